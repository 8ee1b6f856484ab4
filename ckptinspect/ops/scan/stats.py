"""Streamed figures of one variable, and of its change from the previous checkpoint (``scan``).

A value is measured in chunks of :data:`BLOCK_ELEMENTS` as its bytes arrive in an array (the
previous checkpoint's value of the same variable is kept whole beside it: two tensors in
memory). Every sum is accumulated in float64, chunk by chunk in order (a float32 chunk's own
sums are taken in float32 through BLAS, in pieces of 8,192 elements whose sums are added in
float64: within about 1e-7 relative of float64 arithmetic; see :data:`FLOAT32_TINY`):

* ``norm`` = sqrt(sum x^2);
* ``max_abs_change`` = max |x - p|;
* ``rel_change`` = ||x - p|| / ||p|| (inf when ``p`` is all zeros and ``x`` is not, 0 when both are);
* ``cosine`` = x.p / (||x|| ||p||), x.p summed directly (block by block, as the sums of
  squares: the identity x.p = (||x||^2 + ||p||^2 - ||x - p||^2) / 2 loses every digit when
  ||p|| is far below ||x||, e.g. an optimizer accumulator growing from 0.1 to 1e8); None when
  either norm is 0.

Non-finite values are counted (NaN and +/-Inf separately); a chunk's sum of squares is
non-finite exactly when the chunk holds one, so finite chunks are never scanned for them.

Most tensors of consecutive checkpoints are often byte for byte the same (frozen layers,
embeddings rows not seen, a run saved twice): a span whose bytes equal the previous value's,
and whose chunks were finite there, is not converted at all. Its chunks' sums of squares are
the previous value's (same bytes, same arithmetic: the same bits), its difference is 0 and
adds nothing to ``sum (x - p)^2`` or to the max, so the figures are exactly those the chunk
by chunk arithmetic gives, at the cost of one byte comparison.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable

import numpy as np

from ..bit_equality import same_bytes

__all__ = ["BLOCK_ELEMENTS", "Figures", "Sums", "Buffers", "Accumulator", "Measured", "measure_value", "figures_of"]

# Elements per chunk, the unit of every sum: 2 MiB float64 work buffers (measured fastest on the
# 2-core benchmark machine: fewer numpy calls, the three buffers stay in L3; 64 Ki elements
# took 20% longer on changed values and 45% longer on a first checkpoint).
BLOCK_ELEMENTS = 1 << 18
# OpenBLAS computes a dot product of up to 10,000 elements on the calling thread.
DOT_CHUNK = 8192
FLOAT32 = np.dtype(np.float32)
# numpy >= 2.0; numpy 1.x's batched matmul of (k, 1, n) by (k, n, 1) calls the same BLAS dot per piece
_vecdot = getattr(np, "vecdot", None) or (lambda a, b: np.matmul(a[:, None, :], b[:, :, None]).reshape(-1))
# float32 values are reduced as they are, through BLAS (sdot of 8,192-element pieces, the
# pieces merged in float64): about 1e-7 relative from float64 arithmetic, the figures being
# diagnostics (README, "scan"). A chunk whose float32 sum of squares (of the value or of its
# change) is below this or not finite is summed again in float64: squares under float32's
# normal range lose digits, squares over it overflow, and a NaN or Inf must be counted. Below
# it, the subnormal squares' total error (under 2^-149 each) stays under 1e-20 of the sum.
FLOAT32_TINY = 2.0 ** -60


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
        dot: sum x p, or None.
    """

    count: int = 0
    sumsq: float = 0.0
    nan: int = 0
    inf: int = 0
    prev_sumsq: float | None = None
    diff_sumsq: float | None = None
    max_abs_change: float | None = None
    dot: float | None = None

    def add(self, other: "Sums") -> None:
        """Add another variable's sums (a layer's figures are its variables' together)."""
        self.count += other.count
        self.sumsq += other.sumsq
        self.nan += other.nan
        self.inf += other.inf
        if other.diff_sumsq is not None:
            self.prev_sumsq = (self.prev_sumsq or 0.0) + (other.prev_sumsq or 0.0)
            self.diff_sumsq = (self.diff_sumsq or 0.0) + other.diff_sumsq
            self.dot = (self.dot or 0.0) + (other.dot or 0.0)
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
        return {"norm": self.norm, "nan": self.nan, "inf": self.inf, "max_abs_change": self.max_abs_change,
                "rel_change": self.rel_change, "cosine": self.cosine}


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
            dot = s.dot if s.dot is not None else (s.sumsq + s.prev_sumsq - s.diff_sumsq) / 2.0
            cos = max(-1.0, min(1.0, dot / (norm * prev_norm))) if math.isfinite(dot) else math.nan
        else:
            cos = None
    return Figures(norm, s.nan, s.inf, s.max_abs_change, rel, cos)


