"""The view of ``plan``: figures, how each was obtained, what is missing."""

from __future__ import annotations


from ._core import (
    AUTO,
    Column,
    OutputFormat,
    human_bytes,
    render,
    to_json,
)

__all__ = ['human_duration', 'plan_view']


# -- plan (issue 17) ---------------------------------------------------------------------------
PLAN_SOURCES = {"flag": "", "directory": "from DIR", "probe": "from --probe"}
PLAN_DIRECTORY_SOURCES = {"every_seconds": "from DIR's cadence", "keep": "from DIR (checkpoints it holds)"}
PLAN_FLAGS = {"save_seconds": "--save-seconds", "every_seconds": "--every", "train_seconds": "--train-time",
              "job_limit_seconds": "--job-limit", "mtbf_seconds": "--mtbf", "keep": "--keep",
              "checkpoint_bytes": "DIR"}


def human_duration(seconds: float | None) -> str:
    """``6720`` -> ``1.87 h``; ``1800`` -> ``30 min``; ``604800`` -> ``7 d`` (days from 2 d on)."""
    if seconds is None:
        return "-"
    value, unit = seconds, "s"
    for name, size, start in (("d", 86400.0, 2 * 86400.0), ("h", 3600.0, 3600.0), ("min", 60.0, 60.0)):
        if seconds >= start:
            value, unit = seconds / size, name
            break
    return f"{_plan_number(value)} {unit}"


def _plan_number(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def _plan_percent(x: float | None) -> str:
    return "-" if x is None else f"{_plan_number(x)}%"


def plan_view(report, fmt: OutputFormat, width: int | None = AUTO) -> str:
    """Render a :class:`~ckptinspect.ops.plan.operation.PlanReport`: what was measured, then one row per
    input and figure (value, and how it was obtained or computed)."""
    if fmt == OutputFormat.json:
        return to_json(report.to_dict()) + "\n"
    header = []
    m, probe = report.measured, report.probe
    if m is not None:
        roles = ", ".join(f"{r} {human_bytes(n)}" for r, n in m.role_bytes.items())
        header.append(f"path:       {m.path} ({m.format})")
        header.append(f"checkpoint: {m.checkpoint}: {human_bytes(m.checkpoint_bytes)} in {len(m.files)}"
                      f" file{'s' if len(m.files) != 1 else ''} ({roles})")
        c = m.cadence
        if c is not None:
            if c.interval_seconds is not None:
                steps = f", {_plan_number(c.interval_steps)} steps" if c.interval_steps is not None else ""
                per_step = f", {human_duration(c.seconds_per_step)} per step" if c.seconds_per_step else ""
                header.append(f"cadence:    every {human_duration(c.interval_seconds)}{steps}{per_step} (median of"
                              f" {c.intervals} interval{'s' if c.intervals != 1 else ''}, {c.time_source} times,"
                              f" {len(c.points)} checkpoints)")
            else:
                steps = f"every {_plan_number(c.interval_steps)} steps, " if c.interval_steps is not None else ""
                header.append(f"cadence:    {steps}time unknown (no two of its {len(c.points)} checkpoint"
                              f"{'s' if len(c.points) != 1 else ''} have distinct save times)")
        header += [f"warning:    {w}" for w in m.warnings]
    if probe is not None:
        header.append(f"probe:      wrote and fsync'd {human_bytes(probe.bytes_written)} in {probe.directory} in"
                      f" {human_duration(probe.seconds)} ({human_bytes(int(probe.bytes_per_second))}/s)"
                      f"{', scaled to the checkpoint' if probe.capped else ''}: {human_duration(probe.save_seconds)}"
                      " per save (file removed)")
    header += [f"warning:    {w}" for w in report.warnings]
    r = report

    def how(name: str) -> str:
        source = r.sources.get(name)
        if source == "flag":
            return PLAN_FLAGS[name]
        if source == "directory":
            return PLAN_DIRECTORY_SOURCES.get(name, PLAN_SOURCES[source])
        return PLAN_SOURCES.get(source or "", "")

    rows = [
        ("time per save", human_duration(r.save_seconds), how("save_seconds")),
        ("interval (every)", human_duration(r.every_seconds), how("every_seconds")),
        ("training time", human_duration(r.train_seconds), how("train_seconds")),
        ("job limit", human_duration(r.job_limit_seconds), how("job_limit_seconds")),
        ("MTBF", human_duration(r.mtbf_seconds), how("mtbf_seconds")),
        ("checkpoints kept", "-" if r.keep is None else r.keep, how("keep")),
        ("checkpoint size", human_bytes(r.checkpoint_bytes), "from DIR" if r.checkpoint_bytes is not None else ""),
        ("saves", "-" if r.saves is None else r.saves, "floor(train / every)"),
        ("time saving", "-" if r.overhead_seconds is None else
         f"{human_duration(r.overhead_seconds)} ({_plan_number(r.overhead_seconds)} s)", "saves x save"),
        ("share of training time", _plan_percent(r.overhead_percent), "saving / train"),
        ("run time", "-" if r.run_hours is None else human_duration(r.run_hours * 3600), "train + saving"),
        ("lost per failure", "-" if r.lost_hours_expected is None else
         f"{human_duration(r.lost_hours_expected * 3600)} expected, {human_duration(r.lost_hours_worst * 3600)} at worst",
         "every / 2, every"),
        ("lost at job limit", "-" if r.lost_hours_at_limit is None else
         human_duration(r.lost_hours_at_limit * 3600) + (" (a save cut)" if r.limit_cuts_save else ""),
         "limit - saves done x (every + save)"),
        ("saves per job", "-" if r.saves_per_job is None else r.saves_per_job, "floor(limit / (every + save))"),
        ("jobs needed", "-" if r.jobs_needed is None else r.jobs_needed,
         "train / (saves per job x every)"),
        ("lost at job limits", "-" if r.lost_hours_at_limits_total is None else
         human_duration(r.lost_hours_at_limits_total * 3600), "(jobs - 1) x lost at job limit"),
        ("disk for kept", "-" if r.disk_bytes is None else
         f"{human_bytes(r.disk_bytes)} ({human_bytes(r.disk_bytes_peak)} while saving)", "keep x size, (keep + 1) x size"),
        ("disk free", human_bytes(r.disk_free_bytes), "DIR's filesystem" if r.disk_free_bytes is not None else ""),
        ("Young/Daly interval", "-" if r.recommended_every_seconds is None else
         human_duration(r.recommended_every_seconds)
         + (f" ({r.recommended_every_steps} steps)" if r.recommended_every_steps is not None else ""),
         "sqrt(2 x save x MTBF)"),
        ("overhead at that interval", _plan_percent(r.recommended_overhead_percent), "save / T + T / (2 MTBF)"),
        ("overhead at every", _plan_percent(r.waste_percent), "save / every + every / (2 MTBF)"),
        ("failures expected", "-" if r.failures_expected is None else _plan_number(r.failures_expected),
         "(train + saving) / MTBF"),
        ("lost to failures", "-" if r.lost_hours_total_expected is None else
         human_duration(r.lost_hours_total_expected * 3600), "failures x every / 2"),
    ]
    footer = [f"missing:    {hint}" for hint in r.missing.values()]
    footer += [f"note:       {n}" for n in r.notes]
    columns: list[Column] = [("figure", "figure"), ("value", "value"), ("how", "how")]
    return render(fmt, doc={}, rows=[dict(zip(("figure", "value", "how"), row)) for row in rows], columns=columns,
                  header=header, footer=[""] + footer if footer else [], squeeze=("how",), width=width)
