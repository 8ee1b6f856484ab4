"""Views of the commands that write or load weights: ``extract``, ``rewrite``, ``average``,
``transplant``, ``doctor``."""

from __future__ import annotations

from typing import Any

from .. import model as m
from ._core import (
    AUTO,
    Column,
    OutputFormat,
    fmt_shape,
    human_bytes,
    render,
    to_json,
)

__all__ = ['transplant_refusal', 'transplant_summary', 'transplant_view', 'extract_view', 'rewrite_view', 'average_view', 'doctor_verdict', 'doctor_view', 'doctor_map_view', 'doctor_assignment_map_view']


REFUSAL_PROBLEMS_SHOWN = 5
LEFT_AT_INIT_SHOWN = 5  # weights a verdict or footer names before "and N more"


def names_shown(names, shown: int = LEFT_AT_INIT_SHOWN) -> str:
    """``a, b, c and 2 more``."""
    names = list(names)
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def transplant_refusal(report, problems, *, src: str, builder: str) -> tuple[str, list[str]]:
    """What the command line says when strict ``transplant`` refuses: the ``Error:`` message (a
    short summary), then lines with the first few problems, the flags by their command-line
    names, and the ``doctor`` command that explains every weight.

    Returns:
        (the message of the ``Error:`` line, the lines after it).
    """
    import shlex  # noqa: PLC0415

    s = report.summary()
    kinds = [(s["shape_mismatch"] if not report.skip_mismatch else 0, "shape mismatch"),
             (s["dtype_mismatch"] if not report.skip_mismatch else 0, "dtype mismatch"),
             (s["left_at_init"], "left at init"), (s["unused"], "unused in the source")]
    counts = ", ".join(f"{n} {what}" for n, what in kinds if n)
    n = len(problems)
    message = (f"{report.source}: cannot transplant into {report.model!r}: {n} problem{'s' if n != 1 else ''}"
               f" ({counts}); nothing written")
    lines = [f"  {p}" for p in problems[:REFUSAL_PROBLEMS_SHOWN]]
    if n > REFUSAL_PROBLEMS_SHOWN:
        lines.append(f"  ... and {n - REFUSAL_PROBLEMS_SHOWN} more")
    ways = ["--no-strict transplants what matches"]
    if report.mismatches and not report.skip_mismatch:
        ways.append("--skip-mismatch leaves mismatched shapes at init")
    if report.left_at_init or report.unused:
        ways.append("--map 'REGEX=REPLACEMENT' renames source variables")
        if not report.by_order:
            ways.append("--by-order pairs the remaining layers by order and shape")
    lines += [f"hint: {way}" for way in ways]
    lines.append(f"hint: ckptinspect doctor {shlex.quote(src)} --builder {shlex.quote(builder)} explains every weight"
                 " and prints the fix")
    return message, lines


def transplant_summary(report) -> str:
    """``str(report)`` of a :class:`~ckptinspect.ops.model.transplant.TransplantReport`: a few plain lines."""
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
    """Render a :class:`~ckptinspect.ops.model.transplant.TransplantReport` (and the written output)."""
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



def extract_view(report, fmt: OutputFormat, width: int | None = AUTO) -> str:
    """Render an :class:`~ckptinspect.ops.extract.operation.ExtractReport`: a per-role kept/dropped table
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
    left = getattr(report, "left_at_init", ())
    if left:  # the last line says it (exit 1 in the CLI), as transplant's does
        footer += ["", f"incomplete: {len(left)} of {report.verified + len(left)} model weights did not receive a value "
                       f"(left at init: {names_shown(left)})"]
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
    """Render a :class:`~ckptinspect.ops.rewrite.report.RewriteReport`: counts and sizes per role
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

    def cell(action: str, role: str, key: str = "nbytes") -> tuple[int, str]:
        row = totals[action][role]
        return (row["count"], human_bytes(row[key])) if row["count"] else (0, "-")

    rows = []
    for r in ("model", "optimizer", "metadata", "all"):
        kept, renamed, dropped, cast = cell("kept", r), cell("renamed", r), cell("dropped", r), cell("cast", r)
        cast_new = cell("cast", r, "new_nbytes")[1]
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
    """Render an :class:`~ckptinspect.ops.average.operation.AverageReport`: the inputs, then averaged /
    copied / dropped per role (table), one row per variable (csv), or the whole report (json)."""
    method = "mean" if report.method == "mean" else f"ema, decay {report.decay:g}"
    header = [f"inputs:   {len(report.inputs)}, {method} in float64, oldest first"]
    newest = "  <- newest: integers, strings, metadata" + (", object graph" if report.object_graph else "")
    for i in report.inputs:
        step = m.place_in_run(i.step, i.number, i.number_source) or "step ?"
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
    """The verdict line of a :class:`~ckptinspect.ops.doctor.operation.DoctorReport`."""
    s = report.summary()
    total = s["weights"]
    strict = getattr(report, "strict", True)
    if report.ok:
        left_out = (f"; {s['unused']} unused source variable{'s' if s['unused'] != 1 else ''} left out (--no-strict)"
                    if not strict and s["unused"] else "")
        return f"verdict:  OK: every model weight has a source value that fits ({s['matched']} of {total}){left_out}"
    parts = [f"{DOCTOR_REASON_TITLES[k]} {s[k]}" for k in ("missing", "shape_mismatch", "dtype_mismatch", "ambiguous") if s[k]]
    if not strict:  # what transplant and extract --builder --no-strict do: these weights keep their initial values
        left = [w.target for w in report.left_at_init]
        return (f"verdict:  FAIL: {len(left)} of {total} model weights would be left at init with --no-strict "
                f"({', '.join(parts)}): {names_shown(left)}")
    if not parts:  # every weight has a value; source variables are left over (transplant and extract refuse it)
        return (f"verdict:  FAIL: every model weight has a source value that fits ({s['matched']} of {total}), but "
                f"{s['unused']} source variable{'s' if s['unused'] != 1 else ''} would be left unused")
    if s["unused"]:
        parts.append(f"{DOCTOR_REASON_TITLES['unused']} {s['unused']}")
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
    """Render a :class:`~ckptinspect.ops.doctor.operation.DoctorReport`: one row per model weight and per
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
    if report.output is None:
        renames = len(report.map_rules) - len(report.mapping)
        fixes = list(report.flags)
        if renames > 0:
            fixes.append(f"--emit map ({renames} --map rule{'s' if renames != 1 else ''}"
                         f"{', checked' if report.map_verified else ', NOT reproducing every pair'})")
        if report.assignment_map is not None and report.complete:
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
    import json  # noqa: PLC0415 - this view only

    return json.dumps(amap, indent=2) + "\n"


