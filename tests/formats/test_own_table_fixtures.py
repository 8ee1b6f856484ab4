"""The project's own table fixtures (``fixtures/tables``): V1 checkpoints and a snappy index.

Until these existed only the shared corpus (``../shared/realworld``) had a V1
TensorSliceWriter file or an index with snappy-compressed blocks. ``make_fixtures.py`` wrote
them with TensorFlow (``Saver(write_version=V1)``, ``tf.train.Checkpoint``) and re-encoded the
bundle's index with the snappy library ``cramjam``; the expected values in ``expected/`` are
TensorFlow's own reads. These tests read the committed files only; they never need cramjam.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import struct

import numpy as np
import pytest
from click.testing import CliRunner

import ckptinspect
from ckptinspect.cli import app
from ckptinspect.formats.tf.crc import masked_crc32c
from ckptinspect.formats.tf.wire import read_varint

TABLES = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "tables"
EXPECTED = json.loads((TABLES / "expected" / "fixtures.json").read_text())
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
SNAPPY = 1
FORMAT_V1 = "tf-v1-table"
FORMAT_BUNDLE = "tf-bundle"

V1 = TABLES / "v1"
V1_FILE = TABLES / EXPECTED["v1"]["path"]
V1_SHARDED = TABLES / "v1_sharded"
V1_SHARDED_FILE = TABLES / EXPECTED["v1_sharded"]["path"]
PLAIN = TABLES / "snappy" / "plain"
PLAIN_PREFIX = TABLES / EXPECTED["snappy_plain"]["path"]
COMPRESSED = TABLES / "snappy" / "compressed"
COMPRESSED_PREFIX = TABLES / EXPECTED["snappy"]["path"]
COMPRESSED_INDEX = pathlib.Path(str(COMPRESSED_PREFIX) + ".index")
INDEX_BLOCKS = EXPECTED["snappy"]["index_blocks"]
SNAPPY_BLOCKS = [b for b in INDEX_BLOCKS if b["type"] == SNAPPY]


runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def expected_values(name: str) -> dict[str, np.ndarray]:
    with np.load(TABLES / "expected" / EXPECTED[name]["values"]) as npz:
        return {k: npz[k] for k in npz.files}


def tensors(name: str, *, with_object_graph: bool = False) -> dict[str, dict]:
    """Key -> {shape, dtype, role, read_by} as the generating script recorded it."""
    return {k: v for k, v in EXPECTED[name]["tensors"].items() if with_object_graph or k != OBJECT_GRAPH_KEY}


def assert_same(actual, expected: np.ndarray, key: str) -> None:
    """Bit-equal values; string tensors (bytes in the .npz) compared element by element."""
    actual = np.asarray(actual)
    assert actual.shape == expected.shape, key
    if expected.dtype.kind == "S":
        assert [bytes(x) for x in actual.reshape(-1).tolist()] == expected.reshape(-1).tolist(), key
    else:
        assert actual.dtype == expected.dtype, key
        assert actual.tobytes() == expected.tobytes(), key


def listing(ckpt) -> dict[str, dict]:
    return {v.key: {"shape": list(v.shape), "dtype": v.dtype, "role": v.role} for v in ckpt}


def recorded(name: str) -> dict[str, dict]:
    return {k: {f: t[f] for f in ("shape", "dtype", "role")} for k, t in tensors(name).items()}


def flipped_copy(src_dir: pathlib.Path, dest: pathlib.Path, file_name: str, offset: int) -> pathlib.Path:
    """A copy of ``src_dir`` in ``dest`` with one bit of ``file_name`` flipped at ``offset``."""
    shutil.copytree(src_dir, dest)
    target = dest / file_name
    raw = bytearray(target.read_bytes())
    raw[offset] ^= 0x04
    target.write_bytes(bytes(raw))
    return target


# -- the committed files are what the script says ---------------------------------------------
def test_compressed_index_layout_is_in_the_file():
    """Every block the script recorded sits where it says, with its compression byte and a
    checksum that matches; at least one data block really is snappy (type 1)."""
    raw = COMPRESSED_INDEX.read_bytes()
    assert any(b["kind"] == "data" for b in SNAPPY_BLOCKS)
    assert any(b["kind"] == "data" and b["type"] == 0 for b in INDEX_BLOCKS)  # mixed, as LevelDB decides
    for block in INDEX_BLOCKS:
        end = block["offset"] + block["size"]
        assert raw[end] == block["type"], block
        assert struct.unpack_from("<I", raw, end + 1)[0] == masked_crc32c(raw[block["offset"] : end + 1]), block
    # The plain index TF wrote has one uncompressed data block; the data files are the same bytes.
    plain = pathlib.Path(str(PLAIN_PREFIX) + ".index").read_bytes()
    assert plain != raw
    for f in PLAIN.iterdir():
        if f.suffix != ".index":
            assert (COMPRESSED / f.name).read_bytes() == f.read_bytes(), f.name


# -- V1 TensorSliceWriter files ----------------------------------------------------------------
@pytest.mark.parametrize("path", [V1, V1_FILE], ids=["directory", "file"])
def test_v1_listing_matches_json(path):
    ckpt = ckptinspect.open(str(path))
    assert ckpt.format == FORMAT_V1
    assert ckpt.path == str(V1_FILE)
    assert listing(ckpt) == recorded("v1")
    if path == V1:  # the state file Saver wrote names it, with a relative path
        assert [(c.path, c.number, c.exists, c.in_state_file) for c in ckpt.checkpoints] == [(str(V1_FILE), 42, True, True)]


def test_v1_values_equal_tensorflow_reads():
    ckpt = ckptinspect.open(str(V1))
    expected = expected_values("v1")
    assert set(expected) == set(ckpt.keys())
    for key, value in expected.items():
        assert_same(ckpt.read(key), value, key)


def test_v1_sharded_listing_matches_json():
    ckpt = ckptinspect.open(str(V1_SHARDED))
    assert ckpt.format == FORMAT_V1 and ckpt.path == str(V1_SHARDED_FILE)
    assert listing(ckpt) == recorded("v1_sharded")
    assert EXPECTED["v1_sharded"]["tensors"]["emb/table"]["read_by"] == "RestoreV2"


@pytest.mark.parametrize(
    "key",
    [
        "proj/weights",
        "global_step",
        "emb/table",  # saved in slices: read through RestoreV2 (get_tensor refuses it)
    ],
)
def test_v1_sharded_values_equal_tensorflow_reads(key):
    ckpt = ckptinspect.open(str(V1_SHARDED_FILE))
    assert_same(ckpt.read(key), expected_values("v1_sharded")[key], key)


def test_cli_ls_v1_lists_every_tensor():
    result = invoke("ls", V1, "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["format"] == FORMAT_V1 and doc["path"] == str(V1_FILE)
    got = {v["key"]: {"shape": v["shape"], "dtype": v["dtype"], "role": v["role"]} for v in doc["variables"]}
    assert got == recorded("v1")
    table = invoke("ls", V1_FILE)
    assert table.exit_code == 0
    for key, fact in recorded("v1").items():
        shape = "[" + ",".join(map(str, fact["shape"])) + "]"
        assert any(line.split()[:3] == [key, shape, fact["dtype"]] for line in table.stdout.splitlines()), key


@pytest.mark.parametrize("name, path", [("v1", V1), ("snappy", COMPRESSED)])
def test_cli_ls_stats_match_tensorflow_values(name, path):
    result = invoke("ls", path, "--stats", "--format", "json")
    assert result.exit_code == 0, result.output
    expected = expected_values(name)
    stats = {v["key"]: v["stats"] for v in json.loads(result.stdout)["variables"]}
    assert set(stats) == set(expected)
    numeric = 0
    for key, value in expected.items():
        if value.dtype.kind == "S":
            continue
        numeric += 1
        as_float = value.astype(np.float64)
        assert stats[key]["min"] == as_float.min() and stats[key]["max"] == as_float.max(), key
        assert stats[key]["mean"] == pytest.approx(as_float.mean(), rel=1e-9, abs=1e-12), key
        assert stats[key]["nan"] == 0 and stats[key]["inf"] == 0, key
    assert numeric >= 8


@pytest.mark.parametrize(
    "path, tensors_checked",
    [(V1, 13), (V1_FILE, 13), (V1_SHARDED_FILE, 4), (COMPRESSED, 11), (COMPRESSED_PREFIX, 11), (PLAIN, 11)],
    ids=["v1-dir", "v1-file", "v1-sharded-file", "snappy-dir", "snappy-prefix", "plain-dir"],
)
def test_cli_verify_intact(path, tensors_checked):
    """V1 counts table entries (slices: the partitioned variable is two); bundles count the
    index's tensors including the object graph."""
    result = invoke("verify", path, "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [c["status"] for c in doc["checkpoints"]] == ["intact"]
    assert doc["checkpoints"][0]["tensors"] == tensors_checked


def test_cli_verify_sharded_v1_directory():
    """The state file names the pattern 'model.ckpt-7-?????-of-00001': one shard, one file, step 7."""
    result = invoke("verify", V1_SHARDED)
    assert result.exit_code == 0, result.output
    assert "INTACT" in result.stdout and str(V1_SHARDED_FILE) in result.stdout
    doc = json.loads(invoke("verify", V1_SHARDED, "--format", "json").stdout)
    assert [(c["path"], c["number"], c["status"]) for c in doc["checkpoints"]] == [(str(V1_SHARDED_FILE), 7, "intact")]


def test_v1_flipped_byte_is_reported(tmp_path):
    damaged = flipped_copy(V1, tmp_path / "v1", V1_FILE.name, 200)
    result = invoke("verify", damaged)
    assert result.exit_code == 1, result.output
    assert "checksum does not match" in result.stdout and str(damaged) in result.stdout


# -- the snappy-compressed index -----------------------------------------------------------------
@pytest.mark.parametrize("path", [COMPRESSED, COMPRESSED_PREFIX, COMPRESSED_INDEX], ids=["directory", "prefix", "index"])
def test_snappy_listing_matches_json(path):
    ckpt = ckptinspect.open(str(path))
    assert ckpt.format == FORMAT_BUNDLE and ckpt.path == str(COMPRESSED_PREFIX)
    assert listing(ckpt) == recorded("snappy")
    assert ckpt.step == 1234


def test_snappy_values_equal_tensorflow_reads():
    ckpt = ckptinspect.open(str(COMPRESSED))
    expected = expected_values("snappy")
    assert set(expected) == set(ckpt.keys())
    for key, value in expected.items():
        assert_same(ckpt.read(key), value, key)


def test_snappy_index_parses_like_the_plain_one():
    """The same variables, shapes, dtypes, roles as TF's uncompressed original."""
    assert listing(ckptinspect.open(str(COMPRESSED))) == listing(ckptinspect.open(str(PLAIN)))


def test_cli_diff_snappy_against_plain_is_identical():
    result = invoke("diff", PLAIN_PREFIX, COMPRESSED_PREFIX, "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["identical"] is True
    assert doc["summary"]["equal"] == len(doc["variables"]) == len(tensors("snappy"))
    assert {v["status"] for v in doc["variables"]} == {"equal"}
    table = invoke("diff", PLAIN, COMPRESSED)
    assert table.exit_code == 0
    assert table.stdout.splitlines()[-1] == f"all {len(tensors('snappy'))} variables equal (atol=0, rtol=0)"


def test_cli_ls_snappy_table():
    result = invoke("ls", COMPRESSED)
    assert result.exit_code == 0, result.output
    assert f"path:    {COMPRESSED_PREFIX}" in result.stdout
    names = {line.split()[0] for line in result.stdout.splitlines() if line and not line.startswith(("-", " "))}
    assert {t.split("/.ATTRIBUTES/")[0] for t in tensors("snappy")} <= names


@pytest.mark.parametrize("block", SNAPPY_BLOCKS, ids=[f"{b['kind']}@{b['offset']}" for b in SNAPPY_BLOCKS])
def test_flipped_byte_in_a_compressed_block_is_reported(tmp_path, block):
    damaged = flipped_copy(COMPRESSED, tmp_path / "ckpt", COMPRESSED_INDEX.name, block["offset"] + block["size"] // 2)
    result = invoke("verify", tmp_path / "ckpt")
    assert result.exit_code == 1, result.output
    assert str(damaged) in result.stdout
    assert f"block at offset {block['offset']}: checksum does not match" in result.stdout
    listed = invoke("ls", tmp_path / "ckpt")
    assert listed.exit_code == 2 and listed.stderr.startswith(f"Error: {damaged}: ")


def test_resigned_bad_snappy_payload_is_reported(tmp_path):
    """A compressed block whose checksum is recomputed over bad snappy bytes reaches the
    snappy decoder: the declared length (the payload's leading varint) no longer matches."""
    block = next(b for b in SNAPPY_BLOCKS if b["kind"] == "data")
    shutil.copytree(COMPRESSED, tmp_path / "ckpt")
    target = tmp_path / "ckpt" / COMPRESSED_INDEX.name
    raw = bytearray(target.read_bytes())
    start, end = block["offset"], block["offset"] + block["size"]
    declared, pos = read_varint(raw, start)
    assert declared == block["raw_size"] and pos == start + 2  # a two-byte varint (>= 128)
    raw[start] ^= 0x01  # declares one byte more or less than the block decodes to
    raw[end + 1 : end + 5] = struct.pack("<I", masked_crc32c(bytes(raw[start : end + 1])))
    target.write_bytes(bytes(raw))
    now_declared, _ = read_varint(raw, start)
    assert abs(now_declared - declared) == 1
    result = invoke("verify", tmp_path / "ckpt")
    assert result.exit_code == 1, result.output
    assert f"{target}: not a valid checkpoint index: snappy block decodes to {declared} bytes, declared {now_declared}" in (
        " ".join(result.stdout.split())
    )


# -- TensorFlow reads the committed files as the expected values say ---------------------------
def test_tensorflow_reads_the_committed_fixtures():
    """Guards the committed files against drifting from ``expected/`` (and TF from them)."""
    tf = pytest.importorskip("tensorflow")
    for name in ("v1", "v1_sharded", "snappy_plain", "snappy"):
        path = str(TABLES / EXPECTED[name]["path"])
        reader = tf.train.load_checkpoint(path)
        assert {k: list(s) for k, s in reader.get_variable_to_shape_map().items()} == {
            k: t["shape"] for k, t in tensors(name, with_object_graph=True).items()
        }
        expected = expected_values(name)
        for key, fact in tensors(name).items():
            if fact["read_by"] == "get_tensor":
                value = reader.get_tensor(key)
            else:
                dtype = reader.get_variable_to_dtype_map()[key]
                (tensor,) = tf.raw_ops.RestoreV2(prefix=path, tensor_names=[key], shape_and_slices=[""], dtypes=[dtype])
                value = tensor.numpy()
            assert_same(value, expected[key], f"{name}:{key}")
