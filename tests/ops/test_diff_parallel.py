"""``diff`` with two threads: the same report, bit for bit, as with one (issue 16).

Two variables are compared at a time when both checkpoints' sources allow concurrent reads
(TF bundles, local HDF5 files); each variable is compared whole by one thread, so its numbers
cannot depend on the threads. These tests compare the JSON documents (floats written with
``repr``: every bit) of the same diff run with ``CKPTINSPECT_WORKERS=1`` and ``=2``, on
checkpoints written by TensorFlow and h5py, and check the numbers against numpy on the values
TensorFlow/h5py read back. The values exercise every path of the one-pass comparison: blocks
identical throughout, identical first blocks then a difference (their sums computed in a second
read), a difference in the first block only, NaN/Inf in identical and in differing blocks,
integer, float16, float64, complex and bool values, and int8 blocks larger than the float64
work buffers.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

import ckptinspect
from ckptinspect import _parallel
from ckptinspect.errors import CorruptCheckpointError
from ckptinspect.formats.tf.index import read_index
from ckptinspect.ops.diff import compare as cmp
from ckptinspect.ops.diff import operation as d
from pool_spy import count_pools  # noqa: E402 - tests/helpers is on sys.path

tf = pytest.importorskip("tensorflow")
h5py = pytest.importorskip("h5py")

ROOT = pathlib.Path(__file__).resolve().parents[2]
BLOCK_F32 = cmp.BLOCK_BYTES // 4  # float32 elements per streamed block


def _values(seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(A, B): variables of several dtypes, some equal, some changed in chosen blocks."""
    rng = np.random.default_rng(seed)
    n = 2 * BLOCK_F32 + 5000  # three blocks, the last one short
    a: dict[str, np.ndarray] = {}
    b: dict[str, np.ndarray] = {}

    def pair(name, x, y=None):
        a[name] = x
        b[name] = x.copy() if y is None else y

    big = rng.standard_normal(n).astype(np.float32)
    pair("same", big)
    late = big.copy()
    late[-7] += 1e-3  # blocks 0 and 1 identical, block 2 differs
    pair("late", big * 2, late * 2)
    early = big.copy()
    early[:100] -= 0.5  # block 0 differs, blocks 1 and 2 identical
    pair("early", big + 1, early + 1)
    middle = big.copy()
    middle[BLOCK_F32 + 3] = 0.0  # only block 1 differs
    pair("middle", big - 1, middle - 1)
    nan_same = big.copy()
    nan_same[BLOCK_F32 + 11] = np.nan
    nan_same[-1] = -np.inf
    pair("nan_same", nan_same)  # identical, NaN/Inf in blocks 1 and 2
    nan_moved = nan_same.copy()
    nan_moved[BLOCK_F32 + 11] = 1.0
    nan_moved[5] = np.nan
    nan_moved[-2] += 0.25
    pair("nan_moved", nan_same, nan_moved)
    zeros = np.zeros(BLOCK_F32 + 3, np.float32)
    pair("zeros", zeros)  # identical and all zero: cosine None
    ints = rng.integers(-1000, 1000, n).astype(np.int32)
    ints_b = ints.copy()
    ints_b[[3, BLOCK_F32 + 9, n - 1]] += 1
    pair("ints", ints, ints_b)
    i8 = rng.integers(-100, 100, 3 * cmp.SCRATCH_ELEMENTS + 77).astype(np.int8)  # one block, 4 work pieces
    i8_b = i8.copy()
    i8_b[[0, cmp.SCRATCH_ELEMENTS + 1, 3 * cmp.SCRATCH_ELEMENTS + 50]] -= 3
    pair("i8", i8, i8_b)
    f16 = rng.standard_normal(70_000).astype(np.float16)
    pair("f16", f16, (f16 * np.float16(1.001)).astype(np.float16))
    f64 = rng.standard_normal(BLOCK_F32 + 17)
    pair("f64", f64, f64 + 1e-9 * rng.standard_normal(f64.size))
    c64 = (rng.standard_normal(3000) + 1j * rng.standard_normal(3000)).astype(np.complex64)
    c64_b = c64.copy()
    c64_b[10] += 0.5j
    pair("c64", c64, c64_b)
    flags = rng.integers(0, 2, 5000).astype(bool)
    flags_b = flags.copy()
    flags_b[::97] ^= True
    pair("flags", flags, flags_b)
    for i in range(40):  # many small variables: both threads busy, results reordered back
        x = rng.standard_normal((16, 9)).astype(np.float32)
        pair(f"small{i:02d}", x, x if i % 3 else x + np.float32(i * 1e-4))
    return a, b


