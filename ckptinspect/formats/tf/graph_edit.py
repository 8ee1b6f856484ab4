"""Editing a TF2 object graph without TensorFlow: moving variables to new paths, renaming
their recorded names, dropping values (``rewrite``).

A TF2 object-based checkpoint restores by structure: ``tf.train.Checkpoint(model=m).read``
walks the saved ``TrackableObjectGraph`` from the root along child edges named by their
``local_name`` and matches each saved object to the Python object at the same path; each
matched object reads its values under the ``checkpoint_key`` its node records. So moving a
variable means moving its edges, and its key (by convention the escaped path of the object,
``model/dense/kernel/.ATTRIBUTES/VARIABLE_VALUE``) moves with it, as TensorFlow would write it
for the renamed model.

:func:`edit_object_graph` works on the message declared in :mod:`._protos`: fields it does not
declare (``has_checkpoint_values``, ``registered_saver``, ``serialized_tensor`` extras) are
kept as unknown fields and written back unchanged.

A move is done edge by edge where every variable passing through an edge agrees on its new
name (renaming a layer renames one edge, and the layer's other objects follow); otherwise the
variable's own edge is removed and a new one added at its new path, creating empty objects
where the path does not exist. Optimizer slot variables are referenced by node id, so they
follow their variable; their keys (``<var path>/.OPTIMIZER_SLOT/<optimizer path>/<slot>``) are
re-derived from the variable's new path.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from ...errors import CorruptCheckpointError, UsageError
from . import protos as _protos
from .._layout import decode_key, encode_key
from .wire import MalformedError
from .object_graph import ATTRIBUTES_MARK, OPTIMIZER_SLOT_MARK, GraphNode, ObjectPaths, parse_object_graph, walk

__all__ = ["GraphEdit", "EditedGraph", "edit_object_graph", "escape_path", "unescape_path", "OPTIMIZER_SLOT_MARK"]

ESCAPE_CHAR = "."
SLASH_ESCAPE = ".S"
# A variable is moved to a path at most this deep (real models nest a few dozen objects; a
# hostile chain would otherwise make the edit create and walk a million objects).
MAX_MOVE_DEPTH = 1000


def _escape(name: str) -> str:
    """TensorFlow's escaping of one path element (``trackable_utils.escape_local_name``)."""
    return name.replace(ESCAPE_CHAR, ESCAPE_CHAR * 2).replace("/", SLASH_ESCAPE)


def _unescape(name: str) -> str:
    out = []
    i = 0
    while i < len(name):
        if name[i] == ESCAPE_CHAR and i + 1 < len(name):
            out.append("/" if name[i + 1] == "S" else name[i + 1])
            i += 2
        else:
            out.append(name[i])
            i += 1
    return "".join(out)


def escape_path(path: Sequence[str]) -> str:
    """An object path as a checkpoint key prefix (each element escaped, joined with ``/``)."""
    return "/".join(_escape(p) for p in path)


def unescape_path(text: str) -> tuple[str, ...]:
    """The inverse of :func:`escape_path`: a key prefix (or readable name) as local names."""
    return tuple(_unescape(p) for p in text.split("/")) if text else ()


@dataclasses.dataclass(frozen=True)
class GraphEdit:
    """What to change in an object graph.

    Attributes:
        moves: Checkpoint key -> the new object path (local names, unescaped) of the object
            holding it (a variable). Every attribute of that object moves with it.
        full_names: Checkpoint key -> new ``full_name`` recorded for it (the readable name
            Keras gives a variable).
        drop: Checkpoint keys whose attributes are removed.
    """

    moves: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    full_names: Mapping[str, str] = dataclasses.field(default_factory=dict)
    drop: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True)
class EditedGraph:
    """The result of :func:`edit_object_graph`.

    Attributes:
        blob: The serialized edited graph.
        key_map: Old checkpoint key -> new key, for every attribute kept (most unchanged).
        edges_renamed: Child edges renamed in place.
        edges_moved: Variables whose own edge was moved to a new parent.
        nodes_added: Empty objects created on new paths.
    """

    blob: bytes
    key_map: dict[str, str]
    edges_renamed: int
    edges_moved: int
    nodes_added: int


def _paths(nodes) -> tuple[list[int], list[str | None], ObjectPaths]:
    parent, local = walk(nodes, lambda i: True)
    return parent, local, ObjectPaths(parent, local)


def _attribute_suffix(key: str) -> str:
    pos = key.find(ATTRIBUTES_MARK)
    if pos < 0:
        raise CorruptCheckpointError(f"object-graph attribute key {key!r} has no {ATTRIBUTES_MARK.strip('/')} part")
    return key[pos:]


