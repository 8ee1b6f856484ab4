"""The listing walk of a Keras HDF5 file through our own metadata reader (:mod:`.hdf5`),
without h5py: the same :class:`~.h5_walk._Walk` as :func:`~.h5_walk._walk`, object for object.

Every question the h5py walk answers with an error (links other than hard links, external
or virtual storage, shape bombs, names that are not UTF-8) is raised here as
:class:`~.hdf5.Unsupported`, and the caller lists the file through h5py instead: the error
users see stays the one they always saw. Part of :mod:`.keras_h5`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from . import hdf5
from .h5_walk import (
    BOMB_FLOOR_BYTES,
    BOMB_MAX_EXPANSION,
    DIRECT_KINDS,
    MAX_DECLARED_BYTES,
    NAME_ATTR,
    VARS_GROUP,
    _Dataset,
    _dtype_name,
    _text,
    _Walk,
)

if TYPE_CHECKING:
    import numpy as np

Unsupported = hdf5.Unsupported


class OwnFile:
    """A file listed by our reader: its walk, and the attributes of its groups by path."""

    def __init__(self, walk: _Walk, group_attrs: dict[str, dict[bytes, Any]], reader: hdf5.File):
        self.walk = walk
        self.group_attrs = group_attrs
        self.reader = reader  # open until close(): attribute values are read on demand

    def close(self) -> None:
        self.reader.close()

    def __enter__(self) -> "OwnFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # The legacy layout's Attrs (see .legacy).
    def has(self, group: str, name: str) -> bool:
        return name.encode() in self._attrs(group)

    def text(self, group: str, name: str) -> str:
        """``_text(attrs[name])`` as h5py's attribute manager reads it (which decodes ASCII
        variable-length strings to ``str`` too)."""
        attr = self._attrs(group)[name.encode()]
        if attr.shape == () and (attr.vlen is not None or attr.dtype.kind == "S"):  # a scalar string: no numpy
            return _text(self.reader.strings(attr, decode=True)[0])
        return _text(self._value(group, name, decode=True))

    def split(self, group: str, name: str) -> list[str]:
        """:func:`~.h5_walk._split_attr`: whole, or ``name0``, ``name1``..."""
        attrs = self._attrs(group)
        if name.encode() in attrs:
            return self._strings(group, name)
        out: list[str] = []
        index = 0
        while f"{name}{index}".encode() in attrs:
            out.extend(self._strings(group, f"{name}{index}"))
            index += 1
        return out

    def _attrs(self, group: str) -> dict[bytes, Any]:
        found = self.group_attrs.get(group)
        if found is None:
            raise Unsupported(f"attributes of {group!r}, which is not a group")
        return found

    def _value(self, group: str, name: str, decode: bool = False) -> np.ndarray:
        attr = self._attrs(group)[name.encode()]
        if attr.shape is None:
            raise Unsupported(f"attribute {name!r} of {group!r} has a null dataspace")
        return self.reader.attribute_value(attr, decode)

    def _strings(self, group: str, name: str) -> list[str]:
        """:func:`~.h5_walk._attr_values`."""
        attr = self._attrs(group)[name.encode()]
        if attr.shape is None or math.prod(attr.shape) == 0:
            return []
        if attr.vlen is not None or attr.dtype.kind == "S":  # strings, as Keras writes names: no numpy
            return [_text(x) for x in self.reader.strings(attr)]
        return [_text(x) for x in self.reader.attribute_value(attr).reshape(-1)]


def _name(raw: bytes) -> str:
    if not raw or b"/" in raw or raw == b".":
        raise Unsupported(f"link name {raw!r}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Unsupported(f"link name {raw!r} is not UTF-8") from None


def _describe(ds: hdf5.Dataset, key: str) -> _Dataset:
    """:func:`~.h5_walk._describe` for a dataset our reader parsed."""
    if ds.null:
        raise Unsupported("a dataset with a null dataspace")
    dtype = ds.dtype
    shape = ds.shape
    count = math.prod(shape)
    declared = count * dtype.itemsize
    at = ds.address if ds.layout == hdf5.CONTIGUOUS else None
    storage = ds.storage
    if declared > MAX_DECLARED_BYTES or (at is None and declared > BOMB_FLOOR_BYTES and declared > BOMB_MAX_EXPANSION * storage):
        raise Unsupported(f"dataset {key!r} declares {declared} bytes")
    if ds.vlen is not None:
        name, nbytes = "string", storage
    else:
        name, nbytes = _dtype_name(dtype, None), declared
    offset = None
    if at is not None and dtype.kind in DIRECT_KINDS and dtype.itemsize and nbytes and storage == nbytes:
        offset = at
    allocated = not (storage == 0 and count != 0 and ds.layout in (hdf5.CONTIGUOUS, hdf5.CHUNKED))
    return _Dataset(key, shape, name, nbytes, allocated, offset, dtype)  # (shape: a tuple of ints already)


def _attr_text(reader: hdf5.File, attrs: dict[bytes, Any], name: bytes) -> str | None:
    """:func:`~.h5_walk._attr_text`: a string attribute, or None."""
    attr = attrs.get(name)
    if attr is None or attr.dtype.kind not in "OSU" or attr.shape not in ((), (1,)):
        return None
    return _text(reader.strings(attr)[0])


def own_walk(path: str) -> OwnFile:
    """List every object of the HDF5 file at ``path`` (a local regular file) with our reader;
    the caller closes the returned file.

    Raises:
        Unsupported: The file is outside the reader's subset, unsafe or damaged.
        OSError: The file does not open or read.
    """
    reader = hdf5.File(path)
    try:
        return _own_walk(reader)
    except BaseException:
        reader.close()
        raise


def _own_walk(reader: hdf5.File) -> OwnFile:
    root = reader.object(reader.root)
    if not isinstance(root, hdf5.Group):
        raise Unsupported("the root object is not a group")
    seen = {reader.root}
    datasets: dict[str, _Dataset] = {}
    groups: set[str] = set()
    vars_names: dict[str, str] = {}
    group_attrs: dict[str, dict[bytes, Any]] = {"": root.attrs}
    vars_leaf = VARS_GROUP.encode()
    name_attr = NAME_ATTR.encode()

    def visit(group: hdf5.Group, prefix: str, depth: int) -> None:
        if depth > hdf5.MAX_DEPTH:
            raise Unsupported("groups nested too deeply")
        for raw, address in group.links:
            name = prefix + _name(raw)
            if address in seen:  # reached again through another hard link
                continue
            seen.add(address)
            obj = reader.object(address)
            if isinstance(obj, hdf5.Dataset):
                datasets[name] = _describe(obj, name)
            elif isinstance(obj, hdf5.Group):
                groups.add(name)
                group_attrs[name] = obj.attrs
                if raw == vars_leaf:
                    named = _attr_text(reader, obj.attrs, name_attr)
                    if named is not None:
                        vars_names[name] = named
                visit(obj, name + "/", depth + 1)

    visit(root, "", 0)
    return OwnFile(_Walk(datasets, groups, vars_names), group_attrs, reader)
