"""What ``average`` reports: the inputs and their steps, each variable averaged, copied from the
newest or dropped, counts and bytes per role."""

from __future__ import annotations

import dataclasses
from typing import Any

from ... import model as m

__all__ = ["ACTIONS", "AverageInput", "AveragedVariable", "AverageReport"]

ACTION_AVERAGED = "averaged"
ACTION_COPIED = "copied"
ACTION_DROPPED = "dropped"
ACTIONS = (ACTION_AVERAGED, ACTION_COPIED, ACTION_DROPPED)
METHOD_MEAN = "mean"
METHOD_EMA = "ema"


@dataclasses.dataclass(frozen=True)
class AverageInput:
    """One input checkpoint.

    Attributes:
        path: Its resolved prefix.
        step: Its training step (the step rule), or None.
        newest: The input whose integers, strings, metadata and object graph the output keeps.
        number: Its number (in its name; an epoch), or None.
        number_source: What ``number`` is (``name:checkpoint``, ``name:epoch``...).
    """

    path: str
    step: int | None
    newest: bool = False
    number: int | None = None
    number_source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class AveragedVariable:
    """One variable of the newest input and what became of it.

    Attributes:
        name: Readable name.
        key: Key in the inputs.
        output_key: Key in the output; None when dropped (``role="model"``).
        role: model, optimizer or metadata.
        shape: Its shape.
        dtype: Its dtype name.
        nbytes: Its size in bytes.
        action: ``averaged`` (float, not metadata), ``copied`` (from the newest, byte for
            byte) or ``dropped``.
    """

    name: str
    key: str
    output_key: str | None
    role: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    action: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "output_key": self.output_key,
            "role": self.role,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "nbytes": self.nbytes,
            "action": self.action,
        }


@dataclasses.dataclass(frozen=True)
class AverageReport:
    """What :func:`ckptinspect.average` wrote.

    Attributes:
        output: The output prefix.
        files: The files written.
        method: ``mean`` or ``ema``.
        decay: The EMA decay (None for the mean).
        role: ``model`` when only the model's variables were written, else None.
        inputs: The inputs, oldest first (the order of the average).
        variables: Every variable of the newest input, in its file order.
        input_file_bytes: Bytes of the inputs' files.
        output_file_bytes: Bytes of the files written.
        num_shards: Data shards written.
        verified: Tensors read back from the output and found as computed (averaged) or as
            copied.
        seconds: Wall time.
        object_graph: For a TF2 (object-based) output: ``{"nodes", "source_nodes", "pruned"}``.
        notes: Facts worth knowing (what the output restores into).
    """

    output: str
    files: tuple[str, ...]
    method: str
    decay: float | None
    role: str | None
    inputs: tuple[AverageInput, ...]
    variables: tuple[AveragedVariable, ...]
    input_file_bytes: int
    output_file_bytes: int
    num_shards: int
    verified: int
    seconds: float = 0.0
    object_graph: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()

    @property
    def newest(self) -> AverageInput:
        """The input the output's non-averaged values and object graph come from."""
        return next(i for i in self.inputs if i.newest)

    @property
    def averaged(self) -> dict[str, dict[str, int]]:
        """Count and bytes averaged, per role and ``all``."""
        return m.role_totals(v for v in self.variables if v.action == ACTION_AVERAGED)

    @property
    def copied(self) -> dict[str, dict[str, int]]:
        """Count and bytes copied unchanged from the newest input, per role and ``all``."""
        return m.role_totals(v for v in self.variables if v.action == ACTION_COPIED)

    @property
    def dropped(self) -> dict[str, dict[str, int]]:
        """Count and bytes left out (``role="model"``), per role and ``all``."""
        return m.role_totals(v for v in self.variables if v.action == ACTION_DROPPED)

    def to_dict(self) -> dict[str, Any]:
        """The ``average --format json`` document (docs/INTERFACE.md)."""
        return {
            "output": self.output,
            "files": list(self.files),
            "method": self.method,
            "decay": self.decay,
            "role": self.role,
            "inputs": [i.to_dict() for i in self.inputs],
            "newest": self.newest.path,
            "averaged": self.averaged,
            "copied": self.copied,
            "dropped": self.dropped,
            "input_file_bytes": self.input_file_bytes,
            "output_file_bytes": self.output_file_bytes,
            "num_shards": self.num_shards,
            "verified": self.verified,
            "seconds": round(self.seconds, 3),
            "object_graph": self.object_graph,
            "notes": list(self.notes),
            "variables": [v.to_dict() for v in self.variables],
        }
