"""``--map 'REGEX=REPLACEMENT'`` rules, shared by the operations that align variables by name
(``diff`` rewrites A's names, ``transplant`` the source's)."""

from __future__ import annotations

import re
from typing import Iterable, Mapping

from ..errors import UsageError

__all__ = ["Rules", "parse_mapping"]

Rules = list[tuple[re.Pattern[str], str]]


def parse_mapping(rules: Mapping[str, str] | Iterable[str | tuple[str, str]] | None) -> Rules:
    """Compile mapping rules.

    Args:
        rules: ``"REGEX=REPLACEMENT"`` strings (split at the first ``=``), ``(regex,
            replacement)`` pairs, or a dict of them.

    Returns:
        Compiled ``(pattern, replacement)`` pairs, in order.

    Raises:
        UsageError: A rule without ``=`` or with a bad regex.
    """
    if not rules:
        return []
    items = rules.items() if isinstance(rules, Mapping) else rules
    out: Rules = []
    for rule in items:
        if isinstance(rule, str):
            if "=" not in rule:
                raise UsageError(f"bad --map rule {rule!r}: expected 'REGEX=REPLACEMENT'")
            pattern, repl = rule.split("=", 1)
        else:
            pattern, repl = rule
        try:
            out.append((re.compile(pattern), repl))
        except re.error as e:
            raise UsageError(f"bad --map regex {pattern!r}: {e}") from None
    return out
