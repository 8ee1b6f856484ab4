"""The one rule pairing a checkpoint with a model: what ``doctor`` reports, ``transplant``
assigns and ``extract --builder`` writes, with one set of options and one verdict.

:func:`plan_load` takes the open checkpoint, the model's variables (:class:`Target`) and the
:class:`PairingOptions` (the flags ``--map``, ``--by-order``, ``--transpose-dense``,
``--conv-layout``, ``--allow-reshape``, with the same defaults in all three commands) and
returns a :class:`LoadPlan`:

* every model weight, in the model's order, with its status: ``matched`` (a source value that
  fits, a float cast at most), ``shape-mismatch``, ``dtype-mismatch``, ``ambiguous`` or
  ``missing``;
* every source model variable no weight takes (``unused``, or part of an ambiguity);
* the source variables skipped by rule, never problems: optimizer state, metadata (counters),
  and PyTorch BatchNorm's ``num_batches_tracked`` (bookkeeping with no Keras counterpart);
* :attr:`LoadPlan.problems`, one sentence each, in the words every command uses, and the
  verdict :attr:`LoadPlan.ok`, ``doctor``'s exit 0.

``--strict`` (the default, :attr:`PairingOptions.strict`) and ``--no-strict`` mean the same in
all three commands. Strict: every problem counts, unused source variables included; the verdict is
OK only when every weight has a value that fits and every source model variable goes into one
(what ``transplant`` and ``extract --builder`` require to write anything). ``--no-strict``:
unused source variables are allowed (one note names them), and a weight without a value that
fits keeps the model's initial value; the problems are those weights alone (in the same words),
so the verdict is OK exactly when every weight receives a value, and ``transplant`` /
``extract --builder`` write what matched, exiting 1 when a weight was left at init.

Pairing is the one matcher's (:func:`~ckptinspect.ops.model.targets.pair_with_model`: the
object-graph path, then the ``layers`` stage; layer order only with ``by_order``). Pure: no
value is read, nothing is assigned.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

from ... import model as m
from ..match.layers import split_name
from ..match.layouts import CONV_HWIO, PLAIN, Fit, Layout
from ..match.mapping import Rules, RulesLike, parse_mapping
from ..match.matcher import HOW_LAYER_ORDER, Ambiguity, Match
from .targets import FLOAT_DTYPES, Target, fit_of, pair_with_model

__all__ = [
    "STATUS_MATCHED",
    "STATUS_SHAPE_MISMATCH",
    "STATUS_DTYPE_MISMATCH",
    "STATUS_AMBIGUOUS",
    "STATUS_MISSING",
    "STATUS_UNUSED",
    "PROBLEM_WORDS",
    "BY_ORDER_FLAG",
    "NO_STRICT_FLAG",
    "SKIP_OPTIMIZER",
    "SKIP_METADATA",
    "SKIP_COUNTER",
    "PairingOptions",
    "WeightPlan",
    "SourcePlan",
    "Skipped",
    "LoadPlan",
    "plan_load",
    "shape_mismatch_text",
    "dtype_mismatch_text",
    "missing_text",
    "unused_text",
    "skipped_note",
    "unused_note",
    "by_order_gain",
    "describe_counts",
    "refusal",
]

STATUS_MATCHED = "matched"
STATUS_SHAPE_MISMATCH = "shape-mismatch"
STATUS_DTYPE_MISMATCH = "dtype-mismatch"
STATUS_AMBIGUOUS = "ambiguous"
STATUS_MISSING = "missing"
STATUS_UNUSED = "unused"
# How a problem of each status begins, in every command's words.
PROBLEM_WORDS = {
    STATUS_SHAPE_MISMATCH: "shape mismatch",
    STATUS_DTYPE_MISMATCH: "dtype mismatch",
    STATUS_AMBIGUOUS: "ambiguous",
    STATUS_MISSING: "left at init",
    STATUS_UNUSED: "unused source variable",
}
# How problems of each status are counted (as transplant's refusal counts them).
COUNT_WORDS = {
    STATUS_SHAPE_MISMATCH: "shape mismatch",
    STATUS_DTYPE_MISMATCH: "dtype mismatch",
    STATUS_AMBIGUOUS: "ambiguous",
    STATUS_MISSING: "left at init",
    STATUS_UNUSED: "unused in the source",
}
# The command-line flag of the layer-order rule (doctor's fix names it).
BY_ORDER_FLAG = "--by-order"
# The flag that allows unused source variables and leaves weights without a value at init.
NO_STRICT_FLAG = "--no-strict"
# Why a source variable is skipped by rule.
SKIP_OPTIMIZER = "optimizer"
SKIP_METADATA = "metadata"
SKIP_COUNTER = "counter"
# PyTorch BatchNorm's count of batches seen: training bookkeeping no Keras layer keeps.
TORCH_BN_COUNTER = "num_batches_tracked"


@dataclasses.dataclass(frozen=True)
class PairingOptions:
    """The pairing flags, as ``doctor``, ``transplant`` and ``extract --builder`` take them
    (same names, same defaults).

    Attributes:
        rules: Compiled ``--map`` rules.
        by_order: ``--by-order``: also pair layers nothing else paired by layer order and shape.
        layout: ``--transpose-dense``, ``--conv-layout``, ``--allow-reshape``.
        strict: ``--strict`` (default) / ``--no-strict``: whether unused source variables and
            weights left at init are problems, or unused ones are allowed and the weights
            without a value keep their initial values (see the module docstring).
    """

    rules: Rules = ()
    by_order: bool = False
    layout: Layout = PLAIN
    strict: bool = True

    @classmethod
    def make(cls, mapping: RulesLike = None, *, by_order: bool = False, transpose_dense: bool = False,
             conv_layout: str = CONV_HWIO, allow_reshape: bool = False, strict: bool = True) -> "PairingOptions":
        """Options from the commands' arguments.

        Raises:
            UsageError: A bad ``--map`` rule or ``--conv-layout``.
        """
        layout = Layout(transpose_dense=transpose_dense, conv_layout=conv_layout, allow_reshape=allow_reshape)
        return cls(rules=tuple(parse_mapping(mapping)), by_order=by_order, layout=layout, strict=strict)

    @property
    def names_decide(self) -> bool:
        """Options that ask for pairing by names (a rule, a layout rule or layer order)."""
        return bool(self.rules) or self.by_order or not self.layout.plain


@dataclasses.dataclass(frozen=True)
class WeightPlan:
    """One model weight: where its value comes from, or why none can.

    Attributes:
        target: The model variable.
        status: ``matched``, ``shape-mismatch``, ``dtype-mismatch``, ``ambiguous`` or ``missing``.
        source: The source variable paired with it (or the one it mismatches), or None.
        how: How the pair was made (:data:`ckptinspect.ops.match.matcher.HOWS`), or None.
        fit: How the value is rearranged when it fits, or None.
        detail: The problem in the commands' words (after ``PROBLEM_WORDS[status]: ``), or "".
        candidates: For ``ambiguous``: the source variables it could come from.
    """

    target: Target
    status: str
    source: m.Variable | None = None
    how: str | None = None
    fit: Fit | None = None
    detail: str = ""
    candidates: tuple[m.Variable, ...] = ()


@dataclasses.dataclass(frozen=True)
class SourcePlan:
    """A source model variable no weight takes: ``unused``, or ``ambiguous`` (with the detail)."""

    source: m.Variable
    status: str
    detail: str


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A source variable skipped by rule (never a problem): ``reason`` is ``optimizer``,
    ``metadata`` or ``counter``."""

    source: m.Variable
    reason: str


