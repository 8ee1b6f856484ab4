"""TF bundle data files at the byte level: every raw read and every check of their bytes.

* Positioned reads of a tensor's stored bytes (whole for small tensors, in blocks for
  streaming), from a pool of open files and reused buffers (:class:`~._fs.DataFiles`).
* The decoder of one stored run into its value, as ``tf.train.load_checkpoint(...).get_tensor``
  returns it (:func:`read_value`): numeric and bool tensors (bfloat16, float8, int4 through
  ml_dtypes; quantized types as their plain integers), strings in ``WriteStringTensor``'s
  layout, each checked against the stored crc32c; variant tensors refused.
* The checksums TensorFlow records (tensorflow/core/util/tensor_bundle/tensor_bundle.cc,
  ``BundleWriter::Add``): ``BundleEntryProto.crc32c`` is the *masked* crc32c of

  - numeric and bool tensors: their raw bytes;
  - string tensors (``WriteStringTensor``): each element's length as a little-endian uint32
    (uint64 above 4 GiB), *not* the varint bytes on disk, then the 4-byte masked checksum of
    those lengths as stored, then the string bytes;
  - variant tensors (``WriteVariantTensor``): for each element, its length as a little-endian
    uint64, its bytes and its stored 4-byte checksum.

* The whole-checkpoint check behind ``verify``: shards present and long enough, every stored
  run of bytes (a tensor, or one slice of a sliced tensor) with the checksum the index records,
  streamed shard by shard in file order.

Nothing here imports TensorFlow or knows how the index is parsed: callers pass the parsed
entries (``formats._bundle_index``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import struct
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

from ... import model as m
from ... import _parallel
from ...errors import CheckpointNotFoundError, CkptError, CorruptCheckpointError
from .. import _fs
from .crc import buffer_crc32c, crc32c_module, mask, unmask
from .._layout import INDEX_SUFFIX, data_path
from .wire import MalformedError, read_varint

if TYPE_CHECKING:
    import numpy as np

    from .compact import CompactIndex
    from .index import BundleIndex, IndexEntry

__all__ = [
    "DTYPE_NAMES",
    "STORED_ITEMSIZE",
    "read_raw",
    "decode_string_scalar",
    "decode_string_tensor",
    "iter_raw_blocks",
    "value_dtype",
    "read_value",
    "tensor_crc32c",
    "RunCheck",
    "Ledger",
    "BundleCheck",
    "plan_check",
]

# tensorflow/core/framework/types.proto: DataType -> numpy-style name.
DTYPE_NAMES = {
    1: "float32", 2: "float64", 3: "int32", 4: "uint8", 5: "int16", 6: "int8", 7: "string",
    8: "complex64", 9: "int64", 10: "bool", 11: "qint8", 12: "quint8", 13: "qint32",
    14: "bfloat16", 15: "qint16", 16: "quint16", 17: "uint16", 18: "complex128",
    19: "float16", 20: "resource", 21: "variant", 22: "uint32", 23: "uint64",
    24: "float8_e5m2", 25: "float8_e4m3fn", 26: "float8_e4m3fnuz", 27: "float8_e4m3b11fnuz",
    28: "float8_e5m2fnuz", 29: "int4", 30: "uint4", 31: "int2", 32: "uint2", 33: "float4_e2m1fn",
}
VARIABLE_LENGTH_DTYPES = ("string", "variant")
# Bytes per element as a bundle stores them (TensorFlow's DataTypeSize): the model's table,
# plus the narrow types TensorFlow keeps one per byte. ``string`` and ``variant`` have no fixed
# size; ``resource`` handles are never stored values.
STORED_ITEMSIZE = {
    **m.ITEMSIZE,
    **dict.fromkeys(("float8_e4m3fnuz", "float8_e4m3b11fnuz", "float8_e5m2fnuz", "int4", "uint4", "int2",
                     "uint2", "float4_e2m1fn"), 1),
}
CHUNK_BYTES = 8 << 20  # bytes read (and checksummed) at a time when checking
# verify uses both cores: runs of bytes are checksummed by up to _parallel.WORKERS threads
# (CKPTINSPECT_WORKERS, as diff, scan and average; google-crc32c and reads release the GIL),
# in batches of about BATCH_BYTES.
BATCH_BYTES = 8 << 20
BATCH_ITEMS = 256  # and at most this many runs a batch (100,000 tiny tensors: few runs in flight at once)
# A batch reading less than this (what scan's reads left: a TF2 object graph) is checked in the
# calling thread: handing it to a thread costs more than reading it.
INLINE_BYTES = 64 << 10
_UINT32_MAX = 0xFFFFFFFF
READ_CHUNK_BYTES = 64 << 20  # bytes read (and checksummed) per positioned read of a whole value
# What TensorFlow's reader returns for the dtypes numpy and the model's table do not name:
# quantized types as their plain integers, the narrow types as ml_dtypes' (one per byte).
_VALUE_AS = {"qint8": "int8", "quint8": "uint8", "qint16": "int16", "quint16": "uint16", "qint32": "int32"}
_ML_DTYPES_ONLY = frozenset({"float8_e4m3fnuz", "float8_e4m3b11fnuz", "float8_e5m2fnuz", "int4", "uint4", "int2",
                             "uint2", "float4_e2m1fn"})


# -- positioned reads ---------------------------------------------------------------------
def read_raw(prefix: str, num_shards: int, entry: IndexEntry, limit: int | None = None) -> bytes:
    """The stored bytes of one (small) entry, whole.

    The shard's size is checked before anything is read, so an entry declaring a huge size
    or offset costs nothing.

    Args:
        prefix: The checkpoint prefix.
        num_shards: Its number of data shards.
        entry: The index entry.
        limit: Refuse entries larger than this many bytes.

    Raises:
        CheckpointNotFoundError: Its data shard is missing.
        UnsafeFileError: The shard is not a regular file.
        CorruptCheckpointError: The shard ends before the entry does, or the entry is larger
            than ``limit``.
    """
    path = data_path(prefix, entry.shard_id, num_shards)
    if not _fs.exists(path):
        raise CheckpointNotFoundError(f"{path}: data shard is missing (named by {prefix}{INDEX_SUFFIX})")
    if limit is not None and entry.size > limit:
        raise CorruptCheckpointError(
            f"{path}: {entry.key!r} declares {entry.size} bytes, more than the {limit} this entry may take"
        )
    size = _fs.check_regular(path)  # a FIFO or device is refused, not read as 0 bytes
    if entry.offset + entry.size > size:
        raise CorruptCheckpointError(
            f"{path}: truncated: {entry.key!r} needs bytes {entry.offset}..{entry.offset + entry.size},"
            f" the file has {size}"
        )
    raw = _fs.read_range(path, entry.offset, entry.size)
    if len(raw) != entry.size:
        raise CorruptCheckpointError(
            f"{path}: truncated: {entry.key!r} needs bytes {entry.offset}..{entry.offset + entry.size},"
            f" the file has {_fs.getsize(path)}"
        )
    return raw


def decode_string_scalar(raw: bytes) -> bytes:
    """The value of a scalar string tensor as stored in a bundle (varint length, crc, bytes)."""
    length, pos = read_varint(raw, 0)
    pos += 4  # masked crc32c of the lengths
    if pos + length > len(raw):
        raise MalformedError("string tensor shorter than its declared length")
    return raw[pos : pos + length]


def decode_string_tensor(raw: bytes, count: int) -> list[bytes]:
    """The ``count`` elements of a string tensor as stored in a bundle (varint64 lengths, their
    masked crc32c, the bytes; check it first with :func:`tensor_crc32c`).

    Raises:
        MalformedError: The lengths run past the bytes.
    """
    lengths = []
    pos = 0
    for _ in range(count):
        length, pos = read_varint(raw, pos)
        lengths.append(length)
    pos += 4  # masked crc32c of the lengths
    if pos + sum(lengths) > len(raw):
        raise MalformedError(f"string tensor of {count} elements shorter than its declared lengths")
    out = []
    for length in lengths:
        out.append(raw[pos : pos + length])
        pos += length
    return out


def crc_mismatch(stored: int, actual: int) -> str:
    """One line for a checksum mismatch: the plain crc32c of the bytes (what a crc32c tool
    prints) and TensorFlow's stored (masked) form of both."""
    return (
        f"checksum does not match: the bytes have crc32c {unmask(actual):#010x}, the index records "
        f"{unmask(stored):#010x} (stored masked as TensorFlow does: {actual:#010x} vs {stored:#010x})"
    )


