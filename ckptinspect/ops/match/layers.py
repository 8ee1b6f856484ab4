"""The ``layers`` stage: global pairing of a checkpoint with a model, layer by layer.

The name stages of :mod:`ckptinspect.ops.match.stages` pair one variable at a time and do not
look at shapes, which is what ``diff`` wants (a resized layer is a difference to show). Loading
weights into a model needs more: a Keras 2 file names its layers ``conv2d_1, conv2d_2, dense_1``
where the same model built in Keras 3 has ``conv2d, conv2d_1, dense``, so equal names point at
the wrong layer. This stage decides for whole layers, on the evidence of the whole model:

1. Names are split into a layer path and a leaf (``sequential/dense_1`` + ``kernel``; Keras 3
   positions ``layer/vars/N`` keep ``vars/N`` as leaf); doubled components (``dense_1/dense_1``)
   count once; each component's Keras auto-number is split off (``dense_1`` -> ``dense`` #1,
   ``dense`` -> ``dense`` #0).
2. Layers whose paths agree once the numbers are dropped form a group on each side (an outer
   prefix only one side has, such as a model's name, is dropped, most voted first). In a group,
   candidate alignments are "equal numbers", "the same rank" and every constant numbering offset
   (``dense_1 -> dense`` is offset 1); each is scored by the number of variables it pairs with
   fitting shapes (leaf names, their TF1 / PyTorch spellings, then creation order within the
   layer). The best alignment wins; two alignments pairing different layers equally well are an
   ambiguity, unless the offset every decided group of the model agrees on settles it.
3. With ``order=True``: layers that nothing paired (on both sides, including those whose names
   agree but whose shapes do not: a name with a shape mismatch never blocks this) are paired by
   their shape signature: a signature one layer of each side has pairs them; several layers of
   one signature pair in topological order when both sides have as many, in an order that is
   known; anything else is an ambiguity.
4. Variables of layers aligned by name that still differ in shape are paired by leaf without the
   shape check, so the caller reports them as shape mismatches rather than missing.
5. With ``order=True``, likewise the layers nothing paired on either side when they are as many
   on both sides (one each, or in an order that is known) and each pair in order has as many
   variables, pairable by leaf or creation order: a head of 5 units where the source has 4 is a
   shape mismatch by ``layer-order``, not a missing weight and an unused source variable.

Shapes fit when they are equal, or through the :class:`~ckptinspect.ops.match.layouts.Layout` rules
the caller names (a transposed dense kernel, OIHW conv kernels, a reshape). Pairs report how
they were made: ``name`` (equal names), ``prefix`` (an outer prefix dropped), ``positional``
(Keras 3 ``vars/N`` by creation order), ``normalized-name`` (numbering offset, doubled
components, leaf spellings) or ``layer-order`` (layer order and shape). Pure functions of the
records: no TensorFlow, no numpy.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Callable, Iterable, Mapping, Sequence

from .layouts import PLAIN, Layout, fit
from .stages import (
    HOW_NAME,
    HOW_POSITIONAL,
    HOW_PREFIX,
    KERAS_VARIABLE_ORDER,
    Ambiguity,
    Context,
    Item,
    Pair,
    Stage,
    StageResult,
    _components,
    _examples,
)

__all__ = [
    "HOW_NORMALIZED",
    "HOW_LAYER_ORDER",
    "LEAF_CLASSES",
    "split_name",
    "split_number",
    "leaf_class",
    "layer_stage",
]

HOW_NORMALIZED = "normalized-name"
HOW_LAYER_ORDER = "layer-order"

# Leaf spellings of other frameworks, each mapped to the Keras leaves it may stand for.
LEAF_CLASSES: Mapping[str, frozenset[str]] = {
    "kernel": frozenset({"kernel"}),
    "weights": frozenset({"kernel"}),
    "w": frozenset({"kernel"}),
    "weight": frozenset({"kernel", "gamma", "embeddings"}),
    "bias": frozenset({"bias", "beta"}),
    "biases": frozenset({"bias"}),
    "b": frozenset({"bias"}),
    "gamma": frozenset({"gamma"}),
    "scale": frozenset({"gamma"}),
    "beta": frozenset({"beta"}),
    "offset": frozenset({"beta"}),
    "moving_mean": frozenset({"moving_mean"}),
    "running_mean": frozenset({"moving_mean"}),
    "moving_variance": frozenset({"moving_variance"}),
    "running_var": frozenset({"moving_variance"}),
    "embeddings": frozenset({"embeddings"}),
    "embedding": frozenset({"embeddings"}),
    "depthwise_kernel": frozenset({"depthwise_kernel"}),
    "depthwise_weights": frozenset({"depthwise_kernel"}),
    "pointwise_kernel": frozenset({"pointwise_kernel"}),
    "pointwise_weights": frozenset({"pointwise_kernel"}),
    "recurrent_kernel": frozenset({"recurrent_kernel"}),
}
POSITIONAL_LEAF = "vars/"
TORCH_SEPARATOR = "."  # PyTorch module paths (state_dict keys) separate their components with dots
NUMBERED_RE = re.compile(r"^(?P<base>.+?)_(?P<n>\d+)$")
# Groups with more layers than this on both sides try only "equal numbers" and "same rank"
# alignments and the offsets of the first layers (every offset would be quadratic).
MAX_OFFSET_PAIRS = 4096
UNKNOWN_RANK = len(KERAS_VARIABLE_ORDER)

# Kinds of evidence, from the strongest.
_LAYER_NAME, _LAYER_PREFIX, _LAYER_NUMBERED, _LAYER_ORDER = "name", "prefix", "numbered", "order"
_LEAF_EXACT, _LEAF_SYNONYM, _LEAF_POSITION = "leaf", "synonym", "position"

Fits = Callable[[Item, Item], bool]


# -- names -----------------------------------------------------------------------------------------
def split_name(name: str) -> tuple[tuple[str, ...], str]:
    """``a/b/kernel`` -> ``(("a", "b"), "kernel")``; ``a/vars/0`` -> ``(("a",), "vars/0")``;
    consecutive equal components count once (``dense_1/dense_1/kernel``). PyTorch's dotted
    names split at the dots too: ``model_state_dict/fc1.weight`` -> ``(("model_state_dict",
    "fc1"), "weight")``."""
    parts = [p for c in name.split("/") for p in c.split(TORCH_SEPARATOR) if p]
    if len(parts) >= 2 and parts[-2] == "vars" and parts[-1].isdigit():
        leaf, layer = POSITIONAL_LEAF + parts[-1], parts[:-2]
    else:
        leaf, layer = (parts[-1] if parts else ""), parts[:-1]
    path: list[str] = []
    for p in layer:
        if not path or path[-1] != p:
            path.append(p)
    return tuple(path), leaf


def split_number(component: str) -> tuple[str, int]:
    """Keras auto-numbering: ``dense_3`` -> ``("dense", 3)``, ``dense`` -> ``("dense", 0)``."""
    found = NUMBERED_RE.match(component)
    return (found.group("base"), int(found.group("n"))) if found else (component, 0)


def leaf_class(leaf: str) -> frozenset[str]:
    """The Keras leaves a leaf name may stand for (itself, when it is not a known spelling)."""
    return LEAF_CLASSES.get(leaf.lower(), frozenset({leaf}))


def _leaf_rank(leaf: str) -> int:
    ranks = [KERAS_VARIABLE_ORDER.index(c) for c in leaf_class(leaf) if c in KERAS_VARIABLE_ORDER]
    return min(ranks) if ranks else UNKNOWN_RANK


# -- layers ----------------------------------------------------------------------------------------
@dataclasses.dataclass(eq=False)
class _Layer:
    side: int
    path: tuple[str, ...]
    base: tuple[str, ...]
    numbers: tuple[int, ...]
    items: list[Item]
    leaves: dict[int, tuple[str, ...]]  # item index -> its leaf names (primary first)
    rel: tuple[int, ...] = ()  # the numbers of the part of the path both sides have (set per group)

    @property
    def first(self) -> int:
        return self.items[0].index

    def label(self) -> str:
        return "/".join(self.path) or "(top level)"


def _layers(side: int, items: Sequence[Item], names: Mapping[int, tuple[str, ...]]) -> list[_Layer]:
    by_path: dict[tuple[str, ...], _Layer] = {}
    for x in sorted(items, key=lambda i: i.index):
        all_names = names[x.index]
        path, leaf = split_name(all_names[0])
        leaves = [leaf]
        for other in all_names[1:]:
            opath, oleaf = split_name(other)
            if oleaf not in leaves and opath[len(opath) - len(path):] == path:
                leaves.append(oleaf)
        layer = by_path.get(path)
        if layer is None:
            split = [split_number(c) for c in path]
            layer = by_path[path] = _Layer(side, path, tuple(b for b, _ in split), tuple(n for _, n in split), [], {})
        layer.items.append(x)
        layer.leaves[x.index] = tuple(leaves)
    return list(by_path.values())


# -- variables within a pair of layers -------------------------------------------------------------
@dataclasses.dataclass
class _Within:
    """The variable pairs of two layers: ``(a item, b item, leaf evidence)``."""

    pairs: list[tuple[Item, Item, str]]
    ambiguous: bool  # variables left that could have been paired in more than one way

    @property
    def count(self) -> int:
        return len(self.pairs)


def _sort_key(layer: _Layer, x: Item) -> tuple[int, int]:
    leaf = layer.leaves[x.index][0]
    if leaf.startswith(POSITIONAL_LEAF):
        return (int(leaf[len(POSITIONAL_LEAF):]), x.index)
    return (_leaf_rank(leaf), x.index)


def _pair_within(la: _Layer, lb: _Layer, fits: Fits | None, order_known: bool) -> _Within:
    """Pair the variables of two layers: equal leaves, then leaf spellings, then creation order.

    With ``fits`` None, shapes are not checked (misfit pairs for reporting).
    """
    ok = fits or (lambda x, y: True)
    free_a, free_b = list(la.items), list(lb.items)
    pairs: list[tuple[Item, Item, str]] = []

    def unique_mutual(test: Callable[[Item, Item], bool], kind: str) -> None:
        cands = {x.index: [y for y in free_b if test(x, y) and ok(x, y)] for x in free_a}
        wanted = collections.Counter(y.index for ys in cands.values() for y in ys)
        done = []
        for x in free_a:
            ys = cands[x.index]
            if len(ys) == 1 and wanted[ys[0].index] == 1:
                done.append((x, ys[0]))
        for x, y in done:
            pairs.append((x, y, kind))
            free_a.remove(x)
            free_b.remove(y)

    unique_mutual(lambda x, y: la.leaves[x.index][0] in lb.leaves[y.index], _LEAF_EXACT)
    if free_a and free_b:
        unique_mutual(
            lambda x, y: any(leaf_class(la.leaves[x.index][0]) & leaf_class(leaf) for leaf in lb.leaves[y.index]),
            _LEAF_SYNONYM,
        )
    if not free_a or not free_b:
        return _Within(pairs, False)
    # Creation order: Keras positions (vars/N), known leaves (kernel before bias...), then the
    # side's order where it is known.
    xs = sorted(free_a, key=lambda x: _sort_key(la, x))
    ys = sorted(free_b, key=lambda y: _sort_key(lb, y))
    reliable = order_known or all(_sort_key(la, x)[0] != UNKNOWN_RANK for x in xs)
    if len(xs) == len(ys) and all(ok(x, y) for x, y in zip(xs, ys)):
        distinct = len({x.shape for x in xs}) == len(xs)
        if reliable or distinct:
            pairs += [(x, y, _LEAF_POSITION) for x, y in zip(xs, ys)]
            return _Within(pairs, False)
    if fits is None:
        return _Within(pairs, False)
    # Shapes that only one variable of each side has.
    unique_mutual(lambda x, y: True, _LEAF_POSITION)
    return _Within(pairs, any(ok(x, y) for x in free_a for y in free_b))


# -- the stage -------------------------------------------------------------------------------------
def _strip_layer_prefixes(ua: set[tuple[str, ...]], ub: set[tuple[str, ...]]) -> tuple[list[tuple[tuple[str, ...], tuple[str, ...]]], list[tuple[int, tuple[str, ...], int]]]:
    """Base paths of A and B equal once an outer prefix one side has is dropped, most voted first.

    Returns:
        ``(base of A, base of B)`` pairs, and ``(side, prefix, count)`` for each prefix used.
    """
    pairs = []
    used = []
    ua, ub = set(ua), set(ub)
    while ua and ub:
        votes: collections.Counter[tuple[int, tuple[str, ...]]] = collections.Counter()
        for side, mine, other in ((0, ua, ub), (1, ub, ua)):
            for base in mine:
                for k in range(1, len(base)):
                    if base[k:] in other:
                        votes[(side, base[:k])] += 1
        if not votes:
            break
        (side, prefix), _ = min(votes.items(), key=lambda kv: (-kv[1], kv[0][0], kv[0][1]))
        mine, other = (ua, ub) if side == 0 else (ub, ua)
        count = 0
        for base in sorted(mine):
            if base[: len(prefix)] == prefix and base[len(prefix):] in other:
                short = base[len(prefix):]
                pairs.append((base, short) if side == 0 else (short, base))
                mine.discard(base)
                other.discard(short)
                count += 1
        used.append((side, prefix, count))
    return pairs, used


@dataclasses.dataclass
class _Plan:
    """What the stage decided, before it becomes pairs."""

    layer_pairs: list[tuple[_Layer, _Layer, str]] = dataclasses.field(default_factory=list)
    ambiguous: list[Ambiguity] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    offsets: collections.Counter = dataclasses.field(default_factory=collections.Counter)


class _Scorer:
    """Within-layer pairings, cached (an alignment is scored by many of them)."""

    def __init__(self, fits: Fits, order_known: bool):
        self.fits = fits
        self.order_known = order_known
        self.cache: dict[tuple[int, int], _Within] = {}

    def __call__(self, la: _Layer, lb: _Layer) -> _Within:
        key = (id(la), id(lb))
        got = self.cache.get(key)
        if got is None:
            got = self.cache[key] = _pair_within(la, lb, self.fits, self.order_known)
        return got


def _alignments(ga: list[_Layer], gb: list[_Layer]) -> list[tuple[str, list[tuple[_Layer, _Layer]]]]:
    """Candidate alignments of two groups of layers: equal numbers, same rank, constant offsets."""
    out: list[tuple[str, list[tuple[_Layer, _Layer]]]] = []
    by_number_b = {lb.rel: lb for lb in gb}
    out.append(("equal numbers", [(la, by_number_b[la.rel]) for la in ga if la.rel in by_number_b]))
    out.append(("same rank", list(zip(ga, gb))))
    if len(ga) * len(gb) <= MAX_OFFSET_PAIRS:
        shifts = {_shift(la, lb) for la in ga for lb in gb}
    else:
        shifts = {_shift(ga[0], lb) for lb in gb[:8]}
    for d in sorted(shifts):
        if not any(d):
            continue
        pairs = []
        for la in ga:
            lb = by_number_b.get(tuple(n - s for n, s in zip(la.rel, d)))
            if lb is not None:
                pairs.append((la, lb))
        out.append((f"offset {','.join(map(str, d))}", pairs))
    return out


def _shift(la: _Layer, lb: _Layer) -> tuple[int, ...]:
    return tuple(p - q for p, q in zip(la.rel, lb.rel))


def _offset_of(pairs: Iterable[tuple[_Layer, _Layer]]) -> tuple[int, ...] | None:
    found = {_shift(la, lb) for la, lb in pairs}
    return next(iter(found)) if len(found) == 1 else None


def _align_groups(
    groups: list[tuple[list[_Layer], list[_Layer], str]], score: _Scorer, ctx: Context, plan: _Plan
) -> None:
    """Choose each group's alignment (see the module docstring, step 2)."""
    undecided = []
    for ga, gb, kind in groups:
        if len(ga) == 1 and len(gb) == 1:
            plan.layer_pairs.append((ga[0], gb[0], _numbered(ga[0], gb[0], kind)))
            continue
        scored = []
        for label, pairs in _alignments(ga, gb):
            quality = sum(score(la, lb).count for la, lb in pairs)
            positive = frozenset((id(la), id(lb)) for la, lb in pairs if score(la, lb).count)
            scored.append((quality, label, pairs, positive))
        best = max(q for q, *_ in scored)
        if best == 0:
            exact = scored[0][2] or scored[1][2]
            plan.layer_pairs += [(la, lb, kind) for la, lb in exact]
            continue
        winners = [s for s in scored if s[0] == best]
        distinct = {s[3] for s in winners}
        if len(distinct) == 1:
            chosen = winners[0][2]
            if len([s for s in scored if s[0] > 0]) > 1 or len(ga) > 1 and len(gb) > 1:
                offset = _offset_of((la, lb) for la, lb in chosen if score(la, lb).count)
                if offset is not None:
                    plan.offsets[offset] += 1
            plan.layer_pairs += [(la, lb, _numbered(la, lb, kind)) for la, lb in chosen]
        else:
            undecided.append((ga, gb, kind, winners))
    consensus = next(iter(plan.offsets)) if len(plan.offsets) == 1 else None
    for ga, gb, kind, winners in undecided:
        agreeing = [w for w in winners if _offset_of((la, lb) for la, lb in w[2] if score(la, lb).count) == consensus]
        if consensus is not None and len({w[3] for w in agreeing}) == 1:
            plan.layer_pairs += [(la, lb, _numbered(la, lb, kind)) for la, lb in agreeing[0][2]]
            plan.notes.append(
                f"layers {_examples([la.label() for la in ga])} of {ctx.label_a} fit the layers of {ctx.label_b} in "
                f"more than one way; the numbering offset of the rest of the model decided it"
            )
            continue
        # Pair what every best alignment agrees on; the rest is ambiguous.
        common = frozenset.intersection(*(w[3] for w in winners))
        agreed = [(la, lb) for la, lb in winners[0][2] if (id(la), id(lb)) in common]
        plan.layer_pairs += [(la, lb, _numbered(la, lb, kind)) for la, lb in agreed]
        taken = {id(layer) for pair in agreed for layer in pair}
        xs = tuple(x for la in ga if id(la) not in taken for x in la.items)
        ys = tuple(y for lb in gb if id(lb) not in taken for y in lb.items)
        labels = " / ".join(f"{w[1]}" for w in winners)
        reason = (
            f"layers {_examples([la.label() for la in ga if id(la) not in taken])} of {ctx.label_a} and "
            f"{_examples([lb.label() for lb in gb if id(lb) not in taken])} of {ctx.label_b} pair equally well in more "
            f"than one way ({labels}); left unpaired rather than guessed"
        )
        plan.ambiguous.append(Ambiguity(HOW_NORMALIZED, reason, xs, ys))


