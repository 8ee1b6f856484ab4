"""A checkpoint directory another process is saving into (``tf.train.CheckpointManager`` with
``max_to_keep=2``, saving in a loop): every command resolves the directory once and sticks to
the checkpoint it named.

Before: ``verify DIR`` called a normal rotation INCOMPLETE about one time in five, ``diff DIR
DIR`` compared two different checkpoints, ``ls --stats DIR`` failed now and then. Now a
checkpoint deleted underneath ``verify`` is ``rotated`` (not damage, exit 0), ``diff DIR DIR``
opens the directory once (identical, exit 0), and ``ls --stats`` either lists the checkpoint
it resolved (its data files are held open) or says it was rotated out (one Error line).

The writer is a real TensorFlow process, bounded in saves and in time; the commands run in
the limited worker (10 s and 500 MiB each).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from ckptinspect.formats.tf import directory as tf_directory

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROUNDS = 25  # of each command
MAX_SAVES = 20_000
MAX_SECONDS = 240
ROTATED = "deleted while being read (rotated out by the process saving into"

WRITER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import tensorflow as tf
    directory, max_saves, max_seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    rng = np.random.default_rng(0)
    model = tf.Module()
    model.kernel = tf.Variable(rng.standard_normal((256, 256)).astype(np.float32))
    model.bias = tf.Variable(np.zeros(256, np.float32))
    model.names = tf.Variable(["a", "bb", "ccc"])
    step = tf.Variable(0, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(model=model, step=step)
    manager = tf.train.CheckpointManager(ckpt, directory, max_to_keep=2)
    manager.save()
    print("saving", flush=True)
    stop = os.path.join(directory, "..", "stop")
    start = time.monotonic()
    saves = 1
    while saves < max_saves and time.monotonic() - start < max_seconds and not os.path.exists(stop):
        step.assign_add(1)
        model.kernel.assign_add(tf.ones_like(model.kernel))
        manager.save()
        saves += 1
    print(saves, flush=True)
""")


@pytest.fixture
def live_directory(tmp_path):
    """A directory a CheckpointManager keeps saving into (max_to_keep=2) until the test ends."""
    d = tmp_path / "live"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(d), str(MAX_SAVES), str(MAX_SECONDS)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "saving"
        yield d, proc
    finally:
        (tmp_path / "stop").touch()
        try:
            proc.wait(timeout=60)
        finally:
            proc.kill()
            proc.stdout.close()


def _saves_so_far(d: pathlib.Path) -> int:
    return max((int(p.name[5:-6]) for p in d.glob("ckpt-*.index")), default=0)


@pytest.mark.slow
def test_commands_on_a_directory_being_rotated(live_directory, limited):
    d, proc = live_directory
    outcomes: dict[str, list] = {"verify": [], "diff": [], "ls-stats": []}
    first = _saves_so_far(d)
    for _ in range(ROUNDS):
        round_start = _saves_so_far(d)
        for name, args in (("verify", ["verify", d]), ("diff", ["diff", d, d]), ("ls-stats", ["ls", "--stats", d])):
            result = limited.run(args)
            assert not result.timed_out and not result.crashed, (name, result.describe())
            outcomes[name].append(result)
        assert proc.poll() is None, "the writer stopped early"
        # Whatever the machine's speed, each round sees at least two saves (rotations) before the
        # next one starts: wait for a writer the commands outran (bounded: the writer runs MAX_SECONDS).
        deadline = time.monotonic() + 60
        while _saves_so_far(d) < round_start + 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    saved = _saves_so_far(d) - first
    assert saved >= 2 * ROUNDS, f"the writer saved only {saved} checkpoints meanwhile: no rotation to test"

    for r in outcomes["verify"]:
        assert r.exit_code == 0, r.describe()
        assert "INTACT:" in r.stdout and "INCOMPLETE" not in r.stdout and "DAMAGED" not in r.stdout, r.stdout
    rotated = sum("rotated out while checking" in r.stdout for r in outcomes["verify"])

    for r in outcomes["diff"]:
        assert r.exit_code == 0, r.describe()  # one checkpoint compared with itself: identical
        assert "variables equal" in r.stdout, r.stdout

    listed = 0
    for r in outcomes["ls-stats"]:
        if r.exit_code == 0:
            listed += 1
            assert "model/kernel" in r.stdout and r.stderr == "", r.describe()
        else:
            assert r.exit_code == 2 and r.stderr.count("\n") == 1 and ROTATED in r.stderr, r.describe()
    assert listed >= ROUNDS // 2, f"ls --stats listed {listed} of {ROUNDS} times"
    print(f"saves {saved}, verify rotated {rotated}/{ROUNDS}, ls --stats listed {listed}/{ROUNDS}")


