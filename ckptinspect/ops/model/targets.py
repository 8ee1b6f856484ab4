"""The model's side of ``transplant``: its variables as targets, its strategy, and how a
checkpoint's variables pair with them (through :mod:`ckptinspect.ops.match.matcher`).

TensorFlow objects are passed in (``tf``, the model); nothing here imports TensorFlow itself.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Any, Sequence

from ... import model as m
from ...formats import capabilities
from ...errors import UsageError
from ..match.layouts import PLAIN, Fit, Layout, fit
from ..match.layers import split_name
from ..match.matcher import Item, Match, match, model_stages

__all__ = [
    "CHECKPOINT_MODEL_CHILD",
    "SOURCE_LABEL",
    "TARGET_LABEL",
    "Target",
    "is_keras",
    "tf_variable",
    "dtype_name",
    "keras_positional_aliases",
    "graph_paths",
    "model_variables",
    "targets",
    "variable_strategy",
    "resolve_strategy",
    "MISMATCH_SHAPE",
    "MISMATCH_DTYPE",
    "FLOAT_DTYPES",
    "mismatch",
    "fit_of",
    "source_order",
    "order_known",
    "pair_with_model",
]

# The child name under which the model is tracked when its object-graph paths are computed,
# as in ``tf.train.Checkpoint(model=model)``.
CHECKPOINT_MODEL_CHILD = "model"
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
MISMATCH_SHAPE = "shape"
MISMATCH_DTYPE = "dtype"
# A value of one of these dtypes is assigned to a variable of another (a float cast).
FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})
TF_RESTORABLE = "tf-restorable"  # the capability of TF checkpoints (formats.capabilities)
# Object-graph path components Keras 2 gives a Functional/Sequential model's layers, in order.
KERAS2_ORDERED_CHILD_RE = re.compile(r"(^|/)layer(_with_weights)?-\d+(/|$)")
# How the matcher's notes name the two sides.
SOURCE_LABEL = "the source"
TARGET_LABEL = "the model"
_DIGITS_RE = re.compile(r"(\d+)")


@dataclasses.dataclass
class Target:
    """A variable of the model, as transplant pairs and assigns it.

    Attributes:
        index: Its position in the model's variables.
        name: Its readable name (Keras ``path``, or the TF name without ``:0``).
        aliases: Every name it answers to (``name`` first; the TF name, the Keras 3 positional
            ``layer/vars/i``, and those under the model's name).
        graph_path: Its path in ``tf.train.Checkpoint(model=model)``'s object graph, or None.
        shape: Its shape.
        dtype: Its dtype name.
        variable: The ``tf.Variable`` / distributed variable to assign.
        tf_name: Its TensorFlow variable name without ``:0`` (what
            ``tf.compat.v1.train.init_from_checkpoint`` resolves); ``name`` when it has none.
    """

    index: int
    name: str
    aliases: tuple[str, ...]
    graph_path: str | None
    shape: tuple[int, ...]
    dtype: str
    variable: Any  # the tf.Variable / DistributedVariable to assign
    tf_name: str = ""

    @property
    def leaf(self) -> str:
        """The last component of its name (``kernel``, ``bias``, ``vars/0``...)."""
        return split_name(self.name)[1]


def is_keras(obj: Any) -> bool:
    """Whether ``obj`` is a Keras 3 object (its class comes from the ``keras`` package)."""
    return any(c.__module__.split(".")[0] == "keras" for c in type(obj).__mro__)


def tf_variable(var: Any) -> Any:
    """The TensorFlow variable behind a Keras 3 variable (or the variable itself)."""
    if is_keras(var):
        inner = getattr(var, "_value", None)
        return inner if inner is not None and hasattr(inner, "assign") else var.value
    return var


def dtype_name(dtype: Any) -> str:
    """``tf.float32`` / ``"float32"`` / a numpy dtype -> ``float32``."""
    name = getattr(dtype, "name", None) or str(dtype)
    return name.replace("tf.", "")


def keras_positional_aliases(model: Any) -> dict[int, str]:
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


def graph_paths(tf: Any, model: Any) -> dict[int, str]:
    """Object-graph path (local names joined by ``/``) of every trackable below ``model``, by id.

    The paths are those of ``tf.train.Checkpoint(model=model)``'s object graph below ``model``:
    a breadth-first walk of ``tf.train.TrackableView``, each object named by the first path
    that reaches it, as TensorFlow's checkpoint writer does.

    Raises:
        UsageError: The graph holds a ShardedVariable (or another parameter-server variable),
            which ``model.variables`` would have shown only as its pieces.
    """
    if tf is None:  # TensorFlow not installed: a Keras 3 model of another backend; names decide
        return {}
    paths: dict[int, str] = {id(model): ""}
    try:
        view = tf.train.TrackableView(model)
        queue = collections.deque([model])
        while queue:
            obj = queue.popleft()
            for name, child in view.children(obj).items():
                path = f"{paths[id(obj)]}/{name}" if paths[id(obj)] else name
                if type(child).__name__ in UNSUPPORTED_VARIABLE_CLASSES:
                    raise UsageError(f"{NOT_SUPPORTED}. Received: {path} is a {type(child).__name__}")
                if id(child) not in paths:
                    paths[id(child)] = path
                    queue.append(child)
    except UsageError:
        raise
    except Exception:  # noqa: BLE001 - an object TensorFlow cannot walk: no paths, names decide
        return {}
    del paths[id(model)]
    return paths


def model_variables(model: Any) -> tuple[list[Any], bool]:
    """The model's variables (deduplicated, in order) and whether it is a Keras 3 model."""
    keras_model = is_keras(model)
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


def targets(tf: Any, model: Any) -> list[Target]:
    """The model's variables as :class:`Target` records, in the model's order.

    Raises:
        UsageError: Not a built Keras 3 model or ``tf.Module``, or a parameter-server variable.
    """
    variables, keras_model = model_variables(model)
    paths = graph_paths(tf, model)
    positional = keras_positional_aliases(model) if keras_model else {}
    model_name = getattr(model, "name", None) or ""
    out = []
    for i, v in enumerate(variables):
        inner = tf_variable(v)
        tf_name = m.strip_output_index(getattr(inner, "name", "") or "")
        name = getattr(v, "path", None) if keras_model else None
        name = m.strip_output_index(name or tf_name or f"variable_{i}")
        aliases = [name]
        for alias in (tf_name, positional.get(id(v))):
            if alias and alias not in aliases:
                aliases.append(alias)
        if model_name:
            aliases += [f"{model_name}/{a}" for a in list(aliases) if not a.startswith(model_name + "/")]
        out.append(
            Target(
                index=i,
                name=name,
                aliases=tuple(aliases),
                graph_path=paths.get(id(v), paths.get(id(inner))),
                shape=tuple(int(d) for d in v.shape),
                dtype=dtype_name(v.dtype),
                variable=inner,
                tf_name=tf_name or name,
            )
        )
    return out


# -- strategy ----------------------------------------------------------------------------------


def variable_strategy(var: Any) -> Any:
    """The strategy a (distributed) variable was created under, or None."""
    return getattr(var, "_distribute_strategy", None)


def resolve_strategy(tf: Any, targets: Sequence[Target], given: Any) -> Any:
    """The strategy to assign in: the one the model's variables were created under, checked
    against ``given`` (or ``given``, or the current one).

    Raises:
        UsageError: Unsupported (parameter-server) strategies or variables, variables created
            under two strategies, or a ``given`` strategy that is not the model's.
    """
    found = None
    for t in targets:
        cls = type(t.variable).__name__
        if cls in UNSUPPORTED_VARIABLE_CLASSES:
            raise UsageError(f"{NOT_SUPPORTED}. Received: {t.name} is a {cls}")
        s = variable_strategy(t.variable)
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


def fit_of(source_shape: Sequence[int], target: Target, layout: Layout = PLAIN) -> Fit | None:
    """How a source value of ``source_shape`` goes into ``target`` under ``layout``, or None."""
    return fit(source_shape, target.shape, target.leaf, layout)


def mismatch(source_shape: Sequence[int], source_dtype: str, target: Target, layout: Layout = PLAIN) -> str | None:
    """Why a source value cannot go into ``target``: ``shape`` (no fit under ``layout``),
    ``dtype`` (not a float cast), or None."""
    if fit_of(source_shape, target, layout) is None:
        return MISMATCH_SHAPE
    if source_dtype != target.dtype and not (source_dtype in FLOAT_DTYPES and target.dtype in FLOAT_DTYPES):
        return MISMATCH_DTYPE
    return None


# -- pairing -----------------------------------------------------------------------------------
def _natural_key(text: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in _DIGITS_RE.split(text)]


def source_order(source_format: str, sources: Sequence[m.Variable]) -> list[m.Variable]:
    """Sources in layer order (what the ``order`` stage follows): file order for Keras files,
    natural path order for TF checkpoints."""
    if TF_RESTORABLE in capabilities(source_format):
        return sorted(sources, key=lambda s: _natural_key(s.graph_path or s.name))
    return list(sources)


def order_known(source_format: str, sources: Sequence[m.Variable]) -> bool:
    """Whether :func:`source_order` is the layers' topological order: a legacy Keras ``.h5``
    (its ``layer_names``), or a TF2 checkpoint of a Keras 2 model (``layer_with_weights-N``).
    A TF1 checkpoint's names, or a Keras 3 file's groups, are sorted by name."""
    if source_format == m.FORMAT_KERAS_H5:  # the one format keeping its layers' order (layer_names)
        return True
    if TF_RESTORABLE in capabilities(source_format):
        paths = [s.graph_path for s in sources]
        return bool(paths) and all(p is not None and KERAS2_ORDERED_CHILD_RE.search(p) for p in paths)
    return False


def pair_with_model(
    sources: Sequence[m.Variable],
    source_format: str,
    model_targets: Sequence[Target],
    *,
    rules: Any = None,
    by_order: bool = False,
    layout: Layout = PLAIN,
) -> Match:
    """Pair a checkpoint's model variables (A) with the model's variables (B).

    The stages are :func:`ckptinspect.ops.match.matcher.model_stages`: the object-graph path first
    (skipped when ``rules`` are given), then the global ``layers`` stage (names, names after
    normalisation, and with ``by_order`` layer order and shape; shapes compared through
    ``layout``).

    Args:
        sources: The checkpoint's variables to pair.
        source_format: The checkpoint's format (for the order of its variables).
        model_targets: The model's variables.
        rules: ``--map`` rules for the source names.
        by_order: Also pair layers by layer order and shape.
        layout: Layout rules shapes are compared through.

    Returns:
        The :class:`~ckptinspect.ops.match.matcher.Match`: ``pair.a.ref`` is the source
        :class:`~ckptinspect.Variable`, ``pair.b.ref`` the :class:`Target`.
    """
    ordered = source_order(source_format, sources)
    a = [
        Item(key=v.key, name=v.name, shape=tuple(v.shape), dtype=v.dtype, role=v.role, graph_path=v.graph_path,
             index=i, ref=v)
        for i, v in enumerate(ordered)
    ]
    b = [
        Item(key=t.name, name=t.name, shape=t.shape, dtype=t.dtype, graph_path=t.graph_path, index=t.index,
             aliases=t.aliases[1:], ref=t)
        for t in model_targets
    ]
    stages = model_stages(graph_path=True, rules=bool(rules), layout=layout, order=by_order,
                          order_known=order_known(source_format, ordered))
    return match(a, b, stages, rules=rules, labels=(SOURCE_LABEL, TARGET_LABEL))