_BUFFER_EXTEND: list = []  # buffer_crc32c(), resolved once (a run of 100 KB paid a lock and a closure)


def _buffer_extend() -> Any:
    if not _BUFFER_EXTEND:
        _BUFFER_EXTEND.append(buffer_crc32c())
    return _BUFFER_EXTEND[0]


class RunCheck:
    """The check of one stored run of raw bytes (a numeric or bool tensor, or one stored slice)
    against the masked crc32c the index records, fed its bytes as they are read, in order.

    The one definition of that check: ``verify``'s pass (:class:`BundleCheck`) and every read
    of values (:func:`iter_raw_blocks`, :func:`read_value`) feed it the bytes they read, and
    take its :meth:`verdict`.

    Args:
        offset: Where the run starts in its file.
        size: Its length in bytes.
        stored: The masked crc32c the index records (None: proto3 omitted a zero).
    """

    __slots__ = ("offset", "size", "stored", "crc", "got", "_extend")

    def __init__(self, offset: int, size: int, stored: int | None):
        self.offset = offset
        self.size = size
        self.stored = stored or 0  # proto3 omits a zero field
        self.crc = 0
        self.got = 0
        self._extend: Any = None

    def update(self, data: bytes | bytearray, nbytes: int | None = None, start: int = 0) -> None:
        """Add the next bytes: ``data`` whole (``bytes``), or ``nbytes`` of a ``bytearray``
        from ``start`` (checksummed without the GIL)."""
        if nbytes is None:
            self.crc = crc32c_module().extend(self.crc, data)
            self.got += len(data)
            return
        if self._extend is None:
            self._extend = _BUFFER_EXTEND[0] if _BUFFER_EXTEND else _buffer_extend()
        self.crc = self._extend(self.crc, data, nbytes, start)
        self.got += nbytes

    def verdict(self) -> tuple[str, str, int | None] | None:
        """None when the run was read whole and its checksum matches; else (damage kind,
        problem, the computed masked crc32c or None)."""
        if self.got < self.size:
            return (m.DAMAGE_TRUNCATED, f"needs bytes {self.offset}..{self.offset + self.size}, only {self.got} could be read",
                    None)
        actual = mask(self.crc)
        if actual != self.stored:
            return m.DAMAGE_CHECKSUM, crc_mismatch(self.stored, actual), actual
        return None


