"""Building many small objects at once (a header of a million tensors, an index of 100,000
variables): the cyclic garbage collector paused meanwhile (:func:`ckptinspect._gc.paused_gc`).

The objects a listing builds (dicts, tuples, named tuples, variables) hold no reference cycles
and are freed by their reference counts; the collector would only traverse them again and
again as they accumulate (a quarter to a third of the time of a 1.3-million-tensor header).
"""

from __future__ import annotations

from typing import Iterable, Sequence

from .. import model as m
from .._gc import paused_gc

__all__ = ["paused_gc", "compact_variables", "COMPACT_MIN_VARIABLES"]

COMPACT_MIN_VARIABLES = 20_000  # a listing of more variables keeps them as columns (VariableTable)


def compact_variables(variables: Iterable[m.Variable]) -> Sequence[m.Variable]:
    """``variables`` as :attr:`Checkpoint.variables <ckptinspect.model.Checkpoint.variables>`
    holds them: a :class:`~ckptinspect.model.VariableTable` when there are very many (and none
    has slices or an object-graph path), else a tuple."""
    variables = tuple(variables)
    if len(variables) >= COMPACT_MIN_VARIABLES:
        table = m.VariableTable.from_variables(variables)
        if table is not None:
            return table
    return variables
