"""The bytes of a TF bundle's data files: shard files, and each kind of run written into them.

A :class:`ShardFile` is one data file written with positioned writes (small writes gathered,
created exclusively, fsync'ed on close); computed runs go to a :class:`~._direct_io.DirectShard`
instead. :class:`RunWriter` writes one planned run (:class:`~._bundle_plan.Run`) and returns the
masked crc32c its index entry records: a value in memory, streamed blocks, blocks computed on
worker threads (:class:`~.bundle_combine.BlockFeed`), or bytes copied from another bundle with
``os.copy_file_range`` (a read/write loop where the OS or file system refuses; read through and
checksummed with ``check_copies``).
"""

from __future__ import annotations

import errno
import os
from typing import Any, Iterable

import numpy as np

from ....errors import CorruptCheckpointError, OutputExistsError, UsageError
from .plan import Run
from ..crc import crc32c_combine, crc32c_module, mask
from .direct_io import DirectShard
from ..wire import MalformedError
from .combine import BlockFeed
from .tensors import dtype_name, element_count, encodable_dtype, open_source
from ..data import VARIABLE_LENGTH_DTYPES, crc_mismatch, tensor_crc32c

WRITE_BUFFER_BYTES = 1 << 20  # small writes are gathered up to this size
COPY_CHUNK_BYTES = 8 << 20  # read/write copies and checked copies move this much at a time
_COPY_FALLBACK_ERRNOS = frozenset(
    e for e in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", None),
                errno.EPERM, errno.EBADF) if e is not None
)
_FILE_MODE = 0o644


def create_file(path: str, readable: bool = False) -> int:
    """A new file opened for writing (and reading, ``readable``); it must not exist.

    Raises:
        OutputExistsError: ``path`` exists.
    """
    try:
        return os.open(path, (os.O_RDWR if readable else os.O_WRONLY) | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0), _FILE_MODE)
    except FileExistsError:
        raise OutputExistsError(f"{path}: exists; write bundles into a fresh location (save_bundle_native replaces atomically)") from None


class ShardFile:
    """One data file being written: positioned writes, small ones gathered."""

    def __init__(self, path: str):
        self.path = path
        self.fd = create_file(path)
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


def readonly_bytes(arr: np.ndarray) -> np.ndarray:
    """A read-only uint8 view of a contiguous array (google-crc32c takes read-only buffers
    without copying; memoryview takes every dtype this way, bfloat16 included)."""
    view = arr.reshape(-1).view(np.uint8)
    view.flags.writeable = False
    return view


class RunWriter:
    """Writes planned runs into shard files, keeping the source files it copies from open
    (:meth:`close` closes them) and counting the bytes copied."""

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
    def write_array(self, out: ShardFile, arr: np.ndarray) -> int:
        data = readonly_bytes(arr)
        out.write(data)
        return mask(self.crc32c.value(data))

    def write_blocks(self, out: ShardFile, run: Run) -> int:
        data = run.data
        want = encodable_dtype(data.dtype)
        total = element_count(data.shape)
        crc, done = 0, 0
        for block in data.blocks():
            arr = np.asarray(block)
            if dtype_name(arr.dtype) != data.dtype:
                raise UsageError(f"{run.label}: a {data.dtype} tensor was given a block of {dtype_name(arr.dtype)}")
            arr = np.ascontiguousarray(arr, dtype=want)
            done += arr.size
            if done > total:
                raise UsageError(f"{run.label}: blocks hold more than the {total} elements of shape {list(data.shape)}")
            raw = readonly_bytes(arr)
            out.write(raw)
            crc = self.crc32c.extend(crc, raw)
        if done != total:
            raise UsageError(f"{run.label}: blocks hold {done} elements, shape {list(data.shape)} needs {total}")
        return mask(crc)

    def write_combined(self, out: DirectShard, run: Run) -> int:
        data = run.data
        combined = data.combined
        assert combined is not None and self.feed is not None
        feed = self.feed
        out.mark_head(data.nbytes, combined.read_back)
        crc, first = 0, True
        for block in feed.run(combined, encodable_dtype(data.dtype), element_count(data.shape)):
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
            fd = open_source(path)
            self._sources[path] = fd
        return fd

    def write_stored(self, out: ShardFile, run: Run) -> int:
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

    def _copy_in_kernel(self, out: ShardFile, fd: int, offset: int, size: int) -> int:
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

    def _copy_plain(self, out: ShardFile, fd: int, offset: int, size: int, path: str) -> None:
        for chunk in self._chunks(fd, offset, size, path):
            out.flush()
            out._pwrite(chunk)

    def _copy_checked(self, out: ShardFile, run: Run, fd: int) -> int:
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
            crc = self.crc32c.extend(crc, readonly_bytes(np.frombuffer(chunk, dtype=np.uint8)))
            out.write(chunk)
        return mask(crc)

    def write(self, out: ShardFile, run: Run) -> int:
        """Write ``run`` at the end of ``out``; returns its masked crc32c."""
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

