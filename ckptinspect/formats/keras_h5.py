"""Keras HDF5 files: legacy ``.h5`` (full model or weights only), ``.weights.h5``, sharded weights.

Everything is read through h5py; TensorFlow and Keras are never imported. Listing reads only
HDF5 metadata (links, attributes, dataset shapes and types), never tensor bytes; values are
read one dataset at a time by :class:`H5Source`.

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
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .. import model as m
from ..errors import (
    CheckpointNotFoundError,
    CkptError,
    CorruptCheckpointError,
    NotACheckpointError,
    UnallocatedDataError,
    UnsafeFileError,
)
from . import _fs
from ._layout import HDF5_HEAD_BYTES, HDF5_SIGNATURE, is_hdf5_head

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


# Legacy layout names.
MODEL_WEIGHTS = "model_weights"
OPTIMIZER_WEIGHTS = "optimizer_weights"
TOP_LEVEL_MODEL_WEIGHTS = "top_level_model_weights"
LAYER_NAMES_ATTR = "layer_names"
WEIGHT_NAMES_ATTR = "weight_names"
MODEL_CONFIG_ATTR = "model_config"
TRAINING_CONFIG_ATTR = "training_config"
KERAS_VERSION_ATTR = "keras_version"
BACKEND_ATTR = "backend"

# Keras 3 layout names.
VARS_GROUP = "vars"
OPTIMIZER_GROUP = "optimizer"
NAME_ATTR = "name"
DTYPE_ATTR = "dtype"
# Path components that only hold other objects (Keras 3 ``layers``, tf.keras 2.13+
# ``_layer_checkpoint_dependencies``); readable names skip them.
CONTAINER_GROUPS = frozenset({"layers", "_layer_checkpoint_dependencies"})
WEIGHT_MAP = "weight_map"

# Safety limits. A dataset may declare at most MAX_DECLARED_BYTES (1 TiB); above
# BOMB_FLOOR_BYTES (4 GiB) it must also store at least 1/BOMB_MAX_EXPANSION of its declared
# size (the rule Keras's own loader applies to shape/decompression bombs).
MAX_DECLARED_BYTES = 1 << 40
DIRECT_KINDS = "fiucbV"  # fixed-size numpy kinds whose stored bytes may be read at their file offset
BOMB_FLOOR_BYTES = 1 << 32
BOMB_MAX_EXPANSION = 1000
MAX_INDEX_JSON_BYTES = 64 << 20
MAX_REMOTE_H5_BYTES = 2 << 30  # a remote HDF5 file is read into memory whole (h5py needs random access)

# Reading: variable-length values (strings, vlen sequences, references) become one Python
# object each; a dataset holding more than MAX_OBJECT_ELEMENTS of them is refused.
MAX_OBJECT_ELEMENTS = 1 << 21

# Checkpoint.info key naming the datasets declared but never written (no storage allocated):
# reading one raises UnallocatedDataError (with its fill value) instead of materialising it.
INFO_UNALLOCATED = "unallocated"

# dtype names of HDF5 types that are not numbers: no statistics; ``diff`` compares them by
# value (references by the path of the object they point to, the rest by their bytes).
DTYPE_REFERENCE = "reference"
DTYPE_REGION_REFERENCE = "region-reference"
DTYPE_COMPOUND = "compound"
DTYPE_OPAQUE = "opaque"
DTYPE_ARRAY = "array"
DTYPE_OBJECT = "object"
VLEN_PREFIX = "vlen-"

# (path components, number of stored vars) -> variable names, or None for vars/N.
VarNamer = Callable[[tuple[str, ...], int], "Sequence[str] | None"]


def _h5py():
    import h5py  # noqa: PLC0415 - keep `import ckptinspect` light

    return h5py


# -- small helpers -------------------------------------------------------------------------
def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray) and value.shape == ():
        return _text(value[()])
    return str(value)


def _attr_values(oid: Any, name: str) -> list[str] | None:
    """A string-list attribute of a low-level object (None when absent), read without h5py's
    high-level attribute manager (a legacy file has one ``weight_names`` per layer)."""
    h5py = _h5py()
    raw = name.encode()
    if not h5py.h5a.exists(oid, raw):
        return None
    aid = h5py.h5a.open(oid, raw)
    shape = aid.shape
    if shape is None or math.prod(shape) == 0:  # null dataspace, or Keras's empty float array
        return []
    value = np.empty(shape, aid.dtype)
    aid.read(value)
    return [_text(x) for x in value.reshape(-1)]


def _split_attr(obj: Any, name: str) -> list[str]:
    """A list attribute as Keras stores it: whole, or split into ``name0``, ``name1``...

    Args:
        obj: An h5py object or a low-level object id.
    """
    from h5py._objects import ObjectID  # noqa: PLC0415 - the base of every low-level id

    oid = obj if isinstance(obj, ObjectID) else obj.id
    whole = _attr_values(oid, name)
    if whole is not None:
        return whole
    out: list[str] = []
    index = 0
    while (chunk := _attr_values(oid, f"{name}{index}")) is not None:
        out.extend(chunk)
        index += 1
    return out


def _has_split_attr(obj: Any, name: str) -> bool:
    return name in obj.attrs or f"{name}0" in obj.attrs


def _strip_index(name: str) -> str:
    """Readable names drop the ``:0`` output index of TF variable names."""
    return m.strip_output_index(name)


_DTYPE_NAMES: dict[np.dtype, str] = {}


def _dtype_name(dtype: np.dtype, attr_dtype: str | None) -> str:
    """The dtype ``ls`` shows: numpy's name for numbers, else what the HDF5 type is."""
    if attr_dtype == "bfloat16" and dtype.itemsize == 2 and dtype.kind == "V" and dtype.names is None:
        return "bfloat16"
    if dtype.kind == "O":  # h5py keeps what the object is in the dtype's metadata; never cached
        h5py = _h5py()
        ref = h5py.check_ref_dtype(dtype)
        if ref is not None:
            return DTYPE_REGION_REFERENCE if ref is h5py.RegionReference else DTYPE_REFERENCE
        base = h5py.check_vlen_dtype(dtype)
        if base in (str, bytes):
            return "string"
        if base is not None:
            return VLEN_PREFIX + _dtype_name(np.dtype(base), None)
        return DTYPE_OBJECT
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        if dtype.kind in "SU":
            name = "string"
        elif dtype.kind == "b":
            name = "bool"
        elif dtype.kind == "V":
            name = DTYPE_COMPOUND if dtype.names else DTYPE_ARRAY if dtype.subdtype else DTYPE_OPAQUE
        else:
            name = dtype.name
        _DTYPE_NAMES[dtype] = name
    return name


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