class Ledger:
    """The verdicts of the runs a checkpoint's reader streamed whole for ``scan``
    (:func:`~.bundle.stream_blocks` through :func:`iter_raw_blocks`),
    kept so that ``verify``'s check of the same checkpoint (:meth:`BundleCheck.run` with
    ``seen``) takes them instead of reading those bytes again: ``scan`` reads every value once
    and its verify verdict comes from those reads.

    A verdict is keyed by the file, the file's size when read, the run's offset, length and
    stored checksum: the check uses it only for exactly that run of exactly that file. Safe
    from several threads (one dict item set per run).
    """

    def __init__(self) -> None:
        self._verdicts: dict[tuple[str, int | None, int, int, int], tuple[str, str, int | None] | None] = {}

    def record(self, path: str, file_size: int | None, run: RunCheck) -> None:
        self._verdicts[(path, file_size, run.offset, run.size, run.stored)] = run.verdict()

    def get(self, path: str, file_size: int | None, offset: int, size: int, stored: int | None) -> tuple[bool, Any]:
        """(known, verdict) of a run."""
        key = (path, file_size, offset, size, stored or 0)
        if key in self._verdicts:
            return True, self._verdicts[key]
        return False, None


def iter_raw_blocks(
    path: str, entry: IndexEntry, dtype: np.dtype, block_elements: int, files: _fs.DataFiles,
    ledger: Ledger | None = None,
) -> Iterator[np.ndarray]:
    """Blocks of ``block_elements`` elements of a tensor, read straight from its data file.

    Each block is a view of one pooled buffer that the next block overwrites: use it (or copy
    it) before asking for the next. Several of these may run at once in several threads on the
    same ``files`` (local files). The bytes go through the run's :class:`RunCheck`; read whole,
    its verdict is recorded in ``ledger`` (when given).

    Raises:
        CorruptCheckpointError: The file ends early, or the bytes do not match the stored
            crc32c (raised after the last block).
    """
    import numpy as np  # noqa: PLC0415 - numpy only where values are read (`ls` lists without it)

    total = entry.size // dtype.itemsize
    run = RunCheck(entry.offset, entry.size, entry.crc32c)
    done = 0
    offset = entry.offset
    buf = files.take_buffer(max(1, min(block_elements, total)) * dtype.itemsize)
    try:
        view = memoryview(buf)
        while done < total:
            n = min(block_elements, total - done)
            nbytes = n * dtype.itemsize
            got = files.pread_into(path, view[:nbytes], offset)
            if got != nbytes:
                raise CorruptCheckpointError(f"{path}: truncated: {entry.key!r} ends past the end of the file")
            run.update(buf, nbytes)  # releases the GIL: two threads may stream tensors at once
            done += n
            offset += nbytes
            yield np.frombuffer(buf, dtype=dtype, count=n)
    finally:
        files.give_buffer(buf)
    if ledger is not None:
        ledger.record(path, files.size(path), run)
    found = run.verdict()
    if found is not None:
        raise CorruptCheckpointError(f"{path}: {entry.key!r}: {found[1]}")


