"""Per-variable value statistics (min, max, mean, std, NaN and Inf counts), one tensor at a time."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Iterable

from ..model import Checkpoint, Variable

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Stats", "tensor_stats", "compute_stats"]

Progress = Callable[[int, int, Variable], None]


@dataclasses.dataclass(frozen=True)
class Stats:
    """Statistics of one tensor; min/max/mean/std are over finite values (None if there are none)."""

    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    nan: int
    inf: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def as_numeric(value: np.ndarray) -> np.ndarray | None:
    """A view or copy of ``value`` numpy can do arithmetic on, or None (strings, objects)."""
    import numpy as np  # noqa: PLC0415

    if value.dtype.kind in "fiub":
        return value if value.dtype.kind != "b" else value.astype(np.uint8)
    if value.dtype.kind == "c":
        return np.abs(value)
    if value.dtype.kind == "V" or value.dtype.name in ("bfloat16",) or "float8" in value.dtype.name:
        try:
            return value.astype(np.float32)
        except (TypeError, ValueError):
            return None
    return None


def tensor_stats(value: np.ndarray) -> Stats | None:
    """Statistics of one array; None for non-numeric values."""
    import numpy as np  # noqa: PLC0415

    a = as_numeric(np.asarray(value))
    if a is None:
        return None
    if a.dtype.kind == "f" and a.dtype.itemsize < 4:
        a = a.astype(np.float32)
    if a.size == 0:
        return Stats(None, None, None, None, 0, 0)
    if a.dtype.kind == "f":
        nan = int(np.count_nonzero(np.isnan(a)))
        inf = int(np.count_nonzero(np.isinf(a)))
        finite = a if nan == 0 and inf == 0 else a[np.isfinite(a)]
    else:
        nan = inf = 0
        finite = a
    if finite.size == 0:
        return Stats(None, None, None, None, nan, inf)
    return Stats(
        min=float(finite.min()),
        max=float(finite.max()),
        mean=float(finite.mean(dtype=np.float64)),
        std=float(finite.std(dtype=np.float64)),
        nan=nan,
        inf=inf,
    )


def compute_stats(
    ckpt: Checkpoint, variables: Iterable[Variable] | None = None, progress: Progress | None = None
) -> dict[str, Stats | None]:
    """Statistics for each variable, keyed by key; values are read and dropped one at a time.

    Args:
        ckpt: The checkpoint.
        variables: Which variables (default: all).
        progress: Called as ``progress(done, total, variable)`` after each tensor.
    """
    chosen = list(ckpt.variables if variables is None else variables)
    out: dict[str, Stats | None] = {}
    for i, var in enumerate(chosen, 1):
        out[var.key] = tensor_stats(ckpt.read(var))
        if progress is not None:
            progress(i, len(chosen), var)
    return out
