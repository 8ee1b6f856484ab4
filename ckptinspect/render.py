"""The only formatting code: rows to table / JSON / CSV, sizes and shapes for people.

Every listing command builds one JSON document and one list of row dicts, and calls
:func:`render` with the chosen :class:`OutputFormat`.
"""

from __future__ import annotations

import csv
import enum
import io
import json
import math
from typing import Any, Iterable, Sequence

from tabulate import tabulate

from .model import format_shape

__all__ = ["OutputFormat", "render", "human_bytes", "fmt_shape", "fmt_float", "Column"]


class OutputFormat(str, enum.Enum):
    """``--format`` of every listing command."""

    table = "table"
    json = "json"
    csv = "csv"


Column = tuple[str, str]  # (row key, table header)


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
) -> str:
    """Render one listing.

    Args:
        fmt: table, json or csv.
        doc: The whole JSON document (used for ``json``).
        rows: One dict per row (used for ``table`` and ``csv``).
        columns: (row key, header) pairs of the table.
        header: Lines printed above the table.
        footer: Lines printed below the table.
        csv_columns: Row keys for CSV (default: the table's keys).

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
    parts = list(header)
    if rows:
        table = simple_table([h for _, h in columns], [[row.get(k, "") for k, _ in columns] for row in rows])
        parts += ["", table] if header else [table]
    parts += list(footer)
    return "\n".join(parts) + "\n"


def simple_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """The layout of tabulate's ``simple`` format (cells as strings, left-aligned), built in
    one pass: listings have thousands of rows and tabulate costs ~25 us a row."""
    cells = [["" if c is None else str(c) for c in row] for row in rows]
    widths = [len(h) + 2 for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            if len(c) > widths[i]:
                widths[i] = len(c)
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip(), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def _csv_cell(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return "" if value is None else value


# -- views: one per command ---------------------------------------------------------------
def diff_view(report, fmt: OutputFormat) -> str:
    """Render a :class:`~ckptinspect.ops.diff.DiffReport`: variables by movement, layers, verdict."""
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
                    "dtype_a", "dtype_b", "max_abs_diff", "rel_l2", "cosine", "num_different", "nan_a", "inf_a", "nan_b", "inf_b"]
        return render(fmt, doc=report.to_dict(), rows=rows, columns=[(c, c) for c in csv_cols])
    header = [
        f"a: {report.a} ({report.format_a})",
        f"b: {report.b} ({report.format_b})",
        f"aligned by {report.alignment}" + (f", role {report.role}" if report.role else "")
        + (f", --map {' '.join(report.mapping)}" if report.mapping else ""),
    ]
    header += [f"note: {n}" for n in report.notes]
    columns: list[Column] = [("shown_name", "name"), ("status", "status"), ("shape", "shape"), ("dtype", "dtype"),
                             ("max_abs", "max abs diff"), ("rel", "rel l2"), ("cos", "cosine"),
                             ("diff_elems", "differing"), ("nan", "nan a/b"), ("inf", "inf a/b")]
    layers = report.layers
    moved = [s for s in layers if s.changed]
    footer: list[str] = []
    if layers:
        footer += ["", "layers:"]
        if moved:
            footer += simple_table(
                ["layer", "differ", "max rel l2", "max abs diff"],
                [[s.layer or "(top level)", f"{s.changed}/{s.variables}", fmt_float(s.max_rel_l2),
                  fmt_float(s.max_abs_diff)] for s in moved],
            ).splitlines()
        unchanged = len(layers) - len(moved)
        footer.append(f"{unchanged} layer{'s' if unchanged != 1 else ''} unchanged" if moved else
                      f"all {len(layers)} layer{'s' if len(layers) != 1 else ''} unchanged")
    footer += ["", report.verdict]
    return render(fmt, doc={}, rows=rows, columns=columns, header=header, footer=footer)


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


def transplant_view(report, fmt: OutputFormat, output=None) -> str:
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
    return render(fmt, doc=doc, rows=rows, columns=columns, header=header,
                  csv_columns=["target", "shape", "dtype", "source", "key", "matched_by", "status"])


def ls_view(listing, fmt: OutputFormat, tree: bool = False) -> str:
    """Render an :class:`~ckptinspect.ops.listing.Listing`."""
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
    width = max(9, *(len(label) + 2 for label, _ in fields))
    header = [f"{label + ':':<{width}}{value}" for label, value in fields]
    if ckpt.checkpoints:
        header += ["", "checkpoints:"]
        header += tabulate(
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
            headers=["", "prefix", "step", "saved", "exists", "in state file"],
            tablefmt="simple",
            disable_numparse=True,
        ).splitlines()
    if len(listing.variables) != len(ckpt.variables):
        header.append(f"\nshowing {len(listing.variables)} of {len(ckpt.variables)} variables")
    columns: list[Column] = [("name", "name"), ("shape", "shape"), ("dtype", "dtype"), ("size", "size"),
                             ("shards", "shard"), ("role", "role")]
    if stats is not None:
        columns += [("min", "min"), ("max", "max"), ("mean", "mean"), ("std", "std"), ("nan", "nan"), ("inf", "inf")]
    rows = []
    for v in (sorted(listing.variables, key=lambda v: v.name) if tree else listing.variables):
        row = {
            "key": v.key,
            "name": v.name,
            "shape": fmt_shape(v.shape),
            "dtype": v.dtype,
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
    return render(fmt, doc=listing.to_dict(), rows=rows, columns=columns, header=header, csv_columns=csv_cols)


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


def verify_view(report, fmt: OutputFormat) -> str:
    """Render a :class:`~ckptinspect.ops.verify.VerifyReport`: verdict, checkpoints, damage."""
    summary = report.summary()
    newest = report.newest_intact
    n = summary["checkpoints"]
    if report.intact:
        verdict = (f"INTACT: {n} of {n} checkpoint{'s' if n != 1 else ''} whole, {summary['tensors']} tensors"
                   f" ({human_bytes(summary['bytes'])}) checked")
    else:
        word = "DAMAGED" if summary["damaged"] else "INCOMPLETE"
        verdict = (f"{word}: {summary['damaged']} damaged, {summary['missing']} missing of {n} checkpoint"
                   f"{'s' if n != 1 else ''}; {summary['damaged_tensors']} damaged tensors")
    header = [f"path:    {report.path}", f"format:  {report.format}", f"verdict: {verdict}"]
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
    header += tabulate(
        [
            ["*" if c.latest else "", c.path, "-" if c.step is None else c.step, c.status, c.tensors,
             human_bytes(c.nbytes), len(c.damaged), problem_cell(c)]
            for c in report.checkpoints
        ],
        headers=["", "checkpoint", "step", "status", "tensors", "checked", "damaged", "problem"],
        tablefmt="simple",
        disable_numparse=True,
    ).splitlines()
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
    text = "\n".join(header) + "\n"
    tensor_rows = [r for r in rows if r["kind"] != "checkpoint"]
    if tensor_rows:
        text += "\ndamaged tensors:\n" + render(fmt, doc={}, rows=tensor_rows, columns=columns)
    return text


def extract_view(report, fmt: OutputFormat) -> str:
    """Render an :class:`~ckptinspect.ops.extract.ExtractReport`: a per-role kept/dropped table
    (table), one row per source variable (csv), or the whole report (json)."""
    kept, dropped = report.kept, report.dropped
    shards = f", {report.num_shards} data shard{'s' if report.num_shards != 1 else ''}" if report.output_format == "tf" else ""
    header = [
        f"source:   {report.source} ({report.source_format})",
        f"output:   {report.output} ({report.output_format}{shards})",
        f"files:    {', '.join(report.files)}",
        f"check:    {report.verified} kept tensor{'s' if report.verified != 1 else ''} read back bit-identical",
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
        return render(fmt, doc={}, rows=rows, columns=columns, header=header, footer=footer)
    rows = [
        {"name": v.name, "key": v.key, "output_key": v.output_key or "", "role": v.role,
         "shape": fmt_shape(v.shape), "dtype": v.dtype, "nbytes": v.nbytes, "kept": "yes" if v.kept else "no"}
        for v in report.variables
    ]
    columns = [("name", "name"), ("key", "key"), ("output_key", "output key"), ("role", "role"),
               ("shape", "shape"), ("dtype", "dtype"), ("nbytes", "bytes"), ("kept", "kept")]
    return render(fmt, doc=report.to_dict(), rows=rows, columns=columns)
