"""`ckptinspect verify`: checksums, shards, slices, directories, Keras files.

Ground truth is TensorFlow's own reader (``tf.train.load_checkpoint(...).get_tensor`` checks
each tensor's crc32c): a key verify calls damaged is exactly a key TensorFlow cannot read, and
every checkpoint TensorFlow reads fully is intact.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import struct
import zipfile

import numpy as np
import pytest
from click.testing import CliRunner

import ckptinspect
from ckptinspect.cli import app
from ckptinspect.formats.tf.index import OBJECT_GRAPH_KEY, read_index
from ckptinspect.formats.tf.bundle import data_path
from ckptinspect.formats.tf import data as tf_data
from ckptinspect.formats.tf.crc import mask

tf = pytest.importorskip("tensorflow")

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
runner = CliRunner()

LONG_STRING = "wörld" * 60  # 360 bytes: its length is a 2-byte varint on disk, 4 bytes in the crc


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def copy_bundle(prefix: str | pathlib.Path, dest: pathlib.Path) -> str:
    """Copy a bundle's index and data files into ``dest``; returns the new prefix."""
    prefix = pathlib.Path(prefix)
    dest.mkdir(parents=True, exist_ok=True)
    for f in prefix.parent.iterdir():
        if f.name.startswith(prefix.name + ".") and (f.name.endswith(".index") or ".data-" in f.name):
            shutil.copy(f, dest / f.name)
    return str(dest / prefix.name)


def tf_unreadable_keys(prefix: str) -> set[str]:
    """Keys TensorFlow's reader (which checks crc32c) fails to read."""
    bad = set()
    for key, dtype in tf.train.load_checkpoint(prefix).get_variable_to_dtype_map().items():
        # A fresh reader per key: after a failed sliced read TF's reader aborts on its next lookup.
        reader = tf.train.load_checkpoint(prefix)
        try:
            if dtype == tf.variant:  # no numpy form: restore it as a tensor instead
                tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[key], shape_and_slices=[""], dtypes=[dtype])
            else:
                reader.get_tensor(key)
        except Exception:  # noqa: BLE001 - any TF failure counts: DataLoss, IndexError, NotFound
            bad.add(key)
    return bad


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> str:
    """A tf.train.Checkpoint with string, bool, bfloat16, float16, int, 0-d, 0-size, unicode,
    and variant (tf.data iterator state) tensors."""
    d = tmp_path_factory.mktemp("zoo")
    root = tf.Module()
    root.f32 = tf.Variable(np.arange(12, dtype=np.float32).reshape(3, 4))
    root.strings = tf.Variable(["héllo", "", LONG_STRING])
    root.flags = tf.Variable([True, False, True])
    root.bf16 = tf.Variable(tf.constant([1.5, -2.0, 3.25], dtype=tf.bfloat16))
    root.f16 = tf.Variable(np.array([1.5, 2.5], dtype=np.float16))
    root.i32 = tf.Variable(np.array([1, -2, 3], dtype=np.int32))
    root.i64 = tf.Variable(np.int64(7))
    root.scalar = tf.Variable(3.0)
    root.empty = tf.Variable(np.zeros((0, 4), np.float32))
    setattr(root, "poids_é_核", tf.Variable([1.0, 2.0]))
    iterator = iter(tf.data.Dataset.range(10).batch(3))
    next(iterator)
    return tf.train.Checkpoint(root=root, iterator=iterator).write(str(d / "ckpt"))


@pytest.fixture(scope="module")
def sliced(tmp_path_factory) -> str:
    """A bundle with a variable stored as two slices (SaveV2 with slice specs)."""
    prefix = str(tmp_path_factory.mktemp("sliced") / "sliced")
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=["x", "x", "y"],
        shape_and_slices=["4 2 0,2:-", "4 2 2,2:-", ""],
        tensors=[tf.constant([[1.0, 2.0], [3.0, 4.0]]), tf.constant([[5.0, 6.0], [7.0, 8.0]]), tf.constant(["a", "bb"])],
    )
    return prefix


