"""Reading files safely (``formats/_fs.py`` and the readers built on it).

Only regular files are opened: a FIFO used to block every command forever and a link to
``/dev/zero`` was read until MemoryError. Whole-file reads check the size first; V1 tables
and format detection read only the blocks they need. Each check that would hang or eat memory
on a regression runs in a subprocess with a timeout and an address-space limit, so it fails
instead of stalling the suite.
"""

from __future__ import annotations

import json
import importlib.util
import os
import pathlib
import resource
import shutil
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from catalogue import RUN, _copy_prefix

ROOT = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 30  # seconds for a subprocess that must not hang (Python start-up included)
MEMORY = 512 << 20  # address space of a subprocess that does not import TensorFlow
HUGE = 3 << 30
TABLE_MAGIC = struct.pack("<Q", 0xDB4775248B80FB57)


def run_isolated(code: str, *args: str, memory: int | None = MEMORY) -> dict:
    """Run ``code`` in a fresh Python under a time and memory limit; it prints one JSON value."""
    def limit() -> None:
        if memory is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=TIMEOUT, preexec_fn=limit, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def specials(tmp_path) -> dict[str, pathlib.Path]:
    """A FIFO and links to two devices, each named like a checkpoint file."""
    fifo = tmp_path / "fifo.index"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.index"
    zero.symlink_to("/dev/zero")
    urandom = tmp_path / "urandom.h5"
    urandom.symlink_to("/dev/urandom")
    return {"FIFO": fifo, "character device": zero, "character device ": urandom}


EVERY_READER = """
    import json, sys
    from ckptinspect.errors import CkptError
    from ckptinspect.formats import _fs
    from ckptinspect.formats.tf.index import read_index
    from ckptinspect.formats.tf.v1 import is_v1_table, iter_v1_table, open_v1
    from ckptinspect.formats.keras.h5 import open_h5
    from ckptinspect.formats.keras.zip import open_zip

    def outcome(fn):
        try:
            value = fn()
        except CkptError as e:
            return [type(e).__name__, str(e)]
        return ["returned", repr(value)[:60]]

    out = {}
    for path in sys.argv[1:]:
        out[path] = {
            "read_bytes": outcome(lambda: _fs.read_bytes(path, limit=1 << 30)),
            "read_range": outcome(lambda: _fs.read_range(path, 0, 1 << 30)),
            "open_binary": outcome(lambda: _fs.open_binary(path).read()),
            "check_regular": outcome(lambda: _fs.check_regular(path)),
            "range_reader": outcome(lambda: _fs.RangeReader(path).read_at(0, 1 << 30)),
            "read_index": outcome(lambda: read_index(path[: -len(".index")] if path.endswith(".index") else path)),
            "iter_v1_table": outcome(lambda: list(iter_v1_table(path))),
            "open_v1": outcome(lambda: open_v1(path)),
            "open_h5": outcome(lambda: open_h5(path)),
            "open_zip": outcome(lambda: open_zip(path)),
            "read_head": outcome(lambda: _fs.read_head(path, 4096)),
            "is_v1_table": outcome(lambda: is_v1_table(path)),
            "is_regular": outcome(lambda: _fs.is_regular(path)),
        }
    print(json.dumps(out))
"""


def test_every_reader_refuses_fifos_and_devices(specials):
    """Each reader, given a FIFO or a device, refuses it at once with the same one line; the
    sniffers (read_head, is_v1_table) answer "no"; nothing blocks, nothing reads without end."""
    out = run_isolated(EVERY_READER, *map(str, specials.values()))
    for kind, path in specials.items():
        got = out[str(path)]
        refusal = ["UnsafeFileError", f"{path}: not a regular file ({kind.strip()}); refusing to read"]
        for reader in ("read_bytes", "read_range", "open_binary", "check_regular", "range_reader", "open_v1",
                       "open_h5", "open_zip", "iter_v1_table"):
            assert got[reader] == refusal, (reader, got[reader])
        if path.name.endswith(".index"):
            assert got["read_index"] == refusal
        assert got["read_head"] == ["returned", "b''"]
        assert got["is_v1_table"] == ["returned", "False"]
        assert got["is_regular"] == ["returned", "False"]


