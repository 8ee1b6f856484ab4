"""``.npz`` files: numpy's ``savez`` layout, a zip of ``NAME.npy`` members.

This is what ``ckptinspect extract -o out.npz`` writes (one member per kept variable, named by
its readable name, e.g. ``encoder/enc_dense/kernel.npy``), and what ``numpy.savez`` /
``savez_compressed`` write. A variable's key and name are the member name without ``.npy``,
as ``numpy.load(path).files`` gives them.

Listing parses only each member's ``.npy`` header (``numpy.lib.format``: magic, then a dict
read with ``ast.literal_eval``); values are read one array at a time through ``numpy.load``'s
lazy ``NpzFile`` with ``allow_pickle=False``, so memory stays at about one array.

Untrusted files: an array whose dtype holds Python objects (stored pickled; unpickling can run
code) is refused with :class:`~ckptinspect.errors.UnsafeFileError`, as are members that declare
far more bytes than they store (zip bombs) and headers that declare absurd sizes. Two members
with the same name, and a header whose shape does not match its member's size, are damage
(:class:`~ckptinspect.errors.CorruptCheckpointError`, which ``verify`` reports), refused before
anything is allocated. ``verify`` also streams every member through its CRC-32 check.

Writing (``extract -o out.npz``): :func:`write_npz` opens an :class:`NpzWriter` that adds one
array at a time (:func:`npy_array` says whether a value has a ``.npy`` encoding); :func:`read_npz`
reads the file back through ``numpy.load``.

Roles: a scalar named like a counter (``step``, ``global_step``, ``save_counter``, ``epoch``)
is ``metadata``; a name TF1 optimizers give their slots or state is ``optimizer``; the rest is
``model``.
"""

from __future__ import annotations

import io
import math
import zipfile
from typing import Any, BinaryIO

import numpy as np

from .. import model as m
from ..errors import CheckpointNotFoundError, CorruptCheckpointError, NotACheckpointError, UnsafeFileError, one_line
from ._readcheck import ReadCheck
from . import _fs
from ._zip import ZIP_LOCAL_HEADER, check_archive_by_reading, check_bomb, check_duplicates, member_head, open_zip_archive
from .tf.variables import TF1_OPTIMIZER_NAMES, TF1_SLOT_RE

__all__ = ["NPY_SUFFIX", "KERAS_MEMBERS", "is_npz", "open_npz", "NpzSource", "npy_array", "NpzWriter", "write_npz",
           "read_npz"]

NPY_SUFFIX = ".npy"
# Members that make a zip a .keras archive rather than an npz.
KERAS_MEMBERS = ("config.json", "metadata.json", "model.weights.h5", "model.weights.npz")
# Limits: at most MAX_MEMBERS arrays; an array may declare at most MAX_DECLARED_BYTES (and a
# member may expand at most as _zip's check_bomb allows).
MAX_MEMBERS = 1 << 20
MAX_DECLARED_BYTES = 1 << 40
MAX_NPY_HEADER_BYTES = 1 << 16  # numpy itself refuses headers over 10,000 bytes
NPY_HEADER_GUESS = 4096  # read first: numpy's headers are 128 bytes or a few times that
# Names of counters (metadata) and of TF1 optimizer state, as the TF reader's rules know them.
COUNTER_NAMES = frozenset({"save_counter", "global_step", "step", "epoch", "epochs"})


def _open_zip(path: str) -> tuple[zipfile.ZipFile, BinaryIO]:
    return open_zip_archive(path, ".npz file")


def is_npz(path: str) -> bool:
    """True for a zip archive holding ``.npy`` members and none of a ``.keras`` archive's.

    Only the central directory is read; an archive that does not read is not an npz here (the
    ``.keras`` reader then says what is wrong with it).
    """
    try:
        zf, f = _open_zip(str(path))
    except (CorruptCheckpointError, NotACheckpointError, CheckpointNotFoundError):
        return False
    try:
        names = zf.namelist()
    finally:
        zf.close()
        f.close()
    return any(n.endswith(NPY_SUFFIX) for n in names) and not any(n in KERAS_MEMBERS for n in names)


