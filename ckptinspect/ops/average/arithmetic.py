"""The arithmetic of ``average``: inputs combined block by block in float64, rounded once.

See :mod:`.average` for the exact formulas (and why the mean starts from ``0.0``).
"""

from __future__ import annotations

import itertools
import threading
from typing import Iterator, Sequence

import numpy as np

from ... import model as m
from ...errors import CorruptCheckpointError
from ...formats import mask_crc32c

__all__ = ["BLOCK_ELEMENTS", "CHUNK_ELEMENTS", "SPOT_ELEMENTS", "averaged_dtype", "Computed", "Combiner", "lockstep"]

BLOCK_ELEMENTS = 1 << 20  # elements per block read from each input (and written)
CHUNK_ELEMENTS = 1 << 16  # elements combined at a time: the float64 buffers stay in the CPU cache
SPOT_ELEMENTS = 1024  # first values of every averaged tensor (and slice) compared on read-back
_ML_DTYPES = frozenset({"bfloat16", "float8_e5m2", "float8_e4m3fn"})  # not numpy's own: widened explicitly
_WIDEN: dict[np.dtype, bool] = {}  # dtype -> whether it is one of _ML_DTYPES


def averaged_dtype(variable: m.Variable) -> bool:
    """Whether ``average`` averages this variable (a float that is not metadata)."""
    return variable.dtype in m.FLOAT_DTYPES and variable.role != m.ROLE_METADATA


# -- arithmetic --------------------------------------------------------------------------------
class Computed:
    """What was computed for one stored run (a tensor or a slice): its checksum and first values."""

    def __init__(self) -> None:
        import google_crc32c  # noqa: PLC0415 - a dependency of the package (formats use it too)

        self._crc32c = google_crc32c
        self._crc = 0
        self.spot = b""
        self.done = False
        self.written_crc32c: int | None = None  # set when the writer computed it (worker threads)
        self.read_back = False  # the writer read its first bytes back from the file: the ones computed

    def add(self, block: np.ndarray) -> None:
        raw = block.reshape(-1).view(np.uint8)
        if len(self.spot) < SPOT_ELEMENTS * block.itemsize:
            self.spot += raw[: SPOT_ELEMENTS * block.itemsize - len(self.spot)].tobytes()
        raw.flags.writeable = False  # google-crc32c reads a read-only buffer without copying it
        self._crc = self._crc32c.extend(self._crc, raw)

    @property
    def crc32c(self) -> int:
        """The masked crc32c of the values computed (as TF records it)."""
        if self.written_crc32c is not None:
            return self.written_crc32c
        return mask_crc32c(self._crc)


class Combiner:
    """Combines the inputs' blocks of one run: mean or EMA in float64, rounded once.

    :meth:`combine` may be called from several threads at once when each call is given its
    ``out`` (the float64 scratch space is per thread)."""

    def __init__(self, count: int, decay: float | None):
        self.count = count
        self.decay = decay
        self._local = threading.local()
        self._out: dict[np.dtype, np.ndarray] = {}
        if decay is not None:
            self.decay = float(decay)
            self._rest = 1.0 - self.decay  # computed once, in float64

    def _output(self, n: int, dtype: np.dtype) -> np.ndarray:
        """The result block: one buffer per dtype, reused (a block is written before the next
        one is asked for), so no fresh pages are faulted in per block."""
        buf = self._out.get(dtype)
        if buf is None or buf.size < n:
            buf = self._out[dtype] = np.empty(max(n, 1), dtype)
        return buf[:n]

    def _buffers(self) -> tuple[np.ndarray, np.ndarray]:
        local = self._local
        if getattr(local, "acc", None) is None:
            local.acc = np.empty(CHUNK_ELEMENTS, np.float64)
            local.tmp = np.empty(CHUNK_ELEMENTS, np.float64)
        return local.acc, local.tmp

    @staticmethod
    def _wide(block: np.ndarray, tmp: np.ndarray) -> np.ndarray:
        """A block numpy adds to float64 as it is (its own float types widen inside the loop),
        or widened explicitly (ml_dtypes' bfloat16 and float8)."""
        widen = _WIDEN.get(block.dtype)
        if widen is None:  # dtype.name is slow (Python code in numpy): looked up once per dtype
            widen = _WIDEN[block.dtype] = block.dtype.name in _ML_DTYPES
        return Combiner._as_float64(block, tmp) if widen else block

    @staticmethod
    def _as_float64(block: np.ndarray, tmp: np.ndarray) -> np.ndarray:
        if block.dtype == np.float64:
            return block
        tmp[: block.size] = block  # exact: every stored float type widens to float64 without rounding
        return tmp[: block.size]

    def combine(self, blocks: Sequence[np.ndarray], dtype: np.dtype, whole_size: int,
                out: np.ndarray | None = None) -> np.ndarray:
        """The blocks (one per input, in order) combined, rounded once to ``dtype``, into
        ``out`` (flat, of the blocks' size) or else a buffer the next call reuses (write it
        out first)."""
        n = blocks[0].size
        if any(b.size != n for b in blocks):
            raise CorruptCheckpointError("the inputs' values came in blocks of different sizes")
        if self.decay is None and whole_size == 1:  # one element: numpy's own reduction over the N values
            stacked = np.stack([np.asarray(b, dtype=np.float64).reshape(-1) for b in blocks])
            result = np.mean(stacked, axis=0).astype(dtype)
            if out is None:
                return result
            out[...] = result
            return out
        if out is None:
            out = self._output(n, dtype)
        acc, tmp = self._buffers()
        flat = [b.reshape(-1) for b in blocks]
        for i in range(0, n, CHUNK_ELEMENTS):  # chunks the float64 buffers of which stay in cache
            j = min(n, i + CHUNK_ELEMENTS)
            a, t = acc[: j - i], tmp[: j - i]
            if self.decay is None:
                # 0.0 + x_1 (not x_1 itself: numpy's sum starts from 0.0, so -0.0 + -0.0 is 0.0)
                np.add(self._wide(flat[0][i:j], t), 0.0, out=a)
                for b in flat[1:]:
                    np.add(a, self._wide(b[i:j], t), out=a)
                np.true_divide(a, self.count, out=out[i:j], casting="unsafe")  # rounded once, on the way out
            else:
                a[...] = self._as_float64(flat[0][i:j], t)
                for b in flat[1:]:
                    np.multiply(a, self.decay, out=a)
                    np.multiply(self._as_float64(b[i:j], t), self._rest, out=t)
                    np.add(a, t, out=a)
                out[i:j] = a
        return out


def lockstep(streams: Sequence[Iterator[np.ndarray]], label: str) -> Iterator[list[np.ndarray]]:
    """One block of every input at a time (each input's block is used before the next is read)."""
    for blocks in itertools.zip_longest(*streams):
        if any(b is None for b in blocks):
            raise CorruptCheckpointError(f"{label}: the inputs hold different numbers of values")
        yield list(blocks)
