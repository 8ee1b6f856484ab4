"""The ``ckptinspect`` command line: parse, call the library, render, map errors to exit codes.

Exit codes (shared/INTERFACE.md): 0 success; 1 ``diff`` found differences / ``verify``
found damage; 2 error, with one ``Error: ...`` line on stderr (a traceback only with
``--debug``).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import os
import re
import sys
import time
from typing import Callable, Iterator, Optional

import click

from . import errors, formats
from ._cli_app import Argument, EnumChoice, Group, Option
from ._tf import require_tf, tensorflow_available
from .render import OutputFormat

EXIT_OK = 0
EXIT_DIFFERENT = 1
EXIT_ERROR = 2

APP_HELP = "Inspect, compare and operate on model checkpoints: TensorFlow, Keras, PyTorch, safetensors, npz."
_state = {"debug": False}
DEBUG_HELP = "Show tracebacks on errors (before or after the command)."


@click.group("ckptinspect", cls=Group, help=APP_HELP, no_args_is_help=True,
             context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--debug", is_flag=True, help=DEBUG_HELP)
@click.version_option(package_name="ckptinspect", prog_name="ckptinspect", message="%(prog)s %(version)s",
                      help="Show the installed ckptinspect's version and exit.")
def app(debug: bool) -> None:
    _state["debug"] = debug


# -- options shared by several commands: declared once, applied as decorators ---------------
def option(*decls: str, **kwargs) -> Callable:  # noqa: ANN003 - click.option's
    """``click.option`` with :class:`~ckptinspect._cli_app.Option` (repeated values as a list)."""
    return click.option(*decls, cls=Option, **kwargs)


def argument(name: str, metavar: str, help: str, **kwargs) -> Callable:  # noqa: A002, ANN003 - click's words
    """A positional argument with its metavar and help (:class:`~ckptinspect._cli_app.Argument`)."""
    return click.argument(name, cls=Argument, metavar=metavar, help=help, **kwargs)


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> bool:  # noqa: ARG001 - click's callback
    if value:
        _state["debug"] = True
    return value


def _lower(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> Optional[str]:  # noqa: ARG001
    return value.lower() if isinstance(value, str) else value


# --debug is accepted after the command too (`ckptinspect ls X --debug`): every command has it.
debug_option = option("--debug", is_flag=True, help=DEBUG_HELP, callback=_set_debug, expose_value=False)


def format_option(metavar: str = "[table|json|csv]") -> Callable:
    """``--format``/``-f``: the report's format, on every command that reports."""
    return option("--format", "-f", type=EnumChoice(OutputFormat), default=OutputFormat.table.value, metavar=metavar,
                  help="Format of the report on stdout.")


optimizer_pattern_option = option(
    "--optimizer-pattern", metavar="REGEX",
    help="Also treat variables whose name or key matches REGEX as optimizer state (for names no rule knows).",
)
role_option = option("--role", metavar="ROLE", help="Only variables of this role: model, optimizer or metadata.")
force_option = option("--force", is_flag=True, help="Replace an earlier output of the same kind (nothing else).")
# What a checkpoint argument may be comes from the format registry (formats.described()).
PATH_HELP = f"The checkpoint: {formats.described()}."
path_argument = argument("path", "PATH", help=PATH_HELP)


def map_option(names: str = "every source name", when: str = "") -> Callable:
    """``--map REGEX=REPLACEMENT`` (repeatable): rewrites ``names`` before pairing."""
    return option("--map", "maps", multiple=True, metavar="REGEX=REPLACEMENT",
                  help=f"Applied to {names} before pairing by name{when} (repeatable; see docs/INTERFACE.md).")


def builder_option(*, required: bool, when: str = "") -> Callable:
    """``--builder MODULE:FUNCTION``: the function that builds the model the weights go into."""
    return option("--builder", required=required, metavar="MODULE:FUNCTION",
                  help=f"Function returning the built model the weights go into{when}.")


