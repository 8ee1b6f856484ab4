"""A data file written around the page cache (``O_DIRECT``), on its own I/O thread.

Writing 1 GB through the page cache costs about as much CPU as computing it (the kernel copies
every byte into freshly allocated pages, then writes them back on ``fsync``); on the 2-core
machines measured that was 0.5-3 s of system time for ``average``'s output. A
:class:`DirectShard` gathers what is written into two page-aligned staging buffers of
:data:`STAGE_BYTES` and writes each full one with one positioned ``O_DIRECT`` write on an I/O
thread, while the caller fills the other: the device's DMA moves the bytes, and the
computation goes on meanwhile. The last, partial buffer is written padded to
:data:`ALIGN` bytes and the file truncated to its size; ``fsync`` then has only metadata and
the device's cache left to flush.

The first bytes of every run marked with :meth:`DirectShard.mark_head` are read back from the
file by the I/O thread right after the piece holding them is written, and compared with the
bytes staged (on the device when written with ``O_DIRECT``): a write that did not land where
planned is an error before the file is used, at no cost to the computation.

Where the file system refuses ``O_DIRECT`` (tmpfs, some network file systems, alignment it
does not accept) the same writes go through the page cache, still from the I/O thread.
"""

from __future__ import annotations

import errno
import mmap
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from ....errors import CorruptCheckpointError, VerificationError

__all__ = ["ALIGN", "STAGE_BYTES", "HEAD_BYTES", "DirectShard", "direct_io_enabled"]

ALIGN = 4096  # O_DIRECT offsets, lengths and addresses: a multiple of the logical block size
STAGE_BYTES = 8 << 20  # bytes per O_DIRECT write (two staging buffers)
HEAD_BYTES = 4096  # bytes of a marked run read back after it is written
_ENV = "CKPTINSPECT_DIRECT_IO"  # "0": write through the page cache


def direct_io_enabled() -> bool:
    """Whether computed outputs may be written with ``O_DIRECT`` (not when
    ``CKPTINSPECT_DIRECT_IO=0``, nor where the OS has no such flag)."""
    return hasattr(os, "O_DIRECT") and os.environ.get(_ENV, "").strip() != "0"


def _set_direct(fd: int, on: bool) -> bool:
    """Turn ``O_DIRECT`` on or off for an open file; False when the file system refuses."""
    import fcntl  # noqa: PLC0415 - POSIX only (direct_io_enabled() is False elsewhere)

    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, (flags | os.O_DIRECT) if on else (flags & ~os.O_DIRECT))
    except OSError:
        return False
    return True


