"""``rewrite``: rename, drop and cast, checked against TensorFlow's and Keras' own restores.

Sources are real: the committed trainer run (Keras 3 + Adam under MirroredStrategy, saved by
a CheckpointManager), a TF1 Saver checkpoint with partitioned variables and Adam slots, and a
``tf.Module`` checkpoint whose keys are its attribute paths, with a Keras 2 optimizer's slot
variables.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

import ckptinspect
from ckptinspect.cli import app
from ckptinspect.errors import OutputExistsError, UsageError

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from ckptinspect import trainer  # noqa: E402
from ckptinspect.trainer import net as trainer_net  # noqa: E402

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures"
GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
runner = CliRunner()


def tree_hash(path: pathlib.Path) -> dict[str, str]:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def tf_values(prefix) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(str(prefix))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if k != GRAPH_KEY}


def renamed_model(monkeypatch, head: str = "out", seed: int = 5):
    """The trainer's architecture with the head layer named ``head``."""
    monkeypatch.setattr(trainer_net, "HEAD_NAME", head)
    return trainer.build_model(seed=seed)


def reference(prefix):
    """The trainer's model restored from the source by TensorFlow itself (the ground truth)."""
    ref = trainer.build_model(seed=7)
    tf.train.Checkpoint(model=ref).read(str(prefix)).expect_partial()
    return ref


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("src")
    shutil.copytree(FIXTURES / "run", root / "run")
    return root / "run"


# -- TF2: Keras 3 under MirroredStrategy (CheckpointManager) -----------------------------------
def test_renamed_layer_restores_into_renamed_model_assert_consumed(run, tmp_path, monkeypatch):
    before = tree_hash(run)
    out = tmp_path / "renamed"
    report = ckptinspect.rewrite(run, out, rename=["^head/=out/"], role="model")
    assert tree_hash(run) == before
    assert {v.new_name for v in report.variables if v.renamed} == {"out/kernel", "out/bias"}
    assert report.totals()["renamed"]["model"]["count"] == 2
    assert report.totals()["dropped"]["optimizer"]["count"] == 14
    model = renamed_model(monkeypatch)
    assert {w.path for w in model.weights} >= {"out/kernel", "out/bias"}
    tf.train.Checkpoint(model=model).read(str(out)).assert_consumed()
    ref = reference(run / "ckpt-8")
    for w, r in zip(model.weights, ref.weights):
        assert same_bits(w.numpy(), r.numpy()), w.path
    with ckptinspect.open(out) as ckpt:
        assert "out/kernel" in ckpt.names() and "head/kernel" not in ckpt.names()
        assert {v.role for v in ckpt.variables} == {"model"}


def test_rename_keeps_optimizer_and_its_slots_follow(run, tmp_path, monkeypatch):
    out = tmp_path / "full"
    report = ckptinspect.rewrite(run, out, rename=["^head/=out/"])
    names = {v.name: v.new_name for v in report.variables}
    assert names["adam/head_kernel_momentum"] == "adam/out_kernel_momentum"
    assert names["step"] == "step"
    assert report.copied_bytes > 0 and report.totals()["dropped"]["all"]["count"] == 0
    # Every tensor is copied byte for byte: the values TF reads are the source's.
    src_values, out_values = tf_values(run / "ckpt-8"), tf_values(out)
    assert set(src_values) == set(out_values)
    assert all(same_bits(src_values[k], out_values[k]) for k in src_values)
    # The whole training state restores into the renamed model with its optimizer.
    strategy = tf.distribute.get_strategy()
    with strategy.scope():
        model = renamed_model(monkeypatch)
        optimizer = keras.optimizers.Adam(0.01, name="adam")
        optimizer.build(model.trainable_variables)
        step = tf.Variable(0, dtype=tf.int64)
    tf.train.Checkpoint(model=model, optimizer=optimizer, step=step).restore(str(out)).assert_consumed()
    assert int(step.numpy()) == 8
    assert {v.path for v in optimizer.variables} >= {"adam/out_kernel_momentum"}


def test_cast_bfloat16_restores_into_bfloat16_policy_model(run, tmp_path, monkeypatch):
    out = tmp_path / "bf16"
    report = ckptinspect.rewrite(run, out, role="model", cast="bfloat16")
    assert report.totals()["cast"]["model"] == {"count": 10, "nbytes": 2192, "new_nbytes": 1096}
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("bfloat16")
    try:
        model = trainer.build_model(seed=5)
    finally:
        keras.config.set_dtype_policy(policy)
    assert {w.dtype for w in model.weights} == {"bfloat16"}
    tf.train.Checkpoint(model=model).read(str(out)).assert_consumed()
    import ml_dtypes  # noqa: PLC0415

    ref = reference(run / "ckpt-8")
    for w, r in zip(model.weights, ref.weights):
        assert same_bits(np.asarray(w.numpy()), r.numpy().astype(ml_dtypes.bfloat16)), w.path


