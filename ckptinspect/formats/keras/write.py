"""Writing Keras files (HDF5 through h5py, ``.keras`` archives around them): what ``extract``,
``rewrite`` and ``average`` write, the operations deciding only what goes in (which groups,
which names, which values).

* :func:`copy_h5`: a file copied group by group, root attributes with their stored HDF5 types,
  one top-level group left out, datasets written with new values (``rewrite --cast``), an
  ``edit`` applied to the copy (``extract``'s optimizer-free copy, ``rewrite``'s renames);
* :func:`weights_h5_renames` and :func:`legacy_h5_renames`: the edits a rename is in each Keras
  layout (the ``name`` attribute of a Keras 3 ``vars`` group; a legacy file's datasets,
  ``weight_names`` and ``layer_names``), refusing what the layout cannot express;
* :func:`copy_keras_zip`: a ``.keras`` archive copied member by member, its weights file
  written anew (``rewrite --cast`` of a ``.keras``);
* :func:`read_h5_output`: a written file opened to be read back (datasets, root attributes);
* :func:`update_h5_copy`: a copy of a file whose datasets are overwritten in row blocks
  (``average``).

Outputs are written to the temporary name the operation got from :mod:`ckptinspect._atomic`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import zipfile
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import h5py
import numpy as np

from ...errors import UsageError, VerificationError
from .h5_write import copy_attrs

__all__ = [
    "OPTIMIZER_GROUP",
    "LEGACY_OPTIMIZER_GROUP",
    "copy_h5",
    "copy_keras_zip",
    "h5_value",
    "read_h5_output",
    "H5Output",
    "weights_h5_renames",
    "legacy_h5_renames",
    "update_h5_copy",
    "H5Update",
    "row_block_elements",
]

OPTIMIZER_GROUP = "optimizer"  # Keras 3 .weights.h5 / .keras
LEGACY_OPTIMIZER_GROUP = "optimizer_weights"  # legacy .h5
VARS = "/vars/"
WEIGHT_NAMES = "weight_names"
LAYER_NAMES = "layer_names"
WEIGHT_SUFFIX_RE = re.compile(r":\d+$")
KERAS_DTYPE_ATTR = "dtype"  # on a dataset: "bfloat16" where Keras 3 stored bfloat16 values
BFLOAT16 = "bfloat16"

Edit = Callable[[Any], None]
Rename = tuple[str, str, str]  # (variable name, its key, the new name)


# -- copies --------------------------------------------------------------------------------
def copy_h5(src_h5: Any, path: str, *, drop: str | None = None, edit: Edit | None = None,
            values: Mapping[str, Callable[[], np.ndarray]] | None = None) -> None:
    """Write ``path``: the open h5py file ``src_h5`` copied group by group (root attributes with
    their stored types), without the top-level group ``drop``, then ``edit(dst)`` applied.

    ``values`` (dataset path -> a function giving its new value) writes those datasets with the
    values given instead of the source's bytes (``rewrite --cast``), each with its attributes and
    stored as Keras stores the value's dtype (bfloat16: 2-byte values h5py stores as opaque,
    with the ``dtype`` attribute Keras 3 reads them by, :func:`_mark_bfloat16`); the source's bytes are not
    copied first, so the file holds only the new ones. One value is in memory at a time."""
    with h5py.File(path, "w") as dst:
        copy_attrs(src_h5, dst)
        for name in src_h5:
            if name == drop:
                continue
            if values and any(key == name or key.startswith(name + "/") for key in values):
                _copy_with_values(src_h5[name], dst, name, values)
            else:
                src_h5.copy(src_h5[name], dst, name=name, without_attrs=False)
        if edit is not None:
            edit(dst)


def _copy_with_values(src: Any, parent: Any, name: str, values: Mapping[str, Callable[[], np.ndarray]]) -> None:
    """Copy the group ``src`` into ``parent`` as ``name``, walking down to the datasets in
    ``values`` (by path from the root) and writing those with their new values."""
    path = src.name.lstrip("/")
    if isinstance(src, h5py.Dataset):
        if path in values:
            created = parent.create_dataset(name, data=values[path]())
            copy_attrs(src, created)
            _mark_bfloat16(created)
        else:
            src.parent.copy(src, parent, name=name, without_attrs=False)
        return
    if not any(key.startswith(path + "/") for key in values):
        src.parent.copy(src, parent, name=name, without_attrs=False)
        return
    group = parent.create_group(name)
    copy_attrs(src, group)
    for child in src:
        _copy_with_values(src[child], group, child, values)


def _mark_bfloat16(ds: Any) -> None:
    """The ``dtype`` attribute Keras 3 reads bfloat16 values by: set when the dataset holds
    them, removed when it no longer does (a bfloat16 source cast to another type)."""
    if ds.dtype.kind == "V" and ds.dtype.itemsize == 2 and ds.dtype.names is None:
        ds.attrs[KERAS_DTYPE_ATTR] = BFLOAT16
    elif ds.attrs.get(KERAS_DTYPE_ATTR) in (BFLOAT16, BFLOAT16.encode()):
        del ds.attrs[KERAS_DTYPE_ATTR]


def h5_value(h5: Any, key: str) -> np.ndarray:
    """The whole value of dataset ``key`` of an open h5py file."""
    ds = h5[key]
    return ds[()]


class H5Output:
    """A written HDF5 file, opened read-only to be checked (a context manager)."""

    def __init__(self, path: str):
        self._f = h5py.File(path, "r")

    def __enter__(self) -> "H5Output":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._f.close()

    def __contains__(self, name: str) -> bool:
        return name in self._f

    def differing_root_attr(self, src_h5: Any) -> str | None:
        """The first root attribute of ``src_h5`` missing here or holding another value."""
        for name in src_h5.attrs:
            if name not in self._f.attrs or not np.array_equal(np.asarray(self._f.attrs[name]),
                                                               np.asarray(src_h5.attrs[name])):
                return name
        return None

    def datasets(self) -> list[str]:
        """Every dataset's path, in h5py's visiting order."""
        found: list[str] = []
        self._f.visititems(lambda name, obj: found.append(name) if isinstance(obj, h5py.Dataset) else None)
        return found

    def read(self, key: str) -> np.ndarray:
        return h5_value(self._f, key)


def read_h5_output(path: str) -> H5Output:
    """``path`` opened to be read back: ``with read_h5_output(tmp) as out: out.datasets()...``"""
    return H5Output(path)


# -- .keras archives ----------------------------------------------------------------------
KERAS_ZIP_WEIGHTS = "model.weights.h5"  # the weights member of a .keras archive
COPY_CHUNK = 1 << 20


def copy_keras_zip(src: str, path: str, write_weights: Callable[[str], None]) -> None:
    """Write the ``.keras`` archive ``path``: the members of the archive ``src`` copied in their
    order, with their names, dates and compression (``config.json``, ``metadata.json``, assets,
    streamed), its ``model.weights.h5`` replaced by the file ``write_weights(tmp)`` writes (under
    ``path``'s name plus a suffix, removed afterwards)."""
    weights_tmp = f"{path}.{KERAS_ZIP_WEIGHTS}"
    try:
        with zipfile.ZipFile(src) as zin, zipfile.ZipFile(path, "w") as zout:
            for info in zin.infolist():
                if info.filename == KERAS_ZIP_WEIGHTS:
                    write_weights(weights_tmp)
                    zout.write(weights_tmp, arcname=KERAS_ZIP_WEIGHTS, compress_type=info.compress_type)
                    continue
                with zin.open(info) as fin, zout.open(info, "w") as fout:
                    shutil.copyfileobj(fin, fout, COPY_CHUNK)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(weights_tmp)


# -- renames in the Keras layouts ----------------------------------------------------------
def _split(name: str) -> tuple[str, str] | None:
    """``head/vars/0`` -> (``head``, ``/vars/0``)."""
    pos = name.rfind(VARS)
    return (name[:pos], name[pos:]) if pos > 0 else None


def weights_h5_renames(path: str, renames: Sequence[Rename]) -> Edit:
    """The edit renaming variables of a Keras 3 ``.weights.h5``: it loads by position, so a
    rename changes the ``name`` attribute of the ``vars`` group (the layer's name), which every
    weight of the group must agree on.

    Raises:
        UsageError: A rename changes more than the layer name, or one layer would get two names.
    """
    names: dict[str, str] = {}  # vars group -> new name attribute
    for var_name, var_key, new_name in renames:
        if new_name == var_name:
            continue
        old, new, key = _split(var_name), _split(new_name), _split(var_key)
        if old is None or new is None or key is None or old[1] != new[1] or old[1] != key[1]:
            raise UsageError(
                f"{path}: {var_name!r} -> {new_name!r}: a Keras 3 .weights.h5 loads by position, so a"
                " rename may change the layer name only (the part before /vars/N)"
            )
        group = key[0] + VARS.rstrip("/")
        if names.setdefault(group, new[0]) != new[0]:
            raise UsageError(f"{path}: the weights of one layer ({group}) would get different names")

    def apply(dst: Any) -> None:
        for group, new in names.items():
            if group not in dst:
                raise VerificationError(f"{dst.filename}: group {group!r} was not copied")
            dst[group].attrs["name"] = new

    return apply


def _strings(values: Any) -> list[str]:
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]


