"""The Keras HDF5 reader (legacy .h5, .weights.h5, sharded weights) against Keras and h5py.

Files are written by real Keras 3 and Keras 2 (``tf_keras``) once per module; ground truth is
what Keras reports for the model that wrote them (weight counts, paths, values) and what h5py
reads from the files, never ckptinspect itself. Unsafe and damaged files are crafted with h5py.
"""

from __future__ import annotations

import io
import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import ckptinspect
from ckptinspect.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    NotACheckpointError,
    UnsafeFileError,
)
from ckptinspect.formats.keras import h5 as keras_h5

h5py = pytest.importorskip("h5py")
keras_writers = pytest.importorskip("keras_writers")

ROOT = pathlib.Path(__file__).resolve().parents[2]


# -- ground-truth helpers ----------------------------------------------------------------------
def h5_datasets(h5: h5py.File) -> dict[str, h5py.Dataset]:
    """Every dataset of an open file, by path, as h5py sees them."""
    out: dict[str, h5py.Dataset] = {}
    h5.visititems(lambda name, obj: out.__setitem__(name, obj) if isinstance(obj, h5py.Dataset) else None)
    return out


def assert_matches_h5py(ckpt: ckptinspect.Checkpoint, h5_path: pathlib.Path | str) -> None:
    """Every dataset listed once with h5py's shape; every value equal to h5py's."""
    with h5py.File(h5_path, "r") as h5:
        datasets = h5_datasets(h5)
        assert sorted(v.key for v in ckpt) == sorted(datasets)
        for var in ckpt:
            ds = datasets[var.key]
            assert var.shape == ds.shape, var.key
            assert var.shards == ()
            expected = ds[()]
            got = ckpt.read(var)
            if var.dtype == "bfloat16":
                got = got.view(np.uint16)
                expected = np.asarray(expected).view(np.uint16)
            else:
                assert var.dtype == ds.dtype.name, var.key
            assert np.array_equal(got, expected), var.key


def by_role(ckpt: ckptinspect.Checkpoint, role: str) -> list[ckptinspect.Variable]:
    return ckpt.filter(role=role)


# -- files written once per module ---------------------------------------------------------------
@pytest.fixture(scope="module")
def k3(tmp_path_factory):
    return keras_writers.write_keras3(tmp_path_factory.mktemp("k3"))


@pytest.fixture(scope="module")
def k3_sub(tmp_path_factory):
    return keras_writers.write_keras3_subclassed(tmp_path_factory.mktemp("k3sub"))


@pytest.fixture(scope="module")
def k3_sharded(tmp_path_factory):
    return keras_writers.write_keras3_sharded(tmp_path_factory.mktemp("k3sharded"))


@pytest.fixture(scope="module")
def k2(tmp_path_factory):
    pytest.importorskip("tf_keras")
    return keras_writers.write_tf_keras(tmp_path_factory.mktemp("k2"))


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    pytest.importorskip("tf_keras")
    return keras_writers.write_split_layer_names(tmp_path_factory.mktemp("split"))


# -- Keras 3 -----------------------------------------------------------------------------------
def test_keras3_legacy_h5_full_model(k3):
    ckpt = ckptinspect.open(k3["paths"]["h5"])
    assert ckpt.format == "keras-h5"
    assert ckpt.num_shards == 1
    model_vars = by_role(ckpt, "model")
    assert len(model_vars) == k3["n_weights"]
    # Keras 3 legacy paths are model_weights/<layer>/<weight path>; names are Keras's own paths.
    assert sorted(v.name for v in model_vars) == sorted(k3["names"])
    for v in model_vars:
        assert np.array_equal(ckpt.read(v), k3["values"][v.name]), v.name
    assert len(by_role(ckpt, "optimizer")) == k3["n_optimizer"]
    assert ckpt["head/kernel"].key == "model_weights/head/head/kernel"
    assert ckpt.info["keras_version"] == k3["keras_version"]
    assert ckpt.info["backend"] == "tensorflow"
    assert ckpt.info["model_class"] == "Functional"
    assert ckpt.info["model_name"] == "ae"
    assert ckpt.info["layer_count"] == 3  # input_layer, encoder, head
    assert ckpt.info["optimizer_class"] == "Adam"
    assert_matches_h5py(ckpt, k3["paths"]["h5"])


