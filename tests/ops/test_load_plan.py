"""One pairing rule for ``doctor``, ``transplant`` and ``extract --builder`` (issue 25 item 3).

The three commands take the same pairing flags with the same defaults and pair through one plan
(:mod:`ckptinspect.ops.model.plan`), so ``doctor``'s verdict is what ``transplant`` and
``extract --builder`` do with the same flags, and their problems read the same.

Sources are real: the committed fixture run (a Keras 3 model trained by the fixture trainer
under MirroredStrategy, saved with ``tf.train.Checkpoint``) and the committed PyTorch MLP
(trained and ``torch.save``d by fixtures/torch/make_fixtures.py). Models are real Keras 3
models (tests/helpers/transplant_builders.py, xframe_builders.py). Expected values come from
TensorFlow's own restore and from what torch saved (fixtures/torch/expected.npz).
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

from ckptinspect import trainer  # noqa: E402

import transplant_builders as builders  # noqa: E402 - tests/helpers is on sys.path
from torch_builders import TORCH_FIXTURES  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN = ROOT / "fixtures" / "run"
BUILDERS = "tests.helpers.transplant_builders"
TORCH_MLP = TORCH_FIXTURES / "state_dict.pt"

runner = CliRunner()


@pytest.fixture(autouse=True)
def in_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # --builder tests.helpers...: the current directory is importable


@pytest.fixture(scope="module")
def expected() -> dict[str, list[np.ndarray]]:
    """Per fixture layer, the weights TensorFlow itself restores from the run's newest checkpoint."""
    model = trainer.build_model(seed=3)
    tf.train.Checkpoint(model=model).read(tf.train.latest_checkpoint(str(RUN))).expect_partial()
    return {name: model.get_layer(name).get_weights() for name in builders.FLAT_PAIRS.values()}


def invoke(*args) -> object:
    return runner.invoke(app, [str(a) for a in args])


def three(src, builder: str, tmp_path: pathlib.Path, *flags: str) -> dict[str, object]:
    """doctor, transplant and extract --builder on the same source with the same flags (JSON)."""
    return {
        "doctor": invoke("doctor", src, "--builder", builder, *flags, "-f", "json"),
        "transplant": invoke("transplant", src, tmp_path / "t.weights.h5", "--builder", builder, *flags, "-f", "json"),
        "extract": invoke("extract", src, "-o", tmp_path / "e.weights.h5", "--builder", builder, *flags, "-f", "json"),
    }


def assert_flat_layers(model_weights: dict[str, list[np.ndarray]], expected) -> None:
    for mine, theirs in builders.FLAT_PAIRS.items():
        got, want = model_weights[mine], expected[theirs]
        assert len(got) == len(want) > 0, mine
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b, err_msg=mine)


def loaded_flat(path: pathlib.Path) -> dict[str, list[np.ndarray]]:
    model = builders.flat_model()
    model.load_weights(str(path))
    return {name: model.get_layer(name).get_weights() for name in builders.FLAT_NAMES}


# -- a flat model with other names: layer order is a flag, the same in all three ---------------
def test_flat_renamed_model_needs_by_order_in_all_three(tmp_path):
    done = three(RUN, f"{BUILDERS}:flat_model", tmp_path)
    doctor = done["doctor"]
    assert doctor.exit_code == 1, doctor.output  # was 0: doctor paired by layer order, the others did not
    doc = json.loads(doctor.stdout)
    assert doc["ok"] is False and doc["by_order"] is False and doc["summary"]["missing"] == 10
    assert doc["fix"]["flags"] == ["--by-order pairs 10 more weight(s) by layer order and shape (then every weight loads)"]
    table = invoke("doctor", RUN, "--builder", f"{BUILDERS}:flat_model")
    assert "fix:      --by-order pairs 10 more weight(s) by layer order and shape (then every weight loads);" in table.stdout
    assert table.stdout.rstrip().splitlines()[-1].startswith("verdict:  FAIL: 10 of 10 model weights cannot be loaded")

    transplant = done["transplant"]
    assert transplant.exit_code == 2 and "cannot transplant into 'flat': 20 problems" in transplant.stderr
    assert "hint: --by-order pairs the remaining layers by order and shape" in transplant.stderr
    extract = done["extract"]
    assert extract.exit_code == 2 and "not written: 20 problems (10 left at init, 10 unused in the source)" in extract.stderr
    assert not (tmp_path / "t.weights.h5").exists() and not (tmp_path / "e.weights.h5").exists()
    # The same problems, in the same words.
    for problem in doc["problems"][:5]:
        assert problem in extract.stderr
    dry = json.loads(invoke("transplant", RUN, tmp_path / "d.weights.h5", "--builder", f"{BUILDERS}:flat_model",
                            "--dry-run", "-f", "json").stdout)
    assert sorted(dry["problems"]) == sorted(doc["problems"])


