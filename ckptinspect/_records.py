"""The records of the model (:mod:`ckptinspect.model`) that only some commands make, imported on
first use through ``model``'s names (``model.Damage``...): a stored slice of a sliced variable,
a checkpoint of a directory, and ``verify``'s verdicts. Creating a dataclass costs about a
millisecond of every start; ``ls`` of one file makes none of these."""

from __future__ import annotations

import dataclasses
from typing import Any

from .model import STATUS_INTACT

__all__ = ["SliceInfo", "RetainedCheckpoint", "Damage", "CheckResult"]


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
