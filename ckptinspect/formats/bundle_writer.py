"""Writing TF bundle checkpoints without TensorFlow: ``PREFIX.index`` + ``PREFIX.data-*``.

The files are the ones TensorFlow's ``BundleWriter`` / ``MergeBundles``
(tensorflow/core/util/tensor_bundle/tensor_bundle.cc) write, byte for byte where the same
tensors go to the same places:

* **Data shards** ``PREFIX.data-0000k-of-0000N``: each stored run of bytes (a tensor, or one
  slice of a sliced tensor) goes whole into one shard, in the order given. Shards are filled
  in turn up to ``max_shard_bytes`` (as ``MaxShardSizePolicy`` fills them; a run bigger than
  the budget gets a shard of its own; no budget: one shard). Numeric and bool tensors are their
  little-endian bytes; strings are ``WriteStringTensor``'s layout (varint64 lengths, the masked
  crc32c of the lengths, the bytes). Every run's masked crc32c is computed as the bytes go out
  (strings and variants with TensorFlow's layouts, :func:`tf_data.tensor_crc32c`).
* **Copies**: a run taken unchanged from another bundle (:class:`StoredBytes`) is copied byte
  for byte with ``os.copy_file_range`` (in the kernel; a read/write loop where the OS or file
  system refuses) and keeps the crc32c its source index records: nothing is decoded, and
  damage in the source stays detectable by ``verify`` on the output. Pass
  ``check_copies=True`` to read the bytes through and compare checksums on the way instead.
* **The index**: the ``BundleHeaderProto`` (``num_shards``, little-endian, ``version
  {producer: 1}``) under the empty key, then one ``BundleEntryProto`` per key in byte order,
  serialized as TensorFlow's proto3 code does (zero fields left out, the shape always
  present); a sliced tensor's entry has its dtype, full shape and slices, and each stored
  slice is keyed by :func:`~._ordered_code.encode_tensor_name_slice`. The table is written by
  :class:`~._table_builder.TableBuilder` with TensorFlow's options.
* **The object graph** of a TF2 object-based checkpoint is one more string scalar,
  ``_CHECKPOINTABLE_OBJECT_GRAPH``, written last, where TensorFlow 2 puts it.

Memory stays about one block of a streamed tensor (:meth:`TensorData.from_blocks`), one
in-memory value, or one copy buffer, plus the index. Files are created exclusively, written
with positioned writes and fsync'ed. :func:`save_bundle_native` wraps the writer in an atomic
replace (``_atomic.atomic_prefix``).
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import os
import struct
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .. import model as m
from ..errors import CorruptCheckpointError, OutputExistsError, UsageError
from ._lazymod import lazy_import
from . import _fs
from ._direct_io import DirectShard
from .bundle_combine import BlockFeed, Combined
from ._crc import crc32c_combine, crc32c_module, mask
from ._layout import INDEX_SUFFIX, data_path
from ._ordered_code import encode_tensor_name_slice
from ._table_builder import DEFAULT_BLOCK_SIZE, TableBuilder, put_varint
from ._wire import MalformedError
from .tf_bundle import OBJECT_GRAPH_KEY, BundleSource
from .tf_data import DTYPE_NAMES, crc_mismatch, tensor_crc32c

# The protobuf runtime loads when an index or object graph is first decoded (see _lazymod).
_protos = lazy_import(__package__ + "._protos")

__all__ = [
    "StoredBytes",
    "TensorData",
    "OutputTensor",
    "WriteSummary",
    "write_bundle_native",
    "save_bundle_native",
    "copy_tensor",
    "compare_copy",
    "encode_string_tensor",
]

DTYPE_ENUMS = {name: number for number, name in DTYPE_NAMES.items()}
VARIABLE_LENGTH_DTYPES = ("string", "variant")
# Dtypes written from numpy values: their bytes are a plain little-endian array (int4 and
# uint4 take one byte per element in TF bundles, as in ml_dtypes).
PACKED_INT4_DTYPES = ("int4", "uint4")
ENCODABLE_DTYPES = (frozenset(m.NUMERIC_DTYPES) | frozenset(PACKED_INT4_DTYPES)) & frozenset(DTYPE_ENUMS)
BUNDLE_VERSION = b"\x08\x01"  # VersionDef {producer: kTensorBundleVersion = 1}, min_consumer 0
WRITE_BUFFER_BYTES = 1 << 20  # small writes are gathered up to this size
COPY_CHUNK_BYTES = 8 << 20  # read/write copies and checked copies move this much at a time
STREAM_BLOCK_ELEMENTS = 1 << 20  # elements per block when copy_tensor falls back to streaming
_UINT32_MAX = 0xFFFFFFFF
_COPY_FALLBACK_ERRNOS = frozenset(
    e for e in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", None),
                errno.EPERM, errno.EBADF) if e is not None
)
_FILE_MODE = 0o644


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
        fd = _open_source(self.path)
        try:
            return _pread_all(fd, self.offset + start, max(0, size), self.path)
        finally:
            os.close(fd)


@functools.lru_cache(maxsize=None)
def _numpy_dtype(name: str) -> np.dtype | None:
    """The little-endian numpy dtype of an encodable dtype name, or None."""
    if name in PACKED_INT4_DTYPES:
        try:
            import ml_dtypes  # noqa: PLC0415 - comes with TensorFlow and Keras
        except ImportError:  # pragma: no cover
            return None
        return np.dtype(getattr(ml_dtypes, name))
    dtype = m.numpy_dtype(name)
    return None if dtype is None else dtype.newbyteorder("<")


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _dtype_name(dtype: np.dtype) -> str:
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
        dtype = _dtype_name(arr.dtype)
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
        np_dtype = _numpy_dtype(dtype) if dtype in ENCODABLE_DTYPES else None
        if np_dtype is None:
            raise UsageError(f"cannot stream a {dtype} tensor into a TF bundle. Expected one of {sorted(ENCODABLE_DTYPES)}")
        shape = tuple(int(d) for d in shape)
        return cls(dtype, shape, _count(shape) * np_dtype.itemsize, blocks=blocks)

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
        out_dtype = _numpy_dtype(dtype) if dtype in ENCODABLE_DTYPES else None
        if out_dtype is None:
            raise UsageError(f"cannot compute a {dtype} tensor into a TF bundle. Expected one of {sorted(ENCODABLE_DTYPES)}")
        shape = tuple(int(d) for d in shape)
        count = _count(shape)
        dtypes = []
        for data in inputs:
            np_dtype = _numpy_dtype(data.dtype) if data.dtype in ENCODABLE_DTYPES else None
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
        if dtype not in VARIABLE_LENGTH_DTYPES and item is not None and stored.size != _count(shape) * item:
            raise CorruptCheckpointError(
                f"{stored.path}: bytes {stored.offset}..{stored.offset + stored.size} cannot hold a {dtype} tensor of"
                f" shape {list(shape)} ({_count(shape) * item} bytes)"
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


@dataclasses.dataclass(frozen=True)
class WriteSummary:
    """What :func:`write_bundle_native` wrote.

    Attributes:
        prefix: The bundle's prefix.
        num_shards: Data files written.
        tensors: Keys written (sliced tensors once, the object graph included).
        runs: Stored runs of bytes (a sliced tensor counts one per slice).
        data_bytes: Bytes in the data files.
        copied_bytes: Of those, bytes copied unchanged from other bundles.
        index_bytes: Size of the ``.index`` file.
        shard_bytes: Bytes per data file.
    """

    prefix: str
    num_shards: int
    tensors: int
    runs: int
    data_bytes: int
    copied_bytes: int
    index_bytes: int
    shard_bytes: tuple[int, ...]


# -- planning --------------------------------------------------------------------------------
@dataclasses.dataclass
class _Run:
    key: bytes
    data: TensorData
    label: str  # for messages: the tensor key, with the slice
    shard: int = 0
    offset: int = 0
    crc32c: int = 0


def _fmt_slice(starts: tuple[int, ...], lengths: tuple[int, ...]) -> str:
    return "[" + ",".join(":" if ln < 0 else f"{st}:{st + ln}" for st, ln in zip(starts, lengths)) + "]"


def _check_key(key: str, seen: set[bytes]) -> bytes:
    if not isinstance(key, str) or not key:
        raise UsageError(f"a tensor key must be a non-empty string. Received: {key!r}")
    raw = key.encode("utf-8", "surrogateescape")  # a key read as surrogate escapes: its bytes
    if raw[:1] == b"\x00":
        raise UsageError(f"tensor key {key!r} starts with a zero byte (reserved for stored slices)")
    if raw in seen:
        raise UsageError(f"tensor key {key!r} is given twice")
    seen.add(raw)
    return raw


def _slice_shape(key: str, shape: tuple[int, ...], starts: tuple[int, ...], lengths: tuple[int, ...]) -> tuple[int, ...]:
    if len(starts) != len(shape) or len(lengths) != len(shape):
        raise UsageError(f"slice {_fmt_slice(starts, lengths)} of {key!r} does not match its shape {list(shape)}")
    out = []
    for dim, st, ln in zip(shape, starts, lengths):
        if ln == -1:
            if st != 0:
                raise UsageError(f"slice {_fmt_slice(starts, lengths)} of {key!r}: a whole dimension starts at 0")
            out.append(dim)
        elif st < 0 or ln < 0 or st + ln > dim:
            raise UsageError(f"slice {_fmt_slice(starts, lengths)} of {key!r} lies outside its shape {list(shape)}")
        else:
            out.append(ln)
    return tuple(out)


def _is_full(shape: tuple[int, ...], starts: tuple[int, ...], lengths: tuple[int, ...]) -> bool:
    """TensorFlow's ``IsFullSlice``: every dimension whole (a full slice is saved as a plain tensor)."""
    return all(ln == -1 or (st == 0 and ln == d) for d, st, ln in zip(shape, starts, lengths))


