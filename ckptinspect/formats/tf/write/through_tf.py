"""Writing TF bundle checkpoints with TensorFlow's own writer, and pruning TF2 object graphs.

The ``.index`` and ``.data-*`` files are written by TensorFlow itself: tensors go out in
groups through ``tf.raw_ops.SaveV2`` (the kernel every ``tf.train.Checkpoint`` and
``tf.compat.v1.train.Saver`` save runs), and the groups are joined into one checkpoint by
``tf.raw_ops.MergeV2Checkpoints`` (what TF does for multi-device saves). SaveV2 needs all the
tensors of its call in memory, so tensors are packed (first fit, largest first) into groups of
at most ``max_shard_bytes`` (a bigger tensor is a group of its own), and each group becomes one
data shard: memory stays about one shard, not the model. By default a shard holds as much as
the largest tensor (at least :data:`MIN_SHARD_BYTES`), so memory stays about one tensor.

:func:`prune_object_graph` (no TensorFlow: our own descriptor, TensorFlow's bytes) takes a serialized
``TrackableObjectGraph`` and keeps the part a
model restore needs: the objects the root reaches without passing through an optimizer, and,
among the root's children, only those that still hold a kept value. Every kept value is
re-keyed by its path in the pruned graph (``model/<path>/.ATTRIBUTES/VARIABLE_VALUE``), which is
the key TensorFlow itself gives it when it saves that structure.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from typing import Callable, Collection, Iterable, Sequence

import numpy as np

from .... import model as m
from ....errors import CheckpointNotFoundError, CkptError, CorruptCheckpointError, UsageError
from ...._tf import import_tf
from ... import _fs
from .. import protos as _protos
from ..index import OBJECT_GRAPH_KEY
from ..._layout import INDEX_SUFFIX, decode_key, encode_key
from ..wire import MalformedError
from ..bundle import check_bundle_files
from ..object_graph import VARIABLE_VALUE, GraphNode, ObjectPaths, is_optimizer_node, parse_object_graph, walk

__all__ = [
    "MIN_SHARD_BYTES",
    "default_shard_bytes",
    "pack",
    "BundleTensor",
    "PrunedGraph",
    "prune_object_graph",
    "write_bundle",
    "slice_spec",
    "object_graph_tensor",
    "numpy_view",
    "restore_tensor",
]

MIN_SHARD_BYTES = 64 * 1024 * 1024
ATTRIBUTES_NAME = ".ATTRIBUTES"
ESCAPE_CHAR = "."
TEMP_PARTS_DIR = "_temp_parts"


# -- object graph --------------------------------------------------------------------------
def escape_local_name(name: str) -> str:
    """TensorFlow's escaping of one path element (``trackable_utils.escape_local_name``)."""
    return name.replace(ESCAPE_CHAR, ESCAPE_CHAR * 2).replace("/", ESCAPE_CHAR + "S")


@dataclasses.dataclass(frozen=True)
class PrunedGraph:
    """The result of :func:`prune_object_graph`.

    Attributes:
        blob: The serialized pruned ``TrackableObjectGraph``.
        key_map: Old checkpoint key -> new key, for every attribute the pruned graph keeps.
        paths: Old checkpoint key -> object path of its object in the pruned graph
            (local names joined with ``/``, unescaped: comparable with ``Variable.graph_path``).
        num_nodes: Nodes in the pruned graph.
        source_nodes: Nodes in the source graph.
        root_children: Local names of the root's children that were kept.
    """

    blob: bytes
    key_map: dict[str, str]
    paths: dict[str, str]
    num_nodes: int
    source_nodes: int
    root_children: tuple[str, ...]


def _object_prefix(key: str) -> int:
    """Index where the attribute part (``/.ATTRIBUTES/...``) of a checkpoint key starts."""
    mark = "/" + ATTRIBUTES_NAME + "/"
    pos = key.find(mark)
    if pos < 0:
        if key.startswith(ATTRIBUTES_NAME + "/"):
            return 0
        raise CorruptCheckpointError(f"object-graph attribute key {key!r} has no /{ATTRIBUTES_NAME}/ part")
    return pos


