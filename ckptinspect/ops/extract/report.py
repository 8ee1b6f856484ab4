"""What ``extract`` reports: each variable kept or dropped, totals per role, the size saving."""

from __future__ import annotations

import dataclasses
from typing import Any


from ... import model as m

__all__ = ["ExtractedVariable", "ExtractReport"]


# -- report --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ExtractedVariable:
    """One source variable and what became of it.

    Attributes:
        name: Readable name (from the source).
        key: Key or dataset path in the source.
        output_key: Key, dataset path or npz member in the output; None when dropped.
        role: The source role (model, optimizer, metadata).
        shape: Its shape.
        dtype: Its dtype name.
        nbytes: Its size in bytes.
    """

    name: str
    key: str
    output_key: str | None
    role: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int

    @property
    def kept(self) -> bool:
        return self.output_key is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "output_key": self.output_key,
            "role": self.role,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "nbytes": self.nbytes,
            "kept": self.kept,
        }


@dataclasses.dataclass(frozen=True)
class ExtractReport:
    """What :func:`extract` wrote.

    Attributes:
        source: The resolved source path (TF prefix or file).
        source_format: The source's format (``tf-bundle``, ``keras-h5``...).
        output: The output path (TF prefix or file).
        output_format: ``tf``, ``weights-h5``, ``h5`` or ``npz``.
        files: The files written.
        variables: Every source variable, kept or dropped.
        source_file_bytes: Bytes of the source's files (index and data files for TF).
        output_file_bytes: Bytes of the files written.
        verified: Tensors read back from the output and found bit-identical.
        num_shards: Data shards written (TF output), else 1.
        seconds: Wall time.
        object_graph: For a TF2 output: source and output node counts and the kept root
            children; None otherwise.
        notes: Facts worth knowing (what the output restores into, what was left out).
        copied: TF output: kept tensors copied byte for byte from the source's data files
            (their crc32c reused) rather than decoded and re-encoded.
        copied_bytes: The bytes copied so.
        left_at_init: ``.weights.h5`` through ``--builder --no-strict``: the model weights (Keras
            paths) that received no source value and hold the builder model's initial values.
    """

    source: str
    source_format: str
    output: str
    output_format: str
    files: tuple[str, ...]
    variables: tuple[ExtractedVariable, ...]
    source_file_bytes: int
    output_file_bytes: int
    verified: int
    num_shards: int = 1
    seconds: float = 0.0
    object_graph: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()
    copied: int = 0
    copied_bytes: int = 0
    left_at_init: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        """Every model weight of the output holds a source value (False only when ``--no-strict``
        left one at init; the CLI then exits 1 after writing)."""
        return not self.left_at_init

    @property
    def kept(self) -> dict[str, dict[str, int]]:
        """Count and bytes kept, per role and ``all``."""
        return m.role_totals(v for v in self.variables if v.kept)

    @property
    def dropped(self) -> dict[str, dict[str, int]]:
        """Count and bytes dropped, per role and ``all``."""
        return m.role_totals(v for v in self.variables if not v.kept)

    @property
    def saving(self) -> float:
        """Fraction of the source's file bytes the output saves (0.66 = two thirds smaller)."""
        if not self.source_file_bytes:
            return 0.0
        return 1.0 - self.output_file_bytes / self.source_file_bytes

    def to_dict(self) -> dict[str, Any]:
        """The ``extract --json`` document."""
        return {
            "source": self.source,
            "source_format": self.source_format,
            "output": self.output,
            "output_format": self.output_format,
            "files": list(self.files),
            "num_shards": self.num_shards,
            "kept": self.kept,
            "dropped": self.dropped,
            "source_file_bytes": self.source_file_bytes,
            "output_file_bytes": self.output_file_bytes,
            "saving": round(self.saving, 6),
            "verified": self.verified,
            "copied": self.copied,
            "copied_bytes": self.copied_bytes,
            "complete": self.complete,
            "left_at_init": list(self.left_at_init),
            "seconds": round(self.seconds, 3),
            "object_graph": self.object_graph,
            "notes": list(self.notes),
            "variables": [v.to_dict() for v in self.variables],
        }

