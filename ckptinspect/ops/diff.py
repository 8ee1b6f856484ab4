"""``diff``: what changed between two checkpoints, of the same format or of different ones.

Variables are aligned first (:func:`align`): by key when both sides have the same format, by
readable name otherwise, with the name differences between formats smoothed out (``:0``
suffixes, ``/.ATTRIBUTES/VARIABLE_VALUE``, an outer prefix one side has and the other does not,
Keras 3 positional ``layer/vars/N`` names). Then each aligned pair is compared value by value
(:func:`compare_variables`), streaming: only one pair of tensors is held at a time, and TF bundle
tensors are read straight from their data file in blocks (checksum verified), so memory stays
at a few blocks for bundles and about twice the largest tensor for other formats.

Equality follows numpy's ``isclose`` (``|a - b| <= atol + rtol * |b|``, computed in float64) with
NaN equal to NaN and infinities equal to infinities of the same sign.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import re
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from .. import model as m
from ..errors import CorruptCheckpointError, UsageError
from ..model import NUMERIC_DTYPES, ROLES, Checkpoint, Variable, numpy_dtype
from .mapping import parse_mapping

__all__ = [
    "STATUSES",
    "VariableDiff",
    "LayerDiff",
    "DiffReport",
    "Alignment",
    "diff",
    "align",
    "normalize_name",
    "parse_mapping",
    "compare_variables",
]

STATUS_EQUAL = "equal"
STATUS_CHANGED = "changed"
STATUS_ADDED = "added"
STATUS_REMOVED = "removed"
STATUS_SHAPE = "shape_mismatch"
STATUS_DTYPE = "dtype_mismatch"
STATUSES = (STATUS_EQUAL, STATUS_CHANGED, STATUS_ADDED, STATUS_REMOVED, STATUS_SHAPE, STATUS_DTYPE)
# Table order of the statuses that are not "changed" (changed rows are sorted by movement).
_STATUS_RANK = {STATUS_CHANGED: 0, STATUS_DTYPE: 1, STATUS_SHAPE: 2, STATUS_REMOVED: 3, STATUS_ADDED: 4, STATUS_EQUAL: 5}

ALIGN_KEY = "key"
ALIGN_NAME = "name"

# Name normalisation.
ATTRIBUTES_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
ATTRIBUTES_MARK = "/.ATTRIBUTES/"
OUTPUT_INDEX_RE = re.compile(r":\d+$")
POSITIONAL_RE = re.compile(r"^(?:(?P<layer>.*)/)?vars/(?P<index>\d+)$")
# Keras 3 optimizer variables: ``optimizer/vars/N`` in .weights.h5 / .keras files, and in a
# tf.train.Checkpoint the keys ``<opt>/_variables/N/...`` (``_iterations`` and
# ``_learning_rate`` are variables 0 and 1, keyed by the attribute that reaches them first).
KERAS_OPTIMIZER_POSITIONAL_RE = re.compile(r"^(?:.*/)?optimizer/vars/(?P<index>\d+)$")
TF_OPTIMIZER_VARIABLE_RE = re.compile(
    r"^(?P<opt>(?:.*/)?[^/]+)/(?:_variables/(?P<index>\d+)|(?P<attr>_iterations|_learning_rate))/\.ATTRIBUTES/VARIABLE_VALUE$"
)
TF_OPTIMIZER_ATTR_INDEX = {"_iterations": 0, "_learning_rate": 1}
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

# Streaming.
CHUNK_ELEMENTS = 8192  # arithmetic step: small enough that BLAS dot never spawns threads
BLOCK_BYTES = 1 << 20  # bytes per side held at a time when streaming from a data file

Progress = Callable[[int, int, Any], None]


# -- report --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class VariableDiff:
    """The comparison of one aligned variable.

    Attributes:
        name: The name the two sides were aligned on (A's readable name for key alignment).
        key_a: A's key, or None when the variable is only in B.
        key_b: B's key, or None when the variable is only in A.
        status: One of :data:`STATUSES`.
        name_a: A's readable name, or None.
        name_b: B's readable name, or None.
        role: The variable's role (A's when both sides have it).
        shape_a: A's shape, or None.
        shape_b: B's shape, or None.
        dtype_a: A's dtype, or None.
        dtype_b: B's dtype, or None.
        max_abs_diff: Largest ``|a - b|`` over elements finite on both sides (None when not
            compared numerically).
        rel_l2: ``||a - b|| / ||a||`` over those elements (None when ``||a|| = 0`` or not compared).
        cosine: Cosine similarity of a and b over those elements (None when a norm is 0).
        num_different: Elements that are not close (None when not compared).
        nan_a: NaN count in A (None when not compared numerically).
        inf_a: Inf count in A.
        nan_b: NaN count in B.
        inf_b: Inf count in B.
        nonfinite_mismatch: Elements where NaN/Inf on one side is not matched on the other.
    """

    name: str
    key_a: str | None
    key_b: str | None
    status: str
    name_a: str | None = None
    name_b: str | None = None
    role: str | None = None
    shape_a: tuple[int, ...] | None = None
    shape_b: tuple[int, ...] | None = None
    dtype_a: str | None = None
    dtype_b: str | None = None
    max_abs_diff: float | None = None
    rel_l2: float | None = None
    cosine: float | None = None
    num_different: int | None = None
    nan_a: int | None = None
    inf_a: int | None = None
    nan_b: int | None = None
    inf_b: int | None = None
    nonfinite_mismatch: int | None = None

    @property
    def differs(self) -> bool:
        """True for every status but ``equal``."""
        return self.status != STATUS_EQUAL

    @property
    def layer(self) -> str:
        """The layer path: the name without its last component (``""`` at the top level)."""
        return self.name.rpartition("/")[0]

    @property
    def movement(self) -> float:
        """How much the variable moved, for sorting: inf for NaN/Inf mismatches and for changes
        away from an all-zero value, else ``rel_l2``; 0 when equal or not compared."""
        if self.status == STATUS_EQUAL:
            return 0.0
        if self.nonfinite_mismatch:
            return math.inf
        if self.rel_l2 is not None:
            return self.rel_l2
        if self.max_abs_diff:
            return math.inf
        return 0.0

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``variables`` items of ``diff --format json``)."""
        out = {f.name: getattr(self, f.name) for f in _VARIABLE_DIFF_FIELDS}
        for k in ("shape_a", "shape_b"):
            if out[k] is not None:
                out[k] = list(out[k])
        return out


