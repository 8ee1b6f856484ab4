"""The TF bundle writer of our own (``formats.bundle_writer``): TensorFlow is the ground truth.

Every file written here is read back by TensorFlow (``tf.train.load_checkpoint(...).get_tensor``,
``tf.train.Checkpoint.read``) and compared bit for bit, and checked by ``verify``. Where
TensorFlow writes the same tensors in the same order (``tf.raw_ops.SaveV2`` in one call, or a
source checkpoint copied run by run in its storage order), the index and data files must be
byte-identical to TensorFlow's.
"""

from __future__ import annotations

import filecmp
import os
import pathlib
import re
import shutil
import struct

import numpy as np
import pytest

import ckptinspect
from ckptinspect import formats
from ckptinspect.errors import CorruptCheckpointError, OutputExistsError, UsageError
from ckptinspect.formats.tf import protos as _protos
from ckptinspect.formats._layout import data_path
from ckptinspect.formats.tf.ordered_code import (
    decode_tensor_name_slice,
    encode_tensor_name_slice,
    read_signed_num_increasing,
    write_signed_num_increasing,
)
from ckptinspect.formats.tf.sstable import iter_table
from ckptinspect.formats.tf.write.table_builder import TableBuilder
from ckptinspect.formats.tf.write.tensors import OutputTensor, StoredBytes, TensorData
from ckptinspect.formats.tf.write.bundle import copy_tensor, save_bundle_native, write_bundle_native
from ckptinspect.formats.tf.index import OBJECT_GRAPH_KEY, read_index

tf = pytest.importorskip("tensorflow")
ml_dtypes = pytest.importorskip("ml_dtypes")

from ckptinspect import trainer  # noqa: E402
from ckptinspect.trainer import net as trainer_net  # noqa: E402

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures"
NAN_WITH_PAYLOAD = np.frombuffer(struct.pack("<I", 0x7FC00123), "<f4")[0]


# -- helpers ---------------------------------------------------------------------------------
def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype == object or b.dtype == object:
        return a.shape == b.shape and [bytes(x) for x in a.reshape(-1)] == [bytes(x) for x in b.reshape(-1)]
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def bundle_files(prefix) -> list[pathlib.Path]:
    prefix = pathlib.Path(prefix)
    return sorted(
        p for p in prefix.parent.iterdir()
        if p.name.startswith(prefix.name + ".") and (p.name.endswith(".index") or ".data-" in p.name)
    )


def assert_same_files(a, b) -> None:
    """The two bundles have the same file names (after the prefix) and the same bytes."""
    fa, fb = bundle_files(a), bundle_files(b)
    assert [p.name[len(pathlib.Path(a).name):] for p in fa] == [p.name[len(pathlib.Path(b).name):] for p in fb]
    for x, y in zip(fa, fb):
        assert filecmp.cmp(x, y, shallow=False), (x.name, y.name)


def tf_values(prefix) -> dict:
    reader = tf.train.load_checkpoint(str(prefix))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()}


def storage_order_copies(ckpt) -> list[OutputTensor]:
    """Every variable of a bundle, copied byte for byte, in the order its bytes lie on disk."""
    return [copy_tensor(ckpt, v) for v in sorted(ckpt.variables, key=ckpt.storage_order)]


def copy_bundle(prefix, dest: pathlib.Path) -> pathlib.Path:
    prefix = pathlib.Path(prefix)
    dest.mkdir(parents=True, exist_ok=True)
    for f in bundle_files(prefix):
        shutil.copy(f, dest / f.name)
    return dest / prefix.name