def _numbered(la: _Layer, lb: _Layer, kind: str) -> str:
    return kind if la.rel == lb.rel else _LAYER_NUMBERED


def _signature(layer: _Layer, layout: Layout) -> tuple:
    """A necessary condition for two layers to pair completely (equal under every layout rule)."""
    if layout.allow_reshape:
        return tuple(sorted(_numel(x.shape) for x in layer.items))
    if not layout.plain:
        return tuple(sorted(tuple(sorted(x.shape)) for x in layer.items))
    return tuple(sorted(x.shape for x in layer.items))


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _order_tier(
    free_a: list[_Layer], free_b: list[_Layer], score: _Scorer, order_known: bool, layout: Layout, ctx: Context, plan: _Plan
) -> None:
    """Pair whole layers by shape signature and topological order (step 3)."""
    buckets: dict[tuple, tuple[list[_Layer], list[_Layer]]] = collections.defaultdict(lambda: ([], []))
    for layer in free_a:
        buckets[_signature(layer, layout)][0].append(layer)
    for layer in free_b:
        buckets[_signature(layer, layout)][1].append(layer)
    paired = 0
    for la_list, lb_list in buckets.values():
        if not la_list or not lb_list:
            continue
        if len(la_list) == len(lb_list) > 1 and _in_order_fast(la_list, lb_list, score, order_known, plan):
            paired += len(la_list)
            continue
        edges = []
        for i, la in enumerate(la_list):
            for j, lb in enumerate(lb_list):
                w = score(la, lb)
                if w.count == len(la.items) == len(lb.items) and not w.ambiguous:
                    edges.append((i, j))
        for ia, ib in _components(edges):
            ca = sorted((la_list[i] for i in ia), key=lambda layer: layer.first)
            cb = sorted((lb_list[j] for j in ib), key=lambda layer: layer.first)
            if len(ca) == len(cb) == 1:
                plan.layer_pairs.append((ca[0], cb[0], _LAYER_ORDER))
                paired += 1
                continue
            one_base = len({layer.base for layer in ca}) == 1 and len({layer.numbers for layer in ca}) == len(ca)
            if one_base and not order_known:
                ca = sorted(ca, key=lambda layer: layer.numbers)
            edge_set = set(edges)
            pos_a = {id(layer): i for i, layer in enumerate(la_list)}
            pos_b = {id(layer): j for j, layer in enumerate(lb_list)}
            in_order = len(ca) == len(cb) and all((pos_a[id(x)], pos_b[id(y)]) in edge_set for x, y in zip(ca, cb))
            if in_order and (order_known or one_base):
                plan.layer_pairs += [(x, y, _LAYER_ORDER) for x, y in zip(ca, cb)]
                paired += len(ca)
                continue
            why = f"the order of {ctx.label_a}'s layers is not known" if in_order else "no order fits both sides"
            reason = (
                f"{len(ca)} layer(s) of {ctx.label_a} ({_examples([x.label() for x in ca])}) and {len(cb)} of "
                f"{ctx.label_b} ({_examples([y.label() for y in cb])}) have the same shapes and no names to tell them "
                f"apart ({why}); left unpaired rather than guessed"
            )
            plan.ambiguous.append(
                Ambiguity(HOW_LAYER_ORDER, reason, tuple(x for layer in ca for x in layer.items),
                          tuple(y for layer in cb for y in layer.items))
            )
    if paired:
        plan.notes.append(f"paired {paired} layer(s) whose names differ by layer order and shape")


