"""The only formatting code: rows to table / JSON / CSV, sizes and shapes for people.

Every listing command builds one JSON document and one list of row dicts, and calls
:func:`render` with the chosen :class:`OutputFormat`.

Names come from files other people wrote, so they are shown safely:

* tables (and the CLI's ``Error:`` line) show control characters as visible escapes
  (``\\x1b``, ``\\n``, ``\\r``, ``\\t``, bidirectional overrides as ``\\u202e``), so a
  name can neither clear the screen nor break a row;
* CSV cells that a spreadsheet would run as a formula (starting with ``= + - @``, a tab or a
  carriage return, and not a plain number) get a leading ``'`` (OWASP's advice);
* JSON stays exact (``json`` escapes control characters itself).

Tables fit the terminal: when stdout is a terminal, or ``COLUMNS`` is set, a table wider than
the width shortens its name columns with a middle ellipsis (``enc…/kernel``) and wraps long
header lines; piped output with ``COLUMNS`` unset keeps full names, for scripts that grep.
JSON and CSV are never shortened.
"""

from __future__ import annotations

import csv
import enum
import io
import json
import math
import os
import re
import shutil
import sys
import textwrap
import unicodedata
from typing import Any, Iterable, Sequence

from .model import display_name, format_shape

__all__ = [
    "OutputFormat",
    "render",
    "human_bytes",
    "fmt_shape",
    "fmt_float",
    "Column",
    "escape_controls",
    "csv_safe",
    "middle_ellipsis",
    "terminal_width",
    "simple_table",
    "progress_line",
]


class OutputFormat(str, enum.Enum):
    """``--format`` of every listing command."""

    table = "table"
    json = "json"
    csv = "csv"


Column = tuple[str, str]  # (row key, table header)
UNREADABLE_MARK = " (unreadable)"  # after the dtype of an ls row whose entry TensorFlow cannot read

AUTO = -1  # width=AUTO: the terminal's width (see terminal_width); width=None: no fitting
ELLIPSIS = "\u2026"
MIN_SQUEEZED_WIDTH = 16  # a name column is never shortened below this (or its header)
MIN_WRAPPED_WIDTH = 24  # a wrapped last column (a problem's text) keeps at least this
COLUMN_GAP = "  "
# C0 and C1 controls, DEL, and the invisible bidirectional / line-separator marks that can
# reorder or break what a terminal shows.
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
CSV_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
CSV_GUARD = "'"
_PLAIN_NUMBER_RE = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:inf|nan)|-")
_LABEL_RE = re.compile(r"^([^\s:][^:]{0,24}:\s+)\S")  # "path:    ", "note:     "...
PROGRESS_BAR = 30
PROGRESS_MIN_BAR = 10


def escape_controls(text: Any) -> str:
    """``text`` with control characters as visible escapes (``\\x1b``, ``\\n``, ``\\u202e``),
    and bytes of a key that are not UTF-8 as ``\\xff`` (:func:`~ckptinspect.model.display_name`)."""
    s = display_name(str(text))
    if not _CONTROL_RE.search(s):
        return s
    return _CONTROL_RE.sub(_escape_one, s)


def _escape_one(match: re.Match[str]) -> str:
    c = match.group()
    return _NAMED_ESCAPES.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def csv_safe(value: Any) -> Any:
    """A CSV cell a spreadsheet will not run: ``'`` before a text starting with ``= + - @``,
    a tab or a carriage return (plain numbers such as ``-0.5`` stay as they are)."""
    if isinstance(value, str) and value.startswith(CSV_FORMULA_STARTS) and not _PLAIN_NUMBER_RE.fullmatch(value):
        return CSV_GUARD + value
    return value


def display_width(s: str) -> int:
    """Terminal columns ``s`` takes (wide East Asian characters take two, combining marks none)."""
    if s.isascii():
        return len(s)
    return sum(_char_width(c) for c in s)


def _char_width(c: str) -> int:
    if unicodedata.combining(c):
        return 0
    return 2 if unicodedata.east_asian_width(c) in "WF" else 1


def _pad(s: str, width: int) -> str:
    return s + " " * (width - display_width(s))


def middle_ellipsis(s: str, width: int) -> str:
    """``s`` shortened to ``width`` columns by an ellipsis in the middle (the end, which holds
    the leaf name or file name, keeps two thirds)."""
    if display_width(s) <= width:
        return s
    if width <= 1:
        return ELLIPSIS[:width]
    head_room = (width - 1) // 3
    tail_room = width - 1 - head_room
    if s.isascii():
        return s[:head_room] + ELLIPSIS + s[len(s) - tail_room:]
    head, used = [], 0
    for c in s:
        w = _char_width(c)
        if used + w > head_room:
            break
        head.append(c)
        used += w
    tail, used = [], 0
    for c in reversed(s):
        w = _char_width(c)
        if used + w > tail_room:
            break
        tail.append(c)
        used += w
    return "".join(head) + ELLIPSIS + "".join(reversed(tail))


def terminal_width() -> int | None:
    """The width tables fit: ``COLUMNS`` when set, else the terminal's when stdout is one,
    else None (full names, for scripts)."""
    columns = os.environ.get("COLUMNS", "")
    if columns.strip().isdigit() and int(columns) > 0:
        return int(columns)
    try:
        if sys.stdout.isatty():
            return shutil.get_terminal_size().columns
    except (AttributeError, ValueError, OSError):
        pass
    return None


class _Fitted(str):
    """A line already escaped and fitted (a row of a table in a header): never wrapped."""


def _table_lines(*args: Any, **kwargs: Any) -> list[str]:
    """:func:`simple_table` as lines to put in a header."""
    return [_Fitted(line) for line in simple_table(*args, **kwargs).splitlines()]


def fit_lines(lines: Iterable[str], width: int | None) -> list[str]:
    """Text lines with control characters escaped, and, given a ``width``, longer lines
    wrapped under their label (``totals:  ...`` continues under its value)."""
    out: list[str] = []
    for line in lines:
        if isinstance(line, _Fitted):
            out.append(line)
            continue
        line = escape_controls(line)
        if width is None or display_width(line) <= width:
            out.append(line)
            continue
        match = _LABEL_RE.match(line)
        label = match.group(1) if match and len(match.group(1)) < width // 2 else ""
        out += _wrap(line[len(label):], width - len(label), label, " " * (len(label) or 2))
    return out