def _encoded(names: list[str], like: Any) -> Any:
    if getattr(like, "dtype", None) is not None and like.dtype.kind == "S":
        return np.array([n.encode("utf-8") for n in names])
    return names


def legacy_h5_renames(path: str, h5: Any, renames: Sequence[Rename]) -> Edit:
    """The edit renaming variables of a legacy ``.h5`` (the open h5py file ``h5``): datasets and
    ``weight_names`` entries renamed; a layer group whose weights all move from ``<layer>/...``
    to ``<new>/...`` is renamed too (with ``layer_names``).

    Raises:
        UsageError: A variable is in no ``weight_names`` list, a rename changes more than the
            part stored as the weight's name, or a renamed layer collides with another group.
    """
    where: dict[str, tuple[str, int]] = {}  # dataset key -> (group, index in weight_names)
    weight_names: dict[str, list[str]] = {}

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Group) and WEIGHT_NAMES in obj.attrs:
            names = _strings(obj.attrs[WEIGHT_NAMES])
            weight_names[name] = names
            for i, w in enumerate(names):
                where[f"{name}/{w}"] = (name, i)

    h5.visititems(visit)
    new_names = {g: list(ws) for g, ws in weight_names.items()}
    for var_name, var_key, new_name in renames:
        if new_name == var_name:
            continue
        if var_key not in where:
            raise UsageError(f"{path}: {var_name!r} is not listed in any weight_names attribute; cannot rename it")
        group, i = where[var_key]
        w = weight_names[group][i]
        base = WEIGHT_SUFFIX_RE.sub("", w)
        prefix = var_name[: len(var_name) - len(base)]
        if not var_name.endswith(base) or not new_name.startswith(prefix) or new_name == prefix:
            raise UsageError(f"{path}: {var_name!r} -> {new_name!r}: only the part stored as the weight's name"
                             f" ({base!r}) can be renamed")
        new_names[group][i] = new_name[len(prefix):] + w[len(base):]
    renamed_groups: dict[str, str] = {}
    for group, olds in weight_names.items():
        news = new_names[group]
        if olds == news or "/" in group.rsplit("/", 1)[-1]:
            continue
        parent, _, layer = group.rpartition("/")
        heads = {n.split("/", 1)[0] for n in news}
        if all(o.startswith(layer + "/") for o in olds) and all("/" in n for n in news) and len(heads) == 1:
            new_layer = heads.pop()
            if new_layer != layer:
                target = f"{parent}/{new_layer}" if parent else new_layer
                if target in h5:
                    raise UsageError(f"{path}: renaming layer {layer!r} to {new_layer!r} collides with the existing"
                                     f" group {target!r}")
                renamed_groups[group] = target

    def apply(dst: Any) -> None:
        for group, olds in weight_names.items():
            news = new_names[group]
            if group not in dst:  # a dropped group
                continue
            for old, new in zip(olds, news):
                if old != new:
                    target = f"{group}/{new}"
                    dst.require_group(target.rsplit("/", 1)[0])
                    dst.move(f"{group}/{old}", target)
                    _prune_empty(dst, f"{group}/{old}".rsplit("/", 1)[0], group)
            if olds != news:
                dst[group].attrs[WEIGHT_NAMES] = _encoded(news, h5[group].attrs[WEIGHT_NAMES])
        for group, target in renamed_groups.items():
            dst.move(group, target)
            holder = dst[group.rpartition("/")[0]] if "/" in group else dst
            if LAYER_NAMES in holder.attrs:
                old_layer, new_layer = group.rsplit("/", 1)[-1], target.rsplit("/", 1)[-1]
                names = [new_layer if n == old_layer else n for n in _strings(holder.attrs[LAYER_NAMES])]
                holder.attrs[LAYER_NAMES] = _encoded(names, holder.attrs[LAYER_NAMES])

    return apply


