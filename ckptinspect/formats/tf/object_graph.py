"""The object graph of a TF2 object-based checkpoint: decoding, walking, names and roles.

``_CHECKPOINTABLE_OBJECT_GRAPH`` holds a serialized ``TrackableObjectGraph``
(tensorflow/core/protobuf/trackable_object_graph.proto): ``nodes=1``; each TrackableObject has
``children=1`` (ObjectReference: ``node_id=1``, ``local_name=2``), ``attributes=2``
(SerializedTensor: ``name=1``, ``full_name=2``, ``checkpoint_key=3``) and ``slot_variables=3``
(SlotVariableReference: ``original_variable_node_id=1``, ``slot_name=2``,
``slot_variable_node_id=3``).

A graph comes from a file someone else wrote, so it is bounded before it is decoded (objects
counted on the wire), walked iteratively with parent pointers (linear in nodes and edges: a
chain 300,000 objects deep is walked like any other graph), and paths are built only for the
objects that hold values, within a budget.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
from typing import Callable

from ... import model as m
from .._lazymod import lazy_import
from .._layout import KEY_ENCODING, KEY_ERRORS, decode_key
from .wire import (
    WIRE_FIXED32,
    WIRE_FIXED64,
    WIRE_LEN,
    WIRE_VARINT,
    MalformedError,
    read_varint,
)

# The protobuf runtime loads when an index or object graph is first decoded (see _lazymod).
_protos = lazy_import(__package__ + ".protos")

__all__ = [
    "VARIABLE_VALUE",
    "ATTRIBUTES_MARK",
    "OPTIMIZER_SLOT_MARK",
    "MAX_OBJECT_GRAPH_OBJECTS",
    "MAX_PATH_ELEMENTS",
    "GraphNode",
    "count_graph_objects",
    "parse_object_graph",
    "is_optimizer_node",
    "metric_containers",
    "walk",
    "ObjectPaths",
    "KeyFacts",
    "analyse_object_graph",
]

VARIABLE_VALUE = "VARIABLE_VALUE"
# How TF2 keys spell an object's attributes and an optimizer's slots: a variable's value is
# ``<object path>/.ATTRIBUTES/VARIABLE_VALUE``, a slot's ``<var path>/.OPTIMIZER_SLOT/<optimizer path>/<slot>``.
ATTRIBUTES_MARK = "/.ATTRIBUTES/"
OPTIMIZER_SLOT_MARK = "/.OPTIMIZER_SLOT/"
# Children that only an optimizer has (Keras 2 OptimizerV2, Keras 3, TF1 optimizers in eager).
OPTIMIZER_CHILD_MARKS = {"iter", "_iterations", "beta1_power", "beta2_power", "_learning_rate"}
# Local names of step / counter variables (metadata).
METADATA_LOCAL_NAMES = {"save_counter", "global_step", "step", "epoch", "epochs"}
GENERIC_NAME_RE = re.compile(r"^(Variable|ResourceVariable)(_\d+)?(:\d+)?$")
# A Keras 2 SavedModel tracks its compiled metrics under ``keras_api/metrics`` (and layers'
# ``keras_api/layer_metrics``); their accumulators (``total``, ``count``) are not model weights.
KERAS_API_CHILD = "keras_api"
METRIC_CONTAINERS = frozenset({"metrics", "layer_metrics"})
# Bounds far beyond any real graph (tens of KB for hundreds of variables), which keep a hostile
# one (millions of empty objects) from taking gigabytes: objects are nodes plus their child
# references, attributes and slot references.
MAX_OBJECT_GRAPH_OBJECTS = 1_000_000
# Paths are built only for nodes holding values, by walking parent pointers; this bounds the
# total work (path elements over all such nodes) on a hostile graph (a long chain of them).
MAX_PATH_ELEMENTS = 4_000_000


# TrackableObject field numbers (see the module docstring).
NODE_CHILDREN, NODE_ATTRIBUTES, NODE_SLOT_VARIABLES = 1, 2, 3
NODES_FIELD = 1  # TrackableObjectGraph.nodes
_NODE_TAG = NODES_FIELD << 3 | WIRE_LEN


class GraphNode:
    """One ``TrackableObject``: (child node id, local name) pairs, (attribute name, full
    name, checkpoint key) triples, (original, slot name, slot variable) triples."""

    __slots__ = ("children", "attributes", "slots")

    def __init__(self, children: tuple, attributes: tuple, slots: tuple):
        self.children = children
        self.attributes = attributes
        self.slots = slots


def count_graph_objects(blob: bytes, limit: int = MAX_OBJECT_GRAPH_OBJECTS) -> int:
    """The objects a serialized ``TrackableObjectGraph`` holds (nodes, and each node's child
    references, attributes and slot references), counted on the wire before anything is
    decoded.

    Raises:
        MalformedError: More than ``limit`` objects, or bytes that do not scan.
    """
    n = len(blob)
    pos = objects = 0
    while pos < n:
        tag, pos = (blob[pos], pos + 1) if blob[pos] < 0x80 else read_varint(blob, pos)
        if tag != _NODE_TAG:
            pos = _skip_field(blob, pos, tag & 7)
            continue
        size, p = (blob[pos], pos + 1) if pos < n and blob[pos] < 0x80 else read_varint(blob, pos)
        end = p + size
        if end > n:
            raise MalformedError("object graph field runs past the end")
        objects += 1
        while p < end:  # the record's fields; one-byte tags, lengths and varints decoded inline
            t = blob[p]
            if t < 0x80:
                p += 1
            else:
                t, p = read_varint(blob, p)
            wire = t & 7
            if wire == WIRE_LEN:
                objects += 1
                if p < n and blob[p] < 0x80:
                    p += blob[p] + 1
                else:
                    size, p = read_varint(blob, p)
                    p += size
                if p > n:
                    raise MalformedError("object graph field runs past the end")
            elif wire == WIRE_VARINT and p < n and blob[p] < 0x80:
                p += 1
            else:
                p = _skip_field(blob, p, wire)
        if objects > limit:
            raise MalformedError(f"object graph holds more than {limit} objects")
        pos = end
    return objects


def _skip_field(buf: bytes, pos: int, wire: int) -> int:
    """The position after a field's value of wire type ``wire`` starting at ``pos``."""
    if wire == WIRE_LEN:
        size, pos = read_varint(buf, pos)
        end = pos + size
    elif wire == WIRE_VARINT:
        _, end = read_varint(buf, pos)
    elif wire == WIRE_FIXED64:
        end = pos + 8
    elif wire == WIRE_FIXED32:
        end = pos + 4
    else:
        raise MalformedError(f"unsupported protobuf wire type {wire}")
    if end > len(buf):
        raise MalformedError("object graph field runs past the end")
    return end


