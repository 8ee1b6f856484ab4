"""Keras HDF5 files: legacy ``.h5`` (full model or weights only), ``.weights.h5``, sharded weights.

A local file is listed by our own HDF5 metadata reader (:mod:`.hdf5`, through :mod:`.h5_own`)
when it lies inside the subset that reader knows; otherwise (and for remote files, ``.keras``
members and sharded weights) through h5py, decided once per file. TensorFlow and Keras are
never imported. Listing reads only HDF5 metadata (links, attributes, dataset shapes and types),
never tensor bytes; values are read one dataset at a time by :class:`H5Source` (contiguous ones
with one ``pread`` at the offset the listing found, the rest through h5py).

Layouts, as Keras writes them (keras/src/legacy/saving/legacy_h5_format.py,
keras/src/saving/saving_lib.py, tf_keras/src/saving/legacy/hdf5_format.py):

* Legacy full model (``model.save('m.h5')``): root attributes ``model_config``,
  ``training_config``, ``keras_version``, ``backend``; group ``model_weights`` with attribute
  ``layer_names``; one group per layer with attribute ``weight_names``, each weight stored at
  ``model_weights/<layer>/<weight name>`` (Keras 2: ``dense/dense/kernel:0``; Keras 3:
  ``dense/sequential/dense/kernel``); ``model_weights/top_level_model_weights`` for a model's
  own weights; ``optimizer_weights`` (attribute ``weight_names``) when the optimizer was saved.
  Long attributes are split into ``layer_names0``, ``layer_names1``...
* Legacy weights only (Keras 2 ``save_weights('w.h5')``): the same, with ``layer_names`` at the
  root and the layer groups directly under it.
* Keras 3 ``.weights.h5``: positional datasets ``<object path>/vars/<i>``, e.g.
  ``layers/sequential/layers/dense/vars/0``; each ``vars`` group has a ``name`` attribute with
  the layer's name (``enc_dense``); optimizer variables under ``optimizer/vars``; the model's
  own variables under the root ``vars``. tf.keras 2.13/2.14 on Windows wrote paths with
  backslashes (``dec\\_layer_checkpoint_dependencies\\dense/vars/0``).
* Sharded Keras 3 weights (``save_weights('w.weights.json', max_shard_size=...)``): a JSON
  index ``{"metadata": {...}, "weight_map": {"/layers/dense/vars": ["w_00000.weights.h5"]}}``
  and the shard files it names, each laid out as a ``.weights.h5`` file.

Untrusted files: soft and external links, external and virtual datasets, and datasets that
declare absurd sizes are refused with :class:`~ckptinspect.errors.UnsafeFileError` when the
file is opened, before anything is read (and checked again when a value is read).

This module is the public face; the mechanics live in private sub-modules: ``_h5_walk`` (the
safety walk and dataset descriptions), ``_h5_read`` (opening files, :class:`H5Source`),
``_h5_legacy`` and ``_h5_keras3`` (variable names and header facts of each layout).
"""

from __future__ import annotations

import dataclasses
import struct
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ... import model as m
from ...errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    NotACheckpointError,
    UnallocatedDataError,
    one_line,
)
from .. import _fs
from .keras3 import LAYOUT_KERAS3, VarNamer, _keras3_info, _keras3_variables
from .legacy import (
    LAYER_NAMES_ATTR,
    LAYOUT_LEGACY_FULL,
    LAYOUT_LEGACY_WEIGHTS,
    MODEL_WEIGHTS,
    H5pyAttrs,
    _legacy_info,
    _legacy_variables,
    summarize_model_config,  # noqa: F401 - public, used by keras_zip
)
from .h5_read import MAX_OBJECT_ELEMENTS, H5Source, _check_local, _open_file, _read_dataset, guard_h5, open_h5py  # noqa: F401 - re-exported
from .h5_own import OwnFile, Unsupported, own_walk
from .h5_walk import (
    MAX_DECLARED_BYTES,
    VARS_GROUP,
    _has_split_attr,
    _h5py,
    _safe_dataset,
    _strip_index,
    _walk,
    _Walk,
)
from .._layout import HDF5_SIGNATURE

