"""``.keras`` archives: a zip of ``config.json``, ``metadata.json`` and ``model.weights.h5``.

The archive is read in place: nothing is extracted to disk. A stored (uncompressed) weights
member - what Keras writes - is handed to h5py as a read-only window onto the archive's own
bytes; a deflated one as a seekable window that inflates on demand, keeping a snapshot of the
decompressor every few MiB (memory: the snapshots and one input block, never the member); any
other compression through zipfile's own stream. TensorFlow and Keras are never imported.

Variables are those of the inner ``model.weights.h5`` (Keras 3 layout, see
:mod:`.keras_h5`). Where ``config.json`` tells the class of a layer whose variables have
known names (``Dense``: ``kernel``, ``bias``...), they are named ``encoder/enc_dense/kernel``;
otherwise ``encoder/enc_dense/vars/0``.

Untrusted archives: member names that are absolute or climb out with ``..``, members that
declare far more uncompressed bytes than they store (zip bombs), and oversized JSON members
are refused with :class:`~ckptinspect.errors.UnsafeFileError`; the inner HDF5 file gets the
checks of :mod:`.keras_h5`. Two members with the same name (readers disagree on which one
counts: a known way to hide a payload from a scanner) are refused as damage
(:class:`~ckptinspect.errors.CorruptCheckpointError`, which ``verify`` reports). Weights stored
as ``model.weights.npz`` are refused: Keras writes them as pickled Python objects, which are
never loaded here. :func:`member_damage` is ``verify``'s CRC-32 check of every member.
"""

from __future__ import annotations

import bisect
import collections
import io
import json
import re
import struct
import zipfile
import zlib
from typing import Any, BinaryIO, Sequence

import numpy as np

from .. import model as m
from ..errors import CkptError, CorruptCheckpointError, NotACheckpointError, UnsafeFileError
from . import _fs
from .keras_h5 import INFO_UNALLOCATED, H5Source, guard_h5, open_h5py, list_h5_file, summarize_model_config

__all__ = [
    "CONFIG_FILENAME",
    "METADATA_FILENAME",
    "WEIGHTS_FILENAME",
    "open_zip",
    "member_damage",
    "member_head",
    "config_var_namer",
    "LAYER_VARIABLE_NAMES",
]

CONFIG_FILENAME = "config.json"
METADATA_FILENAME = "metadata.json"
WEIGHTS_FILENAME = "model.weights.h5"
WEIGHTS_NPZ_FILENAME = "model.weights.npz"
ZIP_LOCAL_HEADER_SIGNATURE = b"PK\x03\x04"
ZIP_LOCAL_HEADER = struct.Struct("<4s5HL2L2H")  # 30 bytes; the last two are name/extra lengths

# Limits: a JSON member may hold at most MAX_JSON_BYTES; a member larger than BOMB_FLOOR_BYTES
# may expand at most MAX_EXPANSION times its stored size (DEFLATE tops out near 1032:1; Keras
# stores members uncompressed).
MAX_JSON_BYTES = 64 << 20
BOMB_FLOOR_BYTES = 64 << 20
MAX_EXPANSION = 100
# Inflating a deflated member on demand: compressed bytes read at a time; a decompressor
# snapshot (about 45 KiB each) every INFLATE_SNAPSHOT_BYTES of output, at most
# MAX_INFLATE_SNAPSHOTS of them (the interval grows for larger members).
INFLATE_INPUT_BYTES = 256 << 10
INFLATE_SNAPSHOT_BYTES = 4 << 20
MAX_INFLATE_SNAPSHOTS = 512
RAW_DEFLATE_WBITS = -15
ZIP_FLAG_ENCRYPTED = 0x1
NPY_SUFFIX = ".npy"
MAX_NPZ_MEMBERS_EXAMINED = 10_000
MEMBER_CHUNK_BYTES = 8 << 20  # bytes of a member held at a time when checking its CRC
MAX_REMOTE_ARCHIVE_BYTES = 2 << 30  # a remote archive is read into memory whole (zipfile needs seeks)

