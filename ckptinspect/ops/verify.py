"""``verify``: find damaged checkpoints without TensorFlow.

The checks themselves belong to the formats (``formats.prepare_check``): for a TF bundle, the
``.index`` parses, every data shard exists and is long enough, and every stored tensor (each
stored slice of a sliced one) has the checksum the index records, streamed one tensor at a
time in file order; a V1 table by the checksums of its blocks; an HDF5 or ``.keras`` file by
opening it and reading every dataset. This module rolls the results up: one checkpoint, or
every checkpoint a directory retains (as ``ckptinspect ls`` lists them).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import model as m
from ..errors import NotACheckpointError
from ..formats import Kind, list_directory, prepare_check
from ..model import Damage, Progress

__all__ = [
    "FORMAT_DIRECTORY",
    "STATUS_INTACT",
    "STATUS_DAMAGED",
    "STATUS_MISSING",
    "Damage",
    "CheckpointResult",
    "VerifyReport",
    "verify",
]

FORMAT_DIRECTORY = "tf-directory"  # VerifyReport.format for a checkpoint directory
STATUS_INTACT = m.STATUS_INTACT
STATUS_DAMAGED = m.STATUS_DAMAGED
STATUS_MISSING = m.STATUS_MISSING
STATE_FILE = "checkpoint"

CheckpointResult = m.CheckResult  # the verdict on one checkpoint


# -- report ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """What ``verify`` found.

    Attributes:
        path: The path as given.
        format: The format of the checkpoint(s), or ``tf-directory`` for a directory.
        directory: True when ``path`` is a checkpoint directory.
        checkpoints: One result per checkpoint: for a directory every retained one (state
            file order, then ones only on disk), otherwise exactly one.
    """

    path: str
    format: str
    directory: bool
    checkpoints: tuple[CheckpointResult, ...]

    @property
    def intact(self) -> bool:
        """Every checkpoint exists and is whole."""
        return all(c.intact for c in self.checkpoints)

    @property
    def damaged(self) -> list[tuple[CheckpointResult, Damage]]:
        """Every damaged tensor, with its checkpoint."""
        return [(c, d) for c in self.checkpoints for d in c.damaged]

    @property
    def first_damaged(self) -> tuple[CheckpointResult, Damage] | None:
        """The first damaged tensor in file order (of the first checkpoint with damage)."""
        found = self.damaged
        return found[0] if found else None

    @property
    def newest_intact(self) -> CheckpointResult | None:
        """The intact checkpoint with the highest step; among equal (or no) steps the one the
        directory resolves to, else the later-listed one."""
        intact = [(i, c) for i, c in enumerate(self.checkpoints) if c.intact]
        if not intact:
            return None
        return max(intact, key=lambda ic: (ic[1].step if ic[1].step is not None else -1, ic[1].latest, ic[0]))[1]

    def summary(self) -> dict[str, int]:
        """Counts: checkpoints by status, tensors checked and damaged."""
        return {
            "checkpoints": len(self.checkpoints),
            STATUS_INTACT: sum(c.status == STATUS_INTACT for c in self.checkpoints),
            STATUS_DAMAGED: sum(c.status == STATUS_DAMAGED for c in self.checkpoints),
            STATUS_MISSING: sum(c.status == STATUS_MISSING for c in self.checkpoints),
            "tensors": sum(c.tensors for c in self.checkpoints),
            "damaged_tensors": sum(len(c.damaged) for c in self.checkpoints),
            "bytes": sum(c.nbytes for c in self.checkpoints),
        }

    def to_dict(self) -> dict[str, Any]:
        """The ``verify --format json`` document (see README, ``ckptinspect verify``)."""
        first = self.first_damaged
        newest = self.newest_intact
        return {
            "path": self.path,
            "format": self.format,
            "intact": self.intact,
            "newest_intact": newest.path if newest else None,
            "first_damaged": ({"checkpoint": first[0].path, **first[1].to_dict()} if first else None),
            "summary": self.summary(),
            "checkpoints": [c.to_dict() for c in self.checkpoints],
        }


# -- the operation -----------------------------------------------------------------------
def _verify_directory(directory: str, progress: Progress | None) -> VerifyReport:
    retained, _, v1 = list_directory(directory)
    if v1 is not None:
        _, check = prepare_check(v1)
        return VerifyReport(directory, m.FORMAT_TF_V1, True, (check.run(progress),))
    checks: list[tuple[m.RetainedCheckpoint, Any]] = []
    for c in retained:
        checks.append((c, prepare_check(c.path)[1] if c.exists else None))
    total = sum(check.total for _, check in checks if check is not None)
    done = 0
    results = []
    for c, check in checks:
        if check is not None:
            result = check.run(progress, done, total)
            done += check.total
        else:
            result = CheckpointResult(c.path, None, STATUS_MISSING, problems=(
                f"{c.path}: listed by {directory.rstrip('/')}/{STATE_FILE} but its files are missing",))
        step = result.step if result.step is not None else c.step
        results.append(dataclasses.replace(result, step=step, latest=c.latest, in_state_file=c.in_state_file))
    return VerifyReport(directory, FORMAT_DIRECTORY, True, tuple(results))


def verify(path: str, progress: Progress | None = None) -> VerifyReport:
    """Check that a checkpoint (or every checkpoint of a directory) is whole.

    Args:
        path: A TF prefix or ``.index`` file, a checkpoint or SavedModel directory, a V1 file,
            or a Keras ``.h5`` / ``.weights.h5`` / ``.keras`` file.
        progress: Called as ``progress(done, total, item)`` after each tensor or dataset;
            ``item.name`` names it.

    Returns:
        A :class:`VerifyReport`; damage is reported in it (``report.intact`` is False).

    Raises:
        CheckpointNotFoundError: Nothing at ``path``, or an index that cannot be read.
        NotACheckpointError: ``path`` is not a checkpoint (or is a part of one).
        UnsafeFileError: A Keras file asks for something unsafe (external links, zip bomb,
            path traversal).
    """
    path = str(path)
    kind, check = prepare_check(path)
    if kind is Kind.TF_DIRECTORY:
        return _verify_directory(path, progress)
    if check is None:  # pragma: no cover - every other kind has a check
        raise NotACheckpointError(f"{path}: not a checkpoint")
    result = check.run(progress)
    fallback = {Kind.ZIP: m.FORMAT_KERAS_ZIP, Kind.HDF5: "hdf5", Kind.KERAS_SHARDED: "hdf5"}.get(kind, kind.value)
    return VerifyReport(path, result.format or fallback, False, (result,))