def _write_bundle(path: pathlib.Path, values: dict[str, np.ndarray]) -> str:
    module = tf.Module()
    for k, v in values.items():
        setattr(module, k, tf.Variable(v))
    return tf.train.Checkpoint(m=module).write(str(path))


def _write_weights_h5(path: pathlib.Path, values: dict[str, np.ndarray]) -> None:
    """A Keras 3 ``.weights.h5`` layout written by h5py: contiguous datasets (read at their
    file offset) and one chunked, compressed dataset (read through h5py)."""
    with h5py.File(path, "w") as f:
        for k, v in values.items():
            if v.dtype.kind == "c":
                continue  # not a Keras weight type
            key = f"layers/{k}/vars/0"
            if k == "early":
                f.create_dataset(key, data=v, chunks=(4096,), compression="gzip")
            else:
                f.create_dataset(key, data=v)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("diffpar")
    a, b = _values(7)
    out = {
        "tf": (_write_bundle(root / "a" / "ckpt", a), _write_bundle(root / "b" / "ckpt", b)),
    }
    _write_weights_h5(root / "a.weights.h5", a)
    _write_weights_h5(root / "b.weights.h5", b)
    out["h5"] = (str(root / "a.weights.h5"), str(root / "b.weights.h5"))
    out["values"] = (a, b)
    out["root"] = root
    return out


def _json(report) -> str:
    return json.dumps(report.to_dict(), sort_keys=True)  # floats as repr: every bit


def _diff(monkeypatch, workers: int, a, b, **kw):
    monkeypatch.setattr(_parallel, "WORKERS", workers)
    return ckptinspect.diff(a, b, **kw)


@pytest.mark.parametrize("kind", ["tf", "h5"])
@pytest.mark.parametrize("tol", [{}, {"atol": 1e-3, "rtol": 1e-2}])
def test_one_and_two_workers_give_the_same_bits(pairs, monkeypatch, kind, tol):
    a, b = pairs[kind]
    one = _diff(monkeypatch, 1, a, b, **tol)
    two = _diff(monkeypatch, 2, a, b, **tol)
    assert _json(one) == _json(two)
    assert one.summary["changed"] > 10 and one.summary["equal"] > 10  # the pair is not trivial


def _row(report, name: str) -> d.VariableDiff:
    """The row of the variable written as ``name`` (``m/NAME/.ATTRIBUTES/...``, ``layers/NAME/vars/0``)."""
    (row,) = [v for v in report.variables if f"/{name}/" in f"/{v.key_a}/"]
    return row


@pytest.mark.parametrize("kind", ["tf", "h5"])
def test_numbers_match_numpy_on_the_values_read_back(pairs, monkeypatch, kind):
    """Every row against numpy, on the values TensorFlow / h5py read back (the two threads'
    report; the previous test shows the one-thread report is the same)."""
    a, b = pairs[kind]
    if kind == "tf":
        ra, rb = tf.train.load_checkpoint(a), tf.train.load_checkpoint(b)
        keys = [k for k in ra.get_variable_to_shape_map() if k != "_CHECKPOINTABLE_OBJECT_GRAPH"]
        truth = {k: (ra.get_tensor(k), rb.get_tensor(k)) for k in keys}
    else:
        with h5py.File(a) as fa, h5py.File(b) as fb:
            keys = []
            fa.visititems(lambda n, o: keys.append(n) if isinstance(o, h5py.Dataset) else None)
            truth = {k: (fa[k][()], fb[k][()]) for k in keys}
    report = _diff(monkeypatch, 2, a, b)
    rows = {v.key_a: v for v in report.variables}
    assert set(rows) == set(truth)
    for key, (x, y) in truth.items():
        row = rows[key]
        if x.dtype.kind == "c":
            x, y = x.view(np.float32 if x.dtype.itemsize == 8 else np.float64), y.view(np.float32)
        x = x.astype(np.float64).ravel()
        y = y.astype(np.float64).ravel()
        fin = np.isfinite(x) & np.isfinite(y)
        nonfinite_mismatch = int(np.count_nonzero(~fin & ~((x == y) | (np.isnan(x) & np.isnan(y)))))
        diff = np.abs(x[fin] - y[fin])
        assert row.nan_a == np.count_nonzero(np.isnan(x)), key
        assert row.inf_b == np.count_nonzero(np.isinf(y)), key
        assert row.nonfinite_mismatch == nonfinite_mismatch, key
        assert row.num_different == np.count_nonzero(diff > 0) + nonfinite_mismatch, key
        assert row.max_abs_diff == diff.max(), key
        assert row.status == ("changed" if row.num_different else "equal"), key
        nx, ny = np.linalg.norm(x[fin]), np.linalg.norm(y[fin])
        if nx:
            assert row.rel_l2 == pytest.approx(np.linalg.norm(x[fin] - y[fin]) / nx, rel=1e-12, abs=0), key
        else:
            assert row.rel_l2 in (0.0, None), key
        if nx and ny:
            cos = float(np.dot(x[fin], y[fin])) / (nx * ny)
            assert row.cosine == pytest.approx(min(1.0, cos), rel=1e-12), key
        else:
            assert row.cosine is None, key
    same, zeros = _row(report, "same"), _row(report, "zeros")
    assert same.cosine == 1.0 and same.rel_l2 == 0.0 and same.status == "equal"  # identical: exact
    assert zeros.cosine is None and zeros.status == "equal"
    assert _row(report, "late").num_different == 1 and _row(report, "middle").num_different == 1
    assert _row(report, "nan_same").status == "equal" and _row(report, "nan_same").nan_a == 1