def _readable(key: str) -> str:
    """The readable name of a key: its object path (``a/b/.ATTRIBUTES/VARIABLE_VALUE`` -> ``a/b``)."""
    return key.split(ATTRIBUTES_MARK, 1)[0]


def _chain(parent: list[int], i: int) -> list[int]:
    """Nodes from the root to ``i`` (inclusive) along the canonical tree."""
    out = []
    while i >= 0:
        out.append(i)
        i = parent[i]
    out.reverse()
    return out


def edit_object_graph(blob: bytes, edit: GraphEdit, labels: Mapping[str, str] | None = None) -> EditedGraph:
    """Apply ``edit`` to a serialized ``TrackableObjectGraph``.

    Args:
        blob: The ``_CHECKPOINTABLE_OBJECT_GRAPH`` value.
        edit: What to move, rename and drop.
        labels: Checkpoint key -> readable name, for messages.

    Returns:
        The :class:`EditedGraph`.

    Raises:
        CorruptCheckpointError: The graph does not parse, or a key to move is not in it.
        UsageError: A move that would make two objects share a path (both named), or a
            variable that stays reachable at its old path through another edge.
    """
    g = _Editing.parse(blob, labels or {}, with_paths=bool(edit.moves))
    targets, target_key = g.move_targets(edit.moves)  # 1. the moves, per object
    moving = {i: t for i, t in targets.items() if t != g.old_path[i]}
    g.check_final_paths(moving)
    renamed_edges = g.rename_edges(moving)  # 2. edge renames wherever every object agrees
    moved, added = g.move_own_edges(moving, renamed_edges, target_key)  # 3. the rest
    if edit.drop:
        g.drop(edit.drop)  # 4. dropped attributes and the slots left empty
    new_path = g.new_paths(moving, target_key)  # 5. keys from the new paths, full names
    key_map = g.rekey(new_path, edit.full_names)
    g.check_new_keys(key_map)
    return EditedGraph(
        blob=g.graph.SerializeToString(),
        key_map=key_map,
        edges_renamed=len(renamed_edges),
        edges_moved=moved,
        nodes_added=added,
    )


