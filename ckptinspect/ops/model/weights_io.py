"""Building the model and writing it: what ``ckptinspect transplant`` composes around
:func:`~ckptinspect.ops.model.transplant.transplant`.

:func:`build_in_scope` calls the user's builder inside the strategy's scope; :func:`write_model`
writes the model atomically (a TF checkpoint prefix, a ``.weights.h5`` or a ``.keras`` file, by
suffix), reads it back and compares every variable bit for bit before renaming it into place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from typing import Any, Iterable

import numpy as np

from ... import model as m
from ..._atomic import atomic_file, atomic_prefix, check_output, prefix_suffix_error
from ..._tf import missing_tensorflow
from ...errors import CkptError, UsageError, VerificationError
from ...formats import FORMAT_OF, TO_H5, TO_KERAS, TO_TF, TO_WEIGHTS_H5
from ...formats import output_kind as kind_of_output
from .assign import MAX_PROBLEMS_IN_MESSAGE, expected_value, max_abs_diff, problems_text
from .builder import load_builder
from ..bit_equality import bit_equal
from .devices import import_tf
from .targets import CHECKPOINT_MODEL_CHILD, is_keras, mismatch, pair_with_model, targets

__all__ = [
    "OUTPUT_TF",
    "OUTPUT_WEIGHTS_H5",
    "OUTPUT_KERAS",
    "WriteResult",
    "build_in_scope",
    "output_kind",
    "write_model",
]

OUTPUT_TF = TO_TF  # output kinds: the formats' one vocabulary (``--to``)
OUTPUT_WEIGHTS_H5 = TO_WEIGHTS_H5
OUTPUT_KERAS = TO_KERAS
WEIGHTS_H5_SUFFIX = ".weights.h5"
SCRATCH_PREFIX = "ckptinspect-worker-"


def build_in_scope(spec: str, strategy: Any) -> Any:
    """Import the builder ``pkg.module:function`` and call it inside ``strategy.scope()`` (a
    ``tf.distribute`` strategy; None: no scope, as a Keras 3 model of any backend is built).

    Raises:
        UsageError: The builder cannot be imported or raises.
    """
    builder = load_builder(spec)
    try:
        with strategy.scope() if strategy is not None else contextlib.nullcontext():
            return builder()
    except CkptError:
        raise
    except Exception as e:  # noqa: BLE001 - user code: one line naming the builder
        missing = missing_tensorflow(e, f"--builder {spec}")
        if missing is not None:
            raise missing from None
        text = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise UsageError(f"--builder {spec}: the builder raised {type(e).__name__}: {text}") from e


def output_kind(dest: str) -> str:
    """``tf`` (a prefix), ``weights-h5`` or ``keras``, by suffix (:func:`ckptinspect.formats.output_kind`).

    Raises:
        UsageError: A legacy ``.h5`` name (use ``.weights.h5`` or ``.keras``), or a suffix a
            TF prefix does not have (``out.safetensors``, ``X.index``).
    """
    kind = kind_of_output(dest)
    if kind in (OUTPUT_WEIGHTS_H5, OUTPUT_KERAS):
        return kind
    if kind == TO_H5:
        raise UsageError(
            f"{dest}: legacy .h5 output is not written; name it *.weights.h5 (weights) or *.keras (model), "
            "or give a TF checkpoint prefix"
        )
    error = prefix_suffix_error(dest, "transplant writes a TF prefix (no suffix, .ckpt or .ckpt-N), "
                                      "a .weights.h5 or a .keras file", "")
    if error is not None:
        raise error
    return OUTPUT_TF


@dataclasses.dataclass(frozen=True)
class WriteResult:
    """What :func:`write_model` did.

    Attributes:
        path: The output path (prefix for TF checkpoints).
        format: The format written, a registry name: ``tf-bundle``, ``keras-weights-h5`` or ``keras-zip``.
        written: This process wrote ``path`` (False on a non-chief worker).
        verified: The written output was read back and every model variable found equal.
        checked: Variables compared in the read-back.
    """

    path: str
    format: str
    written: bool
    verified: bool
    checked: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _save(model: Any, kind: str, path: str) -> None:
    tf = import_tf()
    if kind == OUTPUT_TF:
        tf.train.Checkpoint(**{CHECKPOINT_MODEL_CHILD: model}).write(path)
    elif kind == OUTPUT_WEIGHTS_H5:
        model.save_weights(path)
    else:
        model.save(path)


def write_model(
    model: Any,
    dest: str,
    *,
    force: bool = False,
    protected: Iterable[str] = (),
    strategy: Any = None,
) -> WriteResult:
    """Write a model's weights to ``dest`` atomically, then read them back and check them.

    ``dest`` is a TF checkpoint prefix (``tf.train.Checkpoint(model=model).write``), a
    ``.weights.h5`` or a ``.keras`` file, by suffix. Under a multi-worker strategy every worker
    takes part in the save (as TensorFlow requires) but only the chief writes ``dest``; the
    others write to a temporary directory that is removed.

    Args:
        model: The model.
        dest: The output path.
        force: Replace an existing output.
        protected: Inputs that must never be overwritten.
        strategy: The model's strategy (to tell the chief); default: the current one.

    Returns:
        A :class:`WriteResult`.

    Raises:
        OutputExistsError: ``dest`` exists and not ``force``.
        UsageError: ``dest`` would overwrite an input; a Keras format for a non-Keras model.
        VerificationError: The read-back differs from the model (nothing is left behind).
    """
    tf = import_tf()
    dest = os.fspath(dest)
    kind = output_kind(dest)
    if kind != OUTPUT_TF and not is_keras(model):
        raise UsageError(f"{dest}: .weights.h5 and .keras outputs need a Keras 3 model; give a TF checkpoint prefix")
    strategy = strategy or tf.distribute.get_strategy()
    chief = bool(getattr(strategy.extended, "should_checkpoint", True))
    if not chief:
        check_output(dest, force=True, prefix=kind == OUTPUT_TF, protected=protected)
        scratch = tempfile.mkdtemp(prefix=SCRATCH_PREFIX)
        try:
            _save(model, kind, os.path.join(scratch, os.path.basename(dest)))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return WriteResult(path=dest, format=FORMAT_OF[kind], written=False, verified=False)
    writer = atomic_prefix if kind == OUTPUT_TF else atomic_file
    with writer(dest, force=force, protected=protected) as tmp:
        _save(model, kind, tmp)
        checked = _read_back(tmp, model, dest)
    return WriteResult(path=dest, format=FORMAT_OF[kind], written=True, verified=True, checked=checked)


def _read_back(path: str, model: Any, label: str) -> int:
    """Compare every model variable with the file just written; return how many were compared.

    Raises:
        VerificationError: A model variable is missing from the file, or differs from it.
    """
    from ...formats import open_checkpoint  # noqa: PLC0415 - the formats package imports h5py lazily, keep it so

    tf = import_tf()
    model_targets = targets(tf, model)
    with open_checkpoint(path) as written:
        sources = [v for v in written.variables if v.role == m.ROLE_MODEL]
        paired = pair_with_model(sources, written.format, model_targets)
        missing = [t.name for t in (y.ref for y in paired.only_b)]
        missing += [p.b.ref.name for p in paired.pairs if mismatch(p.a.shape, p.a.dtype, p.b.ref)]
        if missing:
            raise VerificationError(
                f"{label}: the written output does not hold {len(missing)} model variable(s): "
                + ", ".join(missing[:MAX_PROBLEMS_IN_MESSAGE]),
                problems=missing,
            )
        bad = []
        for p in paired.pairs:
            target, source = p.b.ref, p.a.ref
            expected = np.asarray(target.variable.numpy())
            actual = expected_value(np.asarray(written.read(source)), target.dtype)
            if not bit_equal(actual, expected):
                bad.append(f"{target.name} (max abs diff {max_abs_diff(actual, expected)})")
        if bad:
            raise VerificationError(f"{label}: the written output differs from the model: " + problems_text(bad), problems=bad)
        return len(paired.pairs)
