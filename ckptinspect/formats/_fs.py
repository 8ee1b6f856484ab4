"""File access for local paths (plain ``os``) and remote ones (fsspec or ``tf.io.gfile``).

Local paths never import TensorFlow. A path with a scheme (``s3://``, ``gs://``...) goes
through fsspec when fsspec is installed with an implementation for that scheme (``s3fs``,
``gcsfs``, or any registered ``AbstractFileSystem``), else through ``tf.io.gfile``, imported
(quietly) on first use; :func:`check_remote` says which schemes work when one does not.
Remote files through fsspec are :class:`.remote.RemoteFile` objects (ranged reads shaped for
latency: small windows for metadata, parallel ranges and read-ahead for values; names answered
from one listing), so listing a checkpoint reads its index and headers, never its data whole.

Every read of a local file goes through :func:`open_binary`, which opens only regular files:
a FIFO would block ``open`` (or ``read``) forever and a device such as ``/dev/zero`` never
ends, so both are refused with one clear error before anything is read. The file is opened
with ``O_NONBLOCK`` and checked with ``fstat`` on the open descriptor, so a path swapped for a
FIFO between a check and the open cannot hang either. Whole-file reads take a size limit,
checked before reading, and read in bounded chunks.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import posixpath
import stat
import threading
from typing import Any, BinaryIO, Iterator

from ..errors import CheckpointNotFoundError, UnsafeFileError
from ._lazymod import lazy_import

# Object storage (fsspec, ranged reads, caches): loaded by the first remote path, never by a local one.
_remote = lazy_import(__package__ + ".remote")

__all__ = [
    "READ_CHUNK_BYTES",
    "human_size",
    "is_remote",
    "remote_schemes",
    "check_remote",
    "join",
    "dirname",
    "basename",
    "exists",
    "isdir",
    "isfile",
    "is_regular",
    "check_shard_name",
    "listdir",
    "walk_remote",
    "warm_remote",
    "remote_message",
    "getsize",
    "check_regular",
    "open_remote",
    "file_size",
    "prefetch",
    "open_binary",
    "read_bytes",
    "read_range",
    "read_head",
    "RangeReader",
    "DataFiles",
    "fingerprint",
    "same_file",
    "real_path",
    "is_inside",
]

# Local "schemes" TensorFlow registers beside the remote ones (tf.io.gfile.get_registered_schemes).
LOCAL_SCHEMES = ("", "file")
READ_CHUNK_BYTES = 1 << 20  # bytes read at a time by whole-file reads
DEFAULT_READ_LIMIT = 256 << 20  # a whole-file read of anything larger must say why it may

_FILE_KINDS = (
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISSOCK, "socket"),
)


def is_remote(path: str) -> bool:
    """True for paths with a URL scheme such as ``gs://`` or ``ram://``."""
    return "://" in path


def scheme(path: str) -> str:
    """The URL scheme of a remote path (``gs``), or ``""`` for a local one."""
    return path.split("://", 1)[0].lower() if is_remote(path) else ""


def _fsspec(path: str) -> Any:
    """The fsspec file system for ``path``'s scheme (see :mod:`._remote`), or None (fsspec or
    the scheme's implementation not installed, or a local scheme)."""
    if scheme(path) in LOCAL_SCHEMES:
        return None
    try:
        return _remote.filesystem(path)
    except _remote.RemoteUnavailable:
        return None


def _remote_fs(path: str) -> Any:
    """The file system object for a remote path: ``_remote``'s calls (fsspec, cached names,
    ranged reads shaped for latency), else ``tf.io.gfile`` behind the same few calls (:class:`_GFileFS`)."""
    return _FsspecFS() if _fsspec(path) is not None else _GFileFS()


