"""``ckptinspect.transplant`` and ``ckptinspect transplant``: real checkpoints into real models.

Sources are the committed fixtures written by the fixture trainer (a Keras 3 model trained with
Adam under MirroredStrategy over 2 logical CPUs, saved with tf.train.Checkpoint) and by tf_keras
(Keras 2 ``.h5``). Expected values always come from TensorFlow or Keras themselves
(``tf.train.Checkpoint.read``, ``tf_keras.models.load_model``, ``model.load_weights``), never from
ckptinspect's readers. Runs that need a fresh process (logical devices for MirroredStrategy, one
process per MultiWorkerMirroredStrategy worker) go through tests/helpers/transplant_worker.py.
"""

from __future__ import annotations

import csv
import io
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner

import ckptinspect
from ckptinspect.cli import app
from ckptinspect.errors import UsageError

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from ckptinspect import trainer  # noqa: E402
from ckptinspect.ops.model.transplant import (  # noqa: E402
    MATCH_GRAPH_PATH,
    MATCH_MAPPING,
    MATCH_NAME,
    MATCH_LAYER_ORDER,
    TransplantError,
    transplant,
    transplant_and_write,
)

import transplant_builders as builders  # noqa: E402 - tests/ is on sys.path (pytest rootdir-less import)

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN = ROOT / "fixtures" / "run"
KERAS2_H5 = ROOT / "fixtures" / "keras" / "keras2_model.h5"
WORKER = ROOT / "tests" / "helpers" / "transplant_worker.py"
BUILDERS = "tests.helpers.transplant_builders"
FIXTURE_PATHS = [
    "encoder/enc_dense/kernel", "encoder/enc_dense/bias", "frozen/kernel", "frozen/bias", "bn/gamma", "bn/beta",
    "bn/moving_mean", "bn/moving_variance", "head/kernel", "head/bias",
]
WORKER_TIMEOUT = 180  # seconds; a worker that takes longer is killed and the test fails

runner = CliRunner()


def weights(model) -> dict[str, np.ndarray]:
    return {w.path: np.array(w.numpy()) for w in model.weights}


def assert_same(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray], names) -> None:
    for name in names:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)


@pytest.fixture(scope="module")
def run_prefix() -> str:
    prefix = tf.train.latest_checkpoint(str(RUN))
    assert prefix and prefix.endswith("ckpt-8")
    return prefix


@pytest.fixture(scope="module")
def expected(run_prefix) -> dict[str, np.ndarray]:
    """The source's model weights, restored by TensorFlow into the trainer's architecture."""
    model = trainer.build_model(seed=3)
    tf.train.Checkpoint(model=model).read(run_prefix).assert_existing_objects_matched().expect_partial()
    return weights(model)


@pytest.fixture(scope="module")
def keras2_layers() -> dict[str, list[np.ndarray]]:
    """Per layer, the weights tf_keras itself loads from the Keras 2 full-model ``.h5``."""
    tf_keras = pytest.importorskip("tf_keras")
    k2 = tf_keras.models.load_model(str(KERAS2_H5), compile=False)
    return {layer.name: layer.get_weights() for layer in k2.layers if layer.weights}


def restored(prefix: str, builder=builders.fixture_model) -> dict[str, np.ndarray]:
    """A TF checkpoint prefix read back by TensorFlow into a fresh model."""
    model = builder()
    tf.train.Checkpoint(model=model).read(prefix).assert_existing_objects_matched()
    return weights(model)


def invoke(*args: str):
    return runner.invoke(app, ["transplant", *args])


# -- the library -------------------------------------------------------------------------------