def prune_object_graph(blob: bytes, keep_keys: Collection[str], *, keep_object_state: bool = True) -> PrunedGraph:
    """Prune a TF2 object graph to the model's part and re-key what it keeps, without TensorFlow.

    The graph is parsed and re-serialised through ckptinspect's own descriptor
    (:mod:`._protos`); the result is byte for byte what TensorFlow's own
    ``trackable_object_graph_pb2`` gives for the same edits (proto3: zero values left out, an
    empty ``has_checkpoint_values`` message for False). Fields the descriptor does not know
    (of the graph, a kept object, a reference or an attribute) are carried over unchanged.

    Args:
        blob: The serialized ``TrackableObjectGraph`` (the ``_CHECKPOINTABLE_OBJECT_GRAPH`` value).
        keep_keys: Checkpoint keys of the values to keep (the model's variables, by role).
        keep_object_state: Also keep the non-variable attributes (lookup tables, Python state)
            of objects inside the kept part, below the root: they belong to those objects.

    Returns:
        The :class:`PrunedGraph`.

    Raises:
        CorruptCheckpointError: The graph does not parse, or a kept key is not reachable
            without passing through an optimizer.
        UsageError: A kept object uses a registered saver (not supported).
    """
    source, ours = _parse_full(blob)
    keep_keys = set(keep_keys)
    reached, kept_of = _kept_attributes(ours, keep_keys, keep_object_state)
    kept_root_refs = _root_refs_holding_values(ours, reached, kept_of)
    tree = _kept_tree(ours, reached, kept_root_refs, kept_of)
    out, key_map, paths = _write_pruned(source, ours, tree)
    missing = sorted(keep_keys - set(key_map))
    if missing:
        raise CorruptCheckpointError(
            f"{len(missing)} kept value(s) are reachable only through an optimizer or not at all "
            f"in the object graph, e.g. {missing[0]!r}"
        )
    return PrunedGraph(
        blob=out.SerializeToString(),
        key_map=key_map,
        paths=paths,
        num_nodes=len(out.nodes),
        source_nodes=len(source.nodes),
        root_children=tuple(ours[0].children[k][1] for k in kept_root_refs),
    )


def _parse_full(blob: bytes) -> tuple[_protos.TrackableObjectGraphFull, list[GraphNode]]:
    """The graph as the message to prune from and as our own reading (parsed first: it
    bounds the graph's size before protobuf decodes it); a graph without nodes is refused."""
    source = _protos.TrackableObjectGraphFull()
    try:
        ours = parse_object_graph(blob)
        source.ParseFromString(blob)
    except (MalformedError, _protos.DecodeError) as e:
        raise CorruptCheckpointError(f"the object graph does not parse: {e}") from None
    if not source.nodes:
        raise CorruptCheckpointError("the object graph has no nodes")
    return source, ours


def _kept_attributes(ours: list[GraphNode], keep_keys: set[str], keep_object_state: bool) -> tuple[list[bool], list[list[int]]]:
    """Step 1: which objects the root reaches without entering an optimizer (parent pointers:
    linear), and per object the positions of the attributes it keeps: the kept keys, and with
    ``keep_object_state`` every non-variable attribute of a reached object below the root."""
    optimizer = [is_optimizer_node(n) for n in ours]
    reach, _ = walk(ours, lambda i: True, lambda i: not optimizer[i])
    reached = [p != -2 for p in reach]

    def attrs_kept(i: int) -> list[int]:
        return [
            k
            for k, (name, _, key) in enumerate(ours[i].attributes)
            if key in keep_keys or (keep_object_state and i != 0 and name != VARIABLE_VALUE)
        ]

    empty: list[int] = []
    return reached, [attrs_kept(i) if reached[i] and ours[i].attributes else empty for i in range(len(ours))]


def _root_refs_holding_values(ours: list[GraphNode], reached: list[bool], kept_of: list[list[int]]) -> list[int]:
    """Step 2: the root's child edges (positions) whose part holds a kept value: one walk back
    from every object holding one, along reached edges that do not pass through the root."""
    parents: list[list[int]] = [[] for _ in ours]
    for i, node in enumerate(ours):
        if i != 0 and reached[i]:
            for cid, _ in node.children:
                if cid != 0 and reached[cid]:
                    parents[cid].append(i)
    holds = [False] * len(ours)
    stack = [i for i in range(1, len(ours)) if kept_of[i]]
    for i in stack:
        holds[i] = True
    while stack:
        for q in parents[stack.pop()]:
            if not holds[q]:
                holds[q] = True
                stack.append(q)
    root_refs = [k for k, (cid, _) in enumerate(ours[0].children) if reached[cid] and cid != 0]
    return [k for k in root_refs if holds[ours[0].children[k][0]]]


@dataclasses.dataclass
class _KeptTree:
    """The kept part of the graph, by new id (breadth-first from the root, as TensorFlow
    numbers a saved graph).

    Attributes:
        order: The old id of each new id.
        new_id: Old id -> new id, for every kept object.
        path_of: An old id's path in the kept part.
        kept_refs: Per new id, the positions of the child edges it keeps.
        kept_attr: Per new id, the positions of the attributes it keeps.
        has_values: Per new id, whether it or something below it holds a value.
    """

    order: list[int]
    new_id: dict[int, int]
    path_of: ObjectPaths
    kept_refs: list[list[int]]
    kept_attr: list[list[int]]
    has_values: list[bool]