def test_cast_leaves_integers_and_hyperparameters_and_casts_slots(run, tmp_path):
    out = tmp_path / "half"
    ckptinspect.rewrite(run, out, cast="float16", cast_filter="^head/")
    with ckptinspect.open(out) as ckpt:
        dtypes = {v.name: v.dtype for v in ckpt.variables}
    assert dtypes["head/kernel"] == dtypes["adam/head_kernel_momentum"] == dtypes["adam/head_bias_velocity"] == "float16"
    assert dtypes["frozen/kernel"] == dtypes["adam/bn_beta_momentum"] == "float32"  # not in the filter
    assert dtypes["adam/learning_rate"] == "float32"  # a hyperparameter, not a slot
    assert dtypes["step"] == dtypes["adam/iteration"] == "int64"
    values = tf_values(out)
    assert values["optimizer/_trainable_variables/4/.ATTRIBUTES/VARIABLE_VALUE"].dtype == np.float16


def test_drop_optimizer_state_restores_model_and_step(run, tmp_path):
    out = tmp_path / "noopt"
    report = ckptinspect.rewrite(run, out, drop=["^adam/"])
    assert report.totals()["dropped"]["all"]["count"] == 14
    assert report.output_file_bytes < report.source_file_bytes
    model, step = trainer.build_model(seed=5), tf.Variable(0, dtype=tf.int64)
    tf.train.Checkpoint(model=model, step=step).restore(str(out)).assert_consumed()
    assert int(step.numpy()) == 8
    with ckptinspect.open(out) as ckpt:
        assert {v.role for v in ckpt.variables} == {"model", "metadata"}


def test_collision_refused_naming_both_and_nothing_written(run, tmp_path):
    out = tmp_path / "clash"
    result = runner.invoke(app, ["rewrite", str(run), "-o", str(out), "--rename", "^head/=frozen/"])
    assert result.exit_code == 2
    assert "'frozen/kernel' and 'head/kernel' collide at 'frozen/kernel'" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_output_refused_without_force_and_bad_arguments(run, tmp_path):
    out = tmp_path / "o"
    ckptinspect.rewrite(run, out)
    with pytest.raises(OutputExistsError):
        ckptinspect.rewrite(run, out)
    ckptinspect.rewrite(run, out, force=True, drop=["^adam/"])
    with pytest.raises(UsageError, match="float type"):
        ckptinspect.rewrite(run, tmp_path / "x", cast="int8")
    with pytest.raises(UsageError, match="bad --rename rule"):  # the option given, not --map
        ckptinspect.rewrite(run, tmp_path / "x", rename=["norule"])
    with pytest.raises(UsageError, match=r"bad --rename regex '\['"):
        ckptinspect.rewrite(run, tmp_path / "x", rename=["[=x"])
    with pytest.raises(UsageError, match="every variable would be dropped"):
        ckptinspect.rewrite(run, tmp_path / "x", drop=["."])
    assert not (tmp_path / "x.index").exists()


