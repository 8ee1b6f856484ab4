"""A giant ``.index`` read into columns (:class:`CompactIndex`), without an object per entry.

An index of 100,000 variables parsed by :func:`~.index.parse_index` costs a protobuf message,
an :class:`~.index.IndexEntry` and its tuples per entry (about 1 KB each), and the whole file's
bytes besides. The writers' indexes have one shape: a header under the empty key, then one
``BundleEntryProto`` per tensor, each field at most once (dtype=1, shape=2, shard_id=3,
offset=4, size=5, crc32c=6), shapes of plain ``dim { size }`` records. :func:`scan_index` reads
exactly that shape, a block of the table at a time (each block's checksum checked as
:func:`~.sstable.iter_table` checks it), straight into columns: the keys packed in one buffer
with end offsets, codes for dtypes, shapes and shards, int64 arrays for offsets and sizes, the
stored crc32c, and a code for each entry's problem, given by :func:`~.index.entry_problem`
itself (the one rule; once per distinct dtype, shape and size).

Whatever it cannot take strictly gives None, and the caller parses the bytes with
:func:`~.index.parse_index` as before (the same result, or the same error message): slices
(a sliced tensor, or a stored slice's key), a field it does not know or meets twice, a wire
type other than the field's, a negative or out-of-range number, an unknown-rank shape or a
named dimension, keys out of order or not UTF-8, a header other than little-endian with a
sane shard count, a block that does not decode or check, a size shape x dtype overflowing
int64.
"""

from __future__ import annotations

import array
import hashlib
import io
from typing import TYPE_CHECKING, Any, Iterator

from ... import model as m
from .._layout import decode_key, encode_key
from .data import DTYPE_NAMES
from .index import OBJECT_GRAPH_KEY, IndexEntry, entry_problem, fits_tensorflow
from .sstable import TableSource, block_limit, iter_data_blocks
from .wire import MalformedError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["CompactIndex", "scan_index", "COMPACT_MIN_BYTES", "index_digest"]

COMPACT_MIN_BYTES = 1 << 20  # smaller indexes are parsed into entries: the columns pay off on big ones
DIGEST_CHUNK_BYTES = 1 << 20
_MAX_SHARDS = 1_000_000  # as parse_index
_INT32_LIMIT = 1 << 31
_INT64_LIMIT = 1 << 63
_NO_CRC = -1
_RECENT_ENTRIES = 4096
_NBYTES_ROWS = 1 << 12  # rows whose (dtype, shape) pairs variable_nbytes looks up at a time

# BundleEntryProto tags (field << 3 | wire type) and the bit each sets in ``seen``.
_TAG_DTYPE, _TAG_SHAPE, _TAG_SHARD, _TAG_OFFSET, _TAG_SIZE, _TAG_CRC = 0x08, 0x12, 0x18, 0x20, 0x28, 0x35
# BundleHeaderProto: num_shards=1, endianness=2 (varints), version=3 (a message).
_HEADER_TAGS = {0x08: 1, 0x10: 2, 0x1A: 3}


class _NotCompact(Exception):
    """Not the shape read here: parse_index reads it (and gives the same result or error)."""


def index_digest(read: TableSource) -> bytes:
    """The blake2b digest :func:`~.index.read_index` keys its parses by, read a chunk at a time."""
    h = hashlib.blake2b(digest_size=32)
    at = 0
    while at < read.size:
        chunk = read.read_at(at, DIGEST_CHUNK_BYTES)
        if not chunk:
            break
        h.update(chunk)
        at += len(chunk)
    return h.digest()


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """A varint below 2**63 within ``buf[:end]`` (anything else is not taken)."""
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise _NotCompact
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            if result >= _INT64_LIMIT:
                raise _NotCompact
            return result, pos
        shift += 7
        if shift > 56:
            raise _NotCompact


