"""TF bundle checkpoints: ``PREFIX.index`` + ``PREFIX.data-0000k-of-0000N``.

Listing reads only the ``.index`` file (an SSTable of ``BundleEntryProto`` records keyed by
tensor name; the empty key holds the ``BundleHeaderProto``) and, for TF2 object-based
checkpoints, the object graph (``_CHECKPOINTABLE_OBJECT_GRAPH``, a ``TrackableObjectGraph``
stored as a string tensor). TensorFlow is not imported for that. Values come from
``tf.train.load_checkpoint``, one tensor at a time.

Field numbers used here (tensorflow/core/protobuf/tensor_bundle.proto, tensor_shape.proto,
tensor_slice.proto; the object graph's are in :mod:`.tf_object_graph`):

* BundleHeaderProto: num_shards=1, endianness=2, version=3.
* BundleEntryProto: dtype=1, shape=2, shard_id=3, offset=4, size=5, crc32c=6, slices=7.
* TensorShapeProto: dim=2 (Dim: size=1, name=2), unknown_rank=3.
* TensorSliceProto: extent=1 (Extent: start=1, length=2).

Every entry is checked when the index is parsed (:func:`entry_problem`): one TensorFlow cannot
read (an unknown dtype, a resource handle, a shape it aborts on, a size other than shape x
dtype) is listed, reported by ``verify``, and never handed to TensorFlow. Keys keep their exact
bytes (:func:`~._layout.decode_key`).
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import os
import re
import struct
import threading
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from .. import model as m
from ..errors import (
    CheckpointNotFoundError,
    CkptError,
    CorruptCheckpointError,
    NotACheckpointError,
)
from . import _fs, tf_data
from ._lazymod import lazy_import
from ._layout import INDEX_SUFFIX, data_path, decode_key, encode_key
from ._ordered_code import decode_tensor_name_slice
from ._sstable import iter_table
from ._wire import MalformedError
from .tf_data import DTYPE_NAMES, decode_string_scalar, expected_nbytes, read_raw
from .tf_object_graph import (
    METADATA_LOCAL_NAMES,
    VARIABLE_VALUE,
    GraphNode,
    KeyFacts,
    ObjectPaths,
    analyse_object_graph,
    count_graph_objects,
    is_optimizer_node,
    parse_object_graph,
    walk,
)

# The protobuf runtime loads when an index or object graph is first decoded (see _lazymod).
_protos = lazy_import(__package__ + "._protos")

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "INDEX_SUFFIX",
    "OBJECT_GRAPH_KEY",
    "IndexEntry",
    "BundleIndex",
    "parse_index",
    "read_index",
    "data_path",
    "open_bundle",
    "check_bundle",
    "BundleSource",
    "StoredRun",
    "check_bundle_files",
    "step_from_name",
    "decode_key",
    "encode_key",
    "entry_problem",
    # the object graph (tf_object_graph), for the bundle writers
    "VARIABLE_VALUE",
    "parse_object_graph",
    "count_graph_objects",
    "analyse_object_graph",
    "is_optimizer_node",
    "walk",
    "ObjectPaths",
]

OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
ATTRIBUTES_MARK = "/.ATTRIBUTES/"
OPTIMIZER_SLOT_MARK = "/.OPTIMIZER_SLOT/"
STEP_SUFFIX_RE = re.compile(r"[-_](\d+)$")
# A sharded V1 Saver's file names end in the shard (model.ckpt-7-00000-of-00001), or in TF's
# pattern for all of them in its state file (model.ckpt-7-?????-of-00001).
V1_SHARD_SUFFIX_RE = re.compile(r"-(\d{5}|\?{5})-of-\d{5}$")

# Names of step / counter variables (metadata).
STEP_NAMES = ("global_step", "step")
# TF1 name-based optimizer slots: ``<var>/<OptimizerName>[_N]`` as tf.compat.v1 optimizers name
# them. (Keras optimizer-v2 slots in graph mode live under ``training/`` or ``<Optimizer>/``,
# matched by TF1_OPTIMIZER_NAMES; bare suffixes such as ``/m`` or ``/linear`` are not used,
# since model variables can end that way too.)
TF1_SLOT_RE = re.compile(
    r"/(Adam|Momentum|Ftrl|RMSProp|Adagrad|AdagradDA|Adadelta|Adamax|Nadam|ProximalAdagrad|"
    r"LazyAdam)(_\d+)?$"
    # BERT's AdamWeightDecayOptimizer (google-research/bert optimization.py) and the TF1 ports
    # of it name its slots ``<var>/adam_m`` and ``<var>/adam_v``.
    r"|/adam_[mv]$"
)
TF1_OPTIMIZER_NAMES = re.compile(r"(^|/)(beta1_power|beta2_power)(_\d+)?$|^training/|^(Adam|SGD|RMSprop|Adagrad|Ftrl|Nadam|Adamax|Adadelta|optimizer)(_\d+)?/")
# Largest ``.index`` file read: an index holds ~100 bytes per tensor or slice, so this is far
# beyond any real checkpoint, and it keeps a hostile file (a sparse 3 GB ``.index``) from being read.
MAX_INDEX_BYTES = 256 << 20
MAX_PINNED_SHARDS = 256  # data files held open for a checkpoint resolved from a live directory
KERAS_METRICS_KEY_RE = re.compile(r"(^|/)keras_api/(layer_)?metrics/")
OPTIMIZER_KEY_PART = "optimizer"
KERAS3_MODEL_VARIABLES = "_trainable_variables"

# TensorFlow's limits on a shape (tensorflow/core/framework/tensor_shape.h): it aborts the
# process on more dimensions or on an element count that overflows int64.
MAX_DIMS = 254
MAX_ELEMENTS = (1 << 63) - 1
# The object graph is read whole: far beyond any real one (tens of KB for hundreds of
# variables); tf_object_graph bounds what is decoded.
MAX_OBJECT_GRAPH_BYTES = 32 << 20



@dataclasses.dataclass(frozen=True)
class IndexEntry:
    """One ``BundleEntryProto`` record.

    ``problem`` is set when TensorFlow cannot read the entry (unknown dtype, a resource
    handle, a shape it aborts on, a size that disagrees with shape x dtype): ``(kind, text)``,
    kind ``dtype`` or ``size``. Such an entry is damage for ``verify`` and is never handed to
    TensorFlow.
    """

    key: str
    dtype: str
    shape: tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc32c: int | None
    slices: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()
    problem: tuple[str, str] | None = None


@dataclasses.dataclass(frozen=True)
class BundleIndex:
    """A parsed ``.index`` file.

    Attributes:
        num_shards: From the header.
        entries: Every named tensor, in key order (sliced ones have ``slices`` and no data).
        slice_entries: For each sliced tensor name, its stored slices.
        compressed: True when any block was snappy-compressed.
    """

    num_shards: int
    entries: tuple[IndexEntry, ...]
    slice_entries: dict[str, tuple[tuple[tuple[int, ...], tuple[int, ...], IndexEntry], ...]]


def _shape_of(shape) -> tuple[int, ...]:
    if shape.unknown_rank:
        return ()
    dims = tuple(d.size for d in shape.dim)
    if any(d < 0 for d in dims):
        raise MalformedError(f"negative dimension in shape {dims}")
    return dims


def _parse_shape(buf: bytes) -> tuple[int, ...]:
    """A serialized ``TensorShapeProto`` as a tuple."""
    shape = _protos.TensorShapeProto()
    try:
        shape.ParseFromString(buf)
    except _protos.DecodeError as e:
        raise MalformedError(f"bad TensorShapeProto: {e}") from None
    return _shape_of(shape)


def entry_problem(
    code: int, shape: tuple[int, ...], size: int, *, holds_data: bool
) -> tuple[str, str] | None:
    """Why TensorFlow cannot read an index entry, or None when it can.

    Args:
        code: The ``DataType`` number.
        shape: The declared shape.
        size: The bytes the entry records.
        holds_data: False for the entry of a sliced tensor (its slices hold the bytes).

    Returns:
        ``(kind, problem)`` with kind ``dtype`` or ``size``, or None.
    """
    dtype = DTYPE_NAMES.get(code)
    if dtype is None or code == 0:
        return m.DAMAGE_DTYPE, f"unknown dtype {code}: TensorFlow cannot read it"
    if dtype == "resource":
        return m.DAMAGE_DTYPE, "dtype resource: a resource handle, not a stored value; TensorFlow cannot read it"
    if len(shape) > MAX_DIMS:
        return m.DAMAGE_SIZE, f"shape has {len(shape)} dimensions, more than TensorFlow's {MAX_DIMS}"
    if not _fits_tensorflow(shape):  # multiplied in order, as TensorFlow does: an overflow on the way aborts it too
        return m.DAMAGE_SIZE, f"shape {list(shape)} holds more elements than int64 can count"
    count = 1
    for d in shape:
        count *= d
    if not holds_data:
        return None
    expected = expected_nbytes(dtype, shape)
    if expected is not None and expected != size:
        return m.DAMAGE_SIZE, (f"the index records {size} bytes, a {dtype} tensor of shape {list(shape)}"
                               f" takes {expected}")
    if expected is None and count > size:
        return m.DAMAGE_SIZE, f"the index records {size} bytes, too few for {count} {dtype} elements"
    return None


def _fits_tensorflow(shape: tuple[int, ...]) -> bool:
    """Whether TensorFlow can build this shape (else it aborts the process)."""
    if len(shape) > MAX_DIMS:
        return False
    count = 1
    for d in shape:
        count *= d
        if count > MAX_ELEMENTS:
            return False
    return True


def _parse_entry(key: str, value: bytes, *, stored_slice: bool = False) -> IndexEntry:
    entry = _protos.BundleEntryProto()
    try:
        entry.ParseFromString(value)
    except _protos.DecodeError as e:
        raise MalformedError(f"entry {key!r} is not a BundleEntryProto: {e}") from None
    if entry.offset < 0 or entry.size < 0 or entry.shard_id < 0:
        raise MalformedError(f"entry {key!r} has a negative offset, size or shard")
    shape = _shape_of(entry.shape)
    slices = tuple(
        (
            tuple(e.start for e in sl.extent),
            tuple(e.length if e.HasField("length") else -1 for e in sl.extent),
        )
        for sl in entry.slices
    )
    return IndexEntry(
        key=key,
        dtype=DTYPE_NAMES.get(entry.dtype, f"dtype{entry.dtype}"),
        shape=shape,
        shard_id=entry.shard_id,
        offset=entry.offset,
        size=entry.size,
        crc32c=entry.crc32c if entry.HasField("crc32c") else None,
        slices=slices,
        problem=entry_problem(entry.dtype, shape, entry.size, holds_data=stored_slice or not slices),
    )


# -- OrderedCode, used for the keys of stored slices (tensorflow/core/util/saved_tensor_slice_util)
def _oc_read_num(buf: bytes, pos: int) -> tuple[int, int]:
    if pos >= len(buf):
        raise MalformedError("truncated ordered-code number")
    n = buf[pos]
    if pos + 1 + n > len(buf):
        raise MalformedError("truncated ordered-code number")
    return int.from_bytes(buf[pos + 1 : pos + 1 + n], "big"), pos + 1 + n


def _oc_read_string(buf: bytes, pos: int) -> tuple[bytes, int]:
    out = bytearray()
    while pos < len(buf):
        c = buf[pos]
        if c == 0x00:
            if pos + 1 >= len(buf):
                break
            nxt = buf[pos + 1]
            if nxt == 0x01:
                return bytes(out), pos + 2
            if nxt == 0xFF:
                out.append(0)
                pos += 2
                continue
            raise MalformedError("bad ordered-code escape")
        if c == 0xFF:
            if pos + 1 >= len(buf) or buf[pos + 1] != 0x00:
                raise MalformedError("bad ordered-code escape")
            out.append(0xFF)
            pos += 2
            continue
        out.append(c)
        pos += 1
    raise MalformedError("unterminated ordered-code string")


def _decode_slice_key(key: bytes) -> str:
    """The tensor name of a stored-slice key (``EncodeTensorNameSlice``)."""
    _, pos = _oc_read_num(key, 0)
    name, _ = _oc_read_string(key, pos)
    return decode_key(name)


def _slice_extents(key: bytes) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(starts, lengths) of a stored-slice key, or None when its extents do not decode."""
    try:
        _, starts, lengths = decode_tensor_name_slice(key)
    except MalformedError:
        return None
    return starts, lengths