def layout_options(whose: str = "The source's", when: str = "") -> Callable:
    """``--transpose-dense`` and ``--conv-layout``: how ``whose`` kernels are laid out."""
    transpose_dense = option(
        "--transpose-dense", is_flag=True,
        help=f"{whose} 2-D kernels are [out,in] (PyTorch Linear): read transposed, as Keras' [in,out]{when}.")
    conv_layout = option(
        "--conv-layout", default="hwio", metavar="[hwio|oihw]", callback=_lower,
        help=f"{whose} conv kernels' layout: hwio (Keras, default) or oihw (PyTorch: read reordered to HWIO){when}.")

    def decorate(fn: Callable) -> Callable:
        return transpose_dense(conv_layout(fn))  # listed in this order

    return decorate


def by_order_option(when: str = "") -> Callable:
    """``--by-order``: the layer-order rule of the one pairing plan (doctor, transplant, extract)."""
    return option("--by-order", is_flag=True,
                  help=f"Also pair layers nothing else paired by layer order and shape{when}.")


def allow_reshape_option(when: str = "") -> Callable:
    """``--allow-reshape``: a source value of as many elements fits (doctor, transplant, extract)."""
    return option("--allow-reshape", is_flag=True,
                  help=f"A source value with as many elements as the model variable fits (it is reshaped){when}.")


def strict_option(when: str = "") -> Callable:
    """``--strict/--no-strict``: what counts as a problem in the one pairing plan (doctor,
    transplant, extract; ``PairingOptions.strict``)."""
    return option("--strict/--no-strict", default=True,
                  help="Fail on any problem, unused source variables included (default); or allow unused source "
                       f"variables and leave weights without a value that fits at init (exit 1 when one is){when}.")


def _print_traceback() -> None:
    """The traceback of the exception being handled, on stderr (``--debug``)."""
    import traceback  # noqa: PLC0415 - --debug only

    traceback.print_exc()


def fail(message: str, details: tuple[str, ...] | list[str] = ()) -> None:
    """Print one ``Error:`` line (control characters escaped, so a name from a file cannot
    break the line or drive the terminal), then any ``details`` lines (escaped alike), and exit 2."""
    from .render import escape_controls  # noqa: PLC0415

    click.echo(f"Error: {escape_controls(message)}", err=True)
    for line in details:
        click.echo(escape_controls(line), err=True)
    raise click.exceptions.Exit(EXIT_ERROR)


