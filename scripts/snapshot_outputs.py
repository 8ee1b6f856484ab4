"""Snapshot what the commands print over every fixture and every real-world file, to prove a
refactoring is a pure move.

    python scripts/snapshot_outputs.py snapshot OUT_DIR     # before the change
    python scripts/snapshot_outputs.py snapshot OUT_DIR2    # after it
    python scripts/snapshot_outputs.py compare OUT_DIR OUT_DIR2

``snapshot`` runs ``ls``, ``verify`` and ``scan`` with ``--format json`` on every file and folder
under ``fixtures/`` and ``../shared/realworld/`` (where it exists), ``diff --format json`` of each
path against itself and against the next path of its folder, in real processes (``python -m
ckptinspect``), and stores each run's exit code, stdout and stderr in one JSON file per run.
``compare`` names every run whose exit code, stdout or stderr differs (exit 1), or says they are
all the same (exit 0). Paths are given relative to the repository, so snapshots taken in two
checkouts of it compare.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORPORA = ("fixtures", "../shared/realworld")
SKIP_SUFFIXES = (".py", ".md", ".pyc")
TIMEOUT = 120


def _paths() -> list[str]:
    """Every file and folder of the corpora, relative to the repository, sorted."""
    found: list[str] = []
    for corpus in CORPORA:
        base = ROOT / corpus
        if not base.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            rel = os.path.relpath(dirpath, ROOT)
            found.append(rel)
            found.extend(os.path.join(rel, f) for f in sorted(filenames) if not f.endswith(SKIP_SUFFIXES))
    return found


def _runs(paths: list[str]) -> list[list[str]]:
    runs: list[list[str]] = []
    by_folder: dict[str, list[str]] = {}
    for path in paths:
        runs.append(["ls", "--format", "json", path])
        runs.append(["verify", "--format", "json", path])
        runs.append(["diff", "--format", "json", path, path])
        by_folder.setdefault(os.path.dirname(path), []).append(path)
        if os.path.isdir(ROOT / path):
            runs.append(["scan", "--format", "json", path])
    for siblings in by_folder.values():
        for a, b in zip(siblings, siblings[1:]):
            runs.append(["diff", "--format", "json", a, b])
    return runs


def _run(args: list[str]) -> dict:
    env = {**os.environ, "COLUMNS": "200", "CKPTINSPECT_WORKERS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    try:
        done = subprocess.run([sys.executable, "-m", "ckptinspect", *args], cwd=ROOT, env=env,
                              capture_output=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
        return {"args": args, "code": done.returncode, "stdout": done.stdout.decode("utf-8", "replace"),
                "stderr": done.stderr.decode("utf-8", "replace")}
    except subprocess.TimeoutExpired:
        return {"args": args, "code": "timeout", "stdout": "", "stderr": ""}


def _name(args: list[str]) -> str:
    return hashlib.sha256("\0".join(args).encode()).hexdigest()[:20] + ".json"


def snapshot(out: pathlib.Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    runs = _runs(_paths())
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for result in pool.map(_run, runs):
            (out / _name(result["args"])).write_text(json.dumps(result, indent=1, sort_keys=True))
    print(f"{len(runs)} runs written to {out}")
    return 0


def compare(a: pathlib.Path, b: pathlib.Path) -> int:
    names = sorted({p.name for p in a.glob("*.json")} | {p.name for p in b.glob("*.json")})
    differ = 0
    for name in names:
        left = json.loads((a / name).read_text()) if (a / name).exists() else None
        right = json.loads((b / name).read_text()) if (b / name).exists() else None
        if left != right:
            differ += 1
            args = (left or right)["args"]
            fields = [k for k in ("code", "stdout", "stderr") if (left or {}).get(k) != (right or {}).get(k)]
            print(f"differs ({', '.join(fields) or 'missing'}): ckptinspect {' '.join(args)}")
    print(f"{len(names)} runs compared, {differ} differ")
    return 1 if differ else 0


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "snapshot":
        return snapshot(pathlib.Path(argv[1]))
    if len(argv) == 3 and argv[0] == "compare":
        return compare(pathlib.Path(argv[1]), pathlib.Path(argv[2]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
