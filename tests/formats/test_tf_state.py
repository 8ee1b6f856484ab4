"""Checkpoint directories (``formats/tf_state.py``): each checkpoint once, the state file's
problems reported alike by ``ls`` (a warning on stderr) and ``verify`` (a problem, exit 1),
leftovers of killed writes mentioned, the same step everywhere, and helpful errors for
folders that hold something else (SavedModel exports, Keras files, ``saved_model.pb``).

Directories are written by TensorFlow itself (a TF1 ``Saver``, ``tf.train.Checkpoint``,
``tf.saved_model.save``); broken state files are written as text, as a user's editor or a
crashed job would leave them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from click.testing import CliRunner

from catalogue import KERAS, RUN
from ckptinspect.cli import app

tf = pytest.importorskip("tensorflow")

ROOT = pathlib.Path(__file__).resolve().parents[2]
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def saver_dir(tmp_path_factory) -> pathlib.Path:
    """A TF1 ``Saver`` directory saved through an absolute path: its state file holds absolute
    paths, as TF1 training scripts leave them."""
    d = tmp_path_factory.mktemp("saver") / "train"
    d.mkdir()
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        v1.get_variable("w", initializer=np.arange(3, dtype=np.float32))
        step = v1.train.get_or_create_global_step()
        bump = v1.assign_add(step, 1)
        saver = v1.train.Saver(max_to_keep=3)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for _ in range(3):
                sess.run(bump)
                saver.save(sess, str(d.resolve() / "model.ckpt"), global_step=step, write_meta_graph=False)
    return d


def test_saver_directory_by_relative_path_lists_each_checkpoint_once(saver_dir, monkeypatch):
    """Before: the state file's absolute spellings and the scan's relative ones were both
    listed ("6 of 6")."""
    state = tf.train.get_checkpoint_state(str(saver_dir))
    assert all(os.path.isabs(p) for p in state.all_model_checkpoint_paths)  # the input is what TF1 writes
    monkeypatch.chdir(saver_dir.parent)
    listed = invoke("ls", "train", "-f", "json")
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)["checkpoints"]
    assert len(rows) == 3 and len({os.path.realpath(r["path"]) for r in rows}) == 3
    assert [r["step"] for r in rows] == [1, 2, 3] and [r["latest"] for r in rows] == [False, False, True]
    checked = invoke("verify", "train", "-f", "json")
    assert checked.exit_code == 0, checked.output
    doc = json.loads(checked.stdout)
    assert doc["summary"]["checkpoints"] == 3 and doc["summary"]["intact"] == 3
    table = invoke("verify", "train")
    assert "INTACT: 3 of 3 checkpoints whole" in table.stdout


def tensorflow_finds_nothing(directory: pathlib.Path) -> bool:
    """tf.train.latest_checkpoint returns None, or raises (a state file it cannot decode)."""
    try:
        return tf.train.latest_checkpoint(str(directory)) is None
    except (ValueError, UnicodeDecodeError):
        return True


def _copy_run(d: pathlib.Path) -> pathlib.Path:
    shutil.copytree(RUN, d)
    return d


GARBAGE = {
    "binary": bytes(range(256)),
    "text": b"model_checkpoint_path: \"ckpt-8\"\nrandom junk the editor left\n",
    "empty": b"",
    "no-latest": b'all_model_checkpoint_paths: "ckpt-8"\n',
}


@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_a_state_file_tensorflow_cannot_use_is_reported(tmp_path, kind):
    """TensorFlow finds nothing through such a state file (or raises); before, ls and verify said nothing
    (verify: INTACT, exit 0). Now ls lists the newest checkpoint on disk with a warning on
    stderr and verify reports the same line as a problem (exit 1)."""
    d = _copy_run(tmp_path / "run")
    (d / "checkpoint").write_bytes(GARBAGE[kind])
    assert tensorflow_finds_nothing(d)
    listed = invoke("ls", d)
    assert listed.exit_code == 0, listed.output
    assert listed.stdout.startswith(f"path:    {d}/ckpt-8\n")
    warning = listed.stderr.strip()
    assert warning.startswith(f"warning: {d}/checkpoint: not a") and warning.count("\n") == 0, warning
    assert "tf.train.latest_checkpoint finds nothing here" in warning
    doc = json.loads(invoke("ls", d, "-f", "json").stdout)
    assert doc["info"]["warnings"] == [warning.removeprefix("warning: ")]
    checked = invoke("verify", d)
    assert checked.exit_code == 1, checked.output
    assert "verdict: INCONSISTENT" in checked.stdout
    assert f"problem: {warning.removeprefix('warning: ')}" in checked.stdout
    report = json.loads(invoke("verify", d, "-f", "json").stdout)
    assert report["intact"] is False and report["problems"] == doc["info"]["warnings"]
    assert report["summary"]["intact"] == 3  # every checkpoint was still checked


def test_a_good_state_file_gives_no_warning(tmp_path):
    d = _copy_run(tmp_path / "run")
    assert tf.train.latest_checkpoint(str(d)) == str(d / "ckpt-8")
    listed = invoke("ls", d)
    assert listed.exit_code == 0 and listed.stderr == ""
    checked = invoke("verify", d)
    assert checked.exit_code == 0 and "problem:" not in checked.stdout and "note:" not in checked.stdout


@pytest.mark.parametrize("named", ["../../etc/passwd", "/etc/passwd", "../outside/ckpt-3"])
def test_a_state_file_naming_a_path_outside_is_reported_alike_and_never_read(tmp_path, named):
    d = _copy_run(tmp_path / "run")
    (tmp_path / "outside").mkdir()
    shutil.copy(RUN / "ckpt-4.index", tmp_path / "outside" / "ckpt-3.index")
    (d / "checkpoint").write_text(
        f'model_checkpoint_path: "{named}"\n'
        + "".join(f'all_model_checkpoint_paths: "ckpt-{n}"\n' for n in (4, 6, 8))
        + f'all_model_checkpoint_paths: "{named}"\n'
    )
    line = f"{d}/checkpoint: names {named!r}, outside the directory {d}; not read as a checkpoint"
    listed = invoke("ls", d, "-f", "json")
    assert listed.exit_code == 0, listed.output
    assert listed.stderr == f"warning: {line}\n"
    doc = json.loads(listed.stdout)
    assert doc["path"] == f"{d}/ckpt-8"
    assert [c["path"] for c in doc["checkpoints"]] == [f"{d}/ckpt-{n}" for n in (4, 6, 8)]
    checked = invoke("verify", d)
    assert checked.exit_code == 1 and f"problem: {line}" in checked.stdout
    assert "passwd  " not in checked.stdout and "outside/ckpt-3  " not in checked.stdout
    for cmd in (("diff", d, d), ("extract", d, "-o", tmp_path / "out" / "x")):
        result = invoke(*cmd)
        assert result.exit_code == 0, result.output  # they use the directory's newest checkpoint


SIGKILLED_WRITER = textwrap.dedent("""
    import sys, time
    from ckptinspect import _atomic
    with _atomic.atomic_file(sys.argv[1], force=True) as tmp:
        with open(tmp, "wb") as f:
            f.write(b"x" * 4096); f.flush()
            print("writing", flush=True)
            time.sleep(60)
