"""Benchmark: `ckptinspect ls` vs `tf.train.list_variables` vs TensorFlow's inspect_checkpoint.

Generates a TF bundle checkpoint of N variables (about SIZE MB) once into a work folder, then
times each tool as a whole process, alternating them, several rounds; prints the median wall
time, the spread, peak RSS of the child, and the ratios.

    python benchmarks/bench_ls.py [--size-mb 1024] [--variables 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _common  # noqa: E402 - the shared timing helpers beside this script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--variables", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", default=str(HERE / "_work"))
    args = parser.parse_args()

    prefix = _common.generate_flat_bundle(pathlib.Path(args.work) / f"ls_{args.size_mb}mb_{args.variables}v" / "ckpt", args.size_mb, args.variables)
    env_py = [sys.executable, "-c"]
    tools = {
        "ckptinspect ls": [sys.executable, "-m", "ckptinspect", "ls", prefix],
        "ckptinspect ls --format json": [sys.executable, "-m", "ckptinspect", "ls", prefix, "--format", "json"],
        "tf.train.list_variables": env_py + [f"import tensorflow as tf; print(len(tf.train.list_variables({prefix!r})))"],
        "inspect_checkpoint": [sys.executable, "-m", "tensorflow.python.tools.inspect_checkpoint", f"--file_name={prefix}"],
    }
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    times: dict[str, list[float]] = {k: [] for k in tools}
    peaks: dict[str, int] = {k: 0 for k in tools}
    for _ in range(args.rounds):
        for name, cmd in tools.items():  # alternate the tools within each round
            t, rss, _ = _common.run_timed(cmd)
            times[name].append(t)
            peaks[name] = max(peaks[name], rss)
    base = statistics.median(times["ckptinspect ls"])
    size = sum(f.stat().st_size for f in pathlib.Path(prefix).parent.iterdir())
    print(f"checkpoint: {args.variables} variables, {size / 2**20:.0f} MiB, {os.cpu_count()} cores, {args.rounds} rounds")
    print(f"{'tool':<30} {'median s':>9} {'spread s':>9} {'peak MiB':>9} {'vs ckptinspect':>15}")
    for name in tools:
        med = statistics.median(times[name])
        spread = max(times[name]) - min(times[name])
        print(f"{name:<30} {med:9.3f} {spread:9.3f} {peaks[name] / 2**20:9.1f} {med / base:14.1f}x")


if __name__ == "__main__":
    main()
