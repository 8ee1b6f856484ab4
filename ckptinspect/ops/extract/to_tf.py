"""``extract`` to a TF bundle, through ckptinspect's own bundle writer (no TensorFlow).

* From a TF2 object-based bundle: the object graph pruned to the model's part
  (:func:`~ckptinspect.formats.prune_object_graph`, re-serialised without TensorFlow), every
  kept value re-keyed by its path in the pruned graph and copied byte for byte from the
  source's data files (``copy_file_range``, the source's crc32c reused), slices kept as they
  are stored. ``tf.train.Checkpoint(model=...).read(OUT).assert_consumed()`` passes.
* From a TF1 name-based bundle: the same keys minus the optimizer's, copied the same way.
* From a ``.safetensors`` file that ``extract`` wrote from a TF2 checkpoint (its
  ``__metadata__`` carries the pruned object graph and each tensor's checkpoint key, see
  :data:`META_OBJECT_GRAPH`): the TF2 checkpoint again, object-based, values bit-identical.
* From any other source the tool reads (safetensors, torch, ``.weights.h5``, ``.h5``, npz, V1
  tables): a name-based bundle whose keys are the variables' names (as
  ``tf.train.load_checkpoint`` and ``tf.compat.v1.train.init_from_checkpoint`` read them),
  values streamed in blocks; a V1 partitioned variable keeps its slices.

The output is read back by ckptinspect's own reader before it is renamed into place: the
index's keys, dtypes, shapes and slices, the object graph's bytes, and every value, bit for bit
(a copied run against the source's bytes, chunk by chunk; a streamed one against the source's
values).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from typing import Any, Callable

import numpy as np

from ... import model as m
from ...errors import CkptError, CorruptCheckpointError, UsageError, VerificationError
from ...formats import (
    OutputTensor,
    TensorData,
    capabilities,
    compare_copy,
    copy_tensor,
    open_checkpoint,
    prune_object_graph,
    write_bundle_native,
)
from .report import ExtractedVariable
from .writers import Verifier, gather_blocks, need_object_graph, source_matcher

__all__ = [
    "META_OBJECT_GRAPH",
    "META_CHECKPOINT_KEYS",
    "TfOutput",
    "write_tf",
    "tf_metadata",
    "name_keys",
]

# safetensors ``__metadata__`` entries that let a TF2 checkpoint go to .safetensors and back:
# the pruned object graph (base64 of its serialized bytes) and, as JSON, each tensor's name ->
# its checkpoint key in that graph.
META_OBJECT_GRAPH = "tf_object_graph"
META_CHECKPOINT_KEYS = "tf_checkpoint_keys"
STREAM_ELEMENTS = 1 << 20
SAFETENSORS_FORMAT = "safetensors"
WRITABLE_DTYPES = frozenset(m.NUMERIC_DTYPES) | {"string"}

Progress = Callable[[int, int, m.Variable], None]


@dataclasses.dataclass(frozen=True)
class TfOutput:
    """What :func:`write_tf` wrote (for the report).

    Attributes:
        planned: Every source variable, kept or dropped.
        verified: Tensors read back and found bit-identical.
        num_shards: Data files written.
        object_graph: Node counts and kept root children for an object-based output, else None.
        notes: Facts for the report.
        copied: Tensors copied byte for byte from the source's data files.
        copied_bytes: Bytes copied so.
    """

    planned: list[ExtractedVariable]
    verified: int
    num_shards: int
    object_graph: dict[str, Any] | None
    notes: list[str]
    copied: int
    copied_bytes: int


@dataclasses.dataclass(frozen=True)
class _Plan:
    key_map: dict[str, str]  # source key -> output key, for every kept variable
    blob: bytes | None  # the object graph to write, or None (name-based)
    object_graph: dict[str, Any] | None
    notes: list[str]


def _object_graph_bytes(ckpt: m.Checkpoint) -> bytes:
    read = getattr(ckpt.source, "object_graph", None)
    blob = read() if read is not None else None
    if blob is None:
        raise CorruptCheckpointError(f"{ckpt.path}: the object graph cannot be read; extract needs it")
    return blob


def tf_metadata(ckpt: m.Checkpoint, keep: tuple[str, ...], names: dict[str, str]) -> dict[str, str]:
    """The safetensors ``__metadata__`` entries that let a TF2 object-based source come back
    as a TF2 checkpoint (see :data:`META_OBJECT_GRAPH`); empty for any other source.

    Args:
        ckpt: The source.
        keep: The kept roles.
        names: Source key -> tensor name in the safetensors file, for every kept variable.
    """
    if ckpt.info.get("kind") != "tf2-object" or (ckpt.info.get("object_graph") or {}).get("error"):
        return {}
    try:
        pruned = prune_object_graph(_object_graph_bytes(ckpt), {v.key for v in ckpt.variables if v.role in keep})
    except (CorruptCheckpointError, UsageError):  # the tensors can still go out, without the way back
        return {}
    if set(pruned.key_map) != set(names):  # object state the file cannot hold: no way back
        return {}
    return {
        META_OBJECT_GRAPH: base64.b64encode(pruned.blob).decode("ascii"),
        META_CHECKPOINT_KEYS: json.dumps({names[k]: pruned.key_map[k] for k in names}, ensure_ascii=False),
    }


def _restore_note(root_children: tuple[str, ...]) -> str:
    if len(root_children) == 1:
        return (
            f"restore with tf.train.Checkpoint({root_children[0]}=model).read(OUT).assert_consumed() "
            "(compile the model after restoring: a compiled model brings optimizer variables)"
        )
    shown = ", ".join(root_children[:4]) + (", ..." if len(root_children) > 4 else "")
    return (
        f"the root is the saved object itself (children {shown}): restore into the same kind of "
        "root, e.g. model.load_weights(OUT) for Keras 2 save_weights, or "
        "tf.train.Checkpoint(root=obj).read(OUT)"
    )


def _plan_object_based(ckpt: m.Checkpoint, kept_keys: set[str]) -> _Plan:
    need_object_graph(ckpt)
    pruned = prune_object_graph(_object_graph_bytes(ckpt), kept_keys)
    for v in ckpt.variables:  # the pruning and the reader agree on every model path
        if v.role == m.ROLE_MODEL and v.graph_path is not None and pruned.paths.get(v.key) != v.graph_path:
            raise CkptError(
                f"{ckpt.path}: internal disagreement on the model path of {v.key!r}: reader "
                f"{v.graph_path!r}, pruned graph {pruned.paths.get(v.key)!r}"
            )
    info = {"source_nodes": pruned.source_nodes, "nodes": pruned.num_nodes, "root_children": list(pruned.root_children)}
    return _Plan(pruned.key_map, pruned.blob, info, [_restore_note(pruned.root_children)])


def _plan_from_metadata(ckpt: m.Checkpoint, kept_keys: set[str], metadata: dict[str, Any]) -> _Plan:
    """A .safetensors written from a TF2 checkpoint: its object graph and keys, checked."""
    where = f"{ckpt.path}: __metadata__"
    try:
        blob = base64.b64decode(str(metadata[META_OBJECT_GRAPH]), validate=True)
        keys = json.loads(str(metadata[META_CHECKPOINT_KEYS]))
    except (binascii.Error, ValueError) as e:
        raise CorruptCheckpointError(f"{where} {META_OBJECT_GRAPH}/{META_CHECKPOINT_KEYS} do not decode: {e}") from None
    if not isinstance(keys, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in keys.items()):
        raise CorruptCheckpointError(f"{where} {META_CHECKPOINT_KEYS} is not a JSON object of names to keys")
    name_of = {v.key: v.name for v in ckpt.variables}
    missing = sorted(m.display_name(name_of[k]) for k in kept_keys if name_of[k] not in keys)
    if missing:
        raise CorruptCheckpointError(f"{where} {META_CHECKPOINT_KEYS} has no checkpoint key for {missing[0]!r}")
    key_map = {k: keys[name_of[k]] for k in kept_keys}
    first_of: dict[str, str] = {}
    for k in sorted(kept_keys, key=lambda k: name_of[k]):  # outputs never merge two inputs silently
        other = first_of.setdefault(key_map[k], k)
        if other != k:
            raise CorruptCheckpointError(
                f"{where} {META_CHECKPOINT_KEYS} maps both {m.display_name(name_of[other])!r} and"
                f" {m.display_name(name_of[k])!r} to the checkpoint key {m.display_name(key_map[k])!r}; refusing to"
                " write one over the other")
    # The graph must name exactly these keys: pruning it with every attribute kept is the check
    # (it parses and bounds the graph, and reports a key it does not reach).
    pruned = prune_object_graph(blob, set(key_map.values()))
    extra = sorted(set(pruned.key_map) - set(key_map.values()))
    if extra or any(old != new for old, new in pruned.key_map.items()):
        raise CorruptCheckpointError(f"{where} {META_OBJECT_GRAPH} does not hold exactly the file's tensors")
    info = {"source_nodes": pruned.source_nodes, "nodes": pruned.num_nodes, "root_children": list(pruned.root_children)}
    notes = [_restore_note(pruned.root_children), "object graph and checkpoint keys from the safetensors __metadata__"]
    return _Plan(key_map, blob, info, notes)


def _plan_name_based(ckpt: m.Checkpoint, kept: list[m.Variable]) -> _Plan:
    """Keys are the variables' names (for a TF1 source, its keys: the same thing)."""
    if "tf-restorable" in capabilities(ckpt.format):
        notes = ["name-based (TF1) checkpoint: restore with tf.compat.v1.train.Saver over the model's variables"]
        if ckpt.format == m.FORMAT_TF_V1:
            notes.append("the V1 table source was rewritten as a V2 bundle (.index + .data)")
        return _Plan({v.key: v.key for v in kept}, None, None, notes)
    keys, note = name_keys(ckpt, kept)
    return _Plan(keys, None, None, [note])


