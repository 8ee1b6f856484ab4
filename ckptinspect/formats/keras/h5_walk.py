"""The safety walk of a Keras HDF5 file: every object listed through h5py's low-level API,
links, external/virtual datasets and shape bombs refused, dataset shapes, types and storage
described (metadata only). Part of :mod:`.keras_h5`.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import TYPE_CHECKING, Any

from ... import model as m
from ...errors import CheckpointNotFoundError, CorruptCheckpointError, UnallocatedDataError, UnsafeFileError
from .. import _fs

if TYPE_CHECKING:  # numpy is imported where values are read, and by h5py (a listing by our own reader needs none)
    import numpy as np

# Keras 3 layout names the walk needs.
VARS_GROUP = "vars"
NAME_ATTR = "name"
DTYPE_ATTR = "dtype"

# Safety limits. A dataset may declare at most MAX_DECLARED_BYTES (1 TiB); above
# BOMB_FLOOR_BYTES (4 GiB) it must also store at least 1/BOMB_MAX_EXPANSION of its declared
# size (the rule Keras's own loader applies to shape/decompression bombs).
MAX_DECLARED_BYTES = 1 << 40
DIRECT_KINDS = "fiucbV"  # fixed-size numpy kinds whose stored bytes may be read at their file offset
BOMB_FLOOR_BYTES = 1 << 32
BOMB_MAX_EXPANSION = 1000

# dtype names of HDF5 types that are not numbers: no statistics; ``diff`` compares them by
# value (references by the path of the object they point to, the rest by their bytes).
DTYPE_REFERENCE = "reference"
DTYPE_REGION_REFERENCE = "region-reference"
DTYPE_COMPOUND = "compound"
DTYPE_OPAQUE = "opaque"
DTYPE_ARRAY = "array"
DTYPE_OBJECT = "object"
VLEN_PREFIX = "vlen-"


def _h5py():
    import h5py  # noqa: PLC0415 - keep `import ckptinspect` light

    return h5py


# -- small helpers -------------------------------------------------------------------------
def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    np = sys.modules.get("numpy")  # not imported: value is no numpy array
    if np is not None and isinstance(value, np.ndarray) and value.shape == ():
        return _text(value[()])
    return str(value)


def _attr_values(oid: Any, name: str) -> list[str] | None:
    """A string-list attribute of a low-level object (None when absent), read without h5py's
    high-level attribute manager (a legacy file has one ``weight_names`` per layer)."""
    import numpy as np  # noqa: PLC0415 - an h5py path: numpy is loaded already

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
    if value.dtype.kind == "S":  # fixed-length byte strings, as Keras writes names: decoded in one go
        return [x.decode("utf-8", "replace") for x in value.reshape(-1).tolist()]
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
            import numpy as np  # noqa: PLC0415 - an h5py dtype: numpy is loaded already

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


# -- the safety walk -----------------------------------------------------------------------
class _Dataset:
    """One dataset as the walk found it (metadata only). A plain slotted class: a listing makes
    thousands, and a frozen dataclass costs about three times as much to build."""

    __slots__ = ("key", "shape", "dtype", "nbytes", "allocated", "offset", "stored")

    def __init__(self, key: str, shape: tuple[int, ...], dtype: str, nbytes: int, allocated: bool = True,
                 offset: int | None = None, stored: Any = None):
        self.key = key
        self.shape = shape
        self.dtype = dtype
        self.nbytes = nbytes
        self.allocated = allocated
        self.offset = offset  # contiguous, unfiltered storage of fixed-size values at this file offset
        self.stored = stored  # the numpy dtype of the stored values (with their byte order)

    def __repr__(self) -> str:
        return "_Dataset(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"


def _check_dataset(dsid: Any, key: str, label: str) -> None:
    """Refuse external, virtual and absurdly sized datasets (metadata only).

    Args:
        dsid: The low-level ``h5py.h5d.DatasetID``.
    """
    shape = tuple(dsid.shape or ())
    _check_storage(dsid, key, label, shape, dsid.get_offset(), dsid.dtype.itemsize)


def _check_storage(dsid: Any, key: str, label: str, shape: tuple[int, ...], offset: int | None, itemsize: int) -> None:
    """:func:`_check_dataset` with the dataset's shape, file offset and element size already fetched."""
    declared = math.prod(shape) * itemsize
    if declared > MAX_DECLARED_BYTES:
        raise UnsafeFileError(
            f"{label}: dataset {key!r} declares shape {shape} ({declared} bytes, more than the"
            f" {MAX_DECLARED_BYTES}-byte limit); refusing a possible shape bomb"
        )
    if offset is not None:
        return  # contiguous storage allocated inside this file: neither external nor virtual
    h5py = _h5py()
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