def _in_order_fast(la_list: list[_Layer], lb_list: list[_Layer], score: _Scorer, order_known: bool, plan: _Plan) -> bool:
    """Pair a bucket of as many layers on each side in order when every in-order pair is complete
    and the order may be used: the per-component answer, without scoring every pair of layers
    (each in-order pair is an edge, so every component holds whole in-order pairs)."""
    one_base = len({layer.base for layer in la_list}) == 1 and len({layer.numbers for layer in la_list}) == len(la_list)
    if not (order_known or one_base):
        return False
    ca = sorted(la_list, key=lambda layer: layer.first if order_known else layer.numbers)
    cb = sorted(lb_list, key=lambda layer: layer.first)
    for x, y in zip(ca, cb):
        w = score(x, y)
        if not (w.count == len(x.items) == len(y.items) and not w.ambiguous):
            return False
    plan.layer_pairs += [(x, y, _LAYER_ORDER) for x, y in zip(ca, cb)]
    return True


def _how(x: Item, y: Item, layer_kind: str, leaf_kind: str, ctx: Context) -> str:
    if set(ctx.names_a[x.index]) & set(ctx.names_b[y.index]):
        return HOW_NAME
    if layer_kind == _LAYER_ORDER:
        return HOW_LAYER_ORDER
    if leaf_kind == _LEAF_POSITION:
        return HOW_POSITIONAL if layer_kind in (_LAYER_NAME, _LAYER_PREFIX) else HOW_NORMALIZED
    if leaf_kind == _LEAF_EXACT and layer_kind == _LAYER_PREFIX:
        return HOW_PREFIX
    return HOW_NORMALIZED