@functools.lru_cache(maxsize=1)
def parse_object_graph(blob: bytes) -> list[GraphNode]:
    """Decode a serialized ``TrackableObjectGraph`` (at most :data:`MAX_OBJECT_GRAPH_OBJECTS`
    objects, counted before decoding). The last graph decoded is kept: ``extract`` opens the
    source and then prunes the same graph (the result is shared: do not modify it).

    Raises:
        MalformedError: The bytes are not a graph, hold too many objects, or a reference
            points outside the graph.
    """
    count_graph_objects(blob)
    graph = _protos.TrackableObjectGraph()
    try:
        graph.ParseFromString(blob)
    except _protos.DecodeError as e:
        raise MalformedError(f"bad TrackableObjectGraph: {e}") from None
    n = len(graph.nodes)
    nodes = []
    empty = ()
    for node in graph.nodes:  # the hot loop of a large graph: only the fields that are set
        children = attributes = slots = empty
        for field, values in node.ListFields():
            if field.number == NODE_CHILDREN:
                children = tuple((c.node_id, c.local_name.decode(KEY_ENCODING, KEY_ERRORS)) for c in values)
                for cid, _ in children:
                    if not 0 <= cid < n:
                        raise MalformedError(f"object graph child {cid} out of range ({n} nodes)")
            elif field.number == NODE_ATTRIBUTES:
                attributes = tuple((decode_key(a.name), decode_key(a.full_name), decode_key(a.checkpoint_key))
                                   for a in values)
            elif field.number == NODE_SLOT_VARIABLES:
                slots = tuple((v.original_variable_node_id, decode_key(v.slot_name), v.slot_variable_node_id)
                              for v in values)
                for orig, _, slot in slots:
                    if not (0 <= orig < n and 0 <= slot < n):
                        raise MalformedError("object graph slot variable out of range")
        nodes.append(GraphNode(children, attributes, slots))
    return nodes


def is_optimizer_node(node: GraphNode) -> bool:
    if node.slots:
        return True
    names = {name for _, name in node.children}
    return bool(names & OPTIMIZER_CHILD_MARKS) or {"_variables", "_iterations"} <= names


def metric_containers(nodes: list[GraphNode]) -> set[int]:
    """Nodes that hold a Keras 2 SavedModel's compiled metrics (``keras_api/metrics``)."""
    keras_api = {cid for node in nodes for cid, name in node.children if name == KERAS_API_CHILD}
    return {cid for k in keras_api for cid, name in nodes[k].children if name in METRIC_CONTAINERS}


