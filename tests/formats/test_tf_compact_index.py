"""Giant TF indexes (issue 28): a big ``.index`` read a block at a time into columns
(``formats.tf.compact.CompactIndex``) instead of an entry object per tensor.

Every check runs both ways in one process: the columns forced (``COMPACT_MIN_BYTES`` and
``COMPACT_MIN_VARIABLES`` 0) and the former path (thresholds out of reach), and asserts the same
entries, variables, values and byte-identical outputs (table, CSV, JSON; verify's JSON), or the
same error. Inputs are the committed fixtures (written by TensorFlow), bundles written by our own
writer (100,000 entries in a second or two), indexes rewritten with the project's protobuf
declarations (``bundle_craft``), and, in the slow tests, bundles TensorFlow writes here and reads
back as the oracle (``tf.train.list_variables`` / ``load_checkpoint``).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import struct
import tracemalloc

import numpy as np
import pytest
from click.testing import CliRunner

import ckptinspect
from bundle_craft import parse_entry, read_entries, write_table
from ckptinspect import model as m
from ckptinspect.cli import app
from columns_switch import both_paths, use_columns
from ckptinspect.formats.tf import compact, index as tf_index
from ckptinspect.formats.tf.write.bundle import write_bundle_native
from ckptinspect.formats.tf.write.tensors import OutputTensor

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURE_INDEXES = sorted((ROOT / "fixtures").rglob("*.index"))
PLAIN = ROOT / "fixtures" / "run" / "ckpt-8"  # a TF2 bundle of 27 entries, no slices
SLICED = ROOT / "fixtures" / "sharded" / "ckpt-2"  # partitioned variables: slices
runner = CliRunner()


def _columns(monkeypatch, on: bool) -> None:
    use_columns(monkeypatch, compact, on)


def _both(monkeypatch, fn):
    """``fn()`` on the former path, then on the columns."""
    return both_paths(monkeypatch, compact, fn)


def _cli(*args) -> tuple[int, str]:
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def _scan(prefix: pathlib.Path | str) -> compact.CompactIndex | None:
    path = f"{prefix}.index"
    from ckptinspect.formats import _fs

    with _fs.RangeReader(path) as reader:
        return compact.scan_index(reader, path)


def _copy(prefix: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    dest.mkdir(parents=True, exist_ok=True)
    for f in prefix.parent.glob(prefix.name + ".*"):
        shutil.copy(f, dest / f.name)
    return dest / prefix.name


def _rewrite(prefix: pathlib.Path, fn) -> None:
    """``PREFIX.index`` replaced by a table of ``fn(key, value)`` for each entry (None drops it)."""
    index = pathlib.Path(f"{prefix}.index")
    out = []
    for key, value in read_entries(index):
        changed = fn(key, value)
        if changed is not None:
            out.append(changed)
    index.write_bytes(write_table(out))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


# -- the columns hold what the entries held ---------------------------------------------------
@pytest.mark.parametrize("path", FIXTURE_INDEXES, ids=lambda p: str(p.relative_to(ROOT / "fixtures")))
def test_the_fixtures_scan_into_the_entries_parse_index_gives(path):
    """The one rule: a fixture whose index holds slices is left to parse_index; every other
    reads into columns giving entry for entry what parse_index gives (problems included)."""
    prefix = str(path)[: -len(".index")]
    parsed = tf_index.parse_index(path.read_bytes())
    scanned = _scan(prefix)
    assert (scanned is None) == any(e.slices for e in parsed.entries)
    if scanned is not None:
        assert scanned.num_shards == parsed.num_shards
        assert list(scanned.entries) == list(parsed.entries) and len(scanned.entries) == len(parsed.entries)
        for e in parsed.entries:
            assert scanned.get(e.key) == e and scanned.find(e.key) is not None
        assert scanned.get("no such key") is None


def test_a_sliced_index_is_read_as_before(monkeypatch):
    assert _scan(SLICED) is None
    before, after = _both(monkeypatch, lambda: [_cli("ls", SLICED, "--format", f) for f in ("json", "csv")])
    assert before[0][0] == 0 and after == before


@pytest.mark.parametrize("args", [["--format", "table"], ["--format", "csv"], ["--format", "json"],
                                  ["--sort", "name"], ["--sort", "size", "--format", "csv"], ["--sort", "file"],
                                  ["--role", "optimizer", "--format", "json"], ["--tree"], ["-k", "kernel"],
                                  ["--stats", "--format", "csv"]])
def test_ls_of_a_fixture_is_byte_identical(monkeypatch, args):
    before, after = _both(monkeypatch, lambda: _cli("ls", PLAIN, *args))
    assert before[0] == 0 and after == before


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_verify_and_diff_of_a_fixture_are_byte_identical(monkeypatch, fmt):
    other = ROOT / "fixtures" / "run" / "ckpt-4"
    before, after = _both(monkeypatch, lambda: (_cli("verify", PLAIN, "--format", fmt),
                                                _cli("diff", other, PLAIN, "--format", fmt)))
    assert before[0][0] == 0 and after == before


# -- bundles of many variables written by our own writer -------------------------------------
def _many(directory: pathlib.Path, n: int, scalars: bool = True) -> pathlib.Path:
    """A name-based bundle of ``n`` small float32 variables (and a global_step, Adam slots and a
    string among them), written without TensorFlow."""
    directory.mkdir(parents=True, exist_ok=True)
    prefix = directory / "model.ckpt-7"
    tensors = [OutputTensor.from_array(f"layer_{i // 100:04d}/w{i % 100:02d}", np.full((i % 3 + 1,), i, np.float32))
               for i in range(n)]
    if scalars:
        tensors += [OutputTensor.from_array("global_step", np.int64(1234)),
                    OutputTensor.from_array("layer_0000/w00/Adam", np.zeros(1, np.float32)),
                    OutputTensor.from_array("note", np.array(b"hello", dtype=object)),
                    OutputTensor.from_array("caf\u00e9/\u4e2d", np.ones((2, 0), np.float64))]
    write_bundle_native(str(prefix), tensors, fsync=False)
    return prefix


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> pathlib.Path:
    return _many(tmp_path_factory.mktemp("many"), 3000)


def test_many_variables_are_a_table_sharing_the_columns(many, monkeypatch):
    _columns(monkeypatch, True)
    with ckptinspect.open(many) as ckpt:
        table = ckpt.variables
        assert isinstance(table, m.VariableTable) and table.keys is None and len(table) == 3004
        index = ckpt.source._index
        assert isinstance(index, compact.CompactIndex)
        assert table.names is index.keys and table.name_ends is index.key_ends  # not copied
        assert (ckpt.step, ckpt.step_source) == (1234, "variable:global_step")
        roles = {v.key: v.role for v in table}
        assert roles["global_step"] == m.ROLE_METADATA and roles["layer_0000/w00/Adam"] == m.ROLE_OPTIMIZER
        assert np.array_equal(ckpt.read("layer_0029/w17"), np.full((2,), 2917, np.float32))
        assert ckpt.read("note") == b"hello"
    _columns(monkeypatch, False)
    with ckptinspect.open(many) as old:
        assert isinstance(old.variables, tuple) and tuple(table) == old.variables


@pytest.mark.parametrize("args", [["--format", "table"], ["--format", "csv"], ["--format", "json"],
                                  ["--sort", "name", "--format", "csv"], ["--sort", "size"], ["--tree"],
                                  ["--role", "metadata"], ["-k", "w1"]])
def test_ls_of_many_is_byte_identical(many, monkeypatch, args):
    before, after = _both(monkeypatch, lambda: _cli("ls", many, *args))
    assert before[0] == 0 and after == before


@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
def test_verify_and_diff_of_many_are_byte_identical(many, monkeypatch, fmt):
    before, after = _both(monkeypatch, lambda: (_cli("verify", many, "--format", "json" if fmt == "csv" else fmt),
                                                _cli("diff", many, many, "--format", fmt)))
    assert before[0][0] == 0 and before[1][0] == 0 and after == before


def test_verify_of_many_finds_damaged_bytes_as_before(many, tmp_path, monkeypatch):
    """A flipped byte, a truncated shard, a missing shard: the same damage, named the same way."""
    flipped = _copy(many, tmp_path / "flipped")
    data = pathlib.Path(f"{flipped}.data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    entry = _scan(many).get("layer_0029/w17")
    raw[entry.offset + 1] ^= 0x40
    data.write_bytes(bytes(raw))
    cut = _copy(many, tmp_path / "cut")
    pathlib.Path(f"{cut}.data-00000-of-00001").write_bytes(raw[: len(raw) // 2])
    gone = _copy(many, tmp_path / "gone")
    pathlib.Path(f"{gone}.data-00000-of-00001").unlink()
    for prefix in (flipped, cut, gone):
        before, after = _both(monkeypatch, lambda: _cli("verify", prefix, "--format", "json"))
        assert before[0] != 0 and after == before
    doc = json.loads(_cli("verify", flipped, "--format", "json")[1])
    (damage,) = doc["checkpoints"][0]["damaged"]
    assert damage["kind"] == "checksum" and damage["key"] == "layer_0029/w17"


def test_verify_of_runs_out_of_key_order_is_as_before(many, tmp_path, monkeypatch):
    """Two entries of one size trading places in the data file (offsets and checksums swapped in
    the index): the file order is no longer the key order, and verify, on the columns, reads in
    file order what the record path reads: no damage, then the same two damaged, in the same order."""
    from bundle_craft import edit_entry

    prefix = _copy(many, tmp_path / "swapped")
    first, last = _scan(many).get("layer_0000/w00"), _scan(many).get("layer_0029/w16")
    assert first.size == last.size and first.offset < last.offset
    edit_entry(prefix, b"layer_0000/w00", offset=last.offset, crc32c=last.crc32c)
    edit_entry(prefix, b"layer_0029/w16", offset=first.offset, crc32c=first.crc32c)
    before, after = _both(monkeypatch, lambda: _cli("verify", prefix, "--format", "json"))
    assert before[0] == 0 and after == before
    data = pathlib.Path(f"{prefix}.data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    for offset in (first.offset, last.offset, _scan(many).get("layer_0010/w00").offset):
        raw[offset] ^= 0x40
    data.write_bytes(bytes(raw))
    before, after = _both(monkeypatch, lambda: _cli("verify", prefix, "--format", "json"))
    damaged = [d["key"] for d in json.loads(after[1])["checkpoints"][0]["damaged"]]
    assert before[0] != 0 and after == before and len(damaged) == 3


def test_a_giant_index_takes_less_than_three_times_its_bytes(tmp_path, monkeypatch):
    """What the columns hold, traced by Python's allocators (not the machine's speed): well under
    three times the index file, against ~20x for the entries."""
    prefix = _many(tmp_path, 20_000, scalars=False)
    size = pathlib.Path(f"{prefix}.index").stat().st_size
    _columns(monkeypatch, True)
    tracemalloc.start()
    try:
        index = tf_index.read_index(str(prefix))
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(index, compact.CompactIndex) and len(index) == 20_000
    assert held < 3 * size, (held, size)


@pytest.mark.slow
def test_a_hundred_thousand_entries_read_as_before(tmp_path, monkeypatch):
    prefix = _many(tmp_path, 100_000)
    scanned = _scan(prefix)
    parsed = tf_index.parse_index(pathlib.Path(f"{prefix}.index").read_bytes())
    assert scanned is not None and list(scanned.entries) == list(parsed.entries)
    for args in (["ls", prefix, "--format", "csv"], ["verify", prefix, "--format", "json"]):
        before, after = _both(monkeypatch, lambda: _cli(*args))
        assert before[0] == 0 and after == before


# -- hostile indexes: the same result, or the same error --------------------------------------
def _entry_value(fn):
    """A rewrite of every non-header entry's value by ``fn(value)``."""
    return lambda key, value: (key, fn(value) if key else value)


