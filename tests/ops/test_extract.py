"""`ckptinspect extract`: model-only outputs restored into fresh models, bit for bit.

Sources are real: the trainer's Keras 3 + Adam checkpoints saved under MirroredStrategy with
tf.train.CheckpointManager (the committed ``fixtures/run`` and ``fixtures/sharded``, copied to
a temporary directory), Keras 2 (``tf_keras``) files (``fixtures/keras``), and a TF1
``tf.compat.v1.train.Saver`` checkpoint with Adam slots and a partitioned variable, plus a
SavedModel, both written here. Ground truth comes from TensorFlow and Keras: every output is
restored into a freshly built model (or a fresh TF1 graph) and compared value by value with the
source as TensorFlow / Keras / h5py read it, never with ckptinspect's reader.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

import ckptinspect
from ckptinspect import _atomic
from ckptinspect.cli import app
from ckptinspect.errors import CkptError, OutputExistsError, UsageError

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
h5py = pytest.importorskip("h5py")

from ckptinspect import trainer  # noqa: E402
from ckptinspect.trainer import net as trainer_net  # noqa: E402

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures"
GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
runner = CliRunner()


# -- helpers -------------------------------------------------------------------------------
def tree_hash(path: pathlib.Path) -> dict[str, str]:
    """sha256 of every file under ``path`` (or of ``path`` itself)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def tf_keys(prefix) -> set[str]:
    return set(tf.train.load_checkpoint(str(prefix)).get_variable_to_shape_map()) - {GRAPH_KEY}


def object_graph(prefix):
    from tensorflow.core.protobuf import trackable_object_graph_pb2  # noqa: PLC0415

    g = trackable_object_graph_pb2.TrackableObjectGraph()
    g.ParseFromString(tf.train.load_checkpoint(str(prefix)).get_tensor(GRAPH_KEY))
    return g


def restored_reference(src) -> keras.Model:
    """The trainer's model restored from ``src`` by TensorFlow itself (the ground truth)."""
    ref = trainer.build_model(seed=7)
    tf.train.Checkpoint(model=ref).read(str(src)).expect_partial()
    return ref


def assert_weights_equal(model, ref) -> None:
    assert len(model.weights) == len(ref.weights) > 0
    for w, r in zip(model.weights, ref.weights):
        assert same_bits(w.numpy(), r.numpy()), w.path


# -- sources -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def src(tmp_path_factory) -> dict[str, pathlib.Path]:
    """Copies of the committed trainer fixtures (Keras 3 + Adam under MirroredStrategy, Keras 2 files)."""
    root = tmp_path_factory.mktemp("src")
    for name in ("run", "sharded", "keras"):
        shutil.copytree(FIXTURES / name, root / name)
    return {
        "run": root / "run",
        "run_prefix": root / "run" / "ckpt-8",
        "sharded": root / "sharded" / "ckpt-4",
        "k2_tf": root / "keras" / "keras2_tf" / "ckpt",
        "k2_h5": root / "keras" / "keras2_model.h5",
        "k3_keras": root / "keras" / "model.keras",
        "root": root,
    }


@pytest.fixture(scope="module")
def tf1(tmp_path_factory) -> dict:
    """A TF1 name-based Saver checkpoint: dense layer, a partitioned embedding, Adam, global_step."""
    directory = tmp_path_factory.mktemp("tf1")
    v1 = tf.compat.v1

    def model_vars():
        with v1.variable_scope("dense"):
            w = v1.get_variable("kernel", [4, 6], initializer=v1.glorot_uniform_initializer(seed=1))
            b = v1.get_variable("bias", [6], initializer=v1.constant_initializer(0.5))
        with v1.variable_scope("emb"):
            e = v1.get_variable("table", [10, 3], partitioner=v1.fixed_size_partitioner(2),
                                initializer=v1.random_normal_initializer(seed=2))
        return w, b, e

    with tf.Graph().as_default():
        w, b, e = model_vars()
        x = v1.placeholder(tf.float32, [None, 4])
        step = v1.train.get_or_create_global_step()
        loss = tf.reduce_sum(tf.square(tf.matmul(x, w) + b)) + tf.reduce_sum(tf.nn.embedding_lookup(e, [1, 7]))
        train = v1.train.AdamOptimizer(0.01).minimize(loss, global_step=step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train, {x: np.ones((2, 4), np.float32)})
            prefix = v1.train.Saver().save(sess, str(directory / "model.ckpt"), global_step=step)
    return {"prefix": prefix, "model_vars": model_vars}


