"""``diff``: what changed between two checkpoints, of the same format or of different ones.

Variables are paired first by the one matcher (:func:`ckptinspect.ops.match.matcher.align`): by key
when both sides have the same format, by readable name otherwise, with the name differences
between formats smoothed out (``:0`` suffixes, ``/.ATTRIBUTES/VARIABLE_VALUE``, an outer prefix
one side has and the other does not, Keras 3 positional ``layer/vars/N`` names). Then each pair
is compared value by value, streaming (:func:`ckptinspect.ops.diff.compare.compare_variables`): only
one pair of tensors is held at a time per thread. When both checkpoints can be read from several
threads (``concurrent_reads``: TF bundles, local HDF5 files), batches of consecutive variables are
compared by up to :data:`ckptinspect._parallel.WORKERS` threads; each variable is compared whole
by one thread, and the rows come back in read order, so the report is the same bits with one
thread or two.

Equality follows numpy's ``isclose`` (``|a - b| <= atol + rtol * |b|``, computed in float64) with
NaN equal to NaN and infinities equal to infinities of the same sign.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, overload

import numpy as np

from ..._parallel import THREAD_MIN_BYTES, ordered_map
from ...errors import UsageError
from ...formats import capabilities
from ...model import ROLES, Checkpoint, LazySequence, Variable, VariableTable
from .compare import (
    BLOCK_BYTES,
    CHUNK_ELEMENTS,
    STATUS_ADDED,
    STATUS_CHANGED,
    STATUS_DTYPE,
    STATUS_EQUAL,
    STATUS_REMOVED,
    STATUS_SHAPE,
    STATUSES,
    compare_variables,
)
from ..layout_view import RearrangedSource, fits_reversed, pair_fit
from ..match.layouts import CONV_HWIO, Layout
from ..match.mapping import Rules, parse_mapping, rules_text
from ..roles import OPTIMIZER_PATTERN_INFO, mark_optimizer, optimizer_regex
from ..match.columns import KeyPairs
from ..match.matcher import ALIGN_KEY, ALIGN_NAME, HOW_KEY, Match, align, normalize_name

KERAS_LAYOUT = "keras-layout"  # the capability that lets the matcher use Keras' own layout

__all__ = [
    "STATUSES",
    "ALIGN_KEY",
    "ALIGN_NAME",
    "BLOCK_BYTES",
    "CHUNK_ELEMENTS",
    "VariableDiff",
    "DiffRows",
    "LayerDiff",
    "DiffReport",
    "Match",
    "diff",
    "align",
    "normalize_name",
    "parse_mapping",
    "compare_variables",
]

# Variables are handed to the comparing threads in batches of consecutive ones, about
# BATCH_BYTES (or BATCH_VARIABLES) each, at most BATCHES_AHEAD batches in flight (threads go on
# with the next batches while a large tensor is compared; only the results wait). A batch whose
# values are all under ckptinspect._parallel.THREAD_MIN_BYTES is compared in the calling thread
# (faster there: the measurements are beside that constant).
BATCH_BYTES = 16 << 20
BATCH_VARIABLES = 256
BATCHES_AHEAD = 4

# Table order of the statuses that are not "changed" (changed rows are sorted by movement).
_STATUS_RANK = {STATUS_CHANGED: 0, STATUS_DTYPE: 1, STATUS_SHAPE: 2, STATUS_REMOVED: 3, STATUS_ADDED: 4, STATUS_EQUAL: 5}

Progress = Callable[[int, int, Any], None]


# -- report --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)  # one per variable: a million of them for a giant header
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
        matched_by: How the two sides were paired (``key``, ``name``, ``prefix``,
            ``positional``, ``mapping``...: :data:`ckptinspect.ops.match.matcher.HOWS`), or None
            when the variable is on one side only.
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
        layout: How A's value was rearranged before comparing (``transposed (axes 1,0)``,
            ``permuted (axes 2,3,1,0)``) under the layout rules, or None.
    """

    name: str
    key_a: str | None
    key_b: str | None
    status: str
    name_a: str | None = None
    name_b: str | None = None
    role: str | None = None
    matched_by: str | None = None
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
    layout: str | None = None

    @property
    def differs(self) -> bool:
        """True for every status but ``equal``."""
        return self.status != STATUS_EQUAL

    @property
    def names_differ(self) -> bool:
        """True when both sides have the variable under different readable names."""
        return self.name_a is not None and self.name_b is not None and self.name_a != self.name_b

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


_STATUS_CODE = {s: i for i, s in enumerate(STATUSES)}
_RANK_OF_CODE = np.array([_STATUS_RANK[s] for s in STATUSES], np.int8)
_EQUAL_CODE = _STATUS_CODE[STATUS_EQUAL]
_FLOATS = ("max_abs_diff", "rel_l2", "cosine")
_COUNTS = ("num_different", "nan_a", "inf_a", "nan_b", "inf_b", "nonfinite_mismatch")
_NUMBERS = (*_FLOATS, *_COUNTS)
_PATTERNS = 255  # distinct sets of numbers kept once (the entries' kinds are uint8)
_BLOCK = 1 << 14  # entries per block of the numbers no pattern holds
_INT32_MAX = (1 << 31) - 1
_ROWS_AT_ONCE = 4096  # rows made from the columns at a time
_NAME_SORT_BYTES = 64 << 20  # shown names sorted as fixed-width bytes up to this much, else as strings


def _index_dtype(n: int) -> Any:
    return np.int32 if n <= _INT32_MAX else np.int64


