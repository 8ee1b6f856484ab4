"""A read-only reader of HDF5 metadata, for the subset h5py writes by default for Keras files.

Keras weights files hold thousands of small datasets; through h5py each costs a fixed price
(opening the object, converting its type, asking for its shape, offset and storage size one
call at a time). This module parses the structures themselves, from the HDF5 File Format
Specification (version 3.0): the superblock (versions 0, 1, 2 and 3 without an extension),
symbol-table groups (v1 B-tree, local heap, symbol nodes) and compact link-message groups,
object headers of versions 1 and 2 with their continuation blocks, and the messages a listing
needs: dataspace, datatype (integers, IEEE floats, h5py's boolean enum, fixed-length and
variable-length strings), data layout (contiguous, compact, chunked with a v1 B-tree index),
attributes (values read from the object header and, for variable-length strings, the global
heap) and links.

Anything outside that subset raises :class:`Unsupported`: the caller then reads the whole
file through h5py instead (decided once per file), so a file this reader does not understand
is never answered wrongly. That includes everything a listing refuses or reports (soft and
external links, external files, virtual datasets, shape bombs), so its error stays h5py's.
Damage this reader notices (an offset past the end of the file, a looping B-tree, a bad
signature) raises :class:`Unsupported` as well: h5py then gives the message users always got.

Bounds: every offset and length is checked against the file's size before it is read; node
and header counts are bounded (:data:`MAX_OBJECTS`, :data:`MAX_DEPTH`), every node and
continuation block is visited at most once, so a hostile file costs bounded time and memory.
"""

from __future__ import annotations

import math
import os
import struct
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported only where values are read (a listing needs none)
    import numpy as np

UNDEF = 0xFFFFFFFFFFFFFFFF
SIGNATURE = b"\x89HDF\r\n\x1a\n"

# Limits on what one file may make this reader do (far above any Keras file).
MAX_OBJECTS = 1 << 22  # object headers, B-tree nodes and continuation blocks per file
MAX_DEPTH = 64  # group nesting and B-tree levels
MAX_HEADER_BYTES = 1 << 24  # one object header chunk, one local heap, one global heap collection
MAX_RANK = 32  # HDF5's own limit
FIRST_READ = 512  # bytes read at an object header first (most headers fit)
WINDOW = 4096  # bytes read at least at once (metadata lies in small clusters)
WINDOWS = 4  # the last windows kept

# Layout classes (the data layout message).
COMPACT, CONTIGUOUS, CHUNKED = 0, 1, 2
# Link kinds.
HARD, SOFT, EXTERNAL = 0, 1, 64

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_SYMBOL_ENTRY = struct.Struct("<QQI4x16s")
_HEAP = struct.Struct("<QQQ")
_TWO_U64 = struct.Struct("<QQ")  # local heap: data segment size, free list offset, data segment address  # name offset, header address, cache type, scratch
_MSG1 = struct.Struct("<HHB3x")  # v1 header message: type, size, flags


class Unsupported(Exception):
    """The file is outside this reader's subset, or damaged: read it through h5py instead."""


class DType:
    """The numpy dtype h5py gives a datatype, described without importing numpy: ``str``
    (numpy's ``dtype.str``: ``<f4``, ``|b1``, ``|S8``, ``|O``), ``kind``, ``itemsize`` and
    ``name`` as numpy's. ``dtype`` is the numpy dtype itself (numpy imported then), so numpy
    accepts a DType wherever it takes a dtype, and a numpy dtype compares equal to it."""

    __slots__ = ("str", "kind", "itemsize", "name", "_numpy")
    names = None  # no records
    subdtype = None  # no sub-arrays

    def __init__(self, code: str, kind: str, itemsize: int, name: str):
        self.str = code
        self.kind = kind
        self.itemsize = itemsize
        self.name = name
        self._numpy: Any = None

    @property
    def dtype(self) -> np.dtype:
        if self._numpy is None:
            import numpy as np  # noqa: PLC0415 - numpy only where values are read

            self._numpy = np.dtype(self.str)
        return self._numpy

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DType):
            return self.str == other.str
        return NotImplemented  # a numpy dtype compares itself (through .dtype)

    def __hash__(self) -> int:
        return hash(self.str)

    def __repr__(self) -> str:
        return f"DType({self.str!r})"