def _shape_proto(shape_msg: Any, shape: tuple[int, ...]) -> None:
    shape_msg.SetInParent()  # TensorShape::AsProto(mutable_shape()): always present
    for d in shape:
        dim = shape_msg.dim.add()
        if d:
            dim.size = d


def _entry_bytes(dtype: str, shape: tuple[int, ...], shard: int, offset: int, size: int, crc: int) -> bytes:
    entry = _protos.BundleEntryProto()
    entry.dtype = DTYPE_ENUMS[dtype]
    _shape_proto(entry.shape, shape)
    # proto3: zero values are not serialized
    if shard:
        entry.shard_id = shard
    if offset:
        entry.offset = offset
    if size:
        entry.size = size
    if crc:
        entry.crc32c = crc
    return entry.SerializeToString()


def _sliced_entry_bytes(t: OutputTensor) -> bytes:
    entry = _protos.BundleEntryProto()
    entry.dtype = DTYPE_ENUMS[t.dtype]
    _shape_proto(entry.shape, t.shape)
    for starts, lengths, _ in t.slices:
        proto = entry.slices.add()
        for st, ln in zip(starts, lengths):
            extent = proto.extent.add()
            if ln != -1:  # TensorSlice::AsProto records only the partial dimensions
                if st:
                    extent.start = st
                extent.length = ln  # in a oneof: serialized even when 0
    return entry.SerializeToString()