class DirectShard:
    """A data file being written in :data:`STAGE_BYTES` pieces, with ``O_DIRECT`` where the
    file system takes it (the writer's ``_ShardFile`` interface: ``write``, ``size``,
    ``flush``, ``close``; and ``write_lent``, ``write_from``, ``mark_head``)."""

    def __init__(self, path: str, create: Callable[[str], int]):
        self.path = path
        self.fd = create(path)
        self.direct = direct_io_enabled() and _set_direct(self.fd, True)
        self._bufs: list[mmap.mmap] = []
        self._futures: list[Future[None] | None] = [None, None]
        self._cur = 0
        self._fill = 0
        self._written = 0  # bytes handed to the I/O thread (whole staging buffers)
        self._io = ThreadPoolExecutor(1, thread_name_prefix="ckptinspect-io")
        self._heads: list[tuple[int, int, Callable[[], None] | None]] = []  # (start, end, when read back)
        self._scratch: mmap.mmap | None = None  # the I/O thread's aligned read-back buffer
        self.heads_checked = 0

    @property
    def size(self) -> int:
        return self._written + self._fill

    def _buf(self) -> mmap.mmap:
        while len(self._bufs) <= self._cur:
            self._bufs.append(mmap.mmap(-1, STAGE_BYTES))  # page-aligned, as O_DIRECT needs
        return self._bufs[self._cur]

    def write(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            n = min(len(view), STAGE_BYTES - self._fill)
            self._buf()[self._fill : self._fill + n] = view[:n]
            self._fill += n
            view = view[n:]
            if self._fill == STAGE_BYTES:
                self._submit()

    def mark_head(self, nbytes: int, done: Callable[[], None] | None = None) -> None:
        """Read back the next ``nbytes`` (at most :data:`HEAD_BYTES`) written once they are
        on file, compare them with what was staged, and call ``done()`` (from the I/O thread)."""
        if nbytes > 0:
            self._heads.append((self.size, self.size + min(nbytes, HEAD_BYTES), done))
        elif done is not None:
            done()

    def _heads_in(self, start: int, end: int) -> list[tuple[int, int, Callable[[], None] | None]]:
        """The marked ranges (parts) inside ``start..end``, each with its callback when its
        last part is there; the rest stays marked."""
        parts, rest = [], []
        for s, e, done in self._heads:
            if s >= end:
                rest.append((s, e, done))
                continue
            parts.append((s, min(e, end), done if e <= end else None))
            if e > end:
                rest.append((end, e, done))
        self._heads = rest
        return parts

    def _read_back(self, buf: mmap.mmap, base: int, parts: list[tuple[int, int, Callable[[], None] | None]]) -> None:
        if self._scratch is None:
            self._scratch = mmap.mmap(-1, 2 * ALIGN + HEAD_BYTES)
        view = memoryview(self._scratch)
        for s, e, done in parts:
            lo, hi = s // ALIGN * ALIGN, -(-e // ALIGN) * ALIGN  # whole aligned blocks, as O_DIRECT reads
            got = os.preadv(self.fd, [view[: hi - lo]], lo)
            if got < e - lo or view[s - lo : e - lo] != memoryview(buf)[s - base : e - base]:
                raise VerificationError(f"{self.path}: bytes {s}..{e} read back are not the bytes written")
            self.heads_checked += 1
            if done is not None:
                done()

    def write_lent(self, view: memoryview, release: Callable[[], None]) -> None:
        """Copy ``view`` (a buffer the caller lends) into the staging buffers and give it back
        at once with ``release()``."""
        self.write(view)
        release()

    def write_from(self, fd: int, offset: int, size: int, path: str) -> None:
        """Read ``size`` bytes of another file from ``offset`` straight into the staging buffers.

        Raises:
            CorruptCheckpointError: The file ends first.
        """
        done = 0
        while done < size:
            n = min(size - done, STAGE_BYTES - self._fill)
            got = os.preadv(fd, [memoryview(self._buf())[self._fill : self._fill + n]], offset + done)
            if got == 0:
                raise CorruptCheckpointError(f"{path}: truncated: ended while copying bytes {offset}..{offset + size}")
            self._fill += got
            done += got
            if self._fill == STAGE_BYTES:
                self._submit()

    def _write_piece(self, i: int, length: int, offset: int, parts: list[Any]) -> None:
        buf = self._bufs[i]
        self._pwrite_all(memoryview(buf)[:length], offset)
        if parts:
            self._read_back(buf, offset, parts)

    def _pwrite_all(self, view: memoryview, offset: int) -> None:
        done = 0
        while done < len(view):
            try:
                done += os.pwrite(self.fd, view[done:], offset + done)
            except OSError as e:  # an alignment this file system does not take: the page cache
                if not (self.direct and e.errno == errno.EINVAL and _set_direct(self.fd, False)):
                    raise
                self.direct = False

    def _wait(self, i: int) -> None:
        future, self._futures[i] = self._futures[i], None
        if future is not None:
            future.result()

    def _submit(self) -> None:
        i = self._cur
        parts = self._heads_in(self._written, self._written + STAGE_BYTES)
        self._futures[i] = self._io.submit(self._write_piece, i, STAGE_BYTES, self._written, parts)
        self._written += STAGE_BYTES
        self._fill = 0
        self._cur ^= 1
        self._wait(self._cur)  # the other buffer is free again once its write is done

    def flush(self) -> None:
        """Nothing to do until :meth:`close` (kept for the writer's interface)."""

    def close(self, fsync: bool) -> None:
        """Write what is staged (the tail padded for ``O_DIRECT``, then the file truncated to
        its size), wait for the I/O thread, sync if asked, close."""
        try:
            self._wait(self._cur ^ 1)
            tail = self._fill
            if tail:
                buf = self._buf()
                length = tail
                if self.direct:
                    length = -(-tail // ALIGN) * ALIGN
                    buf[tail:length] = bytes(length - tail)
                self._write_piece(self._cur, length, self._written, self._heads_in(self._written, self._written + tail))
                if length != tail:
                    os.ftruncate(self.fd, self._written + tail)
            if fsync:
                os.fsync(self.fd)
        finally:
            for i in (0, 1):
                try:
                    self._wait(i)
                except Exception:  # noqa: BLE001 - an earlier error is the one raised
                    pass
            self._io.shutdown(wait=True)
            os.close(self.fd)
            for buf in self._bufs:
                buf.close()
            if self._scratch is not None:
                self._scratch.close()
