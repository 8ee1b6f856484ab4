"""Writing TF bundle checkpoints without TensorFlow: ``PREFIX.index`` + ``PREFIX.data-*``.

The files are the ones TensorFlow's ``BundleWriter`` / ``MergeBundles``
(tensorflow/core/util/tensor_bundle/tensor_bundle.cc) write, byte for byte where the same
tensors go to the same places:

* **Data shards** ``PREFIX.data-0000k-of-0000N``: each stored run of bytes (a tensor, or one
  slice of a sliced tensor) goes whole into one shard, in the order given. Shards are filled
  in turn up to ``max_shard_bytes`` (as ``MaxShardSizePolicy`` fills them; a run bigger than
  the budget gets a shard of its own; no budget: one shard). Numeric and bool tensors are their
  little-endian bytes; strings are ``WriteStringTensor``'s layout (varint64 lengths, the masked
  crc32c of the lengths, the bytes). Every run's masked crc32c is computed as the bytes go out
  (strings and variants with TensorFlow's layouts, :func:`tf_data.tensor_crc32c`).
* **Copies**: a run taken unchanged from another bundle (:class:`StoredBytes`) is copied byte
  for byte with ``os.copy_file_range`` (in the kernel; a read/write loop where the OS or file
  system refuses) and keeps the crc32c its source index records: nothing is decoded, and
  damage in the source stays detectable by ``verify`` on the output. Pass
  ``check_copies=True`` to read the bytes through and compare checksums on the way instead.
* **The index**: the ``BundleHeaderProto`` (``num_shards``, little-endian, ``version
  {producer: 1}``) under the empty key, then one ``BundleEntryProto`` per key in byte order,
  serialized as TensorFlow's proto3 code does (zero fields left out, the shape always
  present); a sliced tensor's entry has its dtype, full shape and slices, and each stored
  slice is keyed by :func:`~._ordered_code.encode_tensor_name_slice`. The table is written by
  :class:`~._table_builder.TableBuilder` with TensorFlow's options.
* **The object graph** of a TF2 object-based checkpoint is one more string scalar,
  ``_CHECKPOINTABLE_OBJECT_GRAPH``, written last, where TensorFlow 2 puts it.


Memory stays about one block of a streamed tensor (:meth:`TensorData.from_blocks`), one
in-memory value, or one copy buffer, plus the index. Files are created exclusively, written
with positioned writes and fsync'ed. :func:`save_bundle_native` wraps the writer in an atomic
replace (``_atomic.atomic_prefix``).

The parts: :mod:`.bundle_tensors` (what to write: :class:`~.bundle_tensors.OutputTensor`,
:class:`~.bundle_tensors.TensorData`, :class:`~.bundle_tensors.StoredBytes`),
:mod:`._bundle_plan` (the runs in order, their shards, the index entries and table),
:mod:`._bundle_shards` (the data files' bytes: shard files, copies), and this module, which
drives them, reads copies back (:func:`compare_copy`) and takes tensors from an open
checkpoint (:func:`copy_tensor`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Iterable, Sequence

from .... import model as m
from ....errors import CorruptCheckpointError, OutputExistsError, UsageError
from .plan import Run, assign_shards, entry_bytes, index_bytes, plan_runs
from .shards import COPY_CHUNK_BYTES, RunWriter, ShardFile, create_file
from ..crc import crc32c_module, mask
from .direct_io import DirectShard
from ..._layout import INDEX_SUFFIX, data_path
from .table_builder import DEFAULT_BLOCK_SIZE
from ..wire import MalformedError
from .combine import BlockFeed
from .tensors import (
    ENCODABLE_DTYPES,
    OutputTensor,
    StoredBytes,
    TensorData,
    element_count,
    encodable_dtype,
    open_source,
    pread_all,
)
from ..bundle import BundleSource
from ..data import VARIABLE_LENGTH_DTYPES, crc_mismatch, tensor_crc32c

__all__ = [
    "WriteSummary",
    "write_bundle_native",
    "save_bundle_native",
    "copy_tensor",
    "compare_copy",
]

STREAM_BLOCK_ELEMENTS = 1 << 20  # elements per block when copy_tensor falls back to streaming


@dataclasses.dataclass(frozen=True)
class WriteSummary:
    """What :func:`write_bundle_native` wrote.

    Attributes:
        prefix: The bundle's prefix.
        num_shards: Data files written.
        tensors: Keys written (sliced tensors once, the object graph included).
        runs: Stored runs of bytes (a sliced tensor counts one per slice).
        data_bytes: Bytes in the data files.
        copied_bytes: Of those, bytes copied unchanged from other bundles.
        index_bytes: Size of the ``.index`` file.
        shard_bytes: Bytes per data file.
    """

    prefix: str
    num_shards: int
    tensors: int
    runs: int
    data_bytes: int
    copied_bytes: int
    index_bytes: int
    shard_bytes: tuple[int, ...]


# -- writing ---------------------------------------------------------------------------------
def _fsync_directory(directory: str) -> None:
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # not every file system can sync a directory
    finally:
        os.close(fd)


def write_bundle_native(
    prefix: str,
    tensors: Iterable[OutputTensor],
    *,
    object_graph: bytes | Any | None = None,
    max_shard_bytes: int | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    check_copies: bool = False,
    fsync: bool = True,
) -> WriteSummary:
    """Write a TF bundle at ``prefix`` without TensorFlow.

    Args:
        prefix: Output prefix (``prefix.index``, ``prefix.data-*``) in an existing directory;
            none of its files may exist (use :func:`save_bundle_native` to replace an output
            atomically). Partial files are removed when writing fails.
        tensors: What to write, in data-file order (the index is sorted by key).
        object_graph: A TF2 object graph (a serialized ``TrackableObjectGraph``, or a message
            with ``SerializeToString``), written as ``_CHECKPOINTABLE_OBJECT_GRAPH`` after the tensors.
        max_shard_bytes: Data bytes per shard; a bigger tensor (or slice) gets a shard of its
            own; ``0`` gives one tensor per shard; None (default) writes one shard.
        block_size: Index table block size (TensorFlow's is 256 KiB).
        check_copies: Read copied bytes through and compare them with their recorded
            checksums (else they are copied in the kernel and their checksums reused).
        fsync: Sync every file written to disk before returning.

    Returns:
        A :class:`WriteSummary`.

    Raises:
        UsageError: Tensors that do not fit together (duplicate keys, shapes, dtypes...).
        OutputExistsError: A file of ``prefix`` exists.
        CorruptCheckpointError: A source to copy from is missing, truncated, or (with
            ``check_copies``) does not match its checksum.
    """
    prefix = os.fspath(prefix)
    if object_graph is not None and not isinstance(object_graph, (bytes, bytearray)):
        object_graph = object_graph.SerializeToString()
    if max_shard_bytes is not None and max_shard_bytes < 0:
        raise UsageError(f"max_shard_bytes must be at least 0. Received: {max_shard_bytes}")
    runs, entries = plan_runs(tensors, bytes(object_graph) if object_graph is not None else None)
    num_shards = assign_shards(runs, max_shard_bytes)
    if os.path.lexists(prefix + INDEX_SUFFIX):
        raise OutputExistsError(f"{prefix}{INDEX_SUFFIX}: exists; write bundles into a fresh location")
    created: list[str] = []
    combined = [(r.data.combined, encodable_dtype(r.data.dtype), element_count(r.data.shape)) for r in runs
                if r.data.combined is not None]
    writer = RunWriter(check_copies, BlockFeed(combined) if combined else None)
    try:
        shard_bytes = _write_shards(prefix, runs, num_shards, writer, fsync, created)
        index = _write_index(prefix, runs, entries, num_shards, block_size, fsync, created)
    except BaseException:
        for path in created:
            try:
                os.remove(path)
            except OSError:
                pass
        raise
    finally:
        writer.close()
        if writer.feed is not None:
            writer.feed.close()
    return WriteSummary(
        prefix=prefix,
        num_shards=num_shards,
        tensors=sum(1 for k in entries if k[:1] != b"\x00"),
        runs=len(runs),
        data_bytes=sum(shard_bytes),
        copied_bytes=writer.copied,
        index_bytes=len(index),
        shard_bytes=tuple(shard_bytes),
    )


def _write_shards(prefix: str, runs: list[Run], num_shards: int, writer: RunWriter, fsync: bool,
                  created: list[str]) -> list[int]:
    """Write each data shard, its runs in plan order, recording each run's offset and crc32c
    (computed tensors go around the page cache on an I/O thread); each file is added to
    ``created`` as it is made, and one left open by a failure is closed. Returns each shard's
    size in bytes."""
    shard_bytes: list[int] = []
    out: ShardFile | None = None
    try:
        by_shard: list[list[Run]] = [[] for _ in range(num_shards)]
        for run in runs:
            by_shard[run.shard].append(run)
        for shard, shard_runs in enumerate(by_shard):
            path = data_path(prefix, shard, num_shards)
            # computed tensors (average): written around the page cache on an I/O thread
            out = DirectShard(path, lambda p: create_file(p, readable=True)) if any(r.data.combined is not None for r in shard_runs) else ShardFile(path)
            created.append(out.path)
            for run in shard_runs:
                run.offset = out.size
                run.crc32c = writer.write(out, run)
                if out.size - run.offset != run.data.nbytes:  # pragma: no cover - guarded by the writers above
                    raise UsageError(f"{run.label}: wrote {out.size - run.offset} bytes, planned {run.data.nbytes}")
            shard_bytes.append(out.size)
            done, out = out, None
            done.close(fsync)
    except BaseException:
        if out is not None:
            try:
                out.close(False)
            except OSError:
                pass
        raise
    return shard_bytes


def _write_index(prefix: str, runs: list[Run], entries: dict[bytes, bytes], num_shards: int, block_size: int,
                 fsync: bool, created: list[str]) -> bytes:
    """Write ``prefix.index`` once the data is written: an entry for every run the plan left
    without one (its place and crc32c now known), the table sorted by key. Returns its bytes."""
    for run in runs:
        if run.key not in entries:
            entries[run.key] = entry_bytes(run.data.dtype, run.data.shape, run.shard, run.offset, run.data.nbytes, run.crc32c)
    index = index_bytes(entries, num_shards, block_size)
    index_file = ShardFile(prefix + INDEX_SUFFIX)
    created.append(index_file.path)
    index_file.write(index)
    index_file.close(fsync)
    return index


def save_bundle_native(
    dest: str,
    tensors: Iterable[OutputTensor],
    *,
    force: bool = False,
    protected: Iterable[str] = (),
    check: Callable[[str], None] | None = None,
    **options: Any,
) -> WriteSummary:
    """Write a TF bundle at ``dest`` atomically (``_atomic.atomic_prefix``): into a temporary
    directory beside it, checked, then renamed into place (data first, index last) and the
    directory synced. Every file a tensor is copied from is protected from being replaced.

    Args:
        dest: The output prefix.
        tensors: What to write (see :func:`write_bundle_native`).
        force: Replace an existing bundle at ``dest``.
        protected: Inputs that must never be overwritten (files or prefixes).
        check: Called with the temporary prefix once written; raise to abandon the write.
        **options: Passed to :func:`write_bundle_native`.

    Returns:
        The :class:`WriteSummary`, with ``prefix`` the final one.

    Raises:
        OutputExistsError, UsageError: See ``_atomic.check_output`` and :func:`write_bundle_native`.
        CorruptCheckpointError: A source to copy from is damaged.
    """
    from ...._atomic import atomic_prefix  # noqa: PLC0415 - a sibling of formats, used only here

    tensors = list(tensors)
    sources = {
        data.stored.path
        for t in tensors
        for data in ([t.data] if t.data is not None else [s[2] for s in t.slices])
        if data.stored is not None
    }
    dest = os.fspath(dest)
    with atomic_prefix(dest, force=force, protected=[*protected, *sorted(sources)]) as tmp:
        summary = write_bundle_native(tmp, tensors, **options)
        if check is not None:
            check(tmp)
    _fsync_directory(os.path.dirname(dest))
    return dataclasses.replace(summary, prefix=dest)


# -- reading a copy back --------------------------------------------------------------------
def compare_copy(path: str, offset: int, stored: StoredBytes, dtype: str, shape: Sequence[int], label: str) -> bool:
    """Whether the bytes at ``offset`` of ``path`` (a copy written by :func:`write_bundle_native`)
    are ``stored``'s bytes, read chunk by chunk from both files; the source's bytes are also
    checked against the crc32c its index records (a copy reuses it, so damage in the source
    would otherwise pass on silently).

    Args:
        path: The written data file.
        offset: Where the copy starts in it.
        stored: The source run it was copied from.
        dtype: The run's dtype (strings and variants have their own checksum layouts).
        shape: The run's shape.
        label: The key (and slice) for messages.

    Returns:
        True when the bytes are identical.

    Raises:
        CorruptCheckpointError: A file is missing, not regular or truncated, or the source's
            bytes do not match their recorded crc32c.
    """
    fa, fb = open_source(path), open_source(stored.path)
    try:
        if dtype in VARIABLE_LENGTH_DTYPES:
            a, b = pread_all(fa, offset, stored.size, path), pread_all(fb, stored.offset, stored.size, stored.path)
            try:
                crc = tensor_crc32c(dtype, tuple(shape), b)
            except MalformedError as e:
                raise CorruptCheckpointError(f"{stored.path}: {label!r}: {dtype} tensor does not decode: {e}") from None
            same = a == b
        else:
            crc32c, crc, same, done = crc32c_module(), 0, True, 0
            while done < stored.size:
                n = min(COPY_CHUNK_BYTES, stored.size - done)
                a, b = pread_all(fa, offset + done, n, path), pread_all(fb, stored.offset + done, n, stored.path)
                crc = crc32c.extend(crc, b)
                same = same and a == b
                done += n
            crc = mask(crc)
        if crc != (stored.crc32c or 0):
            raise CorruptCheckpointError(f"{stored.path}: {label!r}: {crc_mismatch(stored.crc32c or 0, crc)}")
        return same
    finally:
        os.close(fa)
        os.close(fb)


# -- from an open checkpoint ------------------------------------------------------------------
def copy_tensor(checkpoint: m.Checkpoint, variable: m.Variable | str, key: str | None = None) -> "OutputTensor":
    """A variable of an open checkpoint, to write unchanged (under ``key``, default its own).

    From a local TF bundle the stored bytes are copied as they are (every slice of a sliced
    variable, with its checksum); from any other source the value is streamed in blocks
    (numeric) or read whole (strings).

    Args:
        checkpoint: The open source checkpoint.
        variable: One of its variables, or its name or key.
        key: The key in the written bundle.

    Returns:
        The :class:`OutputTensor`.
    """
    var = variable if isinstance(variable, m.Variable) else checkpoint[variable]
    key = var.key if key is None else key
    source = checkpoint.source
    runs = source.stored_runs(var) if isinstance(source, BundleSource) else None
    if runs:
        datas = [
            TensorData.from_stored(
                r.entry.dtype, r.entry.shape, StoredBytes(r.path, r.entry.offset, r.entry.size, r.entry.crc32c or 0)
            )
            for r in runs
        ]
        if not runs[0].starts:
            return OutputTensor(key, var.dtype, var.shape, datas[0])
        return OutputTensor(key, var.dtype, var.shape, slices=tuple((r.starts, r.lengths, d) for r, d in zip(runs, datas)))
    if var.dtype in ENCODABLE_DTYPES and encodable_dtype(var.dtype) is not None:
        return OutputTensor(
            key, var.dtype, var.shape,
            TensorData.from_blocks(var.dtype, var.shape, lambda: checkpoint.iter_blocks(var, STREAM_BLOCK_ELEMENTS)),
        )
    return OutputTensor.from_array(key, checkpoint.read(var))