_VARIABLE_DIFF_FIELDS = dataclasses.fields(VariableDiff)


@dataclasses.dataclass(frozen=True)
class LayerDiff:
    """Per-layer summary: how many of a layer's variables differ, and by how much at most."""

    layer: str
    variables: int
    changed: int
    max_rel_l2: float | None
    max_abs_diff: float | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class DiffReport:
    """What ``diff`` found.

    Attributes:
        a: Path of checkpoint A (as resolved).
        b: Path of checkpoint B.
        format_a: A's format.
        format_b: B's format.
        atol: Absolute tolerance.
        rtol: Relative tolerance.
        role: The role compared, or None for all.
        alignment: ``key`` or ``name``.
        variables: One entry per aligned name, sorted by how much it moved, unchanged last.
        notes: What alignment did or could not do (prefixes dropped, positional names, names
            that could not be aligned), one sentence each.
        mapping: The ``--map`` rules applied to A's names, as given.
    """

    a: str
    b: str
    format_a: str
    format_b: str
    atol: float
    rtol: float
    role: str | None
    alignment: str
    variables: tuple[VariableDiff, ...]
    notes: tuple[str, ...] = ()
    mapping: tuple[str, ...] = ()

    @property
    def identical(self) -> bool:
        """True when every variable is equal within the tolerance (and none is added/removed)."""
        return all(not v.differs for v in self.variables)

    @property
    def summary(self) -> dict[str, int]:
        """Count per status."""
        counts = dict.fromkeys(STATUSES, 0)
        for v in self.variables:
            counts[v.status] += 1
        return counts

    @property
    def layers(self) -> tuple[LayerDiff, ...]:
        """Per-layer summaries, layers with the most movement first."""
        groups: dict[str, list[VariableDiff]] = collections.defaultdict(list)
        for v in self.variables:
            groups[v.layer].append(v)
        out = []
        for layer, members in groups.items():
            rels = [v.rel_l2 for v in members if v.differs and v.rel_l2 is not None]
            abss = [v.max_abs_diff for v in members if v.differs and v.max_abs_diff is not None]
            out.append(
                LayerDiff(
                    layer=layer,
                    variables=len(members),
                    changed=sum(v.differs for v in members),
                    max_rel_l2=max(rels) if rels else None,
                    max_abs_diff=max(abss) if abss else None,
                )
            )
        out.sort(key=lambda s: (0 if s.changed else 1, -(s.max_rel_l2 or 0.0), -s.changed, s.layer))
        return tuple(out)

    @property
    def verdict(self) -> str:
        """One line: how many variables differ, and the tolerance."""
        tol = f"(atol={_num(self.atol)}, rtol={_num(self.rtol)})"
        n = len(self.variables)
        counts = self.summary
        differ = n - counts[STATUS_EQUAL]
        if differ == 0:
            return f"all {n} variables equal {tol}" if n else f"no variables to compare {tol}"
        parts = ", ".join(f"{counts[s]} {s.replace('_', ' ')}" for s in STATUSES[1:] if counts[s])
        return f"{differ} of {n} variables differ: {parts} {tol}"

    def to_dict(self) -> dict[str, Any]:
        """The ``diff --format json`` document (see shared/INTERFACE.md)."""
        return {
            "a": self.a,
            "b": self.b,
            "identical": self.identical,
            "atol": self.atol,
            "rtol": self.rtol,
            "format_a": self.format_a,
            "format_b": self.format_b,
            "role": self.role,
            "alignment": self.alignment,
            "mapping": list(self.mapping),
            "notes": list(self.notes),
            "variables": [v.to_dict() for v in self.variables],
            "summary": self.summary,
            "layers": [s.to_dict() for s in self.layers],
            "verdict": self.verdict,
        }


