"""Streamed figures of one variable, and of its change from the previous checkpoint (``scan``).

A value is read in blocks (:meth:`~ckptinspect.model.Checkpoint.iter_blocks`); the previous
checkpoint's value of the same variable is read block for block beside it, so at most two
blocks are held. Every sum is accumulated in float64:

* ``norm`` = sqrt(sum x^2);
* ``max_abs_change`` = max |x - p|;
* ``rel_change`` = ||x - p|| / ||p|| (inf when ``p`` is all zeros and ``x`` is not, 0 when both are);
* ``cosine`` = x.p / (||x|| ||p||), with x.p = (||x||^2 + ||p||^2 - ||x - p||^2) / 2, so the
  previous block is never converted (||p||^2 is the previous checkpoint's own sum of squares,
  summed over the same blocks in the same order); None when either norm is 0.

Non-finite values are counted (NaN and +/-Inf separately); a block's sum of squares is
non-finite exactly when the block holds one, so finite blocks are never scanned for them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Iterator

import numpy as np

__all__ = ["BLOCK_ELEMENTS", "Figures", "Sums", "measure", "figures_of"]

# Elements per block: the float64 work buffers of this size stay in a core's L2 cache.
BLOCK_ELEMENTS = 1 << 16
# OpenBLAS computes a dot product of up to 10,000 elements on the calling thread.
DOT_CHUNK = 8192


@dataclasses.dataclass
class Sums:
    """Float64 sums over a variable (or a layer: the sums of its variables add up).

    Attributes:
        count: Elements.
        sumsq: sum x^2 (non-finite when a value is).
        nan: NaN values.
        inf: +/-Inf values.
        prev_sumsq: sum p^2 of the previous value, or None when there is none to compare.
        diff_sumsq: sum (x - p)^2, or None.
        max_abs_change: max |x - p|, or None.
    """

    count: int = 0
    sumsq: float = 0.0
    nan: int = 0
    inf: int = 0
    prev_sumsq: float | None = None
    diff_sumsq: float | None = None
    max_abs_change: float | None = None

    def add(self, other: "Sums") -> None:
        """Add another variable's sums (a layer's figures are its variables' together)."""
        self.count += other.count
        self.sumsq += other.sumsq
        self.nan += other.nan
        self.inf += other.inf
        if other.diff_sumsq is not None:
            self.prev_sumsq = (self.prev_sumsq or 0.0) + (other.prev_sumsq or 0.0)
            self.diff_sumsq = (self.diff_sumsq or 0.0) + other.diff_sumsq
            self.max_abs_change = _nanmax(self.max_abs_change, other.max_abs_change)


def _nanmax(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b)


@dataclasses.dataclass(frozen=True)
class Figures:
    """What ``scan`` reports for a variable or a layer at one step.

    Attributes:
        norm: L2 norm (NaN/Inf when a value is).
        nan: NaN count.
        inf: Inf count.
        max_abs_change: max |x - p| against the previous step, or None (first step, new or
            reshaped variable).
        rel_change: ||x - p|| / ||p||, or None.
        cosine: Cosine similarity of x and p, or None.
    """

    norm: float
    nan: int
    inf: int
    max_abs_change: float | None = None
    rel_change: float | None = None
    cosine: float | None = None

    @property
    def nonfinite(self) -> int:
        return self.nan + self.inf

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def figures_of(s: Sums) -> Figures:
    """The reported figures of accumulated sums."""
    norm = math.sqrt(s.sumsq) if s.sumsq >= 0 or math.isnan(s.sumsq) else math.nan
    if s.diff_sumsq is None or s.prev_sumsq is None:
        return Figures(norm, s.nan, s.inf)
    prev_norm = math.sqrt(s.prev_sumsq) if s.prev_sumsq >= 0 else math.nan
    diff_norm = math.sqrt(s.diff_sumsq) if s.diff_sumsq >= 0 else math.nan
    if not all(math.isfinite(v) for v in (norm, prev_norm, diff_norm)):
        rel = cos = math.nan
    else:
        rel = diff_norm / prev_norm if prev_norm > 0 else (math.inf if diff_norm > 0 else 0.0)
        if norm > 0 and prev_norm > 0:
            dot = (s.sumsq + s.prev_sumsq - s.diff_sumsq) / 2.0
            cos = max(-1.0, min(1.0, dot / (norm * prev_norm)))
        else:
            cos = None
    return Figures(norm, s.nan, s.inf, s.max_abs_change, rel, cos)


class _Buffers:
    """Reusable float64 work buffers: the value and the previous value converted, their difference."""

    def __init__(self, elements: int):
        self.cur = np.empty(elements, dtype=np.float64)
        self.prev = np.empty(elements, dtype=np.float64)
        self.diff = np.empty(elements, dtype=np.float64)


def _sumsq(x: np.ndarray) -> float:
    """sum x^2 of a float64 vector, by BLAS ``ddot`` (float64 accumulation) over pieces of
    :data:`DOT_CHUNK` elements: OpenBLAS hands a longer vector to its thread pool, which costs
    10-100x more than the sum itself on a busy machine (``np.einsum`` is ~10x slower than ddot)."""
    n = x.size
    if n <= DOT_CHUNK:
        return float(np.dot(x, x))
    total = 0.0
    for i in range(0, n, DOT_CHUNK):
        piece = x[i : i + DOT_CHUNK]
        total += float(np.dot(piece, piece))
    return total


def _count_nonfinite(x: np.ndarray) -> tuple[int, int]:
    nan = int(np.count_nonzero(np.isnan(x)))
    inf = int(np.count_nonzero(np.isinf(x)))
    return nan, inf


def measure(blocks: Iterable[np.ndarray], previous: Iterator[np.ndarray] | None, prev_sumsq: float | None,
            buffers: _Buffers | None = None) -> Sums:
    """The sums of one value, streamed, and of its change from ``previous``.

    Args:
        blocks: The value's blocks (views the source may reuse: each is used before the next).
        previous: The previous value's blocks, of the same sizes, or None.
        prev_sumsq: The previous value's sum of squares (as this function returned it then).
        buffers: Work buffers (allocated here when None).

    Returns:
        The :class:`Sums` (``diff_sumsq`` etc. None without ``previous``).
    """
    buffers = buffers or _Buffers(BLOCK_ELEMENTS)
    out = Sums()
    diff_sumsq = 0.0
    max_change: float = 0.0
    for block in blocks:
        n = block.size
        if n > buffers.cur.size:
            buffers = _Buffers(n)
        cur = buffers.cur[:n]
        np.copyto(cur, block.reshape(-1), casting="unsafe")
        ss = _sumsq(cur)
        out.count += n
        out.sumsq += ss
        if not math.isfinite(ss):
            nan, inf = _count_nonfinite(cur)
            out.nan += nan
            out.inf += inf
        if previous is not None:
            prev = buffers.prev[:n]
            np.copyto(prev, next(previous).reshape(-1), casting="unsafe")  # a mixed-dtype subtract is 3x slower
            diff = buffers.diff[:n]
            np.subtract(cur, prev, out=diff)
            diff_sumsq += _sumsq(diff)
            if n:
                top = float(max(diff.max(), -diff.min()))
                max_change = math.nan if math.isnan(top) or math.isnan(max_change) else max(max_change, top)
    if previous is not None:
        for _ in previous:  # drain it: its checksum is checked after its last block
            pass
        out.prev_sumsq = prev_sumsq
        out.diff_sumsq = diff_sumsq
        out.max_abs_change = max_change
    return out
