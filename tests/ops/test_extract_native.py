"""``extract`` to a TF bundle through ckptinspect's own writer: no TensorFlow on the way, TF
reads every output.

Ground truth comes from the libraries that wrote the sources (TensorFlow's reader for
bundles, h5py, numpy, safetensors, and torch's values recorded in fixtures/torch/expected.npz);
every output is read with ``tf.train.load_checkpoint`` or restored with
``tf.train.Checkpoint(model=...).read(...).assert_consumed()``.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import ckptinspect
from ckptinspect.errors import CorruptCheckpointError

tf = pytest.importorskip("tensorflow")
h5py = pytest.importorskip("h5py")
st_numpy = pytest.importorskip("safetensors.numpy")

from ckptinspect import trainer  # noqa: E402

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures"
GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def tf_values(prefix) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(str(prefix))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if k != GRAPH_KEY}


def weights_of(model) -> list[np.ndarray]:
    return [w.numpy() for w in model.weights]


def reference(prefix) -> list[np.ndarray]:
    ref = trainer.build_model(seed=7)
    tf.train.Checkpoint(model=ref).read(str(prefix)).expect_partial()
    return weights_of(ref)


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("native_src")
    for name in ("run", "sharded", "keras"):
        shutil.copytree(FIXTURES / name, root / name)
    return root


# -- TF sources: copies, no TensorFlow -----------------------------------------------------------
def test_extract_to_tf_imports_no_tensorflow(src, tmp_path):
    """The whole extract (open, prune, copy, read back) in a fresh process: TF never imported."""
    code = (
        "import sys, ckptinspect\n"
        f"r = ckptinspect.extract({str(src / 'sharded')!r}, {str(tmp_path / 'a')!r})\n"
        f"s = ckptinspect.extract({str(src / 'run')!r}, {str(tmp_path / 'b')!r}, keep=('model', 'metadata'))\n"
        "assert r.verified == r.copied == 10 and s.verified == s.copied == 12, (r.copied, s.copied)\n"
        f"ckptinspect.extract({str(src / 'run')!r}, {str(tmp_path / 'c.safetensors')!r})\n"
        f"t = ckptinspect.extract({str(tmp_path / 'c.safetensors')!r}, {str(tmp_path / 'c')!r})\n"
        "assert t.object_graph['root_children'] == ['model'] and t.verified == 10\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras', 'tf_keras'))\n"
        "assert not bad, bad[:5]\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("a", "c"):
        tf.train.Checkpoint(model=trainer.build_model(seed=3)).read(str(tmp_path / name)).assert_consumed()
    step = tf.Variable(0, dtype=tf.int64)
    tf.train.Checkpoint(model=trainer.build_model(seed=3), step=step).read(
        str(tmp_path / "b")).assert_existing_objects_matched()
    assert int(step.numpy()) == 8


@pytest.mark.parametrize("source", ["run/ckpt-8", "sharded/ckpt-4"])
@pytest.mark.parametrize("max_shard_bytes", [None, 0, 700])
def test_tf_reads_every_copied_value_and_restores(src, tmp_path, source, max_shard_bytes):
    out = tmp_path / "m"
    report = ckptinspect.extract(str(src / source), str(out), max_shard_bytes=max_shard_bytes)
    fresh = trainer.build_model(seed=3)
    tf.train.Checkpoint(model=fresh).read(str(out)).assert_consumed()
    assert all(same_bits(a, b) for a, b in zip(weights_of(fresh), reference(src / source)))
    got, want = tf_values(out), tf_values(src / source)
    kept = {v.key: v.output_key for v in report.variables if v.kept}
    assert set(got) == set(kept.values())
    assert all(same_bits(got[new], want[old]) for old, new in kept.items())
    assert report.copied == len(kept) and report.copied_bytes == report.kept["all"]["nbytes"]
    if max_shard_bytes is None:
        assert report.num_shards == 1
    else:
        assert report.num_shards > 1 and len(list(tmp_path.glob("m.data-*"))) == report.num_shards
    assert ckptinspect.verify(str(out)).intact


def test_report_json_has_copies_per_role_and_saving(src, tmp_path):
    doc = ckptinspect.extract(str(src / "run"), str(tmp_path / "m")).to_dict()
    assert doc["copied"] == doc["kept"]["all"]["count"] == doc["verified"] == 10
    assert doc["copied_bytes"] == doc["kept"]["all"]["nbytes"] == doc["kept"]["model"]["nbytes"] > 0
    assert doc["dropped"]["optimizer"]["count"] > 0 and 0 < doc["saving"] < 1


def test_damaged_copy_source_is_refused_and_nothing_written(src, tmp_path):
    """A flipped byte in a kept tensor of the source: the read-back check sees it (the copy
    reuses the source's crc32c, so the bytes are checked against it)."""
    d = tmp_path / "run"
    shutil.copytree(src / "run", d)
    with ckptinspect.open(str(d / "ckpt-8")) as ckpt:
        v = ckpt["head/kernel"]
        run = ckpt.source.stored_runs(v)[0]
    with open(run.path, "r+b") as f:
        f.seek(run.entry.offset + 5)
        byte = f.read(1)
        f.seek(run.entry.offset + 5)
        f.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(CorruptCheckpointError, match="checksum does not match"):
        ckptinspect.extract(str(d / "ckpt-8"), str(tmp_path / "out"))
    assert not list(tmp_path.glob("out*"))


# -- any source -> a name-based TF bundle ---------------------------------------------------------
def _npz_source(tmp_path: pathlib.Path) -> tuple[pathlib.Path, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    values = {
        "dense/kernel": rng.normal(size=(4, 3)).astype(np.float32),
        "dense/bias": rng.normal(size=(3,)).astype(np.float64),
        "ids": np.arange(5, dtype=np.int16),
        "flags": np.array([True, False, True]),
        "z": (rng.normal(size=2) + 1j * rng.normal(size=2)).astype(np.complex128),
    }
    path = tmp_path / "w.npz"
    np.savez(path, **values)
    return path, values


def _torch_expected(name: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "torch" / "expected.npz") as npz:
        return {k.split("::", 1)[1]: npz[k] for k in npz.files if k.startswith(name + "::")}


def _h5_values(path: pathlib.Path, keys: dict[str, str]) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        return {name: f[key][()] for name, key in keys.items()}


@pytest.mark.parametrize("kind", ["safetensors", "torch-dtypes", "torch-state-dict", "weights-h5", "legacy-h5", "npz"])
def test_any_source_gives_a_name_based_bundle_tensorflow_reads(src, tmp_path, kind):
    if kind == "safetensors":
        path = FIXTURES / "torch" / "model.safetensors"
        expected = st_numpy.load_file(str(path))
    elif kind == "torch-dtypes":
        path = FIXTURES / "torch" / "dtypes.pt"
        expected = _torch_expected("dtypes.pt")
    elif kind == "torch-state-dict":
        path = FIXTURES / "torch" / "state_dict.pt"
        expected = _torch_expected("state_dict.pt")
    elif kind == "npz":
        path, expected = _npz_source(tmp_path)
    else:
        path = src / "keras" / ("model.weights.h5" if kind == "weights-h5" else "model.h5")
        with ckptinspect.open(str(path)) as ckpt:
            keys = {v.name: v.key for v in ckpt.variables if v.role == "model"}
        expected = _h5_values(path, keys)
    out = tmp_path / "out" / "ckpt"
    out.parent.mkdir()
    report = ckptinspect.extract(str(path), str(out))
    got = tf_values(out)
    assert set(got) == set(expected), (sorted(got), sorted(expected))
    for name, value in expected.items():
        value = np.asarray(value)
        if got[name].dtype.name != value.dtype.name:  # expected.npz holds bfloat16/float8 as their bits
            assert got[name].dtype.itemsize == value.dtype.itemsize and value.dtype.kind in "uV", name
            assert got[name].shape == value.shape and got[name].tobytes() == value.tobytes(), name
        else:
            assert same_bits(got[name], value), name
    assert report.verified == len(expected) and report.object_graph is None
    assert any("name-based TF bundle" in n for n in report.notes)
    assert ckptinspect.verify(str(out)).intact


def test_name_based_bundle_maps_with_init_from_checkpoint(tmp_path):
    """The keys are what ``tf.compat.v1.train.init_from_checkpoint`` maps from."""
    path, values = _npz_source(tmp_path)
    out = tmp_path / "ckpt"
    ckptinspect.extract(str(path), str(out))
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        with v1.variable_scope("net"):
            kernel = v1.get_variable("kernel", [4, 3], dtype=tf.float32, initializer=v1.zeros_initializer())
            bias = v1.get_variable("bias", [3], dtype=tf.float64, initializer=v1.zeros_initializer())
        v1.train.init_from_checkpoint(str(out), {"dense/": "net/"})
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            got_kernel, got_bias = sess.run([kernel, bias])
    assert same_bits(got_kernel, values["dense/kernel"]) and same_bits(got_bias, values["dense/bias"])


def test_torch_training_dict_keeps_model_state_only(tmp_path):
    out = tmp_path / "ckpt"
    report = ckptinspect.extract(str(FIXTURES / "torch" / "training.pt"), str(out))
    got = tf_values(out)
    expected = {k: v for k, v in _torch_expected("training.pt").items() if k.startswith("model_state_dict/")}
    assert set(got) == set(expected) and all(same_bits(got[k], expected[k]) for k in expected)
    assert report.dropped["optimizer"]["count"] > 0


# -- TF -> .safetensors -> TF ---------------------------------------------------------------------
@pytest.mark.parametrize(("source", "prefix"), [("run", "run/ckpt-8"), ("sharded/ckpt-4", "sharded/ckpt-4")])
def test_tf_to_safetensors_to_tf_round_trip_restores_bit_identical(src, tmp_path, source, prefix):
    st = tmp_path / "m.safetensors"
    ckptinspect.extract(str(src / source), str(st))
    from safetensors import safe_open  # noqa: PLC0415

    with safe_open(str(st), "np") as f:
        meta = f.metadata()
    keys = json.loads(meta["tf_checkpoint_keys"])
    assert set(keys) == set(st_numpy.load_file(str(st))) and all(k.startswith("model/") for k in keys.values())

    back = tmp_path / "back"
    report = ckptinspect.extract(str(st), str(back))
    assert report.object_graph["root_children"] == ["model"]
    fresh = trainer.build_model(seed=9)
    tf.train.Checkpoint(model=fresh).read(str(back)).assert_consumed()
    assert all(same_bits(a, b) for a, b in zip(weights_of(fresh), reference(src / prefix)))
    # The same checkpoint as extracting straight from the TF source: keys, values, object graph.
    direct = tmp_path / "direct"
    ckptinspect.extract(str(src / source), str(direct))
    got, want = tf_values(back), tf_values(direct)
    assert set(got) == set(want) and all(same_bits(got[k], want[k]) for k in want)
    graph = tf.train.load_checkpoint(str(back)).get_tensor(GRAPH_KEY)
    assert graph == tf.train.load_checkpoint(str(direct)).get_tensor(GRAPH_KEY)
    assert ckptinspect.verify(str(back)).intact


def test_safetensors_metadata_that_does_not_fit_is_refused(src, tmp_path):
    st = tmp_path / "m.safetensors"
    ckptinspect.extract(str(src / "run"), str(st))
    from safetensors import safe_open  # noqa: PLC0415

    with safe_open(str(st), "np") as f:
        meta = f.metadata()
    tensors = st_numpy.load_file(str(st))
    keys = json.loads(meta["tf_checkpoint_keys"])
    keys.pop(next(iter(keys)))
    bad = tmp_path / "bad.safetensors"
    st_numpy.save_file(tensors, str(bad), metadata={**meta, "tf_checkpoint_keys": json.dumps(keys)})
    with pytest.raises(CorruptCheckpointError, match="has no checkpoint key for"):
        ckptinspect.extract(str(bad), str(tmp_path / "out"))
    assert not list(tmp_path.glob("out*"))
