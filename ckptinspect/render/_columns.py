"""Very long listings written from columns, a block of rows at a time.

A checkpoint of a million tensors keeps its variables as a :class:`~ckptinspect.model.VariableTable`.
Rendering it as rows of dicts would hold the whole table twice (the rows, then the text). Here the
table's column widths come from the columns in a first pass, and the lines are written in a
second, a block of rows at a time, each block laid out as a byte matrix (numpy) and flattened to
text: the bytes are those :func:`~ckptinspect.render._core.simple_table` writes for the same rows.
JSON is written one variable at a time (:func:`json_chunks`), each as ``json.dumps`` nests it.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Sequence

from .. import model as m
from ._core import COLUMN_GAP, display_width, escape_controls, to_json

__all__ = ["plain_names", "table_chunks", "json_chunks"]

BLOCK_BYTES = 256 << 10  # bytes of text laid out at once (its gather indexes take ~30x that)
_SPACE, _NEWLINE = 0x20, 0x0A
_PRINTABLE_ASCII = bytes(range(0x20, 0x7F))
_CHECK_BYTES = 1 << 18  # names checked at a time by plain_names


def plain_names(table: m.VariableTable) -> bool:
    """Whether every name of ``table`` is printable ASCII (a cell shown as it is, its width its length)."""
    names = table.names
    return not any(names[at:at + _CHECK_BYTES].translate(None, _PRINTABLE_ASCII)  # what is left once they are deleted
                   for at in range(0, len(names), _CHECK_BYTES))  # a piece at a time: no copy of all the names


def _texts(values: Sequence[str]) -> Any:
    """Distinct cell texts as a byte matrix padded with spaces (one row each), and their lengths."""
    import numpy as np  # noqa: PLC0415

    encoded = [v.encode("ascii") for v in values]
    width = max((len(e) for e in encoded), default=0)
    out = np.full((max(len(encoded), 1), max(width, 1)), _SPACE, np.uint8)
    for i, e in enumerate(encoded):
        out[i, : len(e)] = np.frombuffer(e, np.uint8)
    return out, np.array([len(e) for e in encoded] or [0], np.int64)


def table_chunks(headers: Sequence[str], table: m.VariableTable,
                 cells: Sequence[tuple[Callable[[Any], Any], Callable[[Any], str]]]) -> Iterator[str]:
    """The lines of :func:`~ckptinspect.render._core.simple_table` (no width to fit) of a table
    whose first column is the variables' names (printable ASCII: see :func:`plain_names`) and whose
    other columns are drawn from few distinct values, each line ending with a newline.

    Args:
        headers: The column headers.
        table: The variables, in the order to show them.
        cells: For each column after the name: ``(codes, texts)``: ``codes(rows)`` gives each
            row's value code (a numpy array of small ints) and ``texts`` the cell's text (ASCII)
            of each code; or ``(values, text)`` with ``texts`` a function: the distinct values
            are found first (``text(value)`` the cell of one).
    """
    import numpy as np  # noqa: PLC0415

    rows = table.positions()
    ends = table.name_ends
    spans = [slice(at, at + _SPAN_ROWS) for at in range(0, len(rows), _SPAN_ROWS)]
    columns = []  # each row's codes are made a block at a time, here and below: no column of every row's
    for codes_of, text_of in cells:
        if callable(text_of):  # any values: their distinct ones, and each row's index into them
            distinct = m.distinct_values(lambda span, values_of=codes_of: values_of(rows[span]), len(rows), _SPAN_ROWS)
            codes_of = _indexes_into(distinct, codes_of)
            text_of = [text_of(v) for v in distinct.tolist()]
        texts, lengths = _texts(text_of)
        columns.append((codes_of, texts, lengths))
    content = [max((int(_name_spans(ends, rows[span])[1].max()) for span in spans), default=0)]
    for codes_of, _, lengths in columns:  # the widest text shown (not every code is)
        shown = np.zeros(len(lengths), bool)
        for span in spans:
            shown[codes_of(rows[span])] = True
        content.append(int(lengths[shown].max()) if shown.any() else 0)
    headers = [escape_controls(h) for h in headers]
    widths = [max(display_width(h) + 2, c) for h, c in zip(headers, content)]
    yield COLUMN_GAP.join(h + " " * (w - display_width(h)) for h, w in zip(headers, widths)).rstrip() + "\n"
    yield COLUMN_GAP.join("-" * w for w in widths)
    offsets = [0]
    for w in widths[:-1]:
        offsets.append(offsets[-1] + w + len(COLUMN_GAP))
    line = offsets[-1] + widths[-1] + 1
    block = max(1, BLOCK_BYTES // line)
    buf = np.frombuffer(table.names, np.uint8)
    index = np.int32 if len(buf) < 1 << 31 else np.int64  # the gather's positions (a block is ~256 KB of text)
    for first in range(0, len(rows), block):
        chosen = slice(first, first + block)
        k = len(rows[chosen])
        out = np.full((k, line), _SPACE, np.uint8)
        name_starts, lengths = _name_spans(ends, rows[chosen])  # a block's names (no column of every row's)
        total = int(lengths.sum())
        if total:  # the names' bytes, each into its row (one gather for the whole block, in place)
            j = np.arange(total, dtype=index)  # each byte's place in its name
            j -= np.repeat((np.cumsum(lengths) - lengths).astype(index), lengths)
            src = np.repeat(name_starts.astype(index), lengths)
            src += j
            dest = np.repeat(np.arange(k, dtype=index) * line, lengths)
            dest += j
            del j
            out.reshape(-1)[dest] = buf[src]
            del src, dest
        codes = None
        for (codes_of, texts, _), offset, width in zip(columns, offsets[1:], widths[1:]):
            codes = codes_of(rows[chosen])
            shown = min(width, texts.shape[1])  # texts of codes no row shows may be wider
            out[:, offset : offset + shown] = texts[codes, :shown]
        last_lengths = columns[-1][2]
        ends_at = offsets[-1] + last_lengths[codes]  # the last cell ends the line
        out[np.arange(k), ends_at] = _NEWLINE
        keep = np.arange(line)[None, :] <= ends_at[:, None]
        text = out[keep].tobytes().decode("ascii")
        yield "\n" + text[:-1]  # lines joined by newlines, as the table's text


def _indexes_into(distinct: Any, values_of: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``codes(rows)``: each row's index into ``distinct`` (sorted; every value of the rows in it)."""
    import numpy as np  # noqa: PLC0415

    return lambda rows: np.searchsorted(distinct, values_of(rows)).astype(np.int32)


