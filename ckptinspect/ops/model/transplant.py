"""``transplant``: put a checkpoint's weights into a built model, inside its distribution strategy.

Source variables (the checkpoint's model weights; optimizer state, counters and PyTorch
BatchNorm's ``num_batches_tracked`` are skipped by rule) are paired with the model's variables
by the one plan ``doctor`` and ``extract --builder`` use too, with the same options and defaults
(:func:`ckptinspect.ops.model.plan.plan_load`, through the one matcher,
:mod:`ckptinspect.ops.match.matcher`), each stage seeing only what the stages before it left
unpaired (``matched_by`` in the report):

1. ``graph-path``: when the source is a TF2 checkpoint of the same architecture, every model
   variable's path in the source's object graph (below the node the model was saved as,
   ``model`` in ``tf.train.Checkpoint(model=model)``) equals the path of one variable of the
   model, computed from ``tf.train.Checkpoint(model=model)``'s object graph. All or nothing.
2. ``name``: layer path + variable name (``encoder/enc_dense/kernel``), ignoring ``:0``; the
   model's variables also answer to their TF names, their Keras 3 ``.weights.h5`` positions
   (``bn/vars/0``) and those under the model's own name. This is how a Keras 2 ``.h5`` or a
   TF checkpoint lands in a Keras 3 model.
   ``prefix``: names equal once an outer prefix one side has is dropped; ``positional``: Keras 3
   ``layer/vars/N`` names matched by layer, creation order and shape; ``normalized-name``: names
   equal after normalisation (Keras auto-numbering offsets such as a Keras 2 file's ``dense_1``
   for a Keras 3 model's ``dense``, doubled components, TF1 ``weights``/``biases`` spellings).
   These are one global stage (:mod:`ckptinspect.ops.match.layers`) deciding whole layers at
   once, with shapes a hard constraint: a name whose shape differs never takes a variable that
   fits elsewhere.
3. ``layer-order`` (only with ``by_order=True``): layers nothing else paired, by layer order
   and shape; several layers of one shape signature only where the order is known, otherwise
   an ambiguity (never a guess).

Layout rules (``transpose_dense``, ``conv_layout="oihw"``, ``allow_reshape``;
:mod:`ckptinspect.ops.match.layouts`) let a source from another framework fit: shapes are compared
through them, and values rearranged the same way when assigned.

``mapping`` rules rewrite every source name (every rule, in order, ``re.sub``) before the name
stages; pairs made from a rewritten name report ``mapping``, and with rules the object-graph
stage is skipped. A name that fits several variables is left unpaired (and noted), never guessed.

Values are assigned in the model's own ``tf.distribute`` strategy (found from its variables) or
the one given, so every replica of a mirrored variable receives them; afterwards every assigned
variable is compared with the source on every local replica
(``strategy.experimental_local_results``): :mod:`ckptinspect.ops.model.assign`.

:func:`transplant` returns a :class:`TransplantReport` and never prints. The helpers
:func:`transplant_and_write` is what ``ckptinspect transplant`` runs: it composes
:func:`make_strategy` (:mod:`ckptinspect.ops.model.devices`), :func:`build_in_scope`,
:func:`transplant` and :func:`write_model` (:mod:`ckptinspect.ops.model.weights_io`), with the
output checked before any work.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

from ... import model as m
from ...errors import TransplantError, VerificationError
from .assign import assign_and_check, problems_text
from .builder import load_builder
from .devices import STRATEGIES, import_tf, make_strategy
from ..match.layouts import CONV_HWIO, FIT_EQUAL, Fit
from ..match.mapping import RulesLike, parse_mapping
from ..match.matcher import HOW_GRAPH_PATH, HOW_LAYER_ORDER, HOW_MAPPING, HOW_NAME, HOW_NORMALIZED, HOW_ORDER
from .weights_io import OUTPUT_KERAS, OUTPUT_TF, OUTPUT_WEIGHTS_H5, WriteResult, build_in_scope, output_kind, write_model
from .plan import (
    STATUS_AMBIGUOUS,
    STATUS_DTYPE_MISMATCH,
    STATUS_MATCHED,
    STATUS_MISSING,
    STATUS_SHAPE_MISMATCH,
    SKIP_COUNTER,
    SKIP_METADATA,
    SKIP_OPTIMIZER,
    PairingOptions,
    dtype_mismatch_text,
    missing_text,
    plan_load,
    shape_mismatch_text,
    unused_text,
)
from .targets import (
    MISMATCH_DTYPE,
    MISMATCH_SHAPE,
    Target,
    resolve_strategy,
    targets,
)

__all__ = [
    "MATCH_GRAPH_PATH",
    "MATCH_NAME",
    "MATCH_MAPPING",
    "MATCH_ORDER",
    "MATCH_NORMALIZED",
    "MATCH_LAYER_ORDER",
    "STRATEGIES",
    "OUTPUT_TF",
    "OUTPUT_WEIGHTS_H5",
    "OUTPUT_KERAS",
    "TransplantError",
    "VerificationError",
    "Assignment",
    "Mismatch",
    "TargetInfo",
    "SourceInfo",
    "TransplantReport",
    "WriteResult",
    "transplant",
    "TransplantOutcome",
    "transplant_and_write",
    "make_strategy",
    "load_builder",
    "build_in_scope",
    "output_kind",
    "write_model",
    "parse_mapping",
]

# ``matched_by`` values (the matcher's ``how``; ``prefix`` and ``positional`` may appear too).
MATCH_GRAPH_PATH = HOW_GRAPH_PATH
MATCH_NAME = HOW_NAME
MATCH_MAPPING = HOW_MAPPING
MATCH_ORDER = HOW_ORDER
MATCH_NORMALIZED = HOW_NORMALIZED
MATCH_LAYER_ORDER = HOW_LAYER_ORDER


# -- report ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Assignment:
    """One model variable that receives a source variable's value.

    Attributes:
        target: The model variable's readable name (Keras ``path``, or the TF name without ``:0``).
        source: The source variable's readable name.
        key: The source variable's key in the file.
        shape: The shape (equal on both sides).
        dtype: The model variable's dtype.
        source_dtype: The source's dtype (differs only for a float cast).
        matched_by: How the pair was made: ``graph-path``, ``name``, ``prefix``, ``positional``,
            ``mapping``, ``normalized-name`` or ``layer-order``
            (:data:`ckptinspect.ops.match.matcher.HOWS`).
        fit: How the source value is rearranged: ``equal`` (not at all), ``transpose``,
            ``permute`` or ``reshape`` (layout rules, :mod:`ckptinspect.ops.match.layouts`).
    """

    target: str
    source: str
    key: str
    shape: tuple[int, ...]
    dtype: str
    source_dtype: str
    matched_by: str
    fit: str = FIT_EQUAL

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "shape": list(self.shape)}


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """A paired model and source variable that cannot take the value (shape or dtype differs).

    Attributes:
        kind: ``shape`` or ``dtype``.
    """

    kind: str
    target: str
    source: str
    key: str
    target_shape: tuple[int, ...]
    source_shape: tuple[int, ...]
    target_dtype: str
    source_dtype: str
    matched_by: str

    def describe(self) -> str:
        """The problem, in the words doctor and extract use (:mod:`ckptinspect.ops.model.plan`)."""
        if self.kind == MISMATCH_SHAPE:
            return "shape mismatch: " + shape_mismatch_text(self.target, self.target_shape, self.source, self.source_shape)
        return "dtype mismatch: " + dtype_mismatch_text(self.target, self.target_dtype, self.source, self.source_dtype)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["target_shape"] = list(self.target_shape)
        out["source_shape"] = list(self.source_shape)
        return out


@dataclasses.dataclass(frozen=True)
class TargetInfo:
    """A model variable (used for those left at their initial value)."""

    target: str
    shape: tuple[int, ...]
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "shape": list(self.shape), "dtype": self.dtype}


@dataclasses.dataclass(frozen=True)
class SourceInfo:
    """A source model variable that no model variable took."""

    source: str
    key: str
    shape: tuple[int, ...]
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "key": self.key, "shape": list(self.shape), "dtype": self.dtype}


@dataclasses.dataclass(frozen=True)
class TransplantReport:
    """What a transplant did (or, with ``dry_run``, would do).

    Attributes:
        source: The resolved source path.
        source_format: The source's format (``tf-bundle``, ``keras-h5``...).
        model: The model's name.
        model_class: The model's class name.
        strategy: The strategy's class name the values were assigned in.
        replicas: Replicas in sync (all workers).
        local_replicas: Replicas of this process that were checked.
        dry_run: Nothing was assigned.
        strict, skip_mismatch, by_order: The options used.
        layout: The layout rules used, as the options that name them (``--transpose-dense``...).
        assigned: The pairs that received (or would receive) a value.
        mismatches: Pairs whose shape or dtype differ (not assigned).
        left_at_init: Model variables with no source: they keep their initial values.
        unused: Source model variables no model variable took.
        optimizer_skipped: Source optimizer variables (never transplanted).
        metadata_skipped: Source counters and other metadata (never transplanted).
        rule_skipped: Source model variables skipped by rule, never problems: PyTorch BatchNorm's
            ``num_batches_tracked`` (:mod:`ckptinspect.ops.model.plan`).
        verified: Every assigned value was read back equal on every local replica.
        notes: Remarks (optimizer state not transplanted, mapping rules that matched nothing...).
    """

    source: str
    source_format: str
    model: str
    model_class: str
    strategy: str
    replicas: int
    local_replicas: int
    dry_run: bool
    strict: bool
    skip_mismatch: bool
    by_order: bool
    assigned: tuple[Assignment, ...]
    mismatches: tuple[Mismatch, ...]
    left_at_init: tuple[TargetInfo, ...]
    unused: tuple[SourceInfo, ...]
    optimizer_skipped: int
    metadata_skipped: int
    verified: bool = False
    notes: tuple[str, ...] = ()
    layout: tuple[str, ...] = ()
    rule_skipped: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        """Every model variable received (or, in a dry run, would receive) a value."""
        return bool(self.assigned) and not self.mismatches and not self.left_at_init

    @property
    def shape_mismatches(self) -> tuple[Mismatch, ...]:
        return tuple(x for x in self.mismatches if x.kind == MISMATCH_SHAPE)

    @property
    def dtype_mismatches(self) -> tuple[Mismatch, ...]:
        return tuple(x for x in self.mismatches if x.kind == MISMATCH_DTYPE)

    @property
    def problems(self) -> list[str]:
        """The problems under the options used, one string each, as the one plan counts them
        (:attr:`ckptinspect.ops.model.plan.LoadPlan.problems`): mismatches (unless
        ``skip_mismatch``), variables left at init, and, ``strict`` only, unused source
        variables (``--no-strict`` allows them). What ``strict`` refuses."""
        out: list[str] = []
        if not self.skip_mismatch:
            out += [x.describe() for x in self.mismatches]
        out += [f"left at init: {missing_text(t.target, t.shape)}" for t in self.left_at_init]
        if self.strict:
            out += [f"unused source variable: {unused_text(s.source, s.shape)}" for s in self.unused]
        return out

    @property
    def ok(self) -> bool:
        """No problems (see :attr:`problems`): ``doctor``'s verdict with the same options."""
        return not self.problems

    def summary(self) -> dict[str, int]:
        return {
            "assigned": len(self.assigned),
            "shape_mismatch": len(self.shape_mismatches),
            "dtype_mismatch": len(self.dtype_mismatches),
            "left_at_init": len(self.left_at_init),
            "unused": len(self.unused),
            "optimizer_not_transplanted": self.optimizer_skipped,
            "metadata_not_transplanted": self.metadata_skipped,
            "skipped_by_rule": len(self.rule_skipped),
        }

    def to_dict(self) -> dict[str, Any]:
        """The ``transplant --format json`` document (without the ``output`` part)."""
        return {
            "source": self.source,
            "source_format": self.source_format,
            "model": self.model,
            "model_class": self.model_class,
            "strategy": self.strategy,
            "replicas": self.replicas,
            "local_replicas": self.local_replicas,
            "dry_run": self.dry_run,
            "strict": self.strict,
            "skip_mismatch": self.skip_mismatch,
            "by_order": self.by_order,
            "layout": list(self.layout),
            "verified": self.verified,
            "ok": self.ok,
            "complete": self.complete,
            "summary": self.summary(),
            "assigned": [a.to_dict() for a in self.assigned],
            "mismatches": [x.to_dict() for x in self.mismatches],
            "left_at_init": [t.to_dict() for t in self.left_at_init],
            "unused": [s.to_dict() for s in self.unused],
            "skipped_by_rule": list(self.rule_skipped),
            "problems": self.problems,
            "notes": list(self.notes),
        }

    def __str__(self) -> str:
        """A plain-text summary (rendered by :func:`ckptinspect.render.transplant_summary`)."""
        from ...render import transplant_summary  # noqa: PLC0415 - rendering lives in render/; ops do not need it

        return transplant_summary(self)


