"""``scan``: every checkpoint of a run, in step order, in one streamed pass.

For each checkpoint, per variable and per layer (the variables whose names share the path
before their last ``/``): the L2 norm, the change from the previous step (max abs, relative
L2, cosine) and NaN/Inf counts (figures: :mod:`.scan_stats`); the first step where a value
became non-finite; layers that stopped changing or jumped (:func:`find_drift`); and the
directory's health (:mod:`.scan_series`), including checkpoints that fail ``verify``.

One pass per checkpoint: each variable is streamed in blocks beside the previous checkpoint's
value of the same variable (two blocks in memory). The blocks a format checksums (TF bundles'
crc32c) are checked as they are read. Whether a checkpoint is intact is ``verify``'s answer,
from the same code (:func:`ckptinspect.ops.verify.check_checkpoint`, run on every checkpoint
scanned, given the open checkpoint: a TF bundle's check takes the verdicts of the runs scan's
reads checked and reads only the rest, so each byte is read once): a checkpoint verify calls
damaged is damaged here, with verify's problems, and so is one whose values scan could not all
read. A checkpoint deleted while scan ran by the process
saving into the directory is ``rotated``, by verify's rule (:func:`~ckptinspect.ops.verify.rotated_out`).
Only intact checkpoints count for drift (a damaged one's names may come from raw keys).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import statistics
from typing import Any, Sequence

from ... import model as m
from ...errors import CkptError
from ...formats import directory_fingerprint, is_remote, open_checkpoint, path_exists, path_isdir
from ..verify import STATUS_ROTATED, check_checkpoint, rotated_out
from .measure import STATS_DTYPES, measure_chains
from .series import HEALTH_DAMAGED, HEALTH_MISSING, SERIES_DIRECTORY, Entry, Problem, Series, find_series, shard_problems
from .stats import BLOCK_ELEMENTS, Figures, Sums, figures_of

__all__ = [
    "FROZEN_MAX_REL_CHANGE",
    "FROZEN_MIN_TRANSITIONS",
    "JUMP_FACTOR",
    "JUMP_MIN_REL_CHANGE",
    "JUMP_MIN_TRANSITIONS",
    "VariableStep",
    "LayerStep",
    "StepReport",
    "Drift",
    "ScanReport",
    "scan",
    "find_drift",
    "layer_of",
]

# -- drift thresholds ------------------------------------------------------------------------
# A layer is *frozen* when its relative change was at most FROZEN_MAX_REL_CHANGE (0: bit for bit
# the same values) in each of its last FROZEN_MIN_TRANSITIONS or more transitions (up to the last
# checkpoint) while some other layer changed in them.
FROZEN_MAX_REL_CHANGE = 0.0
FROZEN_MIN_TRANSITIONS = 1
# A layer *jumped* at a step when its relative change there was more than JUMP_FACTOR times the
# median of its relative changes over the run, and at least JUMP_MIN_REL_CHANGE; judged only for
# layers with at least JUMP_MIN_TRANSITIONS finite transitions (a median of fewer means nothing).
JUMP_FACTOR = 10.0
JUMP_MIN_REL_CHANGE = 1e-3
JUMP_MIN_TRANSITIONS = 3

# Checkpoints open at once (each holds its data files open): a longer series is measured in
# windows of this many, the last checkpoint of one read again as the previous of the next.
MAX_OPEN_CHECKPOINTS = 64

DRIFT_FROZEN = "frozen"
DRIFT_JUMPED = "jumped"
STATUS_INTACT = m.STATUS_INTACT
STATUS_DAMAGED = m.STATUS_DAMAGED
STATUS_MISSING = m.STATUS_MISSING
KERAS_VARS = "vars"  # Keras 3 files store a layer's weights as LAYER/vars/0, LAYER/vars/1...
TOP_LAYER = ""  # the layer of a variable whose name has no "/"


def layer_of(name: str) -> str:
    """A variable's layer path: its name without the last component (``enc/dense/kernel`` ->
    ``enc/dense``; a Keras 3 file's ``dense/vars/0`` -> ``dense``)."""
    layer = name.rsplit("/", 1)[0] if "/" in name else TOP_LAYER
    return layer[: -len(KERAS_VARS) - 1] if layer.endswith("/" + KERAS_VARS) else layer


