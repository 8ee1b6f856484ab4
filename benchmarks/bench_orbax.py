"""Orbax steps: ckptinspect beside what users run today, measured in the same run (issue 24).

Two steps of about 1 GB each (16 float32 kernels of 4096x4096 and their biases, Keras' tree under
``pytree``), written once by orbax itself in an environment that has it:

    python -m venv /tmp/venv-orbax && /tmp/venv-orbax/bin/pip install jax orbax-checkpoint
    /tmp/venv-orbax/bin/python benchmarks/bench_orbax.py make /tmp/orbax-bench
    python benchmarks/bench_orbax.py measure /tmp/orbax-bench --orbax-python /tmp/venv-orbax/bin/python

``measure`` runs each command three times (the median; peak RSS from the child's rusage):

* listing: ``ckptinspect ls STEP`` against a script of orbax's metadata API
  (``PyTreeCheckpointer().metadata``, with its JAX import) and against a tensorstore-only listing
  (every ``zarr.json`` read through the OCDBT kvstore);
* comparing: ``ckptinspect diff STEP1 STEP2`` against restoring both with orbax and comparing in
  numpy;
* statistics: ``ckptinspect ls --stats STEP`` against restoring with orbax, and against reading
  every array through tensorstore, then min, max, mean, std, NaN and Inf counts in numpy.

Targets (issue 24): ``ls`` at least 10x the orbax script, ``diff`` at least 3x, peak under 200 MiB;
the statistics are a context row (issue 28).

``benchmarks/run.py`` times the same commands as its pairs ``ls-orbax``, ``diff-orbax`` and
``ls-stats-orbax`` when
``$CKPTINSPECT_ORBAX_PYTHON`` names a Python with jax and orbax-checkpoint (the steps are written
once into its work folder, ``orbax_1gb/``); without it the rows are reported as not installed.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAYERS, SIDE = 16, 4096

ORBAX_LS = """
import os, sys
import jax
import orbax.checkpoint as ocp
md = ocp.PyTreeCheckpointer().metadata(os.path.join(os.path.abspath(sys.argv[1]), "pytree"))
tree = md.item_metadata.tree if hasattr(md, "item_metadata") else md
for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    print(jax.tree_util.keystr(path), getattr(leaf, "shape", None), getattr(leaf, "dtype", None))
"""

ORBAX_DIFF = """
import os, sys
import numpy as np, jax
import orbax.checkpoint as ocp
c = ocp.PyTreeCheckpointer()
a = c.restore(os.path.join(os.path.abspath(sys.argv[1]), "pytree"))
b = c.restore(os.path.join(os.path.abspath(sys.argv[2]), "pytree"))
for (p, x), (_, y) in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves_with_path(b)):
    x, y = np.asarray(x), np.asarray(y)
    print(jax.tree_util.keystr(p), float(np.max(np.abs(x.astype(np.float64) - y))) if x.size else 0.0)
"""

# The figures of `ls --stats` (min, max, mean, std, NaN and Inf counts), the means and stds in float64.
STATS_LINE = """
    print(NAME, x.shape, x.min() if x.size else None, x.max() if x.size else None, x.mean(dtype=np.float64),
          x.std(dtype=np.float64), int(np.isnan(x).sum()), int(np.isinf(x).sum()))
"""

ORBAX_STATS = """
import os, sys
import numpy as np, jax
import orbax.checkpoint as ocp
tree = ocp.PyTreeCheckpointer().restore(os.path.join(os.path.abspath(sys.argv[1]), "pytree"))
for p, x in jax.tree_util.tree_leaves_with_path(tree):
    x = np.asarray(x)
""" + STATS_LINE.replace("NAME", "jax.tree_util.keystr(p)")

TS_STATS = """
import os, sys
import numpy as np
import tensorstore as ts
base = "file://" + os.path.abspath(sys.argv[1]) + "/pytree/"
kv = ts.KvStore.open({"driver": "ocdbt", "base": base}).result()
for name in sorted(k.decode()[:-10] for k in kv.list().result() if k.endswith(b"/zarr.json")):
    spec = {"driver": "zarr3", "kvstore": {"driver": "ocdbt", "base": base, "path": name + "/"}}
    x = ts.open(spec).result().read().result()
""" + STATS_LINE.replace("NAME", "name")

TS_LS = """
import json, os, sys
import tensorstore as ts
kv = ts.KvStore.open({"driver": "ocdbt", "base": "file://" + os.path.abspath(sys.argv[1]) + "/pytree/"}).result()
keys = [k for k in kv.list().result() if k.endswith(b"/zarr.json")]
for k, f in [(k, kv.read(k)) for k in keys]:
    meta = json.loads(f.result().value)
    print(k.decode()[:-10], meta["shape"], meta["data_type"])
"""


def make(out: str) -> None:
    """Two ~1 GB steps, written by orbax (run with the Python that has jax and orbax)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax.numpy as jnp
    import numpy as np
    from orbax.checkpoint import v1 as ocp

    rng = np.random.default_rng(0)
    for step, scale in ((1, 1.0), (2, 1.01)):
        layers = {}
        for i in range(LAYERS):
            kernel = rng.standard_normal((SIDE, SIDE), dtype=np.float32) * np.float32(scale)
            layers[f"dense_{i}"] = {"kernel": jnp.asarray(kernel), "bias": jnp.zeros(SIDE, jnp.float32)}
        tree = {"trainable_variables": {"sequential": layers},
                "optimizer_variables": {"adam": {"iteration": jnp.asarray(step, jnp.int32)}}}
        ocp.save_checkpointables(os.path.join(out, str(step)), {"pytree": tree})


