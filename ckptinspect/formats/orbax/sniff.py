"""How Orbax step directories and runs of them are recognised (standard library only: no
tensorstore, JAX or orbax; detection runs for every path). Remote folders (``s3://``, ``gs://``)
through :mod:`.._fs`: a run's folder listed once, each numbered step's folder once, 8 at a time
(that listing answers for its metadata file and commit marker too)."""

from __future__ import annotations

import os
import re

from ...errors import CkptError
from .. import _fs
from .._registry import Probe

__all__ = ["CHECKPOINT_METADATA", "TMP_SUFFIX", "is_step", "step_directory", "run_directory", "run_entries"]

CHECKPOINT_METADATA = "_CHECKPOINT_METADATA"
TREE_METADATA = os.path.join("pytree", "_METADATA")
TMP_SUFFIX = ".orbax-checkpoint-tmp"
MAX_RUN_ENTRIES = 100_000  # names looked at in one run directory
_STEP_RE = re.compile(r"^(\d{1,19})$")
_TMP_RE = re.compile(r"^(\d{1,19})\.orbax-checkpoint-tmp(?:-\d+)?$")


def is_step(path: str) -> bool:
    """A directory holding an Orbax checkpoint: ``_CHECKPOINT_METADATA`` or ``pytree/_METADATA``."""
    if _fs.is_remote(path):
        try:
            if not _fs.isdir(path):
                return False
            names = _fs.listdir(path)  # one listing: the metadata file, the commit marker, pytree/
            return (CHECKPOINT_METADATA in names and _fs.isfile(_fs.join(path, CHECKPOINT_METADATA))) or (
                "pytree" in names and _fs.isfile(_fs.join(path, "pytree", "_METADATA")))
        except (CkptError, OSError, ValueError):
            return False
    try:
        return os.path.isdir(path) and (
            os.path.isfile(os.path.join(path, CHECKPOINT_METADATA)) or os.path.isfile(os.path.join(path, TREE_METADATA))
        )
    except (OSError, ValueError):
        return False


def run_entries(path: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]] | None:
    """The numbered step folders and the interrupted saves (``<step>.orbax-checkpoint-tmp``) of a
    run directory, each as (step, name) sorted by step; None when there are too many names to look at."""
    steps: list[tuple[int, str]] = []
    tmps: list[tuple[int, str]] = []
    if _fs.is_remote(path):
        try:
            names = _fs.listdir(path)
            if len(names) > MAX_RUN_ENTRIES:
                return None
            numbered = [(int(mt.group(1)), name) for name in names if (mt := _STEP_RE.match(name))]
            if numbered:  # one listing per step folder, 8 in flight
                from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415 - remote runs only

                with ThreadPoolExecutor(min(8, len(numbered))) as pool:
                    found = list(pool.map(lambda item: is_step(_fs.join(path, item[1])), numbered))
                steps = [item for item, ok in zip(numbered, found) if ok]
            for name in names:
                if (mt := _TMP_RE.match(name)) and _fs.isdir(_fs.join(path, name)):
                    tmps.append((int(mt.group(1)), name))
        except (CkptError, OSError, ValueError):
            return None
        return sorted(steps), sorted(tmps)
    try:
        with os.scandir(path) as it:
            for n, entry in enumerate(it):
                if n >= MAX_RUN_ENTRIES:
                    return None
                name = entry.name
                if (mt := _STEP_RE.match(name)) and is_step(entry.path):
                    steps.append((int(mt.group(1)), name))
                elif (mt := _TMP_RE.match(name)) and entry.is_dir():
                    tmps.append((int(mt.group(1)), name))
    except (OSError, ValueError):
        return None
    return sorted(steps), sorted(tmps)


def step_directory(probe: Probe) -> str | None:
    """An Orbax step directory (``DIR/<step>/``): the directory to open."""
    return probe.path if is_step(probe.path) else None


def run_directory(probe: Probe) -> str | None:
    """A directory of numbered Orbax steps (what ``OrbaxCheckpoint(directory=DIR)`` writes)."""
    found = run_entries(probe.path)
    return probe.path if found is not None and found[0] else None
