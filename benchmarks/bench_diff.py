"""Benchmark: `ckptinspect diff` vs a plain TensorFlow script vs `h5diff`.

Generates a pair of TF bundle checkpoints (``tf.train.Checkpoint`` of a dict of ``tf.Variable``;
B is A with some variables perturbed) and the same weights as an HDF5 pair (Keras 3
``.weights.h5`` layout, written with h5py), then times whole processes, alternating the tools,
median of the rounds:

* ``ckptinspect diff A B`` on the TF pair (all statistics: max abs diff, rel L2, cosine,
  NaN/Inf counts, differing-element counts),
* a straightforward TensorFlow script: ``tf.train.load_checkpoint`` both, max abs diff per key,
* ``h5diff A.h5 B.h5`` (Debian package ``hdf5-tools``),
* ``ckptinspect diff A.h5 B.h5``.

Peak RSS is the child's own (``os.wait4``). The memory target is measured against two
baselines: ``ckptinspect diff --role metadata`` on the same pair (opens both checkpoints and all
their metadata, reads no tensor: no variable has that role), and ``ckptinspect diff`` on a pair
of the same layout holding two tiny variables (imports and start-up only).

    python benchmarks/bench_diff.py [--size-mb 1024] [--variables 2000] [--rounds 3] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = pathlib.Path(__file__).resolve().parent
PERTURBED_EVERY = 10  # every 10th variable gets noise on all its elements
TF_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tensorflow as tf

    a, b = sys.argv[1], sys.argv[2]
    ra, rb = tf.train.load_checkpoint(a), tf.train.load_checkpoint(b)
    differ = 0
    for key in sorted(ra.get_variable_to_shape_map()):
        if key == "_CHECKPOINTABLE_OBJECT_GRAPH":
            continue
        x, y = ra.get_tensor(key), rb.get_tensor(key)
        if x.size and float(np.max(np.abs(x - y))) > 0:
            differ += 1
    print(differ)
    """
)
GENERATOR = textwrap.dedent(
    """
    import sys, json
    import numpy as np
    import h5py
    import tensorflow as tf

    out, size_mb, n, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rng = np.random.default_rng(0)
    # Sizes: log-normal, scaled to the total; 2-D shapes (rows, 64) or 1-D for tiny ones.
    weights = rng.lognormal(0.0, 1.0, n)
    elems = np.maximum(1, (weights / weights.sum() * size_mb * 2**20 / 4).astype(np.int64))
    shapes = [(int(e) // 64, 64) if e >= 64 else (int(e),) for e in elems]
    perturbed = set(range(0, n, every)) | {n - 1}
    va, vb = {}, {}
    with h5py.File(out + "/a.weights.h5", "w") as ha, h5py.File(out + "/b.weights.h5", "w") as hb:
        for h in (ha, hb):
            h.create_group("layers")
        for i, shape in enumerate(shapes):
            name = f"layer_{i:04d}"
            x = rng.standard_normal(shape, dtype=np.float32)
            y = x.copy()
            if i == n - 1:
                y.reshape(-1)[y.size // 2] += 0.5  # one element only
            elif i in perturbed:
                y += rng.standard_normal(shape, dtype=np.float32) * 1e-3
            va[name] = tf.Variable(x, name=name)
            vb[name] = tf.Variable(y, name=name)
            for h, v in ((ha, x), (hb, y)):
                g = h.create_group(f"layers/{name}/vars")
                g.attrs["name"] = name
                g.create_dataset("0", data=v)
    tf.train.Checkpoint(vars=va).write(out + "/a/ckpt")
    tf.train.Checkpoint(vars=vb).write(out + "/b/ckpt")
    # The baseline pair: the same layouts with two tiny variables (one of them changed).
    tiny = {"layer_0000": np.ones((4, 4), np.float32), "layer_0001": np.zeros(4, np.float32)}
    for side, delta in (("a", 0.0), ("b", 1.0)):
        values = {k: v + (delta if k == "layer_0001" else 0.0) for k, v in tiny.items()}
        tf.train.Checkpoint(vars={k: tf.Variable(v) for k, v in values.items()}).write(f"{out}/tiny_{side}/ckpt")
        with h5py.File(f"{out}/tiny_{side}.weights.h5", "w") as h:
            for k, v in values.items():
                g = h.create_group(f"layers/{k}/vars")
                g.attrs["name"] = k
                g.create_dataset("0", data=v)
    largest = max(int(np.prod(s)) * 4 for s in shapes)
    json.dump({"perturbed": len(perturbed), "largest_bytes": largest, "total_bytes": int(sum(np.prod(s) for s in shapes)) * 4},
              open(out + "/info.json", "w"))
    """
)


def run_timed(cmd: list[str], ok_codes: tuple[int, ...] = (0,)) -> tuple[float, int, str]:
    """Run a command; return (wall seconds, peak RSS of the child in bytes, stdout)."""
    with tempfile.TemporaryFile() as errf:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf)
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        proc.stdout.close()
        errf.seek(0)
        err = errf.read().decode(errors="replace")
    code = os.waitstatus_to_exitcode(status)
    if code not in ok_codes:
        raise SystemExit(f"command failed ({code}): {' '.join(cmd)}\n{err[-2000:]}")
    return elapsed, usage.ru_maxrss * 1024, out.decode(errors="replace")


