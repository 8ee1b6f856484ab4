"""A TF checkpoint directory resolved to the checkpoint it holds: the state file's latest, the
last V1 file, or why it holds none (pointing at SavedModel exports or Keras files instead)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ... import model as m
from ...errors import CheckpointNotFoundError, NotACheckpointError
from .. import _fs
from .._layout import INDEX_SUFFIX, KERAS_SUFFIXES
from .sniff import KIND_V1, is_savedmodel, table_kind

if TYPE_CHECKING:
    from .directory import DirectoryListing

__all__ = ["MAX_LISTED", "RESOLVE_ATTEMPTS", "list_directory", "open_directory"]

MAX_LISTED = 5  # paths named in a "pass one of them" message
RESOLVE_ATTEMPTS = 3  # listings of a live directory whose resolved checkpoint vanished before it opened


def _v1_in_directory(directory: str) -> str | None:
    """The last V1 checkpoint file of a directory that holds no TF bundle."""
    for name in reversed(_fs.listdir(directory)):
        candidate = _fs.join(directory, name)
        if _fs.isfile(candidate) and table_kind(candidate) == KIND_V1:
            return candidate
    return None


def _nothing_found(directory: str, problems: tuple[str, ...] = ()) -> NotACheckpointError:
    """Why a directory holds no checkpoint, pointing at what it does hold."""
    names = _fs.listdir(directory)
    exports = [n for n in names if _fs.isdir(_fs.join(directory, n)) and is_savedmodel(_fs.join(directory, n))]
    if exports:
        shown = sorted(exports, key=lambda n: (n.isdigit(), int(n) if n.isdigit() else 0, n), reverse=True)
        listed = ", ".join(_fs.join(directory, n) for n in shown[:MAX_LISTED])
        more = f" (+{len(shown) - MAX_LISTED} more)" if len(shown) > MAX_LISTED else ""
        return NotACheckpointError(
            f"{directory}: an export directory holding {len(exports)} SavedModel{'s' if len(exports) != 1 else ''},"
            f" not a checkpoint; pass one of them: {listed}{more}"
        )
    keras = [n for n in names if n.endswith(KERAS_SUFFIXES) and _fs.isfile(_fs.join(directory, n))]
    if keras:
        listed = ", ".join(_fs.join(directory, n) for n in keras[:MAX_LISTED])
        more = f" (+{len(keras) - MAX_LISTED} more)" if len(keras) > MAX_LISTED else ""
        return NotACheckpointError(
            f"{directory}: holds Keras file{'s' if len(keras) != 1 else ''} with no epoch or step in"
            f" {'their names' if len(keras) != 1 else 'its name'}, not a series of checkpoints;"
            f" pass one of them: {listed}{more}"
        )
    message = (f"{directory}: no checkpoint found in the directory (no 'checkpoint' state file naming"
               " existing files, no *.index, no saved_model.pb)")
    return NotACheckpointError(message + (f"; also: {problems[0]}" if problems else ""))


def open_directory(directory: str) -> m.Checkpoint:
    """The checkpoint a directory resolves to, opened and pinned (its data files held open, so
    a process saving into the directory can rotate it out while the command reads it); the
    directory's problems (state file, leftover temporaries) ride along in ``info["warnings"]``.

    A checkpoint deleted between listing the directory and opening it (rotated out by a
    CheckpointManager) is not an error: the directory is listed again, up to
    :data:`RESOLVE_ATTEMPTS` times. Once open, the command sticks to that checkpoint.
    """
    from .bundle import open_bundle  # noqa: PLC0415 - bundles and V1 tables load when a directory is opened
    from .directory import checkpoint_present  # noqa: PLC0415
    from .v1 import open_v1  # noqa: PLC0415

    for attempt in range(1, RESOLVE_ATTEMPTS + 1):
        listing = list_directory(directory)
        if listing.v1 is not None:  # a directory holding only V1 checkpoint files (export-00000-of-00001)
            return _with_warnings(open_v1(listing.v1), listing.warnings)
        latest = listing.latest
        if latest is None:  # the state file names checkpoints, none of them exists
            v1 = _v1_in_directory(directory)  # a V1 Saver's state file may name a pattern
            if v1 is None:
                raise _nothing_found(directory, listing.problems)
            return _with_warnings(open_v1(v1), listing.warnings)
        try:
            if not _fs.exists(latest + INDEX_SUFFIX) and _fs.isfile(latest):
                ckpt = open_v1(latest, checkpoints=listing.checkpoints)
            else:
                ckpt = open_bundle(latest, checkpoints=listing.checkpoints)
                if (ckpt.info.get("object_graph") or {}).get("error") and attempt < RESOLVE_ATTEMPTS \
                        and not checkpoint_present(latest):
                    ckpt.close()  # its files went while it was read (rotated out), not damage: resolve again
                    continue
                pin = getattr(ckpt.source, "pin", None)
                if pin is not None:
                    pin()
        except CheckpointNotFoundError:
            if attempt < RESOLVE_ATTEMPTS and not checkpoint_present(latest):
                continue  # rotated out before we could open it: resolve again
            raise
        return _with_warnings(ckpt, listing.warnings)
    raise AssertionError("unreachable")  # pragma: no cover


def _with_warnings(ckpt: m.Checkpoint, warnings: tuple[str, ...]) -> m.Checkpoint:
    if not warnings:
        return ckpt
    # The directory's first, then the checkpoint's own (an unreadable entry or object graph).
    return dataclasses.replace(ckpt, info={**ckpt.info, "warnings": [*warnings, *ckpt.info.get("warnings", ())]})


def list_directory(directory: str, *, steps: bool = True) -> "DirectoryListing":
    """A checkpoint directory, read once, without opening any checkpoint.

    Args:
        directory: The directory.
        steps: Read the last checkpoints' steps from their indexes (as ``ls`` shows them);
            False: from their names only (for callers that open every checkpoint anyway).

    Returns:
        The :class:`~ckptinspect.formats.tf.directory.DirectoryListing`: retained checkpoints, the
        prefix it resolves to, its problems (state file) and leftover temporaries; ``v1`` is
        a V1 file when the directory holds no bundle but V1 checkpoint files.

    Raises:
        NotACheckpointError: No checkpoint at all in the directory (saying what it holds
            instead: SavedModel exports, Keras files).
    """
    from .directory import read_directory  # noqa: PLC0415

    listing = read_directory(directory, steps=steps)
    if listing.latest is None and not listing.checkpoints:
        v1 = _v1_in_directory(directory)
        if v1 is None:
            raise _nothing_found(directory, listing.problems)
        listing = dataclasses.replace(listing, v1=v1)
    return listing