def _pair_slices(declared, stored) -> tuple:
    """Each declared slice of a tensor with the stored entry keyed by the same extents.

    TensorFlow declares slices in the order they were saved, while the index keys sort by
    start, so the two orders can differ. Stored entries whose keys do not decode are paired,
    in order, with the declared slices left over.
    """
    by_extents: dict = {}
    undecoded = []
    for extents, entry in stored:
        if extents is None or extents in by_extents:
            undecoded.append(entry)
        else:
            by_extents[extents] = entry
    out = []
    for st, ln in declared:
        entry = by_extents.pop((st, ln), None)
        if entry is None and undecoded:
            entry = undecoded.pop(0)
        if entry is not None:
            out.append((st, ln, entry))
    return tuple(out)


def parse_index(data: bytes) -> BundleIndex:
    """Parse the bytes of a ``.index`` file.

    Raises:
        MalformedError: The bytes are not a valid bundle index.
    """
    num_shards = None
    entries: list[IndexEntry] = []
    slices: dict[str, list] = collections.defaultdict(list)
    for raw_key, value in iter_table(data):
        if raw_key == b"":
            header = _protos.BundleHeaderProto()
            try:
                header.ParseFromString(value)
            except _protos.DecodeError:
                raise MalformedError("the header entry is not a BundleHeaderProto (a V1 checkpoint?)") from None
            num_shards = header.num_shards
            if header.endianness != 0:
                raise MalformedError("big-endian bundles are not supported")
            continue
        if raw_key[:1] == b"\x00":
            name = _decode_slice_key(raw_key)
            entry = _parse_entry(name, value, stored_slice=True)
            slices[name].append((_slice_extents(raw_key), entry))
            continue
        entries.append(_parse_entry(decode_key(raw_key), value))
    if num_shards is None:
        raise MalformedError("no header entry")
    if num_shards < 1 or num_shards > 1_000_000:
        raise MalformedError(f"header declares {num_shards} shards")
    for e in entries:
        if e.shard_id >= num_shards:
            raise MalformedError(f"entry {e.key!r} is in shard {e.shard_id} of {num_shards}")
    slice_map = {e.key: _pair_slices(e.slices, slices.get(e.key, [])) for e in entries if e.slices}
    return BundleIndex(num_shards=num_shards, entries=tuple(entries), slice_entries=slice_map)