def _dtype(order: str, kind: str, itemsize: int, name: str) -> DType:
    return DType(f"{'|' if itemsize == 1 or kind in 'SOb' else order}{kind}{itemsize if kind != 'O' else ''}", kind, itemsize, name)


BOOL = _dtype("|", "b", 1, "bool")
OBJECT = DType("|O", "O", 8, "object")


class Attribute:
    """One attribute: its dtype (``object`` for variable-length strings), shape and raw bytes."""

    __slots__ = ("dtype", "shape", "raw", "vlen")

    def __init__(self, dtype: DType, shape: tuple[int, ...] | None, raw: bytes, vlen: str | None):
        self.dtype = dtype
        self.shape = shape  # None: a null dataspace
        self.raw = raw
        self.vlen = vlen  # "str" / "bytes" for variable-length strings, else None


class Dataset:
    """What a dataset's object header says (metadata only)."""

    __slots__ = ("dtype", "vlen", "shape", "null", "layout", "address", "storage", "attrs")

    def __init__(self) -> None:
        self.dtype: DType | None = None
        self.vlen: str | None = None
        self.shape: tuple[int, ...] = ()
        self.null = False
        self.layout = -1
        self.address: int | None = None  # contiguous storage at this file offset
        self.storage = 0  # bytes allocated in the file (HDF5's storage size)
        self.attrs: dict[bytes, Any] = {}


class Group:
    __slots__ = ("links", "attrs")

    def __init__(self, links: list[tuple[bytes, int]], attrs: dict[bytes, Any]):
        self.links = links  # (name, object header address), in name order
        self.attrs = attrs


