"""``python -m ckptinspect``, and the ``ckptinspect`` console script (:func:`run`)."""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading

# The cyclic garbage collector's first threshold in the ckptinspect process: a collection when
# the live container objects have grown by this many (Python's default is 700). Start-up alone
# (numpy, h5py, typer) leaves ~30,000 that live as long as the process, which the default
# scans again and again: ~130 collections, 40-50 ms of a `diff` of two .h5 files, for no
# garbage. Objects freed as usual (reference counts) do not count; cyclic garbage is still
# collected, after at most this many objects (some MiB).
GC_THRESHOLD = 100_000


def _quick_exit(code: int) -> None:
    """End the process with ``code`` without tearing the interpreter down.

    Exit handlers run and the standard streams are flushed, as at a normal exit; what is
    skipped is the last garbage collection and the freeing of every module, numpy's and
    HDF5's library teardown: 30-50 ms a command, the state is thrown away with the process
    anyway. Only when nothing could still be pending: no other thread alive (a normal exit
    would wait for it), and TensorFlow not loaded (its own teardown is left to run; those
    commands take seconds anyway). Returns (the caller then exits normally) when a stream
    does not flush, or in those cases.
    """
    if threading.active_count() > 1 or "tensorflow" in sys.modules:
        return
    atexit._run_exitfuncs()  # what a normal exit runs first (logging, futures, user handlers)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed pipe, a closed stream: the normal exit reports it
        return
    os._exit(code)


def run() -> None:
    """The command line as a process: :func:`ckptinspect.cli.main`, then a quick exit with its
    exit code (see :func:`_quick_exit`). :func:`~ckptinspect.cli.main` itself only raises
    ``SystemExit``, for callers that go on running after it. The process collects cyclic
    garbage every :data:`GC_THRESHOLD` new objects."""
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
    from .cli import main  # noqa: PLC0415 - after the threshold: the imports are most of the objects

    try:
        main()
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            _quick_exit(e.code or 0)
        raise


if __name__ == "__main__":
    run()