def _prune_empty(dst: Any, group: str, stop: str) -> None:
    """Remove ``group`` and its parents up to ``stop`` (excluded) while they are empty."""
    while group != stop and group.startswith(stop + "/") and group in dst and len(dst[group]) == 0:
        del dst[group]
        group = group.rsplit("/", 1)[0]


# -- datasets overwritten in a copy (average) ----------------------------------------------
def row_block_elements(shape: Sequence[int], elements: int) -> int:
    """A block size of whole rows (of ``shape[1:]``) near ``elements``, at least one row."""
    row = 1
    for d in shape[1:]:
        row *= d
    return max(1, elements // max(row, 1)) * max(row, 1)


class H5Update:
    """An HDF5 file open for writing values into its existing datasets."""

    def __init__(self, f: Any):
        self._f = f

    def write_blocks(self, key: str, shape: Sequence[int], blocks: Iterable[np.ndarray]) -> None:
        """Overwrite dataset ``key`` (of ``shape``) with the flat ``blocks`` in order, each of
        whole rows (see :func:`row_block_elements`)."""
        shape = tuple(shape)
        row = 1
        for d in shape[1:]:
            row *= d
        ds = self._f[key]
        first = 0
        for block in blocks:
            if not shape:
                ds[()] = block.reshape(())
            elif block.size:
                rows = block.size // row
                ds[first : first + rows] = block.reshape((rows, *shape[1:]))
                first += rows


@contextlib.contextmanager
def update_h5_copy(src: str, path: str) -> Iterator[H5Update]:
    """``src`` copied to ``path`` as it is (groups, attributes, layout), then opened for its
    datasets to be overwritten: ``with update_h5_copy(newest, tmp) as f: f.write_blocks(...)``."""
    shutil.copyfile(src, path)
    with h5py.File(path, "r+") as f:
        yield H5Update(f)