# -- whole values ----------------------------------------------------------------------------
def value_dtype(dtype: str) -> np.dtype | None:
    """The numpy dtype of a stored fixed-size dtype, as TensorFlow's reader returns it; None for
    strings, variants and names it does not know."""
    found = m.numpy_dtype(_VALUE_AS.get(dtype, dtype))
    if found is None and dtype in _ML_DTYPES_ONLY:
        import numpy as np  # noqa: PLC0415

        try:
            import ml_dtypes  # noqa: PLC0415 - a core dependency; loaded only for these dtypes

            return np.dtype(getattr(ml_dtypes, dtype))
        except (ImportError, AttributeError):  # pragma: no cover - an ml_dtypes without the type
            return None
    return found


def truncated(path: str, entry: IndexEntry, size: int) -> CorruptCheckpointError:
    """The error of a run of bytes that lies past the end of its file."""
    return CorruptCheckpointError(
        f"{path}: truncated: {entry.key!r} needs bytes {entry.offset}..{entry.offset + entry.size}, the file has {size}"
    )


def read_value(path: str, entry: IndexEntry, count: int, files: _fs.DataFiles) -> np.ndarray:
    """One stored run of bytes (a whole tensor, or one stored slice) decoded into its flat
    value of ``count`` elements, checked against the crc32c the index records.

    Numeric and bool values are read straight into the array returned (positioned reads of
    :data:`READ_CHUNK_BYTES`, checksummed as they arrive); strings come as an object array of
    ``bytes`` (trailing NUL bytes kept), as TensorFlow's reader gives them.

    Args:
        path: The data file.
        entry: Its index entry (the file is known to hold ``entry.offset + entry.size`` bytes).
        count: The number of elements (the product of ``entry.shape``).
        files: The open data files.

    Raises:
        CorruptCheckpointError: The file ends early, the bytes do not match the stored checksum
            or layout, or the entry is a variant tensor (no numpy value).
    """
    import numpy as np  # noqa: PLC0415 - numpy only where values are read

    if entry.dtype == "variant":
        raise CorruptCheckpointError(
            f"{path}: cannot read {entry.key!r}: a variant tensor (TensorFlow objects serialized, such as a"
            " tf.data iterator's state) has no numpy value"
        )
    if entry.dtype == "string":
        raw = bytes(_read_whole(path, entry, files))
        try:
            actual = tensor_crc32c("string", entry.shape, raw)
            if entry.crc32c is not None and actual != entry.crc32c:
                raise CorruptCheckpointError(f"{path}: {entry.key!r}: {crc_mismatch(entry.crc32c, actual)}")
            out = np.empty(count, dtype=object)
            out[:] = decode_string_tensor(raw, count) if count else []
        except MalformedError as e:
            raise CorruptCheckpointError(f"{path}: cannot read {entry.key!r}: {e}") from None
        return out
    dtype = value_dtype(entry.dtype)
    if dtype is None or entry.size != count * dtype.itemsize:
        raise CorruptCheckpointError(
            f"{path}: cannot read {entry.key!r}: {entry.size} bytes of dtype {entry.dtype} for {count} elements")
    return np.frombuffer(_read_whole(path, entry, files, check=True), dtype=dtype)


def _read_whole(path: str, entry: IndexEntry, files: _fs.DataFiles, check: bool = False) -> bytearray:
    """The ``entry.size`` bytes of a run, in a fresh buffer; with ``check``, compared with the
    stored crc32c (as raw bytes: numeric and bool tensors)."""
    buf = bytearray(entry.size)
    view = memoryview(buf)
    run = RunCheck(entry.offset, entry.size, entry.crc32c)
    done = 0
    while done < entry.size:
        n = min(READ_CHUNK_BYTES, entry.size - done)
        got = files.pread_into(path, view[done : done + n], entry.offset + done)
        if got <= 0:
            raise truncated(path, entry, entry.offset + done)
        if check:
            run.update(buf, got, done)  # releases the GIL: other threads read meanwhile
        done += got
    if check:
        found = run.verdict()
        if found is not None:
            raise CorruptCheckpointError(f"{path}: {entry.key!r}: {found[1]}")
    return buf


# -- checksums ---------------------------------------------------------------------------
def tensor_crc32c(dtype: str, shape: tuple[int, ...], raw: bytes) -> int:
    """The masked crc32c TensorFlow records for a tensor stored as ``raw`` (whole in memory).

    Args:
        dtype: Numpy-style dtype name (``string`` and ``variant`` have their own layouts).
        shape: The stored shape (the slice's shape for a stored slice).
        raw: The stored bytes.

    Returns:
        The masked crc32c.

    Raises:
        MalformedError: A string or variant layout that does not decode.
    """
    crc32c = crc32c_module()
    count = 1
    for d in shape:
        count *= d
    if dtype == "string":
        return mask(_string_crc(raw, count, crc32c))
    if dtype == "variant":
        return mask(_variant_crc(raw, count, crc32c))
    return mask(crc32c.value(raw))