def read_index(prefix: str) -> BundleIndex:
    """Read and parse ``PREFIX.index``.

    Raises:
        CheckpointNotFoundError: No index file.
        CorruptCheckpointError: The index does not parse.
        UnsafeFileError: The index is not a regular file, or larger than :data:`MAX_INDEX_BYTES`.
    """
    path = prefix + INDEX_SUFFIX
    data = _fs.read_bytes(path, limit=MAX_INDEX_BYTES, what="checkpoint index")
    try:
        return parse_index(data)
    except MalformedError as e:
        raise CorruptCheckpointError(f"{path}: not a valid checkpoint index: {e}") from None


# -- small values read without TensorFlow ---------------------------------------------
def _read_int_scalar(prefix: str, index: BundleIndex, entry: IndexEntry) -> int | None:
    if entry.shape != () or entry.slices or entry.problem is not None:
        return None
    fmt = {"int64": "<q", "int32": "<i", "uint64": "<Q", "uint32": "<I", "float32": "<f", "float64": "<d"}.get(entry.dtype)
    if fmt is None or entry.size != struct.calcsize(fmt):
        return None
    if not _fs.exists(data_path(prefix, entry.shard_id, index.num_shards)):
        return None  # a missing shard is for verify (and for reading its values) to report
    try:
        raw = read_raw(prefix, index.num_shards, entry)
    except CorruptCheckpointError:
        return None  # a short shard, likewise
    value = struct.unpack(fmt, raw)[0]
    return int(value) if value == value else None


def _key_name(key: str) -> str:
    """A readable name derived from a key: ``a/b/.ATTRIBUTES/VARIABLE_VALUE`` -> ``a/b``."""
    if key.endswith(ATTRIBUTES_MARK + VARIABLE_VALUE):
        return key[: -len(ATTRIBUTES_MARK + VARIABLE_VALUE)]
    return key.replace(ATTRIBUTES_MARK, "/")


