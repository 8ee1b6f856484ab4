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

Each layout has its reader (:mod:`._torch_zip`, :mod:`._torch_legacy`). The object pickle is
read by :mod:`._torch_unpickle` (allow-listed globals only, to inert stand-ins) and named by
:mod:`._torch_flatten` (``a/b/c`` names, roles, step, ties). Tensors are strided views of their
storage (offset, shape, strides), read from the storage's bytes by
:class:`~._torch_source.TorchSource` (``as_strided`` over them, copied), whatever device the
storage was saved from. This module is the door: opening either layout, and ``verify``'s plan.
"""

from __future__ import annotations

from ... import model as m
from .. import _fs
from .._readcheck import Opened, ReadCheck
from .._torch_layout import LEGACY_HEAD_BYTES, is_torch_legacy_head
from .legacy import legacy_opened
from .zip import zip_opened

__all__ = [
    "FORMAT_TORCH_ZIP",
    "FORMAT_TORCH_LEGACY",
    "open_torch",
    "open_torch_zip",
    "open_torch_legacy",
    "check_torch",
]

FORMAT_TORCH_ZIP = m.FORMAT_TORCH_ZIP
FORMAT_TORCH_LEGACY = m.FORMAT_TORCH_LEGACY


def open_torch_zip(path: str) -> m.Checkpoint:
    """Open a ``torch.save`` zip file (metadata only; tensors are read on demand).

    Raises:
        UnsafeFileError: The pickle calls something other than the allowed rebuild functions,
            storage types and containers (the message names it), or declares absurd sizes.
        CorruptCheckpointError: A damaged archive, pickle or storage record.
        NotACheckpointError: A zip without data.pkl, or a TorchScript archive.
    """
    return zip_opened(str(path), strict=True).ckpt


def open_torch_legacy(path: str) -> m.Checkpoint:
    """Open a legacy (pre-1.6) ``torch.save`` file (metadata only).

    Raises:
        UnsafeFileError, CorruptCheckpointError, NotACheckpointError: As :func:`open_torch_zip`.
    """
    return legacy_opened(str(path), strict=True).ckpt


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
        opened = legacy_opened(p, strict=False) if legacy else zip_opened(p, strict=False)
        damaged = [m.Damage(key=k, name=k, file=p, kind=m.DAMAGE_LAYOUT, problem=problem.removeprefix(p + ": "))
                   for k, problem in opened.problems.items()]
        return Opened(opened.ckpt, damaged, opened.crc_check)

    return ReadCheck(str(path), opener)