def handle_errors(fn: Callable) -> Callable:
    """Turn library errors (and anything unexpected) into one ``Error:`` line and exit 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (click.exceptions.Exit, click.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            click.echo("Error: interrupted", err=True)
            raise click.exceptions.Exit(130) from None
        except errors.CkptError as e:
            if _state["debug"]:  # --debug adds the traceback; the Error line and exit 2 stay
                _print_traceback()
            fail(str(e))
        except Exception as e:  # noqa: BLE001 - the CLI promises no traceback without --debug
            if _state["debug"]:
                _print_traceback()
            text = str(e).strip()
            fail(f"unexpected {type(e).__name__}: {text.splitlines()[0] if text else ''}"
                 + ("" if _state["debug"] else " (run with --debug for the traceback)"))

    return wrapper


class Progress:
    """A one-line progress indicator on stderr, only when stderr is a terminal and the work is
    long; the line fits the terminal's width, so it never wraps. :func:`progress` is the way
    commands use it."""

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
            import shutil  # noqa: PLC0415 - a stderr without a terminal size only

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


@contextlib.contextmanager
def progress(label: str, *, when: bool = True) -> Iterator[Optional[Progress]]:
    """A :class:`Progress` for the ``with`` block (None unless ``when``), its line cleared at
    the end however the block ends."""
    shown = Progress(label) if when else None
    try:
        yield shown
    finally:
        if shown is not None:
            shown.close()


def emit(text: str) -> None:
    """Write a rendered result to stdout."""
    sys.stdout.write(text)


@app.command("ls")
@path_argument
@option("--filter", "-k", metavar="REGEX", help="Regex searched in names and keys.")
@role_option
@option("--stats", is_flag=True, help="Add min/max/mean/std/NaN/Inf (reads every tensor, one at a time).")
@option("--tree", is_flag=True, help="Group variables by layer path.")
@option("--sort", default="role", metavar="[role|name|size|file]", help="Order: role (model, optimizer, metadata), name, size or file.")
@optimizer_pattern_option
@format_option()
@debug_option
@handle_errors
def ls_command(path: str, filter: Optional[str], role: Optional[str], stats: bool, tree: bool, sort: str,  # noqa: A002
               optimizer_pattern: Optional[str], format: OutputFormat) -> None:  # noqa: A002
    """List the variables of a checkpoint: shapes, dtypes, sizes, shards and roles."""
    from . import open as open_checkpoint  # noqa: PLC0415
    from .ops.listing import list_variables  # noqa: PLC0415
    from .render import ls_chunks, ls_warnings  # noqa: PLC0415

    with open_checkpoint(path) as ckpt, progress("stats", when=stats) as shown:
        listing = list_variables(ckpt, pattern=filter, role=role, sort=sort, stats=stats, progress=shown,
                                 optimizer_pattern=optimizer_pattern)
        sys.stderr.write(ls_warnings(listing))
        for chunk in ls_chunks(listing, format, tree=tree):  # a listing of a million rows, a block at a time
            emit(chunk)


@app.command("diff")
@argument("a", "A", help="Checkpoint A, any kind PATH takes (see 'ckptinspect ls --help').")
@argument("b", "B", help="Checkpoint B, of the same or another format.")
@option("--atol", type=float, default=0.0, metavar="FLOAT", help="Absolute tolerance (numpy isclose semantics; 0 = exact).")
@option("--rtol", type=float, default=0.0, metavar="FLOAT", help="Relative tolerance, of B's magnitude (0 = exact).")
@role_option
@map_option("every name of A")
@optimizer_pattern_option
@layout_options("A's")
@option("--hide-equal", is_flag=True, help="Leave out the variables that are equal (table, CSV and JSON 'variables'; the summary counts all).")
@option("--quiet", "-q", is_flag=True, help="Print nothing on stdout: the exit code alone says equal (0) or different (1), as git diff --quiet.")
@format_option()
@debug_option
@handle_errors
def diff_command(a: str, b: str, atol: float, rtol: float, role: Optional[str], maps: list[str],
                 optimizer_pattern: Optional[str], transpose_dense: bool, conv_layout: str, hide_equal: bool,
                 quiet: bool, format: OutputFormat) -> None:  # noqa: A002
    """Compare two checkpoints, also across formats (exit 0 equal within tolerance, 1 different)."""
    from .ops.diff.operation import diff  # noqa: PLC0415
    from .render import diff_chunks  # noqa: PLC0415

    with progress("diff", when=not quiet) as shown:
        report = diff(a, b, atol=atol, rtol=rtol, role=role, mapping=maps, progress=shown,
                      optimizer_pattern=optimizer_pattern, transpose_dense=transpose_dense, conv_layout=conv_layout)
    if not quiet:
        for chunk in diff_chunks(report, format, hide_equal=hide_equal):  # a million rows: never held whole
            emit(chunk)
    if not report.identical:
        raise click.exceptions.Exit(EXIT_DIFFERENT)


@app.command("verify")
@path_argument
@format_option()
@debug_option
@handle_errors
def verify_command(path: str, format: OutputFormat) -> None:  # noqa: A002
    """Check that a checkpoint is whole: index, shards and every tensor's checksum (exit 1 if damaged)."""
    from .ops.verify import verify  # noqa: PLC0415
    from .render import verify_view  # noqa: PLC0415

    with progress("verify") as shown:
        report = verify(path, progress=shown)
    emit(verify_view(report, format))
    if not report.intact:
        raise click.exceptions.Exit(EXIT_DIFFERENT)




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


WITH_BUILDER = " (.weights.h5 with --builder)"


