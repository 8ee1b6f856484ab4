"""diff's results as columns (DiffRows): the rows made when asked are the rows the report held,
in the same order, with the same summary, layers and verdict; a diff of tables holds no object
per variable."""

from __future__ import annotations

import dataclasses
import math
import pathlib
import tracemalloc

import numpy as np
import pytest
from click.testing import CliRunner

import ckptinspect
from ckptinspect.cli import app
from columns_switch import use_columns
from ckptinspect.formats.safetensors import file as safetensors_file
from ckptinspect.model import Variable, VariableTable
from ckptinspect.ops.diff import operation
from ckptinspect.ops.diff.operation import DiffReport, DiffRows, VariableDiff

safetensors_numpy = pytest.importorskip("safetensors.numpy")
runner = CliRunner()

# Table order before the columns: status, then movement, then max_abs_diff, then name.
_RANK = {"changed": 0, "dtype_mismatch": 1, "shape_mismatch": 2, "removed": 3, "added": 4, "equal": 5}


def _eager_key(v: VariableDiff) -> tuple:
    return (_RANK[v.status], -v.movement, -(v.max_abs_diff or 0.0), v.name)


def _columns(monkeypatch, on: bool) -> None:
    use_columns(monkeypatch, safetensors_file, on)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
    """Two .safetensors written by the safetensors library: B changes some values (NaN, Inf, a
    zero moved away from), a shape and a dtype, drops some names and adds others (non-ASCII)."""
    rng = np.random.default_rng(3)
    leaf = ["caf\u00e9", "w", "w", "w", "w", "w", "w"]
    a = {f"blk{i // 40}/{leaf[i % 7]}{i}": rng.standard_normal((i % 4 + 1, 3)).astype(np.float32)
         for i in range(400)}
    a["top"] = np.zeros(3, np.float32)
    b = {k: v.copy() for k, v in a.items()}
    keys = list(a)
    for i in range(0, 400, 9):
        b[keys[i]] += np.float32(rng.random() * (i % 5))
    b[keys[3]][0, 0] = np.nan
    b[keys[4]][0, 1] = np.inf
    b["top"][1] = 1.0
    b[keys[5]] = np.zeros((9,), np.float32)
    b[keys[6]] = b[keys[6]].astype(np.float64)
    for i in range(10, 400, 37):
        del b[keys[i]]
    for j in range(6):
        b[f"new/\u4e2d{j}"] = np.full((2,), j, np.float32)
    folder = tmp_path_factory.mktemp("diffcolumns")
    safetensors_numpy.save_file(a, str(folder / "a.safetensors"))
    safetensors_numpy.save_file(b, str(folder / "b.safetensors"))
    return folder / "a.safetensors", folder / "b.safetensors"


@pytest.mark.parametrize("patterns", [255, 0], ids=["patterns", "blocks"])
def test_rows_from_columns_are_the_rows_sorted_as_before(pair, monkeypatch, patterns):
    _columns(monkeypatch, True)
    monkeypatch.setattr(operation, "_PATTERNS", patterns)  # 0: every entry's numbers in the blocks
    report = ckptinspect.diff(*pair)
    assert isinstance(report.variables, DiffRows)
    rows = list(report.variables)
    assert len({v.status for v in rows}) == 6  # every status is there
    assert rows == sorted(rows, key=_eager_key)
    eager = DiffReport(**{f.name: getattr(report, f.name) for f in dataclasses.fields(DiffReport) if f.name != "variables"},
                       variables=tuple(rows))
    assert eager.variables == report.variables and report.variables == tuple(rows)
    assert eager.to_dict() == report.to_dict()
    assert report.variables[-1] == rows[-1] and report.variables[2:5] == tuple(rows[2:5])
    counts = {s: sum(v.status == s for v in rows) for s in eager.summary}
    assert report.summary == counts and report.verdict == eager.verdict and report.layers == eager.layers
    assert report.has_nonfinite and not report.identical


def test_layers_from_columns_are_the_layers_of_the_rows(pair, monkeypatch):
    _columns(monkeypatch, True)
    report = ckptinspect.diff(*pair)
    groups: dict[str, list[VariableDiff]] = {}
    for v in report.variables:
        groups.setdefault(v.layer, []).append(v)
    for s in report.layers:
        members = groups.pop(s.layer)
        rels = [v.rel_l2 for v in members if v.differs and v.rel_l2 is not None]
        abss = [v.max_abs_diff for v in members if v.differs and v.max_abs_diff is not None]
        assert (s.variables, s.changed) == (len(members), sum(v.differs for v in members))
        assert s.max_rel_l2 == (max(rels) if rels else None) and s.max_abs_diff == (max(abss) if abss else None)
    assert not groups