if TYPE_CHECKING:  # numpy is imported where values are read (a listing by our own reader needs none)
    import numpy as np

__all__ = [
    "HDF5_SIGNATURE",
    "MAX_DECLARED_BYTES",
    "open_h5",
    "open_sharded",
    "list_h5_file",
    "H5Listing",
    "H5Source",
    "VarNamer",
    "iteration_counter",
    "INFO_UNALLOCATED",
]

WEIGHT_MAP = "weight_map"
MAX_INDEX_JSON_BYTES = 64 << 20

# Checkpoint.info key naming the datasets declared but never written (no storage allocated):
# reading one raises UnallocatedDataError (with its fill value) instead of materialising it.
INFO_UNALLOCATED = "unallocated"

# -- layouts -------------------------------------------------------------------------------


def _own_layout(own: OwnFile) -> str | None:
    """:func:`_layout` of a file our reader listed."""
    walk = own.walk
    if MODEL_WEIGHTS in walk.datasets:
        raise Unsupported(f"{MODEL_WEIGHTS} is a dataset")
    if MODEL_WEIGHTS in walk.groups and (own.has(MODEL_WEIGHTS, LAYER_NAMES_ATTR) or own.has(MODEL_WEIGHTS, LAYER_NAMES_ATTR + "0")):
        return LAYOUT_LEGACY_FULL
    if own.has("", LAYER_NAMES_ATTR) or own.has("", LAYER_NAMES_ATTR + "0"):
        return LAYOUT_LEGACY_WEIGHTS
    if walk.vars_names or any(g == VARS_GROUP or g.endswith("/" + VARS_GROUP) for g in walk.groups):
        return LAYOUT_KERAS3
    return None


def _layout(h5: Any, walk: _Walk) -> str | None:
    h5py = _h5py()
    mw = h5.get(MODEL_WEIGHTS) if MODEL_WEIGHTS in walk.groups else None
    if isinstance(mw, h5py.Group) and _has_split_attr(mw, LAYER_NAMES_ATTR):
        return LAYOUT_LEGACY_FULL
    if _has_split_attr(h5, LAYER_NAMES_ATTR):
        return LAYOUT_LEGACY_WEIGHTS
    if walk.vars_names or any(g == VARS_GROUP or g.endswith("/" + VARS_GROUP) for g in walk.groups):
        return LAYOUT_KERAS3
    return None