def _tf1_role(key: str, entry: IndexEntry) -> str:
    base = key.rsplit("/", 1)[-1]
    if base in STEP_NAMES and entry.shape == ():
        return m.ROLE_METADATA
    if TF1_OPTIMIZER_NAMES.search(key) or TF1_SLOT_RE.search(key):
        return m.ROLE_OPTIMIZER
    return m.ROLE_MODEL


def step_from_name(prefix: str) -> int | None:
    """The number at the end of a prefix's file name (``ckpt-10``, ``model.ckpt-100``, ``ckpt_1``;
    ``model.ckpt-7-00000-of-00001``, a sharded V1 file, is step 7)."""
    match = STEP_SUFFIX_RE.search(V1_SHARD_SUFFIX_RE.sub("", _fs.basename(prefix)))
    return int(match.group(1)) if match else None


def _entry_shards(index: BundleIndex, entry: IndexEntry) -> tuple[tuple[int, ...], int, tuple[m.SliceInfo, ...]]:
    if not entry.slices:
        return (entry.shard_id,), entry.size, ()
    infos = tuple(
        m.SliceInfo(starts=st, lengths=ln, shard=se.shard_id, nbytes=se.size)
        for st, ln, se in index.slice_entries.get(entry.key, ())
    )
    return tuple(sorted({s.shard for s in infos})), sum(s.nbytes for s in infos), infos


def _nbytes(entry: IndexEntry, stored: int) -> int:
    """Bytes the value takes: shape x dtype where both make sense (an entry whose recorded size
    is wrong shows what it should take), else what the index records."""
    item = m.ITEMSIZE.get(entry.dtype)
    if item is None or not _fits_tensorflow(entry.shape):
        return stored
    n = item
    for d in entry.shape:
        n *= d
    return n


def _label(variable: m.Variable) -> str:
    """``'name'``, or ``'name' (key 'key')`` when they differ, for messages."""
    name, key = m.display_name(variable.name), m.display_name(variable.key)
    return f"'{name}'" if name == key else f"'{name}' (key '{key}')"


def _keyed_role(key: str, entry: IndexEntry) -> str:
    """The role of a TF2 key when the object graph cannot be read: a guess from the key alone
    (an ``optimizer`` path element or an optimizer slot: optimizer, except a Keras 3
    optimizer's ``_trainable_variables``, which are the model's; Keras metrics, counters at the
    top level and non-variable attributes: metadata; else model)."""
    if OPTIMIZER_SLOT_MARK in key:
        return m.ROLE_OPTIMIZER
    if not key.endswith(ATTRIBUTES_MARK + VARIABLE_VALUE) or KERAS_METRICS_KEY_RE.search(key):
        return m.ROLE_METADATA
    parts = _key_name(key).split("/")
    if KERAS3_MODEL_VARIABLES in parts[:-1]:
        return m.ROLE_MODEL  # a Keras 3 optimizer's list of the model's trainable variables
    if OPTIMIZER_KEY_PART in parts[:-1]:
        return m.ROLE_OPTIMIZER
    if len(parts) == 1 and parts[0] in METADATA_LOCAL_NAMES:
        return m.ROLE_METADATA
    return m.ROLE_MODEL


def _read_object_graph(prefix: str, index: BundleIndex, entry: IndexEntry) -> list[GraphNode]:
    """The object graph's nodes.

    Raises:
        MalformedError: The entry, its bytes or the graph are damaged, or its shard is missing.
        CheckpointNotFoundError: The shard exists but cannot be read (permission denied).
    """
    if entry.problem is not None:
        raise MalformedError(entry.problem[1])
    if entry.dtype != "string" or entry.shape != () or entry.slices:
        raise MalformedError(f"the entry is a {entry.dtype} tensor of shape {list(entry.shape)}, not a scalar string")
    path = data_path(prefix, entry.shard_id, index.num_shards)
    if not _fs.exists(path):
        raise MalformedError("the data shard is missing")
    try:
        raw = read_raw(prefix, index.num_shards, entry, limit=MAX_OBJECT_GRAPH_BYTES)
    except CorruptCheckpointError as e:
        raise MalformedError(str(e).removeprefix(f"{path}: ")) from None
    return parse_object_graph(decode_string_scalar(raw))


def _unreadable(index: BundleIndex) -> dict[str, str]:
    """Keys TensorFlow cannot read (see :attr:`IndexEntry.problem`), with why."""
    out = {}
    for e in index.entries:
        if e.problem is not None:
            out[e.key] = e.problem[1]
        elif e.slices:
            bad = next((se.problem[1] for *_, se in index.slice_entries.get(e.key, ()) if se.problem), None)
            if bad is not None:
                out[e.key] = f"a stored slice: {bad}"
    return out