class _FsspecFS:
    """:mod:`._remote` behind the calls this module uses (one listing answers many names)."""

    def exists(self, path: str) -> bool:
        return _remote.stat(path) is not None

    def isdir(self, path: str) -> bool:
        info = _remote.stat(path)
        return info is not None and info.kind == "dir"

    def isfile(self, path: str) -> bool:
        info = _remote.stat(path)
        return info is not None and info.kind == "file"

    def ls(self, path: str, detail: bool = False) -> list[str]:
        return _remote.listdir(path)

    def size(self, path: str) -> int:
        info = _remote.stat(path)
        if info is None or info.size is None:
            raise FileNotFoundError(path)
        return info.size


class _GFileFS:
    """``tf.io.gfile`` behind the fsspec calls this module uses."""

    def exists(self, path: str) -> bool:
        return _gfile().exists(path)

    def isdir(self, path: str) -> bool:
        return _gfile().isdir(path)

    def isfile(self, path: str) -> bool:
        return self.exists(path) and not self.isdir(path)

    def ls(self, path: str, detail: bool = False) -> list[str]:
        return list(_gfile().listdir(path))

    def size(self, path: str) -> int:
        return _gfile().stat(path).length

    def open(self, path: str, mode: str = "rb", **_kwargs: Any) -> Any:
        return _gfile().GFile(path, mode)


def _gfile():
    from .._tf import import_tf  # noqa: PLC0415 - remote paths only; quiet start-up

    return import_tf().io.gfile


def remote_schemes() -> list[str]:
    """The remote schemes this TensorFlow has file systems for (``gs``, ``ram`` in TF 2.16+;
    ``s3`` and ``hdfs`` moved to the tensorflow-io package)."""
    gfile = _gfile()
    schemes = gfile.get_registered_schemes() if hasattr(gfile, "get_registered_schemes") else ["gs", "ram"]
    return sorted(s for s in schemes if s not in LOCAL_SCHEMES)


def check_remote(path: str) -> None:
    """Make sure a remote path can be asked about: its scheme is one TensorFlow has a file
    system for, and the file system answers. Local paths pass.

    Raises:
        CheckpointNotFoundError: An unsupported scheme (the message says which work), or a
            file system that cannot be reached (no network, no credentials).
    """
    if not is_remote(path):
        return
    name = scheme(path)
    try:
        _remote.filesystem(path)
    except _remote.RemoteUnavailable as e:
        if name in _remote.EXTRAS and name not in ("gs", "gcs"):  # tf.io.gfile has no s3, hf or http
            raise CheckpointNotFoundError(f"{path}: {e}") from None
        missing = str(e) if name in _remote.EXTRAS else None
    else:
        if name not in ("http", "https"):  # http has no bucket or credentials to check first: the first read reports
            _remote.stat(path)  # no such bucket, access denied, no network: one line (CheckpointNotFoundError)
        return
    from .._tf import tensorflow_available  # noqa: PLC0415 - tf.io.gfile only where TensorFlow is installed

    if not tensorflow_available():
        raise CheckpointNotFoundError(
            f"{path}: {missing}" if missing else
            f"{path}: the {name}:// scheme needs an fsspec implementation: pip install 'ckptinspect[gcs]' (gs://)"
            " or 'ckptinspect[s3]' (s3://)"
        )
    supported = remote_schemes()
    if name not in supported:
        raise CheckpointNotFoundError(
            f"{path}: the {name}:// scheme is not supported; remote paths work with "
            f"{', '.join(s + '://' for s in supported)} (the file systems this TensorFlow has;"
            " s3:// and hdfs:// moved out of TensorFlow into the tensorflow-io package), and the schemes"
            " fsspec has an implementation installed for (s3fs, gcsfs...)"
        )
    try:
        _gfile().exists(path)
    except Exception as e:  # noqa: BLE001 - tf.errors.OpError and friends, without importing them here
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointNotFoundError(f"{path}: cannot access ({text})") from None


def join(a: str, *parts: str) -> str:
    return posixpath.join(a, *parts) if is_remote(a) else os.path.join(a, *parts)


def dirname(path: str) -> str:
    return posixpath.dirname(path) if is_remote(path) else os.path.dirname(path)


