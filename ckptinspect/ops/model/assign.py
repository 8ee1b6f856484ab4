"""Assigning source values to a model's variables inside its strategy, and checking them.

Values are assigned in the model's ``tf.distribute`` strategy scope, so every replica of a
mirrored variable receives them; then every assigned variable is read back on every local
replica (``strategy.experimental_local_results``) and compared bit for bit with the source.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ... import model as m
from ...errors import VerificationError
from ..bit_equality import bit_equal
from ..match.layouts import Fit, apply_fit
from .targets import Target

__all__ = ["MAX_PROBLEMS_IN_MESSAGE", "expected_value", "max_abs_diff", "assign_and_check", "problems_text"]

MAX_PROBLEMS_IN_MESSAGE = 20
BFLOAT16 = "bfloat16"


def expected_value(value: np.ndarray, dtype: str) -> np.ndarray:
    """``value`` as the model variable will hold it: cast to ``dtype`` (a float cast) if needed."""
    if str(value.dtype) == dtype:
        return value
    if dtype == BFLOAT16:
        import ml_dtypes  # noqa: PLC0415 - ships with TensorFlow; only for bfloat16 models

        return value.astype(ml_dtypes.bfloat16)
    return value.astype(dtype)


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> str:
    """The largest ``|a - b|`` as text (``n/a`` for values without arithmetic)."""
    try:
        return f"{float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))):.3g}"
    except (TypeError, ValueError):
        return "n/a"


def problems_text(problems: Sequence[str]) -> str:
    """At most :data:`MAX_PROBLEMS_IN_MESSAGE` problems joined by ``; ``, and how many more."""
    shown = problems[:MAX_PROBLEMS_IN_MESSAGE]
    more = len(problems) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more else "")


def _local_values(strategy: Any, variable: Any) -> list[tuple[str, np.ndarray]]:
    out = []
    for local in strategy.experimental_local_results(variable):
        device = getattr(local, "device", "") or ""
        out.append((device, np.asarray(local.numpy())))
    return out


def _is_sum_on_read(tf: Any, variable: Any) -> bool:
    sync = getattr(variable, "synchronization", None)
    agg = getattr(variable, "aggregation", None)
    return sync == tf.VariableSynchronization.ON_READ and agg == tf.VariableAggregation.SUM


def assign_and_check(
    tf: Any, strategy: Any, ckpt: m.Checkpoint, plan: Sequence[tuple[Target, m.Variable] | tuple[Target, m.Variable, Fit | None]]
) -> None:
    """Assign each source value to its target in ``strategy``'s scope, then check every replica.

    A plan entry may carry the :class:`~ckptinspect.ops.match.layouts.Fit` that rearranges the source
    value (a transposed dense kernel, OIHW conv kernels, a reshape); the value is compared
    after it.

    A SUM-on-read variable holds ``value / replicas`` on each replica (compared with
    ``allclose``); every other one holds ``value`` exactly.

    Args:
        tf: TensorFlow.
        strategy: The strategy the model's variables live in.
        ckpt: The source checkpoint.
        plan: ``(target, source variable[, fit])`` entries.

    Raises:
        VerificationError: A value differs from the source on some replica.
        CkptError: A source value cannot be read.
    """
    errors: list[str] = []
    replicas = max(int(strategy.num_replicas_in_sync), 1)
    for entry in plan:
        target, source = entry[0], entry[1]
        layout_fit = entry[2] if len(entry) > 2 else None
        value = expected_value(apply_fit(np.asarray(ckpt.read(source)), layout_fit), target.dtype)
        with strategy.scope():
            target.variable.assign(value)
        sum_on_read = _is_sum_on_read(tf, target.variable)
        for device, actual in _local_values(strategy, target.variable):
            if sum_on_read:
                good = np.allclose(actual.astype(np.float64), value.astype(np.float64) / replicas)
            else:
                good = bit_equal(actual, value)
            if not good:
                errors.append(
                    f"{target.name} on {device or 'its device'} differs from the source {source.name} after "
                    f"assignment (max abs diff {max_abs_diff(actual, value)})"
                )
    if errors:
        raise VerificationError(
            f"{ckpt.path}: {len(errors)} variable(s) did not receive the source value on every replica: "
            + problems_text(errors),
            problems=errors,
        )