# Keras 3 layer classes whose stored variables have known names, given the layer config.
_CONV = ("kernel", "bias")
LAYER_VARIABLE_NAMES: dict[str, tuple[tuple[str, str | None], ...]] = {
    # class name -> ((variable name, config flag that must be true for it to exist), ...)
    "Dense": (("kernel", None), ("bias", "use_bias")),
    "Conv1D": (("kernel", None), ("bias", "use_bias")),
    "Conv2D": (("kernel", None), ("bias", "use_bias")),
    "Conv3D": (("kernel", None), ("bias", "use_bias")),
    "Conv1DTranspose": (("kernel", None), ("bias", "use_bias")),
    "Conv2DTranspose": (("kernel", None), ("bias", "use_bias")),
    "Conv3DTranspose": (("kernel", None), ("bias", "use_bias")),
    "DepthwiseConv1D": (("kernel", None), ("bias", "use_bias")),
    "DepthwiseConv2D": (("kernel", None), ("bias", "use_bias")),
    "SeparableConv1D": (("depthwise_kernel", None), ("pointwise_kernel", None), ("bias", "use_bias")),
    "SeparableConv2D": (("depthwise_kernel", None), ("pointwise_kernel", None), ("bias", "use_bias")),
    "Embedding": (("embeddings", None),),
    "BatchNormalization": (("gamma", "scale"), ("beta", "center"), ("moving_mean", None), ("moving_variance", None)),
    "LayerNormalization": (("gamma", "scale"), ("beta", "center")),
    "GroupNormalization": (("gamma", "scale"), ("beta", "center")),
    "PReLU": (("alpha", None),),
}
# Recurrent layers keep their variables in a ``cell`` child.
RNN_CELL_VARIABLE_NAMES: dict[str, tuple[tuple[str, str | None], ...]] = {
    name: (("kernel", None), ("recurrent_kernel", None), ("bias", "use_bias"))
    for name in ("LSTM", "GRU", "SimpleRNN", "LSTMCell", "GRUCell", "SimpleRNNCell")
}
NESTED_LAYER_KEYS = ("layer", "forward_layer", "backward_layer", "cell")
WINDOWS_DRIVE_RE = re.compile(r"^[A-Za-z]:")


# -- reading the archive in place --------------------------------------------------------
class _Window(io.RawIOBase):
    """A read-only, seekable stream of ``size`` bytes; subclasses provide ``readinto``."""

    def __init__(self, size: int):
        super().__init__()
        self._size = size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos


class _MemberWindow(_Window):
    """A read-only, seekable view of ``size`` bytes at ``start`` of an open file."""

    def __init__(self, f: BinaryIO, start: int, size: int):
        super().__init__(size)
        self._f = f
        self._start = start

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._size - self._pos))
        if n == 0:
            return 0
        self._f.seek(self._start + self._pos)
        got = self._f.readinto(view[:n])
        self._pos += got or 0
        return got or 0

    def close(self) -> None:
        try:
            self._f.close()
        finally:
            super().close()


