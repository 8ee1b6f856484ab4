"""The series seam: which checkpoints a directory holds, in which order, with which step, and
what is wrong with the directory, without opening a checkpoint.

Three kinds of directory form a series:

* a TF checkpoint directory (``CheckpointManager`` / ``Saver``): its state file and files, read by
  the TF family (:func:`ckptinspect.formats.tf.resolve.list_directory`);
* a Keras 3 ``OrbaxCheckpoint`` run, ``DIR/<step>/`` each an Orbax checkpoint
  (:func:`ckptinspect.formats.orbax.run.list_run`);
* a directory of checkpoint files a training callback wrote, one file per save, each with its
  epoch or step in its name: Keras ``ModelCheckpoint`` (``weights.03.weights.h5``,
  ``model.05-0.42.h5``, ``ckpt_7.keras``) and PyTorch / Lightning (``epoch=2-step=60.ckpt``,
  ``model_0004.pt``). Files without such a number (``last.ckpt``, ``final.keras``) are named in
  the listing's notes, not ordered into the series.

``ls DIR`` opens the newest, ``verify DIR`` checks each, ``scan DIR`` goes through them in order,
``average --last N DIR`` takes the newest N, and ``plan DIR`` reads the cadence from them: all
through :func:`list_series`.
"""

from __future__ import annotations

import dataclasses
import os

from .. import model as m
from .._atomic import leftover_temporaries
from ..errors import CkptError, NotACheckpointError
from . import _fs
from ._layout import INDEX_SUFFIX, STATE_FILE
from ._listing import SERIES_KERAS, SERIES_TF, SERIES_TORCH, DirectoryListing
from ._names import FILE_SERIES_SUFFIXES, NameNumbers, name_numbers
from ._step import MAX_STEP_LOOKUPS

__all__ = [
    "SERIES_TF",
    "SERIES_KERAS",
    "SERIES_TORCH",
    "FILE_SERIES_SUFFIXES",
    "DirectoryListing",
    "NameNumbers",
    "name_numbers",
    "file_series_kind",
    "list_series",
    "open_series",
    "series_fingerprint",
    "series_changed",
]

TF_MARKERS = (STATE_FILE, "saved_model.pb", "saved_model.pbtxt")
MAX_SERIES_FILES = 100_000  # names looked at in one directory

def _checkpoint_files(directory: str) -> tuple[str | None, list[str]]:
    """The file-series kind of a directory and its checkpoint files (sorted names), or (None, [])
    for a directory holding TF checkpoint files or no checkpoint files."""
    try:
        names = _fs.listdir(directory)
    except (OSError, CkptError):
        return None, []
    if len(names) > MAX_SERIES_FILES:
        return None, []
    present = set(names)
    if any(n in present for n in TF_MARKERS) or any(n.endswith(INDEX_SUFFIX) for n in names):
        return None, []
    for kind, suffixes in FILE_SERIES_SUFFIXES.items():
        files = sorted(n for n in names if n.endswith(suffixes) and not n.startswith("."))
        files = [n for n in files if _fs.is_regular(_fs.join(directory, n))]
        if files:
            return kind, files
    return None, []


def _series_files(directory: str) -> tuple[str | None, list[str]]:
    """The file-series kind and checkpoint files of a directory that is a file series (at least
    one file carries an epoch or step in its name), or (None, []): the one test of what a file
    series is, for detection, listing and fingerprints alike."""
    kind, files = _checkpoint_files(directory)
    if kind is None or not any(name_numbers(n).order is not None for n in files):
        return None, []
    return kind, files


def file_series_kind(directory: str) -> str | None:
    """:data:`SERIES_KERAS` or :data:`SERIES_TORCH` for a directory of checkpoint files at least one
    of which carries an epoch or step in its name; None otherwise (TF directories included)."""
    return _series_files(directory)[0]


def _file_step(path: str) -> int | None:
    """A series file's training step (the step rule: its step variable, else its optimizer's
    iterations), or None when it has none or does not open."""
    from . import open_checkpoint  # noqa: PLC0415 - the door opens the member by its own kind

    try:
        with open_checkpoint(path) as ckpt:
            return ckpt.step
    except (CkptError, OSError):
        return None


