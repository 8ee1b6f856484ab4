"""``transplant``: put a checkpoint's weights into a built model, inside its distribution strategy.

Source variables (the checkpoint's model weights; optimizer state and counters are left out)
are paired with the model's variables, in this order, each stage seeing only what the stages
before it left unpaired:

1. **Object-graph path** (``graph-path``), when the source is a TF2 checkpoint of the same
   architecture: every model variable's path in the source's object graph (below the node the
   model was saved as, ``model`` in ``tf.train.Checkpoint(model=model)``) equals the path of one
   variable of the model, computed from ``tf.train.Checkpoint(model=model)``'s object graph.
2. **Readable names** (``name``): layer path + variable name (``encoder/enc_dense/kernel``),
   ignoring ``:0`` and outer prefixes such as the model's own name; Keras 3 ``.weights.h5``
   positional names (``bn/vars/0``) are understood too. This is how a Keras 2 ``.h5`` or a TF
   checkpoint lands in a Keras 3 model.
3. **Mapping rules** (``mapping``): ``{regex: replacement}`` applied to source names (the first
   rule that matches), then matched by name as in 2.
4. **Order and shape** (``order``), only with ``by_order=True``: each remaining model variable
   takes the first remaining source variable of the same shape (preferring the same leaf name).

Values are assigned in the model's own ``tf.distribute`` strategy (found from its variables) or
the one given, so every replica of a mirrored variable receives them; afterwards every assigned
variable is compared with the source on every local replica
(``strategy.experimental_local_results``).

:func:`transplant` returns a :class:`TransplantReport` and never prints. The helpers
:func:`make_strategy`, :func:`load_builder` and :func:`write_model` are what ``ckptinspect
transplant`` composes around it.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import tempfile
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from .. import model as m
from ..errors import CkptError, TransplantError, UsageError
from .builder import load_builder
from .mapping import parse_mapping

__all__ = [
    "MATCH_GRAPH_PATH",
    "MATCH_NAME",
    "MATCH_MAPPING",
    "MATCH_ORDER",
    "STRATEGIES",
    "TransplantError",
    "Assignment",
    "Mismatch",
    "TargetInfo",
    "SourceInfo",
    "TransplantReport",
    "WriteResult",
    "transplant",
    "make_strategy",
    "load_builder",
    "build_in_scope",
    "output_kind",
    "write_model",
    "parse_mapping",
]

MATCH_GRAPH_PATH = "graph-path"
MATCH_NAME = "name"
MATCH_MAPPING = "mapping"
MATCH_ORDER = "order"

MISMATCH_SHAPE = "shape"
MISMATCH_DTYPE = "dtype"

# The child name under which the model is tracked when its object-graph paths are computed,
# as in ``tf.train.Checkpoint(model=model)``.
CHECKPOINT_MODEL_CHILD = "model"

STRATEGY_DEFAULT = "default"
STRATEGY_MIRRORED = "mirrored"
STRATEGY_MULTI_WORKER = "multi-worker"
STRATEGIES = (STRATEGY_DEFAULT, STRATEGY_MIRRORED, STRATEGY_MULTI_WORKER)

OUTPUT_TF = "tf-checkpoint"
OUTPUT_WEIGHTS_H5 = "keras-weights-h5"
OUTPUT_KERAS = "keras-zip"
WEIGHTS_H5_SUFFIX = ".weights.h5"
KERAS_SUFFIX = ".keras"
LEGACY_H5_SUFFIXES = (".h5", ".hdf5")

FLOAT_DTYPES = {"float16", "bfloat16", "float32", "float64"}
# Distributed variable classes of strategies whose variables are not one full copy per replica.
UNSUPPORTED_VARIABLE_CLASSES = {"ShardedVariable", "AggregatingVariable", "CachingVariable"}
UNSUPPORTED_STRATEGY_CLASSES = {
    "ParameterServerStrategy",
    "ParameterServerStrategyV1",
    "ParameterServerStrategyV2",
    "CentralStorageStrategy",
    "CentralStorageStrategyV1",
}
NOT_SUPPORTED = (
    "ParameterServerStrategy / ShardedVariable models are not supported yet by transplant "
    "(their variables are split or held on parameter servers); build the model under the default, "
    "Mirrored or MultiWorkerMirrored strategy"
)
BUILD_HINT = "build it first: call it on an input (model(x)) or call model.build(input_shape)"
MAX_PROBLEMS_IN_MESSAGE = 20
_INDEX_SUFFIX_RE = re.compile(r":\d+$")
_DIGITS_RE = re.compile(r"(\d+)")


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
        matched_by: ``graph-path``, ``name``, ``mapping`` or ``order``.
    """

    target: str
    source: str
    key: str
    shape: tuple[int, ...]
    dtype: str
    source_dtype: str
    matched_by: str

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
        if self.kind == MISMATCH_SHAPE:
            return (
                f"shape mismatch: {self.target} is {_fmt_shape(self.target_shape)} in the model, "
                f"{_fmt_shape(self.source_shape)} in the source ({self.source})"
            )
        return (
            f"dtype mismatch: {self.target} is {self.target_dtype} in the model, "
            f"{self.source_dtype} in the source ({self.source})"
        )

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
        assigned: The pairs that received (or would receive) a value.
        mismatches: Pairs whose shape or dtype differ (not assigned).
        left_at_init: Model variables with no source: they keep their initial values.
        unused: Source model variables no model variable took.
        optimizer_skipped: Source optimizer variables (never transplanted).
        metadata_skipped: Source counters and other metadata (never transplanted).
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

    @property
    def shape_mismatches(self) -> tuple[Mismatch, ...]:
        return tuple(x for x in self.mismatches if x.kind == MISMATCH_SHAPE)

    @property
    def dtype_mismatches(self) -> tuple[Mismatch, ...]:
        return tuple(x for x in self.mismatches if x.kind == MISMATCH_DTYPE)

    @property
    def problems(self) -> list[str]:
        """What ``strict`` refuses: mismatches (unless ``skip_mismatch``), variables left at
        init, unused source variables. One string each."""
        out: list[str] = []
        if not self.skip_mismatch:
            out += [x.describe() for x in self.mismatches]
        out += [f"left at init: {t.target} {_fmt_shape(t.shape)} has no source variable" for t in self.left_at_init]
        out += [f"unused source variable: {s.source} {_fmt_shape(s.shape)} matches no model variable" for s in self.unused]
        return out

    @property
    def ok(self) -> bool:
        """No problems (see :attr:`problems`)."""
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
            "verified": self.verified,
            "ok": self.ok,
            "summary": self.summary(),
            "assigned": [a.to_dict() for a in self.assigned],
            "mismatches": [x.to_dict() for x in self.mismatches],
            "left_at_init": [t.to_dict() for t in self.left_at_init],
            "unused": [s.to_dict() for s in self.unused],
            "problems": self.problems,
            "notes": list(self.notes),
        }

    def __str__(self) -> str:
        s = self.summary()
        verb = "would assign" if self.dry_run else "assigned"
        lines = [
            f"transplant {self.source} ({self.source_format}) -> {self.model} ({self.model_class}) "
            f"under {self.strategy} ({self.replicas} replica{'s' if self.replicas != 1 else ''})",
            f"{verb} {s['assigned']}, shape mismatches {s['shape_mismatch']}, dtype mismatches "
            f"{s['dtype_mismatch']}, left at init {s['left_at_init']}, unused source variables {s['unused']}",
        ]
        lines += [f"  {x.describe()}" for x in self.mismatches]
        lines += [f"  left at init: {t.target} {_fmt_shape(t.shape)}" for t in self.left_at_init]
        lines += [f"  unused: {u.source} {_fmt_shape(u.shape)}" for u in self.unused]
        lines += list(self.notes)
        return "\n".join(lines)