# -- report ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class VariableStep:
    """One variable at one step.

    Attributes:
        name: Readable name.
        key: Exact key in the file.
        role: ``model``, ``optimizer`` or ``metadata``.
        layer: Its layer path (:func:`layer_of`).
        shape: Shape.
        dtype: Dtype name.
        figures: The :class:`~ckptinspect.ops.scan.stats.Figures`, or None when its bytes could
            not be read.
    """

    name: str
    key: str
    role: str
    layer: str
    shape: tuple[int, ...]
    dtype: str
    figures: Figures | None

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "key": self.key, "role": self.role, "layer": self.layer,
               "shape": list(self.shape), "dtype": self.dtype}
        out.update(self.figures.to_dict() if self.figures else dict.fromkeys(
            ("norm", "nan", "inf", "max_abs_change", "rel_change", "cosine")))
        return out


@dataclasses.dataclass(frozen=True)
class LayerStep:
    """One layer at one step: its variables' figures together (as one concatenated vector).

    Attributes:
        layer: The layer path.
        variables: How many variables it has.
        figures: The figures.
    """

    layer: str
    variables: int
    figures: Figures

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "variables": self.variables, **self.figures.to_dict()}


@dataclasses.dataclass(frozen=True)
class StepReport:
    """One checkpoint of the series.

    Attributes:
        step: Its training step (the step rule: a step variable, else the optimizer's
            iterations), or None.
        path: The checkpoint.
        format: Its format, or None when it could not be opened.
        status: ``intact``, ``damaged`` or ``missing``.
        variables: Per-variable figures (the selected role; numeric variables).
        layers: Per-layer figures.
        compared_to: The step (path) it was compared with, or None.
        problems: Why it is damaged, one line each.
        number: The number in its name (its place in the series), or None.
        number_source: What ``number`` is (``name:checkpoint``, ``name:epoch``, ``name``...).
    """

    step: int | None
    path: str
    format: str | None
    status: str
    variables: tuple[VariableStep, ...] = ()
    layers: tuple[LayerStep, ...] = ()
    compared_to: str | None = None
    problems: tuple[str, ...] = ()
    number: int | None = None
    number_source: str | None = None

    @property
    def place(self) -> str:
        """Where it sits in the run, in words (``step 24``, ``checkpoint 7``, ``epoch 3``), else its path."""
        return m.place_in_run(self.step, self.number, self.number_source) or self.path

    @functools.cached_property
    def nonfinite(self) -> list[str]:
        """Names of the variables holding a NaN or Inf (computed once: the report asks often).

        A metadata value's Inf is bookkeeping, not divergence (Lightning's ModelCheckpoint keeps
        ``kth_value``/``best_model_score`` at inf until a score is monitored); its NaN (a NaN
        loss) still counts."""
        return [v.name for v in self.variables if v.figures is not None and v.figures.nonfinite
                and (v.role != m.ROLE_METADATA or v.figures.nan)]

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "number": self.number, "number_source": self.number_source,
                "path": self.path, "format": self.format, "status": self.status,
                "compared_to": self.compared_to, "problems": list(self.problems),
                "nonfinite": list(self.nonfinite),
                "layers": [x.to_dict() for x in self.layers], "variables": [v.to_dict() for v in self.variables]}


@dataclasses.dataclass(frozen=True)
class Drift:
    """A flagged layer.

    Attributes:
        layer: The layer path.
        kind: ``frozen`` (stopped changing) or ``jumped``.
        step: The training step of the checkpoint concerned (for ``frozen``, the one since which
            its values are the same; for ``jumped``, the one whose change was out of line), or None.
        rel_change: The relative change at ``step`` (``jumped``), or the largest one over the
            frozen transitions (``frozen``).
        median_rel_change: The layer's median relative change over the run.
        detail: One line for people.
        path: The checkpoint concerned.
    """

    layer: str
    kind: str
    step: int | None
    rel_change: float | None
    median_rel_change: float | None
    detail: str
    path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ScanReport:
    """What ``scan`` found.

    Attributes:
        source: The paths as given.
        series: ``tf-directory``, ``keras-files`` or ``paths``.
        role: The role scanned, or None for all.
        steps: One :class:`StepReport` per checkpoint, in step order.
        health: Problems of the directory and of its checkpoints.
        drift: Flagged layers.
    """

    source: tuple[str, ...]
    series: str
    role: str | None
    steps: tuple[StepReport, ...]
    health: tuple[Problem, ...]
    drift: tuple[Drift, ...]

    @property
    def first_nonfinite(self) -> StepReport | None:
        """The first checkpoint (in step order) holding a NaN or Inf."""
        return next((s for s in self.steps if s.nonfinite), None)

    @property
    def healthy(self) -> bool:
        """No non-finite value and no health problem (drift alone is not unhealthy)."""
        return self.first_nonfinite is None and not self.health

    def to_dict(self) -> dict[str, Any]:
        """The ``scan --format json`` document (docs/INTERFACE.md)."""
        first = self.first_nonfinite
        return {
            "source": list(self.source),
            "series": self.series,
            "role": self.role,
            "healthy": self.healthy,
            "first_nonfinite": ({"step": first.step, "number": first.number, "path": first.path,
                                 "variables": list(first.nonfinite)}
                                if first else None),
            "health": [p.to_dict() for p in self.health],
            "drift": [d.to_dict() for d in self.drift],
            "steps": [s.to_dict() for s in self.steps],
        }