def generate(work: pathlib.Path, size_mb: int, variables: int) -> dict:
    info = work / "info.json"
    if info.exists():
        return json.loads(info.read_text())
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    subprocess.run([sys.executable, "-c", GENERATOR, str(work), str(size_mb), str(variables), str(PERTURBED_EVERY)],
                   check=True, env=env)
    return json.loads(info.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="Size of each checkpoint (default 1024).")
    parser.add_argument("--variables", type=int, default=2000, help="Number of variables (default 2000).")
    parser.add_argument("--rounds", type=int, default=3, help="Timed rounds per tool; the median is reported.")
    parser.add_argument("--workdir", type=pathlib.Path, default=None, help="Where to generate (default benchmarks/_work).")
    parser.add_argument("--keep", action="store_true", help="Keep the generated checkpoints.")
    args = parser.parse_args()
    if shutil.which("h5diff") is None:
        raise SystemExit("h5diff not found: apt-get update && apt-get install -y hdf5-tools")

    work = args.workdir or HERE / "_work" / f"diff_{args.size_mb}mb_{args.variables}v"
    t0 = time.perf_counter()
    info = generate(work, args.size_mb, args.variables)
    print(f"generated {work} in {time.perf_counter() - t0:.1f} s: {args.variables} variables,"
          f" {info['total_bytes'] / 2**20:.0f} MiB per checkpoint, largest tensor {info['largest_bytes'] / 2**20:.1f} MiB,"
          f" {info['perturbed']} perturbed", flush=True)
    script = work / "tf_maxdiff.py"
    script.write_text(TF_SCRIPT)
    a, b = str(work / "a" / "ckpt"), str(work / "b" / "ckpt")
    ha, hb = str(work / "a.weights.h5"), str(work / "b.weights.h5")
    py = sys.executable
    tools = {
        "ckptinspect diff (TF pair)": ([py, "-m", "ckptinspect", "diff", a, b], (1,)),
        "TF script (TF pair)": ([py, str(script), a, b], (0,)),
        "h5diff (HDF5 pair)": (["h5diff", ha, hb], (1,)),
        "ckptinspect diff (HDF5 pair)": ([py, "-m", "ckptinspect", "diff", ha, hb], (1,)),
        "baseline: diff tiny TF pair": ([py, "-m", "ckptinspect", "diff", str(work / "tiny_a" / "ckpt"),
                                         str(work / "tiny_b" / "ckpt")], (1,)),
        "baseline: diff tiny HDF5 pair": ([py, "-m", "ckptinspect", "diff", str(work / "tiny_a.weights.h5"),
                                           str(work / "tiny_b.weights.h5")], (1,)),
        # Opens both checkpoints (all their metadata) and reads no tensor: no variable has that role.
        "baseline: TF pair, no tensor": ([py, "-m", "ckptinspect", "diff", a, b, "--role", "metadata"], (0,)),
        "baseline: HDF5 pair, no tensor": ([py, "-m", "ckptinspect", "diff", ha, hb, "--role", "metadata"], (0,)),
    }

    # Correctness first (untimed): every tool finds the same perturbed variables.
    _, _, out = run_timed([py, "-m", "ckptinspect", "diff", a, b, "--format", "json"], (1,))
    doc = json.loads(out)
    _, _, out_h5 = run_timed([py, "-m", "ckptinspect", "diff", ha, hb, "--format", "json"], (1,))
    doc_h5 = json.loads(out_h5)
    _, _, tf_out = run_timed([py, str(script), a, b])
    assert doc["summary"]["changed"] == info["perturbed"] == int(tf_out.strip()) == doc_h5["summary"]["changed"], (
        doc["summary"], doc_h5["summary"], tf_out)
    print(f"check: ckptinspect (TF and HDF5 pairs) and the TF script each find {info['perturbed']} changed variables",
          flush=True)

    times: dict[str, list[float]] = {k: [] for k in tools}
    rss: dict[str, int] = dict.fromkeys(tools, 0)
    names = list(tools)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:  # rotate the order each round
            cmd, ok = tools[name]
            elapsed, peak, _ = run_timed(cmd, ok)
            times[name].append(elapsed)
            rss[name] = max(rss[name], peak)
            print(f"  round {r + 1}: {name:30s} {elapsed:7.2f} s  {peak / 2**20:8.0f} MiB", flush=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    print()
    print(f"{'tool':32s} {'median s':>9s} {'min':>7s} {'max':>7s} {'peak RSS MiB':>13s}")
    for k in tools:
        print(f"{k:32s} {med[k]:9.2f} {min(times[k]):7.2f} {max(times[k]):7.2f} {rss[k] / 2**20:13.0f}")
    ci_tf, ci_h5 = "ckptinspect diff (TF pair)", "ckptinspect diff (HDF5 pair)"
    print()
    print(f"TF script / ckptinspect diff (TF pair):      {med['TF script (TF pair)'] / med[ci_tf]:.2f}x  (target >= 1)")
    print(f"h5diff / ckptinspect diff (HDF5 pair):       {med['h5diff (HDF5 pair)'] / med[ci_h5]:.2f}x  (target >= 2)")
    for k, tiny, meta in ((ci_tf, "baseline: diff tiny TF pair", "baseline: TF pair, no tensor"),
                          (ci_h5, "baseline: diff tiny HDF5 pair", "baseline: HDF5 pair, no tensor")):
        for label, base in (("metadata baseline (both opened, no tensor read)", rss[meta]),
                            ("tiny-pair baseline (imports only)", rss[tiny])):
            over = (rss[k] - base) / info["largest_bytes"]
            print(f"peak RSS {k}: {rss[k] / 2**20:.0f} MiB = {label} {base / 2**20:.0f} MiB + {over:.2f}x largest"
                  f" tensor  (target <= {(base + 3 * info['largest_bytes']) / 2**20:.0f} MiB, 3x)")
    print(f"peak RSS TF script: {rss['TF script (TF pair)'] / 2**20:.0f} MiB, h5diff: {rss['h5diff (HDF5 pair)'] / 2**20:.0f} MiB")
    if not args.keep:
        shutil.rmtree(work)
        print(f"removed {work}")


if __name__ == "__main__":
    main()
