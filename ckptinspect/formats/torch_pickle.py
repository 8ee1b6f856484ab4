"""``torch.save`` files, read without torch and without running pickle code.

Two container layouts (torch/serialization.py):

* zip (torch >= 1.6, the default): a zip archive of stored members under one root folder
  (``archive/``, or the file's stem): ``<root>/data.pkl`` (the pickle), ``<root>/data/<key>``
  (one raw storage per key), ``<root>/byteorder``, ``<root>/version``... The archive is read in
  place: stored storages are read straight from their offset in the file, and ``verify``
  checks their CRC-32s.
* legacy (``_use_new_zipfile_serialization=False``, torch < 1.6): five pickles in a row (magic
  number, protocol 1001, sys_info, the object, the list of storage keys), then each storage
  in the order of that list as an 8-byte little-endian element count and the raw elements.

The object pickle is read by :mod:`._torch_unpickle` (allow-listed globals only, to inert
stand-ins) and named by :mod:`._torch_flatten` (``a/b/c`` names, roles, step, ties). Tensors
are strided views of their storage (offset, shape, strides), read from the storage's bytes
(``as_strided`` over them, copied), whatever device the storage was saved from.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import zipfile
import zlib
from typing import Any, Callable, Iterator

from .. import model as m
from ..errors import CheckpointNotFoundError, CorruptCheckpointError, NotACheckpointError, UnsafeFileError
from . import _fs
from ._readcheck import Opened, ReadCheck
from ._torch_flatten import Flat, flatten
from ._torch_layout import DATA_PKL, LEGACY_HEAD_BYTES, LEGACY_MAGIC, ZIP_LOCAL_HEADER, is_data_pkl, is_torch_legacy_head
from ._torch_unpickle import (
    MAX_KEY_CHARS,
    MAX_PICKLE_BYTES,
    TORCH_ITEMSIZE,
    StorageRef,
    TensorRef,
    _StorageType,
    refusal_message,
    unpickle,
)
from ._lazymod import lazy_import

# numpy loads when a value is read: listing a .pt needs only the pickle (see _lazymod).
np = lazy_import("numpy")

__all__ = [
    "FORMAT_TORCH_ZIP",
    "FORMAT_TORCH_LEGACY",
    "open_torch",
    "open_torch_zip",
    "open_torch_legacy",
    "check_torch",
    "TorchSource",
]

FORMAT_TORCH_ZIP = m.FORMAT_TORCH_ZIP
FORMAT_TORCH_LEGACY = m.FORMAT_TORCH_LEGACY

ZIP_SIGNATURE = b"PK\x03\x04"
TORCHSCRIPT_MARKERS = ("constants.pkl", "code/")
LEGACY_PROTOCOL = 1001
LEGACY_COUNT = struct.Struct("<q")
FIRST_READ_BYTES = 1 << 20

# Limits: a compressed storage record is decompressed into memory up to MAX_INFLATE_BYTES and
# may expand at most MAX_EXPANSION times; a view may declare more bytes than its storage holds
# (a broadcast, stride 0) only up to MAX_BROADCAST_BYTES (nesting and expansion: _torch_flatten).
MAX_INFLATE_BYTES = 256 << 20
MAX_EXPANSION = 1100
MAX_BROADCAST_BYTES = 256 << 20
READ_CHUNK_BYTES = 8 << 20

def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


# -- storages ----------------------------------------------------------------------------------
class _Storages:
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
class _Record:
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


def _tensor_problem(ref: TensorRef, record: _Record | None, label: str, key: str) -> str | None:
    """Why a tensor cannot be read from its storage record, or None."""
    storage = ref.storage
    if record is None:
        return f"{label}: {key!r}: storage record {storage.key!r} named by the pickle is missing"
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
        flat: What :func:`flatten` found.
        records: Storage key -> where its bytes are.
        big_endian: The file's byte order.
        problems: key -> why it cannot be read (recorded when opened for checking).
    """

    def __init__(self, path: str, flat: Flat, records: dict[str, _Record], big_endian: bool = False,
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
                raise CheckpointNotFoundError(f"{self._path}: cannot read: {_one_line(e)}") from None
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

    def _offset(self, record: _Record) -> int:
        """Where a stored record's bytes start (its local header read on first use)."""
        if record.offset is None:
            record.offset = _member_offset(self._file(), record.member, os.fstat(self._file().fileno()).st_size,
                                           self._path)
        return record.offset

    def _read_range(self, record: _Record, start: int, size: int) -> np.ndarray:
        """``size`` bytes at ``start`` of a storage record, in a new uint8 array."""
        out = np.empty(size, np.uint8)
        if size == 0:
            return out
        if not record.stored:  # a compressed member: inflated whole (bounded when opened)
            with zipfile.ZipFile(self._path) as zf, zf.open(record.member) as f:
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

    def _whole_record(self, ref: TensorRef, record: _Record) -> bool:
        return ref.byte_start == 0 and ref.byte_span == record.size and ref.contiguous

    def _check_crc(self, record: _Record, crc: int, key: str) -> None:
        if record.crc is not None and record.stored and crc != record.crc:
            raise CorruptCheckpointError(
                f"{self._path}: {key!r}: storage record {record.name!r} has CRC-32 {crc:#010x}, the archive"
                f" records {record.crc:#010x}"
            )

    def _lookup(self, variable: m.Variable) -> tuple[TensorRef, _Record]:
        if variable.key in self._problems:
            raise CorruptCheckpointError(self._problems[variable.key])
        ref = self._tensors.get(variable.key)
        if ref is None:
            raise CheckpointNotFoundError(f"{self._path}: no tensor {variable.key!r}")
        record = self._records.get(ref.storage.key)
        problem = _tensor_problem(ref, record, self._path, variable.key)
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


# -- the zip layout ----------------------------------------------------------------------------
def _zip_root(label: str, names: list[str]) -> str:
    roots = sorted({n[: -len(DATA_PKL)] for n in names if is_data_pkl(n)})
    if not roots:
        raise NotACheckpointError(f"{label}: a zip archive without data.pkl; not a torch.save file")
    if len(roots) > 1:
        raise CorruptCheckpointError(f"{label}: several data.pkl records ({', '.join(r + DATA_PKL for r in roots[:3])})")
    return roots[0]


def _member_offset(f: Any, info: zipfile.ZipInfo, size: int, label: str) -> int:
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


def _check_inflate(label: str, info: zipfile.ZipInfo) -> None:
    if info.file_size > MAX_INFLATE_BYTES or info.file_size > MAX_EXPANSION * max(info.compress_size, 1) + (1 << 20):
        raise UnsafeFileError(
            f"{label}: archive member {info.filename!r} is compressed and declares {info.file_size} bytes from"
            f" {info.compress_size} (limit {MAX_INFLATE_BYTES}; torch stores records uncompressed); refusing a"
            " possible zip bomb"
        )


def _open_zipfile(path: str, f: Any) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(f)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, OSError) as e:
        size = os.fstat(f.fileno()).st_size
        raise CorruptCheckpointError(
            f"{path}: not a readable zip archive ({size} bytes), truncated or damaged: {_one_line(e)}"
        ) from None