# -- drift -----------------------------------------------------------------------------------
def find_drift(steps: Sequence[StepReport]) -> list[Drift]:
    """Layers that stopped changing or jumped (thresholds: the module's constants)."""
    by_path = {x.path: x for x in steps}
    series: dict[str, list[tuple[StepReport | None, StepReport, float]]] = {}  # layer -> (previous, this, rel)
    for s in steps:
        if s.compared_to is None or s.status != STATUS_INTACT:
            continue
        prev = by_path.get(s.compared_to)
        for layer in s.layers:
            rel = layer.figures.rel_change
            if rel is not None and math.isfinite(rel):
                series.setdefault(layer.layer, []).append((prev, s, rel))
    # the transitions (checkpoint pairs) in which some layer changed
    moving = {(id(p), id(c)) for layer in series.values() for p, c, r in layer if r > FROZEN_MAX_REL_CHANGE}
    out: list[Drift] = []
    for layer, rows in series.items():
        rels = [r for _, _, r in rows]
        median = statistics.median(rels) if rels else None
        tail = 0
        while tail < len(rows) and rows[-1 - tail][2] <= FROZEN_MAX_REL_CHANGE:
            tail += 1
        frozen_rows = rows[len(rows) - tail:]
        if tail >= FROZEN_MIN_TRANSITIONS and any((id(p), id(c)) in moving for p, c, _ in frozen_rows):
            since = frozen_rows[0][0]
            whole = tail == len(rows)
            out.append(Drift(layer or "(top)", DRIFT_FROZEN, since.step if since else None,
                             max(r for *_, r in frozen_rows), median,
                             f"unchanged {'over the whole run' if whole or since is None else 'since ' + since.place}"
                             f" ({tail} transition{'s' if tail != 1 else ''}) while other layers changed",
                             since.path if since else None))
        if len(rows) >= JUMP_MIN_TRANSITIONS and median is not None:
            for _, at, rel in rows:
                if rel >= JUMP_MIN_REL_CHANGE and rel > JUMP_FACTOR * median:
                    against = ("while it otherwise did not change (median change 0)" if median == 0
                               else f"{rel / median:.3g}x its median {median:.3g}")
                    out.append(Drift(layer or "(top)", DRIFT_JUMPED, at.step, rel, median,
                                     f"relative change {rel:.3g} at {at.place}, {against}", at.path))
    return out


# -- the pass ----------------------------------------------------------------------------------
def _run_order(planned: Sequence[tuple[Entry, int | None, str | None]]) -> list[int]:
    """The checkpoints' order in the run (:func:`~ckptinspect.model.run_positions`, the rule every
    command places checkpoints by): by training step when each has one, else by the number in
    its name, else as listed."""
    positions, _ = m.run_positions([step for _, step, _ in planned], [e.number for e, _, _ in planned])
    return sorted(range(len(planned)), key=lambda n: (positions[n] is None, positions[n] or 0, planned[n][0].order))


def _open_step(entry: Entry) -> tuple[m.Checkpoint | None, int | None, str | None]:
    """Open one checkpoint: (checkpoint, its training step, error)."""
    try:
        ckpt = open_checkpoint(entry.path)
    except CkptError as e:
        return None, None, str(e)
    return ckpt, ckpt.step, None


