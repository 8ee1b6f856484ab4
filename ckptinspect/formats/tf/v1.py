"""TF V1 checkpoints: one SSTable of ``SavedTensorSlices`` (TensorSliceWriter), no ``.index``.

Written by the TF1 ``Saver`` with ``write_version=V1`` (``export-00000-of-00001`` files).
The empty key holds ``SavedTensorSlices.meta``: a ``SavedTensorSliceMeta`` listing every
tensor's name, shape, dtype and slices. Field numbers (saved_tensor_slice.proto):
SavedTensorSlices: meta=1, data=2. SavedTensorSliceMeta: tensor=1. SavedSliceMeta: name=1,
shape=2, type=3, slice=4.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from ... import model as m
from ...errors import CkptError, CorruptCheckpointError
from .. import _fs
from .._readcheck import Check
from .index import IndexEntry, parse_shape
from .variables import tf1_role
from .sstable import iter_table
from .wire import MalformedError, first, parse_message, read_varint
from .ordered_code import decode_tensor_name_slice
from .data import DTYPE_NAMES

if TYPE_CHECKING:
    import numpy as np

__all__ = ["is_v1_table", "iter_v1_table", "open_v1", "check_v1"]


def is_v1_table(data: bytes | str) -> bool:
    """True when a table's empty key holds ``SavedTensorSlices`` with a meta message.

    Args:
        data: The table's bytes, or the path of a table file (then only its footer, index
            block and first data block are read).
    """
    try:
        if isinstance(data, str):
            with _fs.RangeReader(data) as reader:
                return _first_is_meta(reader)
        return _first_is_meta(data)
    except (MalformedError, OSError, CkptError):
        return False


def _first_is_meta(source) -> bool:
    # Content sniffing ignores block checksums: a damaged V1 file is still a V1 file, and
    # open_v1 / verify report the damage.
    for key, value in iter_table(source, check_crc=False):
        if key == b"":
            fields = parse_message(value)
            return isinstance(first(fields, 1), bytes)
        return False
    return False


def iter_v1_table(path: str, check_crc: bool = True) -> Iterator[tuple[bytes, bytes]]:
    """Every (key, value) of a V1 table file, read one block at a time (memory: one block).

    Raises:
        CheckpointNotFoundError, UnsafeFileError: Missing, unreadable or not a regular file.
        MalformedError: The table is damaged.
    """
    with _fs.RangeReader(path) as reader:
        yield from iter_table(reader, check_crc=check_crc)


# TensorProto fields (tensorflow/core/framework/tensor.proto) and where TensorSliceWriter puts
# each dtype's values (saved_tensor_slice_util.h): field number, numpy code of one packed value.
_TENSOR_CONTENT = 4
_VALUE_FIELDS = {
    "float32": (5, "<f4"), "float64": (6, "<f8"), "int32": (7, "int"), "int16": (7, "int"), "int8": (7, "int"),
    "uint8": (7, "int"), "uint16": (7, "int"), "qint8": (7, "int"), "quint8": (7, "int"), "qint16": (7, "int"),
    "quint16": (7, "int"), "qint32": (7, "int"), "string": (8, None), "complex64": (9, "<f4"), "int64": (10, "int"),
    "bool": (11, "int"), "complex128": (12, "<f8"), "float16": (13, "int"), "bfloat16": (13, "int"),
    "uint32": (16, "int"), "uint64": (17, "int"),
}
MAX_V1_SLICES = 1 << 20  # stored slices gathered for one tensor


def _decode_tensor_proto(raw: bytes, dtype: str, count: int):
    """The flat values of a ``TensorProto`` as TensorSliceWriter stores them (typed repeated
    fields, packed or not; ``tensor_content`` when present).

    Raises:
        MalformedError: A value count other than ``count``, or a dtype it does not store.
    """
    import numpy as np  # noqa: PLC0415

    from .data import value_dtype  # noqa: PLC0415

    fields = parse_message(raw)
    where = _VALUE_FIELDS.get(dtype)
    if where is None:
        raise MalformedError(f"dtype {dtype} is not stored by V1 checkpoints")
    number, code = where
    if dtype == "string":
        values = [v for v in fields.get(number, []) if isinstance(v, bytes)]
        if len(values) != count:
            raise MalformedError(f"{len(values)} strings stored, the slice holds {count}")
        out = np.empty(count, dtype=object)
        out[:] = values
        return out
    target = value_dtype(dtype)
    content = first(fields, _TENSOR_CONTENT)
    if isinstance(content, bytes) and content:
        if len(content) != count * target.itemsize:
            raise MalformedError(f"tensor_content of {len(content)} bytes, {count} {dtype} values take "
                                 f"{count * target.itemsize}")
        return np.frombuffer(content, dtype=target).copy()
    parts = []
    for v in fields.get(number, []):
        if isinstance(v, bytes):  # packed
            if code == "int":
                pos, vals = 0, []
                while pos < len(v):
                    x, pos = read_varint(v, pos)
                    vals.append(x)
                parts.append(np.array(vals, dtype=np.uint64))
            else:
                if len(v) % np.dtype(code).itemsize:
                    raise MalformedError("packed values of a partial size")
                parts.append(np.frombuffer(v, dtype=code))
        elif code == "int":
            parts.append(np.array([v], dtype=np.uint64))
        else:  # one fixed32/fixed64 value, as its bits
            parts.append(np.array([v], dtype=code.replace("f", "u")).view(code))
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64 if code == "int" else code)
    if dtype in ("complex64", "complex128"):
        if len(flat) != 2 * count:
            raise MalformedError(f"{len(flat) // 2} complex values stored, the slice holds {count}")
        return flat.view(target)
    if len(flat) != count:
        raise MalformedError(f"{len(flat)} values stored, the slice holds {count}")
    if code != "int":
        return flat.astype(target)
    if dtype in ("float16", "bfloat16"):  # the 16 bits of each value in an int32 field
        return (flat & 0xFFFF).astype(np.uint16).view(target)
    if dtype == "bool":
        return flat != 0
    # varints hold the value's two's complement (int32 values sign-extended to 64 bits)
    return flat.astype(np.uint64).view(np.int64).astype(target) if target.kind == "i" else flat.astype(target)


class _V1Source(m.BaseSource):
    """Values of a V1 table checkpoint, decoded without TensorFlow: the table is read block by
    block (each block's checksum checked) and the slices stored under the variable's name are
    placed into its value."""

    def __init__(self, path: str):
        self.path = path

    def read(self, variable: m.Variable) -> np.ndarray:
        """The whole value, as ``tf.train.load_checkpoint(...).get_tensor`` returns it (sliced
        variables assembled, as ``RestoreV2`` does).

        Raises:
            CorruptCheckpointError: The table is damaged, or the variable's slices are missing,
                overlap or do not decode.
        """
        import numpy as np  # noqa: PLC0415

        from .data import value_dtype  # noqa: PLC0415

        shape = variable.shape
        total = 1
        for d in shape:
            total *= d
        dtype = object if variable.dtype == "string" else value_dtype(variable.dtype)
        label = m.display_name(variable.key)
        if dtype is None:
            raise CorruptCheckpointError(f"{self.path}: cannot read '{label}': dtype {variable.dtype}")
        out = None
        covered = 0
        try:
            for key, value in iter_v1_table(self.path, check_crc=True):
                if key == b"" or not key.startswith(b"\x00"):
                    continue
                name, starts, lengths = decode_tensor_name_slice(key)
                if name != variable.key:
                    continue
                saved = first(parse_message(value), 2)  # SavedTensorSlices.data: SavedSlice
                if not isinstance(saved, bytes):
                    continue
                fields = parse_message(saved)
                if len(starts) != len(shape):
                    raise MalformedError(f"a slice of {len(starts)} dimensions, the tensor has {len(shape)}")
                box = tuple(slice(st, dim if ln < 0 else st + ln) for st, ln, dim in zip(starts, lengths, shape))
                if any(b.start < 0 or b.stop > dim or b.start > b.stop for b, dim in zip(box, shape)):
                    raise MalformedError(f"a slice outside the shape {list(shape)}")
                part_shape = tuple(b.stop - b.start for b in box)
                count = 1
                for d in part_shape:
                    count *= d
                data = first(fields, 3, b"")
                part = _decode_tensor_proto(data if isinstance(data, bytes) else b"", variable.dtype, count)
                if out is None:
                    out = np.empty(shape, dtype=dtype)
                    seen = np.zeros(shape, dtype=bool) if len(variable.slices) > 1 else None
                if seen is not None:
                    if seen[box].any():
                        raise MalformedError("two of its slices overlap")
                    seen[box] = True
                out[box + (Ellipsis,)] = part.reshape(part_shape)  # (a 0-d object array: its element, not itself)
                covered += count
        except MalformedError as e:
            raise CorruptCheckpointError(f"{self.path}: cannot read '{label}': {e}") from None
        if out is None or covered != total:
            raise CorruptCheckpointError(f"{self.path}: cannot read '{label}': its stored slices do not cover its shape"
                                         f" {list(shape)}")
        return out

    def files(self) -> tuple[str, ...]:
        return (self.path,)


def _slices(protos: list, shape: tuple[int, ...], dtype: str) -> tuple[m.SliceInfo, ...]:
    """The stored slices of a partitioned variable (``SavedSliceMeta.slice``: TensorSliceProto,
    extent=1: start=1, length=2), or () when it is stored whole."""
    infos = []
    for raw in protos:
        extents = [parse_message(e) for e in parse_message(raw).get(1, [])]
        starts = tuple(first(e, 1, 0) for e in extents)
        lengths = tuple(first(e, 2, -1) for e in extents)
        nbytes = m.ITEMSIZE.get(dtype, 0)
        for dim, length in zip(shape, lengths):
            nbytes *= dim if length < 0 else length
        infos.append(m.SliceInfo(starts=starts, lengths=lengths, shard=0, nbytes=nbytes))
    if len(infos) == 1 and all(ln < 0 for ln in infos[0].lengths):
        return ()  # one slice covering the whole tensor
    return tuple(infos)


def open_v1(path: str, *, checkpoints: tuple[m.RetainedCheckpoint, ...] = ()) -> m.Checkpoint:
    """Open a V1 checkpoint file.

    Raises:
        CorruptCheckpointError: The table or its meta entry does not parse.
    """
    try:
        meta = None
        with _fs.RangeReader(path) as reader:  # the meta entry is the first key: one block is read
            for key, value in iter_table(reader):
                if key == b"":
                    meta = first(parse_message(value), 1)
                break
        if not isinstance(meta, bytes):
            raise MalformedError("no SavedTensorSliceMeta entry")
        variables = []
        for raw in parse_message(meta).get(1, []):
            f = parse_message(raw)
            name = first(f, 1, b"").decode("utf-8", "replace")
            shape = parse_shape(first(f, 2, b""))
            dtype = DTYPE_NAMES.get(first(f, 3, 0), "unknown")
            n = m.ITEMSIZE.get(dtype, 0)
            for d in shape:
                n *= d
            entry = IndexEntry(name, dtype, shape, 0, 0, n, None)
            variables.append(
                m.Variable(key=name, name=name, shape=shape, dtype=dtype, nbytes=n, shards=(0,),
                           role=tf1_role(name, entry), slices=_slices(f.get(4, []), shape, dtype))
            )
    except MalformedError as e:
        raise CorruptCheckpointError(f"{path}: not a valid V1 checkpoint: {e}") from None
    return m.Checkpoint(
        path=path,
        format=m.FORMAT_TF_V1,
        variables=tuple(sorted(variables, key=lambda v: v.key)),
        num_shards=1,
        checkpoints=checkpoints,
        info={"kind": "tf1-name"},
        source=_V1Source(path),
    )


def check_v1(path: str) -> m.CheckResult:
    """Verify a V1 table checkpoint: every block's checksum (its tensors live in the blocks)."""
    step = None  # its name's number is the checkpoint's, not a training step
    try:
        count = 0
        for _ in iter_v1_table(path, check_crc=True):  # one block at a time
            count += 1
    except MalformedError as e:
        return m.CheckResult(path, m.FORMAT_TF_V1, m.STATUS_DAMAGED, step=step, problems=(f"{path}: {e}",))
    return m.CheckResult(path, m.FORMAT_TF_V1, m.STATUS_INTACT, step=step, tensors=max(count - 1, 0),
                         nbytes=_fs.getsize(path))


def check_v1_file(path: str) -> Check:
    """``verify``'s plan for a V1 table file: one check of the whole file."""
    return Check(path, lambda *_: check_v1(path), 1)