@app.command("extract")
@argument("src", "SRC", help=f"Source checkpoint: {formats.described()}.")
@option("--output", "-o", required=True, metavar="OUT", help="Output: a TF prefix (no suffix, or .ckpt / .ckpt-N), or a .weights.h5 / .h5 / .npz / .safetensors file.")
@option("--to", metavar="[tf|weights-h5|h5|npz|safetensors]", help="Output file type (default: from OUT's suffix; needed for any other suffix).")
@builder_option(required=False, when="; needed for .weights.h5 from a TF, PyTorch or safetensors checkpoint")
@map_option(when=WITH_BUILDER)
@by_order_option(when=WITH_BUILDER)
@layout_options(when=WITH_BUILDER)
@allow_reshape_option(when=WITH_BUILDER)
@strict_option(when=WITH_BUILDER)
@option("--keep-metadata", is_flag=True, help="Also keep step counters, save_counter, TF1 global_step.")
@option("--max-shard-size", metavar="SIZE", help="TF output: bytes per data shard (e.g. 256MiB), filled in turn. Default: one data file; 0: one tensor (or slice) per shard.")
@force_option
@optimizer_pattern_option
@format_option()
@debug_option
@handle_errors
def extract_command(src: str, output: str, to: Optional[str], builder: Optional[str], maps: list[str],
                    by_order: bool, transpose_dense: bool, conv_layout: str, allow_reshape: bool, strict: bool,
                    keep_metadata: bool, max_shard_size: Optional[str], force: bool, optimizer_pattern: Optional[str],
                    format: OutputFormat) -> None:  # noqa: A002
    """Write the model's weights alone (optimizer state stripped), still restorable, and check them.

    Exit 1 (after writing) when --builder --no-strict left a model weight at init.
    """
    from .ops.extract.operation import extract  # noqa: PLC0415
    from .render import extract_view  # noqa: PLC0415

    with progress("extract") as shown:
        report = extract(src, output, format=to, force=force, builder=builder,
                         keep=("model", "metadata") if keep_metadata else ("model",),
                         max_shard_bytes=None if max_shard_size is None else parse_size(max_shard_size),
                         progress=shown, optimizer_pattern=optimizer_pattern, mapping=maps,
                         transpose_dense=transpose_dense, conv_layout=conv_layout, by_order=by_order,
                         allow_reshape=allow_reshape, strict=strict)
    emit(extract_view(report, format))
    if not report.complete:
        raise click.exceptions.Exit(EXIT_DIFFERENT)


@app.command("rewrite")
@argument("src", "SRC", help="Source checkpoint: TF prefix or directory, SavedModel, V1 table, Keras .weights.h5/.h5.")
@option("--output", "-o", required=True, metavar="OUT", help="Output: a TF prefix for a TF source, a .weights.h5 / .h5 file for a Keras one.")
@option("--rename", multiple=True, metavar="REGEX=REPLACEMENT", help="Applied with re.sub to every readable name, in order (repeatable; --map semantics).")
@option("--drop", multiple=True, metavar="REGEX", help="Leave out the variables whose (new) name matches (re.search; repeatable).")
@option("--role", multiple=True, metavar="[model|optimizer|metadata]", help="Keep only variables of this role (repeatable).")
@option("--cast", metavar="[float16|bfloat16|float32|float64]", help="Cast the model's float variables (and their optimizer slots) to this type.")
@option("--cast-filter", metavar="REGEX", help="Cast only the model variables whose (new) name matches (re.search).")
@option("--allow-overflow", is_flag=True, help="Write a cast that turns finite values into Inf (refused otherwise).")
@force_option
@format_option()
@debug_option
@handle_errors
def rewrite_command(src: str, output: str, rename: list[str], drop: list[str], role: list[str], cast: Optional[str],
                    cast_filter: Optional[str], allow_overflow: bool, force: bool, format: OutputFormat) -> None:  # noqa: A002
    """Rename, drop and cast variables (in that order), writing a checked, restorable copy."""
    from .ops.rewrite.operation import rewrite  # noqa: PLC0415
    from .render import rewrite_view  # noqa: PLC0415

    with progress("rewrite") as shown:
        report = rewrite(src, output, rename=rename, drop=drop, role=role, cast=cast, cast_filter=cast_filter,
                         allow_overflow=allow_overflow, force=force, progress=shown)
    emit(rewrite_view(report, format))


