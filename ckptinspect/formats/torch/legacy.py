"""The legacy layout of ``torch.save`` (``_use_new_zipfile_serialization=False``, torch < 1.6).

Five pickles in a row (magic number, protocol 1001, sys_info, the object, the list of storage
keys), then each storage in the order of that list as an 8-byte little-endian element count and
the raw elements (:data:`LEGACY_COUNT`). The head of the file is read in growing pieces until
each pickle fits (:class:`_Growing`); only the object pickle may name storages.
"""

from __future__ import annotations

import struct
from typing import Any, Callable

from ... import model as m
from ...errors import CorruptCheckpointError, NotACheckpointError, UnsafeFileError
from .. import _fs
from .flatten import flatten
from .._torch_layout import LEGACY_MAGIC
from .source import Record, Storages, TorchOpened, tensor_problems, torch_checkpoint
from .unpickle import MAX_PICKLE_BYTES, IncompletePickle, unpickle

__all__ = ["legacy_opened"]

LEGACY_PROTOCOL = 1001
LEGACY_COUNT = struct.Struct("<q")
FIRST_READ_BYTES = 1 << 20


class _Growing:
    """The head of a file, read in growing pieces until a pickle fits."""

    def __init__(self, path: str):
        self.path = path
        self.size = _fs.getsize(path)
        self.data = _fs.read_range(path, 0, min(self.size, FIRST_READ_BYTES))
        self.needs: dict[str, None] = {}

    def unpickle(self, start: int, persistent_load: Callable[[Any], Any], what: str) -> tuple[Any, int]:
        """The pickle at ``start``: (object, where it ends); :attr:`opcodes` its opcode count.

        Only a pickle that runs out of bytes is read again with more of the file, and only when
        the file has them: an opcode that declares its length says how many; otherwise the
        piece grows fourfold (at most :data:`MAX_PICKLE_BYTES` past ``start``). Any other
        failure is final at once: more bytes cannot help."""
        while True:
            try:
                obj, scanned = unpickle(self.data, persistent_load, self.path, start=start)
                self.opcodes = scanned.opcodes
                self.needs.update(dict.fromkeys(scanned.needs))
                return obj, scanned.end
            except IncompletePickle as e:
                have = len(self.data)
                if e.needed is not None:
                    want = max(start + e.needed, min(self.size, have * 2))
                else:
                    want = min(self.size, max(have * 4, start + FIRST_READ_BYTES))
                if have >= self.size or want > self.size:
                    raise CorruptCheckpointError(
                        f"{self.path}: the legacy {what} pickle is damaged: {str(e).removeprefix(self.path + ': ')}"
                        f" (the file has {self.size} bytes)") from None
                if want - start > MAX_PICKLE_BYTES:
                    raise UnsafeFileError(f"{self.path}: the legacy {what} pickle is larger than {MAX_PICKLE_BYTES}"
                                          " bytes; refusing") from None
                self.data = _fs.read_range(self.path, 0, want)
            except CorruptCheckpointError as e:
                raise CorruptCheckpointError(
                    f"{self.path}: the legacy {what} pickle is damaged: {str(e).removeprefix(self.path + ': ')}") from None


def _no_storages(label: str) -> Callable[[Any], Any]:
    def load(pid: Any) -> Any:
        raise CorruptCheckpointError(f"{label}: a storage inside the legacy header pickles")

    return load


def legacy_opened(path: str, strict: bool) -> TorchOpened:
    """Open a legacy-layout file: strict (``open``) raises the first problem, otherwise
    (``verify``) problems are recorded per tensor."""
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
    storages = Storages(path, legacy=True)
    obj, pos = head.unpickle(pos, storages.load, "object")
    opcodes = head.opcodes
    keys, pos = head.unpickle(pos, _no_storages(path), "storage key list")
    if not isinstance(keys, list) or not all(isinstance(k, (str, bytes)) for k in keys):
        raise CorruptCheckpointError(f"{path}: the legacy storage key list is not a list of strings")
    keys = [k.decode("ascii", "replace") if isinstance(k, bytes) else k for k in keys]
    flat = flatten(obj, path, opcodes)
    records: dict[str, Record] = {}
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
            records[key] = Record(key, start, nbytes)
            offset = start + nbytes
    missing = [k for k in storages.by_key if k not in keys]
    if missing and strict:
        raise CorruptCheckpointError(f"{path}: storage {missing[0]!r} used by the pickle is not in the legacy storage list")
    storage_problems = {k: (f"{path}: storage {k!r} is missing or truncated (the legacy storages end at byte"
                            f" {offset} of {size}){': ' + problem.removeprefix(path + ': ') if problem else ''}")
                        for k in storages.by_key if k not in records}
    problems = tensor_problems(flat, records, path, strict, storage_problems)
    extra = {"byteorder": "big" if big_endian else "little", "pickle_globals": [], "legacy_protocol": LEGACY_PROTOCOL,
             "needs": list(head.needs)}
    ckpt = torch_checkpoint(path, m.FORMAT_TORCH_LEGACY, flat, storages, records, extra, big_endian=big_endian,
                            problems=problems)
    return TorchOpened(ckpt, problems)
