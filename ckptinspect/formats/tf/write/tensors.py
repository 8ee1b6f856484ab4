"""What the TF bundle writer writes: the tensors, their values, and their string layout.

A tensor of the bundle to write is an :class:`OutputTensor`: whole, or the slices of a
partitioned variable. Each stored run of bytes is a :class:`TensorData`: a value in memory
(:meth:`~TensorData.from_array`), streamed in blocks (:meth:`~TensorData.from_blocks`), computed
from other bundles' runs (:meth:`~TensorData.from_combined`, ``average``) or copied byte for byte
from another bundle (:meth:`~TensorData.from_stored`, a :class:`StoredBytes`). Strings are
encoded here in ``WriteStringTensor``'s layout (:func:`encode_string_tensor`).

:mod:`.bundle_writer` writes them (planning in :mod:`._bundle_plan`, bytes in
:mod:`._bundle_shards`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import struct
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .... import model as m
from ....errors import CorruptCheckpointError, UsageError
from ... import _fs
from ..crc import crc32c_module, mask
from .table_builder import put_varint
from .combine import Combined
from ..data import DTYPE_NAMES, VARIABLE_LENGTH_DTYPES

__all__ = [
    "StoredBytes",
    "TensorData",
    "OutputTensor",
    "encode_string_tensor",
]

DTYPE_ENUMS = {name: number for number, name in DTYPE_NAMES.items()}
# Dtypes written from numpy values: their bytes are a plain little-endian array (int4 and
# uint4 take one byte per element in TF bundles, as in ml_dtypes).
PACKED_INT4_DTYPES = ("int4", "uint4")
ENCODABLE_DTYPES = (frozenset(m.NUMERIC_DTYPES) | frozenset(PACKED_INT4_DTYPES)) & frozenset(DTYPE_ENUMS)
_UINT32_MAX = 0xFFFFFFFF


# -- what to write ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class StoredBytes:
    """A run of bytes in another bundle's data file, to copy unchanged.

    Attributes:
        path: The source data file.
        offset: Where the run starts.
        size: Its length in bytes.
        crc32c: The masked crc32c the source index records for it (reused as is).
    """

    path: str
    offset: int
    size: int
    crc32c: int

    def read(self, start: int = 0, size: int | None = None) -> bytes:
        """Bytes of the run from ``start`` (``size`` of them, default to its end), read from
        its file (a regular file only). Safe to call from several threads.

        Raises:
            CorruptCheckpointError: The file is missing, not a regular file, or ends first.
        """
        size = self.size - start if size is None else min(size, self.size - start)
        fd = open_source(self.path)
        try:
            return pread_all(fd, self.offset + start, max(0, size), self.path)
        finally:
            os.close(fd)


@functools.lru_cache(maxsize=None)
def encodable_dtype(name: str) -> np.dtype | None:
    """The little-endian numpy dtype of an encodable dtype name, or None."""
    if name in PACKED_INT4_DTYPES:
        try:
            import ml_dtypes  # noqa: PLC0415 - comes with TensorFlow and Keras
        except ImportError:  # pragma: no cover
            return None
        return np.dtype(getattr(ml_dtypes, name))
    dtype = m.numpy_dtype(name)
    return None if dtype is None else dtype.newbyteorder("<")


def element_count(shape: tuple[int, ...]) -> int:
    """Elements of a tensor of ``shape``."""
    n = 1
    for d in shape:
        n *= d
    return n


def dtype_name(dtype: np.dtype) -> str:
    """The dtype name a numpy array is written as (``string`` for object, bytes and str arrays)."""
    if dtype.kind in "OSU":
        return "string"
    return dtype.name


def _as_bytes(item: Any) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, (bytearray, memoryview, np.bytes_)):
        return bytes(item)
    raise UsageError(f"a string tensor holds bytes or str elements. Received: {type(item).__name__}")


def encode_string_tensor(elements: Iterable[bytes]) -> tuple[bytes, int]:
    """A string tensor in ``WriteStringTensor``'s layout, and the masked crc32c TensorFlow records.

    The layout is every element's length as a varint64, the masked crc32c of those lengths
    (each checksummed as a little-endian uint32, uint64 above 4 GiB), then the bytes. The
    recorded checksum covers the lengths (as checksummed), the stored length checksum and
    the bytes.

    Returns:
        (stored bytes, masked crc32c).
    """
    items = list(elements)
    crc32c = crc32c_module()
    sizes = [len(s) for s in items]
    lengths = bytearray()
    for n in sizes:
        put_varint(lengths, n)
    if all(n <= _UINT32_MAX for n in sizes):
        packed = struct.pack(f"<{len(sizes)}I", *sizes)
    else:
        packed = b"".join(struct.pack("<I" if n <= _UINT32_MAX else "<Q", n) for n in sizes)
    crc = crc32c.value(packed)
    lengths_crc = struct.pack("<I", mask(crc))
    crc = crc32c.extend(crc, lengths_crc)
    body = b"".join(items)
    crc = crc32c.extend(crc, body)
    return bytes(lengths) + lengths_crc + body, mask(crc)


@dataclasses.dataclass(frozen=True)
class TensorData:
    """The values of one stored run (a whole tensor, or one slice): in memory, streamed in
    blocks, or copied from another bundle. Build it with :meth:`from_array`,
    :meth:`from_blocks` or :meth:`from_stored`.

    Attributes:
        dtype: Numpy-style dtype name (``float32``, ``bfloat16``, ``string``...).
        shape: Its shape.
        nbytes: Bytes it takes in the data file.
    """

    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    array: np.ndarray | None = dataclasses.field(default=None, repr=False)
    encoded: tuple[bytes, int] | None = dataclasses.field(default=None, repr=False)
    blocks: Callable[[], Iterable[Any]] | None = dataclasses.field(default=None, repr=False)
    stored: StoredBytes | None = None
    combined: Combined | None = dataclasses.field(default=None, repr=False)

    @classmethod
    def from_array(cls, value: Any) -> "TensorData":
        """A value in memory: a numpy array (any numeric dtype TF bundles hold, bool,
        bfloat16...) or strings (``bytes``/``str`` elements, numpy ``object``/``S``/``U``
        arrays; ``str`` is stored as UTF-8).

        Raises:
            UsageError: A dtype TF bundles cannot hold (or that this writer cannot encode).
        """
        if isinstance(value, (bytes, str)):
            value = np.array(value, dtype=object)
        arr = np.asarray(value)
        dtype = dtype_name(arr.dtype)
        shape = tuple(int(d) for d in arr.shape)
        if dtype == "string":
            encoded = encode_string_tensor(_as_bytes(x) for x in arr.reshape(-1).tolist())
            return cls("string", shape, len(encoded[0]), encoded=encoded)
        if dtype not in ENCODABLE_DTYPES:
            raise UsageError(f"cannot write a {dtype} tensor into a TF bundle. Expected one of {sorted(ENCODABLE_DTYPES)}")
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        arr = np.ascontiguousarray(arr)
        return cls(dtype, shape, int(arr.nbytes), array=arr)

    @classmethod
    def from_blocks(cls, dtype: str, shape: Sequence[int], blocks: Callable[[], Iterable[Any]]) -> "TensorData":
        """A numeric value streamed in blocks: ``blocks()`` (called once, when the tensor is
        written) yields arrays of ``dtype`` whose elements, flattened in C order and joined,
        are the value. A block may be a view of a buffer the next one reuses.

        Raises:
            UsageError: ``dtype`` is not a numeric dtype TF bundles hold.
        """
        np_dtype = encodable_dtype(dtype) if dtype in ENCODABLE_DTYPES else None
        if np_dtype is None:
            raise UsageError(f"cannot stream a {dtype} tensor into a TF bundle. Expected one of {sorted(ENCODABLE_DTYPES)}")
        shape = tuple(int(d) for d in shape)
        return cls(dtype, shape, element_count(shape) * np_dtype.itemsize, blocks=blocks)

    @classmethod
    def from_combined(
        cls,
        dtype: str,
        shape: Sequence[int],
        inputs: Sequence["TensorData"],
        fn: Callable[[int, Sequence[np.ndarray], np.ndarray], None],
        *,
        labels: Sequence[str] | None = None,
        written: Callable[[int], None] | None = None,
        read_back: Callable[[], None] | None = None,
    ) -> "TensorData":
        """A numeric value computed element by element from runs stored in other bundles
        (``average``), in blocks, on worker threads (:mod:`.bundle_combine`).

        Args:
            dtype: The output's dtype.
            shape: Its shape; every input holds as many elements.
            inputs: Runs built with :meth:`from_stored` (numeric dtypes); their bytes are
                checked against their recorded crc32c as they are read.
            fn: ``fn(start, blocks, out)`` fills ``out`` (output elements ``start`` ..
                ``start + out.size``) from the same elements of every input (read-only
                arrays); called from worker threads, blocks in any order.
            labels: Names of the inputs for messages (default: the output's shape and dtype).
            written: Called with the run's masked crc32c once it is written.
            read_back: Called (from the writer's I/O thread) once the run's first bytes
                (:data:`~._direct_io.HEAD_BYTES`) were read back from the file and found to be
                the bytes computed.

        Raises:
            UsageError: A dtype that is not numeric, or an input of another element count.
        """
        out_dtype = encodable_dtype(dtype) if dtype in ENCODABLE_DTYPES else None
        if out_dtype is None:
            raise UsageError(f"cannot compute a {dtype} tensor into a TF bundle. Expected one of {sorted(ENCODABLE_DTYPES)}")
        shape = tuple(int(d) for d in shape)
        count = element_count(shape)
        dtypes = []
        for data in inputs:
            np_dtype = encodable_dtype(data.dtype) if data.dtype in ENCODABLE_DTYPES else None
            if data.stored is None or np_dtype is None:
                raise UsageError(f"a combined tensor reads stored numeric runs. Received: {data.dtype} {data.shape}")
            if data.stored.size != count * np_dtype.itemsize:
                raise UsageError(f"a combined {dtype} {list(shape)} tensor reads runs of {count} elements."
                                 f" Received: {data.dtype} {list(data.shape)}")
            dtypes.append(np_dtype)
        names = tuple(labels) if labels is not None else tuple(f"{d.dtype} {list(d.shape)}" for d in inputs)
        combined = Combined(tuple(d.stored for d in inputs), tuple(dtypes), names, fn, written, read_back)
        return cls(dtype, shape, count * out_dtype.itemsize, combined=combined)

    @classmethod
    def from_stored(cls, dtype: str, shape: Sequence[int], stored: StoredBytes) -> "TensorData":
        """A run copied byte for byte from another bundle, keeping its recorded crc32c.

        Raises:
            UsageError: ``dtype`` is not a TF dtype.
            CorruptCheckpointError: The run's size cannot hold such a tensor.
        """
        if dtype not in DTYPE_ENUMS:
            raise UsageError(f"unknown TF dtype {dtype!r}")
        shape = tuple(int(d) for d in shape)
        item = m.ITEMSIZE.get(dtype)
        if dtype not in VARIABLE_LENGTH_DTYPES and item is not None and stored.size != element_count(shape) * item:
            raise CorruptCheckpointError(
                f"{stored.path}: bytes {stored.offset}..{stored.offset + stored.size} cannot hold a {dtype} tensor of"
                f" shape {list(shape)} ({element_count(shape) * item} bytes)"
            )
        return cls(dtype, shape, stored.size, stored=stored)


@dataclasses.dataclass(frozen=True)
class OutputTensor:
    """One tensor of the bundle to write: whole (``data``), or as slices of its full shape
    (a partitioned variable, ``slices``).

    Attributes:
        key: Its key in the bundle.
        dtype: Numpy-style dtype name.
        shape: The full shape.
        data: The whole value, or None for a sliced tensor.
        slices: ``(starts, lengths, data)`` per stored slice (``lengths`` ``-1``: the whole
            dimension, with start 0), in the order they are written.
    """

    key: str
    dtype: str
    shape: tuple[int, ...]
    data: TensorData | None = None
    slices: tuple[tuple[tuple[int, ...], tuple[int, ...], TensorData], ...] = ()

    @classmethod
    def whole(cls, key: str, data: TensorData) -> "OutputTensor":
        """A tensor written whole."""
        return cls(key, data.dtype, data.shape, data)

    @classmethod
    def from_array(cls, key: str, value: Any) -> "OutputTensor":
        """A tensor whose value is in memory (see :meth:`TensorData.from_array`)."""
        return cls.whole(key, TensorData.from_array(value))

    def renamed(self, key: str) -> "OutputTensor":
        """The same tensor under another key."""
        return dataclasses.replace(self, key=key)


# -- reading the runs of a source bundle -----------------------------------------------------
def open_source(path: str) -> int:
    """A source data file opened for reading: a regular file only (``O_NONBLOCK``: a FIFO
    cannot block the open; ``fstat`` on the open descriptor refuses it and devices)."""
    if not os.path.lexists(path):
        raise CorruptCheckpointError(f"{path}: data shard is missing")
    with _fs.open_binary(path) as f:
        return os.dup(f.fileno())


def pread_all(fd: int, offset: int, size: int, path: str) -> bytes:
    """Exactly ``size`` bytes at ``offset`` of ``fd``.

    Raises:
        CorruptCheckpointError: ``path`` ends first.
    """
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise CorruptCheckpointError(f"{path}: truncated: ended while reading bytes {offset}..{offset + size}")
    return data
