"""``doctor``: why a checkpoint's weights will not load into a model, and the fix.

For every variable of a built model, where its value would come from and how it was matched,
and every source model variable left over: the one plan of
:func:`~ckptinspect.ops.model.plan.plan_load`, with the options ``transplant`` and
``extract --builder`` take (``mapping``, ``by_order``, the layout rules) and the same defaults.
The verdict is :attr:`DoctorReport.ok`, the plan's: every model weight has a source of a fitting
shape (equal, or through the layout rules given) and a castable dtype, and (strict, the default)
every source model variable goes into a weight; so ``doctor`` says OK exactly when ``transplant``
and ``extract --builder`` with the same options load everything. With ``strict=False``
(``--no-strict``) unused source variables are allowed (a note) and the verdict is OK exactly when
every weight receives a value; otherwise it names the weights ``transplant --no-strict`` and
``extract --builder --no-strict`` would leave at init. The reasons are grouped: missing in the
source, shape mismatch, dtype mismatch, ambiguous, unused (strict only). Optimizer state,
metadata and PyTorch BatchNorm's ``num_batches_tracked`` are skipped by rule, never problems.

The fix, ready to use:

* :attr:`DoctorReport.flags`: the flags it needs by their command-line names, with what they do
  (``--by-order``, when layer order would pair more weights: the plan is made again with it;
  ``--no-strict``, when every weight would receive a value and only unused source variables
  stand in the way);
* :attr:`DoctorReport.map_rules`: ``--map`` rules (the user's own first) under which the name
  stages alone make every pair the doctor found, checked by running the matcher with them;
* :attr:`DoctorReport.assignment_map`: ``{checkpoint key: model variable name}`` for
  ``tf.compat.v1.train.init_from_checkpoint`` (TF checkpoint sources);
* ``out=...``: a ``.weights.h5`` written through the model (``model.save_weights``), which a
  plain ``model.load_weights(OUT)`` loads, read back through Keras and compared with the source
  before it is renamed into place (:func:`~ckptinspect.ops.extract.writers.write_weights_through_model`).

Nothing is assigned to the model unless ``out`` is given (then the model holds the source's
values afterwards). The library never prints: :mod:`ckptinspect.render` shows the report.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from typing import Any, Callable, Sequence

from ... import _atomic
from ... import model as m
from ...errors import UsageError
from ..model.devices import optional_tf
from .rules import propose, propose_rules, rules_as_given
from ..match.layouts import CONV_HWIO, FIT_EQUAL, Fit
from ..match.mapping import RulesLike, rules_text
from ..match.matcher import HOW_LAYER_ORDER
from ..sources import source_files
from ..model.weights_io import OUTPUT_WEIGHTS_H5, WEIGHTS_H5_SUFFIX, WriteResult
from ...formats import FORMAT_OF, capabilities
from ..model.plan import (
    BY_ORDER_FLAG,
    NO_STRICT_FLAG,
    SKIP_COUNTER,
    SKIP_METADATA,
    SKIP_OPTIMIZER,
    STATUS_AMBIGUOUS,
    STATUS_DTYPE_MISMATCH,
    STATUS_MATCHED,
    STATUS_MISSING,
    STATUS_SHAPE_MISMATCH,
    STATUS_UNUSED,
    LoadPlan,
    PairingOptions,
    by_order_gain,
    describe_counts,
    plan_load,
    refusal,
)
from ..model.targets import (
    TF_RESTORABLE,
    Target,
    is_keras,
    model_variables,
    targets,
)

__all__ = [
    "weight_plan",
    "WritePlan",
    "STATUS_MATCHED",
    "STATUS_SHAPE_MISMATCH",
    "STATUS_DTYPE_MISMATCH",
    "STATUS_AMBIGUOUS",
    "STATUS_MISSING",
    "STATUS_UNUSED",
    "REASON_GROUPS",
    "WeightDiagnosis",
    "SourceLeftover",
    "DoctorReport",
    "doctor",
    "propose_rules",
]

# The reasons a load fails, grouped, in the order they are shown.
REASON_MISSING = "missing"
REASON_SHAPE = "shape_mismatch"
REASON_DTYPE = "dtype_mismatch"
REASON_AMBIGUOUS = "ambiguous"
REASON_UNUSED = "unused"
REASON_GROUPS = (REASON_MISSING, REASON_SHAPE, REASON_DTYPE, REASON_AMBIGUOUS, REASON_UNUSED)
_REASON_OF_STATUS = {
    STATUS_MISSING: REASON_MISSING,
    STATUS_SHAPE_MISMATCH: REASON_SHAPE,
    STATUS_DTYPE_MISMATCH: REASON_DTYPE,
    STATUS_AMBIGUOUS: REASON_AMBIGUOUS,
}
# Temporary names that break a cycle of renames (a swap) in the proposed --map rules.
# What the name stages report when the proposed rules work.

Progress = Callable[[int, int, Any], None]


# -- report ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class WeightDiagnosis:
    """One model weight: where its value would come from, or why none can.

    Attributes:
        target: The model variable's name (Keras ``path``, or the TF name without ``:0``).
        shape: Its shape.
        dtype: Its dtype.
        status: ``matched``, ``shape-mismatch``, ``dtype-mismatch``, ``ambiguous`` or ``missing``.
        source: The source variable's readable name (paired, or the one it mismatches), or None.
        key: The source variable's key in the file, or None.
        source_shape: The source's shape, or None.
        source_dtype: The source's dtype, or None.
        matched_by: How the pair was made (:data:`ckptinspect.ops.match.matcher.HOWS`), or None.
        fit: How the value is rearranged when it fits (``equal``, ``transpose``, ``permute``,
            ``reshape``), or None.
        detail: Why it is not matched (one sentence), or "".
        candidates: For ``ambiguous``: the source variables it could come from.
    """

    target: str
    shape: tuple[int, ...]
    dtype: str
    status: str
    source: str | None = None
    key: str | None = None
    source_shape: tuple[int, ...] | None = None
    source_dtype: str | None = None
    matched_by: str | None = None
    fit: str | None = None
    detail: str = ""
    candidates: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["shape"] = list(self.shape)
        out["source_shape"] = None if self.source_shape is None else list(self.source_shape)
        out["candidates"] = list(self.candidates)
        return out


@dataclasses.dataclass(frozen=True)
class SourceLeftover:
    """A source model variable no model weight takes (``unused``, or part of an ambiguity)."""

    source: str
    key: str
    shape: tuple[int, ...]
    dtype: str
    status: str
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "shape": list(self.shape)}


@dataclasses.dataclass(frozen=True)
class DoctorReport:
    """What :func:`doctor` found.

    Attributes:
        source: The resolved source path.
        source_format: Its format.
        model: The model's name.
        model_class: The model's class name.
        layout: The layout rules used, as the options naming them.
        mapping: The ``--map`` rules given.
        weights: One entry per model weight, in the model's order.
        leftovers: Source model variables no weight takes.
        optimizer_skipped: Source optimizer variables (never loaded into a model).
        metadata_skipped: Source counters and other metadata.
        notes: What the matcher did, one sentence each.
        map_rules: ``--map`` rules (the given ones first) making every matched pair by name.
        map_verified: The matcher, run with ``map_rules`` and names alone, makes exactly the
            matched pairs.
        assignment_map: ``{checkpoint key: model variable name}`` for
            ``tf.compat.v1.train.init_from_checkpoint`` (TF sources; None otherwise).
        output: The ``.weights.h5`` written (``out=``), or None.
        by_order: ``--by-order`` was given.
        strict: ``--strict`` (default) or not (``--no-strict``).
        rule_skipped: Source model variables skipped by rule (PyTorch BatchNorm's
            ``num_batches_tracked``): never problems.
        problems: Every problem, in the words ``transplant`` and ``extract`` use (with
            ``--no-strict``: the weights that would be left at init).
        flags: Command-line flags the fix needs, each with what it does (``--by-order pairs ...``).
    """

    source: str
    source_format: str
    model: str
    model_class: str
    layout: tuple[str, ...]
    mapping: tuple[str, ...]
    weights: tuple[WeightDiagnosis, ...]
    leftovers: tuple[SourceLeftover, ...]
    optimizer_skipped: int
    metadata_skipped: int
    notes: tuple[str, ...] = ()
    map_rules: tuple[str, ...] = ()
    map_verified: bool = False
    assignment_map: dict[str, str] | None = None
    output: WriteResult | None = None
    by_order: bool = False
    rule_skipped: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    strict: bool = True

    @property
    def ok(self) -> bool:
        """The verdict (exit 0), the one :class:`~ckptinspect.ops.model.plan.LoadPlan` gives:
        every model weight has a source value that fits and (strict) every source model variable
        goes into a weight, so ``transplant`` and ``extract --builder`` with the same options
        load everything."""
        return not self.problems

    @property
    def left_at_init(self) -> tuple[WeightDiagnosis, ...]:
        """The weights without a source value that fits: ``--no-strict`` leaves them at init."""
        return tuple(w for w in self.weights if w.status != STATUS_MATCHED)

    @property
    def complete(self) -> bool:
        """Every model weight has a source value that fits (source variables may be left over)."""
        return all(w.status == STATUS_MATCHED for w in self.weights)

    @property
    def matched(self) -> tuple[WeightDiagnosis, ...]:
        return tuple(w for w in self.weights if w.status == STATUS_MATCHED)

    def reasons(self) -> dict[str, list[str]]:
        """What stops the load, grouped (:data:`REASON_GROUPS`), one string per variable."""
        out: dict[str, list[str]] = {g: [] for g in REASON_GROUPS}
        for w in self.weights:
            group = _REASON_OF_STATUS.get(w.status)
            if group is not None:
                out[group].append(w.detail)
        if self.strict:  # --no-strict allows them (a note says so)
            out[REASON_UNUSED] = [s.detail for s in self.leftovers]
        return out

    def summary(self) -> dict[str, int]:
        counts = collections.Counter(w.status for w in self.weights)
        return {
            "weights": len(self.weights),
            "matched": counts[STATUS_MATCHED],
            "missing": counts[STATUS_MISSING],
            "shape_mismatch": counts[STATUS_SHAPE_MISMATCH],
            "dtype_mismatch": counts[STATUS_DTYPE_MISMATCH],
            "ambiguous": counts[STATUS_AMBIGUOUS],
            "unused": len(self.leftovers),
            "optimizer_skipped": self.optimizer_skipped,
            "metadata_skipped": self.metadata_skipped,
            "skipped_by_rule": len(self.rule_skipped),
        }

    def to_dict(self) -> dict[str, Any]:
        """The ``doctor --format json`` document."""
        return {
            "source": self.source,
            "source_format": self.source_format,
            "model": self.model,
            "model_class": self.model_class,
            "layout": list(self.layout),
            "mapping": list(self.mapping),
            "by_order": self.by_order,
            "strict": self.strict,
            "ok": self.ok,
            "summary": self.summary(),
            "weights": [w.to_dict() for w in self.weights],
            "unused": [s.to_dict() for s in self.leftovers],
            "skipped_by_rule": list(self.rule_skipped),
            "reasons": self.reasons(),
            "problems": list(self.problems),
            "fix": {
                "flags": list(self.flags),
                "map": list(self.map_rules),
                "map_verified": self.map_verified,
                "assignment_map": self.assignment_map,
            },
            "output": None if self.output is None else self.output.to_dict(),
            "notes": list(self.notes),
        }


# -- the operation -----------------------------------------------------------------------------
def doctor(
    source: str | os.PathLike[str] | m.Checkpoint,
    model: Any,
    *,
    mapping: RulesLike = None,
    allow_reshape: bool = False,
    transpose_dense: bool = False,
    conv_layout: str = CONV_HWIO,
    by_order: bool = False,
    strict: bool = True,
    out: str | os.PathLike[str] | None = None,
    force: bool = False,
    progress: Progress | None = None,
) -> DoctorReport:
    """Explain how a checkpoint's weights would load into a built model, and propose the fix.

    Args:
        source: A checkpoint of any supported format (path, or an open
            :class:`~ckptinspect.Checkpoint`).
        model: A built Keras 3 model or a ``tf.Module`` with its variables created.
        mapping: ``--map`` rules for the source names (docs/INTERFACE.md, "Pairing variables").
        allow_reshape: A source value with as many elements as the weight fits (reshaped).
        transpose_dense: Source 2-D kernels are ``[out, in]`` (PyTorch ``Linear``).
        conv_layout: ``oihw`` when source conv kernels are ``[out, in, *spatial]`` (PyTorch).
        by_order: Also pair layers nothing else paired by layer order and shape (``--by-order``,
            as ``transplant`` and ``extract`` take it). Without it, the report says what it
            would pair (:attr:`DoctorReport.flags`).
        strict: ``--strict`` (default): unused source variables are problems, as they stop
            ``transplant`` and ``extract --builder``. False (``--no-strict``): they are allowed
            (a note), and the verdict is OK exactly when every weight receives a value (the
            problems are the weights ``--no-strict`` would leave at init).
        out: Also write a ``.weights.h5`` that ``model.load_weights(out)`` loads (the model's
            weights receive the source values). Refused unless the verdict is OK.
        force: Replace an earlier ``out`` (an HDF5 file; nothing else).
        progress: Called as ``progress(done, total, weight)`` while ``out`` is written.

    Returns:
        The :class:`DoctorReport` (``output`` set when ``out`` was written).

    Raises:
        UsageError: The model is not built or not a model; a bad rule or layout; ``out`` asked
            for a non-Keras model, a name not ending in ``.weights.h5``, or weights that do not
            all load (the reasons are named).
        OutputExistsError: ``out`` exists and not ``force``.
        CkptError: The source cannot be opened or read.
    """
    options = PairingOptions.make(mapping, by_order=by_order, transpose_dense=transpose_dense,
                                  conv_layout=conv_layout, allow_reshape=allow_reshape, strict=strict)
    if out is not None:
        out = os.fspath(out)
        if not out.endswith(WEIGHTS_H5_SUFFIX):
            raise UsageError(f"{out}: doctor writes Keras 3 weights: name the output *{WEIGHTS_H5_SUFFIX}")
        if not is_keras(model):
            raise UsageError(f"{out}: a .weights.h5 output needs a Keras 3 model (model.save_weights)")
    tf = optional_tf()  # any Keras 3 backend; TensorFlow's object graph when it is there
    model_targets = targets(tf, model)
    owns = not isinstance(source, m.Checkpoint)
    if owns:
        from ...formats import open_checkpoint  # noqa: PLC0415

        ckpt = open_checkpoint(os.fspath(source))
    else:
        ckpt = source
    try:
        if out is not None:  # before any work: an existing output, or one that would overwrite an input
            _atomic.check_output(out, force=force, kind=_atomic.KIND_HDF5, protected=_protected(ckpt))
        report, plan = _diagnose(ckpt, model, model_targets, options)
        if out is None:
            return report
        entries = _entries(report, plan, model, out, "run doctor without --emit weights for the reasons")
        from ..extract.writers import write_weights_through_model  # noqa: PLC0415 - h5py, TF readers

        with _atomic.atomic_file(out, force=force, kind=_atomic.KIND_HDF5, protected=_protected(ckpt)) as tmp:
            checked = write_weights_through_model(ckpt, tmp, model, entries, progress)
        written = WriteResult(path=out, format=FORMAT_OF[OUTPUT_WEIGHTS_H5], written=True, verified=True, checked=checked)
        return dataclasses.replace(report, output=written)
    finally:
        if owns:
            ckpt.close()


def _entries(report: DoctorReport, plan: LoadPlan, model: Any, out: str, hint: str) -> list[tuple[Any, m.Variable, Fit]]:
    """``(model weight, source variable, fit)`` for every weight, or the refusal naming why not
    (the plan's problems, in the words every command uses)."""
    if not plan.ok:
        raise UsageError(f"{refusal(plan, f'{out}: not written')}; {hint}")
    variables, _ = model_variables(model)
    return [(variables[t.index], s, f) for t, s, f in plan.entries]


@dataclasses.dataclass(frozen=True)
class WritePlan:
    """What a writer through a built model assigns (:func:`weight_plan`).

    Attributes:
        report: The doctor's report of the plan.
        entries: ``(model weight, source variable, fit)`` of every weight that receives a value.
        left_at_init: The model weights that keep their initial values (``--no-strict`` only).
    """

    report: DoctorReport
    entries: list[tuple[Any, m.Variable, Fit]]
    left_at_init: list[Any]


def weight_plan(ckpt: m.Checkpoint, model: Any, *, options: PairingOptions, out: str, hint: str) -> WritePlan:
    """Pair every weight of a built model with a source value, as :func:`doctor` does (the one
    plan, :func:`~ckptinspect.ops.model.plan.plan_load`), for a writer (``extract --builder``).

    Strict: every weight must receive a value and every source model variable be used. With
    ``options.strict`` False (``--no-strict``), as ``transplant --no-strict``: the weights that
    match receive their values, the others keep the model's initial values (listed), unused
    source variables are left out; refused only when no weight receives a value.

    Args:
        ckpt: The open source checkpoint.
        model: A built Keras 3 model.
        options: The pairing options.
        out: The output, as error messages name it.
        hint: What the refusal suggests (where to see the reasons).

    Returns:
        The :class:`WritePlan`.

    Raises:
        UsageError: Strict and the plan has problems, or no weight receives a value (counted by
            kind, the first ones named).
    """
    tf = optional_tf()  # any Keras 3 backend; TensorFlow's object graph when it is there
    report, plan = _diagnose(ckpt, model, targets(tf, model), options)
    if options.strict or not plan.entries:
        return WritePlan(report, _entries(report, plan, model, out, hint), [])
    variables, _ = model_variables(model)
    return WritePlan(report, [(variables[t.index], s, f) for t, s, f in plan.entries],
                      [variables[w.target.index] for w in plan.left_at_init])


def _protected(ckpt: m.Checkpoint) -> list[str]:
    return [ckpt.path, *source_files(ckpt)]


def _diagnose(
    ckpt: m.Checkpoint, model: Any, model_targets: Sequence[Target], options: PairingOptions
) -> tuple[DoctorReport, LoadPlan]:
    """The plan (:func:`~ckptinspect.ops.model.plan.plan_load`) as a report: each weight, each
    leftover source variable, what was skipped by rule, the fix (the flags it needs, ``--map``
    rules, the assignment map)."""
    plan = plan_load(ckpt, model_targets, options)
    weights = [_weight(w) for w in plan.weights]
    leftovers = [SourceLeftover(x.source.name, x.source.key, tuple(x.source.shape), x.source.dtype, x.status, x.detail)
                 for x in plan.leftovers]
    notes = list(plan.notes)
    flags: list[str] = []
    complete_plan = plan if all(w.status == STATUS_MATCHED for w in plan.weights) else None
    alt = by_order_gain(ckpt, model_targets, plan)
    if alt is not None:
        gained = sum(1 for w in alt.weights if w.how == HOW_LAYER_ORDER)
        then = "then every weight loads" if alt.ok else f"then: {describe_counts(alt)}"
        flags.append(f"{BY_ORDER_FLAG} pairs {gained} more weight(s) by layer order and shape ({then})")
        if all(w.status == STATUS_MATCHED for w in alt.weights):
            complete_plan = complete_plan or alt
    unused = complete_plan.count(STATUS_UNUSED) if complete_plan is not None else 0
    if options.strict and unused:  # only unused source variables stand in the way
        flags.append(f"{NO_STRICT_FLAG} leaves the {unused} unused source variable(s) out (then every weight loads)")
    skipped = {x.source.key for x in plan.skipped}
    sources = [v for v in ckpt.variables if v.key not in skipped]
    if complete_plan is not None:
        wanted = {w.target.index for w in complete_plan.matched}
        matched_pairs = [p for p in complete_plan.match.pairs if p.b.ref.index in wanted]
        proposal, verified, more = propose(ckpt, sources, model_targets, matched_pairs, options.rules, options.layout)
        notes += more
    else:  # a rename cannot make every weight load: no rules proposed
        proposal, verified = rules_as_given(options.rules), False
    given = rules_text(rules_as_given(options.rules))
    amap, map_note = _assignment_map(ckpt, plan.entries)
    if map_note:
        notes.append(map_note)
    casts = [w for w in weights if w.status == STATUS_MATCHED and w.source_dtype != w.dtype]
    if casts:
        notes.append(f"{len(casts)} weight(s) cast between float dtypes (e.g. {casts[0].target}: "
                     f"{casts[0].source_dtype} -> {casts[0].dtype})")
    optimizer_skipped = plan.skipped_count(SKIP_OPTIMIZER)
    if optimizer_skipped:
        notes.append(f"{optimizer_skipped} optimizer variable(s) of the source are not model weights (never loaded)")
    report = DoctorReport(
        source=ckpt.path,
        source_format=ckpt.format,
        model=getattr(model, "name", None) or type(model).__name__,
        model_class=type(model).__name__,
        layout=options.layout.describe(),
        mapping=given,
        weights=tuple(weights),
        leftovers=tuple(leftovers),
        optimizer_skipped=optimizer_skipped,
        metadata_skipped=plan.skipped_count(SKIP_METADATA),
        notes=tuple(notes),
        map_rules=tuple(proposal),
        map_verified=verified,
        assignment_map=amap,
        by_order=options.by_order,
        strict=options.strict,
        rule_skipped=tuple(x.source.name for x in plan.skipped if x.reason == SKIP_COUNTER),
        problems=tuple(plan.problems),
        flags=tuple(flags),
    )
    return report, plan


def _weight(w: Any) -> WeightDiagnosis:
    t, s = w.target, w.source
    base: dict[str, Any] = {}
    if s is not None:
        base = dict(source=s.name, key=s.key, source_shape=tuple(s.shape), source_dtype=s.dtype, matched_by=w.how)
    return WeightDiagnosis(t.name, t.shape, t.dtype, w.status, **base, fit=None if w.fit is None else w.fit.kind,
                           detail=w.detail, candidates=tuple(x.name for x in w.candidates))


def _assignment_map(ckpt: m.Checkpoint, plan: list[tuple[Target, m.Variable, Fit]]) -> tuple[dict[str, str] | None, str | None]:
    """The ``init_from_checkpoint`` assignment map (source key -> weight's TF name) of a TF
    source, of the weights whose values need no layout rule; and a note on what it leaves
    out, or why there is none."""
    if TF_RESTORABLE not in capabilities(ckpt.format):
        return None, ("no assignment map: tf.compat.v1.train.init_from_checkpoint reads TF checkpoints only "
                      "(use --emit weights or --emit map)")
    amap = {s.key: t.tf_name for t, s, f in plan if f.kind == FIT_EQUAL}
    skipped = len(plan) - len(amap)
    if skipped:
        return amap, (f"the assignment map leaves out {skipped} weight(s) whose values need a layout rule "
                      "(init_from_checkpoint cannot rearrange values); use --emit weights")
    return amap, None