# -- the checksum itself -------------------------------------------------------------------
def test_string_crc_is_over_uint32_lengths_not_the_varints(zoo):
    """TF checksums string lengths as uint32, so a crc of the raw bytes would be wrong."""
    index = read_index(zoo)
    raw = pathlib.Path(data_path(zoo, 0, 1)).read_bytes()
    checked = 0
    for entry in index.entries:
        if entry.dtype != "string":
            continue
        stored = raw[entry.offset : entry.offset + entry.size]
        assert tf_data.tensor_crc32c("string", entry.shape, stored) == entry.crc32c, entry.key
        assert mask(__import__("google_crc32c").value(stored)) != entry.crc32c
        checked += 1
    assert checked == 2  # the object graph and root.strings


def test_every_dtype_matches_the_crc_tf_wrote(zoo):
    index = read_index(zoo)
    raw = pathlib.Path(data_path(zoo, 0, 1)).read_bytes()
    dtypes = set()
    for entry in index.entries:
        dtypes.add(entry.dtype)
        stored = raw[entry.offset : entry.offset + entry.size]
        assert tf_data.tensor_crc32c(entry.dtype, entry.shape, stored) == (entry.crc32c or 0), entry.key
    assert {"string", "variant", "bool", "bfloat16", "float16", "int32", "int64", "float32"} <= dtypes


# -- intact checkpoints ---------------------------------------------------------------------
def test_zoo_is_intact_and_counts_every_tensor(zoo):
    report = ckptinspect.verify(zoo)
    assert report.intact and report.format == "tf-bundle" and not report.directory
    shapes = tf.train.load_checkpoint(zoo).get_variable_to_shape_map()
    (result,) = report.checkpoints
    assert result.tensors == len(shapes)
    assert result.nbytes == pathlib.Path(data_path(zoo, 0, 1)).stat().st_size
    assert tf_unreadable_keys(zoo) == set()


def test_sliced_variable_checks_each_stored_slice(sliced):
    report = ckptinspect.verify(sliced)
    assert report.intact
    assert report.checkpoints[0].tensors == 3  # two slices of x, and y


def test_committed_fixtures_are_intact():
    for path in ("run", "sharded", "keras/keras2_tf", "keras/model.keras", "keras/model.h5", "keras/model.weights.h5"):
        report = ckptinspect.verify(str(FIXTURES / path))
        assert report.intact, (path, report.to_dict())
        assert report.summary()["tensors"] > 0


def test_directory_lists_every_retained_checkpoint():
    report = ckptinspect.verify(str(FIXTURES / "sharded"))
    state = tf.train.get_checkpoint_state(str(FIXTURES / "sharded"))
    assert [c.path for c in report.checkpoints] == list(state.all_model_checkpoint_paths)
    assert report.newest_intact.path == state.model_checkpoint_path
    # sharded fixture: 5 data files, sliced variables spread over them; every slice counted
    index = read_index(str(FIXTURES / "sharded" / "ckpt-4"))
    stored = sum(len(index.slice_entries[e.key]) if e.slices else 1 for e in index.entries)
    assert report.checkpoints[-1].tensors == stored > len(index.entries)


def test_progress_reaches_total():
    calls = []
    ckptinspect.verify(str(FIXTURES / "run"), progress=lambda done, total, item: calls.append((done, total, item.name)))
    assert [c[0] for c in calls] == list(range(1, len(calls) + 1))
    assert {c[1] for c in calls} == {len(calls)} and len(calls) == 81
    assert all(isinstance(c[2], str) and c[2] for c in calls)