def _kept_tree(ours: list[GraphNode], reached: list[bool], kept_root_refs: list[int],
               kept_of: list[list[int]]) -> _KeptTree:
    """Steps 3 and 4: breadth-first from the root over the kept part, new ids and TensorFlow's
    paths (as parent pointers: a path is built only for an object that keeps attributes);
    then what each kept object keeps, and which hold values (one walk back, linear)."""
    new_id: dict[int, int] = {0: 0}
    order = [0]
    parent = [-2] * len(ours)
    name_of: list[str | None] = [None] * len(ours)
    parent[0] = -1
    queue = collections.deque([0])
    while queue:
        i = queue.popleft()
        children = ours[i].children
        refs = kept_root_refs if i == 0 else [k for k, (cid, _) in enumerate(children) if reached[cid]]
        for k in refs:
            cid, local = children[k]
            if cid not in new_id:
                new_id[cid] = len(order)
                order.append(cid)
                parent[cid] = i
                name_of[cid] = local
                queue.append(cid)
    kept_refs = [
        kept_root_refs if old == 0 else [k for k, (cid, _) in enumerate(ours[old].children) if cid in new_id]
        for old in order
    ]
    kept_attr = [kept_of[old] for old in order]
    back: list[list[int]] = [[] for _ in order]
    for i, old in enumerate(order):
        for k in kept_refs[i]:
            back[new_id[ours[old].children[k][0]]].append(i)
    has_values = [bool(attrs) for attrs in kept_attr]
    stack = [i for i, v in enumerate(has_values) if v]
    while stack:
        for q in back[stack.pop()]:
            if not has_values[q]:
                has_values[q] = True
                stack.append(q)
    return _KeptTree(order, new_id, ObjectPaths(parent, name_of), kept_refs, kept_attr, has_values)


def _write_pruned(source: _protos.TrackableObjectGraphFull, ours: list[GraphNode],
                  tree: _KeptTree) -> tuple[_protos.TrackableObjectGraphFull, dict[str, str], dict[str, str]]:
    """Step 5: the pruned graph, each kept attribute re-keyed by its object's new path.
    Messages are built field by field, unless the source carries fields our descriptor does
    not know: then they are copied (and their known fields rebuilt). A kept object saved by
    a registered saver is refused. Returns (the graph, old key -> new key, old key -> path)."""
    nodes = source.nodes
    unknown = _has_unknown_fields(source)
    out = _protos.TrackableObjectGraphFull()
    if unknown:
        out.CopyFrom(source)  # the graph's own unknown fields
        out.ClearField("nodes")
    key_map: dict[str, str] = {}
    paths: dict[str, str] = {}
    try:
        for i, old in enumerate(tree.order):
            src = nodes[old]
            if src.HasField("registered_saver") and src.registered_saver.name:
                raise UsageError(
                    f"object {'/'.join(tree.path_of(old)) or '(root)'} is saved by the registered saver "
                    f"{decode_key(src.registered_saver.name)!r}; extracting such checkpoints is not supported"
                )
            node = out.nodes.add()
            if unknown:
                node.CopyFrom(src)  # unknown fields of the object survive; the rest is rebuilt
                for field in _REBUILT_NODE_FIELDS:
                    node.ClearField(field)
            children = ours[old].children
            for k in tree.kept_refs[i]:
                child = node.children.add()
                if unknown:
                    child.CopyFrom(src.children[k])
                    _drop_empty(child, ("local_name",))
                elif children[k][1]:
                    child.local_name = src.children[k].local_name
                _set_int(child, "node_id", tree.new_id[children[k][0]])
            if tree.has_values[i]:
                node.has_checkpoint_values.value = True
            else:  # proto3's BoolValue(false): the message present, its zero value left out
                node.has_checkpoint_values.SetInParent()
            if not tree.kept_attr[i]:
                continue
            path = tree.path_of(old)
            prefix = "/".join(escape_local_name(p) for p in path)
            for k in tree.kept_attr[i]:
                old_key = ours[old].attributes[k][2]
                new_key = prefix + old_key[_object_prefix(old_key):]
                new_attr = node.attributes.add()
                if unknown:
                    new_attr.CopyFrom(src.attributes[k])
                    _drop_empty(new_attr, ("name", "full_name"))
                else:
                    sa = src.attributes[k]
                    if sa.name:
                        new_attr.name = sa.name
                    if sa.full_name:
                        new_attr.full_name = sa.full_name
                new_attr.checkpoint_key = encode_key(new_key)
                key_map[old_key] = new_key
                paths[old_key] = "/".join(path)
    except MalformedError as e:
        raise CorruptCheckpointError(f"the object graph cannot be pruned: {e}") from None
    return out, key_map, paths


