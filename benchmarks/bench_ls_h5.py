"""Benchmark: listing Keras HDF5 files with ckptinspect vs ``h5ls -r`` vs ``KerasFileEditor``.

Generates, once into a work folder, a Keras 3 model of about N variables (a chain of Dense
layers, two variables each) saved as ``.weights.h5`` and as a legacy full-model ``.h5``; then
times each tool as a whole process, alternating the tools within each round, for several
rounds; prints the median wall time, the spread, the child's peak RSS, and the ratio to
ckptinspect's listing.

Tools:
  * ckptinspect open+iterate: ``python -c`` that calls ``ckptinspect.open(path)`` and walks
    every variable's metadata (no values).
  * ckptinspect ls: the CLI (``python -m ckptinspect ls PATH``), table output.
  * h5ls -r: HDF5's own lister (Debian package hdf5-tools).
  * h5py visititems: ``python -c`` that opens the file with h5py and visits every object -
    the floor for any h5py-based lister.
  * KerasFileEditor.summary(): imports Keras (and TensorFlow) and reads every tensor; it
    accepts only ``.keras`` and ``.weights.h5`` files, so it is skipped for legacy ``.h5``.

    python benchmarks/bench_ls_h5.py [--variables 2000] [--units 32] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _common  # noqa: E402 - the shared timing helpers beside this script
ROOT = HERE.parent


def run_timed(cmd: list[str]) -> tuple[float, int]:
    """Run a command; return (wall seconds, peak RSS of the child in bytes)."""
    elapsed, peak, _ = _common.run_timed(cmd)
    return elapsed, peak


def generate(folder: pathlib.Path, variables: int, units: int) -> dict[str, str]:
    """A Keras 3 Dense chain with ``variables`` variables, saved as .weights.h5 and legacy .h5."""
    paths = {"weights.h5": folder / "model.weights.h5", "legacy .h5": folder / "model.h5"}
    done = folder / "done"
    if done.exists():
        return {k: str(v) for k, v in paths.items()}
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    code = f"""
import keras
layers = [keras.layers.Dense({units}, name=f"dense_{{i:04d}}") for i in range({variables} // 2)]
model = keras.Sequential([keras.Input(({units},)), *layers], name="chain")
model.save_weights({str(paths["weights.h5"])!r})
model.save({str(paths["legacy .h5"])!r})
print(len(model.weights))
"""
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    done.touch()
    return {k: str(v) for k, v in paths.items()}


def tools_for(path: str, kind: str) -> dict[str, list[str] | None]:
    py = [sys.executable, "-c"]
    return {
        "ckptinspect open+iterate": py + [
            "import sys, ckptinspect\n"
            f"c = ckptinspect.open({path!r})\n"
            "n = sum(1 for v in c if v.shape is not None)\n"
            "print(n)"
        ],
        "ckptinspect ls (CLI)": [sys.executable, "-m", "ckptinspect", "ls", path],
        "h5ls -r": ["h5ls", "-r", path] if shutil.which("h5ls") else None,
        "h5py visititems": py + [
            "import h5py\n"
            f"f = h5py.File({path!r}, 'r')\n"
            "out = []\n"
            "f.visititems(lambda n, o: out.append((n, getattr(o, 'shape', None), getattr(o, 'dtype', None))))\n"
            "print(len(out))"
        ],
        "KerasFileEditor.summary()": (
            py + [f"import keras; keras.saving.KerasFileEditor({path!r}).summary()"]
            if kind == "weights.h5"
            else None
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variables", type=int, default=2000)
    parser.add_argument("--units", type=int, default=32, help="Dense width (size of each kernel)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", default=str(HERE / "_work"))
    args = parser.parse_args()

    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    folder = pathlib.Path(args.work) / f"keras_h5_{args.variables}v_{args.units}u"
    paths = generate(folder, args.variables, args.units)
    base_name = "ckptinspect open+iterate"
    print(f"{os.cpu_count()} cores, {args.rounds} rounds, median of alternating whole-process runs")
    for kind, path in paths.items():
        tools = {k: v for k, v in tools_for(path, kind).items() if v is not None}
        skipped = [k for k, v in tools_for(path, kind).items() if v is None]
        times: dict[str, list[float]] = {k: [] for k in tools}
        peaks: dict[str, int] = {k: 0 for k in tools}
        for _ in range(args.rounds):
            for name, cmd in tools.items():
                t, rss = run_timed(cmd)
                times[name].append(t)
                peaks[name] = max(peaks[name], rss)
        base = statistics.median(times[base_name])
        size = os.path.getsize(path)
        print()
        print(f"{kind}: {path} ({args.variables} variables, {size / 2**20:.1f} MiB)")
        print(f"{'tool':<28} {'median s':>9} {'spread s':>9} {'peak MiB':>9} {'/ ckptinspect':>14}")
        for name in tools:
            med = statistics.median(times[name])
            spread = max(times[name]) - min(times[name])
            print(f"{name:<28} {med:9.3f} {spread:9.3f} {peaks[name] / 2**20:9.1f} {med / base:13.2f}x")
        for name in skipped:
            print(f"{name:<28} {'n/a':>9}  (tool unavailable or does not accept this file)")


if __name__ == "__main__":
    main()