def test_keras3_weights_h5(k3):
    ckpt = ckptinspect.open(k3["paths"]["weights"])
    assert ckpt.format == "keras-weights-h5"
    model_vars = by_role(ckpt, "model")
    assert len(model_vars) == k3["n_weights"]
    # Readable names: layer names from the vars groups, positional variables.
    expected = {
        f"{layer}/vars/{i}" for layer, n in k3["layer_vars"].items() for i in range(n)
    }
    assert {v.name for v in model_vars} == expected
    assert ckpt["encoder/enc_dense/vars/0"].key == "layers/sequential/layers/dense/vars/0"
    # vars/i of a layer is its i-th weight in Keras's order.
    for v in model_vars:
        layer, _, index = v.name.rpartition("/vars/")
        keras_name = [n for n in k3["names"] if n.rsplit("/", 1)[0] == layer][int(index)]
        assert np.array_equal(ckpt.read(v), k3["values"][keras_name]), v.name
    opt = by_role(ckpt, "optimizer")
    assert len(opt) == k3["n_optimizer"]
    assert all(v.key.startswith("optimizer/vars/") for v in opt)
    assert ckpt["optimizer/vars/0"].dtype == "int64"  # the iteration counter
    assert ckpt.info["optimizer_name"] == k3["optimizer_name"]
    assert_matches_h5py(ckpt, k3["paths"]["weights"])


def test_keras3_subclassed_lstm_bfloat16(k3_sub):
    ckpt = ckptinspect.open(k3_sub["paths"]["weights"])
    model_vars = by_role(ckpt, "model")
    assert len(model_vars) == k3_sub["n_weights"] == len(ckpt)
    names = {v.name for v in model_vars}
    assert "vars/0" in names  # the model's own weight
    assert {"rnn/lstm_cell/vars/0", "rnn/lstm_cell/vars/1", "rnn/lstm_cell/vars/2"} <= names
    head = ckpt["head/vars/0"]
    assert head.dtype == "bfloat16" == k3_sub["dtypes"]["sub/head/kernel"]
    assert head.nbytes == head.size * 2
    value = ckpt.read(head)
    assert str(value.dtype) == "bfloat16"
    assert np.array_equal(value.astype("float32"), k3_sub["values"]["sub/head/kernel"].astype("float32"))
    assert np.array_equal(ckpt.read("vars/0"), k3_sub["values"]["sub/extra"])
    assert_matches_h5py(ckpt, k3_sub["paths"]["weights"])


def test_keras3_sharded_weights(k3_sharded):
    index = k3_sharded["paths"]["index"]
    weight_map = json.loads(index.read_text())["weight_map"]
    expected_files = sorted({f for v in weight_map.values() for f in ([v] if isinstance(v, str) else v)})
    assert len(expected_files) > 1
    ckpt = ckptinspect.open(index)
    assert ckpt.format == "keras-weights-h5"
    assert ckpt.num_shards == len(expected_files)
    assert ckpt.info["shard_files"] == expected_files
    assert len(by_role(ckpt, "model")) == k3_sharded["n_weights"]
    assert len(by_role(ckpt, "optimizer")) == k3_sharded["n_optimizer"]
    # The step is the optimizer's iteration count (one fit step was taken), read with h5py.
    counter = ckpt[ckpt.info["iterations_key"]]
    with h5py.File(index.parent / ckpt.info["shard_files"][counter.shards[0]], "r") as f:
        assert ckpt.step == int(np.asarray(f[counter.key][()])) > 0
    seen = set()
    for var in ckpt:
        assert len(var.shards) == 1
        shard = index.parent / ckpt.info["shard_files"][var.shards[0]]
        with h5py.File(shard, "r") as h5:
            assert var.key in h5_datasets(h5), (var.key, shard)
            assert np.array_equal(ckpt.read(var), h5[var.key][()])
        seen.add(var.key)
    every = set()
    for name in expected_files:
        with h5py.File(index.parent / name, "r") as h5:
            every |= set(h5_datasets(h5))
    assert seen == every
    assert {v.shards[0] for v in ckpt} == set(range(len(expected_files)))


def test_sharded_missing_shard(k3_sharded, tmp_path):
    src = k3_sharded["paths"]["index"]
    for f in src.parent.iterdir():
        shutil.copy(f, tmp_path / f.name)
    files = json.loads(src.read_text())["weight_map"]
    last = sorted({f for v in files.values() for f in ([v] if isinstance(v, str) else v)})[-1]
    (tmp_path / last).unlink()
    with pytest.raises(CheckpointNotFoundError, match=last):
        ckptinspect.open(tmp_path / src.name)


