"""Runs of a bundle computed element by element from runs stored in other bundles, on both cores.

``average`` writes each float tensor as a function of the same tensor in N input bundles. Such
a run is a :class:`Combined`: the input runs (:class:`~.bundle_tensors.StoredBytes`: file,
offset, size, recorded crc32c) and a function from the inputs' blocks to the output block.
:class:`BlockFeed` cuts every combined run of a bundle into blocks of about
:data:`BLOCK_BYTES` per input and hands them to :func:`ckptinspect._parallel.ordered_map`:
worker threads read each input's block with one positioned read, checksum it, call the
function, and checksum the result (reads, crc32c and numpy release the GIL); the writer's
thread takes the blocks in order, across tensor boundaries, writes them, and joins the
per-block checksums with :func:`~._crc.crc32c_combine`. Every input's joined checksum is
compared with the one its index records once its run is done (a mismatch is an error naming
the file), and the output's joined checksum is what the written index records.

The result is the same bytes whatever the number of workers: each block is computed on its own
from the same inputs, and checksums are joined in block order. Memory: each worker's input
buffers, plus one output buffer per block in flight or waiting to be written.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .... import _parallel
from ....errors import CorruptCheckpointError
from ..crc import buffer_crc32c, crc32c_combine, mask
from ..data import crc_mismatch

__all__ = ["BLOCK_BYTES", "Combined", "BlockFeed", "Block"]

BLOCK_BYTES = 1 << 20  # bytes read from each input per block (about; whole elements)
AHEAD_PER_WORKER = 3  # blocks in flight per worker thread


@dataclasses.dataclass(frozen=True)
class Combined:
    """An output run computed from stored input runs, block by block.

    Attributes:
        inputs: The input runs (objects with ``path``, ``offset``, ``size``, ``crc32c``:
            :class:`~.bundle_tensors.StoredBytes`), each of ``count`` elements.
        dtypes: Their little-endian numpy dtypes.
        labels: For messages: which tensor each input run is.
        fn: ``fn(start, blocks, out)``: fill ``out`` (the output elements ``start`` ..
            ``start + out.size``) from ``blocks`` (the same elements of every input, read-only).
            Called from worker threads, any block in any order: it must depend on its
            arguments only (scratch space per thread).
        written: Called in the writer's thread with the run's masked crc32c once it is written.
        read_back: Called (from the writer's I/O thread) once the run's first bytes were read
            back from the file and found to be the bytes computed.
    """

    inputs: tuple[Any, ...]
    dtypes: tuple[np.dtype, ...]
    labels: tuple[str, ...]
    fn: Callable[[int, Sequence[np.ndarray], np.ndarray], None]
    written: Callable[[int], None] | None = None
    read_back: Callable[[], None] | None = None


@dataclasses.dataclass
class Block:
    """One computed block, as the writer takes it: ``view`` (its bytes) is valid until
    :meth:`BlockFeed.release` is called with it."""

    view: memoryview
    buffer: bytearray
    in_crcs: list[int]
    in_bytes: list[int]
    out_crc: int


@dataclasses.dataclass(frozen=True)
class _Job:
    combined: Combined
    out_dtype: np.dtype
    start: int
    count: int


def block_elements(combined: Combined, out_dtype: np.dtype) -> int:
    """Elements per block of a combined run."""
    widest = max([out_dtype.itemsize, *(d.itemsize for d in combined.dtypes)])
    return max(1, BLOCK_BYTES // widest)


class BlockFeed:
    """The blocks of every combined run of one bundle, computed ahead on worker threads and
    taken in order by the writer (:meth:`run`)."""

    def __init__(self, runs: Sequence[tuple[Combined, np.dtype, int]], workers: int | None = None):
        """
        Args:
            runs: ``(combined, output dtype, element count)`` of each combined run, in write order.
            workers: Threads (default: ``_parallel.WORKERS``).

        Raises:
            CorruptCheckpointError: An input file is missing, not a regular file, or shorter
                than a run it holds.
        """
        self._crc_extend = buffer_crc32c()  # releases the GIL: the workers checksum at once
        self._fds: dict[str, int] = {}
        self._free: list[bytearray] = []
        self._local = threading.local()
        self._runs = list(runs)
        try:
            for combined, _, _ in self._runs:
                for src, label in zip(combined.inputs, combined.labels):
                    fd = self._fd(src.path)
                    have = os.fstat(fd).st_size
                    if have < src.offset + src.size:
                        raise CorruptCheckpointError(
                            f"{src.path}: truncated: {label!r} needs bytes {src.offset}..{src.offset + src.size},"
                            f" the file has {have}"
                        )
        except BaseException:
            self.close()
            raise
        workers = _parallel.WORKERS if workers is None else max(1, workers)
        self._blocks: Iterator[Block] = _parallel.ordered_map(
            self._compute, self._jobs(), workers, AHEAD_PER_WORKER * workers)

    def _fd(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is None:
            from .tensors import open_source  # noqa: PLC0415 - the writer's one way to open a source

            fd = self._fds[path] = open_source(path)
        return fd

    def _jobs(self) -> Iterator[_Job]:
        for combined, out_dtype, count in self._runs:
            step = block_elements(combined, out_dtype)
            for start in range(0, count, step):
                yield _Job(combined, out_dtype, start, min(step, count - start))

    def _input_buffers(self, k: int) -> list[bytearray]:
        bufs = getattr(self._local, "bufs", None)
        if bufs is None:
            bufs = self._local.bufs = []
        while len(bufs) < k:
            bufs.append(bytearray(BLOCK_BYTES))
        return bufs

    def _take(self) -> bytearray:
        try:
            return self._free.pop()
        except IndexError:
            return bytearray(BLOCK_BYTES)

    def release(self, block: Block) -> None:
        """Give a written block's buffer back for reuse."""
        self._free.append(block.buffer)

    def _compute(self, job: _Job) -> Block:
        combined = job.combined
        bufs = self._input_buffers(len(combined.inputs))
        blocks, crcs, sizes = [], [], []
        for src, dtype, buf, label in zip(combined.inputs, combined.dtypes, bufs, combined.labels):
            nbytes = job.count * dtype.itemsize
            offset = src.offset + job.start * dtype.itemsize
            view = memoryview(buf)[:nbytes]
            done = 0
            while done < nbytes:
                n = os.preadv(self._fds[src.path], [view[done:]], offset + done)
                if n == 0:
                    raise CorruptCheckpointError(f"{src.path}: truncated: {label!r} ends past the end of the file")
                done += n
            crcs.append(self._crc_extend(0, buf, nbytes))
            sizes.append(nbytes)
            arr = np.frombuffer(buf, dtype, job.count)
            arr.flags.writeable = False
            blocks.append(arr)
        out_buf = self._take()
        nbytes = job.count * job.out_dtype.itemsize
        out = np.frombuffer(out_buf, job.out_dtype, job.count)
        try:
            combined.fn(job.start, blocks, out)
        except BaseException:
            self._free.append(out_buf)
            raise
        return Block(memoryview(out_buf)[:nbytes], out_buf, crcs, sizes, self._crc_extend(0, out_buf, nbytes))

    def run(self, combined: Combined, out_dtype: np.dtype, count: int) -> Iterator[Block]:
        """The blocks of the next combined run (the one given, in write order), in order;
        after the last, the inputs' joined checksums are compared with their recorded ones.

        Yields:
            Each :class:`Block` (release it once written).

        Raises:
            CorruptCheckpointError: An input's bytes do not match their recorded crc32c.
        """
        step = block_elements(combined, out_dtype)
        k = len(combined.inputs)
        in_crcs = [0] * k
        for i in range(0, count, step):
            block = next(self._blocks)
            if i == 0:
                in_crcs = list(block.in_crcs)
            else:
                in_crcs = [crc32c_combine(a, b, n) for a, b, n in zip(in_crcs, block.in_crcs, block.in_bytes)]
            yield block
        for src, label, crc in zip(combined.inputs, combined.labels, in_crcs):
            actual, stored = mask(crc), src.crc32c or 0
            if actual != stored:
                raise CorruptCheckpointError(f"{src.path}: {label!r}: {crc_mismatch(stored, actual)}")

    def close(self) -> None:
        """Stop the workers (blocks not taken are dropped) and close the input files."""
        blocks = getattr(self, "_blocks", None)
        if blocks is not None:
            blocks.close()
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)
        self._free.clear()
