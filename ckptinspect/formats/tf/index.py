"""The ``.index`` file of a TF bundle, parsed without TensorFlow.

An SSTable of ``BundleEntryProto`` records keyed by tensor name (the empty key holds the
``BundleHeaderProto``; stored slices of a sliced tensor are keyed by OrderedCode,
``EncodeTensorNameSlice``). :func:`read_index` reads one (bounded by :data:`MAX_INDEX_BYTES`),
:func:`parse_index` parses its bytes into a :class:`BundleIndex` of :class:`IndexEntry` records.

Field numbers used here (tensorflow/core/protobuf/tensor_bundle.proto, tensor_shape.proto,
tensor_slice.proto):

* BundleHeaderProto: num_shards=1, endianness=2, version=3.
* BundleEntryProto: dtype=1, shape=2, shard_id=3, offset=4, size=5, crc32c=6, slices=7.
* TensorShapeProto: dim=2 (Dim: size=1, name=2), unknown_rank=3.
* TensorSliceProto: extent=1 (Extent: start=1, length=2).

Every entry is checked when the index is parsed (:func:`entry_problem`): one TensorFlow cannot
read (an unknown dtype, a resource handle, a shape it aborts on, a size other than shape x
dtype) carries its problem, and is never handed to TensorFlow. Keys keep their exact bytes
(:func:`~._layout.decode_key`).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import threading
import weakref
from typing import TYPE_CHECKING

from ... import model as m
from ...errors import CkptError, CorruptCheckpointError
from .. import _fs
from .._bulk import paused_gc
from .._layout import INDEX_SUFFIX, decode_key
from .._lazymod import lazy_import
from .ordered_code import decode_tensor_name_slice
from .sstable import iter_table
from .wire import MalformedError
from .data import DTYPE_NAMES, expected_nbytes

if TYPE_CHECKING:
    from .compact import CompactIndex

# The protobuf runtime loads when an index is first decoded (see _lazymod).
_protos = lazy_import(__package__ + ".protos")

__all__ = [
    "OBJECT_GRAPH_KEY",
    "MAX_INDEX_BYTES",
    "IndexEntry",
    "BundleIndex",
    "parse_index",
    "read_index",
    "parse_shape",
    "entry_problem",
    "fits_tensorflow",
]

OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
# Largest ``.index`` file read: an index holds ~100 bytes per tensor or slice, so this is far
# beyond any real checkpoint, and it keeps a hostile file (a sparse 3 GB ``.index``) from being read.
MAX_INDEX_BYTES = 256 << 20

# TensorFlow's limits on a shape (tensorflow/core/framework/tensor_shape.h): it aborts the
# process on more dimensions or on an element count that overflows int64.
MAX_DIMS = 254
MAX_ELEMENTS = (1 << 63) - 1


@dataclasses.dataclass(frozen=True)
class IndexEntry:
    """One ``BundleEntryProto`` record.

    ``problem`` is set when TensorFlow cannot read the entry (unknown dtype, a resource
    handle, a shape it aborts on, a size that disagrees with shape x dtype): ``(kind, text)``,
    kind ``dtype`` or ``size``. Such an entry is damage for ``verify`` and is never handed to
    TensorFlow.
    """

    key: str
    dtype: str
    shape: tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc32c: int | None
    slices: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()
    problem: tuple[str, str] | None = None


@dataclasses.dataclass(frozen=True)
class BundleIndex:
    """A parsed ``.index`` file.

    Attributes:
        num_shards: From the header.
        entries: Every named tensor, in key order (sliced ones have ``slices`` and no data).
        slice_entries: For each sliced tensor name, its stored slices.
        compressed: True when any block was snappy-compressed.
    """

    num_shards: int
    entries: tuple[IndexEntry, ...]
    slice_entries: dict[str, tuple[tuple[tuple[int, ...], tuple[int, ...], IndexEntry], ...]]


def _shape_of(shape) -> tuple[int, ...]:
    if shape.unknown_rank:
        return ()
    dims = tuple([d.size for d in shape.dim])
    if dims and min(dims) < 0:
        raise MalformedError(f"negative dimension in shape {dims}")
    return dims


def parse_shape(buf: bytes) -> tuple[int, ...]:
    """A serialized ``TensorShapeProto`` as a tuple."""
    shape = _protos.TensorShapeProto()
    try:
        shape.ParseFromString(buf)
    except _protos.DecodeError as e:
        raise MalformedError(f"bad TensorShapeProto: {e}") from None
    return _shape_of(shape)


@functools.lru_cache(maxsize=4096)  # entries mostly repeat a few (dtype, shape, size): a pure function
def entry_problem(
    code: int, shape: tuple[int, ...], size: int, *, holds_data: bool
) -> tuple[str, str] | None:
    """Why TensorFlow cannot read an index entry, or None when it can.

    Args:
        code: The ``DataType`` number.
        shape: The declared shape.
        size: The bytes the entry records.
        holds_data: False for the entry of a sliced tensor (its slices hold the bytes).

    Returns:
        ``(kind, problem)`` with kind ``dtype`` or ``size``, or None.
    """
    dtype = DTYPE_NAMES.get(code)
    if dtype is None or code == 0:
        return m.DAMAGE_DTYPE, f"unknown dtype {code}: TensorFlow cannot read it"
    if dtype == "resource":
        return m.DAMAGE_DTYPE, "dtype resource: a resource handle, not a stored value; TensorFlow cannot read it"
    if len(shape) > MAX_DIMS:
        return m.DAMAGE_SIZE, f"shape has {len(shape)} dimensions, more than TensorFlow's {MAX_DIMS}"
    if not fits_tensorflow(shape):  # multiplied in order, as TensorFlow does: an overflow on the way aborts it too
        return m.DAMAGE_SIZE, f"shape {list(shape)} holds more elements than int64 can count"
    count = 1
    for d in shape:
        count *= d
    if not holds_data:
        return None
    expected = expected_nbytes(dtype, shape)
    if expected is not None and expected != size:
        return m.DAMAGE_SIZE, (f"the index records {size} bytes, a {dtype} tensor of shape {list(shape)}"
                               f" takes {expected}")
    if expected is None and count > size:
        return m.DAMAGE_SIZE, f"the index records {size} bytes, too few for {count} {dtype} elements"
    return None


def fits_tensorflow(shape: tuple[int, ...]) -> bool:
    """Whether TensorFlow can build this shape (else it aborts the process)."""
    if len(shape) > MAX_DIMS:
        return False
    count = 1
    for d in shape:
        count *= d
        if count > MAX_ELEMENTS:
            return False
    return True


def _parse_entry(key: str, value: bytes, *, stored_slice: bool = False) -> IndexEntry:
    entry = _protos.BundleEntryProto()
    try:
        entry.ParseFromString(value)
    except _protos.DecodeError as e:
        raise MalformedError(f"entry {key!r} is not a BundleEntryProto: {e}") from None
    if entry.offset < 0 or entry.size < 0 or entry.shard_id < 0:
        raise MalformedError(f"entry {key!r} has a negative offset, size or shard")
    shape = _shape_of(entry.shape)
    slices = tuple(
        (
            tuple(e.start for e in sl.extent),
            tuple(e.length if e.HasField("length") else -1 for e in sl.extent),
        )
        for sl in entry.slices
    ) if entry.slices else ()
    return IndexEntry(
        key=key,
        dtype=DTYPE_NAMES.get(entry.dtype, f"dtype{entry.dtype}"),
        shape=shape,
        shard_id=entry.shard_id,
        offset=entry.offset,
        size=entry.size,
        crc32c=entry.crc32c if entry.HasField("crc32c") else None,
        slices=slices,
        problem=entry_problem(entry.dtype, shape, entry.size, holds_data=stored_slice or not slices),
    )


# -- OrderedCode, used for the keys of stored slices (tensorflow/core/util/saved_tensor_slice_util)
def _oc_read_num(buf: bytes, pos: int) -> tuple[int, int]:
    if pos >= len(buf):
        raise MalformedError("truncated ordered-code number")
    n = buf[pos]
    if pos + 1 + n > len(buf):
        raise MalformedError("truncated ordered-code number")
    return int.from_bytes(buf[pos + 1 : pos + 1 + n], "big"), pos + 1 + n


def _oc_read_string(buf: bytes, pos: int) -> tuple[bytes, int]:
    out = bytearray()
    while pos < len(buf):
        c = buf[pos]
        if c == 0x00:
            if pos + 1 >= len(buf):
                break
            nxt = buf[pos + 1]
            if nxt == 0x01:
                return bytes(out), pos + 2
            if nxt == 0xFF:
                out.append(0)
                pos += 2
                continue
            raise MalformedError("bad ordered-code escape")
        if c == 0xFF:
            if pos + 1 >= len(buf) or buf[pos + 1] != 0x00:
                raise MalformedError("bad ordered-code escape")
            out.append(0xFF)
            pos += 2
            continue
        out.append(c)
        pos += 1
    raise MalformedError("unterminated ordered-code string")


def _decode_slice_key(key: bytes) -> str:
    """The tensor name of a stored-slice key (``EncodeTensorNameSlice``)."""
    _, pos = _oc_read_num(key, 0)
    name, _ = _oc_read_string(key, pos)
    return decode_key(name)


def _slice_extents(key: bytes) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(starts, lengths) of a stored-slice key, or None when its extents do not decode."""
    try:
        _, starts, lengths = decode_tensor_name_slice(key)
    except MalformedError:
        return None
    return starts, lengths