# -- the operation -----------------------------------------------------------------------------


def transplant(
    source: str | os.PathLike[str] | m.Checkpoint,
    model: Any,
    *,
    mapping: RulesLike = None,
    strategy: Any = None,
    strict: bool = True,
    skip_mismatch: bool = False,
    dry_run: bool = False,
    by_order: bool = False,
    transpose_dense: bool = False,
    conv_layout: str = CONV_HWIO,
    allow_reshape: bool = False,
) -> TransplantReport:
    """Put a checkpoint's model weights into a built model, inside the model's strategy.

    Args:
        source: A checkpoint of any supported format (path, or an open
            :class:`~ckptinspect.Checkpoint`).
        model: A built Keras 3 model or a ``tf.Module`` with its variables created.
        mapping: ``--map`` rules for the source names: ``{regex: replacement}``, ``(regex,
            replacement)`` pairs or ``"REGEX=REPLACEMENT"`` strings. Every rule applies, in
            order, to every source name before the name stages, and the object-graph stage is
            skipped (docs/INTERFACE.md, "Pairing variables").
        strategy: The ``tf.distribute`` strategy to assign in; default: the one the model's
            variables were created under (or the current one).
        strict: Raise :class:`TransplantError` listing every problem (mismatches, variables left at
            init, unused source variables) instead of transplanting what matches. False
            (``--no-strict``, :attr:`ckptinspect.ops.model.plan.PairingOptions.strict`, as
            ``doctor`` and ``extract`` take it): unused source variables are allowed (a note),
            and variables without a value that fits keep their initial values.
        skip_mismatch: With ``strict``, tolerate shape/dtype mismatches (those variables keep their
            initial values; the report lists them).
        dry_run: Plan only: nothing is read or assigned, and nothing is raised for problems
            (the report lists them).
        by_order: Also pair layers nothing else paired by layer order and shape.
        transpose_dense: Source 2-D kernels are ``[out, in]`` (PyTorch ``Linear``): transposed.
        conv_layout: ``oihw``: source conv kernels are ``[out, in, *spatial]`` (PyTorch):
            reordered to Keras' ``[*spatial, in, out]``; ``hwio`` (default): as Keras.
        allow_reshape: A source value with as many elements as the model variable is reshaped.

    Returns:
        A :class:`TransplantReport`. Optimizer state is never transplanted; the report says how
        many optimizer variables the source held.

    Raises:
        UsageError: The model is not built, is not a model, or lives in an unsupported strategy
            (ParameterServerStrategy, ShardedVariable); a bad mapping rule.
        TransplantError: ``strict`` and problems were found.
        VerificationError: A value differs from the source on some replica after assignment.
        CkptError: The source cannot be opened or read.
    """
    options = PairingOptions.make(mapping, by_order=by_order, transpose_dense=transpose_dense,
                                  conv_layout=conv_layout, allow_reshape=allow_reshape, strict=strict)
    tf = import_tf()
    model_targets = targets(tf, model)
    strat = resolve_strategy(tf, model_targets, strategy)

    owns = not isinstance(source, m.Checkpoint)
    if owns:
        from ...formats import open_checkpoint  # noqa: PLC0415

        ckpt = open_checkpoint(os.fspath(source))
    else:
        ckpt = source
    try:
        report, plan = _plan(ckpt, model, model_targets, strat, options, skip_mismatch=skip_mismatch, dry_run=dry_run)
        if dry_run:
            return report
        if strict and report.problems:
            raise _strict_error(ckpt, report)
        assign_and_check(tf, strat, ckpt, plan)
        return dataclasses.replace(report, verified=True)
    finally:
        if owns:
            ckpt.close()