def _name_spans(ends: Any, rows: Any) -> tuple[Any, Any]:
    """Where the names of ``rows`` start in the names' buffer, and their lengths."""
    import numpy as np  # noqa: PLC0415

    starts = np.where(rows > 0, ends[rows - 1], 0)
    return starts, ends[rows] - starts


_SPAN_ROWS = 1 << 16  # rows measured at a time for the names' column width


def json_chunks(doc: dict[str, Any], items: Iterable[dict[str, Any]], key: str = "variables",
                per_chunk: int = 4096) -> Iterator[str]:
    """``to_json(doc)`` with ``items`` as the list of its top-level ``key`` (``doc`` holds it
    empty, at any place), written a few thousand items at a time, each as
    ``json.dumps(..., indent=2)`` places it two levels deep: a million of them never held."""
    text = to_json(doc)
    # The empty list's line: a top-level key is the only text after a newline and two spaces
    # (strings escape their newlines and quotes, nested keys are indented further).
    marker = f'\n  {to_json(key)}: []'
    head, found, tail = text.partition(marker)
    if not found:  # pragma: no cover - a caller's document always has its list
        raise ValueError(f"the document has no empty {key!r} list")
    opening = marker[:-1] + "\n"
    batch: list[str] = []
    started = False
    for item in items:
        batch.append("    " + to_json(item).replace("\n", "\n    "))
        if len(batch) >= per_chunk:
            yield (",\n" if started else head + opening) + ",\n".join(batch)
            started, batch = True, []
    if batch:
        yield (",\n" if started else head + opening) + ",\n".join(batch)
        started = True
    yield ("\n  ]" + tail) if started else text
