"""The ``.keras`` archive reader against Keras, h5py and zipfile.

Archives are written by real Keras 3 once per module; ground truth is what Keras reports for
the model (weight paths and values) and what h5py reads from the archive's inner
``model.weights.h5``. Unsafe and damaged archives are crafted with zipfile and h5py.
"""

from __future__ import annotations

import io
import json
import pathlib
import subprocess
import sys
import tempfile
import zipfile

import numpy as np
import pytest

import ckptinspect
from ckptinspect.errors import CorruptCheckpointError, NotACheckpointError, UnsafeFileError
from ckptinspect.formats import _zip as _zip_read

h5py = pytest.importorskip("h5py")
keras_writers = pytest.importorskip("keras_writers")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def inner_datasets(path: pathlib.Path) -> dict[str, np.ndarray]:
    """Every dataset of the archive's model.weights.h5, read by h5py from the zip member."""
    out: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(path) as zf:
        data = zf.read("model.weights.h5")
    with h5py.File(io.BytesIO(data), "r") as h5:
        h5.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out


def assert_matches_inner_h5(ckpt: ckptinspect.Checkpoint, path: pathlib.Path) -> None:
    datasets = inner_datasets(path)
    assert sorted(v.key for v in ckpt) == sorted(datasets)
    for var in ckpt:
        expected = np.asarray(datasets[var.key])
        assert var.shape == expected.shape, var.key
        assert var.shards == ()
        assert np.array_equal(ckpt.read(var), expected), var.key


@pytest.fixture(scope="module")
def k3(tmp_path_factory):
    return keras_writers.write_keras3(tmp_path_factory.mktemp("k3zip"))


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    return keras_writers.write_keras3_zoo(tmp_path_factory.mktemp("zoo"))


def test_keras3_archive(k3):
    path = k3["paths"]["keras"]
    ckpt = ckptinspect.open(path)
    assert ckpt.format == "keras-zip"
    assert ckpt.num_shards == 1
    model_vars = ckpt.filter(role="model")
    assert len(model_vars) == k3["n_weights"]
    # Dense and BatchNormalization variables are named from config.json, as Keras names them.
    assert sorted(v.name for v in model_vars) == sorted(k3["names"])
    for v in model_vars:
        assert np.array_equal(ckpt.read(v), k3["values"][v.name]), v.name
    assert ckpt["encoder/enc_dense/kernel"].key == "layers/sequential/layers/dense/vars/0"
    assert len(ckpt.filter(role="optimizer")) == k3["n_optimizer"]
    with zipfile.ZipFile(path) as zf:
        metadata = json.loads(zf.read("metadata.json"))
        config = json.loads(zf.read("config.json"))
    assert ckpt.info["keras_version"] == metadata["keras_version"] == k3["keras_version"]
    assert ckpt.info["date_saved"] == metadata["date_saved"]
    assert ckpt.info["model_class"] == config["class_name"] == "Functional"
    assert ckpt.info["model_name"] == "ae"
    assert ckpt.info["layer_count"] == 3
    assert_matches_inner_h5(ckpt, path)


def test_names_from_config_match_keras(zoo):
    """Embedding, Conv1D, LayerNormalization, LSTM cell and a bias-less Dense."""
    ckpt = ckptinspect.open(zoo["paths"]["keras"])
    assert sorted(v.name for v in ckpt) == sorted(zoo["names"])
    for v in ckpt:
        assert np.array_equal(ckpt.read(v), zoo["values"][v.name]), v.name
    # The same weights without a config keep positional names.
    plain = ckptinspect.open(zoo["paths"]["weights"])
    assert plain.format == "keras-weights-h5"
    assert "rnn/lstm_cell/vars/1" in plain and "out/vars/0" in plain
    assert [v.key for v in plain] == [v.key for v in ckpt]


def test_no_tensorflow_import(k3):
    code = (
        "import sys, ckptinspect\n"
        "with ckptinspect.open(sys.argv[1]) as c:\n"
        "    for v in c: c.read(v)\n"
        "bad = [m for m in ('tensorflow', 'keras', 'tf_keras') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "print(len(c))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(k3["paths"]["keras"])], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 0