class Buffers:
    """Reusable float64 work buffers: the value and the previous value converted (the difference
    is taken in place of the previous value, which is not needed after it: two buffers, not
    three, stay in cache).

    ``held`` names (a caller's tag) the one-chunk block whose float64 conversion ``cur`` holds,
    so that the next step, compared with that block, does not convert it again.
    """

    def __init__(self, elements: int):
        self.cur = np.empty(elements, dtype=np.float64)
        self.prev = np.empty(elements, dtype=np.float64)
        self.diff = np.empty(elements, dtype=np.float32)  # the change of a float32 value, as float32
        self.held: object = None


@dataclasses.dataclass
class Measured:
    """A value as measured, kept to measure the next checkpoint's value of the variable against.

    Attributes:
        data: The flat value (its own dtype).
        chunk_sumsq: sum x^2 of each chunk, in order.
        sumsq: sum x^2 of the whole value (the chunks' in order).
    """

    data: np.ndarray
    chunk_sumsq: list[float]
    sumsq: float


def _sumsq(x: np.ndarray) -> float:
    """sum x^2 of a float64 or float32 vector: BLAS ``ddot``/``sdot`` (accumulating in the
    vector's own type) of each piece of :data:`DOT_CHUNK` elements, the pieces' sums added in
    order in float64 (a float32 piece's sum agrees with float64 arithmetic to about 1e-7
    relative, see :data:`FLOAT32_TINY` for where it does not). OpenBLAS hands a longer vector
    to its thread pool, which costs 10-100x more than the sum itself on a busy machine
    (``np.einsum`` is ~10x slower than ddot); the whole pieces go in one ``vecdot`` (a BLAS
    dot each, one numpy call instead of one per piece). A float32 sum may overflow or be
    invalid silently: the caller sums it again in float64 (numpy's warnings off, see
    :meth:`Accumulator.add`)."""
    return _dot(x, x)


def _dot(x: np.ndarray, y: np.ndarray) -> float:
    """sum x y of two vectors of one float type: as :func:`_sumsq`, pieces of :data:`DOT_CHUNK`
    elements (a BLAS dot each, one ``vecdot`` over the pieces: numpy's vecdot and matmul both
    call BLAS ``sdot``/``ddot`` per piece, vecdot with less set-up), added in order in float64."""
    n = x.size
    if n <= DOT_CHUNK:
        return float(x.dot(y))
    whole = n - n % DOT_CHUNK
    total = 0.0
    for piece in _vecdot(x[:whole].reshape(-1, DOT_CHUNK), y[:whole].reshape(-1, DOT_CHUNK)).tolist():
        total += piece
    if whole < n:
        total += float(x[whole:].dot(y[whole:]))
    return total


def _count_nonfinite(x: np.ndarray) -> tuple[int, int]:
    nan = int(np.count_nonzero(np.isnan(x)))
    inf = int(np.count_nonzero(np.isinf(x)))
    return nan, inf