def test_same_architecture_matches_by_object_graph_path(run_prefix, expected):
    model = builders.fixture_model()
    before = weights(model)
    assert not np.array_equal(before["head/kernel"], expected["head/kernel"])
    report = transplant(str(RUN), model)
    assert report.source == run_prefix
    assert [a.target for a in report.assigned] == FIXTURE_PATHS
    assert {a.matched_by for a in report.assigned} == {MATCH_GRAPH_PATH}
    assert report.verified and report.ok and not report.dry_run
    assert report.strategy == "_DefaultDistributionStrategy" and report.replicas == 1
    # Adam: iterations, learning rate, momentum + velocity of the 6 trainable variables.
    assert report.optimizer_skipped == 14
    assert any("optimizer state is not transplanted" in n and "14 optimizer" in n for n in report.notes)
    assert_same(weights(model), expected, FIXTURE_PATHS)
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["summary"]["assigned"] == 10 and doc["ok"] is True
    assert doc["assigned"][0] == {
        "target": "encoder/enc_dense/kernel", "source": "encoder/enc_dense/kernel",
        "key": "optimizer/_trainable_variables/0/.ATTRIBUTES/VARIABLE_VALUE", "shape": [8, 16],
        "dtype": "float32", "source_dtype": "float32", "matched_by": "graph-path", "fit": "equal",
    }
    assert "assigned 10, shape mismatches 0" in str(report)


def test_keras2_h5_lands_in_keras3_model_by_layer_names(keras2_layers):
    model = builders.fixture_model()
    report = transplant(str(KERAS2_H5), model)
    assert report.source_format == "keras-h5"
    assert len(report.assigned) == 10 and {a.matched_by for a in report.assigned} == {MATCH_NAME}
    assert report.optimizer_skipped > 0 and report.verified
    for layer_name, values in keras2_layers.items():
        got = model.get_layer(layer_name).get_weights()
        assert len(got) == len(values) > 0
        for a, b in zip(got, values):
            np.testing.assert_array_equal(a, b, err_msg=layer_name)


def test_extra_and_resized_layer_strict_lists_every_problem_and_assigns_nothing(run_prefix):
    model = builders.changed_model()
    before = weights(model)
    with pytest.raises(TransplantError) as info:
        transplant(run_prefix, model)
    message = str(info.value)
    assert message.startswith(f"{run_prefix}: cannot transplant into 'net' (4 problems): ")
    assert "shape mismatch: frozen/kernel is [16,8] in the model, [16,16] in the source" in message
    assert "shape mismatch: frozen/bias is [8] in the model, [16] in the source" in message
    assert "left at init: extra/kernel [8,16] has no source variable" in message
    assert "left at init: extra/bias [16] has no source variable" in message
    assert len(info.value.problems) == 4 and "\n" not in message
    assert isinstance(info.value, ValueError)
    assert_same(weights(model), before, before)  # strict refuses before assigning anything

    # skip_mismatch tolerates the resized layer, not the extra one.
    with pytest.raises(TransplantError) as info:
        transplant(run_prefix, model, skip_mismatch=True)
    assert "(2 problems)" in str(info.value) and "shape mismatch" not in str(info.value)


def test_extra_and_resized_layer_non_strict_report(run_prefix, expected):
    model = builders.changed_model()
    before = weights(model)
    report = transplant(run_prefix, model, strict=False)
    assigned = {a.target for a in report.assigned}
    assert assigned == set(FIXTURE_PATHS) - {"frozen/kernel", "frozen/bias"}
    assert {a.matched_by for a in report.assigned} == {MATCH_NAME}  # the graph differs: names decide
    assert [(x.kind, x.target, x.target_shape, x.source_shape) for x in report.mismatches] == [
        ("shape", "frozen/kernel", (16, 8), (16, 16)), ("shape", "frozen/bias", (8,), (16,))]
    assert [t.target for t in report.left_at_init] == ["extra/kernel", "extra/bias"]
    assert report.unused == () and not report.ok and report.verified
    after = weights(model)
    assert_same(after, expected, assigned)
    assert_same(after, before, ["frozen/kernel", "frozen/bias", "extra/kernel", "extra/bias"])


def test_same_graph_with_resized_layer_pairs_by_path_and_reports_mismatches(run_prefix):
    report = transplant(run_prefix, builders.resized_model(), strict=False)
    assert {a.matched_by for a in report.assigned} | {x.matched_by for x in report.mismatches} == {MATCH_GRAPH_PATH}
    assert sorted(x.target for x in report.shape_mismatches) == sorted(
        ["frozen/bias", "frozen/kernel", "head/kernel"] + [f"bn/{n}" for n in ("beta", "gamma", "moving_mean", "moving_variance")])
    assert sorted(a.target for a in report.assigned) == ["encoder/enc_dense/bias", "encoder/enc_dense/kernel", "head/bias"]