def _string_crc(raw: bytes, count: int, crc32c: Any) -> int:
    lengths = []
    pos = 0
    for _ in range(count):
        length, pos = read_varint(raw, pos)
        lengths.append(length)
    if pos + 4 > len(raw):
        raise MalformedError(f"string tensor of {count} elements: {len(raw)} bytes cannot hold its length checksum")
    if all(n <= _UINT32_MAX for n in lengths):
        packed = struct.pack(f"<{count}I", *lengths)
    else:
        packed = b"".join(struct.pack("<I" if n <= _UINT32_MAX else "<Q", n) for n in lengths)
    crc = crc32c.value(packed)
    stored_lengths_crc = struct.unpack_from("<I", raw, pos)[0]
    if mask(crc) != stored_lengths_crc:
        raise MalformedError("string tensor: the checksum of its element lengths does not match")
    crc = crc32c.extend(crc, raw[pos : pos + 4])
    body = raw[pos + 4 :]
    if len(body) != sum(lengths):
        raise MalformedError(
            f"string tensor: element lengths add up to {sum(lengths)} bytes, {len(body)} are stored"
        )
    return crc32c.extend(crc, body)


def _variant_crc(raw: bytes, count: int, crc32c: Any) -> int:
    crc = 0
    pos = 0
    for i in range(count):
        length, pos = read_varint(raw, pos)
        if pos + length + 4 > len(raw):
            raise MalformedError(f"variant tensor: element {i} runs past the stored bytes")
        crc = crc32c.extend(crc, struct.pack("<Q", length))
        crc = crc32c.extend(crc, raw[pos : pos + length])
        pos += length
        if mask(crc) != struct.unpack_from("<I", raw, pos)[0]:
            raise MalformedError(f"variant tensor: the checksum of element {i} does not match")
        crc = crc32c.extend(crc, raw[pos : pos + 4])
        pos += 4
    if pos != len(raw):
        raise MalformedError(f"variant tensor: {len(raw) - pos} bytes after its {count} elements")
    return crc


# -- the whole-checkpoint check ------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Item:
    """One stored run of bytes to check: a tensor, or one stored slice of a sliced tensor."""

    key: str
    name: str
    dtype: str
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc32c: int | None
    slice: str | None = None


def fmt_slice(starts: tuple[int, ...], lengths: tuple[int, ...]) -> str:
    parts = [":" if ln < 0 else f"{st}:{st + ln}" for st, ln in zip(starts, lengths)]
    return "[" + ",".join(parts) + "]"


class _ColumnItems(Sequence[_Item]):
    """The byte runs of a compact index (:class:`~.compact.CompactIndex`) to check, in file order,
    each :class:`_Item` made when reached: the rows TensorFlow can read, sorted by shard, offset
    and key (an int64 array of rows, no object per run)."""

    def __init__(self, index: CompactIndex, names: Mapping[str, str]):
        import numpy as np  # noqa: PLC0415 - the columns

        self._index, self._names = index, names
        rows = np.flatnonzero(index.problem_codes == 0)  # the others are reported by the index parser
        if len(index.shard_numbers) <= 1:  # one shard: in file order already when the offsets never fall
            offsets = index.offsets[rows]
            ordered = bool((offsets[1:] >= offsets[:-1]).all())
            del offsets
            if ordered:  # ties: rows rise with keys, as the sort below leaves them
                self._rows = rows
                return
        shards = np.asarray(index.shard_numbers, np.int64)[index.shard_codes[rows]] if len(rows) else rows
        self._rows = rows[np.lexsort((rows, index.offsets[rows], shards))]  # rows rise with keys

    def __len__(self) -> int:
        return len(self._rows)

    def _item(self, r: int) -> _Item:
        index = self._index
        key = index.key_of(r)
        return _Item(key, self._names.get(key, key), index.dtype_of(r), index.shape_of(r),
                     index.shard_numbers[index.shard_codes[r]], int(index.offsets[r]), int(index.sizes[r]),
                     index.crc_of(r))

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._item(int(r)) for r in self._rows[i]]
        return self._item(int(self._rows[i]))

    def __iter__(self) -> Iterator[_Item]:
        for start in range(0, len(self._rows), _ROWS_AT_A_TIME):
            yield from map(self._item, self._rows[start:start + _ROWS_AT_A_TIME].tolist())

    def ends_by_shard(self) -> dict[int, int]:
        """Each shard's end of its last run (what :func:`plan_check` needs of every item)."""
        import numpy as np  # noqa: PLC0415

        index, rows = self._index, self._rows
        top = np.full(len(index.shard_numbers), -1, np.int64)
        for start in range(0, len(rows), _ROWS_AT_A_TIME):  # a block of rows at a time
            chosen = rows[start:start + _ROWS_AT_A_TIME]
            np.maximum.at(top, index.shard_codes[chosen], index.offsets[chosen] + index.sizes[chosen])
        return {index.shard_numbers[c]: int(top[c]) for c in np.flatnonzero(top >= 0).tolist()}