def test_not_extracted_to_disk(k3, tmp_path, monkeypatch):
    """Opening and reading write nothing to the working directory or the temp directory."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("TMPDIR", str(work))
    monkeypatch.setattr(tempfile, "tempdir", str(work))
    with ckptinspect.open(k3["paths"]["keras"]) as ckpt:
        for v in ckpt:
            ckpt.read(v)
    assert list(work.iterdir()) == []


def test_deflated_archive(k3, tmp_path):
    """An archive re-packed with DEFLATE (not what Keras writes) is inflated on demand."""
    src = k3["paths"]["keras"]
    path = tmp_path / "deflated.keras"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info))
    ckpt = ckptinspect.open(path)
    assert len(ckpt.filter(role="model")) == k3["n_weights"]
    assert_matches_inner_h5(ckpt, path)


def test_deflated_member_with_small_snapshot_interval(k3, tmp_path, monkeypatch):
    """Snapshots every 4 KiB: every seek backwards resumes from a snapshot, and values match."""
    src = k3["paths"]["keras"]
    path = tmp_path / "snapshots.keras"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info))
    monkeypatch.setattr(_zip_read, "INFLATE_SNAPSHOT_BYTES", 4096)
    with ckptinspect.open(path) as ckpt:
        assert_matches_inner_h5(ckpt, path)


@pytest.mark.parametrize("method", [zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA])
def test_other_compression_read_through_zip_stream(k3, tmp_path, method):
    """bzip2 / lzma members (no snapshots possible) are read through zipfile's own stream."""
    src = k3["paths"]["keras"]
    path = tmp_path / "other.keras"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(path, "w", method) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info))
    with ckptinspect.open(path) as ckpt:
        assert_matches_inner_h5(ckpt, path)


# -- real-world corpus -------------------------------------------------------------------------
CORPUS = {
    "keras3-zip": ("out/final_model.keras", 8, 18, "3.9.2"),
    "keras214-zip-backslash-paths": ("model.keras", 14, 29, "2.14.0"),
}


@pytest.mark.parametrize("item", sorted(CORPUS))
def test_realworld_zip(realworld, item):
    name, n_model, n_opt, version = CORPUS[item]
    path = realworld / item / name
    ckpt = ckptinspect.open(path)
    assert ckpt.format == "keras-zip"
    assert len(ckpt.filter(role="model")) == n_model
    assert len(ckpt.filter(role="optimizer")) == n_opt
    assert ckpt.info["keras_version"] == version
    assert_matches_inner_h5(ckpt, path)


def test_realworld_zip_names(realworld):
    ckpt = ckptinspect.open(realworld / "keras3-zip" / "out" / "final_model.keras")
    assert ckpt["dense/kernel"].key == "layers/dense/vars/0"
    assert ckpt["dense_3/bias"].shape == (2,)
    assert int(ckpt.read("optimizer/vars/0")) == 21600
    assert ckpt.info["iterations_key"] == "optimizer/vars/0"
    assert ckpt.info["model_class"] == "Sequential"


def test_realworld_backslash_paths(realworld):
    ckpt = ckptinspect.open(realworld / "keras214-zip-backslash-paths" / "model.keras")
    var = ckpt["dec/conv2d_transpose/vars/0"]
    assert var.key == "dec\\_layer_checkpoint_dependencies\\conv2d_transpose/vars/0"
    assert var.shape == (3, 3, 64, 64)
    assert all("\\" not in v.name for v in ckpt)
    assert int(ckpt.read("optimizer/vars/0")) == 5850
    assert ckpt.info["model_class"] == "VAE"


# -- damaged and unsafe archives ------------------------------------------------------------------
def _copy_members(src: pathlib.Path, zout: zipfile.ZipFile, skip: tuple[str, ...] = ()) -> None:
    with zipfile.ZipFile(src) as zin:
        for info in zin.infolist():
            if info.filename not in skip:
                zout.writestr(info, zin.read(info))


def test_truncated_archive(k3, tmp_path):
    data = k3["paths"]["keras"].read_bytes()
    path = tmp_path / "cut.keras"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptCheckpointError, match=r"cut\.keras"):
        ckptinspect.open(path)


