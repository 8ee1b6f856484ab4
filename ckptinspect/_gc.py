"""The cyclic garbage collector paused while many small objects are built at once.

Objects that hold no reference cycles (an index's entries, a header's tensors, ``scan``'s
figures of every variable at every step) are freed by their reference counts; the collector
would only traverse them again and again as they accumulate.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

__all__ = ["paused_gc"]

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause automatic cyclic collection for the block (nested and concurrent uses keep it paused
    until the last one ends; it is resumed only if it was running before the first)."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
