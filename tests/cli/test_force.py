"""``--force`` replaces an earlier output of the same kind, and nothing else.

Every scene is built for real in a temporary directory (plain files, the state file of a
copied CheckpointManager directory, symlinks, a FIFO, HDF5 and zip files written by h5py and
Keras, outputs written by a first ``extract``), the command runs, and every file of the scene
is hashed before and after: a refusal is one ``Error:`` line, exit 2, and not one byte
changed or added. A full disk (a real 4 KiB tmpfs in a private mount namespace) names the
output, not the temporary file, and leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from catalogue import FIXTURES, KERAS, RUN, _copy_prefix
from ckptinspect.cli import app

tf = pytest.importorskip("tensorflow")
h5py = pytest.importorskip("h5py")

runner = CliRunner()
ROOT = pathlib.Path(__file__).resolve().parents[2]
SERIES = FIXTURES / "series"
NO_BUILDER = "no_such_module_xyz:build"  # transplant checks its output before it imports the builder


def scene_digest(root: pathlib.Path) -> dict[str, str]:
    """Every entry under ``root``: files by sha256, links by target, others by type."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = pathlib.Path(dirpath, name)
            if p.is_symlink():
                out[str(p)] = "link:" + os.readlink(p)
            elif p.is_fifo():
                out[str(p)] = "fifo"
            elif p.is_dir():
                out[str(p)] = "dir"
            else:
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def run_dir(tmp: pathlib.Path) -> pathlib.Path:
    d = tmp / "run"
    shutil.copytree(RUN, d)
    return d


# -- refusals ------------------------------------------------------------------------------
# Each scene builds its files under tmp and returns (argv, parts the one Error line must hold).
def plain_file_at_prefix(tmp):
    (tmp / "X").write_text("precious\n")
    return ["extract", str(RUN), "-o", str(tmp / "X"), "--force"], [
        f"Error: {tmp}/X: exists and is a regular file (9 bytes), not a TF checkpoint prefix",
        "--force replaces only an earlier output of the same kind"]


def state_file_as_prefix(tmp):
    d = run_dir(tmp)
    return ["extract", str(d / "ckpt-8"), "-o", str(d / "checkpoint"), "--force"], [
        f"Error: {d}/checkpoint: exists and is the checkpoint state file of {d} (343 bytes), not a TF checkpoint prefix"]


def state_file_as_prefix_from_directory(tmp):
    d = run_dir(tmp)
    return ["extract", str(d), "-o", str(d / "checkpoint"), "--force"], [
        f"Error: {d}/checkpoint: exists and is the checkpoint state file of {d}"]


def state_file_as_npz(tmp):
    d = run_dir(tmp)
    return ["extract", str(d), "--to", "npz", "-o", str(d / "checkpoint"), "--force"], [
        f"Error: {d}/checkpoint: exists and is the checkpoint state file of {d} (343 bytes), not a numpy .npz archive"]


def new_state_file_in_source_directory(tmp):
    d = run_dir(tmp)
    (d / "checkpoint").unlink()  # the directory resolves by scanning *.index now
    return ["extract", str(d), "--to", "npz", "-o", str(d / "checkpoint")], [
        f"Error: {d}/checkpoint: would be the checkpoint state file of {d}, the source's directory"]


def unmanaged_run_dir(tmp):
    """The run without its state file: it resolves to its newest *.index (ckpt-8)."""
    d = run_dir(tmp)
    (d / "checkpoint").unlink()
    return d


def new_index_in_source_directory(tmp):
    d = unmanaged_run_dir(tmp)
    return ["extract", str(d), "-o", str(d / "slim")], [
        f"Error: {d}/slim: would add slim.index to {d}, the source directory, and make it resolve to slim (it has no "
        "'checkpoint' state file naming a checkpoint); write the output elsewhere"]


def newer_number_in_source_directory(tmp):
    d = unmanaged_run_dir(tmp)
    return ["extract", str(d), "-o", str(d / "ckpt-9")], [
        f"Error: {d}/ckpt-9: would add ckpt-9.index to {d}, the source directory, and make it resolve to ckpt-9"]


def new_index_in_source_directory_other_spelling(tmp):
    d = unmanaged_run_dir(tmp)
    (tmp / "sub").mkdir()
    return ["extract", str(d), "-o", str(tmp / "sub" / ".." / "run" / "slim")], [
        "would add slim.index to", "the source directory, and make it resolve to slim"]


def existing_checkpoint_in_source_directory(tmp):
    d = run_dir(tmp)
    return ["extract", str(d), "-o", str(d / "ckpt-4"), "--force"], [
        f"Error: {d}/ckpt-4: would replace ckpt-4, a checkpoint the state file of {d} (the source checkpoint's "
        "directory) lists"]


