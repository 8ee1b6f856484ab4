"""Re-labelling roles: names no format rule knows, marked as optimizer state by the user.

Every format gives each variable a role (``model``, ``optimizer``, ``metadata``) from what it
knows (the TF2 object graph, TF1 slot names, Keras groups). Custom optimizers name their
state in ways no rule can know; ``--optimizer-pattern REGEX`` (``ls``, ``diff``, ``extract``)
marks every variable whose readable name or key matches (``re.search``, as ``--filter``) as
optimizer state, so it is left out of ``--role model`` and stripped by ``extract``.
"""

from __future__ import annotations

import dataclasses
import re

from ..errors import UsageError
from ..model import ROLE_OPTIMIZER, Checkpoint

__all__ = ["OPTIMIZER_PATTERN_INFO", "optimizer_regex", "mark_optimizer"]

OPTIMIZER_PATTERN_INFO = "optimizer_pattern"  # Checkpoint.info key: {"pattern": ..., "marked": n}


def optimizer_regex(pattern: str | None) -> re.Pattern[str] | None:
    """The compiled ``--optimizer-pattern`` (None when not given).

    Raises:
        UsageError: Not a valid regex.
    """
    if not pattern:
        return None
    try:
        return re.compile(pattern)
    except re.error as e:
        raise UsageError(f"bad --optimizer-pattern regex {pattern!r}: {e}") from None


def mark_optimizer(ckpt: Checkpoint, pattern: str | None) -> Checkpoint:
    """The checkpoint with every variable matching ``pattern`` re-labelled as optimizer state.

    Args:
        ckpt: An open checkpoint (its tensor source is shared, not copied: close either one).
        pattern: A regex searched in each readable name and key; None or ``""`` changes nothing.

    Returns:
        A new :class:`~ckptinspect.model.Checkpoint` (``ckpt`` itself is unchanged), whose
        ``info["optimizer_pattern"]`` records the pattern and how many variables it re-labelled.

    Raises:
        UsageError: ``pattern`` is not a valid regex.
    """
    rx = optimizer_regex(pattern)
    if rx is None:
        return ckpt
    marked = 0
    variables = []
    for v in ckpt.variables:
        if v.role != ROLE_OPTIMIZER and (rx.search(v.name) or rx.search(v.key)):
            v = dataclasses.replace(v, role=ROLE_OPTIMIZER, graph_path=None)
            marked += 1
        variables.append(v)
    info = {**ckpt.info, OPTIMIZER_PATTERN_INFO: {"pattern": pattern, "marked": marked}}
    return dataclasses.replace(ckpt, variables=tuple(variables), info=info)
