"""Read-back failures raise one error: ``VerificationError``, in extract and in transplant.

The outputs are written by TensorFlow for real, then made to differ from what was expected
(the model changes after the write, a value read back is another array), as a failing disk or
a writer bug would.
"""

from __future__ import annotations

import numpy as np
import pytest

import ckptinspect
from ckptinspect.errors import CkptError, VerificationError
from ckptinspect.model import Variable

tf = pytest.importorskip("tensorflow")
pytest.importorskip("keras")


def test_exported_and_caught_as_the_base_error():
    assert "VerificationError" in ckptinspect.__all__ and ckptinspect.VerificationError is VerificationError
    assert issubclass(VerificationError, CkptError)
    assert VerificationError("x", problems=["a", "b"]).problems == ["a", "b"]


def test_transplant_read_back_of_a_written_model_that_differs(tmp_path):
    from ckptinspect import trainer
    from ckptinspect.ops.model.weights_io import _read_back

    model = trainer.build_model(seed=1)
    prefix = tf.train.Checkpoint(model=model).write(str(tmp_path / "out"))
    assert _read_back(prefix, model, "out") == len(model.weights)  # as written: every variable equal
    head = model.get_layer("head").kernel
    head.assign(head.numpy() + 1.0)
    with pytest.raises(VerificationError, match=r"^out: the written output differs from the model: head/kernel") as info:
        _read_back(prefix, model, "out")
    assert info.value.problems[0].startswith("head/kernel (max abs diff 1)")


def test_transplant_read_back_of_an_output_missing_variables(tmp_path):
    from ckptinspect import trainer
    from ckptinspect.ops.model.weights_io import _read_back

    module = tf.Module()
    module.w = tf.Variable(np.zeros(3, np.float32))
    prefix = tf.train.Checkpoint(model=module).write(str(tmp_path / "other"))
    with pytest.raises(VerificationError, match=r"does not hold 10 model variable\(s\)"):
        _read_back(prefix, trainer.build_model(seed=1), "other")


def test_extract_read_back_of_a_value_that_differs():
    from ckptinspect.ops.extract.writers import Verifier as _Verifier

    source = Variable(key="w", name="w", shape=(3,), dtype="float32", nbytes=12)
    value = np.arange(3, dtype=np.float32)
    verifier = _Verifier(None, 1)
    verifier.record("w", source)
    assert verifier.check("out", ["w"], lambda k: value, lambda got, v: np.array_equal(got, value)) == 1
    with pytest.raises(VerificationError, match="read-back check failed: 'w' differs from the source value"):
        verifier.check("out", ["w"], lambda k: value + 1, lambda got, v: np.array_equal(got, value))
    with pytest.raises(VerificationError, match=r"1 kept tensor\(s\) missing and 1 unexpected"):
        verifier.check("out", ["v"], lambda k: value, lambda got, v: True)