def _num(x: float) -> str:
    return f"{x:g}"


# -- alignment -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Alignment:
    """Aligned variables: ``(name, variable of A or None, variable of B or None)`` triples."""

    pairs: tuple[tuple[str, Variable | None, Variable | None], ...]
    method: str
    notes: tuple[str, ...] = ()

    @property
    def matched(self) -> int:
        return sum(1 for _, va, vb in self.pairs if va is not None and vb is not None)


def normalize_name(name: str) -> str:
    """A readable name without format wrappers: ``a/b/.ATTRIBUTES/VARIABLE_VALUE`` -> ``a/b``,
    ``dense/kernel:0`` -> ``dense/kernel``."""
    if name.endswith(ATTRIBUTES_SUFFIX):
        name = name[: -len(ATTRIBUTES_SUFFIX)]
    name = name.replace(ATTRIBUTES_MARK, "/")
    return OUTPUT_INDEX_RE.sub("", name).strip("/")


def _apply_mapping(name: str, rules: list[tuple[re.Pattern, str]]) -> str:
    for pattern, repl in rules:
        try:
            name = pattern.sub(repl, name)
        except (re.error, IndexError) as e:
            raise UsageError(f"bad --map replacement {repl!r} for {pattern.pattern!r}: {e}") from None
    return name


def _named(variables: Sequence[Variable], rules: list[tuple[re.Pattern, str]] | None = None) -> tuple[dict[str, Variable], list[str]]:
    """Normalised (and mapped) name -> variable; names that collide keep their raw key."""
    names = [normalize_name(v.name) for v in variables]
    if rules:
        names = [_apply_mapping(n, rules) for n in names]
    counts = collections.Counter(names)
    out: dict[str, Variable] = {}
    collided = []
    for n, v in zip(names, variables):
        if counts[n] > 1:
            collided.append(n)
            n = v.key
        out.setdefault(n, v)
    return out, sorted(set(collided))


def _strip_prefixes(ua: dict[str, Any], ub: dict[str, Any], label: str) -> tuple[list[tuple[str, str, str]], list[str]]:
    """Match names of ``ua`` and ``ub`` that differ by an outer prefix one side has.

    Prefixes are tried most-voted first; each one is applied to every unmatched name of its
    side that starts with it. Matched names are removed from ``ua`` and ``ub``.

    Returns:
        ``(shown name, name in ua, name in ub)`` triples, and one note per prefix used.
    """
    pairs: list[tuple[str, str, str]] = []
    notes = []
    while ua and ub:
        votes: collections.Counter[tuple[str, str]] = collections.Counter()
        for side, mine, other in (("A", ua, ub), ("B", ub, ua)):
            for name in mine:
                parts = name.split("/")
                for k in range(1, len(parts)):
                    if "/".join(parts[k:]) in other:
                        votes[(side, "/".join(parts[:k]))] += 1
        if not votes:
            break
        (side, prefix), _ = votes.most_common(1)[0]
        mine, other = (ua, ub) if side == "A" else (ub, ua)
        used = 0
        for name in sorted(mine):
            if name.startswith(prefix + "/") and name[len(prefix) + 1 :] in other:
                short = name[len(prefix) + 1 :]
                pairs.append((short, name, short) if side == "A" else (short, short, name))
                del mine[name]
                del other[short]
                used += 1
        notes.append(f"dropped the prefix '{prefix}/' from {used} {label} name(s) of {side} to align them")
    return pairs, notes