@dataclasses.dataclass(frozen=True)
class LoadPlan:
    """What :func:`plan_load` decided.

    Attributes:
        options: The options used.
        weights: One entry per model weight, in the model's order.
        leftovers: Source model variables no weight takes, in the source's order.
        skipped: Source variables skipped by rule.
        notes: What the matcher did, one sentence each (and what was skipped by rule).
        match: The matcher's result (its pairs' ``a.ref`` are sources, ``b.ref`` targets).
    """

    options: PairingOptions
    weights: tuple[WeightPlan, ...]
    leftovers: tuple[SourcePlan, ...]
    skipped: tuple[Skipped, ...]
    notes: tuple[str, ...]
    match: Match

    @property
    def matched(self) -> tuple[WeightPlan, ...]:
        return tuple(w for w in self.weights if w.status == STATUS_MATCHED)

    @property
    def entries(self) -> list[tuple[Target, m.Variable, Fit]]:
        """``(target, source, fit)`` of every matched weight, in the model's order."""
        return [(w.target, w.source, w.fit) for w in self.matched]

    def count(self, status: str) -> int:
        """Model weights (or, for ``unused``, source variables) of a status."""
        if status == STATUS_UNUSED:
            return sum(1 for s in self.leftovers if s.status == STATUS_UNUSED)
        return sum(1 for w in self.weights if w.status == status)

    def skipped_count(self, reason: str) -> int:
        return sum(1 for s in self.skipped if s.reason == reason)

    @property
    def left_at_init(self) -> tuple[WeightPlan, ...]:
        """The weights without a source value that fits (missing, mismatched, ambiguous): with
        ``--no-strict`` they keep the model's initial values."""
        return tuple(w for w in self.weights if w.status != STATUS_MATCHED)

    @property
    def complete(self) -> bool:
        """Every model weight has a source value that fits (source variables may be left over)."""
        return not self.left_at_init

    @property
    def problems(self) -> list[str]:
        """Every problem, one sentence each: the weights without a value that fits, then (strict
        only) the source variables no weight takes (ambiguous ones once, with their weights)."""
        out = [f"{PROBLEM_WORDS[w.status]}: {w.detail}" for w in self.left_at_init]
        if self.options.strict:
            out += [f"{PROBLEM_WORDS[s.status]}: {s.detail}" for s in self.leftovers if s.status == STATUS_UNUSED]
        return out

    def problem_counts(self) -> dict[str, int]:
        """How many problems of each kind (``PROBLEM_WORDS`` keys), the kinds present only."""
        counts = collections.Counter(w.status for w in self.left_at_init)
        if self.options.strict:
            counts[STATUS_UNUSED] = self.count(STATUS_UNUSED)
        return {k: counts[k] for k in PROBLEM_WORDS if counts[k]}

    @property
    def ok(self) -> bool:
        """The verdict: every model weight has a source value that fits, and (strict) every
        source model variable not skipped by rule goes into a weight."""
        return not self.problems


