"""Reading Keras HDF5 files: opening them (h5py's errors turned into ours) and
:class:`H5Source`, which reads one dataset at a time, whole or in blocks (contiguous datasets
straight at their file offset). Part of :mod:`.keras_h5`.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from ... import model as m
from ...errors import CheckpointNotFoundError, CkptError, CorruptCheckpointError, NotACheckpointError, UnsafeFileError, one_line
from .. import _fs
from .h5_walk import (
    DIRECT_KINDS,
    _h5py,
    _is_unallocated,
    _safe_dataset,
    _text,
    _unallocated_error,
)
from .._layout import HDF5_HEAD_BYTES, is_hdf5_head

if TYPE_CHECKING:  # numpy is imported where values are read (a listing needs none)
    import numpy as np


# Reading: variable-length values (strings, vlen sequences, references) become one Python
# object each; a dataset holding more than MAX_OBJECT_ELEMENTS of them is refused.
MAX_OBJECT_ELEMENTS = 1 << 21


def _is_variable_length(dtype: np.dtype) -> bool:
    """Strings and other values h5py converts to Python objects (vlen, references)."""
    h5py = _h5py()
    return dtype.kind == "O" or (dtype.kind in "SU" and dtype.itemsize == 0) or h5py.check_string_dtype(dtype) is not None


def _check_readable(dsid: Any, variable: m.Variable, label: str) -> None:
    """Refuse, before allocating anything, what reading would get wrong or blow up on.

    Raises:
        CorruptCheckpointError: A null dataspace.
        UnallocatedDataError: The dataset was never written (nothing is allocated for it).
        UnsafeFileError: More variable-length elements than :data:`MAX_OBJECT_ELEMENTS`.
    """
    h5py = _h5py()
    space = dsid.get_space()
    if space.get_simple_extent_type() == h5py.h5s.NULL:
        raise CorruptCheckpointError(f"{label}: dataset {variable.key!r} has no dataspace (an empty HDF5 dataset)")
    if _is_unallocated(dsid):
        raise _unallocated_error(dsid, variable.key, label)
    count = space.get_simple_extent_npoints()
    if dsid.dtype.kind == "O" and count > MAX_OBJECT_ELEMENTS:
        raise UnsafeFileError(
            f"{label}: dataset {variable.key!r} holds {count} variable-length elements (limit"
            f" {MAX_OBJECT_ELEMENTS}, one Python object each); refusing to read it"
        )


def _read_numeric(dsid: Any, variable: m.Variable, label: str, start: tuple[int, ...] | None = None,
                  count: tuple[int, ...] | None = None) -> np.ndarray:
    """A fixed-size value (numbers, records, opaque, fixed-length strings): the whole dataset,
    or the hyperslab ``count`` elements from ``start``, read into a fresh array."""
    import numpy as np  # noqa: PLC0415 - numpy only where values are read

    h5py = _h5py()
    if start is None:
        mspace = fspace = h5py.h5s.ALL
        shape = tuple(dsid.get_space().shape)
    else:
        fspace = dsid.get_space()
        fspace.select_hyperslab(start, count)
        mspace = h5py.h5s.create_simple(count)
        shape = count
    value = np.empty(shape, dtype=dsid.dtype)
    try:
        if value.size:
            dsid.read(mspace, fspace, value)
    except (OSError, RuntimeError, ValueError, TypeError) as e:
        raise CorruptCheckpointError(f"{label}: cannot read dataset {variable.key!r}: {one_line(e)}") from None
    if variable.dtype == "bfloat16" and value.dtype.kind == "V":
        import ml_dtypes  # noqa: PLC0415 - only for bfloat16 values

        value = value.view(ml_dtypes.bfloat16)
    return value


def _read_dataset(dsid: Any, variable: m.Variable, label: str) -> np.ndarray:
    """The whole value of a low-level dataset, read into a fresh array.

    Raises:
        UnallocatedDataError: The dataset was never written (nothing is allocated for it).
        UnsafeFileError: More variable-length elements than :data:`MAX_OBJECT_ELEMENTS`.
        CorruptCheckpointError: The value does not read.
    """
    h5py = _h5py()
    _check_readable(dsid, variable, label)
    if not _is_variable_length(dsid.dtype):
        return _read_numeric(dsid, variable, label)
    value = _read_high_level(dsid, variable, label)
    if h5py.check_ref_dtype(dsid.dtype) is not None:
        value = _dereference(dsid, value, variable, label)
    return value


def _hyperslabs(shape: tuple[int, ...], elements: int) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(start, count) of consecutive C-order runs of at most ``elements`` elements covering
    ``shape``: whole trailing dimensions where they fit, a slab of the next one."""
    import numpy as np  # noqa: PLC0415 - numpy only where values are read

    elements = max(1, elements)
    if math.prod(shape) == 0:
        return
    axis, inner = len(shape), 1
    while axis > 0 and inner * shape[axis - 1] <= elements:
        axis -= 1
        inner *= shape[axis]
    if axis == 0:
        yield (0,) * len(shape), tuple(shape)
        return
    axis -= 1  # the dimension split into slabs of `step`
    step = max(1, elements // inner)
    tail = tuple(shape[axis + 1 :])
    for outer in np.ndindex(*shape[:axis]):
        for first in range(0, shape[axis], step):
            n = min(step, shape[axis] - first)
            yield (*outer, first, *(0,) * len(tail)), (*(1,) * axis, n, *tail)


def _dereference(dsid: Any, refs: np.ndarray, variable: m.Variable, label: str) -> np.ndarray:
    """References as what they point to: the target's path (``""`` for a null reference), and
    for a region reference the selection too. The stored bytes are file addresses, which
    differ between two copies of the same content; the targets do not."""
    import numpy as np  # noqa: PLC0415 - numpy only where values are read

    h5py = _h5py()
    out = np.empty(refs.shape, dtype=object)
    flat_in, flat_out = refs.reshape(-1), out.reshape(-1)
    try:
        for i, ref in enumerate(flat_in):
            if not ref:
                flat_out[i] = ""
                continue
            target = _text(h5py.h5r.get_name(ref, dsid))
            if isinstance(ref, h5py.RegionReference):
                region = h5py.h5r.get_region(ref, dsid)
                target += "[" + region.encode().hex() + "]" if region is not None else ""
            flat_out[i] = target
    except (OSError, RuntimeError, ValueError, TypeError) as e:
        raise CorruptCheckpointError(f"{label}: dataset {variable.key!r}: a reference does not resolve: {one_line(e)}") from None
    return out


def _read_high_level(dsid: Any, variable: m.Variable, label: str) -> np.ndarray:
    """Strings and other variable-length values, through h5py's Dataset (which converts them)."""
    import numpy as np  # noqa: PLC0415 - numpy only where values are read

    h5py = _h5py()
    try:
        return np.asarray(h5py.Dataset(dsid)[()])
    except (OSError, RuntimeError, ValueError, TypeError) as e:
        raise CorruptCheckpointError(f"{label}: cannot read dataset {variable.key!r}: {one_line(e)}") from None


def _open_file(path: str, label: str | None = None) -> Any:
    """``h5py.File`` for a local or remote path, with h5py's errors turned into ours."""
    label = label or path
    if _fs.is_remote(path):  # h5py over a file object of ranged reads (metadata windows, values streamed)
        f = _fs.open_binary(path)
        try:
            head = f.read(HDF5_HEAD_BYTES)
            f.seek(0)
        except BaseException:
            f.close()
            raise
        if not is_hdf5_head(head):
            f.close()
            raise NotACheckpointError(f"{label}: not an HDF5 file (no HDF5 signature)")
        return open_h5py(f, label, owned=f)
    _check_local(path, label)
    return open_h5py(path, label)


def _check_local(path: str, label: str) -> None:
    """A local path is an existing regular file (not a FIFO, on which opening by name would
    block forever) that starts with the HDF5 signature."""
    if not _fs.exists(path):
        raise CheckpointNotFoundError(f"{label}: no such file")
    if _fs.isdir(path):
        raise NotACheckpointError(f"{label}: is a directory, not an HDF5 file")
    _fs.check_regular(path)
    if not is_hdf5_head(_fs.read_head(path, HDF5_HEAD_BYTES)):
        raise NotACheckpointError(f"{label}: not an HDF5 file (no HDF5 signature)")


_OWNING_FILE_CLASS: list[type] = []
_UNKNOWN = object()


def _owning_file_class() -> type:
    """An ``h5py.File`` that also closes the file object it was opened on."""
    if not _OWNING_FILE_CLASS:
        h5py = _h5py()

        class OwningFile(h5py.File):
            _owned: Any = None

            def close(self) -> None:
                try:
                    super().close()
                finally:
                    if self._owned is not None:
                        self._owned.close()
                        self._owned = None

        _OWNING_FILE_CLASS.append(OwningFile)
    return _OWNING_FILE_CLASS[0]


# Largest size of HDF5's metadata cache for a file we read (HDF5's own initial size; its default
# lets the cache grow to 32 MiB, which cost ~180 MiB of RSS on a file of 20,000 datasets: the
# cache holds every object header and group node visited). Each object is visited once, in
# order: a small cache costs no time.
METADATA_CACHE_BYTES = 2 << 20


def _small_metadata_cache(h5: Any) -> Any:
    """Cap the open file's metadata cache at :data:`METADATA_CACHE_BYTES`; returns ``h5``."""
    config = h5.id.get_mdc_config()
    config.set_initial_size = True
    config.initial_size = min(config.initial_size, METADATA_CACHE_BYTES)
    config.min_size = min(config.min_size, METADATA_CACHE_BYTES)
    config.max_size = METADATA_CACHE_BYTES
    h5.id.set_mdc_config(config)
    return h5


def open_h5py(target: Any, label: str, owned: Any = None) -> Any:
    """``h5py.File(target)`` read-only, h5py's errors turned into ours.

    Args:
        target: A local path or a seekable file object.
        label: How messages name the file.
        owned: A file object to close together with the returned file (or on failure).
    """
    h5py = _h5py()
    try:
        if owned is None:
            return _small_metadata_cache(h5py.File(target, "r"))
        h5 = _owning_file_class()(target, "r")
        h5._owned = owned
        return _small_metadata_cache(h5)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{label}: no such file") from None
    except PermissionError:
        raise CheckpointNotFoundError(f"{label}: permission denied") from None
    except (OSError, RuntimeError, ValueError) as e:
        size = ""
        if isinstance(target, str) and _fs.exists(target):
            size = f" ({_fs.getsize(target)} bytes)"
        raise CorruptCheckpointError(
            f"{label}: not a readable HDF5 file{size}, truncated or damaged: {one_line(e)}"
        ) from None
    finally:
        if owned is not None and "h5" not in locals():
            owned.close()


def guard_h5(label: str, fn: Callable[[], Any]) -> Any:
    """Run ``fn``; h5py / HDF5 errors from a damaged file become CorruptCheckpointError."""
    try:
        return fn()
    except CkptError:
        raise
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as e:
        raise CorruptCheckpointError(f"{label}: damaged HDF5 metadata: {one_line(e)}") from None


class H5Source(m.BaseSource):
    """Reads one dataset at a time from one or more HDF5 files, opened on first use.

    Args:
        openers: For each shard, a function returning an open ``h5py.File``.
        labels: For each shard, how messages name it.
        paths: The files on disk (default: the labels).
    """

    def __init__(self, openers: Sequence[Callable[[], Any]], labels: Sequence[str], paths: Sequence[str] | None = None,
                 *, direct: bool = False, listed: dict[int, tuple[Any, dict[str, tuple[int, Any]]]] | None = None):
        self._openers = list(openers)
        self._labels = list(labels)
        self._paths = tuple(paths if paths is not None else labels)
        self._files: dict[int, Any] = {}
        # Each label is a local HDF5 file whose contiguous datasets may be read at their offset.
        self._direct = direct
        self._data = _fs.DataFiles()
        self._last: tuple[int, str, Any] | None = None
        # Per shard: the file's fingerprint when it was listed, and where its contiguous
        # datasets lie. While the open file still has that fingerprint, their blocks are read
        # at those offsets without reopening the dataset through HDF5.
        self._listed = listed or {}
        # Local files may be read from several threads (different variables): blocks at a
        # file offset are positioned reads into buffers of their own; everything that goes
        # through h5py (and the files it opens, the dataset last opened) holds this lock.
        self.concurrent_reads = direct
        self._h5_lock = threading.RLock()
        self._dtypes: dict[tuple[Any, bool], Any] = {}  # (stored type, bfloat16) -> numpy dtype or None

    def files(self) -> tuple[str, ...]:
        return self._paths

    def open_hdf5(self, shard: int = 0) -> Any:
        """A new ``h5py.File`` of shard ``shard``, with the reader's safety checks (the caller closes it)."""
        return self._openers[shard]()

    def _file(self, shard: int) -> Any:
        with self._h5_lock:
            if shard not in self._files:
                self._files[shard] = self._openers[shard]()
            return self._files[shard]

    def read(self, variable: m.Variable) -> np.ndarray:
        """The value of ``variable`` as a numpy array."""
        shard = variable.shards[0] if variable.shards else 0
        label = self._labels[shard]
        listed = self._listed_location(shard, variable)
        if listed is not None:  # contiguous bytes where the listing found them: one read, no HDF5
            return self._direct_read(label, variable, *listed)

        def go() -> np.ndarray:
            ds = _safe_dataset(self._file(shard), variable.key, label)
            return _read_dataset(ds, variable, label)

        with self._h5_lock:
            return guard_h5(label, go)

    def iter_blocks(self, variable: m.Variable, elements: int) -> Iterator[np.ndarray]:
        """The flattened value in blocks of at most ``elements`` elements, each read from the
        file as one hyperslab: memory is one block, however large the dataset. Variable-length
        values (strings, references; at most :data:`MAX_OBJECT_ELEMENTS`) are read whole.

        Raises:
            UnallocatedDataError: The dataset was never written (raised before any block).
            CorruptCheckpointError: A block does not read.
        """
        shard = variable.shards[0] if variable.shards else 0
        label = self._labels[shard]
        listed = self._listed_location(shard, variable)
        if listed is not None:  # (no generator around the generator: thousands of small datasets)
            return self._direct_blocks(label, variable, *listed, elements)
        return self._h5py_blocks(shard, label, variable, elements)

    def _h5py_blocks(self, shard: int, label: str, variable: m.Variable, elements: int) -> Iterator[np.ndarray]:
        """:meth:`iter_blocks` of a dataset the listing did not locate: opened and checked
        through HDF5 (when the first block is asked for), read at its offset when contiguous."""

        def prepare() -> Any:
            # diff streams a variable twice (a byte-equality pass, then statistics): the second
            # call reuses the dataset the first one opened and checked.
            if self._last is not None and self._last[:2] == (shard, variable.key):
                return self._last[2]
            dsid = _safe_dataset(self._file(shard), variable.key, label)
            _check_readable(dsid, variable, label)
            self._last = (shard, variable.key, dsid)
            return dsid

        with self._h5_lock:
            dsid = guard_h5(label, prepare)
        shape = tuple(int(d) for d in (dsid.shape or ()))
        if not shape or _is_variable_length(dsid.dtype) or shape != tuple(variable.shape):
            yield from super().iter_blocks(variable, elements)
            return
        with self._h5_lock:
            direct = self._direct_location(shard, dsid, variable)
        if direct is not None:
            yield from self._direct_blocks(label, variable, *direct, elements)
            return
        for start, count in _hyperslabs(shape, elements):
            with self._h5_lock:
                block = guard_h5(label, lambda: _read_numeric(dsid, variable, label, start, count))  # noqa: B023
            yield block.reshape(-1)
            del block

    def _listed_location(self, shard: int, variable: m.Variable) -> tuple[str, int, np.dtype] | None:
        """Where the listing found ``variable``'s bytes, while the file is still the one listed
        (same device, inode, size and modification time): else None, and the dataset is
        opened and checked again through HDF5."""
        listed = self._listed.get(shard) if self._direct else None
        location = listed[1].get(variable.key) if listed else None
        if location is None:
            return None
        offset, stored = location
        dtype = self._direct_dtype(stored, variable.dtype == "bfloat16")
        if dtype is None:
            return None
        path = self._labels[shard]
        try:
            if self._data.fingerprint(path) != listed[0]:
                return None
        except CkptError:
            return None
        size = self._data.size(path)
        if size is None or offset + variable.size * dtype.itemsize > size:
            return None
        return path, offset, dtype

    def _direct_dtype(self, stored: Any, bfloat16: bool) -> np.dtype | None:
        """The numpy dtype a listed dataset's bytes are read as (``stored``: our own reader's
        :class:`~.hdf5.DType`, or numpy's), or None when they are not read at their offset;
        looked up once per stored type (a file holds a handful)."""
        known = self._dtypes.get((stored, bfloat16), _UNKNOWN)
        if known is not _UNKNOWN:
            return known
        import numpy as np  # noqa: PLC0415 - numpy only where values are read

        stored_np = np.dtype(stored)  # our own reader's listing gives an hdf5.DType
        dtype = m.numpy_dtype("bfloat16") if bfloat16 else stored_np
        if dtype is None or dtype.kind not in DIRECT_KINDS or dtype.itemsize != stored_np.itemsize:
            dtype = None
        self._dtypes[(stored, bfloat16)] = dtype
        return dtype

    def _direct_location(self, shard: int, dsid: Any, variable: m.Variable) -> tuple[str, int, np.dtype] | None:
        """Where a dataset's bytes can be read straight from the file: contiguous storage
        (never filtered) of a fixed-size number type in a local HDF5 file, inside the file."""
        dtype = m.numpy_dtype("bfloat16") if variable.dtype == "bfloat16" else dsid.dtype
        if not self._direct or dtype is None or dtype.kind not in DIRECT_KINDS or dtype.itemsize != dsid.dtype.itemsize:
            return None
        offset = dsid.get_offset()
        if offset is None:
            return None
        path = self._labels[shard]
        size = self._data.size(path)
        nbytes = variable.size * dsid.dtype.itemsize
        if size is None or offset + nbytes > size or dsid.get_storage_size() != nbytes:
            return None
        return path, offset, dtype

    def _direct_read(self, label: str, variable: m.Variable, path: str, offset: int, dtype: np.dtype) -> np.ndarray:
        import numpy as np  # noqa: PLC0415 - numpy only where values are read

        value = np.empty(variable.size, dtype=dtype)
        nbytes = value.nbytes
        if nbytes:
            try:
                got = self._data.pread_into(path, memoryview(value.view(np.uint8)), offset)
            except OSError as e:
                raise CorruptCheckpointError(f"{label}: cannot read dataset {variable.key!r}: {e.strerror or e}") from None
            if got != nbytes:
                raise CorruptCheckpointError(f"{label}: dataset {variable.key!r} ends past the end of the file")
        return value.reshape(variable.shape)

    def _direct_blocks(self, label: str, variable: m.Variable, path: str, offset: int, dtype: np.dtype,
                       elements: int) -> Iterator[np.ndarray]:
        """Blocks read with ``pread`` into one pooled buffer (each block overwrites the last)."""
        import numpy as np  # noqa: PLC0415 - numpy only where values are read

        total = variable.size
        elements = max(1, elements)
        buf = self._data.take_buffer(min(elements, total) * dtype.itemsize)
        try:
            view = memoryview(buf)
            done = 0
            while done < total:
                n = min(elements, total - done)
                nbytes = n * dtype.itemsize
                try:
                    got = self._data.pread_into(path, view[:nbytes], offset + done * dtype.itemsize)
                except OSError as e:
                    raise CorruptCheckpointError(f"{label}: cannot read dataset {variable.key!r}: {e.strerror or e}") from None
                if got != nbytes:
                    raise CorruptCheckpointError(f"{label}: dataset {variable.key!r} ends past the end of the file")
                yield np.frombuffer(buf, dtype=dtype, count=n)
                done += n
        finally:
            self._data.give_buffer(buf)

    def close(self) -> None:
        self._last = None
        self._data.close()
        with self._h5_lock:
            files, self._files = self._files, {}
        for f in files.values():
            try:
                f.close()
            except Exception:  # noqa: BLE001 - closing a damaged file must not raise
                pass