def build_variables(prefix: str, index: BundleIndex) -> tuple[list[m.Variable], dict[str, object]]:
    """The variables of a bundle, with names and roles, and header facts.

    An object graph that cannot be read (missing or short shard, bytes that do not parse, a
    hostile shape) does not stop the listing: names and roles then come from the keys, and
    ``info["warnings"]`` says so. Entries TensorFlow cannot read are listed, named in
    ``info["unreadable"]`` (key -> why) and in a warning.

    Returns:
        (variables in key order, info dict with ``kind``, ``object_graph``, and when there is
        something to say ``warnings`` and ``unreadable``).

    Raises:
        CheckpointNotFoundError: The object graph's shard exists but cannot be read.
    """
    info: dict[str, object] = {}
    warnings: list[str] = []
    facts: dict[str, KeyFacts] = {}
    graph_entry = next((e for e in index.entries if e.key == OBJECT_GRAPH_KEY), None)
    graph_read = False
    if graph_entry is not None:
        info["kind"] = "tf2-object"
        graph_info: dict[str, object] = {"nodes": None, "shard": graph_entry.shard_id, "nbytes": graph_entry.size}
        try:
            nodes = _read_object_graph(prefix, index, graph_entry)
            facts = analyse_object_graph(nodes)
            graph_info["nodes"] = len(nodes)
            graph_read = True
        except MalformedError as e:
            shard = data_path(prefix, graph_entry.shard_id, index.num_shards)
            graph_info["error"] = str(e)
            warnings.append(
                f"{shard}: the object graph ({OBJECT_GRAPH_KEY}) cannot be read: {e}; names and roles"
                " below come from the keys (`ckptinspect verify` checks the files)"
            )
        info["object_graph"] = graph_info
    else:
        info["kind"] = "tf1-name"

    variables = []
    names_seen: collections.Counter[str] = collections.Counter()
    pending = []
    for entry in index.entries:
        if entry.key == OBJECT_GRAPH_KEY:
            continue
        fact = facts.get(entry.key)
        if graph_read:
            role = fact.role if fact else (m.ROLE_OPTIMIZER if OPTIMIZER_SLOT_MARK in entry.key else m.ROLE_METADATA)
            if role == m.ROLE_MODEL and fact.root_child and entry.shape == () and entry.dtype in m.INTEGER_DTYPES:
                role = m.ROLE_METADATA  # a counter tracked by the root (episode_counter, epoch...)
            name = (fact.name if fact else None) or _key_name(entry.key)
        elif graph_entry is not None:
            role = _keyed_role(entry.key, entry)
            name = _key_name(entry.key)
        else:
            role = _tf1_role(entry.key, entry)
            name = entry.key
        names_seen[name] += 1
        pending.append((entry, fact, role, name))
    for entry, fact, role, name in pending:
        if names_seen[name] > 1:
            name = _key_name(entry.key)
        shards, stored, slices = _entry_shards(index, entry)
        variables.append(
            m.Variable(
                key=entry.key,
                name=name,
                shape=entry.shape,
                dtype=entry.dtype,
                nbytes=_nbytes(entry, stored),
                shards=shards,
                role=role,
                slices=slices,
                graph_path=fact.graph_path if fact else None,
            )
        )
    unreadable = {k: v for k, v in _unreadable(index).items() if k != OBJECT_GRAPH_KEY}
    if unreadable:
        info["unreadable"] = unreadable
        index_path = prefix + INDEX_SUFFIX
        names = {v.key: v.name for v in variables}
        warnings += [f"{index_path}: '{m.display_name(names[k])}': {why} (`ckptinspect verify` reports it)"
                     for k, why in unreadable.items()]
    if warnings:
        info["warnings"] = warnings
    return variables, info


def _step_candidates(prefix: str, index: BundleIndex, variables: Iterable[m.Variable]) -> dict[str, int]:
    """Every step-like number of a checkpoint, best first."""
    by_key = {e.key: e for e in index.entries}
    found: dict[str, int] = {}
    counters: dict[str, int] = {}
    for v in variables:
        if v.shape != () or v.sliced:
            continue
        base = _key_name(v.key).rsplit("/", 1)[-1]
        label = None
        if v.role == m.ROLE_METADATA and base in STEP_NAMES:
            label, target = f"variable:{_key_name(v.key)}", found
        elif v.role == m.ROLE_OPTIMIZER and base in ("iter", "_iterations", "iterations", "iteration"):
            label, target = f"optimizer:{_key_name(v.key)}", counters
        elif base == "save_counter":
            label, target = "save_counter", counters
        if label is not None:
            value = _read_int_scalar(prefix, index, by_key[v.key])
            if value is not None:
                target[label] = value
    out = dict(found)
    from_name = step_from_name(prefix)
    if from_name is not None:
        out["filename"] = from_name
    out.update(counters)
    return out


@dataclasses.dataclass(frozen=True)
class StoredRun:
    """One stored run of a tensor's bytes (the whole tensor, or one stored slice), as a
    byte-exact copy needs it.

    Attributes:
        path: The data file holding it.
        entry: Its index entry (dtype, stored shape, offset, size, masked crc32c).
        starts: For a stored slice, its start in each dimension; empty otherwise.
        lengths: For a stored slice, its length in each dimension (``-1``: the whole
            dimension); empty otherwise.
    """

    path: str
    entry: IndexEntry
    starts: tuple[int, ...] = ()
    lengths: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class StoredSliceBlocks:
    """One stored slice of a sliced variable, streamed from its data file.

    Attributes:
        starts: Its start in each dimension.
        lengths: Its length in each dimension (``-1``: the whole dimension).
        shape: The slice's own shape.
        blocks: ``blocks()`` yields the slice's flattened values (C order of the slice) in
            blocks, crc32c-checked against the index (a mismatch raises after the last
            block); a block is a view of a buffer the next one reuses.
    """

    starts: tuple[int, ...]
    lengths: tuple[int, ...]
    shape: tuple[int, ...]
    blocks: Callable[[], Iterator[np.ndarray]]


