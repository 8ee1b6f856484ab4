"""Rendering of ``scan``: the table / JSON / CSV views and the ``--plot`` PNG.

Like :mod:`ckptinspect.render` (whose helpers it uses), it imports nothing of the package but
the model and the renderer; matplotlib is imported only when a plot is asked for.
"""

from __future__ import annotations

import io
import math
from typing import Any

from .. import model as m
from ._core import (
    AUTO,
    OutputFormat,
    fmt_shape,
    _table_lines,
    fit_lines,
    fmt_float,
    render,
    terminal_width,
)

__all__ = ["scan_view", "scan_plot", "scan_figure", "PlotUnavailable", "PLOT_TOP_LAYERS"]

PLOT_TOP_LAYERS = 8  # layers labelled (and coloured) in the plot: the largest relative changes
PLOT_SIZE = (11, 8)  # inches
PLOT_DPI = 100
PLAIN_TICK_DECADES = 2.0  # a log axis spanning up to this many decades gets plain tick labels
TAB10_RED = 3  # the palette's red, kept for NaN/Inf
NO_CHANGE = " (no change)"  # a legend label's mark: a layer whose relative change is 0 throughout
SCAN_CSV_COLUMNS = ["step", "number", "path", "status", "name", "layer", "role", "shape", "dtype", "norm", "nan", "inf",
                    "max_abs_change", "rel_change", "cosine"]
MAX_HEALTH_SHOWN = 20  # health lines shown in a table (JSON lists them all)


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _step_text(step: Any) -> str:
    return "-" if step is None else str(step)


def _place(s) -> str:
    """A checkpoint's place in the run for the step column: its training step, else its number
    as what it is (``epoch 3``, ``checkpoint 7``), else ``-``."""
    if s.step is not None:
        return str(s.step)
    return m.place_in_run(None, s.number, s.number_source) or "-"


def _at(s) -> str:
    """``step 24``, ``epoch 3``... for sentences; ``step -`` when nothing places it."""
    return m.place_in_run(s.step, s.number, s.number_source) or "step -"


def _total(step) -> tuple[float | None, int, int]:
    """Whole-checkpoint norm (all scanned variables together), NaN and Inf counts."""
    norms = [x.figures.norm for x in step.layers]
    norm = None if not norms else math.sqrt(sum(n * n for n in norms)) if all(math.isfinite(n) for n in norms) else math.nan
    figures = [v.figures for v in step.variables if v.figures is not None]
    return norm, sum(f.nan for f in figures), sum(f.inf for f in figures)


def _widest_change(step) -> tuple[str, float | None]:
    changes = [(x.layer or "(top)", x.figures.rel_change) for x in step.layers if x.figures.rel_change is not None]
    if not changes:
        return "-", None
    if any(math.isnan(r) for _, r in changes):
        return next(name for name, r in changes if math.isnan(r)), math.nan
    return max(changes, key=lambda c: c[1])


def scan_view(report, fmt: OutputFormat, width: int | None = AUTO) -> str:
    """Render a :class:`~ckptinspect.ops.scan.operation.ScanReport`.

    Table: the verdict, one row per checkpoint (step, status, norm, the layer that changed
    most, NaN/Inf), then health problems and drift. CSV: one row per (step, variable). JSON:
    the report's document.
    """
    if fmt == OutputFormat.csv:
        rows = [{"step": s.step, "number": s.number, "path": s.path, "status": s.status, **v.to_dict(), "shape": fmt_shape(v.shape)}
                for s in report.steps for v in s.variables]
        return render(fmt, doc={}, rows=rows, columns=[(k, k) for k in SCAN_CSV_COLUMNS])
    if fmt != OutputFormat.table:  # json: the document only (no rows built)
        return render(fmt, doc=report.to_dict(), rows=(), columns=())
    if width == AUTO:
        width = terminal_width()
    first = report.first_nonfinite
    n = len(report.steps)
    if report.healthy:
        verdict = f"HEALTHY: {n} checkpoint{'s' if n != 1 else ''}, no NaN/Inf, no directory problem"
    else:
        parts = []
        if first is not None:
            parts.append(f"non-finite values from {_at(first)}")
        if report.health:
            parts.append(f"{len(report.health)} health problem{'s' if len(report.health) != 1 else ''}")
        verdict = "UNHEALTHY: " + ", ".join(parts)
    header = [f"source:  {' '.join(report.source)}", f"series:  {report.series}",
              f"role:    {report.role or 'all'}", f"verdict: {verdict}"]
    if first is not None:
        names = first.nonfinite
        shown = ", ".join(names[:5]) + (f" (+{len(names) - 5} more)" if len(names) > 5 else "")
        header.append(f"first non-finite: {_at(first)} ({first.path}): {shown}")
    table_rows = []
    for s in report.steps:
        norm, nan, inf = _total(s)
        layer, rel = _widest_change(s)
        table_rows.append([_place(s), s.path, s.status, fmt_float(norm), layer, fmt_float(rel),
                           nan, inf])
    lines = list(fit_lines(header, width)) + ["", "steps:"]
    lines += _table_lines(["step", "checkpoint", "status", "norm", "most changed layer", "rel change", "nan", "inf"],
                          table_rows, width=width, squeeze=[1, 4])
    if report.health:
        lines += ["", "health:"]
        shown = report.health[:MAX_HEALTH_SHOWN]
        lines += fit_lines([f"  {p.kind}: {p.problem}" for p in shown], width)
        if len(report.health) > MAX_HEALTH_SHOWN:
            lines.append(f"  (+{len(report.health) - MAX_HEALTH_SHOWN} more; --format json lists them all)")
    if report.drift:
        lines += ["", "drift:"]
        lines += fit_lines([f"  {d.layer} ({d.kind}): {d.detail}" for d in report.drift], width)
    return "\n".join(lines) + "\n"