def test_cli_json_report(run, tmp_path):
    result = runner.invoke(app, ["rewrite", str(run), "-o", str(tmp_path / "j"), "--rename", "^bn/=norm/",
                                 "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["totals"]["renamed"]["model"]["count"] == 4
    assert doc["rename"] == ["^bn/=norm/"]
    assert doc["verified"] == 26
    row = next(v for v in doc["variables"] if v["name"] == "bn/gamma")
    assert row["new_name"] == "norm/gamma" and row["actions"] == ["renamed"] and row["copied"]


# -- TF2: object paths that carry the names (tf.Module), slot variables ------------------------
class Block(tf.Module):
    def __init__(self, rng):
        self.kernel = tf.Variable(rng.normal(size=(3, 2)).astype(np.float32))
        self.bias = tf.Variable(rng.normal(size=(2,)).astype(np.float32))


class Net(tf.Module):
    def __init__(self, seed: int, first: str = "enc"):
        rng = np.random.default_rng(seed)
        setattr(self, first, Block(rng))
        self.head = Block(rng)


@pytest.mark.slow  # tf_keras import
def test_module_paths_move_with_slot_variables(tmp_path):
    tf_keras = pytest.importorskip("tf_keras")
    net = Net(0)
    opt = tf_keras.optimizers.legacy.Adam(0.1)  # OptimizerV2: slot variables
    opt.apply_gradients([(tf.ones_like(v), v) for v in net.trainable_variables])
    src = tf.train.Checkpoint(model=net, optimizer=opt).write(str(tmp_path / "src" / "ckpt"))
    out = tmp_path / "out"
    report = ckptinspect.rewrite(src, out, rename=["^model/enc/=model/encoder/"])
    assert report.object_graph["edges_renamed"] == 1
    keys = set(tf_values(out))
    assert "model/encoder/kernel/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert "model/encoder/kernel/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert not any(k.startswith("model/enc/") for k in keys)

    new = Net(1, first="encoder")
    opt2 = tf_keras.optimizers.legacy.Adam(0.1)
    status = tf.train.Checkpoint(model=new, optimizer=opt2).read(str(out))
    opt2._create_all_weights(new.trainable_variables)  # creates the slots, restored as they are made
    status.assert_consumed()
    src_values = tf_values(src)
    assert same_bits(new.encoder.kernel.numpy(), src_values["model/enc/kernel/.ATTRIBUTES/VARIABLE_VALUE"])
    assert same_bits(opt2.get_slot(new.encoder.kernel, "m").numpy(),
                     src_values["model/enc/kernel/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE"])

    # A longer path: the variables are re-linked under a new, empty object.
    out2 = tmp_path / "deeper"
    report = ckptinspect.rewrite(src, out2, rename=["^model/head/=model/top/head/"])
    assert report.object_graph["edges_moved"] == 2 and report.object_graph["nodes_added"] == 2
    deeper = Net(2)
    deeper.top = tf.Module()
    deeper.top.head = deeper.head
    del deeper.head
    opt3 = tf_keras.optimizers.legacy.Adam(0.1)
    status = tf.train.Checkpoint(model=deeper, optimizer=opt3).read(str(out2))
    opt3._create_all_weights(deeper.trainable_variables)
    status.assert_consumed()
    assert same_bits(deeper.top.head.bias.numpy(), src_values["model/head/bias/.ATTRIBUTES/VARIABLE_VALUE"])
    assert "model/top/head/bias/.OPTIMIZER_SLOT/optimizer/v/.ATTRIBUTES/VARIABLE_VALUE" in tf_values(out2)

    # A rename to a path another variable holds is refused, naming both.
    with pytest.raises(UsageError, match="collide"):
        ckptinspect.rewrite(src, tmp_path / "x", rename=["^model/enc/=model/head/"])


# -- TF1: name-based, partitioned variables -----------------------------------------------------
@pytest.fixture(scope="module")
def tf1(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("tf1")
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        with v1.variable_scope("emb"):
            e = v1.get_variable("table", [10, 3], partitioner=v1.fixed_size_partitioner(3),
                                initializer=v1.random_normal_initializer(seed=2))
        w = v1.get_variable("dense/kernel", [3, 2], initializer=v1.glorot_uniform_initializer(seed=1))
        step = v1.train.get_or_create_global_step()
        loss = tf.reduce_sum(tf.matmul(tf.nn.embedding_lookup(e, [1, 7]), w))
        train = v1.train.AdamOptimizer(0.01).minimize(loss, global_step=step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train)
            return v1.train.Saver().save(sess, str(directory / "model.ckpt"), global_step=step)


def test_tf1_partitioned_rename_keeps_slices(tf1, tmp_path):
    out = tmp_path / "model.ckpt-1"
    report = ckptinspect.rewrite(tf1, out, rename=["^emb/=embedding/"])
    renamed = {v.name: v.new_name for v in report.variables if v.renamed}
    assert renamed["emb/table"] == "embedding/table"
    assert renamed["emb/table/Adam"] == "embedding/table/Adam"
    reader = tf.train.load_checkpoint(str(out))
    shapes = reader.get_variable_to_shape_map()
    assert shapes["embedding/table"] == [10, 3] and "emb/table" not in shapes
    src = tf.train.load_checkpoint(tf1)
    assert same_bits(reader.get_tensor("embedding/table"), src.get_tensor("emb/table"))
    with ckptinspect.open(tf1) as a, ckptinspect.open(out) as b:
        assert len(b["embedding/table"].slices) == len(a["emb/table"].slices) == 3
        assert [(s.starts, s.lengths) for s in b["embedding/table"].slices] == [
            (s.starts, s.lengths) for s in a["emb/table"].slices]
    # A TF1 Saver over the renamed partitioned variable restores it.
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        with v1.variable_scope("embedding"):
            e = v1.get_variable("table", [10, 3], partitioner=v1.fixed_size_partitioner(3))
        with v1.Session() as sess:
            v1.train.Saver([e]).restore(sess, str(out))
            assert same_bits(sess.run(tf.convert_to_tensor(e)), src.get_tensor("emb/table"))


# -- Keras 3 .weights.h5 ------------------------------------------------------------------------
def test_weights_h5_rename_loads_into_renamed_model(tmp_path, monkeypatch):
    out = tmp_path / "renamed.weights.h5"
    report = ckptinspect.rewrite(FIXTURES / "keras" / "model.weights.h5", out, rename=["^head/=out/"], role="model")
    assert {v.new_name for v in report.variables if v.renamed} == {"out/vars/0", "out/vars/1"}
    model = renamed_model(monkeypatch)
    model.load_weights(str(out))
    ref = trainer.build_model(seed=7)
    ref.load_weights(str(FIXTURES / "keras" / "model.weights.h5"), skip_mismatch=False)
    for w, r in zip(model.weights, ref.weights):
        assert same_bits(w.numpy(), r.numpy()), w.path
    with ckptinspect.open(out) as ckpt:
        assert "out/vars/0" in ckpt.names() and {v.role for v in ckpt.variables} == {"model"}
    with pytest.raises(UsageError, match="layer name only"):
        ckptinspect.rewrite(FIXTURES / "keras" / "model.weights.h5", tmp_path / "x.weights.h5",
                            rename=["^head/vars/0$=head/vars/9"])


# -- legacy .h5 ---------------------------------------------------------------------------------
def test_legacy_h5_rename_moves_groups_and_loads(tmp_path, monkeypatch):
    out = tmp_path / "renamed.h5"
    report = ckptinspect.rewrite(FIXTURES / "keras" / "model.h5", out, rename=["^head/=out/"], role="model")
    assert {v.new_key for v in report.variables if v.renamed} == {"model_weights/out/out/kernel",
                                                                  "model_weights/out/out/bias"}
    import h5py  # noqa: PLC0415

    with h5py.File(out) as f:
        assert "head" not in f["model_weights"] and "optimizer_weights" not in f
        assert [n.decode() if isinstance(n, bytes) else n for n in f["model_weights"].attrs["layer_names"]][-1] == "out"
    model = renamed_model(monkeypatch)
    model.load_weights(str(out))
    with h5py.File(FIXTURES / "keras" / "model.h5") as f:
        assert same_bits(model.get_layer("out").kernel.numpy(), f["model_weights/head/head/kernel"][()])


@pytest.mark.slow  # tf_keras import
def test_keras2_weights_h5_rename_loads_by_name(tmp_path, monkeypatch):
    tf_keras = pytest.importorskip("tf_keras")
    src = FIXTURES / "keras" / "keras2_weights.h5"
    out = tmp_path / "renamed.h5"
    ckptinspect.rewrite(src, out, rename=["^head/=out/"])
    monkeypatch.setattr(trainer_net, "HEAD_NAME", "out")
    model = trainer_net.build_net(tf_keras, 5)
    model.load_weights(str(out), by_name=True)  # finds the layer group by its new name
    ref = trainer_net.build_net(tf_keras, 7)
    monkeypatch.setattr(trainer_net, "HEAD_NAME", "head")
    ref = trainer_net.build_net(tf_keras, 7)
    ref.load_weights(str(src), by_name=True)
    for w, r in zip(model.weights, ref.weights):
        assert same_bits(w.numpy(), r.numpy()), w.name
    assert same_bits(model.get_layer("out").kernel.numpy(), ref.get_layer("head").kernel.numpy())


def test_sliced_variables_keep_their_slices_and_cast_ones_are_written_whole(tmp_path):
    src = FIXTURES / "sharded" / "ckpt-4"
    out = tmp_path / "renamed"
    ckptinspect.rewrite(src, out, rename=["^frozen/=ice/"])
    with ckptinspect.open(src) as a, ckptinspect.open(out) as b:
        def spans(v):
            return [(s.starts, s.lengths, s.nbytes) for s in v.slices]

        assert a["frozen/kernel"].sliced and spans(b["ice/kernel"]) == spans(a["frozen/kernel"])
    src_values, out_values = tf_values(src), tf_values(out)
    assert src_values.keys() == out_values.keys()
    assert all(same_bits(src_values[k], out_values[k]) for k in src_values)
    cast = tmp_path / "cast"
    report = ckptinspect.rewrite(src, cast, cast="float64", cast_filter="^frozen/")
    assert any("written whole" in n for n in report.notes)
    with ckptinspect.open(cast) as c:
        assert not c["frozen/kernel"].sliced and c["frozen/kernel"].dtype == "float64"
    key = next(k for k in src_values if src_values[k].shape == (16, 16))
    assert np.array_equal(tf_values(cast)[key], src_values[key].astype(np.float64))