def name_keys(ckpt: m.Checkpoint, kept: list[m.Variable]) -> tuple[dict[str, str], str]:
    """A name-based bundle's keys for a source TF cannot restore (an Orbax step, safetensors,
    torch): each variable's name (``extract`` and ``average`` write such a source so).

    Returns:
        (key -> output key, the note saying how to read the output).

    Raises:
        UsageError: A variable without a name, or two sharing one.
    """
    seen: dict[str, str] = {}
    for v in kept:
        if not v.name:
            raise UsageError(f"{ckpt.path}: a kept variable (key {m.display_name(v.key)!r}) has an empty name")
        if v.name in seen:
            raise UsageError(f"{ckpt.path}: two kept variables share the name {m.display_name(v.name)!r}; a TF bundle"
                             " needs unique keys")
        seen[v.name] = v.key
    note = (f"name-based TF bundle from the {ckpt.format} source, keyed by the variables' names: read it with "
            "tf.train.load_checkpoint(OUT) or map it with tf.compat.v1.train.init_from_checkpoint")
    return {v.key: v.name for v in kept}, note


def _refuse_unwritable(ckpt: m.Checkpoint, kept: list[m.Variable]) -> None:
    """A value to encode (not copied from a bundle) must have a dtype TF bundles hold."""
    can = capabilities(ckpt.format)
    if "tf-restorable" in can and "stored-bytes" in can:
        return  # a TF bundle's values: copied as stored
    for v in kept:
        if v.dtype not in WRITABLE_DTYPES:
            raise UsageError(
                f"{ckpt.path}: '{m.display_name(v.name)}' has dtype {v.dtype}, which a TF bundle cannot hold"
            )