def _positional(
    pos: dict[str, Variable], named: dict[str, Variable], side: str
) -> tuple[list[tuple[str, Variable, Variable]], list[str]]:
    """Match Keras 3 positional names (``layer/vars/N``) of one side to named variables of the
    other, layer by layer, in Keras creation order, checking shapes.

    Args:
        pos: Unmatched names of the positional side.
        named: Unmatched names of the other side.
        side: ``A`` or ``B``: which side ``pos`` is.

    Returns:
        ``(shown name, positional variable, named variable)`` triples, and notes. Matched
        names are removed from ``pos`` and ``named``.
    """
    by_layer: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
    for name in pos:
        match = POSITIONAL_RE.match(name)
        if match:
            by_layer[match.group("layer") or ""].append((int(match.group("index")), name))
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
    stripped, _ = _strip_prefixes(la, lb, "layer")
    layer_pairs += [(p, n) for _, p, n in stripped]

    rank = {leaf: i for i, leaf in enumerate(KERAS_VARIABLE_ORDER)}
    order_of = {name: i for i, name in enumerate(named)}
    triples: list[tuple[str, Variable, Variable]] = []
    ambiguous = []
    for player, nlayer in layer_pairs:
        slots = [name for _, name in sorted(by_layer[player])]
        candidates = sorted(
            named_layers[nlayer],
            key=lambda n: (rank.get(n.rpartition("/")[2], len(rank)), order_of[n]),
        )
        if len(slots) != len(candidates):
            ambiguous.append(player or "(top level)")
            continue
        if all(pos[p].shape == named[n].shape for p, n in zip(slots, candidates)):
            chosen = list(zip(slots, candidates))
        else:
            # Fall back to shapes when every shape in the layer is distinct.
            shapes = [named[n].shape for n in candidates]
            if len(set(shapes)) != len(shapes) or sorted(map(str, shapes)) != sorted(str(pos[p].shape) for p in slots):
                ambiguous.append(player or "(top level)")
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
            f" and shape ({', '.join(ambiguous[:3])}{', ...' if len(ambiguous) > 3 else ''})"
        )
    return triples, notes


def _optimizer_positional(
    pos: dict[str, Variable], keyed: dict[str, Variable], side: str
) -> tuple[list[tuple[str, Variable, Variable]], list[str]]:
    """Match Keras 3 ``optimizer/vars/N`` names of one side to the optimizer variables of a
    TF checkpoint on the other (``<opt>/_variables/N`` keys), by index, checking shape and dtype.

    Returns:
        ``(shown name, positional variable, TF variable)`` triples, and notes. Matched names
        are removed from ``pos`` and ``keyed``.
    """
    slots = {}
    for name, v in pos.items():
        match = KERAS_OPTIMIZER_POSITIONAL_RE.match(name)
        if match:
            slots[int(match.group("index"))] = name
    if not slots:
        return [], []
    by_opt: dict[str, dict[int, str]] = collections.defaultdict(dict)
    attrs: dict[str, dict[int, str]] = collections.defaultdict(dict)
    for name, v in keyed.items():
        match = TF_OPTIMIZER_VARIABLE_RE.match(v.key)
        if match and v.role == m.ROLE_OPTIMIZER:
            if match.group("index") is not None:
                by_opt[match.group("opt")][int(match.group("index"))] = name
            else:
                attrs[match.group("opt")][TF_OPTIMIZER_ATTR_INDEX[match.group("attr")]] = name
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
        if tuple(pv.shape) == tuple(tv.shape) and pv.dtype == tv.dtype:
            triples.append((tname, pos.pop(pname), keyed.pop(tname)))
    notes = []
    if triples:
        notes.append(
            f"matched {len(triples)} Keras 3 optimizer variable(s) of {side} (optimizer/vars/N) to the"
            f" TF checkpoint's '{opt}/_variables/N' by index, shape and dtype"
        )
    return triples, notes


def _align_by_name(a: Sequence[Variable], b: Sequence[Variable], rules: list[tuple[re.Pattern, str]]) -> Alignment:
    na, collided_a = _named(a, rules)
    nb, collided_b = _named(b, None)
    notes = []
    for side, collided in (("A", collided_a), ("B", collided_b)):
        if collided:
            notes.append(f"{len(collided)} readable name(s) of {side} are not unique (e.g. '{collided[0]}'); those variables go by key")
    pairs: list[tuple[str, Variable | None, Variable | None]] = []
    ua = dict(na)
    ub = dict(nb)
    for name in list(ua):
        if name in ub:
            pairs.append((name, ua.pop(name), ub.pop(name)))
    stripped, more = _strip_prefixes({k: None for k in ua}, {k: None for k in ub}, "variable")
    notes += more
    for shown, x, y in stripped:
        pairs.append((shown, ua.pop(x), ub.pop(y)))
    for side in ("A", "B"):
        pos, other = (ua, ub) if side == "A" else (ub, ua)
        triples, more = _positional(pos, other, side)
        notes += more
        for shown, pos_v, named_v in triples:
            pairs.append((shown, pos_v, named_v) if side == "A" else (shown, named_v, pos_v))
    for side in ("A", "B"):
        pos, other = (ua, ub) if side == "A" else (ub, ua)
        triples, more = _optimizer_positional(pos, other, side)
        notes += more
        for shown, pos_v, tf_v in triples:
            pairs.append((shown, pos_v, tf_v) if side == "A" else (shown, tf_v, pos_v))
    if ua and ub:
        ex_a, ex_b = sorted(ua)[0], sorted(ub)[0]
        notes.append(
            f"could not align {len(ua)} name(s) of A with {len(ub)} name(s) of B (e.g. A '{ex_a}', B '{ex_b}');"
            " they are listed as removed/added: rename A's names with --map 'REGEX=REPLACEMENT'"
        )
    pairs += [(name, v, None) for name, v in ua.items()]
    pairs += [(name, None, v) for name, v in ub.items()]
    return Alignment(pairs=tuple(pairs), method=ALIGN_NAME, notes=tuple(notes))