# -- words ---------------------------------------------------------------------------------------
def shape_mismatch_text(target: str, target_shape: Sequence[int], source: str, source_shape: Sequence[int]) -> str:
    return f"{target} is {m.format_shape(target_shape)} in the model, {m.format_shape(source_shape)} in the source ({source})"


def dtype_mismatch_text(target: str, target_dtype: str, source: str, source_dtype: str) -> str:
    return f"{target} is {target_dtype} in the model, {source_dtype} in the source ({source})"


def missing_text(target: str, shape: Sequence[int]) -> str:
    return f"{target} {m.format_shape(shape)} has no source variable"


def unused_text(source: str, shape: Sequence[int]) -> str:
    return f"{source} {m.format_shape(shape)} matches no model variable"


def unused_note(leftovers: Sequence[SourcePlan], shown: int = 3) -> str | None:
    """``--no-strict``'s note naming the unused source variables it allows, or None."""
    unused = [s.source for s in leftovers if s.status == STATUS_UNUSED]
    if not unused:
        return None
    names = ", ".join(f"{v.name} {m.format_shape(v.shape)}" for v in unused[:shown])
    more = f" and {len(unused) - shown} more" if len(unused) > shown else ""
    return f"{NO_STRICT_FLAG}: {len(unused)} unused source variable(s) left out ({names}{more})"


def skipped_note(skipped: Sequence[Skipped]) -> str | None:
    """The note naming the counters skipped by rule, or None."""
    counters = [s.source.name for s in skipped if s.reason == SKIP_COUNTER]
    if not counters:
        return None
    return (f"{len(counters)} source variable(s) skipped by rule: PyTorch BatchNorm's {TORCH_BN_COUNTER} "
            f"(a count of batches seen, with no Keras counterpart; e.g. {counters[0]})")


# -- the plan ------------------------------------------------------------------------------------
def _cast_ok(source_dtype: str, target_dtype: str) -> bool:
    return source_dtype == target_dtype or (source_dtype in FLOAT_DTYPES and target_dtype in FLOAT_DTYPES)


def _split_sources(variables: Sequence[m.Variable], model_targets: Sequence[Target]) -> tuple[list[m.Variable], list[Skipped]]:
    """The source model variables to pair, and those skipped by rule."""
    model_leaves = {t.leaf for t in model_targets}
    sources, skipped = [], []
    for v in variables:
        if v.role == m.ROLE_OPTIMIZER:
            skipped.append(Skipped(v, SKIP_OPTIMIZER))
        elif v.role == m.ROLE_METADATA:
            skipped.append(Skipped(v, SKIP_METADATA))
        elif split_name(v.name)[1] == TORCH_BN_COUNTER and TORCH_BN_COUNTER not in model_leaves and not v.shape:
            skipped.append(Skipped(v, SKIP_COUNTER))
        else:
            sources.append(v)
    return sources, skipped