def _plan(tensors: Iterable[OutputTensor], object_graph: bytes | None) -> tuple[list[_Run], dict[bytes, bytes]]:
    """The stored runs in write order (the object graph last), and the index entries known
    before writing (sliced tensors' full entries)."""
    runs: list[_Run] = []
    fixed: dict[bytes, bytes] = {}
    seen: set[bytes] = set()
    if object_graph is not None:
        tensors = [*tensors, OutputTensor.from_array(OBJECT_GRAPH_KEY, np.array(object_graph, dtype=object))]
    for t in tensors:
        if not isinstance(t, OutputTensor):
            raise UsageError(f"write_bundle_native takes OutputTensor items. Received: {type(t).__name__}")
        raw = _check_key(t.key, seen)
        if t.dtype not in DTYPE_ENUMS:
            raise UsageError(f"{t.key!r}: unknown TF dtype {t.dtype!r}")
        slices = t.slices
        if slices and t.data is not None:
            raise UsageError(f"{t.key!r}: give either the whole value or its slices, not both")
        if len(slices) == 1 and _is_full(t.shape, *slices[0][:2]):
            _slice_shape(t.key, t.shape, *slices[0][:2])
            t = dataclasses.replace(t, data=slices[0][2], slices=())
            slices = ()
        if not slices:
            if t.data is None:
                raise UsageError(f"{t.key!r}: no value and no slices")
            if (t.data.dtype, t.data.shape) != (t.dtype, t.shape):
                raise UsageError(
                    f"{t.key!r}: declared {t.dtype} {list(t.shape)}, its value is {t.data.dtype} {list(t.data.shape)}"
                )
            runs.append(_Run(raw, t.data, t.key))
            continue
        extents = set()
        for starts, lengths, data in slices:
            starts, lengths = tuple(starts), tuple(lengths)
            want = _slice_shape(t.key, t.shape, starts, lengths)
            label = f"{t.key}{_fmt_slice(starts, lengths)}"
            if _is_full(t.shape, starts, lengths):
                raise UsageError(f"{label}: a slice covering the whole tensor cannot be one of several slices")
            if (starts, lengths) in extents:
                raise UsageError(f"{label}: given twice")
            extents.add((starts, lengths))
            if (data.dtype, data.shape) != (t.dtype, want):
                raise UsageError(f"{label}: the slice is {t.dtype} {list(want)}, its value is {data.dtype} {list(data.shape)}")
            runs.append(_Run(encode_tensor_name_slice(t.key, starts, lengths), data, label))
        fixed[raw] = _sliced_entry_bytes(t)
    return runs, fixed


