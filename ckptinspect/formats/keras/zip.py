"""``.keras`` archives: a zip of ``config.json``, ``metadata.json`` and ``model.weights.h5``.

The archive is read in place (:mod:`._zip_read`): nothing is extracted to disk. A stored
(uncompressed) weights member - what Keras writes - is handed to h5py as a read-only window
onto the archive's own bytes; a deflated one as a seekable window that inflates on demand,
keeping a snapshot of the decompressor every few MiB (memory: the snapshots and one input
block, never the member); any other compression through zipfile's own stream. TensorFlow and
Keras are never imported.

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
never loaded here. :func:`~._zip_read.member_damage` is ``verify``'s CRC-32 check of every
member.
"""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any, Sequence

import numpy as np

from ... import model as m
from ...errors import CkptError, CorruptCheckpointError, NotACheckpointError, UnsafeFileError, one_line
from .._readcheck import ReadCheck
from .._zip import check_archive, check_archive_by_reading, open_member, open_zip_archive
from .h5 import INFO_UNALLOCATED, H5Source, guard_h5, open_h5py, list_h5_file, summarize_model_config

__all__ = [
    "CONFIG_FILENAME",
    "METADATA_FILENAME",
    "WEIGHTS_FILENAME",
    "open_zip",
    "config_var_namer",
    "LAYER_VARIABLE_NAMES",
]

CONFIG_FILENAME = "config.json"
METADATA_FILENAME = "metadata.json"
WEIGHTS_FILENAME = "model.weights.h5"
WEIGHTS_NPZ_FILENAME = "model.weights.npz"

# Limits: a JSON member may hold at most MAX_JSON_BYTES (zip bombs, traversal: _zip_read).
MAX_JSON_BYTES = 64 << 20
NPY_SUFFIX = ".npy"
MAX_NPZ_MEMBERS_EXAMINED = 10_000

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


# -- the archive's members ---------------------------------------------------------------
def _read_json(path: str, zf: zipfile.ZipFile, name: str) -> Any:
    info = zf.getinfo(name)
    if info.file_size > MAX_JSON_BYTES:
        raise UnsafeFileError(f"{path}: {name} declares {info.file_size} bytes (limit {MAX_JSON_BYTES}); refusing")
    try:
        with zf.open(info) as f:
            raw = f.read(MAX_JSON_BYTES + 1)
    except (zipfile.BadZipFile, OSError, RuntimeError, ValueError) as e:
        raise CorruptCheckpointError(f"{path}: cannot read {name}: {one_line(e)}") from None
    if len(raw) > MAX_JSON_BYTES:
        raise UnsafeFileError(f"{path}: {name} is larger than its declared size; refusing")
    try:
        return json.loads(raw)
    except ValueError as e:
        raise CorruptCheckpointError(f"{path}: {name} is not valid JSON: {e}") from None


def _open_weights(path: str) -> Any:
    """``h5py.File`` over the archive's ``model.weights.h5``, read in place.

    Closing the returned file closes the archive too.
    """
    target = open_member(path, WEIGHTS_FILENAME)
    return open_h5py(target, f"{path}/{WEIGHTS_FILENAME}", owned=target)


def _npz_object_member(path: str) -> tuple[str, str] | None:
    """The first ``.npy`` member of the archive's ``model.weights.npz`` whose dtype holds Python
    objects (stored pickled), as (member, dtype); None when there is none. Only the ``.npy``
    headers are parsed (``ast.literal_eval``), nothing is unpickled.

    Raises:
        CorruptCheckpointError: The inner archive or a header does not read.
    """
    label = f"{path}/{WEIGHTS_NPZ_FILENAME}"
    stream = open_member(path, WEIGHTS_NPZ_FILENAME)
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
        raise CorruptCheckpointError(f"{label}: not a readable npz archive: {one_line(e)}") from None
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
        check_archive(path, zf)
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


def check_zip(path: str) -> ReadCheck:
    """``verify``'s plan for a ``.keras`` archive (members' CRCs, then every value)."""
    return check_archive_by_reading(path, open_zip)
