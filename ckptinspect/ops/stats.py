"""Per-variable value statistics (min, max, mean, std, NaN and Inf counts), one tensor at a time.

Memory: one block as the format streams it (a tensor for formats that read whole), plus one
chunk. Statistics are computed over chunks of
:data:`CHUNK_ELEMENTS` elements, each converted to float64 on its own; the per-chunk counts,
means and sums of squared deviations are combined with Chan et al.'s parallel update (the
pairwise form of Welford's algorithm), so the result equals numpy's ``mean`` / ``std`` of the
whole float64 tensor to rounding, without a float64 copy of the whole tensor. Minimum and
maximum are taken in the tensor's own dtype (exact for int64 beyond 2**53).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Callable, Iterable

from ..errors import UnallocatedDataError
from ..model import NUMERIC_DTYPES, Checkpoint, Variable

if TYPE_CHECKING:  # numpy is imported where values are read: `ls` without --stats does without
    import numpy as np

__all__ = ["Stats", "tensor_stats", "compute_stats", "CHUNK_ELEMENTS"]

CHUNK_ELEMENTS = 1 << 20  # elements per float64 chunk (8 MiB)

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


def _numeric_chunk(chunk: np.ndarray) -> np.ndarray | None:
    """The chunk as something numpy compares and sums: ints/floats as they are, bool as uint8,
    complex as magnitudes, bfloat16/float8 as float32; None for strings, objects, records."""
    import numpy as np  # noqa: PLC0415

    kind = chunk.dtype.kind
    if kind in "fiu":
        return chunk
    if kind == "b":
        return chunk.view(np.uint8)
    if kind == "c":
        return np.abs(chunk)
    name = chunk.dtype.name
    if name == "bfloat16" or "float8" in name:
        return chunk.astype(np.float32)
    return None


class _Running:
    """Count, mean and M2 (sum of squared deviations) of a stream of chunks, merged pairwise."""

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.lo = None
        self.hi = None

    def add(self, finite: np.ndarray, f64: np.ndarray) -> None:
        """Fold in one chunk: ``finite`` in its own dtype (for min/max), ``f64`` the same
        values as a float64 array this call may overwrite."""
        n = f64.size
        if n == 0:
            return
        lo, hi = finite.min(), finite.max()
        self.lo = lo if self.lo is None or lo < self.lo else self.lo
        self.hi = hi if self.hi is None or hi > self.hi else self.hi
        import numpy as np  # noqa: PLC0415

        mean = float(f64.sum() / n)
        f64 -= mean
        m2 = float(np.square(f64, out=f64).sum())
        if self.n == 0:
            self.n, self.mean, self.m2 = n, mean, m2
            return
        total = self.n + n
        delta = mean - self.mean
        self.mean += delta * (n / total)
        self.m2 += m2 + delta * delta * (self.n * (n / total))
        self.n = total


def _fold(blocks: Iterable[np.ndarray]) -> Stats | None:
    """Statistics of a value given as consecutive flat blocks; None if non-numeric."""
    import numpy as np  # noqa: PLC0415

    run = _Running()
    nan = inf = 0
    numeric_seen = False
    for block in blocks:
        for start in range(0, block.size, CHUNK_ELEMENTS):
            chunk = _numeric_chunk(block[start : start + CHUNK_ELEMENTS])
            if chunk is None:
                return None
            numeric_seen = True
            f64 = chunk.astype(np.float64)
            finite = chunk
            if chunk.dtype.kind == "f":
                ok = np.isfinite(f64)
                bad = f64.size - int(np.count_nonzero(ok))
                if bad:
                    n_nan = int(np.count_nonzero(np.isnan(f64)))
                    nan += n_nan
                    inf += bad - n_nan
                    f64 = f64[ok]
                    finite = f64
            run.add(finite, f64)
            del f64, finite, chunk
    if run.n == 0:
        return Stats(None, None, None, None, nan, inf) if numeric_seen else None
    return Stats(
        min=float(run.lo),
        max=float(run.hi),
        mean=run.mean,
        std=math.sqrt(max(run.m2, 0.0) / run.n),
        nan=nan,
        inf=inf,
    )


def tensor_stats(value: np.ndarray) -> Stats | None:
    """Statistics of one array, computed chunk by chunk; None for non-numeric values.

    Args:
        value: The tensor (any shape). It is flattened without a copy when contiguous.

    Returns:
        :class:`Stats` (min/max/mean/std over the finite values; ``std`` is the population
        standard deviation, numpy's default), or None for strings, objects and records.
    """
    import numpy as np  # noqa: PLC0415

    flat = np.asarray(value).reshape(-1)
    if flat.size == 0:
        return Stats(None, None, None, None, 0, 0) if _numeric_chunk(flat) is not None else None
    return _fold([flat])


def compute_stats(
    ckpt: Checkpoint, variables: Iterable[Variable] | None = None, progress: Progress | None = None
) -> dict[str, Stats | None]:
    """Statistics for each variable, keyed by key, streamed block by block from the format
    (memory: one block of :data:`CHUNK_ELEMENTS`, or one tensor for formats that read whole).

    Non-numeric variables (strings, references, records) have no statistics (None) and are not
    read. A dataset declared but never written
    (:class:`~ckptinspect.errors.UnallocatedDataError`) has none either; nothing is allocated.

    Args:
        ckpt: The checkpoint.
        variables: Which variables (default: all).
        progress: Called as ``progress(done, total, variable)`` after each tensor.
    """
    chosen = list(ckpt.variables if variables is None else variables)
    out: dict[str, Stats | None] = {}
    for i, var in enumerate(chosen, 1):
        if var.dtype not in NUMERIC_DTYPES:
            out[var.key] = None
        elif var.size == 0:
            out[var.key] = Stats(None, None, None, None, 0, 0)
        else:
            try:
                out[var.key] = _fold(ckpt.iter_blocks(var, CHUNK_ELEMENTS))
            except UnallocatedDataError:
                out[var.key] = None
        if progress is not None:
            progress(i, len(chosen), var)
    return out