def _pair_slices(declared, stored) -> tuple:
    """Each declared slice of a tensor with the stored entry keyed by the same extents.

    TensorFlow declares slices in the order they were saved, while the index keys sort by
    start, so the two orders can differ. Stored entries whose keys do not decode are paired,
    in order, with the declared slices left over.
    """
    by_extents: dict = {}
    undecoded = []
    for extents, entry in stored:
        if extents is None or extents in by_extents:
            undecoded.append(entry)
        else:
            by_extents[extents] = entry
    out = []
    for st, ln in declared:
        entry = by_extents.pop((st, ln), None)
        if entry is None and undecoded:
            entry = undecoded.pop(0)
        if entry is not None:
            out.append((st, ln, entry))
    return tuple(out)


def parse_index(data: bytes) -> BundleIndex:
    """Parse the bytes of a ``.index`` file.

    Raises:
        MalformedError: The bytes are not a valid bundle index.
    """
    with paused_gc():  # an entry per variable, no reference cycles
        return _parse_index(data)


def _parse_index(data: bytes) -> BundleIndex:
    num_shards = None
    entries: list[IndexEntry] = []
    slices: dict[str, list] = collections.defaultdict(list)
    for raw_key, value in iter_table(data):
        if raw_key == b"":
            header = _protos.BundleHeaderProto()
            try:
                header.ParseFromString(value)
            except _protos.DecodeError:
                raise MalformedError("the header entry is not a BundleHeaderProto (a V1 checkpoint?)") from None
            num_shards = header.num_shards
            if header.endianness != 0:
                raise MalformedError("big-endian bundles are not supported")
            continue
        if raw_key[:1] == b"\x00":
            name = _decode_slice_key(raw_key)
            entry = _parse_entry(name, value, stored_slice=True)
            slices[name].append((_slice_extents(raw_key), entry))
            continue
        entries.append(_parse_entry(decode_key(raw_key), value))
    if num_shards is None:
        raise MalformedError("no header entry")
    if num_shards < 1 or num_shards > 1_000_000:
        raise MalformedError(f"header declares {num_shards} shards")
    for e in entries:
        if e.shard_id >= num_shards:
            raise MalformedError(f"entry {e.key!r} is in shard {e.shard_id} of {num_shards}")
    slice_map = {e.key: _pair_slices(e.slices, slices.get(e.key, [])) for e in entries if e.slices}
    return BundleIndex(num_shards=num_shards, entries=tuple(entries), slice_entries=slice_map)


