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
from .wire import MalformedError, first, parse_message
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


class _V1Source(m.BaseSource):
    def __init__(self, path: str):
        self.path = path
        self._reader = None

    def read(self, variable: m.Variable) -> np.ndarray:
        from ..._tf import get_tensor, load_checkpoint  # noqa: PLC0415 - TensorFlow only for values

        if variable.sliced:
            # The CheckpointReader refuses sliced V1 tensors ("Sliced checkpoints are not
            # supported"); the RestoreV2 kernel assembles them.
            from .write.through_tf import numpy_view, restore_tensor  # noqa: PLC0415

            return numpy_view(restore_tensor(self.path, variable.key, variable.dtype))
        if self._reader is None:
            _fs.check_regular(self.path)  # TensorFlow's reader would block on a FIFO
            self._reader = load_checkpoint(self.path)
        return get_tensor(self._reader, self.path, variable.key)

    def files(self) -> tuple[str, ...]:
        return (self.path,)

    def close(self) -> None:
        self._reader = None


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
