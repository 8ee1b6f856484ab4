"""Benchmark: `ckptinspect verify` vs reading every tensor with `tf.train.load_checkpoint`.

TensorFlow's reader checks each tensor's crc32c as it reads it, so "read every tensor" is what
a user without ckptinspect runs to find out whether a checkpoint is whole. Generates a TF
bundle checkpoint of N float32 variables (about SIZE MB) once into a work folder, reads it once
with each tool to warm the page cache, then times each as a whole process, alternating them,
several rounds; prints the median wall time, the spread, the child's peak RSS, and the ratios.

    python benchmarks/bench_verify.py [--size-mb 1024] [--variables 2000] [--rounds 5]
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

TF_READ_ALL = """
import sys, tensorflow as tf
reader = tf.train.load_checkpoint(sys.argv[1])
n = 0
for key in reader.get_variable_to_shape_map():
    value = reader.get_tensor(key)  # raises on a checksum mismatch
    n += len(value) if isinstance(value, bytes) else value.nbytes
print(n)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--variables", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", default=str(HERE / "_work"))
    args = parser.parse_args()

    prefix = _common.generate_flat_bundle(pathlib.Path(args.work) / f"verify_{args.size_mb}mb_{args.variables}v" / "ckpt",
                      args.size_mb, args.variables)
    tools = {
        "ckptinspect verify": [sys.executable, "-m", "ckptinspect", "verify", prefix],
        "ckptinspect verify --format json": [sys.executable, "-m", "ckptinspect", "verify", prefix, "--format", "json"],
        "tf load_checkpoint + get_tensor (all)": [sys.executable, "-c", TF_READ_ALL, prefix],
    }
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    for cmd in tools.values():  # warm the page cache and imports once, untimed
        _common.run_timed(cmd)
    times: dict[str, list[float]] = {k: [] for k in tools}
    peaks: dict[str, int] = {k: 0 for k in tools}
    for _ in range(args.rounds):
        for name, cmd in tools.items():  # alternate the tools within each round
            t, rss, _ = _common.run_timed(cmd)
            times[name].append(t)
            peaks[name] = max(peaks[name], rss)
    base = statistics.median(times["ckptinspect verify"])
    size = sum(f.stat().st_size for f in pathlib.Path(prefix).parent.iterdir())
    print(f"checkpoint: {args.variables} variables, {size / 2**20:.0f} MiB, {os.cpu_count()} cores,"
          f" {args.rounds} rounds, warm page cache")
    print(f"{'tool':<40} {'median s':>9} {'spread s':>9} {'peak MiB':>9} {'vs verify':>10}")
    for name in tools:
        med = statistics.median(times[name])
        spread = max(times[name]) - min(times[name])
        print(f"{name:<40} {med:9.3f} {spread:9.3f} {peaks[name] / 2**20:9.1f} {med / base:9.1f}x")


if __name__ == "__main__":
    main()