# -- the safety walk -----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Dataset:
    key: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    allocated: bool = True
    offset: int | None = None  # contiguous, unfiltered storage of fixed-size values at this file offset
    stored: Any = None  # the numpy dtype of the stored values (with their byte order)


def _check_dataset(dsid: Any, key: str, label: str) -> None:
    """Refuse external, virtual and absurdly sized datasets (metadata only).

    Args:
        dsid: The low-level ``h5py.h5d.DatasetID``.
    """
    h5py = _h5py()
    shape = dsid.shape or ()
    declared = math.prod(shape) * dsid.dtype.itemsize
    if declared > MAX_DECLARED_BYTES:
        raise UnsafeFileError(
            f"{label}: dataset {key!r} declares shape {shape} ({declared} bytes, more than the"
            f" {MAX_DECLARED_BYTES}-byte limit); refusing a possible shape bomb"
        )
    if dsid.get_offset() is not None:
        return  # contiguous storage allocated inside this file: neither external nor virtual
    dcpl = dsid.get_create_plist()
    if dcpl.get_external_count() > 0:
        files = [_text(dcpl.get_external(i)[0]) for i in range(dcpl.get_external_count())]
        raise UnsafeFileError(f"{label}: dataset {key!r} keeps its data in external file(s) {files}; refusing to follow")
    if dcpl.get_layout() == h5py.h5d.VIRTUAL:
        raise UnsafeFileError(f"{label}: dataset {key!r} is a virtual dataset; refusing to follow")
    if declared > BOMB_FLOOR_BYTES:
        stored = dsid.get_storage_size()
        if declared > BOMB_MAX_EXPANSION * stored:
            raise UnsafeFileError(
                f"{label}: dataset {key!r} declares {declared} bytes but stores only {stored};"
                " refusing a possible shape/decompression bomb"
            )


def _attr_text(oid: Any, name: bytes) -> str | None:
    """A string attribute of a low-level object, or None when it has none (or is not text)."""
    h5py = _h5py()
    if not h5py.h5a.exists(oid, name):
        return None
    aid = h5py.h5a.open(oid, name)
    if aid.dtype.kind not in "OSU" or aid.shape not in ((), (1,)):
        return None
    value = np.empty(aid.shape, aid.dtype)
    aid.read(value)
    return _text(value.reshape(-1)[0])


def _is_unallocated(dsid: Any) -> bool:
    """A dataset with elements but no storage: created, never written (metadata only)."""
    h5py = _h5py()
    if dsid.get_storage_size() != 0:
        return False
    space = dsid.get_space()
    if space.get_simple_extent_type() == h5py.h5s.NULL or space.get_simple_extent_npoints() == 0:
        return False
    return dsid.get_create_plist().get_layout() in (h5py.h5d.CONTIGUOUS, h5py.h5d.CHUNKED)


def _fill_value(dsid: Any) -> Any:
    """What an unwritten element reads as (a numpy scalar), or None when HDF5 leaves it undefined."""
    h5py = _h5py()
    dtype = dsid.dtype
    if dtype.kind == "O":
        return None
    dcpl = dsid.get_create_plist()
    if dcpl.fill_value_defined() == h5py.h5d.FILL_VALUE_UNDEFINED:
        return None
    value = np.zeros((), dtype=dtype)
    dcpl.get_fill_value(value)
    return value[()]


def _describe(dsid: Any, key: str) -> _Dataset:
    dtype = dsid.dtype
    attr_dtype = _attr_text(dsid, DTYPE_ATTR.encode()) if dtype.kind == "V" else None
    shape = tuple(int(d) for d in (dsid.shape or ()))
    name = _dtype_name(dtype, attr_dtype)
    if dtype.kind == "O" or (dtype.kind in "SU" and dtype.itemsize == 0):
        nbytes = int(dsid.get_storage_size())
    else:
        nbytes = math.prod(shape) * dtype.itemsize
    offset = None
    if dtype.kind in DIRECT_KINDS and dtype.itemsize and nbytes:
        at = dsid.get_offset()  # None unless contiguous storage is allocated (never filtered)
        if at is not None and dsid.get_storage_size() == nbytes:
            offset = int(at)
    return _Dataset(key=key, shape=shape, dtype=name, nbytes=nbytes, allocated=not _is_unallocated(dsid),
                    offset=offset, stored=dtype)