class _InflateWindow(_Window):
    """A read-only, seekable view of a deflated member's uncompressed bytes.

    Bytes are inflated on demand from the archive file. Every ``interval`` bytes of output a
    copy of the decompressor is kept, so a seek backwards resumes from the nearest snapshot
    rather than the member's start, and a seek forwards inflates and discards. Memory: the
    snapshots (at most :data:`MAX_INFLATE_SNAPSHOTS`), one input block and the caller's buffer.
    """

    def __init__(self, f: BinaryIO, start: int, compress_size: int, size: int):
        super().__init__(size)
        self._f = f
        self._start = start
        self._csize = compress_size
        self._interval = max(INFLATE_SNAPSHOT_BYTES, -(-size // MAX_INFLATE_SNAPSHOTS))
        first = zlib.decompressobj(RAW_DEFLATE_WBITS)
        self._snap_out: list[int] = [0]  # output offset of each snapshot, ascending
        self._snaps: list[tuple[int, Any]] = [(0, first)]  # (compressed offset, decompressor)
        self._d = first.copy()
        self._out = 0  # output offset the decompressor is at
        self._in = 0  # compressed bytes consumed from the file (beyond unconsumed_tail)

    def _inflate(self, limit: int) -> bytes:
        """Up to ``limit`` next bytes of output; b"" at the end of the stream."""
        while True:
            data = self._d.unconsumed_tail
            if not data and not self._d.eof and self._in < self._csize:
                self._f.seek(self._start + self._in)
                data = self._f.read(min(INFLATE_INPUT_BYTES, self._csize - self._in))
                if not data:
                    raise OSError("the archive ends inside the member's compressed bytes")
                self._in += len(data)
            if not data or self._d.eof:
                return b""
            out = self._d.decompress(data, limit)
            if out:
                self._out += len(out)
                if self._out >= self._snap_out[-1] + self._interval:
                    self._snap_out.append(self._out)
                    self._snaps.append((self._in, self._d.copy()))
                return out

    def _move_to(self, target: int) -> None:
        if target < self._out or target - self._out > self._interval:
            i = bisect.bisect_right(self._snap_out, target) - 1
            if self._snap_out[i] > self._out or target < self._out:
                self._in, state = self._snaps[i]
                self._d = state.copy()
                self._out = self._snap_out[i]
        while self._out < target:
            if not self._inflate(min(INFLATE_INPUT_BYTES, target - self._out)):
                return

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = max(0, min(len(view), self._size - self._pos))
        if want == 0:
            return 0
        try:
            if self._pos != self._out:
                self._move_to(self._pos)
            got = 0
            while got < want and self._out == self._pos + got:
                out = self._inflate(want - got)
                if not out:
                    break
                view[got : got + len(out)] = out
                got += len(out)
        except zlib.error as e:
            raise OSError(f"the member's deflate stream is damaged: {e}") from None
        self._pos += got
        return got

    def close(self) -> None:
        try:
            self._f.close()
        finally:
            self._snaps = []
            super().close()


def _check_member_names(path: str, zf: zipfile.ZipFile) -> None:
    for info in zf.infolist():
        name = info.filename
        parts = re.split(r"[/\\]", name)
        if name.startswith(("/", "\\")) or WINDOWS_DRIVE_RE.match(name) or ".." in parts or "\x00" in name:
            raise UnsafeFileError(f"{path}: archive member {name!r} escapes the archive (path traversal); refusing")


def _duplicates(zf: zipfile.ZipFile) -> dict[str, int]:
    """Member names that occur more than once, with their count (in archive order)."""
    counts = collections.Counter(info.filename for info in zf.infolist())
    return {name: n for name, n in counts.items() if n > 1}


def _duplicate_text(name: str, count: int) -> str:
    return (f"archive member {name!r} appears {count} times (readers disagree on which copy counts:"
            " a known way to hide content)")


def _check_archive(path: str, zf: zipfile.ZipFile) -> None:
    """Every refusal that needs only the central directory: traversal, duplicates, bombs.

    Duplicate member names are damage (``verify`` reports them), the rest unsafe.
    """
    _check_member_names(path, zf)
    for name, count in _duplicates(zf).items():
        raise CorruptCheckpointError(f"{path}: {_duplicate_text(name, count)}; refusing")
    for info in zf.infolist():
        _check_bomb(path, info)


def _check_bomb(path: str, info: zipfile.ZipInfo) -> None:
    if info.file_size > BOMB_FLOOR_BYTES and info.file_size > MAX_EXPANSION * max(info.compress_size, 1):
        raise UnsafeFileError(
            f"{path}: archive member {info.filename!r} declares {info.file_size} bytes but stores only"
            f" {info.compress_size} (more than {MAX_EXPANSION}:1); refusing a possible zip bomb"
        )


def _read_json(path: str, zf: zipfile.ZipFile, name: str) -> Any:
    info = zf.getinfo(name)
    if info.file_size > MAX_JSON_BYTES:
        raise UnsafeFileError(f"{path}: {name} declares {info.file_size} bytes (limit {MAX_JSON_BYTES}); refusing")
    try:
        with zf.open(info) as f:
            raw = f.read(MAX_JSON_BYTES + 1)
    except (zipfile.BadZipFile, OSError, RuntimeError, ValueError) as e:
        raise CorruptCheckpointError(f"{path}: cannot read {name}: {' '.join(str(e).split())}") from None
    if len(raw) > MAX_JSON_BYTES:
        raise UnsafeFileError(f"{path}: {name} is larger than its declared size; refusing")
    try:
        return json.loads(raw)
    except ValueError as e:
        raise CorruptCheckpointError(f"{path}: {name} is not valid JSON: {e}") from None


def _data_offset(path: str, f: BinaryIO, info: zipfile.ZipInfo, archive_size: int) -> int:
    f.seek(info.header_offset)
    header = f.read(ZIP_LOCAL_HEADER.size)
    if len(header) != ZIP_LOCAL_HEADER.size or header[:4] != ZIP_LOCAL_HEADER_SIGNATURE:
        raise CorruptCheckpointError(f"{path}: bad local header for archive member {info.filename!r}")
    fields = ZIP_LOCAL_HEADER.unpack(header)
    start = info.header_offset + ZIP_LOCAL_HEADER.size + fields[-2] + fields[-1]
    if start + info.compress_size > archive_size:
        raise CorruptCheckpointError(
            f"{path}: truncated: member {info.filename!r} needs bytes {start}..{start + info.compress_size},"
            f" the archive has {archive_size}"
        )
    return start


def member_head(path: str, f: BinaryIO, info: zipfile.ZipInfo, size: int) -> bytes:
    """The first ``size`` uncompressed bytes of a stored or deflated member (fewer when it is
    shorter), read straight from the archive file ``f``: no CRC-32 check, which would need the
    whole member, so a header reads even when the data after it is damaged.

    Raises:
        CorruptCheckpointError: Bad local header, truncated archive, damaged deflate stream.
        NotACheckpointError: Another compression method, or an encrypted member.
    """
    if info.flag_bits & ZIP_FLAG_ENCRYPTED or info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise NotACheckpointError(f"{path}: archive member {info.filename!r} is encrypted or uses compression"
                                  f" method {info.compress_type}; only stored and deflated members are read")
    f.seek(0, io.SEEK_END)
    start = _data_offset(path, f, info, f.tell())
    f.seek(start)
    if info.compress_type == zipfile.ZIP_STORED:
        return f.read(min(size, info.compress_size))
    try:
        return zlib.decompressobj(RAW_DEFLATE_WBITS).decompress(
            f.read(min(info.compress_size, size + INFLATE_INPUT_BYTES)), size)
    except zlib.error as e:
        raise CorruptCheckpointError(f"{path}: archive member {info.filename!r}: damaged deflate stream: {e}") from None


def open_zip_archive(path: str, what: str = ".keras archive") -> tuple[zipfile.ZipFile, BinaryIO]:
    """A zip archive read in place (regular local files only: zipfile on a FIFO would block
    forever), or a remote one read whole (at most :data:`MAX_REMOTE_ARCHIVE_BYTES`).

    Args:
        path: The archive.
        what: How messages name it (``.keras archive``, ``.npz file``).

    Returns:
        (the ``ZipFile``, the underlying file, which the caller closes).

    Raises:
        NotACheckpointError: A directory.
        CorruptCheckpointError: Not a readable zip archive.
    """
    if _fs.is_remote(path):
        f: BinaryIO = io.BytesIO(_fs.read_bytes(path, limit=MAX_REMOTE_ARCHIVE_BYTES, what=f"remote {what}"))
    else:
        if _fs.isdir(path):
            raise NotACheckpointError(f"{path}: is a directory, not a {what}")
        f = _fs.open_binary(path)
    try:
        return zipfile.ZipFile(f), f
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        f.close()
        raise CorruptCheckpointError(
            f"{path}: not a readable zip archive (truncated or damaged): {' '.join(str(e).split())}"
        ) from None


def _open_member(path: str, name: str) -> io.RawIOBase:
    """A seekable, read-only stream of archive member ``name``, read in place (stored: a
    window onto the archive; deflated: inflated on demand; other methods: zipfile's stream).

    The archive is checked again (traversal, duplicates, bombs): it may have changed since it
    was listed. Closing the stream closes the archive file.
    """
    zf, f = open_zip_archive(path)
    try:
        _check_archive(path, zf)
        info = zf.getinfo(name)
        plain = not info.flag_bits & ZIP_FLAG_ENCRYPTED
        if plain and info.compress_type in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            f.seek(0, io.SEEK_END)
            start = _data_offset(path, f, info, f.tell())
            if info.compress_type == zipfile.ZIP_STORED:
                return _MemberWindow(f, start, info.file_size)
            return _InflateWindow(f, start, info.compress_size, info.file_size)
        return _ZipStream(zf.open(info), f)  # zipfile's seekable stream; slow, bounded memory
    except KeyError:
        f.close()
        raise NotACheckpointError(f"{path}: no {name} in the archive") from None
    except (zipfile.BadZipFile, OSError, RuntimeError, ValueError, EOFError) as e:
        f.close()
        raise CorruptCheckpointError(f"{path}: cannot read {name}: {' '.join(str(e).split())}") from None
    except BaseException:
        f.close()
        raise


def _open_weights(path: str) -> Any:
    """``h5py.File`` over the archive's ``model.weights.h5``, read in place.

    Closing the returned file closes the archive too.
    """
    target = _open_member(path, WEIGHTS_FILENAME)
    return open_h5py(target, f"{path}/{WEIGHTS_FILENAME}", owned=target)


def _npz_object_member(path: str) -> tuple[str, str] | None:
    """The first ``.npy`` member of the archive's ``model.weights.npz`` whose dtype holds Python
    objects (stored pickled), as (member, dtype); None when there is none. Only the ``.npy``
    headers are parsed (``ast.literal_eval``), nothing is unpickled.

    Raises:
        CorruptCheckpointError: The inner archive or a header does not read.
    """
    label = f"{path}/{WEIGHTS_NPZ_FILENAME}"
    stream = _open_member(path, WEIGHTS_NPZ_FILENAME)
    try:
        with zipfile.ZipFile(io.BufferedReader(stream)) as inner:
            for info in inner.infolist()[:MAX_NPZ_MEMBERS_EXAMINED]:
                if not info.filename.endswith(NPY_SUFFIX):
                    continue
                with inner.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                   else np.lib.format.read_array_header_2_0)
                    _, _, dtype = read_header(member)
                if dtype.hasobject:
                    return info.filename, str(dtype)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, SyntaxError, RuntimeError) as e:
        raise CorruptCheckpointError(f"{label}: not a readable npz archive: {' '.join(str(e).split())}") from None
    finally:
        stream.close()
    return None


