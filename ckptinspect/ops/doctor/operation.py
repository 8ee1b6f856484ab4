"""``doctor``: why a checkpoint's weights will not load into a model, and the fix.

For every variable of a built model, where its value would come from and how it was matched
(object-graph path, exact name, name after normalisation, layer order and shape: the one
matcher, :func:`~ckptinspect.ops.model.targets.pair_with_model` with layer order on), and every
source model variable left over. The verdict is :attr:`DoctorReport.ok`: every model weight has
a source of a fitting shape (equal, or through the layout rules given) and a castable dtype.
Otherwise the reasons are grouped: missing in the source, shape mismatch, dtype mismatch,
ambiguous; unused source variables are listed too (a backbone taken from a bigger checkpoint
leaves some, which does not stop the load).

The fix, ready to use:

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
from ..match.layouts import CONV_HWIO, FIT_EQUAL, Fit, Layout
from ..match.mapping import Rules, RulesLike, parse_mapping, rules_text
from ..match.matcher import HOW_LAYER_ORDER, Match
from ..sources import source_files
from ..model.weights_io import OUTPUT_WEIGHTS_H5, WEIGHTS_H5_SUFFIX, WriteResult
from ...formats import FORMAT_OF, capabilities
from ..model.targets import (
    FLOAT_DTYPES,
    TF_RESTORABLE,
    Target,
    fit_of,
    is_keras,
    model_variables,
    pair_with_model,
    targets,
)

__all__ = [
    "weight_plan",
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

STATUS_MATCHED = "matched"
STATUS_SHAPE_MISMATCH = "shape-mismatch"
STATUS_DTYPE_MISMATCH = "dtype-mismatch"
STATUS_AMBIGUOUS = "ambiguous"
STATUS_MISSING = "missing"
STATUS_UNUSED = "unused"
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

    @property
    def ok(self) -> bool:
        """Every model weight has a source value that fits (the verdict: exit 0)."""
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
            "ok": self.ok,
            "summary": self.summary(),
            "weights": [w.to_dict() for w in self.weights],
            "unused": [s.to_dict() for s in self.leftovers],
            "reasons": self.reasons(),
            "fix": {
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
        out: Also write a ``.weights.h5`` that ``model.load_weights(out)`` loads (the model's
            weights receive the source values). Refused unless every weight is matched.
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
    rules = parse_mapping(mapping)
    layout = Layout(transpose_dense=transpose_dense, conv_layout=conv_layout, allow_reshape=allow_reshape)
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
        report, plan = _diagnose(ckpt, model, model_targets, rules, layout)
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


def _entries(
    report: DoctorReport, plan: Sequence[tuple[Target, m.Variable, Fit]], model: Any, out: str, hint: str
) -> list[tuple[Any, m.Variable, Fit]]:
    """``(model weight, source variable, fit)`` for every weight, or the refusal naming why not."""
    if not report.ok:
        groups = {g: len(v) for g, v in report.reasons().items() if v and g != REASON_UNUSED}
        raise UsageError(
            f"{out}: not written: {len(report.weights) - len(report.matched)} of {len(report.weights)} model "
            "weight(s) have no source value that fits ("
            + ", ".join(f"{g.replace('_', ' ')} {n}" for g, n in groups.items())
            + f"); {hint}"
        )
    variables, _ = model_variables(model)
    return [(variables[t.index], s, f) for t, s, f in plan]


def weight_plan(
    ckpt: m.Checkpoint, model: Any, *, rules: Rules, layout: Layout, out: str, hint: str
) -> tuple[DoctorReport, list[tuple[Any, m.Variable, Fit]]]:
    """Pair every weight of a built model with a source value, as :func:`doctor` does, for a
    writer (``doctor --emit weights``, ``extract --builder`` from another framework).

    Args:
        ckpt: The open source checkpoint.
        model: A built Keras 3 model.
        rules: Compiled ``--map`` rules (:func:`~ckptinspect.ops.match.mapping.parse_mapping`).
        layout: The layout rules.
        out: The output, as error messages name it.
        hint: What the refusal suggests (where to see the reasons).

    Returns:
        The :class:`DoctorReport` and ``(model weight, source variable, fit)`` for every weight.

    Raises:
        UsageError: A weight has no source value that fits (the reasons are counted).
    """
    tf = optional_tf()  # any Keras 3 backend; TensorFlow's object graph when it is there
    report, plan = _diagnose(ckpt, model, targets(tf, model), rules, layout)
    return report, _entries(report, plan, model, out, hint)


def _protected(ckpt: m.Checkpoint) -> list[str]:
    return [ckpt.path, *source_files(ckpt)]


def _cast_ok(source_dtype: str, target_dtype: str) -> bool:
    return source_dtype == target_dtype or (source_dtype in FLOAT_DTYPES and target_dtype in FLOAT_DTYPES)


def _diagnose(
    ckpt: m.Checkpoint, model: Any, model_targets: Sequence[Target], rules: Rules, layout: Layout
) -> tuple[DoctorReport, list[tuple[Target, m.Variable, Fit]]]:
    """Pair the source's model variables with the model's weights and say what each weight,
    each leftover source variable and the pairing as a whole come to; the plan is the
    (weight, source, fit) triples a load would assign."""
    sources = [v for v in ckpt.variables if v.role == m.ROLE_MODEL]
    paired = pair_with_model(sources, ckpt.format, model_targets, rules=rules, by_order=True, layout=layout)
    ambiguous_a, ambiguous_b = _ambiguous_by_side(paired)
    weights, plan, matched_pairs = _diagnose_weights(model_targets, paired, ambiguous_b, layout)
    leftovers = _leftovers(sources, paired, ambiguous_a)

    notes = list(paired.notes)
    by_order = sum(1 for w in weights if w.matched_by == HOW_LAYER_ORDER)
    if by_order:
        notes.append(f"{by_order} weight(s) paired by layer order and shape alone: transplant needs --by-order "
                     "or the --map rules (--emit map) to take them")
    given = rules_text(rules_as_given(rules))
    proposal, verified, more = propose(ckpt, sources, model_targets, matched_pairs, rules, layout)
    notes += more
    amap, map_note = _assignment_map(ckpt, plan)
    if map_note:
        notes.append(map_note)
    casts = [w for w in weights if w.status == STATUS_MATCHED and w.source_dtype != w.dtype]
    if casts:
        notes.append(f"{len(casts)} weight(s) cast between float dtypes (e.g. {casts[0].target}: "
                     f"{casts[0].source_dtype} -> {casts[0].dtype})")
    optimizer_skipped = sum(1 for v in ckpt.variables if v.role == m.ROLE_OPTIMIZER)
    metadata_skipped = sum(1 for v in ckpt.variables if v.role == m.ROLE_METADATA)
    if optimizer_skipped:
        notes.append(f"{optimizer_skipped} optimizer variable(s) of the source are not model weights (never loaded)")
    report = DoctorReport(
        source=ckpt.path,
        source_format=ckpt.format,
        model=getattr(model, "name", None) or type(model).__name__,
        model_class=type(model).__name__,
        layout=layout.describe(),
        mapping=given,
        weights=tuple(weights),
        leftovers=tuple(leftovers),
        optimizer_skipped=optimizer_skipped,
        metadata_skipped=metadata_skipped,
        notes=tuple(notes),
        map_rules=tuple(proposal),
        map_verified=verified,
        assignment_map=amap,
    )
    return report, plan


def _ambiguous_by_side(paired: Match) -> tuple[dict[str, Any], dict[int, Any]]:
    """Each ambiguity the pairing left, by source key and by model weight index (the first
    ambiguity naming each)."""
    ambiguous_a: dict[str, Any] = {}
    ambiguous_b: dict[int, Any] = {}
    for amb in paired.ambiguous:
        for y in amb.b:
            ambiguous_b.setdefault(y.ref.index, amb)
        for x in amb.a:
            ambiguous_a.setdefault(x.ref.key, amb)
    return ambiguous_a, ambiguous_b


def _diagnose_weights(
    model_targets: Sequence[Target], paired: Match, ambiguous_b: dict[int, Any], layout: Layout
) -> tuple[list[WeightDiagnosis], list[tuple[Target, m.Variable, Fit]], list]:
    """Each model weight's status: matched (its source fits it, a float cast at most), shape
    or dtype mismatch, ambiguous, or missing. Returns (the diagnoses, the plan of matched
    weights, the pairs matched)."""
    by_target = {p.b.ref.index: p for p in paired.pairs}
    weights: list[WeightDiagnosis] = []
    plan: list[tuple[Target, m.Variable, Fit]] = []
    matched_pairs = []
    for t in model_targets:
        p = by_target.get(t.index)
        if p is not None:
            s: m.Variable = p.a.ref
            base = dict(source=s.name, key=s.key, source_shape=tuple(s.shape), source_dtype=s.dtype, matched_by=p.how)
            f = fit_of(s.shape, t, layout)
            if f is None:
                detail = (f"{t.name} is {m.format_shape(t.shape)} in the model, {m.format_shape(s.shape)} in the source "
                          f"({s.name}, paired by {p.how})")
                weights.append(WeightDiagnosis(t.name, t.shape, t.dtype, STATUS_SHAPE_MISMATCH, **base, detail=detail))
            elif not _cast_ok(s.dtype, t.dtype):
                detail = f"{t.name} is {t.dtype} in the model, {s.dtype} in the source ({s.name})"
                weights.append(WeightDiagnosis(t.name, t.shape, t.dtype, STATUS_DTYPE_MISMATCH, **base, fit=f.kind, detail=detail))
            else:
                weights.append(WeightDiagnosis(t.name, t.shape, t.dtype, STATUS_MATCHED, **base, fit=f.kind))
                plan.append((t, s, f))
                matched_pairs.append(p)
            continue
        amb = ambiguous_b.get(t.index)
        if amb is not None:
            cands = tuple(x.ref.name for x in amb.a)
            detail = f"{t.name} {m.format_shape(t.shape)}: {amb.reason}"
            weights.append(WeightDiagnosis(t.name, t.shape, t.dtype, STATUS_AMBIGUOUS, detail=detail, candidates=cands))
            continue
        detail = f"{t.name} {m.format_shape(t.shape)} has no source variable"
        weights.append(WeightDiagnosis(t.name, t.shape, t.dtype, STATUS_MISSING, detail=detail))
    return weights, plan, matched_pairs


def _leftovers(sources: list[m.Variable], paired: Match, ambiguous_a: dict[str, Any]) -> list[SourceLeftover]:
    """The source variables no weight took: ambiguous, or matching no model weight."""
    used = {p.a.ref.key for p in paired.pairs}
    leftovers = []
    for s in sources:
        if s.key in used:
            continue
        amb = ambiguous_a.get(s.key)
        if amb is not None:
            leftovers.append(SourceLeftover(s.name, s.key, tuple(s.shape), s.dtype, STATUS_AMBIGUOUS,
                                            f"{s.name} {m.format_shape(s.shape)}: {amb.reason}"))
        else:
            leftovers.append(SourceLeftover(s.name, s.key, tuple(s.shape), s.dtype, STATUS_UNUSED,
                                            f"{s.name} {m.format_shape(s.shape)} matches no model weight"))
    return leftovers


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