@app.command("transplant")
@argument("src", "SRC", help="Source checkpoint: TF prefix or directory, Keras .h5/.weights.h5/.keras.")
@argument("dst", "DST", help="Output: a TF checkpoint prefix, or a .weights.h5 / .keras file (by suffix).")
@builder_option(required=True, when=" (called inside the strategy scope)")
@option("--strategy", default="default", metavar="[default|mirrored|multi-worker]", help="The tf.distribute strategy (multi-worker reads TF_CONFIG).")
@option("--replicas", type=int, metavar="N", help="Logical CPU devices for --strategy mirrored (default 2).")
@map_option()
@option("--skip-mismatch", is_flag=True, help="Leave variables whose shape/dtype differ at init instead of failing.")
@strict_option()
@by_order_option()
@option("--dry-run", is_flag=True, help="Show the plan; assign and write nothing.")
@force_option
@layout_options()
@allow_reshape_option()
@format_option()
@debug_option
@handle_errors
def transplant_command(src: str, dst: str, builder: str, strategy: str, replicas: Optional[int], maps: list[str],
                       skip_mismatch: bool, strict: bool, by_order: bool, dry_run: bool, force: bool,
                       transpose_dense: bool, conv_layout: str, allow_reshape: bool,
                       format: OutputFormat) -> None:  # noqa: A002
    """Load a checkpoint's weights into a freshly built model inside a tf.distribute strategy and write it.

    Exit 1 (after writing) when not every model variable received a value (--no-strict,
    --skip-mismatch); nothing is written when nothing was assigned.
    """
    require_tf("transplant")
    from .ops.model.transplant import transplant_and_write  # noqa: PLC0415
    from .render import transplant_refusal, transplant_view  # noqa: PLC0415

    try:
        done = transplant_and_write(src, dst, builder, strategy=strategy, replicas=replicas, mapping=maps,
                                    strict=strict, skip_mismatch=skip_mismatch, dry_run=dry_run, by_order=by_order,
                                    transpose_dense=transpose_dense, conv_layout=conv_layout,
                                    allow_reshape=allow_reshape, force=force)
    except errors.TransplantError as e:
        if e.report is None or not e.problems:  # not the strict refusal (a value that did not arrive)
            raise
        if _state["debug"]:
            _print_traceback()
        # the library's message names the Python arguments (strict=False...): say the flags
        fail(*transplant_refusal(e.report, e.problems, src=src, builder=builder))
    report = done.report
    emit(transplant_view(report, format, output=done.output))
    if not dry_run and not report.complete:
        raise click.exceptions.Exit(EXIT_DIFFERENT)


@app.command("train")
@argument("out", "OUT", help="Directory to write the CheckpointManager run into.")
@option("--steps", type=int, default=6, metavar="N", help="Training steps.")
@option("--save-every", type=int, default=2, metavar="N", help="Save a checkpoint every N steps (and after the last).")
@option("--replicas", type=int, default=2, metavar="N", help="Logical CPU devices (MirroredStrategy replicas).")
@option("--max-to-keep", type=int, default=3, metavar="N", help="Checkpoints to retain (0 keeps all).")
@option("--max-shard-bytes", type=int, metavar="BYTES", help="Save multi-shard with MaxShardSizePolicy of this many bytes.")
@option("--seed", type=int, default=0, metavar="N", help="Seed of the initial weights and the synthetic data.")
@option("--keras/--no-keras", default=False, help="Also write model.weights.h5, model.keras, model.h5 (and the Keras 2 files where tf_keras is installed).")
@force_option
@option("--nan-at", type=int, metavar="STEP", help="Plant a fault: set --nan-variable to NaN after this step's update (before its save).")
@option("--nan-variable", metavar="NAME", help="The model weight --nan-at poisons (e.g. head/kernel).")
@debug_option
@handle_errors
def train_command(out: str, steps: int, save_every: int, replicas: int, max_to_keep: int,
                  max_shard_bytes: Optional[int], seed: int, keras: bool, force: bool, nan_at: Optional[int],
                  nan_variable: Optional[str]) -> None:
    """Train the small fixture model under MirroredStrategy and save real checkpoints into OUT."""
    require_tf("train")
    from . import trainer  # noqa: PLC0415

    trainer.configure_devices(replicas)  # first: logical devices must exist before TF initialises
    result = trainer.train(
        out, steps=steps, save_every=save_every, replicas=replicas, max_to_keep=max_to_keep or None,
        max_shard_bytes=max_shard_bytes, seed=seed, keras_formats=keras, force=force,
        nan_at=nan_at, nan_variable=nan_variable,
    )
    extra = trainer.write_keras2_files(out, seed=seed) if keras and trainer.keras2_available() else []
    click.echo(result.summary() + (f", {len(extra)} Keras 2 file(s)" if extra else ""), err=True)