def test_flat_renamed_model_with_by_order_loads_in_all_three(tmp_path, expected):
    done = three(RUN, f"{BUILDERS}:flat_model", tmp_path, "--by-order")
    doctor = done["doctor"]
    assert doctor.exit_code == 0, doctor.output
    doc = json.loads(doctor.stdout)
    assert doc["ok"] and doc["by_order"] and {w["matched_by"] for w in doc["weights"]} == {"layer-order"}
    assert doc["problems"] == [] and doc["fix"]["flags"] == []
    for name in ("transplant", "extract"):
        assert done[name].exit_code == 0, (name, done[name].output)
    report = json.loads(done["transplant"].stdout)
    assert report["by_order"] and [a["target"] for a in report["assigned"]] == [w["target"] for w in doc["weights"]]
    assert [a["source"] for a in report["assigned"]] == [w["source"] for w in doc["weights"]]
    assert_flat_layers(loaded_flat(tmp_path / "t.weights.h5"), expected)
    assert_flat_layers(loaded_flat(tmp_path / "e.weights.h5"), expected)


# -- a head of 5 units where the source has 4 -------------------------------------------------
def test_wider_head_is_a_shape_mismatch_in_all_three(tmp_path):
    done = three(RUN, f"{BUILDERS}:flat_wide_head_model", tmp_path, "--by-order")
    kernel = "classifier/kernel is [16,5] in the model, [16,4] in the source (head/kernel)"
    bias = "classifier/bias is [5] in the model, [4] in the source (head/bias)"
    doctor = done["doctor"]
    assert doctor.exit_code == 1
    doc = json.loads(doctor.stdout)
    assert doc["reasons"]["shape_mismatch"] == [kernel, bias]
    assert doc["reasons"]["missing"] == [] and doc["reasons"]["unused"] == []  # was: missing 2, unused 2
    assert doc["problems"] == [f"shape mismatch: {kernel}", f"shape mismatch: {bias}"]
    assert doc["fix"]["map"] == [] and doc["fix"]["flags"] == []  # no --emit map: a rename cannot fix a shape
    table = invoke("doctor", RUN, "--builder", f"{BUILDERS}:flat_wide_head_model", "--by-order").stdout
    assert "--emit map" not in table and f"    {kernel}" in table
    assert table.rstrip().splitlines()[-1] == "verdict:  FAIL: 2 of 10 model weights cannot be loaded (shape mismatch 2)"

    for name in ("transplant", "extract"):
        result = done[name]
        assert result.exit_code == 2 and f"shape mismatch: {kernel}" in result.stderr, (name, result.output)
        assert "left at init" not in result.stderr and "unused" not in result.stderr
    assert "2 problems (2 shape mismatch)" in done["extract"].stderr
    assert not (tmp_path / "t.weights.h5").exists() and not (tmp_path / "e.weights.h5").exists()

    # Without --by-order nothing pairs; doctor says what --by-order would find.
    plain = json.loads(invoke("doctor", RUN, "--builder", f"{BUILDERS}:flat_wide_head_model", "-f", "json").stdout)
    assert plain["fix"]["flags"] == ["--by-order pairs 10 more weight(s) by layer order and shape (then: 2 shape mismatch)"]
    assert plain["fix"]["map"] == []


# -- PyTorch BatchNorm's num_batches_tracked: skipped by rule in all three --------------------
def test_num_batches_tracked_is_skipped_by_rule_in_all_three(tmp_path):
    done = three(TORCH_MLP, "xframe_builders:mlp", tmp_path, "--transpose-dense")
    for name, result in done.items():
        assert result.exit_code == 0, (name, result.output)  # transplant refused it (unused) before
        doc = json.loads(result.stdout)
        note = next(n for n in doc["notes"] if "skipped by rule" in n)
        assert note.startswith("1 source variable(s) skipped by rule: PyTorch BatchNorm's num_batches_tracked"), name
        assert "bn.num_batches_tracked" in note
    assert json.loads(done["doctor"].stdout)["skipped_by_rule"] == ["bn.num_batches_tracked"]
    assert json.loads(done["doctor"].stdout)["summary"]["skipped_by_rule"] == 1
    assert json.loads(done["transplant"].stdout)["skipped_by_rule"] == ["bn.num_batches_tracked"]
    assert json.loads(done["transplant"].stdout)["unused"] == []
    with np.load(TORCH_FIXTURES / "expected.npz") as npz:
        want = {k.split("::", 1)[1]: npz[k] for k in npz.files if k.startswith("state_dict.pt::")}
    for path in (tmp_path / "t.weights.h5", tmp_path / "e.weights.h5"):
        import xframe_builders  # noqa: PLC0415

        model = xframe_builders.mlp()
        model.load_weights(str(path))
        np.testing.assert_array_equal(model.get_layer("fc1").get_weights()[0], want["fc1.weight"].T)
        np.testing.assert_array_equal(model.get_layer("bn").get_weights()[3], want["bn.running_var"])