def _shape(buf: bytes) -> tuple[int, ...]:
    """A ``TensorShapeProto`` of plain ``dim { size: N }`` records (an absent size: 0)."""
    dims = []
    pos, end = 0, len(buf)
    while pos < end:
        if buf[pos] != 0x12:  # dim; unknown_rank or any other field is not taken
            raise _NotCompact
        length, pos = _varint(buf, pos + 1, end)
        stop = pos + length
        if stop > end:
            raise _NotCompact
        size = 0
        if pos < stop:
            if buf[pos] != 0x08:  # size only (a named dimension is not taken)
                raise _NotCompact
            size, pos = _varint(buf, pos + 1, stop)
            if pos != stop:
                raise _NotCompact
        dims.append(size)
    return tuple(dims)


def _header(value: bytes) -> int:
    """The shard count of a little-endian ``BundleHeaderProto``."""
    seen = 0
    num_shards = endianness = 0
    pos, end = 0, len(value)
    while pos < end:
        tag = value[pos]
        bit = _HEADER_TAGS.get(tag)
        if bit is None or seen & (1 << bit):
            raise _NotCompact
        seen |= 1 << bit
        if tag == 0x1A:
            length, pos = _varint(value, pos + 1, end)
            pos += length
            if pos > end:
                raise _NotCompact
            continue
        number, pos = _varint(value, pos + 1, end)
        if number >= _INT32_LIMIT:
            raise _NotCompact
        if tag == 0x08:
            num_shards = number
        else:
            endianness = number
    if endianness != 0 or not 1 <= num_shards <= _MAX_SHARDS:
        raise _NotCompact
    return num_shards


