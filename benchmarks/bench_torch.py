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

``benchmarks/run.py`` times the same pairs (``ls-safetensors``, ``ls-pt``) through
:func:`tools` and :func:`ensure_files`; without torch their rows are skipped, saying so.

Before timing, the package's bytecode is compiled (``_common.compile_package``), as ``pip install``
does.
"""

from __future__ import annotations

import argparse
import importlib.util
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


PAIR_IDS = ("ls-safetensors", "ls-pt")
TORCH_MISSING = "torch/safetensors not installed (pip install torch safetensors)"


def torch_available() -> bool:
    """Whether torch and safetensors are installed (found, not imported: torch takes seconds)."""
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "safetensors"))


def paths(work: pathlib.Path, size_mb: int, variables: int) -> tuple[pathlib.Path, pathlib.Path]:
    """Where the .safetensors and .pt files of this size live in the work folder."""
    folder = pathlib.Path(work) / f"torch_{size_mb}mb_{variables}v"
    return folder / "model.safetensors", folder / "model.pt"


def ensure_files(work: pathlib.Path, size_mb: int, variables: int) -> tuple[pathlib.Path, pathlib.Path]:
    """Write the two files once (torch needed), reuse them after."""
    st_path, pt_path = paths(work, size_mb, variables)
    if not (st_path.is_file() and pt_path.is_file()):
        st_path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-c", GENERATE, str(size_mb), str(variables), str(st_path), str(pt_path)],
                       check=True)
    return st_path, pt_path


def tools(st_path: pathlib.Path, pt_path: pathlib.Path, missing: str | None = None) -> dict[str, list[_common.Tool]]:
    """The two pairs, ckptinspect first: ``{pair id: tools}``."""
    ck = [sys.executable, "-m", "ckptinspect"]
    st, pt = str(st_path), str(pt_path)
    return {
        "ls-safetensors": [
            _common.Tool("ckptinspect ls", [*ck, "ls", st], ours=True, missing=missing),
            _common.Tool("ckptinspect ls --format json", [*ck, "ls", st, "--format", "json"], missing=missing),
            _common.Tool("safe_open keys (script)", [sys.executable, "-c", SAFE_OPEN, st], missing=missing),
        ],
        "ls-pt": [
            _common.Tool("ckptinspect ls", [*ck, "ls", pt], ours=True, missing=missing),
            _common.Tool("ckptinspect ls --format json", [*ck, "ls", pt, "--format", "json"], missing=missing),
            _common.Tool("torch.load(weights_only=True)", [sys.executable, "-c", TORCH_LOAD, pt], missing=missing),
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--variables", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", default=str(HERE / "_work"))
    args = parser.parse_args()

    if not torch_available():
        raise SystemExit(TORCH_MISSING)
    st_path, pt_path = ensure_files(pathlib.Path(args.work), args.size_mb, args.variables)
    _common.compile_package()
    groups = {"safetensors": tools(st_path, pt_path)["ls-safetensors"], "torch .pt": tools(st_path, pt_path)["ls-pt"]}
    print(f"{args.variables} float32 tensors, {os.cpu_count()} cores, {args.rounds} rounds, load {os.getloadavg()[0]:.1f}")
    for group, group_tools in groups.items():
        times: dict[str, list[float]] = {t.label: [] for t in group_tools}
        peaks: dict[str, int] = {t.label: 0 for t in group_tools}
        for _ in range(args.rounds):
            for t in group_tools:  # alternate the tools within each round
                wall, rss, _ = _common.run_timed(t.cmd)
                times[t.label].append(wall)
                peaks[t.label] = max(peaks[t.label], rss)
        size = (st_path if group == "safetensors" else pt_path).stat().st_size
        print(f"\n{group}: {size / 2**20:.0f} MiB")
        print(f"{'tool':<32} {'median s':>9} {'spread s':>9} {'peak MiB':>9} {'vs ckptinspect':>15}")
        base = statistics.median(times["ckptinspect ls"])
        for name in times:
            med = statistics.median(times[name])
            print(f"{name:<32} {med:9.3f} {max(times[name]) - min(times[name]):9.3f} {peaks[name] / 2**20:9.1f}"
                  f" {med / base:14.1f}x")


if __name__ == "__main__":
    main()
