"""The ``ckptinspect`` command line: parse, call the library, render, map errors to exit codes.

Exit codes (shared/INTERFACE.md): 0 success; 1 ``diff`` found differences / ``verify``
found damage; 2 error, with one ``Error: ...`` line on stderr (a traceback only with
``--debug``).
"""

from __future__ import annotations

import enum
import functools
import os
import re
import shutil
import sys
import time
import traceback
from typing import Callable, Optional

import typer

from . import errors
from ._typer_app import _NOT_FAST, LazyApp, _fast_get_runtime_param, fast_value  # noqa: F401 - cli.fast_value...
from ._typer_app import Command as _Command
from ._typer_app import Group as _Group
from .render import OutputFormat

EXIT_OK = 0
EXIT_DIFFERENT = 1
EXIT_ERROR = 2


app = LazyApp(
    name="ckptinspect",
    cls=_Group,
    help="Inspect, compare and operate on TensorFlow and Keras checkpoints.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_state = {"debug": False}
DEBUG_HELP = "Show tracebacks on errors (before or after the command)."


def _set_debug(value: bool) -> bool:
    if value:
        _state["debug"] = True
    return value


FormatOption = typer.Option(OutputFormat.table, "--format", "-f", help="Output format.", case_sensitive=False,
                            metavar="[table|json|csv]")
# --debug is accepted after the command too (`ckptinspect ls X --debug`): every command has it.
DebugOption = typer.Option(False, "--debug", help=DEBUG_HELP, callback=_set_debug, expose_value=False)
OptimizerPatternOption = typer.Option(
    None, "--optimizer-pattern", metavar="REGEX",
    help="Also treat variables whose name or key matches REGEX as optimizer state (for names no rule knows).",
)


@app.callback()
def _main(
    debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
) -> None:
    """Inspect, compare and operate on TensorFlow and Keras checkpoints."""
    _state["debug"] = debug


def fail(message: str) -> None:
    """Print one ``Error:`` line (control characters escaped, so a name from a file cannot
    break the line or drive the terminal) and exit 2."""
    from .render import escape_controls  # noqa: PLC0415

    typer.echo(f"Error: {escape_controls(message)}", err=True)
    raise typer.Exit(EXIT_ERROR)


def handle_errors(fn: Callable) -> Callable:
    """Turn library errors (and anything unexpected) into one ``Error:`` line and exit 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            typer.echo("Error: interrupted", err=True)
            raise typer.Exit(130) from None
        except errors.CkptError as e:
            if _state["debug"]:  # --debug adds the traceback; the Error line and exit 2 stay
                traceback.print_exc()
            fail(str(e))
        except Exception as e:  # noqa: BLE001 - the CLI promises no traceback without --debug
            if _state["debug"]:
                traceback.print_exc()
            text = str(e).strip()
            fail(f"unexpected {type(e).__name__}: {text.splitlines()[0] if text else ''}"
                 + ("" if _state["debug"] else " (run with --debug for the traceback)"))

    return wrapper


class Progress:
    """A one-line progress indicator on stderr, only when stderr is a terminal and the work is
    long; the line fits the terminal's width, so it never wraps."""

    def __init__(self, label: str, min_seconds: float = 0.5):
        self.label = label
        self.enabled = sys.stderr.isatty()
        self.start = time.monotonic()
        self.min_seconds = min_seconds
        self.shown = False
        self.width = 0

    def _columns(self) -> int:
        try:
            return os.get_terminal_size(sys.stderr.fileno()).columns
        except (AttributeError, ValueError, OSError):
            return shutil.get_terminal_size().columns

    def __call__(self, done: int, total: int, item=None) -> None:
        if not self.enabled or time.monotonic() - self.start < self.min_seconds:
            return
        from .render import progress_line  # noqa: PLC0415

        self.width = self._columns()
        name = getattr(item, "name", "") or ""
        sys.stderr.write("\r" + progress_line(self.label, done, total, str(name), self.width))
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\r" + " " * max(self.width - 1, 1) + "\r")
            sys.stderr.flush()


def emit(text: str) -> None:
    """Write a rendered result to stdout."""
    sys.stdout.write(text)


@app.command("ls", cls=_Command)
@handle_errors
def ls_command(
    path: str = typer.Argument(..., metavar="PATH", help="Checkpoint prefix, .index file, directory, SavedModel, or Keras file."),
    filter: Optional[str] = typer.Option(None, "--filter", "-k", metavar="REGEX", help="Regex searched in names and keys."),
    role: Optional[str] = typer.Option(None, "--role", metavar="ROLE", help="Only variables of this role: model, optimizer or metadata."),
    stats: bool = typer.Option(False, "--stats", help="Add min/max/mean/std/NaN/Inf (reads every tensor, one at a time)."),
    tree: bool = typer.Option(False, "--tree", help="Group variables by layer path."),
    sort: str = typer.Option("role", "--sort", metavar="[role|name|size|file]", help="Order: role (model, optimizer, metadata), name, size or file."),
    optimizer_pattern: Optional[str] = OptimizerPatternOption,
    format: OutputFormat = FormatOption,
    _debug: bool = DebugOption,
) -> None:
    """List the variables of a checkpoint: shapes, dtypes, sizes, shards and roles."""
    from . import open as open_checkpoint  # noqa: PLC0415
    from .ops.listing import list_variables  # noqa: PLC0415
    from .render import ls_view, ls_warnings  # noqa: PLC0415

    ckpt = open_checkpoint(path)
    progress = Progress("stats") if stats else None
    try:
        listing = list_variables(ckpt, pattern=filter, role=role, sort=sort, stats=stats, progress=progress,
                                 optimizer_pattern=optimizer_pattern)
    finally:
        if progress:
            progress.close()
        ckpt.close()
    sys.stderr.write(ls_warnings(listing))
    emit(ls_view(listing, format, tree=tree))


TRANSPOSE_DENSE_HELP = "Source 2-D kernels are [out,in] (PyTorch Linear): transpose them to Keras' [in,out]."
CONV_LAYOUT_HELP = "Source conv kernels' layout: hwio (Keras, default) or oihw (PyTorch: reordered to HWIO)."
DIFF_TRANSPOSE_DENSE_HELP = "A's 2-D kernels are [out,in] (PyTorch Linear): compared transposed with B's [in,out]."
DIFF_CONV_LAYOUT_HELP = "A's conv kernels' layout: hwio (Keras, default) or oihw (PyTorch: compared reordered to HWIO)."


@app.command("diff", cls=_Command)
@handle_errors
def diff_command(
    a: str = typer.Argument(..., metavar="A", help="Checkpoint A: TF prefix, .index, directory, SavedModel or Keras file."),
    b: str = typer.Argument(..., metavar="B", help="Checkpoint B, of the same or another format."),
    atol: float = typer.Option(0.0, "--atol", metavar="FLOAT", help="Absolute tolerance (numpy isclose semantics; 0 = exact)."),
    rtol: float = typer.Option(0.0, "--rtol", metavar="FLOAT", help="Relative tolerance, of B's magnitude (0 = exact)."),
    role: Optional[str] = typer.Option(None, "--role", metavar="ROLE", help="Compare only model, optimizer or metadata variables."),
    maps: list[str] = typer.Option([], "--map", metavar="REGEX=REPLACEMENT", help="Applied to every name of A before aligning (repeatable; see docs/INTERFACE.md)."),
    optimizer_pattern: Optional[str] = OptimizerPatternOption,
    transpose_dense: bool = typer.Option(False, "--transpose-dense", help=DIFF_TRANSPOSE_DENSE_HELP),
    conv_layout: str = typer.Option("hwio", "--conv-layout", metavar="[hwio|oihw]", help=DIFF_CONV_LAYOUT_HELP),
    format: OutputFormat = FormatOption,
    _debug: bool = DebugOption,
) -> None:
    """Compare two checkpoints, also across formats (exit 0 equal within tolerance, 1 different)."""
    from .ops.diff.operation import diff  # noqa: PLC0415
    from .render import diff_view  # noqa: PLC0415

    progress = Progress("diff")
    try:
        report = diff(a, b, atol=atol, rtol=rtol, role=role, mapping=maps, progress=progress,
                      optimizer_pattern=optimizer_pattern, transpose_dense=transpose_dense,
                      conv_layout=conv_layout.lower())
    finally:
        progress.close()
    emit(diff_view(report, format))
    if not report.identical:
        raise typer.Exit(EXIT_DIFFERENT)


@app.command("verify", cls=_Command)
@handle_errors
def verify_command(
    path: str = typer.Argument(..., metavar="PATH", help="Checkpoint prefix, .index file, directory, SavedModel, or Keras file."),
    format: OutputFormat = FormatOption,
    _debug: bool = DebugOption,
) -> None:
    """Check that a checkpoint is whole: index, shards and every tensor's checksum (exit 1 if damaged)."""
    from .ops.verify import verify  # noqa: PLC0415
    from .render import verify_view  # noqa: PLC0415

    progress = Progress("verify")
    try:
        report = verify(path, progress=progress)
    finally:
        progress.close()
    emit(verify_view(report, format))
    if not report.intact:
        raise typer.Exit(EXIT_DIFFERENT)


ALLOW_RESHAPE_HELP = "A source value with as many elements as the model variable fits (it is reshaped)."


class Emit(str, enum.Enum):
    """``doctor --emit``: the fix to print or write."""

    map = "map"
    assignment_map = "assignment-map"
    weights = "weights"


_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
               "g": 1024**3, "gb": 1000**3, "gib": 1024**3}


