"""``prune_object_graph`` without TensorFlow: the same bytes as TensorFlow's own protobuf route.

The reference below is the pruning as it was written over ``trackable_object_graph_pb2`` (the
TensorFlow protobuf classes); the function under test parses and re-serialises the graph
through ckptinspect's own descriptor. Both run on the same graphs (the trainer's fixtures,
Keras 2 ``save_weights``, the real-world TF2 items) with the same kept keys, and their outputs
must be identical bytes, with the same key maps. The graph bytes come from TensorFlow's reader.
"""

from __future__ import annotations

import collections
import pathlib
import subprocess
import sys

import pytest

import ckptinspect
from ckptinspect.errors import CorruptCheckpointError
from ckptinspect.formats.tf import protos as _protos
from ckptinspect.formats.tf.object_graph import is_optimizer_node, parse_object_graph, walk
from ckptinspect.formats.tf.write.through_tf import escape_local_name, prune_object_graph

tf = pytest.importorskip("tensorflow")

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures"
GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
SOURCES = ["run/ckpt-4", "run/ckpt-8", "sharded/ckpt-2", "sharded/ckpt-4", "keras/keras2_tf/ckpt"]
REALWORLD_TF2 = [
    "tf2-gan-lstm-2opt/training_checkpoints/btc",
    "tf2-gan-kerasnewopt/model",
    "tf2-seq2seq-tf112-eager/training_checkpoints",
    "savedmodel-keras-stale-shard",
    "savedmodel-tf2-half-plus-two",
    "tf2-a2c-ckptmanager/training_checkpoints",
    "tf2-wgan-2shard/training_checkpoints",
]


