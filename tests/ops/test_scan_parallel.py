"""`scan`'s fast pass: chains measured by 1 or 2 threads, TF bundle values read in lockstep
across the steps (``formats.stream_blocks``), byte-identical blocks not converted. Whatever the
route (1 or 2 threads, lockstep or step after step, shortcut or arithmetic), the report must be
the same bits, and the figures numpy's.

Ground truth: runs written by ``tf.train.CheckpointManager``, values read back with
``tf.train.load_checkpoint``, figures computed with numpy.
"""

from __future__ import annotations

import math
import pathlib
import shutil
import threading

import numpy as np
import pytest

import ckptinspect
from pool_spy import count_pools  # noqa: E402 - tests/helpers is on sys.path
from scan_precision import scan_close  # noqa: E402 - tests/helpers is on sys.path
from ckptinspect import _parallel
from ckptinspect import model as m
from ckptinspect.errors import CorruptCheckpointError
from ckptinspect.formats import open_checkpoint, stream_blocks
from ckptinspect.ops.scan import operation as scan_mod
from ckptinspect.ops import bit_equality
from ckptinspect.ops.scan import measure as scan_measure
from ckptinspect.ops.scan import stats as scan_stats

tf = pytest.importorskip("tensorflow")

STEPS = (1, 2, 3, 4, 5)
SIZE = 1000  # values of the partly changed variable
CHANGED = slice(600, 700)  # the only values it changes at step 3
NAN_FROM = 2  # "nanvar" is NaN from this step on, and its bytes stay the same after


def write_run(directory: pathlib.Path) -> None:
    """Five steps: "moving" changes every step, "frozen" never, "partial" only in CHANGED at
    step 3, "nanvar" turns NaN at NAN_FROM and stays byte for byte the same, "count" (int64)
    and "flags" (bool) change at steps 2 and 4."""
    rng = np.random.default_rng(3)
    v = {
        "moving": tf.Variable(rng.normal(size=(40, 30)).astype("float32")),
        "frozen": tf.Variable(rng.normal(size=(500,)).astype("float32")),
        "partial": tf.Variable(rng.normal(size=(SIZE,)).astype("float32")),
        "nanvar": tf.Variable(rng.normal(size=(300,)).astype("float32")),
        "wide": tf.Variable(rng.normal(size=(700,)).astype("float64")),
        "count": tf.Variable(np.arange(77, dtype="int64")),
        "flags": tf.Variable(np.zeros(50, dtype=bool)),
        "zeros": tf.Variable(np.zeros(10, dtype="float32")),
    }
    ckpt = tf.train.Checkpoint(**v)
    manager = tf.train.CheckpointManager(ckpt, str(directory), max_to_keep=None)
    for s in STEPS:
        if s > 1:
            v["moving"].assign_add(1e-2 * rng.normal(size=(40, 30)).astype("float32"))
        if s == 3:
            part = v["partial"].numpy()
            part[CHANGED] += 1.0
            v["partial"].assign(part)
            v["wide"].assign_add(rng.normal(size=(700,)))
        if s == NAN_FROM:
            nan = v["nanvar"].numpy()
            nan[::7] = np.nan
            nan[3] = np.inf
            v["nanvar"].assign(nan)
        if s in (2, 4):
            v["count"].assign_add(np.ones(77, dtype="int64"))
            v["flags"].assign(np.arange(50) % s == 0)
        manager.save(checkpoint_number=s)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> pathlib.Path:
    d = tmp_path_factory.mktemp("scanpar") / "run"
    write_run(d)
    return d


@pytest.fixture
def small_blocks(monkeypatch):
    """Several chunks per value, several chunks per block, several blocks per value."""
    monkeypatch.setattr(scan_mod, "BLOCK_ELEMENTS", 64)
    monkeypatch.setattr(scan_measure, "LOCKSTEP_BLOCK_CHUNKS", 3)


def _scan(path, monkeypatch, workers: int, threaded_from: int = 0, **kw) -> dict:
    """The report as JSON; with several workers, the chains with a value of ``threaded_from``
    bytes or more go to the threads (default: every chain, whatever its size)."""
    monkeypatch.setattr(_parallel, "WORKERS", workers)
    monkeypatch.setattr(scan_measure, "THREAD_MIN_BYTES", threaded_from)
    return ckptinspect.scan(str(path), **kw).to_dict()


