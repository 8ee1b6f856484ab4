"""Views of the inspecting commands: ``ls``, ``verify``, ``diff``."""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from .. import model as m
from ._core import (
    AUTO,
    Column,
    OutputFormat,
    UNREADABLE_MARK,
    _table_lines,
    csv_cell,
    escape_controls,
    fit_lines,
    fmt_float,
    fmt_shape,
    human_bytes,
    render,
    render_chunks,
    terminal_width,
)
from ._columns import json_chunks, plain_names, table_chunks

__all__ = ['diff_chunks', 'diff_view', 'ls_chunks', 'ls_view', 'ls_warnings', 'verify_view']


def diff_view(report, fmt: OutputFormat, width: int | None = AUTO, *, hide_equal: bool = False) -> str:
    """Render a :class:`~ckptinspect.ops.diff.operation.DiffReport` (see :func:`diff_chunks`)."""
    return "".join(diff_chunks(report, fmt, width, hide_equal=hide_equal))


def diff_chunks(report, fmt: OutputFormat, width: int | None = AUTO, *, hide_equal: bool = False) -> Iterator[str]:
    """:func:`diff_view`'s text in pieces, the table and CSV rows made twice rather than held
    (a diff of a million variables): variables by movement, layers, verdict.

    The table shows the NaN/Inf columns only when a variable has a NaN or an Inf; fitted to a
    narrow terminal it leaves out ``differing``, ``dtype``, ``cosine``, then ``shape`` (and says
    so) before it shortens a name: names are what people read. ``hide_equal`` leaves the equal
    variables out of the rows (and of the JSON ``variables``; the summary still counts them).
    """
    def shown_variables() -> Iterator[Any]:  # made afresh at each pass: a million rows are never held
        return (v for v in report.variables if not (hide_equal and v.status == "equal"))

    def pair(x, y, show=str) -> str:
        if x is None or y is None:
            return show(x if y is None else y) if (x, y) != (None, None) else "-"
        return show(x) if x == y else f"{show(x)} -> {show(y)}"

    def counts(x, y) -> str:
        return "-" if x is None else f"{x}/{y}"

    if fmt == OutputFormat.json:  # the document, its variables written a few thousand at a time
        yield from json_chunks(report.to_dict(variables=False), (v.to_dict() for v in shown_variables()))
        yield "\n"
        return
    table = fmt == OutputFormat.table

    def rows() -> Iterator[dict[str, Any]]:
        for v in shown_variables():
            size = 1
            for d in v.shape_a or v.shape_b or ():
                size *= d
            yield {
                **({"status": v.status} if table else
                   {**v.to_dict(), **{k: None if getattr(v, k) is None else fmt_shape(getattr(v, k))  # as ls: [8,16]
                                      for k in ("shape_a", "shape_b")}}),  # the table shows no other field of it
                "shown_name": f"{v.name_a} -> {v.name_b}" if v.names_differ else v.name,
                "shape": pair(v.shape_a, v.shape_b, fmt_shape),
                "dtype": pair(v.dtype_a, v.dtype_b),
                "max_abs": fmt_float(v.max_abs_diff),
                "rel": fmt_float(v.rel_l2),
                "cos": fmt_float(v.cosine, 6),
                "diff_elems": "-" if v.num_different is None else f"{v.num_different}/{size}",
                "nan": counts(v.nan_a, v.nan_b),
                "inf": counts(v.inf_a, v.inf_b),
            }

    if fmt != OutputFormat.table:
        csv_cols = ["name", "status", "name_a", "name_b", "key_a", "key_b", "matched_by", "role", "shape_a", "shape_b",
                    "dtype_a", "dtype_b", "max_abs_diff", "rel_l2", "cosine", "num_different", "nan_a", "inf_a", "nan_b", "inf_b",
                    "layout"]
        yield from render_chunks(fmt, doc={}, rows=rows, columns=[(c, c) for c in csv_cols])
        return
    header = _diff_header(report)
    if width == AUTO:
        width = terminal_width()
    columns: list[Column] = [("shown_name", "name"), ("status", "status"), ("shape", "shape"), ("dtype", "dtype"),
                             ("max_abs", "max abs diff"), ("rel", "rel l2"), ("cos", "cosine"),
                             ("diff_elems", "differing")]
    if report.has_nonfinite:
        columns += [("nan", "nan a/b"), ("inf", "inf a/b")]
    footer = [*_diff_layers(*report.moved_layers, width), "", report.verdict]
    yield from render_chunks(fmt, doc={}, rows=rows, columns=columns, header=header, footer=footer, width=width,
                             squeeze=["shown_name"], optional=["diff_elems", "dtype", "cos", "shape"],
                             names_first=True)




def _diff_header(report) -> list[str]:
    """The lines above diff's table: the two sides, how they were aligned, the notes."""
    return [
        f"a: {report.a} ({report.format_a})",
        f"b: {report.b} ({report.format_b})",
        f"aligned by {report.alignment}" + (f", role {report.role}" if report.role else "")
        + (f", --map {' '.join(report.mapping)}" if report.mapping else "")
        + (f", {' '.join(report.layout)}" if report.layout else ""),
        *(f"note: {n}" for n in report.notes),
    ]


