"""The matcher's records and stages (:mod:`ckptinspect.ops.match.matcher` runs them).

Each stage is a pure function ``(unpaired items of A, unpaired items of B, Context) ->
StageResult``; the module docstring of :mod:`ckptinspect.ops.match.matcher` describes what each one
pairs, in the order they run.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from ... import model as m

__all__ = [
    "HOW_KEY",
    "HOW_GRAPH_PATH",
    "HOW_NAME",
    "HOW_PREFIX",
    "HOW_POSITIONAL",
    "HOW_OPTIMIZER_POSITIONAL",
    "HOW_MAPPING",
    "HOW_ORDER",
    "HOWS",
    "Item",
    "Pair",
    "Ambiguity",
    "StageResult",
    "Context",
    "Stage",
    "KEY",
    "GRAPH_PATH",
    "NAME",
    "PREFIX",
    "POSITIONAL",
    "OPTIMIZER_POSITIONAL",
    "ORDER",
    "NAME_STAGES",
    "graph_path_stage",
]

HOW_KEY = "key"
HOW_GRAPH_PATH = "graph-path"
HOW_NAME = "name"
HOW_PREFIX = "prefix"
HOW_POSITIONAL = "positional"
HOW_OPTIMIZER_POSITIONAL = "optimizer-positional"
HOW_MAPPING = "mapping"
HOW_ORDER = "order"
HOWS = (HOW_KEY, HOW_GRAPH_PATH, HOW_NAME, HOW_PREFIX, HOW_POSITIONAL, HOW_OPTIMIZER_POSITIONAL, HOW_MAPPING, HOW_ORDER)

DEFAULT_LABELS = ("A", "B")
TOP_LEVEL = "(top level)"
MAX_EXAMPLES = 3

# Keras 3 positional names.
POSITIONAL_RE = re.compile(r"^(?:(?P<layer>.*)/)?vars/(?P<index>\d+)$")
# Keras 3 optimizer variables: ``optimizer/vars/N`` in .weights.h5 / .keras files, and in a
# tf.train.Checkpoint the keys ``<opt>/_variables/N/...`` (``_iterations`` and
# ``_learning_rate`` are variables 0 and 1, keyed by the attribute that reaches them first).
KERAS_OPTIMIZER_POSITIONAL_RE = re.compile(r"^(?:.*/)?optimizer/vars/(?P<index>\d+)$")
TF_OPTIMIZER_VARIABLE_RE = re.compile(
    r"^(?P<opt>(?:.*/)?[^/]+)/(?:_variables/(?P<index>\d+)|(?P<attr>_iterations|_learning_rate))/\.ATTRIBUTES/VARIABLE_VALUE$"
)
TF_OPTIMIZER_ATTR_INDEX = {"_iterations": 0, "_learning_rate": 1}
# A legacy Keras ``.h5`` full model's optimizer: ``optimizer_weights/<opt>/<name>``, stored in the
# order of its ``weight_names`` attribute, which is the optimizer's variable order (Keras 3:
# ``iteration``, ``learning_rate``, then each trainable variable's slots; ``optimizer/vars/N``).
KERAS_H5_OPTIMIZER_RE = re.compile(r"^optimizer_weights/(?P<opt>[^/]+)/[^/]+$")
# Creation order of the variables of common Keras layers, for matching positional vars/N names.
KERAS_VARIABLE_ORDER = (
    "embeddings",
    "kernel",
    "depthwise_kernel",
    "pointwise_kernel",
    "recurrent_kernel",
    "bias",
    "gamma",
    "beta",
    "moving_mean",
    "moving_variance",
)


# -- records -------------------------------------------------------------------------------------
class Item(NamedTuple):
    """One variable of a side, as the matcher sees it (a named tuple: sides run to many
    thousands of variables, and tuples are cheap to make).

    Attributes:
        key: Its key on its side (unique there).
        name: Its readable name.
        shape: Its shape.
        dtype: Its dtype name.
        role: ``model``, ``optimizer`` or ``metadata``.
        graph_path: Its object-graph path, or None.
        index: Its position on its side (unique there): the order the ``order`` stage follows.
        aliases: Other names it answers to in the name stage (a model variable's TF name, its
            Keras 3 positional name...).
        ref: The object it stands for (a :class:`~ckptinspect.Variable`, a model variable...).
    """

    key: str
    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str = m.ROLE_MODEL
    graph_path: str | None = None
    index: int = 0
    aliases: tuple[str, ...] = ()
    ref: Any = None


class Pair(NamedTuple):
    """Two paired items, how they were paired, and the name to show for the pair."""

    a: Item
    b: Item
    how: str
    name: str


@dataclasses.dataclass(frozen=True)
class Ambiguity:
    """Items a stage could have paired in more than one way, and left unpaired.

    Attributes:
        stage: The ``how`` of the stage.
        reason: One sentence.
        a: The items of A involved.
        b: The items of B involved.
    """

    stage: str
    reason: str
    a: tuple[Item, ...] = ()
    b: tuple[Item, ...] = ()


@dataclasses.dataclass(frozen=True)
class StageResult:
    """What one stage did: its pairs, its ambiguities and its notes (one sentence each)."""

    pairs: tuple[Pair, ...] = ()
    ambiguous: tuple[Ambiguity, ...] = ()
    notes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Context:
    """What the stages know besides the unpaired items.

    Attributes:
        names_a: ``item.index`` -> the names of an item of A, normalised and rewritten by the
            ``--map`` rules, primary name first (filled for every unpaired item before a stage
            that ``needs_names`` runs).
        names_b: The same for B (never rewritten).
        label_a: How notes call side A (``A``, ``the source``...).
        label_b: How notes call side B.
    """

    names_a: Mapping[int, tuple[str, ...]]
    names_b: Mapping[int, tuple[str, ...]]
    label_a: str = DEFAULT_LABELS[0]
    label_b: str = DEFAULT_LABELS[1]

    def name_a(self, item: Item) -> str:
        return self.names_a[item.index][0]

    def name_b(self, item: Item) -> str:
        return self.names_b[item.index][0]


@dataclasses.dataclass(frozen=True)
class Stage:
    """One matching stage: ``run(free_a, free_b, context) -> StageResult``.

    Attributes:
        how: What its pairs report.
        run: The function.
        uses_names: Whether it pairs by the (rewritable) names: its pairs of a renamed item of
            A report ``mapping``.
        needs_names: Whether it reads the context's names (the driver prepares them first).
    """

    how: str
    run: Callable[[Sequence[Item], Sequence[Item], Context], StageResult]
    uses_names: bool = False
    needs_names: bool = True

    def __call__(self, a: Sequence[Item], b: Sequence[Item], context: Context) -> StageResult:
        return self.run(a, b, context)


# -- helpers -------------------------------------------------------------------------------------
def _examples(names: Sequence[str]) -> str:
    shown = ", ".join(names[:MAX_EXAMPLES])
    return shown + (", ..." if len(names) > MAX_EXAMPLES else "")


def _unique_primary(side: Sequence[Item], names: Mapping[int, tuple[str, ...]]) -> dict[str, Item]:
    """Primary name -> item, for the names exactly one item of the side has (in side order)."""
    counts = collections.Counter(names[x.index][0] for x in side)
    return {names[x.index][0]: x for x in side if counts[names[x.index][0]] == 1}


def _components(edges: Sequence[tuple[int, int]]) -> list[tuple[list[int], list[int]]]:
    """Connected components of a bipartite graph given as (a index, b index) edges."""
    parent: dict[tuple[str, int], tuple[str, int]] = {}

    def find(x: tuple[str, int]) -> tuple[str, int]:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, j in edges:
        parent[find(("a", i))] = find(("b", j))
    groups: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
    for i, j in edges:
        ga, gb = groups.setdefault(find(("a", i)), ([], []))
        if i not in ga:
            ga.append(i)
        if j not in gb:
            gb.append(j)
    return list(groups.values())


# -- 1. keys -------------------------------------------------------------------------------------
def _by_key(a: Sequence[Item], b: Sequence[Item], ctx: Context) -> StageResult:
    count_a = collections.Counter(x.key for x in a)
    kb: dict[str, list[Item]] = collections.defaultdict(list)
    for y in b:
        kb[y.key].append(y)
    pairs = tuple(
        Pair(x, kb[x.key][0], HOW_KEY, x.name) for x in a if count_a[x.key] == 1 and len(kb.get(x.key, ())) == 1
    )
    return StageResult(pairs=pairs)


KEY = Stage(HOW_KEY, _by_key, needs_names=False)


# -- 2. object-graph paths -----------------------------------------------------------------------
def graph_path_stage(complete: bool = True) -> Stage:
    """The ``graph-path`` stage.

    A's object-graph paths may carry a prefix (the node B's structure was saved under, such as
    ``model`` in ``tf.train.Checkpoint(model=model)``): the prefix most of A's paths need to
    end in one of B's is used; two prefixes with as many votes are an ambiguity.

    Args:
        complete: All or nothing: pair only when every path of B is found below the prefix and
            nothing else is there (a different architecture is left to the name stages).
            Otherwise pair what is found.

    Returns:
        The stage.
    """

    def run(a: Sequence[Item], b: Sequence[Item], ctx: Context) -> StageResult:
        targets = {y.graph_path: y for y in b if y.graph_path}
        sources = [x for x in a if x.graph_path]
        if not targets or not sources:
            return StageResult()
        votes: collections.Counter[str] = collections.Counter()
        for x in sources:
            parts = x.graph_path.split("/")
            for i in range(len(parts)):
                if "/".join(parts[i:]) in targets:
                    votes["/".join(parts[:i])] += 1
        if not votes:
            return StageResult()
        ranked = votes.most_common()
        if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
            reason = (
                f"object-graph paths were not used: the structure of {ctx.label_b} appears more than once in "
                f"{ctx.label_a} (under {ranked[0][0] or 'the root'!r} and {ranked[1][0] or 'the root'!r})"
            )
            return StageResult(ambiguous=(Ambiguity(HOW_GRAPH_PATH, reason),), notes=(reason,))
        lead = ranked[0][0] + "/" if ranked[0][0] else ""
        below = {x.graph_path[len(lead):]: x for x in sources if x.graph_path.startswith(lead)}
        if complete and set(below) != set(targets):
            return StageResult()
        return StageResult(
            pairs=tuple(Pair(below[p], y, HOW_GRAPH_PATH, below[p].name) for p, y in targets.items() if p in below)
        )

    return Stage(HOW_GRAPH_PATH, run, needs_names=False)


GRAPH_PATH = graph_path_stage(complete=True)


# -- 3. names ------------------------------------------------------------------------------------
def _by_name(a: Sequence[Item], b: Sequence[Item], ctx: Context) -> StageResult:
    notes = []
    for label, side, names in ((ctx.label_a, a, ctx.names_a), (ctx.label_b, b, ctx.names_b)):
        counts = collections.Counter(names[x.index][0] for x in side)
        collided = sorted(n for n, c in counts.items() if c > 1)
        if collided:
            notes.append(
                f"{len(collided)} readable name(s) of {label} are not unique (e.g. '{collided[0]}'); "
                "those variables are not aligned by name"
            )
    index_b: dict[str, list[Item]] = {}
    for y in b:
        for n in ctx.names_b[y.index]:
            have = index_b.setdefault(n, [])
            if not have or have[-1] is not y:
                have.append(y)
    found: dict[int, list[Item]] = {}
    wanted: dict[int, int] = {}
    for x in a:
        names = ctx.names_a[x.index]
        if len(names) == 1:
            cands = index_b.get(names[0])
        else:
            cands = list({y.index: y for n in names for y in index_b.get(n, ())}.values())
        if cands:
            found[x.index] = cands
            for y in cands:
                wanted[y.index] = wanted.get(y.index, 0) + 1
    pairs, edges = [], []
    for x in a:
        cands = found.get(x.index)
        if not cands:
            continue
        if len(cands) == 1 and wanted[cands[0].index] == 1:
            pairs.append(Pair(x, cands[0], HOW_NAME, ctx.name_a(x)))
        else:
            edges += [(x.index, y.index) for y in cands]
    ambiguous = _ambiguities(HOW_NAME, edges, a, b, ctx, "readable name")
    if ambiguous:
        first = ambiguous[0]
        notes.append(
            f"{len(ambiguous)} name(s) match more than one variable, or are wanted by more than one (e.g. "
            f"{ctx.label_a} {_examples([repr(x.name) for x in first.a])} and {ctx.label_b} "
            f"{_examples([repr(y.name) for y in first.b])}); those variables are left unpaired rather than guessed"
        )
    return StageResult(pairs=tuple(pairs), ambiguous=ambiguous, notes=tuple(notes))


def _ambiguities(
    stage: str, edges: Sequence[tuple[int, int]], a: Sequence[Item], b: Sequence[Item], ctx: Context, what: str
) -> tuple[Ambiguity, ...]:
    by_a = {x.index: x for x in a}
    by_b = {y.index: y for y in b}
    out = []
    for ia, ib in _components(edges):
        xs = tuple(by_a[i] for i in ia)
        ys = tuple(by_b[j] for j in ib)
        reason = (
            f"{len(xs)} variable(s) of {ctx.label_a} and {len(ys)} of {ctx.label_b} share a {what} "
            f"('{ctx.name_a(xs[0])}')"
        )
        out.append(Ambiguity(stage, reason, xs, ys))
    return tuple(out)


NAME = Stage(HOW_NAME, _by_name, uses_names=True)


# -- 4. outer prefixes ---------------------------------------------------------------------------
def _strip_prefixes(
    ua: dict[str, Any], ub: dict[str, Any], what: str, labels: tuple[str, str]
) -> tuple[list[tuple[str, str, str]], list[str]]:
    """Match names of ``ua`` and ``ub`` that differ by an outer prefix one side has.

    Prefixes are tried most-voted first; each one is applied to every unmatched name of its
    side that starts with it. Matched names are removed from ``ua`` and ``ub``.

    Returns:
        ``(shown name, name in ua, name in ub)`` triples, and one note per prefix used.
    """
    pairs: list[tuple[str, str, str]] = []
    notes = []
    while ua and ub:
        votes: collections.Counter[tuple[int, str]] = collections.Counter()
        for side, mine, other in ((0, ua, ub), (1, ub, ua)):
            for name in mine:
                parts = name.split("/")
                for k in range(1, len(parts)):
                    if "/".join(parts[k:]) in other:
                        votes[(side, "/".join(parts[:k]))] += 1
        if not votes:
            break
        (side, prefix), _ = votes.most_common(1)[0]
        mine, other = (ua, ub) if side == 0 else (ub, ua)
        used = 0
        for name in sorted(mine):
            if name.startswith(prefix + "/") and name[len(prefix) + 1 :] in other:
                short = name[len(prefix) + 1 :]
                pairs.append((short, name, short) if side == 0 else (short, short, name))
                del mine[name]
                del other[short]
                used += 1
        notes.append(f"dropped the prefix '{prefix}/' from {used} {what} name(s) of {labels[side]} to align them")
    return pairs, notes


def _by_prefix(a: Sequence[Item], b: Sequence[Item], ctx: Context) -> StageResult:
    ua = _unique_primary(a, ctx.names_a)
    ub = _unique_primary(b, ctx.names_b)
    triples, notes = _strip_prefixes(dict(ua), dict(ub), "variable", (ctx.label_a, ctx.label_b))
    return StageResult(pairs=tuple(Pair(ua[x], ub[y], HOW_PREFIX, shown) for shown, x, y in triples), notes=tuple(notes))


PREFIX = Stage(HOW_PREFIX, _by_prefix, uses_names=True)


# -- 5. Keras 3 positional names -----------------------------------------------------------------
def _positional_side(pos: dict[str, Item], named: dict[str, Item], side: str, labels: tuple[str, str]) -> tuple[list[tuple[str, Item, Item]], list[str]]:
    """Match Keras 3 positional names (``layer/vars/N``) of one side to named variables of the
    other, layer by layer, in Keras creation order, checking shapes.

    Args:
        pos: Unmatched names of the positional side.
        named: Unmatched names of the other side.
        side: The label of the positional side.
        labels: The labels of A and B (for the layer prefixes' notes).

    Returns:
        ``(shown name, positional item, named item)`` triples, and notes. Matched names are
        removed from ``pos`` and ``named``.
    """
    by_layer: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
    for name in pos:
        found = POSITIONAL_RE.match(name)
        if found:
            by_layer[found.group("layer") or ""].append((int(found.group("index")), name))
    if not by_layer:
        return [], []
    named_layers: dict[str, list[str]] = collections.defaultdict(list)
    for name in named:
        if not POSITIONAL_RE.match(name):
            named_layers[name.rpartition("/")[0]].append(name)
    la = {layer: layer for layer in by_layer}
    lb = {layer: layer for layer in named_layers}
    layer_pairs = [(layer, layer) for layer in list(la) if layer in lb]
    for layer, _ in layer_pairs:
        del la[layer], lb[layer]
    stripped, _ = _strip_prefixes(la, lb, "layer", labels)
    layer_pairs += [(p, n) for _, p, n in stripped]

    rank = {leaf: i for i, leaf in enumerate(KERAS_VARIABLE_ORDER)}
    order_of = {name: i for i, name in enumerate(named)}
    triples: list[tuple[str, Item, Item]] = []
    ambiguous = []
    for player, nlayer in layer_pairs:
        slots = [name for _, name in sorted(by_layer[player])]
        candidates = sorted(
            named_layers[nlayer],
            key=lambda n: (rank.get(n.rpartition("/")[2], len(rank)), order_of[n]),
        )
        if len(slots) != len(candidates):
            ambiguous.append(player or TOP_LEVEL)
            continue
        if all(pos[p].shape == named[n].shape for p, n in zip(slots, candidates)):
            chosen = list(zip(slots, candidates))
        else:
            # Fall back to shapes when every shape in the layer is distinct.
            shapes = [named[n].shape for n in candidates]
            if len(set(shapes)) != len(shapes) or sorted(map(str, shapes)) != sorted(str(pos[p].shape) for p in slots):
                ambiguous.append(player or TOP_LEVEL)
                continue
            by_shape = {named[n].shape: n for n in candidates}
            chosen = [(p, by_shape[pos[p].shape]) for p in slots]
        for p, n in chosen:
            triples.append((n, pos.pop(p), named.pop(n)))
    notes = []
    if triples:
        notes.append(
            f"matched {len(triples)} positional Keras 3 name(s) of {side} (layer/vars/N) to the other"
            " side's variable names by layer, creation order and shape"
        )
    if ambiguous:
        notes.append(
            f"could not match the positional variables of {len(ambiguous)} layer(s) of {side} by order"
            f" and shape ({_examples(ambiguous)})"
        )
    return triples, notes


def _by_positional(a: Sequence[Item], b: Sequence[Item], ctx: Context) -> StageResult:
    ua = _unique_primary(a, ctx.names_a)
    ub = _unique_primary(b, ctx.names_b)
    labels = (ctx.label_a, ctx.label_b)
    pairs, notes = [], []
    triples, more = _positional_side(ua, ub, ctx.label_a, labels)
    pairs += [Pair(pos, named, HOW_POSITIONAL, shown) for shown, pos, named in triples]
    notes += more
    triples, more = _positional_side(ub, ua, ctx.label_b, labels)
    pairs += [Pair(named, pos, HOW_POSITIONAL, shown) for shown, pos, named in triples]
    notes += more
    return StageResult(pairs=tuple(pairs), notes=tuple(notes))


POSITIONAL = Stage(HOW_POSITIONAL, _by_positional, uses_names=True)


# -- 6. Keras 3 optimizer positions --------------------------------------------------------------
def _optimizer_side(pos: dict[str, Item], keyed: dict[str, Item], side: str) -> tuple[list[tuple[str, Item, Item]], list[str]]:
    """Match Keras 3 ``optimizer/vars/N`` names of one side to the optimizer variables of a
    TF checkpoint on the other (``<opt>/_variables/N`` keys), by index, checking shape and dtype.

    Returns:
        ``(shown name, positional item, TF item)`` triples, and notes. Matched names are removed
        from ``pos`` and ``keyed``.
    """
    slots = {}
    for name in pos:
        found = KERAS_OPTIMIZER_POSITIONAL_RE.match(name)
        if found:
            slots[int(found.group("index"))] = name
    if not slots:
        return [], []
    by_opt: dict[str, dict[int, str]] = collections.defaultdict(dict)
    attrs: dict[str, dict[int, str]] = collections.defaultdict(dict)
    for name, v in keyed.items():
        found = TF_OPTIMIZER_VARIABLE_RE.match(v.key)
        if found and v.role == m.ROLE_OPTIMIZER:
            if found.group("index") is not None:
                by_opt[found.group("opt")][int(found.group("index"))] = name
            else:
                attrs[found.group("opt")][TF_OPTIMIZER_ATTR_INDEX[found.group("attr")]] = name
    if not by_opt and not attrs:
        return _h5_optimizer_side(pos, keyed, slots, side)
    if len(set(by_opt) | set(attrs)) != 1:
        return [], []  # no Keras 3 optimizer in a TF checkpoint, or several: ambiguous
    opt = next(iter(set(by_opt) | set(attrs)))
    indexed = dict(by_opt[opt])
    for index, name in attrs[opt].items():
        indexed.setdefault(index, name)
    triples = []
    for index, pname in sorted(slots.items()):
        tname = indexed.get(index)
        if tname is None:
            continue
        pv, tv = pos[pname], keyed[tname]
        if pv.shape == tv.shape and pv.dtype == tv.dtype:
            triples.append((tname, pos.pop(pname), keyed.pop(tname)))
    notes = []
    if triples:
        notes.append(
            f"matched {len(triples)} Keras 3 optimizer variable(s) of {side} (optimizer/vars/N) to the"
            f" TF checkpoint's '{opt}/_variables/N' by index, shape and dtype"
        )
    return triples, notes


def _h5_optimizer_side(pos: dict[str, Item], keyed: dict[str, Item], slots: dict[int, str],
                       side: str) -> tuple[list[tuple[str, Item, Item]], list[str]]:
    """Keras 3 ``optimizer/vars/N`` of one side and a legacy ``.h5`` model's optimizer
    (``optimizer_weights/<opt>/...``, in stored order) on the other: the Nth of one is the Nth
    of the other, when both hold the same number and every pair has the same shape and dtype
    (all or nothing: one variable more or less would shift every slot)."""
    by_opt: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
    for name, v in keyed.items():
        found = KERAS_H5_OPTIMIZER_RE.match(v.key)
        if found and v.role == m.ROLE_OPTIMIZER:
            by_opt[found.group("opt")].append((v.index, name))
    if len(by_opt) != 1:
        return [], []
    opt, stored = next(iter(by_opt.items()))
    ordered = [name for _, name in sorted(stored)]
    if sorted(slots) != list(range(len(ordered))):
        return [], [f"{len(slots)} Keras 3 optimizer variable(s) of {side} (optimizer/vars/N) and {len(ordered)} in"
                    f" the .h5 model's optimizer '{opt}': not paired by position"]
    pairs = [(slots[i], ordered[i]) for i in range(len(ordered))]
    if any(pos[p].shape != keyed[h].shape or pos[p].dtype != keyed[h].dtype for p, h in pairs):
        return [], [f"the Keras 3 optimizer variables of {side} (optimizer/vars/N) and the .h5 model's optimizer"
                    f" '{opt}' differ in shape or dtype at some position: not paired by position"]
    triples = [(h, pos.pop(p), keyed.pop(h)) for p, h in pairs]
    return triples, [f"matched {len(triples)} Keras 3 optimizer variable(s) of {side} (optimizer/vars/N) to the .h5"
                     f" model's optimizer '{opt}' by Keras' variable order (position, shape and dtype)"]


def _by_optimizer_positional(a: Sequence[Item], b: Sequence[Item], ctx: Context) -> StageResult:
    ua = _unique_primary(a, ctx.names_a)
    ub = _unique_primary(b, ctx.names_b)
    pairs, notes = [], []
    triples, more = _optimizer_side(ua, ub, ctx.label_a)
    pairs += [Pair(pos, tfv, HOW_OPTIMIZER_POSITIONAL, shown) for shown, pos, tfv in triples]
    notes += more
    triples, more = _optimizer_side(ub, ua, ctx.label_b)
    pairs += [Pair(tfv, pos, HOW_OPTIMIZER_POSITIONAL, shown) for shown, pos, tfv in triples]
    notes += more
    return StageResult(pairs=tuple(pairs), notes=tuple(notes))


OPTIMIZER_POSITIONAL = Stage(HOW_OPTIMIZER_POSITIONAL, _by_optimizer_positional, uses_names=True)


# -- 7. order and shape --------------------------------------------------------------------------
def _by_order(a: Sequence[Item], b: Sequence[Item], ctx: Context) -> StageResult:
    free = sorted(a, key=lambda x: x.index)
    pairs = []
    for y in sorted(b, key=lambda y: y.index):
        same_shape = [x for x in free if x.shape == y.shape]
        if not same_shape:
            continue
        leaf = ctx.name_b(y).rsplit("/", 1)[-1]
        chosen = next((x for x in same_shape if ctx.name_a(x).rsplit("/", 1)[-1] == leaf), same_shape[0])
        free.remove(chosen)
        pairs.append(Pair(chosen, y, HOW_ORDER, ctx.name_b(y)))
    return StageResult(pairs=tuple(pairs))


ORDER = Stage(HOW_ORDER, _by_order)

NAME_STAGES = (NAME, PREFIX, POSITIONAL, OPTIMIZER_POSITIONAL)
