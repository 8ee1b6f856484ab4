"""``--map 'REGEX=REPLACEMENT'`` rules: parsing, checking and applying them.

One semantics for every command that pairs variables by name (``diff`` rewrites A's names,
``transplant`` the source's): every rule, in the order given, is applied with ``re.sub`` to
every name of that side, after the name is normalised (see
:func:`ckptinspect.ops.match.matcher.normalize_name`) and before the name stages of the matcher.
The semantics are documented once, in docs/INTERFACE.md ("Pairing variables").
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping, Union

from ...errors import UsageError

__all__ = ["Rules", "RulesLike", "parse_mapping", "apply_rules", "rules_text"]

Rules = list[tuple[re.Pattern[str], str]]
RulesLike = Union[Mapping[str, str], Iterable[Union[str, tuple[str, str]]], None]

RULE_SEPARATOR = "="


def parse_mapping(rules: RulesLike, option: str = "--map") -> Rules:
    """Compile and check mapping rules.

    Both the regex and the replacement are checked here (a replacement naming a group the
    regex does not have is refused), so a bad rule fails before any file is opened.

    Args:
        rules: ``"REGEX=REPLACEMENT"`` strings (split at the first ``=``), ``(regex,
            replacement)`` pairs, or a dict of them.
        option: The option the rules were given with, named by the errors (``rewrite``'s are
            ``--rename``).

    Returns:
        Compiled ``(pattern, replacement)`` pairs, in order.

    Raises:
        UsageError: A rule without ``=``, a bad regex, or a bad replacement.
    """
    if not rules:
        return []
    items = rules.items() if isinstance(rules, Mapping) else rules
    out: Rules = []
    for rule in items:
        if isinstance(rule, str):
            if RULE_SEPARATOR not in rule:
                raise UsageError(f"bad {option} rule {rule!r}: expected 'REGEX=REPLACEMENT'")
            pattern, repl = rule.split(RULE_SEPARATOR, 1)
        else:
            pattern, repl = rule
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise UsageError(f"bad {option} regex {pattern!r}: {e}") from None
        try:
            rx.sub(repl, "")  # parses the replacement template, with or without a match
        except (re.error, IndexError) as e:
            raise UsageError(f"bad {option} replacement {repl!r} for {pattern!r}: {e}") from None
        out.append((rx, repl))
    return out


def apply_rules(name: str, rules: Rules) -> tuple[str, frozenset[int]]:
    """Rewrite ``name`` with every rule, in order (``re.sub``, all occurrences).

    Args:
        name: The name to rewrite.
        rules: Rules from :func:`parse_mapping`.

    Returns:
        The rewritten name, and the positions (in ``rules``) of the rules whose regex matched.
    """
    hit = []
    for i, (rx, repl) in enumerate(rules):
        new, count = rx.subn(repl, name)
        if count:
            hit.append(i)
            name = new
    return name, frozenset(hit)


def rules_text(rules: RulesLike) -> tuple[str, ...]:
    """The rules as ``REGEX=REPLACEMENT`` strings, as given (for reports)."""
    if not rules:
        return ()
    items = rules.items() if isinstance(rules, Mapping) else rules
    return tuple(r if isinstance(r, str) else f"{r[0]}{RULE_SEPARATOR}{r[1]}" for r in items)
