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

import enum
import math
import os
import re
import sys
from typing import Any, Callable, Iterable, Iterator, Sequence

from ..model import display_name, format_shape

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
    "display_width",
    "fit_lines",
    "to_json",
    "AUTO",
    "ELLIPSIS",
    "terminal_width",
    "simple_table",
    "simple_table_lines",
    "render_chunks",
    "progress_line",
    "csv_cell",
    "COLUMN_GAP",
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
# (The patterns are compiled on first use, through re's cache: printable ASCII, what almost every
# name is, never needs them.)
_CONTROL_RE = "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]"
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
CSV_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
CSV_GUARD = "'"
_PLAIN_NUMBER_RE = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:inf|nan)|-"
_LABEL_RE = r"^([^\s:][^:]{0,24}:\s+)\S"  # "path:    ", "note:     "...
PROGRESS_BAR = 30
PROGRESS_MIN_BAR = 10


def escape_controls(text: Any) -> str:
    """``text`` with control characters as visible escapes (``\\x1b``, ``\\n``, ``\\u202e``),
    and bytes of a key that are not UTF-8 as ``\\xff`` (:func:`~ckptinspect.model.display_name`)."""
    s = display_name(str(text))
    if (s.isascii() and s.isprintable()) or not re.search(_CONTROL_RE, s):  # ASCII: printable = no control
        return s
    return re.sub(_CONTROL_RE, _escape_one, s)


def _escape_one(match: re.Match[str]) -> str:
    c = match.group()
    return _NAMED_ESCAPES.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def csv_safe(value: Any) -> Any:
    """A CSV cell a spreadsheet will not run: ``'`` before a text starting with ``= + - @``,
    a tab or a carriage return (plain numbers such as ``-0.5`` stay as they are)."""
    if isinstance(value, str) and value.startswith(CSV_FORMULA_STARTS) and not re.fullmatch(_PLAIN_NUMBER_RE, value):
        return CSV_GUARD + value
    return value


def display_width(s: str) -> int:
    """Terminal columns ``s`` takes (wide East Asian characters take two, combining marks none)."""
    if s.isascii():
        return len(s)
    return sum(_char_width(c) for c in s)


def _char_width(c: str) -> int:
    import unicodedata  # noqa: PLC0415 - non-ASCII text only

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
            import shutil  # noqa: PLC0415 - a terminal only

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
        match = re.match(_LABEL_RE, line)
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
        import textwrap  # noqa: PLC0415 - text wider than its room only

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
    import json  # noqa: PLC0415 - the table, the default, goes without it

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
    names_first: bool = False,
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
        names_first: Leave out ``optional`` columns before shortening a ``squeeze`` column.

    Returns:
        The text, ending with a newline.
    """
    if fmt == OutputFormat.json:
        return to_json(doc) + "\n"
    rows = list(rows)
    return "".join(render_chunks(fmt, doc=doc, rows=lambda: rows, columns=columns, header=header, footer=footer,
                                 csv_columns=csv_columns, squeeze=squeeze, optional=optional, wrap_last=wrap_last,
                                 width=width, names_first=names_first))


LINES_PER_CHUNK = 4096


def render_chunks(
    fmt: OutputFormat,
    *,
    doc: dict[str, Any],
    rows: Callable[[], Iterable[dict[str, Any]]],
    columns: Sequence[Column],
    header: Sequence[str] = (),
    footer: Sequence[str] = (),
    csv_columns: Sequence[str] | None = None,
    squeeze: Sequence[str] = ("name",),
    optional: Sequence[str] = (),
    wrap_last: bool = False,
    width: int | None = AUTO,
    names_first: bool = False,
) -> Iterator[str]:
    """:func:`render`'s text in pieces, ``rows()`` giving the rows afresh at each call (the
    table takes two passes: widths, then lines): a listing of a million rows is never held."""
    if fmt == OutputFormat.json:
        yield to_json(doc) + "\n"
        return
    if fmt == OutputFormat.csv:
        import csv  # noqa: PLC0415 - csv output only
        import io  # noqa: PLC0415

        keys = list(csv_columns or [k for k, _ in columns])
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=keys, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for n, row in enumerate(rows(), 1):
            writer.writerow({k: _csv_cell(row.get(k)) for k in keys})
            if n % LINES_PER_CHUNK == 0:
                yield buf.getvalue()
                buf.seek(0)
                buf.truncate()
        yield buf.getvalue()
        return
    if width == AUTO:
        width = terminal_width()
    parts = fit_lines(header, width)
    flushed = False
    keys = [k for k, _ in columns]
    if next(iter(rows()), None) is not None:
        lines = simple_table_lines([h for _, h in columns], lambda: ([row.get(k, "") for k in keys] for row in rows()),
                                   width=width, squeeze=[keys.index(k) for k in squeeze if k in keys],
                                   optional=[keys.index(k) for k in optional if k in keys], wrap_last=wrap_last,
                                   names_first=names_first)
        if header:
            parts.append("")
        for line in lines:
            parts.append(line)
            if len(parts) >= LINES_PER_CHUNK:  # each line of a block ends with its newline
                yield "\n".join(parts) + "\n"
                flushed, parts = True, []
    parts += fit_lines(footer, width)
    if parts or not flushed:
        yield "\n".join(parts) + "\n"


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
    names_first: bool = False,
) -> str:
    """The layout of tabulate's ``simple`` format (cells as strings, left-aligned), built in
    one pass: listings have thousands of rows and tabulate costs ~25 us a row.

    Cells are shown with control characters escaped. Given a ``width``, a wider table drops
    its header padding, wraps its last column onto continuation lines (``wrap_last``, for
    free text), shortens the ``squeeze`` columns (indexes) with a middle ellipsis, and if that
    is not enough leaves out the ``optional`` columns in order (a last line says so). With
    ``names_first`` the ``optional`` columns are left out first, as long as a ``squeeze``
    column would otherwise be shortened: the names stay whole while other columns can go.
    """
    return "\n".join(simple_table_lines(headers, lambda: rows, width=width, squeeze=squeeze, optional=optional,
                                         wrap_last=wrap_last, names_first=names_first))


def _cells(raw: Sequence[Any]) -> tuple[list[str], bool]:
    """A row's cells as shown (control characters escaped), and whether they are printable ASCII."""
    row = ["" if c is None else c if type(c) is str else str(c) for c in raw]
    joined = "".join(row)
    if joined.isascii() and joined.isprintable():
        return row, True
    return [escape_controls(c) for c in row], False


