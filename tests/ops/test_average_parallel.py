"""`average` on worker threads, written around the page cache: the same bits whatever the number
of workers, and damage or a bad write still caught.

The inputs are real TF checkpoints (``tf.train.Checkpoint.write``) with tensors that span several
blocks of every dtype averaged, odd sizes, an empty tensor, one-element ones and all-``-0.0``
values; ground truth is numpy's mean of what ``tf.train.load_checkpoint`` reads.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import google_crc32c
import numpy as np
import pytest

import ckptinspect
from ckptinspect import _parallel
from ckptinspect.errors import CorruptCheckpointError, VerificationError
from ckptinspect.formats import OutputTensor, StoredBytes, TensorData, write_bundle_native
from ckptinspect.formats.tf.write import direct_io as _direct_io
from ckptinspect.formats.tf.write import combine as bundle_combine
from ckptinspect.formats.tf.crc import crc32c_combine

tf = pytest.importorskip("tensorflow")

GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
DATA = ".data-00000-of-00001"
ROOT = pathlib.Path(__file__).resolve().parents[2]


def numpy_mean(arrays):
    return np.mean(np.stack(arrays).astype(np.float64), axis=0).astype(arrays[0].dtype)


def tf_values(prefix) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(str(prefix))  # checks every tensor's crc32c as it reads it
    return {k: np.asarray(reader.get_tensor(k)) for k in reader.get_variable_to_shape_map() if k != GRAPH_KEY}


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> list[str]:
    """Three checkpoints of one 'run': about 12 MB each, so the output spans two staging buffers."""
    root = tmp_path_factory.mktemp("avgpar")
    rng = np.random.default_rng(14)
    prefixes = []
    for i in range(3):
        values = {
            "big": rng.normal(size=(700_001,)).astype(np.float32),  # 3 blocks of 1 MiB
            "wide": rng.normal(size=(300_007,)) * 1e10,  # float64: 3 blocks
            "half": rng.normal(size=(1_000_003,)).astype(np.float16),  # 2 blocks
            "bf": tf.constant(rng.normal(size=(200_001,)).astype(np.float32), dtype=tf.bfloat16),
            "one": rng.normal(size=(1,)).astype(np.float32),
            "scalar": np.float32(rng.normal()),
            "empty": np.zeros((0, 3), np.float32),
            "negzero": np.full((5,), -0.0, np.float32),
            "step": np.int64(10 * (i + 1)),
        }
        values.update({f"small{j}": rng.normal(size=(12_345,)).astype(np.float32) for j in range(40)})
        ckpt = tf.train.Checkpoint(**{k: tf.Variable(v) for k, v in values.items()})
        prefixes.append(ckpt.write(str(root / f"c{i}" / "ckpt")))
    return prefixes


def _average(prefixes, out: pathlib.Path, monkeypatch, workers: int, direct: bool, stage: int | None = None):
    with monkeypatch.context() as mp:
        mp.setattr(_parallel, "WORKERS", workers)
        mp.setenv("CKPTINSPECT_DIRECT_IO", "1" if direct else "0")
        if stage is not None:
            mp.setattr(_direct_io, "STAGE_BYTES", stage)
        return ckptinspect.average(prefixes, str(out))


def test_same_bits_with_one_and_two_workers_direct_or_not_and_equal_numpy(three, tmp_path, monkeypatch):
    runs = {
        "1 worker": (1, True, None),
        "2 workers": (2, True, None),
        "2 workers, page cache": (2, False, None),
        "2 workers, 12 KiB staging": (2, True, 3 * _direct_io.ALIGN),  # heads straddle pieces
    }
    files = {}
    for name, (workers, direct, stage) in runs.items():
        out = tmp_path / name.replace(" ", "_").replace(",", "") / "avg"
        report = _average(three, out, monkeypatch, workers, direct, stage)
        assert report.verified == 49 and report.averaged["all"]["count"] == 48, name  # + the step
        files[name] = (pathlib.Path(str(out) + DATA).read_bytes(), pathlib.Path(str(out) + ".index").read_bytes())
    first = next(iter(files.values()))
    assert all(f == first for f in files.values()), [n for n, f in files.items() if f != first]
    inputs = [tf_values(p) for p in three]
    got = tf_values(out)
    assert set(got) == set(inputs[-1])
    for key, value in got.items():
        if key.startswith("step"):
            assert value == inputs[-1][key]
            continue
        want = numpy_mean([x[key] for x in inputs])
        assert value.dtype == want.dtype and value.tobytes() == want.tobytes(), key
    negzero = next(v for k, v in got.items() if k.startswith("negzero"))
    assert not np.signbit(negzero).any()  # numpy's sum starts from +0.0
    assert ckptinspect.verify(str(out)).intact


def test_workers_from_the_environment_give_the_same_file(three, tmp_path, monkeypatch):
    """CKPTINSPECT_WORKERS=1 in a fresh process gives the bytes two workers give here."""
    one = tmp_path / "one" / "avg"
    env = {**os.environ, "CKPTINSPECT_WORKERS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "ckptinspect", "average", *three, "-o", str(one)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    two = tmp_path / "two" / "avg"
    _average(three, two, monkeypatch, 2, True)
    for suffix in (DATA, ".index"):
        assert pathlib.Path(str(one) + suffix).read_bytes() == pathlib.Path(str(two) + suffix).read_bytes()


def _damaged_copy(prefix: str, root: pathlib.Path, edit) -> str:
    root.mkdir()
    for suffix in (".index", DATA):
        data = bytearray(pathlib.Path(prefix + suffix).read_bytes())
        if suffix == DATA:
            data = edit(data)
        (root / ("ckpt" + suffix)).write_bytes(bytes(data))
    return str(root / "ckpt")


@pytest.mark.parametrize("workers", [1, 2])
def test_damage_in_a_later_block_is_an_error_naming_the_file(three, tmp_path, monkeypatch, workers):
    big = ckptinspect.open(three[1])
    try:
        entry = next(v for v in big.variables if v.name.startswith("big"))
        offset = big.source.stored_runs(entry)[0].entry.offset
    finally:
        big.close()

    def flip(data: bytearray) -> bytearray:
        data[offset + 2_500_000] ^= 0x10  # in the third block of 'big'
        return data

    bad = _damaged_copy(three[1], tmp_path / "bad", flip)
    out = tmp_path / "out" / "avg"
    with pytest.raises(CorruptCheckpointError, match="checksum does not match") as info:
        _average([three[0], bad, three[2]], out, monkeypatch, workers, True)
    assert bad + DATA in str(info.value)
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_truncated_input_is_an_error_and_nothing_is_written(three, tmp_path, monkeypatch):
    bad = _damaged_copy(three[2], tmp_path / "short", lambda data: data[: len(data) // 2])
    out = tmp_path / "out" / "avg"
    with pytest.raises(CorruptCheckpointError, match="truncated"):
        _average([three[0], three[1], bad], out, monkeypatch, 2, True)
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_an_error_in_a_worker_stops_the_write_and_removes_its_files(three, tmp_path):
    src = ckptinspect.open(three[0])
    try:
        var = next(v for v in src.variables if v.name.startswith("big"))
        run = src.source.stored_runs(var)[0]
        stored = TensorData.from_stored("float32", var.shape, StoredBytes(run.path, run.entry.offset, run.entry.size,
                                                                          run.entry.crc32c))
    finally:
        src.close()

    def fn(start, blocks, out):
        if start > 0:
            raise ValueError(f"no block at {start}")
        out[...] = blocks[0]

    prefix = tmp_path / "w" / "ckpt"
    prefix.parent.mkdir()
    with pytest.raises(ValueError, match="no block at 262144"):
        write_bundle_native(str(prefix), [OutputTensor.whole("x", TensorData.from_combined("float32", var.shape, [stored], fn))])
    assert list(prefix.parent.iterdir()) == []


def test_crc32c_combine_equals_the_checksum_of_the_whole():
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, size=3_000_000, dtype=np.uint8).tobytes()
    for cuts in ([0], [1], [4096], [1 << 20, 2 << 20], sorted(rng.integers(0, len(data), size=7).tolist())):
        edges = [0, *cuts, len(data)]
        crc = 0
        for a, b in zip(edges, edges[1:]):
            crc = crc32c_combine(crc, google_crc32c.value(data[a:b]), b - a) if a else google_crc32c.value(data[a:b])
        assert crc == google_crc32c.value(data), cuts


@pytest.mark.parametrize("direct", [True, False])
def test_direct_shard_writes_every_piece_and_reads_the_heads_back(tmp_path, monkeypatch, direct):
    monkeypatch.setenv("CKPTINSPECT_DIRECT_IO", "1" if direct else "0")
    monkeypatch.setattr(_direct_io, "STAGE_BYTES", 4 * _direct_io.ALIGN)
    rng = np.random.default_rng(1)
    pieces = [rng.integers(0, 256, size=n, dtype=np.uint8).tobytes() for n in (0, 1, 5000, 16384, 3, 40000, 4095, 777)]
    read_back = []
    path = str(tmp_path / "data")
    shard = _direct_io.DirectShard(path, lambda p: os.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644))
    for i, piece in enumerate(pieces):
        shard.mark_head(len(piece), lambda i=i: read_back.append(i))
        shard.write(piece)
    assert shard.size == sum(map(len, pieces))
    shard.close(fsync=True)
    assert pathlib.Path(path).read_bytes() == b"".join(pieces)
    assert sorted(read_back) == list(range(len(pieces)))  # an empty piece is done at once
    assert shard.heads_checked >= len(pieces) - 1


def test_direct_shard_read_back_refuses_bytes_that_are_not_the_ones_written(tmp_path):
    path = tmp_path / "data"
    path.write_bytes(b"\x00" * 8192)
    shard = _direct_io.DirectShard(str(tmp_path / "other"), lambda p: os.open(str(path), os.O_RDWR))
    try:
        staged = bytearray(b"\x00" * 8192)
        shard._read_back(staged, 0, [(100, 200, None)])  # the same bytes: fine
        staged[150] = 1  # what was meant to be written differs from what the file holds
        with pytest.raises(VerificationError, match="read back are not the bytes written"):
            shard._read_back(staged, 0, [(100, 200, None)])
    finally:
        shard.close(fsync=False)


def test_block_sizes_follow_the_widest_dtype():
    f64, f32 = np.dtype("<f8"), np.dtype("<f4")
    combined = bundle_combine.Combined((), (f64,), ("x",), lambda *a: None)
    assert bundle_combine.block_elements(combined, f32) == bundle_combine.BLOCK_BYTES // 8
