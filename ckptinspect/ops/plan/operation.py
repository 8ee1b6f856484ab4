"""``plan``: how often to save, and what saving costs (issue 17).

The arithmetic of the seed guide on checkpointing: measure the time to save, multiply it by the
number of saves, and see what it adds to the training time. Its example, reproduced exactly:
7 days of training, 20 s per save, a save every 30 minutes -> 336 saves, 1.87 h of saving,
1.11% of the training time.

Every figure and formula is documented in docs/INTERFACE.md ("``ckptinspect plan``"). Inputs come
from flags, from a checkpoint directory (size, bytes per role, the cadence it was saved at, how
many checkpoints it keeps) and from ``--probe`` (the time per save, measured on the storage). A
figure whose inputs are missing is None, and :attr:`PlanReport.missing` says which flag gives it;
nothing is guessed.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any, Callable

from ...errors import UsageError
from .measure import Measured, ProbeResult, measure, probe_write

__all__ = [
    "PlanReport",
    "plan",
    "compute_plan",
    "parse_duration",
    "SOURCE_FLAG",
    "SOURCE_DIRECTORY",
    "SOURCE_PROBE",
]

SECONDS_PER_HOUR = 3600.0
DURATION_UNITS = {"w": 7 * 86400.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
MAX_DURATION_SECONDS = 1000 * 365 * 86400.0  # beyond this, a duration is a typo
DURATION_EXAMPLES = "a duration such as 30m, 7d, 1h30m, 20s or plain seconds"
_NUMBER_RE = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)")
_PART_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([wdhms])")
PROBE_FAR_SMALLER = 4  # a probe under 1/4 of the checkpoint: its scaled time is doubtful (a warning)
EPSILON = 1e-9  # 7d / 30m is 336 exactly; float division must not make it 335.99999

SOURCE_FLAG = "flag"
SOURCE_DIRECTORY = "directory"
SOURCE_PROBE = "probe"

# What to pass when an input is missing (``PlanReport.missing``).
HINTS = {
    "save_seconds": "pass --save-seconds S, or DIR with --probe to measure it",
    "every_seconds": "pass --every DURATION (or a DIR holding two or more checkpoints with save times)",
    "train_seconds": "pass --train-time DURATION",
    "checkpoint_bytes": "pass DIR (a checkpoint or a checkpoint directory)",
    "keep": "pass --keep N (or a checkpoint directory: the checkpoints it keeps)",
    "job_limit_seconds": "pass --job-limit DURATION",
    "mtbf_seconds": "pass --mtbf DURATION",
}
# Which inputs each computed figure needs (shown when one of them is missing).
NEEDS = {
    "saves": ("train_seconds", "every_seconds"),
    "overhead": ("train_seconds", "every_seconds", "save_seconds"),
    "lost": ("every_seconds",),
    "job_limit": ("every_seconds", "job_limit_seconds"),
    "disk": ("checkpoint_bytes", "keep"),
    "young_daly": ("save_seconds", "mtbf_seconds"),
}


def parse_duration(value: str | float | int, *, name: str = "duration") -> float:
    """A duration in seconds: ``30m``, ``7d``, ``1h30m``, ``20s``, ``1.5h``, ``2w`` or plain
    seconds (``1800``, or a number).

    Args:
        value: The text (units ``w d h m s``, each at most once, in any order) or seconds.
        name: What it is, for the error message (``--every``).

    Returns:
        Seconds, more than 0.

    Raises:
        UsageError: Not a duration, not more than 0, or absurdly long (over 1,000 years).
    """
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise UsageError(f"bad {name} {value!r}: expected {DURATION_EXAMPLES}")
    if isinstance(value, str):
        text = value.strip().lower()
        seconds = _parse_text(text)
        if seconds is None:
            raise UsageError(f"bad {name} {value!r}: expected {DURATION_EXAMPLES}")
    else:
        seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise UsageError(f"bad {name} {value!r}: must be more than 0 ({DURATION_EXAMPLES})")
    if seconds > MAX_DURATION_SECONDS:
        raise UsageError(f"bad {name} {value!r}: longer than 1,000 years")
    return seconds


def _parse_text(text: str) -> float | None:
    if _NUMBER_RE.fullmatch(text):
        return float(text)
    total, pos, seen = 0.0, 0, set()
    for match in _PART_RE.finditer(text):
        if match.start() != pos or match.group(2) in seen:
            return None
        seen.add(match.group(2))
        total += float(match.group(1)) * DURATION_UNITS[match.group(2)]
        pos = match.end()
    return total if seen and pos == len(text) else None


@dataclasses.dataclass(frozen=True)
class PlanReport:
    """What ``plan`` found and computed. Seconds unless the name says hours or percent; None
    when its inputs are missing (:attr:`missing` says which flag gives them).

    Attributes:
        path: The checkpoint or directory given, or None.
        measured: What was read from it (size, bytes per role, cadence), or None.
        probe: The measured write (``--probe``), or None.
        save_seconds: Time per save (``--save-seconds``, else the probe's).
        every_seconds: Training time between saves (``--every``, else the directory's cadence).
        train_seconds: Training time (``--train-time``).
        job_limit_seconds: A job's wall-time limit (``--job-limit``).
        mtbf_seconds: Mean time between failures (``--mtbf``).
        keep: Checkpoints retained (``--keep``, else how many the directory holds).
        checkpoint_bytes: Bytes of one checkpoint's files.
        sources: Where each input came from: ``flag``, ``directory`` or ``probe``.
        saves: ``floor(train / every)``.
        overhead_seconds: ``saves x save``.
        overhead_hours: ``overhead_seconds / 3600``.
        overhead_percent: ``100 x overhead / train``: the share of the TRAINING time (the run
            takes ``train + overhead``: :attr:`run_hours`).
        run_hours: ``(train + overhead) / 3600``.
        lost_hours_expected: Work lost per failure on average: half an interval, ``every / 2``.
        lost_hours_worst: At worst (failing just before a save ends): ``every``.
        lost_hours_at_limit: Work lost when a job is killed at its limit (see
            :func:`compute_plan`).
        limit_cuts_save: The limit falls inside a save: that save is lost with its interval.
        saves_per_job: Saves completed within one job.
        jobs_needed: Jobs the run takes under the job limit (each resumes from the last save
            of the one before); None when no job completes a save (the run never ends).
        lost_hours_at_limits_total: ``(jobs_needed - 1) x lost_hours_at_limit``: the work
            lost at the limits of all the jobs but the last.
        warnings: What makes a figure doubtful (a probe far smaller than the checkpoint).
        disk_bytes: ``keep x checkpoint_bytes``.
        disk_bytes_peak: ``(keep + 1) x checkpoint_bytes``: a CheckpointManager writes the new
            checkpoint before it deletes the oldest.
        disk_free_bytes: Free space on the directory's filesystem, or None.
        recommended_every_seconds: Young/Daly: ``sqrt(2 x save x MTBF)``.
        recommended_every_steps: That interval in steps, from the directory's seconds per step.
        recommended_overhead_percent: ``100 x (save / T + T / (2 x MTBF))`` at that interval
            ``T``: the expected time saving plus lost to failures, as a share of useful work.
        waste_percent: The same at the chosen interval ``every``.
        failures_expected: ``(train + overhead) / MTBF``.
        lost_hours_total_expected: ``failures_expected x every / 2 / 3600``.
        missing: Input -> the flag that gives it, for every figure that could not be computed.
        notes: Remarks (a capped probe, a save cut by the job limit, an interval longer than
            the job), one line each.
    """

    path: str | None
    measured: Measured | None
    probe: ProbeResult | None
    save_seconds: float | None
    every_seconds: float | None
    train_seconds: float | None
    job_limit_seconds: float | None
    mtbf_seconds: float | None
    keep: int | None
    checkpoint_bytes: int | None
    sources: dict[str, str]
    saves: int | None = None
    overhead_seconds: float | None = None
    overhead_hours: float | None = None
    overhead_percent: float | None = None
    run_hours: float | None = None
    lost_hours_expected: float | None = None
    lost_hours_worst: float | None = None
    lost_hours_at_limit: float | None = None
    limit_cuts_save: bool | None = None
    saves_per_job: int | None = None
    jobs_needed: int | None = None
    lost_hours_at_limits_total: float | None = None
    disk_bytes: int | None = None
    disk_bytes_peak: int | None = None
    disk_free_bytes: int | None = None
    recommended_every_seconds: float | None = None
    recommended_every_steps: int | None = None
    recommended_overhead_percent: float | None = None
    waste_percent: float | None = None
    failures_expected: float | None = None
    lost_hours_total_expected: float | None = None
    missing: dict[str, str] = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The ``plan --format json`` document (docs/INTERFACE.md)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["measured"] = self.measured.to_dict() if self.measured else None
        out["probe"] = self.probe.to_dict() if self.probe else None
        out["notes"] = list(self.notes)
        out["warnings"] = list(self.warnings)
        return out


def _hours(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / SECONDS_PER_HOUR


def _fmt(seconds: float) -> str:
    """A duration in a note: ``30 min``, ``1.87 h``."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def compute_plan(
    *,
    save_seconds: float | None = None,
    every_seconds: float | None = None,
    train_seconds: float | None = None,
    job_limit_seconds: float | None = None,
    mtbf_seconds: float | None = None,
    keep: int | None = None,
    checkpoint_bytes: int | None = None,
    seconds_per_step: float | None = None,
    disk_free_bytes: int | None = None,
    path: str | None = None,
    measured: Measured | None = None,
    probe: ProbeResult | None = None,
    sources: dict[str, str] | None = None,
    notes: tuple[str, ...] = (),
) -> PlanReport:
    """The plan's arithmetic over known inputs (seconds, bytes); no I/O.

    * saves = ``floor(train / every)``; overhead = ``saves x save``; its share is of the
      training time: ``overhead / train`` (7 d, 20 s, 30 min: 336, 6,720 s = 1.87 h, 1.11%).
    * Work lost per failure: ``every / 2`` on average, ``every`` at worst.
    * At the job limit ``L``, in wall time (each save takes ``save`` seconds after ``every`` of
      training): ``k = floor(L / (every + save))`` saves complete; ``r = L - k (every + save)``
      is lost when ``r <= every``, else the limit cuts the next save and ``every`` is lost.
      Without a save time this is ``L mod every``.
    * Disk: ``keep x size``, peak ``(keep + 1) x size``.
    * Young/Daly: ``T = sqrt(2 x save x MTBF)``; expected overhead ``save / T + T / (2 MTBF)``.
    """
    sources = dict(sources or {})
    known = {"save_seconds": save_seconds, "every_seconds": every_seconds, "train_seconds": train_seconds,
             "job_limit_seconds": job_limit_seconds, "mtbf_seconds": mtbf_seconds, "keep": keep,
             "checkpoint_bytes": checkpoint_bytes}
    figures: dict[str, Any] = {}
    notes_out = list(notes)
    if train_seconds is not None and every_seconds is not None:
        figures["saves"] = saves = int(math.floor(train_seconds / every_seconds + EPSILON))
        if saves == 0:
            notes_out.append(f"the interval ({_fmt(every_seconds)}) is longer than the training"
                             f" ({_fmt(train_seconds)}): no save before it ends")
        if save_seconds is not None:
            overhead = saves * save_seconds
            figures.update(overhead_seconds=overhead, overhead_hours=_hours(overhead),
                           overhead_percent=100.0 * overhead / train_seconds,
                           run_hours=_hours(train_seconds + overhead))
    if every_seconds is not None:
        figures.update(lost_hours_expected=_hours(every_seconds / 2), lost_hours_worst=_hours(every_seconds))
    if every_seconds is not None and job_limit_seconds is not None:
        figures.update(_at_limit(every_seconds, job_limit_seconds, save_seconds, notes_out))
        if train_seconds is not None:
            figures.update(_jobs(train_seconds, every_seconds, job_limit_seconds, save_seconds,
                                 figures["saves_per_job"], figures["lost_hours_at_limit"], notes_out))
    warnings = []
    if probe is not None and probe.bytes_written * PROBE_FAR_SMALLER < probe.checkpoint_bytes:
        warnings.append(
            f"the probe wrote {probe.bytes_written:,} bytes, 1/{probe.checkpoint_bytes / probe.bytes_written:.0f} of the"
            f" checkpoint's {probe.checkpoint_bytes:,}: a write that small can run at cache or burst speed, so the"
            " time per save scaled from it may be too short; time a real save and pass --save-seconds")
    if checkpoint_bytes is not None and keep is not None:
        figures.update(disk_bytes=keep * checkpoint_bytes, disk_bytes_peak=(keep + 1) * checkpoint_bytes)
    if save_seconds is not None and mtbf_seconds is not None:
        best = math.sqrt(2.0 * save_seconds * mtbf_seconds)
        figures.update(recommended_every_seconds=best,
                       recommended_overhead_percent=100.0 * (save_seconds / best + best / (2.0 * mtbf_seconds)))
        if seconds_per_step:
            figures["recommended_every_steps"] = max(1, round(best / seconds_per_step))
        if every_seconds is not None:
            figures["waste_percent"] = 100.0 * (save_seconds / every_seconds + every_seconds / (2.0 * mtbf_seconds))
        if save_seconds * 2 > mtbf_seconds:
            notes_out.append("the save time is not small against the MTBF: the Young/Daly interval is only a rough guide")
        if job_limit_seconds is not None and best + save_seconds > job_limit_seconds:
            notes_out.append(f"the Young/Daly interval ({_fmt(best)}) does not fit in a job ({_fmt(job_limit_seconds)}):"
                             f" save at least every {_fmt(max(job_limit_seconds - save_seconds, 0.0))}")
    if mtbf_seconds is not None and train_seconds is not None:
        run = train_seconds + figures.get("overhead_seconds", 0.0)
        figures["failures_expected"] = failures = run / mtbf_seconds
        if every_seconds is not None:
            figures["lost_hours_total_expected"] = failures * _hours(every_seconds / 2)
    missing = {}
    for needs in NEEDS.values():
        for name in needs:
            if known[name] is None:
                missing[name] = HINTS[name]
    return PlanReport(
        path=path, measured=measured, probe=probe, checkpoint_bytes=checkpoint_bytes, sources=sources,
        disk_free_bytes=disk_free_bytes, missing=missing, notes=tuple(notes_out), warnings=tuple(warnings),
        **{k: v for k, v in known.items() if k != "checkpoint_bytes"}, **figures,
    )


def _jobs(train: float, every: float, limit: float, save: float | None, saves_per_job: int,
          lost_hours: float, notes: list[str]) -> dict[str, Any]:
    """How many jobs of ``limit`` the run takes, and the work lost at their limits in total.

    Each job but the last keeps ``saves_per_job x every`` of training (what follows its last
    save is lost at the limit); the last needs only to finish: it holds up to ``k' every`` plus
    what is left of its limit after ``k'`` whole cycles (at most one more ``every``, no save
    needed after the end).
    """
    cycle = every + (save or 0.0)
    if saves_per_job == 0:
        if train <= limit + EPSILON:
            return {"jobs_needed": 1, "lost_hours_at_limits_total": 0.0}
        notes.append("no job completes a save before its limit: the run never gets past its first job")
        return {"jobs_needed": None, "lost_hours_at_limits_total": None}
    whole = int(math.floor(limit / cycle + EPSILON))
    last_holds = whole * every + min(max(limit - whole * cycle, 0.0), every)
    kept_per_job = saves_per_job * every
    jobs = 1 + max(0, math.ceil((train - last_holds) / kept_per_job - EPSILON))
    return {"jobs_needed": jobs, "lost_hours_at_limits_total": (jobs - 1) * lost_hours}


def _at_limit(every: float, limit: float, save: float | None, notes: list[str]) -> dict[str, Any]:
    """Work lost when a job is killed at its wall-time limit (see :func:`compute_plan`)."""
    cycle = every + (save or 0.0)
    done = int(math.floor(limit / cycle + EPSILON))
    rest = max(limit - done * cycle, 0.0)
    if rest <= EPSILON * cycle:
        rest = 0.0
    cut = rest > every + EPSILON
    lost = every if cut else rest
    if save is None:
        notes.append("the job-limit figure counts saves as taking no time (pass --save-seconds or --probe)")
    if done == 0 and not cut:
        notes.append(f"a job ({_fmt(limit)}) ends before its first save: all of its work is lost at the limit")
    elif cut:
        notes.append(f"the job limit falls inside save {done + 1} (it would end {_fmt(done * cycle + cycle - limit)}"
                     " after the limit): that save and the interval before it are lost")
    return {"lost_hours_at_limit": _hours(lost), "limit_cuts_save": cut, "saves_per_job": done}


def plan(
    path: str | os.PathLike[str] | None = None,
    *,
    save_seconds: str | float | None = None,
    every: str | float | None = None,
    train_time: str | float | None = None,
    job_limit: str | float | None = None,
    mtbf: str | float | None = None,
    keep: int | None = None,
    probe: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> PlanReport:
    """Plan a run's checkpointing: saves, time spent saving and its share, work lost per failure
    and at the job limit, disk for the kept checkpoints, and the Young/Daly interval.

    Durations are seconds (numbers) or text such as ``30m``, ``7d``, ``1h30m``, ``20s``.

    Args:
        path: A checkpoint directory (its latest checkpoint's size and bytes per role, its
            cadence from state-file timestamps or file times, how many it keeps) or one
            checkpoint of any supported format; None to plan from the flags alone.
        save_seconds: Time per save. Default: measured by ``probe``.
        every: Training time between saves. Default: the directory's median interval.
        train_time: Training time of the whole run.
        job_limit: Wall-time limit of one job (a cluster's queue limit).
        mtbf: Mean time between failures (for the Young/Daly interval).
        keep: Checkpoints retained. Default: those the directory holds.
        probe: Write and fsync a temporary file of the checkpoint's size (at most 1 GiB) in the
            directory, then delete it: the time per save when ``save_seconds`` is not given.
        progress: Called as ``progress(written, total)`` while probing.

    Returns:
        The :class:`PlanReport`.

    Raises:
        UsageError: A bad duration or ``keep``, ``probe`` without a path, or nothing to plan.
        CkptError: The path is not a checkpoint; the probe could not write.
    """
    given = {
        "save_seconds": None if save_seconds is None else parse_duration(save_seconds, name="--save-seconds"),
        "every_seconds": None if every is None else parse_duration(every, name="--every"),
        "train_seconds": None if train_time is None else parse_duration(train_time, name="--train-time"),
        "job_limit_seconds": None if job_limit is None else parse_duration(job_limit, name="--job-limit"),
        "mtbf_seconds": None if mtbf is None else parse_duration(mtbf, name="--mtbf"),
    }
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise UsageError(f"bad --keep {keep!r}: expected a number of checkpoints, 1 or more")
    if path is None and probe:
        raise UsageError("--probe needs DIR: the checkpoint (or directory) whose storage to measure")
    if path is None and keep is None and all(v is None for v in given.values()):
        raise UsageError("nothing to plan: give DIR, or --train-time, --every and --save-seconds")
    sources = {k: SOURCE_FLAG for k, v in given.items() if v is not None}
    if keep is not None:
        sources["keep"] = SOURCE_FLAG
    measured = measure(os.fspath(path)) if path is not None else None
    notes: list[str] = []
    found: dict[str, Any] = {}
    if measured is not None:
        keep, found = _from_directory(measured, given, sources, keep)
    probed = _from_probe(measured, progress, given, sources, notes) if probe else None
    return compute_plan(**given, keep=keep, path=None if path is None else os.fspath(path), measured=measured,
                        probe=probed, sources=sources, notes=tuple(notes), **found)


def _from_directory(measured: Measured, given: dict[str, float | None], sources: dict[str, str],
                    keep: int | None) -> tuple[int | None, dict[str, Any]]:
    """What the checkpoint (or its directory) tells: the interval between saves and how many
    it keeps, where the flags left them (``sources`` says so), and the facts only it knows.

    Returns:
        (keep, the checkpoint's size, seconds per step and the free disk).
    """
    found: dict[str, Any] = {"checkpoint_bytes": measured.checkpoint_bytes}
    cadence = measured.cadence
    if given["every_seconds"] is None and cadence is not None and cadence.interval_seconds:
        given["every_seconds"] = cadence.interval_seconds
        sources["every_seconds"] = SOURCE_DIRECTORY
    if keep is None and cadence is not None:
        keep = measured.retained
        sources["keep"] = SOURCE_DIRECTORY
    found["seconds_per_step"] = cadence.seconds_per_step if cadence else None
    found["disk_free_bytes"] = _free_bytes(measured.directory)
    return keep, found


def _from_probe(measured: Measured, progress: Callable[[int, int], None] | None, given: dict[str, float | None],
                sources: dict[str, str], notes: list[str]) -> ProbeResult:
    """Write a checkpoint's worth beside it: the time per save unless ``--save-seconds`` gave
    one (then noted beside it), and a note when the probe wrote less than the checkpoint."""
    probed = probe_write(measured.directory, measured.checkpoint_bytes, progress=progress)
    if probed.capped:
        notes.append(f"the probe wrote {probed.bytes_written} of the checkpoint's {probed.checkpoint_bytes}"
                     " bytes (its cap): the time per save is scaled from it")
    if given["save_seconds"] is None:
        given["save_seconds"] = probed.save_seconds
        sources["save_seconds"] = SOURCE_PROBE
    else:
        notes.append("--save-seconds is used; the probe's time per save is shown beside it")
    return probed


def _free_bytes(directory: str) -> int | None:
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize
