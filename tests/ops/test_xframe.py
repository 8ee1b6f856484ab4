"""Cross-framework ``diff``: a Keras model's TF checkpoint against the same numbers as a
PyTorch-layout state_dict (torch names, ``Linear`` ``[out, in]``, conv OIHW) written by
``safetensors.numpy.save_file`` (fixtures/xframe/make_fixtures.py).

The ground truth is what TensorFlow and safetensors read from the two files; the layout rules
(``--transpose-dense``, ``--conv-layout oihw``) are the ones ``doctor``/``transplant`` use.
"""

from __future__ import annotations

import csv
import io
import json
import pathlib

import numpy as np
import pytest
from click.testing import CliRunner

import ckptinspect
from ckptinspect.cli import app
from ckptinspect.model import Variable
from ckptinspect.ops.layout_view import pair_fit
from ckptinspect.ops.match.layouts import Layout

runner = CliRunner()
XFRAME = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "xframe"
KERAS_TF = XFRAME / "keras_tf" / "ckpt"
TORCH = XFRAME / "torch_layout.safetensors"
PERTURBED = XFRAME / "torch_layout_perturbed.safetensors"
PERTURBED_NAME = "encoder.layer.1.weight"  # make_fixtures.PERTURBED_NAME
MAPS = [r"encoder\.layer\.(\d+)\.=encoder/layer_\1/", r"\.=/"]
RULES = [arg for rule in MAPS for arg in ("--map", rule)] + ["--transpose-dense", "--conv-layout", "oihw"]
KERNELS_2D = {"encoder.layer.0.weight", "encoder.layer.1.weight", "head.weight", "proj.weight"}


def run_diff(a: pathlib.Path, b: pathlib.Path, *args: str):
    return runner.invoke(app, ["diff", str(a), str(b), *args, "--format", "json"])


def test_fixture_holds_the_same_numbers_in_two_layouts():
    """Ground truth, without ckptinspect: TF's reader and safetensors' reader, transposed by hand."""
    import tensorflow as tf
    from safetensors.numpy import load_file

    torch_side = load_file(str(TORCH))
    reader = tf.train.load_checkpoint(str(KERAS_TF))
    keras_side = {k.removesuffix("/.ATTRIBUTES/VARIABLE_VALUE"): reader.get_tensor(k)
                  for k in reader.get_variable_to_shape_map() if k.endswith("VARIABLE_VALUE")}
    conv = [k for k, v in keras_side.items() if v.ndim == 4]
    assert len(conv) == 1
    np.testing.assert_array_equal(torch_side["conv.weight"], keras_side[conv[0]].transpose(3, 2, 0, 1))
    sq = torch_side[PERTURBED_NAME]
    assert sq.shape[0] == sq.shape[1], "a square kernel: only the rule, not the shapes, says it is transposed"
    assert not np.array_equal(sq, sq.T)


def test_diff_with_the_layout_rules_proves_equal():
    result = run_diff(TORCH, KERAS_TF, *RULES)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["identical"] is True
    assert doc["layout"] == ["--transpose-dense", "--conv-layout oihw"]
    assert doc["summary"]["equal"] == 14 and len(doc["variables"]) == 14
    by_a = {v["name_a"]: v for v in doc["variables"]}
    assert by_a["conv.weight"]["name_b"] == "conv/kernel"
    assert by_a["conv.weight"]["layout"] == "permuted (axes 2,3,1,0)"
    assert by_a["conv.weight"]["shape_a"] == [4, 3, 3, 3] and by_a["conv.weight"]["shape_b"] == [3, 3, 3, 4]
    for name in KERNELS_2D:
        assert by_a[name]["layout"] == "transposed (axes 1,0)", name
    assert by_a["bn.running_mean"]["name_b"] == "bn/moving_mean"
    assert by_a["bn.running_var"]["name_b"] == "bn/moving_variance"
    assert by_a["bn.weight"]["name_b"] == "bn/gamma" and by_a["bn.weight"]["layout"] is None
    assert by_a["bn.bias"]["name_b"] == "bn/beta"
    assert by_a["encoder.layer.0.bias"]["name_b"] == "encoder/layer_0/bias"
    assert any("5 variable(s) of A compared in B's layout" in n for n in doc["notes"])


def test_diff_without_the_rules_differs():
    result = run_diff(TORCH, KERAS_TF)
    assert result.exit_code == 1
    assert json.loads(result.output)["summary"]["removed"] == 14
    # Names mapped but no layout rule: the kernels are paired and differ in shape (or value).
    result = run_diff(TORCH, KERAS_TF, *[arg for rule in MAPS + [r"weight$=kernel"] for arg in ("--map", rule)])
    assert result.exit_code == 1
    doc = json.loads(result.output)
    by_a = {v["name_a"]: v for v in doc["variables"]}
    assert by_a["head.weight"]["status"] == "shape_mismatch"
    assert by_a[PERTURBED_NAME]["status"] == "changed"  # square: equal shapes, transposed values