@dataclasses.dataclass
class _Opened:
    ckpt: m.Checkpoint
    problems: dict[str, str]
    crc_check: Callable[[], list[m.Damage]] | None = None


def _info(flat: Flat, storages: _Storages, extra: dict[str, Any]) -> dict[str, Any]:
    info: dict[str, Any] = dict(extra)
    info["storages"] = len(storages.by_key)
    if storages.locations and set(storages.locations) != {"cpu"}:
        info["storage_locations"] = dict(sorted(storages.locations.items()))
    if flat.tied:
        info["tied"] = flat.tied
    if flat.model_prefix:
        info["state_dict_prefix"] = flat.model_prefix
    if flat.strings:
        info["strings"] = flat.strings
    return info


def _problems(flat: Flat, records: dict[str, _Record], label: str, strict: bool,
              storage_problems: dict[str, str] | None = None) -> dict[str, str]:
    """Why each tensor cannot be read (strict: raise the first)."""
    problems = {}
    for key, ref in flat.tensors.items():
        problem = (storage_problems or {}).get(ref.storage.key)
        if problem is None:
            problem = _tensor_problem(ref, records.get(ref.storage.key), label, key)
        if problem is not None:
            if strict:
                raise (UnsafeFileError if "size bomb" in problem else CorruptCheckpointError)(problem)
            problems[key] = problem
    return problems


