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
from typing import Any, Callable, Iterable

from .. import model as m
from ..errors import CkptError, NotACheckpointError
from ..formats import checkpoint_present, directory_changed, directory_fingerprint, list_directory, prepare_check
from ..model import Damage, Progress

__all__ = [
    "FORMAT_DIRECTORY",
    "STATUS_INTACT",
    "STATUS_DAMAGED",
    "STATUS_MISSING",
    "STATUS_ROTATED",
    "Damage",
    "CheckpointResult",
    "VerifyReport",
    "check_checkpoint",
    "rotated_out",
    "verify",
]

FORMAT_DIRECTORY = "tf-directory"  # VerifyReport.format for a TF checkpoint directory (a file series: its kind)
STATUS_INTACT = m.STATUS_INTACT
STATUS_DAMAGED = m.STATUS_DAMAGED
STATUS_MISSING = m.STATUS_MISSING
# A checkpoint of a directory deleted while verify ran, as a CheckpointManager rotates old ones
# out (the directory's state file changed meanwhile): not damage.
STATUS_ROTATED = "rotated"
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
            file order, then ones only on disk), otherwise exactly one. A checkpoint deleted
            while verify ran (rotated out by the process saving into the directory) has
            status ``rotated``.
        problems: Directory-level damage, one line each: a state file TensorFlow cannot
            parse, that is not a regular file, or that names paths outside the directory.
        notes: Worth knowing, not damage: temporaries left by interrupted ckptinspect writes;
            what a format's check cannot prove (its check's ``notes``).
    """

    path: str
    format: str
    directory: bool
    checkpoints: tuple[CheckpointResult, ...]
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def intact(self) -> bool:
        """Every checkpoint exists and is whole (rotated-out ones aside, as long as one is
        left), and the directory has no problems."""
        kept = [c for c in self.checkpoints if c.status != STATUS_ROTATED]
        return not self.problems and all(c.intact for c in kept) and (bool(kept) or not self.checkpoints)

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
        """The intact checkpoint placed last in the run (:func:`~ckptinspect.model.run_positions`:
        by training step, else by the number in its name); among equals (or when neither places
        them) the one the directory resolves to, else the later-listed one."""
        intact = [(i, c) for i, c in enumerate(self.checkpoints) if c.intact]
        if not intact:
            return None
        positions, _ = m.run_positions([c.step for _, c in intact], [c.number for _, c in intact])
        best = max(range(len(intact)), key=lambda n: (positions[n] if positions[n] is not None else -1,
                                                       intact[n][1].latest, intact[n][0]))
        return intact[best][1]

    def summary(self) -> dict[str, int]:
        """Counts: checkpoints by status, tensors checked and damaged."""
        return {
            "checkpoints": len(self.checkpoints),
            STATUS_INTACT: sum(c.status == STATUS_INTACT for c in self.checkpoints),
            STATUS_DAMAGED: sum(c.status == STATUS_DAMAGED for c in self.checkpoints),
            STATUS_MISSING: sum(c.status == STATUS_MISSING for c in self.checkpoints),
            STATUS_ROTATED: sum(c.status == STATUS_ROTATED for c in self.checkpoints),
            "problems": len(self.problems),
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
            "problems": list(self.problems),
            "notes": list(self.notes),
            "checkpoints": [c.to_dict() for c in self.checkpoints],
        }


# -- the operation -----------------------------------------------------------------------
def _verify_directory(directory: str, progress: Progress | None) -> VerifyReport:
    """Every checkpoint of a directory, resolved once: the listing is read at the start and
    never re-read, so a checkpoint another process writes meanwhile is not looked at, and one
    it deletes meanwhile (a CheckpointManager rotating it out) is reported as rotated."""
    before = directory_fingerprint(directory)
    listing = list_directory(directory)
    if listing.v1 is not None:
        _, check = prepare_check(listing.v1)
        return VerifyReport(directory, m.FORMAT_TF_V1, True, (check.run(progress),), listing.problems, listing.notes)
    checks: list[tuple[m.RetainedCheckpoint, Any]] = []
    for c in listing.checkpoints:
        checks.append((c, _guarded(c.path, lambda c=c: prepare_check(c.path)[1]) if c.exists else None))
    total = sum(check.total for _, check in checks if check is not None and not isinstance(check, CheckpointResult))
    done = 0
    results = []
    for c, check in checks:
        if isinstance(check, CheckpointResult):
            result = check
        elif check is not None:
            result = _guarded(c.path, lambda check=check: check.run(progress, done, total))
            done += check.total
        else:
            result = CheckpointResult(c.path, None, STATUS_MISSING, problems=(
                f"{c.path}: listed by {directory.rstrip('/')}/{STATE_FILE} but its files are missing",))
        step = result.step if result.step is not None else c.step
        results.append(dataclasses.replace(result, step=step, latest=c.latest, in_state_file=c.in_state_file,
                                           number=c.number))
    gone = rotated_out(directory, before, [r.path for r in results if not r.intact])
    results = [_rotated(r, directory) if r.path in gone else r for r in results]
    return VerifyReport(directory, listing.kind, True, tuple(results), listing.problems, listing.notes)


def rotated_out(directory: str, before: object, not_intact: Iterable[str]) -> set[str]:
    """The rule that tells a checkpoint rotated out from a damaged or missing one (``verify``
    and ``scan`` both ask it): of the checkpoints found not intact, those whose files are gone
    now, when the directory changed since ``before`` (a
    :func:`~ckptinspect.formats.directory_fingerprint` taken before the directory was listed):
    the process saving into the directory deleted them meanwhile. An idle directory has none."""
    gone = {p for p in not_intact if not checkpoint_present(p)}
    return gone if gone and directory_changed(directory, before) else set()


def check_checkpoint(path: str, progress: Progress | None = None, done: int = 0, total: int | None = None,
                     seen: m.Checkpoint | None = None) -> CheckpointResult:
    """``verify``'s verdict on one checkpoint (not a directory): the format's check
    (:func:`~ckptinspect.formats.prepare_check`) run whole; a checkpoint that cannot be
    checked at all (a refusal, a file that vanished) is damaged, with the reason. ``scan``
    takes each checkpoint's status from here.

    ``seen``: the same checkpoint, opened, whose values the caller has just read (``scan``).
    A format whose check is fed by its reader (a TF bundle's checksums) takes the verdicts of
    the runs already read from it instead of reading them again; the verdict is the same."""

    def run() -> CheckpointResult:
        kind, check = prepare_check(path)
        if check is None:
            raise NotACheckpointError(f"{path}: a directory, not one checkpoint")
        return check.run(progress, done, total, seen=seen)

    return _guarded(path, run)


def _guarded(path: str, fn: Callable[[], Any]) -> Any:
    """One checkpoint's check; a refusal (a FIFO or device, an absurd size) or a file that
    vanished is that checkpoint's problem, not the end of the directory's report."""
    try:
        return fn()
    except CkptError as e:
        return CheckpointResult(path, None, STATUS_DAMAGED, problems=(str(e),))


def _rotated(result: CheckpointResult, directory: str) -> CheckpointResult:
    return dataclasses.replace(result, status=STATUS_ROTATED, tensors=0, nbytes=0, damaged=(), problems=(
        f"{result.path}: deleted while verify ran (rotated out by the process saving into {directory}); not damage",))


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
    if kind.can("series"):
        return _verify_directory(path, progress)
    if check is None:  # pragma: no cover - every other kind has a check
        raise NotACheckpointError(f"{path}: not a checkpoint")
    result = check.run(progress)
    fallback = kind.label
    # what the format's check cannot prove (Orbax: chunk data without checksums), if it says
    return VerifyReport(path, result.format or fallback, False, (result,), notes=tuple(getattr(check, "notes", ())))