def basename(path: str) -> str:
    return posixpath.basename(path) if is_remote(path) else os.path.basename(path)


def too_long(path: str) -> str | None:
    """Why a local path cannot even be looked up because of its length (the system answers
    ENAMETOOLONG, which ``os.path.exists`` reports as "no such file"), or None."""
    if is_remote(path):
        return None
    try:
        os.stat(path)
    except OSError as e:
        if e.errno != errno.ENAMETOOLONG:
            return None
    else:
        return None
    raw = os.fsencode(path)
    try:
        name_max = os.pathconf(os.path.dirname(os.path.abspath(path)) or "/", "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    longest = max((len(part) for part in raw.split(b"/")), default=0)
    if longest > name_max:
        return f"a name in it is {longest} bytes, longer than the file system's {name_max}"
    try:
        path_max = os.pathconf("/", "PC_PATH_MAX")
    except (OSError, ValueError):
        path_max = 4096
    return f"it is {len(raw)} bytes, longer than the system's {path_max}; use a shorter (relative) path"


def exists(path: str) -> bool:
    return _remote_fs(path).exists(path) if is_remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
    return _remote_fs(path).isdir(path) if is_remote(path) else os.path.isdir(path)


def isfile(path: str) -> bool:
    """Exists and is not a directory (FIFOs and devices included: :func:`open_binary` refuses them)."""
    if is_remote(path):
        return _remote_fs(path).isfile(path)
    return exists(path) and not isdir(path)


def is_regular(path: str) -> bool:
    """True for a regular file (after symlinks); remote files count as regular."""
    if is_remote(path):
        return isfile(path)
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def listdir(path: str) -> list[str]:
    if is_remote(path):
        return sorted(posixpath.basename(p.rstrip("/")) for p in _remote_fs(path).ls(path, detail=False))
    return sorted(os.listdir(path))


def walk_remote(path: str, limit: int) -> list[tuple[str, int]] | None:
    """Every file under remote folder ``path`` as (path, size), from one recursive listing
    (:func:`.remote.walk`: what is inside is then answered without requests); None when there
    are more than ``limit``.

    Raises:
        CheckpointNotFoundError: The store cannot be listed, or has no fsspec file system here.
    """
    try:
        return _remote.walk(path, limit)
    except _remote.RemoteUnavailable as e:
        raise CheckpointNotFoundError(f"{path}: {e}") from None


def warm_remote(paths: list[str]) -> None:
    """Fetch small remote files about to be read whole, all at once (:func:`.remote.warm`);
    nothing for local paths or without fsspec."""
    paths = [p for p in paths if is_remote(p) and _fsspec(p) is not None]
    if paths:
        _remote.warm(paths)


def remote_message(text: str) -> str:
    """``text`` (another library's error about a remote path) without the environment's
    secrets, endpoints, ``user:password@`` in URLs or signed query parameters."""
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "STORAGE_EMULATOR_HOST"):
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value.rstrip("/"), "***")
    return _remote.redact(text)


def getsize(path: str) -> int:
    if is_remote(path):
        return int(_remote_fs(path).size(path))
    return os.path.getsize(path)


def real_path(path: str) -> str:
    """The canonical spelling of a path: symlinks and ``..`` resolved (normalised for remote)."""
    return posixpath.normpath(path) if is_remote(path) else os.path.realpath(path)


def same_file(a: str, b: str) -> bool:
    """True when two spellings name the same path (after symlinks and ``..``)."""
    return real_path(a) == real_path(b)


def is_inside(path: str, directory: str) -> bool:
    """True when ``path`` (after symlinks and ``..``) lies inside ``directory``."""
    if is_remote(path) != is_remote(directory):
        return False
    inner, outer = real_path(path), real_path(directory)
    sep = "/" if is_remote(path) else os.sep
    return inner == outer or inner.startswith(outer.rstrip(sep) + sep)