def _assign_shards(runs: list[_Run], max_shard_bytes: int | None) -> int:
    """Fill shards in turn up to ``max_shard_bytes`` (a bigger run gets its own shard; empty
    runs stay in the current one). Returns the number of shards."""
    shard, used = 0, 0
    for run in runs:
        size = run.data.nbytes
        if max_shard_bytes is not None and used and size and used + size > max_shard_bytes:
            shard, used = shard + 1, 0
        run.shard = shard
        used += size
    return shard + 1


# -- writing ---------------------------------------------------------------------------------
def _create(path: str, readable: bool = False) -> int:
    try:
        return os.open(path, (os.O_RDWR if readable else os.O_WRONLY) | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0), _FILE_MODE)
    except FileExistsError:
        raise OutputExistsError(f"{path}: exists; write bundles into a fresh location (save_bundle_native replaces atomically)") from None


class _ShardFile:
    """One data file being written: positioned writes, small ones gathered."""

    def __init__(self, path: str):
        self.path = path
        self.fd = _create(path)
        self.offset = 0
        self._buf = bytearray()

    def write(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        if len(view) < WRITE_BUFFER_BYTES:
            self._buf += view
            if len(self._buf) >= WRITE_BUFFER_BYTES:
                self.flush()
            return
        self.flush()
        self._pwrite(view)

    def _pwrite(self, view: memoryview) -> None:
        done = 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], self.offset + done)
        self.offset += done

    def flush(self) -> None:
        if self._buf:
            self._pwrite(memoryview(self._buf))
            self._buf = bytearray()

    @property
    def size(self) -> int:
        return self.offset + len(self._buf)

    def close(self, fsync: bool) -> None:
        try:
            self.flush()
            if fsync:
                os.fsync(self.fd)
        finally:
            os.close(self.fd)


def _readonly_bytes(arr: np.ndarray) -> np.ndarray:
    """A read-only uint8 view of a contiguous array (google-crc32c takes read-only buffers
    without copying; memoryview takes every dtype this way, bfloat16 included)."""
    view = arr.reshape(-1).view(np.uint8)
    view.flags.writeable = False
    return view


