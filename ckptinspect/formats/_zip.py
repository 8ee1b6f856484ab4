"""Zip archives read in place (``.keras`` archives, ``.npz`` files): nothing is extracted to disk.

:func:`open_zip_archive` opens one (a regular local file, or a remote one read whole);
:func:`check_archive` refuses, from the central directory alone, member names that are absolute
or climb out with ``..`` (path traversal, :class:`~ckptinspect.errors.UnsafeFileError`), names
that occur twice (damage: :class:`~ckptinspect.errors.CorruptCheckpointError`) and members that
declare far more uncompressed bytes than they store (zip bombs). :func:`open_member` gives a
seekable, read-only stream of one member: a stored member as a window onto the archive's own
bytes, a deflated one as a window that inflates on demand, keeping a snapshot of the
decompressor every few MiB (memory: the snapshots and one input block, never the member), any
other compression through zipfile's own stream. :func:`member_head` reads the first bytes of
a member; :func:`member_damage` is ``verify``'s CRC-32 check of every member.
"""

from __future__ import annotations

import bisect
import collections
import io
import re
import struct
import zipfile
import zlib
from typing import Any, BinaryIO, Callable

from .. import model as m
from ..errors import CorruptCheckpointError, NotACheckpointError, UnsafeFileError, one_line
from . import _fs
from ._readcheck import Opened, ReadCheck

__all__ = ["FileWindow", "open_zip_archive", "check_archive", "check_duplicates", "check_bomb", "open_member", "member_head", "member_damage"]

ZIP_LOCAL_HEADER_SIGNATURE = b"PK\x03\x04"
ZIP_LOCAL_HEADER = struct.Struct("<4s5HL2L2H")  # 30 bytes; the last two are name/extra lengths

# Limits: a member larger than BOMB_FLOOR_BYTES may expand at most MAX_EXPANSION times its
# stored size (DEFLATE tops out near 1032:1; Keras stores members uncompressed).
BOMB_FLOOR_BYTES = 64 << 20
MAX_EXPANSION = 100
# Inflating a deflated member on demand: compressed bytes read at a time; a decompressor
# snapshot (about 45 KiB each) every INFLATE_SNAPSHOT_BYTES of output, at most
# MAX_INFLATE_SNAPSHOTS of them (the interval grows for larger members).
INFLATE_INPUT_BYTES = 256 << 10
INFLATE_SNAPSHOT_BYTES = 4 << 20
MAX_INFLATE_SNAPSHOTS = 512
RAW_DEFLATE_WBITS = -15
ZIP_FLAG_ENCRYPTED = 0x1
MEMBER_CHUNK_BYTES = 8 << 20  # bytes of a member held at a time when checking its CRC
WINDOWS_DRIVE_RE = re.compile(r"^[A-Za-z]:")


# -- reading the archive in place --------------------------------------------------------
class _Window(io.RawIOBase):
    """A read-only, seekable stream of ``size`` bytes; subclasses provide ``readinto``."""

    def __init__(self, size: int):
        super().__init__()
        self._size = size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos


class FileWindow(_Window):
    """A read-only, seekable view of ``size`` bytes at ``start`` of an open file, which it owns
    (closed with it): a stored zip member, a zstd frame in an Orbax data file."""

    def __init__(self, f: BinaryIO, start: int, size: int):
        super().__init__(size)
        self._f = f
        self._start = start
        if getattr(f, "prefetch", None) is not None:  # a remote archive: spans fetched together (see _fs.prefetch)
            self.prefetch = self._prefetch

    def _prefetch(self, spans: list[tuple[int, int]], at_least: int = 0) -> None:
        self._f.prefetch([(self._start + offset, min(n, self._size - offset)) for offset, n in spans if 0 <= offset < self._size],
                         at_least)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._size - self._pos))
        if n == 0:
            return 0
        self._f.seek(self._start + self._pos)
        got = self._f.readinto(view[:n])
        self._pos += got or 0
        return got or 0

    def close(self) -> None:
        try:
            self._f.close()
        finally:
            super().close()