def parse_size(text: str) -> int:
    """``256MiB`` / ``64M`` / ``1000000`` -> bytes (K, M, G are binary; KB, MB, GB decimal)."""

    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise errors.UsageError(f"bad size {text!r}; expected bytes or a number with K/M/G/KiB/MiB/GiB/KB/MB/GB")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


@app.command("extract", cls=_Command)
@handle_errors
def extract_command(
    src: str = typer.Argument(..., metavar="SRC", help="Source checkpoint: TF prefix or directory, SavedModel, Keras .h5/.weights.h5/.keras, torch.save file, .safetensors, Hugging Face folder."),
    output: str = typer.Option(..., "--output", "-o", metavar="OUT", help="Output: a TF prefix (no suffix, or .ckpt / .ckpt-N), or a .weights.h5 / .h5 / .npz / .safetensors file."),
    format: Optional[str] = typer.Option(None, "--format", metavar="[tf|weights-h5|h5|npz|safetensors]", help="Output format (default: from OUT's suffix; needed for any other suffix)."),
    builder: Optional[str] = typer.Option(None, "--builder", metavar="MODULE:FUNCTION", help="Function building the model (needed for .weights.h5 from a TF, PyTorch or safetensors checkpoint)."),
    maps: list[str] = typer.Option([], "--map", metavar="REGEX=REPLACEMENT", help=".weights.h5 with --builder: applied to every source name before pairing by name (repeatable)."),
    transpose_dense: bool = typer.Option(False, "--transpose-dense", help=".weights.h5 with --builder: " + TRANSPOSE_DENSE_HELP),
    conv_layout: str = typer.Option("hwio", "--conv-layout", metavar="[hwio|oihw]", help=".weights.h5 with --builder: " + CONV_LAYOUT_HELP),
    keep_metadata: bool = typer.Option(False, "--keep-metadata", help="Also keep step counters, save_counter, TF1 global_step."),
    max_shard_size: Optional[str] = typer.Option(None, "--max-shard-size", metavar="SIZE", help="TF output: bytes per data shard (e.g. 256MiB), filled in turn. Default: one data file; 0: one tensor (or slice) per shard."),
    force: bool = typer.Option(False, "--force", help="Replace an earlier output of the same kind (nothing else)."),
    optimizer_pattern: Optional[str] = OptimizerPatternOption,
    report_format: OutputFormat = typer.Option(OutputFormat.table, "--report", metavar="[table|json|csv]", help="Report as table, json or csv (one row per variable).", case_sensitive=False),
    _debug: bool = DebugOption,
) -> None:
    """Write the model's weights alone (optimizer state stripped), still restorable, and check them."""
    from .ops.extract.operation import extract  # noqa: PLC0415
    from .render import extract_view  # noqa: PLC0415

    progress = Progress("extract")
    try:
        report = extract(src, output, format=format, force=force, builder=builder,
                         keep=("model", "metadata") if keep_metadata else ("model",),
                         max_shard_bytes=None if max_shard_size is None else parse_size(max_shard_size),
                         progress=progress, optimizer_pattern=optimizer_pattern, mapping=maps,
                         transpose_dense=transpose_dense, conv_layout=conv_layout.lower())
    finally:
        progress.close()
    emit(extract_view(report, report_format))