_ROWS_AT_A_TIME = 4096


def _items(prefix: str, index: BundleIndex | CompactIndex, names: Mapping[str, str]
           ) -> tuple[Sequence[_Item], list[m.Damage]]:
    """The byte runs to check, in file order, and slices declared but not stored."""
    from .compact import CompactIndex  # noqa: PLC0415 - compact reads the dtype names here

    if isinstance(index, CompactIndex):  # no slices
        return _ColumnItems(index, names), []
    items: list[_Item] = []
    missing: list[m.Damage] = []
    for e in index.entries:
        name = names.get(e.key, e.key)
        if e.problem is not None:
            continue  # reported by the index parser (extra_damage), never read
        if not e.slices:
            items.append(_Item(e.key, name, e.dtype, e.shape, e.shard_id, e.offset, e.size, e.crc32c))
            continue
        stored = index.slice_entries.get(e.key, ())
        for starts, lengths, se in stored:
            if se.problem is not None:
                continue
            items.append(
                _Item(e.key, name, se.dtype, se.shape, se.shard_id, se.offset, se.size, se.crc32c,
                      slice=fmt_slice(starts, lengths))
            )
        if len(stored) < len(e.slices):
            missing.append(m.Damage(
                key=e.key, name=name, file=prefix + INDEX_SUFFIX, kind=m.DAMAGE_MISSING_SLICE,
                problem=f"declares {len(e.slices)} slices, the index holds {len(stored)}",
            ))
    items.sort(key=lambda it: (it.shard, it.offset, it.key))
    return items, missing


def expected_nbytes(dtype: str, shape: tuple[int, ...]) -> int | None:
    """Bytes a tensor of a fixed-size dtype takes in a bundle; None for other dtypes."""
    itemsize = STORED_ITEMSIZE.get(dtype)
    if itemsize is None:
        return None
    for d in shape:
        itemsize *= d
    return itemsize


def _read_exact(f: Any, size: int) -> Iterator[bytes]:
    """``size`` bytes from the current position, in chunks; stops early at end of file."""
    left = size
    while left > 0:
        chunk = f.read(min(CHUNK_BYTES, left))
        if not chunk:
            return
        left -= len(chunk)
        yield chunk


def _size_damage(item: _Item) -> tuple[str, str, None] | None:
    """The damage of an item whose recorded size is not its fixed-size dtype's times its shape
    (found before any byte is read, or taken from a reader's ledger), else None."""
    expected = expected_nbytes(item.dtype, item.shape)
    if item.dtype not in VARIABLE_LENGTH_DTYPES and expected is not None and expected != item.size:
        return (m.DAMAGE_SIZE, f"the index records {item.size} bytes, a {item.dtype} tensor of shape "
                f"{list(item.shape)} takes {expected}", None)
    return None


def _check_item(f: Any, item: _Item) -> tuple[str, str, int | None] | None:
    """Stream one item's bytes from the open shard ``f`` and compare checksums (a run of raw
    bytes through its :class:`RunCheck`).

    Returns:
        None when intact, else (damage kind, problem, computed masked crc or None).
    """
    sized = _size_damage(item)
    if sized is not None:
        return sized
    f.seek(item.offset)
    if item.dtype in VARIABLE_LENGTH_DTYPES:
        stored = item.crc32c if item.crc32c is not None else 0  # proto3 omits a zero field
        raw = b"".join(_read_exact(f, item.size))
        got = len(raw)
        if got < item.size:
            return m.DAMAGE_TRUNCATED, f"needs bytes {item.offset}..{item.offset + item.size}, only {got} could be read", None
        try:
            actual = tensor_crc32c(item.dtype, item.shape, raw)
        except MalformedError as e:
            return m.DAMAGE_LAYOUT, f"{item.dtype} tensor does not decode: {e}", None
        if actual != stored:
            return m.DAMAGE_CHECKSUM, crc_mismatch(stored, actual), actual
        return None
    run = RunCheck(item.offset, item.size, item.crc32c)
    for chunk in _read_exact(f, item.size):
        run.update(chunk)
    return run.verdict()


def _open_binary(path: str) -> Any:
    return _fs.open_binary(path)  # regular files only: a FIFO shard must not block the check