def _x_axis(report) -> tuple[list[float], str]:
    """Each checkpoint's x and the axis' label (the rule every command places checkpoints by,
    :func:`~ckptinspect.model.run_positions`): training steps, else the numbers in the names,
    else positions."""
    positions, axis = m.run_positions([s.step for s in report.steps], [s.number for s in report.steps])
    if axis is None:
        return [float(i) for i in range(len(report.steps))], "checkpoint (in order)"
    if axis == "step":
        return [float(x) for x in positions], "step"
    kinds = {(s.number_source or "").partition(":")[2] for s in report.steps}
    label = {"checkpoint": "checkpoint number", "epoch": "epoch", "step": "step (from the names)"}.get(
        kinds.pop() if len(kinds) == 1 else "", "number in the name")
    return [float(x) for x in positions], label


def _layer_series(report) -> tuple[list[float], dict[str, list[tuple[float, float, float | None]]]]:
    """Per layer, (x, norm, rel change) over the checkpoints (x: :func:`_x_axis`)."""
    out: dict[str, list[tuple[float, float, float | None]]] = {}
    xs, _ = _x_axis(report)
    for x, s in zip(xs, report.steps):
        for layer in s.layers:
            out.setdefault(layer.layer or "(top)", []).append((x, layer.figures.norm, layer.figures.rel_change))
    return xs, out


def scan_plot(report) -> bytes:
    """The ``--plot`` PNG (:func:`scan_figure`, drawn).

    Returns:
        The PNG's bytes.

    Raises:
        PlotUnavailable: matplotlib is not installed.
    """
    fig = scan_figure(report)
    import matplotlib.pyplot as plt  # noqa: PLC0415 - loaded by scan_figure

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=PLOT_DPI)
    finally:
        plt.close(fig)
    return buf.getvalue()


def _pyplot() -> Any:
    try:
        import matplotlib  # noqa: PLC0415 - an optional extra

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'ckptinspect[plot]'") from None
    return plt


def _plain_log_ticks(ax: Any, values: list[float]) -> None:
    """Plain tick labels (``4``, ``0.0105``) on a log axis whose values span at most
    :data:`PLAIN_TICK_DECADES` decades, where matplotlib labels minor ticks ``4×10⁰``: nice
    linear values within a decade, 1-2-5 steps across one or two; wider ranges keep powers of ten."""
    from matplotlib import ticker  # noqa: PLC0415 - matplotlib only for --plot

    if not values:
        return
    lo, hi = min(values), max(values)
    decades = math.log10(hi / lo) if lo > 0 else math.inf
    if decades > PLAIN_TICK_DECADES:
        return
    locator = ticker.MaxNLocator(nbins=5) if decades < 1 else ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0))
    ax.yaxis.set_major_locator(locator)
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())