# -- every dtype TF bundles hold -------------------------------------------------------------
def dtype_zoo() -> dict[str, np.ndarray]:
    """One tensor per dtype TF bundles hold, with awkward values (NaN payloads, -0.0,
    extremes, empty and binary strings, 0-d and 0-size shapes)."""
    return {
        "f16": np.array([1.5, -0.0, np.inf, np.nan], dtype=np.float16),
        "f32": np.append(np.arange(11, dtype=np.float32), NAN_WITH_PAYLOAD).reshape(3, 4),
        "f64": np.array([[np.pi, -1e300], [5e-324, -0.0]], dtype=np.float64),
        "bf16": np.array([1.5, -2.0, 3.25, np.inf], dtype=ml_dtypes.bfloat16),
        "f8_e5m2": np.array([0.5, -3.0, 1.0], dtype=ml_dtypes.float8_e5m2),
        "f8_e4m3fn": np.array([0.5, -3.0, 448.0], dtype=ml_dtypes.float8_e4m3fn),
        "i4": np.array([-8, 0, 7], dtype=ml_dtypes.int4),
        "u4": np.array([0, 5, 15], dtype=ml_dtypes.uint4),
        "i8": np.array([-128, 0, 127], dtype=np.int8),
        "i16": np.array([-32768, 1, 32767], dtype=np.int16),
        "i32": np.array([-(2**31), 1, 2**31 - 1], dtype=np.int32),
        "i64": np.array([-(2**63), 1, 2**63 - 1], dtype=np.int64),
        "u8": np.array([0, 1, 255], dtype=np.uint8),
        "u16": np.array([0, 1, 65535], dtype=np.uint16),
        "u32": np.array([0, 1, 2**32 - 1], dtype=np.uint32),
        "u64": np.array([0, 1, 2**64 - 1], dtype=np.uint64),
        "bool": np.array([[True, False], [False, True]]),
        "c64": np.array([1 + 2j, -0.0 - 1j], dtype=np.complex64),
        "c128": np.array([[1e-300 + 2j]], dtype=np.complex128),
        "str": np.array([b"", b"a\x00b\x00", "héllo".encode(), b"\xff" * 300], dtype=object),
        "str_2d": np.array([[b"x", b""], [b"\x00", b"yz"]], dtype=object),
        "str_scalar": np.array(b"", dtype=object),
        "str_empty": np.zeros((0,), dtype=object),
        "scalar_f32": np.array(3.5, dtype=np.float32),
        "scalar_i64": np.array(-7, dtype=np.int64),
        "empty_f32": np.zeros((0, 3), dtype=np.float32),
        "empty_i32": np.zeros((2, 0), dtype=np.int32),
        "big_f32": np.random.default_rng(0).standard_normal((512, 600)).astype(np.float32),  # > the write buffer
    }


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> dict:
    """The zoo written by TensorFlow's SaveV2 (one call: one BundleWriter) and by ours, in the same order."""
    d = tmp_path_factory.mktemp("zoo")
    values = dtype_zoo()
    tf_prefix, our_prefix = d / "tf" / "ckpt", d / "ours" / "ckpt"
    tf_prefix.parent.mkdir()
    our_prefix.parent.mkdir()
    with tf.device("/cpu:0"):
        tf.raw_ops.SaveV2(
            prefix=str(tf_prefix), tensor_names=list(values), shape_and_slices=[""] * len(values),
            tensors=[tf.constant(v) for v in values.values()],
        )
    summary = write_bundle_native(str(our_prefix), [OutputTensor.from_array(k, v) for k, v in values.items()])
    return {"values": values, "tf": tf_prefix, "ours": our_prefix, "summary": summary}


def test_every_dtype_reads_back_in_tensorflow_bit_for_bit(zoo):
    got = tf_values(zoo["ours"])
    assert set(got) == set(zoo["values"])
    for key, value in zoo["values"].items():
        assert same_bits(got[key], value), key


def test_every_dtype_gives_the_bytes_tensorflow_writes(zoo):
    """Index and data file byte-identical to SaveV2's for the same tensors in the same order."""
    assert_same_files(zoo["ours"], zoo["tf"])


def test_every_dtype_passes_verify_and_reports_what_it_wrote(zoo):
    report = ckptinspect.verify(str(zoo["ours"]))
    assert report.intact
    s = zoo["summary"]
    assert (s.num_shards, s.tensors, s.runs, s.copied_bytes) == (1, len(zoo["values"]), len(zoo["values"]), 0)
    assert s.data_bytes == os.path.getsize(data_path(str(zoo["ours"]), 0, 1))
    assert s.index_bytes == os.path.getsize(str(zoo["ours"]) + ".index")


def test_header_is_the_one_tensorflow_writes(zoo):
    (key, value), *_ = iter_table((pathlib.Path(str(zoo["ours"]) + ".index")).read_bytes())
    header = _protos.BundleHeaderProto()
    header.ParseFromString(value)
    assert key == b"" and header.num_shards == 1 and header.endianness == 0 and header.version == b"\x08\x01"


# -- streaming --------------------------------------------------------------------------------
def test_streamed_blocks_equal_the_value_written_whole(tmp_path):
    value = np.random.default_rng(1).standard_normal((300, 70)).astype(ml_dtypes.bfloat16)
    flat = value.reshape(-1)
    buffer = np.empty(1000, dtype=value.dtype)

    def blocks():  # one reused buffer, as TensorSource.iter_blocks gives them
        for i in range(0, flat.size, 1000):
            n = min(1000, flat.size - i)
            buffer[:n] = flat[i : i + n]
            yield buffer[:n]

    write_bundle_native(str(tmp_path / "s"), [OutputTensor.whole("w", TensorData.from_blocks("bfloat16", value.shape, blocks))])
    write_bundle_native(str(tmp_path / "a"), [OutputTensor.from_array("w", value)])
    assert same_bits(tf_values(tmp_path / "s")["w"], value)
    assert_same_files(tmp_path / "s", tmp_path / "a")


@pytest.mark.parametrize(
    "blocks, message",
    [
        (lambda: [np.zeros(5, np.float32)], "blocks hold 5 elements, shape [2, 3] needs 6"),
        (lambda: [np.zeros(4, np.float32), np.zeros(4, np.float32)], "blocks hold more than the 6 elements"),
        (lambda: [np.zeros(6, np.float64)], "a float32 tensor was given a block of float64"),
    ],
)
def test_blocks_that_do_not_fit_are_refused_and_leave_nothing(tmp_path, blocks, message):
    t = OutputTensor.whole("w", TensorData.from_blocks("float32", (2, 3), blocks))
    with pytest.raises(UsageError, match=re.escape(message)):
        write_bundle_native(str(tmp_path / "x"), [OutputTensor.from_array("a", np.ones(3)), t])
    assert list(tmp_path.iterdir()) == []


