"""A read-only reader of tensorstore's OCDBT databases (the key-value store Orbax writes arrays
into), for the listing: the keys of a database and the small values ``ls`` needs (each array's
``zarr.json``, a scalar's chunk), without importing tensorstore.

The format is tensorstore's own specification (``tensorstore/kvstore/ocdbt/index.rst``): a
``manifest.ocdbt`` (config, data file table, the newest versions inline) pointing at B+tree nodes
in log-structured data files (``d/<hex>``); a node is ``magic (u32 big-endian), length (u64
little-endian), version (varint), compression (varint: 0 none, 1 zstd)``, a body, and a crc32c
(u32 little-endian) of everything before it. Leaf nodes hold each value inline or as a reference
(file, offset, length) into a data file; a database that joins other databases (Orbax's
``pytree/manifest.ocdbt`` over ``ocdbt.process_N/``) names their files by relative paths.

Everything is checked and bounded: every node's checksum, lengths against the bytes present,
decompressed sizes, key lengths, entries per node, tree depth, total keys; data file paths that
would leave the database are refused. Any inconsistency is one :class:`CorruptCheckpointError`.
Node bodies are zstd-compressed: decoded with the ``zstandard`` package (the ``[orbax]`` extra).
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Iterator

from ...errors import CorruptCheckpointError, UnsafeFileError, UsageError
from .. import _fs

__all__ = ["MANIFEST", "ValueRef", "Database", "open_database", "zstd_decompress"]

MANIFEST = "manifest.ocdbt"
MANIFEST_MAGIC = 0x0CDB3A2A
BTREE_MAGIC = 0x0CDB20DE
MAX_MANIFEST_BYTES = 16 << 20
MAX_NODE_BYTES = 64 << 20  # one encoded node
MAX_DECODED_BYTES = 256 << 20  # one decoded node (the config's max_decoded_node_bytes, capped)
MAX_ENTRIES = 1 << 20  # entries of one node (tensorstore's kMaxNodeArity)
MAX_KEY_BYTES = 65535
MAX_PATH_BYTES = 65535
MAX_DEPTH = 32
MAX_KEYS = 10_000_000  # keys listed from one database
MAX_FILES = 1 << 20  # data files named in one table
INSTALL_HINT = "pip install 'ckptinspect[orbax]'"
_HEADER = struct.Struct(">IQ")  # magic (big-endian), then the length, read as little-endian below


@dataclasses.dataclass(frozen=True)
class ValueRef:
    """Where a value is: inline bytes, or ``length`` bytes at ``offset`` of data file ``path``."""

    length: int
    inline: bytes | None = None
    path: str | None = None
    offset: int = 0


class _Reader:
    """A cursor over bytes; every read is checked against what is there."""

    __slots__ = ("buf", "pos", "what")

    def __init__(self, buf: bytes, what: str):
        self.buf, self.pos, self.what = buf, 0, what

    def fail(self, problem: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"{self.what}: {problem}")

    def varint(self) -> int:
        value = shift = 0
        buf, pos = self.buf, self.pos
        while True:
            if pos >= len(buf):
                raise self.fail("truncated (a number runs past the end)")
            b = buf[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift > 63:
                raise self.fail("a number of more than 64 bits")
        self.pos = pos
        return value

    def byte(self) -> int:
        if self.pos >= len(self.buf):
            raise self.fail("truncated")
        self.pos += 1
        return self.buf[self.pos - 1]

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise self.fail(f"truncated ({n} bytes declared, {len(self.buf) - self.pos} left)")
        self.pos += n
        return self.buf[self.pos - n : self.pos]

    def u64le(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def bounded(self, limit: int, name: str) -> int:
        n = self.varint()
        if n > limit:
            raise self.fail(f"{name} {n} (limit {limit})")
        return n


def zstd_decompress(data: bytes, limit: int, what: str) -> bytes:
    """One zstd frame, decoded to at most ``limit`` bytes."""
    try:
        import zstandard  # noqa: PLC0415 - the [orbax] extra, loaded for Orbax checkpoints only
    except ImportError:
        raise UsageError(f"reading Orbax checkpoints needs zstandard: {INSTALL_HINT}") from None
    parts: list[bytes] = []
    got = 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(data) as reader:
            while got <= limit:
                part = reader.read(min(limit + 1 - got, 1 << 20))
                if not part:
                    break
                parts.append(part)
                got += len(part)
        if got > limit:
            raise UnsafeFileError(f"{what}: decodes to more than {limit} bytes; refusing")
        whole = zstandard.ZstdDecompressor().decompressobj()  # bounded now: a cut frame is no EOF
        out = whole.decompress(data)
        if not whole.eof or out != b"".join(parts):
            raise CorruptCheckpointError(f"{what}: zstd data cut short")
    except zstandard.ZstdError as e:
        raise CorruptCheckpointError(f"{what}: zstd data does not decode: {e}") from None
    return out


def _crc32c(data: bytes) -> int:
    import google_crc32c  # noqa: PLC0415 - a dependency of the package

    return google_crc32c.value(data)


def _decode(raw: bytes, magic: int, what: str, limit: int) -> _Reader:
    """An encoded manifest or node: header and checksum checked, the body decompressed."""
    if len(raw) < 12 + 2 + 4:
        raise CorruptCheckpointError(f"{what}: {len(raw)} bytes, too short for an OCDBT header")
    found = struct.unpack(">I", raw[:4])[0]
    if found != magic:
        raise CorruptCheckpointError(f"{what}: magic {found:#010x}, expected {magic:#010x} (not OCDBT data)")
    length = struct.unpack("<Q", raw[4:12])[0]
    if length != len(raw):
        raise CorruptCheckpointError(f"{what}: declares {length} bytes, {len(raw)} are there")
    stored = struct.unpack("<I", raw[-4:])[0]
    if _crc32c(raw[:-4]) != stored:
        raise CorruptCheckpointError(f"{what}: checksum mismatch (the bytes were changed or cut)")
    head = _Reader(raw[:-4], what)
    head.pos = 12
    version = head.varint()
    if version != 0:
        raise CorruptCheckpointError(f"{what}: format version {version} (this reader knows 0)")
    compression = head.varint()
    body = raw[head.pos : -4]
    if compression == 1:
        body = zstd_decompress(body, limit, what)
    elif compression != 0:
        raise CorruptCheckpointError(f"{what}: compression {compression} (expected 0 or 1)")
    return _Reader(body, what)


def _safe_path(path: bytes, what: str) -> str:
    try:
        text = path.decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptCheckpointError(f"{what}: a data file path that is not UTF-8") from None
    parts = text.split("/")
    if text.startswith("/") or "\\" in text or "\x00" in text or any(p in ("..",) for p in parts):
        raise UnsafeFileError(f"{what}: data file path {text[:120]!r} leaves the database; refusing")
    return text


def _file_table(r: _Reader, transitive: str) -> list[tuple[str, str]]:
    """The data file table: (base path, full path) per file, relative to the database."""
    n = r.bounded(MAX_FILES, "data files")
    prefix = [0] + [r.bounded(MAX_PATH_BYTES, "path prefix length") for _ in range(max(0, n - 1))]
    suffix = [r.bounded(MAX_PATH_BYTES, "path length") for _ in range(n)]
    base = [r.bounded(MAX_PATH_BYTES, "base path length") for _ in range(n)]
    files: list[tuple[str, str]] = []
    prev = b""
    for i in range(n):
        if prefix[i] > len(prev):
            raise r.fail(f"data file {i}: prefix of {prefix[i]} bytes, the previous path has {len(prev)}")
        path = prev[: prefix[i]] + r.take(suffix[i])
        if base[i] > len(path):
            raise r.fail(f"data file {i}: base path of {base[i]} bytes, the path has {len(path)}")
        full = _safe_path(transitive.encode() + path, r.what)
        files.append((transitive + _safe_path(path[: base[i]], r.what) if base[i] else transitive, full))
        prev = path
    return files


def _refs(r: _Reader, files: list[tuple[str, str]], count: int) -> list[tuple[tuple[str, str], int, int]]:
    """``count`` references: file ids, then offsets, then lengths (columns); a missing one (an
    empty database's root) is ``(("", ""), 0, 0)``."""
    ids = [r.varint() for _ in range(count)]
    offsets = [r.varint() for _ in range(count)]
    lengths = [r.varint() for _ in range(count)]
    out = []
    for i, o, n in zip(ids, offsets, lengths):
        if n == 0 and not files:
            out.append((("", ""), 0, 0))
            continue
        if i >= len(files):
            raise r.fail(f"data file id {i} outside the table of {len(files)}")
        out.append((files[i], o, n))
    return out


def _keys(r: _Reader, n: int, interior: bool) -> tuple[list[bytes], list[int]]:
    """The node's keys (relative to the node's prefix) and, for an interior node, each child's
    subtree common prefix length."""
    prefix = [0] + [r.bounded(MAX_KEY_BYTES, "key prefix length") for _ in range(n - 1)]
    suffix = [r.bounded(MAX_KEY_BYTES, "key length") for _ in range(n)]
    common = [r.bounded(MAX_KEY_BYTES, "subtree prefix length") for _ in range(n)] if interior else []
    keys: list[bytes] = []
    prev = b""
    for i in range(n):
        if prefix[i] > len(prev):
            raise r.fail(f"key {i}: prefix of {prefix[i]} bytes, the previous key has {len(prev)}")
        key = prev[: prefix[i]] + r.take(suffix[i])
        if len(key) > MAX_KEY_BYTES or (i and key <= prev):
            raise r.fail(f"key {i}: out of order or too long")
        if interior and common[i] > len(key):
            raise r.fail(f"key {i}: subtree prefix of {common[i]} bytes, the key has {len(key)}")
        keys.append(key)
        prev = key
    return keys, common


class Database:
    """One OCDBT database directory, opened at its newest version (keys and small values).

    Attributes:
        path: The directory holding ``manifest.ocdbt``.
        root: The newest version's root node (file, offset, length, height), or None (empty).
    """

    def __init__(self, path: str):
        self.path = path
        self._budget = MAX_KEYS
        manifest = _fs.join(path, MANIFEST)
        raw = _fs.read_bytes(manifest, limit=MAX_MANIFEST_BYTES, what="OCDBT manifest")
        r = _decode(raw, MANIFEST_MAGIC, manifest, MAX_DECODED_BYTES)
        r.take(16)  # uuid
        kind = r.byte()
        self.max_inline = r.varint()
        self.max_decoded = min(r.varint() or MAX_DECODED_BYTES, MAX_DECODED_BYTES)
        arity = r.byte()
        if not 0 < arity < 64:
            raise r.fail(f"version tree arity log2 {arity}")
        if r.varint() == 1:
            r.take(4)  # zstd level
        if kind != 0:
            raise CorruptCheckpointError(f"{manifest}: a numbered (coordinated) manifest; only single-file manifests are read")
        files = _file_table(r, "")
        n = r.bounded(1 << arity, "inline versions")
        if n == 0:
            raise r.fail("no version")
        for _ in range(n):
            r.varint()  # generation numbers
        heights = [r.byte() for _ in range(n)]
        roots = _refs(r, files, n)
        self.root = None
        (base, full), offset, length = roots[-1]
        if length:
            self.root = (base, full, offset, length, heights[-1])

    # -- reading --------------------------------------------------------------------------
    def _read(self, path: str, offset: int, length: int, what: str) -> bytes:
        full = _fs.join(self.path, path)
        size = _fs.check_regular(full)
        if offset + length > size:
            raise CorruptCheckpointError(f"{full}: {what} at {offset}+{length} runs past the end ({size} bytes)")
        return _fs.read_range(full, offset, length)

    def read_value(self, ref: ValueRef) -> bytes:
        """The bytes of a value (inline, or read from its data file)."""
        if ref.inline is not None:
            return ref.inline
        return self._read(ref.path or "", ref.offset, ref.length, "a value")

    def _node(self, full: str, offset: int, length: int) -> _Reader:
        if length > MAX_NODE_BYTES:
            raise UnsafeFileError(f"{_fs.join(self.path, full)}: a B+tree node of {length} bytes; refusing")
        raw = self._read(full, offset, length, "a B+tree node")
        return _decode(raw, BTREE_MAGIC, f"{_fs.join(self.path, full)} (B+tree node at {offset})", self.max_decoded)

    def items(self, with_values: bool = True) -> Iterator[tuple[bytes, ValueRef | None]]:
        """Every key in order, with where its value is (None when ``with_values`` is off)."""
        if self.root is None:
            return
        base, full, offset, length, height = self.root
        yield from self._walk(b"", base, full, offset, length, height, 0, with_values)

    def _walk(self, prefix: bytes, base: str, full: str, offset: int, length: int, height: int, depth: int,
              with_values: bool) -> Iterator[tuple[bytes, ValueRef | None]]:
        """The keys under one node; ``base`` is the base path its file was named under (the
        transitive path of the files its own table names)."""
        if depth > MAX_DEPTH:
            raise CorruptCheckpointError(f"{self.path}: the B+tree is more than {MAX_DEPTH} levels deep")
        r = self._node(full, offset, length)
        found = r.byte()
        if found != height:
            raise r.fail(f"height {found}, its parent says {height}")
        files = _file_table(r, base)
        n = r.bounded(MAX_ENTRIES, "entries")
        if n == 0:
            raise r.fail("an empty node")
        keys, common = _keys(r, n, interior=height > 0)
        if height > 0:
            children = _refs(r, files, n)
            for i in range(n):
                child_file, child_offset, child_length = children[i]
                yield from self._walk(prefix + keys[i][: common[i]], child_file[0], child_file[1], child_offset,
                                      child_length, height - 1, depth + 1, with_values)
            return
        self._budget -= n
        if self._budget < 0:
            raise UnsafeFileError(f"{self.path}: more than {MAX_KEYS} keys; refusing")
        lengths = [r.varint() for _ in range(n)]
        kinds = [r.byte() for _ in range(n)]
        if any(k > 1 for k in kinds):
            raise r.fail("a value kind other than inline (0) or out of line (1)")
        indirect = [i for i in range(n) if kinds[i] == 1]
        ids = [r.varint() for _ in indirect]
        offsets = [r.varint() for _ in indirect]
        refs: dict[int, ValueRef] = {}
        for i, fid, off in zip(indirect, ids, offsets):
            if fid >= len(files):
                raise r.fail(f"data file id {fid} outside the table of {len(files)}")
            refs[i] = ValueRef(lengths[i], None, files[fid][1], off)
        for i in range(n):
            if kinds[i] == 0:
                value = r.take(lengths[i])
                refs[i] = ValueRef(lengths[i], value if with_values else None)
        for i in range(n):
            yield prefix + keys[i], refs[i] if with_values else None


def open_database(path: str) -> Database:
    """Open the OCDBT database in directory ``path`` (its ``manifest.ocdbt``).

    Raises:
        CorruptCheckpointError, UnsafeFileError, CheckpointNotFoundError.
        UsageError: zstandard is not installed.
    """
    return Database(path)