def scan_figure(report) -> Any:
    """The ``--plot`` figure: per-layer norm (top) and relative change (bottom) over steps, log
    scale, the :data:`PLOT_TOP_LAYERS` layers with the largest relative change coloured and
    labelled (the rest thin grey), the first non-finite step marked by a red dashed line.

    The legend lists the labelled layers from the largest change down; a layer that never
    changed (a frozen one: a relative change of 0 has no place on a log scale, so no line in
    the lower panel) comes last, marked ``(no change)``; then the red line and the non-finite
    markers. Labels stay in the legend, off the data. Axes spanning a decade or two have plain
    tick labels (:func:`_plain_log_ticks`), steps whole numbers.

    Returns:
        A matplotlib ``Figure`` (pyplot's: close it with ``plt.close(fig)``).

    Raises:
        PlotUnavailable: matplotlib is not installed.
    """
    plt = _pyplot()
    from matplotlib.lines import Line2D  # noqa: PLC0415
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415

    xs, layers = _layer_series(report)

    def peak(points) -> float:
        rels = [r for _, _, r in points if r is not None and math.isfinite(r)]
        return max(rels) if rels else -1.0

    ranked = sorted(layers, key=lambda name: peak(layers[name]), reverse=True)
    top = ranked[:PLOT_TOP_LAYERS]
    fig, (ax_norm, ax_rel) = plt.subplots(2, 1, figsize=PLOT_SIZE, sharex=True, constrained_layout=True)
    palette = [c for i, c in enumerate(plt.get_cmap("tab10").colors) if i != TAB10_RED]  # red marks NaN/Inf
    entries: list[tuple[tuple[bool, int], str, Any]] = []
    drawn: dict[Any, list[float]] = {ax_norm: [], ax_rel: []}
    for name in reversed(ranked):  # the labelled ones drawn last, on top
        pts = layers[name]
        highlight = name in top
        colour = palette[top.index(name) % len(palette)] if highlight else "0.75"
        style = dict(color=colour, linewidth=1.8, marker="o", markersize=3) if highlight \
            else dict(color=colour, linewidth=0.8)
        norms = [(x, n) for x, n, _ in pts if math.isfinite(n) and n > 0]
        if norms:
            ax_norm.plot(*zip(*norms), **style)
            drawn[ax_norm] += [n for _, n in norms]
        rels = [(x, r) for x, _, r in pts if r is not None and math.isfinite(r) and r > 0]
        if rels:
            ax_rel.plot(*zip(*rels), **style)
            drawn[ax_rel] += [r for _, r in rels]
        if highlight:
            unchanged = peak(pts) == 0.0
            entries.append(((unchanged, top.index(name)), name + (NO_CHANGE if unchanged else ""), Line2D([], [], **style)))
    # The largest change first, layers that never changed last (they have no line below).
    labelled = [(label, handle) for _, label, handle in sorted(entries)]
    ax_norm.set_yscale("log")
    ax_rel.set_yscale("log")
    ax_norm.set_ylabel("L2 norm")
    ax_rel.set_ylabel("relative change ||w - w_prev|| / ||w_prev||")
    ax_rel.set_xlabel(_x_axis(report)[1])
    ax_rel.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers: no 2.5
    for ax, values in drawn.items():
        _plain_log_ticks(ax, values)
    others = len(layers) - len(top)
    ax_norm.set_title(f"{' '.join(report.source)}: {len(report.steps)} checkpoints, {len(layers)} layers"
                      + (f" ({others} more in grey)" if others > 0 else ""))
    first = report.first_nonfinite
    if first is not None:
        x = xs[report.steps.index(first)]
        line = dict(color="red", linestyle="--", linewidth=1.5)
        for ax in (ax_norm, ax_rel):
            ax.axvline(x, **line)
        labelled.append((f"first NaN/Inf: {_at(first)}", Line2D([], [], **line)))
    bad = [(x, name) for name, pts in layers.items() for x, n, _ in pts if not math.isfinite(n)]
    if bad:  # a layer whose values are non-finite has no norm to draw: a red x at the top of the panel
        marks = ax_norm.scatter([x for x, _ in bad], [0.97] * len(bad), transform=ax_norm.get_xaxis_transform(),
                                marker="x", color="red", zorder=5)
        labelled.append((f"NaN/Inf ({len({n for _, n in bad})} layers)", marks))
    for d in report.drift:
        at = next((x for x, s in zip(xs, report.steps) if s.path == d.path), None)
        if d.kind == "jumped" and at is not None and d.rel_change:
            ax_rel.annotate("jump", xy=(at, d.rel_change), xytext=(0, 8), textcoords="offset points",
                            ha="center", color="darkred", fontsize=8)
    if labelled:
        ax_norm.legend([h for _, h in labelled], [label for label, _ in labelled], loc="upper left",
                       bbox_to_anchor=(1.01, 1.0), fontsize=8, title="largest changes")
    for ax in (ax_norm, ax_rel):
        ax.grid(True, which="major", alpha=0.3)
    return fig