def test_interrupted_write_removes_its_partial_files(tmp_path):
    def blocks():
        yield np.zeros(3, np.float32)
        raise KeyboardInterrupt

    t = OutputTensor.whole("w", TensorData.from_blocks("float32", (6,), blocks))
    with pytest.raises(KeyboardInterrupt):
        write_bundle_native(str(tmp_path / "x"), [OutputTensor.from_array("a", np.ones(3)), t], max_shard_bytes=8)
    assert list(tmp_path.iterdir()) == []


# -- shards ----------------------------------------------------------------------------------
def test_max_shard_bytes_fills_shards_in_turn_and_tensorflow_reads_them(tmp_path):
    values = {f"v{i:02d}": np.full(n, i, dtype=np.float32) for i, n in enumerate([10, 10, 10, 100, 5, 0, 5, 20])}
    prefix = tmp_path / "m"
    s = write_bundle_native(str(prefix), [OutputTensor.from_array(k, v) for k, v in values.items()], max_shard_bytes=100)
    # 40+40 | 40 | 400 (bigger than the budget: alone) | 20+0+20 | 80
    assert s.shard_bytes == (80, 40, 400, 40, 80)
    assert [p.name for p in bundle_files(prefix)] == [f"m.data-0000{i}-of-00005" for i in range(5)] + ["m.index"]
    index = read_index(str(prefix))
    assert index.num_shards == 5
    assert {e.key: e.shard_id for e in index.entries} == {
        "v00": 0, "v01": 0, "v02": 1, "v03": 2, "v04": 3, "v05": 3, "v06": 3, "v07": 4,
    }
    got = tf_values(prefix)
    assert all(same_bits(got[k], v) for k, v in values.items())
    assert ckptinspect.verify(str(prefix)).intact


def test_zero_budget_gives_one_tensor_per_shard_and_no_tensors_one_empty_shard(tmp_path):
    s = write_bundle_native(str(tmp_path / "a"), [OutputTensor.from_array(k, np.ones(2)) for k in "xyz"], max_shard_bytes=0)
    assert s.num_shards == 3
    s = write_bundle_native(str(tmp_path / "e"), [])
    assert (s.num_shards, s.data_bytes) == (1, 0)
    assert tf.train.load_checkpoint(str(tmp_path / "e")).get_variable_to_shape_map() == {}
    assert ckptinspect.verify(str(tmp_path / "e")).intact


# -- slices ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tf1(tmp_path_factory) -> dict:
    """A TF1 Saver checkpoint with a partitioned embedding (3 slices) and a partitioned 2-D kernel."""
    directory = tmp_path_factory.mktemp("tf1")
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        emb = v1.get_variable("emb/table", [10, 3], partitioner=v1.fixed_size_partitioner(3),
                              initializer=v1.random_normal_initializer(seed=2))
        ker = v1.get_variable("dense/kernel", [4, 6], partitioner=v1.fixed_size_partitioner(2, axis=1),
                              initializer=v1.random_normal_initializer(seed=3))
        v1.get_variable("dense/bias", [6], initializer=v1.constant_initializer(0.5))
        v1.get_variable("names", initializer=tf.constant([b"a", b"\x00b"]))
        step = v1.train.get_or_create_global_step()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(step.assign(42))
            prefix = v1.train.Saver().save(sess, str(directory / "model.ckpt"), global_step=step)
    del emb, ker
    return {"prefix": prefix, "values": tf_values(prefix)}


def test_tf1_partitioned_checkpoint_copied_gives_tensorflows_bytes(tf1, tmp_path):
    """Copied slice by slice in storage order, the index (slice keys in OrderedCode included)
    and data file are byte-identical to the Saver's."""
    with ckptinspect.open(tf1["prefix"]) as ckpt:
        assert [v.name for v in ckpt.variables if v.sliced] == ["dense/kernel", "emb/table"]
        out = tmp_path / "model.ckpt-42"
        write_bundle_native(str(out), storage_order_copies(ckpt))
    assert_same_files(out, tf1["prefix"])