@app.command("doctor")
@argument("src", "SRC", help="Source checkpoint: TF prefix or directory, SavedModel, Keras .h5/.weights.h5/.keras.")
@builder_option(required=True)
@map_option()
@by_order_option()
@allow_reshape_option()
@layout_options()
@strict_option()
@option("--emit", "emit_fix", type=EnumChoice(Emit), metavar="[map|assignment-map|weights]",
        help="Print the --map rules, print the init_from_checkpoint assignment map, or write the weights (-o).")
@option("--output", "-o", metavar="OUT", help="With --emit weights: the .weights.h5 to write (model.load_weights(OUT) loads it).")
@force_option
@format_option()
@debug_option
@handle_errors
def doctor_command(src: str, builder: str, maps: list[str], by_order: bool, allow_reshape: bool, transpose_dense: bool,
                   conv_layout: str, strict: bool, emit_fix: Optional[Emit], output: Optional[str], force: bool,
                   format: OutputFormat) -> None:  # noqa: A002
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
    Layout(conv_layout=conv_layout)
    with open_checkpoint(src) as ckpt, progress("doctor") as shown:
        # TensorFlow's default strategy where it is installed; a Keras 3 model of another backend
        # is built without it
        model = tp.build_in_scope(builder, tp.make_strategy("default", None) if tensorflow_available() else None)
        report = doctor(ckpt, model, mapping=maps, by_order=by_order, allow_reshape=allow_reshape, strict=strict,
                        transpose_dense=transpose_dense, conv_layout=conv_layout, out=output if emit_fix == Emit.weights else None, force=force,
                        progress=shown)
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

        click.echo(f"warning: not every weight is covered; {doctor_verdict(report).split(':', 1)[1].strip()}", err=True)
    if not report.ok:
        raise click.exceptions.Exit(EXIT_DIFFERENT)


@app.command("plan")
@argument("path", "DIR", required=False, help="Checkpoint directory (size, bytes per role, cadence, checkpoints kept) or one checkpoint; optional.")
@option("--save-seconds", metavar="S", help="Time per save, in seconds (or a duration).")
@option("--every", metavar="DURATION", help="Training time between saves: 30m, 1h30m, 1800 (default: DIR's cadence).")
@option("--train-time", metavar="DURATION", help="Training time of the whole run, e.g. 7d.")
@option("--job-limit", metavar="DURATION", help="Wall-time limit of one job, e.g. 24h: work lost when it is killed.")
@option("--mtbf", metavar="DURATION", help="Mean time between failures: gives the Young/Daly interval.")
@option("--keep", type=int, metavar="N", help="Checkpoints retained, for the disk needed (default: those DIR holds).")
@option("--probe", is_flag=True, help="Measure the time per save: write and fsync a temporary file of the checkpoint's size (at most 1 GiB) in DIR, then delete it.")
@format_option("[table|json]")
@debug_option
@handle_errors
def plan_command(path: Optional[str], save_seconds: Optional[str], every: Optional[str], train_time: Optional[str],
                 job_limit: Optional[str], mtbf: Optional[str], keep: Optional[int], probe: bool,
                 format: OutputFormat) -> None:  # noqa: A002
    """How often to save and what it costs: saves, time saving and its share, work lost, disk, Young/Daly interval."""
    from .ops.plan.operation import plan  # noqa: PLC0415
    from .render import plan_view  # noqa: PLC0415

    if format == OutputFormat.csv:
        raise errors.UsageError("plan --format: table or json")
    with progress("probe") as shown:
        report = plan(path, save_seconds=save_seconds, every=every, train_time=train_time, job_limit=job_limit,
                      mtbf=mtbf, keep=keep, probe=probe, progress=shown)
    emit(plan_view(report, format))