def plan_load(ckpt: m.Checkpoint, model_targets: Sequence[Target], options: PairingOptions) -> LoadPlan:
    """Pair a checkpoint's model variables with a model's weights (see the module docstring).

    Args:
        ckpt: The open source checkpoint.
        model_targets: The model's variables (:func:`~ckptinspect.ops.model.targets.targets`).
        options: The pairing options.

    Returns:
        The :class:`LoadPlan`.
    """
    sources, skipped = _split_sources(ckpt.variables, model_targets)
    paired = pair_with_model(sources, ckpt.format, model_targets, rules=list(options.rules) or None,
                             by_order=options.by_order, layout=options.layout)
    ambiguous_a: dict[str, Ambiguity] = {}
    ambiguous_b: dict[int, Ambiguity] = {}
    for amb in paired.ambiguous:
        for y in amb.b:
            ambiguous_b.setdefault(y.ref.index, amb)
        for x in amb.a:
            ambiguous_a.setdefault(x.ref.key, amb)

    by_target = {p.b.ref.index: p for p in paired.pairs}
    weights = []
    for t in model_targets:
        p = by_target.get(t.index)
        if p is not None:
            s: m.Variable = p.a.ref
            f = fit_of(s.shape, t, options.layout)
            if f is None:
                detail = shape_mismatch_text(t.name, t.shape, s.name, s.shape)
                weights.append(WeightPlan(t, STATUS_SHAPE_MISMATCH, s, p.how, None, detail))
            elif not _cast_ok(s.dtype, t.dtype):
                detail = dtype_mismatch_text(t.name, t.dtype, s.name, s.dtype)
                weights.append(WeightPlan(t, STATUS_DTYPE_MISMATCH, s, p.how, f, detail))
            else:
                weights.append(WeightPlan(t, STATUS_MATCHED, s, p.how, f))
            continue
        amb = ambiguous_b.get(t.index)
        if amb is not None:
            detail = f"{t.name} {m.format_shape(t.shape)}: {amb.reason}"
            weights.append(WeightPlan(t, STATUS_AMBIGUOUS, detail=detail, candidates=tuple(x.ref for x in amb.a)))
            continue
        weights.append(WeightPlan(t, STATUS_MISSING, detail=missing_text(t.name, t.shape)))

    used = {p.a.ref.key for p in paired.pairs}
    leftovers = []
    for s in sources:
        if s.key in used:
            continue
        amb = ambiguous_a.get(s.key)
        if amb is not None:
            leftovers.append(SourcePlan(s, STATUS_AMBIGUOUS, f"{s.name} {m.format_shape(s.shape)}: {amb.reason}"))
        else:
            leftovers.append(SourcePlan(s, STATUS_UNUSED, unused_text(s.name, s.shape)))

    notes = list(paired.notes)
    for note in (skipped_note(skipped), None if options.strict else unused_note(leftovers)):
        if note:
            notes.append(note)
    return LoadPlan(options=options, weights=tuple(weights), leftovers=tuple(leftovers), skipped=tuple(skipped),
                    notes=tuple(notes), match=paired)


def by_order_gain(ckpt: m.Checkpoint, model_targets: Sequence[Target], plan: LoadPlan) -> LoadPlan | None:
    """The plan ``--by-order`` would give, when it was not used and would pair more weights by
    layer order (for ``doctor``'s fix); None otherwise."""
    if plan.options.by_order or plan.ok:
        return None
    alt = plan_load(ckpt, model_targets, dataclasses.replace(plan.options, by_order=True))
    gained = sum(1 for w in alt.weights if w.how == HOW_LAYER_ORDER)
    return alt if gained else None


def describe_counts(plan: LoadPlan) -> str:
    """``2 shape mismatch, 1 unused in the source``: the problems counted by kind."""
    return ", ".join(f"{n} {COUNT_WORDS[k]}" for k, n in plan.problem_counts().items())


def refusal(plan: LoadPlan, what: str, shown: int = 5) -> str:
    """One line refusing ``what`` for the plan's problems: their count by kind, then the first
    ``shown`` of them."""
    problems = plan.problems
    head = problems[:shown]
    more = f"; ... and {len(problems) - shown} more" if len(problems) > shown else ""
    return (f"{what}: {len(problems)} problem{'s' if len(problems) != 1 else ''} ({describe_counts(plan)}): "
            + "; ".join(head) + more)