def test_slices_rewritten_from_values_in_any_order_read_as_the_full_tensor(tf1, tmp_path):
    values = tf1["values"]
    table = values["emb/table"]
    slices = [((7, 0), (3, -1)), ((0, 0), (4, -1)), ((4, 0), (3, 3))]  # not in start order; one partial dim kept
    tensors = [
        OutputTensor("renamed/table", "float32", table.shape,
                     slices=tuple((st, ln, TensorData.from_array(table[st[0] : st[0] + ln[0]])) for st, ln in slices)),
        OutputTensor.from_array("dense/bias", values["dense/bias"]),
    ]
    out = tmp_path / "r"
    write_bundle_native(str(out), tensors, max_shard_bytes=40)
    got = tf_values(out)
    assert same_bits(got["renamed/table"], table)
    assert ckptinspect.verify(str(out)).intact
    with ckptinspect.open(str(out)) as ckpt:  # our reader pairs each slice with its own bytes
        var = ckpt["renamed/table"]
        assert [(s.starts, s.lengths) for s in var.slices] == [((7, 0), (3, -1)), ((0, 0), (4, -1)), ((4, 0), (3, 3))]
        assert len(set(var.shards)) > 1


def test_renamed_partitioned_variable_keeps_its_slices_byte_for_byte(tf1, tmp_path):
    with ckptinspect.open(tf1["prefix"]) as ckpt:
        tensors = [copy_tensor(ckpt, v, key=v.key.replace("emb/", "embedding/")) for v in ckpt.variables]
        s = write_bundle_native(str(tmp_path / "r"), tensors)
        source_crcs = sorted(r.entry.crc32c for v in ckpt.variables for r in ckpt.source.stored_runs(v))
    assert s.copied_bytes == s.data_bytes
    got = tf_values(tmp_path / "r")
    assert same_bits(got["embedding/table"], tf1["values"]["emb/table"])
    index = read_index(str(tmp_path / "r"))
    assert [len(index.slice_entries[k]) for k in ("dense/kernel", "embedding/table")] == [2, 3]
    written = [se.crc32c for sl in index.slice_entries.values() for *_, se in sl]
    written += [e.crc32c for e in index.entries if not e.slices]
    assert sorted(written) == source_crcs


def test_reader_pairs_slices_saved_out_of_start_order(tmp_path):
    """SaveV2 declares slices in save order while their keys sort by start: our reader must
    pair each declared slice with the entry of its own extents (it used to pair them in order)."""
    v = np.arange(30, dtype=np.float32).reshape(10, 3)
    prefix = str(tmp_path / "rev")
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=["t", "t"], shape_and_slices=["10 3 5,5:-", "10 3 0,5:-"],
                      tensors=[v[5:], v[:5]])
    index = read_index(prefix)
    assert [(st, ln, se.offset) for st, ln, se in index.slice_entries["t"]] == [
        ((5, 0), (5, -1), 0), ((0, 0), (5, -1), 60)
    ]
    with ckptinspect.open(prefix) as ckpt:
        write_bundle_native(str(tmp_path / "copy"), [copy_tensor(ckpt, "t")])
    assert same_bits(tf_values(tmp_path / "copy")["t"], v)


def test_bad_slices_are_refused(tmp_path):
    part = TensorData.from_array(np.zeros((5, 3), np.float32))
    cases = [
        (((0, 0), (5, -1)), ((0, 0), (5, -1)), "given twice"),
        (((6, 0), (5, -1)), ((0, 0), (5, -1)), "lies outside its shape"),
        (((0, 1), (5, -1)), ((5, 0), (5, -1)), "a whole dimension starts at 0"),
        (((0,), (5,)), ((5, 0), (5, -1)), "does not match its shape"),
    ]
    for a, b, message in cases:
        t = OutputTensor("t", "float32", (10, 3), slices=((*a, part), (*b, part)))
        with pytest.raises(UsageError, match=message):
            write_bundle_native(str(tmp_path / "x"), [t])
    t = OutputTensor("t", "float32", (10, 3), slices=(((0, 0), (4, -1), part),))
    with pytest.raises(UsageError, match=r"the slice is float32 \[4, 3\], its value is float32 \[5, 3\]"):
        write_bundle_native(str(tmp_path / "x"), [t])
    assert list(tmp_path.iterdir()) == []


def test_one_slice_covering_the_whole_tensor_is_saved_as_a_plain_tensor(tmp_path):
    """As TensorFlow's AddSlice does (IsFullSlice)."""
    value = np.arange(6, dtype=np.int32).reshape(2, 3)
    write_bundle_native(str(tmp_path / "o"), [OutputTensor("t", "int32", (2, 3), slices=(((0, 0), (2, -1), TensorData.from_array(value)),))])
    tf.raw_ops.SaveV2(prefix=str(tmp_path / "tf"), tensor_names=["t"], shape_and_slices=["2 3 0,2:-"], tensors=[value])
    assert_same_files(tmp_path / "o", tmp_path / "tf")


def test_ordered_code_round_trips_and_keeps_order():
    rng = np.random.default_rng(5)
    values = [0, 1, -1, 63, 64, -64, -65, 8191, 8192, -8193, 2**55, -(2**55) - 1, 2**63 - 1, -(2**63)]
    values += [int(x) for x in rng.integers(-(2**63), 2**63 - 1, 2000, dtype=np.int64)]
    encoded = []
    for value in values:
        out = bytearray()
        write_signed_num_increasing(out, value)
        assert read_signed_num_increasing(bytes(out), 0) == (value, len(out))
        encoded.append(bytes(out))
    assert sorted(values) == [v for _, v in sorted(zip(encoded, values))]
    key = encode_tensor_name_slice("a\x00b/\xff", (0, 3, 2**40), (-1, 7, 5))
    assert decode_tensor_name_slice(key) == ("a\x00b/\xff", (0, 3, 2**40), (-1, 7, 5))


