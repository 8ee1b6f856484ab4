"""The storages of a ``torch.save`` file and :class:`TorchSource`, which reads tensors from them.

Both container layouts (:mod:`._torch_zip`, :mod:`._torch_legacy`) end here: :class:`Storages`
checks and deduplicates the persistent ids the pickle names, a :class:`Record` says where a
storage's bytes are (a range of the file, or a zip member to inflate), :func:`tensor_problem`
says why a view cannot be read from its record, and :class:`TorchSource` reads the values
(strided views of their storage, copied, little-endian; contiguous ones streamed and CRC-checked
when they are their whole record). :class:`TorchOpened` is what a layout's reader returns.
"""

from __future__ import annotations

import dataclasses
import os
import zipfile
import zlib
from typing import Any, Callable, Iterator

from ... import model as m
from ...errors import CheckpointNotFoundError, CorruptCheckpointError, UnsafeFileError, one_line
from .. import _fs
from .flatten import Flat
from .._torch_layout import ZIP_LOCAL_HEADER
from .unpickle import (
    MAX_KEY_CHARS,
    TORCH_ITEMSIZE,
    StorageRef,
    TensorRef,
    _StorageType,
    refusal_message,
    short_repr,
)
from .._torch_layout import valid_dims
from .._lazymod import lazy_import

# numpy loads when a value is read: listing a .pt needs only the pickle (see _lazymod).
np = lazy_import("numpy")

__all__ = [
    "Storages",
    "Record",
    "TorchSource",
    "TorchOpened",
    "member_offset",
    "torch_checkpoint",
    "tensor_problem",
    "tensor_problems",
]

ZIP_SIGNATURE = b"PK\x03\x04"

# Limits: a view may declare more bytes than its storage holds (a broadcast, stride 0) only up
# to MAX_BROADCAST_BYTES (compressed records: _torch_zip; nesting and expansion: _torch_flatten).
MAX_BROADCAST_BYTES = 256 << 20
# What all views of a file together may declare beyond the bytes they cover (stride-0 repeats),
# unless the environment variable says otherwise (for people who mean it).
BROADCAST_TOTAL_ENV = "CKPTINSPECT_MAX_BROADCAST_BYTES"
READ_CHUNK_BYTES = 8 << 20


def broadcast_total_limit() -> int:
    """The total expansion allowed: :data:`MAX_BROADCAST_BYTES` or ``$CKPTINSPECT_MAX_BROADCAST_BYTES``."""
    raw = os.environ.get(BROADCAST_TOTAL_ENV, "").strip()
    return int(raw) if raw.isdigit() else MAX_BROADCAST_BYTES


# -- storages ----------------------------------------------------------------------------------
class Storages:
    """The storages a pickle names, by key (each persistent id is checked and deduplicated)."""

    def __init__(self, label: str, legacy: bool):
        self.label = label
        self.legacy = legacy
        self.by_key: dict[str, StorageRef] = {}
        self.locations: dict[str, int] = {}

    def load(self, pid: Any) -> StorageRef:
        label = self.label
        if not isinstance(pid, tuple) or not pid:
            raise CorruptCheckpointError(f"{label}: persistent id {type(pid).__name__} is not a storage tuple")
        kind = pid[0].decode("ascii", "replace") if isinstance(pid[0], bytes) else pid[0]
        if kind == "module":
            raise UnsafeFileError(refusal_message(label, "a pickled nn.Module class", ("torch.nn.modules.",)))
        if kind != "storage" or len(pid) != (6 if self.legacy else 5):
            raise CorruptCheckpointError(f"{label}: persistent id {kind!r:.40} ({len(pid)} fields) is not a storage")
        storage_type, key, location, numel = pid[1:5]
        if isinstance(key, bytes):
            key = key.decode("ascii", "replace")
        if not isinstance(storage_type, _StorageType):
            raise CorruptCheckpointError(f"{label}: storage {key!r:.40} has no storage type")
        if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS:
            raise CorruptCheckpointError(f"{label}: storage key {key!r:.60} is not a short string")
        if not isinstance(location, str) or len(location) > 64:
            raise CorruptCheckpointError(f"{label}: storage {key!r} has a bad location {location!r:.60}")
        if type(numel) is not int or numel < 0:
            raise CorruptCheckpointError(f"{label}: storage {key!r} declares {numel!r:.40} elements")
        ref = StorageRef(key=key, dtype=str(storage_type), location=location, numel=numel)
        known = self.by_key.get(key)
        if known is None:
            self.by_key[key] = ref
            self.locations[location] = self.locations.get(location, 0) + 1
        elif (known.dtype, known.numel) != (ref.dtype, ref.numel):
            raise CorruptCheckpointError(
                f"{label}: storage {key!r} is declared as {known.numel} {known.dtype} and as {ref.numel} {ref.dtype}"
            )
        ref = self.by_key[key]
        if self.legacy and pid[5] is not None:
            view = pid[5]
            if not (isinstance(view, tuple) and len(view) == 3 and type(view[1]) is int and type(view[2]) is int
                    and view[1] >= 0 and view[2] >= 0 and view[1] + view[2] <= ref.numel):
                raise CorruptCheckpointError(f"{label}: storage {key!r} has a bad view {view!r:.80}")
            itemsize = TORCH_ITEMSIZE[ref.dtype]
            ref = dataclasses.replace(ref, numel=view[2], byte_offset=view[1] * itemsize)
        return ref


