"""Hugging Face weight folders: sharded checkpoints by their index, and the folder itself.

``save_pretrained`` writes ``model.safetensors`` (or ``pytorch_model.bin``), or, above its
shard size, ``model-00001-of-00003.safetensors``... with ``model.safetensors.index.json``
(``pytorch_model-0000N-of-0000M.bin`` with ``pytorch_model.bin.index.json``)::

    {"metadata": {"total_size": 123}, "weight_map": {"lm_head.weight": "model-00003-of-00003.safetensors", ...}}

A sharded checkpoint opens as one :class:`~ckptinspect.model.Checkpoint`: every tensor of every
shard the index names, ``Variable.shards`` giving the shard's position in
``info["shard_files"]``. Each name the index maps must be in that shard, and no name may be in
two shards. Shard names must be plain file names in the index's folder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from ... import model as m
from ...errors import CheckpointNotFoundError, CorruptCheckpointError, NotACheckpointError, UnsafeFileError
from .. import _fs
from .._readcheck import Opened, ReadCheck
from .._torch_layout import is_safetensors_head
from ..safetensors.file import (
    FORMAT_SAFETENSORS,
    SafetensorsSource,
    load_json,
    metadata_step,
    read_header,
    variables_of,
)

if TYPE_CHECKING:  # numpy comes with reading values (and with torch shards)
    import numpy as np

__all__ = ["open_hf_sharded", "check_hf_sharded"]

WEIGHT_MAP = "weight_map"
MAX_INDEX_BYTES = 64 << 20


def _shard_names(path: str, weight_map: Any) -> list[str]:
    if not isinstance(weight_map, dict) or not weight_map:
        raise CorruptCheckpointError(f"{path}: no '{WEIGHT_MAP}' object in the sharded weights index")
    names: dict[str, None] = {}
    for key, name in weight_map.items():
        if not isinstance(name, str):
            raise CorruptCheckpointError(f"{path}: '{WEIGHT_MAP}' entry {key!r} is not a file name")
        if not name or name in (".", "..") or any(c in name for c in "/\\:\x00"):
            raise UnsafeFileError(
                f"{path}: shard file name {name!r} is not a plain file name in the index's folder; refusing path traversal"
            )
        names.setdefault(name, None)
    return sorted(names)


class _ShardedSource(m.BaseSource):
    """Reads each tensor from the checkpoint of the shard holding it."""

    def __init__(self, index: str, shards: list[m.Checkpoint], where: dict[str, tuple[int, m.Variable]]):
        self._index = index
        self._shards = shards
        self._where = where

    def files(self) -> tuple[str, ...]:
        return (self._index, *(f for s in self._shards for f in s.files()))

    def _lookup(self, variable: m.Variable) -> tuple[m.Checkpoint, m.Variable]:
        if variable.key not in self._where:
            raise CheckpointNotFoundError(f"{self._index}: no tensor {variable.key!r}")
        i, local = self._where[variable.key]
        return self._shards[i], local

    def read(self, variable: m.Variable) -> np.ndarray:
        shard, local = self._lookup(variable)
        return shard.read(local)

    def iter_blocks(self, variable: m.Variable, elements: int) -> Iterator[np.ndarray]:
        shard, local = self._lookup(variable)
        return shard.iter_blocks(local, elements)

    def storage_order(self, variable: m.Variable) -> tuple:
        i, local = self._where.get(variable.key, (0, variable))
        return (i, *self._shards[i].storage_order(local))

    def close(self) -> None:
        for s in self._shards:
            s.close()


def _read_index(path: str) -> tuple[dict[str, Any], list[str]]:
    size = _fs.getsize(path)
    if size > MAX_INDEX_BYTES:
        raise UnsafeFileError(f"{path}: sharded weights index is {size} bytes (limit {MAX_INDEX_BYTES}); refusing")
    raw = _fs.read_bytes(path, limit=MAX_INDEX_BYTES, what="sharded weights index")
    index = load_json(raw, f"{path}: sharded weights index")
    if not isinstance(index, dict):
        raise CorruptCheckpointError(f"{path}: not a sharded weights index (expected a JSON object)")
    return index, _shard_names(path, index.get(WEIGHT_MAP))


def _opened(path: str, strict: bool) -> tuple[m.Checkpoint, list[m.Damage]]:
    index, shard_files = _read_index(path)
    weight_map: dict[str, str] = index[WEIGHT_MAP]
    directory = _fs.dirname(path)
    shard_paths = [_fs.join(directory, n) if directory else n for n in shard_files]
    for i, p in enumerate(shard_paths):
        if not _fs.isfile(p):
            raise CheckpointNotFoundError(f"{p}: shard {i + 1} of {len(shard_paths)} named by {path} is missing")
    first = _fs.read_head(shard_paths[0], 10)
    damaged: list[m.Damage] = []
    variables: list[m.Variable] = []
    seen: dict[str, int] = {}
    info: dict[str, Any] = {"shard_files": shard_files}
    metadata = index.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("total_size"), (int, float)):
        info["total_size"] = int(metadata["total_size"])

    def add(i: int, shard_vars: list[m.Variable]) -> None:
        for v in shard_vars:
            if v.key in seen:
                raise CorruptCheckpointError(
                    f"{path}: tensor {v.key!r} is in shard {shard_files[seen[v.key]]} and in {shard_files[i]}"
                )
            seen[v.key] = i

    if is_safetensors_head(first):
        entries = {}
        problems: dict[str, str] = {}
        step = step_source = None
        for i, p in enumerate(shard_paths):
            header = read_header(p, strict=strict)
            shard_vars = variables_of(header, shard=i)
            add(i, shard_vars)
            variables += shard_vars
            entries.update({t.name: (i, t) for t in header.tensors})
            problems.update(header.problems)
            if i == 0:
                step, step_source = metadata_step(header.metadata)
                if header.metadata is not None:
                    info["metadata"] = header.metadata
        damaged = [m.Damage(key=k, name=k, file=shard_paths[entries[k][0]],
                            kind=m.DAMAGE_TRUNCATED, problem=problem) for k, problem in problems.items()]
        source: m.BaseSource = SafetensorsSource(shard_paths, entries, extra_files=[path], problems=problems)
        fmt = FORMAT_SAFETENSORS
    else:
        shards = []
        where: dict[str, tuple[int, m.Variable]] = {}
        step = step_source = None
        fmt = None
        try:
            from ..torch.reader import open_torch  # noqa: PLC0415 - brings numpy

            for i, p in enumerate(shard_paths):
                shard = open_torch(p)
                shards.append(shard)
                fmt = fmt or shard.format
                add(i, list(shard.variables))
                for v in shard.variables:
                    where[v.key] = (i, v)
                    variables.append(m.Variable(key=v.key, name=v.name, shape=v.shape, dtype=v.dtype,
                                                nbytes=v.nbytes, shards=(i,), role=v.role))
                if shard.info.get("tied"):
                    info.setdefault("tied", []).extend(shard.info["tied"])
        except BaseException:
            for s in shards:
                s.close()
            raise
        source = _ShardedSource(path, shards, where)
    for key, name in weight_map.items():
        if key not in seen:
            problem = f"{path}: the index maps {key!r} to {name}, which does not hold it"
            if strict:
                source.close()
                raise CorruptCheckpointError(problem)
            damaged.append(m.Damage(key=key, name=key, file=name, kind=m.DAMAGE_MISSING_SLICE,
                                    problem=problem.removeprefix(path + ": ")))
        elif shard_files[seen[key]] != name:
            problem = f"{path}: the index maps {key!r} to {name}, but it is in {shard_files[seen[key]]}"
            if strict:
                source.close()
                raise CorruptCheckpointError(problem)
            damaged.append(m.Damage(key=key, name=key, file=name, kind=m.DAMAGE_LAYOUT,
                                    problem=problem.removeprefix(path + ": ")))
    ckpt = m.Checkpoint(path=path, format=fmt or FORMAT_SAFETENSORS, variables=tuple(variables), step=step,
                        step_source=step_source, num_shards=len(shard_files), info=info, source=source)
    return ckpt, damaged


def open_hf_sharded(path: str) -> m.Checkpoint:
    """Open a sharded Hugging Face checkpoint by its ``*.index.json``.

    Raises:
        CheckpointNotFoundError: The index or a shard is missing.
        CorruptCheckpointError: A damaged index or shard, or one that disagrees with the index.
        UnsafeFileError: A shard name leaving the folder, or an unsafe shard.
        NotACheckpointError: A shard that is not safetensors or torch.
    """
    path = str(path)
    if _fs.is_remote(path):
        raise NotACheckpointError(f"{path}: sharded weights are read from local paths only")
    return _opened(path, strict=True)[0]


def check_hf_sharded(path: str) -> ReadCheck:
    """Plan ``verify`` of a sharded checkpoint (a missing shard is damage, not an error)."""

    def opener(p: str) -> Opened:
        try:
            ckpt, damaged = _opened(p, strict=False)
        except CheckpointNotFoundError as e:
            raise CorruptCheckpointError(str(e)) from None
        return Opened(ckpt, damaged)

    return ReadCheck(str(path), opener)