def _fmt_shape(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


# -- the model's side --------------------------------------------------------------------------


@dataclasses.dataclass
class _Target:
    index: int
    name: str
    aliases: tuple[str, ...]
    graph_path: str | None
    shape: tuple[int, ...]
    dtype: str
    variable: Any  # the tf.Variable / DistributedVariable to assign


def _is_keras(obj: Any) -> bool:
    return any(c.__module__.split(".")[0] == "keras" for c in type(obj).__mro__)


def _tf_variable(var: Any) -> Any:
    """The TensorFlow variable behind a Keras 3 variable (or the variable itself)."""
    if _is_keras(var):
        inner = getattr(var, "_value", None)
        return inner if inner is not None and hasattr(inner, "assign") else var.value
    return var


def _dtype_name(dtype: Any) -> str:
    name = getattr(dtype, "name", None) or str(dtype)
    return name.replace("tf.", "")


def _canonical(name: str) -> str:
    return _INDEX_SUFFIX_RE.sub("", name)


def _keras_positional_aliases(model: Any) -> dict[int, str]:
    """``<layer path>/vars/<i>``: how Keras 3 ``.weights.h5`` names a layer's own variables."""
    out: dict[int, str] = {}
    try:
        layers = list(model._flatten_layers(include_self=True, recursive=True))
    except Exception:  # noqa: BLE001 - a private Keras API; the aliases are a convenience
        return out
    for layer in layers:
        own = list(getattr(layer, "_trainable_variables", [])) + list(getattr(layer, "_non_trainable_variables", []))
        for i, v in enumerate(own):
            path = getattr(v, "path", None)
            if path and "/" in path:
                out.setdefault(id(v), f"{path.rsplit('/', 1)[0]}/vars/{i}")
    return out


def _graph_paths(tf: Any, model: Any) -> dict[int, str]:
    """Object-graph path of each trackable below ``model``, as ``tf.train.Checkpoint(model=model)`` sees it.

    Raises:
        UsageError: The graph holds a ShardedVariable (or another parameter-server variable),
            which ``model.variables`` would have shown only as its pieces.
    """
    try:
        from tensorflow.python.checkpoint import graph_view, util  # noqa: PLC0415

        root = tf.train.Checkpoint(**{CHECKPOINT_MODEL_CHILD: model})
        node_paths = util.objects_ids_and_slot_variables_and_paths(graph_view.ObjectGraphView(root))[1]
    except Exception:  # noqa: BLE001 - private TF API; without it stage 1 is skipped
        return {}
    out: dict[int, str] = {}
    for obj, path in node_paths.items():
        names = [ref.name for ref in path]
        if type(obj).__name__ in UNSUPPORTED_VARIABLE_CLASSES:
            raise UsageError(f"{NOT_SUPPORTED}. Received: {'/'.join(names[1:])} is a {type(obj).__name__}")
        if len(names) > 1 and names[0] == CHECKPOINT_MODEL_CHILD:
            out[id(obj)] = "/".join(names[1:])
    return out


def _model_variables(model: Any) -> tuple[list[Any], bool]:
    """The model's variables (deduplicated, in order) and whether it is a Keras 3 model."""
    keras_model = _is_keras(model)
    if keras_model:
        variables = list(getattr(model, "weights", []))
        if not variables or getattr(model, "built", True) is False:
            raise UsageError(
                f"model {getattr(model, 'name', '?')!r} is not built (it has no variables); {BUILD_HINT}"
            )
    elif hasattr(model, "variables") and hasattr(model, "trainable_variables"):
        variables = list(model.variables)
        if not variables:
            raise UsageError(
                f"model {getattr(model, 'name', None) or type(model).__name__!r} has no variables; {BUILD_HINT}"
            )
    else:
        raise UsageError(
            f"transplant needs a built Keras 3 model or a tf.Module. Received: {type(model).__module__}."
            f"{type(model).__name__}"
        )
    seen: set[int] = set()
    unique = []
    for v in variables:
        if id(v) not in seen:
            seen.add(id(v))
            unique.append(v)
    return unique, keras_model


def _targets(tf: Any, model: Any) -> list[_Target]:
    variables, keras_model = _model_variables(model)
    paths = _graph_paths(tf, model)
    positional = _keras_positional_aliases(model) if keras_model else {}
    model_name = getattr(model, "name", None) or ""
    out = []
    for i, v in enumerate(variables):
        inner = _tf_variable(v)
        tf_name = _canonical(getattr(inner, "name", "") or "")
        name = getattr(v, "path", None) if keras_model else None
        name = _canonical(name or tf_name or f"variable_{i}")
        aliases = [name]
        for alias in (tf_name, positional.get(id(v))):
            if alias and alias not in aliases:
                aliases.append(alias)
        if model_name:
            aliases += [f"{model_name}/{a}" for a in list(aliases) if not a.startswith(model_name + "/")]
        out.append(
            _Target(
                index=i,
                name=name,
                aliases=tuple(aliases),
                graph_path=paths.get(id(v), paths.get(id(inner))),
                shape=tuple(int(d) for d in v.shape),
                dtype=_dtype_name(v.dtype),
                variable=inner,
            )
        )
    return out


# -- strategy ----------------------------------------------------------------------------------


def _variable_strategy(var: Any) -> Any:
    return getattr(var, "_distribute_strategy", None)


def _resolve_strategy(tf: Any, targets: Sequence[_Target], given: Any) -> Any:
    found = None
    for t in targets:
        cls = type(t.variable).__name__
        if cls in UNSUPPORTED_VARIABLE_CLASSES:
            raise UsageError(f"{NOT_SUPPORTED}. Received: {t.name} is a {cls}")
        s = _variable_strategy(t.variable)
        if s is not None:
            if found is not None and s is not found:
                raise UsageError(
                    "the model's variables were created under two different strategies "
                    f"({type(found).__name__} and {type(s).__name__}); build the model in one strategy scope"
                )
            found = s
    if given is not None and found is not None and given is not found:
        raise UsageError(
            f"strategy={type(given).__name__} was given, but the model's variables were created under "
            f"another {type(found).__name__}; pass the strategy the model was built in (or none)"
        )
    strategy = given or found or tf.distribute.get_strategy()
    if type(strategy).__name__ in UNSUPPORTED_STRATEGY_CLASSES:
        raise UsageError(f"{NOT_SUPPORTED}. Received: {type(strategy).__name__}")
    if found is None and int(strategy.num_replicas_in_sync) > 1:
        raise UsageError(
            f"the model's variables are not distributed, but {type(strategy).__name__} has "
            f"{strategy.num_replicas_in_sync} replicas: build the model inside strategy.scope()"
        )
    return strategy


# -- matching ----------------------------------------------------------------------------------


def _natural_key(text: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in _DIGITS_RE.split(text)]


def _suffixes(name: str) -> list[str]:
    """Component suffixes with at least two components: ``a/b/c`` -> ``a/b/c``, ``b/c``."""
    parts = name.split("/")
    return ["/".join(parts[i:]) for i in range(0, max(len(parts) - 1, 1))]


class _Matcher:
    """Pairs source variables with model variables, stage by stage."""

    def __init__(self, sources: Sequence[m.Variable], targets: Sequence[_Target]):
        self.sources = list(sources)
        self.targets = list(targets)
        self.pairs: dict[int, tuple[m.Variable, str]] = {}  # target index -> (source, how)
        self.used: set[str] = set()  # source keys
        self.notes: list[str] = []

    def free_sources(self) -> list[m.Variable]:
        return [s for s in self.sources if s.key not in self.used]

    def free_targets(self) -> list[_Target]:
        return [t for t in self.targets if t.index not in self.pairs]

    def pair(self, target: _Target, source: m.Variable, how: str) -> None:
        self.pairs[target.index] = (source, how)
        self.used.add(source.key)

    # 1. object-graph paths
    def by_graph_path(self) -> None:
        targets = {t.graph_path: t for t in self.targets if t.graph_path}
        sources = [s for s in self.sources if s.graph_path]
        if not targets or not sources:
            return
        prefixes: collections.Counter[str] = collections.Counter()
        for s in sources:
            parts = s.graph_path.split("/")
            for i in range(len(parts)):
                if "/".join(parts[i:]) in targets:
                    prefixes["/".join(parts[:i])] += 1
        if not prefixes:
            return
        ranked = prefixes.most_common()
        if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
            self.notes.append(
                "object-graph paths were not used: the model's structure appears more than once in the source "
                f"(under {ranked[0][0] or 'the root'!r} and {ranked[1][0] or 'the root'!r})"
            )
            return
        prefix = ranked[0][0]
        lead = prefix + "/" if prefix else ""
        below = {s.graph_path[len(lead):]: s for s in sources if s.graph_path.startswith(lead)}
        if set(below) != set(targets):
            return  # not the same architecture: names decide
        for path, t in targets.items():
            self.pair(t, below[path], MATCH_GRAPH_PATH)

    # 2. and 3. names
    def by_names(self, renamed: Mapping[str, str], how: str) -> None:
        """Pair free sources (under the names in ``renamed``: key -> name) with free targets."""
        targets = self.free_targets()
        exact: dict[str, set[int]] = collections.defaultdict(set)
        ends: dict[str, set[int]] = collections.defaultdict(set)
        for t in targets:
            for alias in t.aliases:
                exact[alias].add(t.index)
                for suffix in _suffixes(alias)[1:]:
                    ends[suffix].add(t.index)
        by_index = {t.index: t for t in targets}
        sources = [s for s in self.free_sources() if s.key in renamed]
        for lookup in ("exact", "suffix"):
            candidates: dict[str, set[int]] = {}
            for s in sources:
                if s.key in self.used:
                    continue
                name = renamed[s.key]
                found = set(exact.get(name, ()))
                if lookup == "suffix":
                    if found:
                        continue  # its exact namesake is taken: never settle for a look-alike
                    found = set(ends.get(name, ())) if "/" in name else set()
                    for suffix in _suffixes(name)[1:]:
                        found |= exact.get(suffix, set())
                found = {i for i in found if i not in self.pairs}
                if found:
                    candidates[s.key] = found
            wanted: collections.Counter[int] = collections.Counter(i for f in candidates.values() for i in f)
            for s in sources:
                found = candidates.get(s.key)
                if found and len(found) == 1:
                    (i,) = found
                    if wanted[i] == 1 and i not in self.pairs:
                        self.pair(by_index[i], s, how)

    def by_mapping(self, rules: Sequence[tuple[re.Pattern[str], str]]) -> None:
        renamed: dict[str, str] = {}
        hits: collections.Counter[str] = collections.Counter()
        for s in self.free_sources():
            name = _canonical(s.name)
            for rx, repl in rules:
                if rx.search(name):
                    try:
                        renamed[s.key] = _canonical(rx.sub(repl, name, count=1))
                    except (re.error, IndexError) as e:
                        raise UsageError(f"mapping rule {rx.pattern!r}={repl!r}: bad replacement: {e}") from None
                    hits[rx.pattern] += 1
                    break
        for rx, repl in rules:
            if not hits[rx.pattern]:
                self.notes.append(f"mapping rule {rx.pattern!r} -> {repl!r} matched no unpaired source variable")
        if renamed:
            self.by_names(renamed, MATCH_MAPPING)

    # 4. order and shape
    def by_order(self, source_order: Sequence[m.Variable]) -> None:
        free = [s for s in source_order if s.key not in self.used]
        for t in self.free_targets():
            same_shape = [s for s in free if tuple(s.shape) == t.shape]
            if not same_shape:
                continue
            leaf = t.name.rsplit("/", 1)[-1]
            chosen = next((s for s in same_shape if _canonical(s.name).rsplit("/", 1)[-1] == leaf), same_shape[0])
            free.remove(chosen)
            self.pair(t, chosen, MATCH_ORDER)


def _source_order(ckpt: m.Checkpoint, sources: Sequence[m.Variable]) -> list[m.Variable]:
    """Sources in layer order: file order for Keras files, natural path order for TF bundles."""
    if ckpt.format in (m.FORMAT_TF_BUNDLE, m.FORMAT_TF_SAVEDMODEL, m.FORMAT_TF_V1):
        return sorted(sources, key=lambda s: _natural_key(s.graph_path or s.name))
    return list(sources)


# -- assignment and checks ---------------------------------------------------------------------


def _expected(value: np.ndarray, dtype: str) -> np.ndarray:
    if str(value.dtype) == dtype:
        return value
    if dtype == "bfloat16":
        import ml_dtypes  # noqa: PLC0415 - ships with TensorFlow

        return value.astype(ml_dtypes.bfloat16)
    return value.astype(dtype)


_UINT_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _equal(actual: np.ndarray, expected: np.ndarray) -> bool:
    """Bit-for-bit equality (NaN payloads included), without copying the values to bytes."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return False
    uint = _UINT_OF_SIZE.get(actual.dtype.itemsize)
    if actual.dtype.kind == "O" or uint is None:
        return bool(np.array_equal(actual, expected))
    a = np.ascontiguousarray(actual).reshape(-1).view(uint)
    b = np.ascontiguousarray(expected).reshape(-1).view(uint)
    return bool(np.array_equal(a, b))


def _max_abs_diff(a: np.ndarray, b: np.ndarray) -> str:
    try:
        return f"{float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))):.3g}"
    except (TypeError, ValueError):
        return "n/a"


def _local_values(tf: Any, strategy: Any, variable: Any) -> list[tuple[str, np.ndarray]]:
    out = []
    for local in strategy.experimental_local_results(variable):
        device = getattr(local, "device", "") or ""
        out.append((device, np.asarray(local.numpy())))
    return out


def _is_sum_on_read(tf: Any, variable: Any) -> bool:
    sync = getattr(variable, "synchronization", None)
    agg = getattr(variable, "aggregation", None)
    return sync == tf.VariableSynchronization.ON_READ and agg == tf.VariableAggregation.SUM


def _assign_and_check(tf: Any, strategy: Any, ckpt: m.Checkpoint, plan: Sequence[tuple[_Target, m.Variable]]) -> None:
    errors: list[str] = []
    replicas = max(int(strategy.num_replicas_in_sync), 1)
    for target, source in plan:
        value = _expected(np.asarray(ckpt.read(source)), target.dtype)
        with strategy.scope():
            target.variable.assign(value)
        sum_on_read = _is_sum_on_read(tf, target.variable)
        for device, actual in _local_values(tf, strategy, target.variable):
            if sum_on_read:
                good = np.allclose(actual.astype(np.float64), value.astype(np.float64) / replicas)
            else:
                good = _equal(actual, value)
            if not good:
                errors.append(
                    f"{target.name} on {device or 'its device'} differs from the source {source.name} after "
                    f"assignment (max abs diff {_max_abs_diff(actual, value)})"
                )
    if errors:
        raise TransplantError(
            f"{ckpt.path}: {len(errors)} variable(s) did not receive the source value on every replica: "
            + "; ".join(errors[:MAX_PROBLEMS_IN_MESSAGE])
            + (f"; and {len(errors) - MAX_PROBLEMS_IN_MESSAGE} more" if len(errors) > MAX_PROBLEMS_IN_MESSAGE else ""),
            problems=errors,
        )


# -- the operation -----------------------------------------------------------------------------


def transplant(
    source: str | os.PathLike[str] | m.Checkpoint,
    model: Any,
    *,
    mapping: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
    strategy: Any = None,
    strict: bool = True,
    skip_mismatch: bool = False,
    dry_run: bool = False,
    by_order: bool = False,
) -> TransplantReport:
    """Put a checkpoint's model weights into a built model, inside the model's strategy.

    Args:
        source: A checkpoint of any supported format (path, or an open
            :class:`~ckptinspect.Checkpoint`).
        model: A built Keras 3 model or a ``tf.Module`` with its variables created.
        mapping: ``{regex: replacement}`` rules applied to source names (first match wins) for
            variables the graph-path and name stages left unpaired.
        strategy: The ``tf.distribute`` strategy to assign in; default: the one the model's
            variables were created under (or the current one).
        strict: Raise :class:`TransplantError` listing every problem (mismatches, variables left at
            init, unused source variables) instead of transplanting what matches.
        skip_mismatch: With ``strict``, tolerate shape/dtype mismatches (those variables keep their
            initial values; the report lists them).
        dry_run: Plan only: nothing is read or assigned, and nothing is raised for problems
            (the report lists them).
        by_order: Pair what is still unpaired by order and shape (the last stage).

    Returns:
        A :class:`TransplantReport`. Optimizer state is never transplanted; the report says how
        many optimizer variables the source held.

    Raises:
        UsageError: The model is not built, is not a model, or lives in an unsupported strategy
            (ParameterServerStrategy, ShardedVariable); a bad mapping rule.
        TransplantError: ``strict`` and problems were found; or a value differs from the source on
            some replica after assignment.
        CkptError: The source cannot be opened or read.
    """
    rules = parse_mapping(mapping)
    from .._tf import import_tf  # noqa: PLC0415

    tf = import_tf()
    targets = _targets(tf, model)
    strat = _resolve_strategy(tf, targets, strategy)

    owns = not isinstance(source, m.Checkpoint)
    if owns:
        from ..formats import open_checkpoint  # noqa: PLC0415

        ckpt = open_checkpoint(os.fspath(source))
    else:
        ckpt = source
    try:
        report, plan = _plan(ckpt, model, targets, strat, rules, strict=strict, skip_mismatch=skip_mismatch,
                             dry_run=dry_run, by_order=by_order)
        if dry_run:
            return report
        problems = report.problems
        if strict and problems:
            shown = problems[:MAX_PROBLEMS_IN_MESSAGE]
            more = len(problems) - len(shown)
            raise TransplantError(
                f"{ckpt.path}: cannot transplant into {report.model!r} ({len(problems)} problem"
                f"{'s' if len(problems) != 1 else ''}): " + "; ".join(shown)
                + (f"; and {more} more" if more else "")
                + " (strict: pass strict=False / --no-strict to transplant what matches, skip_mismatch=True /"
                " --skip-mismatch to leave mismatched shapes at init, or mapping rules / --map to rename)",
                problems=problems,
                report=report,
            )
        _assign_and_check(tf, strat, ckpt, plan)
        return dataclasses.replace(report, verified=True)
    finally:
        if owns:
            ckpt.close()


def _plan(
    ckpt: m.Checkpoint,
    model: Any,
    targets: Sequence[_Target],
    strat: Any,
    rules: Sequence[tuple[re.Pattern[str], str]],
    *,
    strict: bool,
    skip_mismatch: bool,
    dry_run: bool,
    by_order: bool,
) -> tuple[TransplantReport, list[tuple[_Target, m.Variable]]]:
    sources = [v for v in ckpt.variables if v.role == m.ROLE_MODEL]
    optimizer_skipped = sum(1 for v in ckpt.variables if v.role == m.ROLE_OPTIMIZER)
    metadata_skipped = sum(1 for v in ckpt.variables if v.role == m.ROLE_METADATA)

    matcher = _Matcher(sources, targets)
    matcher.by_graph_path()
    matcher.by_names({s.key: _canonical(s.name) for s in matcher.free_sources()}, MATCH_NAME)
    if rules:
        matcher.by_mapping(rules)
    if by_order:
        matcher.by_order(_source_order(ckpt, sources))

    assigned, mismatches, plan = [], [], []
    for t in targets:
        if t.index not in matcher.pairs:
            continue
        s, how = matcher.pairs[t.index]
        if tuple(s.shape) != t.shape:
            kind = MISMATCH_SHAPE
        elif s.dtype != t.dtype and not (s.dtype in FLOAT_DTYPES and t.dtype in FLOAT_DTYPES):
            kind = MISMATCH_DTYPE
        else:
            assigned.append(Assignment(t.name, s.name, s.key, t.shape, t.dtype, s.dtype, how))
            plan.append((t, s))
            continue
        mismatches.append(Mismatch(kind, t.name, s.name, s.key, t.shape, tuple(s.shape), t.dtype, s.dtype, how))
    left = [TargetInfo(t.name, t.shape, t.dtype) for t in targets if t.index not in matcher.pairs]
    unused = [SourceInfo(s.name, s.key, tuple(s.shape), s.dtype) for s in sources if s.key not in matcher.used]

    notes = list(matcher.notes)
    casts = [a for a in assigned if a.dtype != a.source_dtype]
    if casts:
        notes.append(f"{len(casts)} variable(s) cast between float dtypes (e.g. {casts[0].target}: "
                     f"{casts[0].source_dtype} -> {casts[0].dtype})")
    notes.append(
        "optimizer state is not transplanted (model weights only)"
        + (f": {optimizer_skipped} optimizer variable(s) in the source left out" if optimizer_skipped else
           ": the source holds none")
    )
    local = len(strat.experimental_local_results(targets[0].variable)) if targets else 1
    report = TransplantReport(
        source=ckpt.path,
        source_format=ckpt.format,
        model=getattr(model, "name", None) or type(model).__name__,
        model_class=type(model).__name__,
        strategy=type(strat).__name__,
        replicas=int(strat.num_replicas_in_sync),
        local_replicas=local,
        dry_run=dry_run,
        strict=strict,
        skip_mismatch=skip_mismatch,
        by_order=by_order,
        assigned=tuple(assigned),
        mismatches=tuple(mismatches),
        left_at_init=tuple(left),
        unused=tuple(unused),
        optimizer_skipped=optimizer_skipped,
        metadata_skipped=metadata_skipped,
        verified=False,
        notes=tuple(notes),
    )
    return report, plan


# -- around the operation: strategies, builders, outputs (what the CLI composes) ---------------


def make_strategy(name: str, replicas: int | None = None) -> Any:
    """Create the ``tf.distribute`` strategy ``transplant --strategy`` names.

    For ``mirrored``, ``replicas`` logical CPU devices are configured first, which works only
    before TensorFlow has initialised its devices (call this first in the process).

    Args:
        name: ``default``, ``mirrored`` or ``multi-worker`` (reads ``TF_CONFIG``).
        replicas: Replicas of ``mirrored`` (default 2); not allowed with the others.

    Returns:
        The strategy.

    Raises:
        UsageError: Unknown name, ``replicas`` with another strategy, multi-worker without
            ``TF_CONFIG``, or too few devices.
    """
    if name not in STRATEGIES:
        raise UsageError(f"unknown strategy {name!r}; expected one of {', '.join(STRATEGIES)}")
    if replicas is not None and name != STRATEGY_MIRRORED:
        raise UsageError(f"--replicas applies to --strategy mirrored only. Received: --strategy {name}")
    from .._tf import import_tf  # noqa: PLC0415

    tf = import_tf()
    if name == STRATEGY_DEFAULT:
        with _quiet_devices():
            tf.config.list_logical_devices()
        return tf.distribute.get_strategy()
    if name == STRATEGY_MIRRORED:
        from ..trainer import configure_devices  # noqa: PLC0415

        with _quiet_devices():
            devices = configure_devices(2 if replicas is None else replicas)
        return tf.distribute.MirroredStrategy(devices)
    if not os.environ.get("TF_CONFIG"):
        raise UsageError(
            "--strategy multi-worker needs TF_CONFIG (the cluster and this worker's task), e.g. "
            '{"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]}, "task": {"type": "worker", "index": 0}}'
        )
    try:
        return tf.distribute.MultiWorkerMirroredStrategy()
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"TF_CONFIG: cannot start MultiWorkerMirroredStrategy: {e}") from None


def _quiet_devices():
    """Silence TensorFlow's C++ device start-up lines (``cuInit`` on CPU-only machines), as
    :func:`~ckptinspect._tf.import_tf` does for the import (``CKPTINSPECT_TF_LOGS=1``
    shows them)."""
    import contextlib  # noqa: PLC0415

    if os.environ.get("CKPTINSPECT_TF_LOGS"):
        return contextlib.nullcontext()
    from .._tf import silenced_stderr  # noqa: PLC0415

    return silenced_stderr()


def build_in_scope(spec: str, strategy: Any) -> Any:
    """Import the builder ``pkg.module:function`` and call it inside ``strategy.scope()``.

    Raises:
        UsageError: The builder cannot be imported or raises.
    """
    builder = load_builder(spec)
    try:
        with strategy.scope():
            return builder()
    except CkptError:
        raise
    except Exception as e:  # noqa: BLE001 - user code: one line naming the builder
        text = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise UsageError(f"--builder {spec}: the builder raised {type(e).__name__}: {text}") from e


def output_kind(dest: str) -> str:
    """``tf-checkpoint`` (a prefix), ``keras-weights-h5`` or ``keras-zip``, by suffix.

    Raises:
        UsageError: A legacy ``.h5`` name (use ``.weights.h5`` or ``.keras``).
    """
    if dest.endswith(WEIGHTS_H5_SUFFIX):
        return OUTPUT_WEIGHTS_H5
    if dest.endswith(KERAS_SUFFIX):
        return OUTPUT_KERAS
    if dest.endswith(LEGACY_H5_SUFFIXES):
        raise UsageError(
            f"{dest}: legacy .h5 output is not written; name it *.weights.h5 (weights) or *.keras (model), "
            "or give a TF checkpoint prefix"
        )
    return OUTPUT_TF


@dataclasses.dataclass(frozen=True)
class WriteResult:
    """What :func:`write_model` did.

    Attributes:
        path: The output path (prefix for TF checkpoints).
        format: ``tf-checkpoint``, ``keras-weights-h5`` or ``keras-zip``.
        written: This process wrote ``path`` (False on a non-chief worker).
        verified: The written output was read back and every model variable found equal.
        checked: Variables compared in the read-back.
    """

    path: str
    format: str
    written: bool
    verified: bool
    checked: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _save(model: Any, kind: str, path: str) -> None:
    from .._tf import import_tf  # noqa: PLC0415

    tf = import_tf()
    if kind == OUTPUT_TF:
        tf.train.Checkpoint(**{CHECKPOINT_MODEL_CHILD: model}).write(path)
    elif kind == OUTPUT_WEIGHTS_H5:
        model.save_weights(path)
    else:
        model.save(path)


def write_model(
    model: Any,
    dest: str,
    *,
    force: bool = False,
    protected: Iterable[str] = (),
    strategy: Any = None,
) -> WriteResult:
    """Write a model's weights to ``dest`` atomically, then read them back and check them.

    ``dest`` is a TF checkpoint prefix (``tf.train.Checkpoint(model=model).write``), a
    ``.weights.h5`` or a ``.keras`` file, by suffix. Under a multi-worker strategy every worker
    takes part in the save (as TensorFlow requires) but only the chief writes ``dest``; the
    others write to a temporary directory that is removed.

    Args:
        model: The model.
        dest: The output path.
        force: Replace an existing output.
        protected: Inputs that must never be overwritten.
        strategy: The model's strategy (to tell the chief); default: the current one.

    Returns:
        A :class:`WriteResult`.

    Raises:
        OutputExistsError: ``dest`` exists and not ``force``.
        UsageError: ``dest`` would overwrite an input; a Keras format for a non-Keras model.
        TransplantError: The read-back differs from the model.
    """
    import shutil  # noqa: PLC0415

    from .._atomic import atomic_file, atomic_prefix, check_output  # noqa: PLC0415
    from .._tf import import_tf  # noqa: PLC0415

    tf = import_tf()
    dest = os.fspath(dest)
    kind = output_kind(dest)
    if kind != OUTPUT_TF and not _is_keras(model):
        raise UsageError(f"{dest}: .weights.h5 and .keras outputs need a Keras 3 model; give a TF checkpoint prefix")
    strategy = strategy or tf.distribute.get_strategy()
    chief = bool(getattr(strategy.extended, "should_checkpoint", True))
    if not chief:
        check_output(dest, force=True, prefix=kind == OUTPUT_TF, protected=protected)
        scratch = tempfile.mkdtemp(prefix="ckptinspect-worker-")
        try:
            _save(model, kind, os.path.join(scratch, os.path.basename(dest)))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return WriteResult(path=dest, format=kind, written=False, verified=False)
    writer = atomic_prefix if kind == OUTPUT_TF else atomic_file
    with writer(dest, force=force, protected=protected) as tmp:
        _save(model, kind, tmp)
        checked = _read_back(tmp, model, dest)
    return WriteResult(path=dest, format=kind, written=True, verified=True, checked=checked)


def _read_back(path: str, model: Any, label: str) -> int:
    """Compare every model variable with the file just written; return how many were compared."""
    from ..formats import open_checkpoint  # noqa: PLC0415
    from .._tf import import_tf  # noqa: PLC0415

    tf = import_tf()
    targets = _targets(tf, model)
    with open_checkpoint(path) as written:
        report, plan = _plan(written, model, targets, tf.distribute.get_strategy(), [], strict=True,
                             skip_mismatch=False, dry_run=True, by_order=False)
        missing = [t.target for t in report.left_at_init] + [x.target for x in report.mismatches]
        if missing:
            raise TransplantError(
                f"{label}: the written output does not hold {len(missing)} model variable(s): "
                + ", ".join(missing[:MAX_PROBLEMS_IN_MESSAGE])
            )
        bad = []
        for target, source in plan:
            expected = np.asarray(target.variable.numpy())
            actual = _expected(np.asarray(written.read(source)), target.dtype)
            if not _equal(actual, expected):
                bad.append(f"{target.name} (max abs diff {_max_abs_diff(actual, expected)})")
        if bad:
            raise TransplantError(f"{label}: the written output differs from the model: " + "; ".join(bad[:MAX_PROBLEMS_IN_MESSAGE]))
        return len(plan)