def read_index(prefix: str) -> BundleIndex | CompactIndex:
    """Read and parse ``PREFIX.index``: a local index of at least
    :data:`~.compact.COMPACT_MIN_BYTES` into columns (:class:`~.compact.CompactIndex`, a block
    at a time) when :func:`~.compact.scan_index` takes it, else whole into a :class:`BundleIndex`.

    Raises:
        CheckpointNotFoundError: No index file.
        CorruptCheckpointError: The index does not parse.
        UnsafeFileError: The index is not a regular file, or larger than :data:`MAX_INDEX_BYTES`.
    """
    path = prefix + INDEX_SUFFIX
    if not _fs.is_remote(path):
        found = _read_compact(path)
        if found is not None:
            return found
    data = _fs.read_bytes(path, limit=MAX_INDEX_BYTES, what="checkpoint index")
    key = (path, hashlib.blake2b(data, digest_size=32).digest())
    with _LIVE_LOCK:
        found = _LIVE.get(key)
    if found is not None:
        return found
    try:
        index = parse_index(data)
    except MalformedError as e:
        raise CorruptCheckpointError(f"{path}: not a valid checkpoint index: {e}") from None
    with _LIVE_LOCK:
        _LIVE[key] = index
    return index


def _read_compact(path: str) -> CompactIndex | None:
    """A big local index read into columns, or None (small, or not of the shape the columns
    take: :func:`read_index` parses it whole; a file it may not read is refused there)."""
    from . import compact  # noqa: PLC0415 - only for big indexes

    try:
        size = _fs.check_regular(path)
    except CkptError:
        return None  # read_bytes says why
    if not compact.COMPACT_MIN_BYTES <= size <= MAX_INDEX_BYTES:
        return None
    try:
        reader = _fs.RangeReader(path)
    except CkptError:
        return None
    with reader:
        if reader.size != size:
            return None
        key = (path, compact.index_digest(reader), "columns")  # the same bytes give the same parse
        with _LIVE_LOCK:
            found = _LIVE.get(key)
        if found is not None:
            return found
        with paused_gc():
            index = compact.scan_index(reader, path)
    if index is not None:
        with _LIVE_LOCK:
            _LIVE[key] = index
    return index


# The indexes parsed and still held by someone (an open checkpoint's reader), by file and the
# digest of the bytes read: reading the same bytes of the same file again gives the same parse
# (``scan`` opens a checkpoint, then verify's check of it plans from its index without parsing
# it twice). Nothing is kept once no checkpoint holds it (the parsed index is immutable).
_LIVE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_LIVE_LOCK = threading.Lock()