def _role(name: str, shape: tuple[int, ...]) -> str:
    if shape == () and name.rsplit("/", 1)[-1] in COUNTER_NAMES:
        return m.ROLE_METADATA
    if TF1_OPTIMIZER_NAMES.search(name) or TF1_SLOT_RE.search(name):
        return m.ROLE_OPTIMIZER
    return m.ROLE_MODEL


def _dtype_name(dtype: np.dtype) -> str:
    if dtype.kind in "SU":
        return "string"
    if dtype.kind == "b":
        return "bool"
    if dtype.kind == "V":
        return "compound" if dtype.names else "opaque"
    return dtype.name


def _header(path: str, f: BinaryIO, info: zipfile.ZipInfo) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype from one member's ``.npy`` header, checked against the member's size.
    Only the header's bytes are read (not through zipfile's stream, whose CRC-32 check needs
    the whole member: damaged data is for reading values and ``verify`` to report).

    Raises:
        UnsafeFileError: Pickled objects, or an absurd declared size.
        CorruptCheckpointError: The header does not parse, or does not match the member's size.
    """
    key = info.filename[: -len(NPY_SUFFIX)]
    for limit in (NPY_HEADER_GUESS, MAX_NPY_HEADER_BYTES):  # the usual few hundred bytes first
        head = io.BytesIO(member_head(path, f, info, limit))
        try:
            version = np.lib.format.read_magic(head)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(head)
            header_bytes = head.tell()
            break
        except (OSError, ValueError, EOFError, SyntaxError, RuntimeError) as e:
            if limit < MAX_NPY_HEADER_BYTES and info.file_size > limit:
                continue  # a longer header than guessed: read up to the limit
            raise CorruptCheckpointError(f"{path}: array {key!r}: not a readable .npy header: {one_line(e)}") from None
    if dtype.hasobject:
        raise UnsafeFileError(
            f"{path}: array {key!r} holds pickled Python objects (dtype {dtype}); ckptinspect never loads"
            " pickled objects (unpickling can run code; numpy.load(..., allow_pickle=False) refuses them too)"
        )
    shape = tuple(int(d) for d in shape)
    declared = math.prod(shape) * dtype.itemsize
    if declared > MAX_DECLARED_BYTES:
        raise UnsafeFileError(
            f"{path}: array {key!r} declares shape {list(shape)} ({declared} bytes, more than the"
            f" {MAX_DECLARED_BYTES}-byte limit); refusing a possible shape bomb"
        )
    if header_bytes + declared != info.file_size:
        raise CorruptCheckpointError(
            f"{path}: array {key!r} declares shape {list(shape)} {dtype} ({declared} bytes) but its member"
            f" holds {info.file_size - header_bytes} bytes of data (truncated or damaged)"
        )
    return shape, dtype


def _list(path: str, zf: zipfile.ZipFile, f: BinaryIO) -> tuple[list[m.Variable], list[str]]:
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        raise UnsafeFileError(f"{path}: {len(infos)} archive members (limit {MAX_MEMBERS}); refusing")
    check_duplicates(path, zf)
    variables: list[m.Variable] = []
    others: list[str] = []
    # each member's local header and the start of its .npy header, fetched together (remote files)
    _fs.prefetch(f, [(i.header_offset, ZIP_LOCAL_HEADER.size + len(i.orig_filename.encode()) + 64 + NPY_HEADER_GUESS)
                     for i in infos if i.filename.endswith(NPY_SUFFIX)])
    for info in infos:
        check_bomb(path, info)
        if not info.filename.endswith(NPY_SUFFIX):
            others.append(info.filename)
            continue
        shape, dtype = _header(path, f, info)
        key = info.filename[: -len(NPY_SUFFIX)]
        variables.append(m.Variable(
            key=key, name=key, shape=shape, dtype=_dtype_name(dtype), nbytes=math.prod(shape) * dtype.itemsize,
            role=_role(key, shape),
        ))
    return variables, others


class NpzSource(m.BaseSource):
    """Reads one array at a time through ``numpy.load``'s lazy ``NpzFile`` (``allow_pickle=False``).

    Args:
        path: The ``.npz`` file.
    """

    def __init__(self, path: str):
        self._path = path
        self._npz: Any = None
        self._file: Any = None

    def _open(self) -> Any:
        if self._npz is None:
            zf, f = _open_zip(self._path)  # the same checks as the listing, on the file as it is now
            try:
                _list(self._path, zf, f)
            finally:
                zf.close()
            self._file = f
            f.seek(0)
            self._npz = np.load(f, allow_pickle=False)
        return self._npz

    def read(self, variable: m.Variable) -> np.ndarray:
        """The array of ``variable``.

        Raises:
            CheckpointNotFoundError: No such member (the file changed since it was listed).
            CorruptCheckpointError: The member does not read.
        """
        npz = self._open()
        if variable.key not in npz.files:
            raise CheckpointNotFoundError(f"{self._path}: no array {variable.key!r} (the file changed since it was listed?)")
        try:
            value = npz[variable.key]
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, RuntimeError) as e:
            raise CorruptCheckpointError(f"{self._path}: cannot read array {variable.key!r}: {one_line(e)}") from None
        if tuple(value.shape) != variable.shape:
            raise CorruptCheckpointError(
                f"{self._path}: array {variable.key!r} has shape {list(value.shape)}, listed as {list(variable.shape)}"
            )
        return value

    def files(self) -> tuple[str, ...]:
        return (self._path,)

    def close(self) -> None:
        npz, f, self._npz, self._file = self._npz, self._file, None, None
        if npz is not None:
            npz.close()
        if f is not None:
            f.close()


def open_npz(path: str) -> m.Checkpoint:
    """Open an ``.npz`` file (headers only; arrays are read on demand).

    Args:
        path: The ``.npz`` file.

    Returns:
        The :class:`~ckptinspect.model.Checkpoint` (format ``npz``); keys and names are the
        member names without ``.npy``; ``info`` has ``members`` (count) and the names of any
        members that are not ``.npy`` (``other_members``, not listed as variables).

    Raises:
        CheckpointNotFoundError: No such file.
        CorruptCheckpointError: A damaged archive or ``.npy`` header.
        UnsafeFileError: Pickled object arrays, duplicate members, zip or shape bombs.
    """
    path = str(path)
    zf, f = _open_zip(path)
    try:
        variables, others = _list(path, zf, f)
    finally:
        zf.close()
        f.close()
    info: dict[str, Any] = {"members": len(variables) + len(others)}
    if others:
        info["other_members"] = others
    return m.Checkpoint(
        path=path,
        format=m.FORMAT_NPZ,
        variables=tuple(variables),
        num_shards=1,
        info=info,
        source=NpzSource(path),
    )



def check_npz(path: str) -> ReadCheck:
    """``verify``'s plan for an ``.npz`` file (members' CRCs, then every value)."""
    return check_archive_by_reading(path, open_npz)


# -- writing ---------------------------------------------------------------------------------
def npy_array(value: Any) -> np.ndarray | None:
    """``value`` as a ``.npy`` member stores it (Python strings as bytes), or None when its dtype
    has no ``.npy`` encoding without pickling (structured, or no numpy name)."""
    value = np.asarray(value)
    if value.dtype.kind == "O":
        value = value.astype(np.bytes_)
    if value.dtype.kind == "V" or value.dtype.name not in np.sctypeDict and value.dtype.kind not in "SU":
        return None
    return value


class NpzWriter:
    """numpy's ``savez`` layout (a zip of ``NAME.npy`` members, stored, zip64), written one
    array at a time; a context manager closing the archive."""

    def __init__(self, path: str):
        self._zf = zipfile.ZipFile(path, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True)

    def __enter__(self) -> "NpzWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._zf.close()

    def add(self, name: str, value: np.ndarray) -> None:
        """Write ``value`` (see :func:`npy_array`) as member ``name + ".npy"``, never pickled."""
        with self._zf.open(name + NPY_SUFFIX, mode="w", force_zip64=True) as f:
            np.lib.format.write_array(f, value, allow_pickle=False)


def write_npz(path: str) -> NpzWriter:
    """``path`` opened for writing: ``with write_npz(tmp) as npz: npz.add(name, value)``."""
    return NpzWriter(path)


def read_npz(path: str) -> Any:
    """A written ``.npz`` read back through ``numpy.load`` (no pickles): a context manager
    giving ``.files`` and ``[name]``."""
    return np.load(path, allow_pickle=False)