def listed_checkpoint_beside_source_prefix(tmp):
    d = run_dir(tmp)
    return ["extract", str(d / "ckpt-8"), "-o", str(d / "ckpt-4"), "--force"], [
        f"Error: {d}/ckpt-4: would replace ckpt-4, a checkpoint the state file of {d}"]


def missing_listed_checkpoint_beside_source_prefix(tmp):
    d = run_dir(tmp)
    for f in d.glob("ckpt-8.*"):  # the state file still names ckpt-8: the directory resolves to ckpt-6
        f.unlink()
    return ["extract", str(d / "ckpt-6"), "-o", str(d / "ckpt-8")], [
        f"Error: {d}/ckpt-8: would write ckpt-8, a checkpoint the state file of {d} (the source checkpoint's "
        "directory) lists, and change what it resolves to"]


def existing_checkpoint_in_unmanaged_source_directory(tmp):
    d = unmanaged_run_dir(tmp)
    return ["extract", str(d), "-o", str(d / "ckpt-4"), "--force"], [
        f"Error: {d}/ckpt-4: would replace a checkpoint of {d}, the source directory, which resolves by its *.index files"]


def prefix_into_keras_series_directory(tmp):
    d = tmp / "weights"
    shutil.copytree(SERIES / "keras3_weights", d)  # a Keras file series: an *.index would make it a TF directory
    return ["extract", str(d), "-o", str(d / "model")], [
        f"Error: {d}/model: would add model.index to {d}, the source directory, and make it resolve to model"]


def index_not_an_index(tmp):
    (tmp / "X.index").write_text("notes about X\n")
    return ["extract", str(RUN), "-o", str(tmp / "X"), "--force"], [
        f"Error: {tmp}/X.index: exists and is a regular file (14 bytes), not a TF checkpoint index"]


def index_is_a_directory(tmp):
    (tmp / "X.index").mkdir()
    (tmp / "X.index" / "keep.txt").write_text("keep\n")
    return ["extract", str(RUN), "-o", str(tmp / "X"), "--force"], [
        f"Error: {tmp}/X.index: exists and is a directory, not a TF checkpoint index"]


def index_is_a_symlink(tmp):
    real = _copy_prefix(RUN / "ckpt-8", tmp / "elsewhere")
    os.symlink(f"{real}.index", tmp / "X.index")
    return ["extract", str(RUN), "-o", str(tmp / "X"), "--force"], [
        f"Error: {tmp}/X.index: is a symbolic link (to {real}.index); --force replaces only regular files"]


def npz_is_text(tmp):
    (tmp / "m.npz").write_text("a,b\n1,2\n")
    return ["extract", str(RUN), "-o", str(tmp / "m.npz"), "--force"], [
        f"Error: {tmp}/m.npz: exists and is a regular file (8 bytes), not a numpy .npz archive"]


def npz_is_hdf5(tmp):
    shutil.copy(KERAS / "model.weights.h5", tmp / "m.npz")
    return ["extract", str(RUN), "-o", str(tmp / "m.npz"), "--force"], ["not a numpy .npz archive"]


def npz_is_keras_zip(tmp):
    shutil.copy(KERAS / "model.keras", tmp / "m.npz")
    return ["extract", str(RUN), "-o", str(tmp / "m.npz"), "--force"], ["not a numpy .npz archive"]


def weights_h5_is_zip(tmp):
    shutil.copy(KERAS / "model.keras", tmp / "m.weights.h5")
    return ["extract", str(KERAS / "model.keras"), "-o", str(tmp / "m.weights.h5"), "--force"], [
        f"Error: {tmp}/m.weights.h5: exists and is a regular file ({(KERAS / 'model.keras').stat().st_size} bytes), "
        "not an HDF5 file"]


def h5_is_text(tmp):
    (tmp / "m.h5").write_text("not hdf5\n")
    return ["extract", str(KERAS / "model.h5"), "-o", str(tmp / "m.h5"), "--force"], ["not an HDF5 file"]


def weights_h5_is_a_symlink(tmp):
    (tmp / "real").mkdir()
    shutil.copy(KERAS / "model.weights.h5", tmp / "real" / "w.weights.h5")
    os.symlink(tmp / "real" / "w.weights.h5", tmp / "m.weights.h5")
    return ["extract", str(KERAS / "model.keras"), "-o", str(tmp / "m.weights.h5"), "--force"], [
        f"Error: {tmp}/m.weights.h5: is a symbolic link (to {tmp}/real/w.weights.h5)"]


def format_option_existing_other_kind(tmp):
    shutil.copy(KERAS / "model.weights.h5", tmp / "weights.bin")
    return ["extract", str(RUN), "--to", "npz", "-o", str(tmp / "weights.bin"), "--force"], [
        f"Error: {tmp}/weights.bin: exists and is a regular file", "not a numpy .npz archive"]