def _same_bits(a, b, where=""):
    """Equal, NaN equal to NaN (json-like documents)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same_bits(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same_bits(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b and type(a) is type(b), (where, a, b)


@pytest.mark.parametrize("blocks", ["default", "small"])
def test_one_or_two_workers_same_bits(run, monkeypatch, request, blocks):
    if blocks == "small":
        request.getfixturevalue("small_blocks")
    one = _scan(run, monkeypatch, 1)
    two = _scan(run, monkeypatch, 2)
    _same_bits(one, two)
    assert one["first_nonfinite"]["number"] == NAN_FROM and one["first_nonfinite"]["variables"] == ["nanvar"]


# the run's values by size: "wide" 5,600 bytes, "moving" 4,800, "partial" 4,000, the others 2,000 or less
LARGE = {"wide", "moving", "partial"}
LARGE_FROM = 4000


def _chain_threads(monkeypatch) -> dict[str, set[str]]:
    """Record which thread measures each key's chain (by variable name)."""
    threads: dict[str, set[str]] = {}
    real = scan_measure._chain

    def chain(key, window, *rest):
        name = window[0][1][key].name if key in window[0][1] else key
        threads.setdefault(name, set()).add(threading.current_thread().name)
        return real(key, window, *rest)

    monkeypatch.setattr(scan_measure, "_chain", chain)
    return threads


def test_small_chains_are_measured_in_the_calling_thread_large_ones_by_the_threads(run, monkeypatch):
    """The policy: a chain with a value of THREAD_MIN_BYTES or more goes to the threads, the
    others stay in the calling thread; the report is the one-thread report's bits."""
    one = _scan(run, monkeypatch, 1)
    threads = _chain_threads(monkeypatch)
    two = _scan(run, monkeypatch, 2, threaded_from=LARGE_FROM)
    _same_bits(one, two)
    main = threading.main_thread().name
    assert {n for n, t in threads.items() if t != {main}} == LARGE
    assert all(t.startswith("ckptinspect") for n in LARGE for t in threads[n])
    assert {"frozen", "nanvar", "count", "flags", "zeros"} <= {n for n, t in threads.items() if t == {main}}


def test_a_run_of_small_values_starts_no_thread(run, monkeypatch):
    """Every value under THREAD_MIN_BYTES: no pool is started, not by the measuring nor by the
    verify check fed by scan's reads (every verdict known, nothing left to read)."""
    started = count_pools(monkeypatch)
    report = _scan(run, monkeypatch, 2, threaded_from=scan_measure.THREAD_MIN_BYTES)
    assert [s["status"] for s in report["steps"]] == ["intact"] * len(STEPS)
    assert started == []
    _scan(run, monkeypatch, 2, threaded_from=LARGE_FROM)  # and the spy sees a pool when there is one
    assert started


def test_tasks_mark_the_chains_of_large_values_for_the_threads(run, monkeypatch):
    ckpts = [open_checkpoint(str(p)[: -len(".index")]) for p in sorted(run.glob("ckpt-*.index"))]
    try:
        window = [(c, {v.key: v for v in c.variables}) for c in ckpts]
        keys = list(window[0][1])
        names = {k: window[0][1][k].name for k in keys}
        largest = {k: max(by[k].size * m.ITEMSIZE[by[k].dtype] for _, by in window if k in by) for k in keys}
        monkeypatch.setattr(scan_measure, "THREAD_MIN_BYTES", LARGE_FROM)
        tasks = list(scan_measure._tasks(keys, window))
        assert [k for t in tasks for k in t.keys] == keys
        threaded = [t.keys for t in tasks if t.threaded]
        assert all(len(t) == 1 for t in threaded)
        assert {names[t[0]] for t in threaded} == LARGE
        assert all(largest[k] < LARGE_FROM for t in tasks if not t.threaded for k in t.keys)
    finally:
        for c in ckpts:
            c.close()


@pytest.mark.parametrize("task_bytes", [1, 1 << 40])
def test_tasks_of_one_or_of_every_chain_same_bits(run, monkeypatch, task_bytes):
    """Small chains go to a thread in runs of consecutive keys (TASK_BYTES): one chain per task
    or every chain in one task, on two threads, gives the one-thread report's bits."""
    one = _scan(run, monkeypatch, 1)
    monkeypatch.setattr(scan_measure, "TASK_BYTES", task_bytes)
    _same_bits(one, _scan(run, monkeypatch, 2))


