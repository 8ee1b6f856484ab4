"""The lean install against the ``[tf]`` one (issue 26): install time and size of each.

    python benchmarks/bench_envs.py [--work DIR] [--extras tf]

Builds a fresh virtual environment per install (``pip install REPO`` and ``pip install
REPO[tf]``, pip's cache as it is: warm when the packages were downloaded before), timing the
install, then measures ``du`` of its site-packages and times ``ckptinspect ls`` and ``read()`` of
one tensor of the committed fixture ``fixtures/run/ckpt-8`` in it (median of 5 runs, each a
whole process). Target: the lean environment under 300 MB.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURE = REPO / "fixtures" / "run" / "ckpt-8"
LEAN_TARGET_MB = 300
READ = "import ckptinspect\nwith ckptinspect.open({p!r}) as c:\n    c.read(c.variables[0])\n"


def du_mb(path: pathlib.Path) -> float:
    out = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0]) / 1024


def timed(cmd: list[str], rounds: int = 5) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def build(work: pathlib.Path, extras: str) -> dict[str, float | str]:
    name = f"venv-{extras or 'lean'}"
    venv = work / name
    shutil.rmtree(venv, ignore_errors=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    target = f"{REPO}[{extras}]" if extras else str(REPO)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", target], check=True)
    seconds = time.perf_counter() - start
    site = next((venv / "lib").glob("python*/site-packages"))
    py = str(venv / "bin" / "python")
    tf = subprocess.run([py, "-c", "import tensorflow"], capture_output=True).returncode == 0
    return {
        "install": f"pip install .{f'[{extras}]' if extras else ''}",
        "seconds": seconds,
        "site_mb": du_mb(site),
        "tensorflow": "yes" if tf else "no",
        "ls": timed([str(venv / "bin" / "ckptinspect"), "ls", str(FIXTURE)]),
        "read": timed([py, "-c", READ.format(p=str(FIXTURE))]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/tmp/ckptinspect-bench-envs", help="where the environments are built")
    ap.add_argument("--extras", default="tf", help="the other install's extras (default tf)")
    args = ap.parse_args(argv)
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = [build(work, ""), build(work, args.extras)]
    print("| install | install time | site-packages | tensorflow | `ls` | `read()` of one tensor |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| `{r['install']}` | {r['seconds']:.0f} s | {r['site_mb']:.0f} MB | {r['tensorflow']} "
              f"| {r['ls']:.2f} s | {r['read']:.2f} s |")
    lean = rows[0]["site_mb"]
    print(f"\nlean environment under {LEAN_TARGET_MB} MB: {'met' if lean < LEAN_TARGET_MB else 'MISSED'} ({lean:.0f} MB)")
    return 0 if lean < LEAN_TARGET_MB else 1


if __name__ == "__main__":
    sys.exit(main())
