"""``scan``'s pass over a window of open checkpoints: one variable at a time, through every step.

The unit of work is a *chain*: one key, read from each checkpoint of the window, each value
measured against the previous step's value of the same key (:mod:`.scan_stats`). Chains are
independent, so up to :data:`ckptinspect._parallel.WORKERS` threads measure them at once
(:func:`ckptinspect._parallel.ordered_map`); each thread computes a chain alone, in a fixed
order, and the results come back in key order: the report is the same, bit for bit, whatever
the number of threads. Only chains of large values go to the threads (:data:`THREAD_MIN_BYTES`):
the others are measured in the calling thread, between the large ones' results.

A chain whose values are all plain runs of bytes of local TF bundles is read *in lockstep*
(:func:`ckptinspect.formats.stream_blocks`: positioned reads, crc32c checked, no TensorFlow,
safe from several threads): block i of every step, in step order, each compared with block i
of the previous step while both are in cache; memory is one block per step of the window, never
a whole tensor. Every other chain (other formats, sliced variables, remote files) is read step
after step through the checkpoint's ``iter_blocks``, the previous step's value kept whole (two
tensors), under one lock held for the whole chain: no reader is ever entered by two threads,
and at most one such chain holds its two tensors at a time.
"""

from __future__ import annotations

import math
import threading
from typing import Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from ... import _parallel
from ... import model as m
from ...errors import CkptError, CorruptCheckpointError
from ...formats import stream_blocks
from . import stats as scan_stats
from .stats import Accumulator, Buffers, Measured, Sums, measure_value

__all__ = ["STATS_DTYPES", "LOCKSTEP_BLOCK_CHUNKS", "LOCKSTEP_BUDGET_BYTES", "TASK_BYTES", "THREAD_MIN_BYTES", "Outcome",
           "measure_chains"]

STATS_DTYPES = m.INTEGER_DTYPES | m.FLOAT_DTYPES | {"bool"}
# Lockstep reads: blocks of LOCKSTEP_BLOCK_CHUNKS chunks (1 MiB of float32), one per step of
# the window; a chain whose blocks would pass LOCKSTEP_BUDGET_BYTES (a long window of wide
# dtypes) is read step after step instead (two tensors).
LOCKSTEP_BLOCK_CHUNKS = 1
LOCKSTEP_BUDGET_BYTES = 64 << 20
# Chains submitted ahead of the one being merged: a long chain (a large tensor) does not stall
# the other thread. A chain waiting holds nothing; its results are a few numbers.
AHEAD_PER_WORKER = 8
# A chain goes to the threads when one of its values holds at least this many bytes; the others
# are measured in the calling thread (the measurements: ckptinspect._parallel.THREAD_MIN_BYTES).
# At 512 KB two threads took 20-35% more CPU for the same time, and the 1 GB a, b, a, b, a run
# 2.17-2.27 s vs 2.30 with one, so chains of 512 KB values stay with the threads.
THREAD_MIN_BYTES = _parallel.THREAD_MIN_BYTES
# Consecutive chains of small tensors are one task, up to this many bytes through the window (a
# tensor of 100 KB in 5 checkpoints: 8 chains a task). A chain of the threads is a task of its own.
TASK_BYTES = 4 << 20


class Outcome(NamedTuple):
    """One checkpoint's value of a chain.

    Attributes:
        index: The checkpoint's position in the window.
        var: The variable.
        selected: Of the role scanned (else read only for its checksum).
        sums: Its sums (selected and read), or None.
        error: Why it could not be read, or None.
    """

    index: int
    var: m.Variable
    selected: bool
    sums: Sums | None = None
    error: str | None = None


class Task(NamedTuple):
    """Consecutive keys measured together (:func:`_tasks`).

    Attributes:
        keys: The keys, in order.
        threaded: Measured by a thread (one key, a value of :data:`THREAD_MIN_BYTES` or more);
            else in the calling thread.
    """

    keys: list[str]
    threaded: bool


class _Member(NamedTuple):
    """One step of a chain (a named tuple: 10,000 of them for 2,000 keys in 5 checkpoints, built
    3x faster than a frozen dataclass)."""

    index: int  # the checkpoint's position in the window
    ckpt: m.Checkpoint
    var: m.Variable
    selected: bool