def layer_stage(layout: Layout = PLAIN, *, order: bool = False, order_known: bool = True) -> Stage:
    """The ``layers`` stage (see the module docstring).

    Args:
        layout: The layout rules shapes are compared through.
        order: Also pair layers nothing else paired by layer order and shape (step 3).
        order_known: A's order (its items' ``index``) is topological: several layers of one
            shape signature may be paired in order. B's order always is (a model's variables).

    Returns:
        The stage; its pairs' ``how`` is one of ``name``, ``prefix``, ``positional``,
        ``normalized-name``, ``layer-order``.
    """

    def run(a: Sequence[Item], b: Sequence[Item], ctx: Context) -> StageResult:
        layers_a = _layers(0, a, ctx.names_a)
        layers_b = _layers(1, b, ctx.names_b)
        score = _Scorer(_leaf_fits(layers_b, layout), order_known)
        plan = _Plan()
        _align_by_base(layers_a, layers_b, score, ctx, plan)
        taken = _Taken(ctx)
        taken.add_layers(plan.layer_pairs, score)
        aligned = list(plan.layer_pairs)
        if order:
            _pair_by_order(layers_a, layers_b, taken, score, layout, ctx, plan)
        misfits = _pair_misfits(aligned, taken, score)
        if misfits:
            plan.notes.append(f"{misfits} variable(s) paired by name have shapes that do not fit")
        order_misfits = _pair_order_misfits(layers_a, layers_b, taken, score, plan) if order else 0
        if order_misfits:
            plan.notes.append(f"{order_misfits} variable(s) paired by layer order have shapes that do not fit")
        for amb in plan.ambiguous:
            plan.notes.append(amb.reason)
        return StageResult(pairs=tuple(taken.pairs), ambiguous=tuple(plan.ambiguous), notes=tuple(plan.notes))

    return Stage(HOW_LAYER_ORDER if order else HOW_NORMALIZED, run, uses_names=True)