def reference_prune(blob: bytes, keep_keys, keep_object_state: bool = True) -> tuple[bytes, dict[str, str]]:
    """The pruning through TensorFlow's ``trackable_object_graph_pb2`` (the former route)."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2  # noqa: PLC0415

    source = trackable_object_graph_pb2.TrackableObjectGraph()
    source.ParseFromString(blob)
    ours = parse_object_graph(blob)
    nodes = source.nodes
    optimizer = [is_optimizer_node(n) for n in ours]
    reach, _ = walk(ours, lambda i: True, lambda i: not optimizer[i])
    reached = [p != -2 for p in reach]

    def kept_attrs(i):
        return [a for a in nodes[i].attributes
                if a.checkpoint_key in keep_keys or (keep_object_state and i != 0 and a.name != "VARIABLE_VALUE")]

    parents = [[] for _ in ours]
    for i, node in enumerate(ours):
        if i != 0 and reached[i]:
            for cid, _ in node.children:
                if cid != 0 and reached[cid]:
                    parents[cid].append(i)
    holds = [False] * len(ours)
    stack = [i for i in range(1, len(ours)) if reached[i] and kept_attrs(i)]
    for i in stack:
        holds[i] = True
    while stack:
        for q in parents[stack.pop()]:
            if not holds[q]:
                holds[q] = True
                stack.append(q)
    kept_root_refs = [r for r in nodes[0].children if reached[r.node_id] and r.node_id != 0 and holds[r.node_id]]
    new_id, order, path = {0: 0}, [0], {0: ()}
    queue = collections.deque([0])
    while queue:
        i = queue.popleft()
        for ref in kept_root_refs if i == 0 else [r for r in nodes[i].children if reached[r.node_id]]:
            if ref.node_id not in new_id:
                new_id[ref.node_id] = len(order)
                order.append(ref.node_id)
                path[ref.node_id] = (*path[i], ref.local_name)
                queue.append(ref.node_id)
    out = trackable_object_graph_pb2.TrackableObjectGraph()
    key_map = {}
    for old in order:
        node = out.nodes.add()
        for ref in kept_root_refs if old == 0 else [r for r in nodes[old].children if r.node_id in new_id]:
            child = node.children.add()
            child.CopyFrom(ref)
            child.node_id = new_id[ref.node_id]
        prefix = "/".join(escape_local_name(p) for p in path[old])
        for attr in kept_attrs(old):
            new = node.attributes.add()
            new.CopyFrom(attr)
            key = attr.checkpoint_key
            new.checkpoint_key = prefix + key[key.find("/.ATTRIBUTES/") if "/.ATTRIBUTES/" in key else 0:]
            key_map[attr.checkpoint_key] = new.checkpoint_key
    back = [[] for _ in out.nodes]
    for i, n in enumerate(out.nodes):
        for c in n.children:
            back[c.node_id].append(i)
    has = [bool(n.attributes) for n in out.nodes]
    stack = [i for i, v in enumerate(has) if v]
    while stack:
        for q in back[stack.pop()]:
            if not has[q]:
                has[q] = True
                stack.append(q)
    for i, n in enumerate(out.nodes):
        n.has_checkpoint_values.value = has[i]
    return out.SerializeToString(), key_map


def _graph_and_keys(prefix: str):
    blob = tf.train.load_checkpoint(prefix).get_tensor(GRAPH_KEY)
    with ckptinspect.open(prefix) as ckpt:
        roles = {v.key: v.role for v in ckpt.variables}
    return blob, roles


def _assert_same_as_tensorflow(prefix: str) -> int:
    blob, roles = _graph_and_keys(prefix)
    checked = 0
    for keep in (("model",), ("model", "metadata")):
        keys = {k for k, r in roles.items() if r in keep}
        for state in (True, False):
            ours = prune_object_graph(blob, keys, keep_object_state=state)
            ref_blob, ref_map = reference_prune(blob, keys, state)
            assert ours.blob == ref_blob, (prefix, keep, state)
            assert ours.key_map == ref_map
            checked += 1
    return checked


@pytest.mark.parametrize("name", SOURCES)
def test_native_prune_is_byte_identical_to_tensorflow_protobuf_route(name):
    assert _assert_same_as_tensorflow(str(FIXTURES / name)) == 4


@pytest.mark.parametrize("item", REALWORLD_TF2)
def test_native_prune_matches_tensorflow_on_realworld_graphs(realworld, item):
    path = realworld / item
    path = next(path.rglob("saved_model.pb")).parent if list(path.rglob("saved_model.pb")) else path
    with ckptinspect.open(str(path)) as ckpt:
        prefix = ckpt.path
    assert _assert_same_as_tensorflow(prefix) == 4


def test_unknown_fields_survive_and_tensorflow_still_parses():
    """Fields our descriptor does not know (a future TrackableObject field, a graph-level one)
    are carried over; TensorFlow's protobuf parses the result to the same known fields."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2  # noqa: PLC0415

    blob, roles = _graph_and_keys(str(FIXTURES / "run/ckpt-8"))
    graph = _protos.TrackableObjectGraphFull()
    graph.ParseFromString(blob)
    # field 15 (varint 7) on the root and on the 'model' node; field 9 (bytes) on the graph
    model_id = next(c.node_id for c in graph.nodes[0].children if c.local_name == b"model")
    extra_node, extra_graph = b"\x78\x07", b"\x4a\x03abc"
    nodes = [n.SerializeToString() + (extra_node if i in (0, model_id) else b"") for i, n in enumerate(graph.nodes)]
    crafted = b"".join(b"\x0a" + _varint(len(n)) + n for n in nodes) + extra_graph
    keys = {k for k, r in roles.items() if r == "model"}
    pruned = prune_object_graph(crafted, keys)
    assert pruned.blob.endswith(extra_graph)
    out = _protos.TrackableObjectGraphFull()
    out.ParseFromString(pruned.blob)
    assert out.nodes[0].SerializeToString().endswith(extra_node)
    assert out.nodes[1].SerializeToString().endswith(extra_node)  # 'model' is the root's only child
    assert sum(n.SerializeToString().endswith(extra_node) for n in out.nodes) == 2
    # Without the extras, the same bytes as the plain graph gives.
    assert _strip(pruned.blob, extra_node, extra_graph) == prune_object_graph(blob, keys).blob
    tf_graph = trackable_object_graph_pb2.TrackableObjectGraph()
    tf_graph.ParseFromString(pruned.blob)
    assert len(tf_graph.nodes) == pruned.num_nodes


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _strip(blob: bytes, extra_node: bytes, extra_graph: bytes) -> bytes:
    graph = _protos.TrackableObjectGraphFull()
    graph.ParseFromString(blob[: -len(extra_graph)])
    nodes = [n.SerializeToString() for n in graph.nodes]
    nodes = [n[: -len(extra_node)] if n.endswith(extra_node) else n for n in nodes]
    return b"".join(b"\x0a" + _varint(len(n)) + n for n in nodes)


def test_registered_saver_is_refused_and_garbage_is_corrupt():
    blob, roles = _graph_and_keys(str(FIXTURES / "run/ckpt-8"))
    graph = _protos.TrackableObjectGraphFull()
    graph.ParseFromString(blob)
    model_id = next(c.node_id for c in graph.nodes[0].children if c.local_name == b"model")
    graph.nodes[model_id].registered_saver.name = b"my_saver"
    keys = {k for k, r in roles.items() if r == "model"}
    with pytest.raises(ckptinspect.errors.UsageError, match="registered saver 'my_saver'"):
        prune_object_graph(graph.SerializeToString(), keys)
    with pytest.raises(CorruptCheckpointError, match="does not parse"):
        prune_object_graph(b"\x0a\xff\xff", keys)


def test_pruning_does_not_import_tensorflow():
    code = (
        "import sys; from ckptinspect.formats.tf.write.through_tf import prune_object_graph\n"
        "from ckptinspect.formats.tf.bundle import open_bundle\n"
        f"c = open_bundle({str(FIXTURES / 'run/ckpt-8')!r})\n"
        "p = prune_object_graph(c.source.object_graph(), {v.key for v in c.variables if v.role == 'model'})\n"
        "assert p.num_nodes > 5 and 'tensorflow' not in sys.modules, sorted(m for m in sys.modules if 'tensorflow' in m)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