def _wrap(body: str, room: int, first: str, indent: str) -> list[str]:
    """``body`` in lines of ``room`` columns, the first after ``first`` and the others after
    ``indent``: after the commas of a list (``a 1 (2 B), b 3 (4 B)``) when every item fits,
    else at spaces, a word longer than a line (a path) cut where the line ends."""
    items = body.split(", ")
    if len(items) > 1 and all(display_width(item) + 1 <= room for item in items):
        lines = [items[0]]
        for item in items[1:]:
            if display_width(lines[-1]) + 2 + display_width(item) + 1 <= room:
                lines[-1] += ", " + item
            else:
                lines[-1] += ","
                lines.append(item)
    else:
        lines = textwrap.wrap(body, width=max(room, 1), break_long_words=True, break_on_hyphens=False) or [body]
    return [first + lines[0], *(indent + line for line in lines[1:])]


def human_bytes(n: int | None) -> str:
    """``1536`` -> ``1.5 KiB``."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def fmt_shape(shape: Sequence[int]) -> str:
    """``(16, 4)`` -> ``[16,4]`` (:func:`ckptinspect.model.format_shape`, the one spelling)."""
    return format_shape(shape)


def fmt_float(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return str(x)
    return f"{x:.{digits}g}"


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if isinstance(obj, bytes):
        return obj.decode("utf-8", "replace")
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _clean(obj: Any) -> Any:
    """Non-finite floats become strings so the document is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def to_json(doc: dict[str, Any]) -> str:
    return json.dumps(_clean(doc), indent=2, default=_json_default, allow_nan=False)


def render(
    fmt: OutputFormat,
    *,
    doc: dict[str, Any],
    rows: Iterable[dict[str, Any]],
    columns: Sequence[Column],
    header: Sequence[str] = (),
    footer: Sequence[str] = (),
    csv_columns: Sequence[str] | None = None,
    squeeze: Sequence[str] = ("name",),
    optional: Sequence[str] = (),
    wrap_last: bool = False,
    width: int | None = AUTO,
) -> str:
    """Render one listing.

    Args:
        fmt: table, json or csv.
        doc: The whole JSON document (used for ``json``).
        rows: One dict per row (used for ``table`` and ``csv``).
        columns: (row key, header) pairs of the table.
        header: Lines printed above the table (one line each; wrapped to the width).
        footer: Lines printed below the table.
        csv_columns: Row keys for CSV (default: the table's keys).
        squeeze: Row keys of the table columns that may be shortened to fit the width.
        optional: Row keys of table columns that may be left out, in this order, when the
            table does not fit even with its names shortened.
        wrap_last: The table's last column is free text: wrap it onto continuation lines.
        width: Columns to fit the table into (default: :func:`terminal_width`).

    Returns:
        The text, ending with a newline.
    """
    if fmt == OutputFormat.json:
        return to_json(doc) + "\n"
    rows = list(rows)
    if fmt == OutputFormat.csv:
        keys = list(csv_columns or [k for k, _ in columns])
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=keys, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv_cell(row.get(k)) for k in keys})
        return buf.getvalue()
    if width == AUTO:
        width = terminal_width()
    parts = fit_lines(header, width)
    if rows:
        keys = [k for k, _ in columns]
        table = simple_table([h for _, h in columns], [[row.get(k, "") for k in keys] for row in rows], width=width,
                             squeeze=[keys.index(k) for k in squeeze if k in keys],
                             optional=[keys.index(k) for k in optional if k in keys], wrap_last=wrap_last)
        parts += ["", table] if header else [table]
    parts += fit_lines(footer, width)
    return "\n".join(parts) + "\n"


def _table_width(widths: Sequence[int]) -> int:
    return sum(widths) + len(COLUMN_GAP) * (len(widths) - 1)


def _fit_widths(headers: Sequence[str], content: Sequence[int], squeeze: Sequence[int], wrap_last: bool,
                width: int) -> list[int]:
    """Column widths fitting ``width``: no header padding; then a wrappable last column
    narrowed (to no less than :data:`MIN_WRAPPED_WIDTH`); then the widest squeezable column
    shortened first, none below its floor."""
    widths = [max(display_width(h), c) for h, c in zip(headers, content)]
    if wrap_last and _table_width(widths) > width:
        room = width - _table_width(widths[:-1]) - len(COLUMN_GAP)
        widths[-1] = min(widths[-1], max(room, MIN_WRAPPED_WIDTH, display_width(headers[-1])))
    floors = {i: max(MIN_SQUEEZED_WIDTH, display_width(headers[i])) for i in squeeze}
    excess = _table_width(widths) - width
    while excess > 0:
        candidates = [i for i in squeeze if widths[i] > floors[i]]
        if not candidates:
            break
        widest = max(candidates, key=lambda i: widths[i])
        others = [widths[i] for i in candidates if i != widest]
        step = min(excess, widths[widest] - floors[widest],
                   max(1, widths[widest] - max(others)) if others else excess)
        widths[widest] -= step
        excess -= step
    if wrap_last and excess < 0 and widths[-1] < content[-1]:  # room left by the shortened names
        widths[-1] = min(content[-1], widths[-1] - excess)
    return widths


