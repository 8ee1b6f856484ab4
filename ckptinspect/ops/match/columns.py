"""The ``key`` stage on columns: two :class:`~ckptinspect.VariableTable` sides joined on their
packed keys, without a record per variable (a checkpoint of a million tensors).

:func:`key_join` pairs what the ``key`` stage (:data:`ckptinspect.ops.match.stages.KEY`) pairs:
each variable of A whose key is unique on A's side with the one variable of B that has that
key, in A's order. Keys are hashed (Python's ``hash`` of their UTF-8 bytes), sorted, and every
hash hit is confirmed on the bytes, so colliding hashes never pair two different keys.
:class:`KeyPairs` carries the result as two index arrays: a ``Sequence`` of
:class:`~ckptinspect.ops.match.stages.Pair` that makes each pair when asked, followed by the
pairs the later stages made from what the join left.
"""

from __future__ import annotations

import collections
from typing import Any, Iterator, Sequence, overload

import numpy as np

from ... import model as m
from ...formats import ATTRIBUTES_MARK
from .stages import HOW_KEY, Item, Pair

__all__ = ["KeyPairs", "key_join", "items_at", "keys_are_plain_names"]

CHUNK = 1 << 12  # keys hashed and compared this many at a time (no list of many ints, no big gather)


def _key_columns(table: m.VariableTable) -> tuple[bytes, Any]:
    """The packed key bytes of ``table``'s columns and their end offsets."""
    return (table.names, table.name_ends) if table.keys is None else (table.keys, table.key_ends)


def _bounds(ends: Any, rows: Any) -> tuple[Any, Any]:
    """Start and end offsets of ``rows`` in a packed buffer with ``ends``."""
    stop = ends[rows]
    start = np.where(rows > 0, ends[np.maximum(rows - 1, 0)], 0)
    return start, stop


def _hashes(buf: bytes, start: Any, stop: Any) -> Any:
    """``hash`` of each key's bytes (int64)."""
    s, e = start.tolist(), stop.tolist()
    return np.fromiter(map(hash, map(buf.__getitem__, map(slice, s, e))), np.int64, len(s))


def _index(n: int) -> Any:
    """The smallest integer type of positions below ``n`` (int32 up to two thousand million)."""
    return np.int32 if n < (1 << 31) else np.int64


class _Side:
    """One side's keys: its rows of the columns, hashes sorted, which keys are unique (offsets
    are read from the columns a chunk at a time, not held)."""

    def __init__(self, table: m.VariableTable):
        self.rows = table.rows  # None: the columns in order
        self.n = len(table)
        self.buf, self.ends = _key_columns(table)
        hashes = np.empty(self.n, np.int64)
        for i in range(0, self.n, CHUNK):
            start, stop = self.bounds(np.arange(i, min(i + CHUNK, self.n)))
            hashes[i:i + len(start)] = _hashes(self.buf, start, stop)
        self.order = np.argsort(hashes, kind="stable").astype(_index(self.n))
        self.sorted = hashes[self.order]
        del hashes
        self.unique = np.ones(self.n, bool)
        same = self.sorted[1:] == self.sorted[:-1]
        shared = np.zeros(self.n, bool)
        shared[1:] |= same
        shared[:-1] |= same
        del same
        if shared.any():  # equal hashes: equal keys, or a collision; the bytes decide
            positions = self.order[shared].tolist()
            counts = collections.Counter(map(self.key, positions))
            for p in positions:
                self.unique[p] = counts[self.key(p)] == 1

    def bounds(self, positions: Any) -> tuple[Any, Any]:
        """Start and end offsets of the keys at ``positions``."""
        return _bounds(self.ends, positions if self.rows is None else self.rows[positions])

    def hashes(self, positions: Any) -> Any:
        """The hashes of the keys at ``positions``."""
        out = np.empty(self.n, np.int64)
        out[self.order] = self.sorted
        return out[positions]

    def key(self, p: int) -> bytes:
        start, stop = self.bounds(np.array([p]))
        return self.buf[int(start[0]):int(stop[0])]


def _equal_keys(sa: _Side, pa: Any, sb: _Side, pb: Any) -> Any:
    """Whether the key of each position ``pa`` of A has the same bytes as that of ``pb`` of B."""
    out = np.zeros(len(pa), bool)
    ua = np.frombuffer(sa.buf, np.uint8)
    ub = ua if sb.buf is sa.buf else np.frombuffer(sb.buf, np.uint8)
    for i in range(0, len(pa), CHUNK):
        qa, qb = pa[i:i + CHUNK], pb[i:i + CHUNK]
        a0, a1 = sa.bounds(qa)
        b0, b1 = sb.bounds(qb)
        length = a1 - a0
        ok = length == b1 - b0
        look = ok & (a0 != b0) if sb.buf is sa.buf else ok.copy()  # the same bytes: equal unlooked
        for n in np.unique(length[look]).tolist():
            sel = np.flatnonzero(look & (length == n))
            if n:
                span = np.arange(n)
                ok[sel] = (ua[a0[sel, None] + span] == ub[b0[sel, None] + span]).all(axis=1)
        out[i:i + len(qa)] = ok
    return out