""")


def test_leftovers_of_a_killed_write_are_mentioned(tmp_path):
    """A write killed with SIGKILL leaves its temporary file in the directory: ls warns,
    verify notes it (the checkpoints are still intact: exit 0)."""
    d = _copy_run(tmp_path / "run")
    proc = subprocess.Popen([sys.executable, "-c", SIGKILLED_WRITER, str(d / "model.weights.h5")],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.stdout.close()
    (leftover,) = [p for p in d.iterdir() if p.name.startswith(".ckptinspect-tmp-")]
    line = f"{leftover}: left over from an interrupted ckptinspect write (safe to delete)"
    listed = invoke("ls", d)
    assert listed.exit_code == 0 and listed.stderr == f"warning: {line}\n"
    checked = invoke("verify", d)
    assert checked.exit_code == 0, checked.output
    assert f"note:    {line}" in checked.stdout and "verdict: INTACT: 3 of 3" in checked.stdout
    assert json.loads(invoke("verify", d, "-f", "json").stdout)["notes"] == [line]


def test_the_step_is_the_same_in_the_header_the_rows_and_verify(tmp_path):
    """A checkpoint named without a number, its step in a variable: the ls header said 7 but
    the checkpoint row (and verify) said '-'."""
    d = tmp_path / "named"
    root = tf.train.Checkpoint(step=tf.Variable(7, dtype=tf.int64), w=tf.Variable([1.0, 2.0]))
    root.write(str(d / "weights"))
    root.step.assign(9)
    root.write(str(d / "weights-final"))
    tf.compat.v1.train.update_checkpoint_state(str(d), "weights-final", ["weights", "weights-final"])
    listed = invoke("ls", d, "-f", "json")
    doc = json.loads(listed.stdout)
    assert doc["step"] == 9 and doc["step_source"] == "variable:step"
    assert [(c["path"], c["step"]) for c in doc["checkpoints"]] == [(f"{d}/weights", 7), (f"{d}/weights-final", 9)]
    table = invoke("ls", d).stdout
    assert f"{d}/weights-final  9 " in table and "step:    9 (from variable:step)" in table
    report = json.loads(invoke("verify", d, "-f", "json").stdout)
    assert [c["step"] for c in report["checkpoints"]] == [7, 9]
    single = json.loads(invoke("verify", f"{d}/weights", "-f", "json").stdout)
    assert single["checkpoints"][0]["step"] == 7


# -- folders that hold something else ---------------------------------------------------------
@pytest.fixture(scope="module")
def export_dir(tmp_path_factory) -> pathlib.Path:
    """An export folder as TF Serving reads them: timestamped SavedModel subdirectories."""
    d = tmp_path_factory.mktemp("export") / "serving"
    for stamp in ("1700000000", "1700000100"):
        module = tf.Module()
        module.w = tf.Variable([1.0, 2.0])
        tf.saved_model.save(module, str(d / stamp))
    return d


def test_saved_model_pb_points_at_its_directory(export_dir):
    pb = export_dir / "1700000100" / "saved_model.pb"
    for cmd in ("ls", "verify"):
        result = invoke(cmd, pb)
        assert result.exit_code == 2
        assert result.stderr == (f"Error: {pb}: is a SavedModel's graph, not a checkpoint; pass its directory"
                                 f" {pb.parent} (its variables are in {pb.parent}/variables/variables)\n")
    assert invoke("ls", pb.parent).exit_code == 0


def test_an_export_folder_names_its_savedmodels(export_dir):
    for cmd in ("ls", "verify", "diff"):
        args = (cmd, export_dir, export_dir) if cmd == "diff" else (cmd, export_dir)
        result = invoke(*args)
        assert result.exit_code == 2
        assert result.stderr == (f"Error: {export_dir}: an export directory holding 2 SavedModels, not a checkpoint;"
                                 f" pass one of them: {export_dir}/1700000100, {export_dir}/1700000000\n")


def test_a_folder_of_keras_files_lists_them(tmp_path):
    d = tmp_path / "models"
    d.mkdir()
    for name in ("model.keras", "model.weights.h5", "model.h5"):
        shutil.copy(KERAS / name, d / name)
    result = invoke("ls", d)
    assert result.exit_code == 2
    assert result.stderr == (f"Error: {d}: holds Keras files with no epoch or step in their names, not a series of checkpoints; pass one of them:"
                             f" {d}/model.h5, {d}/model.keras, {d}/model.weights.h5\n")
    assert invoke("ls", d / "model.keras").exit_code == 0


# -- remote paths ----------------------------------------------------------------------------
REMOTE = textwrap.dedent("""
    import sys
    import tensorflow as tf
    from ckptinspect.cli import main
    root = tf.train.Checkpoint(w=tf.Variable([1.0, 2.0, 3.0]))
    root.write("ram://bucket/run/ckpt-1")
    sys.argv = ["ckptinspect", *sys.argv[1:]]
    main()
