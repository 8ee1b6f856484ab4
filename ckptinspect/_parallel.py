"""An ordered, bounded thread map: the one way the streaming commands use both cores.

numpy's ufuncs and reductions, ``os.preadv`` and google-crc32c release the GIL, so a handful of
threads each working on its own block (about 1 MiB) keep two cores busy. :func:`ordered_map`
runs ``fn`` over the items in up to :data:`WORKERS` threads, with at most ``ahead`` items in
flight (memory stays at that many blocks), and yields the results in input order, so sums
merged by the caller are added in the same order, and give the same bits, whatever the
number of workers.
"""

from __future__ import annotations

import collections
import os
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, TypeVar

if TYPE_CHECKING:  # the pool is imported when one is started (`ls` of a TF bundle reaches this module, never a pool)
    from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["WORKERS", "THREAD_MIN_BYTES", "ordered_map"]

# Threads per map: the cores the process may run on, at most 2 (the commands read ~1 MiB
# blocks; past two workers, hand-offs and memory bandwidth win over compute on the machines
# measured). CKPTINSPECT_WORKERS overrides it (1 runs everything in the calling thread).
_MAX_DEFAULT_WORKERS = 2
_ENV_WORKERS = "CKPTINSPECT_WORKERS"

# Work on values smaller than this is faster in the calling thread than in the pool: a small
# value's read, checksum and arithmetic each release the GIL for microseconds, too short for a
# second thread to use, while each hand-over of the GIL between threads costs about as much.
# The callers pass ``inline`` predicates built on it (scan's chains, diff's batches). Measured
# (medians of 5, two threads vs one, whole processes): scan of 5-checkpoint runs of 200 MB,
# 100 KB values 1.16-1.3 s vs 0.96 s, 256 KB 0.67 vs 0.52, 512 KB even, 1 MB 0.42 vs 0.49,
# 16 MB 0.53 vs 0.70; diff of two 100 MB Keras 3 files, 50 KB values 0.69 vs 0.59 s, 128 KB
# 0.39 vs 0.35, 256 KB 0.36 vs 0.31, 512 KB 0.29 vs 0.29, 4 MB 0.24 vs 0.22.
THREAD_MIN_BYTES = 512 << 10

T = TypeVar("T")
R = TypeVar("R")


def _default_workers() -> int:
    text = os.environ.get(_ENV_WORKERS, "").strip()
    if text.isdigit() and int(text) > 0:
        return int(text)
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(_MAX_DEFAULT_WORKERS, cores))


WORKERS = _default_workers()


def ordered_map(fn: Callable[[T], R], items: Iterable[T], workers: int | None = None, ahead: int | None = None,
                inline: Callable[[T], bool] | None = None) -> Iterator[R]:
    """``fn`` of every item, computed by up to ``workers`` threads, yielded in input order.

    The items are drawn from ``items`` in the calling thread, lazily: at most ``ahead`` of
    them (default ``2 * workers``) are submitted and not yet yielded. An exception raised by
    ``fn`` is raised to the caller at that item's position, after the items before it were
    yielded. Closing the generator early (``break``, an error in the caller) cancels what has
    not started and waits for what has, so no thread outlives the call.

    Args:
        fn: The work for one item; it must not depend on the other items' side effects.
        items: The inputs, in order.
        workers: Threads (default :data:`WORKERS`); 1 computes each item in the calling
            thread when it is yielded, with no pool.
        ahead: Items in flight at most (default ``2 * workers``).
        inline: Items it is true of are computed in the calling thread when their turn comes
            (no hand-over to a thread), while the threads work on the other items drawn ahead
            of them; the pool starts with the first item it is false of. None: every item
            goes to the threads.

    Yields:
        ``fn(item)`` for each item, in order.
    """
    workers = WORKERS if workers is None else max(1, workers)
    if workers == 1:
        for item in items:
            yield fn(item)
        return
    limit = max(workers, ahead if ahead is not None else 2 * workers)
    # each item in flight: its future, or (None, the item) when the calling thread computes it
    in_flight: collections.deque[tuple[Future[R] | None, T | None]] = collections.deque()
    pool: ThreadPoolExecutor | None = None
    try:
        source = iter(items)
        exhausted = False
        while True:
            while not exhausted and len(in_flight) < limit:
                try:
                    item = next(source)
                except StopIteration:
                    exhausted = True
                    break
                if inline is not None and inline(item):
                    in_flight.append((None, item))
                    continue
                if pool is None:
                    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415 - see TYPE_CHECKING above

                    pool = ThreadPoolExecutor(workers, thread_name_prefix="ckptinspect")
                in_flight.append((pool.submit(fn, item), None))
            if not in_flight:
                return
            future, item = in_flight.popleft()
            yield fn(item) if future is None else future.result()  # type: ignore[arg-type]
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
