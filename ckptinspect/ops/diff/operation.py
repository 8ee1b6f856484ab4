"""``diff``: what changed between two checkpoints, of the same format or of different ones.

Variables are paired first by the one matcher (:func:`ckptinspect.ops.match.matcher.align`): by key
when both sides have the same format, by readable name otherwise, with the name differences
between formats smoothed out (``:0`` suffixes, ``/.ATTRIBUTES/VARIABLE_VALUE``, an outer prefix
one side has and the other does not, Keras 3 positional ``layer/vars/N`` names). Then each pair
is compared value by value, streaming (:func:`ckptinspect.ops.diff.compare.compare_variables`): only
one pair of tensors is held at a time per thread. When both checkpoints can be read from several
threads (``concurrent_reads``: TF bundles, local HDF5 files), batches of consecutive variables are
compared by up to :data:`ckptinspect._parallel.WORKERS` threads; each variable is compared whole
by one thread, and the rows come back in read order, so the report is the same bits with one
thread or two.

Equality follows numpy's ``isclose`` (``|a - b| <= atol + rtol * |b|``, computed in float64) with
NaN equal to NaN and infinities equal to infinities of the same sign.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
from typing import Any, Callable, Iterable, Iterator, Mapping

from ..._parallel import ordered_map
from ...errors import UsageError
from ...formats import capabilities
from ...model import ROLES, Checkpoint, Variable
from .compare import (
    BLOCK_BYTES,
    CHUNK_ELEMENTS,
    STATUS_ADDED,
    STATUS_CHANGED,
    STATUS_DTYPE,
    STATUS_EQUAL,
    STATUS_REMOVED,
    STATUS_SHAPE,
    STATUSES,
    compare_variables,
)
from ..layout_view import RearrangedSource, fits_reversed, pair_fit
from ..match.layouts import CONV_HWIO, Layout
from ..match.mapping import parse_mapping, rules_text
from ..roles import OPTIMIZER_PATTERN_INFO, mark_optimizer, optimizer_regex
from ..match.matcher import ALIGN_KEY, ALIGN_NAME, Match, align, normalize_name

KERAS_LAYOUT = "keras-layout"  # the capability that lets the matcher use Keras' own layout

__all__ = [
    "STATUSES",
    "ALIGN_KEY",
    "ALIGN_NAME",
    "BLOCK_BYTES",
    "CHUNK_ELEMENTS",
    "VariableDiff",
    "LayerDiff",
    "DiffReport",
    "Match",
    "diff",
    "align",
    "normalize_name",
    "parse_mapping",
    "compare_variables",
]

# Variables are handed to the comparing threads in batches of consecutive ones, about
# BATCH_BYTES (or BATCH_VARIABLES) each, at most BATCHES_AHEAD batches in flight (threads go on
# with the next batches while a large tensor is compared; only the results wait).
BATCH_BYTES = 16 << 20
BATCH_VARIABLES = 256
BATCHES_AHEAD = 4

# Table order of the statuses that are not "changed" (changed rows are sorted by movement).
_STATUS_RANK = {STATUS_CHANGED: 0, STATUS_DTYPE: 1, STATUS_SHAPE: 2, STATUS_REMOVED: 3, STATUS_ADDED: 4, STATUS_EQUAL: 5}

Progress = Callable[[int, int, Any], None]


# -- report --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)  # one per variable: a million of them for a giant header
class VariableDiff:
    """The comparison of one aligned variable.

    Attributes:
        name: The name the two sides were aligned on (A's readable name for key alignment).
        key_a: A's key, or None when the variable is only in B.
        key_b: B's key, or None when the variable is only in A.
        status: One of :data:`STATUSES`.
        name_a: A's readable name, or None.
        name_b: B's readable name, or None.
        role: The variable's role (A's when both sides have it).
        matched_by: How the two sides were paired (``key``, ``name``, ``prefix``,
            ``positional``, ``mapping``...: :data:`ckptinspect.ops.match.matcher.HOWS`), or None
            when the variable is on one side only.
        shape_a: A's shape, or None.
        shape_b: B's shape, or None.
        dtype_a: A's dtype, or None.
        dtype_b: B's dtype, or None.
        max_abs_diff: Largest ``|a - b|`` over elements finite on both sides (None when not
            compared numerically).
        rel_l2: ``||a - b|| / ||a||`` over those elements (None when ``||a|| = 0`` or not compared).
        cosine: Cosine similarity of a and b over those elements (None when a norm is 0).
        num_different: Elements that are not close (None when not compared).
        nan_a: NaN count in A (None when not compared numerically).
        inf_a: Inf count in A.
        nan_b: NaN count in B.
        inf_b: Inf count in B.
        nonfinite_mismatch: Elements where NaN/Inf on one side is not matched on the other.
        layout: How A's value was rearranged before comparing (``transposed (axes 1,0)``,
            ``permuted (axes 2,3,1,0)``) under the layout rules, or None.
    """

    name: str
    key_a: str | None
    key_b: str | None
    status: str
    name_a: str | None = None
    name_b: str | None = None
    role: str | None = None
    matched_by: str | None = None
    shape_a: tuple[int, ...] | None = None
    shape_b: tuple[int, ...] | None = None
    dtype_a: str | None = None
    dtype_b: str | None = None
    max_abs_diff: float | None = None
    rel_l2: float | None = None
    cosine: float | None = None
    num_different: int | None = None
    nan_a: int | None = None
    inf_a: int | None = None
    nan_b: int | None = None
    inf_b: int | None = None
    nonfinite_mismatch: int | None = None
    layout: str | None = None

    @property
    def differs(self) -> bool:
        """True for every status but ``equal``."""
        return self.status != STATUS_EQUAL

    @property
    def names_differ(self) -> bool:
        """True when both sides have the variable under different readable names."""
        return self.name_a is not None and self.name_b is not None and self.name_a != self.name_b

    @property
    def layer(self) -> str:
        """The layer path: the name without its last component (``""`` at the top level)."""
        return self.name.rpartition("/")[0]

    @property
    def movement(self) -> float:
        """How much the variable moved, for sorting: inf for NaN/Inf mismatches and for changes
        away from an all-zero value, else ``rel_l2``; 0 when equal or not compared."""
        if self.status == STATUS_EQUAL:
            return 0.0
        if self.nonfinite_mismatch:
            return math.inf
        if self.rel_l2 is not None:
            return self.rel_l2
        if self.max_abs_diff:
            return math.inf
        return 0.0

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``variables`` items of ``diff --format json``)."""
        out = {f.name: getattr(self, f.name) for f in _VARIABLE_DIFF_FIELDS}
        for k in ("shape_a", "shape_b"):
            if out[k] is not None:
                out[k] = list(out[k])
        return out