def _refuse_npz_weights(path: str) -> None:
    """Refuse a ``.keras`` archive whose weights are ``model.weights.npz``, saying why.

    Raises:
        UnsafeFileError: The npz holds pickled objects (what Keras's npz weights format writes).
        NotACheckpointError: It does not, but ckptinspect reads ``.keras`` weights only from
            ``model.weights.h5``.
        CorruptCheckpointError: The npz does not read.
    """
    found = _npz_object_member(path)
    if found is not None:
        member, dtype = found
        raise UnsafeFileError(
            f"{path}: weights are stored as {WEIGHTS_NPZ_FILENAME}, whose member {member!r} holds pickled"
            f" Python objects (dtype {dtype}); ckptinspect never loads pickled objects (unpickling can run"
            f" code). Re-save the model with Keras's default {WEIGHTS_FILENAME} weights to inspect it"
        )
    raise NotACheckpointError(
        f"{path}: weights are stored as {WEIGHTS_NPZ_FILENAME}; ckptinspect reads .keras weights only from"
        f" {WEIGHTS_FILENAME}"
    )


class _ZipStream(io.RawIOBase):
    """A seekable zip member stream that closes the archive file with it."""

    def __init__(self, member: Any, f: BinaryIO):
        super().__init__()
        self._member = member
        self._f = f

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._member.tell()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._member.seek(offset, whence)

    def readinto(self, buffer: Any) -> int:
        data = self._member.read(len(memoryview(buffer)))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    def close(self) -> None:
        try:
            self._member.close()
            self._f.close()
        finally:
            super().close()