@contextlib.contextmanager
def _reading(path: str) -> Iterator[None]:
    """Turn the OS's errors for an unreadable file into one-line CheckpointNotFoundErrors."""
    try:
        yield
    except (CheckpointNotFoundError, UnsafeFileError):
        raise  # already one line (a remote store's answer: no such bucket, access denied...)
    except FileNotFoundError as e:
        raise CheckpointNotFoundError(f"{path}: no such file") from e
    except IsADirectoryError as e:
        raise CheckpointNotFoundError(f"{path}: is a directory, not a file") from e
    except PermissionError as e:
        raise CheckpointNotFoundError(f"{path}: permission denied") from e
    except OSError as e:
        if is_remote(path) or not os.path.exists(path):
            raise CheckpointNotFoundError(f"{path}: cannot read ({e})") from e
        raise


def _kind(mode: int) -> str | None:
    """What a non-regular file is (``FIFO``, ``character device``...), None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "directory"
    return next((name for test, name in _FILE_KINDS if test(mode)), "special file")


def _require_regular(path: str, mode: int) -> None:
    kind = _kind(mode)
    if kind == "directory":
        raise CheckpointNotFoundError(f"{path}: is a directory, not a file")
    if kind is not None:
        raise UnsafeFileError(f"{path}: not a regular file ({kind}); refusing to read")


def check_regular(path: str) -> int:
    """The size of a regular file; anything else is refused before it is opened.

    Symlinks are followed (a link to a regular file is fine; one to ``/dev/zero`` is not).
    Remote paths are only checked to exist.

    Returns:
        The file size in bytes.

    Raises:
        CheckpointNotFoundError: Missing, unreadable, or a directory.
        UnsafeFileError: A FIFO, device, socket or other special file.
    """
    if is_remote(path):
        with _reading(path):
            if not exists(path):
                raise FileNotFoundError(path)
            return getsize(path)
    with _reading(path):
        st = os.stat(path)
    _require_regular(path, st.st_mode)
    return st.st_size


def check_shard_name(index_path: str, name: str) -> None:
    """Refuse a shard file name, read from a sharded weights index, that is not a plain file
    name in the index's folder: empty, ``.``/``..``, or with a path separator, a drive colon
    or a NUL (Keras 3 ``.weights.json`` and Hugging Face ``*.index.json`` indexes).

    Raises:
        UnsafeFileError: The name would reach outside the index's folder.
    """
    if not name or name in (".", "..") or any(c in name for c in "/\\:\x00"):
        raise UnsafeFileError(
            f"{index_path}: shard file name {name!r} is not a plain file name in the index's folder;"
            " refusing path traversal"
        )


def open_remote(path: str):
    """A binary file object for a remote path: :class:`.remote.RemoteFile` (ranged reads shaped
    for latency, ``size`` and thread-safe ``pread``) through fsspec, else ``tf.io.gfile``'s."""
    if _fsspec(path) is not None:
        return _remote.open_file(path)
    return _gfile().GFile(path, "rb")


def open_binary(path: str) -> BinaryIO:
    """Open a regular file for binary reading (the caller closes it).

    The local file is opened with ``O_NONBLOCK`` (so a FIFO cannot block the open) and checked
    with ``fstat`` on the open descriptor before anything is read; remote paths go through
    ``tf.io.gfile``.

    Raises:
        CheckpointNotFoundError: Missing, unreadable, or a directory.
        UnsafeFileError: A FIFO, device, socket or other special file.
    """
    if is_remote(path):
        with _reading(path):
            return open_remote(path)
    check_regular(path)  # no open() at all for special files in the common case
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
    with _reading(path):
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    try:
        _require_regular(path, os.fstat(fd).st_mode)  # the path may have been swapped meanwhile
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _is_remote_file(f: BinaryIO) -> bool:
    """``f`` is a :class:`.remote.RemoteFile`. A local file from :func:`open_binary` is told apart
    without loading the object-store module."""
    return not isinstance(f, io.BufferedReader) and isinstance(f, _remote.RemoteFile)