def stored_slice_blocks(checkpoint: m.Checkpoint, variable: m.Variable, elements: int) -> tuple[StoredSliceBlocks, ...] | None:
    """The stored slices of a sliced (partitioned) variable of a local TF bundle, each streamed
    in blocks of at most ``elements`` elements without TensorFlow, in declared order.

    Returns:
        The slices, or None when ``variable`` is not sliced, the checkpoint is not a local TF
        bundle, or a slice is not a plain numeric array.
    """
    source = checkpoint.source
    if not isinstance(source, BundleSource):
        return None
    return source.slice_blocks(variable, elements)


def stream_blocks(checkpoint: m.Checkpoint, variable: m.Variable, elements: int) -> Iterator[np.ndarray] | None:
    """One variable of a local TF bundle in blocks, as :meth:`~ckptinspect.model.Checkpoint.iter_blocks`
    gives them (``elements`` at a time, each a view of a buffer the next block reuses, checksum
    checked after the last), read without TensorFlow, safe to run in several threads at once
    (several per thread too, each with its own buffer).

    Returns:
        The blocks, or None when the value is not a plain run of bytes of a local bundle
        (another format, a sliced variable, a remote file): read it with ``iter_blocks`` then.

    Raises:
        CorruptCheckpointError: An entry TensorFlow cannot read (and, from the iterator, a
            truncated file or a checksum mismatch).
    """
    source = checkpoint.source
    if not isinstance(source, BundleSource):
        return None
    return source.raw_blocks(variable, elements)


def object_graph_bytes(checkpoint: m.Checkpoint) -> bytes | None:
    """The exact bytes of a TF bundle's serialized object graph (``_CHECKPOINTABLE_OBJECT_GRAPH``),
    read without TensorFlow; None for a name-based (TF1) bundle or any other format."""
    source = checkpoint.source
    return source.object_graph() if isinstance(source, BundleSource) else None


def check_bundle_files(prefix: str, num_shards: int | None = None) -> None:
    """Refuse a bundle whose index or data shards are FIFOs, devices or other special files.

    TensorFlow's reader (and ``RestoreV2``) opens them by name and would block forever on a
    FIFO or read ``/dev/zero`` without end, so they are checked before TensorFlow is handed
    the prefix. Missing shards are left for the reader to report.

    Args:
        prefix: The bundle prefix.
        num_shards: From its index; None checks every ``PREFIX.data-*-of-*`` on disk.

    Raises:
        UnsafeFileError: A special file; CheckpointNotFoundError: no index.
    """
    if _fs.is_remote(prefix):
        return
    _fs.check_regular(prefix + INDEX_SUFFIX)
    if num_shards is None:
        paths = glob.glob(glob.escape(prefix) + ".data-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]")
    else:
        paths = [data_path(prefix, shard, num_shards) for shard in range(num_shards)]
    for path in paths:
        if os.path.lexists(path):
            _fs.check_regular(path)


