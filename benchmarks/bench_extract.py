"""Benchmark: `ckptinspect extract` vs the manual route (rebuild the model, restore, save).

Generates once, in a child process, a training checkpoint of about SIZE MiB: a Keras 3 chain of
Dense layers (model weights one third of the bytes) with its Adam state after one step, saved
with ``tf.train.Checkpoint(model=..., optimizer=...)``. Then times whole processes and reads
each child's own peak RSS (``os.wait4``):

* ``baseline``: a process that imports TensorFlow the way ckptinspect does and reads nothing
  (the floor every route pays);
* ``ckptinspect extract SRC -o OUT`` (TF output; by default a data shard holds as much as the
  largest tensor, so memory stays about one tensor);
* the same with ``--max-shard-size 256MiB`` (fewer, bigger data files; memory about one shard);
* ``ckptinspect extract SRC -o OUT.npz``;
* ``ckptinspect extract SRC -o OUT.weights.h5 --builder bench_model:build``;
* manual TF route: build the model, ``tf.train.Checkpoint(model=m).read(SRC).expect_partial()``,
  ``tf.train.Checkpoint(model=m).write(OUT)``;
* manual Keras route: the same restore, then ``m.save_weights(OUT.weights.h5)``.

    python benchmarks/bench_extract.py [--size-mb 1024] [--units 4096] [--rounds 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
WORK = HERE / "_work"
CHILD_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3"}
MODEL_MODULE = "bench_model"
MIB = 1024 * 1024

MODEL_TEMPLATE = '''"""Benchmark architecture for bench_extract.py: {layers} Dense layers of {units} units."""

import keras

LAYERS = {layers}
UNITS = {units}


def build():
    """The Keras 3 model, built, untrained."""
    layers = [keras.layers.Dense(UNITS, name=f"dense_{{i:03d}}") for i in range(LAYERS)]
    return keras.Sequential([keras.Input((UNITS,)), *layers], name="bench")
'''

GENERATE = '''
import sys, numpy as np, tensorflow as tf, keras
sys.path.insert(0, sys.argv[1])
from bench_model import build
model = build()
opt = keras.optimizers.Adam(1e-3)
opt.build(model.trainable_variables)
rng = np.random.default_rng(0)
for v in model.trainable_variables:   # random weights, one Adam step: m and v are not zeros
    v.assign(rng.standard_normal(tuple(v.shape), dtype=np.float32) * 0.02)
opt.apply_gradients([(tf.random.normal(v.shape, seed=1), v) for v in model.trainable_variables])
print(tf.train.Checkpoint(model=model, optimizer=opt).write(sys.argv[2]))
'''

BASELINE = "from ckptinspect._tf import import_tf; import_tf(); import ckptinspect.ops.extract.operation"

MANUAL_TF = '''
import sys, tensorflow as tf
sys.path.insert(0, sys.argv[1])
from bench_model import build
m = build()
tf.train.Checkpoint(model=m).read(sys.argv[2]).expect_partial()
tf.train.Checkpoint(model=m).write(sys.argv[3])
'''

MANUAL_KERAS = '''
import sys, tensorflow as tf
sys.path.insert(0, sys.argv[1])
from bench_model import build
m = build()
tf.train.Checkpoint(model=m).read(sys.argv[2]).expect_partial()
m.save_weights(sys.argv[3])
'''


def run_timed(cmd: list[str], cwd: pathlib.Path) -> tuple[float, int]:
    """Run a command; return (wall seconds, the child's own peak RSS in bytes)."""
    env = {**os.environ, **CHILD_ENV, "PYTHONPATH": str(cwd) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd, env=env)
    err = proc.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"command failed: {' '.join(cmd)}\n{err[-3000:]}")
    return elapsed, usage.ru_maxrss * 1024


def files_size(prefix: pathlib.Path) -> int:
    if prefix.is_file():
        return prefix.stat().st_size
    return sum(p.stat().st_size for p in prefix.parent.glob(prefix.name + ".*") if p.is_file())


