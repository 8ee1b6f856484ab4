"""Benchmark: ``ckptinspect.doctor`` on a ~1 GiB, ~2,000-entry training checkpoint.

Uses the shared synthetic checkpoint of ``_common.py`` (a Keras 3 chain of Dense layers with its
Adam state, ``tf.train.Checkpoint(model=..., optimizer=...)``; the builder is the generated
``bench_model:build``). In one child process (TensorFlow imported once, the checkpoint's files
read once beforehand so the page cache is warm) it times building the model, then each
scenario of ``doctor`` on the built model (median of ``--rounds``):

* ``graph-path``: the same architecture: paired by object-graph path;
* ``names``: a ``--map`` rule that matches nothing, so the object graph is skipped and the
  ``layers`` stage pairs every weight by name;
* ``layer-order``: the same architecture with other layer names (``block_NNNN``) and the same
  rule (a Keras 3 object graph does not hold layer names, so its paths would still pair), so
  only layer order and shape pair them (one layer of its own shape, then hundreds of identical
  ones, ordered by the checkpoint's Keras numbering).

The target (issue 13) is ``doctor`` under 2 s beyond building the model.

    python benchmarks/bench_doctor.py [--size-mb 1024] [--variables 2000] [--rounds 3] [--work DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import DEFAULT_WORK, ensure_checkpoints, layout_for  # noqa: E402

TARGET_SECONDS = 2.0

CHILD = r'''
import json, statistics, sys, time
prefix, rounds = sys.argv[1], int(sys.argv[2])
for path in [prefix + ".index"] + sorted(__import__("glob").glob(prefix + ".data-*")):
    with open(path, "rb") as f:
        while f.read(1 << 26):
            pass
start = time.perf_counter()
import tensorflow as tf, keras, ckptinspect, bench_model
imported = time.perf_counter() - start

def renamed():
    layers = [keras.layers.Dense(bench_model.UNITS, name=f"block_{i:04d}") for i in range(bench_model.LAYERS)]
    return keras.Sequential([keras.Input((bench_model.INPUT,)), *layers], name="bench")

out = {"import_s": imported}
for scenario, build, kwargs in [("graph-path", bench_model.build, {}), ("names", bench_model.build, {"mapping": ["(?!)="]}),
                                ("layer-order", renamed, {"mapping": ["(?!)="]})]:
    t = time.perf_counter()
    model = build()
    built = time.perf_counter() - t
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        report = ckptinspect.doctor(prefix, model, **kwargs)
        times.append(time.perf_counter() - t)
    hows = sorted({w.matched_by for w in report.weights})
    out[scenario] = {"build_s": built, "doctor_s": statistics.median(times), "runs": times, "ok": report.ok,
                     "weights": len(report.weights), "matched_by": hows, "map_verified": report.map_verified}
    del model
    keras.backend.clear_session()
print(json.dumps(out))
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--variables", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=pathlib.Path, default=DEFAULT_WORK)
    parser.add_argument("--json", type=pathlib.Path, default=None)
    args = parser.parse_args()
    layout = layout_for(args.size_mb, args.variables)
    sets = ensure_checkpoints([(layout, ["bundle"])], args.work)
    cs = sets[layout.name]
    proc = subprocess.run([sys.executable, "-c", CHILD, cs.a, str(args.rounds)], env=cs.env(), capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-4000:])
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["checkpoint"] = {"path": cs.a, **{k: cs.meta.get(k) for k in ("entries", "model_weights", "layers", "units")},
                            "bytes": cs.meta.get("files", {}).get("a")}
    print(f"checkpoint: {cs.a}: {result['checkpoint']['entries']} entries, {result['checkpoint']['bytes'] / 2**20:.0f} MiB, "
          f"{result['checkpoint']['model_weights']} model weights; import {result['import_s']:.2f} s")
    print(f"{'scenario':<12}  {'build model':>11}  {'doctor (median)':>15}  {'target':>8}  matched by")
    for scenario in ("graph-path", "names", "layer-order"):
        r = result[scenario]
        verdict = "ok" if r["doctor_s"] < TARGET_SECONDS else "SLOW"
        print(f"{scenario:<12}  {r['build_s']:>10.2f}s  {r['doctor_s']:>14.2f}s  {verdict:>8}  {', '.join(r['matched_by'])}"
              f"{'' if r['ok'] else ' (NOT ok)'}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