# -- names from the model config ---------------------------------------------------------
def _layer_name(node: dict) -> str | None:
    cfg = node.get("config")
    if isinstance(cfg, dict) and isinstance(cfg.get("name"), str):
        return cfg["name"]
    return node.get("name") if isinstance(node.get("name"), str) else None


def _index_config(node: Any, path: tuple[str, ...], out: dict[tuple[str, ...], tuple[str, dict]]) -> None:
    if not isinstance(node, dict) or not isinstance(node.get("class_name"), str):
        return
    cfg = node.get("config") if isinstance(node.get("config"), dict) else {}
    out.setdefault(path, (node["class_name"], cfg))
    layers = cfg.get("layers")
    if isinstance(layers, list):
        for layer in layers:
            if isinstance(layer, dict) and (name := _layer_name(layer)):
                _index_config(layer, (*path, name), out)
    for key in NESTED_LAYER_KEYS:
        inner = cfg.get(key)
        if isinstance(inner, dict) and (name := _layer_name(inner)):
            _index_config(inner, (*path, name), out)


def _names_for(spec: Sequence[tuple[str, str | None]], cfg: dict) -> list[str]:
    return [name for name, flag in spec if flag is None or cfg.get(flag, True)]


def config_var_namer(config: Any):
    """A :data:`~.keras_h5.VarNamer` built from a ``.keras`` model config.

    The names apply only when the layer's class is known and the number of stored variables
    matches what its config implies; otherwise the caller keeps ``vars/N``.
    """
    index: dict[tuple[str, ...], tuple[str, dict]] = {}
    _index_config(config, (), index)

    def namer(path: tuple[str, ...], count: int) -> list[str] | None:
        names = None
        if path in index:
            class_name, cfg = index[path]
            if class_name in LAYER_VARIABLE_NAMES:
                names = _names_for(LAYER_VARIABLE_NAMES[class_name], cfg)
            elif class_name.endswith("Cell") and class_name in RNN_CELL_VARIABLE_NAMES:
                names = _names_for(RNN_CELL_VARIABLE_NAMES[class_name], cfg)
        elif path and path[:-1] in index:
            class_name, cfg = index[path[:-1]]
            if class_name in RNN_CELL_VARIABLE_NAMES:  # the cell of an LSTM/GRU/SimpleRNN
                names = _names_for(RNN_CELL_VARIABLE_NAMES[class_name], cfg)
        return names if names is not None and len(names) == count else None

    return namer