BOUNDED = """
    import json, sys
    from ckptinspect.errors import CkptError
    from ckptinspect.formats import _fs, detect
    from ckptinspect.formats.tf.index import read_index

    def outcome(fn):
        try:
            return ["returned", repr(fn())[:400]]
        except CkptError as e:
            return [type(e).__name__, str(e)]

    big, index_prefix, small = sys.argv[1:]
    print(json.dumps({
        "read_bytes": outcome(lambda: _fs.read_bytes(big, limit=1 << 20, what="state file")),
        "read_index": outcome(lambda: read_index(index_prefix)),
        "detect_big": outcome(lambda: detect(big)),
        "detect_index": outcome(lambda: detect(index_prefix + ".index")),
        "at_limit": outcome(lambda: len(_fs.read_bytes(small, limit=4096))),
        "over_limit": outcome(lambda: _fs.read_bytes(small, limit=4095)),
    }))
"""


def test_sizes_are_checked_before_reading(tmp_path):
    """A 3 GB sparse file: refused by size, under a 512 MiB address-space limit (before the
    fix the index was read whole: MemoryError, or 3 GB of zeros)."""
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(HUGE)
    index = tmp_path / "h.index"
    with open(index, "wb") as f:
        f.truncate(HUGE - 8)
        f.seek(HUGE - 8)
        f.write(TABLE_MAGIC)
    small = tmp_path / "small"
    small.write_bytes(b"x" * 4096)
    out = run_isolated(BOUNDED, str(big), str(tmp_path / "h"), str(small))
    assert out["read_bytes"] == ["UnsafeFileError", f"{big}: state file is 3221225472 bytes (3.0 GiB), more than"
                                 " the 1.0 MiB a state file may take; refusing to read"]
    assert out["read_index"] == ["UnsafeFileError", f"{index}: checkpoint index is 3221225472 bytes (3.0 GiB), more"
                                 " than the 256.0 MiB a checkpoint index may take; refusing to read"]
    assert out["detect_big"][0] == "NotACheckpointError"
    assert out["detect_index"] == ["returned", f"(<Kind.TF_BUNDLE: 'tf-bundle'>, '{tmp_path / 'h'}')"]
    assert out["at_limit"] == ["returned", "4096"]
    assert out["over_limit"][0] == "UnsafeFileError"


READ_BYTES_OF = """
    import json, sys
    from ckptinspect.formats import detect, open_checkpoint

    def rchar():
        with open("/proc/self/io") as f:
            return int(next(l for l in f if l.startswith("rchar")).split()[1])

    import ckptinspect.formats.tf.protos as protos
    protos.DecodeError  # the protobuf runtime loads on first use: not the checkpoint's bytes

    path = sys.argv[1]
    before = rchar()
    kind, target = detect(path)
    ckpt = open_checkpoint(path)
    after = rchar()
    print(json.dumps({"kind": kind.value, "names": [v.name for v in ckpt.variables], "step": ckpt.step,
                      "number": ckpt.number, "read": after - before}))
"""


@pytest.fixture(scope="module")
def v1_file(tmp_path_factory) -> pathlib.Path:
    """A real V1 checkpoint (TensorSliceWriter table) with a 16 MiB tensor, written by TF."""
    tf = pytest.importorskip("tensorflow")
    d = tmp_path_factory.mktemp("v1")
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        v1.get_variable("a", initializer=np.arange(4, dtype=np.float32))
        v1.get_variable("z", initializer=np.ones((1024, 4096), np.float32))
        saver = v1.train.Saver(write_version=v1.train.SaverDef.V1)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            path = saver.save(sess, str(d / "model.ckpt-12"), write_meta_graph=False)
    return pathlib.Path(path)


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs /proc/self/io")
def test_v1_tables_are_read_block_by_block(v1_file):
    """Detecting and listing a 16 MiB V1 file reads its footer, index block and first block
    (before: the whole file, twice); verify checks every block and still says intact."""
    import ckptinspect

    out = run_isolated(READ_BYTES_OF, str(v1_file))
    assert out["kind"] == "tf-v1-table" and sorted(out["names"]) == ["a", "z"]
    assert (out["step"], out["number"]) == (None, 12)  # ckpt-12: the name's number, not a step variable
    assert v1_file.stat().st_size > 16 << 20 and out["read"] < 1 << 20, out["read"]
    report = ckptinspect.verify(str(v1_file))
    assert report.intact and report.checkpoints[0].step is None