def _leaf_fits(layers_b: list[_Layer], layout: Layout) -> Fits:
    """Whether A's variable ``x`` fits B's ``y`` in shape, through the layout rule of
    ``y``'s leaf kind (a kernel, a bias...)."""
    leaf_of = {}
    for layer in layers_b:
        for y in layer.items:
            leaf_of[y.index] = layer.leaves[y.index][0]

    def fits(x: Item, y: Item) -> bool:
        return fit(x.shape, y.shape, leaf_of[y.index], layout) is not None

    return fits


def _align_by_base(layers_a: list[_Layer], layers_b: list[_Layer], score: _Scorer, ctx: Context, plan: _Plan) -> None:
    """Step 2: group each side's layers by base path, pair the groups by equal bases or
    bases equal once a prefix only one side has is dropped (noted), number each layer
    relative to its group, and align each pair of groups into ``plan``; note the layers
    paired across Keras auto-numbering."""
    groups_a: dict[tuple[str, ...], list[_Layer]] = collections.defaultdict(list)
    groups_b: dict[tuple[str, ...], list[_Layer]] = collections.defaultdict(list)
    for layer in layers_a:
        groups_a[layer.base].append(layer)
    for layer in layers_b:
        groups_b[layer.base].append(layer)
    for g in (*groups_a.values(), *groups_b.values()):
        g.sort(key=lambda layer: (layer.numbers, layer.first))
    base_pairs = [(base, base, _LAYER_NAME) for base in groups_a if base in groups_b]
    stripped, prefixes = _strip_layer_prefixes(set(groups_a) - set(groups_b), set(groups_b) - set(groups_a))
    base_pairs += [(ba, bb, _LAYER_PREFIX) for ba, bb in stripped]
    for ba, bb, _ in base_pairs:
        k = min(len(ba), len(bb))
        for layer in (*groups_a[ba], *groups_b[bb]):
            layer.rel = layer.numbers[len(layer.numbers) - k:] if k else ()
    for side, prefix, count in prefixes:
        label = ctx.label_a if side == 0 else ctx.label_b
        plan.notes.append(f"dropped the prefix '{'/'.join(prefix)}/' from {count} layer name(s) of {label} to align them")
    _align_groups([(groups_a[ba], groups_b[bb], kind) for ba, bb, kind in base_pairs], score, ctx, plan)
    renumbered = [(la, lb) for la, lb, kind in plan.layer_pairs if kind == _LAYER_NUMBERED and score(la, lb).count]
    if renumbered:
        shown = [f"{la.label()} -> {lb.label()}" for la, lb in renumbered]
        plan.notes.append(
            f"{len(renumbered)} layer(s) paired across Keras auto-numbering ({_examples(shown)})"
        )