TARGET = b"layer_0000/w00"  # a float32 [1] of 4 bytes with a crc32c


def _first_entry(fn):
    """A rewrite of the value of :data:`TARGET` by ``fn(value)``."""
    return lambda key, value: (key, fn(value)) if key == TARGET else (key, value)


def _dims(*sizes: int) -> bytes:
    """A TensorShapeProto's bytes: a ``dim { size }`` per size."""
    out = b""
    for size in sizes:
        dim = b"\x08" + _varint(size)
        out += b"\x12" + _varint(len(dim)) + dim
    return out


HOSTILE = {
    # each: (how the index is rewritten, whether the columns take it)
    "an unknown field": (_first_entry(lambda v: v + b"\x48\x01"), False),
    "a field twice": (_first_entry(lambda v: v + b"\x28\x04"), False),
    "a varint longer than 10 bytes": (_first_entry(lambda v: v + b"\x20" + b"\xff" * 10 + b"\x01"), False),
    "a negative offset": (_first_entry(lambda v: v + b"\x20" + _varint((1 << 64) - 5)), False),
    "a dtype past int32": (_first_entry(lambda v: b"\x08" + _varint(1 << 31) + v[2:]), False),
    "an unknown-rank shape": (_first_entry(lambda v: _with_shape(v, b"\x18\x01")), False),
    "a named dimension": (_first_entry(lambda v: _with_shape(v, b"\x12\x05\x08\x01\x12\x01a")), False),
    "a stored slice's key": (lambda key, value: (b"\x00" + key, value) if key.startswith(b"note") else (key, value), False),
    "a key that is not UTF-8": (lambda key, value: (b"\xff" + key, value) if key == b"note" else (key, value), False),
    "a big-endian header": (lambda key, value: (key, value + b"\x10\x01") if not key else (key, value), False),
    "no header": (lambda key, value: None if not key else (key, value), False),
    "a shard past the header's count": (_first_entry(lambda v: v + b"\x18\x05"), False),
    "a shape claiming 2**62 elements": (_first_entry(lambda v: _with_shape(v, _dims(1 << 62))), True),
    "a shape of 300 dimensions": (_first_entry(lambda v: _with_shape(v, _dims(*[1] * 300))), True),
    "an unknown dtype": (_first_entry(lambda v: b"\x08\x63" + v[2:]), True),
    "a resource handle": (_first_entry(lambda v: b"\x08\x14" + v[2:]), True),
    "a size other than shape x dtype": (_first_entry(lambda v: v.replace(b"\x28\x04", b"\x28\x08", 1)), True),
    "no crc32c": (_first_entry(lambda v: v[:-5] if v[-5] == 0x35 else v), True),
}