class _Columns:
    """The columns as they grow, a block at a time (arrays and one buffer: no object per entry)."""

    def __init__(self) -> None:
        self.keys = io.BytesIO()  # getvalue() hands over its buffer: the keys are never held twice
        self.key_ends = array.array("q")
        self.dtypes = array.array("h")  # codes into dtype_numbers (dense: no numpy pass over them)
        self.shapes = array.array("i")
        self.shards = array.array("h")  # codes into shard_numbers
        self.offsets = array.array("q")
        self.sizes = array.array("q")
        self.crcs = array.array("I")
        self.no_crc: set[int] = set()  # rows whose entry stores no crc32c
        self.dtype_index: dict[int, int] = {}
        self.shard_index: dict[int, int] = {}
        self.shape_codes: dict[bytes, int] = {}
        self.shape_values: list[tuple[int, ...]] = []
        self.num_shards: int | None = None
        self.key = b""  # the last key (keys must rise)
        self.started = False
        self.written = 0

    @staticmethod
    def _code(known: dict[int, int], value: int) -> int:
        """The dense code of ``value`` (an int16 column: more distinct values are not taken)."""
        code = known.get(value)
        if code is None:
            if len(known) >= 32767:
                raise _NotCompact
            code = known[value] = len(known)
        return code

    def _shape_code(self, raw: bytes) -> int:
        """The code of a ``TensorShapeProto``'s bytes (a new one parsed and added)."""
        code = self.shape_codes.get(raw)
        if code is None:
            self.shape_values.append(_shape(raw))
            code = self.shape_codes[raw] = len(self.shape_codes)
        return code

    def _any_order(self, block: bytes, pos: int, vend: int) -> tuple[int, int, int, int, int, int]:
        """An entry's fields, each at most once, in any order (what the writers' order in
        :meth:`block` does not take): ``(dtype, shape code, shard, offset, size, crc32c)``, the
        crc32c ``_NO_CRC`` when the entry stores none."""
        seen = 0
        dtype = shard = offset = size = 0
        crc = _NO_CRC
        shape = 0
        while pos < vend:
            tag = block[pos]
            pos += 1
            if tag == _TAG_CRC:
                if seen & 64 or pos + 4 > vend:
                    raise _NotCompact
                seen |= 64
                crc = int.from_bytes(block[pos:pos + 4], "little")
                pos += 4
                continue
            if tag == _TAG_SHAPE:
                if seen & 4:
                    raise _NotCompact
                seen |= 4
                n, pos = _varint(block, pos, vend)
                if pos + n > vend:
                    raise _NotCompact
                raw = block[pos:pos + n]
                pos += n
                shape = self._shape_code(raw)
                continue
            b = block[pos] if pos < vend else 0x80
            if b < 0x80:
                number = b
                pos += 1
            else:
                number, pos = _varint(block, pos, vend)
            if tag == _TAG_OFFSET:
                bit = 16
                offset = number
            elif tag == _TAG_SIZE:
                bit = 32
                size = number
            elif tag == _TAG_DTYPE:
                bit = 2
                dtype = number
            elif tag == _TAG_SHARD:
                bit = 8
                shard = number
            else:  # slices=7, or a field not declared
                raise _NotCompact
            if seen & bit or (bit in (2, 8) and number >= _INT32_LIMIT):
                raise _NotCompact
            seen |= bit
        if pos != vend:
            raise _NotCompact
        if not seen & 4:
            shape = self._shape_code(b"")  # no shape field: a scalar
        return dtype, shape, shard, offset, size, crc

    def block(self, block: bytes) -> None:
        """Every entry of one data block into the columns."""
        limit = block_limit(block)
        pos = 0
        key = self.key
        keys_out = self.keys.write
        shape_codes = self.shape_codes
        add_end, add_dtype, add_shape = self.key_ends.append, self.dtypes.append, self.shapes.append
        add_shard, add_offset, add_size, add_crc = (self.shards.append, self.offsets.append, self.sizes.append,
                                                    self.crcs.append)
        written = self.written
        dtype_index, shard_index = self.dtype_index, self.shard_index
        key_in_block = b""
        while pos < limit:
            if pos + 2 < limit and not (block[pos] | block[pos + 1] | block[pos + 2]) & 0x80:
                shared, non_shared, value_len = block[pos], block[pos + 1], block[pos + 2]
                pos += 3
            else:
                shared, pos = _varint(block, pos, limit)
                non_shared, pos = _varint(block, pos, limit)
                value_len, pos = _varint(block, pos, limit)
            if shared > len(key_in_block) or pos + non_shared + value_len > limit:
                raise _NotCompact
            key_in_block = key_in_block[:shared] + block[pos:pos + non_shared] if shared else \
                block[pos:pos + non_shared]
            pos += non_shared
            vend = pos + value_len
            if self.num_shards is None:  # the header: the empty key, first
                key = self._start(key_in_block, block[pos:vend])
                pos = vend
                continue
            if key_in_block <= key:
                raise _NotCompact  # keys out of order (within a block or across blocks)
            key = key_in_block
            if key[0] == 0:  # a stored slice's key
                raise _NotCompact
            # the writers' order first (dtype, shape, [shard], [offset], size, crc32c; one-byte dtype,
            # shape length and shard), else each field at most once in any order (_any_order)
            if (pos + 4 < vend and block[pos] == _TAG_DTYPE and block[pos + 2] == _TAG_SHAPE
                    and not (block[pos + 1] | block[pos + 3]) & 0x80):
                dtype = block[pos + 1]
                at = pos + 4 + block[pos + 3]
                raw = block[pos + 4:at]
                shape = shape_codes.get(raw)
                if shape is None:
                    shape = self._shape_code(raw)
                shard = offset = 0
                if at + 1 < vend and block[at] == _TAG_SHARD and block[at + 1] < 0x80:
                    shard = block[at + 1]
                    at += 2
                if at < vend and block[at] == _TAG_OFFSET:
                    offset, at = _varint(block, at + 1, vend)
                if at < vend and block[at] == _TAG_SIZE:
                    size, at = _varint(block, at + 1, vend)
                    if at + 5 == vend and block[at] == _TAG_CRC:
                        keys_out(key)
                        written += len(key)
                        add_end(written)
                        code = dtype_index.get(dtype)
                        add_dtype(self._code(dtype_index, dtype) if code is None else code)
                        add_shape(shape)
                        code = shard_index.get(shard)
                        add_shard(self._code(shard_index, shard) if code is None else code)
                        add_offset(offset)
                        add_size(size)
                        add_crc(int.from_bytes(block[at + 1:vend], "little"))
                        pos = vend
                        continue
            written = self._add_any_order(key, written, block, pos, vend)
            pos = vend
        self.key = key
        self.written = written

    def _start(self, key: bytes, value: bytes) -> bytes:
        """The header entry, which must come first with the empty key: the number of shards."""
        if key or self.started:
            raise _NotCompact
        self.started = True
        self.num_shards = _header(value)
        return key

    def _add_any_order(self, key: bytes, written: int, block: bytes, pos: int, vend: int) -> int:
        """One entry whose fields are not in the writers' order (:meth:`_any_order`) into the
        columns (the fast path in :meth:`block` adds the others); the key bytes written so far."""
        dtype, shape, shard, offset, size, crc = self._any_order(block, pos, vend)
        self.keys.write(key)
        written += len(key)
        self.key_ends.append(written)
        self.dtypes.append(self._code(self.dtype_index, dtype))
        self.shapes.append(shape)
        self.shards.append(self._code(self.shard_index, shard))
        self.offsets.append(offset)
        self.sizes.append(size)
        if crc == _NO_CRC:
            self.no_crc.add(len(self.crcs))
            crc = 0
        self.crcs.append(crc)
        return written