def _align_by_key(a: Sequence[Variable], b: Sequence[Variable]) -> Alignment:
    kb = {v.key: v for v in b}
    ka = {v.key for v in a}
    pairs: list[tuple[str, Variable | None, Variable | None]] = [(v.name, v, kb.get(v.key)) for v in a]
    pairs += [(v.name, None, v) for v in b if v.key not in ka]
    only_a = sorted(v.key for v in a if v.key not in kb)
    only_b = sorted(v.key for v in b if v.key not in ka)
    notes = ()
    if only_a and only_b:
        notes = (
            f"{len(only_a)} key(s) of A are not in B and {len(only_b)} of B not in A (e.g. A '{only_a[0]}',"
            f" B '{only_b[0]}'); they are listed as removed/added: if they are the same variables, rename"
            " A's names with --map 'REGEX=REPLACEMENT'",
        )
    return Alignment(pairs=tuple(pairs), method=ALIGN_KEY, notes=notes)


def align(
    a: Sequence[Variable],
    b: Sequence[Variable],
    *,
    same_format: bool,
    mapping: Mapping[str, str] | Iterable[str | tuple[str, str]] | None = None,
) -> Alignment:
    """Pair the variables of A with those of B.

    Same format and no mapping: by key, unless names align strictly more pairs (two TF
    checkpoints of the same model written through different object graphs). Otherwise by
    normalised readable name (see :func:`normalize_name`), with A's names rewritten by
    ``mapping`` first, then dropping an outer prefix one side has, then matching Keras 3
    positional ``layer/vars/N`` names to named variables of the same layer.

    Args:
        a: Variables of A.
        b: Variables of B.
        same_format: Whether both checkpoints have the same format.
        mapping: ``--map`` rules for A's names (see :func:`parse_mapping`).

    Returns:
        The :class:`Alignment`.

    Raises:
        UsageError: Bad mapping rules.
    """
    rules = parse_mapping(mapping)
    if same_format and not rules:
        by_key = _align_by_key(a, b)
        if by_key.matched == min(len(a), len(b)):
            return by_key
        by_name = _align_by_name(a, b, rules)
        if by_name.matched > by_key.matched:
            note = f"keys differ ({by_key.matched} shared); aligned by readable name instead ({by_name.matched} pairs)"
            return dataclasses.replace(by_name, notes=(note, *by_name.notes))
        return by_key
    return _align_by_name(a, b, rules)


