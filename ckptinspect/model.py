"""The format-neutral model of a checkpoint: frozen dataclasses, no I/O.

A :class:`Checkpoint` is what :func:`ckptinspect.open` returns for any supported format. It
holds :class:`Variable` entries (metadata only: key, readable name, shape, dtype, size,
shards, role) and a tensor source that reads one value at a time when asked.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Protocol

from .errors import CheckpointNotFoundError

if TYPE_CHECKING:  # numpy is imported only where values are read
    import numpy as np

__all__ = [
    "ROLES",
    "ROLE_MODEL",
    "ROLE_OPTIMIZER",
    "ROLE_METADATA",
    "FORMATS",
    "SliceInfo",
    "Variable",
    "RetainedCheckpoint",
    "Checkpoint",
    "TensorSource",
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
FORMATS = (
    FORMAT_TF_BUNDLE,
    FORMAT_TF_SAVEDMODEL,
    FORMAT_TF_V1,
    FORMAT_KERAS_H5,
    FORMAT_KERAS_WEIGHTS_H5,
    FORMAT_KERAS_ZIP,
)


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


@dataclasses.dataclass(frozen=True)
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
        offset: Byte offset in its shard (TF bundle, unsliced only), or None.
        crc32c: Stored masked crc32c (TF bundle, unsliced only), or None.
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
    offset: int | None = None
    crc32c: int | None = None

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


@dataclasses.dataclass(frozen=True)
class RetainedCheckpoint:
    """One checkpoint of a checkpoint directory.

    Attributes:
        path: The checkpoint prefix.
        step: Step number from the prefix name, or None.
        timestamp: Save time from the state file, or None.
        exists: Whether its index (and data) files are on disk.
        in_state_file: Whether the ``checkpoint`` state file lists it.
        latest: Whether this is the checkpoint the directory resolves to.
    """

    path: str
    step: int | None
    timestamp: float | None
    exists: bool
    in_state_file: bool = True
    latest: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class TensorSource(Protocol):
    """Reads variable values, one tensor at a time."""

    def read(self, variable: Variable) -> np.ndarray:  # pragma: no cover - protocol
        ...

    def close(self) -> None:  # pragma: no cover - protocol
        ...


def _canonical(name: str) -> str:
    return re.sub(r":\d+$", "", name)


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A checkpoint of any supported format.

    Iterate it for its :class:`Variable` entries; ``read(name_or_key)`` returns one value as
    a numpy array. Use it as a context manager, or call :meth:`close`, to release files.

    Attributes:
        path: The resolved path (TF prefix, HDF5 or zip file).
        format: One of :data:`FORMATS`.
        variables: The variables, in file order.
        step: The step number, or None.
        step_source: Where the step came from (``filename``, ``variable:global_step``...).
        num_shards: Number of data files (1 for single-file formats).
        checkpoints: For a directory, every checkpoint it holds; empty otherwise.
        info: Format-specific header facts (Keras version, model class, ...).
    """

    path: str
    format: str
    variables: tuple[Variable, ...]
    step: int | None = None
    step_source: str | None = None
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
            out.setdefault(_canonical(v.name), v)
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
        out = {r: {"count": 0, "nbytes": 0} for r in (*ROLES, "all")}
        for v in self.variables:
            for r in (v.role, "all"):
                out[r]["count"] += 1
                out[r]["nbytes"] += v.nbytes
        return out

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

    def close(self) -> None:
        """Release open files."""
        if self.source is not None:
            self.source.close()

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of ``ls --format json`` (without stats)."""
        out: dict[str, Any] = {
            "path": self.path,
            "format": self.format,
            "step": self.step,
            "step_source": self.step_source,
            "num_shards": self.num_shards,
        }
        if self.checkpoints:
            out["checkpoints"] = [c.to_dict() for c in self.checkpoints]
        if self.info:
            out["info"] = dict(self.info)
        out["totals"] = self.totals()
        out["variables"] = [v.to_dict() for v in self.variables]
        return out