def _attr_text(oid: Any, name: bytes, types: _TypeCache | None = None) -> str | None:
    """A string attribute of a low-level object, or None when it has none (or is not text).

    Args:
        types: A cache of converted attribute types (a walk reads one attribute per ``vars``
            group, all of one type; default: convert this attribute's).
    """
    import numpy as np  # noqa: PLC0415 - an h5py path: numpy is loaded already

    h5py = _h5py()
    if not h5py.h5a.exists(oid, name):
        return None
    aid = h5py.h5a.open(oid, name)
    dtype = aid.dtype if types is None else types.dtype_of(aid)
    shape = aid.shape
    if dtype.kind not in "OSU" or shape not in ((), (1,)):
        return None
    value = np.empty(shape, dtype)
    aid.read(value)
    return _text(value.reshape(-1)[0])


def _is_unallocated(dsid: Any, storage: int | None = None) -> bool:
    """A dataset with elements but no storage: created, never written (metadata only).

    Args:
        storage: ``dsid.get_storage_size()``, when the caller already has it.
    """
    if (dsid.get_storage_size() if storage is None else storage) != 0:
        return False
    h5py = _h5py()
    space = dsid.get_space()
    if space.get_simple_extent_type() == h5py.h5s.NULL or space.get_simple_extent_npoints() == 0:
        return False
    return dsid.get_create_plist().get_layout() in (h5py.h5d.CONTIGUOUS, h5py.h5d.CHUNKED)


def _fill_value(dsid: Any) -> Any:
    """What an unwritten element reads as (a numpy scalar), or None when HDF5 leaves it undefined."""
    import numpy as np  # noqa: PLC0415 - an h5py path: numpy is loaded already

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


class _TypeCache:
    """The numpy dtype of the HDF5 datatype last converted: a listing's datasets mostly share
    a few types, and asking HDF5 whether two types are equal costs far less than h5py's
    conversion of a type to a numpy dtype (the same type always converts to the same dtype).
    Works for datasets and attributes alike (anything with ``get_type()``)."""

    __slots__ = ("tid", "dtype")

    def __init__(self) -> None:
        self.tid: Any = None
        self.dtype: np.dtype | None = None

    def dtype_of(self, oid: Any) -> np.dtype:
        tid = oid.get_type()
        if self.tid is None or not tid.equal(self.tid):
            self.tid, self.dtype = tid, tid.dtype
        return self.dtype  # type: ignore[return-value]


def _describe(dsid: Any, key: str, label: str, types: _TypeCache | None = None) -> _Dataset:
    """Check a dataset (as :func:`_check_dataset`) and describe it, asking HDF5 for its shape,
    file offset and storage size once each.

    Args:
        types: The walk's cache of converted types (default: convert this dataset's).
    """
    dtype = dsid.dtype if types is None else types.dtype_of(dsid)
    shape = tuple(dsid.shape or ())
    at = dsid.get_offset()  # None unless contiguous storage is allocated (never filtered)
    _check_storage(dsid, key, label, shape, at, dtype.itemsize)
    attr_dtype = _attr_text(dsid, DTYPE_ATTR.encode()) if dtype.kind == "V" else None
    name = _dtype_name(dtype, attr_dtype)
    storage = dsid.get_storage_size()
    if dtype.kind == "O" or (dtype.kind in "SU" and dtype.itemsize == 0):
        nbytes = int(storage)
    else:
        nbytes = math.prod(shape) * dtype.itemsize
    offset = None
    if at is not None and dtype.kind in DIRECT_KINDS and dtype.itemsize and nbytes and storage == nbytes:
        offset = int(at)
    return _Dataset(key=key, shape=shape, dtype=name, nbytes=nbytes, allocated=not _is_unallocated(dsid, storage),
                    offset=offset, stored=dtype)