# -- reading bytes -----------------------------------------------------------------------------
@dataclasses.dataclass
class Record:
    """Where a storage's bytes are: ``size`` bytes at ``offset`` of the file (a legacy storage,
    or a stored zip member once its local header was read: ``local_header`` says where that is),
    or a zip member to inflate (compressed: ``offset`` and ``local_header`` None)."""

    name: str
    offset: int | None
    size: int
    crc: int | None = None
    member: zipfile.ZipInfo | None = None
    local_header: int | None = None

    @property
    def stored(self) -> bool:
        return self.offset is not None or self.local_header is not None


def tensor_problem(ref: TensorRef, record: Record | None, label: str, key: str) -> str | None:
    """Why a tensor cannot be read from its storage record, or None."""
    storage = ref.storage
    if record is None:
        return f"{label}: {key!r}: storage record {storage.key!r} named by the pickle is missing"
    if (type(ref.offset) is not int or ref.offset < 0 or valid_dims(ref.shape) is None
            or valid_dims(ref.stride) is None or ref.dtype not in TORCH_ITEMSIZE):  # what is used, checked again
        return f"{label}: {key!r}: view (offset {short_repr(ref.offset, 40)}, shape {short_repr(ref.shape)}) is not valid"
    itemsize = TORCH_ITEMSIZE[ref.dtype]
    declared = ref.numel * itemsize
    end = ref.byte_start + ref.byte_span
    if end > record.size:
        return (f"{label}: {key!r}: view (offset {ref.offset}, shape {list(ref.shape)}, stride {list(ref.stride)})"
                f" ends at byte {end} of storage {storage.key!r}, which holds {record.size} bytes")
    if declared > max(record.size, MAX_BROADCAST_BYTES):
        return (f"{label}: {key!r}: shape {list(ref.shape)} declares {declared} bytes over a storage of"
                f" {record.size}; refusing a possible size bomb")
    return None


