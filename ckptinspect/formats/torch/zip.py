"""The zip layout of ``torch.save`` (torch >= 1.6, the default), read in place.

A zip archive of stored members under one root folder (``archive/``, or the file's stem):
``<root>/data.pkl`` (the pickle), ``<root>/data/<key>`` (one raw storage per key),
``<root>/byteorder``, ``<root>/version``... Stored storages are read straight from their offset
in the file (:class:`~._torch_source.Record`); compressed ones are inflated whole, within
:data:`MAX_INFLATE_BYTES` and :data:`MAX_EXPANSION`. TorchScript archives are refused, their
code never read. ``verify`` checks the stored records' CRC-32s (:func:`zip_crc_damage`).
"""

from __future__ import annotations

import collections
import zipfile
import zlib
from typing import Any

from ... import model as m
from ...errors import CorruptCheckpointError, NotACheckpointError, UnsafeFileError, one_line
from .. import _fs
from .flatten import Flat, flatten
from .._torch_layout import DATA_PKL, ZIP_LOCAL_HEADER, is_data_pkl
from .source import (
    READ_CHUNK_BYTES,
    Record,
    Storages,
    TorchOpened,
    member_offset,
    tensor_problems,
    torch_checkpoint,
)
from .unpickle import MAX_PICKLE_BYTES, unpickle

__all__ = ["zip_opened", "zip_crc_damage"]

TORCHSCRIPT_MARKERS = ("constants.pkl", "code/")

# Limits: a compressed storage record is decompressed into memory up to MAX_INFLATE_BYTES and
# may expand at most MAX_EXPANSION times.
MAX_INFLATE_BYTES = 256 << 20
MAX_EXPANSION = 1100
# A compressed data.pkl (torch never compresses it; a re-zipped file may) may expand at most
# this much: a real pickle deflates a few times, a bomb of no-op opcodes about 1000 times.
MAX_PICKLE_EXPANSION = 100


def _zip_root(label: str, names: list[str]) -> str:
    roots = sorted({n[: -len(DATA_PKL)] for n in names if is_data_pkl(n)})
    if not roots:
        raise NotACheckpointError(f"{label}: a zip archive without data.pkl; not a torch.save file")
    if len(roots) > 1:
        raise CorruptCheckpointError(f"{label}: several data.pkl records ({', '.join(r + DATA_PKL for r in roots[:3])})")
    return roots[0]


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
        size = _fs.file_size(f)
        raise CorruptCheckpointError(
            f"{path}: not a readable zip archive ({size} bytes), truncated or damaged: {one_line(e)}"
        ) from None


def zip_opened(path: str, strict: bool) -> TorchOpened:
    """Open a zip-layout file: strict (``open``) raises the first problem, otherwise (``verify``)
    problems are recorded per tensor and the stored records' CRC-32s are checked later."""
    _fs.read_range(path, 0, 1)  # the usual not-found / permission messages
    with _fs.open_binary(path) as f:  # regular files only (a FIFO would block)
        size = _fs.file_size(f)
        zf = _open_zipfile(path, f)
        counts = collections.Counter(i.filename for i in zf.infolist())
        for name, count in counts.items():
            if count > 1:  # readers disagree on which copy counts: a known way to hide content
                raise CorruptCheckpointError(
                    f"{path}: archive member {name!r} appears {count} times (readers disagree on which copy counts:"
                    " a known way to hide content); refusing")
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
            f.seek(member_offset(f, pkl, size, path))
            data = f.read(pkl.file_size)
            if zlib.crc32(data) != pkl.CRC:
                raise CorruptCheckpointError(f"{path}: {root}{DATA_PKL} does not match its CRC-32 (damaged)")
        else:
            _check_inflate(path, pkl)
            if pkl.file_size > MAX_PICKLE_EXPANSION * max(pkl.compress_size, 1) + (1 << 20):
                raise UnsafeFileError(
                    f"{path}: {root}{DATA_PKL} is compressed and declares {pkl.file_size} bytes from {pkl.compress_size}"
                    f" (more than {MAX_PICKLE_EXPANSION}:1; torch stores it uncompressed); refusing a possible zip bomb")
            try:
                data = zf.read(pkl)
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
                raise CorruptCheckpointError(f"{path}: cannot inflate {root}{DATA_PKL}: {one_line(e)}") from None
        storages = Storages(path, legacy=False)
        obj, scanned = unpickle(data, storages.load, path)
        flat = flatten(obj, path, scanned.opcodes)
        records: dict[str, Record] = {}
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
                        records[key] = Record(info.filename, None, info.file_size, info.CRC, info, info.header_offset)
                    else:
                        records[key] = Record(info.filename, member_offset(f, info, size, path), info.file_size,
                                              info.CRC, info, info.header_offset)
                else:
                    records[key] = Record(info.filename, None, info.file_size, None, info)
            except CorruptCheckpointError as e:
                if strict:
                    raise
                storage_problems[key] = str(e)
        problems = tensor_problems(flat, records, path, strict, storage_problems)
        version = zf.read(infos[root + "version"]).decode("ascii", "replace").strip() if root + "version" in infos and infos[root + "version"].file_size < 64 else None
        byteorder = zf.read(infos[root + "byteorder"]).decode("ascii", "replace").strip() if root + "byteorder" in infos and infos[root + "byteorder"].file_size < 64 else "little"
    if byteorder not in ("little", "big"):
        raise CorruptCheckpointError(f"{path}: byteorder record {byteorder!r:.20} is neither little nor big")
    extra: dict[str, Any] = {"zip_root": root.rstrip("/"), "byteorder": byteorder}
    if version:
        extra["archive_version"] = version
    extra["pickle_globals"] = list(scanned.globals)
    extra["needs"] = list(scanned.needs)
    ckpt = torch_checkpoint(path, m.FORMAT_TORCH_ZIP, flat, storages, records, extra, big_endian=byteorder == "big",
                            problems=problems)

    def crc_check() -> list[m.Damage]:
        return zip_crc_damage(path, records, flat)

    return TorchOpened(ckpt, problems, crc_check)


def zip_crc_damage(path: str, records: dict[str, Record], flat: Flat) -> list[m.Damage]:
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