def test_sharded_index_path_traversal(tmp_path, k3):
    shutil.copy(k3["paths"]["weights"], tmp_path / "real.weights.h5")
    index = tmp_path / "evil.weights.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {"/vars": ["../real.weights.h5"]}}))
    with pytest.raises(UnsafeFileError, match=r"evil\.weights\.json.*path traversal"):
        ckptinspect.open(index)


# -- Keras 2 (tf_keras) --------------------------------------------------------------------------
def test_tf_keras_full_model_with_optimizer(k2):
    ckpt = ckptinspect.open(k2["paths"]["h5"])
    assert ckpt.format == "keras-h5"
    model_vars = by_role(ckpt, "model")
    assert len(model_vars) == k2["n_weights"]
    with h5py.File(k2["paths"]["h5"], "r") as h5:
        for v in model_vars:
            assert v.key.endswith(":0")
            assert not v.name.endswith(":0")
            # The dataset is model_weights/<layer>/<Keras 2 weight name>.
            keras_name = v.key.split("/", 2)[2]
            assert np.array_equal(ckpt.read(v), k2["values"][keras_name]), v.key
            assert np.array_equal(h5[v.key][()], k2["values"][keras_name]), v.key  # h5py reads the same dataset
    # The duplicated layer/layer nesting is gone: model_weights/head/head/kernel:0 -> head/kernel.
    assert ckpt["head/kernel"].key == "model_weights/head/head/kernel:0"
    assert ckpt["encoder/enc_dense/kernel"].key == "model_weights/encoder/enc_dense/kernel:0"
    opt = by_role(ckpt, "optimizer")
    assert len(opt) == k2["n_optimizer"]
    assert all(v.key.startswith("optimizer_weights/") for v in opt)
    assert ckpt["optimizer/iteration"].key == "optimizer_weights/iteration:0"
    assert ckpt.info["keras_version"] == k2["keras_version"]
    assert ckpt.info["model_class"] == "Functional"
    assert_matches_h5py(ckpt, k2["paths"]["h5"])


def test_tf_keras_save_weights(k2):
    ckpt = ckptinspect.open(k2["paths"]["weights"])
    assert ckpt.format == "keras-h5"
    assert ckpt.info["layout"] == "legacy-weights"
    assert len(by_role(ckpt, "model")) == k2["n_weights"] == len(ckpt)
    assert ckpt["head/kernel"].key == "head/head/kernel:0"
    assert_matches_h5py(ckpt, k2["paths"]["weights"])


@pytest.mark.parametrize("which", ["k2", "k3"])
def test_split_layer_names(split, which):
    path = split["paths"][which]
    with h5py.File(path, "r") as h5:
        attrs = set(h5["model_weights"].attrs)
    assert "layer_names" not in attrs and {"layer_names0", "layer_names1"} <= attrs
    ckpt = ckptinspect.open(path)
    assert len(by_role(ckpt, "model")) == split["n_weights"][which] == 2 * keras_writers.SPLIT_LAYERS
    assert ckpt.info["layer_count"] == keras_writers.SPLIT_LAYERS
    first = f"layer_0000_{keras_writers.LONG_NAME_PAD}"
    assert ckpt.variables[0].name == f"{first}/kernel"
    assert ckpt.variables[-1].name == f"layer_{keras_writers.SPLIT_LAYERS - 1:04d}_{keras_writers.LONG_NAME_PAD}/bias"


# -- the real-world corpus -------------------------------------------------------------------
CORPUS = {
    # item: (file, format, model vars, optimizer vars)
    "keras2-h5-full-k206": ("model.h5", "keras-h5", 12, 25),
    "keras2-h5-full-tfk211-dotkeras": ("model.keras", "keras-h5", 3, 7),
    "keras3-legacy-h5-full": ("model.h5", "keras-h5", 6, 14),
    "keras2-h5-weights-k214": ("weights.h5", "keras-h5", 10, 0),
    "keras3-weights-h5": ("model.weights.h5", "keras-weights-h5", 6, 14),
}


@pytest.mark.parametrize("item", sorted(CORPUS))
def test_realworld_h5(realworld, item):
    name, fmt, n_model, n_opt = CORPUS[item]
    path = realworld / item / name
    ckpt = ckptinspect.open(path)
    assert ckpt.format == fmt
    assert len(by_role(ckpt, "model")) == n_model
    assert len(by_role(ckpt, "optimizer")) == n_opt
    assert len(by_role(ckpt, "metadata")) == 0
    assert_matches_h5py(ckpt, path)


