"""``plan``'s measurements: what a checkpoint directory says about a run (checkpoint size,
bytes per role, the cadence it was saved at), and the write speed of its storage (``--probe``).

Nothing here computes the plan itself (:mod:`ckptinspect.ops.plan.operation` does); these functions read
the directory, or write one temporary file and remove it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
import statistics
import time
import uuid
from typing import Any, Callable

from ... import _atomic
from ... import model as m
from ...errors import OutputWriteError, UsageError
from ...formats import is_remote, open_checkpoint

__all__ = [
    "TIME_STATE_FILE",
    "TIME_MTIME",
    "TIME_COMMIT",
    "PROBE_MAX_BYTES",
    "PROBE_SUFFIX",
    "CadencePoint",
    "Cadence",
    "Measured",
    "ProbeResult",
    "measure",
    "probe_write",
]

TIME_STATE_FILE = "state-file"  # all_model_checkpoint_timestamps of the ``checkpoint`` file
TIME_COMMIT = "commit"  # the commit time each checkpoint records itself (an Orbax step's _CHECKPOINT_METADATA)
TIME_MTIME = "mtime"  # the modification time of each checkpoint's index (or V1 file)
INDEX_SUFFIX = ".index"  # a TF bundle's index: written last by a save, so its mtime is the save's end

PROBE_MAX_BYTES = 1 << 30  # the probe writes at most 1 GiB; a bigger checkpoint's time is scaled
PROBE_CHUNK_BYTES = 8 << 20  # one buffer, written again and again: memory stays at this
PROBE_FREE_MARGIN = 64 << 20  # the probe leaves at least this much free on the filesystem
# ``.ckptinspect-tmp-<hex>.write-probe``: clearly ours, and reported by ``ls``/``verify`` as a
# leftover of an interrupted ckptinspect write should a SIGKILL ever leave one behind.
PROBE_SUFFIX = ".write-probe"


@dataclasses.dataclass(frozen=True)
class CadencePoint:
    """One retained checkpoint of a directory, as ``plan`` sees it.

    Attributes:
        path: The checkpoint prefix (or V1 file).
        step: Its step, or None.
        time: When it was saved (seconds since the epoch), or None.
    """

    path: str
    step: int | None
    time: float | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Cadence:
    """How often a directory's checkpoints were saved (medians over consecutive retained ones).

    Attributes:
        points: The retained checkpoints that exist, oldest first.
        time_source: ``state-file`` (the ``checkpoint`` file's timestamps), ``commit`` (the
            commit time each checkpoint records itself: an Orbax step's ``_CHECKPOINT_METADATA``)
            or ``mtime`` (file times), or None when no two checkpoints have distinct times.
        interval_seconds: Median time between consecutive saves, or None.
        interval_steps: Median step difference between consecutive saves, or None.
        seconds_per_step: Median of (time difference / step difference), or None.
        intervals: How many consecutive pairs the time median is over.
    """

    points: tuple[CadencePoint, ...]
    time_source: str | None
    interval_seconds: float | None
    interval_steps: float | None
    seconds_per_step: float | None
    intervals: int = 0

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["points"] = [p.to_dict() for p in self.points]
        return out


@dataclasses.dataclass(frozen=True)
class Measured:
    """What ``plan`` reads from a checkpoint or directory.

    Attributes:
        path: The path as given.
        directory: The directory the checkpoints live in (what ``--probe`` measures).
        checkpoint: The checkpoint measured (a directory's latest).
        format: Its format.
        checkpoint_bytes: Bytes of that checkpoint's files (index and data shards, or the file).
        files: Those files.
        role_bytes: Bytes of its variables' values per role (``model``, ``optimizer``,
            ``metadata``), as ``ls`` totals them.
        retained: How many checkpoints of the directory exist on disk (1 for a single file).
        cadence: The cadence, for a directory of two or more checkpoints; else None.
        warnings: What the reader found wrong around the checkpoint (as ``ls`` warns).
    """

    path: str
    directory: str
    checkpoint: str
    format: str
    checkpoint_bytes: int
    files: tuple[str, ...]
    role_bytes: dict[str, int]
    retained: int
    cadence: Cadence | None
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["files"] = list(self.files)
        out["warnings"] = list(self.warnings)
        out["cadence"] = self.cadence.to_dict() if self.cadence else None
        return out


def _regular_size(path: str) -> int:
    try:
        st = os.stat(path)
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def _save_time(c: m.RetainedCheckpoint) -> float | None:
    """The modification time of a checkpoint's index (a save writes it last), or of its V1 file."""
    for candidate in (c.path + INDEX_SUFFIX, c.path):
        try:
            return os.stat(candidate).st_mtime
        except OSError:
            continue
    return None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def cadence_of(retained: tuple[m.RetainedCheckpoint, ...]) -> Cadence:
    """The cadence of a directory's retained checkpoints: recorded timestamps when every existing
    checkpoint has one (the state file's, or the commit time a checkpoint records itself where no
    state file lists it), else file modification times; step deltas from their steps.

    Args:
        retained: ``Checkpoint.checkpoints`` of a directory.
    """
    existing = [c for c in retained if c.exists]
    stamped = [c for c in existing if c.timestamp is not None]
    if len(existing) >= 2 and len(stamped) == len(existing):
        # A timestamp on a checkpoint no state file lists was recorded by the checkpoint itself.
        source: str | None = TIME_STATE_FILE if all(c.in_state_file for c in existing) else TIME_COMMIT
        points = [CadencePoint(c.path, c.step, c.timestamp) for c in existing]
    else:
        points = [CadencePoint(c.path, c.step, _save_time(c)) for c in existing]
        source = TIME_MTIME if sum(p.time is not None for p in points) >= 2 else None
    points.sort(key=lambda p: (p.step is None, p.step or 0, p.time or 0.0))
    if source is not None:  # in the order they were saved
        points.sort(key=lambda p: (p.time is None, p.time or 0.0))
    timed = [p.time for p in points if p.time is not None]
    gaps = [b - a for a, b in zip(timed, timed[1:])]
    by_step = sorted((p for p in points if p.step is not None), key=lambda p: p.step)
    step_gaps = [(b.step - a.step, a.time, b.time) for a, b in zip(by_step, by_step[1:]) if b.step > a.step]
    per_step = [(tb - ta) / ds for ds, ta, tb in step_gaps if ta is not None and tb is not None and tb >= ta]
    interval = _median(gaps) if source is not None else None
    if not interval or interval <= 0:  # identical save times (files copied together): no cadence
        source, interval, per_step = None, None, []
    return Cadence(
        points=tuple(points),
        time_source=source,
        interval_seconds=interval,
        interval_steps=_median([float(ds) for ds, _, _ in step_gaps]),
        seconds_per_step=_median(per_step) or None,
        intervals=len(gaps) if source is not None else 0,
    )


def measure(path: str) -> Measured:
    """Read a checkpoint (or a checkpoint directory) for ``plan``: size, bytes per role, cadence.

    Args:
        path: A checkpoint directory (its latest checkpoint is measured; its retained ones
            give the cadence) or a single checkpoint of any supported format.

    Raises:
        UsageError: A remote path (``plan`` measures local storage).
        CkptError: The path is not a checkpoint (as ``ls`` would say).
    """
    if is_remote(path):
        raise UsageError(f"{path}: plan measures local storage; remote paths are not supported (copy a checkpoint here)")
    with open_checkpoint(path) as ckpt:
        files = tuple(dict.fromkeys(ckpt.source.files() if ckpt.source is not None else ()))
        if not files and os.path.isfile(ckpt.path):
            files = (ckpt.path,)
        totals = ckpt.totals()
        role_bytes = {r: int(totals[r]["nbytes"]) for r in m.ROLES}
        retained = ckpt.checkpoints
        cadence = cadence_of(retained) if retained else None
        directory = path if os.path.isdir(path) else os.path.dirname(ckpt.path) or "."
        return Measured(
            path=path,
            directory=directory,
            checkpoint=ckpt.path,
            format=ckpt.format,
            checkpoint_bytes=sum(_regular_size(f) for f in files),
            files=files,
            role_bytes=role_bytes,
            retained=sum(c.exists for c in retained) if retained else 1,
            cadence=cadence,
            warnings=tuple(ckpt.info.get("warnings", ())),
        )


# -- --probe ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """One measured write (``--probe``).

    Attributes:
        directory: Where the temporary file was written (and removed).
        bytes_written: Bytes written and fsync'd (the checkpoint's size, at most
            :data:`PROBE_MAX_BYTES`).
        checkpoint_bytes: The checkpoint's size the time is for.
        capped: ``bytes_written < checkpoint_bytes``: the time was scaled up linearly.
        max_bytes: The cap on the bytes written.
        seconds: Time to write, fsync the file and fsync the directory.
        bytes_per_second: ``bytes_written / seconds``.
        save_seconds: The time per save: ``seconds`` scaled to ``checkpoint_bytes``.
    """

    directory: str
    bytes_written: int
    checkpoint_bytes: int
    capped: bool
    max_bytes: int
    seconds: float
    bytes_per_second: float
    save_seconds: float

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        return out


def _probe_error(directory: str, e: OSError) -> OutputWriteError:
    return OutputWriteError(f"{directory}: cannot measure its write speed: {e.strerror or e}"
                            " (the probe file was removed)")


def probe_write(directory: str, nbytes: int, *, progress: Callable[[int, int], None] | None = None,
                max_bytes: int = PROBE_MAX_BYTES) -> ProbeResult:
    """Measure the time to save ``nbytes`` into ``directory``: write a temporary file of that
    size (at most :data:`PROBE_MAX_BYTES`, reusing one buffer), fsync it and the directory,
    then delete it. Nothing is left behind, also on an error or Ctrl-C (and SIGTERM/SIGHUP in
    the main thread).

    Args:
        directory: The directory whose storage is measured.
        nbytes: The checkpoint's size.
        progress: Called as ``progress(written, total)`` after each buffer.
        max_bytes: The cap (:data:`PROBE_MAX_BYTES`): a bigger checkpoint's time is scaled
            linearly from this many bytes.

    Returns:
        The :class:`ProbeResult`.

    Raises:
        UsageError: ``directory`` is not a directory, or its filesystem has too little room.
        OutputWriteError: The file could not be written (read-only, full disk, ...).
    """
    if not os.path.isdir(directory):
        raise UsageError(f"{directory}: --probe measures a directory's storage; this is not a directory")
    total = max(1, min(int(nbytes), int(max_bytes)))
    try:
        st = os.statvfs(directory)
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = None
    if free is not None and free < total + PROBE_FREE_MARGIN:
        raise UsageError(f"{directory}: too little free space to probe ({free} bytes free, the probe needs"
                         f" {total} + {PROBE_FREE_MARGIN} bytes)")
    buffer = memoryview(os.urandom(min(total, PROBE_CHUNK_BYTES)))  # incompressible, as weights are
    path = os.path.join(directory, f"{_atomic.TMP_MARK}{uuid.uuid4().hex[:12]}{PROBE_SUFFIX}")
    fd = None
    ours = True
    try:
        with _atomic.signals_unwind():  # SIGTERM/SIGHUP unwind: the probe file goes, exit 128+signal
            try:
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
                except OSError:
                    ours = False  # nothing was created (or the name is not ours to remove)
                    raise
                start = time.perf_counter()
                written = 0
                while written < total:
                    written += os.write(fd, buffer[: total - written])
                    if progress is not None:
                        progress(written, total)
                os.fsync(fd)
                dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(dir_fd)
                finally:
                    os.close(dir_fd)
                seconds = max(time.perf_counter() - start, 1e-9)
            finally:
                if fd is not None:
                    os.close(fd)
                if ours:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
    except OSError as e:
        raise _probe_error(directory, e) from None
    rate = total / seconds
    return ProbeResult(
        directory=directory,
        bytes_written=total,
        checkpoint_bytes=int(nbytes),
        capped=total < nbytes,
        max_bytes=int(max_bytes),
        seconds=seconds,
        bytes_per_second=rate,
        save_seconds=seconds * (nbytes / total) if nbytes > 0 else seconds,
    )