class _InflateWindow(_Window):
    """A read-only, seekable view of a deflated member's uncompressed bytes.

    Bytes are inflated on demand from the archive file. Every ``interval`` bytes of output a
    copy of the decompressor is kept, so a seek backwards resumes from the nearest snapshot
    rather than the member's start, and a seek forwards inflates and discards. Memory: the
    snapshots (at most :data:`MAX_INFLATE_SNAPSHOTS`), one input block and the caller's buffer.
    """

    def __init__(self, f: BinaryIO, start: int, compress_size: int, size: int):
        super().__init__(size)
        self._f = f
        self._start = start
        self._csize = compress_size
        self._interval = max(INFLATE_SNAPSHOT_BYTES, -(-size // MAX_INFLATE_SNAPSHOTS))
        first = zlib.decompressobj(RAW_DEFLATE_WBITS)
        self._snap_out: list[int] = [0]  # output offset of each snapshot, ascending
        self._snaps: list[tuple[int, Any]] = [(0, first)]  # (compressed offset, decompressor)
        self._d = first.copy()
        self._out = 0  # output offset the decompressor is at
        self._in = 0  # compressed bytes consumed from the file (beyond unconsumed_tail)

    def _inflate(self, limit: int) -> bytes:
        """Up to ``limit`` next bytes of output; b"" at the end of the stream."""
        while True:
            data = self._d.unconsumed_tail
            if not data and not self._d.eof and self._in < self._csize:
                self._f.seek(self._start + self._in)
                data = self._f.read(min(INFLATE_INPUT_BYTES, self._csize - self._in))
                if not data:
                    raise OSError("the archive ends inside the member's compressed bytes")
                self._in += len(data)
            if not data or self._d.eof:
                return b""
            out = self._d.decompress(data, limit)
            if out:
                self._out += len(out)
                if self._out >= self._snap_out[-1] + self._interval:
                    self._snap_out.append(self._out)
                    self._snaps.append((self._in, self._d.copy()))
                return out

    def _move_to(self, target: int) -> None:
        if target < self._out or target - self._out > self._interval:
            i = bisect.bisect_right(self._snap_out, target) - 1
            if self._snap_out[i] > self._out or target < self._out:
                self._in, state = self._snaps[i]
                self._d = state.copy()
                self._out = self._snap_out[i]
        while self._out < target:
            if not self._inflate(min(INFLATE_INPUT_BYTES, target - self._out)):
                return

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = max(0, min(len(view), self._size - self._pos))
        if want == 0:
            return 0
        try:
            if self._pos != self._out:
                self._move_to(self._pos)
            got = 0
            while got < want and self._out == self._pos + got:
                out = self._inflate(want - got)
                if not out:
                    break
                view[got : got + len(out)] = out
                got += len(out)
        except zlib.error as e:
            raise OSError(f"the member's deflate stream is damaged: {e}") from None
        self._pos += got
        return got

    def close(self) -> None:
        try:
            self._f.close()
        finally:
            self._snaps = []
            super().close()


class _ZipStream(io.RawIOBase):
    """A seekable zip member stream that closes the archive file with it."""

    def __init__(self, member: Any, f: BinaryIO):
        super().__init__()
        self._member = member
        self._f = f

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._member.tell()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._member.seek(offset, whence)

    def readinto(self, buffer: Any) -> int:
        data = self._member.read(len(memoryview(buffer)))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    def close(self) -> None:
        try:
            self._member.close()
            self._f.close()
        finally:
            super().close()


# -- refusals from the central directory ------------------------------------------------
def _check_member_names(path: str, zf: zipfile.ZipFile) -> None:
    for info in zf.infolist():
        name = info.filename
        parts = re.split(r"[/\\]", name)
        if name.startswith(("/", "\\")) or WINDOWS_DRIVE_RE.match(name) or ".." in parts or "\x00" in name:
            raise UnsafeFileError(f"{path}: archive member {name!r} escapes the archive (path traversal); refusing")


def check_duplicates(path: str, zf: zipfile.ZipFile) -> None:
    """Refuse an archive naming a member more than once (the first such name, in archive
    order): readers disagree on which copy counts, a known way to hide content. Damage, not
    unsafe: ``verify`` reports it.

    Raises:
        CorruptCheckpointError: A member name occurs twice or more.
    """
    counts = collections.Counter(info.filename for info in zf.infolist())
    for name, count in counts.items():
        if count > 1:
            raise CorruptCheckpointError(
                f"{path}: archive member {name!r} appears {count} times (readers disagree on which copy"
                " counts: a known way to hide content); refusing"
            )


def check_archive(path: str, zf: zipfile.ZipFile) -> None:
    """Every refusal that needs only the central directory: traversal, duplicates, bombs.

    Duplicate member names are damage (``verify`` reports them), the rest unsafe.
    """
    _check_member_names(path, zf)
    check_duplicates(path, zf)
    for info in zf.infolist():
        check_bomb(path, info)


def check_bomb(path: str, info: zipfile.ZipInfo) -> None:
    """Refuse a member larger than :data:`BOMB_FLOOR_BYTES` that declares more than
    :data:`MAX_EXPANSION` times the bytes it stores (a possible zip bomb).

    Raises:
        UnsafeFileError: The member would expand past that ratio.
    """
    if info.file_size > BOMB_FLOOR_BYTES and info.file_size > MAX_EXPANSION * max(info.compress_size, 1):
        raise UnsafeFileError(
            f"{path}: archive member {info.filename!r} declares {info.file_size} bytes but stores only"
            f" {info.compress_size} (more than {MAX_EXPANSION}:1); refusing a possible zip bomb"
        )


# -- members ----------------------------------------------------------------------------
def _data_offset(path: str, f: BinaryIO, info: zipfile.ZipInfo, archive_size: int) -> int:
    f.seek(info.header_offset)
    header = f.read(ZIP_LOCAL_HEADER.size)
    if len(header) != ZIP_LOCAL_HEADER.size or header[:4] != ZIP_LOCAL_HEADER_SIGNATURE:
        raise CorruptCheckpointError(f"{path}: bad local header for archive member {info.filename!r}")
    fields = ZIP_LOCAL_HEADER.unpack(header)
    start = info.header_offset + ZIP_LOCAL_HEADER.size + fields[-2] + fields[-1]
    if start + info.compress_size > archive_size:
        raise CorruptCheckpointError(
            f"{path}: truncated: member {info.filename!r} needs bytes {start}..{start + info.compress_size},"
            f" the archive has {archive_size}"
        )
    return start


def member_head(path: str, f: BinaryIO, info: zipfile.ZipInfo, size: int) -> bytes:
    """The first ``size`` uncompressed bytes of a stored or deflated member (fewer when it is
    shorter), read straight from the archive file ``f``: no CRC-32 check, which would need the
    whole member, so a header reads even when the data after it is damaged.

    Raises:
        CorruptCheckpointError: Bad local header, truncated archive, damaged deflate stream.
        NotACheckpointError: Another compression method, or an encrypted member.
    """
    if info.flag_bits & ZIP_FLAG_ENCRYPTED or info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise NotACheckpointError(f"{path}: archive member {info.filename!r} is encrypted or uses compression"
                                  f" method {info.compress_type}; only stored and deflated members are read")
    f.seek(0, io.SEEK_END)
    start = _data_offset(path, f, info, f.tell())
    f.seek(start)
    if info.compress_type == zipfile.ZIP_STORED:
        return f.read(min(size, info.compress_size))
    try:
        return zlib.decompressobj(RAW_DEFLATE_WBITS).decompress(
            f.read(min(info.compress_size, size + INFLATE_INPUT_BYTES)), size)
    except zlib.error as e:
        raise CorruptCheckpointError(f"{path}: archive member {info.filename!r}: damaged deflate stream: {e}") from None


def open_zip_archive(path: str, what: str = ".keras archive") -> tuple[zipfile.ZipFile, BinaryIO]:
    """A zip archive read in place (regular local files only: zipfile on a FIFO would block
    forever; remote archives through ranged reads, never whole).

    Args:
        path: The archive.
        what: How messages name it (``.keras archive``, ``.npz file``).

    Returns:
        (the ``ZipFile``, the underlying file, which the caller closes).

    Raises:
        NotACheckpointError: A directory.
        CorruptCheckpointError: Not a readable zip archive.
    """
    if _fs.isdir(path):
        raise NotACheckpointError(f"{path}: is a directory, not a {what}")
    f: BinaryIO = _fs.open_binary(path)  # remote: ranged reads (the tail holds the central directory)
    try:
        return zipfile.ZipFile(f), f
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        f.close()
        raise CorruptCheckpointError(
            f"{path}: not a readable zip archive (truncated or damaged): {one_line(e)}"
        ) from None


def open_member(path: str, name: str) -> io.RawIOBase:
    """A seekable, read-only stream of archive member ``name``, read in place (stored: a
    window onto the archive; deflated: inflated on demand; other methods: zipfile's stream).

    The archive is checked again (traversal, duplicates, bombs): it may have changed since it
    was listed. Closing the stream closes the archive file.
    """
    zf, f = open_zip_archive(path)
    try:
        check_archive(path, zf)
        info = zf.getinfo(name)
        plain = not info.flag_bits & ZIP_FLAG_ENCRYPTED
        if plain and info.compress_type in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            f.seek(0, io.SEEK_END)
            start = _data_offset(path, f, info, f.tell())
            if info.compress_type == zipfile.ZIP_STORED:
                return FileWindow(f, start, info.file_size)
            return _InflateWindow(f, start, info.compress_size, info.file_size)
        return _ZipStream(zf.open(info), f)  # zipfile's seekable stream; slow, bounded memory
    except KeyError:
        f.close()
        raise NotACheckpointError(f"{path}: no {name} in the archive") from None
    except (zipfile.BadZipFile, OSError, RuntimeError, ValueError, EOFError) as e:
        f.close()
        raise CorruptCheckpointError(f"{path}: cannot read {name}: {one_line(e)}") from None
    except BaseException:
        f.close()
        raise


# -- verify -----------------------------------------------------------------------------
def member_damage(path: str) -> list[m.Damage]:
    """Stream every archive member (``.keras`` or ``.npz``) so zipfile checks its CRC-32 (after
    the reader's safety checks, which opening the archive ran): one damage entry per member
    that does not read. Memory: one chunk of :data:`MEMBER_CHUNK_BYTES`."""
    damaged: list[m.Damage] = []
    with _fs.open_binary(path) as raw, zipfile.ZipFile(raw) as zf:
        for info in zf.infolist():
            try:
                with zf.open(info) as member:
                    while member.read(MEMBER_CHUNK_BYTES):
                        pass
            except (zipfile.BadZipFile, OSError, EOFError, ValueError, RuntimeError, zlib.error) as e:
                damaged.append(m.Damage(key=info.filename, name=info.filename, file=path, kind=m.DAMAGE_CHECKSUM,
                                        problem=f"archive member does not read: {one_line(e)}"))
    return damaged


def check_archive_by_reading(path: str, opener: Callable[[str], m.Checkpoint]) -> ReadCheck:
    """``verify``'s plan for a zip-based checkpoint (``.keras``, ``.npz``): every value read, and
    for a local archive every member's CRC-32 checked."""
    def opened(p: str) -> Opened:
        more = lambda: member_damage(p)  # noqa: E731
        return Opened(opener(p), more=more)

    return ReadCheck(path, opened)