def simple_table_lines(
    headers: Sequence[str],
    rows: Callable[[], Iterable[Sequence[Any]]],
    *,
    width: int | None = None,
    squeeze: Sequence[int] = (),
    optional: Sequence[int] = (),
    wrap_last: bool = False,
    names_first: bool = False,
) -> Iterator[str]:
    """:func:`simple_table`'s lines, one at a time, in two passes over ``rows()`` (a fresh
    iterable each call): the column widths first, then the lines; a table of a million rows is
    never held (nor its text)."""
    headers = [escape_controls(h) for h in headers]
    content = [0] * len(headers)
    count = 0
    for raw in rows():
        row, plain = _cells(raw)
        count += 1
        for i, w in enumerate(map(len, row) if plain else map(display_width, row)):
            if w > content[i]:
                content[i] = w
    keep = list(range(len(headers)))
    hidden: list[str] = []
    widths = [max(display_width(h) + 2, c) for h, c in zip(headers, content)]
    wrap = False
    fitted = False
    if width is not None and _table_width(widths) > width:
        fitted = True
        pending = [i for i in optional if 0 <= i < len(headers)]
        while True:
            wrap = wrap_last and keep[-1] == len(headers) - 1
            widths = _fit_widths([headers[i] for i in keep], [content[i] for i in keep],
                                 [keep.index(i) for i in squeeze if i in keep], wrap, width)
            shortened = names_first and any(widths[keep.index(i)] < content[i] for i in squeeze if i in keep)
            if (_table_width(widths) <= width and not shortened) or not pending:
                break
            dropped = pending.pop(0)
            keep.remove(dropped)
            hidden.append(headers[dropped])
        headers = [headers[i] for i in keep]
        headers = [middle_ellipsis(h, w) for h, w in zip(headers, widths)]
    yield COLUMN_GAP.join(_pad(h, w) for h, w in zip(headers, widths)).rstrip()
    yield COLUMN_GAP.join("-" * w for w in widths)
    padded = COLUMN_GAP.join(f"{{:<{w}}}" for w in widths).format  # pads by length: right for plain rows
    last = len(keep) - 1
    for raw in rows():
        row, is_plain = _cells(raw)
        if fitted:
            row = [row[i] for i in keep]
            for i, c in enumerate(row):
                if display_width(c) > widths[i] and not (wrap and i == last):
                    row[i] = middle_ellipsis(c, widths[i])
                    is_plain = False  # the ellipsis is not ASCII
        if is_plain and len(row) == len(widths) and not (wrap and len(row[-1]) > widths[-1]):
            yield padded(*row).rstrip()
        elif wrap and display_width(row[-1]) > widths[-1]:
            import textwrap  # noqa: PLC0415 - a cell wider than its column only

            pieces = textwrap.wrap(row[-1], width=widths[-1], break_long_words=True, break_on_hyphens=False)
            offset = " " * (_table_width(widths[:-1]) + len(COLUMN_GAP))
            yield COLUMN_GAP.join(_pad(c, w) for c, w in zip(row[:-1] + [pieces[0]], widths)).rstrip()
            for piece in pieces[1:]:
                yield offset + piece
        else:
            yield COLUMN_GAP.join(_pad(c, w) for c, w in zip(row, widths)).rstrip()
    if hidden:
        said = f"(left out to fit {width} columns: {', '.join(hidden)}; all in --format csv)"
        import textwrap  # noqa: PLC0415 - columns left out only

        yield from textwrap.wrap(said, width=max(width, MIN_WRAPPED_WIDTH), break_on_hyphens=False) or [said]


def _csv_cell(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return csv_safe(display_name(" ".join(str(v) for v in value)))
    if isinstance(value, str):
        return csv_safe(display_name(value))
    return "" if value is None else csv_safe(value)


csv_cell = _csv_cell  # one CSV cell as render writes it (lists joined, names shown, formulas guarded)


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