class _Writer:
    def __init__(self, check_copies: bool, feed: BlockFeed | None = None):
        self.check_copies = check_copies
        self.feed = feed
        self.crc32c = crc32c_module()
        self.copied = 0
        self._sources: dict[str, int] = {}
        self._copy_file_range = hasattr(os, "copy_file_range")
        self._buffer: bytearray | None = None

    def close(self) -> None:
        fds, self._sources = self._sources, {}
        for fd in fds.values():
            os.close(fd)

    # in-memory numeric values
    def write_array(self, out: _ShardFile, arr: np.ndarray) -> int:
        data = _readonly_bytes(arr)
        out.write(data)
        return mask(self.crc32c.value(data))

    def write_blocks(self, out: _ShardFile, run: _Run) -> int:
        data = run.data
        want = _numpy_dtype(data.dtype)
        total = _count(data.shape)
        crc, done = 0, 0
        for block in data.blocks():
            arr = np.asarray(block)
            if _dtype_name(arr.dtype) != data.dtype:
                raise UsageError(f"{run.label}: a {data.dtype} tensor was given a block of {_dtype_name(arr.dtype)}")
            arr = np.ascontiguousarray(arr, dtype=want)
            done += arr.size
            if done > total:
                raise UsageError(f"{run.label}: blocks hold more than the {total} elements of shape {list(data.shape)}")
            raw = _readonly_bytes(arr)
            out.write(raw)
            crc = self.crc32c.extend(crc, raw)
        if done != total:
            raise UsageError(f"{run.label}: blocks hold {done} elements, shape {list(data.shape)} needs {total}")
        return mask(crc)

    def write_combined(self, out: DirectShard, run: _Run) -> int:
        data = run.data
        combined = data.combined
        assert combined is not None and self.feed is not None
        feed = self.feed
        out.mark_head(data.nbytes, combined.read_back)
        crc, first = 0, True
        for block in feed.run(combined, _numpy_dtype(data.dtype), _count(data.shape)):
            crc = block.out_crc if first else crc32c_combine(crc, block.out_crc, len(block.view))
            first = False
            out.write_lent(block.view, lambda block=block: feed.release(block))
        crc = mask(crc)
        if combined.written is not None:
            combined.written(crc)
        return crc

    # byte-exact copies
    def _source(self, path: str) -> int:
        fd = self._sources.get(path)
        if fd is None:
            fd = _open_source(path)
            self._sources[path] = fd
        return fd

    def write_stored(self, out: _ShardFile, run: _Run) -> int:
        stored = run.data.stored
        assert stored is not None
        fd = self._source(stored.path)
        end = stored.offset + stored.size
        have = os.fstat(fd).st_size
        if have < end:
            raise CorruptCheckpointError(
                f"{stored.path}: truncated: {run.label!r} needs bytes {stored.offset}..{end}, the file has {have}"
            )
        if isinstance(out, DirectShard) and not self.check_copies:
            out.write_from(fd, stored.offset, stored.size, stored.path)
        elif self.check_copies:
            crc = self._copy_checked(out, run, fd)
            if crc != (stored.crc32c or 0):
                raise CorruptCheckpointError(f"{stored.path}: {run.label!r}: {crc_mismatch(stored.crc32c or 0, crc)}")
        else:
            out.flush()
            done = self._copy_in_kernel(out, fd, stored.offset, stored.size) if self._copy_file_range else 0
            self._copy_plain(out, fd, stored.offset + done, stored.size - done, stored.path)
        self.copied += stored.size
        return stored.crc32c or 0

    def _copy_in_kernel(self, out: _ShardFile, fd: int, offset: int, size: int) -> int:
        """Copy with ``copy_file_range``; returns the bytes copied (fewer when the OS or the
        file system cannot, and the rest is left to a plain copy)."""
        done = 0
        while done < size:
            try:
                n = os.copy_file_range(fd, out.fd, size - done, offset + done, out.offset)
            except OSError as e:
                if e.errno in _COPY_FALLBACK_ERRNOS:
                    self._copy_file_range = False
                    return done
                raise
            if n == 0:  # a file system that copies nothing (or a source shrinking meanwhile)
                self._copy_file_range = False
                return done
            done += n
            out.offset += n
        return done

    def _chunks(self, fd: int, offset: int, size: int, path: str) -> Iterable[memoryview]:
        if self._buffer is None:
            self._buffer = bytearray(min(COPY_CHUNK_BYTES, max(size, 1)))
        elif len(self._buffer) < min(COPY_CHUNK_BYTES, size):
            self._buffer = bytearray(min(COPY_CHUNK_BYTES, size))
        view = memoryview(self._buffer)
        done = 0
        while done < size:
            n = os.preadv(fd, [view[: min(len(view), size - done)]], offset + done)
            if n == 0:
                raise CorruptCheckpointError(f"{path}: truncated: ended while copying bytes {offset}..{offset + size}")
            yield view[:n]
            done += n

    def _copy_plain(self, out: _ShardFile, fd: int, offset: int, size: int, path: str) -> None:
        for chunk in self._chunks(fd, offset, size, path):
            out.flush()
            out._pwrite(chunk)

    def _copy_checked(self, out: _ShardFile, run: _Run, fd: int) -> int:
        stored = run.data.stored
        assert stored is not None
        if run.data.dtype in VARIABLE_LENGTH_DTYPES:
            raw = bytes(b"".join(bytes(c) for c in self._chunks(fd, stored.offset, stored.size, stored.path)))
            out.write(raw)
            try:
                return tensor_crc32c(run.data.dtype, run.data.shape, raw)
            except MalformedError as e:
                raise CorruptCheckpointError(f"{stored.path}: {run.label!r}: {run.data.dtype} tensor does not decode: {e}") from None
        crc = 0
        for chunk in self._chunks(fd, stored.offset, stored.size, stored.path):
            crc = self.crc32c.extend(crc, _readonly_bytes(np.frombuffer(chunk, dtype=np.uint8)))
            out.write(chunk)
        return mask(crc)

    def write(self, out: _ShardFile, run: _Run) -> int:
        data = run.data
        if data.stored is not None:
            return self.write_stored(out, run)
        if data.encoded is not None:
            out.write(data.encoded[0])
            return data.encoded[1]
        if data.array is not None:
            return self.write_array(out, data.array)
        if data.blocks is not None:
            return self.write_blocks(out, run)
        if data.combined is not None:
            return self.write_combined(out, run)
        raise UsageError(f"{run.label}: no value")  # pragma: no cover - TensorData is built by its constructors