def simple_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    width: int | None = None,
    squeeze: Sequence[int] = (),
    optional: Sequence[int] = (),
    wrap_last: bool = False,
) -> str:
    """The layout of tabulate's ``simple`` format (cells as strings, left-aligned), built in
    one pass: listings have thousands of rows and tabulate costs ~25 us a row.

    Cells are shown with control characters escaped. Given a ``width``, a wider table drops
    its header padding, wraps its last column onto continuation lines (``wrap_last``, for
    free text), shortens the ``squeeze`` columns (indexes) with a middle ellipsis, and if that
    is not enough leaves out the ``optional`` columns in order (a last line says so).
    """
    headers = [escape_controls(h) for h in headers]
    cells = [["" if c is None else escape_controls(c) for c in row] for row in rows]
    keep = list(range(len(headers)))
    hidden: list[str] = []
    content = [0] * len(headers)
    for row in cells:
        for i, c in enumerate(row):
            w = display_width(c)
            if w > content[i]:
                content[i] = w
    widths = [max(display_width(h) + 2, c) for h, c in zip(headers, content)]
    wrap = False
    if width is not None and _table_width(widths) > width:
        pending = [i for i in optional if 0 <= i < len(headers)]
        while True:
            wrap = wrap_last and keep[-1] == len(headers) - 1
            widths = _fit_widths([headers[i] for i in keep], [content[i] for i in keep],
                                 [keep.index(i) for i in squeeze if i in keep], wrap, width)
            if _table_width(widths) <= width or not pending:
                break
            dropped = pending.pop(0)
            keep.remove(dropped)
            hidden.append(headers[dropped])
        headers = [headers[i] for i in keep]
        cells = [[row[i] for i in keep] for row in cells]
        last = len(keep) - 1
        for row in cells:
            for i, c in enumerate(row):
                if display_width(c) > widths[i] and not (wrap and i == last):
                    row[i] = middle_ellipsis(c, widths[i])
        headers = [middle_ellipsis(h, w) for h, w in zip(headers, widths)]
    lines = [COLUMN_GAP.join(_pad(h, w) for h, w in zip(headers, widths)).rstrip(),
             COLUMN_GAP.join("-" * w for w in widths)]
    for row in cells:
        if wrap and display_width(row[-1]) > widths[-1]:
            pieces = textwrap.wrap(row[-1], width=widths[-1], break_long_words=True, break_on_hyphens=False)
            offset = " " * (_table_width(widths[:-1]) + len(COLUMN_GAP))
            lines.append(COLUMN_GAP.join(_pad(c, w) for c, w in zip(row[:-1] + [pieces[0]], widths)).rstrip())
            lines += [offset + piece for piece in pieces[1:]]
        else:
            lines.append(COLUMN_GAP.join(_pad(c, w) for c, w in zip(row, widths)).rstrip())
    if hidden:
        lines.append(f"(left out to fit {width} columns: {', '.join(hidden)}; --format csv has every column)")
    return "\n".join(lines)