def walk(nodes: list[GraphNode], expand: Callable[[int], bool], enter: Callable[[int], bool] | None = None
         ) -> tuple[list[int], list[str | None]]:
    """Breadth-first from the root, iteratively: each reached node's parent and the local
    name it was reached by (the first, shortest path), in time linear in nodes and edges.

    Args:
        nodes: The graph.
        expand: Whether to follow a reached node's children.
        enter: Whether a node may be reached at all (default: every node).

    Returns:
        ``(parent, local)``: per node, its parent (-1 for the root, -2 if not reached) and its
        local name (None for the root and nodes not reached).
    """
    parent = [-2] * len(nodes)
    local: list[str | None] = [None] * len(nodes)
    parent[0] = -1
    queue = collections.deque([0])
    while queue:
        i = queue.popleft()
        if not expand(i):
            continue
        for cid, name in nodes[i].children:
            if parent[cid] == -2 and (enter is None or enter(cid)):
                parent[cid] = i
                local[cid] = name
                queue.append(cid)
    return parent, local


class ObjectPaths:
    """Paths (local names from the root) of reached nodes, built on demand by walking parent
    pointers, within a total budget of :data:`MAX_PATH_ELEMENTS`."""

    def __init__(self, parent: list[int], local: list[str | None], budget: int = MAX_PATH_ELEMENTS):
        self.parent = parent
        self.local = local
        self.budget = budget

    def __call__(self, i: int) -> tuple[str, ...]:
        parts = []
        while self.parent[i] >= 0:
            parts.append(self.local[i])
            i = self.parent[i]
            self.budget -= 1
            if self.budget < 0:
                raise MalformedError(
                    f"object graph paths add up to more than {MAX_PATH_ELEMENTS} elements (reached an "
                    f"object {len(parts)}+ levels deep)"
                )
        parts.reverse()
        return tuple(parts)


@dataclasses.dataclass(frozen=True)
class KeyFacts:
    name: str | None
    role: str
    graph_path: str | None
    local_name: str | None
    root_child: bool = False


def analyse_object_graph(nodes: list[GraphNode]) -> dict[str, KeyFacts]:
    """Readable names, roles and model paths for every checkpoint key of a TF2 graph.

    A variable is a model variable when the root reaches it without passing through an
    optimizer; one reached only through an optimizer (slots, iterations, learning rates) is
    optimizer state; save counters and step counters are metadata, and so are the metric
    accumulators a Keras 2 SavedModel keeps under ``keras_api/metrics``.

    Time and memory are linear in the graph: the walks keep parent pointers, and paths are
    built only for the nodes that hold values.

    Raises:
        MalformedError: Paths too long to build (see :data:`MAX_PATH_ELEMENTS`).
    """
    if not nodes:
        return {}
    optimizer_nodes = [is_optimizer_node(n) for n in nodes]
    slot_nodes = {slot for n in nodes for _, _, slot in n.slots}
    metrics = metric_containers(nodes)

    def not_optimizer(i: int) -> bool:
        return not optimizer_nodes[i]

    model_parent, model_local = walk(nodes, not_optimizer)
    all_parent, all_local = walk(nodes, lambda i: True)
    # Without metric containers the walk avoiding them is the model walk.
    outside_metrics = walk(nodes, not_optimizer, lambda i: i not in metrics)[0] if metrics else model_parent
    model_path = ObjectPaths(model_parent, model_local)
    root_children = {cid for cid, _ in nodes[0].children}

    facts: dict[str, KeyFacts] = {}
    for i, node in enumerate(nodes):
        if not node.attributes:
            continue
        in_model = model_parent[i] != -2 and not optimizer_nodes[i]
        reached = all_parent[i] != -2
        local = all_local[i]
        for attr_name, full_name, key in node.attributes:
            if not key:
                continue
            if attr_name != VARIABLE_VALUE:
                role = m.ROLE_METADATA
            elif i in slot_nodes or (not in_model and reached):
                role = m.ROLE_OPTIMIZER
            elif in_model and (local in METADATA_LOCAL_NAMES and i in root_children or local == "save_counter"):
                role = m.ROLE_METADATA
            elif not in_model:
                role = m.ROLE_METADATA
            elif outside_metrics[i] == -2:
                role = m.ROLE_METADATA  # reached only through keras_api/metrics
            else:
                role = m.ROLE_MODEL
            name = full_name if full_name and not GENERIC_NAME_RE.match(full_name) else None
            facts[key] = KeyFacts(
                name=name,
                role=role,
                graph_path="/".join(model_path(i)) if role == m.ROLE_MODEL else None,
                local_name=local,
                root_child=i in root_children,
            )
    return facts
