"""Building many small objects at once (a header of a million tensors, an index of 100,000
variables): the cyclic garbage collector paused meanwhile.

The objects a listing builds (dicts, tuples, named tuples, variables) hold no reference cycles
and are freed by their reference counts; the collector would only traverse them again and
again as they accumulate (a quarter to a third of the time of a 1.3-million-tensor header).
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterable, Iterator, Sequence

from .. import model as m

__all__ = ["paused_gc", "compact_variables", "COMPACT_MIN_VARIABLES"]

COMPACT_MIN_VARIABLES = 20_000  # a listing of more variables keeps them as columns (VariableTable)


def compact_variables(variables: Iterable[m.Variable]) -> Sequence[m.Variable]:
    """``variables`` as :attr:`Checkpoint.variables <ckptinspect.model.Checkpoint.variables>`
    holds them: a :class:`~ckptinspect.model.VariableTable` when there are very many (and none
    has slices or an object-graph path), else a tuple."""
    variables = tuple(variables)
    if len(variables) >= COMPACT_MIN_VARIABLES:
        try:
            table = m.VariableTable.from_variables(variables)
        except OverflowError:  # a size beyond the int64 column (a hostile shape): kept as objects
            return variables
        if table is not None:
            return table
    return variables

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