def test_zip_without_weights(tmp_path):
    path = tmp_path / "other.keras"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("readme.txt", "hello")
    with pytest.raises(NotACheckpointError, match=r"other\.keras.*without model\.weights\.h5"):
        ckptinspect.open(path)


def test_bad_config_json(k3, tmp_path):
    path = tmp_path / "badconfig.keras"
    with zipfile.ZipFile(path, "w") as zout:
        _copy_members(k3["paths"]["keras"], zout, skip=("config.json",))
        zout.writestr("config.json", "{not json")
    with pytest.raises(CorruptCheckpointError, match=r"badconfig\.keras: config\.json is not valid JSON"):
        ckptinspect.open(path)


def test_path_traversal_refused(k3, tmp_path):
    path = tmp_path / "traversal.keras"
    with zipfile.ZipFile(path, "w") as zout:
        _copy_members(k3["paths"]["keras"], zout)
        zout.writestr("assets/../../evil.txt", "x")
    with pytest.raises(UnsafeFileError, match=r"traversal\.keras: archive member 'assets/\.\./\.\./evil\.txt'.*path traversal"):
        ckptinspect.open(path)


def test_absolute_member_refused(k3, tmp_path):
    path = tmp_path / "absolute.keras"
    with zipfile.ZipFile(path, "w") as zout:
        _copy_members(k3["paths"]["keras"], zout)
        info = zipfile.ZipInfo("x")
        info.filename = "/etc/evil"  # ZipInfo() strips a leading slash; set it afterwards
        zout.writestr(info, "x")
    with pytest.raises(UnsafeFileError, match=r"absolute\.keras: archive member '/etc/evil'"):
        ckptinspect.open(path)


def test_zip_bomb_refused(k3, tmp_path):
    path = tmp_path / "bomb.keras"
    size = _zip_read.BOMB_FLOOR_BYTES + (1 << 20)
    with zipfile.ZipFile(path, "w") as zout:
        _copy_members(k3["paths"]["keras"], zout, skip=("model.weights.h5",))
        with zout.open(zipfile.ZipInfo("model.weights.h5"), "w") as f:
            pass
        info = zipfile.ZipInfo("model.weights.h5.big")
        info.compress_type = zipfile.ZIP_DEFLATED
        chunk = bytes(1 << 20)
        with zout.open(info, "w", force_zip64=True) as f:
            for _ in range(size >> 20):
                f.write(chunk)
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("model.weights.h5.big")
        assert info.file_size > 100 * info.compress_size  # a real bomb, by zipfile's own account
    assert path.stat().st_size < 2_000_000
    with pytest.raises(UnsafeFileError, match=r"bomb\.keras: archive member 'model\.weights\.h5\.big' declares \d+ bytes but stores only"):
        ckptinspect.open(path)


def test_inner_soft_link_refused(k3, tmp_path):
    inner = io.BytesIO()
    with h5py.File(inner, "w") as h5:
        g = h5.create_group("layers/dense/vars")
        g["0"] = np.ones(3, "float32")
        g["1"] = h5py.SoftLink("/layers/dense/vars/0")
    path = tmp_path / "softlink.keras"
    with zipfile.ZipFile(path, "w") as zout:
        _copy_members(k3["paths"]["keras"], zout, skip=("model.weights.h5",))
        zout.writestr("model.weights.h5", inner.getvalue())
    with pytest.raises(UnsafeFileError, match=r"softlink\.keras/model\.weights\.h5: soft link 'layers/dense/vars/1'"):
        ckptinspect.open(path)


def test_inner_truncated_h5(k3, tmp_path):
    with zipfile.ZipFile(k3["paths"]["keras"]) as zf:
        weights = zf.read("model.weights.h5")
    path = tmp_path / "innercut.keras"
    with zipfile.ZipFile(path, "w") as zout:
        _copy_members(k3["paths"]["keras"], zout, skip=("model.weights.h5",))
        zout.writestr("model.weights.h5", weights[: len(weights) // 2])
    with pytest.raises(CorruptCheckpointError, match=r"innercut\.keras/model\.weights\.h5"):
        ckptinspect.open(path)
