"""Pairing two sets of variables: the one matcher behind ``diff``, ``transplant`` and ``extract``.

Each side is a list of :class:`Item` records (key, readable name, shape, dtype, role,
object-graph path, an order index and optional extra names; :func:`items` builds them from
:class:`~ckptinspect.Variable` entries). :func:`match` runs *stages* in a fixed order; each
stage sees only what the stages before it left unpaired and returns a :class:`StageResult`:
the pairs it made (each saying how), the ambiguities it refused to resolve, and notes. What no
stage pairs comes back as ``only_a`` / ``only_b``. Everything here is a pure function of the
records: no file, no TensorFlow, no numpy.

The stages, in the order they run (the ``how`` of the pairs they make):

1. ``key``: equal keys (two checkpoints of the same format).
2. ``graph-path``: equal object-graph paths, below the node A saved B's structure as (the most
   voted prefix; a tie is an ambiguity). By default all or nothing: every path of B must be
   found, and nothing else below that node.
3. ``name``: equal names after normalisation (:func:`normalize_name`), any of an item's names.
4. ``prefix``: equal after dropping an outer prefix one side has (most voted prefix first).
5. ``positional``: Keras 3 positional names (``layer/vars/N``) matched to named variables of
   the same layer, in Keras creation order, checking shapes.
6. ``optimizer-positional``: Keras 3 ``optimizer/vars/N`` matched to a TF checkpoint's
   ``<optimizer>/_variables/N`` by index, shape and dtype.
7. ``order``: each remaining variable of B, in order, takes the first remaining variable of A
   with the same shape, in order, preferring the same last name component (opt-in).

Loading a checkpoint into a model (``transplant``, ``doctor``) replaces stages 3-7 with one
global stage, :func:`layer_stage` (:mod:`ckptinspect.ops.match.layers`): whole layers are paired
on the evidence of the whole model (exact names, names after normalisation such as Keras
auto-numbering offsets, leaf spellings, then, opt-in, layer order and shape), shapes are a hard
constraint (through the :class:`~ckptinspect.ops.match.layouts.Layout` rules a user names), and its
pairs report ``normalized-name`` or ``layer-order`` besides the name stages' ``how``.
:func:`model_stages` is that pipeline.

``--map`` rules (:mod:`ckptinspect.ops.match.mapping`): every rule, in order, ``re.sub`` on every
normalised name of A, before the name stages (3-6). A pair a name stage makes from a name a
rule rewrote is reported as ``mapping``. Rules mean the names decide: when rules are given the
identity stages (1-2) are skipped, so a rule can pair variables whose keys or paths also match
others. docs/INTERFACE.md ("Pairing variables") is the user-facing description.

Ambiguity is a result, never a guess: a name matching several variables on the other side (or
wanted by several), or a structure found twice, leaves those variables unpaired and is returned
as an :class:`Ambiguity` with a note. The records and the per-variable stages live in
:mod:`ckptinspect.ops.match.stages`, the global ``layers`` stage in
:mod:`ckptinspect.ops.match.layers` (same signature); this module runs them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Sequence

from ... import model as m
from ...formats import ATTRIBUTES_MARK
from .layouts import PLAIN, Layout
from .mapping import Rules, RulesLike, apply_rules, parse_mapping
from .layers import HOW_LAYER_ORDER, HOW_NORMALIZED, layer_stage
from .stages import (
    GRAPH_PATH,
    HOW_GRAPH_PATH,
    HOW_KEY,
    HOW_MAPPING,
    HOW_NAME,
    HOW_OPTIMIZER_POSITIONAL,
    HOW_ORDER,
    HOW_POSITIONAL,
    HOW_PREFIX,
    HOWS as _NAME_STAGE_HOWS,
    KEY,
    NAME,
    NAME_STAGES,
    OPTIMIZER_POSITIONAL,
    ORDER,
    POSITIONAL,
    PREFIX,
    DEFAULT_LABELS,
    Ambiguity,
    Context,
    Item,
    Pair,
    Stage,
    StageResult,
    graph_path_stage,
)

__all__ = [
    "HOW_KEY",
    "HOW_GRAPH_PATH",
    "HOW_NAME",
    "HOW_PREFIX",
    "HOW_POSITIONAL",
    "HOW_OPTIMIZER_POSITIONAL",
    "HOW_MAPPING",
    "HOW_ORDER",
    "HOW_NORMALIZED",
    "HOW_LAYER_ORDER",
    "HOWS",
    "NAME_HOWS",
    "ALIGN_KEY",
    "ALIGN_NAME",
    "Item",
    "Pair",
    "Ambiguity",
    "StageResult",
    "Context",
    "Stage",
    "Match",
    "KEY",
    "GRAPH_PATH",
    "NAME",
    "PREFIX",
    "POSITIONAL",
    "OPTIMIZER_POSITIONAL",
    "ORDER",
    "NAME_STAGES",
    "graph_path_stage",
    "layer_stage",
    "stages_for",
    "model_stages",
    "items",
    "normalize_name",
    "match",
    "align",
]

HOWS = (*_NAME_STAGE_HOWS, HOW_NORMALIZED, HOW_LAYER_ORDER)
# Pairs made from names: one made from a name a --map rule rewrote reports ``mapping`` instead.
NAME_HOWS = frozenset({HOW_NAME, HOW_PREFIX, HOW_POSITIONAL, HOW_OPTIMIZER_POSITIONAL, HOW_NORMALIZED})

# What diff reports as its alignment: by key (same format, the key stage paired something) or name.
ALIGN_KEY = "key"
ALIGN_NAME = "name"

# Format wrappers a readable name loses when normalised.
ATTRIBUTES_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


@dataclasses.dataclass(frozen=True)
class Match:
    """The result of :func:`match`.

    Attributes:
        pairs: Every pair, in the order the stages made them (a tuple, or, where :func:`align`
            joined two :class:`~ckptinspect.VariableTable` sides on their keys, a
            :class:`~ckptinspect.ops.match.columns.KeyPairs` sequence making each pair when asked).
        only_a: Items of A no stage paired, in A's order.
        only_b: Items of B no stage paired, in B's order.
        ambiguous: What the stages refused to guess.
        notes: What the stages did or could not do, one sentence each.
        method: For ``diff``: ``key`` or ``name`` (see :func:`align`); empty otherwise.
    """

    pairs: Sequence[Pair]
    only_a: tuple[Item, ...]
    only_b: tuple[Item, ...]
    ambiguous: tuple[Ambiguity, ...] = ()
    notes: tuple[str, ...] = ()
    method: str = ""

    @property
    def matched(self) -> int:
        """The number of pairs."""
        return len(self.pairs)

    def count(self, how: str) -> int:
        """The number of pairs made ``how``."""
        counted = getattr(self.pairs, "count_how", None)
        if counted is not None:
            return counted(how)
        return sum(1 for p in self.pairs if p.how == how)


def items(variables: Iterable[Any]) -> list[Item]:
    """Items for :class:`~ckptinspect.Variable` entries (or any objects with ``key``, ``name``,
    ``shape``, ``dtype`` and optionally ``role`` and ``graph_path``), indexed in the given order."""
    role = m.ROLE_MODEL
    return [
        Item(v.key, v.name, tuple(v.shape), v.dtype, getattr(v, "role", role), getattr(v, "graph_path", None), i, (), v)
        for i, v in enumerate(variables)
    ]


def normalize_name(name: str) -> str:
    """A readable name without format wrappers: ``a/b/.ATTRIBUTES/VARIABLE_VALUE`` -> ``a/b``,
    ``dense/kernel:0`` -> ``dense/kernel``; outer slashes dropped."""
    if ATTRIBUTES_MARK in name:
        name = name.removesuffix(ATTRIBUTES_SUFFIX).replace(ATTRIBUTES_MARK, "/")
    if ":" in name:
        name = m.strip_output_index(name)
    return name.strip("/")


def stages_for(*, key: bool = False, graph_path: bool = False, rules: bool = False, order: bool = False) -> tuple[Stage, ...]:
    """The one pipeline, as a command uses it.

    Args:
        key: Start with the ``key`` stage (two checkpoints of the same format).
        graph_path: Start with the ``graph-path`` stage (all or nothing).
        rules: ``--map`` rules are given: the identity stages (key, graph-path) are skipped.
        order: End with the ``order`` stage.

    Returns:
        The stages, in order.
    """
    stages: list[Stage] = []
    if not rules:
        stages += [KEY] if key else []
        stages += [GRAPH_PATH] if graph_path else []
    stages += NAME_STAGES
    stages += [ORDER] if order else []
    return tuple(stages)


def model_stages(
    *, graph_path: bool = True, rules: bool = False, layout: Layout = PLAIN, order: bool = False, order_known: bool = True
) -> tuple[Stage, ...]:
    """The pipeline that pairs a checkpoint (A) with a model's variables (B).

    Args:
        graph_path: Start with the ``graph-path`` stage (all or nothing).
        rules: ``--map`` rules are given: the graph-path stage is skipped (names decide).
        layout: Layout rules shapes are compared through.
        order: Also pair layers by layer order and shape.
        order_known: A's order is topological (see :func:`layer_stage`).

    Returns:
        The stages, in order.
    """
    stages: list[Stage] = [GRAPH_PATH] if graph_path and not rules else []
    return (*stages, layer_stage(layout, order=order, order_known=order_known))


# diff's name stages: the per-variable ones, then what they leave paired as Keras lays a model
# out (issue 25): whole layers by name once Keras' auto-numbers are set aside (``dense`` in an
# early ModelCheckpoint file, ``dense_3`` in the final model saved from another session), each
# layer's variables by their names or Keras' creation order; shapes must be equal.
DIFF_NAME_STAGES = (*NAME_STAGES, layer_stage(PLAIN))


# -- the driver ----------------------------------------------------------------------------------
def _check_indices(side: Sequence[Item], label: str) -> None:
    seen = set()
    for x in side:
        if x.index in seen:
            raise ValueError(f"items of {label} must have distinct indices; {x.index} is repeated")
        seen.add(x.index)


def match(
    a: Sequence[Item],
    b: Sequence[Item],
    stages: Sequence[Stage],
    *,
    rules: RulesLike = None,
    labels: tuple[str, str] = DEFAULT_LABELS,
) -> Match:
    """Pair the items of A with those of B, stage by stage.

    Args:
        a: Items of A (the side ``--map`` rewrites).
        b: Items of B.
        stages: The stages to run, in order (see :func:`stages_for`).
        rules: ``--map`` rules for A's names (see :func:`~ckptinspect.ops.match.mapping.parse_mapping`).
        labels: How notes name A and B.

    Returns:
        The :class:`Match`: pairs, leftovers of each side, ambiguities and notes.

    Raises:
        UsageError: Bad rules.
        ValueError: Two items of a side share an index.
    """
    _check_indices(a, labels[0])
    _check_indices(b, labels[1])
    compiled = parse_mapping(rules)
    notes: list[str] = []
    names = _Names(compiled)
    if compiled:  # a note for every rule that rewrites nothing: every name is needed
        names.prepare(a, b)
        notes += [f"--map rule {rx.pattern!r} -> {repl!r} matched no name of {labels[0]}"
                  for i, (rx, repl) in enumerate(compiled) if i not in names.hits]
    ctx = Context(names.a, names.b, *labels)

    free_a, free_b = list(a), list(b)
    pairs: list[Pair] = []
    ambiguous: list[Ambiguity] = []
    for stage in stages:
        if not free_a or not free_b:
            break
        if stage.needs_names:
            names.prepare(free_a, free_b)
        result = stage(free_a, free_b, ctx)
        made = _stage_pairs(stage, result, names.renamed)
        pairs += made
        ambiguous += result.ambiguous
        notes += result.notes
        done_a = {p.a.index for p in made}
        done_b = {p.b.index for p in made}
        free_a = [x for x in free_a if x.index not in done_a]
        free_b = [y for y in free_b if y.index not in done_b]
    return Match(
        pairs=tuple(pairs),
        only_a=tuple(free_a),
        only_b=tuple(free_b),
        ambiguous=tuple(ambiguous),
        notes=tuple(notes),
    )


class _Names:
    """Each item's normalised names (its name first, then its aliases), made when a stage
    first needs them; A's rewritten by the ``--map`` rules.

    Attributes:
        a: A's names by item index.
        b: B's names by item index.
        renamed: A's items whose own name a rule rewrote.
        hits: The rules that rewrote some name.
    """

    def __init__(self, compiled: Rules):
        self.compiled = compiled
        self.a: dict[int, tuple[str, ...]] = {}
        self.b: dict[int, tuple[str, ...]] = {}
        self.renamed: set[int] = set()
        self.hits: set[int] = set()

    def prepare(self, side_a: Sequence[Item], side_b: Sequence[Item]) -> None:
        """Normalised (A: and rewritten) names of the items not prepared yet."""
        for x in side_a:
            if x.index in self.a:
                continue
            primary = normalize_name(x.name)
            names = [primary, *(normalize_name(n) for n in x.aliases)]
            if self.compiled:
                for i, plain in enumerate(names):
                    names[i], hit = apply_rules(plain, self.compiled)
                    self.hits.update(hit)
                if names[0] != primary:
                    self.renamed.add(x.index)
            self.a[x.index] = tuple(dict.fromkeys(names)) if x.aliases else (names[0],)
        for y in side_b:
            if y.index not in self.b:
                self.b[y.index] = (
                    tuple(dict.fromkeys(normalize_name(n) for n in (y.name, *y.aliases))) if y.aliases
                    else (normalize_name(y.name),)
                )


def _stage_pairs(stage: Stage, result: StageResult, renamed: set[int]) -> list[Pair]:
    """A stage's pairs, each item paired once (else the stage is wrong); a pair a name-using
    stage made from a name a ``--map`` rule rewrote says ``mapping``."""
    done_a, done_b = set(), set()
    pairs = []
    for p in result.pairs:
        if p.a.index in done_a or p.b.index in done_b:
            raise RuntimeError(f"stage {stage.how} paired an item twice")  # pragma: no cover - a stage bug
        done_a.add(p.a.index)
        done_b.add(p.b.index)
        if stage.uses_names and p.a.index in renamed and p.how in NAME_HOWS:
            p = p._replace(how=HOW_MAPPING)
        pairs.append(p)
    return pairs


def align(
    a: Sequence[Any],
    b: Sequence[Any],
    *,
    same_format: bool,
    mapping: RulesLike = None,
    layout: Layout | None = None,
    keras: bool = False,
) -> Match:
    """Pair the variables of two checkpoints, as ``diff`` does.

    Same format and no mapping: by key first, then the name stages for what is left; when the
    name stages alone pair strictly more (two TF checkpoints of one model written through
    different object graphs, whose keys mean different variables), the name alignment is used
    instead. Otherwise by name only, A's names rewritten by ``mapping`` first.

    Args:
        a: Variables of A (or :class:`Item` records).
        b: Variables of B.
        same_format: Whether both checkpoints have the same format.
        mapping: ``--map`` rules for A's names.
        layout: Layout rules (``--transpose-dense``, ``--conv-layout``): A comes from another
            framework. Alignment is by name, and what the name stages leave is paired by
            :func:`layer_stage` (leaf spellings such as ``weight``/``kernel``,
            ``running_mean``/``moving_mean``; shapes through these rules), as ``doctor`` pairs.
        keras: Both sides are Keras files (``.h5``, ``.weights.h5``, ``.keras``): what the name
            stages leave is paired as Keras lays a model out (:data:`DIFF_NAME_STAGES`).

    Returns:
        The :class:`Match`, its ``method`` ``key`` or ``name``, with a note naming what could
        not be aligned.

    Raises:
        UsageError: Bad mapping rules.
    """
    rules = parse_mapping(mapping)
    names = DIFF_NAME_STAGES if keras else NAME_STAGES
    plain = layout is None or layout.plain
    if plain and same_format and not rules and not keras and isinstance(a, m.VariableTable) \
            and isinstance(b, m.VariableTable):
        return _with_unaligned_note(_align_tables(a, b))
    ia = list(a) if all(isinstance(x, Item) for x in a) else items(a)
    ib = list(b) if all(isinstance(y, Item) for y in b) else items(b)
    if layout is not None and not layout.plain:
        stages = (*NAME_STAGES, layer_stage(layout))
        result = dataclasses.replace(match(ia, ib, stages, rules=rules), method=ALIGN_NAME)
    elif same_format and not rules:
        result, method, extra, by_name = _key_or_name(match(ia, ib, stages_for(key=True)), min(len(ia), len(ib)),
                                                      lambda: match(ia, ib, NAME_STAGES))
        if keras and result.only_a and result.only_b:  # the same pipeline again, with Keras' layout last
            result = match(ia, ib, names if by_name else (KEY, *names))
        result = dataclasses.replace(result, notes=(*extra, *result.notes), method=method)
    else:
        result = dataclasses.replace(match(ia, ib, names, rules=rules), method=ALIGN_NAME)
    return _with_unaligned_note(result)


def _with_unaligned_note(result: Match) -> Match:
    """``result`` with a last note naming what could not be aligned (when both sides have some)."""
    if result.only_a and result.only_b:
        ex_a, ex_b = min(x.name for x in result.only_a), min(y.name for y in result.only_b)
        result = dataclasses.replace(result, notes=(*result.notes, (
            f"could not align {len(result.only_a)} name(s) of A with {len(result.only_b)} name(s) of B (e.g. A '{ex_a}',"
            f" B '{ex_b}'); they are listed as removed/added: rename A's names with --map 'REGEX=REPLACEMENT'"
        )))
    return result


def _align_tables(a: m.VariableTable, b: m.VariableTable) -> Match:
    """:func:`align` of two :class:`~ckptinspect.VariableTable` sides of the same format, without
    ``--map``, layout rules or Keras' layout: the ``key`` stage is a join on the packed keys
    (:func:`~ckptinspect.ops.match.columns.key_join`), only what it leaves goes through the name
    stages as :class:`Item` records. The same pairs, ``how``, notes, ``method`` and order as the
    record path."""
    from .columns import KeyPairs, items_at, key_join, keys_are_plain_names  # noqa: PLC0415 - numpy

    rows_a, rows_b, free_a, free_b = key_join(a, b)
    rest = match(items_at(a, free_a), items_at(b, free_b), NAME_STAGES)
    del free_a, free_b
    # By name alone the stages pair what they pair after the key stage when every key is a name
    # that normalises to itself (pairing by that name is pairing by key): no second run then.
    plain = keys_are_plain_names(a) and keys_are_plain_names(b)
    result, method, extra, _ = _key_or_name(dataclasses.replace(rest, pairs=KeyPairs(a, b, rows_a, rows_b, rest.pairs)),
                                            min(len(a), len(b)), lambda: None if plain else match(items(a), items(b), NAME_STAGES))
    return dataclasses.replace(result, notes=(*extra, *result.notes), method=method)


def _key_or_name(result: Match, smaller: int, by_name: Callable[[], Match | None]) -> tuple[Match, str, list[str], bool]:
    """diff's choice between the key stage followed by the name stages (``result``) and the name
    stages alone (``by_name()``, run only when keys left something of the smaller side unpaired;
    None: known to pair no more): the one that pairs more, keys first on a tie.

    Returns:
        (the alignment, its method, its first notes, whether it is the name stages alone).
    """
    by_key = result.count(HOW_KEY)
    method = ALIGN_NAME if result.matched and not by_key else ALIGN_KEY
    extra: list[str] = []
    if by_key and result.matched > by_key:
        extra.append(f"{result.matched - by_key} pair(s) whose keys differ aligned by readable name")
    elif not by_key and result.matched:
        extra.append(f"keys differ (0 shared); aligned by readable name instead ({result.matched} pairs)")
    if result.matched < smaller and by_key:
        alt = by_name()
        if alt is not None and alt.matched > result.matched:
            return alt, ALIGN_NAME, [f"keys differ ({by_key} shared); aligned by readable name instead ({alt.matched} pairs)"], True
    return result, method, extra, False