def test_realworld_k206_names(realworld):
    ckpt = ckptinspect.open(realworld / "keras2-h5-full-k206" / "model.h5")
    assert ckpt["dense_1/kernel"].key == "model_weights/dense_1/dense_1/kernel:0"
    assert ckpt["optimizer/iterations"].key == "optimizer_weights/iterations:0"
    assert ckpt["optimizer/Variable_23"].role == "optimizer"
    assert float(ckpt.read("optimizer/iterations")) == 3623.0
    assert ckpt.info["keras_version"] == "2.0.6"
    assert ckpt.info["model_class"] == "Sequential"
    assert ckpt.info["layer_count"] == 12


def test_realworld_keras3_legacy_names(realworld):
    ckpt = ckptinspect.open(realworld / "keras3-legacy-h5-full" / "model.h5")
    assert ckpt["dense/kernel"].key == "model_weights/dense/sequential/dense/kernel"
    assert int(ckpt.read("optimizer/adam/iteration")) == 3500
    assert ckpt.info["keras_version"] == "3.8.0"


def test_realworld_dotkeras_is_hdf5(realworld):
    ckpt = ckptinspect.open(realworld / "keras2-h5-full-tfk211-dotkeras" / "model.keras")
    assert ckpt["embedding/embeddings"].shape == (10000, 16)
    assert ckpt["optimizer/iteration"].dtype == "int64"
    assert int(ckpt.read("optimizer/iteration")) == 6250
    assert ckpt.info["keras_version"] == "2.11.0"


def test_realworld_keras3_weights_names(realworld):
    ckpt = ckptinspect.open(realworld / "keras3-weights-h5" / "model.weights.h5")
    assert ckpt["dense/vars/0"].shape == (784, 128)
    assert int(ckpt.read("optimizer/vars/0")) == 10500


# -- no TensorFlow, no tensor bytes while listing ------------------------------------------------
def test_listing_and_reading_never_import_tensorflow(k3, k2, k3_sharded):
    paths = [k3["paths"]["h5"], k3["paths"]["weights"], k3_sharded["paths"]["index"], k2["paths"]["h5"]]
    code = (
        "import sys, ckptinspect\n"
        "for p in sys.argv[1:]:\n"
        "    with ckptinspect.open(p) as c:\n"
        "        for v in c: c.read(v)\n"
        "bad = [m for m in ('tensorflow', 'keras', 'tf_keras') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *map(str, paths)], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


class CountingFile(io.RawIOBase):
    """A file object that counts the bytes read through it."""

    def __init__(self, path):
        self._f = open(path, "rb")  # noqa: SIM115
        self.bytes_read = 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=0):
        return self._f.seek(offset, whence)

    def tell(self):
        return self._f.tell()

    def readinto(self, b):
        n = self._f.readinto(b)
        self.bytes_read += n or 0
        return n

    def close(self):
        self._f.close()
        super().close()


def test_listing_reads_metadata_only(tmp_path):
    keras = pytest.importorskip("keras")
    model = keras.Sequential([keras.Input((1000,)), keras.layers.Dense(1000, name="big")])
    path = tmp_path / "big.weights.h5"
    model.save_weights(path)
    size = path.stat().st_size
    assert size > 4_000_000
    f = CountingFile(path)
    with h5py.File(f, "r") as h5:
        listing = keras_h5.list_h5_file(h5, str(path))
    assert [v.shape for v in listing.variables] == [(1000, 1000), (1000,)]
    assert f.bytes_read < 64 * 1024 < size
    f.close()


# -- damaged and non-Keras files -----------------------------------------------------------------
def test_truncated_h5(k3, tmp_path):
    data = k3["paths"]["h5"].read_bytes()
    bad = tmp_path / "truncated.h5"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptCheckpointError, match=r"truncated\.h5.*truncated"):
        ckptinspect.open(bad)
    with pytest.raises(CorruptCheckpointError, match=r"truncated\.h5"):
        keras_h5.open_h5(str(bad))


