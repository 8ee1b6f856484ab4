"""``python -m ckptinspect``, and the ``ckptinspect`` console script (:func:`run`)."""

from __future__ import annotations

import gc
import os
import sys
import threading

# The cyclic garbage collector's first threshold in the ckptinspect process: a collection when
# the live container objects have grown by this many (Python's default is 700). Start-up alone
# (numpy, h5py, click) leaves ~30,000 that live as long as the process, which the default
# scans again and again: ~130 collections, 40-50 ms of a `diff` of two .h5 files, for no
# garbage. Objects freed as usual (reference counts) do not count; cyclic garbage is still
# collected, after at most this many objects (some MiB).
GC_THRESHOLD = 100_000

# OpenBLAS threads in the ckptinspect process (unless the environment sets them). Its BLAS calls
# are dots of at most a block (scan's 8,192-element pieces, diff's blocks), which the comparing
# threads already spread over the cores; OpenBLAS' own pool only adds its start-up to numpy's
# import (~30 ms of CPU) and threads that contend with ours (user + sys CPU, medians: diff of the
# 1 GB pair 1.51 -> 1.21 s, of two .weights.h5 of 2,000 datasets 0.75 -> 0.63 s; wall no slower).
BLAS_THREADS = "1"


def _skip_teardown(code: int) -> None:
    """End the process with ``code`` once the normal exit has done its work, without tearing the
    interpreter down.

    A normal exit joins the other threads, runs every exit handler (``atexit``: logging,
    futures, user handlers, in whatever order they were registered), flushes the standard
    streams, collects garbage, then frees every module (numpy's and HDF5's library teardown
    included): 30-50 ms a command for state that is thrown away with the process anyway. This
    arms a garbage-collector callback (``gc.callbacks``) that, at the interpreter's final
    collection (``sys.is_finalizing()``: the exit handlers have all run, each once), flushes
    the streams again and ends the process with ``os._exit``. Everything before that point is
    the normal exit's own; only the teardown is skipped.

    Not armed when something could still be pending: another thread alive (daemon threads
    included), or TensorFlow loaded (its own teardown is left to run; those commands take
    seconds anyway). A stream that does not flush disarms it: the normal exit then reports the
    error as usual. Where a Python runs no collection at that point, the exit is simply a
    normal one.
    """
    if threading.active_count() > 1 or "tensorflow" in sys.modules:
        return

    def at_final_collection(phase: str, info: dict) -> None:  # noqa: ARG001 - gc's callback signature
        if phase != "start" or not sys.is_finalizing():
            return  # a collection while the command or an exit handler runs
        gc.callbacks.remove(at_final_collection)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):  # a closed pipe or stream: the normal exit reports it
            return
        os._exit(code)

    gc.callbacks.append(at_final_collection)


def run() -> None:
    """The command line as a process: :func:`ckptinspect.cli.main`, then a normal exit with its
    exit code that skips the interpreter's teardown (see :func:`_skip_teardown`).
    :func:`~ckptinspect.cli.main` itself only raises ``SystemExit``, for callers that go on
    running after it. The process collects cyclic
    garbage every :data:`GC_THRESHOLD` new objects, and OpenBLAS runs :data:`BLAS_THREADS` thread."""
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
    os.environ.setdefault("OPENBLAS_NUM_THREADS", BLAS_THREADS)  # read when numpy first loads
    from .cli import main  # noqa: PLC0415 - after the threshold: the imports are most of the objects

    try:
        main()
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            _skip_teardown(e.code or 0)
        raise


if __name__ == "__main__":
    run()
