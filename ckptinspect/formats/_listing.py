"""What a directory of checkpoints holds, read once: the record the series seam
(:mod:`.series`) and the TF directory reader (:mod:`.tf.directory`) both return."""

from __future__ import annotations

import dataclasses

from .. import model as m
from ._layout import SERIES_KERAS, SERIES_TF, SERIES_TORCH

__all__ = ["SERIES_TF", "SERIES_KERAS", "SERIES_TORCH", "DirectoryListing"]


@dataclasses.dataclass(frozen=True)
class DirectoryListing:
    """What a checkpoint directory holds, read once.

    Attributes:
        directory: The directory as given.
        checkpoints: Every checkpoint: for a TF directory the state file's, in its order, then
            ones only on disk; for a file series the files in step order.
        latest: The checkpoint the directory resolves to (the newest), or None.
        problems: What is wrong with the directory (its state file), one line each (``verify``
            counts them as damage; ``ls`` warns).
        leftovers: Temporary files or folders of interrupted ckptinspect writes.
        v1: A V1 checkpoint file, when the directory holds no bundle but V1 files.
        foreign: Absolute paths the state file names that do not exist on this machine (a
            directory copied from another machine), read as their basenames in the directory.
            TensorFlow uses such a path as written, so ``tf.train.latest_checkpoint`` names a
            file that is not there.
        has_state_file: Whether the directory has a readable, valid state file.
        kind: :data:`SERIES_TF`, :data:`SERIES_KERAS` or :data:`SERIES_TORCH`.
        unordered: Checkpoint files of a file series whose names carry no epoch or step.
    """

    directory: str
    checkpoints: tuple[m.RetainedCheckpoint, ...]
    latest: str | None
    problems: tuple[str, ...] = ()
    leftovers: tuple[str, ...] = ()
    v1: str | None = None
    foreign: tuple[str, ...] = ()
    has_state_file: bool = False
    kind: str = SERIES_TF
    unordered: tuple[str, ...] = ()

    @property
    def notes(self) -> tuple[str, ...]:
        """One line per leftover temporary and per unordered file (worth knowing; not damage)."""
        return tuple(f"{p}: left over from an interrupted ckptinspect write (safe to delete)" for p in self.leftovers) + tuple(
            f"{p}: not part of the series (no epoch or step in its name)" for p in self.unordered)

    @property
    def warnings(self) -> tuple[str, ...]:
        """Problems, then notes: what ``ls`` shows on stderr."""
        return self.problems + self.notes
