"""Giant headers (issue 28): a checkpoint of very many variables kept as columns (VariableTable).

Every check runs both ways in one process: the columns forced (thresholds 0) and the former
path (thresholds out of reach), and asserts the same variables, values and byte-identical
outputs (table, CSV, JSON), or the same error message when the header is damaged.
"""

from __future__ import annotations

import json
import pathlib
import struct

import numpy as np
import pytest
from click.testing import CliRunner

import ckptinspect
from ckptinspect import model as m
from ckptinspect.cli import app
from columns_switch import both_paths, use_columns
from ckptinspect.formats.safetensors import compact, file as safetensors_file
from ckptinspect.render import simple_table

safetensors_numpy = pytest.importorskip("safetensors.numpy")

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = sorted((ROOT / "fixtures" / "torch").glob("*.safetensors"))
TF_FIXTURES = [ROOT / "fixtures" / "sharded" / "ckpt-4", ROOT / "fixtures" / "xframe" / "keras_tf" / "ckpt"]
runner = CliRunner()

# names other people write: escapes, quotes, a terminal escape, non-ASCII, a counter
NAMES = ["a/b.weight", 'q"uote', "back\\slash", "\x1b[31mred", "caf\u00e9/\u4e2d", "tab\there", "e\u0301",
         "model.step", "global_step", "x" * 300, "\U0001f600", "sp ace ", "-lead", "=formula"]


def _columns(monkeypatch, on: bool) -> None:
    use_columns(monkeypatch, safetensors_file, on)


def _both(monkeypatch, fn):
    """``fn()`` on the former path, then on the columns."""
    return both_paths(monkeypatch, safetensors_file, fn)


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> pathlib.Path:
    """A .safetensors of 3,000 tensors written by the safetensors library (names above, dtypes,
    shapes, 0-d counters, empty tensors), metadata with a step."""
    rng = np.random.default_rng(0)
    tensors = {}
    dtypes = [np.float32, np.float16, np.int64, np.uint8, np.bool_, np.int32, np.float64]
    for i in range(3000):
        name = NAMES[i] if i < len(NAMES) else f"layer{i % 97}/w{i}"
        shape = [(), (3,), (2, 5), (0, 4), (1, 1, 2)][i % 5]
        dtype = dtypes[i % len(dtypes)]
        if name in ("model.step", "global_step"):
            shape, dtype = (), np.int64
        tensors[name] = np.asarray(rng.standard_normal(shape) * 10).astype(dtype)
    path = tmp_path_factory.mktemp("giant") / "model.safetensors"
    safetensors_numpy.save_file(tensors, str(path), metadata={"step": "42", "format": "np"})
    return path


def _cli(*args) -> tuple[int, str]:
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def test_the_columns_hold_what_the_dicts_held(written, monkeypatch):
    def opened():
        with ckptinspect.open(written) as ckpt:
            values = {v.key: ckpt.read(v) for v in ckpt.variables}
            return ckpt.variables, tuple(ckpt.variables), ckpt.step, ckpt.info, ckpt.totals(), values

    before, after = _both(monkeypatch, opened)
    assert isinstance(before[0], tuple) and isinstance(after[0], m.VariableTable)
    assert after[1] == before[1]  # every Variable, in header order
    assert after[2:5] == before[2:5] == (42, before[3], before[4])
    assert after[5].keys() == before[5].keys()
    for key, value in before[5].items():
        np.testing.assert_array_equal(after[5][key], value)
        assert after[5][key].dtype == value.dtype
    roles = {v.name: v.role for v in after[0]}
    assert roles["global_step"] == roles["model.step"] == m.ROLE_METADATA and roles["a/b.weight"] == m.ROLE_MODEL


@pytest.mark.parametrize("args", [[], ["--sort", "name"], ["--sort", "size"], ["--sort", "file"],
                                  ["--role", "metadata"], ["--filter", "layer1"], ["--format", "csv"],
                                  ["--format", "json"], ["--format", "csv", "--sort", "name"], ["--tree"]])
def test_ls_is_byte_identical(written, monkeypatch, args):
    before, after = _both(monkeypatch, lambda: _cli("ls", written, *args))
    assert before[0] == 0 and after == before


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.name)
@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_ls_of_the_fixtures_is_byte_identical(fixture, fmt, monkeypatch):
    before, after = _both(monkeypatch, lambda: _cli("ls", fixture, "--format", fmt))
    assert before[0] == 0 and after == before


@pytest.mark.parametrize("prefix", TF_FIXTURES, ids=lambda p: p.parent.name)
@pytest.mark.parametrize("args", [["--format", "table"], ["--format", "csv"], ["--format", "json"],
                                  ["--sort", "size"], ["--role", "optimizer"]])
def test_ls_of_a_tf_bundle_is_byte_identical(prefix, args, monkeypatch):
    before, after = _both(monkeypatch, lambda: _cli("ls", prefix, *args))
    assert before[0] == 0 and after == before