# -- TF2 object-based checkpoints ------------------------------------------------------------
def reserialized_graph(ckpt) -> bytes:
    graph = _protos.TrackableObjectGraph()
    graph.ParseFromString(ckpt.source.object_graph())
    return graph.SerializeToString()


def test_tf2_fixture_rewritten_gives_tensorflows_bytes_and_restores(tmp_path):
    """fixtures/run/ckpt-8 (Keras 3 + Adam under MirroredStrategy, CheckpointManager) copied in
    storage order with its object graph re-serialised: byte-identical files; the full structure
    restores with assert_consumed."""
    src = FIXTURES / "run" / "ckpt-8"
    out = tmp_path / "ckpt-8"
    with ckptinspect.open(str(src)) as ckpt:
        graph = reserialized_graph(ckpt)
        assert graph == ckpt.source.object_graph()
        write_bundle_native(str(out), storage_order_copies(ckpt), object_graph=graph)
    assert_same_files(out, src)

    import keras  # noqa: PLC0415

    model = trainer.build_model(seed=3)
    optimizer = keras.optimizers.Adam(name=trainer_net.OPTIMIZER_NAME)
    optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64)
    root = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
    root.save_counter  # noqa: B018 - created on first use; the checkpoint holds one
    root.read(str(out)).assert_consumed()
    assert int(step.numpy()) == 8 and int(root.save_counter.numpy()) > 0
    ref = trainer.build_model(seed=7)
    tf.train.Checkpoint(model=ref).read(str(src)).expect_partial()
    assert all(same_bits(w.numpy(), r.numpy()) for w, r in zip(model.weights, ref.weights))


def test_tf2_model_part_with_pruned_graph_restores_assert_consumed(tmp_path):
    """The model's variables copied under the keys of a pruned, re-keyed object graph (what
    extract will write): Checkpoint(model=...).read(OUT).assert_consumed() into a fresh model."""
    src = FIXTURES / "run" / "ckpt-8"
    out = tmp_path / "model"
    with ckptinspect.open(str(src)) as ckpt:
        model_vars = ckpt.filter(role="model")
        pruned = formats.prune_object_graph(ckpt.source.object_graph(), [v.key for v in model_vars])
        s = save_bundle_native(str(out), [copy_tensor(ckpt, v, key=pruned.key_map[v.key]) for v in model_vars],
                               object_graph=pruned.blob)
    assert s.copied_bytes == sum(v.nbytes for v in model_vars) and s.num_shards == 1
    fresh = trainer.build_model(seed=3)
    tf.train.Checkpoint(model=fresh).read(str(out)).assert_consumed()
    ref = trainer.build_model(seed=7)
    tf.train.Checkpoint(model=ref).read(str(src)).expect_partial()
    assert len(fresh.weights) == len(ref.weights) > 0
    assert all(same_bits(w.numpy(), r.numpy()) for w, r in zip(fresh.weights, ref.weights))
    assert ckptinspect.verify(str(out)).intact


def test_sharded_sliced_tf2_source_rewritten_in_small_shards_restores(tmp_path):
    """fixtures/sharded (MaxShardSizePolicy: 5 shards, big tensors sliced) re-written with a
    256-byte budget: more shards, every slice copied, restores with assert_consumed."""
    src = FIXTURES / "sharded" / "ckpt-4"
    out = tmp_path / "ckpt-4"
    with ckptinspect.open(str(src)) as ckpt:
        assert any(v.sliced for v in ckpt.variables)
        s = write_bundle_native(str(out), storage_order_copies(ckpt), object_graph=reserialized_graph(ckpt),
                                max_shard_bytes=256)
    index = read_index(str(out))
    runs_per_shard = [0] * s.num_shards
    for e in index.entries:
        for se in [se for *_, se in index.slice_entries[e.key]] if e.slices else [e]:
            runs_per_shard[se.shard_id] += 1
    assert s.num_shards > 5 and max(s.shard_bytes) > 256
    assert all(size <= 256 or runs == 1 for size, runs in zip(s.shard_bytes, runs_per_shard))  # bigger: alone
    import keras  # noqa: PLC0415

    model = trainer.build_model(seed=3)
    optimizer = keras.optimizers.Adam(name=trainer_net.OPTIMIZER_NAME)
    optimizer.build(model.trainable_variables)
    root = tf.train.Checkpoint(model=model, optimizer=optimizer, step=tf.Variable(0, dtype=tf.int64))
    root.save_counter  # noqa: B018 - created on first use; the checkpoint holds one
    root.read(str(out)).assert_consumed()
    want, got = tf_values(src), tf_values(out)
    assert set(want) == set(got) and all(same_bits(got[k], want[k]) for k in want)
    assert ckptinspect.verify(str(out)).intact