def test_dry_run_plans_without_assigning(run_prefix):
    model = builders.changed_model()
    before = weights(model)
    report = transplant(run_prefix, model, dry_run=True)  # strict, but a plan never raises
    assert report.dry_run and not report.verified and not report.ok
    assert len(report.assigned) == 8 and len(report.problems) == 4
    assert_same(weights(model), before, before)


def test_mapping_rules_rename_source_variables(keras2_layers):
    model = builders.renamed_head_model()
    with pytest.raises(TransplantError) as info:
        transplant(str(KERAS2_H5), model)
    assert "left at init: classifier/kernel" in str(info.value)
    assert "unused source variable: head/kernel [16,4] matches no model variable" in str(info.value)
    report = transplant(str(KERAS2_H5), model, mapping={"^head/": "classifier/", "^nothing/": "x/"})
    by = {a.target: a.matched_by for a in report.assigned}
    assert by["classifier/kernel"] == by["classifier/bias"] == MATCH_MAPPING and by["bn/gamma"] == MATCH_NAME
    assert report.ok and any("'^nothing/'" in n and "matched no" in n for n in report.notes)
    for a, b in zip(model.get_layer(builders.RENAMED_HEAD).get_weights(), keras2_layers["head"]):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(UsageError, match="bad --map regex"):
        transplant(str(KERAS2_H5), model, mapping={"(": "x"})


def test_by_order_pairs_anonymous_layers_by_order_and_shape(keras2_layers):
    model = builders.anonymous_model()
    with pytest.raises(TransplantError, match=r"\(20 problems\)"):
        transplant(str(KERAS2_H5), model)
    report = transplant(str(KERAS2_H5), model, by_order=True)
    # --by-order pairs whole layers by layer order and shape (issue 13), not one variable at a time.
    assert len(report.assigned) == 10 and {a.matched_by for a in report.assigned} == {MATCH_LAYER_ORDER}
    # gamma/beta and moving mean/variance share a shape: the leaf names keep them apart.
    for mine, theirs in zip(("layer0", "layer2", "layer3", "layer4"), ("encoder", "frozen", "bn", "head")):
        for a, b in zip(model.get_layer(mine).get_weights(), keras2_layers[theirs]):
            np.testing.assert_array_equal(a, b, err_msg=mine)


def test_realworld_keras_2_0_6_h5_that_keras3_cannot_load(realworld):
    """A Keras 2.0.6 full-model .h5 from a public repository, which Keras 3's load_model rejects,
    transplanted into a Keras 3 rebuild with the same layer names; expected values read with h5py."""
    import h5py

    path = realworld / "keras2-h5-full-k206" / "model.h5"
    model = builders.k206_driving_model()
    report = transplant(str(path), model)
    assert len(report.assigned) == 12 and report.ok and report.optimizer_skipped == 25
    with h5py.File(path, "r") as f:
        group = f["model_weights"]
        for layer in ("conv2d_1", "conv2d_2", "conv2d_3", "dense_1", "dense_2", "dense_3"):
            stored = [group[layer][n.decode() if isinstance(n, bytes) else n][()] for n in group[layer].attrs["weight_names"]]
            got = model.get_layer(layer).get_weights()
            assert len(got) == len(stored) == 2
            for a, b in zip(got, stored):
                np.testing.assert_array_equal(a, b, err_msg=layer)