def generate(size_mb: int, units: int) -> tuple[pathlib.Path, pathlib.Path, dict]:
    """The work folder, the checkpoint prefix, and facts about it (reused when present)."""
    kernel = units * units * 4
    layers = max(1, round(size_mb * MIB / 3 / kernel))
    folder = WORK / f"extract_{layers}x{units}"
    prefix = folder / "train" / "ckpt"
    meta_path = folder / "meta.json"
    if meta_path.exists():
        return folder, prefix, json.loads(meta_path.read_text())
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "train").mkdir(parents=True)
    (folder / f"{MODEL_MODULE}.py").write_text(MODEL_TEMPLATE.format(layers=layers, units=units))
    print(f"generating {layers} x Dense({units}) + Adam into {prefix} ...", file=sys.stderr)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", GENERATE, str(folder), str(prefix)], check=True, cwd=folder,
                   env={**os.environ, **CHILD_ENV}, stdout=subprocess.DEVNULL)
    meta = {
        "layers": layers,
        "units": units,
        "checkpoint_bytes": files_size(prefix),
        "model_bytes": layers * (kernel + units * 4),
        "largest_tensor_bytes": kernel,
        "generate_seconds": round(time.perf_counter() - start, 1),
    }
    meta_path.write_text(json.dumps(meta, indent=2))
    return folder, prefix, meta


def routes(folder: pathlib.Path, prefix: pathlib.Path) -> list[tuple[str, list[str], pathlib.Path | None]]:
    out = folder / "out"
    ck = [sys.executable, "-m", "ckptinspect", "extract", str(prefix)]
    return [
        ("baseline (import TF, read nothing)", [sys.executable, "-c", BASELINE], None),
        ("ckptinspect extract -o OUT (tf)", ck + ["-o", str(out / "x"), "--force"], out / "x"),
        ("ckptinspect extract --max-shard-size 256MiB", ck + ["-o", str(out / "y"), "--force", "--max-shard-size", "256MiB"],
         out / "y"),
        ("ckptinspect extract -o OUT.npz", ck + ["-o", str(out / "z.npz"), "--force"], out / "z.npz"),
        ("ckptinspect extract -o OUT.weights.h5 --builder", ck + ["-o", str(out / "w.weights.h5"), "--force",
                                                              "--builder", f"{MODEL_MODULE}:build"], out / "w.weights.h5"),
        ("manual: rebuild, restore, Checkpoint.write", [sys.executable, "-c", MANUAL_TF, str(folder), str(prefix),
                                                        str(out / "manual_tf")], out / "manual_tf"),
        ("manual: rebuild, restore, save_weights", [sys.executable, "-c", MANUAL_KERAS, str(folder), str(prefix),
                                                    str(out / "manual.weights.h5")], out / "manual.weights.h5"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="Checkpoint size to generate (MiB).")
    parser.add_argument("--units", type=int, default=4096, help="Dense width (one kernel = units^2 x 4 bytes).")
    parser.add_argument("--rounds", type=int, default=1, help="Rounds per route (median reported).")
    parser.add_argument("--json", type=pathlib.Path, help="Also write the results as JSON.")
    args = parser.parse_args(argv)

    folder, prefix, meta = generate(args.size_mb, args.units)
    out = folder / "out"
    results = []
    for name, cmd, output in routes(folder, prefix):
        times, peaks = [], []
        for _ in range(args.rounds):
            if output is not None and out.exists():
                shutil.rmtree(out)
            out.mkdir(exist_ok=True)
            t, rss = run_timed(cmd, folder)
            times.append(t)
            peaks.append(rss)
        results.append({"route": name, "seconds": statistics.median(times), "peak_rss": max(peaks),
                        "output_bytes": files_size(output) if output is not None else None})
    base = results[0]["peak_rss"]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"checkpoint: {meta['layers']} x Dense({meta['units']}) + Adam, {meta['checkpoint_bytes'] / MIB:.0f} MiB "
          f"(model {meta['model_bytes'] / MIB:.0f} MiB, largest tensor {meta['largest_tensor_bytes'] / MIB:.0f} MiB), "
          f"rounds: {args.rounds}")
    print()
    print(f"{'route':<48} {'seconds':>8} {'peak RSS':>10} {'above baseline':>15} {'output':>10}")
    for r in results:
        above = "" if r is results[0] else f"{(r['peak_rss'] - base) / MIB:.0f} MiB"
        size = "" if r["output_bytes"] is None else f"{r['output_bytes'] / MIB:.0f} MiB"
        print(f"{r['route']:<48} {r['seconds']:>8.1f} {r['peak_rss'] / MIB:>6.0f} MiB {above:>15} {size:>10}")
    if args.json:
        args.json.write_text(json.dumps({"checkpoint": meta, "results": results}, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
