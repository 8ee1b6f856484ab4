"""Peak memory of the streaming commands on a checkpoint of a few large tensors.

Issue target: ``ls --stats``, ``verify`` and ``diff`` on a checkpoint of 8 x 128 MiB float32
tensors stay within the baseline (the same command's imports with no tensor read: ``ls``)
plus two tensors. Each command runs as a whole process; its peak RSS comes from ``wait4``.

    python benchmarks/bench_memory.py [--tensors 8] [--tensor-mib 128] [--work DIR]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _common as c  # noqa: E402

MIB = 2**20
PY = sys.executable


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=8)
    parser.add_argument("--tensor-mib", type=int, default=128)
    parser.add_argument("--work", type=pathlib.Path, default=c.DEFAULT_WORK / "memory")
    args = parser.parse_args(argv)

    size_mb = args.tensors * args.tensor_mib
    a = c.generate_flat_bundle(args.work / f"a-{args.tensors}x{args.tensor_mib}" / "ckpt", size_mb, args.tensors)
    b = c.generate_flat_bundle(args.work / f"b-{args.tensors}x{args.tensor_mib}" / "ckpt", size_mb, args.tensors, seed=1)
    tensor = args.tensor_mib * MIB
    env = {**c.os.environ, **c.CHILD_ENV}
    commands = {
        "ls (baseline)": ["ls", a],
        "ls --stats": ["ls", "--stats", a],
        "verify": ["verify", a],
        "diff A A": ["diff", a, a],
        "diff A B": ["diff", a, b],
    }
    peaks = {}
    for label, cmd in commands.items():
        _, peak, code = c.run_timed([PY, "-m", "ckptinspect", *cmd], env=env, ok_codes=(0, 1))
        peaks[label] = peak
    base = peaks["ls (baseline)"]
    print(f"{args.tensors} x {args.tensor_mib} MiB float32 tensors; target: baseline + 2 tensors = "
          f"{(base + 2 * tensor) / MIB:.0f} MiB")
    print(f"{'command':<16} {'peak RSS':>10} {'over baseline':>14} {'in tensors':>11}")
    for label, peak in peaks.items():
        over = peak - base
        print(f"{label:<16} {peak / MIB:>8.0f} MiB {over / MIB:>10.0f} MiB {over / tensor:>11.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
