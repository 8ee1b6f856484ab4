"""A giant safetensors header read into columns (:class:`~ckptinspect.model.VariableTable`), without
a Python dict per tensor.

A header of a million tensors parsed by ``json.loads`` costs a dict, a list and a few ints per
tensor (about 600 bytes each) before a single :class:`~ckptinspect.model.Variable` is made. The
writers' headers have one shape: compact JSON, ``{"__metadata__":{...},"name":{"dtype":"F32",
"shape":[2,3],"data_offsets":[0,24]},...}`` (the three keys in one order throughout, any order),
then spaces. :func:`scan_header` reads exactly that shape, a window of the file at a time, with
one regular expression per tensor (C code: ``re.split`` of each chunk of about 1 MB, whose pieces
between the matches must all be empty: the matches then tile the chunk byte for byte, so nothing
was skipped and every match is a real entry), keeps the fields in columns, then checks what
:func:`~ckptinspect.formats.safetensors.file.read_header` checks: names' escapes, UTF-8, no name
twice, known dtypes, at most ``MAX_DIMS`` dims, numbers without leading zeros, spans equal to
dtype size x shape, every span in the file, no two overlapping. A header of any other shape, or
one that fails a check, gives None: the caller reads it with ``json.loads`` as before (same
result, or the same error message).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ... import model as m
from ...errors import CkptError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["CompactHeader", "scan_header"]

WINDOW_BYTES = 8 << 20  # header bytes read at a time
CHUNK_BYTES = 1 << 20  # header bytes matched per findall (its tuples are the transient memory)

_STRING_BODY = rb'[^"\\\x00-\x1f]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*)*'
_NAME = rb'"(' + _STRING_BODY + rb')"'
# Loose where a check follows (C code is faster on simple classes): a shape's digits and commas are
# checked once per distinct shape, the offsets' leading zeros by their lengths (see _columns).
_INT = rb"[0-9]{1,18}"  # below 10**18: within int64, as read_header requires
_VALUES = {
    "dtype": rb'"([A-Z0-9_]{1,24})"',
    "shape": rb"\[([0-9,]*)\]",
    "data_offsets": rb"\[(" + _INT + rb"),(" + _INT + rb")\]",
}
_SHAPE = re.compile(rb"(?:(?:0|[1-9][0-9]{0,17})(?:,(?:0|[1-9][0-9]{0,17})){0,63})?")  # at most MAX_DIMS dims
_STRING = rb'"' + _STRING_BODY + rb'"'
_METADATA = re.compile(rb'"__metadata__":(\{(?:' + _STRING + rb":" + _STRING + rb"(?:," + _STRING + rb":"
                       + _STRING + rb")*)?\})")
_TRAILING = b" \t\n\r"


@dataclasses.dataclass(frozen=True)
class _Order:
    """The entry pattern for one order of the three keys."""

    keys: tuple[str, ...]
    first: re.Pattern[bytes]  # the entry right after ``{``
    rest: re.Pattern[bytes]  # each later entry, its comma first
    dtype: int  # index of each field in a match's groups
    shape: int
    begin: int


def _order(keys: tuple[str, ...]) -> _Order:
    body = rb"\{" + b",".join(b'"' + k.encode() + b'":' + _VALUES[k] for k in keys) + rb"\}"
    groups = {}
    at = 1  # group 0 of findall's tuples: the name
    for k in keys:
        groups[k] = at
        at += 2 if k == "data_offsets" else 1
    return _Order(keys, re.compile(_NAME + b":" + body), re.compile(b"," + _NAME + b":" + body),
                  groups["dtype"], groups["shape"], groups["data_offsets"])


_ORDERS = [_order(keys) for keys in itertools.permutations(("dtype", "shape", "data_offsets"))]
_GROUPS = 5  # groups of an entry pattern: name, dtype, shape, two offsets


@dataclasses.dataclass(frozen=True)
class CompactHeader:
    """A header read into columns.

    Attributes:
        table: The tensors (role, shape, dtype, size), in header order.
        starts: numpy int64, each tensor's absolute file offset.
        metadata: ``__metadata__``, or None.
        header_bytes, data_start, file_size: As :class:`~ckptinspect.formats.safetensors.file.Header`.
        problems: name -> why its bytes are not in the file (lenient reading only).
    """

    table: m.VariableTable
    starts: np.ndarray
    metadata: dict[str, Any] | None
    header_bytes: int
    data_start: int
    file_size: int
    problems: dict[str, str]


class _NotCompact(Exception):
    """The header is not of the shape read here, or fails a check: json.loads reads it."""


def scan_header(read: Callable[[int, int], bytes], path: str, n: int, size: int, strict: bool,
                dtypes: dict[str, str], unreadable: frozenset[str], counter_names: frozenset[str],
                header_length: int) -> CompactHeader | None:
    """The header in columns, or None when json.loads must read it (see the module).

    The header is read a window at a time, never whole: its bytes and the columns are not held
    together.

    Args:
        read: ``read(offset, count)``: at most ``count`` bytes of the header from ``offset``.
        n: The header's length; ``size``: the file's.
        strict: None for a tensor whose bytes lie past the end (the caller raises); else recorded.
        dtypes: safetensors dtype code -> dtype name; ``unreadable``: codes listed but not read.
        counter_names: Lower-case last name components of 0-d integer counters (role metadata).
        header_length: Bytes of the length field before the header.
    """
    try:
        return _scan(read, path, n, size, strict, dtypes, unreadable, counter_names, header_length)
    except (_NotCompact, ValueError, OverflowError, UnicodeError, RecursionError, CkptError):
        return None


def _utf8(buf: bytes, start: int, stop: int) -> None:
    """UnicodeDecodeError unless ``buf[start:stop]`` is UTF-8 (json.loads would refuse it)."""
    if not buf[start:stop].isascii():
        buf[start:stop].decode("utf-8")


def _scan(read: Callable[[int, int], bytes], path: str, n: int, size: int, strict: bool, dtypes: dict[str, str],
          unreadable: frozenset[str], counter_names: frozenset[str], header_length: int) -> CompactHeader:
    import numpy as np  # noqa: PLC0415 - the columns

    end, metadata = _header_end(read, path, n)
    buf = read(0, min(n, WINDOW_BYTES))
    if not buf.startswith(b"{"):
        raise _NotCompact
    pos = 1
    found = _METADATA.match(buf, pos)
    if found:
        if metadata is not None:
            raise _NotCompact  # named twice (json.loads says so)
        metadata = _metadata(found.group(1), path)
        pos = found.end()
    names: list[bytes] = []
    name_lengths: list[Any] = []
    hashes: list[Any] = []
    dtype_index: dict[bytes, int] = {}
    shape_index: dict[bytes, int] = {}
    dtype_chunks: list[Any] = []
    shape_chunks: list[Any] = []
    begin_chunks: list[Any] = []
    end_chunks: list[Any] = []
    columns = (names, name_lengths, hashes, dtype_index, shape_index, dtype_chunks, shape_chunks, begin_chunks,
               end_chunks)
    if pos < end:
        # the first entry fixes the order of the three keys
        order = None
        entry = None
        for candidate in _ORDERS:
            entry = (candidate.rest if pos > 1 else candidate.first).match(buf, pos, min(len(buf), end))
            if entry:
                order = candidate
                break
        if order is None or entry is None:
            raise _NotCompact
        _utf8(buf, pos, entry.end())
        first = entry.groups()
        pos = entry.end()
        base = 0  # the header offset of buf[0]
        while base + pos < end:
            limit = min(len(buf), end - base)
            stop = buf.find(b'},"', pos + CHUNK_BYTES, limit) if pos + CHUNK_BYTES < limit else -1
            if stop < 0 and base + len(buf) < end:  # the next window
                more = read(base + len(buf), WINDOW_BYTES)
                if not more:
                    raise _NotCompact
                buf = buf[pos:] + more
                base += pos
                pos = 0
                continue
            stop = limit if stop < 0 else stop + 1
            piece = buf[pos:stop]
            _utf8(piece, 0, len(piece))
            # split: between the matches, what no match took: all empty when the matches tile the piece
            parts = order.rest.split(piece)
            if any(parts[0::_GROUPS + 1]):
                raise _NotCompact  # not this shape
            _columns([parts[g::_GROUPS + 1] for g in range(1, _GROUPS + 1)], order, b"\\" in piece, *columns, np)
            del parts, piece
            pos = stop
        _columns([[g] for g in first], order, True, *columns, np, first=True)
    del buf
    return _checked(path, n, size, strict, dtypes, unreadable, counter_names, header_length, metadata, *columns, np)


def _header_end(read: Callable[[int, int], bytes], path: str, n: int) -> tuple[int, dict[str, Any] | None]:
    """Where the entries of an ``n``-byte header end: before the closing brace and the trailing
    whitespace, and before a ``__metadata__`` written last (then returned, parsed)."""
    tail_at = max(0, n - WINDOW_BYTES)
    tail = read(tail_at, n - tail_at)
    if len(tail) != n - tail_at:
        raise _NotCompact
    end = len(tail)
    while end and tail[end - 1] in _TRAILING:
        end -= 1
    if end < 1 or tail[end - 1:end] != b"}" or tail_at + end < 2:
        raise _NotCompact
    end -= 1
    metadata = None
    at = tail.rfind(b',"__metadata__":{', 0, end)
    if at >= 0:
        found = _METADATA.match(tail, at + 1, end)
        if not found or found.end() != end:
            raise _NotCompact
        metadata = _metadata(found.group(1), path)
        end = at
    return end + tail_at, metadata  # in the header


def _metadata(text: bytes, path: str) -> dict[str, Any]:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
        out = dict(pairs)
        if len(out) != len(pairs):
            raise _NotCompact
        return out

    return json.loads(text.decode("utf-8"), object_pairs_hook=no_duplicates)


def _decoded_name(name: bytes) -> bytes:
    """A name with JSON escapes, as the UTF-8 (surrogates passed) of the string they spell."""
    return json.loads(b'"' + name + b'"').encode("utf-8", "surrogatepass")


def _columns(fields: list[Sequence[bytes]], order: _Order, escapes: bool, names: list[bytes],
             name_lengths: list[Any], hashes: list[Any], dtype_index: dict[bytes, int],
             shape_index: dict[bytes, int], dtype_chunks: list[Any], shape_chunks: list[Any],
             begin_chunks: list[Any], end_chunks: list[Any], np: Any, first: bool = False) -> None:
    """One chunk's fields (one sequence per group of the entry pattern) into the columns (the
    first entry's are put in front)."""
    chunk_names = list(fields[0])
    count = len(chunk_names)
    if not count:
        return
    if escapes:
        for i, name in enumerate(chunk_names):
            if b"\\" in name:
                chunk_names[i] = _decoded_name(name)
    lengths = np.fromiter(map(len, chunk_names), np.int32, count)
    for code in set(fields[order.dtype]) - dtype_index.keys():
        dtype_index[code] = len(dtype_index)
    for shape in set(fields[order.shape]) - shape_index.keys():
        if not _SHAPE.fullmatch(shape):
            raise _NotCompact
        shape_index[shape] = len(shape_index)
    packed = b"".join(chunk_names)
    chunk_hashes = np.fromiter(map(hash, chunk_names), np.int64, count)
    dtype_codes = np.fromiter(map(dtype_index.__getitem__, fields[order.dtype]), np.int16, count)
    shape_codes = np.fromiter(map(shape_index.__getitem__, fields[order.shape]), np.int32, count)
    offsets = []
    for column in (fields[order.begin], fields[order.begin + 1]):
        values = np.fromiter(map(int, column), np.int64, count)
        # JSON spells a number without leading zeros: its length is then its count of digits
        digits = int(np.searchsorted(_POWERS_OF_TEN, values, side="right").sum()) + int((values == 0).sum())
        if digits != sum(map(len, column)):
            raise _NotCompact
        offsets.append(values)
    where = 0 if first else len(names)
    names.insert(where, packed)
    name_lengths.insert(where, lengths)
    hashes.insert(where, chunk_hashes)
    dtype_chunks.insert(where, dtype_codes)
    shape_chunks.insert(where, shape_codes)
    begin_chunks.insert(where, offsets[0])
    end_chunks.insert(where, offsets[1])