def _output_tensor(ckpt: m.Checkpoint, v: m.Variable, key: str) -> OutputTensor:
    """The kept variable to write: copied byte for byte from a local bundle, else streamed (a
    partitioned V1 variable is written as the same slices)."""
    t = copy_tensor(ckpt, v, key)
    if v.slices and not t.slices:
        value = np.asarray(ckpt.read(v))
        parts = []
        for info in v.slices:
            index = tuple(slice(None) if ln < 0 else slice(st, st + ln) for st, ln in zip(info.starts, info.lengths))
            parts.append((tuple(info.starts), tuple(info.lengths), TensorData.from_array(value[index])))
        t = OutputTensor(key, v.dtype, v.shape, slices=tuple(parts))
    return t


def _is_copy(t: OutputTensor) -> bool:
    datas = [t.data] if t.data is not None else [d for _, _, d in t.slices]
    return all(d.stored is not None for d in datas)


def _stored_equal(written: m.Checkpoint, wv: m.Variable, t: OutputTensor, label: str) -> bool:
    """A copied tensor read back: the same runs (slices in order, dtype, shape, size, crc32c)
    as planned, and the same bytes as the source's."""
    runs = getattr(written.source, "stored_runs", lambda v: None)(wv)
    planned = [((), (), t.data)] if t.data is not None else list(t.slices)
    if not runs or len(runs) != len(planned):
        return False
    for run, (starts, lengths, data) in zip(runs, planned):
        e, s = run.entry, data.stored
        if (tuple(run.starts), tuple(run.lengths)) != (tuple(starts), tuple(lengths)):
            return False
        if (e.dtype, tuple(e.shape), e.size, e.crc32c or 0) != (data.dtype, data.shape, s.size, s.crc32c):
            return False
        if not compare_copy(run.path, e.offset, s, data.dtype, data.shape, label):
            return False
    return True