def _with_shape(value: bytes, shape: bytes) -> bytes:
    """An entry with its shape field replaced (the other fields as they were)."""
    e = parse_entry(value)
    e.ClearField("shape")
    rest = e.SerializeToString()
    return rest[:2] + b"\x12" + _varint(len(shape)) + shape + rest[2:]


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> pathlib.Path:
    return _many(tmp_path_factory.mktemp("small"), 40)


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_a_hostile_index_reads_as_before(case, small, tmp_path, monkeypatch):
    prefix = _copy(small, tmp_path / "x")
    edit, taken = HOSTILE[case]
    _rewrite(prefix, edit)
    assert (_scan(prefix) is not None) is taken
    if taken:  # the same entries, each with the same problem
        scanned = _scan(prefix)
        parsed = tf_index.parse_index(pathlib.Path(f"{prefix}.index").read_bytes())
        assert list(scanned.entries) == list(parsed.entries)
    for command in (["ls", prefix, "--format", "json"], ["verify", prefix, "--format", "json"],
                    ["ls", prefix, "--format", "csv"]):
        before, after = _both(monkeypatch, lambda: _cli(*command))
        assert after == before, command


def test_a_problem_is_carried_by_its_row(small, tmp_path):
    prefix = _copy(small, tmp_path / "x")
    _rewrite(prefix, HOSTILE["an unknown dtype"][0])
    scanned = _scan(prefix)
    bad = [(scanned.key_of(r), scanned.problem_of(r)) for r in scanned.problem_rows()]
    assert bad == [("layer_0000/w00", ("dtype", "unknown dtype 99: TensorFlow cannot read it"))]


