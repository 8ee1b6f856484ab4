"""Comparing the values of two variables, streaming: the numeric half of ``diff``.

:func:`compare_variables` reads one pair of tensors block by block (``Checkpoint.iter_blocks``:
TF bundle tensors straight from their data file, checksum verified) and keeps
running float64 sums, so memory stays at a few blocks for bundles and about twice the largest
tensor for other formats. Equality follows numpy's ``isclose`` (``|a - b| <= atol + rtol * |b|``)
with NaN equal to NaN and infinities equal to infinities of the same sign. Values that are not
numbers (strings, HDF5 references, records, opaque and variable-length values) are equal when
every element holds the same bytes; a dataset declared but never written compares as its fill
value, without being materialised.

:func:`~.bit_equality.bit_equal` (its own module) is the one bit-for-bit equality of two
arrays, shared by ``diff``, ``scan``, ``extract`` and ``transplant``.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable, Iterator

import numpy as np

from ...errors import CorruptCheckpointError, UnallocatedDataError
from ...model import NUMERIC_DTYPES, Checkpoint, Variable, numpy_dtype
from ..bit_equality import bit_equal, same_bytes

__all__ = [
    "STATUSES",
    "STATUS_EQUAL",
    "STATUS_CHANGED",
    "STATUS_ADDED",
    "STATUS_REMOVED",
    "STATUS_SHAPE",
    "STATUS_DTYPE",
    "CHUNK_ELEMENTS",
    "BLOCK_BYTES",
    "NUMERIC_DTYPES",
    "compare_variables",
]

STATUS_EQUAL = "equal"
STATUS_CHANGED = "changed"
STATUS_ADDED = "added"
STATUS_REMOVED = "removed"
STATUS_SHAPE = "shape_mismatch"
STATUS_DTYPE = "dtype_mismatch"
STATUSES = (STATUS_EQUAL, STATUS_CHANGED, STATUS_ADDED, STATUS_REMOVED, STATUS_SHAPE, STATUS_DTYPE)

# Streaming.
CHUNK_ELEMENTS = 8192  # elements per BLAS dot call: OpenBLAS starts threads of its own above 10,000
BLOCK_BYTES = 1 << 20  # bytes per side held at a time when streaming from a data file
# float64 work buffers per thread: a block is converted and compared this many elements at a
# time (half a 1 MiB block of float32: 1 MiB per buffer), a few numpy calls per piece.
SCRATCH_ELEMENTS = 1 << 17


# -- comparing values ----------------------------------------------------------------------------
def _rowdot_einsum(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # numpy < 2.0 has no vecdot
    return np.einsum("ij,ij->i", a, b)


_ROWDOT: Callable[[np.ndarray, np.ndarray], np.ndarray] = getattr(np, "vecdot", _rowdot_einsum)
# The reductions ndarray.sum/min/max call (without their Python wrappers): the same results.
_SUM = np.add.reduce
_MIN = np.minimum.reduce
_MAX = np.maximum.reduce


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """``a . b`` of two float64 1-D arrays, as the sum of the dot products of consecutive runs
    of :data:`CHUNK_ELEMENTS` (one numpy call for all of them): each run's dot is a short BLAS
    call (OpenBLAS starts threads of its own above 10,000 elements, which would fight the
    comparing threads for the cores), the runs' products are added in order."""
    full = a.size - a.size % CHUNK_ELEMENTS
    total = 0.0
    if full:
        total = float(_SUM(_ROWDOT(a[:full].reshape(-1, CHUNK_ELEMENTS), b[:full].reshape(-1, CHUNK_ELEMENTS)), None))
    if full < a.size:
        total += float(np.dot(a[full:], b[full:]))
    return total


class _Scratch(threading.local):
    """Per-thread float64 buffers of :data:`SCRATCH_ELEMENTS` (made once per thread: fresh
    1 MiB arrays for every block would cost a page fault per 4 KiB)."""

    def __init__(self) -> None:
        self.a = np.empty(SCRATCH_ELEMENTS, np.float64)
        self.b = np.empty(SCRATCH_ELEMENTS, np.float64)