def scan_index(read: TableSource, path: str) -> CompactIndex | None:
    """The index in columns, or None when :func:`~.index.parse_index` must read it (see the module).

    Args:
        read: The ``.index`` file, read a block at a time.
        path: Its path (for the keys' messages, none here: the caller parses it to say why).
    """
    try:
        return _scan(read)
    except (_NotCompact, MalformedError, UnicodeError, OverflowError, IndexError):
        return None


def _scan(read: TableSource) -> CompactIndex:
    import numpy as np  # noqa: PLC0415 - the columns

    cols = _Columns()
    for block in iter_data_blocks(read):
        cols.block(block)
    if cols.num_shards is None:
        raise _NotCompact
    keys = cols.keys.getvalue()
    cols.keys.close()
    del cols.keys
    if not keys.isascii():
        _utf8_keys(keys, cols.key_ends)
    count = len(cols.key_ends)

    def column(values: array.array, dtype: Any) -> Any:
        return np.frombuffer(values, dtype, count) if count else np.zeros(0, dtype)

    shard_numbers = _by_code(cols.shard_index)
    if count and max(shard_numbers) >= cols.num_shards:
        raise _NotCompact
    return CompactIndex(
        num_shards=cols.num_shards, keys=keys, key_ends=column(cols.key_ends, np.int64),
        dtype_numbers=_by_code(cols.dtype_index), dtype_codes=column(cols.dtypes, np.int16),
        shapes=tuple(cols.shape_values), shape_codes=column(cols.shapes, np.int32),
        shard_numbers=shard_numbers, shard_codes=column(cols.shards, np.int16),
        offsets=column(cols.offsets, np.int64), sizes=column(cols.sizes, np.int64),
        crcs=column(cols.crcs, np.uint32), no_crc=frozenset(cols.no_crc),
    )


def _by_code(known: dict[int, int]) -> tuple[int, ...]:
    """The values of a dense coding, in code order."""
    out = [0] * len(known)
    for value, code in known.items():
        out[code] = value
    return tuple(out)


def _utf8_keys(keys: bytes, key_ends: array.array) -> None:
    """UnicodeDecodeError unless every key is UTF-8 on its own (then its str encodes back to the
    same bytes both ways: a :class:`~ckptinspect.model.VariableTable` name and a bundle key)."""
    start = 0
    for end in key_ends:
        piece = keys[start:end]
        if not piece.isascii():
            piece.decode("utf-8")
        start = end


