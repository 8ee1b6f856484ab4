"""Issue 27 item 12: ``rewrite --cast`` counts the finite values a cast turns into +/-Inf, zero
or subnormals, refuses an overflow unless ``--allow-overflow``, and leaks no numpy warning.
Inputs written by the real libraries (safetensors, TensorFlow)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import ckptinspect
from ckptinspect.cli import app
from ckptinspect.errors import UsageError

safetensors_numpy = pytest.importorskip("safetensors.numpy")

BIG = np.array([1.0, 7e4, -1e5, 3e38, 2.5], np.float32)  # 3 of 5 past float16's 65504
TINY = np.array([1e-6, 1e-45, 0.0, 1.0], np.float32)  # float16: 1e-6 becomes subnormal, 1e-45 zero


@pytest.fixture
def source(tmp_path) -> pathlib.Path:
    path = tmp_path / "model.safetensors"
    safetensors_numpy.save_file({"dense/kernel": BIG, "dense/bias": TINY, "head/kernel": np.ones(3, np.float32)},
                                str(path))
    return path


def test_an_overflowing_cast_is_refused_naming_the_variable(source, tmp_path):
    out = tmp_path / "half.safetensors"
    with pytest.raises(UsageError, match=r"--cast float16 would turn 3 finite values into \+/-Inf, in 1 variable\(s\):"
                                         r" dense/kernel \(3\); pass --allow-overflow"):
        ckptinspect.rewrite(source, out, cast="float16")
    assert not out.exists()


def test_the_cli_refuses_in_one_line_without_numpy_warnings(source, tmp_path):
    out = tmp_path / "half.safetensors"
    proc = subprocess.run([sys.executable, "-W", "default", "-m", "ckptinspect", "rewrite", str(source), "-o", str(out),
                           "--cast", "float16"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("Error: "), proc.stderr
    assert "RuntimeWarning" not in proc.stderr and not out.exists()


def test_allow_overflow_writes_and_reports_every_loss(source, tmp_path):
    out = tmp_path / "half.safetensors"
    result = CliRunner().invoke(app, ["rewrite", str(source), "-o", str(out), "--cast", "float16", "--allow-overflow",
                                      "--format", "json"])
    assert result.exit_code == 0, result.output
    notes = json.loads(result.stdout)["notes"]
    assert "--cast float16: dense/kernel: 3 became +/-Inf (finite values of the source)" in notes
    assert "--cast float16: dense/bias: 1 became zero, 1 became subnormal (finite values of the source)" in notes
    assert not any("head/kernel" in n for n in notes)
    written = safetensors_numpy.load_file(str(out))
    with np.errstate(over="ignore"):  # the expected value overflows, as the cast it checks does
        expected = BIG.astype(np.float16)
    np.testing.assert_array_equal(written["dense/kernel"], expected)
    assert np.isinf(written["dense/kernel"]).sum() == 3


def test_bfloat16_keeps_float32_range(source, tmp_path):
    """bfloat16 has float32's exponent: no overflow; 1e-45 (a float32 subnormal) becomes zero."""
    out = tmp_path / "bf16.safetensors"
    report = ckptinspect.rewrite(source, out, cast="bfloat16")
    assert not any("became +/-Inf" in n for n in report.notes)
    assert any(n.startswith("--cast bfloat16: dense/bias: 1 became zero") for n in report.notes), report.notes


def test_a_tf_checkpoint_cast_overflow_is_refused(tmp_path):
    tf = pytest.importorskip("tensorflow")
    module = tf.Module()
    module.kernel = tf.Variable(BIG)
    prefix = tf.train.Checkpoint(model=module).write(str(tmp_path / "src" / "ckpt"))
    out = tmp_path / "out" / "half"
    with pytest.raises(UsageError, match=r"would turn 3 finite values into \+/-Inf.*model/kernel"):
        ckptinspect.rewrite(prefix, out, cast="float16")
    assert not out.parent.exists() or not list(out.parent.iterdir())
    report = ckptinspect.rewrite(prefix, out, cast="float16", allow_overflow=True)
    assert any("3 became +/-Inf" in n for n in report.notes)


FIXTURE_RUN = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "run"
HINT = ("cast variables restore only into bfloat16 variables: build the model under"
        " keras.mixed_precision.set_global_policy('bfloat16')")


def test_the_restore_hint_after_a_cast_names_the_dtype_policy(tmp_path):
    """Issue 25 item 12: after --cast bfloat16 the printed hint alone failed in a float32 model."""
    report = ckptinspect.rewrite(FIXTURE_RUN, tmp_path / "out" / "model", role="model", cast="bfloat16")
    assert any(n.startswith(HINT) for n in report.notes), report.notes


@pytest.mark.slow  # TensorFlow and Keras build the model twice (~10 s)
def test_the_hint_restores_and_a_float32_model_refuses(tmp_path):
    out = tmp_path / "out" / "model"
    ckptinspect.rewrite(FIXTURE_RUN, out, role="model", cast="bfloat16")
    code = f"""
import keras, tensorflow as tf
from ckptinspect.trainer import build_model
for policy in ("float32", "bfloat16"):
    keras.mixed_precision.set_global_policy(policy)
    model = build_model(0)
    try:
        tf.train.Checkpoint(model=model).read({str(out)!r}).assert_consumed()
        print(policy, "restored")
    except Exception:
        print(policy, "refused")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["float32", "refused", "bfloat16", "restored"], done.stderr[-2000:]
