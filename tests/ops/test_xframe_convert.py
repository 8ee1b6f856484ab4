"""Conversions from PyTorch / safetensors: ``extract -o X.weights.h5 --builder`` (names paired by
the matcher, layout rules applied) and ``extract -o X.npz``.

Ground truth: the committed torch fixtures' expected values (what ``torch.load(weights_only=True)``
returned, fixtures/torch/expected.npz), ``safetensors.numpy.load_file`` and TensorFlow's own
checkpoint reader; the written ``.weights.h5`` is loaded with plain ``model.load_weights``.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
from click.testing import CliRunner

import ckptinspect
from ckptinspect.cli import app
from torch_builders import TORCH_FIXTURES
import xframe_builders

runner = CliRunner()
XFRAME = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "xframe"
# Keras weight path -> (state_dict key, transposed?)
MLP_WEIGHTS = {
    "fc1/kernel": ("fc1.weight", True),
    "fc1/bias": ("fc1.bias", False),
    "bn/gamma": ("bn.weight", False),
    "bn/beta": ("bn.bias", False),
    "bn/moving_mean": ("bn.running_mean", False),
    "bn/moving_variance": ("bn.running_var", False),
    "fc2/kernel": ("fc2.weight", True),
    "fc2/bias": ("fc2.bias", False),
}
# Source file -> how expected.npz names its state_dict.
TORCH_SOURCES = {
    "state_dict.pt": "state_dict.pt::",
    "training.pt": "training.pt::model_state_dict/",
    "training_legacy.pt": "training_legacy.pt::model_state_dict/",
}


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    with np.load(TORCH_FIXTURES / "expected.npz") as npz:
        return {k: npz[k] for k in npz.files}


def _loaded(path: pathlib.Path) -> dict[str, np.ndarray]:
    model = xframe_builders.mlp()
    model.load_weights(str(path))
    return {w.path: np.asarray(w.numpy()) for w in model.weights}


def _extract(src: pathlib.Path, out: pathlib.Path, *args: str):
    return runner.invoke(app, ["extract", str(src), "-o", str(out), *args, "--format", "json"])


@pytest.mark.parametrize("source", sorted(TORCH_SOURCES))
def test_torch_to_weights_h5_loads_with_load_weights(tmp_path, source, expected):
    out = tmp_path / "mlp.weights.h5"
    result = _extract(TORCH_FIXTURES / source, out, "--builder", "xframe_builders:mlp", "--transpose-dense")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["verified"] == len(MLP_WEIGHTS)
    assert any("2 weight(s) rearranged by the layout rules (--transpose-dense)" in n for n in doc["notes"])
    assert any("num_batches_tracked" in n for n in doc["notes"])  # a source value with no Keras weight
    weights = _loaded(out)
    assert set(weights) == set(MLP_WEIGHTS)
    prefix = TORCH_SOURCES[source]
    for path, (key, transposed) in MLP_WEIGHTS.items():
        want = expected[prefix + key]
        np.testing.assert_array_equal(weights[path], want.T if transposed else want, err_msg=path)


def test_safetensors_to_weights_h5(tmp_path):
    from safetensors.numpy import load_file

    src = TORCH_FIXTURES / "state_dict.safetensors"
    out = tmp_path / "mlp.weights.h5"
    result = _extract(src, out, "--builder", "xframe_builders:mlp", "--transpose-dense")
    assert result.exit_code == 0, result.output
    truth = load_file(str(src))
    weights = _loaded(out)
    for path, (key, transposed) in MLP_WEIGHTS.items():
        np.testing.assert_array_equal(weights[path], truth[key].T if transposed else truth[key], err_msg=path)


def test_conv_and_templates_through_the_api(tmp_path, monkeypatch):
    """The cross-framework fixture: OIHW conv and [out,in] kernels, a name template; the file
    loads into the Keras model with the numbers TensorFlow reads from the original checkpoint."""
    import tensorflow as tf

    monkeypatch.syspath_prepend(str(XFRAME))
    import xframe_model

    out = tmp_path / "net.weights.h5"
    report = ckptinspect.extract(XFRAME / "torch_layout.safetensors", out, builder=xframe_model.build_model,
                                 mapping=[r"encoder\.layer\.(\d+)\.=encoder/layer_\1/"], transpose_dense=True,
                                 conv_layout="oihw")
    assert report.verified == 14
    model = xframe_model.build_model()
    model.load_weights(str(out))
    reader = tf.train.load_checkpoint(str(XFRAME / "keras_tf" / "ckpt"))
    truth = {k.removesuffix("/.ATTRIBUTES/VARIABLE_VALUE"): reader.get_tensor(k)
             for k in reader.get_variable_to_shape_map() if k.endswith("VARIABLE_VALUE")}
    by_value_count = 0
    for w in model.weights:
        value = np.asarray(w.numpy())
        same = [k for k, v in truth.items() if v.shape == value.shape and np.array_equal(v, value)]
        assert len(same) == 1, w.path
        by_value_count += 1
    assert by_value_count == 14


def test_refusals_are_one_error_line(tmp_path):
    src = TORCH_FIXTURES / "state_dict.pt"
    out = tmp_path / "mlp.weights.h5"
    result = _extract(src, out)  # no builder
    assert result.exit_code == 2 and result.output.startswith("Error:") and "--builder" in result.output
    result = _extract(src, out, "--builder", "xframe_builders:mlp")  # no --transpose-dense: kernels do not fit
    assert result.exit_code == 2, result.output
    assert "not written: 2 problems (2 shape mismatch): shape mismatch: fc1/kernel is [4,8] in the model" in result.output
    assert not out.exists()
    result = _extract(src, tmp_path / "x.npz", "--transpose-dense")
    assert result.exit_code == 2 and "apply to a .weights.h5 output" in result.output


def test_torch_to_npz(tmp_path, expected):
    out = tmp_path / "training.npz"
    result = _extract(TORCH_FIXTURES / "training.pt", out)
    assert result.exit_code == 0, result.output
    with np.load(out, allow_pickle=False) as npz:
        got = {k: npz[k] for k in npz.files}
    # Named by state_dict key (model_state_dict/ dropped, as the safetensors output), optimizer dropped.
    assert set(got) == {k for _, (k, _) in MLP_WEIGHTS.items()} | {"bn.num_batches_tracked"}
    for key, value in got.items():
        want = expected["training.pt::model_state_dict/" + key]
        assert value.dtype == want.dtype
        np.testing.assert_array_equal(value, want)


def test_bfloat16_to_npz_is_refused_with_a_way_out(tmp_path):
    result = _extract(TORCH_FIXTURES / "dtypes.pt", tmp_path / "d.npz")
    assert result.exit_code == 2
    assert "no numpy .npy encoding; use a .safetensors output" in result.output
    assert not (tmp_path / "d.npz").exists()


def test_legacy_keras2_weights_to_weights_h5_by_names(tmp_path):
    """A Keras 2 weights file (no object graph) goes the same way: paired by name, as doctor does."""
    import h5py

    from ckptinspect.trainer import build_model

    src = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "keras" / "keras2_weights.h5"
    out = tmp_path / "k.weights.h5"
    result = _extract(src, out, "--builder", "ckptinspect.trainer:build_model")
    assert result.exit_code == 0, result.output
    truth = []
    with h5py.File(src, "r") as f:
        f.visititems(lambda name, obj: truth.append(obj[()]) if isinstance(obj, h5py.Dataset) else None)
    model = build_model()
    model.load_weights(str(out))
    assert len(model.weights) == len(truth) == 10
    for w in model.weights:
        value = np.asarray(w.numpy())
        assert sum(1 for t in truth if t.shape == value.shape and np.array_equal(t, value)) == 1, w.path
