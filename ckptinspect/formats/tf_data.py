"""Direct reads of tensor bytes from TF bundle data files, in blocks, checksum-checked.

For streaming operations (``diff``) that must hold one block of a tensor at a time and
need no TensorFlow: a local, unsliced tensor of a fixed-size numeric dtype is read straight
from its data file at the offset the index gives, and its stored masked crc32c is checked
once the last block has been read. Anything else goes through the checkpoint's own reader.
"""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np

from .. import model as m
from ..errors import CorruptCheckpointError
from ._crc import crc32c_module, mask
from ._layout import data_path

__all__ = ["RAW_DTYPES", "numpy_dtype", "DataFiles", "raw_location", "iter_raw_blocks"]

BUNDLE_FORMATS = (m.FORMAT_TF_BUNDLE, m.FORMAT_TF_SAVEDMODEL)
# Bundle dtypes whose stored bytes are the little-endian array itself.
RAW_DTYPES = {
    "float16": "<f2", "float32": "<f4", "float64": "<f8", "int8": "i1", "int16": "<i2",
    "int32": "<i4", "int64": "<i8", "uint8": "u1", "uint16": "<u2", "uint32": "<u4",
    "uint64": "<u8", "bool": "?", "complex64": "<c8", "complex128": "<c16",
}


def numpy_dtype(name: str) -> np.dtype | None:
    """The numpy dtype of a bundle dtype name whose bytes are a plain array, or None."""
    if name in RAW_DTYPES:
        return np.dtype(RAW_DTYPES[name])
    if name == "bfloat16":
        try:
            import ml_dtypes  # noqa: PLC0415 - comes with TensorFlow

            return np.dtype(ml_dtypes.bfloat16)
        except ImportError:  # pragma: no cover
            return None
    return None


class DataFiles:
    """Data files opened once for a whole operation: sizes, positioned reads, and a pool of
    read buffers reused across tensors (fresh buffers would cost a page fault per 4 KiB)."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._sizes: dict[str, int | None] = {}
        self._buffers: list[bytearray] = []

    def size(self, path: str) -> int | None:
        """The file's size, or None when it cannot be stat'ed."""
        if path not in self._sizes:
            try:
                self._sizes[path] = os.path.getsize(path)
            except OSError:
                self._sizes[path] = None
        return self._sizes[path]

    def pread_into(self, path: str, buffer: memoryview, offset: int) -> int:
        """Fill ``buffer`` from ``offset``; returns the bytes read (fewer at the end of the file)."""
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        return os.preadv(fd, [buffer], offset)

    def take_buffer(self, nbytes: int) -> bytearray:
        """A buffer of at least ``nbytes`` from the pool (give it back with :meth:`give_buffer`)."""
        for i, buf in enumerate(self._buffers):
            if len(buf) >= nbytes:
                return self._buffers.pop(i)
        return bytearray(nbytes)

    def give_buffer(self, buf: bytearray) -> None:
        self._buffers.append(buf)

    def close(self) -> None:
        self._buffers.clear()
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)


def raw_location(ckpt: m.Checkpoint, var: m.Variable, files: DataFiles) -> tuple[str, np.dtype] | None:
    """Data file and dtype when ``var``'s bytes can be read directly (a local unsliced bundle
    tensor of a plain numeric dtype with a stored checksum), else None."""
    if ckpt.format not in BUNDLE_FORMATS or var.sliced or var.offset is None or var.crc32c is None:
        return None
    prefix = getattr(ckpt.source, "prefix", None)
    if not prefix or "://" in prefix or len(var.shards) != 1:
        return None
    dtype = numpy_dtype(var.dtype)
    if dtype is None:
        return None
    path = data_path(prefix, var.shards[0], ckpt.num_shards)
    size = files.size(path)
    if size is None or size < var.offset + var.nbytes:
        return None  # let the checkpoint's reader report the missing or truncated shard
    return path, dtype


def iter_raw_blocks(
    path: str, var: m.Variable, dtype: np.dtype, block_elements: int, files: DataFiles
) -> Iterator[np.ndarray]:
    """Blocks of ``block_elements`` elements of a tensor, read straight from its data file.

    Each block is a view of one pooled buffer that the next block overwrites: use it (or copy
    it) before asking for the next.

    Raises:
        CorruptCheckpointError: The file ends early, or the bytes do not match the stored
            crc32c (raised after the last block).
    """
    total = var.size
    crc = crc32c_module().Checksum()
    done = 0
    offset = var.offset
    buf = files.take_buffer(min(block_elements, total) * dtype.itemsize)
    try:
        view = memoryview(buf)
        while done < total:
            n = min(block_elements, total - done)
            nbytes = n * dtype.itemsize
            got = files.pread_into(path, view[:nbytes], offset)
            if got != nbytes:
                raise CorruptCheckpointError(f"{path}: truncated: {var.key!r} ends past the end of the file")
            crc.update(bytes(view[:nbytes]))  # google-crc32c takes bytes only; this copy reuses memory
            done += n
            offset += nbytes
            yield np.frombuffer(buf, dtype=dtype, count=n)
    finally:
        files.give_buffer(buf)
    actual = mask(int.from_bytes(crc.digest(), "big"))
    if actual != var.crc32c:
        raise CorruptCheckpointError(
            f"{path}: checksum mismatch for {var.key!r} (stored {var.crc32c:#010x}, computed {actual:#010x})"
        )