def _run(cmd: list[str], env: dict[str, str]) -> tuple[float, int, int]:
    """Wall seconds, peak RSS bytes and exit code of one run."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    return time.perf_counter() - start, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status)


def commands(directory: str, orbax_python: str) -> dict[str, list[tuple[str, list[str]]]]:
    """Each group's commands, ckptinspect first (what ``measure`` and ``benchmarks/run.py`` time)."""
    s1, s2 = os.path.join(directory, "1"), os.path.join(directory, "2")
    me = [sys.executable, "-m", "ckptinspect"]
    return {
        "ls": [("ckptinspect ls", [*me, "ls", s1]),
               ("orbax metadata API script", [orbax_python, "-c", ORBAX_LS, s1]),
               ("tensorstore-only listing", [sys.executable, "-c", TS_LS, s1])],
        "diff": [("ckptinspect diff", [*me, "diff", s1, s2]),
                 ("orbax restore both + numpy", [orbax_python, "-c", ORBAX_DIFF, s1, s2])],
        "ls-stats": [("ckptinspect ls --stats", [*me, "ls", "--stats", s1]),
                     ("orbax restore + numpy statistics", [orbax_python, "-c", ORBAX_STATS, s1]),
                     ("tensorstore read + numpy statistics", [sys.executable, "-c", TS_STATS, s1])],
    }


# -- benchmarks/run.py's rows (its pairs ls-orbax, diff-orbax and ls-stats-orbax) -----------------
PAIR_IDS = ("ls-orbax", "diff-orbax", "ls-stats-orbax")
TITLES = {
    "ls-orbax": "list a 1 GB Keras-tree Orbax step (16 float32 4096x4096 kernels, one chunk each)",
    "diff-orbax": "compare two 1 GB Orbax steps (every kernel changed)",
    "ls-stats-orbax": "per-tensor min/max/mean/std/NaN/Inf of a 1 GB Orbax step",
}
ORBAX_PYTHON_ENV = "CKPTINSPECT_ORBAX_PYTHON"
ORBAX_MISSING = f"no Python with jax and orbax-checkpoint ({ORBAX_PYTHON_ENV}=/path/to/python)"


def orbax_python() -> str | None:
    """The Python that has jax and orbax-checkpoint (``$CKPTINSPECT_ORBAX_PYTHON``), or None."""
    found = os.environ.get(ORBAX_PYTHON_ENV)
    return found if found and os.path.isfile(found) else None


def ensure_steps(work: pathlib.Path, python: str) -> pathlib.Path:
    """The two steps under ``work/orbax_1gb``, written once by orbax (about a minute), reused after."""
    directory = pathlib.Path(work) / "orbax_1gb"
    if not all((directory / s / "_CHECKPOINT_METADATA").is_file() for s in ("1", "2")):
        shutil.rmtree(directory, ignore_errors=True)
        subprocess.run([python, str(pathlib.Path(__file__).resolve()), "make", str(directory)], check=True,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
    return directory


def tools(work: pathlib.Path, tool: type, python: str | None) -> dict[str, list[Any]]:
    """``{pair id: [Tool, ...]}`` for run.py (``tool`` is its ``_common.Tool``), ckptinspect first;
    every tool missing, saying why, without an orbax Python."""
    missing = None if python else ORBAX_MISSING
    groups = commands(str(pathlib.Path(work) / "orbax_1gb"), python or "python")
    codes = {"diff": (0, 1)}
    return {f"{g}-orbax": [tool(label, cmd, ok_codes=codes.get(g, (0,)) if i == 0 else (0,), ours=i == 0, missing=missing)
                           for i, (label, cmd) in enumerate(cmds)] for g, cmds in groups.items()}


def measure(directory: str, orbax_python: str, repeat: int) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    rows = commands(directory, orbax_python)
    print(f"{'command':<30} {'median s':>9} {'peak MiB':>9} {'ratio':>8}")
    for group, cmds in rows.items():
        ours = None
        for label, cmd in cmds:
            runs = [_run(cmd, env) for _ in range(repeat)]
            codes = {c for _, _, c in runs}
            wall = statistics.median(t for t, _, _ in runs)
            peak = max(p for _, p, _ in runs)
            ours = wall if ours is None else ours
            ratio = "1.00x" if wall == ours else f"{wall / ours:.2f}x"
            print(f"{label:<30} {wall:>9.2f} {peak / 2**20:>9.0f} {ratio:>8}  exit {sorted(codes)}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("make").add_argument("directory")
    m = sub.add_parser("measure")
    m.add_argument("directory")
    m.add_argument("--orbax-python", required=True, help="a Python with jax and orbax-checkpoint")
    m.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.command == "make":
        make(args.directory)
        return 0
    return measure(args.directory, args.orbax_python, args.repeat)


if __name__ == "__main__":
    sys.exit(main())