def _list_files(directory: str, kind: str, files: list[str], steps: bool) -> DirectoryListing:
    numbered = [(name_numbers(n).order, n) for n in files]
    ordered = sorted((order, n) for order, n in numbered if order is not None)
    unordered = tuple(_fs.join(directory, n) for order, n in numbered if order is None)
    paths = [_fs.join(directory, n) for _, n in ordered]
    latest = paths[-1] if paths else None
    looked_up = set(paths[-MAX_STEP_LOOKUPS:]) if steps else set()
    checkpoints = tuple(
        # No recorded save time (a state file's): plan takes the files' modification times as such.
        m.RetainedCheckpoint(path=p, step=_file_step(p) if p in looked_up else None, timestamp=None, exists=True,
                             in_state_file=False, latest=p == latest, number=order)
        for (order, _), p in zip(ordered, paths)
    )
    leftovers = () if _fs.is_remote(directory) else tuple(leftover_temporaries(directory))
    return DirectoryListing(directory, checkpoints, latest, leftovers=leftovers, kind=kind, unordered=unordered)


def list_series(directory: str, *, steps: bool = True) -> DirectoryListing:
    """The checkpoints of a directory, in order, and its problems, without opening any.

    Args:
        directory: A TF checkpoint directory or a directory of checkpoint files.
        steps: Read the newest checkpoints' training steps (:data:`MAX_STEP_LOOKUPS`; a TF
            directory's from small indexes), as ``ls`` shows them; False: none (the numbers in
            their names are read either way).

    Raises:
        NotACheckpointError: No checkpoint at all in the directory (saying what it holds
            instead: SavedModel exports, Keras files without an epoch in their names).
    """
    kind, files = _series_files(directory)
    if kind is not None:
        return _list_files(directory, kind, files, steps)
    from .orbax.run import is_run, list_run  # noqa: PLC0415 - names and small files only

    if is_run(directory):
        return list_run(directory, steps=steps)
    from .tf.resolve import list_directory  # noqa: PLC0415 - the TF readers load for TF directories only

    return list_directory(directory, steps=steps)


def open_series(directory: str) -> m.Checkpoint:
    """The newest checkpoint of a file series, opened, with the series as its ``checkpoints``."""
    from . import open_checkpoint  # noqa: PLC0415 - the door opens the member by its own kind

    listing = list_series(directory)
    if listing.latest is None:  # pragma: no cover - file_series_kind found a numbered file
        raise NotACheckpointError(f"{directory}: no checkpoint file with an epoch or step in its name")
    ckpt = open_checkpoint(listing.latest)
    info = dict(ckpt.info)
    if listing.warnings:
        info["warnings"] = [*listing.warnings, *info.get("warnings", ())]
    number, number_source = ckpt.number, ckpt.number_source
    if number is None:  # in a series, a bare number in the name is its place (a ModelCheckpoint's {epoch})
        number, number_source = listing.checkpoints[-1].number, "name"
    return dataclasses.replace(ckpt, checkpoints=listing.checkpoints, info=info, number=number,
                               number_source=number_source)


def series_fingerprint(directory: str) -> object:
    """What changes when a process saves into the directory: a TF directory's state file; a file
    series' names, sizes and modification times."""
    kind, files = _series_files(directory)
    from .orbax.run import is_run, run_fingerprint  # noqa: PLC0415

    if kind is None and is_run(directory):
        return run_fingerprint(directory)
    if kind is None:
        from .tf.directory import state_fingerprint  # noqa: PLC0415

        return state_fingerprint(directory)
    stats = []
    for n in files:
        try:
            st = os.stat(_fs.join(directory, n))
            stats.append((n, st.st_size, st.st_mtime_ns))
        except OSError:
            stats.append((n, None, None))
    return tuple(stats)


def series_changed(directory: str, before: object) -> bool:
    """Whether the directory changed since ``before`` (a :func:`series_fingerprint`)."""
    if isinstance(before, tuple):
        return series_fingerprint(directory) != before
    from .tf.directory import state_changed  # noqa: PLC0415

    return state_changed(directory, before)
