"""Planning a TF bundle before its bytes are written: the stored runs and the index.

:func:`plan_runs` checks what :func:`~.bundle_writer.write_bundle_native` was given (keys,
dtypes, shapes, slices) and lays it out as :class:`Run` entries in data-file order (the TF2
object graph last); :func:`assign_shards` fills the shards in turn as ``MaxShardSizePolicy``
does. Once the runs are written, :func:`entry_bytes` serializes each one's ``BundleEntryProto``
as TensorFlow's proto3 code does, and :func:`index_bytes` builds the ``.index`` table with the
``BundleHeaderProto`` under the empty key.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

import numpy as np

from ....errors import UsageError
from ..index import OBJECT_GRAPH_KEY
from ..._lazymod import lazy_import
from ..ordered_code import encode_tensor_name_slice
from .table_builder import TableBuilder
from .tensors import DTYPE_ENUMS, OutputTensor, TensorData
from ..data import fmt_slice

# The protobuf runtime loads when an index or object graph is first decoded (see _lazymod).
_protos = lazy_import(__package__.rpartition(".")[0] + ".protos")

BUNDLE_VERSION = b"\x08\x01"  # VersionDef {producer: kTensorBundleVersion = 1}, min_consumer 0


@dataclasses.dataclass
class Run:
    """One stored run of bytes: its index key, its value, and where it was written (filled in
    by the writer)."""

    key: bytes
    data: TensorData
    label: str  # for messages: the tensor key, with the slice
    shard: int = 0
    offset: int = 0
    crc32c: int = 0


def _check_key(key: str, seen: set[bytes]) -> bytes:
    if not isinstance(key, str) or not key:
        raise UsageError(f"a tensor key must be a non-empty string. Received: {key!r}")
    raw = key.encode("utf-8", "surrogateescape")  # a key read as surrogate escapes: its bytes
    if raw[:1] == b"\x00":
        raise UsageError(f"tensor key {key!r} starts with a zero byte (reserved for stored slices)")
    if raw in seen:
        raise UsageError(f"tensor key {key!r} is given twice")
    seen.add(raw)
    return raw


def _slice_shape(key: str, shape: tuple[int, ...], starts: tuple[int, ...], lengths: tuple[int, ...]) -> tuple[int, ...]:
    if len(starts) != len(shape) or len(lengths) != len(shape):
        raise UsageError(f"slice {fmt_slice(starts, lengths)} of {key!r} does not match its shape {list(shape)}")
    out = []
    for dim, st, ln in zip(shape, starts, lengths):
        if ln == -1:
            if st != 0:
                raise UsageError(f"slice {fmt_slice(starts, lengths)} of {key!r}: a whole dimension starts at 0")
            out.append(dim)
        elif st < 0 or ln < 0 or st + ln > dim:
            raise UsageError(f"slice {fmt_slice(starts, lengths)} of {key!r} lies outside its shape {list(shape)}")
        else:
            out.append(ln)
    return tuple(out)


def _is_full(shape: tuple[int, ...], starts: tuple[int, ...], lengths: tuple[int, ...]) -> bool:
    """TensorFlow's ``IsFullSlice``: every dimension whole (a full slice is saved as a plain tensor)."""
    return all(ln == -1 or (st == 0 and ln == d) for d, st, ln in zip(shape, starts, lengths))


def _shape_proto(shape_msg: Any, shape: tuple[int, ...]) -> None:
    shape_msg.SetInParent()  # TensorShape::AsProto(mutable_shape()): always present
    for d in shape:
        dim = shape_msg.dim.add()
        if d:
            dim.size = d


def entry_bytes(dtype: str, shape: tuple[int, ...], shard: int, offset: int, size: int, crc: int) -> bytes:
    """The serialized ``BundleEntryProto`` of a run written whole."""
    entry = _protos.BundleEntryProto()
    entry.dtype = DTYPE_ENUMS[dtype]
    _shape_proto(entry.shape, shape)
    # proto3: zero values are not serialized
    if shard:
        entry.shard_id = shard
    if offset:
        entry.offset = offset
    if size:
        entry.size = size
    if crc:
        entry.crc32c = crc
    return entry.SerializeToString()