class BundleSource(m.BaseSource):
    """Values of a bundle: whole tensors through TensorFlow's reader (opened on first use);
    streamed blocks of unsliced numeric tensors straight from the local data files, crc32c
    checked, without TensorFlow.

    Safe for concurrent reads of different variables: streamed blocks are positioned reads
    into buffers of their own (:class:`~._fs.DataFiles` is thread-safe), and every use of
    TensorFlow's reader is serialised by a lock (a failed lookup resets the shared reader).
    """

    concurrent_reads = True

    def __init__(self, prefix: str, index: BundleIndex):
        self.prefix = prefix
        self.num_shards = index.num_shards
        self._entries = {e.key: e for e in index.entries}
        self._slices = index.slice_entries
        self._unreadable = _unreadable(index)
        # TensorFlow's CheckpointReader builds every entry's shape when it opens and aborts the
        # process on a shape it cannot hold; RestoreV2 looks up one key only.
        stored = [se for slices in index.slice_entries.values() for *_, se in slices]
        self._reader_aborts = any(not _fits_tensorflow(e.shape) for e in (*index.entries, *stored))
        self._reader = None
        self._files = _fs.DataFiles()
        self._pinned = False
        self._reader_lock = threading.RLock()

    def _check_readable(self, variable: m.Variable) -> None:
        """Refuse, before TensorFlow sees the key, an entry it cannot read: it would abort the
        process (unknown dtype, an element count that overflows) or read the wrong bytes."""
        why = self._unreadable.get(variable.key)
        if why is not None:
            raise CorruptCheckpointError(
                f"{self.prefix}{INDEX_SUFFIX}: cannot read {_label(variable)}: {why} (`ckptinspect verify` reports it)"
            )

    def _open(self):
        if self._reader is None:
            from .._tf import load_checkpoint  # noqa: PLC0415 - TensorFlow only for values

            check_bundle_files(self.prefix, self.num_shards)  # TensorFlow's reader would block on a FIFO
            self._reader = load_checkpoint(self.prefix)
        return self._reader

    def pin(self) -> None:
        """Hold the data shards open from now on (up to :data:`MAX_PINNED_SHARDS`), so the
        checkpoint stays readable if it is deleted meanwhile (a CheckpointManager rotating it
        out of its directory): streamed reads use the open files, and a whole-tensor read that
        TensorFlow can no longer do by name falls back to them."""
        if _fs.is_remote(self.prefix) or self.num_shards > MAX_PINNED_SHARDS:
            return
        for path in tf_data.shard_files(self.prefix, self.num_shards):
            try:
                self._files.pin(path)
            except CkptError:
                pass  # missing or special: reported by whatever reads it
        self._pinned = True

    def read(self, variable: m.Variable) -> np.ndarray:
        with self._reader_lock:
            return self._read(variable)

    def _read(self, variable: m.Variable) -> np.ndarray:
        from .._tf import get_tensor  # noqa: PLC0415

        self._check_readable(variable)
        if self._reader_aborts:
            return self._restore(variable)
        try:
            return get_tensor(self._open(), self.prefix, variable.key)
        except Exception:
            # TF's BundleReader keeps the status of a failed sliced read and aborts the whole
            # process (a C++ CHECK) on its next lookup: never reuse a reader after a failure.
            self._reader = None
            if not (self._pinned and self._vanished()):
                raise
        import numpy as np  # noqa: PLC0415, F811 - loaded with tf_data already

        raw = self._raw_entry(variable)
        if raw is None:
            strings = self._pinned_strings(variable)
            if strings is not None:
                return strings
            directory = _fs.dirname(self.prefix) or "."
            raise CheckpointNotFoundError(
                f"{self.prefix}: deleted while being read (rotated out by the process saving into {directory});"
                " run the command again"
            ) from None
        out = np.empty(variable.size, dtype=raw[2])
        done = 0
        for block in tf_data.iter_raw_blocks(raw[0], raw[1], raw[2], 1 << 20, self._files):
            out[done : done + block.size] = block
            done += block.size
        return out.reshape(variable.shape)

    def _vanished(self) -> bool:
        """Whether the index or a data shard is gone from its path now."""
        return not _fs.exists(self.prefix + INDEX_SUFFIX) or not all(
            _fs.exists(p) for p in tf_data.shard_files(self.prefix, self.num_shards))

    def _restore(self, variable: m.Variable) -> np.ndarray:
        """One value through ``RestoreV2`` (which reads one entry, not the whole index)."""
        import numpy as np  # noqa: PLC0415

        from .tf_writer import restore_tensor  # noqa: PLC0415 - TensorFlow only for values

        value = restore_tensor(self.prefix, variable.key, variable.dtype).numpy()
        if isinstance(value, bytes):  # a scalar string: keep trailing NUL bytes (see _tf.get_tensor)
            out = np.empty((), dtype=object)
            out[()] = value
            return out
        return np.asarray(value)

    def _pinned_strings(self, variable: m.Variable) -> np.ndarray | None:
        """An unsliced string tensor read from the held-open data file, after TensorFlow could
        not read it by name (its files deleted): the stored layout (varint64 lengths, their
        masked crc32c, the bytes) checked against the entry's checksum and decoded; None when
        the entry is not such a tensor or the held-open file does not hold it.

        Raises:
            CorruptCheckpointError: The bytes do not match the recorded checksum or layout.
        """
        import numpy as np  # noqa: PLC0415, F811 - loaded with tf_data already

        entry = self._entries.get(variable.key)
        if entry is None or entry.slices or entry.problem is not None or entry.dtype != "string":
            return None
        path = data_path(self.prefix, entry.shard_id, self.num_shards)
        size = self._files.size(path)
        if size is None or size < entry.offset + entry.size:
            return None
        buf = bytearray(entry.size)
        if self._files.pread_into(path, memoryview(buf), entry.offset) != entry.size:
            return None
        raw = bytes(buf)
        count = variable.size
        try:
            actual = tf_data.tensor_crc32c("string", tuple(entry.shape), raw)
        except MalformedError as e:
            raise CorruptCheckpointError(f"{path}: cannot read {_label(variable)}: {e}") from None
        if entry.crc32c is not None and actual != entry.crc32c:
            raise CorruptCheckpointError(f"{path}: {_label(variable)}: {tf_data.crc_mismatch(entry.crc32c, actual)}")
        out = np.empty(count, dtype=object)
        out[:] = tf_data.decode_string_tensor(raw, count)
        return out.reshape(variable.shape)

    def _raw_entry(self, variable: m.Variable) -> tuple[str, IndexEntry, np.dtype] | None:
        """Where ``variable``'s bytes can be read directly (ranged reads for a remote one): an
        unsliced tensor of a plain numeric dtype whose shard is long enough (else the TF reader
        reports the problem)."""
        entry = self._entries.get(variable.key)
        if entry is None or entry.slices or entry.problem is not None:
            return None
        dtype = m.numpy_dtype(entry.dtype)
        if dtype is None or entry.size != variable.size * dtype.itemsize:
            return None
        path = data_path(self.prefix, entry.shard_id, self.num_shards)
        size = self._files.size(path)
        if size is None or size < entry.offset + entry.size:
            return None
        return path, entry, dtype

    def iter_blocks(self, variable: m.Variable, elements: int) -> Iterator[np.ndarray]:
        self._check_readable(variable)
        raw = self._raw_entry(variable)
        if raw is None:
            return super().iter_blocks(variable, elements)
        return tf_data.iter_raw_blocks(raw[0], raw[1], raw[2], elements, self._files)

    def raw_blocks(self, variable: m.Variable, elements: int) -> Iterator[np.ndarray] | None:
        """``variable``'s blocks straight from its local data file (see :func:`stream_blocks`),
        or None when it has no plain local run of bytes (sliced, remote)."""
        self._check_readable(variable)
        raw = self._raw_entry(variable)
        if raw is None or _fs.is_remote(raw[0]):
            return None
        return tf_data.iter_raw_blocks(raw[0], raw[1], raw[2], elements, self._files)

    def stored_runs(self, variable: m.Variable) -> tuple[StoredRun, ...] | None:
        """Where a variable's bytes lie, for byte-exact copies: one run for a whole tensor,
        one per stored slice (in declared order) for a sliced one.

        Returns:
            The runs, or None when they cannot be copied directly (a remote checkpoint, a key
            the index does not hold, slices declared but not stored).
        """
        self._check_readable(variable)  # bytes TensorFlow cannot read are not copied on
        entry = self._entries.get(variable.key)
        if entry is None or _fs.is_remote(self.prefix):
            return None
        if not entry.slices:
            return (StoredRun(data_path(self.prefix, entry.shard_id, self.num_shards), entry),)
        stored = self._slices.get(entry.key, ())
        if len(stored) != len(entry.slices):
            return None
        return tuple(
            StoredRun(data_path(self.prefix, se.shard_id, self.num_shards), se, st, ln) for st, ln, se in stored
        )

    def slice_blocks(self, variable: m.Variable, elements: int) -> tuple[StoredSliceBlocks, ...] | None:
        """A sliced variable's stored slices, each streamed on its own (see
        :func:`stored_slice_blocks`); None when it is not sliced or cannot be streamed."""
        runs = self.stored_runs(variable)
        if not runs or not runs[0].starts:
            return None
        out = []
        for run in runs:
            entry = run.entry
            dtype = m.numpy_dtype(entry.dtype)
            count = 1
            for d in entry.shape:
                count *= d
            if dtype is None or entry.problem is not None or entry.size != count * dtype.itemsize:
                return None
            out.append(StoredSliceBlocks(
                run.starts, run.lengths, entry.shape,
                lambda run=run, dtype=dtype: tf_data.iter_raw_blocks(run.path, run.entry, dtype, elements, self._files),
            ))
        return tuple(out)

    def storage_order(self, variable: m.Variable) -> tuple:
        entry = self._entries.get(variable.key)
        if entry is None or entry.slices:
            return (variable.shards[0] if variable.shards else 0, 0)
        return (entry.shard_id, entry.offset)

    def files(self) -> tuple[str, ...]:
        return (self.prefix + INDEX_SUFFIX, *tf_data.shard_files(self.prefix, self.num_shards))

    def object_graph(self) -> bytes | None:
        """The serialized object graph (exact bytes), or None for a name-based checkpoint."""
        entry = self._entries.get(OBJECT_GRAPH_KEY)
        if entry is None:
            return None
        return decode_string_scalar(read_raw(self.prefix, self.num_shards, entry, limit=MAX_OBJECT_GRAPH_BYTES))

    def close(self) -> None:
        self._reader = None
        self._files.close()