def transplant_plain_file_at_prefix(tmp):
    (tmp / "X").write_text("precious\n")
    return ["transplant", str(RUN), str(tmp / "X"), "--builder", NO_BUILDER, "--force"], [
        f"Error: {tmp}/X: exists and is a regular file (9 bytes), not a TF checkpoint prefix"]


def transplant_state_file(tmp):
    d = run_dir(tmp)
    return ["transplant", str(d), str(d / "checkpoint"), "--builder", NO_BUILDER, "--force"], [
        f"Error: {d}/checkpoint: exists and is the checkpoint state file of {d}"]


def transplant_new_index_in_source_directory(tmp):
    d = unmanaged_run_dir(tmp)
    return ["transplant", str(d), str(d / "moved"), "--builder", NO_BUILDER], [
        f"Error: {d}/moved: would add moved.index to {d}, the source directory, and make it resolve to moved"]


def transplant_keras_is_hdf5(tmp):
    shutil.copy(KERAS / "model.weights.h5", tmp / "m.keras")
    return ["transplant", str(RUN), str(tmp / "m.keras"), "--builder", NO_BUILDER, "--force"], [
        f"Error: {tmp}/m.keras: exists and is a regular file", "not a .keras zip archive"]


REFUSALS = [
    plain_file_at_prefix, state_file_as_prefix, state_file_as_prefix_from_directory, state_file_as_npz,
    new_state_file_in_source_directory, new_index_in_source_directory, newer_number_in_source_directory,
    new_index_in_source_directory_other_spelling, existing_checkpoint_in_source_directory,
    listed_checkpoint_beside_source_prefix, missing_listed_checkpoint_beside_source_prefix,
    existing_checkpoint_in_unmanaged_source_directory, prefix_into_keras_series_directory,
    index_not_an_index, index_is_a_directory, index_is_a_symlink,
    npz_is_text, npz_is_hdf5, npz_is_keras_zip, weights_h5_is_zip, h5_is_text, weights_h5_is_a_symlink,
    format_option_existing_other_kind, transplant_plain_file_at_prefix, transplant_state_file,
    transplant_new_index_in_source_directory, transplant_keras_is_hdf5,
]