def test_not_hdf5(tmp_path):
    bad = tmp_path / "notes.h5"
    bad.write_text("this is not an HDF5 file\n")
    with pytest.raises(NotACheckpointError, match=r"notes\.h5"):
        ckptinspect.open(bad)
    with pytest.raises(NotACheckpointError, match=r"notes\.h5.*not an HDF5 file"):
        keras_h5.open_h5(str(bad))
    with pytest.raises(CheckpointNotFoundError, match=r"missing\.h5"):
        keras_h5.open_h5(str(tmp_path / "missing.h5"))


def test_hdf5_but_not_keras(tmp_path):
    path = tmp_path / "data.h5"
    with h5py.File(path, "w") as h5:
        h5["table"] = np.arange(10)
    with pytest.raises(NotACheckpointError, match=r"data\.h5.*not Keras weights"):
        ckptinspect.open(path)


def test_layer_names_pointing_nowhere(tmp_path):
    path = tmp_path / "dangling.h5"
    with h5py.File(path, "w") as h5:
        h5.attrs["layer_names"] = [b"dense"]
        g = h5.create_group("dense")
        g.attrs["weight_names"] = [b"dense/kernel:0"]
    with pytest.raises(CorruptCheckpointError, match=r"dangling\.h5.*dense/dense/kernel:0"):
        ckptinspect.open(path)