@dataclasses.dataclass
class _Editing:
    """An object graph under edit and what every step of :func:`edit_object_graph` reads.

    Attributes:
        ours: The graph as :func:`parse_object_graph` reads it (the original, never edited).
        graph: The message being edited.
        node_of: Checkpoint key -> the node holding it (the first, if several do).
        parent: Each node's parent in the canonical tree (-2: not reached), when paths were
            needed (something moves); else empty.
        old_path: Node holding a key and reached from the root -> its path before the edit.
        labels: Checkpoint key -> readable name, for messages.
    """

    ours: list[GraphNode]
    graph: Any
    node_of: dict[str, int]
    parent: list[int]
    old_path: dict[int, tuple[str, ...]]
    labels: Mapping[str, str]

    @classmethod
    def parse(cls, blob: bytes, labels: Mapping[str, str], with_paths: bool) -> _Editing:
        """Parse the graph twice (our reading and the message to edit) and, when something
        moves (a hostile graph can be deep), the path of every node holding a key."""
        try:
            ours = parse_object_graph(blob)
            graph = _protos.TrackableObjectGraph()
            graph.ParseFromString(blob)
        except (MalformedError, _protos.DecodeError) as e:
            raise CorruptCheckpointError(f"the object graph does not parse: {e}") from None
        if not ours:
            raise CorruptCheckpointError("the object graph has no nodes")
        node_of: dict[str, int] = {}
        for i, node in enumerate(ours):
            for _, _, key in node.attributes:
                node_of.setdefault(key, i)
        parent: list[int] = []
        old_path: dict[int, tuple[str, ...]] = {}
        try:
            if with_paths:
                parent, _local, path_of = _paths(ours)
                old_path = {i: path_of(i) for i in set(node_of.values()) if parent[i] != -2}
        except MalformedError as e:
            raise CorruptCheckpointError(f"the object graph cannot be edited: {e}") from None
        return cls(ours, graph, node_of, parent, old_path, labels)

    def label(self, key: str) -> str:
        return self.labels.get(key, key)

    def _key_of(self, i: int) -> str:
        """A key held by node ``i`` (for messages)."""
        return next(k for k, n in self.node_of.items() if n == i)

    def move_targets(self, moves: Mapping[str, tuple[str, ...]]) -> tuple[dict[int, tuple[str, ...]], dict[int, str]]:
        """Step 1: each moved object's new path and the key that asked for it, refusing keys
        not in the graph, slot variables (they follow their variable), paths too deep or with
        an empty element, and two keys of one object asked to move apart."""
        targets: dict[int, tuple[str, ...]] = {}
        target_key: dict[int, str] = {}
        label = self.label
        for key, new in moves.items():
            i = self.node_of.get(key)
            if i is None:
                raise CorruptCheckpointError(f"key {key!r} is not in the object graph")
            if i not in self.old_path:
                raise UsageError(f"{label(key)!r} is not reached from the root of the object graph (a slot variable"
                                 " follows its variable): it cannot be moved by itself")
            if len(new) > MAX_MOVE_DEPTH or len(self.old_path[i]) > MAX_MOVE_DEPTH:
                raise UsageError(f"{label(key)!r}: cannot move an object more than {MAX_MOVE_DEPTH} levels deep")
            if not new or any(not p for p in new):
                raise UsageError(f"{label(key)!r} cannot be moved to an empty path element ({'/'.join(new)!r})")
            if i in targets and targets[i] != new:
                raise UsageError(f"{label(target_key[i])!r} and {label(key)!r} are held by one object and cannot move apart")
            targets[i] = tuple(new)
            target_key[i] = key
        return targets, target_key

    def check_final_paths(self, moving: dict[int, tuple[str, ...]]) -> None:
        """Refuse two variables (moved or not) that would end at one path."""
        final: dict[tuple[str, ...], int] = {}
        for i, p in self.old_path.items():
            t = moving.get(i, p)
            other = final.get(t)
            if other is not None and other != i:
                raise UsageError(f"renaming makes {self.label(self._key_of(other))!r} and"
                                 f" {self.label(self._key_of(i))!r} collide at {'/'.join(t)!r}")
            final[t] = i

    def rename_edges(self, moving: dict[int, tuple[str, ...]]) -> dict[tuple[int, str], str]:
        """Step 2: rename a child edge in place wherever every object through it agrees on its
        new name (a moved object agrees only with a path of the same depth); refuse a rename
        onto an existing child. Returns (parent node, old local name) -> new local name."""
        proposals: dict[tuple[int, str], set[str]] = {}
        for i, p in self.old_path.items():
            chain = _chain(self.parent, i)
            t = moving.get(i)
            same_shape = t is None or len(t) == len(p)
            for depth in range(len(p)):
                edge = (chain[depth], p[depth])
                want = p[depth] if t is None else (t[depth] if same_shape else None)
                proposals.setdefault(edge, set()).add(want)  # None: this object cannot agree
        renamed_edges = {e: next(iter(v)) for e, v in proposals.items() if len(v) == 1 and None not in v
                         and next(iter(v)) != e[1]}
        nodes = self.graph.nodes
        for (pid, old), new in renamed_edges.items():
            names = {decode_key(r.local_name) for r in nodes[pid].children}
            if new in names and (pid, new) not in renamed_edges:
                clash = [r.node_id for r in nodes[pid].children if decode_key(r.local_name) == new]
                raise UsageError(f"renaming moves {'/'.join(self.old_path.get(pid, ())) or '(root)'}/{old!r} onto the"
                                 f" existing object {new!r} (node {clash[0]})")
            for ref in nodes[pid].children:
                if decode_key(ref.local_name) == old:
                    ref.local_name = encode_key(new)
        return renamed_edges

    def _child(self, pid: int, name: str) -> int | None:
        for ref in self.graph.nodes[pid].children:
            if decode_key(ref.local_name) == name:
                return ref.node_id
        return None

    def move_own_edges(self, moving: dict[int, tuple[str, ...]], renamed_edges: dict[tuple[int, str], str],
                       target_key: dict[int, str]) -> tuple[int, int]:
        """Step 3: each moved object the renames did not bring to its new path loses its own
        edge and gets one at the new path, empty objects created on the way; refuse a path
        already held by another object. Returns (objects moved, objects created)."""
        nodes = self.graph.nodes

        def current_path(i: int) -> tuple[str, ...]:
            chain = _chain(self.parent, i)
            out = []
            for depth in range(1, len(chain)):
                pid, old = chain[depth - 1], self.old_path[i][depth - 1]
                out.append(renamed_edges.get((pid, old), old))
            return tuple(out)

        moved = added = 0
        for i, t in moving.items():
            if current_path(i) == t:
                continue
            pid, old = self.parent[i], self.old_path[i][-1]
            old_name = renamed_edges.get((pid, old), old)
            keep = [r for r in nodes[pid].children if not (r.node_id == i and decode_key(r.local_name) == old_name)]
            del nodes[pid].children[:]
            nodes[pid].children.extend(keep)
            at = 0
            for name in t[:-1]:
                nxt = self._child(at, name)
                if nxt is None:
                    nodes.add()
                    nxt = len(nodes) - 1
                    ref = nodes[at].children.add()
                    ref.node_id, ref.local_name = nxt, encode_key(name)
                    added += 1
                at = nxt
            existing = self._child(at, t[-1])
            if existing is not None and existing != i:
                raise UsageError(f"renaming moves {self.label(target_key[i])!r} onto an existing object at {'/'.join(t)!r}")
            if existing is None:
                ref = nodes[at].children.add()
                ref.node_id, ref.local_name = i, encode_key(t[-1])
            moved += 1
        return moved, added

    def drop(self, drop: frozenset[str]) -> None:
        """Step 4: remove the dropped keys' attributes, then the slot references whose slot
        variable holds nothing any more."""
        nodes = self.graph.nodes
        for node in nodes:
            kept = [a for a in node.attributes if decode_key(a.checkpoint_key) not in drop]
            if len(kept) != len(node.attributes):
                del node.attributes[:]
                node.attributes.extend(kept)
        for node in nodes:
            kept_slots = [s for s in node.slot_variables if len(nodes[s.slot_variable_node_id].attributes)]
            if len(kept_slots) != len(node.slot_variables):
                del node.slot_variables[:]
                node.slot_variables.extend(kept_slots)

    def new_paths(self, moving: dict[int, tuple[str, ...]], target_key: dict[int, str]) -> dict[int, tuple[str, ...]]:
        """Step 5: every key-holding object's path in the edited graph, refusing one that the
        canonical walk still reaches elsewhere than where it was asked to go (TensorFlow would
        key it there)."""
        if not self.old_path:
            return {}
        new_parent, _, new_path_of = _paths(parse_object_graph(self.graph.SerializeToString()))
        new_path: dict[int, tuple[str, ...]] = {}
        for i, p in self.old_path.items():
            if new_parent[i] == -2:  # pragma: no cover - edges are only renamed or re-added
                raise UsageError(f"{self.label(target_key.get(i, ''))!r}: the object is no longer reachable after the edit")
            new_path[i] = new_path_of(i)
            want = moving.get(i, p)
            if new_path[i] != want:
                key = target_key.get(i) or self._key_of(i)
                raise UsageError(
                    f"{self.label(key)!r} cannot be moved to {'/'.join(want)!r}: the object is also reached at "
                    f"{'/'.join(new_path[i])!r}, so TensorFlow would still key it there"
                )
        return new_path

    def rekey(self, new_path: dict[int, tuple[str, ...]], full_names: Mapping[str, str]) -> dict[str, str]:
        """Every kept attribute's new key: a moved object's from its new path, a slot's from its
        variable's and its optimizer's new paths; and its full name (as asked, or following the
        path when it was the path). Returns old key -> new key."""
        slot_of: dict[int, tuple[int, int]] = {}  # slot node -> (variable node, optimizer node)
        for o, node in enumerate(self.ours):
            for orig, _, slot in node.slots:
                slot_of[slot] = (orig, o)
        old_path = self.old_path
        key_map: dict[str, str] = {}
        for i, node in enumerate(self.graph.nodes):
            for attr in node.attributes:
                key = decode_key(attr.checkpoint_key)
                new_key = key
                if i in old_path and new_path[i] != old_path[i]:
                    new_key = escape_path(new_path[i]) + _attribute_suffix(key)
                elif i in slot_of and OPTIMIZER_SLOT_MARK in key:
                    var, opt = slot_of[i]
                    head, tail = key.split(OPTIMIZER_SLOT_MARK, 1)
                    if var in old_path and head == escape_path(old_path[var]):
                        head = escape_path(new_path[var])
                    if opt in old_path:
                        old_opt = escape_path(old_path[opt]) + "/"
                        if tail.startswith(old_opt):
                            tail = escape_path(new_path[opt]) + "/" + tail[len(old_opt):]
                    new_key = head + OPTIMIZER_SLOT_MARK + tail
                if new_key != key:
                    attr.checkpoint_key = encode_key(new_key)
                if key in full_names:
                    attr.full_name = encode_key(full_names[key])
                elif new_key != key and decode_key(attr.full_name) == _readable(key):
                    attr.full_name = encode_key(_readable(new_key))  # a full name that was the path follows it
                key_map[key] = new_key
        return key_map

    def check_new_keys(self, key_map: dict[str, str]) -> None:
        """Refuse two old keys that end as one new key."""
        seen: dict[str, str] = {}
        for old, new in key_map.items():
            if new in seen:
                raise UsageError(f"renaming makes {self.label(seen[new])!r} and {self.label(old)!r} collide at key {new!r}")
            seen[new] = old
