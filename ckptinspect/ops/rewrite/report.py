"""What ``rewrite`` did: one row per source variable, totals per role, sizes."""

from __future__ import annotations

import dataclasses
from typing import Any

from ... import model as m

__all__ = ["RewrittenVariable", "RewriteReport", "ACTIONS"]

ACTION_RENAMED = "renamed"
ACTION_DROPPED = "dropped"
ACTION_CAST = "cast"
ACTIONS = (ACTION_RENAMED, ACTION_DROPPED, ACTION_CAST)


@dataclasses.dataclass(frozen=True)
class RewrittenVariable:
    """One variable of the source and what became of it.

    Attributes:
        name: Its readable name in the source.
        key: Its key in the source.
        role: ``model``, ``optimizer`` or ``metadata``.
        shape: Its shape.
        dtype: Its dtype in the source.
        nbytes: Bytes it takes in the source.
        new_name: Its readable name in the output (None when dropped).
        new_key: Its key in the output (None when dropped).
        new_dtype: Its dtype in the output (None when dropped).
        new_nbytes: Bytes it takes in the output (0 when dropped).
        copied: Its stored bytes were copied unchanged (with their checksum).
    """

    name: str
    key: str
    role: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    new_name: str | None
    new_key: str | None
    new_dtype: str | None
    new_nbytes: int
    copied: bool = False

    @property
    def dropped(self) -> bool:
        return self.new_key is None

    @property
    def renamed(self) -> bool:
        return not self.dropped and self.new_name != self.name

    @property
    def cast(self) -> bool:
        return not self.dropped and self.new_dtype != self.dtype

    @property
    def actions(self) -> tuple[str, ...]:
        """What happened to it (``renamed``, ``dropped``, ``cast``), in that order."""
        return tuple(a for a, hit in zip(ACTIONS, (self.renamed, self.dropped, self.cast)) if hit)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "role": self.role,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "nbytes": self.nbytes,
            "new_name": self.new_name,
            "new_key": self.new_key,
            "new_dtype": self.new_dtype,
            "new_nbytes": self.new_nbytes,
            "actions": list(self.actions),
            "copied": self.copied,
        }


@dataclasses.dataclass(frozen=True)
class RewriteReport:
    """The result of :func:`ckptinspect.rewrite`.

    Attributes:
        source: The source checkpoint (resolved).
        source_format: Its format.
        output: The output written.
        output_format: ``tf-bundle``, ``keras-weights-h5`` or ``keras-h5``.
        files: The files written.
        variables: One row per source variable, in source order.
        rules: The ``--rename`` rules, as given.
        drop: The ``--drop`` regexes.
        roles: The ``--role`` roles kept (empty: all).
        cast: The ``--cast`` dtype, or None.
        cast_filter: The ``--cast-filter`` regex, or None.
        source_file_bytes: Size of the source's files.
        output_file_bytes: Size of the files written.
        copied_bytes: Bytes copied unchanged from the source's data files.
        verified: Tensors read back and compared before the output was put in place.
        seconds: Wall time.
        object_graph: Facts about the object graph written (TF2), or None.
        notes: How to restore the output, and anything worth knowing.
    """

    source: str
    source_format: str
    output: str
    output_format: str
    files: tuple[str, ...]
    variables: tuple[RewrittenVariable, ...]
    rules: tuple[str, ...]
    drop: tuple[str, ...]
    roles: tuple[str, ...]
    cast: str | None
    cast_filter: str | None
    source_file_bytes: int
    output_file_bytes: int
    copied_bytes: int
    verified: int
    seconds: float
    object_graph: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()

    def totals(self) -> dict[str, dict[str, dict[str, int]]]:
        """Per action (and ``kept``), per role and ``all``: ``count`` and ``nbytes`` (source
        bytes; for ``cast`` also ``new_nbytes``), as every report's totals."""
        out: dict[str, dict[str, dict[str, int]]] = {
            "kept": m.role_totals(v for v in self.variables if not v.dropped)}
        for action in ACTIONS:
            out[action] = m.role_totals((v for v in self.variables if action in v.actions),
                                        extra="new_nbytes" if action == ACTION_CAST else None)
        return out

    @property
    def saved_bytes(self) -> int:
        """Bytes saved on disk (negative when the output is bigger)."""
        return self.source_file_bytes - self.output_file_bytes

    def summary(self) -> str:
        t = self.totals()
        parts = [f"{a} {t[a]['all']['count']}" for a in ACTIONS if t[a]["all"]["count"]]
        kept = t["kept"]["all"]["count"]
        return f"{kept} tensors written" + (f" ({', '.join(parts)})" if parts else " (unchanged)")

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "source_format": self.source_format,
            "output": self.output,
            "output_format": self.output_format,
            "files": list(self.files),
            "rename": list(self.rules),
            "drop": list(self.drop),
            "roles": list(self.roles),
            "cast": self.cast,
            "cast_filter": self.cast_filter,
            "totals": self.totals(),
            "source_file_bytes": self.source_file_bytes,
            "output_file_bytes": self.output_file_bytes,
            "saved_bytes": self.saved_bytes,
            "copied_bytes": self.copied_bytes,
            "verified": self.verified,
            "seconds": round(self.seconds, 3),
            "object_graph": self.object_graph,
            "notes": list(self.notes),
            "variables": [v.to_dict() for v in self.variables],
        }
