"""Benchmark: `ckptinspect ls` of a 1 GB .safetensors and a 1 GB torch .pt vs the libraries.

Needs torch and safetensors (to write the files and for the baselines; ckptinspect itself uses
neither). Writes, once, a state dict of N float32 tensors (about SIZE MB) with
``safetensors.torch.save_file`` and ``torch.save`` into the work folder, then times each tool as
a whole process, alternating them, several rounds; prints the median wall time, the spread, the
peak RSS and the ratios.

* ``safe_open keys``: a script opening the file with ``safetensors.safe_open`` and listing keys
  with shapes and dtypes (``get_slice``), the safetensors library's own header-only path.
* ``torch.load(weights_only=True)``: a script loading the .pt (every tensor's bytes read).

    python benchmarks/bench_torch.py [--size-mb 1024] [--variables 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _common  # noqa: E402 - the shared timing helpers beside this script

GENERATE = r"""
import sys, torch
from safetensors.torch import save_file
size_mb, variables, st_path, pt_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
per = max(1, size_mb * 2**20 // 4 // variables)
g = torch.Generator().manual_seed(0)
state = {f"layers.{i}.weight": torch.randn(per, generator=g).reshape(-1, 64) if per % 64 == 0 else torch.randn(per, generator=g)
         for i in range(variables)}
save_file(state, st_path, metadata={"format": "pt"})
torch.save(state, pt_path)
"""

SAFE_OPEN = r"""
import sys
from safetensors import safe_open
with safe_open(sys.argv[1], framework="np") as f:
    rows = [(k, f.get_slice(k).get_shape(), f.get_slice(k).get_dtype()) for k in f.keys()]
print(len(rows))
"""

TORCH_LOAD = r"""
import sys, torch
state = torch.load(sys.argv[1], weights_only=True)
print(len(state))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--variables", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", default=str(HERE / "_work"))
    args = parser.parse_args()

    work = pathlib.Path(args.work) / f"torch_{args.size_mb}mb_{args.variables}v"
    st_path, pt_path = work / "model.safetensors", work / "model.pt"
    if not (st_path.is_file() and pt_path.is_file()):
        work.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-c", GENERATE, str(args.size_mb), str(args.variables), str(st_path), str(pt_path)],
                       check=True)
    ck = [sys.executable, "-m", "ckptinspect"]
    groups = {
        "safetensors": {
            "ckptinspect ls": [*ck, "ls", str(st_path)],
            "ckptinspect ls --format json": [*ck, "ls", str(st_path), "--format", "json"],
            "safe_open keys": [sys.executable, "-c", SAFE_OPEN, str(st_path)],
        },
        "torch .pt": {
            "ckptinspect ls": [*ck, "ls", str(pt_path)],
            "ckptinspect ls --format json": [*ck, "ls", str(pt_path), "--format", "json"],
            "torch.load(weights_only=True)": [sys.executable, "-c", TORCH_LOAD, str(pt_path)],
        },
    }
    print(f"{args.variables} float32 tensors, {os.cpu_count()} cores, {args.rounds} rounds")
    for group, tools in groups.items():
        times: dict[str, list[float]] = {k: [] for k in tools}
        peaks: dict[str, int] = {k: 0 for k in tools}
        for _ in range(args.rounds):
            for name, cmd in tools.items():  # alternate the tools within each round
                t, rss, _ = _common.run_timed(cmd)
                times[name].append(t)
                peaks[name] = max(peaks[name], rss)
        size = (st_path if group == "safetensors" else pt_path).stat().st_size
        print(f"\n{group}: {size / 2**20:.0f} MiB")
        print(f"{'tool':<32} {'median s':>9} {'spread s':>9} {'peak MiB':>9} {'vs ckptinspect':>15}")
        base = statistics.median(times["ckptinspect ls"])
        for name in tools:
            med = statistics.median(times[name])
            print(f"{name:<32} {med:9.3f} {max(times[name]) - min(times[name]):9.3f} {peaks[name] / 2**20:9.1f}"
                  f" {med / base:14.1f}x")


if __name__ == "__main__":
    main()