def _numbered(entry: Entry, ckpt: m.Checkpoint | None) -> Entry:
    """``entry`` with the number its checkpoint's own name gives as what it is (``epoch=2``,
    ``ckpt-7``), where the checkpoint says more than the listing."""
    if ckpt is None or ckpt.number is None or not (ckpt.number_source or "").startswith("name:"):
        return entry
    return dataclasses.replace(entry, number=ckpt.number, number_source=ckpt.number_source)


def _damaged(entry: Entry, step: int | None, error: str) -> StepReport:
    """A checkpoint that does not open (or misses a file): verify's verdict on it."""
    problems = _verify_problems(entry.path) or (error,)
    return StepReport(step, entry.path, None, STATUS_DAMAGED, problems=problems,
                      number=entry.number, number_source=entry.number_source)


def _verify_problems(path: str, seen: m.Checkpoint | None = None) -> tuple[str, ...]:
    """verify's verdict on one checkpoint (:func:`~ckptinspect.ops.verify.check_checkpoint`,
    the same code ``verify`` runs), as lines: none when it is intact. ``seen``: the checkpoint
    as scan opened and read it: the runs its reads checked are not read again."""
    result = check_checkpoint(path, seen=seen)
    if result.intact:
        return ()
    return tuple([*result.problems, *(f"{d.name}: {d.problem}" for d in result.damaged)])


def _rotated(report: StepReport, directory: str) -> StepReport:
    return dataclasses.replace(report, status=STATUS_ROTATED, variables=(), layers=(), problems=(
        f"{report.path}: deleted while scan ran (rotated out by the process saving into {directory}); not damage",))


def _layers(variables: list[VariableStep], sums: list[Sums]) -> tuple[LayerStep, ...]:
    """Per-layer figures of the floating-point variables (integer counters such as ``step`` or
    an optimizer's ``iteration`` are reported per variable, but are no layer's weights).

    Layers are the model's: optimizer slots and metadata are reported per variable (their
    names group by optimizer, not by layer: ``adam/dense_kernel_momentum``), unless the scan
    holds no model variable at all (``--role optimizer``)."""
    has_model = any(v.role == m.ROLE_MODEL and v.dtype in m.FLOAT_DTYPES for v in variables)
    grouped: dict[str, list] = {}  # layer -> [its variables' sums added, how many, the first one's figures]
    for v, s in zip(variables, sums):
        if v.dtype not in m.FLOAT_DTYPES or (has_model and v.role != m.ROLE_MODEL):
            continue
        group = grouped.get(v.layer)
        if group is None:
            grouped[v.layer] = [s, 1, v.figures]
            continue
        if group[1] == 1:
            total = Sums()
            total.add(group[0])
            group[0] = total
        group[0].add(s)
        group[1] += 1
    # a layer of one variable has that variable's figures (its sums added to zeros: the same
    # floats), computed once
    return tuple(LayerStep(layer, count, first if count == 1 and first is not None else figures_of(total))
                 for layer, (total, count, first) in grouped.items())


@dataclasses.dataclass
class _Step:
    """One opened checkpoint's results, gathered variable by variable."""

    step: int | None
    ckpt: m.Checkpoint
    by_key: dict[str, m.Variable]
    variables: list[VariableStep] = dataclasses.field(default_factory=list)
    sums: list[Sums] = dataclasses.field(default_factory=list)
    failures: list[str] = dataclasses.field(default_factory=list)
    compared_to: str | None = None
    carry: bool = False  # read again only as the previous value of the next window's first checkpoint
    entry: Entry | None = None  # where it came from in the series (its number)


def _key_order(window: list[_Step]) -> list[str]:
    """Every numeric key of the window, in the first checkpoint's storage order (then the others')."""
    keys: dict[str, None] = {}
    for st in window:
        numeric = [v for v in st.ckpt.variables if v.dtype in STATS_DTYPES]
        if keys and all(v.key in keys for v in numeric):
            continue  # no key of its own: nothing to place (a run's checkpoints mostly share theirs)
        for v in sorted(numeric, key=st.ckpt.storage_order):
            keys.setdefault(v.key)
    return list(keys)


