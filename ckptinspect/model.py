"""The format-neutral model of a checkpoint: frozen dataclasses, no I/O.

A :class:`Checkpoint` is what :func:`ckptinspect.open` returns for any supported format. It
holds :class:`Variable` entries (metadata only: key, readable name, shape, dtype, size,
shards, role) and a tensor source that reads one value at a time when asked.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence, TypeVar

from .errors import CheckpointNotFoundError

if TYPE_CHECKING:  # numpy is imported only where values are read
    import numpy as np

__all__ = [
    "ROLES",
    "ROLE_MODEL",
    "ROLE_OPTIMIZER",
    "ROLE_METADATA",
    "SliceInfo",
    "Variable",
    "VariableTable",
    "LazySequence",
    "RetainedCheckpoint",
    "Checkpoint",
    "TensorSource",
    "BaseSource",
    "Damage",
    "CheckResult",
    "Progress",
    "run_positions",
    "place_in_run",
    "strip_output_index",
    "format_shape",
    "ITEMSIZE",
    "NUMERIC_DTYPES",
    "INTEGER_DTYPES",
    "FLOAT_DTYPES",
    "numpy_dtype",
    "display_name",
    "role_totals",
    "distinct_values",
]

ROLE_MODEL = "model"
ROLE_OPTIMIZER = "optimizer"
ROLE_METADATA = "metadata"
ROLES = (ROLE_MODEL, ROLE_OPTIMIZER, ROLE_METADATA)

FORMAT_TF_BUNDLE = "tf-bundle"
FORMAT_TF_SAVEDMODEL = "tf-savedmodel"
FORMAT_TF_V1 = "tf-v1-table"
FORMAT_KERAS_H5 = "keras-h5"
FORMAT_KERAS_WEIGHTS_H5 = "keras-weights-h5"
FORMAT_KERAS_ZIP = "keras-zip"
FORMAT_NPZ = "npz"
FORMAT_SAFETENSORS = "safetensors"
FORMAT_TORCH_ZIP = "torch-zip"
FORMAT_TORCH_LEGACY = "torch-legacy"


# Dtype names (numpy-style, as every format reports them) and what they hold.
ITEMSIZE = {
    "float32": 4, "float64": 8, "int32": 4, "uint8": 1, "int16": 2, "int8": 1,
    "complex64": 8, "int64": 8, "bool": 1, "qint8": 1, "quint8": 1, "qint32": 4,
    "bfloat16": 2, "qint16": 2, "quint16": 2, "uint16": 2, "complex128": 16, "float16": 2,
    "uint32": 4, "uint64": 8, "float8_e5m2": 1, "float8_e4m3fn": 1,
}
INTEGER_DTYPES = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})
FLOAT_DTYPES = frozenset({"float16", "float32", "float64", "bfloat16", "float8_e5m2", "float8_e4m3fn"})
NUMERIC_DTYPES = INTEGER_DTYPES | FLOAT_DTYPES | {"bool", "complex64", "complex128"}
# Dtypes whose bytes are a plain little-endian array numpy can view (ml_dtypes for the rest).
_NUMPY_CODES = {
    "float16": "<f2", "float32": "<f4", "float64": "<f8", "int8": "i1", "int16": "<i2",
    "int32": "<i4", "int64": "<i8", "uint8": "u1", "uint16": "<u2", "uint32": "<u4",
    "uint64": "<u8", "bool": "?", "complex64": "<c8", "complex128": "<c16",
}
_ML_DTYPES = {"bfloat16": "bfloat16", "float8_e5m2": "float8_e5m2", "float8_e4m3fn": "float8_e4m3fn"}


def numpy_dtype(name: str) -> np.dtype | None:
    """The numpy dtype of a numeric dtype name (little-endian), or None for strings and others."""
    import numpy as np  # noqa: PLC0415 - numpy only where values are read

    if name in _NUMPY_CODES:
        return np.dtype(_NUMPY_CODES[name])
    if name in _ML_DTYPES:
        try:
            import ml_dtypes  # noqa: PLC0415 - comes with TensorFlow and Keras

            return np.dtype(getattr(ml_dtypes, _ML_DTYPES[name]))
        except ImportError:  # pragma: no cover
            return None
    return None


@dataclasses.dataclass(frozen=True)
class SliceInfo:
    """One stored slice of a sliced (partitioned) variable.

    Attributes:
        starts: Start index of the slice in each dimension.
        lengths: Length in each dimension (``-1`` means the whole dimension).
        shard: The data shard holding the slice's bytes.
        nbytes: Bytes the slice takes in its shard.
    """

    starts: tuple[int, ...]
    lengths: tuple[int, ...]
    shard: int
    nbytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class Variable:
    """One stored variable: metadata only, never its value.

    Attributes:
        key: The exact key (TF bundle) or dataset path (HDF5) in the file.
        name: A readable name, e.g. ``encoder/enc_dense/kernel``.
        shape: The full shape.
        dtype: Numpy-style dtype name (``float32``, ``bfloat16``, ``string``...).
        nbytes: Bytes the value takes on disk.
        shards: Data shards holding its bytes (empty for single-file formats).
        role: ``model``, ``optimizer`` or ``metadata``.
        slices: The stored slices of a sliced variable, empty otherwise.
        graph_path: Object-graph path of the variable through the model (TF2 checkpoints
            whose model reaches it), or None.

    Where the bytes live (offsets, checksums) is the format's business: its tensor source
    knows, and offers streamed reads (:meth:`TensorSource.iter_blocks`) and byte-exact copies.
    """

    key: str
    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    shards: tuple[int, ...] = ()
    role: str = ROLE_MODEL
    slices: tuple[SliceInfo, ...] = ()
    graph_path: str | None = None

    @property
    def size(self) -> int:
        """Number of elements."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def sliced(self) -> bool:
        """True when the variable is stored as several slices."""
        return bool(self.slices)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of ``ls --format json`` (without stats)."""
        return {
            "key": self.key,
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "nbytes": self.nbytes,
            "shards": list(self.shards),
            "role": self.role,
        }


T = TypeVar("T")


class LazySequence(Sequence[T]):
    """A sequence whose items are made when asked, from columns behind it (:class:`VariableTable`,
    diff's rows, the matcher's key pairs): equal to any sequence of equal items (a tuple, a list),
    unhashable as a list is, and its positions checked one way (:meth:`_position`)."""

    __slots__ = ()
    _ITEM = "item"  # what an IndexError calls an item

    def _position(self, i: int) -> int:
        """``i`` as a position (a negative one counts from the end); IndexError outside."""
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"{self._ITEM} index out of range")
        return i

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]


class VariableTable(LazySequence[Variable]):
    """Many variables kept as columns: a checkpoint of a million tensors without a million objects.

    A ``Sequence[Variable]`` (what :attr:`Checkpoint.variables` may hold instead of a tuple): each
    :class:`Variable` is made when asked. Names (and keys, when they differ) are UTF-8 in one
    packed buffer with end offsets; shapes, dtypes, shards and roles are codes into short tuples
    of their distinct values; sizes are an int64 array. Variables have no slices and no
    object-graph path. ``rows`` (positions, optional) makes a view: a filtered or sorted listing
    sharing the columns.

    Args:
        names: The names' UTF-8 bytes (``surrogatepass``), one after another.
        name_ends: numpy int64, the end of each name in ``names``.
        shapes, shape_codes: Distinct shapes, and each variable's index into them.
        dtypes, dtype_codes: Distinct dtype names, and each variable's index.
        nbytes: numpy int64, each variable's bytes.
        roles, role_codes: Distinct roles, and each variable's index.
        shards, shard_codes: Distinct shard tuples, and each variable's index.
        keys, key_ends: The keys, packed as the names; None when every key is its name.
    """

    _ITEM = "variable"
    __slots__ = ("names", "name_ends", "shapes", "shape_codes", "dtypes", "dtype_codes", "nbytes", "roles",
                 "role_codes", "shards", "shard_codes", "keys", "key_ends", "rows", "_index")

    def __init__(self, names: bytes, name_ends: Any, shapes: Sequence[tuple[int, ...]], shape_codes: Any,
                 dtypes: Sequence[str], dtype_codes: Any, nbytes: Any, roles: Sequence[str], role_codes: Any,
                 shards: Sequence[tuple[int, ...]], shard_codes: Any, keys: bytes | None = None,
                 key_ends: Any = None, rows: Any = None, _index: dict[str, Any] | None = None):
        self.names, self.name_ends = names, name_ends
        self.shapes, self.shape_codes = tuple(shapes), shape_codes
        self.dtypes, self.dtype_codes = tuple(dtypes), dtype_codes
        self.nbytes = nbytes
        self.roles, self.role_codes = tuple(roles), role_codes
        self.shards, self.shard_codes = tuple(shards), shard_codes
        self.keys, self.key_ends = keys, key_ends
        self.rows = rows
        self._index = {} if _index is None else _index  # find's hashes, shared with views

    @classmethod
    def from_variables(cls, variables: Iterable[Variable]) -> VariableTable | None:
        """The columns of ``variables``, or None when one has slices or an object-graph path
        (which the columns do not keep)."""
        import numpy as np  # noqa: PLC0415

        names, keys, name_ends, key_ends = bytearray(), bytearray(), [], []
        codes: dict[str, dict[Any, int]] = {"shape": {}, "dtype": {}, "role": {}, "shards": {}}
        columns: dict[str, list[int]] = {k: [] for k in codes}
        nbytes: list[int] = []
        same_keys = True
        for v in variables:
            if v.slices or v.graph_path is not None:
                return None
            name = v.name.encode("utf-8", "surrogatepass")
            names += name
            name_ends.append(len(names))
            if v.key != v.name:
                same_keys = False
            keys += v.key.encode("utf-8", "surrogatepass")
            key_ends.append(len(keys))
            for field, value in (("shape", v.shape), ("dtype", v.dtype), ("role", v.role), ("shards", v.shards)):
                known = codes[field]
                columns[field].append(known.setdefault(value, len(known)))
            nbytes.append(v.nbytes)
        return cls(bytes(names), np.array(name_ends, np.int64), list(codes["shape"]),
                   np.array(columns["shape"], np.int32), list(codes["dtype"]), np.array(columns["dtype"], np.int32),
                   np.array(nbytes, np.int64), list(codes["role"]), np.array(columns["role"], np.int32),
                   list(codes["shards"]), np.array(columns["shards"], np.int32),
                   None if same_keys else bytes(keys), None if same_keys else np.array(key_ends, np.int64))

    # -- the sequence ----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.name_ends) if self.rows is None else len(self.rows)

    def _row(self, i: int) -> int:
        i = self._position(i)
        return i if self.rows is None else int(self.rows[i])

    @staticmethod
    def _text(buf: bytes, ends: Any, r: int) -> str:
        start = int(ends[r - 1]) if r else 0
        return buf[start:int(ends[r])].decode("utf-8", "surrogatepass")

    def name_of(self, r: int) -> str:
        """The name of row ``r`` of the columns (not of the view)."""
        return self._text(self.names, self.name_ends, r)

    def key_of(self, r: int) -> str:
        """The key of row ``r`` of the columns."""
        return self.name_of(r) if self.keys is None else self._text(self.keys, self.key_ends, r)

    def variable(self, r: int) -> Variable:
        """The :class:`Variable` of row ``r`` of the columns."""
        name = self.name_of(r)
        return Variable(key=name if self.keys is None else self._text(self.keys, self.key_ends, r), name=name,
                        shape=self.shapes[self.shape_codes[r]], dtype=self.dtypes[self.dtype_codes[r]],
                        nbytes=int(self.nbytes[r]), shards=self.shards[self.shard_codes[r]],
                        role=self.roles[self.role_codes[r]])

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return self.view(self.positions()[i])
        return self.variable(self._row(i))

    def __iter__(self) -> Iterator[Variable]:
        variable = self.variable
        if self.rows is None:
            return map(variable, range(len(self.name_ends)))
        return map(variable, self.rows.tolist())

    def __repr__(self) -> str:
        return f"<VariableTable of {len(self)} variables>"

    # -- columns ---------------------------------------------------------------------------
    def positions(self) -> Any:
        """The rows of the columns this table shows, in order (numpy int64)."""
        import numpy as np  # noqa: PLC0415 - a table's columns are numpy arrays

        return np.arange(len(self.name_ends), dtype=np.int64) if self.rows is None else self.rows

    def view(self, rows: Any) -> VariableTable:
        """A table of the same columns showing ``rows`` (positions into the columns)."""
        return VariableTable(self.names, self.name_ends, self.shapes, self.shape_codes, self.dtypes,
                             self.dtype_codes, self.nbytes, self.roles, self.role_codes, self.shards,
                             self.shard_codes, self.keys, self.key_ends, rows, self._index)

    def find(self, key: str) -> int | None:
        """The row (of the columns) of the variable whose key is ``key``, or None (a sorted
        array of the keys' hashes, made on first use: no dict of a million keys)."""
        import numpy as np  # noqa: PLC0415

        index = self._index
        after = index.get("next", 0)  # callers often go in order, or ask for the same one twice
        for guess in (after, after - 1):
            if 0 <= guess < len(self.name_ends) and self.key_of(guess) == key:
                index["next"] = guess + 1
                return guess
        if "hashes" not in index:
            buf, ends = (self.names, self.name_ends) if self.keys is None else (self.keys, self.key_ends)
            bounds = ends.tolist()
            hashes = np.fromiter(map(hash, map(buf.__getitem__, map(slice, [0, *bounds[:-1]], bounds))),
                                 np.int64, len(bounds))
            order = np.argsort(hashes, kind="stable")
            index["hashes"], index["order"] = hashes[order], order
        hashes, order = index["hashes"], index["order"]
        try:
            wanted = hash(key.encode("utf-8", "surrogatepass"))
        except UnicodeEncodeError:  # pragma: no cover - every str encodes with surrogatepass
            return None
        i = int(hashes.searchsorted(wanted))
        while i < len(hashes) and hashes[i] == wanted:
            r = int(order[i])
            if self.key_of(r) == key:
                index["next"] = r + 1
                return r
            i += 1
        return None

    def name_order(self) -> Any:
        """This table's positions sorted by name (Python's string order: code points; stable)."""
        import numpy as np  # noqa: PLC0415

        rows = self.positions()
        ends = self.name_ends
        if _rising(self.names, ends, rows):  # in order already (a TF index's keys): no sort buffer
            return rows
        starts = np.concatenate(([0], ends[:-1]))
        lengths = (ends - starts)[rows]
        widest = int(lengths.max()) if len(rows) else 0
        if widest and len(rows) * widest <= _SORT_BUFFER_BYTES and b"\0" not in self.names:
            # UTF-8 bytes sort as their code points do; numpy's fixed-width bytes pad with NULs
            fixed = np.zeros((len(rows), widest), np.uint8)
            buf = np.frombuffer(self.names, np.uint8)
            first = starts[rows]
            for column in range(widest):  # one vectorised copy per byte position (no array per byte)
                has = lengths > column
                fixed[has, column] = buf[first[has] + column]
            del first
            keys = fixed.view(f"S{widest}").reshape(-1)
            if bool((keys[1:] >= keys[:-1]).all()):  # in order already (writers often sort)
                return rows
            return rows[np.argsort(keys, kind="stable")]
        name_of = self.name_of
        return np.asarray(sorted(rows.tolist(), key=name_of), dtype=np.int64)

    def role_totals(self) -> dict[str, dict[str, int]]:
        """:func:`role_totals` of these variables, from the columns."""
        import numpy as np  # noqa: PLC0415

        rows = self.positions()
        codes = self.role_codes[rows]
        counts = np.bincount(codes, minlength=len(self.roles))
        nbytes = self.nbytes[rows]
        out = {r: {"count": 0, "nbytes": 0} for r in (*ROLES, "all")}
        for code, role in enumerate(self.roles):
            if counts[code]:
                out[role]["count"] += int(counts[code])
                out[role]["nbytes"] += sum(nbytes[codes == code].tolist())
        out["all"] = {"count": len(rows), "nbytes": sum(nbytes.tolist())}
        return out


def distinct_values(values_of: Callable[[slice], Any], n: int, block_rows: int) -> Any:
    """The distinct values, sorted, of ``values_of(rows)`` over ``n`` rows taken ``block_rows`` at
    a time: ``np.unique``'s result without a sort of every row's value at once, nor its import of
    ``numpy.ma``. ``values_of(slice(0, 0))`` gives the empty result its dtype."""
    import numpy as np  # noqa: PLC0415

    def sorted_once(values: Any) -> Any:
        out = np.sort(values)
        return out[np.concatenate(([True], out[1:] != out[:-1]))] if len(out) else out

    blocks = [slice(at, at + block_rows) for at in range(0, n, block_rows)] or [slice(0, 0)]
    return sorted_once(np.concatenate([sorted_once(values_of(block)) for block in blocks]))


_SORT_BUFFER_BYTES = 64 << 20  # names sorted as fixed-width bytes up to this much, else one by one
_RISING_ROWS = 4096  # names compared at a time by _rising


def _rising(names: bytes, ends: Any, rows: Any) -> bool:
    """Whether the names of ``rows`` are in order (UTF-8 bytes sort as their code points), a
    block of rows at a time; stops at the first that is not."""
    import numpy as np  # noqa: PLC0415

    previous = b""
    for first in range(0, len(rows), _RISING_ROWS):
        chosen = rows[first:first + _RISING_ROWS]
        stops = ends[chosen].tolist()
        starts = np.where(chosen > 0, ends[chosen - 1], 0).tolist()  # a row starts where the one before ends
        for start, stop in zip(starts, stops):
            name = names[start:stop]
            if name < previous:
                return False
            previous = name
    return True


@dataclasses.dataclass(frozen=True)
class RetainedCheckpoint:
    """One checkpoint of a checkpoint directory.

    Attributes:
        path: The checkpoint prefix.
        step: Its training step where the listing read it from its variables (the newest 32
            of a TF directory or a folder of checkpoint files), else None.
        timestamp: Save time from the state file, or None.
        exists: Whether its index (and data) files are on disk.
        in_state_file: Whether the ``checkpoint`` state file lists it.
        latest: Whether this is the checkpoint the directory resolves to.
        number: The number in its name (``ckpt-7``: 7, ``weights.03.weights.h5``: 3,
            ``epoch=2-step=60.ckpt``: 60), or None: its place in the series, not a step.
    """

    path: str
    step: int | None
    timestamp: float | None
    exists: bool
    in_state_file: bool = True
    latest: bool = False
    number: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run_positions(steps: Sequence[int | None], numbers: Sequence[int | None]) -> tuple[list[int | None], str | None]:
    """The one rule placing the checkpoints of a run in order and on an axis (``scan``,
    ``average``, ``verify``'s newest intact): their training steps when every one
    has one; else the numbers in their names (or epochs) when every one has one; else none
    (the order given stands).

    Args:
        steps: Each checkpoint's training step (:attr:`Checkpoint.step`), or None.
        numbers: Each checkpoint's number (:attr:`Checkpoint.number`, the listing's), or None.

    Returns:
        (positions, ``"step"``, ``"number"`` or None): one position per checkpoint, all None
        when neither is known for all of them.
    """
    if steps and all(s is not None for s in steps):
        return list(steps), "step"
    if numbers and all(n is not None for n in numbers):
        return list(numbers), "number"
    return [None] * max(len(steps), len(numbers)), None


def place_in_run(step: int | None, number: int | None, number_source: str | None) -> str | None:
    """Where a checkpoint sits in its run, in words: ``step 9360`` (its training step), else its
    number as what it is (``checkpoint 7``, ``epoch 3``, ``step=60 in its name``, ``save 7``,
    ``number 3 in its name``); None when neither is known. Every command says it this way."""
    if step is not None:
        return f"step {step}"
    if number is None:
        return None
    what, _, where = (number_source or "").partition(":")
    if what == "name":
        return {"checkpoint": f"checkpoint {number}", "epoch": f"epoch {number}",
                "step": f"step={number} in its name"}.get(where, f"number {number} in its name")
    if number_source == "save_counter":
        return f"save {number}"
    return f"{where or 'number'} {number}"


Progress = Callable[[int, int, Any], None]
"""``progress(done, total, item)``: called after each tensor of a long operation."""

# Damage kinds (``Damage.kind``).
DAMAGE_CHECKSUM = "checksum"
DAMAGE_TRUNCATED = "truncated"
DAMAGE_MISSING_SHARD = "missing-shard"
DAMAGE_SIZE = "size"
DAMAGE_LAYOUT = "layout"
DAMAGE_MISSING_SLICE = "missing-slice"
DAMAGE_UNREADABLE = "unreadable"
DAMAGE_DTYPE = "dtype"
DAMAGE_UNALLOCATED = "unallocated"  # an HDF5 dataset declared but never written

STATUS_INTACT = "intact"
STATUS_DAMAGED = "damaged"
STATUS_MISSING = "missing"


@dataclasses.dataclass(frozen=True)
class Damage:
    """One damaged tensor (or dataset, or archive member).

    Attributes:
        key: The key in the index (or dataset path in an HDF5 file).
        name: Its readable name (the key when no better name is known).
        file: The file holding its bytes (the data shard for TF bundles).
        kind: One of the ``DAMAGE_*`` kinds: ``checksum``, ``truncated``, ``missing-shard``,
            ``size``, ``layout``, ``missing-slice``, ``unreadable``, ``dtype``, ``unallocated``.
        problem: One line saying what is wrong.
        shard: The data shard number, or None.
        offset: Byte offset in ``file``, or None.
        size: Bytes the index records for it, or None.
        slice: For a stored slice of a sliced variable, which one (``[0:4,:]``), else None.
        stored_crc32c: The checksum the file records, as stored (TF bundles: masked), or None.
        actual_crc32c: The checksum of the bytes on disk, in the stored form, or None.
    """

    key: str
    name: str
    file: str
    kind: str
    problem: str
    shard: int | None = None
    offset: int | None = None
    size: int | None = None
    slice: str | None = None
    stored_crc32c: int | None = None
    actual_crc32c: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The verdict on one checkpoint (one prefix, V1 file, HDF5 or ``.keras`` file).

    Attributes:
        path: The prefix or file.
        format: A format name (``ckptinspect.formats.FORMATS``, from the format registry), or None when it could not be told.
        status: ``intact``, ``damaged`` or ``missing``.
        step: Its training step (the step rule), or None.
        latest: The checkpoint a directory resolves to.
        in_state_file: Listed by the directory's ``checkpoint`` state file.
        tensors: Tensors (stored slices, datasets) checked.
        nbytes: Bytes checked.
        problems: File-level problems (index, missing or short shards), one line each.
        damaged: Damaged tensors, in file order.
        number: In a directory, the number in its name (:attr:`RetainedCheckpoint.number`), or None.
    """

    path: str
    format: str | None
    status: str
    step: int | None = None
    latest: bool = False
    in_state_file: bool = False
    tensors: int = 0
    nbytes: int = 0
    problems: tuple[str, ...] = ()
    damaged: tuple[Damage, ...] = ()
    number: int | None = None

    @property
    def intact(self) -> bool:
        return self.status == STATUS_INTACT

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["damaged"] = [d.to_dict() for d in self.damaged]
        out["problems"] = list(self.problems)
        return out


class TensorSource(Protocol):
    """Everything an operation may ask of a checkpoint's stored values.

    Each format provides one (usually by subclassing :class:`BaseSource`); operations never
    open a format's files themselves.
    """

    def read(self, variable: Variable) -> np.ndarray:  # pragma: no cover - protocol
        """The whole value (sliced variables assembled)."""

    def iter_blocks(self, variable: Variable, elements: int) -> Iterator[np.ndarray]:  # pragma: no cover
        """The flattened value in blocks of at most ``elements`` elements, checksum-checked
        where the format stores checksums (a mismatch raises after the last block). A block
        may be a view of a buffer the next block reuses: use it before asking for the next."""

    def storage_order(self, variable: Variable) -> tuple:  # pragma: no cover - protocol
        """A sort key placing variables in the order their bytes lie on disk."""

    def files(self) -> tuple[str, ...]:  # pragma: no cover - protocol
        """Every file the checkpoint's values live in (to protect them, or size them)."""

    def close(self) -> None:  # pragma: no cover - protocol
        ...


class BaseSource:
    """Defaults for a :class:`TensorSource`: blocks are slices of the value read whole.

    ``concurrent_reads``: True when :meth:`read` and :meth:`iter_blocks` may be called from
    several threads at once, for different variables (``diff`` then compares two at a time).
    """

    concurrent_reads = False

    def read(self, variable: Variable) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def iter_blocks(self, variable: Variable, elements: int) -> Iterator[np.ndarray]:
        import numpy as np  # noqa: PLC0415 - numpy only where values are read

        from .errors import CorruptCheckpointError  # noqa: PLC0415

        value = np.ascontiguousarray(self.read(variable)).reshape(-1)
        if value.size != variable.size:
            raise CorruptCheckpointError(
                f"{variable.key!r} holds {value.size} values, its shape {list(variable.shape)} needs {variable.size}"
            )
        for i in range(0, value.size, max(1, elements)):
            yield value[i : i + elements]

    def storage_order(self, variable: Variable) -> tuple:
        return ()

    def files(self) -> tuple[str, ...]:
        return ()

    def close(self) -> None:
        pass


def role_totals(items: Iterable[Any], extra: str | None = None) -> dict[str, dict[str, int]]:
    """``count`` and ``nbytes`` per role (every role of :data:`ROLES`, plus ``all``) of things
    with a ``role`` and ``nbytes`` (variables, report rows); with ``extra``, that integer
    attribute summed too (``new_nbytes``)."""
    keys = ("count", "nbytes") + ((extra,) if extra else ())
    out = {r: dict.fromkeys(keys, 0) for r in (*ROLES, "all")}
    for v in items:
        for r in (v.role, "all"):
            row = out[r]
            row["count"] += 1
            row["nbytes"] += v.nbytes
            if extra:
                row[extra] += getattr(v, extra)
    return out


def display_name(text: str) -> str:
    """A key or name as shown to people: bytes that are not UTF-8 as backslash escapes.

    Formats keep such bytes in ``Variable.key``/``name`` as surrogate escapes (``b"w\\xff"``
    is ``"w\\udcff"``), so the str is the exact identity of the key; it cannot be printed as
    is. This shows it as ``w\\xff``; valid UTF-8 is returned unchanged.
    """
    if text.isascii():
        return text
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # surrogates that are not escaped bytes
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


OUTPUT_INDEX_RE = re.compile(r":\d+$")


def strip_output_index(name: str) -> str:
    """A name without its ``:N`` output suffix (``dense/kernel:0`` -> ``dense/kernel``)."""
    return OUTPUT_INDEX_RE.sub("", name)


def format_shape(shape: Sequence[int]) -> str:
    """``(16, 4)`` -> ``[16,4]``: the one spelling of a shape, in tables and in messages."""
    return "[" + ",".join(str(d) for d in shape) + "]"


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A checkpoint of any supported format.

    Iterate it for its :class:`Variable` entries; ``read(name_or_key)`` returns one value as
    a numpy array. Use it as a context manager, or call :meth:`close`, to release files.

    Attributes:
        path: The resolved path (TF prefix, HDF5 or zip file).
        format: A format name (``ckptinspect.formats.FORMATS``, from the format registry).
        variables: The variables, in file order: a tuple, or a :class:`VariableTable` where a
            checkpoint holds very many.
        step: The training step a variable records, or None (:func:`run_positions` and the
            formats' step rule: ``global_step``/``step`` first, else the optimizer's
            iteration count; never a number read from the name).
        step_source: Where the step came from (``variable:global_step``,
            ``optimizer:optimizer/iter``, ``metadata:step``...).
        number: The checkpoint's number when it is not a training step: the number in its
            name (a ``CheckpointManager``'s ``ckpt-7``, ``epoch=2`` in a Lightning name), else
            an epoch or save counter a variable records; None when there is none.
        number_source: What ``number`` is (``name:checkpoint``, ``name:epoch``, ``name:step``,
            ``name``, ``variable:epoch``, ``metadata:epoch``, ``save_counter``).
        num_shards: Number of data files (1 for single-file formats).
        checkpoints: For a directory, every checkpoint it holds; empty otherwise.
        info: Format-specific header facts (Keras version, model class, ...).
    """

    path: str
    format: str
    variables: Sequence[Variable]  # a tuple, or a VariableTable (very many variables)
    step: int | None = None
    step_source: str | None = None
    number: int | None = None
    number_source: str | None = None
    num_shards: int = 1
    checkpoints: tuple[RetainedCheckpoint, ...] = ()
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    source: TensorSource | None = dataclasses.field(default=None, repr=False, compare=False)

    # -- mapping-like access -------------------------------------------------------------
    def __iter__(self) -> Iterator[Variable]:
        return iter(self.variables)

    def __len__(self) -> int:
        return len(self.variables)

    def __contains__(self, name_or_key: object) -> bool:
        return isinstance(name_or_key, str) and self._lookup(name_or_key) is not None

    def __getitem__(self, name_or_key: str) -> Variable:
        var = self._lookup(name_or_key)
        if var is None:
            raise CheckpointNotFoundError(f"{self.path}: no variable named {name_or_key!r}")
        return var

    @functools.cached_property
    def _by_key(self) -> dict[str, Variable]:
        return {v.key: v for v in self.variables}

    @functools.cached_property
    def _by_name(self) -> dict[str, Variable]:
        out: dict[str, Variable] = {}
        for v in self.variables:
            out.setdefault(v.name, v)
        for v in self.variables:
            out.setdefault(strip_output_index(v.name), v)
        return out

    def _lookup(self, name_or_key: str) -> Variable | None:
        return self._by_key.get(name_or_key) or self._by_name.get(name_or_key)

    def keys(self) -> list[str]:
        """The exact keys, in file order."""
        return [v.key for v in self.variables]

    def names(self) -> list[str]:
        """The readable names, in file order."""
        return [v.name for v in self.variables]

    def filter(self, pattern: str | None = None, role: str | None = None) -> list[Variable]:
        """Variables whose name or key matches ``pattern`` (regex search) and ``role``."""
        rx = re.compile(pattern) if pattern else None
        return [
            v
            for v in self.variables
            if (role is None or v.role == role)
            and (rx is None or rx.search(v.name) or rx.search(v.key))
        ]

    def totals(self) -> dict[str, dict[str, int]]:
        """Count and bytes per role, plus ``all``."""
        if isinstance(self.variables, VariableTable):
            return self.variables.role_totals()
        return role_totals(self.variables)

    # -- values --------------------------------------------------------------------------
    def read(self, name_or_key: str | Variable) -> np.ndarray:
        """Read one variable's value.

        Args:
            name_or_key: A key, a readable name, or a :class:`Variable` of this checkpoint.

        Returns:
            The full value as a numpy array (sliced variables are assembled).

        Raises:
            CheckpointNotFoundError: No such variable.
            CorruptCheckpointError: The bytes cannot be read.
        """
        var = name_or_key if isinstance(name_or_key, Variable) else self[name_or_key]
        if self.source is None:
            raise CheckpointNotFoundError(f"{self.path}: no tensor source to read values from")
        return self.source.read(var)

    def iter_blocks(self, name_or_key: str | Variable, elements: int) -> Iterator[np.ndarray]:
        """One variable's flattened value in blocks of at most ``elements`` elements (streamed
        from the file where the format allows, checksum-checked where it stores checksums)."""
        var = name_or_key if isinstance(name_or_key, Variable) else self[name_or_key]
        if self.source is None:
            raise CheckpointNotFoundError(f"{self.path}: no tensor source to read values from")
        return self.source.iter_blocks(var, elements)

    def storage_order(self, variable: Variable) -> tuple:
        """A sort key placing variables in the order their bytes lie on disk."""
        return self.source.storage_order(variable) if self.source is not None else ()

    def files(self) -> tuple[str, ...]:
        """Every file holding this checkpoint's values (the index or HDF5 file included)."""
        return self.source.files() if self.source is not None else ()

    def close(self) -> None:
        """Release open files."""
        if self.source is not None:
            self.source.close()

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def to_dict(self, variables: bool = True) -> dict[str, Any]:
        """The JSON form of ``ls --format json`` (without stats); ``variables=False``: with an
        empty ``variables`` list, for a caller writing them one at a time."""
        out: dict[str, Any] = {
            "path": self.path,
            "format": self.format,
            "step": self.step,
            "step_source": self.step_source,
            "number": self.number,
            "number_source": self.number_source,
            "num_shards": self.num_shards,
        }
        if self.checkpoints:
            out["checkpoints"] = [c.to_dict() for c in self.checkpoints]
        if self.info:
            out["info"] = dict(self.info)
        out["totals"] = self.totals()
        out["variables"] = [v.to_dict() for v in self.variables] if variables else []
        return out