def _strict_error(ckpt: m.Checkpoint, report: TransplantReport) -> TransplantError:
    """What ``strict`` refuses with: every problem the plan found, and the ways around them."""
    problems = report.problems
    return TransplantError(
        f"{ckpt.path}: cannot transplant into {report.model!r} ({len(problems)} problem"
        f"{'s' if len(problems) != 1 else ''}): " + problems_text(problems)
        + " (strict: pass strict=False / --no-strict to transplant what matches, skip_mismatch=True /"
        " --skip-mismatch to leave mismatched shapes at init, or mapping rules / --map to rename)",
        problems=problems,
        report=report,
    )


@dataclasses.dataclass(frozen=True)
class TransplantOutcome:
    """What :func:`transplant_and_write` did: the transplant's report, and the output written
    (None for a dry run, or when no model variable received a value)."""

    report: TransplantReport
    output: WriteResult | None


def transplant_and_write(
    source: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    builder: str,
    *,
    strategy: str = "default",
    replicas: int | None = None,
    mapping: RulesLike = None,
    strict: bool = True,
    skip_mismatch: bool = False,
    dry_run: bool = False,
    by_order: bool = False,
    transpose_dense: bool = False,
    conv_layout: str = CONV_HWIO,
    allow_reshape: bool = False,
    force: bool = False,
) -> TransplantOutcome:
    """Build a model inside a ``tf.distribute`` strategy, put a checkpoint's weights into it, and
    write it to ``dst`` (``ckptinspect transplant SRC DST --builder MODULE:FUNCTION``).

    In order:

    1. ``dst``'s kind (by suffix) and the ``mapping`` rules are checked before any work.
    2. The source is opened; unless ``dry_run``, ``dst`` is checked against the atomic-output
       rules (an existing output without ``force``, anything but an earlier output of the same
       kind, the source itself or its directory) before TensorFlow is set up.
    3. The strategy is made (:func:`make_strategy`: devices are configured here, the first
       TensorFlow work) and the builder called inside its scope (:func:`build_in_scope`).
    4. :func:`transplant` pairs, assigns and checks the values.
    5. Unless ``dry_run``, and only when some model variable received a value (a model holding
       only its initial values is no transplant), the model is written to ``dst`` and read back
       (:func:`write_model`, the source protected).

    Args:
        source: The checkpoint to read (any supported format).
        dst: A TF checkpoint prefix, or a ``.weights.h5`` / ``.keras`` file (by suffix).
        builder: ``pkg.module:function`` returning the model (called inside the strategy scope).
        strategy: ``default``, ``mirrored`` or ``multi-worker`` (reads ``TF_CONFIG``).
        replicas: Logical CPU devices for ``mirrored`` (default 2).
        mapping, strict, skip_mismatch, dry_run, by_order, transpose_dense, conv_layout,
            allow_reshape: As for :func:`transplant`.
        force: Replace an earlier output of the same kind at ``dst``.

    Returns:
        A :class:`TransplantOutcome`: the report, and the :class:`WriteResult` (or None).

    Raises:
        UsageError: A bad ``dst`` suffix, mapping rule, strategy or builder; ``dst`` is in the
            way (not an earlier output of the same kind, an input, a source directory).
        OutputExistsError: An earlier output is at ``dst`` and ``force`` is not set.
        TransplantError, VerificationError, CkptError: As for :func:`transplant` and
            :func:`write_model`.
    """
    from ... import _atomic  # noqa: PLC0415
    from ...formats import open_checkpoint  # noqa: PLC0415

    dst = os.fspath(dst)
    kind = output_kind(dst)
    parse_mapping(mapping)  # bad rules fail before any work
    with open_checkpoint(os.fspath(source)) as ckpt:
        protected = [os.fspath(source), ckpt.path]
        if not dry_run:  # a dry run writes nothing: what is at dst does not matter
            _atomic.check_output(dst, force=force, prefix=kind == OUTPUT_TF, protected=protected)
        strat = make_strategy(strategy, replicas)  # the first TensorFlow work: devices are set up here
        model = build_in_scope(builder, strat)
        report = transplant(ckpt, model, mapping=mapping, strategy=strat, strict=strict, skip_mismatch=skip_mismatch,
                            dry_run=dry_run, by_order=by_order, transpose_dense=transpose_dense,
                            conv_layout=conv_layout, allow_reshape=allow_reshape)
    if dry_run or not report.assigned:
        return TransplantOutcome(report, None)
    return TransplantOutcome(report, write_model(model, dst, force=force, protected=protected, strategy=strat))