class Net(tf.Module):
    def __init__(self, seed: int):
        rng = np.random.default_rng(seed)
        self.w = tf.Variable(rng.normal(size=(3, 2)).astype(np.float32), name="w")
        self.b = tf.Variable(rng.normal(size=(2,)).astype(np.float32), name="b")

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def __call__(self, x):
        return tf.matmul(x, self.w) + self.b


@pytest.fixture(scope="module")
def savedmodel(tmp_path_factory) -> pathlib.Path:
    """A SavedModel whose root tracks a Keras 3 Adam optimizer with slots."""
    directory = tmp_path_factory.mktemp("sm") / "export"
    net = Net(0)
    net.opt = keras.optimizers.Adam(0.1)
    net.opt.build([net.w, net.b])
    net.opt.apply_gradients([(tf.ones_like(net.w), net.w), (tf.ones_like(net.b), net.b)])
    tf.saved_model.save(net, str(directory))
    return directory


# -- TF2: Keras 3 under MirroredStrategy ---------------------------------------------------
@pytest.fixture(scope="module")
def run_tf(src, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "model"
    before = tree_hash(src["run"])
    report = ckptinspect.extract(str(src["run"]), str(out))
    return {"out": out, "report": report, "before": before, "after": tree_hash(src["run"])}


def test_tf2_output_restores_fresh_model_assert_consumed_bit_identical(src, run_tf):
    fresh = trainer.build_model(seed=3)
    tf.train.Checkpoint(model=fresh).read(str(run_tf["out"])).assert_consumed()
    assert_weights_equal(fresh, restored_reference(src["run_prefix"]))


def test_tf2_output_keys_are_the_ones_tensorflow_writes_for_the_model(run_tf, tmp_path):
    written = tf.train.Checkpoint(model=trainer.build_model()).write(str(tmp_path / "tf"))
    assert tf_keys(run_tf["out"]) == tf_keys(written)
    # Keras 3 keeps its weights under optimizer/_trainable_variables in the source: kept, re-keyed.
    report = run_tf["report"]
    moved = [v for v in report.variables if v.kept and v.key.startswith("optimizer/_trainable_variables/")]
    assert len(moved) == len(trainer.build_model().trainable_weights) == 6
    assert all(v.output_key.startswith("model/") for v in moved)


def test_tf2_output_has_no_optimizer_state_and_source_untouched(src, run_tf):
    keys = tf_keys(run_tf["out"])
    assert not any(k.startswith(("optimizer/", "save_counter", "step")) or "OPTIMIZER_SLOT" in k for k in keys)
    graph = object_graph(run_tf["out"])
    names = {c.local_name for n in graph.nodes for c in n.children}
    assert not names & {"optimizer", "_iterations", "_momentums", "_velocities", "save_counter"}
    assert all(not n.slot_variables for n in graph.nodes)
    assert run_tf["before"] == run_tf["after"]
    assert _atomic.leftover_temporaries(str(run_tf["out"].parent)) == []


def test_tf2_report_counts_bytes_and_saving(src, run_tf):
    reader = tf.train.load_checkpoint(str(src["run_prefix"]))
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    total = sum(int(np.prod(shapes[k], dtype=np.int64)) * dtypes[k].size for k in shapes if k != GRAPH_KEY)
    r = run_tf["report"]
    assert r.kept["model"]["count"] == len(trainer.build_model().weights) == len(tf_keys(run_tf["out"]))
    assert r.kept["optimizer"]["count"] == 0 and r.dropped["model"]["count"] == 0
    assert r.dropped["optimizer"]["count"] > r.kept["model"]["count"]
    assert r.kept["all"]["nbytes"] + r.dropped["all"]["nbytes"] == total
    assert r.verified == r.kept["all"]["count"]
    on_disk = sum(os.path.getsize(f) for f in r.files)
    assert r.output_file_bytes == on_disk and 0 < r.saving < 1
    assert r.output_format == "tf" and r.object_graph["root_children"] == ["model"]


@pytest.fixture(scope="module")
def fresh_run(tmp_path_factory) -> pathlib.Path:
    """A checkpoint trained now by the fixture trainer: one Adam step under MirroredStrategy on 2
    logical CPUs (a fresh process, since logical devices must be set before TF initialises)."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    out = tmp_path_factory.mktemp("train") / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "ckptinspect.trainer", str(out), "--steps", "1", "--save-every", "1", "--replicas", "2"],
        capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.mark.slow  # trains under MirroredStrategy in a subprocess (~10 s)
def test_fresh_mirrored_training_checkpoint_extracts_and_restores(fresh_run, tmp_path):
    meta = json.loads((fresh_run / "metadata.json").read_text())
    assert meta["replicas"] == 2 and meta["optimizer"]["class"] == "Adam"
    prefix = tf.train.latest_checkpoint(str(fresh_run))
    before = tree_hash(fresh_run)
    report = ckptinspect.extract(str(fresh_run), str(tmp_path / "m"))
    assert report.source == prefix and report.dropped["optimizer"]["count"] > 0
    fresh = trainer.build_model(seed=11)
    tf.train.Checkpoint(model=fresh).read(str(tmp_path / "m")).assert_consumed()
    assert_weights_equal(fresh, restored_reference(prefix))
    assert tree_hash(fresh_run) == before


def test_sharded_sliced_source_one_tensor_per_shard(src, tmp_path):
    """max_shard_bytes=0: every stored run (a tensor, each slice of a sliced one, the object
    graph) in a data file of its own; the source's slices are kept as they are stored."""
    out = tmp_path / "m"
    report = ckptinspect.extract(str(src["sharded"]), str(out), max_shard_bytes=0)
    with ckptinspect.open(str(src["sharded"])) as source:
        kept = [source[v.key] for v in report.variables if v.kept]
        runs = sum(max(1, len(v.slices)) for v in kept)
        sliced = {v.name: len(v.slices) for v in kept if v.slices}
    assert len(sliced) == 2 and runs == len(kept) + 2 == report.kept["all"]["count"] + 2
    assert report.num_shards == runs + 1
    assert len(list(tmp_path.glob("m.data-*"))) == runs + 1
    with ckptinspect.open(str(out)) as written:
        assert {v.name: len(v.slices) for v in written.variables if v.slices} == sliced
    assert report.copied == len(kept) and report.copied_bytes == report.kept["all"]["nbytes"]
    fresh = trainer.build_model(seed=4)
    tf.train.Checkpoint(model=fresh).read(str(out)).assert_consumed()
    assert_weights_equal(fresh, restored_reference(src["sharded"]))


def test_keep_metadata_keeps_step(src, tmp_path):
    out = tmp_path / "m"
    ckptinspect.extract(str(src["run_prefix"]), str(out), keep=("model", "metadata"))
    reader = tf.train.load_checkpoint(str(out))
    assert reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == 8
    step = tf.Variable(0, dtype=tf.int64)
    fresh = trainer.build_model(seed=5)
    tf.train.Checkpoint(model=fresh, step=step).read(str(out)).assert_existing_objects_matched()
    assert int(step.numpy()) == 8


# -- TF2: Keras 2 save_weights (the root is the model) ------------------------------------
def test_keras2_tf_save_weights_output_loads_with_assert_consumed(src, tmp_path):
    tf_keras = pytest.importorskip("tf_keras")
    out = tmp_path / "k2"
    report = ckptinspect.extract(str(src["k2_tf"]), str(out))
    assert report.dropped["optimizer"]["count"] > 0
    fresh = trainer_net.build_keras2_model(tf_keras, seed=1)
    fresh.load_weights(str(out)).assert_consumed()
    ref = trainer_net.build_keras2_model(tf_keras, seed=2)
    ref.load_weights(str(src["k2_tf"])).expect_partial()
    assert_weights_equal(fresh, ref)
    assert not any("optimizer" in k or "OPTIMIZER_SLOT" in k for k in tf_keys(out))


# -- TF1 name-based ------------------------------------------------------------------------
def test_tf1_saver_output_restores_in_fresh_graph_without_slots(tf1, tmp_path):
    out = tmp_path / "tf1"
    report = ckptinspect.extract(tf1["prefix"], str(out))
    keys = tf_keys(out)
    assert keys == {"dense/kernel", "dense/bias", "emb/table"}
    assert report.dropped["optimizer"]["count"] >= 6 and report.dropped["metadata"]["count"] == 1  # global_step
    source = tf.train.load_checkpoint(tf1["prefix"])
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        w, b, e = tf1["model_vars"]()
        saver = v1.train.Saver()
        with v1.Session() as sess:
            saver.restore(sess, str(out))
            got_w, got_b, got_e = sess.run([w, b, list(e)])
    assert same_bits(got_w, source.get_tensor("dense/kernel"))
    assert same_bits(got_b, source.get_tensor("dense/bias"))
    assert same_bits(np.concatenate(got_e), source.get_tensor("emb/table"))
    # The partitioned variable keeps its two slices.
    from tensorflow.python.training import py_checkpoint_reader  # noqa: PLC0415

    assert py_checkpoint_reader.NewCheckpointReader(str(out)).has_tensor("emb/table")
    assert len(ckptinspect.open(str(out))["emb/table"].slices) == 2


# -- SavedModel ----------------------------------------------------------------------------
def test_savedmodel_source_gives_checkpoint_of_its_variables(savedmodel, tmp_path):
    out = tmp_path / "sm"
    before = tree_hash(savedmodel)
    report = ckptinspect.extract(str(savedmodel), str(out))
    assert report.kept["model"]["count"] == 2 and report.dropped["optimizer"]["count"] >= 4
    fresh = Net(1)
    tf.train.Checkpoint(root=fresh).read(str(out)).assert_consumed()
    loaded = tf.saved_model.load(str(savedmodel))
    assert same_bits(fresh.w.numpy(), loaded.w.numpy()) and same_bits(fresh.b.numpy(), loaded.b.numpy())
    assert tree_hash(savedmodel) == before


# -- Keras files ---------------------------------------------------------------------------
def test_weights_h5_from_tf2_with_builder_loads_in_keras3(src, tmp_path):
    out = tmp_path / "model.weights.h5"
    report = ckptinspect.extract(str(src["run_prefix"]), str(out), builder="ckptinspect.trainer:build_model")
    assert report.output_format == "weights-h5" and report.verified == report.kept["model"]["count"] == 10
    fresh = trainer.build_model(seed=9)
    fresh.load_weights(str(out))
    assert_weights_equal(fresh, restored_reference(src["run_prefix"]))
    with h5py.File(out, "r") as f:
        assert "optimizer" not in f


def test_weights_h5_from_keras_archive_drops_optimizer_group(src, tmp_path):
    out = tmp_path / "m.weights.h5"
    report = ckptinspect.extract(str(src["k3_keras"]), str(out))
    assert report.dropped["optimizer"]["count"] > 0
    fresh = trainer.build_model(seed=9)
    fresh.load_weights(str(out))
    assert_weights_equal(fresh, keras.models.load_model(str(src["k3_keras"]), compile=False))


def test_legacy_h5_keeps_model_config_drops_optimizer_weights(src, tmp_path):
    tf_keras = pytest.importorskip("tf_keras")
    out = tmp_path / "model.h5"
    before = tree_hash(src["k2_h5"])
    report = ckptinspect.extract(str(src["k2_h5"]), str(out))
    assert report.output_format == "h5" and report.dropped["optimizer"]["count"] > 0
    with h5py.File(src["k2_h5"], "r") as s, h5py.File(out, "r") as o:
        assert "optimizer_weights" in s and "optimizer_weights" not in o
        assert o.attrs["model_config"] == s.attrs["model_config"]
        assert set(o.attrs) == set(s.attrs)
    got = tf_keras.models.load_model(str(out), compile=False)
    ref = tf_keras.models.load_model(str(src["k2_h5"]), compile=False)
    assert_weights_equal(got, ref)
    assert tree_hash(src["k2_h5"]) == before


def test_npz_holds_model_variables_by_readable_name(src, tmp_path):
    out = tmp_path / "m.npz"
    ckptinspect.extract(str(src["run_prefix"]), str(out))
    ref = restored_reference(src["run_prefix"])
    with np.load(out) as npz:
        assert set(npz.files) == {w.path for w in ref.weights}
        for w in ref.weights:
            assert same_bits(npz[w.path], w.numpy())


# -- writing rules -------------------------------------------------------------------------
def test_existing_output_refused_then_replaced_with_force(src, tmp_path):
    out = tmp_path / "m"
    ckptinspect.extract(str(src["run_prefix"]), str(out), max_shard_bytes=0)
    first = tree_hash(tmp_path)
    with pytest.raises(OutputExistsError, match="output exists; pass --force"):
        ckptinspect.extract(str(src["run_prefix"]), str(out))
    assert tree_hash(tmp_path) == first
    report = ckptinspect.extract(str(src["run_prefix"]), str(out), force=True)
    assert report.num_shards == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.data-00000-of-00001", "m.index"]  # stale shards gone
    tf.train.Checkpoint(model=trainer.build_model()).read(str(out)).assert_consumed()


def test_source_is_never_an_output_even_with_force(src):
    before = tree_hash(src["run"])
    with pytest.raises(UsageError, match="refusing to overwrite an input"):
        ckptinspect.extract(str(src["run_prefix"]), str(src["run_prefix"]), force=True)
    assert tree_hash(src["run"]) == before


def test_interrupted_write_leaves_nothing(src, tmp_path):
    def interrupt(done, total, variable):
        if done == 3:
            raise KeyboardInterrupt

    for out in (tmp_path / "m", tmp_path / "m.npz"):
        with pytest.raises(KeyboardInterrupt):
            ckptinspect.extract(str(src["run_prefix"]), str(out), progress=interrupt)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("out", "kwargs", "message"),
    [
        ("m.h5", {}, "legacy .h5 output needs a legacy Keras .h5 source"),
        ("m.weights.h5", {}, "needs --builder"),
        ("m.keras", {}, "does not write .keras"),
        ("m", {"format": "onnx"}, "unknown output format"),
        ("m", {"keep": ("model", "optimizer")}, "strips optimizer state"),
        ("m.weights.h5", {"builder": "nosuchmodule_xyz:build"}, "cannot import"),
    ],
)
def test_bad_requests_are_usage_errors(src, tmp_path, out, kwargs, message):
    with pytest.raises(UsageError, match=message):
        ckptinspect.extract(str(src["run_prefix"]), str(tmp_path / out), **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_builder_pairs_as_transplant_does_and_refuses_in_its_words(src, tmp_path):
    """extract --builder pairs by the plan transplant and doctor use (issue 25 item 3): a Keras 2
    TF-format checkpoint (other object graph, same layer names) goes into the Keras 3 model by
    name, as transplant takes it; another architecture is refused with transplant's problems."""
    tf_keras = pytest.importorskip("tf_keras")
    out = tmp_path / "m.weights.h5"
    report = ckptinspect.extract(str(src["k2_tf"]), str(out), builder=trainer.build_model)
    assert report.verified == 10
    fresh = trainer.build_model(seed=9)
    fresh.load_weights(str(out))
    ref = trainer_net.build_keras2_model(tf_keras, seed=2)
    ref.load_weights(str(src["k2_tf"])).expect_partial()
    for layer in ("encoder", "frozen", "bn", "head"):
        got, want = fresh.get_layer(layer).get_weights(), ref.get_layer(layer).get_weights()
        assert len(got) == len(want) > 0 and all(same_bits(a, b) for a, b in zip(got, want)), layer

    import transplant_builders  # noqa: PLC0415 - tests/helpers is on sys.path

    other = tmp_path / "other.weights.h5"
    with pytest.raises(UsageError) as info:
        ckptinspect.extract(str(src["run_prefix"]), str(other), builder=transplant_builders.changed_model)
    with pytest.raises(ckptinspect.TransplantError) as refused:
        ckptinspect.transplant(str(src["run_prefix"]), transplant_builders.changed_model())
    assert f"{other}: not written: 4 problems (2 shape mismatch, 2 left at init): " in str(info.value)
    for problem in refused.value.problems:  # the same problems, in the same words
        assert problem in str(info.value)
    assert not other.exists()


def test_prune_keeps_every_model_variable_reachable_only_via_model(src):
    """The pruned paths agree with the reader's graph_path for every model variable."""
    from ckptinspect.formats.tf.write.through_tf import prune_object_graph  # noqa: PLC0415

    with ckptinspect.open(str(src["run_prefix"])) as ckpt:
        blob = tf.train.load_checkpoint(ckpt.path).get_tensor(GRAPH_KEY)
        model_vars = [v for v in ckpt.variables if v.role == "model"]
        pruned = prune_object_graph(blob, {v.key for v in model_vars})
    for v in model_vars:
        assert pruned.paths[v.key] == v.graph_path
        assert pruned.key_map[v.key] == v.graph_path + "/.ATTRIBUTES/VARIABLE_VALUE"
    with pytest.raises(CkptError, match="reachable only through an optimizer"):
        prune_object_graph(blob, {"optimizer/_variables/2/.ATTRIBUTES/VARIABLE_VALUE"})


# -- CLI -----------------------------------------------------------------------------------
def test_cli_extract_table_json_and_exit_codes(src, tmp_path):
    out = tmp_path / "m"
    result = runner.invoke(app, ["extract", str(src["run"]), "-o", str(out)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"source:   {src['run_prefix']} (tf-bundle)"
    assert any(line.split()[:2] == ["model", "10"] for line in lines)
    assert "read back bit-identical" in result.stdout and "smaller" in result.stdout

    again = runner.invoke(app, ["extract", str(src["run"]), "-o", str(out)])
    assert again.exit_code == 2
    assert again.stderr.startswith("Error: ") and "output exists" in again.stderr and len(again.stderr.splitlines()) == 1

    forced = runner.invoke(app, ["extract", str(src["run"]), "-o", str(out), "--force", "--format", "json"])
    assert forced.exit_code == 0, forced.output
    doc = json.loads(forced.stdout)
    assert doc["kept"]["model"]["count"] == 10 and doc["dropped"]["model"]["count"] == 0
    assert doc["verified"] == 10 and doc["output_format"] == "tf"


def test_cli_format_option_and_bad_sizes(src, tmp_path):
    out = tmp_path / "weights"
    result = runner.invoke(app, ["extract", str(src["run_prefix"]), "-o", str(out), "--to", "npz"])
    assert result.exit_code == 0, result.output
    with np.load(out) as npz:
        assert len(npz.files) == 10
    bad = runner.invoke(app, ["extract", str(src["run_prefix"]), "-o", str(tmp_path / "x"), "--max-shard-size", "12Q"])
    assert bad.exit_code == 2 and bad.stderr.startswith("Error: bad size '12Q'")
    missing = runner.invoke(app, ["extract", str(tmp_path / "nope"), "-o", str(tmp_path / "y")])
    assert missing.exit_code == 2 and missing.stderr.startswith("Error: ") and "nope" in missing.stderr


# -- pieces --------------------------------------------------------------------------------
def test_pack_bounds_groups_and_keeps_graph_in_first():
    from ckptinspect.formats.tf.write.through_tf import BundleTensor, default_shard_bytes, pack  # noqa: PLC0415

    mib = 1 << 20
    tensors = [BundleTensor(GRAPH_KEY, lambda: None, 0)]
    tensors += [BundleTensor(f"{k}{i}", lambda: None, n) for i in range(5) for k, n in (("k", 64 * mib), ("b", 16 << 10))]
    budget = default_shard_bytes(t.nbytes for t in tensors)
    assert budget == 64 * mib
    groups = pack(tensors, budget)
    assert groups[0][0].key == GRAPH_KEY
    assert all(sum(t.nbytes for t in g) <= budget for g in groups) and len(groups) == 6
    assert sorted(t.key for g in groups for t in g) == sorted(t.key for t in tensors)
    assert len(pack(tensors, 0)) == 10 and len(pack(tensors, 256 * mib)) == 2


def test_read_back_comparison_sees_one_flipped_bit(src):
    from ckptinspect.ops.bit_equality import bit_equal as same_value  # noqa: PLC0415
    from ckptinspect.ops.extract.writers import source_matcher as _matcher  # noqa: PLC0415

    with ckptinspect.open(str(src["run_prefix"])) as ckpt:
        matches = _matcher(ckpt)
        reader = tf.train.load_checkpoint(ckpt.path)
        for v in (ckpt["frozen/kernel"], ckpt["bn/moving_mean"]):
            value = reader.get_tensor(v.key)
            assert matches(value, v)
            flipped = value.copy()
            flipped.reshape(-1).view(np.uint32)[-1] ^= 1
            assert not matches(flipped, v)
            assert not matches(value.astype(np.float64), v) and not matches(value.reshape(1, -1), v)
    nan_a = np.array([np.nan], np.float32)
    nan_b = nan_a.view(np.uint32) | np.uint32(1)
    assert same_value(nan_a, nan_a.copy()) and not same_value(nan_a, nan_b.view(np.float32))
    assert same_value(np.array([b"a", b"bc"], object), np.array([b"a", b"bc"])) and not same_value(np.array([b"a"]), np.array([1]))


# -- the real-world corpus -----------------------------------------------------------------
def _bfs_paths(graph) -> dict[int, tuple[str, ...]]:
    paths = {0: ()}
    queue = [0]
    while queue:
        i = queue.pop(0)
        for c in graph.nodes[i].children:
            if c.node_id not in paths:
                paths[c.node_id] = (*paths[i], c.local_name)
                queue.append(c.node_id)
    return paths


def _walk(graph, path: tuple[str, ...]) -> int:
    node = 0
    for name in path:
        node = next(c.node_id for c in graph.nodes[node].children if c.local_name == name)
    return node


@pytest.mark.parametrize(
    "item",
    [
        "tf2-gan-lstm-2opt/training_checkpoints/btc",  # two models, two optimizers, .OPTIMIZER_SLOT
        "tf2-gan-kerasnewopt/model",  # generator shared under discriminator, Keras optimizer _variables
        "tf2-seq2seq-tf112-eager/training_checkpoints",  # TF1 AdamOptimizer in eager, string attributes
        "savedmodel-keras-stale-shard",  # Keras SavedModel, 2 shards + a stale one
        "savedmodel-tf2-half-plus-two",  # object graph ending in NUL bytes
    ],
)
def test_realworld_tf2_items_keep_model_values_under_the_same_object_paths(realworld, tmp_path, item):
    """Every value in the output sits at the same object path as in the source (walked with TF's
    own protobuf) with the same bytes (TF's reader); no optimizer object survives."""
    src = realworld / item
    src = next(src.rglob("saved_model.pb")).parent if list(src.rglob("saved_model.pb")) else src
    before = tree_hash(realworld / item.split("/")[0])
    report = ckptinspect.extract(str(src), str(tmp_path / "out"))
    source_prefix = report.source
    out_graph, src_graph = object_graph(tmp_path / "out"), object_graph(source_prefix)
    out_reader, src_reader = tf.train.load_checkpoint(str(tmp_path / "out")), tf.train.load_checkpoint(source_prefix)
    compared = 0
    for node_id, path in _bfs_paths(out_graph).items():
        for attr in out_graph.nodes[node_id].attributes:
            src_attr = next(a for a in src_graph.nodes[_walk(src_graph, path)].attributes if a.name == attr.name)
            assert same_bits(out_reader.get_tensor(attr.checkpoint_key), src_reader.get_tensor(src_attr.checkpoint_key))
            compared += 1
    assert compared == report.kept["all"]["count"] == report.verified > 0
    assert all(not n.slot_variables for n in out_graph.nodes)
    assert not {c.local_name for n in out_graph.nodes for c in n.children} & {"iter", "_iterations", "beta1_power"}
    assert tree_hash(realworld / item.split("/")[0]) == before


@pytest.mark.parametrize("item", ["tf1-estimator-linear-2shard", "tf1-estimator-tf2-ftrl"])
def test_realworld_tf1_estimators_lose_only_optimizer_slots(realworld, tmp_path, item):
    report = ckptinspect.extract(str(realworld / item), str(tmp_path / "out"))
    src_reader = tf.train.load_checkpoint(report.source)
    out_keys = tf_keys(tmp_path / "out")
    dropped = set(src_reader.get_variable_to_shape_map()) - out_keys
    assert out_keys < set(src_reader.get_variable_to_shape_map())
    assert dropped and all(k.endswith(("/Ftrl", "/Ftrl_1", "/accumulator", "/linear", "global_step"))
                           or k.startswith("training/") for k in dropped)
    out_reader = tf.train.load_checkpoint(str(tmp_path / "out"))
    assert all(same_bits(out_reader.get_tensor(k), src_reader.get_tensor(k)) for k in out_keys)


@pytest.mark.parametrize(
    ("item", "out_name", "group"),
    [
        ("keras2-h5-full-k206/model.h5", "m.h5", "optimizer_weights"),  # anonymous Variable:0 slots
        ("keras2-h5-full-tfk211-dotkeras/model.keras", "m.h5", "optimizer_weights"),  # HDF5 named .keras
        ("keras3-weights-h5/model.weights.h5", "m.weights.h5", "optimizer"),
        ("keras214-zip-backslash-paths/model.keras", "m.weights.h5", "optimizer"),  # zip, backslash groups
    ],
)
def test_realworld_keras_files_lose_exactly_the_optimizer_group(realworld, tmp_path, item, out_name, group):
    import io  # noqa: PLC0415
    import zipfile  # noqa: PLC0415

    src = realworld / item
    before = tree_hash(src)
    ckptinspect.extract(str(src), str(tmp_path / out_name))

    def datasets(f) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        f.visititems(lambda name, obj: found.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
        return found

    if zipfile.is_zipfile(src):
        with zipfile.ZipFile(src) as z:
            source = h5py.File(io.BytesIO(z.read("model.weights.h5")), "r")
    else:
        source = h5py.File(src, "r")
    with source, h5py.File(tmp_path / out_name, "r") as out:
        src_sets, out_sets = datasets(source), datasets(out)
        assert group in source and group not in out
        assert set(src_sets) - set(out_sets) == {k for k in src_sets if k.startswith(group + "/")}
        assert all(same_bits(out_sets[k], src_sets[k]) for k in out_sets)
        assert {k: np.asarray(v).tobytes() for k, v in source.attrs.items()} == {k: np.asarray(v).tobytes() for k, v in out.attrs.items()}
    assert tree_hash(src) == before


def test_a_real_extract_prints_nothing_on_stderr(tmp_path):
    """TensorFlow's C++ log lines (``failed call to cuInit`` on a machine without a GPU) stay
    out of a successful run's stderr; CKPTINSPECT_TF_LOGS=1 brings them back."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "CKPTINSPECT_TF_LOGS")}
    proc = subprocess.run([sys.executable, "-m", "ckptinspect", "extract", str(FIXTURES / "run"), "-o", str(tmp_path / "out" / "m")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