# -- reading values in blocks ----------------------------------------------------------------------
# -- comparing values ----------------------------------------------------------------------------
class _Accumulator:
    """Running sums over aligned chunks of A and B (float64), NaN/Inf counts, element counts."""

    def __init__(self, atol: float, rtol: float):
        self.atol = atol
        self.rtol = rtol
        self.saa = self.sbb = self.sab = self.sdd = 0.0
        self.max_abs = 0.0
        self.pairs = 0  # element pairs finite on both sides
        self.ndiff = 0
        self.nan_a = self.inf_a = self.nan_b = self.inf_b = 0
        self.nonfinite_mismatch = 0

    # Each method takes 1-D arrays of equal length.
    def equal_chunk(self, x: np.ndarray) -> None:
        """A chunk whose two sides are bitwise identical."""
        x64 = x.astype(np.float64)
        s = float(np.dot(x64, x64))
        if not math.isfinite(s):
            nan = int(np.count_nonzero(np.isnan(x64)))
            inf = int(np.count_nonzero(np.isinf(x64)))
            self.nan_a += nan
            self.nan_b += nan
            self.inf_a += inf
            self.inf_b += inf
            x64 = x64[np.isfinite(x64)]
            s = float(np.dot(x64, x64))
        self.saa += s
        self.sbb += s
        self.sab += s
        self.pairs += x64.size

    def chunk(self, x: np.ndarray, y: np.ndarray, exact_int: bool) -> None:
        """A chunk that may differ; ``exact_int`` when both sides are integers."""
        if exact_int:
            if not np.count_nonzero(x != y):
                self.equal_chunk(x)
                return
        x64 = x.astype(np.float64)
        y64 = y.astype(np.float64)
        saa = float(np.dot(x64, x64))
        sbb = float(np.dot(y64, y64))
        if not (math.isfinite(saa) and math.isfinite(sbb)):
            x64, y64 = self._split_nonfinite(x64, y64)
            saa = float(np.dot(x64, x64))
            sbb = float(np.dot(y64, y64))
        self.saa += saa
        self.sbb += sbb
        self.sab += float(np.dot(x64, y64))
        self.pairs += x64.size
        d = np.subtract(x64, y64, out=x64)
        sdd = float(np.dot(d, d))
        if sdd == 0.0 and not d.any():
            return
        self.sdd += sdd
        np.abs(d, out=d)
        mx = float(d.max())
        if mx > self.max_abs:
            self.max_abs = mx
        if mx > self.atol:
            if self.rtol:
                limit = np.abs(y64)
                limit *= self.rtol
                limit += self.atol
                self.ndiff += int(np.count_nonzero(d > limit))
            else:
                self.ndiff += int(np.count_nonzero(d > self.atol))

    def _split_nonfinite(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Count NaN/Inf, count positions where they do not match, return the both-finite part."""
        fx = np.isfinite(x)
        fy = np.isfinite(y)
        nx = np.isnan(x)
        ny = np.isnan(y)
        self.nan_a += int(np.count_nonzero(nx))
        self.nan_b += int(np.count_nonzero(ny))
        self.inf_a += int(x.size - np.count_nonzero(fx) - np.count_nonzero(nx))
        self.inf_b += int(y.size - np.count_nonzero(fy) - np.count_nonzero(ny))
        both = fx & fy
        rest = ~both
        if rest.any():
            ok = (x[rest] == y[rest]) | (nx[rest] & ny[rest])
            self.nonfinite_mismatch += int(ok.size - np.count_nonzero(ok))
        return x[both], y[both]

    def result(self) -> dict[str, Any]:
        compared = self.pairs > 0
        na = math.sqrt(self.saa)
        nb = math.sqrt(self.sbb)
        return {
            "max_abs_diff": self.max_abs if compared else None,
            "rel_l2": (math.sqrt(self.sdd) / na) if compared and na > 0 else (0.0 if compared and self.sdd == 0 else None),
            "cosine": max(-1.0, min(1.0, self.sab / (na * nb))) if na > 0 and nb > 0 else None,
            "num_different": self.ndiff + self.nonfinite_mismatch,
            "nan_a": self.nan_a,
            "inf_a": self.inf_a,
            "nan_b": self.nan_b,
            "inf_b": self.inf_b,
            "nonfinite_mismatch": self.nonfinite_mismatch,
        }


def _arith_view(block: np.ndarray) -> np.ndarray:
    """A view numpy can do float64 arithmetic on: complex as (re, im) pairs, bool as uint8."""
    if block.dtype.kind == "c":
        return block.view(np.float32 if block.dtype.itemsize == 8 else np.float64)
    if block.dtype.kind == "b":
        return block.view(np.uint8)
    return block


def _bits_view(block: np.ndarray) -> np.ndarray:
    return block.view(f"u{block.dtype.itemsize}") if block.dtype.itemsize in (1, 2, 4, 8) else block


def _bitwise_equal(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether two blocks hold the same bytes (memcmp when both were read as ``bytes``)."""
    bx, by = x.base, y.base
    if isinstance(bx, bytes) and isinstance(by, bytes) and len(bx) == x.nbytes and len(by) == y.nbytes:
        return bx == by
    return bool(np.array_equal(_bits_view(_arith_view(x)), _bits_view(_arith_view(y))))


def _block_source(ckpt: Checkpoint, var: Variable, block: int) -> Callable[[], Iterator[np.ndarray]]:
    """A function returning a fresh iterator over ``var``'s blocks (streamed by its format)."""
    return lambda: ckpt.iter_blocks(var, block)


def _pairs(blocks_a: Iterator[np.ndarray], blocks_b: Iterator[np.ndarray], label: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for xa in blocks_a:
        xb = next(blocks_b, None)
        if xb is None or xb.size != xa.size:
            raise CorruptCheckpointError(f"{label}: fewer values than its shape declares")
        yield xa, xb
    if next(blocks_b, None) is not None:
        raise CorruptCheckpointError(f"{label}: more values than its shape declares")


def _identical(blocks: Iterator[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any] | None:
    """The result for a variable whose two sides hold the same bytes, streaming (no float64
    pass: rel_l2 0, cosine 1 unless all zero); None as soon as a block differs, or when the
    value holds NaN/Inf (the general path counts them) or nothing."""
    nonzero = False
    seen = False
    for xa, xb in blocks:
        if not _bitwise_equal(xa, xb):
            return None
        x = _arith_view(xa)
        if x.size == 0:
            continue
        seen = True
        if x.dtype.kind == "f":
            lo, hi = x.min(), x.max()
            if not (math.isfinite(lo) and math.isfinite(hi)):
                return None
            nonzero = nonzero or not (lo == 0 and hi == 0)
        else:
            nonzero = nonzero or bool(x.any())
    if not seen:
        return None
    return {
        "max_abs_diff": 0.0,
        "rel_l2": 0.0,
        "cosine": 1.0 if nonzero else None,
        "num_different": 0,
        "nan_a": 0,
        "inf_a": 0,
        "nan_b": 0,
        "inf_b": 0,
        "nonfinite_mismatch": 0,
    }


def _compare_numeric(
    ckpt_a: Checkpoint, va: Variable, ckpt_b: Checkpoint, vb: Variable, atol: float, rtol: float
) -> dict[str, Any]:
    itemsize = max(_itemsize(va.dtype), _itemsize(vb.dtype))
    block = max(CHUNK_ELEMENTS, (BLOCK_BYTES // itemsize) // CHUNK_ELEMENTS * CHUNK_ELEMENTS)
    source_a = _block_source(ckpt_a, va, block)
    source_b = _block_source(ckpt_b, vb, block)
    label = f"{ckpt_b.path}: {vb.key!r}"
    if va.dtype == vb.dtype:
        # Most variables of two checkpoints are either untouched or changed everywhere: try
        # the cheap byte comparison first; a variable that differs is read again below.
        pairs = _pairs(source_a(), source_b(), label)
        try:
            quick = _identical(pairs)
        finally:
            pairs.close()
        if quick is not None:
            return quick
    acc = _Accumulator(atol, rtol)
    prefilter = va.dtype == vb.dtype
    for xa, xb in _pairs(source_a(), source_b(), label):
        x = _arith_view(xa)
        y = _arith_view(xb)
        if prefilter and _bitwise_equal(xa, xb):
            for i in range(0, x.size, CHUNK_ELEMENTS):
                acc.equal_chunk(x[i : i + CHUNK_ELEMENTS])
            continue
        prefilter = False  # a variable that differs in one block usually differs in all
        exact_int = x.dtype.kind in "iu" and y.dtype.kind in "iu"
        for i in range(0, x.size, CHUNK_ELEMENTS):
            acc.chunk(x[i : i + CHUNK_ELEMENTS], y[i : i + CHUNK_ELEMENTS], exact_int)
    return acc.result()


def _itemsize(dtype: str) -> int:
    d = numpy_dtype(dtype)
    return d.itemsize if d is not None else 8


def _compare_other(ckpt_a: Checkpoint, va: Variable, ckpt_b: Checkpoint, vb: Variable) -> dict[str, Any]:
    """Strings and other non-numeric values: equal iff identical."""
    x = np.asarray(ckpt_a.read(va)).reshape(-1)
    y = np.asarray(ckpt_b.read(vb)).reshape(-1)
    if x.shape != y.shape:
        return {"num_different": max(x.size, y.size)}
    try:
        same = np.asarray(x == y, dtype=bool).reshape(-1)
    except (TypeError, ValueError):
        same = np.array([bytes(p) == bytes(q) for p, q in zip(x, y)], dtype=bool)
    return {"num_different": int(same.size - np.count_nonzero(same))}


def compare_variables(
    ckpt_a: Checkpoint,
    va: Variable,
    ckpt_b: Checkpoint,
    vb: Variable,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
) -> dict[str, Any]:
    """Compare the values of two variables, streaming.

    Args:
        ckpt_a: Checkpoint holding ``va``.
        va: Variable of A.
        ckpt_b: Checkpoint holding ``vb``.
        vb: Variable of B (same shape as ``va``).
        atol: Absolute tolerance.
        rtol: Relative tolerance (of B's magnitude, as numpy ``isclose``).

    Returns:
        A dict with ``status`` and the statistic fields of :class:`VariableDiff`.

    Raises:
        CkptError: A value cannot be read.
    """
    if tuple(va.shape) != tuple(vb.shape):
        return {"status": STATUS_SHAPE}
    numeric = va.dtype in NUMERIC_DTYPES and vb.dtype in NUMERIC_DTYPES
    comparable = numeric and (("complex" in va.dtype) == ("complex" in vb.dtype))
    if comparable:
        stats = _compare_numeric(ckpt_a, va, ckpt_b, vb, atol, rtol)
    elif va.dtype == vb.dtype:
        stats = _compare_other(ckpt_a, va, ckpt_b, vb)
    else:
        return {"status": STATUS_DTYPE}
    if va.dtype != vb.dtype:
        status = STATUS_DTYPE
    else:
        status = STATUS_CHANGED if stats["num_different"] else STATUS_EQUAL
    return {"status": status, **stats}


# -- the operation --------------------------------------------------------------------------------
def _sort_key(v: VariableDiff) -> tuple:
    return (_STATUS_RANK[v.status], -v.movement, -(v.max_abs_diff or 0.0), v.name)


def _read_order(ca: Checkpoint, cb: Checkpoint) -> Callable[[tuple[str, Variable | None, Variable | None]], tuple]:
    """Pairs in the order A's bytes lie on disk (B's for variables only B has)."""

    def key(pair: tuple[str, Variable | None, Variable | None]) -> tuple:
        _, va, vb = pair
        return (ca.storage_order(va), va.key) if va is not None else (cb.storage_order(vb), vb.key)

    return key


def diff(
    a: str | os.PathLike[str] | Checkpoint,
    b: str | os.PathLike[str] | Checkpoint,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
    role: str | None = None,
    mapping: Mapping[str, str] | Iterable[str | tuple[str, str]] | None = None,
    progress: Progress | None = None,
) -> DiffReport:
    """Compare two checkpoints, of the same or of different formats.

    Args:
        a: Checkpoint A: any path :func:`ckptinspect.open` accepts, or an open
            :class:`~ckptinspect.Checkpoint` (left open).
        b: Checkpoint B, likewise.
        atol: Absolute tolerance (>= 0).
        rtol: Relative tolerance (>= 0), relative to B's magnitude as in numpy ``isclose``.
        role: Compare only variables of this role (``model``, ``optimizer``, ``metadata``).
        mapping: Rules rewriting A's names before aligning: ``"REGEX=REPLACEMENT"`` strings,
            ``(regex, replacement)`` pairs or a dict. Forces alignment by name.
        progress: Called as ``progress(done, total, variable_diff)`` after each variable.

    Returns:
        A :class:`DiffReport`; ``report.identical`` is the verdict.

    Raises:
        UsageError: Bad tolerance, role or mapping.
        CkptError: A checkpoint cannot be opened or read.
    """
    for label, value in (("atol", atol), ("rtol", rtol)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise UsageError(f"{label} must be a finite number >= 0. Received: {label}={value!r}")
    if role is not None and role not in ROLES:
        raise UsageError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
    rules_text = _mapping_text(mapping)
    parse_mapping(mapping)  # fail on bad rules before opening anything

    opened: list[Checkpoint] = []
    try:
        ca = _open(a, opened)
        cb = _open(b, opened)
        va_list = ca.filter(role=role)
        vb_list = cb.filter(role=role)
        alignment = align(va_list, vb_list, same_format=ca.format == cb.format, mapping=mapping)
        notes = list(alignment.notes)
        if role is not None and not va_list and not vb_list:
            notes.append(f"neither checkpoint has {role}-role variables")
        pairs = sorted(alignment.pairs, key=_read_order(ca, cb))
        results = []
        for i, (name, va, vb) in enumerate(pairs, 1):
            results.append(_diff_one(name, ca, va, cb, vb, float(atol), float(rtol)))
            if progress is not None:
                progress(i, len(pairs), results[-1])
        return DiffReport(
            a=ca.path,
            b=cb.path,
            format_a=ca.format,
            format_b=cb.format,
            atol=float(atol),
            rtol=float(rtol),
            role=role,
            alignment=alignment.method,
            variables=tuple(sorted(results, key=_sort_key)),
            notes=tuple(notes),
            mapping=rules_text,
        )
    finally:
        for c in opened:
            c.close()


def _mapping_text(mapping: Any) -> tuple[str, ...]:
    if not mapping:
        return ()
    items = mapping.items() if isinstance(mapping, Mapping) else mapping
    return tuple(r if isinstance(r, str) else f"{r[0]}={r[1]}" for r in items)


def _open(path_or_ckpt: Any, opened: list[Checkpoint]) -> Checkpoint:
    if isinstance(path_or_ckpt, Checkpoint):
        return path_or_ckpt
    from ..formats import open_checkpoint  # noqa: PLC0415

    ckpt = open_checkpoint(os.fspath(path_or_ckpt))
    opened.append(ckpt)
    return ckpt


def _diff_one(
    name: str, ca: Checkpoint, va: Variable | None, cb: Checkpoint, vb: Variable | None, atol: float, rtol: float,
) -> VariableDiff:
    common = {
        "name": name,
        "key_a": va.key if va else None,
        "key_b": vb.key if vb else None,
        "name_a": va.name if va else None,
        "name_b": vb.name if vb else None,
        "role": (va or vb).role,
        "shape_a": tuple(va.shape) if va else None,
        "shape_b": tuple(vb.shape) if vb else None,
        "dtype_a": va.dtype if va else None,
        "dtype_b": vb.dtype if vb else None,
    }
    if va is None:
        return VariableDiff(status=STATUS_ADDED, **common)
    if vb is None:
        return VariableDiff(status=STATUS_REMOVED, **common)
    return VariableDiff(**common, **compare_variables(ca, va, cb, vb, atol=atol, rtol=rtol))
