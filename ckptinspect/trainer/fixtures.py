"""The committed fixtures, and ``python -m ckptinspect.trainer``.

:func:`regenerate_fixtures` rewrites ``fixtures/run``, ``sharded`` and ``keras`` with fresh
outputs of the same deterministic training (see ``fixtures/README.md``); :func:`main` is the
minimal command line behind ``python -m ckptinspect.trainer`` (``ckptinspect train`` is the
user-facing one).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shutil
import sys
from typing import Any, Sequence

from ..errors import OutputExistsError, UsageError
from ..ops.model.devices import configure_devices
from .training import TrainResult, fresh_dir, keras2_available, replace_dir, train, write_keras2_files

__all__ = ["regenerate_fixtures", "main"]

DESCRIPTION = "The fixture trainer: small, real, deterministic TF2 checkpoints to inspect."
# The committed fixtures (see fixtures/README.md).
FIXTURES_DIR = pathlib.Path(__file__).resolve().parents[2] / "fixtures"
FIXTURE_RUN = "run"
FIXTURE_SHARDED = "sharded"
FIXTURE_KERAS = "keras"
FIXTURE_SUBDIRS = (FIXTURE_RUN, FIXTURE_SHARDED, FIXTURE_KERAS)
FIXTURE_SHARD_BYTES = 1024


# -- the committed fixtures --------------------------------------------------------------------


def regenerate_fixtures(root: str | os.PathLike[str] = FIXTURES_DIR, *, keras2: bool | None = None) -> dict[str, Any]:
    """Rewrite the fixture directories ``run/``, ``sharded/`` and ``keras/`` under ``root``.

    Idempotent: every run replaces the three directories (and nothing else under ``root``)
    with fresh outputs of the same deterministic training.

    * ``run/``: 8 steps, saved every 2, 2 replicas, ``max_to_keep=3`` -> ``ckpt-4``, ``ckpt-6``,
      ``ckpt-8`` retained (``ckpt-2`` was deleted by the manager; ``metadata.json`` lists it).
    * ``sharded/``: 4 steps, saved every 2, 2 replicas, ``MaxShardSizePolicy(1024 bytes)``.
    * ``keras/``: the final model of ``run/`` as ``model.weights.h5``, ``model.keras``,
      ``model.h5``, plus the Keras 2 files of :func:`write_keras2_files` when ``tf_keras`` is
      importable.

    Args:
        root: The fixtures directory.
        keras2: Write the Keras 2 files (default: when ``tf_keras`` is importable).

    Returns:
        ``{"run": TrainResult, "sharded": TrainResult, "keras": [paths]}``.
    """
    configure_devices(2)
    base = pathlib.Path(root).absolute()
    base.mkdir(parents=True, exist_ok=True)
    work = fresh_dir(base, ".regenerate")
    try:
        run = train(
            work / FIXTURE_RUN,
            steps=8,
            save_every=2,
            replicas=2,
            max_to_keep=3,
            keras_formats=True,
            keras_dir=work / FIXTURE_KERAS,
        )
        sharded = train(
            work / FIXTURE_SHARDED,
            steps=4,
            save_every=2,
            replicas=2,
            max_to_keep=2,
            max_shard_bytes=FIXTURE_SHARD_BYTES,
        )
        keras_files = list(run.keras_files)
        if keras2 if keras2 is not None else keras2_available():
            keras_files += write_keras2_files(work / FIXTURE_KERAS)
        for name in FIXTURE_SUBDIRS:
            replace_dir(work / name, base / name)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def moved(result: TrainResult) -> TrainResult:
        def fix(p: str) -> str:
            return str(base / os.path.relpath(p, work)) if p else p

        return dataclasses.replace(
            result,
            out_dir=fix(result.out_dir),
            retained=tuple(fix(p) for p in result.retained),
            latest=fix(result.latest),
            keras_files=tuple(fix(p) for p in result.keras_files),
            metadata_path=fix(result.metadata_path),
        )

    return {
        FIXTURE_RUN: moved(run),
        FIXTURE_SHARDED: moved(sharded),
        FIXTURE_KERAS: [str(base / os.path.relpath(p, work)) for p in keras_files],
    }


# -- python -m ckptinspect.trainer -------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ckptinspect.trainer``: regenerate the fixtures, or train into OUT.

    Kept minimal; ``ckptinspect train`` is the user-facing command.
    """
    parser = argparse.ArgumentParser(prog="python -m ckptinspect.trainer", description=DESCRIPTION)
    parser.add_argument("out", nargs="?", help="output directory (omit with --regenerate-fixtures)")
    parser.add_argument("--regenerate-fixtures", action="store_true", help="rewrite fixtures/run, sharded, keras")
    parser.add_argument("--fixtures-dir", default=str(FIXTURES_DIR), help="fixtures root (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--save-every", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--max-to-keep", type=int, default=3)
    parser.add_argument("--max-shard-bytes", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keras", action="store_true", help="also write the Keras 3 files")
    parser.add_argument("--keras2", action="store_true", help="also write the Keras 2 files (tf_keras)")
    parser.add_argument("--force", action="store_true", help="replace a non-empty OUT")
    args = parser.parse_args(argv)
    if args.regenerate_fixtures == (args.out is not None):
        parser.error("give either OUT or --regenerate-fixtures")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        if args.regenerate_fixtures:
            results = regenerate_fixtures(args.fixtures_dir)
            for name in (FIXTURE_RUN, FIXTURE_SHARDED):
                print(results[name].summary(), file=sys.stderr)
            print(f"{len(results[FIXTURE_KERAS])} Keras file(s) in {pathlib.Path(args.fixtures_dir) / FIXTURE_KERAS}", file=sys.stderr)
            return 0
        configure_devices(args.replicas)
        result = train(
            args.out,
            steps=args.steps,
            save_every=args.save_every,
            replicas=args.replicas,
            max_to_keep=args.max_to_keep,
            max_shard_bytes=args.max_shard_bytes,
            seed=args.seed,
            keras_formats=args.keras,
            force=args.force,
        )
        if args.keras2:
            write_keras2_files(args.out, seed=args.seed, force=args.force)
        print(result.summary(), file=sys.stderr)
        return 0
    except (UsageError, OutputExistsError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2