def _unallocated_error(dsid: Any, key: str, label: str) -> UnallocatedDataError:
    shape = tuple(int(d) for d in (dsid.shape or ()))
    declared = math.prod(shape) * dsid.dtype.itemsize
    fill = _fill_value(dsid)
    reads_as = "undefined values" if fill is None else f"its fill value {_fill_text(fill)}"
    return UnallocatedDataError(
        f"{label}: dataset {key!r} is declared but unallocated: shape {list(shape)}"
        f" {_dtype_name(dsid.dtype, None)} ({_fs.human_size(declared)}) was never written, it would read as {reads_as}",
        key=key,
        fill_value=fill,
    )


def _fill_text(value: Any) -> str:
    import numpy as np  # noqa: PLC0415 - an h5py path: numpy is loaded already

    if isinstance(value, (bytes, np.void)):
        return repr(bytes(value))
    return repr(value.item()) if hasattr(value, "item") else repr(value)


@dataclasses.dataclass
class _Walk:
    """Every hard-linked dataset (in link order) and the ``name`` of every ``vars`` group."""

    datasets: dict[str, _Dataset]
    groups: set[str]
    vars_names: dict[str, str]


def _walk(h5: Any, label: str) -> _Walk:
    """Every object of the file, through h5py's low-level API, refusing anything unsafe.

    One traversal runs inside HDF5, a link visit (depth first in name order, each group
    entered once): every link must be a hard link (no object is opened for a soft or external
    one), and each object is listed once, under the first name that reaches it (its address
    identifies it), as ``H5Ovisit`` lists objects. A name with names below it is a group; any
    other object is opened and asked what it is: datasets are described, ``vars`` groups give
    their ``name`` attribute, named datatypes are skipped. (``H5Ovisit`` would also list each
    object once, but it reads every object header in full for its info: a second traversal
    as long as the listing itself.)

    Raises:
        UnsafeFileError: A soft, external or user-defined link, or an unsafe dataset.
        CorruptCheckpointError: A link name that is not UTF-8.
    """
    h5py = _h5py()
    h5l, h5o, h5i = h5py.h5l, h5py.h5o, h5py.h5i
    root = h5["/"].id

    def name_of(raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptCheckpointError(f"{label}: link name {raw!r} is not UTF-8") from None

    # The callback returns None (continue): an exception raised inside HDF5's callback does not
    # propagate cleanly through h5py.
    links: list[tuple[bytes, int, int]] = []  # (name, link type, object address for hard links)
    owned = getattr(h5, "_owned", None)  # the file object h5py reads (a remote file, a zip member)
    prefetching = owned is not None and getattr(owned, "prefetch", None) is not None
    if prefetching:
        links = _links_prefetching(root, owned)
    else:
        root.links.visit(lambda raw, info: links.append((raw, info.type, info.u)), info=True)
    hard = h5l.TYPE_HARD
    _refuse_other_links(root, links, label, name_of, h5l)

    parents = {raw.rpartition(b"/")[0] for raw, _, _ in links if b"/" in raw}  # groups with something below
    seen = {h5o.get_info(root).addr}  # the root is no object of its own listing (a link back to it)
    datasets: dict[str, _Dataset] = {}
    groups: set[str] = set()
    vars_names: dict[str, str] = {}
    vars_leaf = b"/" + VARS_GROUP.encode()
    name_attr = NAME_ATTR.encode()
    types, attr_types = _TypeCache(), _TypeCache()
    for i, (raw, _, address) in enumerate(links):
        if prefetching and i % PREFETCH_BATCH == 0:  # the headers met next, fetched together (the walk's may be gone)
            _fs.prefetch(owned, [(a, PREFETCH_HEADER_BYTES) for _, k, a in links[i:i + PREFETCH_BATCH] if k == hard and a not in seen],
                         at_least=PREFETCH_WINDOW_BYTES)
        if address in seen:  # reached again through another hard link
            continue
        seen.add(address)
        name = name_of(raw)
        oid = None
        if raw in parents:
            is_group = True
        else:
            oid = h5o.open(root, raw)
            kind = h5i.get_type(oid)
            if kind == h5i.DATASET:
                datasets[name] = _describe(oid, name, label, types)
                continue
            is_group = kind == h5i.GROUP  # else a named datatype: not listed
        if is_group:
            groups.add(name)
            if raw == vars_leaf[1:] or raw.endswith(vars_leaf):
                named = _attr_text(oid if oid is not None else h5o.open(root, raw), name_attr, attr_types)
                if named is not None:
                    vars_names[name] = named
    return _Walk(datasets, groups, vars_names)


def _refuse_other_links(root: Any, links: list[tuple[bytes, int, int]], label: str, name_of: Any, h5l: Any) -> None:
    """Raise UnsafeFileError for the first soft, external or user-defined link (none is followed)."""
    for raw, link_type, _ in links:
        if link_type == h5l.TYPE_HARD:
            continue
        name = name_of(raw)
        if link_type == h5l.TYPE_SOFT:
            target = _text(root.links.get_val(raw))
            raise UnsafeFileError(f"{label}: soft link {name!r} -> {target!r}; refusing to follow links")
        if link_type == h5l.TYPE_EXTERNAL:
            filename, path = (_text(x) for x in root.links.get_val(raw))
            raise UnsafeFileError(f"{label}: external link {name!r} -> {filename}:{path}; refusing to follow links")
        raise UnsafeFileError(f"{label}: link {name!r} of unknown type {link_type}; refusing to follow")


PREFETCH_WINDOW_BYTES = 64 << 10  # each range fetched for them: a group's B-tree and heap lie beside its header
PREFETCH_BATCH = 64  # objects whose headers are fetched together (at most 64 windows: 4-8 MiB)
PREFETCH_HEADER_BYTES = 4096  # an object header's usual reach; each range fetched is a metadata window (64 KiB) from there


def _links_prefetching(root: Any, f: Any) -> list[tuple[bytes, int, int]]:
    """``root.links.visit(..., info=True)``'s list (depth first in name order, each group
    entered once), walked here so that the objects' headers are fetched ahead: entering a group
    lists its links without opening their objects (a link carries its object's address), and
    the headers of its next :data:`PREFETCH_BATCH` children are fetched together
    (``_fs.prefetch``: several ranged requests in flight, near ones merged) before the first of
    them is opened. Over an object store that is a round of parallel requests per batch of
    siblings instead of one request after another per object (h5py reads one at a time); the
    depth-first order keeps each child's own subtree, stored beside it, in the windows just
    fetched."""
    h5py = _h5py()
    hard = h5py.h5l.TYPE_HARD
    group = h5py.h5o.TYPE_GROUP

    def links_of(path: bytes) -> list[tuple[bytes, int, int]]:
        kids: list[tuple[bytes, int, int]] = []
        root.links.iterate(lambda raw, info: kids.append((raw, info.type, info.u)), info=True, obj_name=path)
        return kids

    out: list[tuple[bytes, int, int]] = []
    entered = {h5py.h5o.get_info(root).addr}
    stack = [(b"", links_of(b"."), 0)]  # (prefix, the group's links, the next one to visit)
    while stack:
        prefix, kids, i = stack.pop()
        if i >= len(kids):
            continue
        if i % PREFETCH_BATCH == 0:
            _fs.prefetch(f, [(a, PREFETCH_HEADER_BYTES) for _, k, a in kids[i:i + PREFETCH_BATCH] if k == hard and a not in entered],
                         at_least=PREFETCH_WINDOW_BYTES)
        raw, kind, addr = kids[i]
        stack.append((prefix, kids, i + 1))
        full = prefix + raw
        out.append((full, kind, addr))
        if kind == hard and addr not in entered and h5py.h5o.get_info(root, full).type == group:
            entered.add(addr)
            stack.append((full + b"/", links_of(full), 0))
    return out


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


def _join(*parts: str) -> str:
    return "/".join(p for p in parts if p)


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