def _zip_opened(path: str, strict: bool) -> _Opened:
    if _fs.is_remote(path):
        raise NotACheckpointError(f"{path}: torch files are read from local paths only")
    _fs.read_range(path, 0, 1)  # the usual not-found / permission messages
    with _fs.open_binary(path) as f:  # regular files only (a FIFO would block)
        size = os.fstat(f.fileno()).st_size
        zf = _open_zipfile(path, f)
        infos = {i.filename: i for i in zf.infolist()}
        root = _zip_root(path, list(infos))
        if any(root + marker in infos or any(n.startswith(root + marker) for n in infos) for marker in TORCHSCRIPT_MARKERS):
            raise NotACheckpointError(
                f"{path}: is a TorchScript archive (torch.jit.save), not a torch.save file; its code is not read"
            )
        pkl = infos[root + DATA_PKL]
        if pkl.file_size > MAX_PICKLE_BYTES:
            raise UnsafeFileError(f"{path}: data.pkl declares {pkl.file_size} bytes (limit {MAX_PICKLE_BYTES}); refusing")
        if pkl.compress_type == zipfile.ZIP_STORED:
            f.seek(_member_offset(f, pkl, size, path))
            data = f.read(pkl.file_size)
            if zlib.crc32(data) != pkl.CRC:
                raise CorruptCheckpointError(f"{path}: {root}{DATA_PKL} does not match its CRC-32 (damaged)")
        else:
            _check_inflate(path, pkl)
            try:
                data = zf.read(pkl)
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
                raise CorruptCheckpointError(f"{path}: cannot inflate {root}{DATA_PKL}: {_one_line(e)}") from None
        storages = _Storages(path, legacy=False)
        obj, scanned = unpickle(data, storages.load, path)
        flat = flatten(obj, path, scanned.opcodes)
        records: dict[str, _Record] = {}
        storage_problems: dict[str, str] = {}
        for key, storage in storages.by_key.items():
            info = infos.get(f"{root}data/{key}")
            if info is None:
                continue  # reported per tensor
            if info.compress_type != zipfile.ZIP_STORED:
                _check_inflate(path, info)  # before anything else: a bomb is refused, not reported
            try:
                if info.file_size != storage.nbytes:
                    raise CorruptCheckpointError(
                        f"{path}: storage record {info.filename!r} holds {info.file_size} bytes, the pickle declares"
                        f" {storage.numel} {storage.dtype} ({storage.nbytes} bytes)"
                    )
                if info.compress_type == zipfile.ZIP_STORED:
                    if strict:  # the local header is read when the bytes are first read
                        if info.header_offset + ZIP_LOCAL_HEADER.size + len(info.filename) + info.file_size > size:
                            raise CorruptCheckpointError(
                                f"{path}: archive member {info.filename!r} needs bytes past the end of the file"
                                f" ({size} bytes, truncated)"
                            )
                        records[key] = _Record(info.filename, None, info.file_size, info.CRC, info, info.header_offset)
                    else:
                        records[key] = _Record(info.filename, _member_offset(f, info, size, path), info.file_size,
                                               info.CRC, info, info.header_offset)
                else:
                    records[key] = _Record(info.filename, None, info.file_size, None, info)
            except CorruptCheckpointError as e:
                if strict:
                    raise
                storage_problems[key] = str(e)
        problems = _problems(flat, records, path, strict, storage_problems)
        version = zf.read(infos[root + "version"]).decode("ascii", "replace").strip() if root + "version" in infos and infos[root + "version"].file_size < 64 else None
        byteorder = zf.read(infos[root + "byteorder"]).decode("ascii", "replace").strip() if root + "byteorder" in infos and infos[root + "byteorder"].file_size < 64 else "little"
    if byteorder not in ("little", "big"):
        raise CorruptCheckpointError(f"{path}: byteorder record {byteorder!r:.20} is neither little nor big")
    extra: dict[str, Any] = {"zip_root": root.rstrip("/"), "byteorder": byteorder}
    if version:
        extra["archive_version"] = version
    extra["pickle_globals"] = list(scanned.globals)
    ckpt = m.Checkpoint(
        path=path,
        format=FORMAT_TORCH_ZIP,
        variables=tuple(flat.variables),
        step=flat.step,
        step_source=flat.step_source,
        num_shards=1,
        info=_info(flat, storages, extra),
        source=TorchSource(path, flat, records, big_endian=byteorder == "big", problems=problems),
    )

    def crc_check() -> list[m.Damage]:
        return _zip_crc_damage(path, records, flat)

    return _Opened(ckpt, problems, crc_check)