def test_the_three_commands_take_the_same_pairing_flags():
    flags = ("--map", "--by-order", "--transpose-dense", "--conv-layout", "--allow-reshape", "--strict")
    strict_help = set()
    for command in ("doctor", "transplant", "extract"):
        params = {opt: p for p in app.commands[command].params for opt in p.opts}
        for flag in flags:
            assert flag in params, (command, flag)
        assert params["--by-order"].default is False and params["--allow-reshape"].default is False
        assert params["--conv-layout"].default == "hwio" and params["--transpose-dense"].default is False
        strict = params["--strict"]
        assert strict.default is True and strict.secondary_opts == ["--no-strict"], command
        strict_help.add(strict.help.replace(" (.weights.h5 with --builder)", ""))  # extract's says where it applies
    assert len(strict_help) == 1, strict_help  # one meaning, worded once


# -- a backbone: every weight has a value, source variables are left over ---------------------
def test_unused_source_variables_fail_doctor_as_they_stop_transplant_and_extract(tmp_path):
    done = three(RUN, f"{BUILDERS}:headless_model", tmp_path)
    doc = json.loads(done["doctor"].stdout)
    assert done["doctor"].exit_code == 1 and doc["ok"] is False  # was 0: doctor listed them without failing
    assert doc["summary"]["matched"] == 8 and doc["reasons"]["unused"] == [
        "head/kernel [16,4] matches no model variable", "head/bias [4] matches no model variable"]
    # The fix names the flag of the same name in all three, not another command.
    assert doc["strict"] is True
    assert doc["fix"]["flags"] == ["--no-strict leaves the 2 unused source variable(s) out (then every weight loads)"]
    table = invoke("doctor", RUN, "--builder", f"{BUILDERS}:headless_model").stdout
    assert "fix:      --no-strict leaves the 2 unused source variable(s) out (then every weight loads);" in table
    assert "transplant --no-strict" not in table
    assert table.rstrip().splitlines()[-1] == ("verdict:  FAIL: every model weight has a source value that fits "
                                               "(8 of 8), but 2 source variables would be left unused")
    assert done["transplant"].exit_code == 2 and "2 problems (2 unused in the source)" in done["transplant"].stderr
    assert done["extract"].exit_code == 2 and "2 problems (2 unused in the source)" in done["extract"].stderr
    for problem in doc["problems"]:
        assert problem in done["extract"].stderr and problem in done["transplant"].stderr
    loose = invoke("transplant", RUN, tmp_path / "loose.weights.h5", "--builder", f"{BUILDERS}:headless_model",
                   "--no-strict")
    assert loose.exit_code == 0, loose.output  # what the fix says


# -- --no-strict, the same in all three -------------------------------------------------------
BACKBONE = ("encoder", "frozen", "bn")  # headless_model's layers, as the fixture names them


def loaded(builder, path: pathlib.Path, layers) -> dict[str, list[np.ndarray]]:
    model = builder()
    model.load_weights(str(path))
    return {name: model.get_layer(name).get_weights() for name in layers}


def test_no_strict_takes_a_backbone_from_a_bigger_checkpoint_in_all_three(tmp_path, expected):
    done = three(RUN, f"{BUILDERS}:headless_model", tmp_path, "--no-strict")
    for name, result in done.items():
        assert result.exit_code == 0, (name, result.output)  # doctor FAILed, extract refused: no such option
    unused_note = "--no-strict: 2 unused source variable(s) left out (head/kernel [16,4], head/bias [4])"
    doc = json.loads(done["doctor"].stdout)
    assert doc["ok"] is True and doc["strict"] is False and doc["problems"] == [] and doc["fix"]["flags"] == []
    assert doc["summary"]["matched"] == 8 and doc["summary"]["unused"] == 2
    assert doc["reasons"]["unused"] == [] and unused_note in doc["notes"]  # allowed: a note, not a reason
    table = invoke("doctor", RUN, "--builder", f"{BUILDERS}:headless_model", "--no-strict")
    assert table.exit_code == 0
    assert table.stdout.rstrip().splitlines()[-1] == ("verdict:  OK: every model weight has a source value that fits "
                                                      "(8 of 8); 2 unused source variables left out (--no-strict)")

    report = json.loads(done["transplant"].stdout)
    assert report["strict"] is False and report["ok"] and report["complete"] and report["problems"] == []
    assert [u["source"] for u in report["unused"]] == ["head/kernel", "head/bias"] and unused_note in report["notes"]
    matched = [w["target"] for w in doc["weights"] if w["status"] == "matched"]
    assert [a["target"] for a in report["assigned"]] == matched
    extract = json.loads(done["extract"].stdout)
    assert extract["complete"] and extract["left_at_init"] == [] and extract["verified"] == 8
    assert unused_note in extract["notes"]
    dropped = {v["name"] for v in extract["variables"] if v["role"] == "model" and not v["kept"]}
    assert dropped == {"head/kernel", "head/bias"}

    # Both files hold what TensorFlow itself restores from the checkpoint, layer by layer.
    for path in (tmp_path / "t.weights.h5", tmp_path / "e.weights.h5"):
        got = loaded(builders.headless_model, path, BACKBONE)
        for layer in BACKBONE:
            assert len(got[layer]) == len(expected[layer]) > 0
            for a, b in zip(got[layer], expected[layer]):
                np.testing.assert_array_equal(a, b, err_msg=f"{path.name}: {layer}")