class Accumulator:
    """The running sums of one value, block after block, and of its change from the previous
    value's blocks (the same element ranges).

    Args:
        chunk: Elements per chunk (the unit of every sum; the same for every step).
        buffers: Float64 work buffers of at least ``chunk`` elements.
    """

    def __init__(self, chunk: int, buffers: Buffers):
        self.chunk = chunk
        self.buffers = buffers
        self.sums = Sums()
        self.diff_sumsq = 0.0
        self.max_change = 0.0
        self.dot = 0.0

    def add(self, cur: np.ndarray, prev: np.ndarray | None, prev_chunks: list[float] | None,
            tag: object = None, prev_tag: object = None) -> list[float]:
        """Add one block.

        Args:
            cur: The block (flat; a whole number of chunks, but the value's last block).
            prev: The previous value's same block, or None (nothing to compare it with).
            prev_chunks: Its chunks' sums of squares, or None when unknown. When one is not
                finite, the block is compared with nothing (:meth:`result` will be given no
                previous sum of squares: a non-finite value is never compared with).
            tag: A name for this block (any object equal only to itself), or None.
            prev_tag: The name ``prev`` was added under, or None: when the buffers still hold
                its float64 conversion (a one-chunk block added just before), it is not
                converted again.

        Returns:
            This block's chunks' sums of squares.
        """
        out = self.sums
        size = cur.size
        dtype = cur.dtype
        finite = prev_chunks is not None and all(map(math.isfinite, prev_chunks))
        if prev_chunks is not None and not finite:
            prev = None  # a non-finite previous value is compared with nothing (scan's figures say so)
        buffers = self.buffers
        if prev is not None and finite and prev.dtype == dtype and prev.size == size and same_bytes(cur, prev):
            return self._add_same(size, prev_chunks, tag, prev_tag)
        chunk = self.chunk
        native = dtype == FLOAT32 and (prev is None or prev.dtype == FLOAT32)
        # prev's conversion still in ``cur``: it becomes ``prev``, this block is converted beside it
        reuse = not native and prev is not None and prev_tag is not None and buffers.held == prev_tag \
            and cur.size <= chunk and prev.size == cur.size
        if reuse:
            buffers.cur, buffers.prev = buffers.prev, buffers.cur
        buffers.held = None
        sums: list[float] = []
        # numpy's overflow warnings off: a float32 sum out of range is taken again in float64, a
        # non-finite x.p gives a NaN cosine (as a non-finite value does)
        with np.errstate(over="ignore", invalid="ignore"):
            for at in range(0, size, chunk):
                n = min(chunk, size - at)
                x = xs = cur[at : at + n] if n < size else cur
                ss = _dot(x, x) if native else math.nan
                in_range = FLOAT32_TINY <= ss < math.inf
                if not in_range:  # not float32, or out of float32's safe range
                    x = buffers.cur[:n]
                    np.copyto(x, xs, casting="unsafe")
                    ss = _sumsq(x)
                sums.append(ss)
                out.count += n
                out.sumsq += ss
                if not math.isfinite(ss):
                    nan, inf = _count_nonfinite(x)
                    out.nan += nan
                    out.inf += inf
                if prev is not None:
                    i = at // chunk
                    known = prev_chunks[i] if prev_chunks is not None and i < len(prev_chunks) else math.nan
                    ps = prev[at : at + n] if n < prev.size else prev
                    self._add_change(x, xs, ps, n, native, in_range and FLOAT32_TINY <= known < math.inf, reuse)
        if size <= chunk and not native:
            buffers.held = tag
        return sums

    def _add_same(self, size: int, prev_chunks: list[float], tag: object, prev_tag: object) -> list[float]:
        """A block holding the previous block's bytes: the same sums, a difference of 0, x.p = x.x."""
        for ss in prev_chunks:
            self.sums.sumsq += ss
            self.dot += ss
        self.sums.count += size
        if prev_tag is not None and self.buffers.held == prev_tag:
            self.buffers.held = tag  # the same bytes: the same conversion
        return list(prev_chunks)

    def _add_change(self, x: np.ndarray, xs: np.ndarray, ps: np.ndarray, n: int, native: bool, safe: bool,
                    reuse: bool) -> None:
        """One chunk's change from the previous value's: x.p, the difference's sum of squares and
        largest magnitude. ``xs``/``ps``: the chunk and the previous one as stored; ``x``: the
        chunk as summed (``xs``, or its float64 conversion); ``safe``: both chunks' float32 sums
        of squares were in float32's safe range; ``reuse``: the buffers hold ``ps`` converted."""
        buffers = self.buffers
        diff = None
        if native:
            dot = _dot(xs, ps)
            if not (safe and math.isfinite(dot)):
                dot = _dot(xs.astype(np.float64), ps.astype(np.float64))
            self.dot += dot
            diff = np.subtract(xs, ps, out=buffers.diff[:n])  # an overflow falls back, below
            dss = _sumsq(diff)
            if not FLOAT32_TINY <= dss < math.inf:
                diff = None
        if diff is None:
            if x.dtype != np.float64:
                x = buffers.cur[:n]
                np.copyto(x, xs, casting="unsafe")
            old = buffers.prev[:n]
            if not reuse:
                np.copyto(old, ps, casting="unsafe")  # a mixed-dtype subtract is 3x slower
            if not native:
                self.dot += _dot(x, old)
            diff = np.subtract(x, old, out=old)  # the previous value is not needed after this
            dss = _sumsq(diff)
        self.diff_sumsq += dss
        top = float(max(diff.max(), -diff.min()))
        self.max_change = math.nan if math.isnan(top) or math.isnan(self.max_change) else max(self.max_change, top)

    def result(self, prev_sumsq: float | None) -> Sums:
        """The sums: with the change from the previous value when ``prev_sumsq`` (its sum of
        squares) is given, which every block must then have been compared with."""
        s = self.sums
        out = Sums(s.count, s.sumsq, s.nan, s.inf)
        if prev_sumsq is not None:
            out.prev_sumsq = prev_sumsq
            out.diff_sumsq = self.diff_sumsq
            out.max_abs_change = self.max_change
            out.dot = self.dot
        return out