_VARIABLE_DIFF_FIELDS = dataclasses.fields(VariableDiff)


@dataclasses.dataclass(frozen=True)
class LayerDiff:
    """Per-layer summary: how many of a layer's variables differ, and by how much at most."""

    layer: str
    variables: int
    changed: int
    max_rel_l2: float | None
    max_abs_diff: float | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class DiffReport:
    """What ``diff`` found.

    Attributes:
        a: Path of checkpoint A (as resolved).
        b: Path of checkpoint B.
        format_a: A's format.
        format_b: B's format.
        atol: Absolute tolerance.
        rtol: Relative tolerance.
        role: The role compared, or None for all.
        alignment: ``key`` or ``name``.
        variables: One entry per aligned name, sorted by how much it moved, unchanged last.
        notes: What alignment did or could not do (prefixes dropped, positional names, names
            that could not be aligned), one sentence each.
        mapping: The ``--map`` rules applied to A's names, as given.
        layout: The layout rules in force, as the options naming them (``--transpose-dense``,
            ``--conv-layout oihw``).
    """

    a: str
    b: str
    format_a: str
    format_b: str
    atol: float
    rtol: float
    role: str | None
    alignment: str
    variables: tuple[VariableDiff, ...]
    notes: tuple[str, ...] = ()
    mapping: tuple[str, ...] = ()
    layout: tuple[str, ...] = ()

    @property
    def identical(self) -> bool:
        """True when every variable is equal within the tolerance (and none is added/removed)."""
        return all(not v.differs for v in self.variables)

    @property
    def summary(self) -> dict[str, int]:
        """Count per status."""
        counts = dict.fromkeys(STATUSES, 0)
        for v in self.variables:
            counts[v.status] += 1
        return counts

    @property
    def layers(self) -> tuple[LayerDiff, ...]:
        """Per-layer summaries, layers with the most movement first."""
        groups: dict[str, list[VariableDiff]] = collections.defaultdict(list)
        for v in self.variables:
            groups[v.layer].append(v)
        out = []
        for layer, members in groups.items():
            rels = [v.rel_l2 for v in members if v.differs and v.rel_l2 is not None]
            abss = [v.max_abs_diff for v in members if v.differs and v.max_abs_diff is not None]
            out.append(
                LayerDiff(
                    layer=layer,
                    variables=len(members),
                    changed=sum(v.differs for v in members),
                    max_rel_l2=max(rels) if rels else None,
                    max_abs_diff=max(abss) if abss else None,
                )
            )
        out.sort(key=lambda s: (0 if s.changed else 1, -(s.max_rel_l2 or 0.0), -s.changed, s.layer))
        return tuple(out)

    @property
    def verdict(self) -> str:
        """One line: how many variables differ, and the tolerance."""
        tol = f"(atol={_num(self.atol)}, rtol={_num(self.rtol)})"
        n = len(self.variables)
        counts = self.summary
        differ = n - counts[STATUS_EQUAL]
        if differ == 0:
            return f"all {n} variables equal {tol}" if n else f"no variables to compare {tol}"
        parts = ", ".join(f"{counts[s]} {s.replace('_', ' ')}" for s in STATUSES[1:] if counts[s])
        return f"{differ} of {n} variables differ: {parts} {tol}"

    def to_dict(self) -> dict[str, Any]:
        """The ``diff --format json`` document (see shared/INTERFACE.md)."""
        return {
            "a": self.a,
            "b": self.b,
            "identical": self.identical,
            "atol": self.atol,
            "rtol": self.rtol,
            "format_a": self.format_a,
            "format_b": self.format_b,
            "role": self.role,
            "alignment": self.alignment,
            "mapping": list(self.mapping),
            "layout": list(self.layout),
            "notes": list(self.notes),
            "variables": [v.to_dict() for v in self.variables],
            "summary": self.summary,
            "layers": [s.to_dict() for s in self.layers],
            "verdict": self.verdict,
        }