def _measure_window(window: list[_Step], role: str | None, progress: m.Progress | None, counter: list[int]) -> None:
    """Variable by variable, each checkpoint of the window in step order: every value read once,
    compared with the same variable's value in the previous checkpoint (:mod:`.scan_measure`:
    chains of a key measured in parallel, merged here in key order)."""
    for i, st in enumerate(window):
        if i and not st.carry:
            st.compared_to = window[i - 1].ckpt.path
    chains = measure_chains(_key_order(window), [(st.ckpt, st.by_key) for st in window], role, BLOCK_ELEMENTS)
    layers: dict[str, str] = {}  # name -> layer, the same in every step
    for outcomes in chains:
        for index, var, selected, sums, error in outcomes:
            st = window[index]
            if st.carry:
                continue
            name = var.name
            layer = layers.get(name)
            if layer is None:
                layer = layers[name] = layer_of(name)
            if error is not None:
                st.failures.append(f"{name}: {error}")
                if selected:
                    st.variables.append(VariableStep(name, var.key, var.role, layer, var.shape, var.dtype, None))
            elif selected and sums is not None:
                st.variables.append(VariableStep(name, var.key, var.role, layer, var.shape, var.dtype, figures_of(sums)))
                st.sums.append(sums)
            counter[0] += 1
            if progress is not None:
                progress(counter[0], counter[1], var)


def _report(st: _Step) -> StepReport:
    measured = [(v, s) for v, s in zip([v for v in st.variables if v.figures is not None], st.sums)]
    layers = _layers([v for v, _ in measured], [s for _, s in measured])
    return StepReport(st.step, st.ckpt.path, st.ckpt.format, STATUS_INTACT,
                      tuple(sorted(st.variables, key=lambda v: v.name)),
                      tuple(sorted(layers, key=lambda x: x.layer)), compared_to=st.compared_to,
                      number=st.entry.number if st.entry else None,
                      number_source=st.entry.number_source if st.entry else None)


def scan(paths: str | Sequence[str], *, role: str | None = None, progress: m.Progress | None = None) -> ScanReport:
    """Go through every checkpoint of a run, in step order.

    Args:
        paths: A checkpoint directory (TF ``CheckpointManager``/``Saver``, or one holding Keras
            ``ModelCheckpoint`` files), or a list of checkpoints.
        role: Only variables of this role (``model``, ``optimizer``, ``metadata``); None: all.
            Every numeric tensor is read (and checksum-checked) whatever the role.
        progress: Called as ``progress(done, total, variable)`` after each tensor.

    Returns:
        A :class:`ScanReport` (``report.healthy`` False when a value is non-finite or the
        directory has a problem).

    Raises:
        UsageError: An unknown role.
        CheckpointNotFoundError, NotACheckpointError: Nothing to scan.
    """
    from ...errors import UsageError  # noqa: PLC0415

    if role is not None and role not in m.ROLES:
        raise UsageError(f"role must be one of {', '.join(m.ROLES)}. Received: {role!r}")
    source = (str(paths),) if isinstance(paths, (str, bytes)) or not isinstance(paths, Sequence) else tuple(map(str, paths))
    if not source:
        raise UsageError("nothing to scan: give a directory or checkpoint paths")
    # the state file before the directory is listed: verify's rule for rotated checkpoints
    before = (directory_fingerprint(source[0]) if len(source) == 1 and not is_remote(source[0])
              and os.path.isdir(source[0]) else None)
    series: Series = find_series(source)
    health: list[Problem] = list(series.problems)
    # Steps first, to put the checkpoints in order: each checkpoint is opened (its index: metadata
    # only) for its step; the first MAX_OPEN_CHECKPOINTS stay open for the measuring pass.
    planned: list[tuple[Entry, int | None, str | None]] = []
    kept: dict[int, m.Checkpoint] = {}  # by position in series.entries
    try:
        for n, entry in enumerate(series.entries):
            if not entry.exists:
                planned.append((entry, None, None))
                continue
            ckpt, step, error = _open_step(entry)
            entry = _numbered(entry, ckpt)
            if ckpt is not None:
                if len(kept) < MAX_OPEN_CHECKPOINTS:
                    kept[n] = ckpt
                else:
                    ckpt.close()
            planned.append((entry, step, error))
        order = _run_order(planned)
        return _scan_planned(source, series, role, progress, health, [(planned[n], kept.pop(n, None)) for n in order],
                             before)
    finally:
        for ckpt in kept.values():
            ckpt.close()


