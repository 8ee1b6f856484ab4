"""`diff` and `verify` on both cores: the same results, in the same order, with 1 or N workers.

Checkpoints are written by TensorFlow; ground truth for values comes from TensorFlow's reader
(``tf.train.load_checkpoint``), for damage from TensorFlow refusing the damaged key.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import ckptinspect
from ckptinspect import _parallel
from ckptinspect.formats.tf import data as tf_data
from ckptinspect.formats.tf.index import read_index
from ckptinspect.ops.diff import compare

tf = pytest.importorskip("tensorflow")

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN = ROOT / "fixtures" / "run"
BLOCK_FLOATS = compare.BLOCK_BYTES // 4
SMALL_BATCH_BYTES = 1 << 16
POOL_THREAD_PREFIX = "ckptinspect"  # ordered_map's ThreadPoolExecutor(thread_name_prefix=...)


def _write(prefix: pathlib.Path, values: dict[str, np.ndarray]) -> str:
    module = tf.Module()
    for k, v in values.items():
        setattr(module, k, tf.Variable(v))
    return tf.train.Checkpoint(m=module).write(str(prefix))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A and B with tensors of several blocks: equal ones, ones changed everywhere, changed in
    one late block only, NaN/Inf in a late block, float64, int32 and complex64."""
    root = tmp_path_factory.mktemp("parallel")
    rng = np.random.default_rng(7)
    n = 3 * BLOCK_FLOATS + 12345  # four blocks, the last one partial
    a = {
        "same": rng.standard_normal(n).astype(np.float32),
        "moved": rng.standard_normal(n).astype(np.float32),
        "late": rng.standard_normal(n).astype(np.float32),
        "nonfinite": rng.standard_normal(n).astype(np.float32),
        "wide": rng.standard_normal(n // 2).astype(np.float64),
        "count": rng.integers(-1000, 1000, n).astype(np.int32),
        "cplx": (rng.standard_normal(n // 2) + 1j * rng.standard_normal(n // 2)).astype(np.complex64),
        "small": np.arange(7, dtype=np.float32),
    }
    b = {k: v.copy() for k, v in a.items()}
    b["moved"] += rng.standard_normal(n).astype(np.float32) * np.float32(1e-3)
    b["late"][-5] += np.float32(0.5)
    a["nonfinite"][BLOCK_FLOATS * 2 + 3] = np.nan
    b["nonfinite"][BLOCK_FLOATS * 2 + 3] = np.nan
    b["nonfinite"][-2] = np.inf
    b["wide"][1::3] *= 1.0001
    b["count"][BLOCK_FLOATS + 1] += 1
    b["cplx"][::5] += np.complex64(1e-2j)
    return _write(root / "a" / "ckpt", a), _write(root / "b" / "ckpt", b)


def _diff_with(monkeypatch, workers: int, *args, **kwargs):
    monkeypatch.setattr(_parallel, "WORKERS", workers)
    return ckptinspect.diff(*args, **kwargs)


@pytest.mark.parametrize("tol", [{}, {"atol": 1e-4, "rtol": 1e-3}])
def test_diff_same_results_with_one_and_two_workers(pair, monkeypatch, tol):
    one = _diff_with(monkeypatch, 1, *pair, **tol).to_dict()
    two = _diff_with(monkeypatch, 2, *pair, **tol).to_dict()
    assert one == two  # the same numbers, bit for bit, and the same row order
    assert [v["name"] for v in one["variables"]] == [v["name"] for v in two["variables"]]
    rows = {v["name"].split("/")[1]: v for v in two["variables"]}
    changed = {"moved", "late", "nonfinite", "wide", "count", "cplx"} - ({"wide"} if tol else set())  # wide: within rtol
    assert {k for k, v in rows.items() if v["status"] == "changed"} == changed
    assert rows["late"]["num_different"] == 1 and rows["count"]["num_different"] == 1
    # Ground truth from TensorFlow's reader.
    ra, rb = tf.train.load_checkpoint(pair[0]), tf.train.load_checkpoint(pair[1])
    for name in ("moved", "late", "wide", "count"):
        key = f"m/{name}/.ATTRIBUTES/VARIABLE_VALUE"
        x, y = ra.get_tensor(key).astype(np.float64), rb.get_tensor(key).astype(np.float64)
        assert rows[name]["max_abs_diff"] == float(np.max(np.abs(x - y)))
        assert rows[name]["rel_l2"] == pytest.approx(np.linalg.norm(x - y) / np.linalg.norm(x), rel=1e-12)
    assert rows["nonfinite"]["nan_a"] == 1 and rows["nonfinite"]["nan_b"] == 1 and rows["nonfinite"]["inf_b"] == 1


def test_diff_real_fixture_same_with_one_and_two_workers(monkeypatch):
    one = _diff_with(monkeypatch, 1, RUN / "ckpt-4", RUN / "ckpt-8").to_dict()
    two = _diff_with(monkeypatch, 2, RUN / "ckpt-4", RUN / "ckpt-8").to_dict()
    assert one == two and one["summary"]["changed"] > 0


def _verify_with(monkeypatch, workers: int, path: str):
    monkeypatch.setattr(_parallel, "WORKERS", workers)
    monkeypatch.setattr(tf_data, "BATCH_BYTES", SMALL_BATCH_BYTES)  # many batches in flight even on a small file
    seen: list[str] = []
    report = ckptinspect.verify(path, progress=lambda done, total, item: seen.append((done, item.key)))
    return report, seen


def _pool_threads() -> set[str]:
    """Names of the threads of ``_parallel.ordered_map``'s pool alive now."""
    return {t.name for t in threading.enumerate() if t.name.startswith(POOL_THREAD_PREFIX)}


# Runs in a fresh interpreter, so that CKPTINSPECT_WORKERS is read when ckptinspect is imported.
VERIFY_SCRIPT = textwrap.dedent(
    f"""
    import json, sys, threading
    import ckptinspect
    from ckptinspect import _parallel
    from ckptinspect.formats.tf import data as tf_data

    tf_data.BATCH_BYTES = {SMALL_BATCH_BYTES}
    pool, seen = set(), []
    before = most = threading.active_count()

    def progress(done, total, item):
        global most
        seen.append([done, item.key])
        most = max(most, threading.active_count())
        pool.update(t.name for t in threading.enumerate() if t.name.startswith({POOL_THREAD_PREFIX!r}))

    report = ckptinspect.verify(sys.argv[1], progress=progress)
    json.dump({{"workers": _parallel.WORKERS, "pool": sorted(pool), "before": before, "most": most, "seen": seen,
               "report": report.to_dict()}}, sys.stdout)
    """
)


def _damage(prefix: str, dest: pathlib.Path, key: str, at: int) -> str:
    src = pathlib.Path(prefix)
    for f in src.parent.iterdir():
        if f.name.startswith(src.name):
            shutil.copy(f, dest / f.name)
    entry = next(e for e in read_index(prefix).entries if e.key == key)
    data = next(dest.glob(f"{src.name}.data-*"))
    raw = bytearray(data.read_bytes())
    raw[entry.offset + at] ^= 0x40
    data.write_bytes(bytes(raw))
    return str(dest / src.name)


def test_verify_same_results_and_order_with_one_and_two_workers(pair, monkeypatch):
    for path in (pair[0], str(RUN / "ckpt-8")):
        one, seen_one = _verify_with(monkeypatch, 1, path)
        two, seen_two = _verify_with(monkeypatch, 2, path)
        assert one.to_dict() == two.to_dict() and one.intact
        assert seen_one == seen_two and [d for d, _ in seen_two] == list(range(1, len(seen_two) + 1))


def test_workers_from_the_environment_give_verify_one_thread(pair, monkeypatch):
    """``CKPTINSPECT_WORKERS=1`` (the knob of diff, scan and average) in a fresh process: verify
    checks in the calling thread, no pool thread ever runs, and the result and progress order are
    those of two workers here, where the pool's threads are seen at work."""
    env = {**os.environ, "CKPTINSPECT_WORKERS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", VERIFY_SCRIPT, pair[0]], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    one = json.loads(proc.stdout)
    assert one["workers"] == 1
    assert one["pool"] == [] and one["most"] == one["before"]  # no thread started while verify ran
    pool: set[str] = set()
    two, seen = _verify_with(monkeypatch, 2, pair[0])
    monkeypatch.setattr(tf_data, "BATCH_BYTES", SMALL_BATCH_BYTES)
    ckptinspect.verify(pair[0], progress=lambda done, total, item: pool.update(_pool_threads()))
    assert pool  # two workers: the pool's threads are there while verify runs
    assert one["report"] == json.loads(json.dumps(two.to_dict())) and two.intact
    assert [tuple(x) for x in one["seen"]] == seen and len(seen) == two.to_dict()["summary"]["tensors"]


def test_damaged_block_reported_at_its_variable(pair, monkeypatch, tmp_path):
    """A byte flipped in the third block of one tensor: verify (both workers) names exactly that
    key, as TensorFlow's reader refuses exactly that key; diff fails on it."""
    key = "m/late/.ATTRIBUTES/VARIABLE_VALUE"
    damaged = _damage(pair[0], tmp_path, key, 2 * compare.BLOCK_BYTES + 17)
    reader = tf.train.load_checkpoint(damaged)
    refused = []
    for k in reader.get_variable_to_shape_map():
        try:
            reader.get_tensor(k)
        except Exception:  # noqa: BLE001 - TensorFlow's DataLossError
            refused.append(k)
    assert refused == [key]
    for workers in (1, 2):
        report, _ = _verify_with(monkeypatch, workers, damaged)
        assert [(d.key, d.kind) for _, d in report.damaged] == [(key, "checksum")]
    monkeypatch.setattr(_parallel, "WORKERS", 2)
    with pytest.raises(ckptinspect.CkptError, match="checksum does not match") as info:
        ckptinspect.diff(damaged, pair[1])
    assert repr(key) in str(info.value)