def key_join(a: m.VariableTable, b: m.VariableTable) -> tuple[Any, Any, Any, Any]:
    """The ``key`` stage on two tables (positions are the tables' own: ``Item.index``).

    Returns:
        ``(pairs_a, pairs_b, free_a, free_b)``: the positions paired (A's ascending, with B's
        partner of each), then each side's unpaired positions in order (int32 arrays, int64
        past two thousand million).
    """
    sa = _Side(a)
    n_a = sa.n
    if b is a:  # one table twice (diff X X): each unique key with itself
        pa = np.flatnonzero(sa.unique).astype(_index(n_a))
        free = np.flatnonzero(~sa.unique).astype(_index(n_a))
        return pa, pa, free, free
    sb = _Side(b)
    n_b = sb.n
    want = np.flatnonzero(sa.unique)
    wanted = sa.hashes(want)
    lo = np.searchsorted(sb.sorted, wanted, "left")
    hi = np.searchsorted(sb.sorted, wanted, "right")
    del wanted
    single = hi - lo == 1
    pa = want[single]
    pb = sb.order[lo[single]]
    pa, pb = pa[(keep := _equal_keys(sa, pa, sb, pb))], pb[keep]
    several = np.flatnonzero(hi - lo > 1)
    if len(several):  # B has keys of one hash more than once: compared one by one
        extra_a, extra_b = [], []
        for j in several.tolist():
            p = int(want[j])
            key = sa.key(p)
            found = [q for q in sb.order[lo[j]:hi[j]].tolist() if sb.key(q) == key]
            if len(found) == 1:
                extra_a.append(p)
                extra_b.append(found[0])
        if extra_a:
            pa = np.concatenate([pa, np.asarray(extra_a, np.int64)])
            pb = np.concatenate([pb, np.asarray(extra_b, np.int64)])
            order = np.argsort(pa, kind="stable")
            pa, pb = pa[order], pb[order]
    paired_a = np.zeros(n_a, bool)
    paired_a[pa] = True
    paired_b = np.zeros(n_b, bool)
    paired_b[pb] = True
    return (pa.astype(_index(n_a)), pb.astype(_index(n_b)), np.flatnonzero(~paired_a).astype(_index(n_a)),
            np.flatnonzero(~paired_b).astype(_index(n_b)))


def item_of(variables: Sequence[Any], i: int) -> Item:
    """The :class:`Item` of ``variables[i]``, as :func:`ckptinspect.ops.match.matcher.items` makes it."""
    v = variables[i]
    return Item(v.key, v.name, tuple(v.shape), v.dtype, getattr(v, "role", m.ROLE_MODEL), getattr(v, "graph_path", None),
                i, (), v)


def items_at(variables: Sequence[Any], positions: Any) -> list[Item]:
    """Items of ``variables`` at ``positions`` (their indices the positions)."""
    return [item_of(variables, i) for i in positions.tolist()]


def keys_are_plain_names(table: m.VariableTable) -> bool:
    """True when every key of ``table`` is its name and every name is its own normalised name
    (no ``:N`` suffix, no ``/.ATTRIBUTES/``, no outer slash): then pairing by name pairs
    exactly what pairing by key pairs."""
    if table.keys is not None or b":" in table.names or ATTRIBUTES_MARK.encode() in table.names:
        return False
    rows = table.positions()
    start, stop = _bounds(table.name_ends, rows)
    buf = np.frombuffer(table.names, np.uint8)
    filled = stop > start
    slash = ord("/")
    return not (buf[start[filled]] == slash).any() and not (buf[stop[filled] - 1] == slash).any()


class KeyPairs(m.LazySequence[Pair]):
    """The pairs of :func:`key_join` (A's positions ``rows_a``, B's ``rows_b``), each
    :class:`Pair` made when asked, then ``rest``: the pairs later stages made.

    Attributes:
        a: A's variables (a :class:`~ckptinspect.VariableTable`).
        b: B's variables.
        rows_a: Positions of A paired by key, ascending.
        rows_b: B's partner of each.
        rest: The later stages' pairs, in order.
    """

    _ITEM = "pair"

    def __init__(self, a: Sequence[Any], b: Sequence[Any], rows_a: Any, rows_b: Any, rest: Sequence[Pair] = ()):
        self.a, self.b = a, b
        self.rows_a, self.rows_b = rows_a, rows_b
        self.rest = tuple(rest)

    def __len__(self) -> int:
        return len(self.rows_a) + len(self.rest)

    def _pair(self, i: int) -> Pair:
        if i >= len(self.rows_a):
            return self.rest[i - len(self.rows_a)]
        x = item_of(self.a, int(self.rows_a[i]))
        return Pair(x, item_of(self.b, int(self.rows_b[i])), HOW_KEY, x.name)

    @overload
    def __getitem__(self, i: int) -> Pair: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[Pair]: ...

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return tuple(self._pair(j) for j in range(*i.indices(len(self))))
        return self._pair(self._position(i))

    def __iter__(self) -> Iterator[Pair]:
        return map(self._pair, range(len(self)))

    def __repr__(self) -> str:
        return f"<KeyPairs: {len(self.rows_a)} by key, {len(self.rest)} more>"

    def count_how(self, how: str) -> int:
        """The number of pairs made ``how`` (no pair made for it)."""
        return (len(self.rows_a) if how == HOW_KEY else 0) + sum(1 for p in self.rest if p.how == how)