def _num(x: float) -> str:
    return f"{x:g}"


# -- the operation --------------------------------------------------------------------------------
def _sort_key(v: VariableDiff) -> tuple:
    return (_STATUS_RANK[v.status], -v.movement, -(v.max_abs_diff or 0.0), v.name)


# One aligned entry: (shown name, variable of A or None, variable of B or None, how it was matched).
_Entry = tuple[str, "Variable | None", "Variable | None", "str | None"]


def _entries(alignment: Match) -> list[_Entry]:
    out: list[_Entry] = [(p.name, p.a.ref, p.b.ref, p.how) for p in alignment.pairs]
    out += [(x.name, x.ref, None, None) for x in alignment.only_a]
    out += [(y.name, None, y.ref, None) for y in alignment.only_b]
    return out


def _read_order(ca: Checkpoint, cb: Checkpoint) -> Callable[[_Entry], tuple]:
    """Entries in the order A's bytes lie on disk (B's for variables only B has)."""

    def key(entry: _Entry) -> tuple:
        _, va, vb, _ = entry
        return (ca.storage_order(va), va.key) if va is not None else (cb.storage_order(vb), vb.key)

    return key


def diff(
    a: str | os.PathLike[str] | Checkpoint,
    b: str | os.PathLike[str] | Checkpoint,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
    role: str | None = None,
    mapping: Mapping[str, str] | Iterable[str | tuple[str, str]] | None = None,
    progress: Progress | None = None,
    optimizer_pattern: str | None = None,
    transpose_dense: bool = False,
    conv_layout: str = CONV_HWIO,
) -> DiffReport:
    """Compare two checkpoints, of the same or of different formats.

    Args:
        a: Checkpoint A: any path :func:`ckptinspect.open` accepts, or an open
            :class:`~ckptinspect.Checkpoint` (left open).
        b: Checkpoint B, likewise.
        atol: Absolute tolerance (>= 0).
        rtol: Relative tolerance (>= 0), relative to B's magnitude as in numpy ``isclose``.
        role: Compare only variables of this role (``model``, ``optimizer``, ``metadata``).
        mapping: ``--map`` rules rewriting A's names before aligning: ``"REGEX=REPLACEMENT"``
            strings, ``(regex, replacement)`` pairs or a dict; every rule applies, in order, to
            every name (docs/INTERFACE.md, "Pairing variables"). Forces alignment by name.
        progress: Called as ``progress(done, total, variable_diff)`` after each variable.
        optimizer_pattern: Regex of names (or keys) to treat as optimizer state on both sides
            (see :func:`ckptinspect.ops.roles.mark_optimizer`), before ``role`` filters.
        transpose_dense: A's 2-D kernels are ``[out, in]`` (PyTorch ``Linear``): compared
            transposed with B's ``[in, out]`` kernels (docs/INTERFACE.md, "Pairing variables").
        conv_layout: ``oihw`` when A's conv kernels are ``[out, in, *spatial]`` (PyTorch): compared
            with B's HWIO kernels with their axes reordered. Either rule aligns by name, and
            pairs what names leave by layer and leaf spelling (``weight``/``kernel``...).

    Returns:
        A :class:`DiffReport`; ``report.identical`` is the verdict.

    Raises:
        UsageError: Bad tolerance, role or mapping.
        CkptError: A checkpoint cannot be opened or read.
    """
    _check_arguments(atol, rtol, role)
    rules = parse_mapping(mapping)  # fail on bad rules before opening anything
    layout = Layout(transpose_dense=transpose_dense, conv_layout=conv_layout)
    optimizer_regex(optimizer_pattern)

    opened: list[Checkpoint] = []
    try:
        ca = mark_optimizer(_open(a, opened), optimizer_pattern)
        # The same path twice is opened once: a directory resolves to one checkpoint, even while
        # another process rotates checkpoints in it.
        cb = ca if _same_path(a, b) else mark_optimizer(_open(b, opened), optimizer_pattern)
        va_list = ca.filter(role=role)
        vb_list = va_list if cb is ca else cb.filter(role=role)  # X X: one list (a table makes new objects)
        keras = all(KERAS_LAYOUT in capabilities(c.format) for c in (ca, cb))
        alignment = align(va_list, vb_list, same_format=ca.format == cb.format, mapping=rules, layout=layout, keras=keras)
        notes = _notes(ca, cb, alignment, optimizer_pattern)
        if role is not None and not va_list and not vb_list:
            notes.append(f"neither checkpoint has {role}-role variables")
        entries = sorted(_entries(alignment), key=_read_order(ca, cb))
        fits, layout_notes = _layout_fits(entries, layout)
        notes += layout_notes
        results = _compare(entries, ca, cb, fits, float(atol), float(rtol), progress)
        return DiffReport(
            a=ca.path,
            b=cb.path,
            format_a=ca.format,
            format_b=cb.format,
            atol=float(atol),
            rtol=float(rtol),
            role=role,
            alignment=alignment.method,
            variables=tuple(sorted(results, key=_sort_key)),
            notes=tuple(notes),
            mapping=rules_text(mapping),
            layout=layout.describe(),
        )
    finally:
        for c in opened:
            c.close()