class CompactIndex:
    """A parsed ``.index`` file in columns: what :class:`~.index.BundleIndex` holds, for an index
    of plain entries (no slices), with :class:`~.index.IndexEntry` records made when asked.

    Rows are the entries in key order (the header is not a row).

    Attributes:
        num_shards: From the header.
        keys, key_ends: The keys' bytes, packed, and each one's end (numpy int64).
        dtype_numbers, dtype_codes: The distinct ``DataType`` numbers, and each row's index.
        shapes, shape_codes: The distinct shapes, and each row's index.
        shard_numbers, shard_codes: The distinct shard ids, and each row's index.
        offsets, sizes: numpy int64 columns; crcs: uint32, the stored crc32c (0 in the rows of
            ``no_crc``, whose entries store none).
        problem_codes, problems: Each row's index into ``problems`` (0: None; see
            :func:`~.index.entry_problem`).
    """

    slice_entries: dict = {}  # no entry of a compact index is sliced

    def __init__(self, *, num_shards: int, keys: bytes, key_ends: Any, dtype_numbers: tuple[int, ...],
                 dtype_codes: Any, shapes: tuple[tuple[int, ...], ...], shape_codes: Any,
                 shard_numbers: tuple[int, ...], shard_codes: Any, offsets: Any, sizes: Any, crcs: Any,
                 no_crc: frozenset[int] = frozenset()):
        self.num_shards = num_shards
        self.keys, self.key_ends = keys, key_ends
        self.dtype_numbers, self.dtype_codes = dtype_numbers, dtype_codes
        self.dtype_names = tuple(DTYPE_NAMES.get(d, f"dtype{d}") for d in dtype_numbers)
        self.shapes, self.shape_codes = shapes, shape_codes
        self.shard_numbers, self.shard_codes = shard_numbers, shard_codes
        self.offsets, self.sizes, self.crcs, self.no_crc = offsets, sizes, crcs, no_crc
        self.problems, self.problem_codes = self._problems()
        self._next = 0  # find's guess: callers mostly go in key order
        self._recent: dict[str, IndexEntry] = {}  # get's entries made last (at most _RECENT_ENTRIES)

    # -- the one rule ----------------------------------------------------------------------
    def _problems(self) -> tuple[tuple[tuple[str, str] | None, ...], Any]:
        """:func:`~.index.entry_problem` of every row, called once per distinct (dtype, shape, size)."""
        import numpy as np  # noqa: PLC0415

        count = len(self.key_ends)
        pair = self.dtype_codes.astype(np.int64) * max(1, len(self.shapes)) + self.shape_codes
        order = np.lexsort((self.sizes, pair))
        p, s = pair[order], self.sizes[order]
        starts = np.flatnonzero(np.concatenate(([True], (p[1:] != p[:-1]) | (s[1:] != s[:-1])))) if count else \
            np.zeros(0, np.int64)
        problems: list[tuple[str, str] | None] = [None]
        known: dict[tuple[str, str], int] = {}
        codes = np.zeros(count, np.int16)
        bounds = [*starts.tolist(), count]
        for at, stop in zip(bounds[:-1], bounds[1:]):
            row = int(order[at])
            found = entry_problem(self.dtype_numbers[self.dtype_codes[row]], self.shapes[self.shape_codes[row]],
                                  int(self.sizes[row]), holds_data=True)
            if found is None:
                continue
            code = known.get(found)
            if code is None:
                if len(problems) > 32000:
                    raise _NotCompact  # more distinct problems than codes: parse_index holds them
                code = known[found] = len(problems)
                problems.append(found)
            codes[order[at:stop]] = code
        return tuple(problems), codes

    # -- rows ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.key_ends)

    def key_bytes(self, r: int) -> bytes:
        start = int(self.key_ends[r - 1]) if r else 0
        return self.keys[start:int(self.key_ends[r])]

    def key_of(self, r: int) -> str:
        return decode_key(self.key_bytes(r))

    def dtype_of(self, r: int) -> str:
        return self.dtype_names[self.dtype_codes[r]]

    def shape_of(self, r: int) -> tuple[int, ...]:
        return self.shapes[self.shape_codes[r]]

    def problem_of(self, r: int) -> tuple[str, str] | None:
        return self.problems[self.problem_codes[r]]

    def entry_at(self, r: int) -> IndexEntry:
        """The :class:`~.index.IndexEntry` of row ``r`` (what parse_index gives for it)."""
        return IndexEntry(key=self.key_of(r), dtype=self.dtype_of(r), shape=self.shape_of(r),
                          shard_id=self.shard_numbers[self.shard_codes[r]], offset=int(self.offsets[r]),
                          size=int(self.sizes[r]), crc32c=self.crc_of(r),
                          problem=self.problem_of(r))

    def crc_of(self, r: int) -> int | None:
        """The stored crc32c of row ``r``, or None when its entry stores none."""
        return None if r in self.no_crc else int(self.crcs[r])

    def find(self, key: str) -> int | None:
        """The row of ``key``, or None: a binary search of the sorted keys (the next row tried first)."""
        want = encode_key(key)
        n = len(self.key_ends)
        after = self._next
        for guess in (after, after - 1):  # the next row, or the same one again (two readers in step)
            if 0 <= guess < n and self.key_bytes(guess) == want:
                self._next = guess + 1
                return guess
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) // 2
            if self.key_bytes(mid) < want:
                lo = mid + 1
            else:
                hi = mid
        if lo < n and self.key_bytes(lo) == want:
            self._next = lo + 1
            return lo
        return None

    def get(self, key: str, default: Any = None) -> IndexEntry | Any:
        """The entry of ``key`` (a mapping's ``get``: what ``{e.key: e}`` gave). The entries made
        last are kept a while (two readers of one index, diff X X, ask for each in turn)."""
        entry = self._recent.get(key)
        if entry is not None:
            return entry
        r = self.find(key)
        if r is None:
            return default
        entry = self.entry_at(r)
        if len(self._recent) >= _RECENT_ENTRIES:
            self._recent.clear()
        self._recent[key] = entry
        return entry

    @property
    def entries(self) -> _Entries:
        """Every entry, in key order, each made when reached (a sequence as BundleIndex's)."""
        return _Entries(self)

    def problem_rows(self) -> list[int]:
        """The rows TensorFlow cannot read, in key order."""
        import numpy as np  # noqa: PLC0415

        return np.flatnonzero(self.problem_codes).tolist()

    def graph_row(self) -> int | None:
        """The row of the object graph (``_CHECKPOINTABLE_OBJECT_GRAPH``), or None."""
        return self.find(OBJECT_GRAPH_KEY)

    def variable_nbytes(self) -> Any:
        """Bytes each row's value takes, as the variables report it: shape x dtype where both
        make sense, else what the index records (int64; OverflowError beyond it)."""
        import numpy as np  # noqa: PLC0415

        if not len(self):
            return self.sizes
        # once per (dtype, shape) pair present (not per pair possible: many shapes x many dtypes),
        # the rows' pairs made a block at a time (no sort of every row's)
        def pairs_of(block: slice) -> Any:
            return self.dtype_codes[block].astype(np.int64) * len(self.shapes) + self.shape_codes[block]

        pairs = m.distinct_values(pairs_of, len(self), _NBYTES_ROWS)
        per = np.full(len(pairs), -1, np.int64)
        for i, pair in enumerate(pairs.tolist()):
            item = m.ITEMSIZE.get(self.dtype_names[pair // len(self.shapes)])
            shape = self.shapes[pair % len(self.shapes)]
            if item is None or not fits_tensorflow(shape):
                continue
            n = item
            for dim in shape:
                n *= dim
            if n >= _INT64_LIMIT:
                raise OverflowError("a variable's size exceeds int64")
            per[i] = n
        out = np.empty(len(self), np.int64)
        for at in range(0, len(self), _NBYTES_ROWS):
            block = slice(at, at + _NBYTES_ROWS)
            out[block] = per[np.searchsorted(pairs, pairs_of(block))]
        stored = out < 0
        if stored.any():
            out[stored] = self.sizes[stored]
        elif np.array_equal(out, self.sizes):
            return self.sizes  # one column for both
        return out


class _Entries:
    """A compact index's entries as a sequence of :class:`~.index.IndexEntry`, made when reached."""

    __slots__ = ("_index",)

    def __init__(self, index: CompactIndex):
        self._index = index

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, r: int) -> IndexEntry:
        if not -len(self._index) <= r < len(self._index):
            raise IndexError("entry index out of range")
        return self._index.entry_at(r % len(self._index))

    def __iter__(self) -> Iterator[IndexEntry]:
        return map(self._index.entry_at, range(len(self._index)))