""")


@pytest.mark.slow
def test_ram_paths_work_and_unsupported_schemes_say_which_work():
    """Three TensorFlow processes: a checkpoint in ram:// verifies; s3:// and hdfs:// are one
    Error line saying which schemes work, with none of TensorFlow's start-up lines before it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # TensorFlow's own start-up lines must still not show
    ok = subprocess.run([sys.executable, "-c", REMOTE, "verify", "ram://bucket/run/ckpt-1"], capture_output=True,
                        text=True, timeout=120, env=env)
    assert ok.returncode == 0 and "INTACT" in ok.stdout, ok.stderr[-2000:]
    for scheme in ("s3", "hdfs"):
        bad = subprocess.run([sys.executable, "-m", "ckptinspect", "ls", f"{scheme}://bucket/run/ckpt-1"],
                             capture_output=True, text=True, timeout=120, env=env)
        assert bad.returncode == 2
        if scheme == "s3" and importlib.util.find_spec("s3fs") is not None:
            # s3fs (the [s3] extra, in the test extra) reads s3://: no bucket, no credentials here,
            # one Error line all the same (docs/REMOTE.md; tests/formats/test_object_store.py)
            assert bad.stderr.startswith(f"Error: {scheme}://bucket/run/ckpt-1: ") and bad.stderr.count("\n") == 1, bad.stderr
            continue
        assert bad.stderr == (
            f"Error: {scheme}://bucket/run/ckpt-1: the {scheme}:// scheme is not supported; remote paths work with"
            " gs://, ram:// (the file systems this TensorFlow has; s3:// and hdfs:// moved out of TensorFlow into"
            " the tensorflow-io package), and the schemes fsspec has an implementation installed for (s3fs, gcsfs...)\n"), bad.stderr
