"""Benchmark: ``ckptinspect.transplant`` vs TensorFlow's / Keras' own loading, on a ~1 GiB model.

Writes once (cached in the work folder) the weights of a Keras 3 chain of Dense layers of about
SIZE MiB as a TF checkpoint (``tf.train.Checkpoint(model=model).write``) and as a Keras 3
``.weights.h5`` (``model.save_weights``). Then, in this one process (TensorFlow imported once,
files read once beforehand so the page cache is warm), times loading the same weights into a
freshly built model (building is not timed) by:

* ``ckptinspect.transplant(prefix, model)``: plan by object-graph path, read one tensor at a time,
  assign, read every variable back and compare it with the source;
* ``tf.train.Checkpoint(model=model).restore(prefix)`` (eager: the values are assigned at once);
* ``ckptinspect.transplant(weights.h5, model)``: plan by names;
* ``model.load_weights(weights.h5)``;
* ``ckptinspect.transplant(prefix, model, dry_run=True)``: the plan alone.

Every load is checked (one kernel compared with the source) after its timing. Prints a table of
median seconds and the ratio of each transplant to the TF/Keras loader of the same file.

    python benchmarks/bench_transplant.py [--size-mb 1024] [--units 4096] [--rounds 1] [--work DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import platform
import shutil
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
MIB = 1024 * 1024
DONE = "done.json"
PROBE = "probe.npy"  # the first kernel, as the model that was saved held it


def build(layers: int, units: int):
    """A built Keras 3 Sequential chain of ``layers`` Dense(units) layers (float32, random init)."""
    import keras

    return keras.Sequential(
        [keras.Input((units,)), *[keras.layers.Dense(units, name=f"dense_{i:03d}") for i in range(layers)]],
        name="bench",
    )


def generate(work: pathlib.Path, layers: int, units: int) -> tuple[str, str]:
    """The TF prefix and ``.weights.h5`` of one random model, written once."""
    import numpy as np
    import tensorflow as tf

    prefix, weights_h5 = work / "tf" / "ckpt", work / "model.weights.h5"
    done = work / DONE
    if done.exists() and json.loads(done.read_text()) == {"layers": layers, "units": units}:
        return str(prefix), str(weights_h5)
    shutil.rmtree(work, ignore_errors=True)
    (work / "tf").mkdir(parents=True)
    model = build(layers, units)
    tf.train.Checkpoint(model=model).write(str(prefix))
    model.save_weights(str(weights_h5))
    np.save(work / PROBE, np.asarray(model.get_layer("dense_000").kernel.numpy()))
    done.write_text(json.dumps({"layers": layers, "units": units}))
    return str(prefix), str(weights_h5)


def warm(paths: list[pathlib.Path]) -> None:
    for path in paths:
        with open(path, "rb") as f:
            while f.read(64 * MIB):
                pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="model weights in MiB (default 1024)")
    parser.add_argument("--units", type=int, default=4096, help="Dense width (kernel = units x units float32)")
    parser.add_argument("--rounds", type=int, default=1, help="timed runs of each method (median reported)")
    parser.add_argument("--work", default=str(HERE / "_work" / "transplant"), help="cache folder of the inputs")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from ckptinspect._tf import import_tf

    tf = import_tf()
    import numpy as np

    import ckptinspect

    layer_bytes = (args.units * args.units + args.units) * 4
    layers = max(1, round(args.size_mb * MIB / layer_bytes))
    work = pathlib.Path(args.work)
    prefix, weights_h5 = generate(work, layers, args.units)
    files = sorted(p for p in work.rglob("*") if p.is_file() and p.name not in (DONE, PROBE))
    warm(files)
    total = layers * layer_bytes
    probe = np.load(work / PROBE)

    def transplant_tf(model):
        report = ckptinspect.transplant(prefix, model)
        assert len(report.assigned) == 2 * layers and report.verified

    def restore_tf(model):
        tf.train.Checkpoint(model=model).restore(prefix).assert_nontrivial_match()

    def transplant_h5(model):
        report = ckptinspect.transplant(weights_h5, model)
        assert len(report.assigned) == 2 * layers and report.verified

    def load_h5(model):
        model.load_weights(weights_h5)

    def plan_only(model):
        report = ckptinspect.transplant(prefix, model, dry_run=True)
        assert len(report.assigned) == 2 * layers

    methods = {
        "ckptinspect.transplant(TF checkpoint)": (transplant_tf, True),
        "tf.train.Checkpoint(model).restore": (restore_tf, True),
        "ckptinspect.transplant(.weights.h5)": (transplant_h5, True),
        "model.load_weights(.weights.h5)": (load_h5, True),
        "ckptinspect.transplant(dry_run=True)": (plan_only, False),
    }
    times: dict[str, list[float]] = {name: [] for name in methods}
    order = list(methods)
    for r in range(args.rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            fn, loads = methods[name]
            model = build(layers, args.units)
            start = time.perf_counter()
            fn(model)
            times[name].append(time.perf_counter() - start)
            kernel = np.asarray(model.get_layer("dense_000").kernel.numpy())
            assert np.array_equal(kernel, probe) == loads, f"{name}: the weights did not arrive as expected"
            del model
            gc.collect()

    med = {name: statistics.median(ts) for name, ts in times.items()}
    ratios = {
        "transplant / Checkpoint.restore (TF checkpoint)":
            med["ckptinspect.transplant(TF checkpoint)"] / med["tf.train.Checkpoint(model).restore"],
        "transplant / load_weights (.weights.h5)":
            med["ckptinspect.transplant(.weights.h5)"] / med["model.load_weights(.weights.h5)"],
    }
    print(f"model: {layers} Dense({args.units}) layers, {2 * layers} variables, {total / MIB:.0f} MiB of weights; "
          f"{args.rounds} round(s); {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
          f"tensorflow {tf.__version__}")
    width = max(len(n) for n in med)
    for name, seconds in med.items():
        spread = max(times[name]) - min(times[name])
        print(f"  {name:<{width}}  {seconds:7.2f} s" + (f"  (spread {spread:.2f} s)" if args.rounds > 1 else "")
              + f"  {total / MIB / seconds:7.0f} MiB/s")
    for label, value in ratios.items():
        print(f"  ratio {label}: {value:.2f}x")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({
            "layers": layers, "units": args.units, "bytes": total, "rounds": args.rounds,
            "seconds": times, "median": med, "ratios": ratios, "tensorflow": tf.__version__,
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()