@dataclasses.dataclass
class BundleCheck:
    """A planned check of one bundle: the index parsed and the shards stat'ed, no tensor
    bytes read yet. ``total`` tensors will be checked by :meth:`run`.

    Attributes:
        path: The prefix.
        format: ``tf-bundle`` or ``tf-savedmodel``.
        step: The checkpoint's step, or None.
        total: Stored runs of bytes to check.
    """

    path: str
    format: str
    step: int | None
    num_shards: int = 0
    items: Sequence[_Item] = dataclasses.field(default_factory=list)
    damaged: list[m.Damage] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)
    sizes: dict[int, int | None] = dataclasses.field(default_factory=dict)
    result: m.CheckResult | None = None

    @property
    def total(self) -> int:
        return len(self.items)

    def run(self, progress: m.Progress | None = None, done: int = 0, total: int | None = None,
            seen: m.Checkpoint | None = None) -> m.CheckResult:
        """Check every item, in file order; local shards are checksummed by up to
        ``_parallel.WORKERS`` threads (``CKPTINSPECT_WORKERS``), a batch of about
        ``BATCH_BYTES`` each, at most one batch more than workers in flight. Results (and progress calls) come in file
        order whatever the number of workers.

        Args:
            progress: Called as ``progress(done, total, item)`` after each item.
            done: Items already checked by the caller (a directory's earlier checkpoints).
            total: The caller's total (default: this check's).
            seen: The same checkpoint, opened, whose values the caller has read (``scan``):
                the runs its reader streamed whole are not read again, their :class:`RunCheck`
                verdicts are taken from its :class:`Ledger` (the same file, size, offset,
                length and stored checksum); every other run is read here.

        Returns:
            The result; damage is reported in it, not raised.
        """
        if self.result is not None:
            return self.result
        total = self.total if total is None else total
        damaged = list(self.damaged)
        handles: dict[int, Any] = {}
        workers = _parallel.WORKERS
        parallel = workers > 1 and not _fs.is_remote(self.path)
        ledger = getattr(getattr(seen, "source", None), "ledger", None)

        def check(work: list[tuple[_Item, str, Any, Any]]) -> list[tuple[_Item, str, tuple[str, str, int | None] | None]]:
            return [(it, path, pre if f is None else _checked(f, it)) for it, path, pre, f in work]

        batches = self._batches(handles, parallel, ledger if isinstance(ledger, Ledger) else None)
        # a batch with (almost) nothing left to read (verdicts known from scan's reads, or damage) is
        # no work for a thread
        results = _parallel.ordered_map(check, batches, workers=workers if parallel else 1, ahead=workers + 1,
                                        inline=_little_to_read)
        try:
            with contextlib.closing(results):  # the threads are done before the shards close
                for checked in results:
                    for it, path, found in checked:
                        if found is not None:
                            damaged.append(_damage(it, path, found))
                        done += 1
                        if progress is not None:
                            progress(done, total, it)
        finally:
            for f in handles.values():
                f.close()
        nbytes = sum(it.size for it in self.items if self._known_damage(it) is None)
        status = m.STATUS_DAMAGED if damaged or self.problems else m.STATUS_INTACT
        return m.CheckResult(
            self.path, self.format, status, step=self.step, tensors=len(self.items),
            nbytes=nbytes, problems=tuple(self.problems), damaged=tuple(damaged),
        )

    def _known_damage(self, it: _Item) -> tuple[str, str, None] | None:
        """The damage an item has whatever its bytes hold: its shard is missing, or it lies
        past the shard's end; None when its bytes are there to check."""
        size = self.sizes.get(it.shard)
        if size is None:
            return m.DAMAGE_MISSING_SHARD, "its data shard is missing", None
        if it.offset + it.size > size:
            return m.DAMAGE_TRUNCATED, f"needs bytes {it.offset}..{it.offset + it.size}, the shard has {size}", None
        return None

    def _batches(self, handles: dict[int, Any], parallel: bool,
                 ledger: Ledger | None = None) -> Iterator[list[tuple[_Item, str, Any, Any]]]:
        """Items in file order, in batches of about BATCH_BYTES (one item a batch when not
        parallel), each with its verdict known up front (its damage whatever its bytes hold,
        or a reader's verdict from ``ledger``) or the file to check it in; the shards are
        opened here, in the calling thread, into ``handles`` (shard -> file)."""
        batch: list[tuple[_Item, str, Any, Any]] = []
        batch_bytes = 0
        for it in self.items:
            path = data_path(self.path, it.shard, self.num_shards)
            known = self._known_damage(it) or _size_damage(it)
            found = False
            if known is None and ledger is not None and it.dtype not in VARIABLE_LENGTH_DTYPES:
                found, known = ledger.get(path, self.sizes.get(it.shard), it.offset, it.size, it.crc32c)
            if known is not None or found:
                batch.append((it, path, known, None))
            else:
                f = handles.get(it.shard)
                if f is None:
                    f = handles[it.shard] = _open_shard(path)
                batch.append((it, path, None, _Positioned(f.fileno()) if parallel else f))
                batch_bytes += it.size
            if batch_bytes >= BATCH_BYTES or len(batch) >= BATCH_ITEMS or not parallel:
                yield batch
                batch, batch_bytes = [], 0
        if batch:
            yield batch