def _diff_layers(moved, count: int, width: int | None) -> list[str]:
    """The layers block below diff's table (none when the report has no layers): the layers that
    moved (``moved``, of ``count`` layers), then how many did not."""
    if not count:
        return []
    lines = ["", "layers:"]
    if moved:
        lines += _table_lines(
            ["layer", "differ", "max rel l2", "max abs diff"],
            [[s.layer or "(top level)", f"{s.changed}/{s.variables}", fmt_float(s.max_rel_l2),
              fmt_float(s.max_abs_diff)] for s in moved],
            width=width, squeeze=[0],
        )
    unchanged = count - len(moved)
    lines.append(f"{unchanged} layer{'s' if unchanged != 1 else ''} unchanged" if moved else
                 f"all {count} layer{'s' if count != 1 else ''} unchanged")
    return lines


INFO_CLIP = 160


def _clip(text: str) -> str:
    return text if len(text) <= INFO_CLIP else text[: INFO_CLIP - 3] + "..."


def _step_field(ckpt) -> str:
    """The training step with its source, and the checkpoint's number as what it is:
    ``9360 (from optimizer:optimizer/iter); checkpoint 7``, ``- (no step variable; epoch 3)``."""
    number = m.place_in_run(None, ckpt.number, ckpt.number_source)
    if ckpt.step is not None:
        return f"{ckpt.step} (from {ckpt.step_source})" + (f"; {number}" if number else "")
    return f"- (no step variable; {number})" if number else "-"


def _header_fields(ckpt) -> list[tuple[str, Any]]:
    """The header's ``label: value`` lines: path, format, step, shards, totals, then what the
    format knows (model, optimizer, Keras version, save date, unallocated datasets, metadata, ties)."""
    step = _step_field(ckpt)
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
    if info.get("date_committed"):  # Orbax: when every host had finished
        fields.append(("committed", info["date_committed"]))
    if info.get("mesh"):  # Orbax: the device mesh the arrays were sharded over
        processes = info.get("processes") or []
        fields.append(("mesh", info["mesh"] + (f" ({len(processes)} process database{'s' if len(processes) != 1 else ''})"
                                               if processes else "")))
    if info.get("unallocated"):  # datasets declared but never written: no values, no stats
        empty = info["unallocated"]
        more = f" (+{len(empty) - 3} more)" if len(empty) > 3 else ""
        fields.append(("warning", f"{len(empty)} dataset{'s' if len(empty) != 1 else ''} declared but unallocated"
                                  f" (never written, no values): {', '.join(empty[:3])}{more}"))
    if isinstance(info.get("metadata"), dict) and info["metadata"]:  # safetensors __metadata__
        fields.append(("metadata", _clip(", ".join(f"{k}={v}" for k, v in info["metadata"].items()))))
    if info.get("tied"):  # torch: names sharing one tensor
        fields.append(("tied", _clip("; ".join(" = ".join(group) for group in info["tied"]))))
    return fields


def _checkpoint_lines(ckpt, width: int | None) -> list[str]:
    """A directory's checkpoints (the series), newest marked ``*``; nothing for one checkpoint."""
    if not ckpt.checkpoints:
        return []
    return ["", "checkpoints:", *_table_lines(
        ["", "prefix", "step", "number", "saved", "exists", "in state file"],
        [
            [
                "*" if c.latest else "",
                c.path,
                "-" if c.step is None else c.step,
                "-" if c.number is None else c.number,
                _fmt_time(c.timestamp),
                "yes" if c.exists else "MISSING",
                "yes" if c.in_state_file else "no",
            ]
            for c in ckpt.checkpoints
        ],
        width=width, squeeze=[1],
    )]


def _variable_rows(listing, fmt: OutputFormat, tree: bool) -> list[dict[str, Any]]:
    """One row per listed variable (the stats' figures when ``--stats``), in tree order for ``--tree``."""
    rows = list(_variable_rows_iter(listing, fmt, tree))
    if tree and fmt == OutputFormat.table:
        rows = _tree_rows(rows)
    return rows


def _variable_rows_iter(listing, fmt: OutputFormat, tree: bool) -> Iterator[dict[str, Any]]:
    """:func:`_variable_rows` one at a time (without the tree's subtotal rows)."""
    stats = listing.stats
    unreadable = listing.checkpoint.info.get("unreadable") or {}
    specs = listing.checkpoint.info.get("partition_specs") or {}  # Orbax: each array's partition spec
    shapes: dict[tuple, str] = {}  # thousands of variables, a few distinct shapes and sizes
    sizes: dict[int, str] = {}
    for v in (sorted(listing.variables, key=lambda v: v.name) if tree else listing.variables):
        dims = tuple(v.shape)
        shape = shapes.get(dims)
        if shape is None:
            shape = shapes[dims] = fmt_shape(dims)
        size = sizes.get(v.nbytes)
        if size is None:
            size = sizes[v.nbytes] = human_bytes(v.nbytes)
        row = {
            "key": v.key,
            "name": v.name,
            "shape": shape,
            "dtype": v.dtype + (UNREADABLE_MARK if v.key in unreadable and fmt == OutputFormat.table else ""),
            "size": size,
            "nbytes": v.nbytes,
            "shards": ",".join(str(s) for s in v.shards) or "-",
            "role": v.role,
        }
        if specs:
            row["partition"] = specs.get(v.key, "-")
        if stats is not None:
            s = stats.get(v.key)
            for f in ("min", "max", "mean", "std"):
                row[f] = fmt_float(getattr(s, f)) if s else "-"
            row["nan"] = s.nan if s else "-"
            row["inf"] = s.inf if s else "-"
        yield row


