"""``ls``: the variables of a checkpoint, filtered, optionally with value statistics."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..model import ROLES, Checkpoint, Variable
from .roles import mark_optimizer

if TYPE_CHECKING:  # the statistics module loads for --stats only
    from .stats import Progress, Stats

__all__ = ["Listing", "list_variables"]


@dataclasses.dataclass(frozen=True)
class Listing:
    """What ``ls`` shows: the checkpoint, the chosen variables and (with stats) their statistics."""

    checkpoint: Checkpoint
    variables: tuple[Variable, ...]
    stats: dict[str, Stats | None] | None = None

    @property
    def warnings(self) -> tuple[str, ...]:
        """What the reader found wrong around the checkpoint (a directory's state file,
        leftover temporaries), one line each."""
        return tuple(self.checkpoint.info.get("warnings", ()))

    def to_dict(self) -> dict[str, Any]:
        """The ``ls --format json`` document (see shared/INTERFACE.md)."""
        doc = self.checkpoint.to_dict()
        doc["variables"] = []
        for v in self.variables:
            item = v.to_dict()
            if self.stats is not None:
                s = self.stats.get(v.key)
                item["stats"] = s.to_dict() if s is not None else None
            doc["variables"].append(item)
        return doc


SORT_KEYS = ("role", "name", "size", "file")


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
        chosen = _sorted(tuple(ckpt.filter(pattern, role)), sort)
    except re.error as e:
        raise UsageError(f"bad --filter regex {pattern!r}: {e}") from None
    values = None
    if stats:
        from .stats import compute_stats  # noqa: PLC0415 - numpy only when values are read

        values = compute_stats(ckpt, chosen, progress)
    return Listing(checkpoint=ckpt, variables=chosen, stats=values)