class File:
    """An HDF5 file opened for metadata reads (``os.pread`` on a descriptor of its own).

    Args:
        path: A local regular file (the caller checked it).
    """

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            self.size = os.fstat(self.fd).st_size
            self._budget = MAX_OBJECTS
            self._windows: list[tuple[int, int, bytes]] = []  # (start, end, bytes)
            self._heaps: dict[int, dict[int, bytes]] = {}
            self.root = self._superblock()
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "File":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- bytes -------------------------------------------------------------------------------
    def read(self, offset: int, n: int) -> bytes:
        """``n`` bytes at ``offset``, from one of the last windows read when they hold them
        (a group's header, heap, B-tree and symbol nodes usually lie together)."""
        window, at = self._window(offset, n)
        return window[at : at + n] if at or len(window) != n else window

    def _window(self, offset: int, n: int) -> tuple[bytes, int]:
        """:meth:`read` without the copy: a buffer holding the ``n`` bytes at ``offset`` and
        where they start in it. The windows are kept most recently used first."""
        end = offset + n
        start, stop, window = self._windows[0] if self._windows else (0, -1, b"")
        if start <= offset and end <= stop and offset <= end:  # (n >= 0)
            return window, offset - start
        if offset < 0 or n < 0 or end > self.size:
            raise Unsupported(f"{n} bytes at {offset} lie past the end of the file ({self.size} bytes)")
        windows = self._windows
        for k in range(1, len(windows)):
            start, stop, window = windows[k]
            if start <= offset and end <= stop:
                windows.insert(0, windows.pop(k))
                return window, offset - start
        want = max(n, min(WINDOW, self.size - offset))
        data = os.pread(self.fd, want, offset)
        if len(data) < n:
            raise Unsupported(f"short read at {offset} (the file shrank?)")
        windows.insert(0, (offset, offset + len(data), data))
        del windows[WINDOWS:]
        return data, 0

    def _spend(self) -> None:
        self._budget -= 1
        if self._budget < 0:
            raise Unsupported("too many objects (a looping structure?)")

    # -- superblock --------------------------------------------------------------------------
    def _superblock(self) -> int:
        head = self.read(0, min(self.size, 128))
        if head[:8] != SIGNATURE or len(head) < 12:
            raise Unsupported("no HDF5 signature at offset 0 (a user block?)")
        version = head[8]
        if version in (0, 1):
            if len(head) < 24 or head[13] != 8 or head[14] != 8:
                raise Unsupported("offsets or lengths that are not 8 bytes")
            at = 24 + (4 if version == 1 else 0)
            base, _free, eof, driver = struct.unpack_from("<4Q", head, at)
            if base != 0 or driver != UNDEF:
                raise Unsupported("a base address or a driver information block")
            at += 32
            if len(head) < at + 40:
                raise Unsupported("truncated superblock")
            _name, root, cache, _scratch = _SYMBOL_ENTRY.unpack_from(head, at)
            self._check_eof(eof)
            return root
        if version in (2, 3):
            if head[9] != 8 or head[10] != 8:
                raise Unsupported("offsets or lengths that are not 8 bytes")
            base, ext, eof, root = struct.unpack_from("<4Q", head, 12)
            if base != 0 or ext != UNDEF:
                raise Unsupported("a base address or a superblock extension")
            self._check_eof(eof)
            return root
        raise Unsupported(f"superblock version {version}")

    def _check_eof(self, eof: int) -> None:
        if eof > self.size:
            raise Unsupported(f"the superblock says the file ends at {eof} but it has {self.size} bytes (truncated)")

    # -- object headers ----------------------------------------------------------------------
    def messages(self, address: int) -> list[tuple[int, bytes]]:
        """(type, body) of every message of the object header at ``address``, continuation
        blocks followed (each once)."""
        self._budget -= 1
        if self._budget < 0:
            raise Unsupported("too many objects (a looping structure?)")
        if address >= self.size:
            raise Unsupported(f"object header at {address} lies past the end of the file")
        buf, i = self._window(address, min(FIRST_READ, self.size - address))
        out: list[tuple[int, bytes]] = []
        pending: list[tuple[int, int]] = []
        if buf[i] == 1 and i + 16 <= len(buf):  # version 1 (h5py's default): the chunk sliced from the window once
            count = buf[i + 2] | buf[i + 3] << 8
            size = _U32.unpack_from(buf, i + 8)[0]
            start = i + 16
            chunk = buf[start : start + size] if start + size <= len(buf) else self._block(address + 16, size)
            self._v1_messages(chunk, out, pending)
            if pending:
                seen: set[int] = {address}
                while pending:
                    at, length = pending.pop(0)
                    self._visit_block(at, seen)
                    self._v1_messages(self._block(at, length), out, pending)
            if len(out) > count:
                raise Unsupported(f"object header at {address} holds more messages than it declares")
            return out
        first = buf[i : i + min(FIRST_READ, self.size - address)]
        seen = {address}
        if first[:4] == b"OHDR":
            chunk = self._v2_first(address, first)
            self._v2_messages(chunk, 0, out, pending)
            while pending:
                at, length = pending.pop(0)
                self._visit_block(at, seen)
                block = self._block(at, length)
                if block[:4] != b"OCHK":
                    raise Unsupported(f"continuation block at {at} without its signature")
                self._v2_messages(block[:-4], 4, out, pending)
            return out
        # Neither a version-2 header nor a whole version-1 prefix (a truncated file, another version).
        raise Unsupported(f"object header at {address}: version {first[0] if first else None}")

    def _visit_block(self, at: int, seen: set[int]) -> None:
        if at in seen:
            raise Unsupported(f"object header continuation at {at} loops")
        seen.add(at)
        self._spend()

    def _block(self, at: int, length: int) -> bytes:
        if length > MAX_HEADER_BYTES:
            raise Unsupported(f"object header block of {length} bytes")
        return self.read(at, length)

    def _v1_messages(self, chunk: bytes, out: list, pending: list) -> None:
        unpack = _MSG1.unpack_from
        at, end = 0, len(chunk)
        while at + 8 <= end:
            mtype, size, flags = unpack(chunk, at)
            at += 8
            stop = at + size
            if stop > end:
                raise Unsupported("object header message past the end of its block")
            if flags & 0x02:  # shared message (a committed datatype, a shared dataspace)
                raise Unsupported(f"shared object header message of type {mtype}")
            if mtype == 0x10:
                pending.append(_continuation(chunk[at:stop]))
            elif mtype:  # (type 0: padding)
                out.append((mtype, chunk[at:stop], flags))
            at = stop

    def _v2_first(self, address: int, first: bytes) -> bytes:
        if len(first) < 6 or first[4] != 2:
            raise Unsupported(f"object header at {address}: version-2 header of version {first[4] if len(first) > 4 else None}")
        flags = first[5]
        at = 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
        width = 1 << (flags & 3)
        if len(first) < at + width:
            raise Unsupported("truncated object header")
        size = int.from_bytes(first[at : at + width], "little")
        at += width
        self._creation_order = bool(flags & 0x04)
        total = at + size + 4
        chunk = first[:total] if total <= len(first) else self._block(address, total) if total <= MAX_HEADER_BYTES else None
        if chunk is None:
            raise Unsupported(f"object header of {size} bytes")
        return chunk[at : at + size]

    def _v2_messages(self, chunk: bytes, at: int, out: list, pending: list) -> None:
        head = 6 if self._creation_order else 4
        end = len(chunk)
        while at + head <= end:
            mtype = chunk[at]
            size = _U16.unpack_from(chunk, at + 1)[0]
            flags = chunk[at + 3]
            at += head
            if at + size > end:
                raise Unsupported("object header message past the end of its block")
            if flags & 0x02:
                raise Unsupported(f"shared object header message of type {mtype}")
            body = chunk[at : at + size]
            at += size
            if mtype == 0x10:
                pending.append(_continuation(body))
            elif mtype:
                out.append((mtype, body, flags))

    # -- objects -----------------------------------------------------------------------------
    def object(self, address: int) -> Group | Dataset | None:
        """The group or dataset at ``address`` (None for a named datatype)."""
        msgs = self.messages(address)
        attrs: dict[bytes, Any] = {}
        dataset = links = datatype = False
        table = None
        for t, body, flags in msgs:  # one pass: what the object is, its attributes
            if flags & 0x80 and t not in KNOWN_MESSAGES:  # "always fail if unknown" messages
                raise Unsupported(f"unknown object header message {t} marked must-understand")
            if t < 0x08 and t != 0x02 and t != 0x06:  # dataspace, datatype, fill value...: a dataset's (read below)
                if t == 0x03:
                    datatype = True
                continue
            if t == 0x0C:
                name, attr = self._attribute(body)
                attrs[name] = attr
            elif t == 0x08:
                dataset = True
            elif t == 0x11:
                if table is None:
                    table = body
            elif t == 0x15:  # attribute info: dense attribute storage in a fractal heap
                _compact_only(body, "attribute", 2)
            elif t in (0x02, 0x06, 0x0A):
                links = True
        if dataset:
            return self._dataset(msgs, attrs)
        if table is not None:
            if len(table) < 16:
                raise Unsupported("truncated symbol table message")
            btree, heap = _TWO_U64.unpack_from(table, 0)
            return Group(self._symbol_table(btree, heap), attrs)
        if links:
            for t, body, _ in msgs:
                if t == 0x02:
                    _compact_only(body, "link", 8)
            found = [_link(body) for t, body, _ in msgs if t == 0x06]
            found.sort(key=lambda x: x[0])
            return Group(found, attrs)
        if datatype:
            return None  # a named (committed) datatype
        raise Unsupported(f"object at {address} is neither a group, a dataset nor a datatype")

    def _dataset(self, msgs: list, attrs: dict) -> Dataset:
        ds = Dataset()
        ds.attrs = attrs
        layout = None
        for t, body, flags in msgs:
            if t == 0x01:
                space = _dataspace(body)
                ds.null = space is None
                ds.shape = space or ()
            elif t == 0x03:
                if flags & 0x02:
                    raise Unsupported("a dataset of a committed datatype")
                ds.dtype, ds.vlen = _datatype(body)
            elif t == 0x08:
                layout = body
            elif t in (0x07, 0x0B):  # external files, filters: h5py reads these
                raise Unsupported("external storage or a filter pipeline")
        if ds.dtype is None or layout is None or len(layout) < 2:
            raise Unsupported("a dataset without a datatype or layout")
        ds.layout = layout[1]
        # Version 4 (h5py's libver="latest") stores contiguous and compact layouts as version 3
        # does; its chunk indexes (and virtual datasets) are left to h5py.
        if layout[0] != 3 and not (layout[0] == 4 and ds.layout in (COMPACT, CONTIGUOUS)):
            raise Unsupported(f"data layout message version {layout[0]} of class {ds.layout}")
        if ds.layout == CONTIGUOUS:
            if len(layout) < 18:
                raise Unsupported("truncated layout message")
            address, size = struct.unpack_from("<QQ", layout, 2)
            if address != UNDEF:
                if address + size > self.size:
                    raise Unsupported(f"contiguous data at {address} ({size} bytes) past the end of the file")
                ds.address, ds.storage = address, size
        elif ds.layout == COMPACT:
            if len(layout) < 4:
                raise Unsupported("truncated layout message")
            size = _U16.unpack_from(layout, 2)[0]
            if 4 + size > len(layout):
                raise Unsupported("compact data past the end of its message")
            ds.storage = size
        elif ds.layout == CHUNKED:
            if len(layout) < 3:
                raise Unsupported("truncated layout message")
            rank = layout[2]
            if rank < 1 or rank > MAX_RANK + 1 or len(layout) < 11 + 4 * rank:
                raise Unsupported("chunked layout of unsupported rank")
            btree = _U64.unpack_from(layout, 3)[0]
            ds.storage = 0 if btree == UNDEF else self._chunk_storage(btree, rank)
        else:
            raise Unsupported(f"layout class {ds.layout}")
        return ds

    def _attribute(self, body: bytes) -> tuple[bytes, Attribute]:
        if len(body) < 8:
            raise Unsupported("truncated attribute message")
        version = body[0]
        if version == 1:
            name_size, dt_size, ds_size = struct.unpack_from("<HHH", body, 2)
            at, pad = 8, True
        elif version in (2, 3):
            if body[1] & 0x03:
                raise Unsupported("an attribute of a shared datatype or dataspace")
            name_size, dt_size, ds_size = struct.unpack_from("<HHH", body, 2)
            at, pad = (9 if version == 3 else 8), False
        else:
            raise Unsupported(f"attribute message version {version}")

        def field(n: int) -> bytes:
            nonlocal at
            if at + n > len(body):
                raise Unsupported("truncated attribute message")
            out = body[at : at + n]
            at += ((n + 7) & ~7) if pad else n
            return out

        name = field(name_size).rstrip(b"\0")
        dtype, vlen = _datatype(field(dt_size))
        shape = _dataspace(field(ds_size))
        count = 0 if shape is None else math.prod(shape)
        itemsize = 16 if vlen else dtype.itemsize
        nbytes = count * itemsize
        if at + nbytes > len(body):
            raise Unsupported("attribute value past the end of its message")
        return name, Attribute(dtype, shape, body[at : at + nbytes], vlen)

    def attribute_value(self, attr: Attribute, decode: bool = False) -> np.ndarray:
        """The value as h5py's low-level read gives it: an array (``object`` of ``str`` for
        variable-length UTF-8 strings, of ``bytes`` for ASCII ones, or ``str`` too with
        ``decode``, as h5py's ``attrs[name]`` gives them)."""
        import numpy as np  # noqa: PLC0415 - numpy only where values are read

        shape = attr.shape if attr.shape is not None else ()
        if attr.vlen is None:
            return np.frombuffer(attr.raw, dtype=attr.dtype.dtype).reshape(shape).copy()
        out = np.empty(shape, dtype=object)
        flat = out.reshape(-1)
        for i, item in enumerate(self.strings(attr, decode)):
            flat[i] = item
        return out

    def strings(self, attr: Attribute, decode: bool = False) -> list[str | bytes]:
        """The elements of a string attribute (fixed-length or variable-length) in C order, as
        Python objects, without numpy: each element as :meth:`attribute_value`'s array holds it
        (``bytes`` of a fixed-length string without its trailing NULs, as numpy gives them)."""
        count = math.prod(attr.shape) if attr.shape is not None else 0
        if attr.vlen is None:
            if attr.dtype.kind != "S":
                raise Unsupported("not a string attribute")
            size = attr.dtype.itemsize
            raw = attr.raw
            return [raw[i : i + size].rstrip(b"\0") for i in range(0, count * size, size)]
        out: list[str | bytes] = []
        for i in range(count):
            length, collection, index = struct.unpack_from("<IQI", attr.raw, 16 * i)
            data = self._global(collection, index) if collection else b""
            if len(data) < length:
                raise Unsupported("variable-length string longer than its heap object")
            data = data[:length]
            if attr.vlen == "str" or decode:
                try:
                    out.append(data.decode("utf-8"))
                except UnicodeDecodeError:
                    raise Unsupported("a UTF-8 string attribute that is not UTF-8") from None
            else:
                out.append(data)
        return out

    def _global(self, collection: int, index: int) -> bytes:
        objects = self._heaps.get(collection)
        if objects is None:
            self._spend()
            head = self.read(collection, 16)
            if head[:4] != b"GCOL" or head[4] != 1:
                raise Unsupported(f"no global heap collection at {collection}")
            size = _U64.unpack_from(head, 8)[0]
            if size < 16 or size > MAX_HEADER_BYTES:
                raise Unsupported(f"global heap collection of {size} bytes")
            data = self.read(collection, size)
            objects = {}
            at = 16
            while at + 16 <= size:
                number, _refs, length = struct.unpack_from("<HH4xQ", data, at)
                if number == 0:  # free space: the rest of the collection
                    break
                if at + 16 + length > size:
                    raise Unsupported("global heap object past the end of its collection")
                objects[number] = data[at + 16 : at + 16 + length]
                at += 16 + ((length + 7) & ~7)
            self._heaps[collection] = objects
        if index not in objects:
            raise Unsupported(f"no object {index} in the global heap collection at {collection}")
        return objects[index]

    # -- groups ------------------------------------------------------------------------------
    def _symbol_table(self, btree: int, heap: int) -> list[tuple[bytes, int]]:
        self._spend()
        buf, i = self._window(heap, 32)
        if buf[i : i + 5] != b"HEAP\0":
            raise Unsupported(f"no local heap at {heap}")
        size, _free, data_at = _HEAP.unpack_from(buf, i + 8)
        if size > MAX_HEADER_BYTES:
            raise Unsupported(f"local heap of {size} bytes")
        if data_at == heap + 32 and i + 32 + size <= len(buf):  # the names follow the heap's header
            names = buf[i + 32 : i + 32 + size]
        else:
            names = self.read(data_at, size)
        find = names.find
        entry = _SYMBOL_ENTRY.unpack_from
        links: list[tuple[bytes, int]] = []
        append = links.append
        for address in self._symbol_nodes(btree):
            self._spend()
            buf, i = self._window(address, 8)
            if buf[i : i + 5] != b"SNOD\1":
                raise Unsupported(f"no symbol table node at {address}")
            count = buf[i + 6] | buf[i + 7] << 8
            if i + 8 + 40 * count <= len(buf):  # the entries follow in the same window
                i += 8
            else:
                buf, i = self._window(address + 8, 40 * count)
            for at in range(i, i + 40 * count, 40):
                name_at, obj, cache, _scratch = entry(buf, at)
                if cache == 2:
                    raise Unsupported("a soft link")
                end = find(b"\0", name_at)
                if name_at >= size or end < 0:
                    raise Unsupported("link name outside its local heap")
                append((names[name_at:end], obj))
        previous = None
        for name, _ in links:
            if previous is not None and previous >= name:
                raise Unsupported("group links out of order or repeated")
            previous = name
        return links

    def _symbol_nodes(self, btree: int) -> list[int]:
        """The symbol table nodes of a group's B-tree (:meth:`_btree` of node type 0), a root
        that is its only leaf (a group of up to a few dozen links) read here directly."""
        self._spend()
        buf, i = self._window(btree, 24)
        if buf[i : i + 6] != b"TREE\0\0":  # not a leaf root (or no B-tree): the general walk says which
            self._budget += 1
            return [child for child, _ in self._btree(btree, 0)]
        count = buf[i + 6] | buf[i + 7] << 8
        if i + 24 + count * 16 + 8 > len(buf):
            buf, i = self._window(btree + 24, count * 16 + 8)
        else:
            i += 24
        unpack = _U64.unpack_from
        return [unpack(buf, i + 8 + 16 * k)[0] for k in range(count)]

    def _btree(self, address: int, node_type: int, key_size: int = 8) -> list[tuple[int, bytes | None]]:
        """The children of the level-0 nodes of a v1 B-tree, depth first, left to right: symbol
        nodes (``node_type`` 0), or chunk addresses with their keys (1)."""
        seen: set[int] = set()
        out: list[tuple[int, bytes | None]] = []
        stack: list[tuple[int, int, int | None]] = [(address, 0, None)]  # (node, depth, level expected)
        step = key_size + 8
        signature = b"TREE" + bytes((node_type,))
        while stack:
            at, depth, expect = stack.pop()
            if at in seen:
                raise Unsupported(f"B-tree node at {at} reached twice (a loop)")
            seen.add(at)
            self._spend()
            buf, i = self._window(at, 24)
            if buf[i : i + 5] != signature:
                raise Unsupported(f"no B-tree node at {at}")
            level, count = buf[i + 5], buf[i + 6] | buf[i + 7] << 8
            if (expect is not None and level != expect) or depth > MAX_DEPTH or level > MAX_DEPTH:
                raise Unsupported("B-tree levels inconsistent")
            if i + 24 + count * step + key_size <= len(buf):  # the keys and children follow in the same window
                i += 24
            else:
                buf, i = self._window(at + 24, count * step + key_size)
            first = i + key_size
            if level == 0 and node_type == 0:
                if count == 1:  # a small group: one symbol node
                    out.append((_U64.unpack_from(buf, first)[0], None))
                else:
                    out.extend((_U64.unpack_from(buf, first + step * k)[0], None) for k in range(count))
                continue
            children = [_U64.unpack_from(buf, first + step * k)[0] for k in range(count)]
            if level == 0:
                out.extend((child, buf[i + step * k : i + step * k + key_size]) for k, child in enumerate(children))
            else:
                stack.extend((child, depth + 1, level - 1) for child in reversed(children))
        return out

    def _chunk_storage(self, btree: int, rank: int) -> int:
        total = 0
        for address, key in self._btree(btree, 1, key_size=8 + 8 * rank):
            size = _U32.unpack_from(key, 0)[0]  # type: ignore[arg-type]
            if address + size > self.size:
                raise Unsupported(f"chunk at {address} past the end of the file")
            total += size
        return total