class DiffRows(LazySequence[VariableDiff]):
    """diff's per-variable results as columns, in the report's order: each :class:`VariableDiff`
    is made when asked (a diff of a million variables holds no million objects).

    The columns are indexed by *entry* (the aligned variables in read order); ``order`` gives the
    report's order. Names, keys, shapes, dtypes and roles are read from the two sides' variables
    (``a[pos_a[j]]``, ``b[pos_b[j]]``, -1 for a side that lacks the variable); statuses are codes
    into :data:`STATUSES`; each entry's numbers (``max_abs_diff`` ... ``nonfinite_mismatch``) are
    one of up to 255 sets kept once (an equal variable's 0, 0, 1, 0... is shared by most of them),
    else float64 and int64 columns of a block of entries (made for the blocks that need them),
    else (a None among the floats) a tuple.

    Args:
        a: A's variables (a tuple or a :class:`~ckptinspect.VariableTable`).
        b: B's variables.
        pos_a: Each entry's position in ``a``, or -1.
        pos_b: Each entry's position in ``b``, or -1.
        how: Each entry's code into ``hows`` (how it was paired), or -1 (one side only).
        hows: The ``matched_by`` values the codes stand for.
        shown: Entry -> the name it was aligned on, where that is not its own name (A's, else B's).
    """

    _ITEM = "variable"

    def __init__(self, a: Sequence[Variable], b: Sequence[Variable], pos_a: Any, pos_b: Any, how: Any,
                 hows: Sequence[str], shown: Mapping[int, str]):
        n = len(pos_a)
        self.a, self.b = a, b
        self.pos_a, self.pos_b, self.how, self.hows = pos_a, pos_b, how, tuple(hows)
        self.shown = dict(shown)
        self.status = np.zeros(n, np.int8)
        # Each entry's numbers (_FLOATS, then _COUNTS): most entries share theirs with many
        # others (equal variables: 0, 0, 1, 0...), kept once as a pattern (kind: its code + 1);
        # the others (kind 0) in blocks of columns made for the blocks that have some.
        self.kind = np.zeros(n, np.uint8)
        self._patterns: list[tuple] = []
        self._pattern_codes: dict[tuple, int] = {}
        self._blocks: dict[int, tuple[Any, Any]] = {}
        self._odd: dict[int, tuple] = {}
        self.layouts: dict[int, str] = {}
        self._made: tuple[VariableDiff, ...] | None = None  # rows given whole (DiffRows.of)
        self.order: Any = np.arange(n, dtype=_index_dtype(n))
        self._layers: tuple[LayerDiff, ...] | None = None
        self._moved: tuple[tuple[LayerDiff, ...], int] | None = None

    @classmethod
    def of(cls, rows: Iterable[VariableDiff]) -> DiffRows:
        """Columns of ready-made rows (a report built by hand), in their order."""
        rows = tuple(rows)
        n = len(rows)
        none = np.full(n, -1, np.int64)
        out = cls(rows, (), np.arange(n, dtype=np.int64), none, none, (), {j: v.name for j, v in enumerate(rows)})
        out._made = rows
        for j, v in enumerate(rows):
            out.store(j, v)
        return out

    # -- filling ---------------------------------------------------------------------------
    def store(self, j: int, v: VariableDiff) -> None:
        """Keep the results of entry ``j`` (its names and shapes are the sides' own)."""
        self.status[j] = _STATUS_CODE[v.status]
        values = (v.max_abs_diff, v.rel_l2, v.cosine, v.num_different, v.nan_a, v.inf_a, v.nan_b, v.inf_b,
                  v.nonfinite_mismatch)
        # equal as a tuple is not always the same number (1 and 1.0, 0.0 and -0.0): the key says
        key = (values, tuple(map(type, values)),
               tuple(math.copysign(1.0, x) if type(x) is float else 0.0 for x in values) if 0.0 in values else None)
        code = self._pattern_codes.get(key)
        if code is None and len(self._patterns) < _PATTERNS:
            code = self._pattern_codes[key] = len(self._patterns)
            self._patterns.append(values)
        if code is not None:
            self.kind[j] = code + 1
        elif all(type(x) is float for x in values[:len(_FLOATS)]) and all(type(x) is int or x is None
                                                                           for x in values[len(_FLOATS):]):
            block = self._blocks.get(j // _BLOCK)
            if block is None:
                block = self._blocks[j // _BLOCK] = (np.zeros((_BLOCK, len(_FLOATS))),
                                                     np.full((_BLOCK, len(_COUNTS)), -1, np.int64))
            block[0][j % _BLOCK] = values[:len(_FLOATS)]
            block[1][j % _BLOCK] = [-1 if x is None else x for x in values[len(_FLOATS):]]
        else:  # None among the floats, or a number of another type: kept as it is
            self._odd[j] = values
        if v.layout is not None:
            self.layouts[j] = v.layout

    def _values(self, j: int, kind: int) -> tuple:
        """Entry ``j``'s numbers (_FLOATS, then _COUNTS)."""
        if kind:
            return self._patterns[kind - 1]
        odd = self._odd.get(j)
        if odd is not None:
            return odd
        floats, counts = self._blocks[j // _BLOCK]
        at = j % _BLOCK
        return (*floats[at].tolist(), *(None if x < 0 else x for x in counts[at].tolist()))

    def column(self, field: str) -> tuple[Any, Any]:
        """One number of every entry: float64 values (0 where None), and where they are not None."""
        c = _NUMBERS.index(field)
        pattern_values = np.array([0.0 if p[c] is None else float(p[c]) for p in self._patterns] + [0.0])
        pattern_present = np.array([p[c] is not None for p in self._patterns] + [False])
        codes = np.subtract(self.kind, 1, dtype=np.int16)  # kind 0: -1, the last (filled below)
        values, present = pattern_values[codes], pattern_present[codes]
        del codes
        for block, (floats, counts) in self._blocks.items():
            first = block * _BLOCK
            at = np.flatnonzero(self.kind[first:first + _BLOCK] == 0)
            if c < len(_FLOATS):
                values[first + at], present[first + at] = floats[at, c], True
            else:
                got = counts[at, c - len(_FLOATS)]
                values[first + at], present[first + at] = np.maximum(got, 0), got >= 0
        for j, odd in self._odd.items():
            values[j] = 0.0 if odd[c] is None else float(odd[c])
            present[j] = odd[c] is not None
        return values, present

    # -- the rows --------------------------------------------------------------------------
    def name(self, j: int) -> str:
        """The name entry ``j`` was aligned on."""
        shown = self.shown.get(j)
        if shown is not None:
            return shown
        pa = int(self.pos_a[j])
        side, at = (self.a, pa) if pa >= 0 else (self.b, int(self.pos_b[j]))
        if isinstance(side, VariableTable):  # the name alone, no Variable made
            return side.name_of(at if side.rows is None else int(side.rows[at]))
        return side[at].name

    def entry(self, j: int) -> VariableDiff:
        """The :class:`VariableDiff` of entry ``j``."""
        return self._entries(np.array([j], np.int64))[0]

    def _entries(self, js: Any) -> list[VariableDiff]:
        """The :class:`VariableDiff` of each entry ``js`` (numpy): the columns read a block at a time."""
        if self._made is not None:
            return [self._made[j] for j in js.tolist()]
        numbers = [self._values(j, kind) for j, kind in zip(js.tolist(), self.kind[js].tolist())]
        hows, shown_names, layouts = self.hows, self.shown, self.layouts
        pa, pb = self.pos_a[js], self.pos_b[js]
        side_a = _side_block(self.a, pa)
        side_b = side_a if self.b is self.a and np.array_equal(pa, pb) else _side_block(self.b, pb)  # X X: once
        out = []
        for i, (j, how, status, fa, fb) in enumerate(zip(js.tolist(), self.how[js].tolist(), self.status[js].tolist(),
                                                         side_a, side_b)):
            either: Any = fa if fa is not None else fb  # every entry has a side
            shown = shown_names.get(j)
            out.append(VariableDiff(
                shown if shown is not None else either[1],
                fa[0] if fa else None, fb[0] if fb else None, STATUSES[status],
                fa[1] if fa else None, fb[1] if fb else None, either[4], hows[how] if how >= 0 else None,
                fa[2] if fa else None, fb[2] if fb else None, fa[3] if fa else None, fb[3] if fb else None,
                *numbers[i], layouts.get(j),
            ))
        return out

    def __len__(self) -> int:
        return len(self.order)

    @overload
    def __getitem__(self, i: int) -> VariableDiff: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[VariableDiff, ...]: ...

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return tuple(self._entries(self.order[i]))
        return self.entry(int(self.order[self._position(i)]))

    def __iter__(self) -> Iterator[VariableDiff]:
        order = self.order
        for first in range(0, len(order), _ROWS_AT_ONCE):
            yield from self._entries(order[first:first + _ROWS_AT_ONCE])

    def __repr__(self) -> str:
        return f"<DiffRows of {len(self)} variables>"

    # -- what the report says of them ------------------------------------------------------
    def summary(self) -> dict[str, int]:
        """Count per status."""
        counts = np.bincount(self.status, minlength=len(STATUSES))
        return {s: int(counts[i]) for i, s in enumerate(STATUSES)}

    def identical(self) -> bool:
        return bool((self.status == _EQUAL_CODE).all())

    def nonfinite(self) -> bool:
        """Whether some variable has a NaN or an Inf on a side."""
        return any(bool((self.column(k)[0] > 0).any()) for k in ("nan_a", "nan_b", "inf_a", "inf_b"))

    def sort(self) -> None:
        """Order the rows as the report shows them: status (changed first, equal last), then
        movement, largest ``max_abs_diff``, name (a stable sort: read order breaks ties)."""
        status = self.status
        ranks = self.name_ranks()  # first: its own columns gone before the numbers' are made
        # the columns are 0 where a number is None: movement and biggest made in place in them
        movement, has_rel = self.column("rel_l2")
        biggest = self.column("max_abs_diff")[0]
        movement[~has_rel & (biggest != 0)] = np.inf
        del has_rel
        movement[self.column("nonfinite_mismatch")[0] > 0] = np.inf
        movement[status == _EQUAL_CODE] = 0.0
        np.negative(movement, out=movement)
        np.negative(biggest, out=biggest)
        # lexsort is stable: a key of one value, or names already in entry order, orders nothing
        keys = [k for k in (ranks, biggest, movement, _RANK_OF_CODE[status]) if not _orders_nothing(k, k is ranks)]
        del ranks, biggest, movement
        n = len(status)
        self.order = np.lexsort(keys).astype(_index_dtype(n)) if keys else np.arange(n, dtype=_index_dtype(n))

    def _packed_names(self) -> tuple[bytes, Any, Any]:
        """Every entry's name as UTF-8 in one buffer: the buffer, each name's start and length (a
        table's own buffer when every name is one of A's names)."""
        a = self.a
        if not self.shown and isinstance(a, VariableTable) and bool((self.pos_a >= 0).all()):
            rows = self.pos_a if a.rows is None else a.rows[self.pos_a]
            start, stop = _bounds(a.name_ends, rows)
            del rows
            stop -= start  # the lengths (no third column)
            return a.names, start, stop
        n = len(self.pos_a)
        packed = bytearray()
        ends = np.empty(n, np.int64)
        name = self.name
        for j in range(n):
            packed += name(j).encode("utf-8", "surrogatepass")
            ends[j] = len(packed)
        start = np.concatenate(([0], ends[:-1]))[:n].astype(np.int64)  # no entry: no start
        return bytes(packed), start, ends - start

    def name_ranks(self) -> Any:
        """Each entry's place among the entries sorted by name (Python's string order; ties by entry)."""
        n = len(self.pos_a)
        packed, starts, lengths = self._packed_names()
        widest = int(lengths.max()) if n else 0
        if widest and n * widest <= _NAME_SORT_BYTES and b"\0" not in packed:
            buf = np.frombuffer(packed, np.uint8)
            if all(_names_in_order(buf, starts[max(first - 1, 0):first + _ROWS_AT_ONCE],
                                   lengths[max(first - 1, 0):first + _ROWS_AT_ONCE])
                   for first in range(0, n, _ROWS_AT_ONCE)):  # in order already (no matrix of every name)
                return np.arange(n, dtype=_index_dtype(n))
            keys = _fixed_names(buf, starts, lengths)
            del starts, lengths
            by_name = np.argsort(keys, kind="stable")
        else:
            del starts, lengths
            by_name = np.asarray(sorted(range(n), key=self.name), np.int64)
        ranks = np.empty(n, _index_dtype(n))
        ranks[by_name] = np.arange(n)
        return ranks

    def layers(self) -> tuple[LayerDiff, ...]:
        """Per-layer summaries, layers with the most movement first."""
        if self._layers is None:
            self._layers = _layers_of(self)
        return self._layers

    def moved_layers(self) -> tuple[tuple[LayerDiff, ...], int]:
        """The leading part of :meth:`layers` whose layers have changed variables, and how many
        layers there are: what the table shows, without an object per unchanged layer."""
        if self._layers is not None:
            return tuple(s for s in self._layers if s.changed), len(self._layers)
        if self._moved is None:
            columns = _LayerColumns(self)
            self._moved = (tuple(columns.moved()), len(columns))
        return self._moved


_Fields = tuple[str, str, tuple[int, ...], str, str]  # key, name, shape, dtype, role


def _side_block(side: Sequence[Variable], positions: Any) -> list[_Fields | None]:
    """Key, name, shape, dtype and role of ``side`` at each of ``positions`` (None at -1); a
    table's read from its columns, a block at a time."""
    out: list[_Fields | None] = [None] * len(positions)
    have = np.flatnonzero(positions >= 0)
    at = positions[have]
    if isinstance(side, VariableTable):
        rows = at if side.rows is None else side.rows[at]
        names = _texts(side.names, side.name_ends, rows)
        keys = names if side.keys is None else _texts(side.keys, side.key_ends, rows)
        shapes, dtypes, roles = side.shapes, side.dtypes, side.roles
        for i, key, name, shape, dtype, role in zip(have.tolist(), keys, names, side.shape_codes[rows].tolist(),
                                                   side.dtype_codes[rows].tolist(), side.role_codes[rows].tolist()):
            out[i] = (key, name, shapes[shape], dtypes[dtype], roles[role])
        return out
    for i, p in zip(have.tolist(), at.tolist()):
        v = side[p]
        out[i] = (v.key, v.name, tuple(v.shape), v.dtype, v.role)
    return out


def _orders_nothing(key: Any, rising: bool) -> bool:
    """Whether a sort key leaves a stable sort's order as it is: every value the same, or (when
    ``rising`` may be so) each value above the one before."""
    if len(key) < 2:
        return True
    return bool((key[1:] > key[:-1]).all()) if rising else bool((key == key[0]).all())


def _fixed_names(buf: Any, starts: Any, lengths: Any) -> Any:
    """Names (no NUL in them) as fixed-width bytes (numpy ``S``), which sort as UTF-8 bytes, as
    their code points do."""
    widest = max(int(lengths.max()) if len(lengths) else 0, 1)  # S0 is no type: empty names as one NUL
    fixed = np.zeros((len(starts), widest), np.uint8)
    for column in range(widest):
        has = lengths > column
        fixed[has, column] = buf[starts[has] + column]
    return fixed.view(f"S{widest}").reshape(-1)


def _names_in_order(buf: Any, starts: Any, lengths: Any) -> bool:
    """Whether the names (no NUL in them) are in order, each at most the next."""
    keys = _fixed_names(buf, starts, lengths)
    return bool((keys[1:] >= keys[:-1]).all())


def _bounds(ends: Any, rows: Any) -> tuple[Any, Any]:
    """Start and end offsets of ``rows`` in a packed buffer with ``ends``."""
    start = ends[np.maximum(rows - 1, 0)]
    start[rows == 0] = 0
    return start, ends[rows]


def _texts(buf: bytes, ends: Any, rows: Any) -> list[str]:
    """The strings of ``rows`` in a packed UTF-8 buffer with ``ends``."""
    start, stop = _bounds(ends, rows)
    return [buf[i:j].decode("utf-8", "surrogatepass") for i, j in zip(start.tolist(), stop.tolist())]


class _LayerColumns:
    """Every layer's numbers in columns (a layer is the bytes of a name before its last "/";
    UTF-8 keeps it whole), and each layer's name where one of its entries' names starts: no
    object per layer until one is shown."""

    def __init__(self, rows: DiffRows):
        self.packed, codes, self.start, self.cut = _layer_codes(rows)
        k = len(self.cut)
        self.variables = np.bincount(codes, minlength=k)
        differs = np.flatnonzero(rows.status != _EQUAL_CODE)  # the entries that differ, and their layers
        codes = codes[differs]
        self.changed = np.bincount(codes, minlength=k)
        self.moved_codes = np.flatnonzero(self.changed)  # the layers with changes (their numbers below)
        at = np.searchsorted(self.moved_codes, codes)
        del codes
        self.best = {}
        for field in ("rel_l2", "max_abs_diff"):
            top = np.full(len(self.moved_codes), -np.inf)
            present = np.zeros(len(self.moved_codes), bool)
            if len(differs):
                values, has = rows.column(field)
                values, has = values[differs], has[differs]
                np.maximum.at(top, at[has], values[has])
                present[at[has]] = True
            self.best[field] = (top, present)

    def __len__(self) -> int:
        return len(self.cut)

    def name(self, c: int) -> str:
        start = int(self.start[c])
        return self.packed[start:start + int(self.cut[c])].decode("utf-8", "surrogatepass")

    def layer(self, c: int) -> LayerDiff:
        """Layer ``c``'s summary (the largest movements: of its variables that differ)."""
        i = int(np.searchsorted(self.moved_codes, c))
        moved = i < len(self.moved_codes) and int(self.moved_codes[i]) == c
        rel, abs_ = self.best["rel_l2"], self.best["max_abs_diff"]
        return LayerDiff(layer=self.name(c), variables=int(self.variables[c]), changed=int(self.changed[c]),
                         max_rel_l2=float(rel[0][i]) if moved and rel[1][i] else None,
                         max_abs_diff=float(abs_[0][i]) if moved and abs_[1][i] else None)

    def moved(self) -> list[LayerDiff]:
        """The layers some of whose variables differ, the most movement first (as :func:`_layers_of`)."""
        out = [self.layer(c) for c in self.moved_codes.tolist()]
        out.sort(key=lambda s: (-(s.max_rel_l2 or 0.0), -s.changed, s.layer))
        return out


def _layer_codes(rows: DiffRows) -> tuple[bytes, Any, Any, Any]:
    """The entries' names packed (:meth:`DiffRows._packed_names`), each entry's layer code, and
    where each layer's name starts in them and its length in bytes: the layers told apart by
    their bytes' hashes, each entry's checked against its layer's first (a collision: a dict of
    the layers' bytes instead)."""
    packed, starts, lengths = rows._packed_names()
    n = len(starts)
    hashes = np.empty(n, np.int64)
    cut = np.empty(n, np.int32 if n and int(lengths.max()) <= _INT32_MAX else np.int64)
    for first in range(0, n, _ROWS_AT_ONCE):
        block = slice(first, first + _ROWS_AT_ONCE)
        cuts = [max(packed.rfind(b"/", s, s + size), s) - s
                for s, size in zip(starts[block].tolist(), lengths[block].tolist())]
        cut[block] = cuts
        hashes[block] = [hash(packed[s:s + c]) for s, c in zip(starts[block].tolist(), cuts)]
    del lengths
    order = np.argsort(hashes, kind="stable")  # np.unique's work, with fewer columns of every entry's
    hashes.sort()  # in place: as hashes[order]
    new = np.empty(n, bool)
    new[:1] = True
    np.not_equal(hashes[1:], hashes[:-1], out=new[1:])
    del hashes
    codes = np.empty(n, np.int32)
    codes[order] = np.cumsum(new, dtype=np.int32) - 1
    firsts = order[new]  # the first entry of each layer (the sort is stable)
    del order, new
    cut_of_layer = cut[firsts]
    same = bool((cut == cut_of_layer[codes]).all())
    for first in range(0, n, _ROWS_AT_ONCE):
        if not same:
            break
        block = slice(first, first + _ROWS_AT_ONCE)
        reps = starts[firsts[codes[block]]].tolist()
        same = all(packed[s:s + c] == packed[r:r + c]
                   for s, c, r in zip(starts[block].tolist(), cut[block].tolist(), reps))
    if not same:
        seen: dict[bytes, int] = {}
        for j, (s, c) in enumerate(zip(starts.tolist(), cut.tolist())):
            codes[j] = seen.setdefault(packed[s:s + c], len(seen))
        firsts = np.full(len(seen), n, np.int64)
        np.minimum.at(firsts, codes, np.arange(n))
        cut_of_layer = cut[firsts]
    return packed, codes, starts[firsts], cut_of_layer


def _layers_of(rows: DiffRows) -> tuple[LayerDiff, ...]:
    """Every layer, the moved ones first (:meth:`_LayerColumns.moved`), then the others by name."""
    columns = _LayerColumns(rows)
    moved = columns.moved()
    still = [columns.layer(c) for c in np.flatnonzero(columns.changed == 0).tolist()]
    still.sort(key=lambda s: s.layer)
    return (*moved, *still)


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
        variables: One entry per aligned name, sorted by how much it moved, unchanged last: a
            :class:`DiffRows` (columns; each :class:`VariableDiff` made when asked). Rows given
            as any other sequence are kept as columns in their order.
        notes: What alignment did or could not do (prefixes dropped, positional names, names
            that could not be aligned), one sentence each.
        mapping: The ``--map`` rules applied to A's names, as given.
        layout: The layout rules in force, as the options naming them (``--transpose-dense``,
            ``--conv-layout oihw``).
    """

    a: str
    b: str
    format_a: str
    format_b: str
    atol: float
    rtol: float
    role: str | None
    alignment: str
    variables: Sequence[VariableDiff]
    notes: tuple[str, ...] = ()
    mapping: tuple[str, ...] = ()
    layout: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.variables, DiffRows):  # rows given one by one: their columns
            object.__setattr__(self, "variables", DiffRows.of(self.variables))

    @property
    def identical(self) -> bool:
        """True when every variable is equal within the tolerance (and none is added/removed)."""
        return self.variables.identical()  # type: ignore[attr-defined]

    @property
    def summary(self) -> dict[str, int]:
        """Count per status."""
        return self.variables.summary()  # type: ignore[attr-defined]

    @property
    def has_nonfinite(self) -> bool:
        """True when some variable has a NaN or an Inf on a side."""
        return self.variables.nonfinite()  # type: ignore[attr-defined]

    @property
    def layers(self) -> tuple[LayerDiff, ...]:
        """Per-layer summaries, layers with the most movement first."""
        return self.variables.layers()  # type: ignore[attr-defined]

    @property
    def moved_layers(self) -> tuple[tuple[LayerDiff, ...], int]:
        """The layers with changed variables (the start of :attr:`layers`) and how many layers
        there are, without the unchanged layers' summaries (the table's footer)."""
        return self.variables.moved_layers()  # type: ignore[attr-defined]

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

    def to_dict(self, variables: bool = True) -> dict[str, Any]:
        """The ``diff --format json`` document (see shared/INTERFACE.md); ``variables=False``:
        with an empty ``variables`` list, for a caller writing them one at a time."""
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
            "layout": list(self.layout),
            "notes": list(self.notes),
            "variables": [v.to_dict() for v in self.variables] if variables else [],
            "summary": self.summary,
            "layers": [s.to_dict() for s in self.layers],
            "verdict": self.verdict,
        }


def _num(x: float) -> str:
    return f"{x:g}"


# -- the operation --------------------------------------------------------------------------------
# One aligned entry, as the comparing threads see it: (its index, variable of A or None, variable of
# B or None, how it was matched).
_Entry = tuple[int, "Variable | None", "Variable | None", "str | None"]


def _entry_rows(alignment: Match, va_list: Sequence[Variable], vb_list: Sequence[Variable]) -> DiffRows:
    """The aligned variables as columns (pairs in the order made, then A's, then B's leftovers):
    positions into the two sides, how each pair was made, the names aligned on where they are
    not the variable's own. Pairs a key join made stay index arrays."""
    pairs = alignment.pairs
    joined = pairs if isinstance(pairs, KeyPairs) else None
    rest = joined.rest if joined is not None else tuple(pairs)
    first = len(joined.rows_a) if joined is not None else 0
    n = first + len(rest) + len(alignment.only_a) + len(alignment.only_b)
    dtype = np.int32 if max(len(va_list), len(vb_list)) < (1 << 31) else np.int64
    hows: dict[str, int] = {}
    shown: dict[int, str] = {}
    how = np.full(n, -1, np.int8)
    if joined is not None and n == first:  # every entry a key pair (diff X X): the join's arrays
        how[:] = hows.setdefault(HOW_KEY, len(hows))
        return DiffRows(va_list, vb_list, joined.rows_a.astype(dtype, copy=False),
                        joined.rows_b.astype(dtype, copy=False), how, list(hows), shown)
    pos_a = np.full(n, -1, dtype)
    pos_b = np.full(n, -1, dtype)
    if joined is not None:
        pos_a[:first] = joined.rows_a
        pos_b[:first] = joined.rows_b
        how[:first] = hows.setdefault(HOW_KEY, len(hows))
    j = first
    for p in rest:
        pos_a[j], pos_b[j] = p.a.index, p.b.index
        how[j] = hows.setdefault(p.how, len(hows))
        if p.name != p.a.name:
            shown[j] = p.name
        j += 1
    for x in alignment.only_a:
        pos_a[j] = x.index
        j += 1
    for y in alignment.only_b:
        pos_b[j] = y.index
        j += 1
    return DiffRows(va_list, vb_list, pos_a, pos_b, how, list(hows), shown)


def _read_order(rows: DiffRows, ca: Checkpoint, cb: Checkpoint) -> Any:
    """The entries in the order A's bytes lie on disk (B's for variables only B has), then by key
    (None: in that order already): each entry's storage order kept as a row of ints where it is
    one (a sort without a tuple per variable), else as tuples."""
    n = len(rows.pos_a)
    a, b, pos_a, pos_b = rows.a, rows.b, rows.pos_a, rows.pos_b

    def variable(j: int) -> tuple[Variable, Checkpoint]:
        pa = int(pos_a[j])
        return (a[pa], ca) if pa >= 0 else (b[int(pos_b[j])], cb)

    def key(j: int) -> tuple:
        v, c = variable(j)
        return (c.storage_order(v), v.key)

    columns: Any = None
    for first in range(0, n, _ROWS_AT_ONCE):
        block = slice(first, first + _ROWS_AT_ONCE)
        places = [ca.storage_order(a[pa]) if pa >= 0 else cb.storage_order(b[pb])
                  for pa, pb in zip(pos_a[block].tolist(), pos_b[block].tolist())]
        if columns is None:
            columns = np.empty((n, len(places[0])), np.int64)
        width = columns.shape[1]
        if not all(len(place) == width and all(type(x) is int for x in place) for place in places):
            return np.asarray(sorted(range(n), key=key), np.int64)  # not ints: sorted as tuples
        try:
            columns[block] = np.array(places, np.int64).reshape(len(places), width)
        except OverflowError:
            return np.asarray(sorted(range(n), key=key), np.int64)
    if columns is None:
        return None
    if columns.shape[1] and n > 1:  # in order already (each place after the one before): as they are
        after = np.zeros(n - 1, bool)
        tied = np.ones(n - 1, bool)
        for c in range(columns.shape[1]):
            x = columns[:, c]
            after |= tied & (x[1:] > x[:-1])
            tied &= x[1:] == x[:-1]
        if after.all():
            return None
        del after, tied
    order = np.lexsort(columns.T[::-1]) if columns.shape[1] else np.arange(n, dtype=np.int64)
    placed = columns[order]
    del columns
    tied = (placed[1:] == placed[:-1]).all(axis=1) if n > 1 else np.zeros(0, bool)
    del placed
    if tied.any():  # the same place: by key (stable), run by run
        edges = np.flatnonzero(np.diff(np.concatenate(([0], tied.astype(np.int8), [0]))))
        for start, stop in zip(edges[::2].tolist(), edges[1::2].tolist()):
            run = order[start:stop + 1].tolist()
            order[start:stop + 1] = sorted(run, key=lambda j: variable(j)[0].key)
    return order


def _in_order(rows: DiffRows, order: Any) -> DiffRows:
    """``rows``' entries permuted to ``order`` (None: as they are), one column at a time."""
    if order is None:
        return rows
    if rows.shown:
        inverse = np.empty(len(order), np.int64)
        inverse[order] = np.arange(len(order))
        rows.shown = {int(inverse[j]): name for j, name in rows.shown.items()}
    same = rows.pos_b is rows.pos_a
    rows.pos_a = rows.pos_a[order]
    rows.pos_b = rows.pos_a if same else rows.pos_b[order]
    rows.how = rows.how[order]
    return rows


def _variables(ckpt: Checkpoint, role: str | None) -> Sequence[Variable]:
    """``ckpt``'s variables of ``role`` (all for None), in order: a table stays a table (a view)."""
    table = ckpt.variables
    if isinstance(table, VariableTable):
        if role is None:
            return table
        codes = [i for i, r in enumerate(table.roles) if r == role]
        rows = table.positions()
        return table.view(rows[np.isin(table.role_codes[rows], codes)])
    return ckpt.filter(role=role)


def diff(
    a: str | os.PathLike[str] | Checkpoint,
    b: str | os.PathLike[str] | Checkpoint,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
    role: str | None = None,
    mapping: Mapping[str, str] | Iterable[str | tuple[str, str]] | None = None,
    progress: Progress | None = None,
    optimizer_pattern: str | None = None,
    transpose_dense: bool = False,
    conv_layout: str = CONV_HWIO,
) -> DiffReport:
    """Compare two checkpoints, of the same or of different formats.

    Args:
        a: Checkpoint A: any path :func:`ckptinspect.open` accepts, or an open
            :class:`~ckptinspect.Checkpoint` (left open).
        b: Checkpoint B, likewise.
        atol: Absolute tolerance (>= 0).
        rtol: Relative tolerance (>= 0), relative to B's magnitude as in numpy ``isclose``.
        role: Compare only variables of this role (``model``, ``optimizer``, ``metadata``).
        mapping: ``--map`` rules rewriting A's names before aligning: ``"REGEX=REPLACEMENT"``
            strings, ``(regex, replacement)`` pairs or a dict; every rule applies, in order, to
            every name (docs/INTERFACE.md, "Pairing variables"). Forces alignment by name.
        progress: Called as ``progress(done, total, variable_diff)`` after each variable.
        optimizer_pattern: Regex of names (or keys) to treat as optimizer state on both sides
            (see :func:`ckptinspect.ops.roles.mark_optimizer`), before ``role`` filters.
        transpose_dense: A's 2-D kernels are ``[out, in]`` (PyTorch ``Linear``): compared
            transposed with B's ``[in, out]`` kernels (docs/INTERFACE.md, "Pairing variables").
        conv_layout: ``oihw`` when A's conv kernels are ``[out, in, *spatial]`` (PyTorch): compared
            with B's HWIO kernels with their axes reordered. Either rule aligns by name, and
            pairs what names leave by layer and leaf spelling (``weight``/``kernel``...).

    Returns:
        A :class:`DiffReport`; ``report.identical`` is the verdict.

    Raises:
        UsageError: Bad tolerance, role or mapping.
        CkptError: A checkpoint cannot be opened or read.
    """
    _check_arguments(atol, rtol, role)
    rules = parse_mapping(mapping)  # fail on bad rules before opening anything
    layout = Layout(transpose_dense=transpose_dense, conv_layout=conv_layout)
    optimizer_regex(optimizer_pattern)

    opened: list[Checkpoint] = []
    try:
        ca = mark_optimizer(_open(a, opened), optimizer_pattern)
        # The same path twice is opened once: a directory resolves to one checkpoint, even while
        # another process rotates checkpoints in it.
        cb = ca if _same_path(a, b) else mark_optimizer(_open(b, opened), optimizer_pattern)
        rows, method, notes = _aligned_rows(ca, cb, role, rules, layout, optimizer_pattern)
        fits, layout_notes = _layout_fits(rows, layout)
        notes += layout_notes
        _compare(rows, ca, cb, fits, float(atol), float(rtol), progress)
        rows.sort()
        return DiffReport(
            a=ca.path,
            b=cb.path,
            format_a=ca.format,
            format_b=cb.format,
            atol=float(atol),
            rtol=float(rtol),
            role=role,
            alignment=method,
            variables=rows,
            notes=tuple(notes),
            mapping=rules_text(mapping),
            layout=layout.describe(),
        )
    finally:
        for c in opened:
            c.close()


def _aligned_rows(ca: Checkpoint, cb: Checkpoint, role: str | None, rules: Rules, layout: Layout,
                  optimizer_pattern: str | None) -> tuple[DiffRows, str, list[str]]:
    """Both sides' variables (of ``role``) paired by the matcher into rows in read order, how
    they were aligned, and the notes so far."""
    va_list = _variables(ca, role)
    vb_list = va_list if cb is ca else _variables(cb, role)  # X X: one list (a table makes new objects)
    keras = all(KERAS_LAYOUT in capabilities(c.format) for c in (ca, cb))
    alignment = align(va_list, vb_list, same_format=ca.format == cb.format, mapping=rules, layout=layout, keras=keras)
    notes = _notes(ca, cb, alignment, optimizer_pattern)
    if role is not None and not va_list and not vb_list:
        notes.append(f"neither checkpoint has {role}-role variables")
    rows = _entry_rows(alignment, va_list, vb_list)
    method = alignment.method
    del alignment
    return _in_order(rows, _read_order(rows, ca, cb)), method, notes


def _check_arguments(atol: float, rtol: float, role: str | None) -> None:
    """Refuse a tolerance that is not a finite number >= 0, or an unknown role."""
    for label, value in (("atol", atol), ("rtol", rtol)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise UsageError(f"{label} must be a finite number >= 0. Received: {label}={value!r}")
    if role is not None and role not in ROLES:
        raise UsageError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")


def _notes(ca: Checkpoint, cb: Checkpoint, alignment: Match, optimizer_pattern: str | None) -> list[str]:
    """The report's first notes: each side's warnings (once when A and B are one checkpoint),
    the alignment's, and what ``--optimizer-pattern`` marked on each side."""
    sides = (("A", ca),) if cb is ca else (("A", ca), ("B", cb))
    notes = [f"{side}: {w}" for side, c in sides for w in c.info.get("warnings", ())]
    notes += alignment.notes
    if optimizer_pattern:
        marked = [c.info.get(OPTIMIZER_PATTERN_INFO, {}).get("marked", 0) for c in (ca, cb)]
        notes.append(f"--optimizer-pattern {optimizer_pattern!r} marked {marked[0]} variable(s) of A and"
                     f" {marked[1]} of B as optimizer state")
    return notes


def _pairs(rows: DiffRows) -> Iterator[tuple[Variable, Variable]]:
    """The variables of every entry both sides have."""
    for first in range(0, len(rows.pos_a), _ROWS_AT_ONCE):
        block = slice(first, first + _ROWS_AT_ONCE)
        for pa, pb in zip(rows.pos_a[block].tolist(), rows.pos_b[block].tolist()):
            if pa >= 0 and pb >= 0:
                yield rows.a[pa], rows.b[pb]


def _layout_fits(rows: DiffRows, layout: Layout) -> tuple[dict[str, tuple[Variable, Any]], list[str]]:
    """The pairs whose values the layout rules rearrange (A's key -> (A's variable, the fit))
    and the notes: what was rearranged, and how many pairs fit the rules only with A and B
    swapped."""
    notes: list[str] = []
    if layout.plain:  # no rule: nothing to rearrange
        return {}, notes
    fits = {va.key: (va, f) for va, vb in _pairs(rows) if (f := pair_fit(va, vb, layout)) is not None}
    if fits:
        notes.append(_layout_note(fits))
    backwards = sum(1 for va, vb in _pairs(rows) if fits_reversed(va, vb, layout))
    if backwards:
        notes.append(f"{backwards} pair(s) fit the layout rules the other way round: the rules describe A's"
                     " layout (A is the PyTorch side, B the Keras one); swap A and B")
    return fits, notes


def _entries(rows: DiffRows) -> Iterator[_Entry]:
    """Each entry's index, variables and how it was paired, in read order (made as the comparing
    threads ask for them)."""
    hows = rows.hows
    a, b = rows.a, rows.b
    for first in range(0, len(rows.pos_a), _ROWS_AT_ONCE):  # a block of positions at a time: no list of a million
        block = slice(first, first + _ROWS_AT_ONCE)
        for j, pa, pb, how in zip(range(first, first + _ROWS_AT_ONCE), rows.pos_a[block].tolist(),
                                  rows.pos_b[block].tolist(), rows.how[block].tolist()):
            va = a[pa] if pa >= 0 else None
            vb = (va if b is a and pb == pa else b[pb]) if pb >= 0 else None  # X X: one variable
            yield (j, va, vb, hows[how] if how >= 0 else None)


def _compare(rows: DiffRows, ca: Checkpoint, cb: Checkpoint, fits: dict[str, tuple[Variable, Any]],
             atol: float, rtol: float, progress: Progress | None) -> None:
    """Every entry compared, in read order (A's values rearranged where they fit the layout
    rules), its results kept in ``rows``. Two batches of variables are compared at a time when
    both formats allow concurrent reads (each variable is compared whole by one thread, so its
    numbers do not depend on the threads); results and progress come in read order. A batch of
    small values only is compared in the calling thread (:func:`_small`)."""
    source_a = RearrangedSource(ca, fits) if fits else ca
    shown = rows.shown

    def batch(group: list[_Entry]) -> list[tuple[int, VariableDiff]]:
        return [(j, _diff_one(_name(shown.get(j), va, vb), how, source_a, va, cb, vb, atol, rtol, fits))
                for j, va, vb, how in group]

    workers = None if _concurrent(ca) and _concurrent(cb) else 1
    total = len(rows.pos_a)
    done = 0
    for results in ordered_map(batch, _batches(_entries(rows)), workers=workers, ahead=BATCHES_AHEAD, inline=_small):
        for j, row in results:
            rows.store(j, row)
            done += 1
            if progress is not None:
                progress(done, total, row)


def _name(shown: str | None, va: Variable | None, vb: Variable | None) -> str:
    """The name an entry was aligned on: ``shown``, else its own (A's, else B's)."""
    if shown is not None:
        return shown
    return va.name if va is not None else vb.name  # type: ignore[union-attr]


def _batches(entries: Iterable[_Entry]) -> Iterator[list[_Entry]]:
    """Consecutive entries in groups of about :data:`BATCH_BYTES` (at most
    :data:`BATCH_VARIABLES`): one hand-off between threads per group, not per variable."""
    group: list[_Entry] = []
    nbytes = 0
    for entry in entries:
        group.append(entry)
        va, vb = entry[1], entry[2]
        nbytes += max(va.nbytes if va is not None else 0, vb.nbytes if vb is not None else 0)
        if nbytes >= BATCH_BYTES or len(group) >= BATCH_VARIABLES:
            yield group
            group, nbytes = [], 0
    if group:
        yield group


def _small(group: list[_Entry]) -> bool:
    """Whether every value of the batch is under :data:`ckptinspect._parallel.THREAD_MIN_BYTES`."""
    return all((va is None or va.nbytes < THREAD_MIN_BYTES) and (vb is None or vb.nbytes < THREAD_MIN_BYTES)
               for _, va, vb, _ in group)


def _concurrent(ckpt: Checkpoint) -> bool:
    """Whether ``ckpt``'s values may be read from several threads at once."""
    return bool(getattr(ckpt.source, "concurrent_reads", False))


def _same_path(a: Any, b: Any) -> bool:
    """True when ``a`` and ``b`` are two spellings of one path (or one open checkpoint)."""
    if isinstance(a, Checkpoint) or isinstance(b, Checkpoint):
        return a is b
    a, b = os.fspath(a), os.fspath(b)
    if "://" in a or "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def _open(path_or_ckpt: Any, opened: list[Checkpoint]) -> Checkpoint:
    if isinstance(path_or_ckpt, Checkpoint):
        return path_or_ckpt
    from ...formats import open_checkpoint  # noqa: PLC0415

    ckpt = open_checkpoint(os.fspath(path_or_ckpt))
    opened.append(ckpt)
    return ckpt


def _layout_note(fits: Mapping[str, tuple[Variable, Any]]) -> str:
    kinds = collections.Counter(f.kind for _, f in fits.values())
    parts = ", ".join(f"{n} {kind}d" for kind, n in sorted(kinds.items()))
    return f"{len(fits)} variable(s) of A compared in B's layout by the layout rules ({parts})"


def _diff_one(
    name: str, how: str | None, ca: Any, va: Variable | None, cb: Checkpoint, vb: Variable | None, atol: float, rtol: float,
    fits: Mapping[str, tuple[Variable, Any]],
) -> VariableDiff:
    if va is None or vb is None:
        common = {
            "name": name,
            "key_a": va.key if va else None,
            "key_b": vb.key if vb else None,
            "name_a": va.name if va else None,
            "name_b": vb.name if vb else None,
            "role": (va or vb).role,
            "matched_by": how,
            "shape_a": tuple(va.shape) if va else None,
            "shape_b": tuple(vb.shape) if vb else None,
            "dtype_a": va.dtype if va else None,
            "dtype_b": vb.dtype if vb else None,
        }
        return VariableDiff(status=STATUS_ADDED if va is None else STATUS_REMOVED, **common)
    # Both sides (every variable of most diffs): the fields in their order, positionally.
    key_a, name_a, shape_a, dtype_a = va.key, va.name, tuple(va.shape), va.dtype
    layout = None
    fitted = fits.get(key_a) if fits else None
    if fitted is not None:
        layout = fitted[1].describe()
        va = RearrangedSource.view(va, fitted[1])
    r = compare_variables(ca, va, cb, vb, atol=atol, rtol=rtol)
    get = r.get
    return VariableDiff(name, key_a, vb.key, r["status"], name_a, vb.name, va.role, how, shape_a, tuple(vb.shape),
                        dtype_a, vb.dtype, get("max_abs_diff"), get("rel_l2"), get("cosine"), get("num_different"),
                        get("nan_a"), get("inf_a"), get("nan_b"), get("inf_b"), get("nonfinite_mismatch"), layout)
