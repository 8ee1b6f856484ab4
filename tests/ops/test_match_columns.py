"""The key stage as a join on two VariableTables' packed keys (ops/match/columns.py) against the
Item path: the same pairs, how, leftovers, ambiguities, notes and method, in the same order."""

from __future__ import annotations

import dataclasses
import random
import tracemalloc

import numpy as np
import pytest

from ckptinspect.model import Variable, VariableTable
from ckptinspect.ops.match import columns
from ckptinspect.ops.match.columns import KeyPairs, key_join
from ckptinspect.ops.match.matcher import HOW_KEY, align, items

# keys other people write: non-ASCII, Keras positional, TF wrappers, :0 suffixes, outer slashes, empty
STEMS = ["a", "b/c", "caf\u00e9/x", "\u4e2d/w", "\U0001f600", "dense/kernel:0", "x/vars/0", "x/vars/1",
         "m/x/.ATTRIBUTES/VARIABLE_VALUE", "pre/a", "/pre/b/c", "", "opt/y", "e\u0301"]


def _variables(rng: random.Random, n: int, pool: list[str], rename: bool) -> list[Variable]:
    out = []
    for _ in range(n):
        key = rng.choice(pool)  # drawn with replacement: keys repeat on a side
        name = key.upper() if rename else key
        out.append(Variable(key=key, name=name, shape=(rng.randint(1, 3),), dtype=rng.choice(["float32", "int8"]),
                            nbytes=4, role=rng.choice(["model", "optimizer"])))
    return out


def _same(by_items, by_columns) -> None:
    assert tuple(by_columns.pairs) == tuple(by_items.pairs)
    assert by_columns.only_a == by_items.only_a and by_columns.only_b == by_items.only_b
    assert by_columns.ambiguous == by_items.ambiguous
    assert by_columns.notes == by_items.notes and by_columns.method == by_items.method
    assert by_columns.count(HOW_KEY) == by_items.count(HOW_KEY)


def _cases(seed: int, count: int):
    rng = random.Random(seed)
    for _ in range(count):
        pool = [rng.choice(STEMS) + str(rng.randint(0, 6)) for _ in range(rng.randint(1, 30))]
        rename = rng.random() < 0.3  # keys that are not the names
        a = _variables(rng, rng.randint(0, 25), pool, rename)
        b = _variables(rng, rng.randint(0, 25), pool, rename and rng.random() < 0.5)
        yield a, b


@pytest.mark.parametrize("collide", [False, True], ids=["hashes", "colliding-hashes"])
def test_the_join_pairs_what_the_item_path_pairs(collide, monkeypatch):
    if collide:  # every key in one of three hash buckets: hits the bytes must refuse
        real = columns._hashes
        monkeypatch.setattr(columns, "_hashes", lambda buf, start, stop: real(buf, start, stop) % 3)
    checked = 0
    for a, b in _cases(7 + collide, 150):
        ta, tb = VariableTable.from_variables(a), VariableTable.from_variables(b)
        for x, y, tx, ty in ((a, b, ta, tb), (b, a, tb, ta), (a, a, ta, ta)):
            by_columns = align(tx, ty, same_format=True)
            assert isinstance(by_columns.pairs, KeyPairs)
            _same(align(x, y, same_format=True), by_columns)
            checked += len(by_columns.pairs)
        # views (what --role leaves of a table): positions of the view, not of the columns
        rows = np.flatnonzero(ta.role_codes == 0)
        view = ta.view(rows)
        _same(align(list(view), b, same_format=True), align(view, tb, same_format=True))
    assert checked > 500


def test_keys_on_one_side_only_and_repeated_keys():
    a = [Variable(k, k, (1,), "float32", 4) for k in ["k\u00e9", "dup", "dup", "only_a", "both"]]
    b = [Variable(k, k, (1,), "float32", 4) for k in ["both", "only_b", "k\u00e9", "dup"]]
    ta, tb = VariableTable.from_variables(a), VariableTable.from_variables(b)
    pairs_a, pairs_b, free_a, free_b = key_join(ta, tb)
    assert pairs_a.tolist() == [0, 4] and pairs_b.tolist() == [2, 0]  # A's order; a repeated key pairs nothing
    assert free_a.tolist() == [1, 2, 3] and free_b.tolist() == [1, 3]
    _same(align(a, b, same_format=True), align(ta, tb, same_format=True))


def test_key_pairs_is_a_sequence_of_pairs():
    a = [Variable(f"v{i}", f"v{i}", (i + 1,), "float32", 4) for i in range(5)]
    table = VariableTable.from_variables(a)
    found = align(table, table, same_format=True)
    expected = align(a, a, same_format=True).pairs
    pairs = found.pairs
    assert len(pairs) == 5 and pairs[-1] == expected[-1] and pairs[1:3] == expected[1:3]
    assert pairs == expected and list(pairs) == list(expected)
    assert pairs[0].a == items(a)[0] and pairs[0].how == HOW_KEY
    with pytest.raises(IndexError):
        pairs[5]


def test_a_join_of_many_keys_makes_no_record_per_key():
    n = 60_000
    table = VariableTable.from_variables(Variable(f"layer{i // 100}/w{i}", f"layer{i // 100}/w{i}", (1,), "float32", 4)
                                         for i in range(n))
    other = VariableTable.from_variables(dataclasses.replace(v, key=v.key + "x" * (i % 2), name=v.name + "x" * (i % 2))
                                         for i, v in enumerate(table))
    tracemalloc.start()
    try:
        found = align(table, table, same_format=True)
        _, x_x = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        half = align(table, other, same_format=True)
        _, halves = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found.matched == n and found.count(HOW_KEY) == n and not found.only_a
    assert half.count(HOW_KEY) == n // 2 and len(half.only_a) == n // 2
    # Items and Pairs: ~570 bytes a variable (~910 with half the keys different); the join: its
    # arrays and a chunk of offsets (~130), the Items of what it leaves (half of each side)
    assert x_x < 200 * n, x_x
    assert halves < 750 * n, halves
