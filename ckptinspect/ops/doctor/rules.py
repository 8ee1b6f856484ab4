"""The ``--map`` rules ``doctor`` proposes: renames that make a plain load pair every weight,
spelled so that applying them in sequence never rewrites one rule's result with another,
checked by running the matcher again with them."""

from __future__ import annotations

import collections
import re
from typing import Any, Sequence

from ... import model as m
from ..match.layouts import Layout
from ..match.mapping import Rules, apply_rules
from ..match.matcher import HOW_MAPPING, HOW_NAME, Item, match, model_stages, normalize_name
from ..model.targets import (
    SOURCE_LABEL,
    TARGET_LABEL,
    Target,
    order_known,
    source_order,
)

TMP_PREFIX = "ckptinspect-doctor-tmp-"  # temporary names that break a cycle of renames
NAME_PAIRED = (HOW_NAME, HOW_MAPPING)  # pairs a plain load makes by name

def rules_as_given(rules: Rules) -> list[str]:
    """Compiled rules back as ``REGEX=REPLACEMENT`` strings."""
    return [f"{rx.pattern}={repl}" for rx, repl in rules]


# -- the proposed --map rules ------------------------------------------------------------------
def _escape_pattern(text: str) -> str:
    # ``=`` separates a rule's regex from its replacement: spell it as an escape in the regex.
    return re.escape(text).replace("=", r"\x3d")


def _escape_replacement(text: str) -> str:
    return text.replace("\\", "\\\\")


def _common_suffix(a: list[str], b: list[str]) -> int:
    k = 0
    while k < len(a) and k < len(b) and a[-1 - k] == b[-1 - k]:
        k += 1
    return k


def propose_rules(pairs: Sequence[tuple[str, Sequence[str]]]) -> tuple[list[tuple[str, str, bool]], list[tuple[str, str, bool]]]:
    """Renames that turn each source name into one of its target's names.

    Args:
        pairs: ``(source name, target names)``: the source's name as the matcher saw it
            (normalised, after the given rules) and the names its target answers to, primary
            first.

    Returns:
        Two candidate rename sets, each ``(from, to, whole_name)``: by layer (``from/`` ->
        ``to/``, one per source layer, whole names where a layer cannot be renamed as one), and
        by whole name. Pairs whose source name is already one of the target's need none.
    """
    by_layer: dict[str, set[str]] = collections.defaultdict(set)
    whole: list[tuple[str, str, bool]] = []
    layer_of: list[tuple[str, str, str, str]] = []  # (source prefix, target prefix, source, target)
    for s, names in pairs:
        if s in names:
            continue
        target = names[0]
        sp = s.split("/")
        best_k, best_t = 0, target
        for t in names:
            k = _common_suffix(sp, t.split("/"))
            if k > best_k:
                best_k, best_t = k, t
        whole.append((s, target, True))
        if 0 < best_k < len(sp) and best_k < len(best_t.split("/")):
            src_prefix = "/".join(sp[: len(sp) - best_k])
            dst_prefix = "/".join(best_t.split("/")[: len(best_t.split("/")) - best_k])
            by_layer[src_prefix].add(dst_prefix)
            layer_of.append((src_prefix, dst_prefix, s, target))
        else:
            layer_of.append(("", "", s, target))
    layered: list[tuple[str, str, bool]] = []
    seen = set()
    for src_prefix, dst_prefix, s, target in layer_of:
        if src_prefix and len(by_layer[src_prefix]) == 1:
            if src_prefix not in seen:
                seen.add(src_prefix)
                layered.append((src_prefix, dst_prefix, False))
        else:
            layered.append((s, target, True))
    return layered, whole


def _ordered(renames: list[tuple[str, str, bool]]) -> list[str]:
    """Rules applying ``renames`` in sequence without one rewriting another's result: a rename
    whose result another would match runs after it; a cycle goes through temporary names."""

    def matches(rename: tuple[str, str, bool], name: str) -> bool:
        frm, _, whole_name = rename
        return name == frm if whole_name else name == frm or name.startswith(frm + "/")

    n = len(renames)
    after = {i: set() for i in range(n)}  # i must come after each j in after[i]
    for i, (_, to, _w) in enumerate(renames):
        for j in range(n):
            if j != i and matches(renames[j], to):
                after[i].add(j)
    order: list[int] = []
    placed: set[int] = set()
    pending = list(range(n))
    while pending:
        ready = [i for i in pending if after[i] <= placed]
        if not ready:
            break
        for i in ready:
            order.append(i)
            placed.add(i)
        pending = [i for i in pending if i not in placed]

    def rule(frm: str, to: str, whole_name: bool) -> str:
        if whole_name:
            return f"^{_escape_pattern(frm)}$={_escape_replacement(to)}"
        return f"^{_escape_pattern(frm)}/={_escape_replacement(to)}/"

    rules = [rule(*renames[i]) for i in order]
    if pending:  # a cycle (a swap): through temporary names
        rules += [rule(renames[i][0], f"{TMP_PREFIX}{i}", renames[i][2]) for i in pending]
        rules += [rule(f"{TMP_PREFIX}{i}", renames[i][1], renames[i][2]) for i in pending]
    return rules


def propose(
    ckpt: m.Checkpoint,
    sources: Sequence[m.Variable],
    model_targets: Sequence[Target],
    matched: Sequence[Any],
    rules: Rules,
    layout: Layout,
) -> tuple[list[str], bool, list[str]]:
    """The proposed ``--map`` rules (the given ones first), whether they were verified, notes."""
    given = rules_as_given(rules)
    if not matched:
        return given, False, []
    pairs = []
    for p in matched:
        name = normalize_name(p.a.ref.name)
        if rules:
            name, _ = apply_rules(name, rules)
        t: Target = p.b.ref
        pairs.append((name, tuple(dict.fromkeys(normalize_name(n) for n in t.aliases))))
    layered, whole = propose_rules(pairs)
    if not whole:
        return given, verify_rules(ckpt, sources, model_targets, matched, given, layout), []
    for renames in (layered, whole):
        candidate = given + _ordered(renames)
        if verify_rules(ckpt, sources, model_targets, matched, candidate, layout):
            return candidate, True, []
    return given + _ordered(whole), False, [
        "the proposed --map rules do not reproduce every pair by name (other names collide with them); "
        "use --emit weights"
    ]


def verify_rules(
    ckpt: m.Checkpoint,
    sources: Sequence[m.Variable],
    model_targets: Sequence[Target],
    matched: Sequence[Any],
    rules: Sequence[str],
    layout: Layout,
) -> bool:
    """The matcher with ``rules`` and names alone (no object graph, no layer order) pairs every
    matched source with its model weight, by name."""
    ordered = source_order(ckpt.format, sources)
    a = [Item(key=v.key, name=v.name, shape=tuple(v.shape), dtype=v.dtype, role=v.role, graph_path=v.graph_path,
              index=i, ref=v) for i, v in enumerate(ordered)]
    b = [Item(key=t.name, name=t.name, shape=t.shape, dtype=t.dtype, graph_path=t.graph_path, index=t.index,
              aliases=t.aliases[1:], ref=t) for t in model_targets]
    stages = model_stages(graph_path=False, rules=True, layout=layout, order=False,
                          order_known=order_known(ckpt.format, ordered))
    result = match(a, b, stages, rules=list(rules) or None, labels=(SOURCE_LABEL, TARGET_LABEL))
    got = {p.a.ref.key: (p.b.ref.index, p.how) for p in result.pairs}
    return all(got.get(p.a.ref.key, (None, None)) in ((p.b.ref.index, how) for how in NAME_PAIRED) for p in matched)