def _csv_cell(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return csv_safe(display_name(" ".join(str(v) for v in value)))
    if isinstance(value, str):
        return csv_safe(display_name(value))
    return "" if value is None else csv_safe(value)


def progress_line(label: str, done: int, total: int, name: str, width: int) -> str:
    """One progress line of at most ``width - 1`` columns (a full-width line wraps in some
    terminals): ``label [#####.....] done/total name``, the name shortened in the middle."""
    room = max(width - 1, 1)
    counts = f"{done}/{total}"
    bar = min(PROGRESS_BAR, max(PROGRESS_MIN_BAR, room - len(label) - len(counts) - 5 - MIN_SQUEEZED_WIDTH))
    filled = int(bar * done / max(total, 1))
    line = f"{label} [{'#' * filled}{'.' * (bar - filled)}] {counts}"
    name_room = room - display_width(line) - 1
    if name and name_room > 1:
        line += " " + middle_ellipsis(escape_controls(name), name_room)
    return _pad(line, room) if display_width(line) < room else middle_ellipsis(line, room)


# -- views: one per command ---------------------------------------------------------------
def diff_view(report, fmt: OutputFormat, width: int | None = AUTO) -> str:
    """Render a :class:`~ckptinspect.ops.diff.DiffReport`: variables by movement, layers, verdict.

    The table shows the NaN/Inf columns only when a variable has a NaN or an Inf; fitted to a
    narrow terminal it leaves out ``differing``, then ``dtype`` and ``shape`` (and says so).
    """
    def pair(x, y, show=str) -> str:
        if x is None or y is None:
            return show(x if y is None else y) if (x, y) != (None, None) else "-"
        return show(x) if x == y else f"{show(x)} -> {show(y)}"

    def counts(x, y) -> str:
        return "-" if x is None else f"{x}/{y}"

    rows = []
    for v in report.variables:
        size = 1
        for d in v.shape_a or v.shape_b or ():
            size *= d
        rows.append({
            **v.to_dict(),
            "shown_name": f"{v.name_a} -> {v.name_b}" if v.names_differ else v.name,
            "shape": pair(v.shape_a, v.shape_b, fmt_shape),
            "dtype": pair(v.dtype_a, v.dtype_b),
            "max_abs": fmt_float(v.max_abs_diff),
            "rel": fmt_float(v.rel_l2),
            "cos": fmt_float(v.cosine, 6),
            "diff_elems": "-" if v.num_different is None else f"{v.num_different}/{size}",
            "nan": counts(v.nan_a, v.nan_b),
            "inf": counts(v.inf_a, v.inf_b),
        })
    if fmt != OutputFormat.table:
        csv_cols = ["name", "status", "name_a", "name_b", "key_a", "key_b", "matched_by", "role", "shape_a", "shape_b",
                    "dtype_a", "dtype_b", "max_abs_diff", "rel_l2", "cosine", "num_different", "nan_a", "inf_a", "nan_b", "inf_b",
                    "layout"]
        return render(fmt, doc=report.to_dict(), rows=rows, columns=[(c, c) for c in csv_cols])
    header = [
        f"a: {report.a} ({report.format_a})",
        f"b: {report.b} ({report.format_b})",
        f"aligned by {report.alignment}" + (f", role {report.role}" if report.role else "")
        + (f", --map {' '.join(report.mapping)}" if report.mapping else "")
        + (f", {' '.join(report.layout)}" if report.layout else ""),
    ]
    header += [f"note: {n}" for n in report.notes]
    if width == AUTO:
        width = terminal_width()
    columns: list[Column] = [("shown_name", "name"), ("status", "status"), ("shape", "shape"), ("dtype", "dtype"),
                             ("max_abs", "max abs diff"), ("rel", "rel l2"), ("cos", "cosine"),
                             ("diff_elems", "differing")]
    if any(v.nan_a or v.nan_b or v.inf_a or v.inf_b for v in report.variables):
        columns += [("nan", "nan a/b"), ("inf", "inf a/b")]
    layers = report.layers
    moved = [s for s in layers if s.changed]
    footer: list[str] = []
    if layers:
        footer += ["", "layers:"]
        if moved:
            footer += _table_lines(
                ["layer", "differ", "max rel l2", "max abs diff"],
                [[s.layer or "(top level)", f"{s.changed}/{s.variables}", fmt_float(s.max_rel_l2),
                  fmt_float(s.max_abs_diff)] for s in moved],
                width=width, squeeze=[0],
            )
        unchanged = len(layers) - len(moved)
        footer.append(f"{unchanged} layer{'s' if unchanged != 1 else ''} unchanged" if moved else
                      f"all {len(layers)} layer{'s' if len(layers) != 1 else ''} unchanged")
    footer += ["", report.verdict]
    return render(fmt, doc={}, rows=rows, columns=columns, header=header, footer=footer, width=width,
                  squeeze=["shown_name"], optional=["diff_elems", "dtype", "shape"])


def transplant_summary(report) -> str:
    """``str(report)`` of a :class:`~ckptinspect.ops.transplant.TransplantReport`: a few plain lines."""
    s = report.summary()
    verb = "would assign" if report.dry_run else "assigned"
    lines = [
        f"transplant {report.source} ({report.source_format}) -> {report.model} ({report.model_class}) "
        f"under {report.strategy} ({report.replicas} replica{'s' if report.replicas != 1 else ''})",
        f"{verb} {s['assigned']}, shape mismatches {s['shape_mismatch']}, dtype mismatches "
        f"{s['dtype_mismatch']}, left at init {s['left_at_init']}, unused source variables {s['unused']}",
    ]
    lines += [f"  {x.describe()}" for x in report.mismatches]
    lines += [f"  left at init: {t.target} {fmt_shape(t.shape)}" for t in report.left_at_init]
    lines += [f"  unused: {u.source} {fmt_shape(u.shape)}" for u in report.unused]
    lines += list(report.notes)
    return "\n".join(lines)


def transplant_view(report, fmt: OutputFormat, output=None, width: int | None = AUTO) -> str:
    """Render a :class:`~ckptinspect.ops.transplant.TransplantReport` (and the written output)."""
    doc = report.to_dict()
    doc["output"] = output.to_dict() if output is not None else None
    s = report.summary()
    plural = "s" if report.replicas != 1 else ""
    header = [
        f"source:   {report.source} ({report.source_format})",
        f"model:    {report.model} ({report.model_class})",
        f"strategy: {report.strategy}, {report.replicas} replica{plural} ({report.local_replicas} in this process)",
        f"{('plan' if report.dry_run else 'result') + ':':<10}{'would assign' if report.dry_run else 'assigned'} "
        f"{s['assigned']}, shape mismatches {s['shape_mismatch']}, dtype mismatches {s['dtype_mismatch']}, "
        f"left at init {s['left_at_init']}, unused source variables {s['unused']}",
    ]
    if report.dry_run:
        problems = report.problems
        header.append("check:    dry run: nothing assigned or written"
                      + (f"; strict would refuse it ({len(problems)} problem{'s' if len(problems) != 1 else ''})"
                         if report.strict and problems else ""))
    else:
        header.append(f"check:    every assigned value equal to the source on {report.local_replicas} local "
                      f"replica{'s' if report.local_replicas != 1 else ''}" if report.verified else "check:    not verified")
    if output is not None:
        if output.written:
            header.append(f"output:   {output.path} ({output.format}), read back: {output.checked} variables equal")
        else:
            header.append(f"output:   {output.path} ({output.format}): written by the chief, not by this worker")
    header += [f"note:     {n}" for n in report.notes]
    rows: list[dict[str, Any]] = []
    for a in report.assigned:
        rows.append({"target": a.target, "shape": fmt_shape(a.shape), "dtype": a.dtype, "source": a.source,
                     "key": a.key, "matched_by": a.matched_by,
                     "status": "would assign" if report.dry_run else "assigned"})
    for x in report.mismatches:
        status = (f"shape mismatch: source {fmt_shape(x.source_shape)}" if x.kind == "shape"
                  else f"dtype mismatch: source {x.source_dtype}")
        rows.append({"target": x.target, "shape": fmt_shape(x.target_shape), "dtype": x.target_dtype,
                     "source": x.source, "key": x.key, "matched_by": x.matched_by, "status": status})
    for t in report.left_at_init:
        rows.append({"target": t.target, "shape": fmt_shape(t.shape), "dtype": t.dtype, "source": "-", "key": "",
                     "matched_by": "-", "status": "left at init"})
    for u in report.unused:
        rows.append({"target": "-", "shape": fmt_shape(u.shape), "dtype": u.dtype, "source": u.source, "key": u.key,
                     "matched_by": "-", "status": "unused source"})
    columns: list[Column] = [("target", "model variable"), ("shape", "shape"), ("dtype", "dtype"),
                             ("source", "source variable"), ("matched_by", "matched by"), ("status", "status")]
    footer = []
    if not report.dry_run and not report.complete:  # the last line says it (exit 1 in the CLI)
        s_left = s["shape_mismatch"] + s["dtype_mismatch"] + s["left_at_init"]
        footer = ["", "incomplete: nothing was assigned" + ("; no output written" if output is None else "")
                  if not report.assigned else
                  f"incomplete: {s_left} of {s_left + s['assigned']} model variables did not receive a value "
                  f"(shape mismatches {s['shape_mismatch']}, dtype mismatches {s['dtype_mismatch']}, "
                  f"left at init {s['left_at_init']})"]
    return render(fmt, doc=doc, rows=rows, columns=columns, header=header, footer=footer,
                  csv_columns=["target", "shape", "dtype", "source", "key", "matched_by", "status"],
                  squeeze=["target", "source"], wrap_last=True, width=width)


INFO_CLIP = 160


def _clip(text: str) -> str:
    return text if len(text) <= INFO_CLIP else text[: INFO_CLIP - 3] + "..."


def ls_view(listing, fmt: OutputFormat, tree: bool = False, width: int | None = AUTO) -> str:
    """Render an :class:`~ckptinspect.ops.listing.Listing`."""
    if width == AUTO and fmt == OutputFormat.table:
        width = terminal_width()
    ckpt = listing.checkpoint
    stats = listing.stats
    step = "-" if ckpt.step is None else f"{ckpt.step} (from {ckpt.step_source})"
    totals = ckpt.totals()
    info = ckpt.info
    fields = [
        ("path", ckpt.path),
        ("format", ckpt.format + (f" ({info['kind']})" if info.get("kind") else "")),
        ("step", step),
        ("shards", ckpt.num_shards),
        ("totals", ", ".join(
            f"{r} {totals[r]['count']} ({human_bytes(totals[r]['nbytes'])})"
            for r in ("model", "optimizer", "metadata", "all")
        )),
    ]
    if info.get("model_class"):
        extra = [f"{info['model_name']!r}" if info.get("model_name") else "",
                 f"{info['layer_count']} layers" if info.get("layer_count") else ""]
        fields.append(("model", " ".join([info["model_class"], *filter(None, extra)])))
    if info.get("optimizer_class"):
        fields.append(("optimizer", info["optimizer_class"]))
    if info.get("keras_version"):
        fields.append(("keras", info["keras_version"] + (f" ({info['backend']} backend)" if info.get("backend") else "")))
    if info.get("date_saved"):
        fields.append(("saved", info["date_saved"]))
    if info.get("unallocated"):  # datasets declared but never written: no values, no stats
        empty = info["unallocated"]
        more = f" (+{len(empty) - 3} more)" if len(empty) > 3 else ""
        fields.append(("warning", f"{len(empty)} dataset{'s' if len(empty) != 1 else ''} declared but unallocated"
                                  f" (never written, no values): {', '.join(empty[:3])}{more}"))
    if isinstance(info.get("metadata"), dict) and info["metadata"]:  # safetensors __metadata__
        fields.append(("metadata", _clip(", ".join(f"{k}={v}" for k, v in info["metadata"].items()))))
    if info.get("tied"):  # torch: names sharing one tensor
        fields.append(("tied", _clip("; ".join(" = ".join(group) for group in info["tied"]))))
    label_width = max(9, *(len(label) + 2 for label, _ in fields))
    header = [f"{label + ':':<{label_width}}{value}" for label, value in fields]
    if ckpt.checkpoints:
        header += ["", "checkpoints:"]
        header += _table_lines(
            ["", "prefix", "step", "saved", "exists", "in state file"],
            [
                [
                    "*" if c.latest else "",
                    c.path,
                    "-" if c.step is None else c.step,
                    _fmt_time(c.timestamp),
                    "yes" if c.exists else "MISSING",
                    "yes" if c.in_state_file else "no",
                ]
                for c in ckpt.checkpoints
            ],
            width=width, squeeze=[1],
        )
    if len(listing.variables) != len(ckpt.variables):
        header += ["", f"showing {len(listing.variables)} of {len(ckpt.variables)} variables"]
    columns: list[Column] = [("name", "name"), ("shape", "shape"), ("dtype", "dtype"), ("size", "size"),
                             ("shards", "shard"), ("role", "role")]
    if stats is not None:
        columns += [("min", "min"), ("max", "max"), ("mean", "mean"), ("std", "std"), ("nan", "nan"), ("inf", "inf")]
    rows = []
    unreadable = info.get("unreadable") or {}
    for v in (sorted(listing.variables, key=lambda v: v.name) if tree else listing.variables):
        row = {
            "key": v.key,
            "name": v.name,
            "shape": fmt_shape(v.shape),
            "dtype": v.dtype + (UNREADABLE_MARK if v.key in unreadable and fmt == OutputFormat.table else ""),
            "size": human_bytes(v.nbytes),
            "nbytes": v.nbytes,
            "shards": ",".join(str(s) for s in v.shards) or "-",
            "role": v.role,
        }
        if stats is not None:
            s = stats.get(v.key)
            for f in ("min", "max", "mean", "std"):
                row[f] = fmt_float(getattr(s, f)) if s else "-"
            row["nan"] = s.nan if s else "-"
            row["inf"] = s.inf if s else "-"
        rows.append(row)
    if tree and fmt == OutputFormat.table:
        rows = _tree_rows(rows)
    csv_cols = ["key", "name", "shape", "dtype", "nbytes", "shards", "role"]
    if stats is not None:
        csv_cols += ["min", "max", "mean", "std", "nan", "inf"]
    return render(fmt, doc=listing.to_dict(), rows=rows, columns=columns, header=header, csv_columns=csv_cols,
                  width=width)


def ls_warnings(listing) -> str:
    """The warning lines of an :class:`~ckptinspect.ops.listing.Listing`, for stderr (control
    characters and bytes that are not UTF-8 escaped, as in tables)."""
    return "".join(f"warning: {escape_controls(w)}\n" for w in listing.warnings)


def _tree_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Group rows by layer path: a subtotal row per group, leaves indented under it."""
    out: list[dict[str, Any]] = []
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        parent, _, leaf = row["name"].rpartition("/")
        groups.setdefault(parent, []).append({**row, "name": "  " + leaf if parent else leaf})
    for parent, members in groups.items():
        if parent:
            total = sum(r["nbytes"] for r in members)
            out.append({"name": parent + "/", "size": human_bytes(total), "role": members[0]["role"]
                        if len({r["role"] for r in members}) == 1 else "mixed",
                        "shape": f"{len(members)} vars"})
        out.extend(members)
    return out


def _fmt_time(ts: float | None) -> str:
    if ts is None:
        return "-"
    import datetime  # noqa: PLC0415

    return datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def verify_view(report, fmt: OutputFormat, width: int | None = AUTO) -> str:
    """Render a :class:`~ckptinspect.ops.verify.VerifyReport`: verdict, checkpoints, damage."""
    if width == AUTO and fmt == OutputFormat.table:
        width = terminal_width()
    summary = report.summary()
    newest = report.newest_intact
    n = summary["checkpoints"]
    rotated = summary.get("rotated", 0)
    n_kept = n - rotated
    gone = f" ({rotated} rotated out while checking)" if rotated else ""
    if report.intact:
        verdict = (f"INTACT: {n_kept} of {n_kept} checkpoint{'s' if n_kept != 1 else ''} whole{gone},"
                   f" {summary['tensors']} tensors ({human_bytes(summary['bytes'])}) checked")
    elif summary["damaged"] or summary["missing"] or not report.problems:
        word = "DAMAGED" if summary["damaged"] else "INCOMPLETE"
        verdict = (f"{word}: {summary['damaged']} damaged, {summary['missing']} missing of {n_kept} checkpoint"
                   f"{'s' if n_kept != 1 else ''}{gone}; {summary['damaged_tensors']} damaged tensors")
    else:
        verdict = (f"INCONSISTENT: the checkpoint{'s' if n_kept != 1 else ''} ({n_kept}{gone}) are whole, the"
                   f" directory's state file is not")
    header = [f"path:    {report.path}", f"format:  {report.format}", f"verdict: {verdict}"]
    header += [f"problem: {p}" for p in report.problems]
    header += [f"note:    {p}" for p in report.notes]
    first = report.first_damaged
    if first is not None:
        _, d = first
        header.append(f"first:   {d.name}{d.slice or ''} in {d.file}: {d.problem}")
    if report.directory or not report.intact:
        header.append(f"newest intact: {newest.path if newest else 'none'}")

    def problem_cell(c) -> str:
        if not c.problems:
            return "-"
        text = c.problems[0].removeprefix(c.path + ": ")
        return text + (f" (+{len(c.problems) - 1} more)" if len(c.problems) > 1 else "")

    header += ["", "checkpoints:"]
    header += _table_lines(
        ["", "checkpoint", "step", "status", "tensors", "checked", "damaged", "problem"],
        [
            ["*" if c.latest else "", c.path, "-" if c.step is None else c.step, c.status, c.tensors,
             human_bytes(c.nbytes), len(c.damaged), problem_cell(c)]
            for c in report.checkpoints
        ],
        width=width, squeeze=[1], wrap_last=True,
    )
    rows = []
    for c in report.checkpoints:
        for problem in c.problems:
            rows.append({"checkpoint": c.path, "status": c.status, "kind": "checkpoint", "problem": problem,
                         "key": "", "name": "", "slice": "", "file": problem.split(": ", 1)[0]})
        for d in c.damaged:
            rows.append({"checkpoint": c.path, "status": c.status, **d.to_dict(), "slice": d.slice or ""})
    columns: list[Column] = [("name", "name"), ("slice", "slice"), ("file", "file"), ("kind", "kind"), ("problem", "problem")]
    if report.directory:
        columns.insert(0, ("checkpoint", "checkpoint"))
    csv_cols = ["checkpoint", "status", "key", "name", "slice", "file", "shard", "offset", "size", "kind", "problem",
                "stored_crc32c", "actual_crc32c"]
    if fmt != OutputFormat.table:
        return render(fmt, doc=report.to_dict(), rows=rows, columns=columns, csv_columns=csv_cols)
    text = "\n".join(fit_lines(header, width)) + "\n"
    tensor_rows = [r for r in rows if r["kind"] != "checkpoint"]
    if tensor_rows:
        text += "\ndamaged tensors:\n" + render(fmt, doc={}, rows=tensor_rows, columns=columns, width=width,
                                                squeeze=["name", "file", "checkpoint"], wrap_last=True,
                                                optional=["kind", "checkpoint"])
    return text


def extract_view(report, fmt: OutputFormat, width: int | None = AUTO) -> str:
    """Render an :class:`~ckptinspect.ops.extract.ExtractReport`: a per-role kept/dropped table
    (table), one row per source variable (csv), or the whole report (json)."""
    kept, dropped = report.kept, report.dropped
    shards = f", {report.num_shards} data shard{'s' if report.num_shards != 1 else ''}" if report.output_format == "tf" else ""
    header = [
        f"source:   {report.source} ({report.source_format})",
        f"output:   {report.output} ({report.output_format}{shards})",
        f"files:    {', '.join(report.files)}",
        f"check:    {report.verified} kept tensor{'s' if report.verified != 1 else ''} read back bit-identical"
        + (f" ({report.copied} copied byte for byte)" if getattr(report, "copied", 0) else ""),
    ]
    if report.object_graph:
        g = report.object_graph
        header.append(f"graph:    {g['source_nodes']} -> {g['nodes']} objects, root keeps: {', '.join(g['root_children'])}")
    saving = report.saving
    footer = [
        "",
        f"on disk:  {human_bytes(report.source_file_bytes)} -> {human_bytes(report.output_file_bytes)}"
        + (f" ({saving * 100:.1f}% smaller)" if saving >= 0 else f" ({-saving * 100:.1f}% larger)"),
    ]
    footer += [f"note:     {n}" for n in report.notes]
    if fmt == OutputFormat.table:
        rows = [
            {
                "role": r,
                "kept": kept[r]["count"],
                "kept_bytes": human_bytes(kept[r]["nbytes"]),
                "dropped": dropped[r]["count"],
                "dropped_bytes": human_bytes(dropped[r]["nbytes"]),
            }
            for r in ("model", "optimizer", "metadata", "all")
        ]
        columns: list[Column] = [("role", "role"), ("kept", "kept"), ("kept_bytes", "kept size"),
                                 ("dropped", "dropped"), ("dropped_bytes", "dropped size")]
        return render(fmt, doc={}, rows=rows, columns=columns, header=header, footer=footer, width=width)
    rows = [
        {"name": v.name, "key": v.key, "output_key": v.output_key or "", "role": v.role,
         "shape": fmt_shape(v.shape), "dtype": v.dtype, "nbytes": v.nbytes, "kept": "yes" if v.kept else "no"}
        for v in report.variables
    ]
    columns = [("name", "name"), ("key", "key"), ("output_key", "output key"), ("role", "role"),
               ("shape", "shape"), ("dtype", "dtype"), ("nbytes", "bytes"), ("kept", "kept")]
    return render(fmt, doc=report.to_dict(), rows=rows, columns=columns, width=width)


# -- rewrite (issue 14) ------------------------------------------------------------------------
def rewrite_view(report, fmt: OutputFormat, width: int | None = AUTO) -> str:
    """Render a :class:`~ckptinspect.ops.rewrite_report.RewriteReport`: counts and sizes per role
    kept/renamed/dropped/cast (table), one row per source variable (csv), or the whole report
    (json)."""
    if fmt == OutputFormat.json:
        return render(fmt, doc=report.to_dict(), rows=[], columns=[], width=width)
    if fmt == OutputFormat.csv:
        rows = [
            {"name": v.name, "new_name": v.new_name or "", "key": v.key, "new_key": v.new_key or "", "role": v.role,
             "shape": fmt_shape(v.shape), "dtype": v.dtype, "new_dtype": v.new_dtype or "", "nbytes": v.nbytes,
             "new_nbytes": v.new_nbytes, "actions": " ".join(v.actions)}
            for v in report.variables
        ]
        columns: list[Column] = [(c, c) for c in ("name", "new_name", "key", "new_key", "role", "shape", "dtype",
                                                  "new_dtype", "nbytes", "new_nbytes", "actions")]
        return render(fmt, doc={}, rows=rows, columns=columns, width=width)
    totals = report.totals()
    header = [
        f"source:   {report.source} ({report.source_format})",
        f"output:   {report.output} ({report.output_format})",
        f"files:    {', '.join(report.files)}",
        f"check:    {report.verified} tensor{'s' if report.verified != 1 else ''} read back and compared",
        f"result:   {report.summary()}",
    ]
    g = report.object_graph
    if g:
        line = f"graph:    {g['edges_renamed']} edge(s) renamed, {g['edges_moved']} moved, {g['nodes_added']} object(s) added"
        if g.get("pruned"):
            line += f"; pruned {g['source_nodes']} -> {g['nodes']} objects"
        header.append(line)

    def cell(action: str, role: str, key: str = "bytes") -> tuple[int, str]:
        row = totals[action].get(role)
        return (row["count"], human_bytes(row[key])) if row else (0, "-")

    rows = []
    for r in ("model", "optimizer", "metadata", "all"):
        kept, renamed, dropped, cast = cell("kept", r), cell("renamed", r), cell("dropped", r), cell("cast", r)
        cast_new = cell("cast", r, "new_bytes")[1]
        rows.append({"role": r, "kept": kept[0], "kept_bytes": kept[1], "renamed": renamed[0],
                     "dropped": dropped[0], "dropped_bytes": dropped[1], "cast": cast[0],
                     "cast_bytes": f"{cast[1]} -> {cast_new}" if cast[0] else "-"})
    columns = [("role", "role"), ("kept", "kept"), ("kept_bytes", "kept size"), ("renamed", "renamed"),
               ("dropped", "dropped"), ("dropped_bytes", "dropped size"), ("cast", "cast"), ("cast_bytes", "cast size")]
    saved = report.saved_bytes
    src = report.source_file_bytes or 1
    footer = [
        "",
        f"on disk:  {human_bytes(report.source_file_bytes)} -> {human_bytes(report.output_file_bytes)}"
        + (f" ({saved / src * 100:.1f}% smaller)" if saved >= 0 else f" ({-saved / src * 100:.1f}% larger)")
        + f"; {human_bytes(report.copied_bytes)} copied unchanged",
    ]
    footer += [f"note:     {n}" for n in report.notes]
    return render(fmt, doc={}, rows=rows, columns=columns, header=header, footer=footer, width=width)


# -- average (issue 14) ----------------------------------------------------------------------
def average_view(report, fmt: OutputFormat, width: int | None = AUTO) -> str:
    """Render an :class:`~ckptinspect.ops.average.AverageReport`: the inputs, then averaged /
    copied / dropped per role (table), one row per variable (csv), or the whole report (json)."""
    method = "mean" if report.method == "mean" else f"ema, decay {report.decay:g}"
    header = [f"inputs:   {len(report.inputs)}, {method} in float64, oldest first"]
    newest = "  <- newest: integers, strings, metadata" + (", object graph" if report.object_graph else "")
    for i in report.inputs:
        step = "step ?" if i.step is None else f"step {i.step}"
        header.append(f"          {i.path} ({step}){newest if i.newest else ''}")
    header += [
        f"output:   {report.output} ({report.num_shards} data shard{'s' if report.num_shards != 1 else ''}"
        + (", model variables only" if report.role else "") + ")",
        f"check:    {report.verified} tensor{'s' if report.verified != 1 else ''} read back as computed",
    ]
    if report.object_graph and report.object_graph.get("pruned"):
        g = report.object_graph
        header.append(f"graph:    {g['source_nodes']} -> {g['nodes']} objects, root keeps: {', '.join(g['root_children'])}")
    footer = ["", f"on disk:  {human_bytes(report.input_file_bytes)} read, {human_bytes(report.output_file_bytes)} written"]
    footer += [f"note:     {n}" for n in report.notes]
    if fmt == OutputFormat.table:
        averaged, copied, dropped = report.averaged, report.copied, report.dropped
        rows = [
            {"role": r, "averaged": averaged[r]["count"], "averaged_bytes": human_bytes(averaged[r]["nbytes"]),
             "copied": copied[r]["count"], "copied_bytes": human_bytes(copied[r]["nbytes"]),
             "dropped": dropped[r]["count"]}
            for r in ("model", "optimizer", "metadata", "all")
        ]
        columns: list[Column] = [("role", "role"), ("averaged", "averaged"), ("averaged_bytes", "averaged size"),
                                 ("copied", "from newest"), ("copied_bytes", "copied size"), ("dropped", "dropped")]
        return render(fmt, doc={}, rows=rows, columns=columns, header=header, footer=footer, width=width)
    rows = [
        {"name": v.name, "key": v.key, "output_key": v.output_key or "", "role": v.role, "shape": fmt_shape(v.shape),
         "dtype": v.dtype, "nbytes": v.nbytes, "action": v.action}
        for v in report.variables
    ]
    columns = [("name", "name"), ("key", "key"), ("output_key", "output key"), ("role", "role"),
               ("shape", "shape"), ("dtype", "dtype"), ("nbytes", "bytes"), ("action", "action")]
    return render(fmt, doc=report.to_dict(), rows=rows, columns=columns, width=width)


# -- doctor (issue 13) -----------------------------------------------------------------------
DOCTOR_REASON_TITLES = {
    "missing": "missing in source",
    "shape_mismatch": "shape mismatch",
    "dtype_mismatch": "dtype mismatch",
    "ambiguous": "ambiguous",
    "unused": "unused source variables",
}
DOCTOR_MAX_REASONS = 5  # lines shown per reason group in a table (JSON lists them all)


def doctor_verdict(report) -> str:
    """The verdict line of a :class:`~ckptinspect.ops.doctor.DoctorReport`."""
    s = report.summary()
    total = s["weights"]
    if report.ok:
        return f"verdict:  OK: every model weight has a source value that fits ({s['matched']} of {total})"
    parts = [f"{DOCTOR_REASON_TITLES[k]} {s[k]}" for k in ("missing", "shape_mismatch", "dtype_mismatch", "ambiguous") if s[k]]
    return f"verdict:  FAIL: {total - s['matched']} of {total} model weights cannot be loaded ({', '.join(parts)})"


def _doctor_status(w) -> str:
    if w.status == "matched":
        return "matched" if w.fit in (None, "equal") else f"matched ({w.fit})"
    if w.status == "shape-mismatch":
        return f"shape mismatch: source {fmt_shape(w.source_shape)}"
    if w.status == "dtype-mismatch":
        return f"dtype mismatch: source {w.source_dtype}"
    if w.status == "ambiguous":
        return f"ambiguous: {len(w.candidates)} candidate{'s' if len(w.candidates) != 1 else ''}"
    return "missing in source"


def doctor_view(report, fmt: OutputFormat, width: int | None = AUTO) -> str:
    """Render a :class:`~ckptinspect.ops.doctor.DoctorReport`: one row per model weight and per
    source variable left over, the reasons grouped, the fix, and the verdict as the last line."""
    rows: list[dict[str, Any]] = []
    for w in report.weights:
        rows.append({"target": w.target, "shape": fmt_shape(w.shape), "dtype": w.dtype, "source": w.source or "-",
                     "key": w.key or "", "source_shape": fmt_shape(w.source_shape) if w.source_shape is not None else "",
                     "matched_by": w.matched_by or "-", "fit": w.fit or "", "status": _doctor_status(w)})
    for s in report.leftovers:
        rows.append({"target": "-", "shape": fmt_shape(s.shape), "dtype": s.dtype, "source": s.source, "key": s.key,
                     "source_shape": fmt_shape(s.shape), "matched_by": "-", "fit": "",
                     "status": "unused source" if s.status == "unused" else "ambiguous source"})
    header = [
        f"source:   {report.source} ({report.source_format})",
        f"model:    {report.model} ({report.model_class})",
    ]
    if report.layout:
        header.append(f"layout:   {' '.join(report.layout)}")
    if report.mapping:
        header.append(f"map:      {' '.join(report.mapping)}")
    if report.output is not None:
        header.append(f"output:   {report.output.path} ({report.output.format}), read back through "
                      f"model.load_weights: {report.output.checked} weights equal to the source")
    header += [f"note:     {n}" for n in report.notes]
    footer: list[str] = []
    reasons = report.reasons()
    shown = [(k, v) for k, v in reasons.items() if v]
    if shown:
        footer += ["", "reasons:"]
        for key, lines in shown:
            footer.append(f"  {DOCTOR_REASON_TITLES[key]} ({len(lines)}):")
            footer += [f"    {line}" for line in lines[:DOCTOR_MAX_REASONS]]
            if len(lines) > DOCTOR_MAX_REASONS:
                footer.append(f"    ... and {len(lines) - DOCTOR_MAX_REASONS} more (--format json lists them all)")
    footer.append("")
    if report.matched and report.output is None:
        renames = len(report.map_rules) - len(report.mapping)
        fixes = []
        if renames > 0:
            fixes.append(f"--emit map ({renames} --map rule{'s' if renames != 1 else ''}"
                         f"{', checked' if report.map_verified else ', NOT reproducing every pair'})")
        if report.assignment_map is not None:
            fixes.append("--emit assignment-map (tf.compat.v1.train.init_from_checkpoint)")
        if report.ok:
            fixes.append("--emit weights -o OUT.weights.h5 (then model.load_weights(OUT))")
        if fixes:
            footer.append("fix:      " + "; ".join(fixes))
    footer.append(doctor_verdict(report))
    columns: list[Column] = [("target", "model variable"), ("shape", "shape"), ("dtype", "dtype"),
                             ("source", "source variable"), ("matched_by", "matched by"), ("status", "status")]
    return render(fmt, doc=report.to_dict(), rows=rows, columns=columns, header=header, footer=footer,
                  csv_columns=["target", "shape", "dtype", "source", "key", "source_shape", "matched_by", "fit", "status"],
                  squeeze=["target", "source"], wrap_last=True, width=width)


def doctor_map_view(report, fmt: OutputFormat) -> str:
    """The proposed ``--map`` rules: one ``--map 'RULE'`` per line, shell-quoted (table), the
    list (json: ``{"map": [...], "verified": ...}``) or one ``rule`` per row (csv)."""
    import shlex  # noqa: PLC0415

    if fmt == OutputFormat.json:
        return to_json({"map": list(report.map_rules), "verified": report.map_verified, "ok": report.ok}) + "\n"
    if fmt == OutputFormat.csv:
        return render(fmt, doc={}, rows=[{"rule": r} for r in report.map_rules], columns=[("rule", "rule")])
    return "".join(f"--map {shlex.quote(r)}\n" for r in report.map_rules)


def doctor_assignment_map_view(report, fmt: OutputFormat) -> str:
    """The ``tf.compat.v1.train.init_from_checkpoint`` assignment map: a JSON object (also a
    Python dict literal) of checkpoint key -> model variable name; csv: one row per entry."""
    amap = report.assignment_map or {}
    if fmt == OutputFormat.csv:
        return render(fmt, doc={}, rows=[{"checkpoint_key": k, "variable": v} for k, v in amap.items()],
                      columns=[("checkpoint_key", "checkpoint_key"), ("variable", "variable")])
    return json.dumps(amap, indent=2) + "\n"


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
    """Render a :class:`~ckptinspect.ops.plan.PlanReport`: what was measured, then one row per
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