def _read_back(written: m.Checkpoint, wv: m.Variable) -> Any:
    """A streamed tensor read back whole: numeric values from the data file in blocks (no
    TensorFlow), anything else through the reader."""
    if wv.dtype not in m.NUMERIC_DTYPES or wv.sliced:
        return written.read(wv)
    return gather_blocks(written, wv, STREAM_ELEMENTS, lambda n: VerificationError(
        f"{written.path}: read-back check failed: {wv.key!r} holds {n} of {wv.size} values"))


def write_tf(
    ckpt: m.Checkpoint, tmp: str, keep: tuple[str, ...], max_shard_bytes: int | None, progress: Progress | None
) -> TfOutput:
    """Write the kept variables of ``ckpt`` as a TF bundle at ``tmp`` and read it back.

    Args:
        ckpt: The open source (any format).
        tmp: The temporary output prefix (inside ``_atomic.atomic_prefix``).
        keep: The kept roles.
        max_shard_bytes: Data bytes per shard (None: one shard; 0: one tensor or slice per shard).
        progress: Called as ``progress(done, total, variable)`` for each kept tensor.

    Returns:
        The :class:`TfOutput`.

    Raises:
        UsageError: Names that cannot be keys (empty, duplicated).
        CorruptCheckpointError: The source's object graph (or safetensors metadata) is damaged.
        VerificationError: The output did not read back identical.
    """
    kept_vars = [v for v in ckpt.variables if v.role in keep]
    kept_keys = {v.key for v in kept_vars}
    metadata = ckpt.info.get("metadata") if ckpt.format == SAFETENSORS_FORMAT else None
    if ckpt.info.get("kind") == "tf2-object":
        plan = _plan_object_based(ckpt, kept_keys)
    elif isinstance(metadata, dict) and META_OBJECT_GRAPH in metadata:
        plan = _plan_from_metadata(ckpt, kept_keys, metadata)
    else:
        plan = _plan_name_based(ckpt, kept_vars)
    # An object-based output also keeps the state of kept objects (lookup tables...).
    kept_vars = [v for v in ckpt.variables if v.key in plan.key_map]
    _refuse_unwritable(ckpt, kept_vars)

    planned = [
        ExtractedVariable(v.name, v.key, plan.key_map.get(v.key), v.role, v.shape, v.dtype, v.nbytes)
        for v in ckpt.variables
    ]
    verifier = Verifier(progress, len(kept_vars))
    tensors: dict[str, OutputTensor] = {}
    for v in sorted(kept_vars, key=ckpt.storage_order):  # data-file order: sequential reads
        out_key = plan.key_map[v.key]
        tensors[out_key] = _output_tensor(ckpt, v, out_key)
        verifier.record(out_key, v)
    summary = write_bundle_native(tmp, list(tensors.values()), object_graph=plan.blob, max_shard_bytes=max_shard_bytes)
    copied = [t for t in tensors.values() if _is_copy(t)]

    # Read back through our own reader: keys, roles, the object graph's bytes, every value.
    by_out = {plan.key_map[v.key]: v for v in kept_vars}
    streamed = source_matcher(ckpt)
    with open_checkpoint(tmp) as written:
        if plan.blob is not None:
            if written.info.get("kind") != "tf2-object" or _object_graph_bytes(written) != plan.blob:
                raise VerificationError(f"{tmp}: read-back check failed: the object graph was not written as built")
        out_vars = {v.key: v for v in written.variables}

        def matches(wv: m.Variable, v: m.Variable) -> bool:
            if (wv.dtype, tuple(wv.shape)) != (v.dtype, tuple(v.shape)):
                return False
            t = tensors[wv.key]
            if _is_copy(t):
                return _stored_equal(written, wv, t, v.key)
            return streamed(_read_back(written, wv), v)

        verified = verifier.check(tmp, out_vars, out_vars.__getitem__, matches)
        for v in written.variables:
            if by_out[v.key].role == m.ROLE_MODEL and plan.blob is not None and v.role != m.ROLE_MODEL:
                raise VerificationError(f"{tmp}: read-back check failed: {v.key!r} is no longer a model variable")
    return TfOutput(
        planned=planned,
        verified=verified,
        num_shards=summary.num_shards,
        object_graph=plan.object_graph,
        notes=plan.notes,
        copied=len(copied),
        copied_bytes=summary.copied_bytes,
    )

