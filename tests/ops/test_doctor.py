"""``ckptinspect.doctor`` and ``ckptinspect doctor``: why weights do not load, and the fix, on real files.

Sources: the real Keras 2.1.4 ``weights.h5`` of the shared corpus and our own Keras 2 file of
the same kind written with ``tf_keras``; the committed Keras 2 TF-format ``save_weights``
checkpoint; a TF1 Saver checkpoint with Estimator-style names written with ``tf.compat.v1``;
a PyTorch-layout ``.npz`` written with numpy. Expected values come from h5py, TensorFlow's
checkpoint reader or numpy, and every written fix is checked with Keras' or TensorFlow's own
loader (``model.load_weights``, ``init_from_checkpoint``, ``transplant --map`` is ours).
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
from click.testing import CliRunner

from ckptinspect.cli import app

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import ckptinspect  # noqa: E402
import doctor_builders as db  # noqa: E402 - tests/ is on sys.path
import transplant_builders  # noqa: E402 - after the importorskip lines above

ROOT = pathlib.Path(__file__).resolve().parents[2]
KERAS2_TF = ROOT / "fixtures" / "keras" / "keras2_tf" / "ckpt"
BUILDERS = "tests.helpers.doctor_builders"
runner = CliRunner()


@pytest.fixture(scope="module")
def own_keras2_h5(tmp_path_factory) -> str:
    """Our own Keras 2 ``save_weights`` file (tf_keras), layers numbered from 1 as Keras 2.1.4 does."""
    pytest.importorskip("tf_keras")
    path = str(tmp_path_factory.mktemp("k2") / "weights.h5")
    db.write_keras2_cnn(path)
    return path


@pytest.fixture(params=["realworld", "own"])
def keras2_h5(request) -> str:
    if request.param == "realworld":
        return str(request.getfixturevalue("realworld") / "keras2-h5-weights-k214" / "weights.h5")
    return request.getfixturevalue("own_keras2_h5")


@pytest.fixture()
def in_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the builder module is imported from the current directory


def doctor_cli(*args: str):
    return runner.invoke(app, ["doctor", *args])


def keras3_layer_values(model) -> dict[str, list[np.ndarray]]:
    return {layer.name: [np.asarray(w) for w in layer.get_weights()] for layer in model.layers if layer.weights}


def assert_keras2_values(model, path: str) -> None:
    """Every layer of the Keras 3 rebuild holds the values of its Keras 2 namesake (offset by one)."""
    source = db.legacy_values(path)
    names = dict(zip(db.keras3_names(list(source.items())), source))
    got = keras3_layer_values(model)
    assert got and set(got) <= set(names)
    for k3, k2 in names.items():
        if k3 in got:
            assert len(got[k3]) == len(source[k2]) == 2
            for a, b in zip(got[k3], source[k2]):
                np.testing.assert_array_equal(a, b, err_msg=f"{k3} <- {k2}")


# -- Keras 2 .h5 (layer names numbered from 1) into the same CNN built in Keras 3 -----------------
def test_keras2_h5_into_keras3_doctor_finds_every_weight(keras2_h5, monkeypatch):
    monkeypatch.setenv(db.H5_ENV, keras2_h5)
    model = db.keras3_from_legacy_h5()
    report = ckptinspect.doctor(keras2_h5, model)
    assert report.ok and len(report.weights) == 10 and report.leftovers == ()
    assert {w.matched_by for w in report.weights} == {"normalized-name"}
    by_target = {w.target: w.source for w in report.weights}
    assert by_target["sequential/conv2d/kernel"] == "conv2d_1/kernel"
    assert by_target["sequential/dense_2/bias"] == "dense_3/bias"
    assert report.map_verified and report.map_rules[0] == "^conv2d_1/=sequential/conv2d/"
    assert report.assignment_map is None  # init_from_checkpoint reads TF checkpoints only
    assert report.summary()["matched"] == 10 and report.reasons()["shape_mismatch"] == []


def test_keras2_h5_into_keras3_transplant_assigns_every_weight(keras2_h5, monkeypatch):
    """Before issue 13, transplant paired conv2d_1 with conv2d_1 (shapes differ) and assigned 0."""
    monkeypatch.setenv(db.H5_ENV, keras2_h5)
    model = db.keras3_from_legacy_h5()
    report = ckptinspect.transplant(keras2_h5, model)
    assert report.ok and report.complete and len(report.assigned) == 10 and report.verified
    assert_keras2_values(model, keras2_h5)
    # The proposed rules make the same load by names alone.
    rules = ckptinspect.doctor(keras2_h5, db.keras3_from_legacy_h5()).map_rules
    again = db.keras3_from_legacy_h5()
    mapped = ckptinspect.transplant(keras2_h5, again, mapping=rules)
    assert {a.matched_by for a in mapped.assigned} == {"mapping"} and len(mapped.assigned) == 10
    assert_keras2_values(again, keras2_h5)


def test_keras2_h5_cli_emit_weights_loads_with_plain_load_weights(keras2_h5, in_root, monkeypatch, tmp_path):
    monkeypatch.setenv(db.H5_ENV, keras2_h5)
    out = tmp_path / "fixed.weights.h5"
    result = doctor_cli(keras2_h5, "--builder", f"{BUILDERS}:keras3_from_legacy_h5", "--emit", "weights", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert f"output:   {out} (keras-weights-h5), read back through model.load_weights: 10 weights equal" in result.stdout
    assert result.stdout.rstrip().splitlines()[-1] == "verdict:  OK: every model weight has a source value that fits (10 of 10)"
    fresh = db.keras3_from_legacy_h5()
    fresh.load_weights(str(out))  # Keras' own loader, nothing of ours
    assert_keras2_values(fresh, keras2_h5)
    again = doctor_cli(keras2_h5, "--builder", f"{BUILDERS}:keras3_from_legacy_h5", "--emit", "weights", "-o", str(out))
    assert again.exit_code == 2 and "output exists; pass --force" in again.stderr


def test_keras2_h5_cli_table_map_and_json(keras2_h5, in_root, monkeypatch):
    monkeypatch.setenv(db.H5_ENV, keras2_h5)
    builder = f"{BUILDERS}:keras3_from_legacy_h5"
    table = doctor_cli(keras2_h5, "--builder", builder)
    assert table.exit_code == 0, table.output
    row = next(line for line in table.stdout.splitlines() if line.startswith("sequential/dense/kernel"))
    assert row.split()[3:] == ["dense_1/kernel", "normalized-name", "matched"]
    assert "fix:      --emit map (5 --map rules, checked); --emit weights -o OUT.weights.h5" in table.stdout
    rules = doctor_cli(keras2_h5, "--builder", builder, "--emit", "map")
    assert rules.exit_code == 0 and rules.stdout.splitlines() == [
        "--map '^conv2d_1/=sequential/conv2d/'", "--map '^conv2d_2/=sequential/conv2d_1/'",
        "--map '^dense_1/=sequential/dense/'", "--map '^dense_2/=sequential/dense_1/'",
        "--map '^dense_3/=sequential/dense_2/'"]
    doc = json.loads(doctor_cli(keras2_h5, "--builder", builder, "--format", "json").stdout)
    assert doc["ok"] is True and doc["summary"]["matched"] == 10 and doc["fix"]["map_verified"] is True
    assert doc["weights"][0]["matched_by"] == "normalized-name" and doc["weights"][0]["fit"] == "equal"
    no_amap = doctor_cli(keras2_h5, "--builder", builder, "--emit", "assignment-map")
    assert no_amap.exit_code == 2 and "init_from_checkpoint reads TF checkpoints only" in no_amap.stderr


def test_one_resized_layer_is_reported_exit_1_and_nothing_guessed(keras2_h5, in_root, monkeypatch, tmp_path):
    monkeypatch.setenv(db.H5_ENV, keras2_h5)
    source = dict(db.legacy_layers(keras2_h5))
    units = source["dense_2"][0][1]
    monkeypatch.setenv(db.RESIZE_ENV, f"dense_1:{units + 3}")  # the Keras 3 dense_1 is the file's dense_2
    model = db.keras3_from_legacy_h5()
    report = ckptinspect.doctor(keras2_h5, model)
    assert not report.ok
    status = {w.target: (w.status, w.source) for w in report.weights}
    assert status["sequential/dense_1/kernel"] == ("shape-mismatch", "dense_2/kernel")
    assert status["sequential/dense_1/bias"] == ("shape-mismatch", "dense_2/bias")
    assert status["sequential/dense_2/kernel"] == ("shape-mismatch", "dense_3/kernel")
    assert status["sequential/dense_2/bias"] == ("matched", "dense_3/bias")  # 10 classes either way
    matched = [w for w in report.weights if w.status == "matched"]
    assert len(matched) == 7 and all(w.shape == w.source_shape for w in matched)
    assert len(report.reasons()["shape_mismatch"]) == 3 and report.reasons()["missing"] == []

    out = tmp_path / "fixed.weights.h5"
    builder = f"{BUILDERS}:keras3_from_legacy_h5"
    result = doctor_cli(keras2_h5, "--builder", builder)
    assert result.exit_code == 1
    lines = result.stdout.rstrip().splitlines()
    assert lines[-1] == "verdict:  FAIL: 3 of 10 model weights cannot be loaded (shape mismatch 3)"
    assert "  shape mismatch (3):" in lines
    refused = doctor_cli(keras2_h5, "--builder", builder, "--emit", "weights", "-o", str(out))
    assert refused.exit_code == 2 and "not written: 3 problems (3 shape mismatch): shape mismatch: " in refused.stderr
    assert not out.exists()

    # transplant --no-strict assigns the 7 and says in its last line that 3 got no value (exit 1).
    dst = tmp_path / "partial.weights.h5"
    loose = runner.invoke(app, ["transplant", keras2_h5, str(dst), "--builder", builder, "--no-strict"])
    assert loose.exit_code == 1, loose.output
    assert loose.stdout.rstrip().splitlines()[-1] == (
        "incomplete: 3 of 10 model variables did not receive a value (shape mismatches 3, dtype mismatches 0, "
        "left at init 0)")
    assert dst.exists()


def test_transplant_no_strict_that_assigns_nothing_exits_1_and_writes_nothing(in_root, tmp_path, own_keras2_h5, monkeypatch):
    monkeypatch.setenv(db.H5_ENV, own_keras2_h5)
    dst = tmp_path / "out.weights.h5"
    result = runner.invoke(app, ["transplant", str(KERAS2_TF), str(dst), "--builder", f"{BUILDERS}:keras3_from_legacy_h5",
                                 "--no-strict"])
    assert result.exit_code == 1, result.output
    assert result.stdout.rstrip().splitlines()[-1] == "incomplete: nothing was assigned; no output written"
    assert "assigned 0," in result.stdout and not dst.exists()


# -- Keras 2 TF-format save_weights checkpoint into Keras 3 ---------------------------------------
def test_keras2_tf_format_checkpoint_into_keras3(in_root, tmp_path):
    model = transplant_builders.fixture_model()
    report = ckptinspect.doctor(str(KERAS2_TF), model)
    assert report.ok and report.optimizer_skipped == 14
    how = {w.target: w.matched_by for w in report.weights}
    assert how["encoder/enc_dense/kernel"] == "prefix" and how["head/kernel"] == "name"
    assert report.assignment_map["layer_with_weights-3/kernel/.ATTRIBUTES/VARIABLE_VALUE"] == "head/kernel"
    out = tmp_path / "k3.weights.h5"
    result = doctor_cli(str(KERAS2_TF), "--builder", "tests.helpers.transplant_builders:fixture_model", "--emit", "weights",
                        "-o", str(out))
    assert result.exit_code == 0, result.output
    fresh = transplant_builders.fixture_model()
    fresh.load_weights(str(out))
    reader = tf.train.load_checkpoint(str(KERAS2_TF))
    got = {w.path: np.asarray(w.numpy()) for w in fresh.weights}
    for w in report.weights:
        np.testing.assert_array_equal(got[w.target], reader.get_tensor(w.key), err_msg=w.target)


# -- TF1 Saver checkpoint (Estimator-style names) into Keras 3 with the proposed rules -------------
@pytest.fixture(scope="module")
def tf1_prefix(tmp_path_factory) -> str:
    return db.write_tf1_estimator_checkpoint(str(tmp_path_factory.mktemp("tf1") / "model.ckpt"))


def test_tf1_estimator_checkpoint_into_keras3_with_the_proposed_rules(tf1_prefix, in_root, tmp_path):
    reader = tf.train.load_checkpoint(tf1_prefix)
    # The names share nothing: without --by-order nothing pairs (as transplant and extract say),
    # and the fix names the flag.
    plain = ckptinspect.doctor(tf1_prefix, db.tf1_mlp())
    assert not plain.ok and {w.status for w in plain.weights} == {"missing"}
    assert plain.flags == ("--by-order pairs 8 more weight(s) by layer order and shape (then every weight loads)",)
    report = ckptinspect.doctor(tf1_prefix, db.tf1_mlp(), by_order=True)
    # Layer order and shape (two hidden layers of one shape, ordered by their Keras numbering
    # since a TF1 checkpoint sorts its names).
    assert report.ok and {w.matched_by for w in report.weights} == {"layer-order"}
    assert {w.target: w.source for w in report.weights if w.target.endswith("kernel")} == {
        "mlp/hidden1/kernel": "dense/kernel", "mlp/hidden2/kernel": "dense_1/kernel",
        "mlp/hidden3/kernel": "dense_2/kernel", "mlp/logits/kernel": "dense_3/kernel"}
    assert report.optimizer_skipped > 0 and report.metadata_skipped == 1  # Adam slots, beta powers; global_step

    # A plain transplant does not trust layer order either: every weight is left at init.
    with pytest.raises(ckptinspect.TransplantError, match="left at init: mlp/hidden1/kernel"):
        ckptinspect.transplant(tf1_prefix, db.tf1_mlp())
    # The rules doctor proposes (with or without --by-order) make it work by names.
    listed = doctor_cli(tf1_prefix, "--builder", f"{BUILDERS}:tf1_mlp", "--emit", "map", "--format", "json")
    assert listed.exit_code == 1, listed.output  # the rules are printed; the verdict without them is FAIL
    rules = json.loads(listed.stdout)["map"]
    assert rules == ["^dense/=mlp/hidden1/", "^dense_1/=mlp/hidden2/", "^dense_2/=mlp/hidden3/", "^dense_3/=mlp/logits/"]
    model = db.tf1_mlp()
    mapped = ckptinspect.transplant(tf1_prefix, model, mapping=rules)
    assert mapped.ok and {a.matched_by for a in mapped.assigned} == {"mapping"}
    for w in model.weights:
        key = next(r for r in report.weights if r.target == w.path).key
        np.testing.assert_array_equal(np.asarray(w.numpy()), reader.get_tensor(key), err_msg=w.path)

    # The assignment map works with TensorFlow's own init_from_checkpoint.
    shown = doctor_cli(tf1_prefix, "--builder", f"{BUILDERS}:tf1_mlp", "--by-order", "--emit", "assignment-map")
    assert shown.exit_code == 0, shown.output
    amap = json.loads(shown.stdout)
    assert amap == {"dense/kernel": "mlp/hidden1/kernel", "dense/bias": "mlp/hidden1/bias",
                    "dense_1/kernel": "mlp/hidden2/kernel", "dense_1/bias": "mlp/hidden2/bias",
                    "dense_2/kernel": "mlp/hidden3/kernel", "dense_2/bias": "mlp/hidden3/bias",
                    "dense_3/kernel": "mlp/logits/kernel", "dense_3/bias": "mlp/logits/bias"}
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        made = {}
        for key, name in amap.items():
            *scopes, leaf = name.split("/")
            with v1.variable_scope("/".join(scopes)):
                made[key] = v1.get_variable(leaf, reader.get_variable_to_shape_map()[key], initializer=v1.zeros_initializer())
        v1.train.init_from_checkpoint(tf1_prefix, amap)
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            for key, var in made.items():
                np.testing.assert_array_equal(sess.run(var), reader.get_tensor(key), err_msg=key)


# -- layout rules: a PyTorch-layout source ---------------------------------------------------------
def test_pytorch_layout_npz_with_transpose_dense_and_oihw(in_root, tmp_path):
    rng = np.random.default_rng(3)
    arrays = {"conv/weight": rng.standard_normal((3, 2, 3, 2)).astype(np.float32),  # OIHW
              "conv/bias": rng.standard_normal(3).astype(np.float32),
              "fc/weight": rng.standard_normal((5, 60)).astype(np.float32),  # [out, in]
              "fc/bias": rng.standard_normal(5).astype(np.float32)}
    src = tmp_path / "torch_like.npz"
    np.savez(src, **arrays)
    plain = ckptinspect.doctor(str(src), db.torch_like_net())
    assert not plain.ok and {w.target for w in plain.weights if w.status == "shape-mismatch"} == {"net/conv/kernel", "net/fc/kernel"}
    report = ckptinspect.doctor(str(src), db.torch_like_net(), transpose_dense=True, conv_layout="oihw")
    assert report.ok and report.layout == ("--transpose-dense", "--conv-layout oihw")
    assert {w.target: w.fit for w in report.weights} == {
        "net/conv/kernel": "permute", "net/conv/bias": "equal", "net/fc/kernel": "transpose", "net/fc/bias": "equal"}
    out = tmp_path / "net.weights.h5"
    result = doctor_cli(str(src), "--builder", f"{BUILDERS}:torch_like_net", "--transpose-dense", "--conv-layout", "oihw",
                        "--emit", "weights", "-o", str(out))
    assert result.exit_code == 0, result.output
    fresh = db.torch_like_net()
    fresh.load_weights(str(out))
    conv, fc = fresh.get_layer("conv"), fresh.get_layer("fc")
    np.testing.assert_array_equal(conv.kernel.numpy(), arrays["conv/weight"].transpose(2, 3, 1, 0))
    np.testing.assert_array_equal(fc.kernel.numpy(), arrays["fc/weight"].T)
    np.testing.assert_array_equal(fc.bias.numpy(), arrays["fc/bias"])
    # transplant takes the same rules.
    model = db.torch_like_net()
    moved = ckptinspect.transplant(str(src), model, transpose_dense=True, conv_layout="oihw")
    assert moved.ok and {a.target: a.fit for a in moved.assigned}["net/fc/kernel"] == "transpose"
    np.testing.assert_array_equal(model.get_layer("fc").kernel.numpy(), arrays["fc/weight"].T)


# -- usage ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--emit", "weights"], "Error: --emit weights needs -o OUT.weights.h5"),
    (["-o", "x.weights.h5"], "Error: -o OUT is for --emit weights"),
    (["--conv-layout", "nchw"], "Error: conv layout must be one of hwio, oihw. Received: 'nchw'"),
    (["--map", "nomap"], "Error: bad --map rule 'nomap': expected 'REGEX=REPLACEMENT'"),
    (["--emit", "weights", "-o", "out.h5"], "Error: out.h5: doctor writes Keras 3 weights: name the output *.weights.h5"),
])
def test_cli_usage_errors(in_root, args, message):
    result = doctor_cli(str(KERAS2_TF), "--builder", "tests.helpers.transplant_builders:fixture_model", *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1


def test_doctor_is_a_public_operation_with_help():
    assert "doctor" in ckptinspect.__all__ and "doctor" in dir(ckptinspect)
    assert ckptinspect.doctor.__module__ == "ckptinspect.ops.doctor.operation"
    result = runner.invoke(app, ["doctor", "--help"])
    assert result.exit_code == 0
    for option in ("--builder", "--map", "--allow-reshape", "--transpose-dense", "--conv-layout", "--emit", "--output",
                   "--force", "--format"):
        assert option in result.stdout