def _open_source(path: str) -> int:
    """A source data file opened for reading: a regular file only (``O_NONBLOCK``: a FIFO
    cannot block the open; ``fstat`` on the open descriptor refuses it and devices)."""
    if not os.path.lexists(path):
        raise CorruptCheckpointError(f"{path}: data shard is missing")
    with _fs.open_binary(path) as f:
        return os.dup(f.fileno())


def compare_copy(path: str, offset: int, stored: StoredBytes, dtype: str, shape: Sequence[int], label: str) -> bool:
    """Whether the bytes at ``offset`` of ``path`` (a copy written by :func:`write_bundle_native`)
    are ``stored``'s bytes, read chunk by chunk from both files; the source's bytes are also
    checked against the crc32c its index records (a copy reuses it, so damage in the source
    would otherwise pass on silently).

    Args:
        path: The written data file.
        offset: Where the copy starts in it.
        stored: The source run it was copied from.
        dtype: The run's dtype (strings and variants have their own checksum layouts).
        shape: The run's shape.
        label: The key (and slice) for messages.

    Returns:
        True when the bytes are identical.

    Raises:
        CorruptCheckpointError: A file is missing, not regular or truncated, or the source's
            bytes do not match their recorded crc32c.
    """
    fa, fb = _open_source(path), _open_source(stored.path)
    try:
        if dtype in VARIABLE_LENGTH_DTYPES:
            a, b = _pread_all(fa, offset, stored.size, path), _pread_all(fb, stored.offset, stored.size, stored.path)
            try:
                crc = tensor_crc32c(dtype, tuple(shape), b)
            except MalformedError as e:
                raise CorruptCheckpointError(f"{stored.path}: {label!r}: {dtype} tensor does not decode: {e}") from None
            same = a == b
        else:
            crc32c, crc, same, done = crc32c_module(), 0, True, 0
            while done < stored.size:
                n = min(COPY_CHUNK_BYTES, stored.size - done)
                a, b = _pread_all(fa, offset + done, n, path), _pread_all(fb, stored.offset + done, n, stored.path)
                crc = crc32c.extend(crc, b)
                same = same and a == b
                done += n
            crc = mask(crc)
        if crc != (stored.crc32c or 0):
            raise CorruptCheckpointError(f"{stored.path}: {label!r}: {crc_mismatch(stored.crc32c or 0, crc)}")
        return same
    finally:
        os.close(fa)
        os.close(fb)


def _pread_all(fd: int, offset: int, size: int, path: str) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise CorruptCheckpointError(f"{path}: truncated: ended while reading bytes {offset}..{offset + size}")
    return data


