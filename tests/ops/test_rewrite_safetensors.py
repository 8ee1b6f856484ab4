"""``rewrite ... -o OUT.safetensors`` from any source (issue 15: writers).

Ground truth: what ``torch.load(weights_only=True)`` returned for the committed torch fixtures
(fixtures/torch/expected.npz, written by fixtures/torch/make_fixtures.py), TensorFlow's own
``tf.train.load_checkpoint`` for the trainer's fixture, and ``safetensors.numpy.load_file`` for
reading the output.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from click.testing import CliRunner

import ckptinspect
from ckptinspect.cli import app
from torch_builders import TORCH_FIXTURES

safetensors_numpy = pytest.importorskip("safetensors.numpy")
ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN = ROOT / "fixtures" / "run"


def test_torch_training_dict_renamed_model_only(tmp_path):
    out = tmp_path / "model.safetensors"
    report = ckptinspect.rewrite(TORCH_FIXTURES / "training.pt", out, rename=["^model_state_dict/fc1\\.=model_state_dict/first."],
                                 role="model")
    got = safetensors_numpy.load_file(str(out))
    expected = np.load(TORCH_FIXTURES / "expected.npz")
    want = {k.split("::", 1)[1][len("model_state_dict/"):]: expected[k] for k in expected.files
            if k.startswith("training.pt::model_state_dict/")}
    want = {k.replace("fc1.", "first.", 1) if k.startswith("fc1.") else k: v for k, v in want.items()}
    assert set(got) == set(want) and "first.weight" in got and not any(k.startswith("fc1.") for k in got)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and np.array_equal(got[k], v), k
    assert report.totals()["renamed"]["model"]["count"] == 2
    assert report.totals()["dropped"]["optimizer"]["count"] > 0
    with ckptinspect.open(out) as written:  # the header records where it came from
        assert written.info["metadata"]["source"].endswith("training.pt")
        assert (written.info["metadata"]["epoch"], written.number, written.number_source) == ("3", 3, "metadata:epoch")


def test_tf_checkpoint_cast_to_bfloat16(tmp_path):
    tf = pytest.importorskip("tensorflow")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    out = tmp_path / "model.safetensors"
    result = CliRunner().invoke(app, ["rewrite", str(RUN), "-o", str(out), "--cast", "bfloat16", "--role", "model"])
    assert result.exit_code == 0, result.output
    got = safetensors_numpy.load_file(str(out))
    with ckptinspect.open(RUN) as ckpt:
        keys = {v.name: v.key for v in ckpt.filter(role="model")}
    reader = tf.train.load_checkpoint(str(RUN))
    assert set(got) == set(keys)
    for name, key in keys.items():
        want = reader.get_tensor(key)
        if want.dtype.kind == "f":
            want = want.astype(ml_dtypes.bfloat16)
        assert got[name].dtype == want.dtype and np.array_equal(got[name].view(np.uint8), want.view(np.uint8)), name


def test_collision_refused_and_nothing_written(tmp_path):
    out = tmp_path / "x.safetensors"
    result = CliRunner().invoke(app, ["rewrite", str(TORCH_FIXTURES / "state_dict.pt"), "-o", str(out),
                                      "--rename", "fc[12]=fc"])
    assert result.exit_code == 2
    assert result.output.count("Error:") == 1 and "fc" in result.output
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_other_outputs_of_a_torch_source_refused(tmp_path):
    result = CliRunner().invoke(app, ["rewrite", str(TORCH_FIXTURES / "state_dict.pt"), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and ".safetensors" in result.output
