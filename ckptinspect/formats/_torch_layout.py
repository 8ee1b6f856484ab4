"""Signatures and file names of PyTorch and Hugging Face checkpoints, for detection (standard
library only: detection runs for every path, and must not import numpy)."""

from __future__ import annotations

import struct

from ..errors import CheckpointNotFoundError
from . import _fs

__all__ = [
    "ZIP_LOCAL_HEADER",
    "DATA_PKL",
    "LEGACY_MAGIC",
    "LEGACY_HEAD_BYTES",
    "SAFETENSORS_HEADER_LENGTH",
    "is_data_pkl",
    "is_torch_zip",
    "is_torch_legacy_head",
    "is_safetensors_head",
    "is_hf_index",
    "hf_weights_in",
    "INT64_MAX",
    "valid_dims",
]

ZIP_SIGNATURE = b"PK\x03\x04"
ZIP_LOCAL_HEADER = struct.Struct("<4s5HL2L2H")  # 30 bytes; fields 9 and 10: name and extra lengths
DATA_PKL = "data.pkl"
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch/serialization.py MAGIC_NUMBER
LEGACY_MAGIC_BYTES = LEGACY_MAGIC.to_bytes(10, "little")
LEGACY_LONG1_10 = b"\x8a\x0a"  # pickle LONG1 opcode with 10 bytes: how the magic number is pickled
LEGACY_HEAD_BYTES = 32
SAFETENSORS_HEADER_LENGTH = struct.Struct("<Q")

# Hugging Face weight folders: what a folder's weights are, in order of preference.
HF_INDEX_SUFFIXES = (".safetensors.index.json", ".bin.index.json")
HF_INDEX_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
HF_SINGLE_NAMES = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin",
                   "diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin")
TF_FOLDER_MARKERS = ("checkpoint", "saved_model.pb", "saved_model.pbtxt")


def is_data_pkl(name: str) -> bool:
    """``data.pkl`` at the top of a torch zip (``<root>/data.pkl``)."""
    return name == DATA_PKL or (name.endswith("/" + DATA_PKL) and name.count("/") == 1)


def is_torch_zip(path: str) -> bool:
    """True for a zip archive holding ``<root>/data.pkl`` (a torch zip, or TorchScript).

    The first member's name decides for files torch wrote (data.pkl comes first, so a truncated
    file is still recognised); otherwise the central directory is read.
    """
    head = _fs.read_head(path, ZIP_LOCAL_HEADER.size + 1024)
    if head[:4] != ZIP_SIGNATURE or len(head) < ZIP_LOCAL_HEADER.size:
        return False
    name_len = ZIP_LOCAL_HEADER.unpack_from(head)[9]
    first = head[ZIP_LOCAL_HEADER.size : ZIP_LOCAL_HEADER.size + name_len].decode("utf-8", "replace")
    if is_data_pkl(first):
        return True
    import zipfile  # noqa: PLC0415 - a zip whose first member is not data.pkl only (detection runs for every path)

    try:
        with _fs.open_binary(path) as raw, zipfile.ZipFile(raw) as zf:  # the central directory alone
            return any(is_data_pkl(n) for n in zf.namelist())
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return False


def is_torch_legacy_head(head: bytes) -> bool:
    """True when a file starts with the pickled magic number of a legacy ``torch.save``."""
    return head[:1] == b"\x80" and (LEGACY_LONG1_10 + LEGACY_MAGIC_BYTES) in head[:LEGACY_HEAD_BYTES]


SAFETENSORS_JSON_STARTS = (b'{"', b"{ ", b"{}", b"{\n", b"{\r", b"{\t")


def is_safetensors_head(head: bytes) -> bool:
    """True when a file's first 10 bytes are a safetensors header length followed by the start of
    a JSON object (``{"``, or ``{`` and white space)."""
    n = SAFETENSORS_HEADER_LENGTH.size
    if len(head) < n + 2 or head[n : n + 2] not in SAFETENSORS_JSON_STARTS:
        return False
    (length,) = SAFETENSORS_HEADER_LENGTH.unpack_from(head)
    return length >= 2  # a length past the end is reported by the reader (truncated, or a bomb)


def is_hf_index(name: str) -> bool:
    """True for the name of a sharded-weights index (``*.safetensors.index.json``, ``*.bin.index.json``)."""
    return name.endswith(HF_INDEX_SUFFIXES)


def hf_weights_in(directory: str) -> str | None:
    """The weights file (or index) of a Hugging Face model folder, or None.

    A folder holding TF checkpoint files (a ``checkpoint`` state file, ``*.index``, a
    SavedModel) is not one.
    """
    try:
        names = _fs.listdir(directory)
    except (OSError, CheckpointNotFoundError):
        return None
    present = set(names)
    if any(n in present for n in TF_FOLDER_MARKERS) or any(n.endswith(".index") for n in names):
        return None
    for group in (HF_INDEX_NAMES, [n for n in names if is_hf_index(n)], HF_SINGLE_NAMES):
        for n in group:
            if n in present and _fs.isfile(_fs.join(directory, n)):
                return _fs.join(directory, n)
    singles = [n for n in names if n.endswith(".safetensors")]
    if len(singles) == 1:
        return _fs.join(directory, singles[0])
    return None


INT64_MAX = (1 << 63) - 1  # torch and safetensors count elements, sizes and offsets in int64


def valid_dims(value, max_dims: int = 64) -> tuple[int, ...] | None:
    """The one rule for a shape (or strides) read from a torch pickle or a safetensors header: a
    list or tuple of at most ``max_dims`` ints (not bools), each in [0, 2**63), the product of the
    non-zero ones below 2**63 (an element count int64 holds, whatever a zero beside them makes
    the total). The shape as a tuple, or None."""
    if not isinstance(value, (tuple, list)) or len(value) > max_dims:
        return None
    count = 1
    for d in value:
        if type(d) is not int or not 0 <= d <= INT64_MAX:
            return None
        count *= d or 1
    if count > INT64_MAX:
        return None
    return tuple(value)