def _plan(
    ckpt: m.Checkpoint,
    model: Any,
    model_targets: Sequence[Target],
    strat: Any,
    options: PairingOptions,
    *,
    skip_mismatch: bool,
    dry_run: bool,
) -> tuple[TransplantReport, list[tuple[Target, m.Variable, Fit | None]]]:
    plan = plan_load(ckpt, model_targets, options)
    assigned, mismatches = [], []
    for w in plan.weights:
        t, s = w.target, w.source
        if w.status == STATUS_MATCHED:
            assigned.append(Assignment(t.name, s.name, s.key, t.shape, t.dtype, s.dtype, w.how, w.fit.kind))
        elif w.status in (STATUS_SHAPE_MISMATCH, STATUS_DTYPE_MISMATCH):
            kind = MISMATCH_SHAPE if w.status == STATUS_SHAPE_MISMATCH else MISMATCH_DTYPE
            mismatches.append(Mismatch(kind, t.name, s.name, s.key, t.shape, tuple(s.shape), t.dtype, s.dtype, w.how))
    left = [TargetInfo(w.target.name, w.target.shape, w.target.dtype) for w in plan.weights
            if w.status in (STATUS_MISSING, STATUS_AMBIGUOUS)]
    unused = [SourceInfo(x.source.name, x.source.key, tuple(x.source.shape), x.source.dtype) for x in plan.leftovers]
    optimizer_skipped = plan.skipped_count(SKIP_OPTIMIZER)

    notes = list(plan.notes)
    casts = [a for a in assigned if a.dtype != a.source_dtype]
    if casts:
        notes.append(f"{len(casts)} variable(s) cast between float dtypes (e.g. {casts[0].target}: "
                     f"{casts[0].source_dtype} -> {casts[0].dtype})")
    notes.append(
        "optimizer state is not transplanted (model weights only)"
        + (f": {optimizer_skipped} optimizer variable(s) in the source left out" if optimizer_skipped else
           ": the source holds none")
    )
    local = len(strat.experimental_local_results(model_targets[0].variable)) if model_targets else 1
    report = TransplantReport(
        source=ckpt.path,
        source_format=ckpt.format,
        model=getattr(model, "name", None) or type(model).__name__,
        model_class=type(model).__name__,
        strategy=type(strat).__name__,
        replicas=int(strat.num_replicas_in_sync),
        local_replicas=local,
        dry_run=dry_run,
        strict=options.strict,
        skip_mismatch=skip_mismatch,
        by_order=options.by_order,
        assigned=tuple(assigned),
        mismatches=tuple(mismatches),
        left_at_init=tuple(left),
        unused=tuple(unused),
        optimizer_skipped=optimizer_skipped,
        metadata_skipped=plan.skipped_count(SKIP_METADATA),
        verified=False,
        notes=tuple(notes),
        layout=options.layout.describe(),
        rule_skipped=tuple(x.source.name for x in plan.skipped if x.reason == SKIP_COUNTER),
    )
    return report, plan.entries