def _size_of(f: BinaryIO, path: str) -> int:
    if is_remote(path):
        return f.size if _is_remote_file(f) else getsize(path)
    return os.fstat(f.fileno()).st_size


def file_size(f: BinaryIO) -> int:
    """The size of an open file from :func:`open_binary` (local: ``fstat``; remote: the object's)."""
    if _is_remote_file(f):
        return f.size
    return os.fstat(f.fileno()).st_size


def prefetch(f: BinaryIO, spans: list[tuple[int, int]], at_least: int = 0) -> None:
    """Tell an open file which (offset, size) spans will be read next: a remote file fetches them
    at once (one round trip, not one per span; each range at least ``at_least`` bytes from its
    span's start); a local file ignores it."""
    fetch = getattr(f, "prefetch", None)  # a RemoteFile, or a zip member's window onto one
    if fetch is not None and spans:
        fetch(spans, at_least)


def human_size(n: int) -> str:
    """A byte count for a message: ``"512 bytes"`` below 1 KiB, else one decimal in the
    largest binary unit that keeps it at least 1 (``"3.0 GiB"``), TiB at most."""
    size = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{n} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} bytes"  # pragma: no cover


def read_bytes(path: str, *, limit: int = DEFAULT_READ_LIMIT, what: str = "file") -> bytes:
    """The whole file, when it is a regular file of at most ``limit`` bytes.

    Args:
        path: Local or remote path.
        limit: Most bytes the file may have; checked before reading (callers name the bound
            that fits what they read: an index, a state file...).
        what: What the file is, for the message (``checkpoint index``, ``state file``...).

    Raises:
        CheckpointNotFoundError: Missing or unreadable.
        UnsafeFileError: Not a regular file, or larger than ``limit``.
    """
    with open_binary(path) as f:
        with _reading(path):
            size = _size_of(f, path)
            if size > limit:
                raise UnsafeFileError(
                    f"{path}: {what} is {size} bytes ({human_size(size)}), more than the {human_size(limit)} a {what}"
                    " may take; refusing to read"
                )
            if _is_remote_file(f):  # one request (or parallel ranges), not a loop of reads
                return f.pread(0, size)
            chunks = []
            left = size
            while left > 0:
                chunk = f.read(min(READ_CHUNK_BYTES, left))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)


def read_range(path: str, offset: int, size: int) -> bytes:
    """``size`` bytes at ``offset`` (fewer if the file is shorter); never more than the file holds.

    Raises:
        CheckpointNotFoundError: Missing or unreadable.
        UnsafeFileError: Not a regular file.
    """
    with open_binary(path) as f:
        with _reading(path):
            total = _size_of(f, path)
            if offset >= total or size <= 0:
                return b""
            if _is_remote_file(f):
                return f.pread(offset, min(size, total - offset))
            f.seek(offset)
            return f.read(min(size, total - offset))


def read_head(path: str, size: int) -> bytes:
    """The first ``size`` bytes (for content sniffing); b'' for unreadable or special files."""
    try:
        return read_range(path, 0, size)
    except (OSError, UnsafeFileError):
        return b""