def _fsync_directory(directory: str) -> None:
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # not every file system can sync a directory
    finally:
        os.close(fd)


def write_bundle_native(
    prefix: str,
    tensors: Iterable[OutputTensor],
    *,
    object_graph: bytes | Any | None = None,
    max_shard_bytes: int | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    check_copies: bool = False,
    fsync: bool = True,
) -> WriteSummary:
    """Write a TF bundle at ``prefix`` without TensorFlow.

    Args:
        prefix: Output prefix (``prefix.index``, ``prefix.data-*``) in an existing directory;
            none of its files may exist (use :func:`save_bundle_native` to replace an output
            atomically). Partial files are removed when writing fails.
        tensors: What to write, in data-file order (the index is sorted by key).
        object_graph: A TF2 object graph (a serialized ``TrackableObjectGraph``, or a message
            with ``SerializeToString``), written as ``_CHECKPOINTABLE_OBJECT_GRAPH`` after the tensors.
        max_shard_bytes: Data bytes per shard; a bigger tensor (or slice) gets a shard of its
            own; ``0`` gives one tensor per shard; None (default) writes one shard.
        block_size: Index table block size (TensorFlow's is 256 KiB).
        check_copies: Read copied bytes through and compare them with their recorded
            checksums (else they are copied in the kernel and their checksums reused).
        fsync: Sync every file written to disk before returning.

    Returns:
        A :class:`WriteSummary`.

    Raises:
        UsageError: Tensors that do not fit together (duplicate keys, shapes, dtypes...).
        OutputExistsError: A file of ``prefix`` exists.
        CorruptCheckpointError: A source to copy from is missing, truncated, or (with
            ``check_copies``) does not match its checksum.
    """
    prefix = os.fspath(prefix)
    if object_graph is not None and not isinstance(object_graph, (bytes, bytearray)):
        object_graph = object_graph.SerializeToString()
    if max_shard_bytes is not None and max_shard_bytes < 0:
        raise UsageError(f"max_shard_bytes must be at least 0. Received: {max_shard_bytes}")
    runs, entries = _plan(tensors, bytes(object_graph) if object_graph is not None else None)
    num_shards = _assign_shards(runs, max_shard_bytes)
    if os.path.lexists(prefix + INDEX_SUFFIX):
        raise OutputExistsError(f"{prefix}{INDEX_SUFFIX}: exists; write bundles into a fresh location")
    created: list[str] = []
    combined = [(r.data.combined, _numpy_dtype(r.data.dtype), _count(r.data.shape)) for r in runs
                if r.data.combined is not None]
    writer = _Writer(check_copies, BlockFeed(combined) if combined else None)
    shard_bytes: list[int] = []
    out: _ShardFile | None = None
    try:
        by_shard: list[list[_Run]] = [[] for _ in range(num_shards)]
        for run in runs:
            by_shard[run.shard].append(run)
        for shard, shard_runs in enumerate(by_shard):
            path = data_path(prefix, shard, num_shards)
            # computed tensors (average): written around the page cache on an I/O thread
            out = DirectShard(path, lambda p: _create(p, readable=True)) if any(r.data.combined is not None for r in shard_runs) else _ShardFile(path)
            created.append(out.path)
            for run in shard_runs:
                run.offset = out.size
                run.crc32c = writer.write(out, run)
                if out.size - run.offset != run.data.nbytes:  # pragma: no cover - guarded by the writers above
                    raise UsageError(f"{run.label}: wrote {out.size - run.offset} bytes, planned {run.data.nbytes}")
            shard_bytes.append(out.size)
            done, out = out, None
            done.close(fsync)
        for run in runs:
            if run.key not in entries:
                entries[run.key] = _entry_bytes(run.data.dtype, run.data.shape, run.shard, run.offset, run.data.nbytes, run.crc32c)
        header = _protos.BundleHeaderProto()
        header.num_shards = num_shards
        header.version = BUNDLE_VERSION
        table = TableBuilder(block_size=block_size)
        table.add(b"", header.SerializeToString())
        for key in sorted(entries):
            table.add(key, entries[key])
        index = table.finish()
        index_file = _ShardFile(prefix + INDEX_SUFFIX)
        created.append(index_file.path)
        index_file.write(index)
        index_file.close(fsync)
    except BaseException:
        if out is not None:
            try:
                out.close(False)
            except OSError:
                pass
        for path in created:
            try:
                os.remove(path)
            except OSError:
                pass
        raise
    finally:
        writer.close()
        if writer.feed is not None:
            writer.feed.close()
    return WriteSummary(
        prefix=prefix,
        num_shards=num_shards,
        tensors=sum(1 for k in entries if k[:1] != b"\x00"),
        runs=len(runs),
        data_bytes=sum(shard_bytes),
        copied_bytes=writer.copied,
        index_bytes=len(index),
        shard_bytes=tuple(shard_bytes),
    )