_POWERS_OF_TEN = [10**i for i in range(19)]


def _checked(path: str, n: int, size: int, strict: bool, dtypes: dict[str, str], unreadable: frozenset[str],
             counter_names: frozenset[str], header_length: int, metadata: dict[str, Any] | None,
             names: list[bytes], name_lengths: list[Any], hashes: list[Any], dtype_index: dict[bytes, int],
             shape_index: dict[bytes, int], dtype_chunks: list[Any], shape_chunks: list[Any],
             begin_chunks: list[Any], end_chunks: list[Any], np: Any) -> CompactHeader:
    """The columns checked as read_header checks the entries, and made a table."""

    def joined(chunks: list[Any], dtype: Any) -> Any:
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype)

    packed = b"".join(names)
    del names[:]
    name_ends = np.cumsum(joined(name_lengths, np.int32), dtype=np.int64)
    count = len(name_ends)
    # no name twice (and none is the metadata's): equal hashes, then the names themselves
    all_hashes = np.sort(joined(hashes, np.int64))
    if count > 1 and bool((all_hashes[1:] == all_hashes[:-1]).any()):
        if _has_duplicate(packed, name_ends):
            raise _NotCompact
    del all_hashes, hashes[:]
    if _find(packed, name_ends, b"__metadata__"):
        raise _NotCompact
    # dtypes: known, or listed but unreadable
    codes = [code.decode("ascii") for code, _ in sorted(dtype_index.items(), key=lambda kv: kv[1])]
    if any(code not in dtypes and code not in unreadable for code in codes):
        raise _NotCompact
    dtype_names = [dtypes.get(code, code) for code in codes]
    itemsizes = np.array([m.ITEMSIZE.get(dtypes[c], 0) if c in dtypes else 0 for c in codes] or [0], np.int64)
    shapes, elements = _shapes(shape_index)
    dtype_codes = joined(dtype_chunks, np.int16)
    shape_codes = joined(shape_chunks, np.int32)
    begins = joined(begin_chunks, np.int64)
    ends = joined(end_chunks, np.int64)
    del dtype_chunks[:], shape_chunks[:], begin_chunks[:], end_chunks[:]
    if bool((begins > ends).any()):
        raise _NotCompact
    nbytes = ends - begins
    needed = np.array(elements or [0], np.int64)[shape_codes]
    needed *= itemsizes[dtype_codes]
    if bool(((nbytes != needed) & (itemsizes[dtype_codes] > 0)).any()):  # unreadable dtypes: no size
        raise _NotCompact
    del needed
    data_start = header_length + n
    data_size = size - data_start
    problems = _past_the_data(path, packed, name_ends, ends, data_size, strict, np)
    _no_overlap(begins, ends, nbytes, np)
    del ends
    role_codes = _roles(packed, name_ends, shape_index.get(b""), shape_codes, dtype_names, dtype_codes,
                        counter_names, np)
    table = m.VariableTable(packed, name_ends, shapes, shape_codes, dtype_names, dtype_codes, nbytes, m.ROLES,
                            role_codes, [()], np.zeros(count, np.uint8))
    return CompactHeader(table, begins + data_start, metadata, n, data_start, size, problems)


