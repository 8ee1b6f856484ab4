"""The bad-input catalogue's building blocks: a case is a builder (makes the bad input in a
directory, returns the path to pass) and, per command, the exit code and message expected.

The base cases live here; each area adds its own in a ``cases_<area>.py`` module listed in
``test_hardening.CATALOGUE``.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import zipfile
from typing import Callable

import h5py
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
RUN = FIXTURES / "run"
SHARDED = FIXTURES / "sharded"
KERAS = FIXTURES / "keras"


# -- building the bad inputs ---------------------------------------------------------------
def _copy_prefix(prefix: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    dest.mkdir(parents=True, exist_ok=True)
    for f in prefix.parent.iterdir():
        if f.name.startswith(prefix.name + ".") and (f.name.endswith(".index") or ".data-" in f.name):
            shutil.copy(f, dest / f.name)
    return dest / prefix.name


def _rewrite(path: pathlib.Path, fn: Callable[[bytearray], bytes | bytearray]) -> None:
    path.write_bytes(bytes(fn(bytearray(path.read_bytes()))))


def truncated_index(d: pathlib.Path) -> pathlib.Path:
    prefix = _copy_prefix(RUN / "ckpt-8", d)
    _rewrite(prefix.with_name("ckpt-8.index"), lambda b: b[:700])
    return prefix


def wrong_magic(d: pathlib.Path) -> pathlib.Path:
    prefix = _copy_prefix(RUN / "ckpt-8", d)
    index = prefix.with_name("ckpt-8.index")

    def zero_magic(b: bytearray) -> bytearray:
        b[-8:] = bytes(8)
        return b

    _rewrite(index, zero_magic)
    return index


def missing_shard(d: pathlib.Path) -> pathlib.Path:
    prefix = _copy_prefix(SHARDED / "ckpt-4", d)
    os.remove(f"{prefix}.data-00003-of-00005")  # holds a slice of frozen/kernel and frozen/bias
    return prefix


def truncated_shard(d: pathlib.Path) -> pathlib.Path:
    prefix = _copy_prefix(SHARDED / "ckpt-4", d)
    _rewrite(pathlib.Path(f"{prefix}.data-00002-of-00005"), lambda b: b[:300])
    return prefix


FLIP_AT = 2000
FLIPPED_KEY = "optimizer/_trainable_variables/0/.ATTRIBUTES/VARIABLE_VALUE"  # bytes 1980..2492 of ckpt-8


def flipped_bit(d: pathlib.Path) -> pathlib.Path:
    prefix = _copy_prefix(RUN / "ckpt-8", d)

    def flip(b: bytearray) -> bytearray:
        b[FLIP_AT] ^= 0x10  # inside encoder/enc_dense/kernel, a model weight every command needs
        return b

    _rewrite(pathlib.Path(f"{prefix}.data-00000-of-00001"), flip)
    return prefix


def state_names_deleted(d: pathlib.Path) -> pathlib.Path:
    shutil.copytree(RUN, d, dirs_exist_ok=True)
    for n in (4, 8):  # the oldest and the newest, which the state file calls latest
        for f in d.glob(f"ckpt-{n}.*"):
            f.unlink()
    return d


def state_names_only_deleted(d: pathlib.Path) -> pathlib.Path:
    shutil.copytree(RUN, d, dirs_exist_ok=True)
    for f in d.glob("ckpt-*"):
        f.unlink()
    return d


def state_from_another_machine(d: pathlib.Path) -> pathlib.Path:
    shutil.copytree(RUN, d, dirs_exist_ok=True)
    (d / "checkpoint").write_text(
        'model_checkpoint_path: "/mnt/cluster/job-17/run/ckpt-8"\n'
        + "".join(f'all_model_checkpoint_paths: "/mnt/cluster/job-17/run/ckpt-{n}"\n' for n in (4, 6, 8))
    )
    return d


def data_file(d: pathlib.Path) -> pathlib.Path:
    prefix = _copy_prefix(RUN / "ckpt-8", d)
    return pathlib.Path(f"{prefix}.data-00000-of-00001")


def state_file(d: pathlib.Path) -> pathlib.Path:
    shutil.copytree(RUN, d, dirs_exist_ok=True)
    return d / "checkpoint"


def empty_directory(d: pathlib.Path) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    return d


def fake_h5(d: pathlib.Path) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "model.h5").write_text("this is not HDF5\n")
    return d / "model.h5"


def truncated_h5(d: pathlib.Path) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    raw = (KERAS / "model.weights.h5").read_bytes()
    (d / "model.weights.h5").write_bytes(raw[: len(raw) // 2])
    return d / "model.weights.h5"


def h5_external_link(d: pathlib.Path) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    with h5py.File(d / "secret.h5", "w") as f:
        f["data"] = np.arange(4.0)
    path = d / "model.weights.h5"
    shutil.copy(KERAS / "model.weights.h5", path)
    with h5py.File(path, "a") as f:
        f["layers/evil"] = h5py.ExternalLink(str(d / "secret.h5"), "/data")
    return path


def _keras_zip(path: pathlib.Path, extra: dict[str, bytes]) -> None:
    with zipfile.ZipFile(KERAS / "model.keras") as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        for name, data in extra.items():
            dst.writestr(name, data)


def zip_traversal(d: pathlib.Path) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    path = d / "model.keras"
    _keras_zip(path, {"../../evil.sh": b"echo pwned\n"})
    return path


def zip_bomb(d: pathlib.Path) -> pathlib.Path:
    """A .keras whose weights member declares 4 GiB in its central directory entry."""
    d.mkdir(parents=True, exist_ok=True)
    path = d / "model.keras"
    with zipfile.ZipFile(KERAS / "model.keras") as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
    raw = bytearray(path.read_bytes())
    pos = 0
    while (pos := raw.find(b"PK\x01\x02", pos)) != -1:
        name_len = int.from_bytes(raw[pos + 28 : pos + 30], "little")
        if raw[pos + 46 : pos + 46 + name_len] == b"model.weights.h5":
            raw[pos + 24 : pos + 28] = (0xFFFFFFF0).to_bytes(4, "little")  # uncompressed size
        pos += 4
    path.write_bytes(bytes(raw))
    return path


@dataclasses.dataclass(frozen=True)
class Case:
    """A bad input and, per command, (exit code, what the message says)."""

    id: str
    make: Callable[[pathlib.Path], pathlib.Path]
    expect: dict[str, tuple[int, str]]


# {p}: the path given; {d}: the case directory; " … " separates parts that must all appear. Exit 0 means the command copes (e.g. ls of a
# directory whose newest checkpoint is gone lists the newest that exists).
BASE_CASES = [
    Case("truncated-index", truncated_index, {
        "ls": (2, "Error: {p}.index: not a valid checkpoint index: not an sstable (bad magic number)"),
        "ls-stats": (2, "Error: {p}.index: not a valid checkpoint index: not an sstable (bad magic number)"),
        "verify": (1, "{p}.index: not a valid checkpoint index: not an sstable (bad magic number)"),
        "diff": (2, "Error: {p}.index: not a valid checkpoint index"),
        "extract": (2, "Error: {p}.index: not a valid checkpoint index"),
    }),
    Case("wrong-magic", wrong_magic, {
        "ls": (2, "Error: {p}: not a valid checkpoint index (1585 bytes, no table footer: truncated or not an index)"),
        "verify": (1, "{p}: not a valid checkpoint index: not an sstable (bad magic number)"),
        "diff": (2, "Error: {p}: not a valid checkpoint index"),
        "extract": (2, "Error: {p}: not a valid checkpoint index"),
    }),
    Case("missing-shard", missing_shard, {
        "ls": (0, ""),
        # issue 25: said at once, without TensorFlow
        "ls-stats": (2, "Error: {p}.data-00003-of-00005: data file is missing ({p}.index names it; cannot read '"),
        "verify": (1, "{p}.data-00003-of-00005: data shard is missing (named by {p}.index)"),
        "diff": (2, "{p}.data-00003-of-00005: data file is missing"),
        "extract": (2, "{p}.data-00003-of-00005"),
    }),
    Case("truncated-shard", truncated_shard, {
        "ls": (0, ""),
        # issue 26: said by our own decoder, as the copy's writer says it (was TensorFlow's
        # "cannot read '...': Read less bytes than requested")
        "ls-stats": (2, "Error: {p}.data-00002-of-00005: truncated: ' … ' needs bytes … the file has 300"),
        "verify": (1, "{p}.data-00002-of-00005: truncated: 300 bytes, the index needs 976"),
        "diff": (2, "Error: {p}.data-00002-of-00005: truncated: ' … ' needs bytes 0..448, the file has 300"),
        # a copied slice: the writer sees the shard end before the bytes it needs
        "extract": (2, "Error: {p}.data-00002-of-00005: truncated: ' … ' needs bytes 0..448, the file has 300"),
    }),
    Case("flipped-bit", flipped_bit, {
        "ls": (0, ""),
        # ls --stats streams each tensor through its format's block reader (checksum-checked), as diff does.
        "ls-stats": (2, f"Error: {{p}}.data-00000-of-00001: '{FLIPPED_KEY}': checksum does not match: the bytes have crc32c 0x"),
        "verify": (1, "first:   encoder/enc_dense/kernel in {p}.data-00000-of-00001: checksum does not match: the bytes have crc32c 0x … the index records 0x … (stored masked as TensorFlow does: 0x"),
        "diff": (2, f"Error: {{p}}.data-00000-of-00001: '{FLIPPED_KEY}': checksum does not match: the bytes have crc32c 0x"),
        # copied bytes are checked against the crc32c the source records before the output is kept
        "extract": (2, f"Error: {{p}}.data-00000-of-00001: '{FLIPPED_KEY}': checksum does not match: the bytes have crc32c 0x"),
    }),
    Case("state-names-deleted", state_names_deleted, {
        "ls": (0, "path:    {p}/ckpt-6 … {p}/ckpt-8  -       8 … MISSING"),
        "verify": (1, "INCOMPLETE: 0 damaged, 2 missing of 3 checkpoints"),
    }),
    Case("state-names-only-deleted", state_names_only_deleted, {
        "ls": (2, "Error: {p}: no checkpoint found in the directory"),
        "verify": (1, "INCOMPLETE: 0 damaged, 3 missing of 3 checkpoints … listed by {p}/checkpoint but its files are missing"),
        "diff": (2, "Error: {p}: no checkpoint found in the directory"),
        "extract": (2, "Error: {p}: no checkpoint found in the directory"),
    }),
    Case("state-from-another-machine", state_from_another_machine, {
        "ls": (0, "path:    {p}/ckpt-8"),
        "ls-stats": (0, "path:    {p}/ckpt-8"),
        "verify": (0, "verdict: INTACT: 3 of 3 checkpoints whole"),
    }),
    Case("data-file", data_file, {
        cmd: (2, "Error: {p}: is a data shard, not a checkpoint; pass the prefix {d}/ckpt-8 (or {d}/ckpt-8.index)")
        for cmd in ("ls", "ls-stats", "verify", "diff", "extract")
    }),
    Case("state-file", state_file, {
        cmd: (2, "Error: {p}: is the checkpoint state file, not a checkpoint; pass its directory {d}")
        for cmd in ("ls", "verify", "diff", "extract")
    }),
    Case("empty-directory", empty_directory, {
        cmd: (2, "Error: {p}: no checkpoint found in the directory")
        for cmd in ("ls", "verify", "diff", "extract")
    }),
    Case("not-hdf5-named-h5", fake_h5, {
        cmd: (2, "Error: {p}: has a Keras suffix but is neither HDF5 nor a zip archive")
        for cmd in ("ls", "verify", "diff", "extract")
    }),
    Case("truncated-hdf5", truncated_h5, {
        "ls": (2, "Error: {p}: not a readable HDF5 file (17912 bytes), truncated or damaged"),
        "verify": (1, "path:    {p} … DAMAGED … not a readable HDF5 file (17912 bytes), truncated or damaged"),
        "diff": (2, "Error: {p}: not a readable HDF5 file"),
        "extract": (2, "Error: {p}: not a readable HDF5 file"),
    }),
    Case("hdf5-external-link", h5_external_link, {
        cmd: (2, "Error: {p}: external link 'layers/evil' -> {d}/secret.h5:/data; refusing to follow links")
        for cmd in ("ls", "verify", "diff", "extract")
    }),
    Case("zip-path-traversal", zip_traversal, {
        cmd: (2, "Error: {p}: archive member '../../evil.sh' escapes the archive (path traversal); refusing")
        for cmd in ("ls", "verify", "diff", "extract")
    }),
    Case("zip-bomb", zip_bomb, {
        cmd: (2, "Error: {p}: archive member 'model.weights.h5' declares 4294967280 bytes but stores only")
        for cmd in ("ls", "verify", "diff", "extract")
    }),
]