def _write_png(dest: str, data: bytes, *, force: bool, protected: list[str]) -> None:
    """Write the plot with the atomic-output rules (``--force`` replaces only a PNG file)."""
    from . import _atomic  # noqa: PLC0415

    with _atomic.atomic_file(dest, force=force, kind=_atomic.KIND_PNG, protected=protected) as tmp, \
            open(tmp, "wb") as f:
        f.write(data)


@app.command("scan")
@argument("paths", "DIR|PATHS", nargs=-1, required=True, help="A checkpoint directory (CheckpointManager/Saver, or Keras ModelCheckpoint files), or checkpoints in any order.")
@option("--role", metavar="ROLE", help="Only variables of this role: model, optimizer or metadata (default: all).")
@option("--plot", metavar="OUT.png", help="Also write a PNG of per-layer norm and relative change over steps (needs matplotlib).")
@force_option
@format_option()
@debug_option
@handle_errors
def scan_command(paths: list[str], role: Optional[str], plot: Optional[str], force: bool,
                 format: OutputFormat) -> None:  # noqa: A002
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
    with progress("scan") as shown:
        report = scan(paths, role=role, progress=shown)
    if plot is not None:
        try:
            data = scan_plot(report)
        except PlotUnavailable as e:  # pragma: no cover - checked above
            raise errors.UsageError(str(e)) from None
        _write_png(plot, data, force=force, protected=list(paths))
    emit(scan_view(report, format))
    if not report.healthy:
        raise click.exceptions.Exit(EXIT_DIFFERENT)


@app.command("average")
@argument("sources", "SRC", nargs=-1, required=False, help="Checkpoints of one run: TF prefixes or .index files, Keras .weights.h5 or legacy .h5 files (or --last N DIR).")
@option("--output", "-o", required=True, metavar="OUT", help="Output TF prefix (no suffix, or .ckpt / .ckpt-N); OUT.weights.h5 or OUT.h5 for Keras inputs.")
@option("--last", type=(int, str), metavar="N DIR", help="Average the newest N checkpoints the CheckpointManager/Saver directory DIR retains.")
@option("--ema", type=float, metavar="DECAY", help="Exponential moving average in step order (e_k = DECAY*e_{k-1} + (1-DECAY)*x_k) instead of the mean.")
@option("--role", metavar="model", help="Write only the model's variables (object graph pruned to them).")
@force_option
@format_option()
@debug_option
@handle_errors
def average_command(sources: list[str], output: str, last: Optional[tuple[int, str]], ema: Optional[float],
                    role: Optional[str], force: bool, format: OutputFormat) -> None:  # noqa: A002
    """Average float variables over checkpoints of one run (mean or EMA, in float64); the rest from the newest."""
    from .ops.average.operation import average  # noqa: PLC0415
    from .render import average_view  # noqa: PLC0415

    sources = list(sources or [])
    if last is not None:
        if sources:
            raise errors.UsageError("give either checkpoints or --last N DIR, not both")
        sources = [last[1]]
    with progress("average") as shown:
        report = average(sources, output, last=None if last is None else last[0], ema=ema, role=role, force=force,
                         progress=shown)
    emit(average_view(report, format))


# -- each operation's command is defined above this line, in the style of `ls` ---------------


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