def test_no_strict_leaves_a_wider_head_at_init_in_all_three(tmp_path, expected):
    builder = f"{BUILDERS}:flat_wide_head_model"
    done = three(RUN, builder, tmp_path, "--by-order", "--no-strict")
    for name, result in done.items():  # a weight left at init: exit 1 in all three (extract and transplant write)
        assert result.exit_code == 1, (name, result.output)
    head = ["classifier/kernel", "classifier/bias"]
    doc = json.loads(done["doctor"].stdout)
    assert doc["ok"] is False and doc["strict"] is False
    assert [w["target"] for w in doc["weights"] if w["status"] != "matched"] == head
    assert doc["problems"] == [
        "shape mismatch: classifier/kernel is [16,5] in the model, [16,4] in the source (head/kernel)",
        "shape mismatch: classifier/bias is [5] in the model, [4] in the source (head/bias)"]
    table = invoke("doctor", RUN, "--builder", builder, "--by-order", "--no-strict")
    assert table.exit_code == 1
    assert table.stdout.rstrip().splitlines()[-1] == (
        "verdict:  FAIL: 2 of 10 model weights would be left at init with --no-strict (shape mismatch 2): "
        "classifier/kernel, classifier/bias")

    report = json.loads(done["transplant"].stdout)
    assert not report["complete"] and report["output"]["written"]
    assert [x["target"] for x in report["mismatches"]] == head
    assert sorted(report["problems"]) == sorted(doc["problems"])
    matched = [w["target"] for w in doc["weights"] if w["status"] == "matched"]
    assert [a["target"] for a in report["assigned"]] == matched
    extract = json.loads(done["extract"].stdout)
    assert not extract["complete"] and extract["left_at_init"] == head and extract["verified"] == len(matched) == 8
    assert "incomplete: 2 of 10 model weights did not receive a value (left at init: classifier/kernel, classifier/bias)" in (
        invoke("extract", RUN, "-o", tmp_path / "e2.weights.h5", "--builder", builder, "--by-order", "--no-strict").stdout)

    # The layers that matched hold TensorFlow's restore; the head holds the builder's initial
    # values (its kernel is seeded, its bias zeros), not anything from the source.
    initial = builders.flat_wide_head_model().get_layer("classifier").get_weights()
    assert not np.any(initial[1]) and np.any(initial[0])
    for path in (tmp_path / "t.weights.h5", tmp_path / "e.weights.h5"):
        got = loaded(builders.flat_wide_head_model, path, builders.FLAT_NAMES)
        for mine, theirs in builders.FLAT_PAIRS.items():
            want = initial if mine == "classifier" else expected[theirs]
            assert len(got[mine]) == len(want) > 0
            for a, b in zip(got[mine], want):
                np.testing.assert_array_equal(a, b, err_msg=f"{path.name}: {mine}")


def test_no_strict_with_nothing_to_pair_writes_nothing(tmp_path):
    """Without --by-order nothing pairs into the flat model: doctor says every weight would be
    left at init, transplant writes nothing (exit 1), extract refuses (nothing to write)."""
    done = three(RUN, f"{BUILDERS}:flat_model", tmp_path, "--no-strict")
    doc = json.loads(done["doctor"].stdout)
    assert done["doctor"].exit_code == 1 and doc["summary"]["matched"] == 0 and len(doc["problems"]) == 10
    assert done["transplant"].exit_code == 1 and json.loads(done["transplant"].stdout)["assigned"] == []
    assert done["extract"].exit_code == 2 and "not written: 10 problems (10 left at init)" in done["extract"].stderr
    assert not (tmp_path / "t.weights.h5").exists() and not (tmp_path / "e.weights.h5").exists()


def test_no_strict_applies_to_a_builder_output_only(tmp_path):
    result = invoke("extract", RUN, "-o", tmp_path / "out.npz", "--no-strict")
    assert result.exit_code == 2 and "--no-strict apply to a .weights.h5 output (with --builder)" in result.stderr
    assert not (tmp_path / "out.npz").exists()