def ls_view(listing, fmt: OutputFormat, tree: bool = False, width: int | None = AUTO) -> str:
    """Render an :class:`~ckptinspect.ops.listing.Listing`."""
    return "".join(ls_chunks(listing, fmt, tree=tree, width=width))


def ls_chunks(listing, fmt: OutputFormat, tree: bool = False, width: int | None = AUTO) -> Iterator[str]:
    """:func:`ls_view`'s text in pieces: a listing of a :class:`~ckptinspect.model.VariableTable`
    (a checkpoint of very many variables) is written a block of rows at a time, never whole."""
    if width == AUTO and fmt == OutputFormat.table:
        width = terminal_width()
    ckpt = listing.checkpoint
    fields = _header_fields(ckpt)
    label_width = max(9, *(len(label) + 2 for label, _ in fields))
    header = [f"{label + ':':<{label_width}}{value}" for label, value in fields]
    header += _checkpoint_lines(ckpt, width)
    if len(listing.variables) != len(ckpt.variables):
        header += ["", f"showing {len(listing.variables)} of {len(ckpt.variables)} variables"]
    columns: list[Column] = [("name", "name"), ("shape", "shape"), ("dtype", "dtype"), ("size", "size"),
                             ("shards", "shard"), ("role", "role")]
    csv_cols = ["key", "name", "shape", "dtype", "nbytes", "shards", "role"]
    if ckpt.info.get("partition_specs"):
        columns.insert(5, ("partition", "partition"))
        csv_cols.append("partition")
    if listing.stats is not None:
        columns += [("min", "min"), ("max", "max"), ("mean", "mean"), ("std", "std"), ("nan", "nan"), ("inf", "inf")]
        csv_cols += ["min", "max", "mean", "std", "nan", "inf"]
    table = listing.variables if isinstance(listing.variables, m.VariableTable) else None
    if table is not None and fmt == OutputFormat.json:
        yield from json_chunks(listing.to_dict(variables=False), listing.variable_dicts())
        yield "\n"
        return
    plain = (table is not None and fmt == OutputFormat.table and not tree and listing.stats is None
             and len(columns) == 6 and not ckpt.info.get("unreadable") and len(table) and plain_names(table))
    if plain:
        chunks = _column_table(table, [h for _, h in columns])
        first, dashes = next(chunks), next(chunks)
        if width is None or len(dashes) <= width:  # the table fits as it is: no column shortened
            parts = fit_lines(header, width)
            yield "\n".join(parts + ([""] if header else [])) + ("\n" if header else "")
            yield first
            yield dashes
            yield from chunks
            yield "\n"
            return
    if table is not None and fmt == OutputFormat.csv:
        yield from _csv_chunks(_variable_rows_iter(listing, fmt, tree), csv_cols)
        return
    rows = _variable_rows(listing, fmt, tree)
    doc = listing.to_dict() if fmt == OutputFormat.json else {}  # the table and CSV show rows only
    yield render(fmt, doc=doc, rows=rows, columns=columns, header=header, csv_columns=csv_cols, width=width)


def _column_table(table, headers: list[str]) -> Iterator[str]:
    """The ls table of a :class:`~ckptinspect.model.VariableTable` (printable ASCII names), from its columns."""
    return table_chunks(headers, table, [
        (lambda rows: table.shape_codes[rows], [fmt_shape(s) for s in table.shapes]),
        (lambda rows: table.dtype_codes[rows], list(table.dtypes)),
        (lambda rows: table.nbytes[rows], human_bytes),
        (lambda rows: table.shard_codes[rows], [",".join(str(s) for s in shards) or "-" for shards in table.shards]),
        (lambda rows: table.role_codes[rows], list(table.roles)),
    ])


def _csv_chunks(rows: Iterable[dict[str, Any]], keys: list[str], per_chunk: int = 8192) -> Iterator[str]:
    """:func:`render`'s CSV of ``rows``, a few thousand rows at a time."""
    import csv  # noqa: PLC0415
    import io  # noqa: PLC0415

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=keys, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for i, row in enumerate(rows, 1):
        writer.writerow({k: csv_cell(row.get(k)) for k in keys})
        if i % per_chunk == 0:
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue()


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
        ["", "checkpoint", "step", "number", "status", "tensors", "checked", "damaged", "problem"],
        [
            ["*" if c.latest else "", c.path, "-" if c.step is None else c.step,
             "-" if c.number is None else c.number, c.status, c.tensors,
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