# TrackableObject fields prune_object_graph rebuilds (children, attributes, has_checkpoint_values)
# or drops (slot_variables: only optimizers have them; registered_saver: refused).
_REBUILT_NODE_FIELDS = ("children", "attributes", "slot_variables", "registered_saver", "has_checkpoint_values")


def _has_unknown_fields(graph) -> bool:
    """Whether a parsed graph holds fields our descriptor does not know, anywhere (one pass in
    protobuf's C code: the size without them against the size with them)."""
    probe = _protos.TrackableObjectGraphFull()
    probe.CopyFrom(graph)
    probe.DiscardUnknownFields()
    return probe.ByteSize() != graph.ByteSize()


def _drop_empty(message, fields: tuple[str, ...]) -> None:
    """Leave empty strings out, as proto3 serialises them (a graph written with them spelled
    out reads the same in TensorFlow)."""
    for field in fields:
        if message.HasField(field) and not getattr(message, field):
            message.ClearField(field)


def _set_int(message, field: str, value: int) -> None:
    """Set a proto3 scalar as TensorFlow's code would serialise it: zero is left out."""
    if value:
        setattr(message, field, value)
    else:
        message.ClearField(field)


# -- bundle writing ------------------------------------------------------------------------
def numpy_view(tensor) -> np.ndarray:
    """A numpy view of an eager CPU tensor's buffer, without the copy ``Tensor.numpy()`` makes."""
    view = getattr(tensor, "_numpy", None)  # what Tensor.numpy() calls before copying
    return view() if view is not None else tensor.numpy()


def _check_regular_inputs(prefix: str) -> None:
    """Refuse FIFOs and devices among the files RestoreV2 would open: a bundle's index and data
    shards, or a V1 table file. What is missing is left for TensorFlow to report."""
    if _fs.is_remote(prefix):
        return
    if os.path.lexists(prefix + INDEX_SUFFIX):
        check_bundle_files(prefix)
    elif os.path.lexists(prefix):
        _fs.check_regular(prefix)


def restore_tensor(prefix: str, key: str, dtype: str):
    """One full tensor of a checkpoint as an eager tensor, read by ``tf.raw_ops.RestoreV2``.

    The value lives in TensorFlow's buffer only (no numpy copy); sliced tensors are assembled.

    Raises:
        CheckpointNotFoundError: No such key or file.
        CorruptCheckpointError: TensorFlow cannot read it.
        UnsafeFileError: The index or a data shard is a FIFO or device.
    """
    _check_regular_inputs(prefix)  # RestoreV2 opens the files by name: it would block on a FIFO
    tf = import_tf()
    try:
        with tf.device("/cpu:0"):
            return tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[encode_key(key)], shape_and_slices=[""],
                                        dtypes=[tf.as_dtype(dtype)])[0]
    except tf.errors.NotFoundError as e:
        raise CheckpointNotFoundError(f"{prefix}: {key!r}: {e.message.splitlines()[0]}") from None
    except (tf.errors.OpError, TypeError, ValueError) as e:
        raise CorruptCheckpointError(f"{prefix}: cannot read {key!r}: {str(e).splitlines()[0]}") from None


@dataclasses.dataclass(frozen=True)
class BundleTensor:
    """One tensor to write.

    Attributes:
        key: Its key in the written bundle.
        read: Returns the full value (an eager tensor, or anything numpy takes); called once,
            when its group is written.
        nbytes: Its size, for grouping.
        slices: Write it as these slices of its full shape (a partitioned variable);
            empty for a whole tensor.
    """

    key: str
    read: Callable[[], np.ndarray]
    nbytes: int
    slices: tuple[m.SliceInfo, ...] = ()


def slice_spec(shape: tuple[int, ...], info: m.SliceInfo) -> str:
    """The ``shape_and_slices`` string of SaveV2 for one slice: ``"10 5 0,5:-"``."""
    extents = ":".join("-" if length < 0 else f"{start},{length}" for start, length in zip(info.starts, info.lengths))
    return " ".join(str(d) for d in shape) + " " + extents


def _slice_of(value, info: m.SliceInfo):
    index = tuple(slice(None) if ln < 0 else slice(st, st + ln) for st, ln in zip(info.starts, info.lengths))
    return value[index]