def _unallocated_error(dsid: Any, key: str, label: str) -> UnallocatedDataError:
    shape = tuple(int(d) for d in (dsid.shape or ()))
    declared = math.prod(shape) * dsid.dtype.itemsize
    fill = _fill_value(dsid)
    reads_as = "undefined values" if fill is None else f"its fill value {_fill_text(fill)}"
    return UnallocatedDataError(
        f"{label}: dataset {key!r} is declared but unallocated: shape {list(shape)}"
        f" {_dtype_name(dsid.dtype, None)} ({_human(declared)}) was never written, it would read as {reads_as}",
        key=key,
        fill_value=fill,
    )


def _fill_text(value: Any) -> str:
    if isinstance(value, (bytes, np.void)):
        return repr(bytes(value))
    return repr(value.item()) if hasattr(value, "item") else repr(value)


def _human(n: int) -> str:
    size = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{n} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} bytes"  # pragma: no cover


@dataclasses.dataclass
class _Walk:
    """Every hard-linked dataset (in link order) and the ``name`` of every ``vars`` group."""

    datasets: dict[str, _Dataset]
    groups: set[str]
    vars_names: dict[str, str]


def _walk(h5: Any, label: str) -> _Walk:
    """Every object of the file, through h5py's low-level API, refusing anything unsafe.

    Two traversals run inside HDF5: a link visit checks that every link is a hard link (no
    object is opened for a soft or external one), then an object visit lists each object once
    (a group reached twice through hard links is visited once), depth first in name order.
    Only datasets and ``vars`` groups are then opened, for their shape, type and ``name``.

    Raises:
        UnsafeFileError: A soft, external or user-defined link, or an unsafe dataset.
        CorruptCheckpointError: A link name that is not UTF-8.
    """
    h5py = _h5py()
    h5l, h5o = h5py.h5l, h5py.h5o
    root = h5["/"].id

    def name_of(raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptCheckpointError(f"{label}: link name {raw!r} is not UTF-8") from None

    # Stopping a visit: return a true value from the callback (an exception raised inside
    # HDF5's callback does not propagate cleanly through h5py).
    bad: list[tuple[bytes, int]] = []
    root.links.visit(lambda raw, info: bad.append((raw, info.type)) if info.type != h5l.TYPE_HARD else None, info=True)
    if bad:
        raw, link_type = bad[0]
        name = name_of(raw)
        if link_type == h5l.TYPE_SOFT:
            target = _text(root.links.get_val(raw))
            raise UnsafeFileError(f"{label}: soft link {name!r} -> {target!r}; refusing to follow links")
        if link_type == h5l.TYPE_EXTERNAL:
            filename, path = (_text(x) for x in root.links.get_val(raw))
            raise UnsafeFileError(f"{label}: external link {name!r} -> {filename}:{path}; refusing to follow links")
        raise UnsafeFileError(f"{label}: link {name!r} of unknown type {link_type}; refusing to follow")

    objects: list[tuple[bytes, int]] = []
    h5o.visit(root, lambda raw, info: objects.append((raw, info.type)), info=True)
    datasets: dict[str, _Dataset] = {}
    groups: set[str] = set()
    vars_names: dict[str, str] = {}
    vars_leaf = b"/" + VARS_GROUP.encode()
    name_attr = NAME_ATTR.encode()
    for raw, obj_type in objects:
        if raw == b".":
            continue
        name = name_of(raw)
        if obj_type == h5o.TYPE_DATASET:
            dsid = h5o.open(root, raw)
            _check_dataset(dsid, name, label)
            datasets[name] = _describe(dsid, name)
        elif obj_type == h5o.TYPE_GROUP:
            groups.add(name)
            if raw == vars_leaf[1:] or raw.endswith(vars_leaf):
                named = _attr_text(h5o.open(root, raw), name_attr)
                if named is not None:
                    vars_names[name] = named
    return _Walk(datasets, groups, vars_names)


def _safe_dataset(h5: Any, key: str, label: str) -> Any:
    """Open dataset ``key`` (a low-level ``DatasetID``) through hard links only, checking it
    again before a read: the file may have changed since it was listed.

    Each prefix of the path is checked with ``H5Lget_info`` before HDF5 traverses it, so a
    soft or external link is refused rather than followed.
    """
    h5py = _h5py()
    root = h5["/"].id
    raw = key.encode("utf-8")
    parts = raw.split(b"/")
    for i in range(1, len(parts) + 1):
        prefix = b"/".join(parts[:i])
        if not root.links.exists(prefix):
            raise CheckpointNotFoundError(f"{label}: no dataset {key!r} (the file changed since it was listed?)")
        link_type = root.links.get_info(prefix).type
        if link_type != h5py.h5l.TYPE_HARD:
            kind = {h5py.h5l.TYPE_SOFT: "SoftLink", h5py.h5l.TYPE_EXTERNAL: "ExternalLink"}.get(link_type, "link")
            raise UnsafeFileError(f"{label}: {prefix.decode('utf-8', 'replace')!r} is a {kind}; refusing to follow links")
    oid = h5py.h5o.open(root, raw)
    if h5py.h5i.get_type(oid) != h5py.h5i.DATASET:
        raise CheckpointNotFoundError(f"{label}: {key!r} is not a dataset")
    _check_dataset(oid, key, label)
    return oid


def _is_variable_length(dtype: np.dtype) -> bool:
    """Strings and other values h5py converts to Python objects (vlen, references)."""
    h5py = _h5py()
    return dtype.kind == "O" or (dtype.kind in "SU" and dtype.itemsize == 0) or h5py.check_string_dtype(dtype) is not None


def _check_readable(dsid: Any, variable: m.Variable, label: str) -> None:
    """Refuse, before allocating anything, what reading would get wrong or blow up on.

    Raises:
        CorruptCheckpointError: A null dataspace.
        UnallocatedDataError: The dataset was never written (nothing is allocated for it).
        UnsafeFileError: More variable-length elements than :data:`MAX_OBJECT_ELEMENTS`.
    """
    h5py = _h5py()
    space = dsid.get_space()
    if space.get_simple_extent_type() == h5py.h5s.NULL:
        raise CorruptCheckpointError(f"{label}: dataset {variable.key!r} has no dataspace (an empty HDF5 dataset)")
    if _is_unallocated(dsid):
        raise _unallocated_error(dsid, variable.key, label)
    count = space.get_simple_extent_npoints()
    if dsid.dtype.kind == "O" and count > MAX_OBJECT_ELEMENTS:
        raise UnsafeFileError(
            f"{label}: dataset {variable.key!r} holds {count} variable-length elements (limit"
            f" {MAX_OBJECT_ELEMENTS}, one Python object each); refusing to read it"
        )


def _read_numeric(dsid: Any, variable: m.Variable, label: str, start: tuple[int, ...] | None = None,
                  count: tuple[int, ...] | None = None) -> np.ndarray:
    """A fixed-size value (numbers, records, opaque, fixed-length strings): the whole dataset,
    or the hyperslab ``count`` elements from ``start``, read into a fresh array."""
    h5py = _h5py()
    if start is None:
        mspace = fspace = h5py.h5s.ALL
        shape = tuple(dsid.get_space().shape)
    else:
        fspace = dsid.get_space()
        fspace.select_hyperslab(start, count)
        mspace = h5py.h5s.create_simple(count)
        shape = count
    value = np.empty(shape, dtype=dsid.dtype)
    try:
        if value.size:
            dsid.read(mspace, fspace, value)
    except (OSError, RuntimeError, ValueError, TypeError) as e:
        raise CorruptCheckpointError(f"{label}: cannot read dataset {variable.key!r}: {_one_line(e)}") from None
    if variable.dtype == "bfloat16" and value.dtype.kind == "V":
        import ml_dtypes  # noqa: PLC0415 - only for bfloat16 values

        value = value.view(ml_dtypes.bfloat16)
    return value


def _read_dataset(dsid: Any, variable: m.Variable, label: str) -> np.ndarray:
    """The whole value of a low-level dataset, read into a fresh array.

    Raises:
        UnallocatedDataError: The dataset was never written (nothing is allocated for it).
        UnsafeFileError: More variable-length elements than :data:`MAX_OBJECT_ELEMENTS`.
        CorruptCheckpointError: The value does not read.
    """
    h5py = _h5py()
    _check_readable(dsid, variable, label)
    if not _is_variable_length(dsid.dtype):
        return _read_numeric(dsid, variable, label)
    value = _read_high_level(dsid, variable, label)
    if h5py.check_ref_dtype(dsid.dtype) is not None:
        value = _dereference(dsid, value, variable, label)
    return value


def _hyperslabs(shape: tuple[int, ...], elements: int) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(start, count) of consecutive C-order runs of at most ``elements`` elements covering
    ``shape``: whole trailing dimensions where they fit, a slab of the next one."""
    elements = max(1, elements)
    if math.prod(shape) == 0:
        return
    axis, inner = len(shape), 1
    while axis > 0 and inner * shape[axis - 1] <= elements:
        axis -= 1
        inner *= shape[axis]
    if axis == 0:
        yield (0,) * len(shape), tuple(shape)
        return
    axis -= 1  # the dimension split into slabs of `step`
    step = max(1, elements // inner)
    tail = tuple(shape[axis + 1 :])
    for outer in np.ndindex(*shape[:axis]):
        for first in range(0, shape[axis], step):
            n = min(step, shape[axis] - first)
            yield (*outer, first, *(0,) * len(tail)), (*(1,) * axis, n, *tail)


def _dereference(dsid: Any, refs: np.ndarray, variable: m.Variable, label: str) -> np.ndarray:
    """References as what they point to: the target's path (``""`` for a null reference), and
    for a region reference the selection too. The stored bytes are file addresses, which
    differ between two copies of the same content; the targets do not."""
    h5py = _h5py()
    out = np.empty(refs.shape, dtype=object)
    flat_in, flat_out = refs.reshape(-1), out.reshape(-1)
    try:
        for i, ref in enumerate(flat_in):
            if not ref:
                flat_out[i] = ""
                continue
            target = _text(h5py.h5r.get_name(ref, dsid))
            if isinstance(ref, h5py.RegionReference):
                region = h5py.h5r.get_region(ref, dsid)
                target += "[" + region.encode().hex() + "]" if region is not None else ""
            flat_out[i] = target
    except (OSError, RuntimeError, ValueError, TypeError) as e:
        raise CorruptCheckpointError(f"{label}: dataset {variable.key!r}: a reference does not resolve: {_one_line(e)}") from None
    return out


def _read_high_level(dsid: Any, variable: m.Variable, label: str) -> np.ndarray:
    """Strings and other variable-length values, through h5py's Dataset (which converts them)."""
    h5py = _h5py()
    try:
        return np.asarray(h5py.Dataset(dsid)[()])
    except (OSError, RuntimeError, ValueError, TypeError) as e:
        raise CorruptCheckpointError(f"{label}: cannot read dataset {variable.key!r}: {_one_line(e)}") from None


# -- layouts -------------------------------------------------------------------------------
LAYOUT_LEGACY_FULL = "legacy-full"
LAYOUT_LEGACY_WEIGHTS = "legacy-weights"
LAYOUT_KERAS3 = "keras3"


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


def _legacy_model_name(layer: str, weight_name: str) -> str:
    """``dense`` + ``dense/kernel:0`` -> ``dense/kernel``; ``sequential/dense/kernel`` -> ``dense/kernel``."""
    wn = _strip_index(weight_name)
    if layer == TOP_LEVEL_MODEL_WEIGHTS:
        return wn
    parts = wn.split("/")
    if layer in parts:
        return "/".join(parts[parts.index(layer) :])
    return f"{layer}/{wn}"


def _join(*parts: str) -> str:
    return "/".join(p for p in parts if p)


def _legacy_variables(h5: Any, walk: _Walk, base: str, label: str) -> list[m.Variable]:
    h5py = _h5py()
    root = h5["/"].id
    group = h5[base] if base else h5
    layer_names = _split_attr(group, LAYER_NAMES_ATTR)
    if TOP_LEVEL_MODEL_WEIGHTS not in layer_names and _join(base, TOP_LEVEL_MODEL_WEIGHTS) in walk.groups:
        layer_names.append(TOP_LEVEL_MODEL_WEIGHTS)
    out: list[tuple[str, str, str]] = []  # (key, name, role)
    claimed: set[str] = set()

    def claim(key: str, name: str, role: str, owner: str) -> None:
        if key not in walk.datasets:
            raise CorruptCheckpointError(f"{label}: {owner} names weight {key!r} but the file has no such dataset")
        if key in claimed:
            raise CorruptCheckpointError(f"{label}: weight {key!r} is named twice in {owner}")
        claimed.add(key)
        out.append((key, name, role))

    for layer in layer_names:
        layer_path = _join(base, layer)
        if layer_path not in walk.groups:
            raise CorruptCheckpointError(
                f"{label}: {LAYER_NAMES_ATTR} lists layer {layer!r} but the file has no group {layer_path!r}"
            )
        for wn in _split_attr(h5py.h5o.open(root, layer_path.encode()), WEIGHT_NAMES_ATTR):
            claim(_join(layer_path, wn), _legacy_model_name(layer, wn), m.ROLE_MODEL, f"layer {layer!r}")

    if base and OPTIMIZER_WEIGHTS in walk.groups:
        for wn in _split_attr(h5[OPTIMIZER_WEIGHTS], WEIGHT_NAMES_ATTR):
            claim(_join(OPTIMIZER_WEIGHTS, wn), "optimizer/" + _strip_index(wn), m.ROLE_OPTIMIZER, OPTIMIZER_WEIGHTS)

    # Datasets no attribute names: optimizer ones stay optimizer state; anything else is
    # listed as metadata (Keras would not load it into the model).
    for key in walk.datasets:
        if key in claimed:
            continue
        if base and key.startswith(OPTIMIZER_WEIGHTS + "/"):
            out.append((key, "optimizer/" + _strip_index(key[len(OPTIMIZER_WEIGHTS) + 1 :]), m.ROLE_OPTIMIZER))
        else:
            out.append((key, _strip_index(key), m.ROLE_METADATA))
    return _make_variables(out, walk)


def _natural_key(key: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", key))


def _split_component(component: str) -> list[str]:
    """A path component, split at the backslashes of Windows-written files, containers dropped."""
    return [p for p in component.split("\\") if p and p not in CONTAINER_GROUPS]


def _keras3_variables(
    walks: Sequence[_Walk], namer: VarNamer | None, shard_of: dict[str, int] | None = None
) -> list[m.Variable]:
    vars_names: dict[str, str] = {}
    for w in walks:
        for g, n in w.vars_names.items():
            vars_names.setdefault(g, n)
    datasets: dict[str, _Dataset] = {}
    for w in walks:
        for key, ds in w.datasets.items():
            datasets.setdefault(key, ds)

    # Group the datasets of each vars group; groups and vars in natural order (dense_2 < dense_10).
    by_group: dict[str, list[str]] = {}
    loose: list[str] = []
    for key in datasets:
        parent, _, leaf = key.rpartition("/")
        if parent.rpartition("/")[2] == VARS_GROUP or parent == VARS_GROUP:
            by_group.setdefault(parent, []).append(key)
        else:
            loose.append(key)

    out: list[tuple[str, str, str]] = []
    for vars_group in sorted(by_group, key=_natural_key):
        keys = by_group[vars_group]
        keys.sort(key=_natural_key)
        owner = vars_group[: -len(VARS_GROUP)].rstrip("/")
        components = owner.split("/") if owner else []
        if components and _split_component(components[0])[:1] == [OPTIMIZER_GROUP]:
            role = m.ROLE_OPTIMIZER
            path = [p for c in components for p in _split_component(c)]
        else:
            role = m.ROLE_MODEL
            path = []
            for i, component in enumerate(components):
                named = vars_names.get("/".join(components[: i + 1]) + "/" + VARS_GROUP)
                if named is not None and "\\" not in component:
                    path.append(named)
                else:
                    path.extend(_split_component(component))
        indices = [k.rpartition("/")[2] for k in keys]
        names = None
        if namer is not None and role == m.ROLE_MODEL and indices == [str(i) for i in range(len(keys))]:
            names = namer(tuple(path), len(keys))
            if names is not None and len(names) != len(keys):
                names = None
        for j, key in enumerate(keys):
            leaf = names[j] if names else f"{VARS_GROUP}/{indices[j]}"
            out.append((key, _join(*path, leaf), role))
    for key in loose:
        out.append((key, "/".join(p for c in key.split("/") for p in _split_component(c)), m.ROLE_METADATA))
    return _make_variables(out, None, datasets=datasets, shard_of=shard_of)


def _make_variables(
    rows: list[tuple[str, str, str]],
    walk: _Walk | None,
    *,
    datasets: dict[str, _Dataset] | None = None,
    shard_of: dict[str, int] | None = None,
) -> list[m.Variable]:
    datasets = datasets if datasets is not None else walk.datasets  # type: ignore[union-attr]
    counts: dict[str, int] = {}
    for _, name, _ in rows:
        counts[name] = counts.get(name, 0) + 1
    variables = []
    for key, name, role in rows:
        if counts[name] > 1:
            name = _strip_index(key)
        ds = datasets[key]
        variables.append(
            m.Variable(
                key=key,
                name=name,
                shape=ds.shape,
                dtype=ds.dtype,
                nbytes=ds.nbytes,
                shards=(shard_of[key],) if shard_of is not None else (),
                role=role,
            )
        )
    return variables


# -- header facts --------------------------------------------------------------------------
def _json_attr(h5: Any, name: str) -> dict | list | None:
    if name not in h5.attrs:
        return None
    try:
        return json.loads(_text(h5.attrs[name]))
    except (ValueError, TypeError):
        return None


def summarize_model_config(config: Any) -> dict[str, Any]:
    """Model class, name and layer count from a Keras model config (legacy or Keras 3)."""
    out: dict[str, Any] = {}
    if not isinstance(config, dict):
        return out
    if "class_name" in config:
        out["model_class"] = config["class_name"]
    inner = config.get("config")
    layers = None
    if isinstance(inner, list):  # Keras <= 2.1 Sequential: the config is the layer list
        layers = inner
    elif isinstance(inner, dict):
        if isinstance(inner.get("name"), str):
            out["model_name"] = inner["name"]
        if isinstance(inner.get("layers"), list):
            layers = inner["layers"]
    if layers is not None:
        # As len(model.layers): a Sequential model does not count its InputLayer.
        if out.get("model_class") == "Sequential":
            layers = [x for x in layers if not (isinstance(x, dict) and x.get("class_name") == "InputLayer")]
        out["layer_count"] = len(layers)
    return out


def _legacy_info(h5: Any, layout: str) -> dict[str, Any]:
    info: dict[str, Any] = {"layout": layout}
    src = h5 if KERAS_VERSION_ATTR in h5.attrs else h5.get(MODEL_WEIGHTS, h5)
    for attr in (KERAS_VERSION_ATTR, BACKEND_ATTR):
        if attr in src.attrs:
            info[attr] = _text(src.attrs[attr])
    model_config = _json_attr(h5, MODEL_CONFIG_ATTR)
    if model_config is not None:
        info.update(summarize_model_config(model_config))
    elif MODEL_CONFIG_ATTR in h5.attrs:
        info["model_config_error"] = "model_config is not valid JSON"
    base = h5[MODEL_WEIGHTS] if layout == LAYOUT_LEGACY_FULL else h5
    names = _split_attr(base, LAYER_NAMES_ATTR)
    info.setdefault("layer_count", len(names))
    training = _json_attr(h5, TRAINING_CONFIG_ATTR)
    if isinstance(training, dict):
        opt = training.get("optimizer_config")
        if isinstance(opt, dict) and "class_name" in opt:
            info["optimizer_class"] = opt["class_name"]
        if isinstance(training.get("loss"), (str, dict)):
            loss = training["loss"]
            info["loss"] = loss if isinstance(loss, str) else loss.get("class_name")
    return info


def _keras3_info(walks: Sequence[_Walk]) -> dict[str, Any]:
    info: dict[str, Any] = {"layout": LAYOUT_KERAS3}
    for w in walks:
        if VARS_GROUP in w.vars_names:
            info.setdefault("model_name", w.vars_names[VARS_GROUP])
        opt = w.vars_names.get(f"{OPTIMIZER_GROUP}/{VARS_GROUP}")
        if opt is not None:
            info.setdefault("optimizer_name", opt)
    return info


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


def counter_step(read: Callable[[m.Variable], np.ndarray], variables: Sequence[m.Variable]) -> tuple[int | None, str | None]:
    """The step of a Keras file: its optimizer's iteration count, one scalar read (a few bytes).

    Args:
        read: Reads one variable's value.
        variables: The file's variables.

    Returns:
        (step, where it came from), or (None, None) when the file has no counter.
    """
    counter = iteration_counter(variables)
    if counter is None or counter.size != 1 or counter.dtype not in NUMERIC_COUNTER_DTYPES:
        return None, None
    try:
        value = float(np.asarray(read(counter)).reshape(()))
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
    locations = {k: (ds.offset, ds.stored) for k, ds in walk.datasets.items() if ds.offset is not None}

    def read(v: m.Variable) -> np.ndarray:
        return _read_dataset(_safe_dataset(h5, v.key, label), v, label)

    if layout in (LAYOUT_LEGACY_FULL, LAYOUT_LEGACY_WEIGHTS):
        base = MODEL_WEIGHTS if layout == LAYOUT_LEGACY_FULL else ""
        variables = tuple(_legacy_variables(h5, walk, base, label))
        info = _with_unallocated(_with_counter(_legacy_info(h5, layout), variables), [walk])
        return H5Listing(m.FORMAT_KERAS_H5, variables, info, *counter_step(read, variables), locations=locations)
    if layout == LAYOUT_KERAS3:
        variables = tuple(_keras3_variables([walk], namer))
        info = _with_unallocated(_with_counter(_keras3_info([walk]), variables), [walk])
        return H5Listing(m.FORMAT_KERAS_WEIGHTS_H5, variables, info, *counter_step(read, variables), locations=locations)
    raise NotACheckpointError(
        f"{label}: an HDF5 file but not Keras weights (no {MODEL_WEIGHTS} group, no"
        f" {LAYER_NAMES_ATTR} attribute, no {VARS_GROUP} groups)"
    )


def _open_file(path: str, label: str | None = None) -> Any:
    """``h5py.File`` for a local or remote path, with h5py's errors turned into ours."""
    label = label or path
    if _fs.is_remote(path):
        data = _fs.read_bytes(path, limit=MAX_REMOTE_H5_BYTES, what="remote HDF5 file")
        if not is_hdf5_head(data[:HDF5_HEAD_BYTES]):
            raise NotACheckpointError(f"{label}: not an HDF5 file (no HDF5 signature)")
        return open_h5py(io.BytesIO(data), label)
    if not _fs.exists(path):
        raise CheckpointNotFoundError(f"{label}: no such file")
    if _fs.isdir(path):
        raise NotACheckpointError(f"{label}: is a directory, not an HDF5 file")
    _fs.check_regular(path)  # h5py opens by name: on a FIFO it would block forever
    if not is_hdf5_head(_fs.read_head(path, HDF5_HEAD_BYTES)):
        raise NotACheckpointError(f"{label}: not an HDF5 file (no HDF5 signature)")
    return open_h5py(path, label)


_OWNING_FILE_CLASS: list[type] = []


def _owning_file_class() -> type:
    """An ``h5py.File`` that also closes the file object it was opened on."""
    if not _OWNING_FILE_CLASS:
        h5py = _h5py()

        class OwningFile(h5py.File):
            _owned: Any = None

            def close(self) -> None:
                try:
                    super().close()
                finally:
                    if self._owned is not None:
                        self._owned.close()
                        self._owned = None

        _OWNING_FILE_CLASS.append(OwningFile)
    return _OWNING_FILE_CLASS[0]


def open_h5py(target: Any, label: str, owned: Any = None) -> Any:
    """``h5py.File(target)`` read-only, h5py's errors turned into ours.

    Args:
        target: A local path or a seekable file object.
        label: How messages name the file.
        owned: A file object to close together with the returned file (or on failure).
    """
    h5py = _h5py()
    try:
        if owned is None:
            return h5py.File(target, "r")
        h5 = _owning_file_class()(target, "r")
        h5._owned = owned
        return h5
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{label}: no such file") from None
    except PermissionError:
        raise CheckpointNotFoundError(f"{label}: permission denied") from None
    except (OSError, RuntimeError, ValueError) as e:
        size = ""
        if isinstance(target, str) and _fs.exists(target):
            size = f" ({_fs.getsize(target)} bytes)"
        raise CorruptCheckpointError(
            f"{label}: not a readable HDF5 file{size}, truncated or damaged: {_one_line(e)}"
        ) from None
    finally:
        if owned is not None and "h5" not in locals():
            owned.close()


def guard_h5(label: str, fn: Callable[[], Any]) -> Any:
    """Run ``fn``; h5py / HDF5 errors from a damaged file become CorruptCheckpointError."""
    try:
        return fn()
    except CkptError:
        raise
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as e:
        raise CorruptCheckpointError(f"{label}: damaged HDF5 metadata: {_one_line(e)}") from None


class H5Source(m.BaseSource):
    """Reads one dataset at a time from one or more HDF5 files, opened on first use.

    Args:
        openers: For each shard, a function returning an open ``h5py.File``.
        labels: For each shard, how messages name it.
        paths: The files on disk (default: the labels).
    """

    def __init__(self, openers: Sequence[Callable[[], Any]], labels: Sequence[str], paths: Sequence[str] | None = None,
                 *, direct: bool = False, listed: dict[int, tuple[Any, dict[str, tuple[int, Any]]]] | None = None):
        self._openers = list(openers)
        self._labels = list(labels)
        self._paths = tuple(paths if paths is not None else labels)
        self._files: dict[int, Any] = {}
        # Each label is a local HDF5 file whose contiguous datasets may be read at their offset.
        self._direct = direct
        self._data = _fs.DataFiles()
        self._last: tuple[int, str, Any] | None = None
        # Per shard: the file's fingerprint when it was listed, and where its contiguous
        # datasets lie. While the open file still has that fingerprint, their blocks are read
        # at those offsets without reopening the dataset through HDF5.
        self._listed = listed or {}

    def files(self) -> tuple[str, ...]:
        return self._paths

    def open_hdf5(self, shard: int = 0) -> Any:
        """A new ``h5py.File`` of shard ``shard``, with the reader's safety checks (the caller closes it)."""
        return self._openers[shard]()

    def _file(self, shard: int) -> Any:
        if shard not in self._files:
            self._files[shard] = self._openers[shard]()
        return self._files[shard]

    def read(self, variable: m.Variable) -> np.ndarray:
        """The value of ``variable`` as a numpy array."""
        shard = variable.shards[0] if variable.shards else 0
        label = self._labels[shard]

        def go() -> np.ndarray:
            ds = _safe_dataset(self._file(shard), variable.key, label)
            return _read_dataset(ds, variable, label)

        return guard_h5(label, go)

    def iter_blocks(self, variable: m.Variable, elements: int) -> Iterator[np.ndarray]:
        """The flattened value in blocks of at most ``elements`` elements, each read from the
        file as one hyperslab: memory is one block, however large the dataset. Variable-length
        values (strings, references; at most :data:`MAX_OBJECT_ELEMENTS`) are read whole.

        Raises:
            UnallocatedDataError: The dataset was never written (raised before any block).
            CorruptCheckpointError: A block does not read.
        """
        shard = variable.shards[0] if variable.shards else 0
        label = self._labels[shard]
        listed = self._listed_location(shard, variable)
        if listed is not None:
            yield from self._direct_blocks(label, variable, *listed, elements)
            return

        def prepare() -> Any:
            # diff streams a variable twice (a byte-equality pass, then statistics): the second
            # call reuses the dataset the first one opened and checked.
            if self._last is not None and self._last[:2] == (shard, variable.key):
                return self._last[2]
            dsid = _safe_dataset(self._file(shard), variable.key, label)
            _check_readable(dsid, variable, label)
            self._last = (shard, variable.key, dsid)
            return dsid

        dsid = guard_h5(label, prepare)
        shape = tuple(int(d) for d in (dsid.shape or ()))
        if not shape or _is_variable_length(dsid.dtype) or shape != tuple(variable.shape):
            yield from super().iter_blocks(variable, elements)
            return
        direct = self._direct_location(shard, dsid, variable)
        if direct is not None:
            yield from self._direct_blocks(label, variable, *direct, elements)
            return
        for start, count in _hyperslabs(shape, elements):
            block = guard_h5(label, lambda: _read_numeric(dsid, variable, label, start, count))  # noqa: B023
            yield block.reshape(-1)
            del block

    def _listed_location(self, shard: int, variable: m.Variable) -> tuple[str, int, np.dtype] | None:
        """Where the listing found ``variable``'s bytes, while the file is still the one listed
        (same device, inode, size and modification time): else None, and the dataset is
        opened and checked again through HDF5."""
        listed = self._listed.get(shard) if self._direct else None
        location = listed[1].get(variable.key) if listed else None
        if location is None:
            return None
        offset, stored = location
        dtype = m.numpy_dtype("bfloat16") if variable.dtype == "bfloat16" else stored
        if dtype is None or dtype.kind not in DIRECT_KINDS or dtype.itemsize != stored.itemsize:
            return None
        path = self._labels[shard]
        try:
            if self._data.fingerprint(path) != listed[0]:
                return None
        except CkptError:
            return None
        size = self._data.size(path)
        if size is None or offset + variable.size * dtype.itemsize > size:
            return None
        return path, offset, dtype

    def _direct_location(self, shard: int, dsid: Any, variable: m.Variable) -> tuple[str, int, np.dtype] | None:
        """Where a dataset's bytes can be read straight from the file: contiguous storage
        (never filtered) of a fixed-size number type in a local HDF5 file, inside the file."""
        dtype = m.numpy_dtype("bfloat16") if variable.dtype == "bfloat16" else dsid.dtype
        if not self._direct or dtype is None or dtype.kind not in DIRECT_KINDS or dtype.itemsize != dsid.dtype.itemsize:
            return None
        offset = dsid.get_offset()
        if offset is None:
            return None
        path = self._labels[shard]
        size = self._data.size(path)
        nbytes = variable.size * dsid.dtype.itemsize
        if size is None or offset + nbytes > size or dsid.get_storage_size() != nbytes:
            return None
        return path, offset, dtype

    def _direct_blocks(self, label: str, variable: m.Variable, path: str, offset: int, dtype: np.dtype,
                       elements: int) -> Iterator[np.ndarray]:
        """Blocks read with ``pread`` into one pooled buffer (each block overwrites the last)."""
        total = variable.size
        elements = max(1, elements)
        buf = self._data.take_buffer(min(elements, total) * dtype.itemsize)
        try:
            view = memoryview(buf)
            done = 0
            while done < total:
                n = min(elements, total - done)
                nbytes = n * dtype.itemsize
                try:
                    got = self._data.pread_into(path, view[:nbytes], offset + done * dtype.itemsize)
                except OSError as e:
                    raise CorruptCheckpointError(f"{label}: cannot read dataset {variable.key!r}: {e.strerror or e}") from None
                if got != nbytes:
                    raise CorruptCheckpointError(f"{label}: dataset {variable.key!r} ends past the end of the file")
                yield np.frombuffer(buf, dtype=dtype, count=n)
                done += n
        finally:
            self._data.give_buffer(buf)

    def close(self) -> None:
        self._last = None
        self._data.close()
        files, self._files = self._files, {}
        for f in files.values():
            try:
                f.close()
            except Exception:  # noqa: BLE001 - closing a damaged file must not raise
                pass


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
            if (
                not name
                or name in (".", "..")
                or "/" in name
                or "\\" in name
                or ":" in name
                or "\x00" in name
            ):
                raise UnsafeFileError(
                    f"{index_path}: shard file name {name!r} is not a plain file name in the index's"
                    " directory; refusing path traversal"
                )
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
        UnsafeFileError: A shard name leaves the index's directory, or a shard is unsafe.
    """
    path = str(path)
    raw = _fs.read_bytes(path, limit=MAX_INDEX_JSON_BYTES, what="sharded weights index")
    try:
        index = json.loads(raw)
    except ValueError as e:
        raise CorruptCheckpointError(f"{path}: not a valid sharded weights index (JSON): {_one_line(e)}") from None
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