class _Taken:
    """The variable pairs made so far, and which variables of each side they took.

    Attributes:
        pairs: The pairs, in the order made.
        a: A's taken items, by index: (B's item, layer kind, leaf kind).
        b: B's taken items' indexes.
    """

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.pairs: list[Pair] = []
        self.a: dict[int, tuple[Item, str, str]] = {}
        self.b: set[int] = set()

    def add(self, x: Item, y: Item, layer_kind: str, leaf_kind: str) -> None:
        self.pairs.append(Pair(x, y, _how(x, y, layer_kind, leaf_kind, self.ctx), self.ctx.name_a(x)))
        self.a[x.index] = (y, layer_kind, leaf_kind)
        self.b.add(y.index)

    def add_layers(self, layer_pairs: Sequence[tuple[_Layer, _Layer, str]], score: _Scorer) -> None:
        """The fitting pairs within each pair of layers."""
        for la, lb, kind in layer_pairs:
            for x, y, leaf_kind in score(la, lb).pairs:
                self.add(x, y, kind, leaf_kind)


def _pair_by_order(layers_a: list[_Layer], layers_b: list[_Layer], taken: _Taken, score: _Scorer, layout: Layout,
                   ctx: Context, plan: _Plan) -> None:
    """Step 3: the layers of which nothing was paired or found ambiguous, paired by layer
    order and shape, and their fitting pairs taken."""
    ambiguous_ids = {x.index for amb in plan.ambiguous for x in amb.a} | {y.index for amb in plan.ambiguous for y in amb.b}
    untouched_a = [la for la in layers_a if not any(x.index in taken.a or x.index in ambiguous_ids for x in la.items)]
    untouched_b = [lb for lb in layers_b if not any(y.index in taken.b or y.index in ambiguous_ids for y in lb.items)]
    before = len(plan.layer_pairs)
    _order_tier(untouched_a, untouched_b, score, score.order_known, layout, ctx, plan)
    taken.add_layers(plan.layer_pairs[before:], score)