def _little_to_read(work: list[tuple[_Item, str, Any, Any]]) -> bool:
    """Whether a batch reads under :data:`INLINE_BYTES` (checked in the calling thread)."""
    return sum(it.size for it, _, _, f in work if f is not None) < INLINE_BYTES


def _open_shard(path: str) -> Any:
    """A data shard opened for checking; a shard that cannot be opened ends the check."""
    try:
        return _open_binary(path)
    except CkptError:
        raise
    except PermissionError:
        raise CheckpointNotFoundError(f"{path}: permission denied") from None
    except OSError as e:
        raise CheckpointNotFoundError(f"{path}: cannot open the data shard: {e.strerror or e}") from None


def _damage(it: _Item, path: str, found: tuple[str, str, int | None]) -> m.Damage:
    """The damage entry of an item whose check found (kind, problem, actual crc32c)."""
    kind, problem, actual = found
    return m.Damage(
        key=it.key, name=it.name, file=path, kind=kind, problem=problem, shard=it.shard,
        offset=it.offset, size=it.size, slice=it.slice,
        stored_crc32c=it.crc32c if it.crc32c is not None else 0, actual_crc32c=actual,
    )


class _Positioned:
    """``seek``/``read`` over a file descriptor with positioned reads: each thread checking a
    batch has its own position, the descriptor is shared."""

    def __init__(self, fd: int):
        self._fd = fd
        self._pos = 0

    def seek(self, pos: int) -> None:
        self._pos = pos

    def read(self, size: int) -> bytes:
        data = os.pread(self._fd, size, self._pos)
        self._pos += len(data)
        return data


def _checked(f: Any, item: _Item) -> tuple[str, str, int | None] | None:
    """:func:`_check_item`, a read error being that item's damage."""
    try:
        return _check_item(f, item)
    except OSError as e:
        return m.DAMAGE_UNREADABLE, f"read error: {e.strerror or e}", None


def plan_check(
    prefix: str, index: BundleIndex | CompactIndex, names: Mapping[str, str], *, format: str,  # noqa: A002
    step: int | None,
    extra_damage: Sequence[m.Damage] = (),
) -> BundleCheck:
    """Stat the shards and list the runs of bytes to check (no tensor bytes read).

    Args:
        prefix: The checkpoint prefix.
        index: Its parsed index.
        names: Readable names by key (best effort: the object graph may be what is damaged).
        format: The format to report.
        step: The step to report.
        extra_damage: Entries the index parser already found damaged (bad dtype, size...).

    Raises:
        CheckpointNotFoundError: A data shard exists but cannot be stat'ed.
    """
    items, damaged = _items(prefix, index, names)
    problems: list[str] = []
    sizes: dict[int, int | None] = {}
    for shard in range(index.num_shards):
        path = data_path(prefix, shard, index.num_shards)
        try:
            sizes[shard] = _fs.check_regular(path)  # a FIFO or device shard is refused, not read
        except CheckpointNotFoundError:
            sizes[shard] = None
            if _fs.exists(path):
                raise CheckpointNotFoundError(f"{path}: data shard cannot be read") from None
            problems.append(f"{path}: data shard is missing (named by {prefix}{INDEX_SUFFIX})")
    need: dict[int, int] = {}
    if isinstance(items, _ColumnItems):
        need = items.ends_by_shard()
    else:
        for it in items:
            need[it.shard] = max(need.get(it.shard, 0), it.offset + it.size)
    for shard, end in sorted(need.items()):
        size = sizes.get(shard)
        if size is not None and size < end:
            problems.append(
                f"{data_path(prefix, shard, index.num_shards)}: truncated: {size} bytes, the index needs {end}"
            )
    return BundleCheck(prefix, format, step, index.num_shards, items, [*extra_damage, *damaged], problems, sizes)


def damaged_check(path: str, format: str | None, step: int | None, problem: str) -> BundleCheck:  # noqa: A002
    """A check whose result is already known: the index itself is damaged."""
    return BundleCheck(path, format or m.FORMAT_TF_BUNDLE, step,
                       result=m.CheckResult(path, format, m.STATUS_DAMAGED, step=step, problems=(problem,)))


def shard_files(prefix: str, num_shards: int) -> Iterable[str]:
    """The data files of a bundle, in shard order."""
    return (data_path(prefix, shard, num_shards) for shard in range(num_shards))