def _measure_windows(opened: list[tuple[int, Entry, int | None, m.Checkpoint | None]], role: str | None,
                     progress: m.Progress | None, results: dict[int, StepReport], shards: dict[str, int | None]) -> None:
    """Measure the checkpoints in windows of MAX_OPEN_CHECKPOINTS (a checkpoint still open is
    used, then closed, by its window: its entry in ``opened`` is cleared)."""
    counter = [0, 0]
    carry: tuple[Entry, int | None] | None = None  # the last measured checkpoint of the previous window
    for w in range(0, len(opened), MAX_OPEN_CHECKPOINTS):
        window: list[_Step] = []
        batch = opened[w : w + MAX_OPEN_CHECKPOINTS]
        try:
            if carry is not None:  # read again, for its values only
                ckpt, _, _ = _open_step(carry[0])
                if ckpt is not None:
                    window.append(_Step(carry[1], ckpt, {v.key: v for v in ckpt.variables}, carry=True, entry=carry[0]))
            members = []
            for n, (i, entry, step, ckpt) in enumerate(batch):
                error = None
                if ckpt is None:
                    ckpt, step, error = _open_step(entry)
                missing = [f for f in ckpt.files() if not path_exists(f)] if ckpt is not None else []
                opened[w + n] = (i, entry, step, None)  # closed here or by the window from now on
                if missing:  # verify's check says what is wrong, without reading through TensorFlow's reader
                    ckpt.close()
                    ckpt, error = None, f"{missing[0]}: missing"
                if ckpt is None:
                    results[i] = _damaged(entry, step, error)
                    shards[entry.path] = None
                    continue
                shards[entry.path] = ckpt.num_shards
                st = _Step(step, ckpt, {v.key: v for v in ckpt.variables}, entry=entry)
                window.append(st)
                members.append((i, entry, st))
            if not counter[1] and members:  # the progress total, estimated from the first checkpoint
                counter[1] = len(opened) * sum(v.dtype in STATS_DTYPES for v in members[0][2].ckpt.variables)
            _measure_window(window, role, progress, counter)
            for i, entry, st in members:
                report = _report(st)
                # verify's verdict decides; a checkpoint scan could not read whole is damaged too
                problems = _verify_problems(st.ckpt.path, st.ckpt) or tuple(st.failures)
                if problems:
                    report = dataclasses.replace(report, status=STATUS_DAMAGED, problems=problems)
                results[i] = report
            if members:
                carry = (members[-1][1], members[-1][2].step)
        finally:
            for st in window:
                st.ckpt.close()


def _scan_planned(source: tuple[str, ...], series: Series, role: str | None, progress: m.Progress | None,
                  health: list[Problem], planned: list[tuple[tuple[Entry, int | None, str | None], m.Checkpoint | None]],
                  before: bytes | None = None) -> ScanReport:
    """The measuring pass over the checkpoints in step order (each with its checkpoint when it
    is still open from the planning; closed here)."""
    results: dict[int, StepReport] = {}
    shards: dict[str, int | None] = {}
    opened: list[tuple[int, Entry, int | None, m.Checkpoint | None]] = []  # checkpoints to measure, in step order
    for i, ((entry, step, error), ckpt) in enumerate(planned):
        if not entry.exists:
            results[i] = StepReport(step, entry.path, None, STATUS_MISSING, problems=("its files are missing",),
                                    number=entry.number, number_source=entry.number_source)
        elif error is not None:
            results[i] = _damaged(entry, step, error)
            shards[entry.path] = None
        else:
            opened.append((i, entry, step, ckpt))
    try:
        _measure_windows(opened, role, progress, results, shards)
    finally:
        for *_, ckpt in opened:
            if ckpt is not None:
                ckpt.close()
    steps = [results[i] for i in sorted(results)]
    if series.kind == SERIES_DIRECTORY and series.directory is not None:
        gone = rotated_out(series.directory, before, [r.path for r in steps if r.status != STATUS_INTACT])
        if gone:  # deleted by the process saving into the directory while scan ran: not damage
            steps = [_rotated(r, series.directory) if r.path in gone else r for r in steps]
            health = [p for p in health if not (p.kind == HEALTH_MISSING and p.path in gone)]
    for r in steps:  # in step order
        if r.status == STATUS_DAMAGED:
            more = f" (+{len(r.problems) - 1} more)" if len(r.problems) > 1 else ""
            health.append(Problem(HEALTH_DAMAGED, r.path, f"{r.path}: fails verify: {r.problems[0]}{more}"))
    if series.kind == SERIES_DIRECTORY and series.directory is not None:
        if path_isdir(series.directory):
            health += shard_problems(series.directory, shards)
    return ScanReport(source, series.kind, role, tuple(steps), tuple(health), tuple(find_drift(steps)))