def test_realworld_tf_keras_tf_format_weights_with_a_mapping_rule(realworld):
    """tf.keras ``save_weights`` (TF format) from a public repository into Keras 3, whose LSTM keeps
    its weights one level deeper (``lstm/lstm_cell/kernel``): a mapping rule bridges the names."""
    prefix = str(realworld / "tf2-textgen-keras-weights" / "training_checkpoints" / "ckpt_1")
    model = builders.textgen_model()
    with pytest.raises(TransplantError, match="left at init: lstm/lstm_cell/kernel .*unused source variable: lstm/kernel"):
        transplant(prefix, model)
    report = transplant(prefix, model, mapping={"^lstm/": "lstm/lstm_cell/"})
    assert report.ok and len(report.assigned) == 6
    assert {a.target: a.matched_by for a in report.assigned}["lstm/lstm_cell/recurrent_kernel"] == MATCH_MAPPING
    reader = tf.train.load_checkpoint(prefix)
    keys = {
        "embedding/embeddings": "layer_with_weights-0/embeddings",
        "lstm/lstm_cell/kernel": "layer_with_weights-1/cell/kernel",
        "lstm/lstm_cell/recurrent_kernel": "layer_with_weights-1/cell/recurrent_kernel",
        "lstm/lstm_cell/bias": "layer_with_weights-1/cell/bias",
        "dense/kernel": "layer_with_weights-2/kernel",
        "dense/bias": "layer_with_weights-2/bias",
    }
    got = weights(model)
    for path, key in keys.items():
        np.testing.assert_array_equal(got[path], reader.get_tensor(key + "/.ATTRIBUTES/VARIABLE_VALUE"), err_msg=path)


def test_tf_module_target(tmp_path):
    class Net(tf.Module):
        def __init__(self, seed):
            rng = np.random.default_rng(seed)
            self.dense = tf.Module()
            self.dense.kernel = tf.Variable(rng.standard_normal((3, 4)).astype(np.float32), name="kernel")
            self.scale = tf.Variable(rng.standard_normal(4), name="scale")  # float64

    src = Net(1)
    prefix = tf.train.Checkpoint(model=src).write(str(tmp_path / "module"))
    dst = Net(2)
    report = transplant(prefix, dst)
    assert {a.matched_by for a in report.assigned} == {MATCH_GRAPH_PATH} and len(report.assigned) == 2
    np.testing.assert_array_equal(dst.dense.kernel.numpy(), src.dense.kernel.numpy())
    np.testing.assert_array_equal(dst.scale.numpy(), src.scale.numpy())


def test_float_cast_and_dtype_mismatch(tmp_path):
    holder = tf.Module()
    holder.w = tf.Variable(np.linspace(0, 1, 6).reshape(2, 3))  # float64
    holder.n = tf.Variable(np.arange(3, dtype=np.int64))
    prefix = tf.train.Checkpoint(model=holder).write(str(tmp_path / "mixed"))
    target = tf.Module()
    target.w = tf.Variable(np.zeros((2, 3), np.float32))
    target.n = tf.Variable(np.zeros(3, np.float32))
    with pytest.raises(TransplantError, match="dtype mismatch: .* is float32 in the model, int64 in the source"):
        transplant(prefix, target)
    report = transplant(prefix, target, skip_mismatch=True)
    assert [a.source_dtype for a in report.assigned] == ["float64"] and report.dtype_mismatches
    np.testing.assert_array_equal(target.w.numpy(), np.linspace(0, 1, 6).reshape(2, 3).astype(np.float32))
    assert any("cast between float dtypes" in n for n in report.notes)


def test_unbuilt_model_and_non_model_are_usage_errors(run_prefix):
    with pytest.raises(UsageError, match=r"not built .*call it on an input \(model\(x\)\) or call model.build"):
        transplant(run_prefix, builders.unbuilt_model())
    with pytest.raises(UsageError, match="has no variables"):
        transplant(run_prefix, tf.Module())
    with pytest.raises(UsageError, match="needs a built Keras 3 model or a tf.Module. Received: builtins.dict"):
        transplant(run_prefix, {})


def test_sharded_variables_are_not_supported_yet(run_prefix):
    from tensorflow.python.distribute.sharded_variable import ShardedVariable

    module = tf.Module()
    module.table = ShardedVariable([tf.Variable(np.zeros((2, 3), np.float32)), tf.Variable(np.zeros((2, 3), np.float32))])
    with pytest.raises(UsageError, match="ParameterServerStrategy / ShardedVariable models are not supported yet"):
        transplant(run_prefix, module)


# -- the command line (default strategy, in this process) -------------------------------------


@pytest.fixture()
def in_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the builder module is imported from the current directory