def test_two_variables_are_compared_at_a_time(pairs, monkeypatch):
    """With two workers, two threads are inside the comparison at once (each of the first two
    calls waits for the other: one thread alone would break the barrier). Every batch goes to
    the threads here (the small ones' policy is the next test's)."""
    monkeypatch.setattr(d, "THREAD_MIN_BYTES", 0)
    barrier = threading.Barrier(2, timeout=20)
    threads = set()
    calls = []
    real = d.compare_variables

    def spy(*args, **kw):
        calls.append(1)
        threads.add(threading.current_thread().name)
        if len(calls) <= 2:
            barrier.wait()
        return real(*args, **kw)

    monkeypatch.setattr(d, "compare_variables", spy)
    for kind in ("tf", "h5"):
        barrier.reset()
        calls.clear()
        threads.clear()
        _diff(monkeypatch, 2, *pairs[kind])
        assert len(threads) == 2, kind


def test_batches_of_small_values_only_are_compared_in_the_calling_thread(pairs, monkeypatch, tmp_path):
    """The policy: a batch goes to the threads only when one of its values holds
    ``_parallel.THREAD_MIN_BYTES`` or more. Small values only: no pool is started and every
    comparison runs in the calling thread; the pair of mixed sizes starts one pool. Same bits
    either way (``test_one_and_two_workers_give_the_same_bits``)."""
    a, b = pairs["values"]
    small_a = {k: v for k, v in a.items() if v.nbytes < _parallel.THREAD_MIN_BYTES and v.dtype.kind != "c"}
    assert 40 < len(small_a) < len(a) - 5  # small ones and large ones
    _write_weights_h5(tmp_path / "a.weights.h5", small_a)
    _write_weights_h5(tmp_path / "b.weights.h5", {k: b[k] for k in small_a})
    threads = set()
    real = d.compare_variables

    def spy(*args, **kw):
        threads.add(threading.current_thread().name)
        return real(*args, **kw)

    monkeypatch.setattr(d, "compare_variables", spy)
    started = count_pools(monkeypatch)
    report = _diff(monkeypatch, 2, str(tmp_path / "a.weights.h5"), str(tmp_path / "b.weights.h5"))
    assert report.summary["changed"] > 5
    assert started == [] and threads == {threading.current_thread().name}
    _diff(monkeypatch, 2, *pairs["h5"])
    assert len(started) == 1 and len(threads) > 1


def test_sources_say_whether_they_read_concurrently(pairs, tmp_path):
    a, _ = pairs["tf"]
    with ckptinspect.open(a) as ckpt:
        assert ckpt.source.concurrent_reads
    with ckptinspect.open(pairs["h5"][0]) as ckpt:
        assert ckpt.source.concurrent_reads
    np.savez(tmp_path / "w.npz", x=np.ones(3, np.float32))
    with ckptinspect.open(str(tmp_path / "w.npz")) as ckpt:
        assert not ckpt.source.concurrent_reads  # compared one variable at a time