KNOWN_MESSAGES = frozenset({0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x08, 0x0A, 0x0C, 0x10, 0x11, 0x12, 0x15, 0x16})


def _continuation(body: bytes) -> tuple[int, int]:
    if len(body) < 16:
        raise Unsupported("truncated continuation message")
    return struct.unpack_from("<QQ", body, 0)


def _compact_only(body: bytes, what: str, index_bytes: int) -> None:
    """A link info or attribute info message (``what``): refuse dense storage (a fractal heap
    address defined), the one part of it our reader does not follow. ``index_bytes`` is the
    optional creation-order field flag bit 0 adds (8 for links, 2 for attributes)."""
    if len(body) < 2 or body[0] != 0:
        raise Unsupported(f"{what} info message of an unknown version")
    at = 2 + (index_bytes if body[1] & 1 else 0)
    if len(body) < at + 8:
        raise Unsupported(f"truncated {what} info message")
    if _U64.unpack_from(body, at)[0] != UNDEF:
        raise Unsupported(f"dense {what} storage (a fractal heap)")


def _link(body: bytes) -> tuple[bytes, int]:
    if len(body) < 2 or body[0] != 1:
        raise Unsupported("link message of an unknown version")
    flags = body[1]
    at = 2
    kind = HARD
    if flags & 0x08:
        kind = body[at]
        at += 1
    if flags & 0x04:
        at += 8
    if flags & 0x10:
        at += 1
    width = 1 << (flags & 3)
    if len(body) < at + width:
        raise Unsupported("truncated link message")
    length = int.from_bytes(body[at : at + width], "little")
    at += width
    name = body[at : at + length]
    at += length
    if kind != HARD:
        raise Unsupported("a soft, external or user-defined link")
    if len(name) != length or len(body) < at + 8 or not length:
        raise Unsupported("truncated link message")
    return name, _U64.unpack_from(body, at)[0]


