"""File names and signatures of checkpoint layouts, shared by detection (which must stay cheap: it runs
for Keras files too) and the TF readers."""

from __future__ import annotations

import re

INDEX_SUFFIX = ".index"
# Keys are bytes; a key that is not UTF-8 keeps its bytes as surrogate escapes, so the str is
# the identity of the key (two keys never collide) and encodes back to the exact bytes.
KEY_ENCODING = "utf-8"
KEY_ERRORS = "surrogateescape"
STATE_FILE = "checkpoint"
# The kinds of directory a series is read from (DirectoryListing.kind): a TF checkpoint directory,
# a folder of Keras or PyTorch files with the epoch or step in their names.
SERIES_TF = "tf-directory"
SERIES_KERAS = "keras-files"
SERIES_TORCH = "torch-files"
DATA_FILE_RE = re.compile(r"^(?P<prefix>.*)\.data-(?P<shard>\d{5})-of-(?P<num>\d{5})$")


# The number at the end of a TF prefix's file name (``ckpt-10``, ``model.ckpt-100``, ``ckpt_1``),
# after a sharded V1 file's ``-00000-of-00001``.
TF_PREFIX_NUMBER_RE = re.compile(r"[-_](\d+)$")
V1_SHARD_SUFFIX_RE = re.compile(r"-(\d{5}|\?{5})-of-\d{5}$")


def prefix_number(basename: str) -> int | None:
    """The number a TF prefix's file name ends in (``ckpt-10`` -> 10; ``model.ckpt-7-00000-of-00001``,
    a sharded V1 file, -> 7), or None."""
    match = TF_PREFIX_NUMBER_RE.search(V1_SHARD_SUFFIX_RE.sub("", basename))
    return int(match.group(1)) if match else None


def data_path(prefix: str, shard: int, num_shards: int) -> str:
    """The file holding data shard ``shard`` of a bundle."""
    return f"{prefix}.data-{shard:05d}-of-{num_shards:05d}"


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
HDF5_USERBLOCK_OFFSETS = (0, 512, 1024, 2048)  # where the HDF5 superblock may start
HDF5_HEAD_BYTES = HDF5_USERBLOCK_OFFSETS[-1] + len(HDF5_SIGNATURE)
ZIP_SIGNATURE = b"PK\x03\x04"
KERAS_SHARDED_INDEX_SUFFIX = ".weights.json"
KERAS_SUFFIXES = (".h5", ".hdf5", ".keras", KERAS_SHARDED_INDEX_SUFFIX)  # named when a folder holds Keras files


def is_hdf5_head(head: bytes) -> bool:
    """True when the first :data:`HDF5_HEAD_BYTES` bytes of a file hold an HDF5 signature."""
    return any(head[o : o + len(HDF5_SIGNATURE)] == HDF5_SIGNATURE for o in HDF5_USERBLOCK_OFFSETS)


def decode_key(raw: bytes) -> str:
    """A TF bundle key (or object-graph name) as a str that encodes back to the exact bytes."""
    return raw.decode(KEY_ENCODING, KEY_ERRORS)


def encode_key(key: str) -> bytes:
    """The exact bytes of a key (what TensorFlow's reader and writer take)."""
    return key.encode(KEY_ENCODING, KEY_ERRORS)