@pytest.mark.parametrize("bad", ["truncated", "text"])
def test_cli_one_error_line(k3, tmp_path, bad):
    path = tmp_path / "bad.h5"
    if bad == "truncated":
        path.write_bytes(k3["paths"]["h5"].read_bytes()[:3000])
    else:
        path.write_text("hello\n")
    out = subprocess.run(
        [sys.executable, "-m", "ckptinspect", "ls", str(path)], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and "bad.h5" in lines[0], out.stderr
    assert "Traceback" not in out.stderr


# -- unsafe files (crafted with h5py) --------------------------------------------------------------
def _keras3_like(h5: h5py.File) -> h5py.Group:
    vars_group = h5.create_group("layers/dense/vars")
    vars_group.attrs["name"] = "dense"
    vars_group["0"] = np.ones((2, 2), "float32")
    return vars_group


def test_soft_link_refused(tmp_path):
    path = tmp_path / "soft.weights.h5"
    with h5py.File(path, "w") as h5:
        g = _keras3_like(h5)
        g["1"] = h5py.SoftLink("/layers/dense/vars/0")
    with pytest.raises(UnsafeFileError, match=r"soft\.weights\.h5: soft link 'layers/dense/vars/1'"):
        ckptinspect.open(path)


def test_external_link_refused(tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as h5:
        h5["secret"] = np.arange(3)
    path = tmp_path / "ext.weights.h5"
    with h5py.File(path, "w") as h5:
        g = _keras3_like(h5)
        g["1"] = h5py.ExternalLink(str(other), "/secret")
    with pytest.raises(UnsafeFileError, match=r"ext\.weights\.h5: external link 'layers/dense/vars/1'"):
        ckptinspect.open(path)


def test_legacy_external_link_refused(tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as h5:
        h5["kernel"] = np.arange(3)
    path = tmp_path / "legacy.h5"
    with h5py.File(path, "w") as h5:
        h5.attrs["layer_names"] = [b"dense"]
        g = h5.create_group("dense")
        g.attrs["weight_names"] = [b"dense/kernel:0"]
        g["dense/kernel:0"] = h5py.ExternalLink(str(other), "/kernel")
    with pytest.raises(UnsafeFileError, match=r"legacy\.h5: external link"):
        ckptinspect.open(path)


def test_external_dataset_refused(tmp_path):
    raw = tmp_path / "raw.bin"
    raw.write_bytes(np.arange(4, dtype="float32").tobytes())
    path = tmp_path / "extds.weights.h5"
    with h5py.File(path, "w") as h5:
        g = _keras3_like(h5)
        g.create_dataset("1", shape=(4,), dtype="float32", external=[(str(raw), 0, 16)])
    with pytest.raises(UnsafeFileError, match=r"extds\.weights\.h5: dataset 'layers/dense/vars/1' keeps its data in external"):
        ckptinspect.open(path)


def test_virtual_dataset_refused(tmp_path):
    src = tmp_path / "src.h5"
    with h5py.File(src, "w") as h5:
        h5["data"] = np.arange(4, dtype="float32")
    path = tmp_path / "vds.weights.h5"
    layout = h5py.VirtualLayout(shape=(4,), dtype="float32")
    layout[:] = h5py.VirtualSource(str(src), "data", shape=(4,))
    with h5py.File(path, "w") as h5:
        g = _keras3_like(h5)
        g.create_virtual_dataset("1", layout)
    with pytest.raises(UnsafeFileError, match=r"vds\.weights\.h5: dataset 'layers/dense/vars/1' is a virtual dataset"):
        ckptinspect.open(path)


def test_absurd_shape_refused(tmp_path):
    path = tmp_path / "huge.weights.h5"
    with h5py.File(path, "w") as h5:
        g = _keras3_like(h5)
        g.create_dataset("1", shape=(2**20, 2**20), dtype="float32", chunks=(1, 1024))  # 4 TiB, nothing stored
    assert path.stat().st_size < 100_000
    with pytest.raises(UnsafeFileError, match=r"huge\.weights\.h5: dataset 'layers/dense/vars/1' declares shape"):
        ckptinspect.open(path)


def test_shape_bomb_refused(tmp_path):
    path = tmp_path / "bomb.weights.h5"
    with h5py.File(path, "w") as h5:
        g = _keras3_like(h5)
        ds = g.create_dataset("1", shape=(2**31,), dtype="float32", chunks=(2**20,), compression="gzip")  # 8 GiB
        ds[:10] = 1.0
    with pytest.raises(UnsafeFileError, match=r"bomb\.weights\.h5: dataset 'layers/dense/vars/1' declares 8589934592 bytes but stores only"):
        ckptinspect.open(path)


def test_value_read_rechecks_links(k3, tmp_path):
    path = tmp_path / "swap.weights.h5"
    shutil.copy(k3["paths"]["weights"], path)
    ckpt = ckptinspect.open(path)
    var = ckpt["head/vars/0"]
    with h5py.File(path, "a") as h5:  # the file changes after listing
        del h5[var.key]
        h5[var.key] = h5py.SoftLink("/layers/dense/vars/1")
    with pytest.raises(UnsafeFileError, match="SoftLink"):
        ckpt.read(var)
    ckpt.close()


def test_hard_link_cycle_walked_once(tmp_path):
    path = tmp_path / "cycle.weights.h5"
    with h5py.File(path, "w") as h5:
        g = _keras3_like(h5)
        h5["layers/dense/again"] = h5["layers/dense"]  # a group containing itself
        g["1"] = np.zeros(2, "float32")
    ckpt = ckptinspect.open(path)
    assert sorted(v.key for v in ckpt) == ["layers/dense/vars/0", "layers/dense/vars/1"]
    assert [v.name for v in ckpt] == ["dense/vars/0", "dense/vars/1"]


@pytest.mark.parametrize(
    "item, name, key, value",
    [
        ("keras2-h5-full-k206", "model.h5", "optimizer_weights/iterations:0", 3623),
        ("keras2-h5-full-tfk211-dotkeras", "model.keras", "optimizer_weights/iteration:0", 6250),
        ("keras3-legacy-h5-full", "model.h5", "optimizer_weights/adam/iteration", 3500),
        ("keras3-weights-h5", "model.weights.h5", "optimizer/vars/0", 10500),
        ("keras2-h5-weights-k214", "weights.h5", None, None),
    ],
)
def test_realworld_iteration_counter(realworld, item, name, key, value):
    """The counter is found from metadata; its value (MANIFEST) is the file's step."""
    ckpt = ckptinspect.open(realworld / item / name)
    assert ckpt.info.get("iterations_key") == key
    assert ckpt.step == (value if key is not None else None)
    if key is not None:
        assert ckpt[key].role == "optimizer"
        assert int(ckpt.read(key)) == value


def test_written_iteration_counter(k3, k2):
    opt = k3["optimizer_name"]
    for path, key in [(k3["paths"]["weights"], "optimizer/vars/0"), (k3["paths"]["h5"], f"optimizer_weights/{opt}/iteration"),
                      (k2["paths"]["h5"], "optimizer_weights/iteration:0")]:
        ckpt = ckptinspect.open(path)
        assert ckpt.info["iterations_key"] == key
        assert int(ckpt.read(key)) == 2  # one epoch of 16 samples, batch size 8


@pytest.mark.parametrize(
    "relpath, step, key",
    [
        ("keras2-h5-full-k206/model.h5", 3623, "optimizer_weights/iterations:0"),
        ("keras2-h5-full-tfk211-dotkeras/model.keras", 6250, "optimizer_weights/iteration:0"),
        ("keras3-legacy-h5-full/model.h5", 3500, "optimizer_weights/adam/iteration"),
        ("keras3-weights-h5/model.weights.h5", 10500, "optimizer/vars/0"),
        ("keras3-zip/out/final_model.keras", 21600, "optimizer/vars/0"),
        ("keras214-zip-backslash-paths/model.keras", 5850, "optimizer/vars/0"),
        ("keras2-h5-weights-k214/weights.h5", None, None),
    ],
)
def test_step_is_the_optimizer_iteration_count(realworld, relpath, step, key):
    """MANIFEST's iteration counts; the value is checked with h5py (inside the zip for .keras)."""
    ckpt = ckptinspect.open(str(realworld / relpath))
    assert ckpt.step == step
    assert ckpt.step_source == (None if key is None else f"optimizer:{key}")
    if key is not None and relpath.endswith(".h5"):
        with h5py.File(realworld / relpath, "r") as f:
            assert int(np.asarray(f[key][()]).reshape(())) == step


def _hdf5_object_visit(path):
    """What HDF5's own object visit (H5Ovisit) lists: each object once, in its order."""
    objects = []
    with h5py.File(path, "r") as h5:
        h5py.h5o.visit(h5["/"].id, lambda raw, info: objects.append((raw.decode(), info.type)), info=True)
    datasets = [n for n, t in objects if t == h5py.h5o.TYPE_DATASET]
    groups = {n for n, t in objects if t == h5py.h5o.TYPE_GROUP}
    return datasets, groups


def test_walk_lists_objects_as_hdf5s_object_visit(tmp_path):
    """The walk's one link visit lists what H5Ovisit lists, in its order: a dataset or group
    reached through several hard links once (under its first name), links back to the root or
    to a parent, empty groups, named datatypes skipped; ``vars`` names read from empty groups too."""
    from ckptinspect.formats.keras.h5_walk import _walk

    path = tmp_path / "links.weights.h5"
    with h5py.File(path, "w") as h5:
        g = _keras3_like(h5)
        g["1"] = np.arange(3, dtype="int64")
        h5["layers/alias/vars/0"] = g["0"]  # one dataset under two names: listed once, first name
        h5["b_group_again"] = h5["layers/dense"]  # a group under two names: entered once
        h5["layers/dense/to_root"] = h5["/"]  # back to the root
        h5["layers/dense/vars/to_parent"] = h5["layers/dense"]  # back to a parent
        h5.create_group("empty")
        h5.create_group("layers/lonely/vars").attrs["name"] = "lonely"  # an empty vars group
        h5["named_type"] = np.dtype("<f4")  # a committed datatype: no variable
        h5["z/late"] = np.ones(2, "float32")
    datasets, groups = _hdf5_object_visit(path)
    assert "layers/alias/vars/0" not in datasets and "empty" in groups  # the file is what we meant
    with h5py.File(path, "r") as h5:
        walk = _walk(h5, str(path))
    assert list(walk.datasets) == datasets
    assert walk.groups == groups
    # name order reaches the dense layer first as b_group_again (HDF5 lists it there)
    assert walk.vars_names == {"b_group_again/vars": "dense", "layers/lonely/vars": "lonely"}
    assert datasets == ["b_group_again/vars/0", "b_group_again/vars/1", "z/late"]
    ckpt = ckptinspect.open(path)
    assert sorted(v.key for v in ckpt) == datasets


def test_files_are_read_with_a_small_metadata_cache():
    """Issue 28: HDF5's metadata cache may grow to 32 MiB by default, ~180 MiB of RSS on a file
    of 20,000 datasets (it keeps every object header and group node visited); files we read
    cap it at METADATA_CACHE_BYTES, and list the same."""
    from ckptinspect.formats.keras import h5_read

    path = ROOT / "fixtures" / "keras" / "model.weights.h5"
    h5 = h5_read._open_file(str(path))
    try:
        config = h5.id.get_mdc_config()
        assert config.max_size == h5_read.METADATA_CACHE_BYTES < 32 << 20
        assert config.initial_size <= h5_read.METADATA_CACHE_BYTES and config.min_size <= h5_read.METADATA_CACHE_BYTES
    finally:
        h5.close()
    with ckptinspect.open(str(path)) as ckpt:
        assert len(ckpt.variables) > 0 and all(ckpt.read(v) is not None for v in ckpt.variables)