def _shapes(shape_index: dict[bytes, int]) -> tuple[list[tuple[int, ...]], list[int]]:
    """The distinct shapes in code order, and their element counts: at most MAX_DIMS ints (the
    pattern's bound) whose product, in bytes of the widest dtype, stays below 2**63."""
    shapes, elements = [], []
    for text, _ in sorted(shape_index.items(), key=lambda kv: kv[1]):
        dims = tuple(int(d) for d in text.split(b",")) if text else ()
        product = 1
        for d in dims:
            product *= d
        if product >= 2**63 or product * 16 >= 2**63:  # 16: the widest dtype (bytes stay in int64)
            raise _NotCompact
        shapes.append(dims)
        elements.append(product)
    return shapes, elements


def _past_the_data(path: str, packed: bytes, name_ends: Any, ends: Any, data_size: int, strict: bool,
                   np: Any) -> dict[str, str]:
    """read_header's problem line for each entry whose span ends past the data (none allowed when
    ``strict``)."""
    problems: dict[str, str] = {}
    past = np.flatnonzero(ends > data_size)
    if len(past) and strict:
        raise _NotCompact
    for r in past.tolist():
        name = _name(packed, name_ends, r)
        problems[name] = (f"{path}: safetensors entry {name!r} declares data up to byte {int(ends[r])} of the"
                          f" buffer, which holds {data_size} bytes (truncated, or a header claiming more than"
                          " the file holds)")
    return problems