def _dataspace(body: bytes) -> tuple[int, ...] | None:
    """The shape (``()`` for a scalar), or None for a null dataspace."""
    if len(body) < 4:
        raise Unsupported("truncated dataspace message")
    version, rank = body[0], body[1]  # body[2]: flags (maximum dimensions follow; not needed)
    if version == 1:
        at = 8
        kind = 1 if rank else 0  # version 1 has no null dataspace; rank 0 is a scalar
    elif version == 2:
        at = 4
        kind = body[3]
    else:
        raise Unsupported(f"dataspace message version {version}")
    if kind == 2:
        return None
    if kind == 0:
        return ()
    if kind != 1 or rank > MAX_RANK or len(body) < at + 8 * rank:
        raise Unsupported("dataspace of an unsupported kind or rank")
    return _DIMS[rank].unpack_from(body, at)


_DIMS = [struct.Struct(f"<{rank}Q") for rank in range(MAX_RANK + 1)]
_INTS = {(1, False): "u1", (2, False): "u2", (4, False): "u4", (8, False): "u8",
         (1, True): "i1", (2, True): "i2", (4, True): "i4", (8, True): "i8"}
# size -> (precision, exponent location, exponent size, mantissa location, mantissa size, bias)
_IEEE = {2: (16, 10, 5, 0, 10, 15), 4: (32, 23, 8, 0, 23, 127), 8: (64, 52, 11, 0, 52, 1023)}
_DTYPES: dict[bytes, tuple[DType, str | None]] = {}