ITERATION_NAMES = ("iterations", "iteration")
NUMERIC_COUNTER_DTYPES = frozenset(
    {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64", "bfloat16"}
)


def iteration_counter(variables: Sequence[m.Variable]) -> m.Variable | None:
    """The optimizer's iteration counter, found from metadata alone (its value is not read).

    Legacy files name it (``optimizer_weights/iterations:0``, ``.../adam/iteration``); in Keras 3
    weights it is the first optimizer variable, a scalar (``optimizer/vars/0``).
    """
    for v in variables:
        if v.role == m.ROLE_OPTIMIZER and v.shape == () and _strip_index(v.key).rsplit("/", 1)[-1] in ITERATION_NAMES:
            return v
    for v in variables:
        if v.role == m.ROLE_OPTIMIZER and v.key.endswith(f"{VARS_GROUP}/0") and v.shape == () and v.dtype.startswith(("int", "uint", "float")):
            return v
    return None


def _with_counter(info: dict[str, Any], variables: Sequence[m.Variable]) -> dict[str, Any]:
    counter = iteration_counter(variables)
    if counter is not None:
        info["iterations_key"] = counter.key
    return info


def _with_unallocated(info: dict[str, Any], walks: Sequence[_Walk]) -> dict[str, Any]:
    """Name the datasets declared but never written (``info["unallocated"]``), if any."""
    keys = [k for w in walks for k, ds in w.datasets.items() if not ds.allocated]
    if keys:
        info[INFO_UNALLOCATED] = keys
    return info


def counter_step(read: Callable[[m.Variable], Any], variables: Sequence[m.Variable]) -> tuple[int | None, str | None]:
    """The step of a Keras file: its optimizer's iteration count, one scalar read (a few bytes).

    Args:
        read: Reads one variable's value (an array, or a Python number).
        variables: The file's variables.

    Returns:
        (step, where it came from), or (None, None) when the file has no counter.
    """
    counter = iteration_counter(variables)
    if counter is None or counter.size != 1 or counter.dtype not in NUMERIC_COUNTER_DTYPES:
        return None, None
    try:
        raw = read(counter)
        if isinstance(raw, (int, float)):
            value = float(raw)
        else:
            import numpy as np  # noqa: PLC0415 - numpy only where values are read

            value = float(np.asarray(raw).reshape(()))
    except UnallocatedDataError:  # never written: no step (verify reports the dataset)
        return None, None
    if value != value or value in (float("inf"), float("-inf")):
        return None, None
    return int(value), f"optimizer:{counter.key}"


# -- opening -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class H5Listing:
    """What :func:`list_h5_file` found in one open HDF5 file."""

    format: str
    variables: tuple[m.Variable, ...]
    info: dict[str, Any]
    step: int | None = None
    step_source: str | None = None
    # key -> (file offset, stored dtype) of contiguous fixed-size datasets (see H5Source).
    locations: dict[str, tuple[int, Any]] = dataclasses.field(default_factory=dict)


def list_h5_file(h5: Any, label: str, namer: VarNamer | None = None) -> H5Listing:
    """List the variables of an open Keras HDF5 file (metadata only).

    Args:
        h5: An open ``h5py.File``.
        label: How messages name the file (its path, or ``archive.keras/model.weights.h5``).
        namer: For Keras 3 layouts, gives variable names (``kernel``...) for a layer path.

    Returns:
        The format (``keras-h5`` or ``keras-weights-h5``), the variables and header facts.

    Raises:
        UnsafeFileError: Links, external/virtual datasets, shape bombs.
        NotACheckpointError: An HDF5 file that is not a Keras weights file.
        CorruptCheckpointError: The attributes name datasets the file does not have.
    """
    walk = _walk(h5, label)
    layout = _layout(h5, walk)
    locations = _locations(walk)

    def read(v: m.Variable) -> np.ndarray:
        return _read_dataset(_safe_dataset(h5, v.key, label), v, label)

    if layout in (LAYOUT_LEGACY_FULL, LAYOUT_LEGACY_WEIGHTS):
        base = MODEL_WEIGHTS if layout == LAYOUT_LEGACY_FULL else ""
        attrs = H5pyAttrs(h5)
        variables = tuple(_legacy_variables(attrs, walk, base, label))
        info = _with_unallocated(_with_counter(_legacy_info(attrs, walk, layout), variables), [walk])
        return H5Listing(m.FORMAT_KERAS_H5, variables, info, *counter_step(read, variables), locations=locations)
    if layout == LAYOUT_KERAS3:
        variables = tuple(_keras3_variables([walk], namer))
        info = _with_unallocated(_with_counter(_keras3_info([walk]), variables), [walk])
        return H5Listing(m.FORMAT_KERAS_WEIGHTS_H5, variables, info, *counter_step(read, variables), locations=locations)
    raise NotACheckpointError(
        f"{label}: an HDF5 file but not Keras weights (no {MODEL_WEIGHTS} group, no"
        f" {LAYER_NAMES_ATTR} attribute, no {VARS_GROUP} groups)"
    )


def _locations(walk: _Walk) -> dict[str, tuple[int, Any]]:
    return {k: (ds.offset, ds.stored) for k, ds in walk.datasets.items() if ds.offset is not None}


# numpy's dtype codes -> struct's: a scalar read without numpy.
_STRUCT_CODES = {"f2": "e", "f4": "f", "f8": "d", "i1": "b", "i2": "h", "i4": "i", "i8": "q",
                 "u1": "B", "u2": "H", "u4": "I", "u8": "Q"}


def _own_listing(path: str, label: str, namer: VarNamer | None = None) -> H5Listing | None:
    """:func:`list_h5_file` through our own HDF5 reader (no h5py), or None when the file is
    outside its subset (or a layout it does not list): the caller lists it through h5py."""
    try:
        own = own_walk(path)
    except (Unsupported, OSError):
        return None
    try:
        with own:
            return _list_own(own, path, label, namer)
    except Unsupported:
        return None


def _list_own(own: OwnFile, path: str, label: str, namer: VarNamer | None) -> H5Listing | None:
    """:func:`list_h5_file` of a file our reader walked (None: no Keras layout)."""
    walk = own.walk
    layout = _own_layout(own)
    if layout is None:
        return None  # h5py's listing says what the file is not
    locations = _locations(walk)

    def read(v: m.Variable) -> Any:
        """The value (a scalar of numbers as a Python number, without numpy)."""
        where = locations.get(v.key)
        if where is None:  # not contiguous: one value through h5py
            h5 = _open_file(path, label)
            try:
                return guard_h5(label, lambda: _read_dataset(_safe_dataset(h5, v.key, label), v, label))
            finally:
                h5.close()
        offset, stored = where
        try:
            raw = own.reader.read(offset, v.size * stored.itemsize)
        except Unsupported as e:
            raise CorruptCheckpointError(f"{label}: cannot read dataset {v.key!r}: {e}") from None
        code = _STRUCT_CODES.get(stored.str[1:]) if v.shape == () else None
        if code is not None:
            return struct.unpack(("<" if stored.str[0] == "|" else stored.str[0]) + code, raw)[0]
        import numpy as np  # noqa: PLC0415 - numpy only where values are read

        return np.frombuffer(raw, dtype=np.dtype(stored)).reshape(v.shape).copy()

    if layout in (LAYOUT_LEGACY_FULL, LAYOUT_LEGACY_WEIGHTS):
        base = MODEL_WEIGHTS if layout == LAYOUT_LEGACY_FULL else ""
        variables = tuple(_legacy_variables(own, walk, base, label))
        info = _with_unallocated(_with_counter(_legacy_info(own, walk, layout), variables), [walk])
        return H5Listing(m.FORMAT_KERAS_H5, variables, info, *counter_step(read, variables), locations=locations)
    variables = tuple(_keras3_variables([walk], namer))
    info = _with_unallocated(_with_counter(_keras3_info([walk]), variables), [walk])
    return H5Listing(m.FORMAT_KERAS_WEIGHTS_H5, variables, info, *counter_step(read, variables), locations=locations)


def open_h5(path: str) -> m.Checkpoint:
    """Open a Keras HDF5 file: legacy ``.h5`` (full model or weights) or ``.weights.h5``.

    Args:
        path: The file (any suffix; a ``.keras`` file that is really HDF5 works too).

    Returns:
        The :class:`~ckptinspect.model.Checkpoint` (format ``keras-h5`` for the legacy layout,
        ``keras-weights-h5`` for Keras 3 weights). Values are read on demand.

    Raises:
        CheckpointNotFoundError: No such file.
        NotACheckpointError: Not HDF5, or HDF5 without Keras weights.
        CorruptCheckpointError: Truncated or damaged.
        UnsafeFileError: Links, external/virtual datasets or shape bombs.
    """
    path = str(path)
    listed = None if _fs.is_remote(path) else _fs.fingerprint(path)  # the file as it was listed
    listing = None
    if listed is not None:
        _check_local(path, path)
        listing = _own_listing(path, path)
    if listing is None:
        h5 = _open_file(path)
        try:
            listing = guard_h5(path, lambda: list_h5_file(h5, path))
        finally:
            h5.close()
    return m.Checkpoint(
        path=path,
        format=listing.format,
        variables=listing.variables,
        step=listing.step,
        step_source=listing.step_source,
        num_shards=1,
        info=listing.info,
        source=H5Source([lambda: _open_file(path)], [path], direct=not _fs.is_remote(path),
                        listed={0: (listed, listing.locations)} if listed is not None else None),
    )


def _shard_names(index_path: str, weight_map: Any) -> list[str]:
    if not isinstance(weight_map, dict) or not weight_map:
        raise CorruptCheckpointError(f"{index_path}: no '{WEIGHT_MAP}' in the sharded weights index")
    names: set[str] = set()
    for entry, files in weight_map.items():
        files = [files] if isinstance(files, str) else files
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            raise CorruptCheckpointError(f"{index_path}: '{WEIGHT_MAP}' entry {entry!r} is not a file name or list of them")
        for name in files:
            _fs.check_shard_name(index_path, name)
            names.add(name)
    return sorted(names)


def open_sharded(path: str) -> m.Checkpoint:
    """Open sharded Keras 3 weights by their ``.weights.json`` index.

    Args:
        path: The JSON index written by ``save_weights(..., max_shard_size=...)``.

    Returns:
        The :class:`~ckptinspect.model.Checkpoint`; ``Variable.shards`` holds the index of
        the shard file in ``info["shard_files"]`` (sorted); ``num_shards`` their number.

    Raises:
        CheckpointNotFoundError: The index or a shard it names is missing.
        CorruptCheckpointError: The index is not valid JSON or a shard is damaged.
        UnsafeFileError: A shard name leaves the index's folder, or a shard is unsafe.
    """
    path = str(path)
    raw = _fs.read_bytes(path, limit=MAX_INDEX_JSON_BYTES, what="sharded weights index")
    import json  # noqa: PLC0415 - a sharded index only: ls of one .h5/.weights.h5 file imports no json

    try:
        index = json.loads(raw)
    except ValueError as e:
        raise CorruptCheckpointError(f"{path}: not a valid sharded weights index (JSON): {one_line(e)}") from None
    if not isinstance(index, dict):
        raise CorruptCheckpointError(f"{path}: not a sharded weights index (expected a JSON object)")
    shard_files = _shard_names(path, index.get(WEIGHT_MAP))
    directory = _fs.dirname(path)
    shard_paths = [_fs.join(directory, n) if directory else n for n in shard_files]
    walks: list[_Walk] = []
    shard_of: dict[str, int] = {}
    for i, shard_path in enumerate(shard_paths):
        if not _fs.exists(shard_path):
            raise CheckpointNotFoundError(f"{shard_path}: shard {i} named by {path} is missing")
        h5 = _open_file(shard_path)
        try:
            walk = guard_h5(shard_path, lambda: _walk(h5, shard_path))
            if guard_h5(shard_path, lambda: _layout(h5, walk)) not in (LAYOUT_KERAS3, None):
                raise NotACheckpointError(f"{shard_path}: shard named by {path} is not Keras 3 weights")
        finally:
            h5.close()
        for key in walk.datasets:
            if key in shard_of:
                raise CorruptCheckpointError(
                    f"{path}: dataset {key!r} is in shard {shard_files[shard_of[key]]} and in {shard_files[i]}"
                )
            shard_of[key] = i
        walks.append(walk)
    variables = _keras3_variables(walks, None, shard_of)
    info = _with_unallocated(_with_counter(_keras3_info(walks), variables), walks)
    info["shard_files"] = shard_files
    metadata = index.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("total_size"), (int, float)):
        info["total_size"] = int(metadata["total_size"])
    source = H5Source([(lambda p=p: _open_file(p)) for p in shard_paths], shard_paths, [path, *shard_paths],
                      direct=not _fs.is_remote(path))
    step, step_source = counter_step(source.read, variables)
    source.close()  # reopened on the next read
    return m.Checkpoint(
        path=path,
        format=m.FORMAT_KERAS_WEIGHTS_H5,
        variables=tuple(variables),
        step=step,
        step_source=step_source,
        num_shards=len(shard_files),
        info=info,
        source=source,
    )