def test_cli_writes_tf_checkpoint_and_refuses_to_overwrite(in_root, tmp_path, run_prefix, expected):
    dst = str(tmp_path / "out" / "transplanted")
    result = invoke(str(RUN), dst, "--builder", f"{BUILDERS}:fixture_model")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"source:   {run_prefix} (tf-bundle)" in out
    assert "result:   assigned 10, shape mismatches 0, dtype mismatches 0, left at init 0, unused source variables 0" in out
    assert f"output:   {dst} (tf-bundle), read back: 10 variables equal" in out
    assert "note:     optimizer state is not transplanted (model weights only): 14 optimizer" in out
    row = next(line for line in out.splitlines() if line.startswith("head/kernel"))
    assert row.split() == ["head/kernel", "[16,4]", "float32", "head/kernel", "graph-path", "assigned"]
    assert_same(restored(dst), expected, FIXTURE_PATHS)
    assert sorted(os.listdir(tmp_path / "out")) == ["transplanted.data-00000-of-00001", "transplanted.index"]

    again = invoke(str(RUN), dst, "--builder", f"{BUILDERS}:fixture_model")
    assert again.exit_code == 2
    assert again.stderr == (f"Error: {dst} (transplanted.data-00000-of-00001, transplanted.index): output exists; "
                            "pass --force (force=True) to replace it\n")
    forced = invoke(str(KERAS2_H5), dst, "--builder", f"{BUILDERS}:fixture_model", "--force", "--format", "json")
    assert forced.exit_code == 0, forced.output
    doc = json.loads(forced.stdout)
    assert doc["output"] == {"path": dst, "format": "tf-bundle", "written": True, "verified": True, "checked": 10}
    assert doc["source_format"] == "keras-h5" and doc["summary"]["assigned"] == 10


