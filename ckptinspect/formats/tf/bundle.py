"""TF bundle checkpoints: ``PREFIX.index`` + ``PREFIX.data-0000k-of-0000N``.

Listing reads only the ``.index`` file (parsed by :mod:`._bundle_index`) and, for TF2
object-based checkpoints, the object graph (``_CHECKPOINTABLE_OBJECT_GRAPH``; names and roles
come from :mod:`._bundle_vars`). Values are decoded from the data files by
:class:`BundleSource` (whole, or streamed in blocks), each stored run checked against its
crc32c, without TensorFlow: they equal ``tf.train.load_checkpoint(...).get_tensor``.

Entries TensorFlow cannot read (:func:`~._bundle_index.entry_problem`) are listed, reported by
``verify`` (:func:`check_bundle`), and refused when read.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ... import model as m
from ...errors import (
    CheckpointNotFoundError,
    CkptError,
    CorruptCheckpointError,
    NotACheckpointError,
)
from .. import _fs
from .._bulk import compact_variables
from .._step import training_step
from . import data as tf_data
from .compact import CompactIndex
from .index import OBJECT_GRAPH_KEY, BundleIndex, IndexEntry, read_index
from .variables import (
    MAX_OBJECT_GRAPH_BYTES,
    build_variables,
    key_name,
    step_candidates,
    unreadable_entries,
)
from .._layout import INDEX_SUFFIX, data_path
from .sniff import SAVED_MODEL_VARIABLES
from .wire import MalformedError
from .data import decode_string_scalar, read_raw

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "INDEX_SUFFIX",
    "data_path",
    "open_bundle",
    "check_bundle",
    "BundleSource",
    "StoredRun",
    "check_bundle_files",
]

MAX_PINNED_SHARDS = 256  # data files held open for a checkpoint resolved from a live directory


def _label(variable: m.Variable) -> str:
    """``'name'``, or ``'name' (key 'key')`` when they differ, for messages."""
    name, key = m.display_name(variable.name), m.display_name(variable.key)
    return f"'{name}'" if name == key else f"'{name}' (key '{key}')"


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
    (several per thread too, each with its own buffer). A value read whole leaves its checksum
    verdict with the checkpoint: ``verify``'s check given the checkpoint (``seen``) does not
    read it again.

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
    """Values of a bundle, decoded from the data files without TensorFlow: whole tensors
    (:func:`~.data.read_value`: numeric, bool, strings; sliced variables assembled from their
    stored slices), streamed blocks of unsliced numeric tensors; every stored run checked
    against the crc32c the index records.

    Safe for concurrent reads of different variables: reads are positioned, into buffers of
    their own (:class:`~._fs.DataFiles` is thread-safe).
    """

    concurrent_reads = True

    def __init__(self, prefix: str, index: BundleIndex | CompactIndex):
        self.prefix = prefix
        self.num_shards = index.num_shards
        self._index = index  # held while the checkpoint is: read_index of the same bytes reuses it
        # key -> entry: a compact index finds its rows itself (an entry made per look-up)
        self._entries = index if isinstance(index, CompactIndex) else {e.key: e for e in index.entries}
        self._slices = index.slice_entries
        self._unreadable = unreadable_entries(index)
        self._files = _fs.DataFiles()
        # the verdicts of the runs streamed whole by raw_blocks (stream_blocks: scan's reads):
        # verify's check of this checkpoint takes them instead of reading the bytes again
        # (BundleCheck.run's seen). Other reads record nothing (a diff or an average of giant
        # indexes holds no entry per run).
        self.ledger = tf_data.Ledger()
        self._pinned = False
        self._held: set[str] = set()  # data files held open since pin()

    def _check_readable(self, variable: m.Variable) -> None:
        """Refuse an entry TensorFlow cannot read either (unknown dtype, a resource handle, an
        element count that overflows, a size other than shape x dtype), with why."""
        why = self._unreadable.get(variable.key)
        if why is not None:
            raise CorruptCheckpointError(
                f"{self.prefix}{INDEX_SUFFIX}: cannot read {_label(variable)}: {why} (`ckptinspect verify` reports it)"
            )

    def pin(self) -> None:
        """Hold the data shards open from now on (up to :data:`MAX_PINNED_SHARDS`), so the
        checkpoint stays readable if it is deleted meanwhile (a CheckpointManager rotating it
        out of its directory): every read uses the open files."""
        if _fs.is_remote(self.prefix) or self.num_shards > MAX_PINNED_SHARDS:
            return
        for path in tf_data.shard_files(self.prefix, self.num_shards):
            try:
                self._files.pin(path)
                self._held.add(path)
            except CkptError:
                pass  # missing or special: reported by whatever reads it
        self._pinned = True

    def read(self, variable: m.Variable) -> np.ndarray:
        """The whole value, as ``tf.train.load_checkpoint(...).get_tensor`` returns it (a
        scalar string as a 0-d object array, its trailing NUL bytes kept).

        Raises:
            CorruptCheckpointError: An entry TensorFlow cannot read, a missing data file or
                stored slice, a truncated file, bytes that do not match their checksum.
            CheckpointNotFoundError: No such key, or the checkpoint was deleted while being read.
        """
        self._check_readable(variable)
        self._check_shards(variable)
        entry = self._entries.get(variable.key)
        if entry is None:
            raise CheckpointNotFoundError(f"{self.prefix}: {_label(variable)} is not in the checkpoint")
        if not entry.slices:
            return self._read_run(variable, entry, _count(entry.shape)).reshape(entry.shape)
        return self._assemble(variable, entry)

    def _read_run(self, variable: m.Variable, entry: IndexEntry, count: int) -> np.ndarray:
        """One stored run (a whole tensor or a stored slice), flat, from its data file."""
        return tf_data.read_value(self._located(variable, entry), entry, count, self._files)

    def _located(self, variable: m.Variable, entry: IndexEntry) -> str:
        """The data file of a stored run, checked to hold it (nothing is read or allocated
        for a run the file cannot hold)."""
        path = data_path(self.prefix, entry.shard_id, self.num_shards)
        size = self._files.size(path)
        if size is None:
            if _fs.is_remote(path):
                raise CorruptCheckpointError(
                    f"{path}: data file is missing ({self.prefix}{INDEX_SUFFIX} names it; cannot read {_label(variable)})")
            if self._pinned and not os.path.lexists(path):
                directory = _fs.dirname(self.prefix) or "."
                raise CheckpointNotFoundError(
                    f"{self.prefix}: deleted while being read (rotated out by the process saving into {directory});"
                    " run the command again"
                )
            _fs.check_regular(path)  # a FIFO or device: refused with its own error
            raise CorruptCheckpointError(
                f"{path}: data file is missing ({self.prefix}{INDEX_SUFFIX} names it; cannot read {_label(variable)})")
        if size < entry.offset + entry.size:
            raise tf_data.truncated(path, entry, size)
        return path

    def _assemble(self, variable: m.Variable, entry: IndexEntry) -> np.ndarray:
        """A sliced (partitioned) variable from its stored slices, as TensorFlow's
        ``BundleReader::GetSliceValue`` does: the declared slices must lie within the shape,
        not overlap and cover it; each stored slice is read (checksum-checked) and placed."""
        import numpy as np  # noqa: PLC0415

        def refuse(why: str) -> CorruptCheckpointError:
            return CorruptCheckpointError(
                f"{self.prefix}{INDEX_SUFFIX}: cannot read {_label(variable)}: {why} (`ckptinspect verify` reports it)")

        shape = entry.shape
        stored = self._slices.get(entry.key, ())
        if len(stored) != len(entry.slices):
            raise refuse(f"it declares {len(entry.slices)} slices, the index holds {len(stored)}")
        boxes = []
        for starts, lengths, se in stored:
            where = tf_data.fmt_slice(starts, lengths)
            if len(starts) != len(shape):
                raise refuse(f"slice {where} has {len(starts)} dimensions, the tensor {len(shape)}")
            box = tuple((st, dim) if ln < 0 else (st, st + ln) for st, ln, dim in zip(starts, lengths, shape))
            if any(lo < 0 or hi > dim or lo > hi for (lo, hi), dim in zip(box, shape)):
                raise refuse(f"slice {where} lies outside its shape {list(shape)}")
            if tuple(hi - lo for lo, hi in box) != tuple(se.shape):
                raise refuse(f"slice {where} is stored with shape {list(se.shape)}")
            if se.dtype != entry.dtype:
                raise refuse(f"slice {where} is stored as {se.dtype}, the tensor is {entry.dtype}")
            boxes.append(box)
        if _overlap(boxes):
            raise refuse("two of its slices overlap")
        if sum(_count(tuple(hi - lo for lo, hi in box)) for box in boxes) != _count(shape):
            raise refuse(f"its {len(boxes)} slices do not cover its shape {list(shape)}")
        for _, _, se in stored:
            self._located(variable, se)  # every slice's bytes are there before the value is allocated
        dtype = object if entry.dtype == "string" else tf_data.value_dtype(entry.dtype)
        out = np.empty(shape, dtype=dtype)
        for box, (_, _, se) in zip(boxes, stored):
            part = self._read_run(variable, se, _count(se.shape)).reshape(se.shape)
            out[(*(slice(lo, hi) for lo, hi in box), Ellipsis)] = part
        return out

    def _check_shards(self, variable: m.Variable) -> None:
        """Refuse at once a value whose local data file is not there and was not held open: a
        file that never existed (an index copied alone) is missing, not rotated out.

        Raises:
            CorruptCheckpointError: ``PATH: data file is missing (PREFIX.index names it)``: the
                checkpoint is incomplete (the error a damaged value raises, as the API promises).
        """
        if _fs.is_remote(self.prefix):
            return
        entry = self._entries.get(variable.key)
        if entry is None:
            return
        shards = {entry.shard_id} if not entry.slices else {se.shard_id for *_, se in self._slices.get(variable.key, ())}
        for shard in sorted(shards):
            path = data_path(self.prefix, shard, self.num_shards)
            if path not in self._held and not os.path.lexists(path):
                raise CorruptCheckpointError(
                    f"{path}: data file is missing ({self.prefix}{INDEX_SUFFIX} names it; "
                    f"cannot read {_label(variable)})")

    def _raw_entry(self, variable: m.Variable) -> tuple[str, IndexEntry, np.dtype] | None:
        """Where ``variable``'s bytes can be read directly (ranged reads for a remote one): an
        unsliced tensor of a plain numeric dtype whose shard is long enough (else the TF reader
        reports the problem)."""
        entry = self._entries.get(variable.key)
        if entry is None or entry.slices or entry.problem is not None:
            return None
        dtype = tf_data.value_dtype(entry.dtype)
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
        return tf_data.iter_raw_blocks(raw[0], raw[1], raw[2], elements, self._files, self.ledger)

    def stored_runs(self, variable: m.Variable) -> tuple[StoredRun, ...] | None:
        """Where a variable's bytes lie, for byte-exact copies: one run for a whole tensor,
        one per stored slice (in declared order) for a sliced one.

        Returns:
            The runs, or None when they cannot be copied directly (a remote checkpoint, a key
            the index does not hold, slices declared but not stored).
        """
        if _fs.is_remote(self.prefix):
            return None
        return self._runs(variable)

    def _runs(self, variable: m.Variable) -> tuple[StoredRun, ...] | None:
        self._check_readable(variable)  # bytes TensorFlow cannot read are not copied on
        entry = self._entries.get(variable.key)
        if entry is None:
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
        runs = self._runs(variable)  # remote ones too: the slices stream through DataFiles
        if not runs or not runs[0].starts:
            return None
        out = []
        for run in runs:
            entry = run.entry
            dtype = tf_data.value_dtype(entry.dtype)
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
        if isinstance(self._entries, CompactIndex):  # from the columns: no entry made per variable
            index = self._entries
            r = index.find(variable.key)
            if r is not None:
                return (index.shard_numbers[index.shard_codes[r]], int(index.offsets[r]))
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
        self._files.close()


def _count(shape: tuple[int, ...]) -> int:
    count = 1
    for d in shape:
        count *= d
    return count


def _overlap(boxes: list[tuple[tuple[int, int], ...]]) -> bool:
    """Whether two of these boxes (per dimension ``[lo, hi)``) share an element; empty boxes
    share nothing. Compared all against all, a box at a time in numpy."""
    import numpy as np  # noqa: PLC0415

    boxes = [b for b in boxes if all(hi > lo for lo, hi in b)]
    if len(boxes) < 2:
        return False
    lo = np.array([[d[0] for d in b] for b in boxes], dtype=object if _huge(boxes) else np.int64)
    hi = np.array([[d[1] for d in b] for b in boxes], dtype=lo.dtype)
    for i in range(len(boxes) - 1):
        shared = (np.maximum(lo[i], lo[i + 1 :]) < np.minimum(hi[i], hi[i + 1 :])).all(axis=1)
        if shared.any():
            return True
    return False


def _huge(boxes) -> bool:
    return any(hi >= 1 << 62 for b in boxes for _, hi in b)


# The variables of the bundles open now, for verify's plan of the same checkpoint (``scan``
# opens each checkpoint, reads it, then checks it): by index object (read_index gives the same
# object for the same bytes while a checkpoint holds it), with the rest of what their names and
# roles depend on: the prefix and a TF2 bundle's object graph, as bytes. The plan takes them only
# when all three are the same; nothing is kept beyond what the open checkpoint holds anyway.
_OPENED: dict[int, tuple[weakref.ref, str, bytes | None, Any]] = {}


def _graph_bytes(prefix: str, index: BundleIndex | CompactIndex) -> bytes | None:
    """The object graph's stored bytes (None: a name-based bundle, which has none).

    Raises:
        CkptError, OSError: They cannot be read (the variables are then built as ever).
    """
    if isinstance(index, CompactIndex):
        row = index.graph_row()
        entry = None if row is None else index.entry_at(row)
    else:
        entry = next((e for e in index.entries if e.key == OBJECT_GRAPH_KEY), None)
    if entry is None:
        return None
    return read_raw(prefix, index.num_shards, entry, limit=MAX_OBJECT_GRAPH_BYTES)


def _remember(prefix: str, index: BundleIndex | CompactIndex, graph: bytes | None, variables: Any) -> None:
    """Keep an open bundle's variables for its check, built with ``graph`` read before (and read
    again now: the same bytes, or nothing is kept)."""
    try:
        if _graph_bytes(prefix, index) != graph:
            return
    except (CkptError, OSError):
        return
    key = id(index)
    _OPENED[key] = (weakref.ref(index, lambda _, key=key: _OPENED.pop(key, None)), prefix, graph, variables)


def _remembered(prefix: str, index: BundleIndex | CompactIndex) -> Any:
    """The variables an open checkpoint of this prefix built from this index and the object
    graph its data holds now, or None."""
    held = _OPENED.get(id(index))
    if held is None or held[0]() is not index or held[1] != prefix:
        return None
    try:
        return held[3] if _graph_bytes(prefix, index) == held[2] else None
    except (CkptError, OSError):
        return None


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
    graph: bytes | None | bool = False  # False: nothing kept for the check (a remote bundle: no extra requests)
    if not _fs.is_remote(prefix):
        try:
            graph = _graph_bytes(prefix, index)
        except (CkptError, OSError):
            pass  # unreadable: build_variables says so
    variables, info = build_variables(prefix, index)
    candidates = step_candidates(prefix, index, variables)
    step, source = training_step(candidates)
    if candidates:
        info["step_candidates"] = candidates
    if extra_info:
        info.update(extra_info)
    # 100,000 variables: columns, not objects (a compact index's table shares its columns)
    held = variables if isinstance(variables, m.VariableTable) else compact_variables(variables)
    if graph is not False and (held is variables or isinstance(held, tuple)):  # what build_variables gives
        _remember(prefix, index, graph, held)  # type: ignore[arg-type]
    return m.Checkpoint(
        path=prefix,
        format=format,
        variables=held,
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
    step = None  # the training step, from the variables (the step rule), when the index reads
    try:
        index = read_index(prefix)
    except CorruptCheckpointError as e:
        return tf_data.damaged_check(prefix, format, step, str(e))
    try:
        variables = _remembered(prefix, index)  # an open checkpoint's (scan checks what it read)
        if variables is None:
            variables, _ = build_variables(prefix, index)
        if isinstance(variables, m.VariableTable) and variables.keys is None:  # every name is its key
            names = {key: key for key in unreadable_entries(index)}
        else:
            names = {v.key: v.name for v in variables}
        step, _ = training_step(step_candidates(prefix, index, variables))
    except (CkptError, MalformedError, OSError):
        names = {}
    return tf_data.plan_check(prefix, index, names, format=format, step=step,
                              extra_damage=_entry_damage(prefix, index, names))


def _entry_damage(prefix: str, index: BundleIndex | CompactIndex, names: dict[str, str]) -> list[m.Damage]:
    """One :class:`~ckptinspect.model.Damage` per entry (or stored slice) TensorFlow cannot read."""
    out = []

    def damage(e: IndexEntry, key: str, slice_text: str | None = None) -> m.Damage:
        kind, problem = e.problem
        return m.Damage(
            key=key, name=names.get(key, key_name(key)), file=data_path(prefix, e.shard_id, index.num_shards),
            kind=kind, problem=problem, shard=e.shard_id, offset=e.offset, size=e.size, slice=slice_text,
        )

    if isinstance(index, CompactIndex):  # no slices: the rows with a problem
        return [damage(e, e.key) for e in map(index.entry_at, index.problem_rows())]
    for e in index.entries:
        if e.problem is not None:
            out.append(damage(e, e.key))
        for starts, lengths, se in index.slice_entries.get(e.key, ()):
            if se.problem is not None:
                out.append(damage(se, e.key, tf_data.fmt_slice(starts, lengths)))
    return out


def check_bundle_prefix(prefix: str) -> tf_data.BundleCheck:
    """``verify``'s plan for a bundle given by prefix (its ``.index`` a regular file)."""
    if _fs.isdir(prefix + INDEX_SUFFIX):
        raise NotACheckpointError(f"{prefix}{INDEX_SUFFIX}: is a directory, not an index file")
    return check_bundle(prefix)


def open_savedmodel(directory: str) -> m.Checkpoint:
    """The variables of a SavedModel directory (its ``variables/variables`` bundle)."""
    return open_bundle(_fs.join(directory, SAVED_MODEL_VARIABLES), format=m.FORMAT_TF_SAVEDMODEL)


def check_savedmodel(directory: str) -> tf_data.BundleCheck:
    """``verify``'s plan for a SavedModel directory's variables."""
    return check_bundle(_fs.join(directory, SAVED_MODEL_VARIABLES), format=m.FORMAT_TF_SAVEDMODEL)