@pytest.mark.parametrize("scene", REFUSALS, ids=[f.__name__ for f in REFUSALS])
def test_force_refuses_what_is_not_an_earlier_output(scene, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv, parts = scene(tmp_path)
    before = scene_digest(tmp_path) | scene_digest(RUN)
    result = runner.invoke(app, argv)
    assert scene_digest(tmp_path) | scene_digest(RUN) == before, "a file was changed, added or removed"
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("Error: "), result.stderr
    for part in parts:
        assert part in result.stderr, result.stderr


def test_force_refuses_a_fifo_named_like_the_index_without_opening_it(tmp_path):
    """Opening a FIFO for reading blocks forever: the check must look, not open."""
    fifo = tmp_path / "X.index"
    os.mkfifo(fifo)
    proc = subprocess.run([sys.executable, "-m", "ckptinspect", "extract", str(RUN), "-o", str(tmp_path / "X"), "--force"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"Error: {fifo}: exists and is a FIFO, not a TF checkpoint index")
    assert sorted(os.listdir(tmp_path)) == ["X.index"] and fifo.is_fifo()


# -- writes that change nothing a directory resolves to (issue 25 item 13) -----------------
def resolved(path) -> str:
    result = runner.invoke(app, ["ls", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["path"]


def ship_directory(tmp):
    """The issue's scene: a model extracted to ship/ (no state file), then cast beside itself."""
    assert runner.invoke(app, ["extract", str(RUN), "-o", str(tmp / "ship" / "model")]).exit_code == 0
    src = tmp / "ship" / "model"
    return src, [["rewrite", str(src), "--cast", "float16", "-o", str(tmp / "ship" / "model_fp16")],
                 ["extract", str(src), "-o", str(tmp / "ship" / "model_slim")],
                 ["rewrite", str(src), "--cast", "float16", "-o", str(tmp / "ship" / "model_fp16"), "--force"]]


def beside_a_listed_prefix(tmp):
    d = run_dir(tmp)
    return d, [["extract", str(d / "ckpt-8"), "-o", str(d / "ckpt-8-model")],
               ["extract", str(d / "ckpt-8"), "-o", str(d / "ckpt-8-model"), "--force"]]


def into_a_managed_source_directory(tmp):
    d = run_dir(tmp)  # its state file names ckpt-8: a new prefix is not what it resolves to
    return d, [["extract", str(d), "-o", str(d / "slim")], ["extract", str(d), "-o", str(d / "slim"), "--force"]]


def older_number_into_an_unmanaged_source_directory(tmp):
    d = unmanaged_run_dir(tmp)  # resolves to its highest number, ckpt-8
    return d, [["extract", str(d), "-o", str(d / "ckpt-3")]]


def into_a_savedmodel_variables_directory(tmp):
    module = tf.Module()
    module.v = tf.Variable([1.0, 2.0])
    module.f = tf.function(lambda x: x * module.v, input_signature=[tf.TensorSpec([2], tf.float32)])
    tf.saved_model.save(module, str(tmp / "sm"))  # resolves to variables/variables, whatever is beside it
    return tmp / "sm", [["extract", str(tmp / "sm"), "-o", str(tmp / "sm" / "variables" / "slim")]]


WRITES = [ship_directory, beside_a_listed_prefix, into_a_managed_source_directory,
          older_number_into_an_unmanaged_source_directory, into_a_savedmodel_variables_directory]


@pytest.mark.parametrize("scene", WRITES, ids=[f.__name__ for f in WRITES])
def test_an_output_beside_its_source_is_written_when_nothing_resolves_elsewhere(scene, tmp_path):
    source, commands = scene(tmp_path)
    before = resolved(source)
    for argv in commands:
        result = runner.invoke(app, argv)
        assert result.exit_code == 0, result.output
        out = pathlib.Path(argv[argv.index("-o") + 1])
        assert (out.parent / (out.name + ".index")).is_file()
        assert resolved(out) == str(out)  # a checkpoint, readable
    assert resolved(source) == before  # the source still names the same checkpoint


# -- what --force does replace -------------------------------------------------------------
@pytest.mark.parametrize(
    ("source", "name", "extra"),
    [
        (RUN, "X", []),
        (RUN, "m.npz", []),
        (RUN, "weights", ["--to", "npz"]),
        (KERAS / "model.keras", "m.weights.h5", []),
        (KERAS / "model.h5", "m.h5", []),
    ],
    ids=["tf-prefix", "npz", "npz-by-to", "weights-h5", "legacy-h5"],
)
def test_force_replaces_an_earlier_output_of_the_same_kind(tmp_path, source, name, extra):
    out = tmp_path / "out"
    out.mkdir()
    (out / f"{name}.notes").write_text("mine\n")  # a neighbour: never touched
    first = runner.invoke(app, ["extract", str(source), "-o", str(out / name), *extra, "--max-shard-size", "0"]
                          if name == "X" else ["extract", str(source), "-o", str(out / name), *extra])
    assert first.exit_code == 0, first.output
    names = sorted(os.listdir(out))
    again = runner.invoke(app, ["extract", str(source), "-o", str(out / name), *extra])
    assert again.exit_code == 2 and "output exists; pass --force" in again.stderr
    forced = runner.invoke(app, ["extract", str(source), "-o", str(out / name), *extra, "--force"])
    assert forced.exit_code == 0, forced.output
    after = sorted(os.listdir(out))
    if name == "X":  # one shard per tensor first, one shard now: the stale shards are gone
        assert len(names) > 3 and after == sorted(["X.index", "X.data-00000-of-00001", "X.notes"])
    else:
        assert after == names
    assert (out / f"{name}.notes").read_text() == "mine\n"


# -- a full disk ---------------------------------------------------------------------------
FULL_DISK = """
set -e
mkdir -p "$1"
mount -t tmpfs -o size=4k tmpfs "$1"
shift
exec "$@"
"""


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", FULL_DISK, "sh", "/mnt", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.parametrize(
    ("source", "name"),
    [  # a TF source starts TensorFlow in the subprocess (~10 s): those two run with -m slow
        pytest.param(RUN, "out/model", id="tf-prefix", marks=pytest.mark.slow),
        pytest.param(RUN, "model.npz", id="npz", marks=pytest.mark.slow),
        pytest.param(KERAS / "model.keras", "model.weights.h5", id="weights-h5"),
    ],
)
def test_full_disk_names_the_output_and_leaves_nothing(tmp_path, source, name):
    if not _unshare_works():
        pytest.skip("cannot mount a tmpfs in a private mount namespace here (needs root or user namespaces)")
    mnt = tmp_path / "full"
    dest = mnt / name
    script = f'"$@"; echo "rc=$?"; ls -A {mnt}'
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", FULL_DISK, "sh", str(mnt), "sh", "-c", script, "sh",
         sys.executable, "-m", "ckptinspect", "extract", str(source), "-o", str(dest)],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith(f"Error: {dest}: cannot write the output: no space left on device"), errors[0]
    assert ".ckptinspect-tmp-" not in errors[0]
    assert proc.stdout.splitlines() == ["rc=2"], proc.stdout  # nothing left in the mount, not even out/