def save_bundle_native(
    dest: str,
    tensors: Iterable[OutputTensor],
    *,
    force: bool = False,
    protected: Iterable[str] = (),
    check: Callable[[str], None] | None = None,
    **options: Any,
) -> WriteSummary:
    """Write a TF bundle at ``dest`` atomically (``_atomic.atomic_prefix``): into a temporary
    directory beside it, checked, then renamed into place (data first, index last) and the
    directory synced. Every file a tensor is copied from is protected from being replaced.

    Args:
        dest: The output prefix.
        tensors: What to write (see :func:`write_bundle_native`).
        force: Replace an existing bundle at ``dest``.
        protected: Inputs that must never be overwritten (files or prefixes).
        check: Called with the temporary prefix once written; raise to abandon the write.
        **options: Passed to :func:`write_bundle_native`.

    Returns:
        The :class:`WriteSummary`, with ``prefix`` the final one.

    Raises:
        OutputExistsError, UsageError: See ``_atomic.check_output`` and :func:`write_bundle_native`.
        CorruptCheckpointError: A source to copy from is damaged.
    """
    from .._atomic import atomic_prefix  # noqa: PLC0415 - a sibling of formats, used only here

    tensors = list(tensors)
    sources = {
        data.stored.path
        for t in tensors
        for data in ([t.data] if t.data is not None else [s[2] for s in t.slices])
        if data.stored is not None
    }
    dest = os.fspath(dest)
    with atomic_prefix(dest, force=force, protected=[*protected, *sorted(sources)]) as tmp:
        summary = write_bundle_native(tmp, tensors, **options)
        if check is not None:
            check(tmp)
    _fsync_directory(os.path.dirname(dest))
    return dataclasses.replace(summary, prefix=dest)


# -- from an open checkpoint ------------------------------------------------------------------
def copy_tensor(checkpoint: m.Checkpoint, variable: m.Variable | str, key: str | None = None) -> "OutputTensor":
    """A variable of an open checkpoint, to write unchanged (under ``key``, default its own).

    From a local TF bundle the stored bytes are copied as they are (every slice of a sliced
    variable, with its checksum); from any other source the value is streamed in blocks
    (numeric) or read whole (strings).

    Args:
        checkpoint: The open source checkpoint.
        variable: One of its variables, or its name or key.
        key: The key in the written bundle.

    Returns:
        The :class:`OutputTensor`.
    """
    var = variable if isinstance(variable, m.Variable) else checkpoint[variable]
    key = var.key if key is None else key
    source = checkpoint.source
    runs = source.stored_runs(var) if isinstance(source, BundleSource) else None
    if runs:
        datas = [
            TensorData.from_stored(
                r.entry.dtype, r.entry.shape, StoredBytes(r.path, r.entry.offset, r.entry.size, r.entry.crc32c or 0)
            )
            for r in runs
        ]
        if not runs[0].starts:
            return OutputTensor(key, var.dtype, var.shape, datas[0])
        return OutputTensor(key, var.dtype, var.shape, slices=tuple((r.starts, r.lengths, d) for r, d in zip(runs, datas)))
    if var.dtype in ENCODABLE_DTYPES and _numpy_dtype(var.dtype) is not None:
        return OutputTensor(
            key, var.dtype, var.shape,
            TensorData.from_blocks(var.dtype, var.shape, lambda: checkpoint.iter_blocks(var, STREAM_BLOCK_ELEMENTS)),
        )
    return OutputTensor.from_array(key, checkpoint.read(var))