def test_tasks_keep_key_order_and_their_bound(run, monkeypatch):
    ckpts = [open_checkpoint(str(p)[: -len(".index")]) for p in sorted(run.glob("ckpt-*.index"))]
    try:
        window = [(c, {v.key: v for v in c.variables}) for c in ckpts]
        keys = list(window[0][1])
        held = {k: sum(by[k].size * m.ITEMSIZE[by[k].dtype] for _, by in window if k in by) for k in keys}
        bound = sorted(held.values())[len(held) // 2]  # some keys over it: alone in their task
        monkeypatch.setattr(scan_measure, "TASK_BYTES", bound)
        tasks = [t.keys for t in scan_measure._tasks(keys, window)]
        assert [k for t in tasks for k in t] == keys
        assert all(len(t) == 1 or sum(held[k] for k in t) <= bound for t in tasks)
        assert any(len(t) > 1 for t in tasks) and any(held[t[0]] > bound for t in tasks if len(t) == 1)
    finally:
        for c in ckpts:
            c.close()


def test_identical_spans_give_the_bits_of_the_arithmetic(run, monkeypatch, small_blocks):
    seen = {"same": 0}
    real = scan_stats.same_bytes

    def counting(a, b):
        same = real(a, b)
        seen["same"] += same
        return same

    monkeypatch.setattr(scan_stats, "same_bytes", counting)
    fast = _scan(run, monkeypatch, 2)
    assert seen["same"] > 0  # the shortcut was taken
    monkeypatch.setattr(scan_stats, "same_bytes", lambda a, b: False)
    _same_bits(fast, _scan(run, monkeypatch, 2))


@pytest.mark.parametrize("blocks", ["default", "small"])
def test_lockstep_and_step_after_step_same_bits(run, monkeypatch, request, blocks):
    if blocks == "small":
        request.getfixturevalue("small_blocks")
    lockstep = _scan(run, monkeypatch, 2)
    with monkeypatch.context() as patch:
        patch.setattr(scan_measure, "LOCKSTEP_BUDGET_BYTES", 0)  # blocks past the budget: step after step
        _same_bits(lockstep, _scan(run, patch, 2))
    monkeypatch.setattr(scan_measure, "stream_blocks", lambda *a: None)  # as for formats read whole
    _same_bits(lockstep, _scan(run, monkeypatch, 2))


@pytest.mark.parametrize("role", [None, "model", "metadata"])
def test_roles_lockstep_and_step_after_step_same_bits(run, monkeypatch, small_blocks, role):
    lockstep = _scan(run, monkeypatch, 2, role=role)
    monkeypatch.setattr(scan_measure, "stream_blocks", lambda *a: None)
    _same_bits(lockstep, _scan(run, monkeypatch, 1, role=role))


def _expected(cur: np.ndarray, prev: np.ndarray) -> dict:
    c = cur.astype(np.float64).ravel()
    p = prev.astype(np.float64).ravel()
    with np.errstate(invalid="ignore"):
        d = c - p
    nc, np_, nd = np.linalg.norm(c), np.linalg.norm(p), np.linalg.norm(d)
    finite = all(math.isfinite(x) for x in (nc, np_, nd))
    if not math.isfinite(np_):  # scan compares nothing with a non-finite value
        return {"norm": float(nc), "nan": int(np.isnan(c).sum()), "inf": int(np.isinf(c).sum()),
                "max_abs_change": None, "rel_change": None, "cosine": None}
    return {
        "norm": float(nc),
        "nan": int(np.isnan(c).sum()),
        "inf": int(np.isinf(c).sum()),
        "max_abs_change": float(np.max(np.abs(d))) if d.size else 0.0,
        "rel_change": (float(nd / np_) if np_ > 0 else (0.0 if nd == 0 else math.inf)) if finite else math.nan,
        "cosine": (float(np.dot(c, p) / (nc * np_)) if nc > 0 and np_ > 0 else None) if finite else math.nan,
    }


@pytest.mark.parametrize("workers", [1, 2])
def test_figures_equal_numpy(run, monkeypatch, small_blocks, workers):
    monkeypatch.setattr(_parallel, "WORKERS", workers)
    report = ckptinspect.scan(str(run))
    checked = set()
    for prev, cur in zip(report.steps, report.steps[1:]):
        r_prev, r_cur = tf.train.load_checkpoint(prev.path), tf.train.load_checkpoint(cur.path)
        for v in cur.variables:
            if v.name == "save_counter":
                continue
            want = _expected(r_cur.get_tensor(v.key), r_prev.get_tensor(v.key))
            got = v.figures.to_dict()
            for k, value in want.items():
                if isinstance(value, float) and math.isnan(value):
                    assert math.isnan(got[k]), (cur.step, v.name, k)
                elif value is None or isinstance(value, int) or math.isinf(value):
                    assert got[k] == value, (cur.step, v.name, k)
                else:
                    assert got[k] == scan_close(k, value), (cur.step, v.name, k, got[k], value)
            checked.add(v.name)
    assert checked == {"moving", "frozen", "partial", "nanvar", "wide", "count", "flags", "zeros"}
    by = {s.number: {v.name: v.figures for v in s.variables} for s in report.steps}
    assert by[3]["partial"].max_abs_change == pytest.approx(1.0, rel=1e-6)
    assert by[4]["partial"].max_abs_change == 0.0 and by[4]["partial"].rel_change == 0.0
    assert by[4]["nanvar"].nan == by[NAN_FROM]["nanvar"].nan == len(range(0, 300, 7))
    assert by[4]["nanvar"].inf == 1
    assert math.isnan(by[NAN_FROM]["nanvar"].max_abs_change)  # x - NaN, as numpy says
    assert by[4]["nanvar"].max_abs_change is None  # nothing finite to compare with
    assert by[5]["frozen"].cosine == pytest.approx(1.0, rel=1e-15) and by[5]["frozen"].norm == by[1]["frozen"].norm


def test_identical_bytes_of_another_dtype_are_compared_by_value():
    prev = np.arange(1, 506, dtype=np.int32) * 1000
    cur = prev.view(np.float32)  # the same bytes, other values
    ss_prev, chunks = scan_stats.measure_value([prev.size], prev, None, 64)
    sums, _ = scan_stats.measure_value([cur.size], cur, scan_stats.Measured(prev, chunks, ss_prev.sumsq), 64)
    d = cur.astype(np.float64) - prev.astype(np.float64)
    assert sums.max_abs_change == float(np.max(np.abs(d))) > 0
    assert sums.diff_sumsq == pytest.approx(float(np.dot(d, d)), rel=1e-12)


def _flip(prefix: pathlib.Path, offset: int) -> None:
    data = pathlib.Path(str(prefix) + ".data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    raw[offset] ^= 0x40
    data.write_bytes(bytes(raw))


@pytest.mark.parametrize("workers", [1, 2])
def test_damaged_value_is_verify_damage_and_breaks_the_chain(run, tmp_path, monkeypatch, workers):
    d = tmp_path / "run"
    shutil.copytree(run, d)
    ckpt = open_checkpoint(str(d / "ckpt-3"))
    var = ckpt["frozen"]
    offset = ckpt.source._entries[var.key].offset  # noqa: SLF001 - where to plant the damage
    ckpt.close()
    _flip(d / "ckpt-3", offset + 17)
    monkeypatch.setattr(_parallel, "WORKERS", workers)
    report = ckptinspect.scan(str(d))
    assert [(s.number, s.status) for s in report.steps] == [(1, "intact"), (2, "intact"), (3, "damaged"),
                                                          (4, "intact"), (5, "intact")]
    assert any("frozen" in p and "checksum" in p for p in report.steps[2].problems), report.steps[2].problems
    assert [p.kind for p in report.health] == ["damaged"]
    step4 = {v.name: v.figures for v in report.steps[3].variables}
    assert step4["frozen"].max_abs_change is None  # nothing readable to compare with
    assert step4["moving"].max_abs_change is not None


def test_stream_blocks_reads_tf_values_from_two_threads(run):
    prefix = str(run / "ckpt-3")
    reader = tf.train.load_checkpoint(prefix)
    with open_checkpoint(prefix) as ckpt:
        variables = [v for v in ckpt.variables if v.dtype in scan_measure.STATS_DTYPES] * 20
        errors: list[BaseException] = []

        def work(part):
            try:
                for v in part:  # two readers at once in each thread, each with its own buffer
                    a, b = stream_blocks(ckpt, v, 37), stream_blocks(ckpt, v, 37)
                    first, second = [], []
                    for x, y in zip(a, b):
                        first.append(x.copy())
                        second.append(y.copy())
                    for rest in (a, b):  # the checksums, after the last block
                        assert list(rest) == []
                    want = reader.get_tensor(v.key).ravel()
                    assert len(first) == -(-want.size // 37)
                    np.testing.assert_array_equal(np.concatenate(first), want)
                    np.testing.assert_array_equal(np.concatenate(second), want)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(variables[i::2],)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[0]


def test_stream_blocks_checks_the_checksum(run, tmp_path):
    d = tmp_path / "one"
    d.mkdir()
    for f in run.glob("ckpt-1.*"):
        shutil.copy(f, d / f.name)
    with open_checkpoint(str(d / "ckpt-1")) as ckpt:
        var = ckpt["partial"]
        offset = ckpt.source._entries[var.key].offset  # noqa: SLF001
    _flip(d / "ckpt-1", offset + 4 * 900)
    with open_checkpoint(str(d / "ckpt-1")) as ckpt:
        blocks = stream_blocks(ckpt, ckpt["partial"], 64)
        with pytest.raises(CorruptCheckpointError, match="checksum"):
            for _ in blocks:
                pass


def test_stream_blocks_is_none_for_other_formats(tmp_path):
    keras = pytest.importorskip("keras")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    path = tmp_path / "m.weights.h5"
    model.save_weights(str(path))
    with open_checkpoint(str(path)) as ckpt:
        assert stream_blocks(ckpt, ckpt.variables[0], 64) is None


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 255, 256, 257, 1000, 65537])
def test_same_bytes_finds_any_changed_byte(n):
    rng = np.random.default_rng(n)
    a = rng.integers(0, 255, n, dtype=np.uint8)
    assert bit_equality.same_bytes(a, a.copy())
    for i in sorted({0, n // 2, n - 1}) if n else []:
        b = a.copy()
        b[i] ^= 1
        assert not bit_equality.same_bytes(a, b), i
    f = rng.standard_normal(n).astype(np.float32)
    g = f.copy()
    if n:
        g[-1] = np.float32(-0.0) if f[-1] == 0 else -f[-1]  # -0.0 == 0.0 as values, not as bytes
        assert not bit_equality.same_bytes(f, g)


@pytest.mark.parametrize("route", ["memcmp", "numpy"])
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 255, 256, 257, 1000, 65537])
def test_same_bytes_routes_agree(monkeypatch, route, n):
    if route == "numpy":
        monkeypatch.setattr(bit_equality, "_MEMCMP", None)
    elif bit_equality._memcmp() is None:  # pragma: no cover - libc's memcmp is there on Linux and macOS
        pytest.skip("no memcmp through ctypes here")
    rng = np.random.default_rng(100 + n)
    a = rng.integers(0, 255, n, dtype=np.uint8)
    assert bit_equality.same_bytes(a, a.copy())
    for i in sorted({0, n // 2, n - 1}) if n else []:
        b = a.copy()
        b[i] ^= 0x80
        assert not bit_equality.same_bytes(a, b), (route, i)
    assert not bit_equality.same_bytes(a, np.zeros(n + 1, np.uint8))  # another size is never the same
    f = rng.standard_normal(n).astype(np.float32)
    assert bit_equality.same_bytes(f, f.copy())
    assert bit_equality.same_bytes(f, f.view(np.int32).copy())  # bytes, whatever the dtype
    if n:
        g = f.copy()
        g[-1] = np.nextafter(g[-1], np.float32(np.inf))  # one ulp in the last value
        assert not bit_equality.same_bytes(f, g)


def test_report_memcmp_and_numpy_same_bits(run, monkeypatch, small_blocks):
    fast = _scan(run, monkeypatch, 2)
    monkeypatch.setattr(bit_equality, "_MEMCMP", None)
    _same_bits(fast, _scan(run, monkeypatch, 2))


def test_two_buffers_held_conversion_survives_the_in_place_difference(monkeypatch):
    """The difference is taken in place of the previous value's float64 conversion; a chain of
    changed one-chunk blocks (each converted once, then used as the next one's previous value)
    still gives numpy's figures at every step. (float16: float32 values are not converted.)"""
    rng = np.random.default_rng(7)
    values = [rng.standard_normal(300).astype(np.float16)]
    for _ in range(4):
        values.append((values[-1] + rng.standard_normal(300).astype(np.float16) * 0.1).astype(np.float16))
    buffers = scan_stats.Buffers(512)
    accs = [scan_stats.Accumulator(512, buffers) for _ in values]
    chunks = [accs[0].add(values[0], None, None, tag=0)]
    for i in range(1, len(values)):
        chunks.append(accs[i].add(values[i], values[i - 1], chunks[i - 1], tag=i, prev_tag=i - 1))
    for i in range(1, len(values)):
        c, p = values[i].astype(np.float64), values[i - 1].astype(np.float64)
        s = accs[i].result(accs[i - 1].sums.sumsq)
        assert s.diff_sumsq == pytest.approx(float(np.dot(c - p, c - p)), rel=1e-12)
        assert s.max_abs_change == float(np.max(np.abs(c - p)))
        assert s.sumsq == pytest.approx(float(np.dot(c, c)), rel=1e-12)


def test_report_lists_are_copies(run, monkeypatch):
    report = ckptinspect.scan(str(run))
    doc = report.to_dict()
    assert doc["first_nonfinite"]["variables"] == ["nanvar"]
    doc["first_nonfinite"]["variables"].append("x")
    doc["steps"][NAN_FROM - 1]["nonfinite"].append("y")
    assert report.first_nonfinite.nonfinite == ["nanvar"]
    assert report.to_dict()["steps"][NAN_FROM - 1]["nonfinite"] == ["nanvar"]


def test_same_bytes_of_read_only_and_sliced_arrays():
    raw = np.arange(1000, dtype=np.float32)
    frozen = np.frombuffer(raw.tobytes(), dtype=np.float32)  # read-only: its address another way
    assert not frozen.flags.writeable
    assert bit_equality.same_bytes(frozen, raw) and bit_equality.same_bytes(raw, frozen)
    assert bit_equality.same_bytes(raw[500:], frozen[500:])  # a view's own first byte, not its base's
    assert not bit_equality.same_bytes(raw[500:], frozen[499:999])


def _f64_sums(cur, prev):
    c = cur.astype(np.float64)
    out = {"sumsq": float(np.dot(c, c))}
    if prev is not None:
        d = c - prev.astype(np.float64)
        out["diff_sumsq"] = float(np.dot(d, d))
        out["max_abs_change"] = float(np.max(np.abs(d)))
    return out


@pytest.mark.filterwarnings("error")  # float32 overflows fall back to float64 without a warning on stderr
@pytest.mark.parametrize("case", ["normal", "wide-range", "near-one", "tiny", "huge", "tiny-change", "zeros"])
def test_float32_sums_agree_with_float64(case):
    """float32 values are summed in float32 through BLAS (issue 28's decision): within 1e-6
    relative of float64 arithmetic everywhere, including where float32 squares underflow
    (|x| ~ 1e-25), overflow (|x| ~ 1e25) or the change is far below the values."""
    rng = np.random.default_rng(3)
    n = 3 * 1024 + 77  # several chunks and a ragged tail
    base = rng.standard_normal(n)
    prev = {
        "normal": base,
        "wide-range": base * np.exp(rng.uniform(-20, 20, n)),
        "near-one": 1 + base * 1e-3,
        "tiny": base * 1e-25,
        "huge": base * 1e25,
        "tiny-change": base,
        "zeros": np.zeros(n),
    }[case].astype(np.float32)
    step = {"tiny-change": 1e-22, "tiny": 1e-27, "huge": 1e23}.get(case, 1e-3)
    cur = (prev + (rng.standard_normal(n) * step).astype(np.float32)).astype(np.float32)
    if case == "zeros":
        cur = prev.copy()
        cur[5] = 1e-30
    first, chunks = scan_stats.measure_value([prev.size], prev, None, 1024)
    sums, _ = scan_stats.measure_value([cur.size], cur, scan_stats.Measured(prev, chunks, first.sumsq), 1024)
    want_prev, want = _f64_sums(prev, None), _f64_sums(cur, prev)
    assert first.sumsq == pytest.approx(want_prev["sumsq"], rel=1e-6, abs=0)
    assert sums.sumsq == pytest.approx(want["sumsq"], rel=1e-6, abs=0)
    assert sums.diff_sumsq == pytest.approx(want["diff_sumsq"], rel=1e-6, abs=0)
    assert sums.max_abs_change == pytest.approx(want["max_abs_change"], rel=1e-6, abs=0)
    assert math.isfinite(sums.sumsq) and sums.nan == sums.inf == 0


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("case", ["wide-range", "offset"])
def test_float32_sums_of_a_million_values_agree_with_float64(case):
    """At the chunk size scan uses (BLOCK_ELEMENTS) a float32 chunk is summed as BLAS dots of
    8,192-element pieces merged in float64: on a million values of mixed magnitude every figure
    is within 1e-6 relative of float64 arithmetic (exactly rounded sums), the cosine within
    1e-6. One float32 BLAS dot per 262,144-element chunk is 1.2e-6 off on the wide-range case."""
    rng = np.random.default_rng(28)
    n = 1_000_000 + 123  # several chunks, pieces and a ragged tail
    base = rng.standard_normal(n)
    prev = (base * np.exp(rng.uniform(-12, 12, n)) if case == "wide-range" else 100.0 + base).astype(np.float32)
    cur = (prev * (1 + rng.standard_normal(n) * 1e-3) + rng.standard_normal(n) * 1e-4).astype(np.float32)
    first, chunks = scan_stats.measure_value([prev.size], prev, None)
    sums, _ = scan_stats.measure_value([cur.size], cur, scan_stats.Measured(prev, chunks, first.sumsq))
    c, p = cur.astype(np.float64), prev.astype(np.float64)
    d = c - p
    cc, pp, dd, cp = (math.fsum(a * b) for a, b in ((c, c), (p, p), (d, d), (c, p)))  # exactly rounded
    assert first.sumsq == pytest.approx(pp, rel=1e-6, abs=0)
    assert sums.sumsq == pytest.approx(cc, rel=1e-6, abs=0)
    assert sums.diff_sumsq == pytest.approx(dd, rel=1e-6, abs=0)
    assert sums.dot == pytest.approx(cp, rel=1e-6, abs=0)
    assert sums.max_abs_change == pytest.approx(float(np.max(np.abs(d))), rel=1e-6, abs=0)
    figures = scan_stats.figures_of(sums)
    assert figures.rel_change == pytest.approx(math.sqrt(dd / pp), rel=1e-6)
    assert figures.cosine == pytest.approx(cp / math.sqrt(cc * pp), abs=1e-6)


def test_float32_pieces_are_blas_dots_added_in_order():
    """The arithmetic pinned: a float32 vector's x.y is the BLAS dot of each 8,192-element piece
    (and of the tail), added in order in float64, bit for bit (scan's outputs stay the same
    whichever numpy call hands the pieces to BLAS)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal(5 * scan_stats.DOT_CHUNK + 1234).astype(np.float32)
    y = rng.standard_normal(x.size).astype(np.float32)
    want = 0.0
    for at in range(0, x.size, scan_stats.DOT_CHUNK):
        want += float(np.dot(x[at : at + scan_stats.DOT_CHUNK], y[at : at + scan_stats.DOT_CHUNK]))
    assert scan_stats._dot(x, y) == want


def test_float32_nonfinite_values_are_counted():
    """A NaN or Inf in a float32 chunk is counted as before (its chunk summed again in float64)."""
    value = np.linspace(-1, 1, 5000, dtype=np.float32)
    value[[10, 2000]] = np.nan
    value[4000] = -np.inf
    sums, _ = scan_stats.measure_value([value.size], value, None, 1024)
    assert (sums.nan, sums.inf) == (2, 1) and math.isnan(sums.sumsq)


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("prev_value, cur_value", [(0.1, 1.58e8), (1e-30, 1.0), (3e19, 3e19 + 1e13), (2.0, -1e20)])
def test_cosine_of_values_far_apart_in_scale(prev_value, cur_value):
    """The cosine is x.p summed directly: from the sums of squares (x.p = (|x|^2 + |p|^2 -
    |x - p|^2) / 2) a float32 accumulator growing from 0.1 to 1.58e8 (a real Ftrl slot) gave 0
    instead of 1; values beyond float32's squares are summed in float64."""
    n = 3000
    prev = np.full(n, prev_value, np.float32)
    cur = np.full(n, cur_value, np.float32)
    first, chunks = scan_stats.measure_value([n], prev, None, 1024)
    sums, _ = scan_stats.measure_value([n], cur, scan_stats.Measured(prev, chunks, first.sumsq), 1024)
    c, p = cur.astype(np.float64), prev.astype(np.float64)
    want = float(np.dot(c, p) / (np.linalg.norm(c) * np.linalg.norm(p)))
    assert scan_stats.figures_of(sums).cosine == pytest.approx(want, abs=1e-6)