_SCRATCH = _Scratch()


class _Accumulator:
    """Running sums over aligned blocks of A and B (float64), NaN/Inf counts, element counts."""

    def __init__(self, atol: float, rtol: float):
        self.atol = atol
        self.rtol = rtol
        self.saa = self.sbb = self.sab = self.sdd = 0.0
        self.max_abs = 0.0
        self.pairs = 0  # element pairs finite on both sides
        self.ndiff = 0
        self.nan_a = self.inf_a = self.nan_b = self.inf_b = 0
        self.nonfinite_mismatch = 0

    # Each method takes 1-D arrays of equal length; arrays larger than SCRATCH_ELEMENTS are
    # taken in pieces of that many elements, in order.
    def equal_chunk(self, x: np.ndarray) -> None:
        """Values whose two sides are bitwise identical."""
        for i in range(0, x.size, SCRATCH_ELEMENTS):
            self._equal_piece(x[i : i + SCRATCH_ELEMENTS])

    def chunk(self, x: np.ndarray, y: np.ndarray, exact_int: bool) -> None:
        """Values that may differ; ``exact_int`` when both sides are integers."""
        for i in range(0, x.size, SCRATCH_ELEMENTS):
            self._piece(x[i : i + SCRATCH_ELEMENTS], y[i : i + SCRATCH_ELEMENTS], exact_int)

    def _equal_piece(self, x: np.ndarray) -> None:
        x64 = _SCRATCH.a[: x.size]
        np.copyto(x64, x, casting="unsafe")
        s = _dot(x64, x64)
        if not math.isfinite(s):
            nan = int(np.count_nonzero(np.isnan(x64)))
            inf = int(np.count_nonzero(np.isinf(x64)))
            self.nan_a += nan
            self.nan_b += nan
            self.inf_a += inf
            self.inf_b += inf
            x64 = x64[np.isfinite(x64)]
            s = _dot(x64, x64)
        self.saa += s
        self.sbb += s
        self.sab += s
        self.pairs += x64.size

    def _piece(self, x: np.ndarray, y: np.ndarray, exact_int: bool) -> None:
        if exact_int and not np.count_nonzero(x != y):
            self._equal_piece(x)
            return
        x64 = _SCRATCH.a[: x.size]
        y64 = _SCRATCH.b[: y.size]
        np.copyto(x64, x, casting="unsafe")
        np.copyto(y64, y, casting="unsafe")
        saa = _dot(x64, x64)
        sbb = _dot(y64, y64)
        if not (math.isfinite(saa) and math.isfinite(sbb)):
            x64, y64 = self._split_nonfinite(x64, y64)
            saa = _dot(x64, x64)
            sbb = _dot(y64, y64)
        self.saa += saa
        self.sbb += sbb
        self.sab += _dot(x64, y64)
        self.pairs += x64.size
        d = np.subtract(x64, y64, out=x64)
        sdd = _dot(d, d)
        if sdd == 0.0 and not d.any():
            return
        self.sdd += sdd
        if not (self.atol or self.rtol):  # exact comparison: |d| > 0 (no pass writing |d|)
            mx = max(float(_MAX(d, None)), -float(_MIN(d, None)))
            self.max_abs = max(self.max_abs, mx)
            self.ndiff += int(np.count_nonzero(d != 0))  # a bool array counts fast, floats do not
            return
        np.abs(d, out=d)
        mx = float(_MAX(d, None))
        if mx > self.max_abs:
            self.max_abs = mx
        if mx > self.atol:
            if self.rtol:
                limit = np.abs(y64, out=y64)
                limit *= self.rtol
                limit += self.atol
                self.ndiff += int(np.count_nonzero(d > limit))
            else:
                self.ndiff += int(np.count_nonzero(d > self.atol))

    def merge(self, other: "_Accumulator") -> None:
        """Add the sums and counts of ``other`` (the next part of the same values)."""
        self.saa += other.saa
        self.sbb += other.sbb
        self.sab += other.sab
        self.sdd += other.sdd
        self.max_abs = max(self.max_abs, other.max_abs)
        self.pairs += other.pairs
        self.ndiff += other.ndiff
        self.nan_a += other.nan_a
        self.inf_a += other.inf_a
        self.nan_b += other.nan_b
        self.inf_b += other.inf_b
        self.nonfinite_mismatch += other.nonfinite_mismatch

    def _split_nonfinite(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Count NaN/Inf, count positions where they do not match, return the both-finite part."""
        fx = np.isfinite(x)
        fy = np.isfinite(y)
        nx = np.isnan(x)
        ny = np.isnan(y)
        self.nan_a += int(np.count_nonzero(nx))
        self.nan_b += int(np.count_nonzero(ny))
        self.inf_a += int(x.size - np.count_nonzero(fx) - np.count_nonzero(nx))
        self.inf_b += int(y.size - np.count_nonzero(fy) - np.count_nonzero(ny))
        both = fx & fy
        rest = ~both
        if rest.any():
            ok = (x[rest] == y[rest]) | (nx[rest] & ny[rest])
            self.nonfinite_mismatch += int(ok.size - np.count_nonzero(ok))
        return x[both], y[both]

    def result(self) -> dict[str, Any]:
        compared = self.pairs > 0
        na = math.sqrt(self.saa)
        nb = math.sqrt(self.sbb)
        return {
            "max_abs_diff": self.max_abs if compared else None,
            "rel_l2": (math.sqrt(self.sdd) / na) if compared and na > 0 else (0.0 if compared and self.sdd == 0 else None),
            "cosine": max(-1.0, min(1.0, self.sab / (na * nb))) if na > 0 and nb > 0 else None,
            "num_different": self.ndiff + self.nonfinite_mismatch,
            "nan_a": self.nan_a,
            "inf_a": self.inf_a,
            "nan_b": self.nan_b,
            "inf_b": self.inf_b,
            "nonfinite_mismatch": self.nonfinite_mismatch,
        }


_IDENTICAL = {
    "max_abs_diff": 0.0,
    "rel_l2": 0.0,
    "num_different": 0,
    "nan_a": 0,
    "inf_a": 0,
    "nan_b": 0,
    "inf_b": 0,
    "nonfinite_mismatch": 0,
}


def _arith_view(block: np.ndarray) -> np.ndarray:
    """A view numpy can do float64 arithmetic on: complex as (re, im) pairs, bool as uint8."""
    if block.dtype.kind == "c":
        return block.view(np.float32 if block.dtype.itemsize == 8 else np.float64)
    if block.dtype.kind == "b":
        return block.view(np.uint8)
    return block


def _block_source(ckpt: Checkpoint, var: Variable, block: int) -> Callable[[], Iterator[np.ndarray]]:
    """A function returning a fresh iterator over ``var``'s blocks (streamed by its format)."""
    return lambda: ckpt.iter_blocks(var, block)


def _pairs(blocks_a: Iterator[np.ndarray], blocks_b: Iterator[np.ndarray], label: Callable[[], str]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The blocks of A and B side by side (``label()`` names B's variable in the error when
    they do not hold the same number of values)."""
    try:
        for xa in blocks_a:
            xb = next(blocks_b, None)
            if xb is None or xb.size != xa.size:
                raise CorruptCheckpointError(f"{label()}: fewer values than its shape declares")
            yield xa, xb
        if next(blocks_b, None) is not None:
            raise CorruptCheckpointError(f"{label()}: more values than its shape declares")
    finally:  # release the formats' buffers now, in this thread (not whenever they are collected)
        for blocks in (blocks_a, blocks_b):
            close = getattr(blocks, "close", None)
            if close is not None:
                close()


def _identical_block(x: np.ndarray) -> bool | None:
    """Whether a block whose two sides hold the same bytes has a nonzero value; None when it
    holds NaN or Inf (counted by the full statistics)."""
    if x.dtype.kind == "f":
        lo, hi = _MIN(x, None), _MAX(x, None)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return None
        return not (lo == 0 and hi == 0)
    return bool(x.any())


def _compare_blocks(ckpt_a: Checkpoint, va: Variable, ckpt_b: Checkpoint, vb: Variable, block: int,
                    atol: float, rtol: float) -> dict[str, Any]:
    """The statistics of two streamed values, in one pass over their blocks.

    Most variables of two checkpoints are either untouched or changed everywhere. While the
    blocks of a same-dtype pair hold the same bytes, only finiteness and "any nonzero" are
    checked (no float64 pass); a variable equal throughout returns the exact result of
    identical values (rel_l2 0, cosine 1 unless all zero). Once a block differs (or holds
    NaN/Inf), every later block gets the full float64 statistics, and the identical blocks
    skipped before it are read again for their sums only. Each block's sums are kept apart
    and added in block order at the end: the result depends on the blocks only, not on the
    thread that computed them.
    """
    partials: list[_Accumulator | None] = []  # None: identical, finite, sums not computed yet
    nonzero = False
    prefilter = va.dtype == vb.dtype
    label = lambda: f"{ckpt_b.path}: {vb.key!r}"  # noqa: E731 - only for an error message
    for xa, xb in _pairs(ckpt_a.iter_blocks(va, block), ckpt_b.iter_blocks(vb, block), label):
        x = xa if xa.dtype.kind not in "cb" else _arith_view(xa)
        y = xb if xb.dtype.kind not in "cb" else _arith_view(xb)
        if not x.size:
            continue
        # (same dtype, same size, flat: bit_equal's answer is the bytes')
        if prefilter and x.dtype == y.dtype and same_bytes(x, y):
            flag = _identical_block(x)
            if flag is not None:
                nonzero = nonzero or flag
                partials.append(None)
                continue
            acc = _Accumulator(atol, rtol)
            acc.equal_chunk(x)
        else:
            # A variable that differs in one block usually differs in all: stop looking for
            # equal bytes.
            prefilter = False
            acc = _Accumulator(atol, rtol)
            acc.chunk(x, y, x.dtype.kind in "iu" and y.dtype.kind in "iu")
        partials.append(acc)
    if not partials:
        return _Accumulator(atol, rtol).result()  # no values
    if len(partials) == 1:  # one block (most variables)
        if partials[0] is None:
            return {**_IDENTICAL, "cosine": 1.0 if nonzero else None}
        skipped = []
    else:
        skipped = [k for k, p in enumerate(partials) if p is None]
        if len(skipped) == len(partials):
            return {**_IDENTICAL, "cosine": 1.0 if nonzero else None}
    if skipped:
        _fill_skipped(ckpt_a.iter_blocks(va, block), partials, skipped[-1], atol, rtol)
    total = _Accumulator(atol, rtol)
    for p in partials:
        total.merge(p)
    return total.result()


def _fill_skipped(blocks: Iterator[np.ndarray], partials: list[_Accumulator | None], last: int, atol: float,
                  rtol: float) -> None:
    """The sums of the identical blocks the first pass skipped (A's side read again, up to
    block ``last``; both sides hold these bytes, and the checksums were checked then)."""
    try:
        k = 0
        for xa in blocks:
            x = _arith_view(xa)
            if not x.size:
                continue
            if partials[k] is None:
                acc = partials[k] = _Accumulator(atol, rtol)
                acc.equal_chunk(x)
            if k == last:
                return
            k += 1
    finally:
        close = getattr(blocks, "close", None)
        if close is not None:
            close()


def _compare_numeric(
    ckpt_a: Checkpoint, va: Variable, ckpt_b: Checkpoint, vb: Variable, atol: float, rtol: float
) -> dict[str, Any]:
    block = _block_elements(max(_itemsize(va.dtype), _itemsize(vb.dtype)))
    return _compare_blocks(ckpt_a, va, ckpt_b, vb, block, atol, rtol)


def _block_elements(itemsize: int) -> int:
    """Elements per streamed block: about :data:`BLOCK_BYTES`, a multiple of :data:`CHUNK_ELEMENTS`."""
    return max(CHUNK_ELEMENTS, (BLOCK_BYTES // itemsize) // CHUNK_ELEMENTS * CHUNK_ELEMENTS)


_ITEMSIZES: dict[str, int] = {}  # dtype name -> bytes per element (8 for non-numbers)


def _itemsize(dtype: str) -> int:
    size = _ITEMSIZES.get(dtype)
    if size is None:
        d = numpy_dtype(dtype)
        size = _ITEMSIZES[dtype] = d.itemsize if d is not None else 8
    return size


def _element_bytes(item: Any) -> bytes | None:
    """One non-numeric element as the bytes it holds (None when it has no byte form)."""
    if isinstance(item, bytes):  # also np.bytes_
        return item
    if isinstance(item, str):  # strings, and HDF5 references as the path they point to
        return item.encode("utf-8", "surrogatepass")
    if isinstance(item, np.ndarray):  # an HDF5 variable-length sequence
        return f"{item.dtype.str}{item.shape}".encode() + np.ascontiguousarray(item).tobytes()
    if isinstance(item, np.generic):  # a record or opaque scalar
        return item.tobytes()
    return None


def _different_elements(x: np.ndarray, y: np.ndarray) -> int:
    """How many elements of two equal-length 1-D non-numeric arrays are not identical."""
    if x.dtype == y.dtype and x.dtype.kind != "O" and x.dtype.itemsize:
        # Fixed-size records, opaque blobs, fixed-length strings: compare the bytes of each
        # element (a NaN field equals itself; no field-wise float semantics).
        bx = np.ascontiguousarray(x).view(np.uint8).reshape(x.size, x.dtype.itemsize)
        by = np.ascontiguousarray(y).view(np.uint8).reshape(y.size, y.dtype.itemsize)
        return int(np.count_nonzero((bx != by).any(axis=1)))
    n = 0
    for p, q in zip(x.tolist() if x.dtype.kind != "O" else x, y.tolist() if y.dtype.kind != "O" else y):
        bp, bq = _element_bytes(p), _element_bytes(q)
        if bp is None or bq is None:
            try:
                same = bool(p == q)
            except (TypeError, ValueError):
                same = False
        else:
            same = bp == bq
        n += not same
    return n


def _compare_other(ckpt_a: Checkpoint, va: Variable, ckpt_b: Checkpoint, vb: Variable) -> dict[str, Any]:
    """Strings, references, records, opaque and variable-length values: equal iff every
    element holds the same bytes (references: point to the same path), in chunks."""
    x = np.asarray(ckpt_a.read(va)).reshape(-1)
    y = np.asarray(ckpt_b.read(vb)).reshape(-1)
    if x.shape != y.shape:
        return {"num_different": max(x.size, y.size)}
    n = 0
    for i in range(0, x.size, CHUNK_ELEMENTS):
        n += _different_elements(x[i : i + CHUNK_ELEMENTS], y[i : i + CHUNK_ELEMENTS])
    return {"num_different": n}


def _unallocated_fill(ckpt: Checkpoint, var: Variable) -> tuple[bool, Any]:
    """(True, fill value) when ``var`` is declared but never written, else (False, None).

    Asks the format for a one-element first block: an unwritten dataset raises
    :class:`~ckptinspect.errors.UnallocatedDataError` before anything is allocated.
    """
    blocks = ckpt.iter_blocks(var, 1)
    try:
        next(blocks, None)
    except UnallocatedDataError as e:
        return True, e.fill_value
    finally:
        close = getattr(blocks, "close", None)
        if close is not None:
            close()
    return False, None


def _compare_unallocated(
    ckpt_a: Checkpoint, va: Variable, ckpt_b: Checkpoint, vb: Variable, atol: float, rtol: float, numeric: bool
) -> dict[str, Any]:
    """A side declared but never written compares as its fill value (what h5py, and so Keras,
    would load), without materialising it: two such sides by their fill values; one such side
    against the other side's values, streamed block by block. An undefined fill value (or a
    non-numeric one) equals only another unwritten side with the same (or no) fill value."""
    empty_a, fill_a = _unallocated_fill(ckpt_a, va)
    empty_b, fill_b = _unallocated_fill(ckpt_b, vb)
    n = va.size
    if not numeric or (empty_a and fill_a is None) or (empty_b and fill_b is None):
        if empty_a and empty_b and (fill_a is None) == (fill_b is None) and _element_bytes(fill_a) == _element_bytes(fill_b):
            return {"num_different": 0}
        return {"num_different": n}
    acc = _Accumulator(atol, rtol)
    if empty_a and empty_b:
        x = _arith_view(np.asarray([fill_a]))
        y = _arith_view(np.asarray([fill_b]))
        if x.dtype == y.dtype and bit_equal(x, y):
            acc.equal_chunk(x)
        else:
            acc.chunk(x, y, x.dtype.kind in "iu" and y.dtype.kind in "iu")
        out = acc.result()
        for k in ("num_different", "nan_a", "inf_a", "nan_b", "inf_b", "nonfinite_mismatch"):
            out[k] *= n  # every element is the fill value: counts scale, ratios do not
        return out
    full, fill = (vb, fill_a) if empty_a else (va, fill_b)
    ckpt = ckpt_b if empty_a else ckpt_a
    block = _block_elements(_itemsize(full.dtype))
    for values in _block_source(ckpt, full, block)():
        constant = np.full(values.size, fill)
        xa, xb = (constant, values) if empty_a else (values, constant)
        x, y = _arith_view(xa), _arith_view(xb)
        acc.chunk(x, y, x.dtype.kind in "iu" and y.dtype.kind in "iu")
    return acc.result()


def compare_variables(
    ckpt_a: Checkpoint,
    va: Variable,
    ckpt_b: Checkpoint,
    vb: Variable,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
) -> dict[str, Any]:
    """Compare the values of two variables, streaming.

    Args:
        ckpt_a: Checkpoint holding ``va``.
        va: Variable of A.
        ckpt_b: Checkpoint holding ``vb``.
        vb: Variable of B (same shape as ``va``).
        atol: Absolute tolerance.
        rtol: Relative tolerance (of B's magnitude, as numpy ``isclose``).

    Returns:
        A dict with ``status`` and the statistic fields of :class:`VariableDiff`.

    Raises:
        CkptError: A value cannot be read.
    """
    if tuple(va.shape) != tuple(vb.shape):
        return {"status": STATUS_SHAPE}
    numeric = va.dtype in NUMERIC_DTYPES and vb.dtype in NUMERIC_DTYPES
    comparable = numeric and (("complex" in va.dtype) == ("complex" in vb.dtype))
    if comparable or va.dtype == vb.dtype:
        try:
            stats = (_compare_numeric(ckpt_a, va, ckpt_b, vb, atol, rtol) if comparable
                     else _compare_other(ckpt_a, va, ckpt_b, vb))
        except UnallocatedDataError:
            stats = None  # compared below, once the values read so far are released
        if stats is None:
            stats = _compare_unallocated(ckpt_a, va, ckpt_b, vb, atol, rtol, comparable)
    else:
        return {"status": STATUS_DTYPE}
    if va.dtype != vb.dtype:
        status = STATUS_DTYPE
    else:
        status = STATUS_CHANGED if stats["num_different"] else STATUS_EQUAL
    return {"status": status, **stats}