def _pair_misfits(aligned: list[tuple[_Layer, _Layer, str]], taken: _Taken, score: _Scorer) -> int:
    """Step 4: in layers aligned by name, the variables left on both sides paired by name even
    though their shapes do not fit (the report says what differs). Returns how many."""
    misfits = 0
    for la, lb, kind in aligned:
        rest_a = [x for x in la.items if x.index not in taken.a]
        rest_b = [y for y in lb.items if y.index not in taken.b]
        if not rest_a or not rest_b:
            continue
        sub_a = _Layer(0, la.path, la.base, la.numbers, rest_a, la.leaves)
        sub_b = _Layer(1, lb.path, lb.base, lb.numbers, rest_b, lb.leaves)
        for x, y, leaf_kind in _pair_within(sub_a, sub_b, None, score.order_known).pairs:
            if not score.fits(x, y):
                taken.add(x, y, kind, leaf_kind)
                misfits += 1
    return misfits


def _pair_order_misfits(layers_a: list[_Layer], layers_b: list[_Layer], taken: _Taken, score: _Scorer,
                        plan: _Plan) -> int:
    """Step 5: the layers nothing paired on either side (and no ambiguity names), paired in
    order without the shape check when both sides have as many (one each, or in a known order)
    and each pair's variables pair completely by leaf or creation order; those pairs are taken
    (the caller reports the shapes that differ). All or nothing. Returns how many were taken."""
    in_ambiguity = {x.index for amb in plan.ambiguous for x in amb.a} | {y.index for amb in plan.ambiguous for y in amb.b}
    free_a = [la for la in layers_a if not any(x.index in taken.a or x.index in in_ambiguity for x in la.items)]
    free_b = [lb for lb in layers_b if not any(y.index in taken.b or y.index in in_ambiguity for y in lb.items)]
    if not free_a or len(free_a) != len(free_b) or (len(free_a) > 1 and not score.order_known):
        return 0
    chosen = []
    for la, lb in zip(sorted(free_a, key=lambda layer: layer.first), sorted(free_b, key=lambda layer: layer.first)):
        within = _pair_within(la, lb, None, score.order_known)
        if not (within.count == len(la.items) == len(lb.items)):
            return 0
        chosen += within.pairs
    for x, y, leaf_kind in chosen:
        taken.add(x, y, _LAYER_ORDER, leaf_kind)
    return sum(1 for x, y, _ in chosen if not score.fits(x, y))