class RangeReader:
    """Random-access reads of one open regular file (``size``, ``read_at``); close it after use."""

    def __init__(self, path: str):
        self.path = path
        self._f = open_binary(path)
        try:
            with _reading(path):
                self.size = _size_of(self._f, path)
        except BaseException:
            self._f.close()
            raise

    def read_at(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` (fewer at the end of the file)."""
        if offset >= self.size or size <= 0:
            return b""
        with _reading(self.path):
            self._f.seek(offset)
            return self._f.read(min(size, self.size - offset))

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "RangeReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def fingerprint(path: str) -> tuple[int, int, int, int] | None:
    """(device, inode, size, modification time in ns) of a local file, None when it cannot be stat'ed."""
    try:
        return _stat_key(os.stat(path))
    except OSError:
        return None


class DataFiles:
    """Data files opened once for a whole operation: sizes, positioned reads, and a pool of
    read buffers reused across tensors (fresh buffers would cost a page fault per 4 KiB).

    Safe to use from several threads at once (``diff`` reads two variables at a time): local
    reads are positioned (``preadv`` on a shared descriptor), the pool, the open descriptors
    and the sizes are guarded by a lock, and a remote file's seek-and-read is done under it.
    """

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._remote: dict[str, Any] = {}  # remote files: open file objects, ranged reads
        self._sizes: dict[str, int | None] = {}
        self._buffers: list[bytearray] = []
        self._lock = threading.RLock()

    def size(self, path: str) -> int | None:
        """The file's size, or None when it cannot be stat'ed or is not a regular file (a FIFO
        or device is left for the checkpoint's reader, which refuses it)."""
        if path in self._sizes:
            return self._sizes[path]
        with self._lock:
            if path not in self._sizes:
                if is_remote(path):
                    try:
                        self._sizes[path] = getsize(path) if exists(path) else None
                    except Exception:  # noqa: BLE001 - an unreachable remote file is left for the reader to report
                        self._sizes[path] = None
                else:
                    self._sizes[path] = os.path.getsize(path) if is_regular(path) else None
            return self._sizes[path]

    def pin(self, path: str) -> None:
        """Open ``path`` now and keep it open: its bytes stay readable even if it is deleted
        (a checkpoint rotated out of a live directory while a command reads it).

        Raises:
            CheckpointNotFoundError, UnsafeFileError: Missing, unreadable or not a regular file.
        """
        self._fd(path, pin=True)

    def _fd(self, path: str, pin: bool = False) -> int:
        """The descriptor of local ``path``, opened (regular files only) on first use."""
        fd = self._fds.get(path)
        if fd is not None:
            return fd
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:
                with open_binary(path) as f:  # regular files only (never blocks on a FIFO)
                    fd = os.dup(f.fileno())
                self._fds[path] = fd
                if pin:  # a pinned file's size is the open file's, whatever its path holds later
                    self._sizes[path] = os.fstat(fd).st_size
            return fd

    def fingerprint(self, path: str) -> tuple[int, int, int, int]:
        """(device, inode, size, modification time in ns) of the file as opened here (opened,
        and kept open, on first use): compare with :func:`fingerprint` of the path taken earlier.

        Raises:
            CheckpointNotFoundError, UnsafeFileError: Missing, unreadable or not a regular file.
        """
        return _stat_key(os.fstat(self._fd(path)))

    def pread_into(self, path: str, buffer: memoryview, offset: int) -> int:
        """Fill ``buffer`` from ``offset``; returns the bytes read (fewer at the end of the file)."""
        if is_remote(path):
            with self._lock:
                f = self._remote.get(path)
                if f is None:
                    f = self._remote[path] = open_binary(path)
            if _is_remote_file(f):  # positioned reads: several threads at once
                data = f.pread(offset, len(buffer))
                buffer[: len(data)] = data
                return len(data)
            with self._lock:  # one file object, one position: one reader at a time
                with _reading(path):
                    f.seek(offset)
                    data = f.read(len(buffer))  # one ranged read of exactly these bytes
            buffer[: len(data)] = data
            return len(data)
        return os.preadv(self._fd(path), [buffer], offset)

    def take_buffer(self, nbytes: int) -> bytearray:
        """A buffer of at least ``nbytes`` from the pool (give it back with :meth:`give_buffer`)."""
        with self._lock:
            for i, buf in enumerate(self._buffers):
                if len(buf) >= nbytes:
                    return self._buffers.pop(i)
        return bytearray(nbytes)

    def give_buffer(self, buf: bytearray) -> None:
        with self._lock:
            self._buffers.append(buf)

    def close(self) -> None:
        with self._lock:
            self._buffers.clear()
            fds, self._fds = self._fds, {}
            remote, self._remote = self._remote, {}
        for fd in fds.values():
            os.close(fd)
        for f in remote.values():
            f.close()
