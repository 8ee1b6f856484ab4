"""``.keras`` archives: a zip of ``config.json``, ``metadata.json`` and ``model.weights.h5``.

The archive is read in place: nothing is extracted to disk. A stored (uncompressed) weights
member - what Keras writes - is handed to h5py as a read-only window onto the archive's own
bytes; a compressed one is decompressed into memory (up to :data:`MAX_IN_MEMORY_BYTES`) or
read through the zip stream. TensorFlow and Keras are never imported.

Variables are those of the inner ``model.weights.h5`` (Keras 3 layout, see
:mod:`.keras_h5`). Where ``config.json`` tells the class of a layer whose variables have
known names (``Dense``: ``kernel``, ``bias``...), they are named ``encoder/enc_dense/kernel``;
otherwise ``encoder/enc_dense/vars/0``.

Untrusted archives: member names that are absolute or climb out with ``..``, members that
declare far more uncompressed bytes than they store (zip bombs), and oversized JSON members
are refused with :class:`~ckptinspect.errors.UnsafeFileError`; the inner HDF5 file gets the
checks of :mod:`.keras_h5`.
"""

from __future__ import annotations

import io
import json
import re
import struct
import zipfile
from typing import Any, BinaryIO, Sequence

from .. import model as m
from ..errors import CkptError, CorruptCheckpointError, NotACheckpointError, UnsafeFileError
from . import _fs
from .keras_h5 import H5Source, _guard, _open_h5py, list_h5_file, summarize_model_config

__all__ = [
    "CONFIG_FILENAME",
    "METADATA_FILENAME",
    "WEIGHTS_FILENAME",
    "open_zip",
    "member_damage",
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
# stores members uncompressed); compressed weights up to MAX_IN_MEMORY_BYTES are decompressed
# into memory, larger ones are read through the zip stream.
MAX_JSON_BYTES = 64 << 20
BOMB_FLOOR_BYTES = 64 << 20
MAX_EXPANSION = 100
MAX_IN_MEMORY_BYTES = 1 << 30

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
class _MemberWindow(io.RawIOBase):
    """A read-only, seekable view of ``size`` bytes at ``start`` of an open file."""

    def __init__(self, f: BinaryIO, start: int, size: int):
        super().__init__()
        self._f = f
        self._start = start
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


MEMBER_CHUNK_BYTES = 8 << 20  # bytes of a member held at a time when checking its CRC


def _check_member_names(path: str, zf: zipfile.ZipFile) -> None:
    for info in zf.infolist():
        name = info.filename
        parts = re.split(r"[/\\]", name)
        if name.startswith(("/", "\\")) or WINDOWS_DRIVE_RE.match(name) or ".." in parts or "\x00" in name:
            raise UnsafeFileError(f"{path}: archive member {name!r} escapes the archive (path traversal); refusing")


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


def _open_archive(path: str) -> tuple[zipfile.ZipFile, BinaryIO]:
    if _fs.is_remote(path):
        f: BinaryIO = io.BytesIO(_fs.read_bytes(path))
    else:
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed by the caller
        except FileNotFoundError:
            from ..errors import CheckpointNotFoundError  # noqa: PLC0415

            raise CheckpointNotFoundError(f"{path}: no such file") from None
        except IsADirectoryError:
            raise NotACheckpointError(f"{path}: is a directory, not a .keras archive") from None
    try:
        return zipfile.ZipFile(f), f
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        f.close()
        raise CorruptCheckpointError(
            f"{path}: not a readable zip archive (truncated or damaged): {' '.join(str(e).split())}"
        ) from None


def _open_weights(path: str) -> Any:
    """``h5py.File`` over the archive's ``model.weights.h5``, read in place.

    Closing the returned file closes the archive too.
    """
    label = f"{path}/{WEIGHTS_FILENAME}"
    zf, f = _open_archive(path)
    try:
        info = zf.getinfo(WEIGHTS_FILENAME)
        _check_bomb(path, info)
        if info.compress_type == zipfile.ZIP_STORED and not info.flag_bits & 0x1:
            f.seek(0, io.SEEK_END)
            start = _data_offset(path, f, info, f.tell())
            target: Any = _MemberWindow(f, start, info.file_size)
        elif info.file_size <= MAX_IN_MEMORY_BYTES:
            with zf.open(info) as member:
                target = io.BytesIO(member.read(info.file_size + 1))
            f.close()
        else:
            target = _ZipStream(zf.open(info), f)  # seekable zip stream; slow, bounded memory
    except KeyError:
        f.close()
        raise NotACheckpointError(f"{path}: no {WEIGHTS_FILENAME} in the archive") from None
    except (zipfile.BadZipFile, OSError, RuntimeError, ValueError, EOFError) as e:
        f.close()
        raise CorruptCheckpointError(f"{path}: cannot read {WEIGHTS_FILENAME}: {' '.join(str(e).split())}") from None
    except BaseException:
        f.close()
        raise
    return _open_h5py(target, label, owned=target)


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
    zf, f = _open_archive(path)
    try:
        _check_member_names(path, zf)
        names = zf.namelist()
        for info in zf.infolist():
            _check_bomb(path, info)
        if WEIGHTS_FILENAME not in names:
            if WEIGHTS_NPZ_FILENAME in names:
                raise NotACheckpointError(
                    f"{path}: weights are stored as {WEIGHTS_NPZ_FILENAME}, which ckptinspect does not read;"
                    f" expected {WEIGHTS_FILENAME}"
                )
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
        listing = _guard(label, lambda: list_h5_file(h5, label, config_var_namer(config)))
    except CkptError:
        raise
    finally:
        h5.close()
    info = _summarize(config, metadata)
    info["layout"] = listing.info.get("layout")
    for key in ("model_name", "optimizer_name", "iterations_key"):
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
    """Stream every archive member so zipfile checks its CRC-32 (after the reader's safety
    checks, which opening the archive ran): one damage entry per member that does not read."""
    damaged: list[m.Damage] = []
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            try:
                with zf.open(info) as member:
                    while member.read(MEMBER_CHUNK_BYTES):
                        pass
            except (zipfile.BadZipFile, OSError, EOFError, ValueError, RuntimeError) as e:
                damaged.append(m.Damage(key=info.filename, name=info.filename, file=path, kind=m.DAMAGE_CHECKSUM,
                                        problem=f"archive member does not read: {' '.join(str(e).split())}"))
    return damaged