@app.command("rewrite", cls=_Command)
@handle_errors
def rewrite_command(
    src: str = typer.Argument(..., metavar="SRC", help="Source checkpoint: TF prefix or directory, SavedModel, V1 table, Keras .weights.h5/.h5."),
    output: str = typer.Option(..., "--output", "-o", metavar="OUT", help="Output: a TF prefix for a TF source, a .weights.h5 / .h5 file for a Keras one."),
    rename: list[str] = typer.Option([], "--rename", metavar="REGEX=REPLACEMENT", help="Applied with re.sub to every readable name, in order (repeatable; --map semantics)."),
    drop: list[str] = typer.Option([], "--drop", metavar="REGEX", help="Leave out the variables whose (new) name matches (re.search; repeatable)."),
    role: list[str] = typer.Option([], "--role", metavar="[model|optimizer|metadata]", help="Keep only variables of this role (repeatable)."),
    cast: Optional[str] = typer.Option(None, "--cast", metavar="[float16|bfloat16|float32|float64]", help="Cast the model's float variables (and their optimizer slots) to this type."),
    cast_filter: Optional[str] = typer.Option(None, "--cast-filter", metavar="REGEX", help="Cast only the model variables whose (new) name matches (re.search)."),
    force: bool = typer.Option(False, "--force", help="Replace an earlier output of the same kind (nothing else)."),
    report_format: OutputFormat = typer.Option(OutputFormat.table, "--format", metavar="[table|json|csv]", help="Report as table, json or csv (one row per variable).", case_sensitive=False),
    _debug: bool = DebugOption,
) -> None:
    """Rename, drop and cast variables (in that order), writing a checked, restorable copy."""
    from .ops.rewrite.operation import rewrite  # noqa: PLC0415
    from .render import rewrite_view  # noqa: PLC0415

    progress = Progress("rewrite")
    try:
        report = rewrite(src, output, rename=rename, drop=drop, role=role, cast=cast, cast_filter=cast_filter,
                         force=force, progress=progress)
    finally:
        progress.close()
    emit(rewrite_view(report, report_format))