def default_shard_bytes(sizes: Iterable[int]) -> int:
    """The default shard budget: the largest tensor, and at least :data:`MIN_SHARD_BYTES`."""
    return max([MIN_SHARD_BYTES, *sizes])


def pack(tensors: Sequence[BundleTensor], max_shard_bytes: int) -> list[list[BundleTensor]]:
    """Groups of at most ``max_shard_bytes`` (first fit, largest first; input order kept inside
    a group and between groups by their first member). ``0`` gives one tensor per group;
    zero-byte entries (the object graph) join the first group."""
    bins: list[tuple[int, list[tuple[int, BundleTensor]]]] = []
    sizes: list[int] = []
    for pos, t in sorted(enumerate(tensors), key=lambda item: -item[1].nbytes):
        for b, (_, members) in enumerate(bins):
            if t.nbytes == 0 or sizes[b] + t.nbytes <= max_shard_bytes:
                members.append((pos, t))
                sizes[b] += t.nbytes
                break
        else:
            bins.append((pos, [(pos, t)]))
            sizes.append(t.nbytes)
    groups = [sorted(members, key=lambda item: item[0]) for _, members in bins]
    groups.sort(key=lambda members: members[0][0])
    return [[t for _, t in members] for members in groups]


def write_bundle(
    prefix: str,
    tensors: Sequence[BundleTensor],
    *,
    max_shard_bytes: int | None = None,
    on_value: Callable[[BundleTensor, np.ndarray], None] | None = None,
) -> int:
    """Write a TF bundle at ``prefix`` with TensorFlow's SaveV2 and MergeV2Checkpoints.

    Args:
        prefix: Output prefix (``prefix.index``, ``prefix.data-*``); its directory must exist.
            Write into a temporary location and move it into place (see ``_atomic``).
        tensors: What to write. Values are read one group at a time.
        max_shard_bytes: Bytes per data shard (and about the peak memory); a bigger tensor
            gets a shard of its own; ``0`` writes one tensor per shard. Default:
            :func:`default_shard_bytes` (the largest tensor, at least 64 MiB).
        on_value: Called with a numpy view of each tensor's full value while it is in memory
            (for checksums); the view is only valid during the call.

    Returns:
        The number of data shards written.

    Raises:
        UsageError: Nothing to write.
        CkptError: TensorFlow refused to write (the message names the prefix).
    """
    tf = import_tf()
    parts_dir = prefix + TEMP_PARTS_DIR
    os.makedirs(parts_dir, exist_ok=True)
    parts: list[str] = []
    try:
        if max_shard_bytes is None:
            max_shard_bytes = default_shard_bytes(t.nbytes for t in tensors)
        for group in pack(tensors, max_shard_bytes):
            names, specs, values = [], [], []
            for t in group:
                value = t.read()
                if not isinstance(value, tf.Tensor):
                    value = tf.constant(np.asarray(value))
                if on_value is not None:
                    on_value(t, numpy_view(value))
                if t.slices:
                    for info in t.slices:
                        names.append(encode_key(t.key))
                        specs.append(slice_spec(tuple(value.shape), info))
                        values.append(_slice_of(value, info))
                else:
                    names.append(encode_key(t.key))
                    specs.append("")
                    values.append(value)
                del value
            part = os.path.join(parts_dir, f"part-{len(parts):05d}")
            with tf.device("/cpu:0"):
                tf.raw_ops.SaveV2(prefix=part, tensor_names=names, shape_and_slices=specs, tensors=values)
            del names, specs, values
            parts.append(part)
        if not parts:
            raise UsageError(f"{prefix}: nothing to write")
        with tf.device("/cpu:0"):
            tf.raw_ops.MergeV2Checkpoints(
                checkpoint_prefixes=parts, destination_prefix=prefix, delete_old_dirs=True
            )
    except tf.errors.OpError as e:
        raise CkptError(f"{prefix}: TensorFlow could not write the checkpoint: {e.message.splitlines()[0]}") from None
    finally:
        if os.path.isdir(parts_dir):
            import shutil  # noqa: PLC0415

            shutil.rmtree(parts_dir, ignore_errors=True)
    return len(parts)


def object_graph_tensor(blob: bytes) -> BundleTensor:
    """The ``_CHECKPOINTABLE_OBJECT_GRAPH`` entry holding ``blob`` (counted as 0 bytes, so it
    shares the first data shard instead of taking one of its own)."""
    return BundleTensor(key=OBJECT_GRAPH_KEY, read=lambda: np.array(blob, dtype=object), nbytes=0)