def measure_value(filled: Iterable[int], value: np.ndarray, previous: Measured | None,
                  chunk: int = BLOCK_ELEMENTS, buffers: Buffers | None = None) -> tuple[Sums, list[float]]:
    """The sums of one value as its elements arrive, and of its change from ``previous``.

    Args:
        filled: After each read, how many leading elements of ``value`` hold the value (the
            last one ``value.size``).
        value: The flat value being filled (C-contiguous).
        previous: The previous checkpoint's value of the same variable (same size), or None.
        chunk: Elements per chunk (the unit of every sum; the same for every step).
        buffers: Float64 work buffers of ``chunk`` elements (allocated here when None).

    Returns:
        The :class:`Sums` (``diff_sumsq`` etc. None without ``previous``) and each chunk's
        sum of squares (for :class:`Measured`).
    """
    if buffers is None or buffers.cur.size < chunk:
        buffers = Buffers(chunk)
    acc = Accumulator(chunk, buffers)
    chunk_sumsq: list[float] = []
    size = value.size
    prev = previous.data if previous is not None and previous.data.size == size else None
    at = 0
    for got in filled:
        end = got if got >= size else got - got % chunk  # whole chunks only, but the last
        if end <= at:
            continue
        known = previous.chunk_sumsq[at // chunk : -(-end // chunk)] if prev is not None else None
        chunk_sumsq += acc.add(value[at:end], prev[at:end] if prev is not None else None, known)
        at = end
    return acc.result(previous.sumsq if prev is not None else None), chunk_sumsq