# -- opening -----------------------------------------------------------------------------
def _summarize(config: Any, metadata: Any) -> dict[str, Any]:
    info: dict[str, Any] = {}
    if isinstance(metadata, dict):
        for key in ("keras_version", "date_saved"):
            if isinstance(metadata.get(key), str):
                info[key] = metadata[key]
    info.update(summarize_model_config(config))
    if isinstance(config, dict):
        compile_config = config.get("compile_config")
        if isinstance(compile_config, dict):
            opt = compile_config.get("optimizer")
            if isinstance(opt, dict) and isinstance(opt.get("class_name"), str):
                info["optimizer_class"] = opt["class_name"]
            elif isinstance(opt, str):
                info["optimizer_class"] = opt
    return info


def open_zip(path: str) -> m.Checkpoint:
    """Open a ``.keras`` archive in place (config, metadata and the inner weights file).

    Args:
        path: The ``.keras`` zip file.

    Returns:
        The :class:`~ckptinspect.model.Checkpoint` (format ``keras-zip``); ``Variable.key`` is
        the dataset path inside ``model.weights.h5``; ``info`` holds the Keras version, save
        date, model class and name, layer count and the archive's member names.

    Raises:
        CheckpointNotFoundError: No such file.
        NotACheckpointError: A zip without ``model.weights.h5``.
        CorruptCheckpointError: A damaged archive, JSON member or weights file.
        UnsafeFileError: Path traversal, zip bombs, or an unsafe inner HDF5 file.
    """
    path = str(path)
    zf, f = open_zip_archive(path)
    try:
        _check_archive(path, zf)
        names = zf.namelist()
        if WEIGHTS_FILENAME not in names:
            if WEIGHTS_NPZ_FILENAME in names:
                _refuse_npz_weights(path)
            raise NotACheckpointError(
                f"{path}: a zip archive without {WEIGHTS_FILENAME}; expected a .keras archive."
                f" Received members: {names[:10]}"
            )
        config = _read_json(path, zf, CONFIG_FILENAME) if CONFIG_FILENAME in names else None
        metadata = _read_json(path, zf, METADATA_FILENAME) if METADATA_FILENAME in names else None
    finally:
        zf.close()
        f.close()

    label = f"{path}/{WEIGHTS_FILENAME}"
    h5 = _open_weights(path)
    try:
        listing = guard_h5(label, lambda: list_h5_file(h5, label, config_var_namer(config)))
    except CkptError:
        raise
    finally:
        h5.close()
    info = _summarize(config, metadata)
    info["layout"] = listing.info.get("layout")
    for key in ("model_name", "optimizer_name", "iterations_key", INFO_UNALLOCATED):
        if key in listing.info:
            info.setdefault(key, listing.info[key])
    info["members"] = names
    return m.Checkpoint(
        path=path,
        format=m.FORMAT_KERAS_ZIP,
        variables=listing.variables,
        step=listing.step,
        step_source=listing.step_source,
        num_shards=1,
        info=info,
        source=H5Source([lambda: _open_weights(path)], [label], [path]),
    )


def member_damage(path: str) -> list[m.Damage]:
    """Stream every archive member (``.keras`` or ``.npz``) so zipfile checks its CRC-32 (after
    the reader's safety checks, which opening the archive ran): one damage entry per member
    that does not read. Memory: one chunk of :data:`MEMBER_CHUNK_BYTES`."""
    damaged: list[m.Damage] = []
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            try:
                with zf.open(info) as member:
                    while member.read(MEMBER_CHUNK_BYTES):
                        pass
            except (zipfile.BadZipFile, OSError, EOFError, ValueError, RuntimeError, zlib.error) as e:
                damaged.append(m.Damage(key=info.filename, name=info.filename, file=path, kind=m.DAMAGE_CHECKSUM,
                                        problem=f"archive member does not read: {' '.join(str(e).split())}"))
    return damaged