def test_diff_with_the_rules_finds_one_perturbed_element():
    result = run_diff(PERTURBED, KERAS_TF, *RULES)
    assert result.exit_code == 1, result.output
    doc = json.loads(result.output)
    changed = [v for v in doc["variables"] if v["status"] != "equal"]
    assert [v["name_a"] for v in changed] == [PERTURBED_NAME]
    assert changed[0]["num_different"] == 1
    assert changed[0]["max_abs_diff"] == pytest.approx(1e-3, rel=1e-3)
    # Within a tolerance above the perturbation, equal.
    assert run_diff(PERTURBED, KERAS_TF, *RULES, "--atol", "0.002").exit_code == 0


def test_diff_api_and_table():
    report = ckptinspect.diff(TORCH, KERAS_TF, mapping=MAPS, transpose_dense=True, conv_layout="oihw")
    assert report.identical and report.layout == ("--transpose-dense", "--conv-layout oihw")
    result = runner.invoke(app, ["diff", str(TORCH), str(KERAS_TF), *RULES], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "--transpose-dense --conv-layout oihw" in result.output
    assert "[4,3,3,3] -> [3,3,3,4]" in result.output
    assert "all 14 variables equal" in result.output


def test_bad_conv_layout_is_one_error_line():
    result = runner.invoke(app, ["diff", str(TORCH), str(KERAS_TF), "--conv-layout", "nchw"])
    assert result.exit_code == 2
    assert result.output.strip().startswith("Error:") and "nchw" in result.output


def _var(name: str, shape: tuple[int, ...]) -> Variable:
    return Variable(key=name, name=name, shape=shape, dtype="float32", nbytes=4 * int(np.prod(shape)))


def test_pair_fit_applies_to_kernels_only():
    both = Layout(transpose_dense=True, conv_layout="oihw")
    assert pair_fit(_var("fc.weight", (3, 2)), _var("fc/kernel", (2, 3)), both).describe() == "transposed (axes 1,0)"
    assert pair_fit(_var("fc.weight", (3, 3)), _var("fc/kernel", (3, 3)), both).kind == "transpose"
    assert pair_fit(_var("emb.weight", (10, 4)), _var("emb/embeddings", (10, 4)), both) is None
    assert pair_fit(_var("fc.weight", (3, 2)), _var("fc/kernel", (2, 3)), Layout()) is None
    assert pair_fit(_var("c.weight", (8, 3, 5, 5)), _var("c/kernel", (5, 5, 3, 8)), both).axes == (2, 3, 1, 0)
    assert pair_fit(_var("c.weight", (8, 3, 5)), _var("c/kernel", (5, 3, 8)), both).axes == (2, 1, 0)
    assert pair_fit(_var("fc.weight", (3, 2)), _var("fc/kernel", (3, 4)), both) is None  # no fit: shape mismatch


def test_dotted_names_split_without_a_rule():
    """PyTorch's dots separate layer and leaf for the layers stage: only the template needs a rule."""
    result = run_diff(TORCH, KERAS_TF, "--map", MAPS[0], "--transpose-dense", "--conv-layout", "oihw")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["summary"]["equal"] == 14
    # Without the template rule, encoder.layer.0 is not encoder/layer_0: those four differ.
    result = run_diff(TORCH, KERAS_TF, "--transpose-dense", "--conv-layout", "oihw")
    assert result.exit_code == 1
    doc = json.loads(result.output)
    assert doc["summary"]["equal"] == 10 and doc["summary"]["removed"] == 4


def test_csv_has_the_layout_column():
    result = runner.invoke(app, ["diff", str(TORCH), str(KERAS_TF), *RULES, "--format", "csv"])
    assert result.exit_code == 0
    rows = {r["name_a"]: r for r in csv.DictReader(io.StringIO(result.stdout))}
    assert rows["conv.weight"]["layout"] == "permuted (axes 2,3,1,0)"
    assert rows["conv.bias"]["layout"] == ""


def test_swapped_sides_get_a_note():
    """The rules describe A: with the Keras checkpoint first, kernels do not compare, and a note says why."""
    result = run_diff(KERAS_TF, TORCH, "--transpose-dense", "--conv-layout", "oihw")
    assert result.exit_code == 1
    doc = json.loads(result.output)
    assert any("fit the layout rules the other way round" in n and "swap A and B" in n for n in doc["notes"])