def _former_layer_order(s) -> tuple:
    """The layers' order before the columns: moved first, the most movement first, then by name."""
    return (0 if s.changed else 1, -(s.max_rel_l2 or 0.0), -s.changed, s.layer)


@pytest.fixture(scope="module")
def layered(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
    """Two .safetensors (the safetensors library) of 40 layers, some nested in others and one
    name without a "/", where B changes variables of 5 layers."""
    rng = np.random.default_rng(5)
    a = {f"m/l{i % 20}/{'in/' * (i % 40 >= 20)}v{i}": rng.standard_normal(4).astype(np.float32) for i in range(120)}
    a["bias"] = np.ones(2, np.float32)
    b = {k: v.copy() for k, v in a.items()}
    for k in list(b)[3:120:24]:
        b[k] += np.float32(0.5)
    folder = tmp_path_factory.mktemp("difflayers")
    safetensors_numpy.save_file(a, str(folder / "a.safetensors"))
    safetensors_numpy.save_file(b, str(folder / "b.safetensors"))
    return folder / "a.safetensors", folder / "b.safetensors"


@pytest.mark.parametrize("collide", [False, True], ids=["hashes", "collisions"])
@pytest.mark.parametrize("files", ["pair", "layered"])
def test_layers_are_in_order_and_the_moved_ones_lead(request, monkeypatch, collide, files):
    """Layers told apart by hashes (or, every hash colliding, by their bytes) come in the former
    order; moved_layers is their moved part and their count, with no summary of the others made."""
    _columns(monkeypatch, True)
    pair = request.getfixturevalue(files)
    before = ckptinspect.diff(*pair).layers
    if collide:  # every layer's hash the same: the check sees it and the bytes decide
        monkeypatch.setattr(operation, "hash", lambda _: 7, raising=False)
    report = ckptinspect.diff(*pair)
    moved, count = report.moved_layers
    layers = report.layers
    assert layers == before and list(layers) == sorted(layers, key=_former_layer_order)
    assert len({s.layer for s in layers}) == len(layers) >= len(moved) > 3
    if files == "layered":
        assert (len(layers), len(moved)) == (41, 5) and "" in {s.layer for s in layers}
    assert (moved, count) == (tuple(s for s in layers if s.changed), len(layers)) == report.moved_layers
    rows = list(report.variables)
    eager = DiffReport(**{f.name: getattr(report, f.name) for f in dataclasses.fields(DiffReport) if f.name != "variables"},
                       variables=tuple(rows))  # names packed from the rows, not a table's buffer
    assert eager.moved_layers == (moved, count) and eager.layers == layers


def test_moved_layers_of_no_rows_and_of_names_without_a_slash():
    v = VariableDiff("top", "top", "top", "changed", name_a="top", name_b="top", role="model", matched_by="key",
                     shape_a=(2,), shape_b=(2,), dtype_a="float32", dtype_b="float32", max_abs_diff=1.0,
                     rel_l2=0.5, cosine=0.9, num_different=1)
    assert DiffReport("a", "b", "f", "f", 0.0, 0.0, None, "key", ()).moved_layers == ((), 0)
    moved, count = DiffReport("a", "b", "f", "f", 0.0, 0.0, None, "key", (v,)).moved_layers
    assert count == 1 and [(s.layer, s.variables, s.changed, s.max_rel_l2) for s in moved] == [("", 1, 1, 0.5)]


@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
@pytest.mark.parametrize("order", ["ab", "ba", "aa"])
def test_the_output_of_tables_is_the_output_of_tuples(pair, monkeypatch, fmt, order):
    """The columns path (VariableTables, the key join) writes what the tuple path writes."""
    a, b = {"ab": pair, "ba": pair[::-1], "aa": (pair[0], pair[0])}[order]
    outputs = []
    for on in (False, True):
        _columns(monkeypatch, on)
        result = runner.invoke(app, ["diff", str(a), str(b), "--format", fmt])
        outputs.append((result.exit_code, result.output))
    assert outputs[0] == outputs[1]
    assert outputs[1][0] == (0 if order == "aa" else 1)


def test_a_role_keeps_the_table(pair, monkeypatch):
    _columns(monkeypatch, True)
    with ckptinspect.open(pair[0]) as ca, ckptinspect.open(pair[1]) as cb:
        assert isinstance(ca.variables, VariableTable)
        for role in ("model", "optimizer"):
            report = ckptinspect.diff(ca, cb, role=role)
            tuples = ckptinspect.diff(dataclasses.replace(ca, variables=tuple(ca.variables)),
                                      dataclasses.replace(cb, variables=tuple(cb.variables)), role=role)
            assert report.to_dict() == tuples.to_dict()


def test_nan_inf_none_and_big_counts_survive_the_columns():
    x, y = Variable("x", "x", (2,), "float32", 8), Variable("y", "y", (), "int8", 1, role="optimizer")
    rows = (VariableDiff("x", "x", "x", "changed", "x", "x", "model", "key", (2,), (2,), "float32", "float32",
                         max_abs_diff=math.inf, rel_l2=None, cosine=float("nan"), num_different=3 << 33, nan_a=0),
            VariableDiff("y", "y", None, "removed", "y", None, "optimizer", None, (), None, "int8", None))
    made = DiffRows((x, y), (x,), np.array([0, 1]), np.array([0, -1]), np.array([0, -1], np.int8), ("key",), {})
    for j, v in enumerate(rows):
        made.store(j, v)
    got = list(made)
    assert got[1] == rows[1] and got[0].num_different == 3 << 33 and got[0].rel_l2 is None
    assert math.isnan(got[0].cosine) and got[0].max_abs_diff == math.inf and got[0].nan_a == 0
    assert dataclasses.replace(got[0], cosine=None) == dataclasses.replace(rows[0], cosine=None)


@pytest.mark.slow
def test_a_diff_of_many_tensors_holds_no_row_per_tensor(tmp_path, monkeypatch):
    n = 40_000
    path = tmp_path / "many.safetensors"
    safetensors_numpy.save_file({f"l{i // 1000}.e{i % 1000}": np.full((1,), i % 97, np.float32) for i in range(n)},
                                str(path))
    _columns(monkeypatch, True)
    with ckptinspect.open(path) as ckpt:
        tracemalloc.start()
        try:
            report = ckptinspect.diff(ckpt, ckpt)
            held, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert report.identical and len(report.variables) == n
    # a VariableDiff a tensor is ~270 bytes, the matcher's Items and Pairs ~500: the columns ~100
    assert held < 150 * n, held
    assert peak < 400 * n, peak


def test_the_table_footer_lists_the_moved_layers_and_counts_the_others(layered, monkeypatch):
    _columns(monkeypatch, True)
    result = runner.invoke(app, ["diff", *map(str, layered)])
    assert result.exit_code == 1
    footer = result.output.split("\nlayers:\n", 1)[1].splitlines()
    moved = ckptinspect.diff(*layered).moved_layers[0]
    assert [line.split()[0] for line in footer[2:7]] == [s.layer for s in moved]
    assert footer[7] == "36 layers unchanged" and footer[8:] == ["", "5 of 121 variables differ: 5 changed (atol=0, rtol=0)"]


@pytest.mark.parametrize("names", [
    [f"n{i:03d}" for i in range(40)],  # in order, over many blocks
    [f"n{i:03d}" for i in (0, 1, 2, 4, 3, 5, 6, 7, 8)],  # out of order only where two blocks of 4 meet
    ["", "a", "a/b", "ab", "\u00e9", "\u4e2d", "z"] * 3,  # empty, nested, non-ASCII, repeated
    [f"{'x' * (i % 7)}{i % 5}" for i in range(30)],
])
def test_name_ranks_are_python_s_order(monkeypatch, names):
    """Checked in order a few rows at a time (the blocks overlap by a row), else sorted whole:
    each entry's place is its place in Python's sort of the names (ties by entry)."""
    monkeypatch.setattr(operation, "_ROWS_AT_ONCE", 4)
    rows = DiffRows.of(VariableDiff(n, n, n, "equal") for n in names)
    expected = np.empty(len(names), np.int64)
    expected[sorted(range(len(names)), key=lambda j: names[j])] = np.arange(len(names))
    assert rows.name_ranks().tolist() == expected.tolist()