def _zip_crc_damage(path: str, records: dict[str, _Record], flat: Flat) -> list[m.Damage]:
    """Every stored storage record whose bytes do not match its CRC-32, as damage of the first
    tensor using it."""
    users: dict[str, str] = {}
    for key, ref in flat.tensors.items():
        users.setdefault(ref.storage.key, key)
    damage = []
    with _fs.open_binary(path) as f:  # regular files only (a FIFO would block)
        for skey, rec in records.items():
            if rec.offset is None or rec.crc is None or skey not in users:
                continue
            f.seek(rec.offset)
            crc, left = 0, rec.size
            while left:
                chunk = f.read(min(READ_CHUNK_BYTES, left))
                if not chunk:
                    break
                crc = zlib.crc32(chunk, crc)
                left -= len(chunk)
            if left or crc != rec.crc:
                problem = (f"storage record {rec.name!r} is truncated" if left else
                           f"storage record {rec.name!r} has CRC-32 {crc:#010x}, the archive records {rec.crc:#010x}")
                damage.append(m.Damage(key=users[skey], name=users[skey], file=path,
                                       kind=m.DAMAGE_TRUNCATED if left else m.DAMAGE_CHECKSUM, problem=problem,
                                       offset=rec.offset, size=rec.size))
    return damage


def open_torch_zip(path: str) -> m.Checkpoint:
    """Open a ``torch.save`` zip file (metadata only; tensors are read on demand).

    Raises:
        UnsafeFileError: The pickle calls something other than the allowed rebuild functions,
            storage types and containers (the message names it), or declares absurd sizes.
        CorruptCheckpointError: A damaged archive, pickle or storage record.
        NotACheckpointError: A zip without data.pkl, or a TorchScript archive.
    """
    return _zip_opened(str(path), strict=True).ckpt


# -- the legacy layout -------------------------------------------------------------------------
class _Growing:
    """The head of a file, read in growing pieces until a pickle fits."""

    def __init__(self, path: str):
        self.path = path
        self.size = _fs.getsize(path)
        self.data = _fs.read_range(path, 0, min(self.size, FIRST_READ_BYTES))

    def unpickle(self, start: int, persistent_load: Callable[[Any], Any], what: str) -> tuple[Any, int]:
        """The pickle at ``start``: (object, where it ends); :attr:`opcodes` its opcode count."""
        while True:
            try:
                obj, scanned = unpickle(self.data, persistent_load, self.path, start=start)
                self.opcodes = scanned.opcodes
                return obj, scanned.end
            except CorruptCheckpointError as e:
                if len(self.data) >= self.size or len(self.data) - start > MAX_PICKLE_BYTES:
                    raise CorruptCheckpointError(f"{self.path}: the legacy {what} pickle is damaged: {str(e).removeprefix(self.path + ': ')}") from None
                self.data = _fs.read_range(self.path, 0, min(self.size, max(len(self.data) * 4, start + FIRST_READ_BYTES)))


def _no_storages(label: str) -> Callable[[Any], Any]:
    def load(pid: Any) -> Any:
        raise CorruptCheckpointError(f"{label}: a storage inside the legacy header pickles")

    return load