def _no_overlap(begins: Any, ends: Any, nbytes: Any, np: Any) -> None:
    """No two stored (non-empty) spans overlap."""
    stored = np.flatnonzero(nbytes)
    stored_begins, stored_ends = begins[stored], ends[stored]
    del stored
    if len(stored_begins) > 1 and not bool((stored_begins[1:] >= stored_ends[:-1]).all()):
        order = np.argsort(stored_begins, kind="stable")  # not in file order: sorted by offset
        stored_begins, stored_ends = stored_begins[order], stored_ends[order]
        del order
        if bool((stored_begins[1:] < stored_ends[:-1]).any()):
            raise _NotCompact


def _roles(packed: bytes, name_ends: Any, scalar: int | None, shape_codes: Any, dtype_names: list[str],
           dtype_codes: Any, counter_names: frozenset[str], np: Any) -> Any:
    """Each entry's role code: 0-d integer counters (``scalar``: the code of shape ``()``) are
    metadata, the rest model."""
    role_codes = np.zeros(len(name_ends), np.uint8)
    if scalar is not None:
        metadata_role = m.ROLES.index(m.ROLE_METADATA)
        integer = np.array([name in m.INTEGER_DTYPES for name in dtype_names], bool)
        for r in np.flatnonzero((shape_codes == scalar) & integer[dtype_codes]).tolist():
            if _name(packed, name_ends, r).replace("/", ".").rsplit(".", 1)[-1].lower() in counter_names:
                role_codes[r] = metadata_role
    return role_codes


def _name(packed: bytes, ends: Any, r: int) -> str:
    start = int(ends[r - 1]) if r else 0
    return packed[start:int(ends[r])].decode("utf-8", "surrogatepass")


def _find(packed: bytes, ends: Any, name: bytes) -> bool:
    """Whether ``name`` is one of the packed names (a search, then its boundaries checked)."""
    import numpy as np  # noqa: PLC0415

    at = packed.find(name)
    while at >= 0:
        r = int(np.searchsorted(ends, at, side="right"))
        start = int(ends[r - 1]) if r else 0
        if start == at and int(ends[r]) == at + len(name):
            return True
        at = packed.find(name, at + 1)
    return False


def _has_duplicate(packed: bytes, ends: Any) -> bool:
    """Whether two packed names are equal (their bytes sorted, compared neighbour to neighbour)."""
    import numpy as np  # noqa: PLC0415

    starts = np.concatenate(([0], ends[:-1]))
    order = sorted(range(len(ends)), key=lambda r: packed[int(starts[r]):int(ends[r])])
    previous = None
    for r in order:
        name = packed[int(starts[r]):int(ends[r])]
        if name == previous:
            return True
        previous = name
    return False