# -- the same, made deterministic: the "writer" rotates a checkpoint out at a chosen moment -------
def _manager_dir(d: pathlib.Path, saves: int = 3) -> pathlib.Path:
    """A CheckpointManager directory (max_to_keep=2) with a string variable beside the floats."""
    tf = pytest.importorskip("tensorflow")
    model = tf.Module()
    model.kernel = tf.Variable(np.arange(12, dtype=np.float32).reshape(3, 4))
    model.names = tf.Variable(["a", "bb"])
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(d), max_to_keep=2)
    for _ in range(saves):
        model.kernel.assign_add(tf.ones_like(model.kernel))
        manager.save()
    return d


def _write_state(d: pathlib.Path, names: list[str]) -> None:
    tf = pytest.importorskip("tensorflow")
    tf.compat.v1.train.update_checkpoint_state(str(d), names[-1], names)


def test_a_checkpoint_rotated_out_while_being_read_stays_readable(tmp_path):
    """ls --stats / diff resolved DIR to ckpt-3; the writer deletes ckpt-3 before the values are
    read: the values still come from the data files held open since the directory was resolved
    (numbers streamed, and a string tensor, which TensorFlow can no longer read by name, decoded
    from the held-open file and checked against its checksum); a value whose bytes went with the
    files is reported as rotated, not damaged."""
    import ckptinspect

    d = _manager_dir(tmp_path / "run")
    with ckptinspect.open(str(d)) as ckpt:
        assert ckpt.path == str(d / "ckpt-3")
        for f in d.glob("ckpt-3.*"):
            f.unlink()
        kernel = ckpt.read("model/kernel")
        np.testing.assert_array_equal(kernel, np.arange(12, dtype=np.float32).reshape(3, 4) + 3)
        blocks = np.concatenate([b.copy() for b in ckpt.iter_blocks("model/kernel", 5)])
        np.testing.assert_array_equal(blocks, kernel.reshape(-1))
        names = ckpt.read("model/names")
        assert names.dtype == object and names.tolist() == [b"a", b"bb"]
    # A held-open file that is damaged is refused (the checksum), not decoded.
    d2 = _manager_dir(tmp_path / "run2")
    with ckptinspect.open(str(d2)) as ckpt:
        entry = next(e for e in ckptinspect.formats.tf.index.read_index(ckpt.path).entries if e.key.startswith("model/names"))
        data = next(d2.glob("ckpt-3.data-*"))
        raw = bytearray(data.read_bytes())
        raw[entry.offset + entry.size - 1] ^= 0x01
        data.write_bytes(bytes(raw))  # same inode: the held-open file sees the flip
        for f in d2.glob("ckpt-3.*"):
            f.unlink()
        with pytest.raises(ckptinspect.CorruptCheckpointError, match="checksum does not match"):
            ckpt.read("model/names")
    # Deleted before the directory is resolved: nothing was held open, so it is rotated.
    d3 = _manager_dir(tmp_path / "run3")
    with ckptinspect.open(str(d3 / "ckpt-3")) as ckpt:  # a prefix: nothing held open
        for f in d3.glob("ckpt-3.*"):
            f.unlink()
        with pytest.raises(ckptinspect.CkptError):
            ckpt.read("model/names")


def test_verify_reports_a_rotation_during_the_check_as_rotated(tmp_path, monkeypatch):
    """The race behind "INCOMPLETE one time in five": CheckpointManager writes the state file
    (naming ckpt-2, ckpt-3, ckpt-4), deletes ckpt-2, then writes the state file again without
    it. verify listed the first state file and found ckpt-2 gone; the writer's second write
    comes while verify checks. Before: INCOMPLETE, exit 1. Now: rotated, intact. In a directory
    nobody writes to, the same listing is still missing (and answered without waiting)."""
    from ckptinspect.ops.verify import STATUS_ROTATED, verify

    d = _manager_dir(tmp_path / "run", saves=4)  # keeps ckpt-3, ckpt-4
    _write_state(d, ["ckpt-2", "ckpt-3", "ckpt-4"])  # the first write; ckpt-2 is already deleted
    seen = []

    def writer_writes_again(done, total, item):
        if not seen:
            _write_state(d, ["ckpt-3", "ckpt-4"])
            seen.append(True)

    report = verify(str(d), progress=writer_writes_again)
    assert [c.status for c in report.checkpoints] == [STATUS_ROTATED, "intact", "intact"]
    assert report.intact and report.summary()["rotated"] == 1
    assert report.checkpoints[0].problems == (
        f"{d}/ckpt-2: deleted while verify ran (rotated out by the process saving into {d}); not damage",)

    _write_state(d, ["ckpt-2", "ckpt-3", "ckpt-4"])
    os.utime(d / "checkpoint", (time.time() - 3600, time.time() - 3600))  # an idle directory
    # a wait for the writer to settle would now take a minute: far beyond the work itself on any
    # machine, however busy (the bound tells waiting from working, not fast from slow)
    monkeypatch.setattr(tf_directory, "SETTLE_SECONDS", 60.0)
    start = time.monotonic()
    stale = verify(str(d))
    assert time.monotonic() - start < 30.0
    assert not stale.intact and [c.status for c in stale.checkpoints] == ["missing", "intact", "intact"]