def test_a_narrow_terminal_fits_as_before(written, monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    before, after = _both(monkeypatch, lambda: _cli("ls", written))
    assert "\u2026" in before[1] and after == before


def test_verify_and_diff_agree(written, monkeypatch):
    before, after = _both(monkeypatch, lambda: (_cli("verify", written), _cli("diff", written, written)))
    assert before[0][0] == 0 and after == before


def _raw(path: pathlib.Path, header: bytes, data: bytes = b"") -> pathlib.Path:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def _entry(name: str, begin: int, end: int, dtype: str = "F32", shape: str = "[1]") -> str:
    return f'"{name}":{{"dtype":"{dtype}","shape":{shape},"data_offsets":[{begin},{end}]}}'


CRAFTED = {
    "sorted keys (json.dumps)": json.dumps({"a": {"data_offsets": [0, 4], "dtype": "F32", "shape": [1]},
                                            "b": {"data_offsets": [4, 8], "dtype": "F32", "shape": [1]}},
                                           separators=(",", ":")),
    "metadata last": "{" + _entry("a", 0, 4) + "," + _entry("b", 4, 8) + ',"__metadata__":{"step":"7"}}',
    "spaces (json.dumps)": json.dumps({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}),
    "a name twice": "{" + _entry("a", 0, 4) + "," + _entry("a", 4, 8) + "}",
    "a name twice through an escape": "{" + _entry("a", 0, 4) + "," + _entry("\\u0061", 4, 8) + "}",
    "metadata twice": '{"__metadata__":{},' + _entry("a", 0, 4) + ',"__metadata__":{}}',
    "overlapping spans": "{" + _entry("a", 0, 8, shape="[2]") + "," + _entry("b", 4, 8) + "}",
    "a leading zero": "{" + _entry("a", 0, 4) + "," + _entry("b", 4, "08") + "}",
    "a span of the wrong size": "{" + _entry("a", 0, 4) + "," + _entry("b", 4, 12) + "}",
    "an unknown dtype": "{" + _entry("a", 0, 4) + "," + _entry("b", 4, 8, dtype="F128") + "}",
    "past the end": "{" + _entry("a", 0, 4) + "," + _entry("b", 4, 4000) + "}",
    "begin after end": "{" + _entry("a", 0, 4) + "," + _entry("b", 8, 4) + "}",
    "65 dims": "{" + _entry("a", 0, 4) + "," + _entry("b", 4, 8, shape="[" + ",".join(["1"] * 65) + "]") + "}",
    "a control character in a name": "{" + _entry("a", 0, 4) + "," + _entry("b\x01", 4, 8) + "}",
    "a bad escape": "{" + _entry("a", 0, 4) + "," + _entry("b\\x41", 4, 8) + "}",
    "trailing text": "{" + _entry("a", 0, 4) + "}x",
    "a second object": "{" + _entry("a", 0, 4) + "}{}",
    "not an object": "[" + _entry("a", 0, 4) + "]",
    "the metadata a list": '{"__metadata__":[1],' + _entry("a", 0, 4) + "}",
    "an entry named __metadata__": "{" + _entry("a", 0, 4) + "," + _entry("__metadata__", 4, 8) + "}",
    "empty": "{}",
    "metadata only": '{"__metadata__":{"a":"b"}}',
    "unreadable dtype": "{" + _entry("a", 0, 4) + "," + _entry("b", 4, 5, dtype="F4") + "}",
}


@pytest.mark.parametrize("case", CRAFTED, ids=list(CRAFTED))
@pytest.mark.parametrize("command", ["ls", "verify"])
def test_a_crafted_header_reads_as_before(case, command, tmp_path, monkeypatch):
    path = _raw(tmp_path / "x.safetensors", CRAFTED[case].encode("utf-8", "surrogatepass"), bytes(64))
    before, after = _both(monkeypatch, lambda: _cli(command, path, "--format", "json"))
    assert after == before


def test_not_utf8_reads_as_before(tmp_path, monkeypatch):
    path = _raw(tmp_path / "x.safetensors", b"{" + _entry("a\xff", 0, 4).encode("latin-1") + b"}", bytes(8))
    before, after = _both(monkeypatch, lambda: _cli("ls", path))
    assert before[0] != 0 and after == before


def test_a_header_of_many_windows_is_read_a_window_at_a_time(tmp_path, monkeypatch):
    """Entries cross the windows' and chunks' edges; the columns are those json.loads gives."""
    monkeypatch.setattr(compact, "WINDOW_BYTES", 4096)
    monkeypatch.setattr(compact, "CHUNK_BYTES", 1000)
    entries = [_entry(f"w{i}" + "\\u00e9" * (i % 3), 4 * i, 4 * i + 4) for i in range(2000)]
    header = ('{"__metadata__":{"k":"v"},' + ",".join(entries) + "}").encode() + b" " * 5
    path = _raw(tmp_path / "x.safetensors", header, bytes(8000))
    before, after = _both(monkeypatch, lambda: _cli("ls", path, "--format", "csv"))
    assert before[0] == 0 and after == before
    with ckptinspect.open(path) as ckpt:
        assert isinstance(ckpt.variables, m.VariableTable) and len(ckpt) == 2000


def test_the_table_is_a_sequence_of_variables(written, monkeypatch):
    _columns(monkeypatch, True)
    with ckptinspect.open(written) as ckpt:
        table = ckpt.variables
        listed = tuple(table)
        assert len(table) == len(listed) == 3000
        assert table[0] == listed[0] and table[-1] == listed[-1]
        assert tuple(table[10:20]) == listed[10:20] and tuple(table[::-7]) == listed[::-7]
        with pytest.raises(IndexError):
            table[3000]
        assert table == listed and table != listed[:-1]
        for v in listed[:20]:
            assert table.find(v.key) is not None and ckpt[v.key] == v
        assert table.find("no such") is None
        assert [table.name_of(int(r)) for r in table.name_order()] == sorted(v.name for v in listed)
        assert ckpt.totals() == m.role_totals(listed)


def test_the_table_renderer_writes_what_simple_table_writes(written, monkeypatch):
    from ckptinspect.render._columns import table_chunks

    _columns(monkeypatch, True)
    with ckptinspect.open(written) as ckpt:
        table = ckpt.variables.view(np.array([r for r in range(3000) if ckpt.variables.name_of(r).isascii()
                                              and ckpt.variables.name_of(r).isprintable()][::-1]))
        text = "".join(table_chunks(["name", "dtype", "role"], table, [
            (lambda rows: table.dtype_codes[rows], list(table.dtypes)),
            (lambda rows: table.role_codes[rows], list(table.roles))]))
        assert text == simple_table(["name", "dtype", "role"], [[v.name, v.dtype, v.role] for v in table])


@pytest.mark.parametrize("case, columns", [("sorted keys (json.dumps)", True), ("metadata last", True),
                                           ("unreadable dtype", True), ("empty", True), ("metadata only", True),
                                           ("spaces (json.dumps)", False),
                                           ("an entry named __metadata__", False)])
def test_the_writers_shapes_are_read_into_columns(case, columns, tmp_path, monkeypatch):
    """Any order of the three keys, metadata first or last: columns; anything else: json.loads."""
    path = _raw(tmp_path / "x.safetensors", CRAFTED[case].encode(), bytes(64))
    _columns(monkeypatch, True)
    with ckptinspect.open(path) as ckpt:
        assert isinstance(ckpt.variables, m.VariableTable) is columns


@pytest.mark.parametrize("lines", [1, 2, 3, 7])
@pytest.mark.parametrize("fmt", ["table", "csv"])
@pytest.mark.parametrize("command", ["ls", "diff"])
def test_text_written_in_blocks_is_the_text_written_whole(written, monkeypatch, lines, fmt, command):
    """Blocks of a few lines (their edges before, inside and after the header and footer) give
    the same bytes as one block."""
    from ckptinspect.render import _core

    _columns(monkeypatch, False)
    args = ("ls", written, "--role", "metadata") if command == "ls" else ("diff", written, FIXTURES[0])
    whole = _cli(*args, "--format", fmt)
    monkeypatch.setattr(_core, "LINES_PER_CHUNK", lines)
    assert _cli(*args, "--format", fmt) == whole and whole[1]


@pytest.mark.parametrize("span", [7, 1 << 16])
def test_the_table_renderer_in_small_blocks_writes_what_simple_table_writes(written, monkeypatch, span):
    """Each column's codes made a few rows at a time (sizes: distinct values found block by block),
    lines written a few at a time: the bytes simple_table writes."""
    from ckptinspect.render import _columns as columns
    from ckptinspect.render._core import human_bytes

    _columns(monkeypatch, True)
    monkeypatch.setattr(columns, "_SPAN_ROWS", span)
    monkeypatch.setattr(columns, "BLOCK_BYTES", 300)
    with ckptinspect.open(written) as ckpt:
        table = ckpt.variables.view(np.array([r for r in range(3000) if ckpt.variables.name_of(r).isascii()
                                              and ckpt.variables.name_of(r).isprintable()][::-3]))
        text = "".join(columns.table_chunks(["name", "size", "role"], table, [
            (lambda rows: table.nbytes[rows], human_bytes),
            (lambda rows: table.role_codes[rows], list(table.roles))]))
        assert len({v.nbytes for v in table}) > 3
        assert text == simple_table(["name", "size", "role"], [[v.name, human_bytes(v.nbytes), v.role] for v in table])


@pytest.mark.parametrize("odd", [None, "\x1b", "\u00e9", "\x7f"])
@pytest.mark.parametrize("at", [0, 5, 39])
def test_plain_names_looks_at_every_piece(monkeypatch, odd, at):
    from ckptinspect.render import _columns as columns

    monkeypatch.setattr(columns, "_CHECK_BYTES", 16)
    names = [f"layer{i:02d}/w" for i in range(40)]
    if odd is not None:
        names[at] = names[at][:3] + odd + names[at][3:]
    table = m.VariableTable.from_variables(m.Variable(key=n, name=n, shape=(1,), dtype="float32", nbytes=4)
                                           for n in names)
    assert columns.plain_names(table) is (odd is None)
