"""``rewrite``: rename, drop and cast the variables of a checkpoint, writing a new one.

Operations run in this order, each on what the one before left:

1. ``rename``: every ``REGEX=REPLACEMENT`` rule, in order, ``re.sub`` on every readable name
   (the names ``ls`` shows; the ``--map`` semantics of :mod:`.mapping`). TF2 object-based
   checkpoints: a name that is the variable's object path moves the object in the graph (its
   edges and key, :func:`ckptinspect.formats.edit_object_graph`); a name Keras recorded
   (``full_name``) is rewritten in the graph. TF1 name-based checkpoints: the key is the name.
   Keras HDF5 files and ``.keras`` archives: see :mod:`.keras_h5`. Two variables that would share a name are
   refused, naming both.
2. ``drop``: variables whose (new) name matches a regex (``re.search``) are left out.
3. ``role``: only variables of these roles are kept.
4. ``cast``: float variables (float16/bfloat16/float32/float64) of the model, and the optimizer
   slots that belong to them, are cast to the dtype; integers, strings and optimizer
   hyperparameters are untouched. ``cast_filter`` (``re.search`` on the new name) limits which
   model variables are cast.

The output goes through the project's TF bundle writer: tensors that pass unchanged are copied
byte for byte with their checksums, cast ones are streamed. It is written beside its final
name, read back with our reader and compared (names, dtypes, shapes, every value, streamed)
before it is renamed into place.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ... import _atomic
from ... import model as m
from ...errors import CorruptCheckpointError, UsageError, VerificationError
from ...formats import (
    OPTIMIZER_SLOT_MARK,
    TO_KERAS,
    TO_SAFETENSORS,
    output_kind,
    capabilities,
    GraphEdit,
    OutputTensor,
    TensorData,
    check_regular,
    copy_tensor,
    edit_object_graph,
    open_checkpoint,
    prune_object_graph,
    unescape_path,
)
from ..bit_equality import bit_equal
from ..match.mapping import RulesLike, apply_rules, parse_mapping, rules_text
from .report import RewriteReport, RewrittenVariable
from .to_safetensors import rewrite_safetensors
from ..sources import files_size, source_files

__all__ = ["rewrite", "CAST_DTYPES", "RewriteReport", "RewrittenVariable"]

CAST_DTYPES = ("float16", "bfloat16", "float32", "float64")
KERAS_REWRITABLE = frozenset({"keras-layout", "writable"})  # Keras HDF5 files (.h5, .weights.h5), not .keras zips
VARIABLE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
MAX_NAMED = 5  # variables a refusal names
BLOCK_ELEMENTS = 1 << 20  # elements per streamed block (cast and read-back)
Progress = Callable[[int, int, m.Variable], None]


@dataclasses.dataclass
class _Plan:
    """Per source variable: its new name and key (None: dropped) and output dtype."""

    var: m.Variable
    new_name: str
    new_key: str | None = None
    new_dtype: str | None = None
    dropped: bool = False


def _compile_all(patterns: Sequence[str], what: str) -> list[re.Pattern[str]]:
    out = []
    for p in patterns:
        try:
            out.append(re.compile(p))
        except re.error as e:
            raise UsageError(f"bad {what} regex {p!r}: {e}") from None
    return out


def _check_arguments(roles: Sequence[str], cast: str | None, cast_filter: str | None) -> re.Pattern[str] | None:
    for role in roles:
        if role not in m.ROLES:
            raise UsageError(f"unknown role {role!r}. Expected one of {', '.join(m.ROLES)}")
    if cast is not None and cast not in CAST_DTYPES:
        raise UsageError(f"--cast takes a float type: {', '.join(CAST_DTYPES)}. Received: {cast!r}")
    if cast_filter is not None and cast is None:
        raise UsageError("--cast-filter needs --cast")
    return _compile_all([cast_filter], "--cast-filter")[0] if cast_filter is not None else None


def _key_name(key: str) -> str:
    return key[: -len(VARIABLE_SUFFIX)] if key.endswith(VARIABLE_SUFFIX) else key


def _refuse_collisions(plans: list[_Plan]) -> None:
    seen: dict[str, _Plan] = {}
    for p in plans:
        other = seen.get(p.new_name)
        if other is not None:
            raise UsageError(
                f"renaming makes {m.display_name(other.var.name)!r} and {m.display_name(p.var.name)!r} collide at"
                f" {m.display_name(p.new_name)!r}; nothing was written"
            )
        seen[p.new_name] = p


def _slot_owner(opt: m.Variable, models: dict[str, m.Variable]) -> m.Variable | None:
    """The model variable an optimizer variable is a slot of, from its name: TF2 slot keys
    (``<var path>/.OPTIMIZER_SLOT/...``), TF1 slots (``<var>/Adam``), Keras 2
    (``Adam/m/<var>``) and Keras 3 (``adam/<var with _>_momentum``); the longest fits."""
    best: m.Variable | None = None
    best_len = -1
    key_head = opt.key.split(OPTIMIZER_SLOT_MARK, 1)[0] if OPTIMIZER_SLOT_MARK in opt.key else None
    last = opt.name.rsplit("/", 1)[-1]
    for name, v in models.items():
        if v.shape != opt.shape:
            continue
        hit = (
            (key_head is not None and _key_name(v.key) == key_head)
            or opt.name.startswith(name + "/")
            or opt.name.endswith("/" + name)
            or last.startswith(name.replace("/", "_") + "_")
        )
        if hit and len(name) > best_len:
            best, best_len = v, len(name)
    return best


def _follow_owners(plans: list[_Plan]) -> None:
    """Optimizer slots named after their variable follow its rename (Keras 3
    ``adam/<var with _>_momentum``, Keras 2 ``Adam/m/<var>``, TF1 ``<var>/Adam``) when no rule
    renamed them; TF2 slot keys follow through the object graph."""
    renamed = {p.var.name: p.new_name for p in plans if p.var.role == m.ROLE_MODEL and p.new_name != p.var.name}
    if not renamed:
        return
    models = {p.var.name: p.var for p in plans if p.var.role == m.ROLE_MODEL}
    for p in plans:
        v = p.var
        if v.role != m.ROLE_OPTIMIZER or p.new_name != v.name or OPTIMIZER_SLOT_MARK in v.key:
            continue
        owner = _slot_owner(v, models)
        if owner is None or owner.name not in renamed:
            continue
        old, new = owner.name, renamed[owner.name]
        if v.name.startswith(old + "/"):
            p.new_name = new + v.name[len(old):]
        elif v.name.endswith("/" + old):
            p.new_name = v.name[: -len(old)] + new
        else:
            head, _, last = v.name.rpartition("/")
            old_s, new_s = old.replace("/", "_"), new.replace("/", "_")
            p.new_name = (head + "/" if head else "") + new_s + last[len(old_s):]


def _cast_plan(plans: list[_Plan], cast: str, rx: re.Pattern[str] | None) -> None:
    kept = [p for p in plans if not p.dropped]
    targets = {
        p.var.name: p.var
        for p in kept
        if p.var.role == m.ROLE_MODEL and p.var.dtype in CAST_DTYPES and (rx is None or rx.search(p.new_name))
    }
    models = {p.var.name: p.var for p in kept if p.var.role == m.ROLE_MODEL}
    for p in kept:
        if p.var.dtype not in CAST_DTYPES:
            continue
        if p.var.name in targets:
            p.new_dtype = cast
        elif p.var.role == m.ROLE_OPTIMIZER:
            owner = _slot_owner(p.var, models)
            if owner is not None and owner.name in targets:
                p.new_dtype = cast


def _cast_blocks(ckpt: m.Checkpoint, var: m.Variable, dtype: np.dtype) -> Callable[[], Iterable[np.ndarray]]:
    def blocks() -> Iterable[np.ndarray]:
        for block in ckpt.iter_blocks(var, BLOCK_ELEMENTS):
            with np.errstate(over="ignore", under="ignore"):  # counted and refused by _cast_losses
                yield block.astype(dtype)

    return blocks


@dataclasses.dataclass(frozen=True)
class CastLoss:
    """What a cast does to one variable's finite values.

    Attributes:
        name: The variable's (new) name.
        dtype: The type it is cast to.
        overflow: Finite values that become +/-Inf (their magnitude is past the type's maximum).
        zero: Nonzero values that become zero.
        subnormal: Values that become subnormal (below the type's smallest normal number:
            precision lost).
    """

    name: str
    dtype: str
    overflow: int
    zero: int
    subnormal: int

    def note(self) -> str:
        parts = [f"{n} {what}" for n, what in ((self.overflow, "became +/-Inf"), (self.zero, "became zero"),
                                                (self.subnormal, "became subnormal")) if n]
        return f"--cast {self.dtype}: {self.name}: " + ", ".join(parts) + " (finite values of the source)"


def _smallest_normal(dtype: np.dtype) -> float:
    try:
        return float(np.finfo(dtype).tiny)
    except ValueError:  # bfloat16: numpy's finfo does not know it, ml_dtypes' does
        import ml_dtypes  # noqa: PLC0415 - comes with TensorFlow and Keras

        return float(ml_dtypes.finfo(dtype).tiny)


def _cast_losses(ckpt: m.Checkpoint, plans: list[_Plan]) -> list[CastLoss]:
    """Read each variable planned for a cast once, counting the finite values the cast turns
    into +/-Inf, zero or subnormals (what ``--cast`` reports, and refuses for overflow)."""
    losses = []
    for p in plans:
        if p.dropped or p.new_dtype == p.var.dtype or p.var.dtype not in CAST_DTYPES:
            continue
        target = m.numpy_dtype(p.new_dtype)
        tiny = _smallest_normal(target)
        overflow = zero = subnormal = 0
        for block in ckpt.iter_blocks(p.var, BLOCK_ELEMENTS):
            source = np.asarray(block).astype(np.float64)
            with np.errstate(over="ignore", under="ignore", invalid="ignore"):
                cast = source.astype(target).astype(np.float64)
            finite = np.isfinite(source)
            overflow += int(np.count_nonzero(finite & ~np.isfinite(cast)))
            zero += int(np.count_nonzero(finite & (source != 0) & (cast == 0)))
            subnormal += int(np.count_nonzero((cast != 0) & (np.abs(cast) < tiny)))
        if overflow or zero or subnormal:
            losses.append(CastLoss(p.new_name, p.new_dtype, overflow, zero, subnormal))
    return losses


def _refuse_overflow(path: str, losses: list[CastLoss], cast: str) -> None:
    """An overflow silently turns weights into Inf: refused unless the user allows it."""
    over = [x for x in losses if x.overflow]
    if not over:
        return
    named = ", ".join(f"{x.name} ({x.overflow})" for x in over[:MAX_NAMED])
    more = f" and {len(over) - MAX_NAMED} more" if len(over) > MAX_NAMED else ""
    raise UsageError(
        f"{path}: --cast {cast} would turn {sum(x.overflow for x in over)} finite values into +/-Inf, in "
        f"{len(over)} variable(s): {named}{more}; pass --allow-overflow to write them anyway"
    )


def _same_values(ckpt: m.Checkpoint, src: m.Variable, written: m.Checkpoint, out: m.Variable, dtype: str) -> bool:
    """Streamed bit-for-bit comparison of the output with the source (cast to ``dtype``)."""
    if src.dtype not in m.NUMERIC_DTYPES or dtype not in m.NUMERIC_DTYPES:
        return bit_equal(ckpt.read(src), written.read(out))
    np_dtype = m.numpy_dtype(dtype)
    blocks_a = ckpt.iter_blocks(src, BLOCK_ELEMENTS)
    blocks_b = written.iter_blocks(out, BLOCK_ELEMENTS)
    for a in blocks_a:
        b = next(blocks_b, None)
        if b is None:
            return False
        if dtype != src.dtype:
            with np.errstate(over="ignore", under="ignore"):  # what the cast wrote, overflow allowed
                a = a.astype(np_dtype)
        if not bit_equal(a.reshape(-1), np.asarray(b).reshape(-1)):
            return False
    return next(blocks_b, None) is None


# -- TF bundles ------------------------------------------------------------------------------
def _graph_for(ckpt: m.Checkpoint, plans: list[_Plan]) -> tuple[bytes | None, dict[str, Any] | None, list[str]]:
    """The output's object graph (TF2) and each plan's new key; notes."""
    notes: list[str] = []
    if ckpt.info.get("kind") != "tf2-object":
        for p in plans:
            if not p.dropped:
                p.new_key = p.new_name
        notes.append("name-based (TF1) checkpoint: restore with tf.compat.v1.train.Saver over the renamed variables")
        if ckpt.format == m.FORMAT_TF_V1:
            notes.append("the V1 table source was rewritten as a V2 bundle (.index + .data); sliced variables"
                         " are written whole")
        return None, None, notes
    graph_info = ckpt.info.get("object_graph") or {}
    object_graph = getattr(ckpt.source, "object_graph", None)
    if graph_info.get("error") or object_graph is None:
        raise CorruptCheckpointError(
            f"{ckpt.path}: the object graph cannot be read ({graph_info.get('error', 'not a local bundle')});"
            " rewrite needs it to write a restorable checkpoint"
        )
    blob = object_graph()
    moves: dict[str, tuple[str, ...]] = {}
    full_names: dict[str, str] = {}
    for p in plans:
        v = p.var
        if p.new_name == v.name or OPTIMIZER_SLOT_MARK in v.key:
            continue  # slot variables follow their variable
        if v.name == _key_name(v.key):
            moves[v.key] = unescape_path(p.new_name)
        else:
            full_names[v.key] = p.new_name
    dropped = frozenset(p.var.key for p in plans if p.dropped)
    edited = edit_object_graph(blob, GraphEdit(moves, full_names, dropped), {p.var.key: p.var.name for p in plans})
    key_map = dict(edited.key_map)
    blob = edited.blob
    info: dict[str, Any] = {
        "edges_renamed": edited.edges_renamed,
        "edges_moved": edited.edges_moved,
        "nodes_added": edited.nodes_added,
        "pruned": False,
    }
    kept = [p for p in plans if not p.dropped]
    optimizer_dropped = any(p.dropped and p.var.role == m.ROLE_OPTIMIZER for p in plans)
    if optimizer_dropped and not any(p.var.role == m.ROLE_OPTIMIZER for p in kept):
        # No optimizer state left: keep only the part a model restore walks (as extract does).
        pruned = prune_object_graph(blob, {key_map[p.var.key] for p in kept})
        key_map = {old: pruned.key_map[new] for old, new in key_map.items() if new in pruned.key_map}
        blob = pruned.blob
        info.update(pruned=True, source_nodes=pruned.source_nodes, nodes=pruned.num_nodes,
                    root_children=list(pruned.root_children))
        if len(pruned.root_children) == 1:
            notes.append(f"restore with tf.train.Checkpoint({pruned.root_children[0]}=model).read(OUT).assert_consumed()")
    for p in kept:
        p.new_key = key_map[p.var.key]
        if p.var.name == _key_name(p.var.key):  # a name that is the path follows the key
            p.new_name = _key_name(p.new_key)
    return blob, info, notes


def _output_tensors(ckpt: m.Checkpoint, plans: list[_Plan]) -> list[OutputTensor]:
    tensors = []
    for p in plans:
        if p.dropped:
            continue
        v = p.var
        if p.new_dtype == v.dtype:
            tensors.append(copy_tensor(ckpt, v, p.new_key))
        else:
            np_dtype = m.numpy_dtype(p.new_dtype)
            tensors.append(OutputTensor.whole(p.new_key, TensorData.from_blocks(p.new_dtype, v.shape,
                                                                                _cast_blocks(ckpt, v, np_dtype))))
    return tensors


def _read_back(ckpt: m.Checkpoint, plans: list[_Plan], tf2: bool, progress: Progress | None) -> Callable[[str], None]:
    kept = [p for p in plans if not p.dropped]
    keeps_slices = "slices" in capabilities(ckpt.format)  # V1 tables are read whole, and written whole

    def check(tmp: str) -> None:
        with open_checkpoint(tmp) as written:
            keys = {v.key for v in written.variables}
            expected = {p.new_key for p in kept}
            if keys != expected:
                missing, extra = sorted(expected - keys), sorted(keys - expected)
                what = f"missing {missing[0]!r}" if missing else f"unexpected {extra[0]!r}"
                raise VerificationError(f"{tmp}: read-back check failed ({what}); nothing was written")
            if tf2 and written.info.get("kind") != "tf2-object":
                raise VerificationError(f"{tmp}: read-back check failed: the object graph was not written")
            by_key = {v.key: v for v in written.variables}
            for done, p in enumerate(kept, 1):
                w = by_key[p.new_key]
                problem = None
                if w.name != p.new_name:
                    problem = f"reads back as {w.name!r}, expected {p.new_name!r}"
                elif w.dtype != p.new_dtype or w.shape != p.var.shape:
                    problem = f"reads back as {w.dtype}{list(w.shape)}, expected {p.new_dtype}{list(p.var.shape)}"
                elif keeps_slices and p.new_dtype == p.var.dtype and len(w.slices) != len(p.var.slices):
                    problem = f"has {len(w.slices)} stored slices, the source {len(p.var.slices)}"
                elif not _same_values(ckpt, p.var, written, w, p.new_dtype):
                    problem = "differs from the source value"
                if problem:
                    raise VerificationError(f"{tmp}: read-back check failed: {p.new_key!r} {problem}; nothing was written")
                if progress is not None:
                    progress(done, len(kept), p.var)

    return check


def _tf_notes(plans: list[_Plan], cast: str | None, cast_filter: str | None) -> list[str]:
    notes = []
    if any(p.var.sliced and p.new_dtype != p.var.dtype and not p.dropped for p in plans):
        notes.append("sliced variables that were cast are written whole (TensorFlow restores slices from them)")
    if cast is not None and any(p.new_dtype != p.var.dtype and not p.dropped for p in plans):
        # TensorFlow restores a value only into a variable of its dtype (checked: a bfloat16 cast
        # restores into a model built under the 'bfloat16' policy, not a float32 or mixed one).
        where = (f"build the model under keras.mixed_precision.set_global_policy('{cast}')" if cast_filter is None
                 else f"build the layers of the variables --cast-filter matched with dtype='{cast}'")
        notes.append(f"cast variables restore only into {cast} variables: {where} (float32 and mixed_{cast}"
                     " models keep float32 variables, which refuse them)" if cast in ("float16", "bfloat16")
                     else f"cast variables restore only into {cast} variables: {where}")
    return notes


# -- the operation -----------------------------------------------------------------------------
def rewrite(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    rename: RulesLike = (),
    drop: Sequence[str] = (),
    role: Sequence[str] | str = (),
    cast: str | None = None,
    cast_filter: str | None = None,
    allow_overflow: bool = False,
    force: bool = False,
    progress: Progress | None = None,
) -> RewriteReport:
    """Rename, drop and cast the variables of ``src``, writing ``out`` (in that order).

    Args:
        src: A TF checkpoint (prefix, ``.index``, directory, SavedModel, V1 table) or a Keras
            ``.weights.h5`` / legacy ``.h5`` file.
        out: The output: a ``.safetensors`` file (any source), else a TF prefix for a TF source
            and a file of the same kind for a Keras one.
        rename: ``REGEX=REPLACEMENT`` rules (or pairs, or a dict), applied in order with
            ``re.sub`` to every readable name (``--map`` semantics).
        drop: Regexes; a variable whose new name matches one (``re.search``) is left out.
        role: Keep only variables of these roles (``model``, ``optimizer``, ``metadata``).
        cast: ``float16``, ``bfloat16``, ``float32`` or ``float64``: cast the model's float
            variables (and their optimizer slots) to it.
        cast_filter: Cast only the model variables whose new name matches (``re.search``).
        allow_overflow: Write a cast that turns finite values into +/-Inf (refused otherwise).
            Values that become zero or subnormal are reported in the notes either way.
        force: Replace an existing output (of the same kind only).
        progress: Called as ``progress(done, total, variable)`` while the output is checked.

    Returns:
        The :class:`RewriteReport`.

    Raises:
        UsageError: Bad arguments, a rename that makes two variables collide, an output that
            does not fit the source.
        OutputExistsError: ``out`` exists and ``force`` is not set.
        CheckpointNotFoundError, NotACheckpointError, CorruptCheckpointError: Bad source.
        VerificationError: The output did not read back as planned (nothing is left behind).
    """
    start = time.perf_counter()
    src, out = os.fspath(src), os.fspath(out)
    roles = (role,) if isinstance(role, str) else tuple(dict.fromkeys(role))
    rules = parse_mapping(rename, "--rename")
    drops = _compile_all(list(drop), "--drop")
    cast_rx = _check_arguments(roles, cast, cast_filter)

    ckpt = open_checkpoint(src)
    try:
        plans = [_Plan(v, apply_rules(v.name, rules)[0], new_dtype=v.dtype) for v in ckpt.variables]
        _follow_owners(plans)
        _refuse_collisions(plans)
        for p in plans:
            p.dropped = any(rx.search(p.new_name) for rx in drops) or bool(roles and p.var.role not in roles)
        if all(p.dropped for p in plans):
            raise UsageError(f"{ckpt.path}: every variable would be dropped; nothing to write")
        losses: list[CastLoss] = []
        if cast is not None:
            _cast_plan(plans, cast, cast_rx)
            losses = _cast_losses(ckpt, plans)
            if not allow_overflow:
                _refuse_overflow(ckpt.path, losses, cast)
        for path in ckpt.files():  # bytes are copied from them: a FIFO or device would block
            if os.path.lexists(path):
                check_regular(path)
        protected = [src, ckpt.path, *source_files(ckpt)]
        source_bytes = files_size(source_files(ckpt))
        if output_kind(out) == TO_SAFETENSORS:  # any source the tool reads
            files, out_format, copied, notes, graph_info = rewrite_safetensors(ckpt, out, plans, force, protected)
            out_bytes = files_size(files)
        elif capabilities(ckpt.format) >= KERAS_REWRITABLE:
            from .keras_h5 import rewrite_keras  # noqa: PLC0415 - h5py only for Keras files

            files, out_format, copied, notes, graph_info = rewrite_keras(ckpt, out, plans, force, protected)
            out_bytes = files_size(files)
        elif "keras-layout" in capabilities(ckpt.format) and output_kind(out) == TO_KERAS:
            from .keras_h5 import rewrite_keras_zip  # noqa: PLC0415 - h5py only for Keras files

            files, out_format, copied, notes, graph_info = rewrite_keras_zip(ckpt, out, plans, force, protected)
            out_bytes = files_size(files)
        elif "tf-restorable" in capabilities(ckpt.format):
            error = _atomic.prefix_suffix_error(out, "a TF source is rewritten to a TF prefix", "")
            if error is not None:
                raise error
            blob, graph_info, notes = _graph_for(ckpt, plans)
            notes += _tf_notes(plans, cast, cast_filter)
            tf2 = blob is not None
            summary = _save(ckpt, out, plans, blob, force, protected, _read_back(ckpt, plans, tf2, progress))
            files = tuple(_atomic.prefix_files(out))
            out_format, copied = m.FORMAT_TF_BUNDLE, summary.copied_bytes
            out_bytes = files_size(files)
        else:
            raise UsageError(
                f"{ckpt.path}: rewrite writes {ckpt.format} sources to a .safetensors file only (TF checkpoints"
                " and Keras .weights.h5/.h5 files also to their own format, .keras archives to a .keras with --cast)"
            )
    finally:
        ckpt.close()
    rows = tuple(
        RewrittenVariable(
            name=p.var.name, key=p.var.key, role=p.var.role, shape=p.var.shape, dtype=p.var.dtype,
            nbytes=p.var.nbytes,
            new_name=None if p.dropped else p.new_name,
            new_key=None if p.dropped else p.new_key,
            new_dtype=None if p.dropped else p.new_dtype,
            new_nbytes=0 if p.dropped else _new_nbytes(p),
            copied=not p.dropped and p.new_dtype == p.var.dtype,
        )
        for p in plans
    )
    return RewriteReport(
        source=ckpt.path, source_format=ckpt.format, output=out, output_format=out_format, files=tuple(files),
        variables=rows, rules=rules_text(rename), drop=tuple(drop), roles=roles, cast=cast, cast_filter=cast_filter,
        source_file_bytes=source_bytes, output_file_bytes=out_bytes, copied_bytes=copied,
        verified=sum(1 for p in plans if not p.dropped), seconds=time.perf_counter() - start,
        object_graph=graph_info, notes=(*notes, *(x.note() for x in losses)),
    )


def _new_nbytes(p: _Plan) -> int:
    if p.new_dtype == p.var.dtype:
        return p.var.nbytes
    return p.var.size * m.ITEMSIZE[p.new_dtype]


def _save(ckpt, out, plans, blob, force, protected, check):
    from ...formats import save_bundle_native  # noqa: PLC0415 - the writer's module loads on first use

    return save_bundle_native(out, _output_tensors(ckpt, plans), object_graph=blob, force=force,
                              protected=protected, check=check)