def _check_arguments(atol: float, rtol: float, role: str | None) -> None:
    """Refuse a tolerance that is not a finite number >= 0, or an unknown role."""
    for label, value in (("atol", atol), ("rtol", rtol)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise UsageError(f"{label} must be a finite number >= 0. Received: {label}={value!r}")
    if role is not None and role not in ROLES:
        raise UsageError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")


def _notes(ca: Checkpoint, cb: Checkpoint, alignment: Match, optimizer_pattern: str | None) -> list[str]:
    """The report's first notes: each side's warnings (once when A and B are one checkpoint),
    the alignment's, and what ``--optimizer-pattern`` marked on each side."""
    sides = (("A", ca),) if cb is ca else (("A", ca), ("B", cb))
    notes = [f"{side}: {w}" for side, c in sides for w in c.info.get("warnings", ())]
    notes += alignment.notes
    if optimizer_pattern:
        marked = [c.info.get(OPTIMIZER_PATTERN_INFO, {}).get("marked", 0) for c in (ca, cb)]
        notes.append(f"--optimizer-pattern {optimizer_pattern!r} marked {marked[0]} variable(s) of A and"
                     f" {marked[1]} of B as optimizer state")
    return notes


def _layout_fits(entries: list[_Entry], layout: Layout) -> tuple[dict[str, tuple[Variable, Any]], list[str]]:
    """The pairs whose values the layout rules rearrange (A's key -> (A's variable, the fit))
    and the notes: what was rearranged, and how many pairs fit the rules only with A and B
    swapped."""
    notes: list[str] = []
    fits = {va.key: (va, f) for _, va, vb, _ in entries if va is not None and vb is not None
            and (f := pair_fit(va, vb, layout)) is not None}
    if fits:
        notes.append(_layout_note(fits))
    backwards = sum(1 for _, va, vb, _ in entries if va is not None and vb is not None and fits_reversed(va, vb, layout))
    if backwards:
        notes.append(f"{backwards} pair(s) fit the layout rules the other way round: the rules describe A's"
                     " layout (A is the PyTorch side, B the Keras one); swap A and B")
    return fits, notes


def _compare(entries: list[_Entry], ca: Checkpoint, cb: Checkpoint, fits: dict[str, tuple[Variable, Any]],
             atol: float, rtol: float, progress: Progress | None) -> list[VariableDiff]:
    """Every entry compared, in read order (A's values rearranged where they fit the layout
    rules). Two batches of variables are compared at a time when both formats allow
    concurrent reads (each variable is compared whole by one thread, so its numbers do not
    depend on the threads); results and progress come in read order."""
    source_a = RearrangedSource(ca, fits) if fits else ca

    def batch(group: list[_Entry]) -> list[VariableDiff]:
        return [_diff_one(name, how, source_a, va, cb, vb, atol, rtol, fits) for name, va, vb, how in group]

    workers = None if _concurrent(ca) and _concurrent(cb) else 1
    results: list[VariableDiff] = []
    for rows in ordered_map(batch, _batches(entries), workers=workers, ahead=BATCHES_AHEAD):
        for row in rows:
            results.append(row)
            if progress is not None:
                progress(len(results), len(entries), row)
    return results


def _batches(entries: list[_Entry]) -> Iterator[list[_Entry]]:
    """Consecutive entries in groups of about :data:`BATCH_BYTES` (at most
    :data:`BATCH_VARIABLES`): one hand-off between threads per group, not per variable."""
    group: list[_Entry] = []
    nbytes = 0
    for entry in entries:
        group.append(entry)
        va, vb = entry[1], entry[2]
        nbytes += max(va.nbytes if va is not None else 0, vb.nbytes if vb is not None else 0)
        if nbytes >= BATCH_BYTES or len(group) >= BATCH_VARIABLES:
            yield group
            group, nbytes = [], 0
    if group:
        yield group


def _concurrent(ckpt: Checkpoint) -> bool:
    """Whether ``ckpt``'s values may be read from several threads at once."""
    return bool(getattr(ckpt.source, "concurrent_reads", False))


def _same_path(a: Any, b: Any) -> bool:
    """True when ``a`` and ``b`` are two spellings of one path (or one open checkpoint)."""
    if isinstance(a, Checkpoint) or isinstance(b, Checkpoint):
        return a is b
    a, b = os.fspath(a), os.fspath(b)
    if "://" in a or "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def _open(path_or_ckpt: Any, opened: list[Checkpoint]) -> Checkpoint:
    if isinstance(path_or_ckpt, Checkpoint):
        return path_or_ckpt
    from ...formats import open_checkpoint  # noqa: PLC0415

    ckpt = open_checkpoint(os.fspath(path_or_ckpt))
    opened.append(ckpt)
    return ckpt


def _layout_note(fits: Mapping[str, tuple[Variable, Any]]) -> str:
    kinds = collections.Counter(f.kind for _, f in fits.values())
    parts = ", ".join(f"{n} {kind}d" for kind, n in sorted(kinds.items()))
    return f"{len(fits)} variable(s) of A compared in B's layout by the layout rules ({parts})"


def _diff_one(
    name: str, how: str | None, ca: Any, va: Variable | None, cb: Checkpoint, vb: Variable | None, atol: float, rtol: float,
    fits: Mapping[str, tuple[Variable, Any]],
) -> VariableDiff:
    if va is None or vb is None:
        common = {
            "name": name,
            "key_a": va.key if va else None,
            "key_b": vb.key if vb else None,
            "name_a": va.name if va else None,
            "name_b": vb.name if vb else None,
            "role": (va or vb).role,
            "matched_by": how,
            "shape_a": tuple(va.shape) if va else None,
            "shape_b": tuple(vb.shape) if vb else None,
            "dtype_a": va.dtype if va else None,
            "dtype_b": vb.dtype if vb else None,
        }
        return VariableDiff(status=STATUS_ADDED if va is None else STATUS_REMOVED, **common)
    # Both sides (every variable of most diffs): the fields in their order, positionally.
    key_a, name_a, shape_a, dtype_a = va.key, va.name, tuple(va.shape), va.dtype
    layout = None
    fitted = fits.get(key_a) if fits else None
    if fitted is not None:
        layout = fitted[1].describe()
        va = RearrangedSource.view(va, fitted[1])
    r = compare_variables(ca, va, cb, vb, atol=atol, rtol=rtol)
    get = r.get
    return VariableDiff(name, key_a, vb.key, r["status"], name_a, vb.name, va.role, how, shape_a, tuple(vb.shape),
                        dtype_a, vb.dtype, get("max_abs_diff"), get("rel_l2"), get("cosine"), get("num_different"),
                        get("nan_a"), get("inf_a"), get("nan_b"), get("inf_b"), get("nonfinite_mismatch"), layout)