TF_READER = """
    import json, sys
    import ckptinspect
    from ckptinspect.errors import CkptError

    out = {}
    with ckptinspect.open(sys.argv[1]) as ckpt:
        out["listed"] = sorted(v.name for v in ckpt.variables)
        for how, fn in (("read", lambda v: ckpt.read(v)), ("blocks", lambda v: list(ckpt.iter_blocks(v, 1024)))):
            try:
                fn(ckpt["w"])
                out[how] = "read"
            except CkptError as e:
                out[how] = [type(e).__name__, str(e)]
    print(json.dumps(out))
"""


def _tf1_checkpoint(d: pathlib.Path) -> pathlib.Path:
    """A TF1 name-based checkpoint (no object graph: listing reads the index alone)."""
    tf = pytest.importorskip("tensorflow")
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        v1.get_variable("w", initializer=np.arange(6, dtype=np.float32).reshape(2, 3))
        saver = v1.train.Saver()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            return pathlib.Path(saver.save(sess, str(d / "model.ckpt"), write_meta_graph=False))


@pytest.mark.parametrize("special", ["fifo", "dev-zero"])
def test_tensorflow_reader_is_never_handed_a_special_file(tmp_path, special):
    """Values of a bundle whose data shard is a FIFO (or /dev/zero) are refused before
    TensorFlow's reader opens it (which would block, or read zeros as a checkpoint)."""
    prefix = _tf1_checkpoint(tmp_path)
    shard = pathlib.Path(f"{prefix}.data-00000-of-00001")
    shard.unlink()
    if special == "fifo":
        os.mkfifo(shard)
    else:
        shard.symlink_to("/dev/zero")
    kind = "FIFO" if special == "fifo" else "character device"
    out = run_isolated(TF_READER, str(prefix), memory=None)  # TensorFlow needs its address space
    refusal = ["UnsafeFileError", f"{shard}: not a regular file ({kind}); refusing to read"]
    assert out == {"listed": ["w"], "read": refusal, "blocks": refusal}


def test_a_checkpoint_whose_files_are_fine_still_reads(tmp_path):
    """The checks change nothing for regular files, symlinked ones included."""
    import ckptinspect

    prefix = _copy_prefix(RUN / "ckpt-8", tmp_path / "real")
    linked = tmp_path / "linked"
    linked.mkdir()
    for f in (tmp_path / "real").iterdir():
        (linked / f.name).symlink_to(f)
    with ckptinspect.open(str(linked / "ckpt-8")) as a, ckptinspect.open(str(prefix)) as b:
        assert [v.key for v in a] == [v.key for v in b]
        np.testing.assert_array_equal(a.read("encoder/enc_dense/kernel"), b.read("encoder/enc_dense/kernel"))
    assert ckptinspect.verify(str(linked / "ckpt-8")).intact
    shutil.rmtree(linked)


def test_human_size_names_bytes_then_binary_units():
    from ckptinspect.formats import _fs

    assert _fs.human_size(0) == "0 bytes"
    assert _fs.human_size(1023) == "1023 bytes"
    assert _fs.human_size(1024) == "1.0 KiB"
    assert _fs.human_size(256 << 20) == "256.0 MiB"
    assert _fs.human_size(3 << 30) == "3.0 GiB"
    assert _fs.human_size(5 << 50) == "5120.0 TiB"


@pytest.mark.parametrize("name", ["", ".", "..", "../x.h5", "a/b.h5", "a\\b.h5", "C:x.h5", "x\x00.h5"])
def test_check_shard_name_refuses_what_leaves_the_folder(name):
    from ckptinspect.errors import UnsafeFileError
    from ckptinspect.formats import _fs

    with pytest.raises(UnsafeFileError, match=r"^idx\.json: shard file name .* refusing path traversal$"):
        _fs.check_shard_name("idx.json", name)


def test_check_shard_name_accepts_a_plain_name():
    from ckptinspect.formats import _fs

    _fs.check_shard_name("idx.json", "model-00001-of-00002.safetensors")


def test_a_scheme_whose_fsspec_implementation_lacks_its_package_is_one_error_line():
    """fsspec knows hdfs:// but its implementation needs pyarrow: one Error line, not an
    'unexpected ModuleNotFoundError'."""
    pytest.importorskip("fsspec")
    if importlib.util.find_spec("pyarrow") is not None:
        pytest.skip("pyarrow is installed: hdfs:// has a file system here")
    from click.testing import CliRunner  # noqa: PLC0415

    from ckptinspect.cli import app  # noqa: PLC0415

    result = CliRunner().invoke(app, ["ls", "hdfs://bucket/run/ckpt-1"])
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: hdfs://bucket/run/ckpt-1: ") and "unexpected" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
