"""A run directory of Orbax steps (``OrbaxCheckpoint(directory=DIR)``): ``DIR/<step>/`` each a
checkpoint, the series in step order; ``<step>.orbax-checkpoint-tmp`` folders are interrupted saves,
named and left out of the series. Read from names and small files only (no tensorstore)."""

from __future__ import annotations

import dataclasses

from ... import model as m
from ...errors import CkptError, NotACheckpointError
from .. import _fs
from .._listing import DirectoryListing
from .._step import MAX_STEP_LOOKUPS, apply_step_rule
from .layout import CHECKPOINT_METADATA, COMMIT_MARKER, read_json
from .sniff import run_entries

__all__ = ["SERIES_ORBAX", "list_run", "open_run", "run_fingerprint", "is_run"]

SERIES_ORBAX = "orbax-run"
CHECKSUM_NOTE = ("Orbax chunk data carries no checksum (OCDBT checks its manifests and tree nodes, zarr its"
                 " shard indexes): a flipped bit inside a compressed chunk may still decode")


def is_run(directory: str) -> bool:
    """A directory holding at least one numbered Orbax step."""
    found = run_entries(directory)
    return found is not None and bool(found[0])


def _commit_time(step: str) -> float | None:
    try:
        meta = read_json(_fs.join(step, CHECKPOINT_METADATA), "Orbax checkpoint metadata", limit=1 << 20)
    except Exception:  # noqa: BLE001 - a damaged step is verify's to report, not the listing's
        return None
    ns = meta.get("commit_timestamp_nsecs") if isinstance(meta, dict) else None
    return ns / 1e9 if isinstance(ns, int) and not isinstance(ns, bool) and ns > 0 else None


def _training_step(step: str) -> int | None:
    """A step directory's training step by the step rule (its optimizer's iterations), or None
    when it has none or does not open (a damaged step is verify's to report)."""
    from .step import open_orbax  # noqa: PLC0415 - metadata and one scalar; tensorstore is not imported

    try:
        with apply_step_rule(open_orbax(step)) as ckpt:
            return ckpt.step
    except (CkptError, OSError):
        return None


def list_run(directory: str, *, steps: bool = True) -> DirectoryListing:
    """The steps of an Orbax run directory in step order, the newest committed one its latest,
    interrupted saves (``.orbax-checkpoint-tmp``) and uncommitted steps named in its notes.

    Args:
        directory: The run directory (``OrbaxCheckpoint(directory=DIR)``).
        steps: Read the training steps of the newest committed steps (``MAX_STEP_LOOKUPS``, as a
            file series does: metadata and one scalar each); False: none (their directory
            names are their numbers either way).
    """
    found = run_entries(directory)
    if found is None or not found[0]:
        raise NotACheckpointError(f"{directory}: no numbered Orbax step directory")
    numbered, tmps = found
    paths = [(n, _fs.join(directory, name)) for n, name in numbered]
    times = {p: _commit_time(p) for _, p in paths}  # each step's metadata read once
    committed = [p for _, p in paths if times[p] is not None or _fs.exists(_fs.join(p, COMMIT_MARKER))]
    latest = committed[-1] if committed else paths[-1][1]
    looked_up = set(committed[-MAX_STEP_LOOKUPS:]) if steps else set()
    checkpoints = tuple(
        m.RetainedCheckpoint(path=p, step=_training_step(p) if p in looked_up else None, timestamp=times[p],
                             exists=True, in_state_file=False, latest=p == latest, number=n)
        for n, p in paths
    )
    notes = [CHECKSUM_NOTE]
    notes += [f"{_fs.join(directory, name)}: an interrupted Orbax save (step {n}, never committed); not part of the series"
              for n, name in tmps]
    done = set(committed)
    notes += [f"{p}: not committed (no {COMMIT_MARKER})" for _, p in paths if p not in done]
    return _RunListing(directory, checkpoints, latest, kind=SERIES_ORBAX, run_notes=tuple(notes),
                       interrupted=tuple(_fs.join(directory, name) for _, name in tmps))


@dataclasses.dataclass(frozen=True)
class _RunListing(DirectoryListing):
    """A run's listing: its notes are the run's (interrupted saves, the checksum caveat)."""

    run_notes: tuple[str, ...] = ()
    interrupted: tuple[str, ...] = ()

    @property
    def notes(self) -> tuple[str, ...]:
        return self.run_notes


def open_run(directory: str) -> m.Checkpoint:
    """The newest committed step of a run, opened, with the run as its ``checkpoints``."""
    from .step import open_orbax  # noqa: PLC0415

    listing = list_run(directory)
    ckpt = open_orbax(listing.latest)
    info = dict(ckpt.info)
    warnings = [n for n in listing.notes if not n.startswith("Orbax chunk data")]
    if warnings:
        info["warnings"] = [*warnings, *info.get("warnings", ())]
    return dataclasses.replace(ckpt, checkpoints=listing.checkpoints, info=info)


def run_fingerprint(directory: str) -> tuple:
    """What changes when a process saves into the run: its step names and their commit markers."""
    found = run_entries(directory) or ([], [])
    out = []
    for _, name in [*found[0], *found[1]]:
        marker = _fs.join(directory, name, COMMIT_MARKER)
        out.append((name, _fs.exists(marker)))
    return ("orbax", *out)