def _legacy_opened(path: str, strict: bool) -> _Opened:
    if _fs.is_remote(path):
        raise NotACheckpointError(f"{path}: torch files are read from local paths only")
    head = _Growing(path)
    magic, pos = head.unpickle(0, _no_storages(path), "magic number")
    if magic != LEGACY_MAGIC:
        raise NotACheckpointError(f"{path}: not a legacy torch.save file (wrong magic number)")
    protocol, pos = head.unpickle(pos, _no_storages(path), "protocol")
    if protocol != LEGACY_PROTOCOL:
        raise NotACheckpointError(f"{path}: legacy torch.save protocol {protocol!r:.20} is not {LEGACY_PROTOCOL}")
    sys_info, pos = head.unpickle(pos, _no_storages(path), "sys_info")
    if not isinstance(sys_info, dict):
        raise CorruptCheckpointError(f"{path}: the legacy sys_info pickle is not a dict")
    big_endian = sys_info.get("little_endian", True) is False
    storages = _Storages(path, legacy=True)
    obj, pos = head.unpickle(pos, storages.load, "object")
    opcodes = head.opcodes
    keys, pos = head.unpickle(pos, _no_storages(path), "storage key list")
    if not isinstance(keys, list) or not all(isinstance(k, (str, bytes)) for k in keys):
        raise CorruptCheckpointError(f"{path}: the legacy storage key list is not a list of strings")
    keys = [k.decode("ascii", "replace") if isinstance(k, bytes) else k for k in keys]
    flat = flatten(obj, path, opcodes)
    records: dict[str, _Record] = {}
    problem = ""
    size = head.size
    offset = pos
    unknown = [k for k in keys if k not in storages.by_key]
    if unknown:
        raise CorruptCheckpointError(f"{path}: the legacy storage list names {unknown[0]!r}, which the pickle never uses")
    with _fs.open_binary(path) as f:  # regular files only (a FIFO would block)
        for key in keys:
            storage = storages.by_key[key]
            f.seek(offset)
            raw = f.read(LEGACY_COUNT.size)
            if len(raw) != LEGACY_COUNT.size:
                problem = f"{path}: truncated: storage {key!r} should start at byte {offset}, the file has {size}"
                if strict:
                    raise CorruptCheckpointError(problem)
                break
            (count,) = LEGACY_COUNT.unpack(raw)
            if count != storage.numel:
                problem = f"{path}: storage {key!r} holds {count} elements, the pickle declares {storage.numel}"
                if strict:
                    raise CorruptCheckpointError(problem)
                break
            nbytes = storage.nbytes
            start = offset + LEGACY_COUNT.size
            if start + nbytes > size:
                if strict:
                    raise CorruptCheckpointError(
                        f"{path}: truncated: storage {key!r} needs bytes up to {start + nbytes}, the file has {size}"
                    )
                break
            records[key] = _Record(key, start, nbytes)
            offset = start + nbytes
    missing = [k for k in storages.by_key if k not in keys]
    if missing and strict:
        raise CorruptCheckpointError(f"{path}: storage {missing[0]!r} used by the pickle is not in the legacy storage list")
    storage_problems = {k: (f"{path}: storage {k!r} is missing or truncated (the legacy storages end at byte"
                            f" {offset} of {size}){': ' + problem.removeprefix(path + ': ') if problem else ''}")
                        for k in storages.by_key if k not in records}
    problems = _problems(flat, records, path, strict, storage_problems)
    info = _info(flat, storages, {"byteorder": "big" if big_endian else "little", "pickle_globals": [],
                                  "legacy_protocol": LEGACY_PROTOCOL})
    ckpt = m.Checkpoint(
        path=path,
        format=FORMAT_TORCH_LEGACY,
        variables=tuple(flat.variables),
        step=flat.step,
        step_source=flat.step_source,
        num_shards=1,
        info=info,
        source=TorchSource(path, flat, records, big_endian=big_endian, problems=problems),
    )
    return _Opened(ckpt, problems)


def open_torch_legacy(path: str) -> m.Checkpoint:
    """Open a legacy (pre-1.6) ``torch.save`` file (metadata only).

    Raises:
        UnsafeFileError, CorruptCheckpointError, NotACheckpointError: As :func:`open_torch_zip`.
    """
    return _legacy_opened(str(path), strict=True).ckpt


def open_torch(path: str) -> m.Checkpoint:
    """Open a ``torch.save`` file of either layout, told apart by content."""
    path = str(path)
    if is_torch_legacy_head(_fs.read_head(path, LEGACY_HEAD_BYTES)):
        return open_torch_legacy(path)
    return open_torch_zip(path)


def check_torch(path: str) -> ReadCheck:
    """Plan ``verify`` of a torch file: structure (storage records, views within them), zip
    CRC-32s of the storage records, and every tensor read."""

    def opener(p: str) -> Opened:
        legacy = is_torch_legacy_head(_fs.read_head(p, LEGACY_HEAD_BYTES))
        opened = _legacy_opened(p, strict=False) if legacy else _zip_opened(p, strict=False)
        damaged = [m.Damage(key=k, name=k, file=p, kind=m.DAMAGE_LAYOUT, problem=problem.removeprefix(p + ": "))
                   for k, problem in opened.problems.items()]
        return Opened(opened.ckpt, damaged, opened.crc_check)

    return ReadCheck(str(path), opener)