# -- byte-for-byte copies ------------------------------------------------------------------
@pytest.fixture(scope="module")
def iterator_ckpt(tmp_path_factory) -> dict:
    """A tf.train.Checkpoint holding a variant (tf.data iterator state), strings and numbers."""
    d = tmp_path_factory.mktemp("it")
    it = iter(tf.data.Dataset.range(10))
    next(it), next(it), next(it)
    root = tf.train.Checkpoint(it=it, s=tf.Variable([b"a\x00", b""]), w=tf.Variable(np.arange(5, dtype=np.float64)))
    prefix = root.write(str(d / "ckpt"))
    return {"prefix": prefix}


def test_copies_keep_every_checksum_and_variant_state_restores(iterator_ckpt, tmp_path):
    out = tmp_path / "copy"
    with ckptinspect.open(iterator_ckpt["prefix"]) as ckpt:
        assert "variant" in {v.dtype for v in ckpt.variables}
        s = write_bundle_native(str(out), storage_order_copies(ckpt), object_graph=ckpt.source.object_graph())
        assert s.copied_bytes == sum(v.nbytes for v in ckpt.variables)
    src, dst = read_index(iterator_ckpt["prefix"]), read_index(str(out))
    assert {e.key: e.crc32c for e in dst.entries} == {e.key: e.crc32c for e in src.entries}
    assert_same_files(out, iterator_ckpt["prefix"])
    it = iter(tf.data.Dataset.range(10))
    tf.train.Checkpoint(it=it, s=tf.Variable([b""] * 2), w=tf.Variable(np.zeros(5))).read(str(out)).assert_consumed()
    assert int(next(it)) == 3


def test_copy_falls_back_to_read_write_without_copy_file_range(iterator_ckpt, tmp_path, monkeypatch):
    """An OS without copy_file_range (macOS, Windows): the same bytes by a read/write loop."""
    monkeypatch.delattr(os, "copy_file_range", raising=False)
    with ckptinspect.open(iterator_ckpt["prefix"]) as ckpt:
        write_bundle_native(str(tmp_path / "copy"), storage_order_copies(ckpt), object_graph=ckpt.source.object_graph())
    assert_same_files(tmp_path / "copy", iterator_ckpt["prefix"])


def test_damaged_source_copied_stays_damaged_or_is_refused_when_checked(tmp_path):
    src = copy_bundle(FIXTURES / "run" / "ckpt-8", tmp_path / "src")
    index = read_index(str(src))
    target = next(e for e in index.entries if e.key.startswith("model/") and e.size >= 64)
    data = pathlib.Path(data_path(str(src), 0, 1))
    raw = bytearray(data.read_bytes())
    raw[target.offset + 5] ^= 0x10
    data.write_bytes(bytes(raw))
    with ckptinspect.open(str(src)) as ckpt:
        tensors = storage_order_copies(ckpt)
        write_bundle_native(str(tmp_path / "trusting"), tensors)  # checksum reused: damage stays visible
        with pytest.raises(CorruptCheckpointError, match=f"{target.key!r}: checksum does not match"):
            write_bundle_native(str(tmp_path / "checked"), tensors, check_copies=True)
    assert not list(tmp_path.glob("checked*"))
    report = ckptinspect.verify(str(tmp_path / "trusting"))
    assert not report.intact
    assert [d.key for _, d in report.damaged] == [target.key]


def test_checked_copies_of_an_intact_source_give_the_same_bytes(iterator_ckpt, tmp_path):
    with ckptinspect.open(iterator_ckpt["prefix"]) as ckpt:
        write_bundle_native(str(tmp_path / "c"), storage_order_copies(ckpt), object_graph=ckpt.source.object_graph(),
                            check_copies=True)
    assert_same_files(tmp_path / "c", iterator_ckpt["prefix"])


def test_truncated_or_missing_source_is_refused(tmp_path):
    src = copy_bundle(FIXTURES / "run" / "ckpt-8", tmp_path / "src")
    with ckptinspect.open(str(src)) as ckpt:
        tensors = storage_order_copies(ckpt)
    data = pathlib.Path(data_path(str(src), 0, 1))
    data.write_bytes(data.read_bytes()[:1000])
    with pytest.raises(CorruptCheckpointError, match="truncated"):
        write_bundle_native(str(tmp_path / "o"), tensors)
    data.unlink()
    with pytest.raises(CorruptCheckpointError, match="data shard is missing"):
        write_bundle_native(str(tmp_path / "o"), tensors)
    assert not list(tmp_path.glob("o*"))


def test_stored_run_of_the_wrong_size_is_refused():
    with pytest.raises(CorruptCheckpointError, match=r"cannot hold a float32 tensor of shape \[3\]"):
        TensorData.from_stored("float32", (3,), StoredBytes("x.data-00000-of-00001", 0, 8, 0))