@pytest.mark.parametrize("name", ["model.weights.h5", "model.keras"])
def test_cli_writes_keras_files(in_root, tmp_path, name, expected):
    dst = str(tmp_path / name)
    result = invoke(str(RUN), dst, "--builder", f"{BUILDERS}:fixture_model", "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["output"]["written"] and doc["output"]["checked"] == 10
    if name.endswith(".keras"):
        loaded = keras.saving.load_model(dst, compile=False)
        # A reloaded model names its variables afresh; its layers keep their names and order.
        got = dict(zip(FIXTURE_PATHS, (np.array(w.numpy()) for w in loaded.weights)))
        assert [layer.name for layer in loaded.layers[1:]] == ["encoder", "frozen", "bn", "head"]
    else:
        loaded = builders.fixture_model()
        loaded.load_weights(dst)
        got = weights(loaded)
    assert_same(got, expected, FIXTURE_PATHS)
    assert os.listdir(tmp_path) == [name]


def test_cli_dry_run_writes_nothing(in_root, tmp_path):
    dst = tmp_path / "plan"
    result = invoke(str(RUN), str(dst), "--builder", f"{BUILDERS}:changed_model", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "check:    dry run: nothing assigned or written; strict would refuse it (4 problems)" in result.stdout
    assert "plan:     would assign 8, shape mismatches 2, dtype mismatches 0, left at init 2" in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_cli_strict_failure_is_a_short_error(in_root, tmp_path):
    dst = tmp_path / "out"
    result = invoke(str(RUN), str(dst), "--builder", f"{BUILDERS}:changed_model")
    assert result.exit_code == 2
    # issue 25 item 17: a summary line, the problems (4: all shown), the flags, doctor
    assert result.stderr.count("Error: ") == 1 and result.stderr.startswith("Error: ")
    assert "4 problems (2 shape mismatch, 2 left at init); nothing written" in result.stderr.splitlines()[0]
    assert "frozen/kernel is [16,8] in the model, [16,16] in the source" in result.stderr
    assert "left at init: extra/kernel" in result.stderr
    assert list(tmp_path.iterdir()) == []

    loose = invoke(str(RUN), str(dst), "--builder", f"{BUILDERS}:changed_model", "--no-strict", "--format", "json")
    # Issue 13: --no-strict exits 1 when not every model variable received a value (it still writes).
    assert loose.exit_code == 1, loose.output
    doc = json.loads(loose.stdout)
    assert doc["complete"] is False
    assert doc["summary"] == {"assigned": 8, "shape_mismatch": 2, "dtype_mismatch": 0, "left_at_init": 2,
                              "unused": 0, "optimizer_not_transplanted": 14, "metadata_not_transplanted": 2, "skipped_by_rule": 0}
    assert doc["ok"] is False and doc["verified"] is True and len(doc["problems"]) == 4
    assert doc["output"]["checked"] == 12  # every variable of the model is in the written checkpoint


def test_cli_map_option(in_root, tmp_path):
    result = invoke(str(KERAS2_H5), str(tmp_path / "out"), "--builder", f"{BUILDERS}:renamed_head_model",
                    "--map", "^head/=classifier/", "--format", "csv")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert list(rows[0]) == ["target", "shape", "dtype", "source", "key", "matched_by", "status"]
    assert {"target": "classifier/kernel", "shape": "[16,4]", "dtype": "float32", "source": "head/kernel",
            "key": "model_weights/head/head/kernel:0", "matched_by": "mapping", "status": "assigned"} in rows
    assert len(rows) == 10


@pytest.mark.parametrize(
    "args, message",
    [
        (["--builder", "nocolon"], "Error: --builder must be pkg.module:function. Received: 'nocolon'"),
        (["--builder", "no_such_module_xyz:f"], "Error: --builder no_such_module_xyz:f: cannot import 'no_such_module_xyz'"),
        (["--builder", f"{BUILDERS}:nothing"], f"Error: --builder {BUILDERS}:nothing: '{BUILDERS}' has no 'nothing'"),
        (["--builder", f"{BUILDERS}:failing_model"],
         f"Error: --builder {BUILDERS}:failing_model: the builder raised RuntimeError: no GPU here"),
        (["--builder", f"{BUILDERS}:unbuilt_model"], "Error: model 'net' is not built (it has no variables); build it first"),
        (["--builder", f"{BUILDERS}:fixture_model", "--replicas", "2"],
         "Error: --replicas applies to --strategy mirrored only. Received: --strategy default"),
        (["--builder", f"{BUILDERS}:fixture_model", "--strategy", "multi-worker"],
         "Error: --strategy multi-worker needs TF_CONFIG"),
        (["--builder", f"{BUILDERS}:fixture_model", "--strategy", "ps"], "Error: unknown strategy 'ps'"),
        (["--builder", f"{BUILDERS}:fixture_model", "--map", "nomap"], "Error: bad --map rule 'nomap': expected 'REGEX=REPLACEMENT'"),
    ],
)
def test_cli_usage_errors(in_root, tmp_path, monkeypatch, args, message):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    result = invoke(str(RUN), str(tmp_path / "out"), *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_cli_refuses_to_overwrite_the_source_and_legacy_h5(in_root, tmp_path, run_prefix):
    result = invoke(str(RUN), run_prefix, "--builder", f"{BUILDERS}:fixture_model", "--force")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: {run_prefix}: is the input ")
    result = invoke(str(RUN), str(tmp_path / "model.h5"), "--builder", f"{BUILDERS}:fixture_model")
    assert result.exit_code == 2 and "legacy .h5 output is not written" in result.stderr


def test_transplant_and_write_is_what_the_command_runs(tmp_path, monkeypatch):
    """The orchestration ``ckptinspect transplant`` ran in the CLI, as a library function: output
    checked before any TensorFlow work, the model built in the strategy, transplanted, written
    and read back; a dry run writes nothing and ignores what is at DST."""
    monkeypatch.chdir(ROOT)
    out = tmp_path / "model.weights.h5"
    done = transplant_and_write(RUN, out, f"{BUILDERS}:fixture_model")
    assert done.report.complete and done.report.verified
    assert [a.target for a in done.report.assigned] == FIXTURE_PATHS
    assert done.output is not None and done.output.path == os.fspath(out) and done.output.verified and out.is_file()

    again = transplant_and_write(RUN, out, f"{BUILDERS}:fixture_model", dry_run=True)  # DST exists: no matter
    assert again.output is None and again.report.dry_run and not again.report.verified
    with pytest.raises(ckptinspect.errors.OutputExistsError):
        transplant_and_write(RUN, out, f"{BUILDERS}:fixture_model")

    # refused before the strategy or the builder: a builder that cannot be imported is never reached
    (tmp_path / "plain").write_text("mine\n")
    for dst, message in ((tmp_path, "is a directory"), (tmp_path / "x.safetensors", "unknown output suffix"),
                         (tmp_path / "plain", "exists and is a regular file")):
        with pytest.raises(UsageError, match=message):
            transplant_and_write(RUN, dst, "no_such_module_xyz:build", force=True)
    with pytest.raises(UsageError, match="no_such_module_xyz"):
        transplant_and_write(RUN, tmp_path / "new.weights.h5", "no_such_module_xyz:build")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.weights.h5", "plain"]


def test_cli_help():
    result = runner.invoke(app, ["transplant", "--help"])
    assert result.exit_code == 0
    for option in ("--builder", "--strategy", "--replicas", "--map", "--skip-mismatch", "--dry-run", "--force"):
        assert option in result.stdout


# -- fresh processes: MirroredStrategy over 2 logical CPUs, and two MultiWorkerMirrored workers --


def _worker_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.update(extra)
    return env


def _finish(procs: list[subprocess.Popen]) -> list[dict]:
    """Wait for every worker (killing all of them at the deadline); each one's JSON line."""
    deadline = time.monotonic() + WORKER_TIMEOUT
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
            assert proc.returncode == 0, err[-3000:]
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    except subprocess.TimeoutExpired:
        pytest.fail(f"a transplant worker did not finish within {WORKER_TIMEOUT} s")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return outputs


def _spawn(npz: pathlib.Path, args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(WORKER), str(npz), "--", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow  # trains under MirroredStrategy in a subprocess (~10 s)
def test_mirrored_checkpoint_into_model_built_under_mirrored_strategy(tmp_path, expected):
    dst = tmp_path / "mirrored" / "ckpt"
    npz = tmp_path / "replicas.npz"
    proc = _spawn(npz, [str(RUN), str(dst), "--builder", f"{BUILDERS}:fixture_model", "--strategy", "mirrored",
                        "--replicas", "2", "--format", "json"], _worker_env())
    (result,) = _finish([proc])
    assert result["exit_code"] == 0, result
    doc = json.loads(result["output"])
    assert (doc["strategy"], doc["replicas"], doc["local_replicas"]) == ("MirroredStrategy", 2, 2)
    assert doc["verified"] and doc["summary"]["assigned"] == 10 and doc["output"]["written"]
    values = np.load(npz)
    assert sorted(values.files) == sorted(f"{p}@{i}" for p in FIXTURE_PATHS for i in (0, 1))
    for path in FIXTURE_PATHS:
        np.testing.assert_array_equal(values[f"{path}@0"], expected[path], err_msg=path)
        np.testing.assert_array_equal(values[f"{path}@1"], expected[path], err_msg=path)
    assert_same(restored(str(dst)), expected, FIXTURE_PATHS)


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.mark.slow
def test_two_multi_worker_mirrored_workers(tmp_path, expected):
    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    out_dir = tmp_path / "out"
    dst = out_dir / "ckpt"
    procs = []
    for index in range(2):
        env = _worker_env(TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}))
        procs.append(_spawn(tmp_path / f"worker{index}.npz",
                            [str(RUN), str(dst), "--builder", f"{BUILDERS}:fixture_model",
                             "--strategy", "multi-worker", "--format", "json"], env))
    results = _finish(procs)
    docs = []
    for result in results:
        assert result["exit_code"] == 0, result
        docs.append(json.loads(result["output"]))
    for doc in docs:
        assert (doc["strategy"], doc["replicas"], doc["local_replicas"]) == ("CollectiveAllReduceStrategy", 2, 1)
        assert doc["verified"] and doc["summary"]["assigned"] == 10
    assert [d["output"]["written"] for d in docs] == [True, False]  # worker 0 is the chief
    workers = [np.load(tmp_path / f"worker{i}.npz") for i in range(2)]
    for path in FIXTURE_PATHS:
        np.testing.assert_array_equal(workers[0][f"{path}@0"], expected[path], err_msg=path)
        np.testing.assert_array_equal(workers[1][f"{path}@0"], expected[path], err_msg=path)
    assert sorted(os.listdir(out_dir)) == ["ckpt.data-00000-of-00001", "ckpt.index"]
    assert_same(restored(str(dst)), expected, FIXTURE_PATHS)