def test_progress_comes_in_order_with_the_rows_of_one_worker(pairs, monkeypatch):
    seen = {1: [], 2: []}
    for workers in (1, 2):
        _diff(monkeypatch, workers, *pairs["tf"], progress=lambda i, n, row, w=workers: seen[w].append((i, n, row)))
    assert [i for i, _, _ in seen[2]] == list(range(1, len(seen[2]) + 1))
    assert [(i, n, row.to_dict()) for i, n, row in seen[1]] == [(i, n, row.to_dict()) for i, n, row in seen[2]]


def test_a_checksum_mismatch_is_raised_for_its_variable_with_two_workers(pairs, monkeypatch, tmp_path):
    """Damage in one of B's tensors: the same error with one worker or two, after the same
    variables were reported (the error comes at that variable's position)."""
    a, b = pairs["tf"]
    damaged = tmp_path / "ckpt"
    for f in pathlib.Path(b).parent.iterdir():
        shutil.copy(f, tmp_path / f.name)
    entries = {e.key: e for e in read_index(str(damaged)).entries}
    target = next(e for k, e in entries.items() if "small20" in k)
    data = next(tmp_path.glob("ckpt.data-*"))
    raw = bytearray(data.read_bytes())
    raw[target.offset + 5] ^= 0x40
    data.write_bytes(bytes(raw))
    outcomes = {}
    for workers in (1, 2):
        done = []
        with pytest.raises(CorruptCheckpointError, match="small20") as err:
            _diff(monkeypatch, workers, a, str(damaged), progress=lambda i, n, row: done.append(row.key_a))
        outcomes[workers] = (str(err.value), done)
    assert outcomes[1] == outcomes[2]
    assert outcomes[1][1]  # variables before it were reported


@pytest.mark.slow
def test_cli_json_is_the_same_with_workers_env_1_and_2(pairs):
    """The real switch: ``CKPTINSPECT_WORKERS`` in the environment of ``ckptinspect diff``."""
    out = {}
    for kind in ("tf", "h5"):
        for workers in ("1", "2"):
            env = dict(os.environ, CKPTINSPECT_WORKERS=workers, PYTHONPATH=str(ROOT))
            proc = subprocess.run([sys.executable, "-m", "ckptinspect", "diff", *pairs[kind], "--format", "json"],
                                  env=env, capture_output=True, text=True, timeout=120)
            assert proc.returncode == 1, proc.stderr  # they differ
            out[kind, workers] = proc.stdout
        assert out[kind, "1"] == out[kind, "2"]
        assert json.loads(out[kind, "1"])["summary"]["changed"] > 10


# -- the checksum of streamed blocks ---------------------------------------------------------------
@pytest.mark.parametrize("direct", [True, False])
def test_buffer_crc32c_equals_google_crc32c(monkeypatch, direct):
    """The streamed blocks' crc32c (the C library through ctypes, which releases the GIL; or the
    package's ``extend``) equals google-crc32c's on the same bytes, continued block by block."""
    import google_crc32c

    from ckptinspect.formats.tf import crc as _crc

    if not direct:
        monkeypatch.setattr(_crc, "_LIB", [None])
    extend = _crc.buffer_crc32c()
    data = bytearray(np.random.default_rng(5).integers(0, 256, 3_000_001, dtype=np.uint8).tobytes())
    assert extend(0, data, len(data)) == google_crc32c.extend(0, bytes(data))
    crc, expected = 0, 0
    for n in (1, 7, 4096, 1 << 20, 0, 123_457):
        block = bytearray(data[:n])
        crc = extend(crc, bytearray(block + b"tail"), n)  # only the first n bytes count
        expected = google_crc32c.extend(expected, bytes(block))
        assert crc == expected, n
    with pytest.raises(ValueError):
        extend(0, bytearray(4), 5)


def test_the_c_library_is_found_where_the_wheel_ships_it():
    """On this platform (a manylinux wheel of google-crc32c) the library behind the package is
    called directly: blocks are checksummed without holding the GIL."""
    import google_crc32c

    from ckptinspect.formats.tf import crc as _crc

    if google_crc32c.implementation != "c" or sys.platform != "linux":
        pytest.skip("google-crc32c's C library is found where its Linux wheels ship it")
    assert _crc._crc32c_library() is not None