def test_copy_tensor_streams_from_other_formats(tmp_path):
    """A Keras .weights.h5 source has no stored runs to copy: values are streamed (numeric)."""
    with ckptinspect.open(str(FIXTURES / "keras" / "model.weights.h5")) as ckpt:
        tensors = [copy_tensor(ckpt, v, key=f"w{i}") for i, v in enumerate(ckpt.variables)]
        assert all(t.data.stored is None for t in tensors)
        s = write_bundle_native(str(tmp_path / "k"), tensors)
        want = {f"w{i}": ckpt.read(v) for i, v in enumerate(ckpt.variables)}
    assert s.copied_bytes == 0
    got = tf_values(tmp_path / "k")
    assert all(same_bits(got[k], v) for k, v in want.items())


# -- atomic saves and bad requests ----------------------------------------------------------
def test_save_is_atomic_refuses_to_overwrite_and_protects_its_sources(tmp_path):
    src = copy_bundle(FIXTURES / "run" / "ckpt-8", tmp_path / "src")
    dest = tmp_path / "out" / "ckpt"
    with ckptinspect.open(str(src)) as ckpt:
        tensors = storage_order_copies(ckpt)
        save_bundle_native(str(dest), tensors, object_graph=ckpt.source.object_graph())
        before = {p.name: p.read_bytes() for p in bundle_files(dest)}
        with pytest.raises(OutputExistsError):
            save_bundle_native(str(dest), tensors)

        def refuse(tmp_prefix):
            assert tf.train.load_checkpoint(tmp_prefix).get_variable_to_shape_map()  # the check sees the files
            raise CorruptCheckpointError("read-back failed")

        with pytest.raises(CorruptCheckpointError, match="read-back failed"):
            save_bundle_native(str(dest), tensors[:3], force=True, check=refuse)
        assert {p.name: p.read_bytes() for p in bundle_files(dest)} == before
        assert sorted(p.name for p in dest.parent.iterdir()) == sorted(before)  # no temporaries left

        s = save_bundle_native(str(dest), tensors[:3], force=True, max_shard_bytes=0)
        assert s.prefix == str(dest) and s.num_shards == 3
        assert sorted(p.name for p in dest.parent.iterdir()) == [f"ckpt.data-0000{i}-of-00003" for i in range(3)] + ["ckpt.index"]
        with pytest.raises(UsageError, match="refusing to overwrite an input"):
            save_bundle_native(str(src), tensors, force=True)
    assert ckptinspect.verify(str(src)).intact


def test_raw_writer_never_overwrites(tmp_path):
    write_bundle_native(str(tmp_path / "a"), [OutputTensor.from_array("x", np.ones(2))])
    with pytest.raises(OutputExistsError):
        write_bundle_native(str(tmp_path / "a"), [OutputTensor.from_array("x", np.ones(2))])