def open_bundle(
    prefix: str,
    *,
    format: str = m.FORMAT_TF_BUNDLE,
    checkpoints: tuple[m.RetainedCheckpoint, ...] = (),
    extra_info: dict | None = None,
) -> m.Checkpoint:
    """Open a TF bundle checkpoint by prefix (index only; values on demand).

    Raises:
        CheckpointNotFoundError: No ``PREFIX.index``.
        CorruptCheckpointError: The index or object graph does not parse.
    """
    if _fs.isdir(prefix + INDEX_SUFFIX):
        raise NotACheckpointError(f"{prefix}{INDEX_SUFFIX}: is a directory, not an index file")
    index = read_index(prefix)
    variables, info = build_variables(prefix, index)
    candidates = _step_candidates(prefix, index, variables)
    source = next(iter(candidates), None)
    step = candidates[source] if source else None
    if candidates:
        info["step_candidates"] = candidates
    if extra_info:
        info.update(extra_info)
    return m.Checkpoint(
        path=prefix,
        format=format,
        variables=tuple(variables),
        step=step,
        step_source=source,
        num_shards=index.num_shards,
        checkpoints=checkpoints,
        info=info,
        source=BundleSource(prefix, index),
    )


def check_bundle(prefix: str, *, format: str = m.FORMAT_TF_BUNDLE) -> tf_data.BundleCheck:  # noqa: A002
    """Plan the check of one bundle (``verify``): index parsed, shards stat'ed.

    A damaged index is a result, not an error; names come from the object graph when it
    parses (the object graph itself may be what is damaged). Entries TensorFlow cannot read
    (:attr:`IndexEntry.problem`) are damage, named, and their bytes are not read.

    Raises:
        CheckpointNotFoundError: The index (or a data shard) exists but cannot be read.
    """
    step = step_from_name(prefix)
    try:
        index = read_index(prefix)
    except CorruptCheckpointError as e:
        return tf_data.damaged_check(prefix, format, step, str(e))
    try:
        variables, _ = build_variables(prefix, index)
        names = {v.key: v.name for v in variables}
        candidates = _step_candidates(prefix, index, variables)
        step = next(iter(candidates.values()), step)
    except (CkptError, MalformedError, OSError):
        names = {}
    return tf_data.plan_check(prefix, index, names, format=format, step=step,
                              extra_damage=_entry_damage(prefix, index, names))


def _entry_damage(prefix: str, index: BundleIndex, names: dict[str, str]) -> list[m.Damage]:
    """One :class:`~ckptinspect.model.Damage` per entry (or stored slice) TensorFlow cannot read."""
    out = []

    def damage(e: IndexEntry, key: str, slice_text: str | None = None) -> m.Damage:
        kind, problem = e.problem
        return m.Damage(
            key=key, name=names.get(key, _key_name(key)), file=data_path(prefix, e.shard_id, index.num_shards),
            kind=kind, problem=problem, shard=e.shard_id, offset=e.offset, size=e.size, slice=slice_text,
        )

    for e in index.entries:
        if e.problem is not None:
            out.append(damage(e, e.key))
        for starts, lengths, se in index.slice_entries.get(e.key, ()):
            if se.problem is not None:
                out.append(damage(se, e.key, tf_data.fmt_slice(starts, lengths)))
    return out