def _sliced_entry_bytes(t: OutputTensor) -> bytes:
    entry = _protos.BundleEntryProto()
    entry.dtype = DTYPE_ENUMS[t.dtype]
    _shape_proto(entry.shape, t.shape)
    for starts, lengths, _ in t.slices:
        proto = entry.slices.add()
        for st, ln in zip(starts, lengths):
            extent = proto.extent.add()
            if ln != -1:  # TensorSlice::AsProto records only the partial dimensions
                if st:
                    extent.start = st
                extent.length = ln  # in a oneof: serialized even when 0
    return entry.SerializeToString()


def plan_runs(tensors: Iterable[OutputTensor], object_graph: bytes | None) -> tuple[list[Run], dict[bytes, bytes]]:
    """The stored runs in write order (the object graph last), and the index entries known
    before writing (sliced tensors' full entries)."""
    runs: list[Run] = []
    fixed: dict[bytes, bytes] = {}
    seen: set[bytes] = set()
    if object_graph is not None:
        tensors = [*tensors, OutputTensor.from_array(OBJECT_GRAPH_KEY, np.array(object_graph, dtype=object))]
    for t in tensors:
        if not isinstance(t, OutputTensor):
            raise UsageError(f"write_bundle_native takes OutputTensor items. Received: {type(t).__name__}")
        raw = _check_key(t.key, seen)
        if t.dtype not in DTYPE_ENUMS:
            raise UsageError(f"{t.key!r}: unknown TF dtype {t.dtype!r}")
        slices = t.slices
        if slices and t.data is not None:
            raise UsageError(f"{t.key!r}: give either the whole value or its slices, not both")
        if len(slices) == 1 and _is_full(t.shape, *slices[0][:2]):
            _slice_shape(t.key, t.shape, *slices[0][:2])
            t = dataclasses.replace(t, data=slices[0][2], slices=())
            slices = ()
        if not slices:
            if t.data is None:
                raise UsageError(f"{t.key!r}: no value and no slices")
            if (t.data.dtype, t.data.shape) != (t.dtype, t.shape):
                raise UsageError(
                    f"{t.key!r}: declared {t.dtype} {list(t.shape)}, its value is {t.data.dtype} {list(t.data.shape)}"
                )
            runs.append(Run(raw, t.data, t.key))
            continue
        extents = set()
        for starts, lengths, data in slices:
            starts, lengths = tuple(starts), tuple(lengths)
            want = _slice_shape(t.key, t.shape, starts, lengths)
            label = f"{t.key}{fmt_slice(starts, lengths)}"
            if _is_full(t.shape, starts, lengths):
                raise UsageError(f"{label}: a slice covering the whole tensor cannot be one of several slices")
            if (starts, lengths) in extents:
                raise UsageError(f"{label}: given twice")
            extents.add((starts, lengths))
            if (data.dtype, data.shape) != (t.dtype, want):
                raise UsageError(f"{label}: the slice is {t.dtype} {list(want)}, its value is {data.dtype} {list(data.shape)}")
            runs.append(Run(encode_tensor_name_slice(t.key, starts, lengths), data, label))
        fixed[raw] = _sliced_entry_bytes(t)
    return runs, fixed


def assign_shards(runs: list[Run], max_shard_bytes: int | None) -> int:
    """Fill shards in turn up to ``max_shard_bytes`` (a bigger run gets its own shard; empty
    runs stay in the current one). Returns the number of shards."""
    shard, used = 0, 0
    for run in runs:
        size = run.data.nbytes
        if max_shard_bytes is not None and used and size and used + size > max_shard_bytes:
            shard, used = shard + 1, 0
        run.shard = shard
        used += size
    return shard + 1


def index_bytes(entries: Mapping[bytes, bytes], num_shards: int, block_size: int) -> bytes:
    """The ``.index`` table: the header under the empty key, then ``entries`` in key order."""
    header = _protos.BundleHeaderProto()
    header.num_shards = num_shards
    header.version = BUNDLE_VERSION
    table = TableBuilder(block_size=block_size)
    table.add(b"", header.SerializeToString())
    for key in sorted(entries):
        table.add(key, entries[key])
    return table.finish()
