"""``ls``: the variables of a checkpoint, filtered, optionally with value statistics."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from ..errors import UsageError
from ..model import ROLES, Checkpoint, Variable, VariableTable
from .roles import mark_optimizer

if TYPE_CHECKING:  # the statistics module loads for --stats only
    from .stats import Progress, Stats

__all__ = ["Listing", "list_variables"]


@dataclasses.dataclass(frozen=True)
class Listing:
    """What ``ls`` shows: the checkpoint, the chosen variables and (with stats) their statistics."""

    checkpoint: Checkpoint
    variables: Sequence[Variable]  # a tuple, or a view of the checkpoint's VariableTable
    stats: dict[str, Stats | None] | None = None

    @property
    def warnings(self) -> tuple[str, ...]:
        """What the reader found wrong around the checkpoint (a directory's state file,
        leftover temporaries), one line each."""
        return tuple(self.checkpoint.info.get("warnings", ()))

    def to_dict(self, variables: bool = True) -> dict[str, Any]:
        """The ``ls --format json`` document (see shared/INTERFACE.md); ``variables=False``:
        with an empty ``variables`` list (:meth:`variable_dicts` gives them one at a time)."""
        doc = self.checkpoint.to_dict(variables=False)
        doc["variables"] = list(self.variable_dicts()) if variables else []
        return doc

    def variable_dicts(self) -> Iterator[dict[str, Any]]:
        """The ``variables`` of :meth:`to_dict`, one at a time."""
        for v in self.variables:
            item = v.to_dict()
            if self.stats is not None:
                s = self.stats.get(v.key)
                item["stats"] = s.to_dict() if s is not None else None
            yield item


SORT_KEYS = ("role", "name", "size", "file")


def _sorted_table(table: VariableTable, role: str | None, sort: str) -> VariableTable:
    """:func:`_sorted` of a table's variables of ``role`` (or all), from its columns."""
    import numpy as np  # noqa: PLC0415 - a table's columns are numpy arrays

    rows = table.positions()
    if role is not None:
        code = table.roles.index(role) if role in table.roles else -1
        rows = rows[table.role_codes[rows] == code]
    table = table.view(rows)
    if sort == "file":
        return table
    rows = table.name_order()  # stable sorts by the other keys keep names in order within them
    if sort == "size":
        rows = rows[np.argsort(-table.nbytes[rows], kind="stable")]
    elif sort == "role":
        order = np.array([ROLES.index(r) if r in ROLES else len(ROLES) for r in table.roles], np.int64)
        rows = rows[np.argsort(order[table.role_codes[rows]], kind="stable")]
    return table.view(rows)


def _sorted(variables: tuple[Variable, ...], sort: str) -> tuple[Variable, ...]:
    if sort == "file":
        return variables
    if sort == "name":
        return tuple(sorted(variables, key=lambda v: v.name))
    if sort == "size":
        return tuple(sorted(variables, key=lambda v: (-v.nbytes, v.name)))
    order = {r: i for i, r in enumerate(ROLES)}
    return tuple(sorted(variables, key=lambda v: (order.get(v.role, len(order)), v.name)))


def list_variables(
    ckpt: Checkpoint,
    *,
    pattern: str | None = None,
    role: str | None = None,
    sort: str = "role",
    stats: bool = False,
    progress: Progress | None = None,
    optimizer_pattern: str | None = None,
) -> Listing:
    """Choose variables by regex and role, and compute statistics when asked.

    Args:
        ckpt: An open checkpoint.
        pattern: Regex searched in each name and key.
        role: ``model``, ``optimizer`` or ``metadata``.
        sort: ``role`` (model, optimizer, metadata; by name within each), ``name``,
            ``size`` (largest first) or ``file`` (the order in the file).
        stats: Read every chosen tensor (one at a time) for min/max/mean/std/NaN/Inf.
        progress: Called after each tensor when ``stats`` is set.
        optimizer_pattern: Regex of names (or keys) to mark as optimizer state first (see
            :func:`ckptinspect.ops.roles.mark_optimizer`); the listing's checkpoint carries them.

    Raises:
        UsageError: Bad role or regex.
    """
    ckpt = mark_optimizer(ckpt, optimizer_pattern)
    if role is not None and role not in ROLES:
        raise UsageError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
    import re  # noqa: PLC0415

    if sort not in SORT_KEYS:
        raise UsageError(f"unknown sort {sort!r}; expected one of {', '.join(SORT_KEYS)}")
    try:
        if isinstance(ckpt.variables, VariableTable) and not pattern:  # very many: from the columns
            chosen: Sequence[Variable] = _sorted_table(ckpt.variables, role, sort)
        else:
            chosen = _sorted(tuple(ckpt.filter(pattern, role)), sort)
    except re.error as e:
        raise UsageError(f"bad --filter regex {pattern!r}: {e}") from None
    values = None
    if stats:
        from .stats import compute_stats  # noqa: PLC0415 - numpy only when values are read

        values = compute_stats(ckpt, chosen, progress)
    return Listing(checkpoint=ckpt, variables=chosen, stats=values)