@pytest.mark.parametrize(
    "tensors, kwargs, message",
    [
        ([OutputTensor.from_array("x", np.ones(2)), OutputTensor.from_array("x", np.ones(2))], {}, "given twice"),
        ([OutputTensor.from_array("", np.ones(2))], {}, "non-empty string"),
        ([OutputTensor.from_array("\x00x", np.ones(2))], {}, "zero byte"),
        ([OutputTensor.from_array(OBJECT_GRAPH_KEY, b"g")], {"object_graph": b"g"}, "given twice"),
        ([OutputTensor("x", "float64", (3,), TensorData.from_array(np.ones(2)))], {}, r"declared float64 \[3\]"),
        ([OutputTensor.from_array("x", np.ones(2))], {"max_shard_bytes": -1}, "at least 0"),
    ],
)
def test_bad_requests_are_usage_errors(tmp_path, tensors, kwargs, message):
    with pytest.raises(UsageError, match=message):
        write_bundle_native(str(tmp_path / "x"), tensors, **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_values_tf_bundles_cannot_hold_are_refused():
    with pytest.raises(UsageError, match="cannot write a datetime64"):
        TensorData.from_array(np.array(["2020-01-01"], dtype="datetime64[D]"))
    with pytest.raises(UsageError, match="bytes or str elements"):
        TensorData.from_array(np.array([1, b"x"], dtype=object))
    with pytest.raises(UsageError, match="cannot stream a string"):
        TensorData.from_blocks("string", (1,), lambda: [])


# -- the index table --------------------------------------------------------------------------
def data_blocks(table: bytes) -> int:
    """Data blocks of a table: the entries of its index block."""
    from ckptinspect.formats.tf import sstable as _sstable  # noqa: PLC0415

    footer = table[-_sstable.FOOTER_SIZE :]
    _, _, pos = _sstable._block_handle(footer, 0)
    offset, size, _ = _sstable._block_handle(footer, pos)
    return len(list(_sstable._iter_block(_sstable._read_block(table, offset, size, True))))


def test_table_builder_rebuilds_tensorflow_indexes_byte_for_byte():
    for index in sorted(FIXTURES.glob("*/*.index")):
        data = index.read_bytes()
        builder = TableBuilder()
        for key, value in iter_table(data):
            builder.add(key, value)
        assert builder.finish() == data, index


def test_many_long_keys_span_several_index_blocks_as_tensorflow_cuts_them(tmp_path):
    """4,000 tensors with 150-byte keys: an index of several 256 KiB blocks (restarts every 16
    keys, shortest separators between blocks), byte-identical to TensorFlow's."""
    names = [f"layer_{i:05d}/" + "x" * 130 + f"/kernel_{i % 7}" for i in range(4000)]
    values = [np.array(i, dtype=np.int32) for i in range(4000)]
    with tf.device("/cpu:0"):
        tf.raw_ops.SaveV2(prefix=str(tmp_path / "tf"), tensor_names=names, shape_and_slices=[""] * len(names),
                          tensors=[tf.constant(v) for v in values])
    write_bundle_native(str(tmp_path / "ours"), [OutputTensor.from_array(k, v) for k, v in zip(names, values)])
    assert data_blocks((tmp_path / "ours.index").read_bytes()) >= 2
    assert_same_files(tmp_path / "ours", tmp_path / "tf")


def test_small_blocks_still_read_by_tensorflow(tmp_path):
    values = {f"k{i:03d}": np.array([i], np.int64) for i in range(100)}
    write_bundle_native(str(tmp_path / "b"), [OutputTensor.from_array(k, v) for k, v in values.items()], block_size=64)
    data = (tmp_path / "b.index").read_bytes()
    assert data_blocks(data) > 10 and len(list(iter_table(data))) == 101
    got = tf_values(tmp_path / "b")
    assert all(same_bits(got[k], v) for k, v in values.items())


def test_an_entry_over_twice_the_block_size_starts_a_block_as_tensorflow_does(tmp_path):
    """TableBuilder::Add cuts the block before an entry of at least 2 x block_size (a 600 KB key)."""
    names = ["a", "b" * 600_000, "c"]
    values = [np.array([i], np.int16) for i in range(3)]
    tf.raw_ops.SaveV2(prefix=str(tmp_path / "tf"), tensor_names=names, shape_and_slices=[""] * 3,
                      tensors=[tf.constant(v) for v in values])
    write_bundle_native(str(tmp_path / "ours"), [OutputTensor.from_array(k, v) for k, v in zip(names, values)])
    assert data_blocks((tmp_path / "ours.index").read_bytes()) == 3
    assert_same_files(tmp_path / "ours", tmp_path / "tf")


# -- other people's checkpoints ---------------------------------------------------------------
def realworld_prefixes(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p.with_suffix("") for p in root.rglob("*.index") if "broken" not in p.parts)


def test_realworld_bundles_rewritten_read_back_equal(realworld, tmp_path):
    """Every TF bundle of the corpus (TF1 and TF2, SavedModel variables, 2-shard ones, snappy
    indexes) copied through our writer: TensorFlow reads every key with the same
    value, verify passes; where the source is one uncompressed shard the files are identical."""
    prefixes = realworld_prefixes(realworld)
    assert len(prefixes) >= 15
    identical = 0
    for i, src in enumerate(prefixes):
        out = tmp_path / f"{i}" / src.name
        out.parent.mkdir()
        with ckptinspect.open(str(src)) as ckpt:
            graph = ckpt.source.object_graph()
            write_bundle_native(str(out), storage_order_copies(ckpt), object_graph=graph)
        want_dtypes = tf.train.load_checkpoint(str(src)).get_variable_to_dtype_map()
        assert tf.train.load_checkpoint(str(out)).get_variable_to_dtype_map() == want_dtypes, src
        want, got = tf.train.load_checkpoint(str(src)), tf.train.load_checkpoint(str(out))
        for key, dtype in want_dtypes.items():
            if dtype != tf.variant:
                assert same_bits(got.get_tensor(key), want.get_tensor(key)), (src, key)
        assert ckptinspect.verify(str(out)).intact, src
        src_index = read_index(str(src))
        one_plain_shard = src_index.num_shards == 1 and all(
            block_type == 0 for block_type in index_block_types((pathlib.Path(str(src) + ".index")).read_bytes())
        )
        graph_last = graph is None or max(src_index.entries, key=lambda e: e.offset).key == OBJECT_GRAPH_KEY
        if one_plain_shard and graph_last:  # (TF 1.x wrote the graph first)
            assert_same_files(out, src)
            identical += 1
    assert identical >= 8


def index_block_types(table: bytes) -> list[int]:
    """The compression byte of every data block of a table."""
    from ckptinspect.formats.tf import sstable as _sstable  # noqa: PLC0415

    footer = table[-_sstable.FOOTER_SIZE :]
    _, _, pos = _sstable._block_handle(footer, 0)
    offset, size, _ = _sstable._block_handle(footer, pos)
    types = []
    for _, handle in _sstable._iter_block(_sstable._read_block(table, offset, size, True)):
        block_offset, block_size, _ = _sstable._block_handle(handle, 0)
        types.append(table[block_offset + block_size])
    return types