def _copied(blocks: Iterable[np.ndarray], value: np.ndarray) -> Iterator[int]:
    """Copy the blocks into ``value``, yielding the elements filled so far."""
    at = 0
    for block in blocks:
        if at + block.size > value.size:
            raise CorruptCheckpointError(f"more than the {value.size} values its shape holds")
        value[at : at + block.size] = block.reshape(-1)
        at += block.size
        yield at
    if at != value.size:
        raise CorruptCheckpointError(f"{at} values read, its shape holds {value.size}")


def _stepwise(members: list[_Member | None], chunk: int, buffers: Buffers) -> list[Outcome]:
    """A chain read step after step, each value whole, compared with the previous step's value
    kept in memory (two arrays, let go at the end)."""
    raw = [np.empty(0, np.uint8), np.empty(0, np.uint8)]
    out: list[Outcome] = []
    prev: tuple[m.Variable, Measured, int] | None = None  # variable, value, slot
    for member in members:
        if member is None:
            prev = None
            continue
        index, ckpt, var, selected = member.index, member.ckpt, member.var, member.selected
        slot = 1 - prev[2] if prev is not None else 0
        dtype = m.numpy_dtype(var.dtype)
        try:
            if dtype is None:  # pragma: no cover - ml_dtypes comes with TensorFlow and Keras
                sums = Sums()
                for block in ckpt.iter_blocks(var, chunk):
                    flat = np.asarray(block).reshape(-1)
                    sums.add(measure_value([flat.size], flat, None, chunk)[0])
                measured = None
            else:
                need = var.size * dtype.itemsize
                if raw[slot].size < need:
                    raw[slot] = np.empty(need, np.uint8)
                value = raw[slot][:need].view(dtype)
                for _ in _copied(ckpt.iter_blocks(var, chunk), value):
                    pass
                if not selected:  # read for its checksum only
                    out.append(Outcome(index, var, False))
                    continue
                paired = prev is not None and prev[0].shape == var.shape and math.isfinite(prev[1].sumsq)
                sums, chunk_sumsq = measure_value((value.size,), value, prev[1] if paired else None, chunk, buffers)
                measured = Measured(value, chunk_sumsq, sums.sumsq)
        except CkptError as e:
            prev = None
            out.append(Outcome(index, var, selected, error=str(e)))
            continue
        prev = (var, measured, slot) if measured is not None else None
        out.append(Outcome(index, var, True, sums))
    return out


def _plan(members: list[_Member | None]) -> dict[int, tuple[int | None, tuple[int, ...]]]:
    """For each selected step (its position): the step it is compared with (the last selected
    one before it, unless a missing value or a new shape came between) and the unselected steps
    in between (a read error in any of them, as in that step, leaves nothing to compare with)."""
    plan: dict[int, tuple[int | None, tuple[int, ...]]] = {}
    last: int | None = None
    between: list[int] = []
    for pos, member in enumerate(members):
        if member is None:
            last, between = None, []
        elif member.selected:
            same = last is not None and members[last].var.shape == member.var.shape  # type: ignore[union-attr]
            plan[pos] = (last if same else None, tuple(between))
            last, between = pos, []
        else:
            between.append(pos)
    return plan


def _lockstep(members: list[_Member | None], streams: dict[int, Iterator[np.ndarray] | str], chunk: int,
              buffers: Buffers) -> list[Outcome]:
    """A chain read block by block across its steps: block i of each step, in step order,
    compared with block i of the step before it (still in its reader's buffer)."""
    plan = _plan(members)
    accs = {pos: Accumulator(chunk, buffers) for pos in plan}
    failed: dict[int, str] = {}
    # (position, its reader, its accumulator or None when only read, the position it is compared with)
    active: list[tuple[int, Iterator[np.ndarray], Accumulator | None, int | None]] = []
    for pos, stream in streams.items():
        if isinstance(stream, str):
            failed[pos] = stream
        else:
            acc = accs.get(pos)
            active.append((pos, stream, acc, plan[pos][0] if acc is not None else None))
    chain = object()  # this chain's blocks are named (chain, position, round)
    round_ = 0
    none = (None, None)
    while active:
        round_ += 1
        current: dict[int | None, tuple[np.ndarray, list[float]]] = {}  # this round's blocks
        still = []
        for item in active:
            pos, stream, acc, before = item
            try:
                block = next(stream, None)  # None: read whole, checksum matched
            except CkptError as e:
                failed[pos] = str(e)
                continue
            if block is None:
                continue
            still.append(item)
            if acc is not None:
                flat = block.reshape(-1)
                prev, prev_chunks = current.get(before, none)
                current[pos] = (flat, acc.add(flat, prev, prev_chunks, (chain, pos, round_), (chain, before, round_)))
        active = still
    out = []
    for pos, member in enumerate(members):
        if member is None:
            continue
        if pos in failed:
            out.append(Outcome(member.index, member.var, member.selected, None, failed[pos]))
        elif not member.selected:
            out.append(Outcome(member.index, member.var, False))
        else:
            before, between = plan[pos]
            compared = before is not None and (not failed or (before not in failed and not any(b in failed for b in between))) \
                and math.isfinite(accs[before].sums.sumsq)
            out.append(Outcome(member.index, member.var, True, accs[pos].result(accs[before].sums.sumsq if compared else None)))
    return out