@pytest.mark.parametrize("damage", ["a flipped byte", "cut short", "a block checksum"])
def test_a_damaged_table_gives_the_same_error(damage, many, tmp_path, monkeypatch):
    prefix = _copy(many, tmp_path / "x")
    index = pathlib.Path(f"{prefix}.index")
    raw = bytearray(index.read_bytes())
    if damage == "a flipped byte":
        raw[len(raw) // 3] ^= 0x01
    elif damage == "cut short":
        raw = raw[: len(raw) // 2] + raw[-48:]  # the footer kept: its handles point past the end
    else:
        raw[len(raw) - 48 - 6] ^= 0x01  # inside the index block's trailer
    index.write_bytes(bytes(raw))
    assert _scan(prefix) is None
    for command in (["ls", prefix], ["verify", prefix, "--format", "json"]):
        before, after = _both(monkeypatch, lambda: _cli(*command))
        assert after == before and before[0] != 0, command


def test_keys_out_of_order_across_blocks_are_not_taken(small, tmp_path):
    """Two data blocks whose keys do not rise from one to the next: parse_index's error."""
    prefix = _copy(small, tmp_path / "x")
    entries = read_entries(pathlib.Path(f"{prefix}.index"))
    header, rest = entries[0], entries[1:]
    first, second = [header, *rest[20:]], rest[:20]
    table = _two_blocks(first, second)
    pathlib.Path(f"{prefix}.index").write_bytes(table)
    assert _scan(prefix) is None
    with pytest.raises(Exception, match="out of order"):
        tf_index.parse_index(table)


def _two_blocks(a: list, b: list) -> bytes:
    """A table of two data blocks holding ``a`` then ``b`` as given (unsorted across them)."""
    from ckptinspect.formats.tf.crc import masked_crc32c
    from ckptinspect.formats.tf.sstable import FOOTER_SIZE, TABLE_MAGIC

    def block(entries):
        body = bytearray()
        for key, value in entries:
            body += _varint(0) + _varint(len(key)) + _varint(len(value)) + key + value
        return bytes(body + struct.pack("<II", 0, 1))

    out = bytearray()

    def put(data):
        at = len(out)
        out.extend(data + b"\x00" + struct.pack("<I", masked_crc32c(data + b"\x00")))
        return at, len(data)

    h1, h2, meta = put(block(a)), put(block(b)), put(block([]))
    handles = [(a[-1][0], _varint(h1[0]) + _varint(h1[1])), (b[-1][0] + b"\xff", _varint(h2[0]) + _varint(h2[1]))]
    index = put(block(handles))
    footer = _varint(meta[0]) + _varint(meta[1]) + _varint(index[0]) + _varint(index[1])
    return bytes(out + footer + bytes(FOOTER_SIZE - 8 - len(footer)) + struct.pack("<Q", TABLE_MAGIC))


def test_a_size_beyond_int64_keeps_the_variables_as_objects(tmp_path, monkeypatch):
    """float32 x 2**62 elements is 2**64 bytes: no int64 column holds it; the listing is the
    former one (objects), not an overflow."""
    prefix = _copy(_many(tmp_path / "src", 40), tmp_path / "x")
    _rewrite(prefix, HOSTILE["a shape claiming 2**62 elements"][0])
    before, after = _both(monkeypatch, lambda: _cli("ls", prefix, "--format", "json"))
    assert before[0] == 0 and after == before
    assert str(4 * 2**62) in after[1]


# -- the seam: a table's name order ------------------------------------------------------------
@pytest.mark.parametrize("names", [["a", "b", "b", "c\u00e9", "d\x00", "d\x00x", "\U0001f600"],
                                   ["b", "a", "c"], ["x", "x", "\u00e9", "e"], []])
def test_name_order_is_a_stable_sort_by_name(names):
    variables = [m.Variable(key=n, name=n, shape=(), dtype="float32", nbytes=4) for n in names]
    table = m.VariableTable.from_variables(variables) if variables else None
    if table is None:
        return
    for rows in (table.positions(), table.positions()[::-1], table.positions()[1:]):
        view = table.view(rows)
        want = sorted(rows.tolist(), key=table.name_of)
        assert view.name_order().tolist() == want


# -- TensorFlow as the oracle (slow: TensorFlow is imported) -----------------------------------
@pytest.fixture(scope="module")
def tf_written(tmp_path_factory):
    tf = pytest.importorskip("tensorflow")
    base = tmp_path_factory.mktemp("tf")
    names = [f"dense_{i}/kernel" for i in range(200)] + [f"dense_{i}/kernel/Adam" for i in range(50)]
    values = {n: tf.constant(np.arange(i % 7 + 1, dtype=np.float32).reshape(-1) * i) for i, n in enumerate(names)}
    values.update({
        "global_step": tf.constant(np.int64(99)), "beta1_power": tf.constant(np.float32(0.9)),
        "bf16": tf.constant([1.5, -2.0], dtype=tf.bfloat16), "f16": tf.constant([[0.5]], dtype=tf.float16),
        "flag": tf.constant(True), "empty": tf.zeros([0, 3]), "text": tf.constant(["h\u00e9llo", "w\u00f6rld"]),
        "\u00fcn\u00efcode_n\u00e4me": tf.constant(3.0), "c64": tf.constant([1 + 2j], dtype=tf.complex64),
        "i8": tf.constant([-1, 2], dtype=tf.int8),
    })
    tf1 = str(base / "tf1" / "model.ckpt-99")
    with tf.device("/cpu:0"):
        tf.raw_ops.SaveV2(prefix=tf1, tensor_names=list(values), shape_and_slices=[""] * len(values),
                          tensors=list(values.values()))
    tf2 = tf.train.Checkpoint(**{f"v{i}": tf.Variable(np.full((2, i % 4 + 1), i, np.float32)) for i in range(60)},
                              step=tf.Variable(np.int64(5))).write(str(base / "tf2" / "ckpt"))
    return tf, {"tf1": tf1, "tf2": tf2}


@pytest.mark.slow
@pytest.mark.parametrize("which", ["tf1", "tf2"])
def test_the_columns_read_what_tensorflow_reads(tf_written, which, monkeypatch):
    tf, prefixes = tf_written
    prefix = prefixes[which]
    _columns(monkeypatch, True)
    assert _scan(prefix) is not None
    reader = tf.train.load_checkpoint(prefix)
    listed = dict(tf.train.list_variables(prefix))
    listed.pop("_CHECKPOINTABLE_OBJECT_GRAPH", None)
    dtypes = reader.get_variable_to_dtype_map()
    with ckptinspect.open(prefix) as ckpt:
        assert isinstance(ckpt.variables, m.VariableTable) is (which == "tf1")
        assert sorted(v.key for v in ckpt) == sorted(listed)
        for var in ckpt:
            assert list(var.shape) == list(listed[var.key]), var.key
            want = {"half": "float16"}.get(dtypes[var.key].name, dtypes[var.key].name)
            assert var.dtype == want, var.key
            assert np.array_equal(np.asarray(ckpt.read(var)), np.asarray(reader.get_tensor(var.key))), var.key
        if which == "tf1":
            assert (ckpt.step, ckpt["global_step"].role, ckpt["beta1_power"].role) == (99, "metadata", "optimizer")


@pytest.mark.slow
@pytest.mark.parametrize("which", ["tf1", "tf2"])
def test_outputs_of_tensorflows_bundles_are_byte_identical(tf_written, which, monkeypatch):
    _, prefixes = tf_written
    prefix = prefixes[which]
    for args in (["ls", prefix], ["ls", prefix, "--format", "json"], ["ls", prefix, "--format", "csv"],
                 ["verify", prefix, "--format", "json"], ["diff", prefix, prefix, "--format", "csv"]):
        before, after = _both(monkeypatch, lambda: _cli(*args))
        assert before[0] == 0 and after == before, args