class TorchSource(m.BaseSource):
    """Reads the tensors of one ``torch.save`` file from their storages (and numbers from memory).

    Args:
        path: The file.
        flat: What :func:`~._torch_flatten.flatten` found.
        records: Storage key -> where its bytes are.
        big_endian: The file's byte order.
        problems: key -> why it cannot be read (recorded when opened for checking).
    """

    def __init__(self, path: str, flat: Flat, records: dict[str, Record], big_endian: bool = False,
                 problems: dict[str, str] | None = None):
        self._path = path
        self._tensors = flat.tensors
        self._values = flat.values
        self._records = records
        self._big = big_endian
        self._problems = problems or {}
        self._f: Any = None

    def files(self) -> tuple[str, ...]:
        return (self._path,)

    def _file(self) -> Any:
        if self._f is None:
            try:
                self._f = _fs.open_binary(self._path)  # regular files only
            except OSError as e:
                raise CheckpointNotFoundError(f"{self._path}: cannot read: {one_line(e)}") from None
        return self._f

    def close(self) -> None:
        f, self._f = self._f, None
        if f is not None:
            f.close()

    def storage_order(self, variable: m.Variable) -> tuple:
        ref = self._tensors.get(variable.key)
        if ref is None:
            return (-1, 0)
        record = self._records.get(ref.storage.key)
        return ((record.local_header or record.offset or 0) if record else -1, ref.byte_start)

    def _offset(self, record: Record) -> int:
        """Where a stored record's bytes start (its local header read on first use)."""
        if record.offset is None:
            record.offset = member_offset(self._file(), record.member, _fs.file_size(self._file()),
                                           self._path)
        return record.offset

    def _read_range(self, record: Record, start: int, size: int) -> np.ndarray:
        """``size`` bytes at ``start`` of a storage record, in a new uint8 array."""
        out = np.empty(size, np.uint8)
        if size == 0:
            return out
        if not record.stored:  # a compressed member: inflated whole (bounded when opened)
            with _fs.open_binary(self._path) as raw, zipfile.ZipFile(raw) as zf, zf.open(record.member) as f:
                f.read(start)
                got = f.readinto(memoryview(out))
        else:
            f = self._file()
            f.seek(self._offset(record) + start)
            got = f.readinto(memoryview(out))
        if got != size:
            raise CorruptCheckpointError(
                f"{self._path}: storage {record.name!r} is truncated: needed {size} bytes at {start}, got {got}"
            )
        return out

    def _fix_order(self, raw: np.ndarray, dtype: str) -> np.ndarray:
        """Bytes of ``dtype`` elements in the file's byte order -> little-endian, in place."""
        if not self._big:
            return raw
        unit = TORCH_ITEMSIZE[dtype] // (2 if dtype.startswith("complex") else 1)
        if unit > 1:
            raw.view(f"<u{unit}").byteswap(inplace=True)
        return raw

    def _numpy_dtype(self, variable: m.Variable) -> np.dtype:
        dt = m.numpy_dtype(variable.dtype)
        if dt is None:  # pragma: no cover - every torch dtype read here has one
            raise CorruptCheckpointError(f"{self._path}: {variable.key!r}: dtype {variable.dtype} is not readable")
        return dt

    def _whole_record(self, ref: TensorRef, record: Record) -> bool:
        return ref.byte_start == 0 and ref.byte_span == record.size and ref.contiguous

    def _check_crc(self, record: Record, crc: int, key: str) -> None:
        if record.crc is not None and record.stored and crc != record.crc:
            raise CorruptCheckpointError(
                f"{self._path}: {key!r}: storage record {record.name!r} has CRC-32 {crc:#010x}, the archive"
                f" records {record.crc:#010x}"
            )

    def _lookup(self, variable: m.Variable) -> tuple[TensorRef, Record]:
        if variable.key in self._problems:
            raise CorruptCheckpointError(self._problems[variable.key])
        ref = self._tensors.get(variable.key)
        if ref is None:
            raise CheckpointNotFoundError(f"{self._path}: no tensor {variable.key!r}")
        record = self._records.get(ref.storage.key)
        problem = tensor_problem(ref, record, self._path, variable.key)
        if problem is not None:
            raise CorruptCheckpointError(problem)
        return ref, record

    def read(self, variable: m.Variable) -> np.ndarray:
        """The value of ``variable`` (a copy, little-endian, C order)."""
        if variable.key in self._values:
            return self._values[variable.key].copy()
        ref, record = self._lookup(variable)
        dtype = self._numpy_dtype(variable)
        itemsize = dtype.itemsize
        raw = self._read_range(record, ref.byte_start, ref.byte_span)
        if self._whole_record(ref, record):
            self._check_crc(record, zlib.crc32(raw), variable.key)
        self._fix_order(raw, ref.dtype)
        if ref.numel == 0:
            return np.zeros(ref.shape, dtype)
        flat = raw.view(dtype)
        if ref.contiguous and ref.byte_span == ref.numel * itemsize:
            return flat.reshape(ref.shape)
        view = np.lib.stride_tricks.as_strided(flat, shape=ref.shape, strides=tuple(s * itemsize for s in ref.stride))
        return np.array(view, copy=True, order="C")

    def iter_blocks(self, variable: m.Variable, elements: int) -> Iterator[np.ndarray]:
        """Contiguous tensors streamed from the file through one reused buffer (CRC-checked when
        the tensor is its whole storage record); others read whole."""
        if variable.key in self._values:
            yield from super().iter_blocks(variable, elements)
            return
        ref, record = self._lookup(variable)
        if not (ref.contiguous and record.stored and ref.byte_span == ref.numel * TORCH_ITEMSIZE[ref.dtype]):
            yield from super().iter_blocks(variable, elements)
            return
        dtype = self._numpy_dtype(variable)
        itemsize = dtype.itemsize
        block_bytes = max(1, min(elements, max(1, READ_CHUNK_BYTES // itemsize))) * itemsize
        buf = np.empty(min(block_bytes, ref.byte_span) or 1, np.uint8)
        f = self._file()
        pos = 0
        crc = 0
        whole = self._whole_record(ref, record)
        while pos < ref.byte_span:
            n = min(block_bytes, ref.byte_span - pos)
            f.seek(self._offset(record) + ref.byte_start + pos)
            got = f.readinto(memoryview(buf)[:n])
            if got != n:
                raise CorruptCheckpointError(
                    f"{self._path}: storage {record.name!r} is truncated: needed {ref.byte_span} bytes, got {pos + (got or 0)}"
                )
            if whole:
                crc = zlib.crc32(memoryview(buf)[:n], crc)
            self._fix_order(buf[:n], ref.dtype)
            pos += n
            for i in range(0, n, elements * itemsize):
                yield buf[i : min(n, i + elements * itemsize)].view(dtype)
        if whole:
            self._check_crc(record, crc, variable.key)


# -- zip members -------------------------------------------------------------------------------
def member_offset(f: Any, info: zipfile.ZipInfo, size: int, label: str) -> int:
    """Where a stored member's bytes start (after its local header)."""
    f.seek(info.header_offset)
    head = f.read(ZIP_LOCAL_HEADER.size)
    if len(head) != ZIP_LOCAL_HEADER.size or head[:4] != ZIP_SIGNATURE:
        raise CorruptCheckpointError(f"{label}: archive member {info.filename!r} has no local header at {info.header_offset}")
    fields = ZIP_LOCAL_HEADER.unpack(head)
    start = info.header_offset + ZIP_LOCAL_HEADER.size + fields[9] + fields[10]
    if start + info.file_size > size:
        raise CorruptCheckpointError(
            f"{label}: archive member {info.filename!r} needs bytes up to {start + info.file_size}, the file has {size}"
            " (truncated)"
        )
    return start


# -- what a layout's reader returns ------------------------------------------------------------
@dataclasses.dataclass
class TorchOpened:
    """An opened file: the checkpoint, key -> why that tensor cannot be read (when opened for
    checking), and the check of the stored records' CRC-32s (zip layout)."""

    ckpt: m.Checkpoint
    problems: dict[str, str]
    crc_check: Callable[[], list[m.Damage]] | None = None


def torch_checkpoint(path: str, fmt: str, flat: Flat, storages: Storages, records: dict[str, Record],
                     extra: dict[str, Any], *, big_endian: bool, problems: dict[str, str]) -> m.Checkpoint:
    """The checkpoint of an opened ``torch.save`` file of either layout: its flattened variables
    and step, a :class:`TorchSource` over ``records``, and ``info``: ``extra`` (the layout's own
    facts), then storages, ties, strings."""
    info: dict[str, Any] = dict(extra)
    needs = info.pop("needs", None) or []
    info["storages"] = len(storages.by_key)
    if needs:  # globals kept as inert stand-ins: what torch.load(weights_only=True) would need
        info["needs"] = list(needs)
        info["warnings"] = [needs_message(needs)]
    if storages.locations and set(storages.locations) != {"cpu"}:
        info["storage_locations"] = dict(sorted(storages.locations.items()))
    if flat.tied:
        info["tied"] = flat.tied
    if flat.model_prefix:
        info["state_dict_prefix"] = flat.model_prefix
    if flat.strings:
        info["strings"] = flat.strings
    return m.Checkpoint(
        path=path,
        format=fmt,
        variables=tuple(flat.variables),
        step=flat.step,
        step_source=flat.step_source,
        num_shards=1,
        info=info,
        source=TorchSource(path, flat, records, big_endian=big_endian, problems=problems),
    )


def needs_message(needs: list[str]) -> str:
    """The line saying which globals a plain ``torch.load(weights_only=True)`` would refuse."""
    shown = ", ".join(needs[:8]) + (f" (+{len(needs) - 8} more)" if len(needs) > 8 else "")
    return (f"needs: {shown}: globals torch.load(weights_only=True) refuses unless given to"
            " torch.serialization.add_safe_globals; read here as inert stand-ins (never imported, nothing run)")


def tensor_problems(flat: Flat, records: dict[str, Record], label: str, strict: bool,
                    storage_problems: dict[str, str] | None = None) -> dict[str, str]:
    """Why each tensor cannot be read (strict: raise the first)."""
    problems = {}
    expansion = 0
    limit = broadcast_total_limit()
    for key, ref in flat.tensors.items():
        problem = (storage_problems or {}).get(ref.storage.key)
        if problem is None:
            problem = tensor_problem(ref, records.get(ref.storage.key), label, key)
        if problem is None:
            expansion += max(0, ref.numel * TORCH_ITEMSIZE[ref.dtype] - ref.byte_span)
            if expansion > limit:
                problem = (f"{label}: {key!r}: views that repeat their storage's bytes (stride 0) declare {expansion}"
                           f" bytes beyond what they cover, over the limit of {limit} for a file (set"
                           f" {BROADCAST_TOTAL_ENV} to allow more); refusing a possible size bomb")
        if problem is not None:
            if strict:
                raise (UnsafeFileError if "size bomb" in problem else CorruptCheckpointError)(problem)
            problems[key] = problem
    return problems