def _chain(key: str, window: Sequence[tuple[m.Checkpoint, dict[str, m.Variable]]], role: str | None,
           buffers: Buffers, lock: threading.Lock) -> list[Outcome]:
    """One key through the window, in step order: in lockstep when every value can be."""
    members: list[_Member | None] = []
    chunk = buffers.cur.size
    block = chunk * LOCKSTEP_BLOCK_CHUNKS
    held = 0
    for index, (ckpt, by_key) in enumerate(window):
        var = by_key.get(key)
        if var is not None and var.dtype in STATS_DTYPES:
            members.append(_Member(index, ckpt, var, role is None or var.role == role))
            held += min(block, var.size) * m.ITEMSIZE.get(var.dtype, 8)
        else:
            members.append(None)
    if held > LOCKSTEP_BUDGET_BYTES:
        with lock:
            return _stepwise(members, chunk, buffers)
    streams: dict[int, Iterator[np.ndarray] | str] = {}
    try:
        for pos, member in enumerate(members):
            if member is None:
                continue
            try:
                stream = stream_blocks(member.ckpt, member.var, block)
            except CkptError as e:
                streams[pos] = str(e)
                continue
            if stream is None:
                break
            streams[pos] = stream
        else:
            return _lockstep(members, streams, chunk, buffers)
    finally:
        for stream in streams.values():
            if not isinstance(stream, str):
                stream.close()  # type: ignore[attr-defined]
    with lock:
        return _stepwise(members, chunk, buffers)


def measure_chains(keys: Iterable[str], window: Sequence[tuple[m.Checkpoint, dict[str, m.Variable]]],
                   role: str | None, chunk: int = scan_stats.BLOCK_ELEMENTS) -> Iterator[list[Outcome]]:
    """Every key's chain through the window, measured by up to ``_parallel.WORKERS`` threads.

    Args:
        keys: The keys, in the order the results are wanted.
        window: The open checkpoints in step order, each with its variables by key.
        role: Only variables of this role are measured (the others are read for their
            checksums); None: all.
        chunk: Elements per chunk, the unit of every sum.

    Yields:
        For each key, in order, one :class:`Outcome` per checkpoint holding it as a numeric
        variable.
    """
    local = threading.local()  # per call: the work buffers go when the call ends, whatever thread held them
    lock = threading.Lock()

    def run(task: Task) -> list[list[Outcome]]:
        buffers = getattr(local, "buffers", None)
        if buffers is None:
            buffers = local.buffers = Buffers(chunk)
        return [_chain(key, window, role, buffers, lock) for key in task.keys]

    workers = _parallel.WORKERS
    for done in _parallel.ordered_map(run, _tasks(keys, window), workers, AHEAD_PER_WORKER * workers,
                                      inline=_in_calling_thread):
        yield from done


def _in_calling_thread(task: Task) -> bool:
    return not task.threaded


def _tasks(keys: Iterable[str], window: Sequence[tuple[m.Checkpoint, dict[str, m.Variable]]]) -> Iterator[Task]:
    """The keys in order: a key with a value of :data:`THREAD_MIN_BYTES` or more alone, for the
    threads; the others in runs of consecutive keys of at most :data:`TASK_BYTES` through the
    window (one key alone when it holds more), for the calling thread."""
    task: list[str] = []
    held = 0
    for key in keys:
        nbytes = largest = 0
        for _, by_key in window:
            var = by_key.get(key)
            if var is not None:
                size = var.size * m.ITEMSIZE.get(var.dtype, 8)
                nbytes += size
                largest = max(largest, size)
        if task and (largest >= THREAD_MIN_BYTES or held + nbytes > TASK_BYTES):
            yield Task(task, False)
            task, held = [], 0
        if largest >= THREAD_MIN_BYTES:
            yield Task([key], True)
            continue
        task.append(key)
        held += nbytes
    if task:
        yield Task(task, False)