def test_verify_does_not_import_tensorflow():
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    code = ("import sys, ckptinspect; r = ckptinspect.verify(sys.argv[1]); "
            "assert r.intact; print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(FIXTURES / "sharded")], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


# -- damage, compared with TensorFlow -------------------------------------------------------
def test_each_flipped_tensor_is_the_one_tf_cannot_read(zoo, tmp_path):
    index = read_index(zoo)
    for n, entry in enumerate(e for e in index.entries if e.size):
        prefix = copy_bundle(zoo, tmp_path / f"flip{n}")
        shard = pathlib.Path(data_path(prefix, 0, 1))
        raw = bytearray(shard.read_bytes())
        raw[entry.offset + entry.size - 1] ^= 0x04  # last byte: string body, variant checksum, value
        shard.write_bytes(bytes(raw))
        report = ckptinspect.verify(prefix)
        assert not report.intact
        damaged = {d.key for _, d in report.damaged}
        assert damaged == {entry.key}
        if entry.key != OBJECT_GRAPH_KEY:  # TF reads the graph when opening, not via get_tensor
            assert tf_unreadable_keys(prefix) == {entry.key}, entry.key
        _, first = report.first_damaged
        assert first.file == str(shard) and first.shard == 0 and first.offset == entry.offset
        assert first.kind in ("checksum", "layout")
        if first.kind == "checksum" and entry.dtype not in ("string", "variant"):
            # The problem names the plain crc32c of the bytes (what any crc32c tool prints) and
            # the masked forms TensorFlow stores.
            plain = __import__("google_crc32c").value(bytes(raw[entry.offset : entry.offset + entry.size]))
            assert f"the bytes have crc32c {plain:#010x}" in first.problem, first.problem
            assert f"{first.actual_crc32c:#010x} vs {entry.crc32c or 0:#010x}" in first.problem


def test_flipped_string_length_is_a_layout_error(zoo, tmp_path):
    prefix = copy_bundle(zoo, tmp_path / "len")
    entry = next(e for e in read_index(prefix).entries if e.key.startswith("strings/"))
    shard = pathlib.Path(data_path(prefix, 0, 1))
    raw = bytearray(shard.read_bytes())
    raw[entry.offset] ^= 0x01  # the first element's varint length
    shard.write_bytes(bytes(raw))
    (result,) = ckptinspect.verify(prefix).checkpoints
    (damage,) = result.damaged
    assert damage.key == entry.key and damage.kind == "layout"
    assert "checksum of its element lengths does not match" in damage.problem
    assert tf_unreadable_keys(prefix) == {entry.key}


def test_truncated_and_missing_shards(tmp_path):
    prefix = copy_bundle(FIXTURES / "sharded" / "ckpt-4", tmp_path / "s")
    index = read_index(prefix)
    short = pathlib.Path(data_path(prefix, 2, 5))
    short.write_bytes(short.read_bytes()[:300])
    os.remove(data_path(prefix, 3, 5))
    report = ckptinspect.verify(prefix)
    (result,) = report.checkpoints
    assert result.status == "damaged"
    assert f"{data_path(prefix, 3, 5)}: data shard is missing (named by {prefix}.index)" in result.problems
    assert f"{short}: truncated: 300 bytes, the index needs 976" in result.problems
    kinds = {(d.key, d.slice, d.kind) for d in result.damaged}
    for key, slices in index.slice_entries.items():
        for st, ln, se in slices:
            if se.shard_id == 3:
                assert (key, tf_data.fmt_slice(st, ln), "missing-shard") in kinds
    assert all(d.kind == "truncated" for d in result.damaged if d.shard == 2 and d.offset + d.size > 300)
    assert all(d.offset + d.size > 300 for d in result.damaged if d.shard == 2)
    assert {d.key for d in result.damaged} == tf_unreadable_keys(prefix)


def test_damaged_index(tmp_path):
    prefix = copy_bundle(FIXTURES / "run" / "ckpt-8", tmp_path / "i")
    index = pathlib.Path(prefix + ".index")
    index.write_bytes(index.read_bytes()[:700])
    result = invoke("verify", prefix + ".index")
    assert result.exit_code == 1, result.output
    assert f"{prefix}.index: not a valid checkpoint index: not an sstable (bad magic number)" in result.stdout
    doc = json.loads(invoke("verify", prefix, "--format", "json").stdout)
    assert doc["intact"] is False and doc["checkpoints"][0]["status"] == "damaged"
    assert doc["checkpoints"][0]["problems"] == [f"{prefix}.index: not a valid checkpoint index: not an sstable (bad magic number)"]


def test_directory_with_damaged_newest_names_the_newest_intact(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(FIXTURES / "run", d)
    shard = d / "ckpt-8.data-00000-of-00001"
    raw = bytearray(shard.read_bytes())
    raw[10] ^= 0xFF
    shard.write_bytes(bytes(raw))
    os.remove(d / "ckpt-4.index")
    os.remove(d / "ckpt-4.data-00000-of-00001")
    report = ckptinspect.verify(str(d))
    assert [(c.number, c.status) for c in report.checkpoints] == [(4, "missing"), (6, "intact"), (8, "damaged")]
    assert report.newest_intact.path == str(d / "ckpt-6")
    assert tf_unreadable_keys(str(d / "ckpt-6")) == set()
    assert tf_unreadable_keys(str(d / "ckpt-8")) == {d_.key for _, d_ in report.damaged}
    result = invoke("verify", d, "-f", "json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["newest_intact"] == str(d / "ckpt-6")
    assert doc["summary"] == {"checkpoints": 3, "intact": 1, "damaged": 1, "missing": 1, "rotated": 0, "problems": 0,
                              "tensors": 54, "damaged_tensors": 1, "bytes": 2 * 7924}
    assert doc["first_damaged"]["checkpoint"] == str(d / "ckpt-8")
    first = doc["first_damaged"]
    assert first["file"] == str(shard) and first["offset"] <= 10 < first["offset"] + first["size"]


def test_state_file_with_paths_from_another_machine(tmp_path):
    d = tmp_path / "moved"
    shutil.copytree(FIXTURES / "run", d)
    (d / "checkpoint").write_text(
        'model_checkpoint_path: "/home/someone/old/run/ckpt-8"\n'
        + "".join(f'all_model_checkpoint_paths: "/home/someone/old/run/ckpt-{n}"\n' for n in (4, 6, 8))
    )
    result = invoke("verify", d)
    assert result.exit_code == 0, result.output
    assert "verdict: INTACT: 3 of 3 checkpoints whole, 81 tensors" in result.stdout
    assert f"newest intact: {d / 'ckpt-8'}" in result.stdout


# -- CLI -----------------------------------------------------------------------------------
def test_cli_table_and_exit_codes(tmp_path):
    ok = invoke("verify", FIXTURES / "run")
    assert ok.exit_code == 0 and ok.stderr == ""
    lines = ok.stdout.splitlines()
    assert lines[:4] == [
        f"path:    {FIXTURES / 'run'}",
        "format:  tf-directory",
        "verdict: INTACT: 3 of 3 checkpoints whole, 81 tensors (23.2 KiB) checked",
        f"newest intact: {FIXTURES / 'run' / 'ckpt-8'}",
    ]
    missing = invoke("verify", tmp_path / "nothing-here")
    assert missing.exit_code == 2
    assert missing.stderr == f"Error: {tmp_path / 'nothing-here'}: no such file, directory or checkpoint prefix\n"


def test_cli_csv_rows_are_damage(tmp_path):
    prefix = copy_bundle(FIXTURES / "run" / "ckpt-8", tmp_path / "c")
    shard = pathlib.Path(data_path(prefix, 0, 1))
    shard.write_bytes(shard.read_bytes()[:7000])
    result = invoke("verify", prefix, "-f", "csv")
    assert result.exit_code == 1
    rows = result.stdout.splitlines()
    assert rows[0] == "checkpoint,status,key,name,slice,file,shard,offset,size,kind,problem,stored_crc32c,actual_crc32c"
    assert rows[1].startswith(f"{prefix},damaged,,,,{shard},,,,checkpoint,")
    assert rows[2].startswith(f"{prefix},damaged,{OBJECT_GRAPH_KEY},{OBJECT_GRAPH_KEY},,{shard},0,4172,3752,truncated,")


# -- Keras files ---------------------------------------------------------------------------
def test_keras_zip_member_crc(tmp_path):
    path = tmp_path / "model.keras"
    shutil.copy(FIXTURES / "keras" / "model.keras", path)
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("model.weights.h5")
        assert info.compress_type == zipfile.ZIP_STORED
    raw = bytearray(path.read_bytes())
    # the local header is 30 bytes + name + extra; flip a byte deep inside the stored member
    name_len, extra_len = struct.unpack_from("<HH", raw, info.header_offset + 26)
    start = info.header_offset + 30 + name_len + extra_len
    raw[start + info.file_size - 100] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(zipfile.BadZipFile):  # ground truth: zipfile's own CRC check
        zipfile.ZipFile(path).read("model.weights.h5")
    result = invoke("verify", path)
    assert result.exit_code == 1, result.output
    assert "model.weights.h5" in result.stdout and "Bad CRC-32" in result.stdout


def test_truncated_hdf5_is_damaged(tmp_path):
    src = (FIXTURES / "keras" / "model.weights.h5").read_bytes()
    path = tmp_path / "t.weights.h5"
    path.write_bytes(src[: len(src) // 2])
    result = invoke("verify", path)
    assert result.exit_code == 1
    assert "not a readable HDF5 file" in result.stdout and "truncated" in result.stdout


# -- real-world corpus ----------------------------------------------------------------------
REALWORLD_INTACT = [
    "tf2-gan-lstm-2opt/training_checkpoints/btc",
    "tf2-a2c-ckptmanager/training_checkpoints",
    "tf2-gan-kerasnewopt/model",
    "tf2-textgen-keras-weights/training_checkpoints",
    "tf2-seq2seq-tf112-eager/training_checkpoints",
    "tf2-nmt-objgraph-only/training_checkpoints/ckpt-2",
    "tf1-estimator-linear-2shard",
    "tf1-estimator-tf2-ftrl",
    "tf1-v1-session-bundle/half_plus_two/00000123/export-00000-of-00001",
    "savedmodel-tf1-half-plus-two/saved_model_half_plus_two_cpu/00000123",
    "savedmodel-tf2-half-plus-two/saved_model_half_plus_two_tf2_cpu/00000123",
    "savedmodel-keras-stale-shard",
    "broken/tf1-empty-prefix",
    "broken/tf1-v1-abs-state-path/bad_half_plus_two/00000123",
    "keras2-h5-full-k206/model.h5",
    "keras2-h5-full-tfk211-dotkeras/model.keras",
    "keras3-legacy-h5-full/model.h5",
    "keras2-h5-weights-k214/weights.h5",
    "keras3-weights-h5/model.weights.h5",
    "keras3-zip/out/final_model.keras",
    "keras214-zip-backslash-paths/model.keras",
]


def test_realworld_corpus(realworld):
    """Every item TF/h5py read fully (MANIFEST) verifies intact; the state file that names
    four deleted checkpoints is reported incomplete with the one that exists as newest intact."""
    for item in REALWORLD_INTACT:
        report = ckptinspect.verify(str(realworld / item))
        assert report.intact, (item, report.to_dict())
    wgan = realworld / "tf2-wgan-2shard" / "training_checkpoints"
    report = ckptinspect.verify(str(wgan))
    assert [c.status for c in report.checkpoints] == ["missing"] * 4 + ["intact"]
    assert report.newest_intact.path == tf.train.latest_checkpoint(str(wgan))
    assert report.checkpoints[-1].tensors == len(tf.train.load_checkpoint(str(wgan)).get_variable_to_shape_map())


def test_realworld_v1_block_damage(realworld, tmp_path):
    src = realworld / "tf1-v1-session-bundle" / "half_plus_two" / "00000123" / "export-00000-of-00001"
    path = tmp_path / "export-00000-of-00001"
    raw = bytearray(src.read_bytes())
    raw[len(raw) // 3] ^= 0x20
    path.write_bytes(bytes(raw))
    result = invoke("verify", path)
    assert result.exit_code == 1
    assert "checksum does not match" in result.stdout