@app.command("transplant", cls=_Command)
@handle_errors
def transplant_command(
    src: str = typer.Argument(..., metavar="SRC", help="Source checkpoint: TF prefix or directory, Keras .h5/.weights.h5/.keras."),
    dst: str = typer.Argument(..., metavar="DST", help="Output: a TF checkpoint prefix, or a .weights.h5 / .keras file (by suffix)."),
    builder: str = typer.Option(..., "--builder", metavar="MODULE:FUNCTION", help="Function returning the model (called inside the strategy scope)."),
    strategy: str = typer.Option("default", "--strategy", metavar="[default|mirrored|multi-worker]", help="The tf.distribute strategy (multi-worker reads TF_CONFIG)."),
    replicas: Optional[int] = typer.Option(None, "--replicas", metavar="N", help="Logical CPU devices for --strategy mirrored (default 2)."),
    maps: list[str] = typer.Option([], "--map", metavar="REGEX=REPLACEMENT", help="Applied to every source name before pairing by name (repeatable; see docs/INTERFACE.md)."),
    skip_mismatch: bool = typer.Option(False, "--skip-mismatch", help="Leave variables whose shape/dtype differ at init instead of failing."),
    strict: bool = typer.Option(True, "--strict/--no-strict", help="Fail on any problem (default), or transplant what matches."),
    by_order: bool = typer.Option(False, "--by-order", help="Also pair layers nothing else paired by layer order and shape."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the plan; assign and write nothing."),
    force: bool = typer.Option(False, "--force", help="Replace an earlier DST of the same kind (nothing else)."),
    transpose_dense: bool = typer.Option(False, "--transpose-dense", help=TRANSPOSE_DENSE_HELP),
    conv_layout: str = typer.Option("hwio", "--conv-layout", metavar="[hwio|oihw]", help=CONV_LAYOUT_HELP),
    allow_reshape: bool = typer.Option(False, "--allow-reshape", help=ALLOW_RESHAPE_HELP),
    format: OutputFormat = FormatOption,
    _debug: bool = DebugOption,
) -> None:
    """Load a checkpoint's weights into a freshly built model inside a tf.distribute strategy and write it.

    Exit 1 (after writing) when not every model variable received a value (--no-strict,
    --skip-mismatch); nothing is written when nothing was assigned.
    """
    from . import _atomic  # noqa: PLC0415
    from . import open as open_checkpoint  # noqa: PLC0415
    from .ops.model import transplant as tp  # noqa: PLC0415
    from .render import transplant_view  # noqa: PLC0415

    kind = tp.output_kind(dst)
    tp.parse_mapping(maps)  # bad rules fail before any work
    ckpt = open_checkpoint(src)
    try:
        protected = [src, ckpt.path]
        if not dry_run:  # a dry run writes nothing: what is at DST does not matter
            _atomic.check_output(dst, force=force, prefix=kind == tp.OUTPUT_TF, protected=protected)
        strat = tp.make_strategy(strategy, replicas)  # first TensorFlow work: devices are set up here
        model = tp.build_in_scope(builder, strat)
        report = tp.transplant(ckpt, model, mapping=maps, strategy=strat, strict=strict,
                               skip_mismatch=skip_mismatch, dry_run=dry_run, by_order=by_order,
                               transpose_dense=transpose_dense, conv_layout=conv_layout.lower(),
                               allow_reshape=allow_reshape)
    finally:
        ckpt.close()
    write = not dry_run and bool(report.assigned)  # a model holding only its initial values is no transplant
    output = tp.write_model(model, dst, force=force, protected=protected, strategy=strat) if write else None
    emit(transplant_view(report, format, output=output))
    if not dry_run and not report.complete:
        raise typer.Exit(EXIT_DIFFERENT)


@app.command("train", cls=_Command)
@handle_errors
def train_command(
    out: str = typer.Argument(..., metavar="OUT", help="Directory to write the CheckpointManager run into."),
    steps: int = typer.Option(6, "--steps", metavar="N", help="Training steps."),
    save_every: int = typer.Option(2, "--save-every", metavar="N", help="Save a checkpoint every N steps (and after the last)."),
    replicas: int = typer.Option(2, "--replicas", metavar="N", help="Logical CPU devices (MirroredStrategy replicas)."),
    max_to_keep: int = typer.Option(3, "--max-to-keep", metavar="N", help="Checkpoints to retain (0 keeps all)."),
    max_shard_bytes: Optional[int] = typer.Option(None, "--max-shard-bytes", metavar="BYTES", help="Save multi-shard with MaxShardSizePolicy of this many bytes."),
    seed: int = typer.Option(0, "--seed", metavar="N", help="Seed of the initial weights and the synthetic data."),
    keras: bool = typer.Option(False, "--keras/--no-keras", help="Also write model.weights.h5, model.keras, model.h5 (and the Keras 2 files where tf_keras is installed)."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty OUT."),
    nan_at: Optional[int] = typer.Option(None, "--nan-at", metavar="STEP", help="Plant a fault: set --nan-variable to NaN after this step's update (before its save)."),
    nan_variable: Optional[str] = typer.Option(None, "--nan-variable", metavar="NAME", help="The model weight --nan-at poisons (e.g. head/kernel)."),
    _debug: bool = DebugOption,
) -> None:
    """Train the small fixture model under MirroredStrategy and save real checkpoints into OUT."""
    from . import trainer  # noqa: PLC0415

    trainer.configure_devices(replicas)  # first: logical devices must exist before TF initialises
    result = trainer.train(
        out, steps=steps, save_every=save_every, replicas=replicas, max_to_keep=max_to_keep or None,
        max_shard_bytes=max_shard_bytes, seed=seed, keras_formats=keras, force=force,
        nan_at=nan_at, nan_variable=nan_variable,
    )
    extra = trainer.write_keras2_files(out, seed=seed) if keras and trainer.keras2_available() else []
    typer.echo(result.summary() + (f", {len(extra)} Keras 2 file(s)" if extra else ""), err=True)


@app.command("doctor", cls=_Command)
@handle_errors
def doctor_command(
    src: str = typer.Argument(..., metavar="SRC", help="Source checkpoint: TF prefix or directory, SavedModel, Keras .h5/.weights.h5/.keras."),
    builder: str = typer.Option(..., "--builder", metavar="MODULE:FUNCTION", help="Function returning the built model the weights should load into."),
    maps: list[str] = typer.Option([], "--map", metavar="REGEX=REPLACEMENT", help="Applied to every source name before pairing by name (repeatable; see docs/INTERFACE.md)."),
    allow_reshape: bool = typer.Option(False, "--allow-reshape", help=ALLOW_RESHAPE_HELP),
    transpose_dense: bool = typer.Option(False, "--transpose-dense", help=TRANSPOSE_DENSE_HELP),
    conv_layout: str = typer.Option("hwio", "--conv-layout", metavar="[hwio|oihw]", help=CONV_LAYOUT_HELP),
    emit_fix: Optional[Emit] = typer.Option(None, "--emit", metavar="[map|assignment-map|weights]", case_sensitive=False,
                                            help="Print the --map rules, print the init_from_checkpoint assignment map, or write the weights (-o)."),
    output: Optional[str] = typer.Option(None, "--output", "-o", metavar="OUT", help="With --emit weights: the .weights.h5 to write (model.load_weights(OUT) loads it)."),
    force: bool = typer.Option(False, "--force", help="Replace an earlier OUT (an HDF5 file; nothing else)."),
    format: OutputFormat = FormatOption,
    _debug: bool = DebugOption,
) -> None:
    """Explain how a checkpoint's weights would load into a model, and the fix (exit 0 all load, 1 not)."""
    from . import open as open_checkpoint  # noqa: PLC0415
    from .ops.model import transplant as tp  # noqa: PLC0415
    from .ops.doctor.operation import doctor  # noqa: PLC0415
    from .ops.match.layouts import Layout  # noqa: PLC0415
    from .render import doctor_assignment_map_view, doctor_map_view, doctor_view  # noqa: PLC0415

    if emit_fix == Emit.weights and not output:
        raise errors.UsageError("--emit weights needs -o OUT.weights.h5")
    if output and emit_fix != Emit.weights:
        raise errors.UsageError("-o OUT is for --emit weights")
    tp.parse_mapping(maps)  # bad rules and layouts fail before any work
    Layout(conv_layout=conv_layout.lower())
    ckpt = open_checkpoint(src)
    progress = Progress("doctor")
    try:
        model = tp.build_in_scope(builder, tp.make_strategy("default", None))
        report = doctor(ckpt, model, mapping=maps, allow_reshape=allow_reshape, transpose_dense=transpose_dense,
                        conv_layout=conv_layout.lower(), out=output if emit_fix == Emit.weights else None, force=force,
                        progress=progress)
    finally:
        progress.close()
        ckpt.close()
    if emit_fix == Emit.map:
        emit(doctor_map_view(report, format))
    elif emit_fix == Emit.assignment_map:
        if report.assignment_map is None:
            raise errors.UsageError(f"{report.source}: no assignment map: tf.compat.v1.train.init_from_checkpoint reads "
                                    f"TF checkpoints only (this is {report.source_format}); use --emit map or --emit weights")
        emit(doctor_assignment_map_view(report, format))
    else:
        emit(doctor_view(report, format))
    if emit_fix in (Emit.map, Emit.assignment_map) and not report.ok:
        from .render import doctor_verdict  # noqa: PLC0415

        typer.echo(f"warning: not every weight is covered; {doctor_verdict(report).split(':', 1)[1].strip()}", err=True)
    if not report.ok:
        raise typer.Exit(EXIT_DIFFERENT)


@app.command("plan", cls=_Command)
@handle_errors
def plan_command(
    path: Optional[str] = typer.Argument(None, metavar="DIR", help="Checkpoint directory (size, bytes per role, cadence, checkpoints kept) or one checkpoint; optional."),
    save_seconds: Optional[str] = typer.Option(None, "--save-seconds", metavar="S", help="Time per save, in seconds (or a duration)."),
    every: Optional[str] = typer.Option(None, "--every", metavar="DURATION", help="Training time between saves: 30m, 1h30m, 1800 (default: DIR's cadence)."),
    train_time: Optional[str] = typer.Option(None, "--train-time", metavar="DURATION", help="Training time of the whole run, e.g. 7d."),
    job_limit: Optional[str] = typer.Option(None, "--job-limit", metavar="DURATION", help="Wall-time limit of one job, e.g. 24h: work lost when it is killed."),
    mtbf: Optional[str] = typer.Option(None, "--mtbf", metavar="DURATION", help="Mean time between failures: gives the Young/Daly interval."),
    keep: Optional[int] = typer.Option(None, "--keep", metavar="N", help="Checkpoints retained, for the disk needed (default: those DIR holds)."),
    probe: bool = typer.Option(False, "--probe", help="Measure the time per save: write and fsync a temporary file of the checkpoint's size (at most 1 GiB) in DIR, then delete it."),
    format: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f", help="Output format.", case_sensitive=False,
                                        metavar="[table|json]"),
    _debug: bool = DebugOption,
) -> None:
    """How often to save and what it costs: saves, time saving and its share, work lost, disk, Young/Daly interval."""
    from .ops.plan.operation import plan  # noqa: PLC0415
    from .render import plan_view  # noqa: PLC0415

    if format == OutputFormat.csv:
        raise errors.UsageError("plan --format: table or json")
    progress = Progress("probe")
    try:
        report = plan(path, save_seconds=save_seconds, every=every, train_time=train_time, job_limit=job_limit,
                      mtbf=mtbf, keep=keep, probe=probe, progress=progress)
    finally:
        progress.close()
    emit(plan_view(report, format))


def _write_png(dest: str, data: bytes, *, force: bool, protected: list[str]) -> None:
    """Write the plot with the atomic-output rules (``--force`` replaces only a PNG file)."""
    from . import _atomic  # noqa: PLC0415

    with _atomic.atomic_file(dest, force=force, kind=_atomic.KIND_PNG, protected=protected) as tmp, \
            open(tmp, "wb") as f:
        f.write(data)


@app.command("scan", cls=_Command)
@handle_errors
def scan_command(
    paths: list[str] = typer.Argument(..., metavar="DIR|PATHS", help="A checkpoint directory (CheckpointManager/Saver, or Keras ModelCheckpoint files), or checkpoints in any order."),
    role: Optional[str] = typer.Option(None, "--role", metavar="ROLE", help="Only variables of this role: model, optimizer or metadata (default: all)."),
    plot: Optional[str] = typer.Option(None, "--plot", metavar="OUT.png", help="Also write a PNG of per-layer norm and relative change over steps (needs matplotlib)."),
    force: bool = typer.Option(False, "--force", help="Replace an earlier --plot PNG (nothing else)."),
    format: OutputFormat = FormatOption,
    _debug: bool = DebugOption,
) -> None:
    """Every checkpoint of a run in step order: norms, changes, NaN/Inf, drift, directory health (exit 1 if unhealthy)."""
    from .ops.scan.operation import scan  # noqa: PLC0415
    from .render import PlotUnavailable, scan_plot, scan_view  # noqa: PLC0415

    if plot is not None:
        from . import _atomic  # noqa: PLC0415

        # an existing plot without --force, anything but a PNG file, a directory, a remote path,
        # an input: refused before the work
        _atomic.check_output(plot, force=force, kind=_atomic.KIND_PNG, protected=paths)
        try:
            import matplotlib  # noqa: F401, PLC0415 - fail before the work, not after
        except ImportError:
            raise errors.UsageError("--plot needs matplotlib: pip install 'ckptinspect[plot]'") from None
    progress = Progress("scan")
    try:
        report = scan(paths, role=role, progress=progress)
    finally:
        progress.close()
    if plot is not None:
        try:
            data = scan_plot(report)
        except PlotUnavailable as e:  # pragma: no cover - checked above
            raise errors.UsageError(str(e)) from None
        _write_png(plot, data, force=force, protected=list(paths))
    emit(scan_view(report, format))
    if not report.healthy:
        raise typer.Exit(EXIT_DIFFERENT)


@app.command("average", cls=_Command)
@handle_errors
def average_command(
    sources: Optional[list[str]] = typer.Argument(None, metavar="SRC", help="Checkpoints of one run: TF prefixes, .index files or directories (or --last N DIR)."),
    output: str = typer.Option(..., "--output", "-o", metavar="OUT", help="Output TF prefix (no suffix, or .ckpt / .ckpt-N)."),
    last: Optional[tuple[int, str]] = typer.Option(None, "--last", metavar="N DIR", help="Average the newest N checkpoints the CheckpointManager/Saver directory DIR retains."),
    ema: Optional[float] = typer.Option(None, "--ema", metavar="DECAY", help="Exponential moving average in step order (e_k = DECAY*e_{k-1} + (1-DECAY)*x_k) instead of the mean."),
    role: Optional[str] = typer.Option(None, "--role", metavar="model", help="Write only the model's variables (object graph pruned to them)."),
    force: bool = typer.Option(False, "--force", help="Replace an earlier output of the same kind (nothing else)."),
    format: OutputFormat = FormatOption,
    _debug: bool = DebugOption,
) -> None:
    """Average float variables over checkpoints of one run (mean or EMA, in float64); the rest from the newest."""
    from .ops.average.operation import average  # noqa: PLC0415
    from .render import average_view  # noqa: PLC0415

    sources = list(sources or [])
    if last is not None:
        if sources:
            raise errors.UsageError("give either checkpoints or --last N DIR, not both")
        sources = [last[1]]
    progress = Progress("average")
    try:
        report = average(sources, output, last=None if last is None else last[0], ema=ema, role=role, force=force,
                         progress=progress)
    finally:
        progress.close()
    emit(average_view(report, format))


# -- each operation's command is defined above this line, in the style of `ls` ---------------


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