def _datatype(body: bytes) -> tuple[DType, str | None]:
    """The numpy dtype h5py gives this datatype, and ``"str"``/``"bytes"`` for variable-length
    strings (dtype ``object``)."""
    cached = _DTYPES.get(body)
    if cached is not None:
        return cached
    out = _parse_datatype(body)
    if len(_DTYPES) < 256:
        _DTYPES[bytes(body)] = out
    return out


def _parse_datatype(body: bytes) -> tuple[DType, str | None]:
    if len(body) < 8:
        raise Unsupported("truncated datatype message")
    cls, version = body[0] & 0x0F, body[0] >> 4
    bits = body[1] | body[2] << 8 | body[3] << 16
    size = _U32.unpack_from(body, 4)[0]
    order = ">" if bits & 1 else "<"
    if version not in (1, 2, 3, 4):  # 4: h5py's libver="latest" (its enumerations as version 3's)
        raise Unsupported(f"datatype version {version}")
    if cls == 0:  # fixed-point
        if len(body) < 12 or struct.unpack_from("<HH", body, 8) != (0, 8 * size) or (size, bool(bits & 8)) not in _INTS:
            raise Unsupported("an integer type numpy has no dtype for")
        signed = bool(bits & 8)
        return _dtype(order, "i" if signed else "u", size, f"{'int' if signed else 'uint'}{8 * size}"), None
    if cls == 1:  # floating point
        if size not in _IEEE or bits & 0x40 or len(body) < 20:
            raise Unsupported("a floating-point type other than IEEE half, single or double")
        offset, precision = struct.unpack_from("<HH", body, 8)
        layout = (precision, body[12], body[13], body[14], body[15], _U32.unpack_from(body, 16)[0])
        if offset != 0 or layout != _IEEE[size] or (bits >> 8) & 0xFF != 8 * size - 1 or (bits >> 4) & 3 != 2:
            raise Unsupported("a floating-point type other than IEEE half, single or double")
        return _dtype(order, "f", size, f"float{8 * size}"), None
    if cls == 3:  # fixed-length string
        if size == 0:
            raise Unsupported("a zero-length string type")
        return _dtype("|", "S", size, f"bytes{8 * size}"), None
    if cls == 9:  # variable-length
        if bits & 0x0F != 1:
            raise Unsupported("a variable-length sequence")
        charset = (bits >> 8) & 0x0F
        return OBJECT, ("str" if charset == 1 else "bytes")
    if cls == 8:  # enumeration: h5py's boolean (int8 FALSE=0, TRUE=1) only
        base, _ = _datatype(body[8:])
        if base.str != "|i1" or (bits & 0xFFFF) != 2:
            raise Unsupported("an enumeration other than h5py's boolean")
        at = 8 + 12
        names = []
        for _ in range(2):
            end = body.find(b"\0", at)
            if end < 0:
                raise Unsupported("truncated enumeration")
            names.append(body[at:end])
            at = end + 1 if version >= 3 else at + ((end - at + 8) & ~7)
        if names != [b"FALSE", b"TRUE"] or body[at : at + 2] != b"\x00\x01":
            raise Unsupported("an enumeration other than h5py's boolean")
        return BOOL, None
    raise Unsupported(f"datatype class {cls}")
