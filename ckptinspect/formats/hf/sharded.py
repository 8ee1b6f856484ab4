"""Hugging Face weight folders: sharded checkpoints by their index, and the folder itself.

``save_pretrained`` writes ``model.safetensors`` (or ``pytorch_model.bin``), or, above its
shard size, ``model-00001-of-00003.safetensors``... with ``model.safetensors.index.json``
(``pytorch_model-0000N-of-0000M.bin`` with ``pytorch_model.bin.index.json``)::

    {"metadata": {"total_size": 123}, "weight_map": {"lm_head.weight": "model-00003-of-00003.safetensors", ...}}

A sharded checkpoint opens as one :class:`~ckptinspect.model.Checkpoint`: every tensor of every
shard the index names, ``Variable.shards`` giving the shard's position in
``info["shard_files"]``. Each name the index maps must be in that shard, and no name may be in
two shards. Shard names must be plain file names in the index's folder.

Shards that are not there (an index copied without them) do not stop listing: the names the
index maps to them are variables of unknown shape (``()``) and dtype :data:`UNKNOWN_DTYPE`, a
warning per missing shard says so (``info["warnings"]``, ``info["missing_shards"]``,
``info["unreadable"]``: name -> why), and
reading one of their values is an error naming the shard. ``verify`` names every missing shard
(a problem line each, and ``missing-shard`` damage per name).
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
UNKNOWN_DTYPE = "unknown"  # a name the index maps to a shard that is not there


def _shard_names(path: str, weight_map: Any) -> list[str]:
    if not isinstance(weight_map, dict) or not weight_map:
        raise CorruptCheckpointError(f"{path}: no '{WEIGHT_MAP}' object in the sharded weights index")
    names: dict[str, None] = {}
    for key, name in weight_map.items():
        if not isinstance(name, str):
            raise CorruptCheckpointError(f"{path}: '{WEIGHT_MAP}' entry {key!r} is not a file name")
        _fs.check_shard_name(path, name)
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


class _MissingShards(m.BaseSource):
    """A sharded checkpoint's values when some shards are not there: the names mapped to them
    refuse to be read (naming the shard), the others come from the shards that are."""

    def __init__(self, inner: m.BaseSource | None, missing: dict[str, str], extra_files: tuple[str, ...]):
        self._inner = inner
        self._missing = missing  # key -> why
        self._extra = extra_files

    def _check(self, variable: m.Variable) -> m.BaseSource:
        why = self._missing.get(variable.key)
        if why is not None or self._inner is None:
            raise CheckpointNotFoundError(why or f"no tensor {variable.key!r}")
        return self._inner

    def read(self, variable: m.Variable) -> np.ndarray:
        return self._check(variable).read(variable)

    def iter_blocks(self, variable: m.Variable, elements: int) -> Iterator[np.ndarray]:
        return self._check(variable).iter_blocks(variable, elements)

    def storage_order(self, variable: m.Variable) -> tuple:
        if variable.key in self._missing or self._inner is None:
            return (len(self._extra), variable.key)
        return self._inner.storage_order(variable)

    def files(self) -> tuple[str, ...]:
        inner = self._inner.files() if self._inner is not None else ()
        return (*self._extra, *(f for f in inner if f not in self._extra))

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()


def _read_index(path: str) -> tuple[dict[str, Any], list[str]]:
    size = _fs.getsize(path)
    if size > MAX_INDEX_BYTES:
        raise UnsafeFileError(f"{path}: sharded weights index is {size} bytes (limit {MAX_INDEX_BYTES}); refusing")
    raw = _fs.read_bytes(path, limit=MAX_INDEX_BYTES, what="sharded weights index")
    index = load_json(raw, f"{path}: sharded weights index")
    if not isinstance(index, dict):
        raise CorruptCheckpointError(f"{path}: not a sharded weights index (expected a JSON object)")
    return index, _shard_names(path, index.get(WEIGHT_MAP))


class _Read:
    """What the present shards gave: variables (each key's shard in ``seen``), damage, the
    source reading them, the format, the step, and facts for ``info``."""

    def __init__(self, path: str, shard_files: list[str], info: dict[str, Any]):
        self.path = path
        self.shard_files = shard_files
        self.info = info
        self.variables: list[m.Variable] = []
        self.damaged: list[m.Damage] = []
        self.seen: dict[str, int] = {}
        self.source: m.BaseSource | None = None
        self.fmt: str | None = None
        self.step: int | None = None
        self.step_source: str | None = None

    def add(self, i: int, shard_vars: list[m.Variable]) -> None:
        """Shard ``i``'s keys, each in one shard only."""
        for v in shard_vars:
            if v.key in self.seen:
                raise CorruptCheckpointError(
                    f"{self.path}: tensor {v.key!r} is in shard {self.shard_files[self.seen[v.key]]} and in {self.shard_files[i]}"
                )
            self.seen[v.key] = i


def _read_safetensors_shards(read: _Read, shard_paths: list[str], number: list[int], strict: bool) -> None:
    entries = {}
    problems: dict[str, str] = {}
    for j, p in enumerate(shard_paths):
        i = number[j]
        header = read_header(p, strict=strict)
        shard_vars = variables_of(header, shard=i)
        read.add(i, shard_vars)
        read.variables += shard_vars
        entries.update({t.name: (j, t) for t in header.tensors})
        problems.update(header.problems)
        if j == 0:
            read.step, read.step_source = metadata_step(header.metadata)
            if header.metadata is not None:
                read.info["metadata"] = header.metadata
    read.damaged = [m.Damage(key=k, name=k, file=shard_paths[entries[k][0]],
                             kind=m.DAMAGE_TRUNCATED, problem=problem) for k, problem in problems.items()]
    read.source = SafetensorsSource(shard_paths, entries, extra_files=[read.path], problems=problems)
    read.fmt = FORMAT_SAFETENSORS


def _read_torch_shards(read: _Read, shard_paths: list[str], number: list[int], any_absent: bool) -> None:
    shards = []
    where: dict[str, tuple[int, m.Variable]] = {}
    try:
        from ..torch.reader import open_torch  # noqa: PLC0415 - brings numpy

        for j, p in enumerate(shard_paths):
            i = number[j]
            shard = open_torch(p)
            shards.append(shard)
            read.fmt = read.fmt or shard.format
            read.add(i, list(shard.variables))
            for v in shard.variables:
                where[v.key] = (j, v)
                read.variables.append(m.Variable(key=v.key, name=v.name, shape=v.shape, dtype=v.dtype,
                                                 nbytes=v.nbytes, shards=(i,), role=v.role))
            if shard.info.get("tied"):
                read.info.setdefault("tied", []).extend(shard.info["tied"])
    except BaseException:
        for s in shards:
            s.close()
        raise
    read.source = _ShardedSource(read.path, shards, where)
    read.fmt = read.fmt or (m.FORMAT_TORCH_ZIP if any_absent else None)  # no shard to tell: torch.save's default


def _list_missing(read: _Read, weight_map: dict[str, str], all_paths: list[str], absent: dict[int, str]) -> None:
    """The names of the absent shards' tensors, as the index gives them (shape and dtype
    unknown), each damage; commands that need their values refuse at once (``info["unreadable"]``)."""
    path, shard_files = read.path, read.shard_files
    missing: dict[str, str] = {}
    position = {n: i for i, n in enumerate(shard_files)}
    for key, name in weight_map.items():
        i = position[name]
        if i in absent and key not in read.seen:
            read.seen[key] = i
            missing[key] = f"{all_paths[i]}: cannot read {key!r}: shard {i + 1} of {len(all_paths)} named by {path} is missing"
            read.variables.append(m.Variable(key=key, name=key, shape=(), dtype=UNKNOWN_DTYPE, nbytes=0, shards=(i,)))
            read.damaged.append(m.Damage(key=key, name=key, file=all_paths[i], kind=m.DAMAGE_MISSING_SHARD,
                                         problem=f"its shard {name} is missing", shard=i))
    read.info["missing_shards"] = [shard_files[i] for i in sorted(absent)]
    # as a TF bundle's entries TensorFlow cannot read: commands that need the values refuse at once
    read.info["unreadable"] = {key: f"its shard {weight_map[key]} is missing" for key in missing}
    read.info["warnings"] = [f"{absent[i]}; its {sum(n == shard_files[i] for n in weight_map.values())} tensor(s) are"
                             " listed by the names the index gives (shape and dtype unknown)" for i in sorted(absent)]
    read.source = _MissingShards(read.source, missing, (path, *all_paths))


def _check_index(read: _Read, weight_map: dict[str, str], strict: bool) -> None:
    """Every key the index maps is in the shard it names: damage (or, strict, an error) otherwise."""
    path, shard_files = read.path, read.shard_files
    for key, name in weight_map.items():
        if key not in read.seen:
            problem = f"{path}: the index maps {key!r} to {name}, which does not hold it"
            kind = m.DAMAGE_MISSING_SLICE
        elif shard_files[read.seen[key]] != name:
            problem = f"{path}: the index maps {key!r} to {name}, but it is in {shard_files[read.seen[key]]}"
            kind = m.DAMAGE_LAYOUT
        else:
            continue
        if strict:
            read.source.close()
            raise CorruptCheckpointError(problem)
        read.damaged.append(m.Damage(key=key, name=key, file=name, kind=kind, problem=problem.removeprefix(path + ": ")))


def _opened(path: str, strict: bool) -> tuple[m.Checkpoint, list[m.Damage], list[str]]:
    """The checkpoint of a sharded index, the damage found opening it, and the absent shards."""
    index, shard_files = _read_index(path)
    weight_map: dict[str, str] = index[WEIGHT_MAP]
    directory = _fs.dirname(path)
    all_paths = [_fs.join(directory, n) if directory else n for n in shard_files]
    absent = {i: f"{p}: shard {i + 1} of {len(all_paths)} named by {path} is missing"
              for i, p in enumerate(all_paths) if not _fs.isfile(p)}
    # the shards read: the present ones (their positions in shard_files kept by `number`)
    number = [i for i in range(len(all_paths)) if i not in absent]
    shard_paths = [all_paths[i] for i in number]
    info: dict[str, Any] = {"shard_files": shard_files}
    metadata = index.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("total_size"), (int, float)):
        info["total_size"] = int(metadata["total_size"])
    read = _Read(path, shard_files, info)
    if shard_paths:
        is_st = is_safetensors_head(_fs.read_head(shard_paths[0], 10))
    else:  # no shard at all: the index's own name says which kind they were
        is_st = _fs.basename(path).endswith(".safetensors.index.json") or all(
            n.endswith(".safetensors") for n in shard_files)
    if is_st:
        _read_safetensors_shards(read, shard_paths, number, strict)
    else:
        _read_torch_shards(read, shard_paths, number, bool(absent))
    if absent:
        _list_missing(read, weight_map, all_paths, absent)
    _check_index(read, weight_map, strict)
    ckpt = m.Checkpoint(path=path, format=read.fmt or FORMAT_SAFETENSORS, variables=tuple(read.variables),
                        step=read.step, step_source=read.step_source, num_shards=len(shard_files), info=info,
                        source=read.source)
    return ckpt, read.damaged, [absent[i] for i in sorted(absent)]


def open_hf_sharded(path: str) -> m.Checkpoint:
    """Open a sharded Hugging Face checkpoint by its ``*.index.json``.

    Raises:
        CheckpointNotFoundError: The index or a shard is missing.
        CorruptCheckpointError: A damaged index or shard, or one that disagrees with the index.
        UnsafeFileError: A shard name leaving the folder, or an unsafe shard.
        NotACheckpointError: A shard that is not safetensors or torch.
    """
    path = str(path)
    return _opened(path, strict=True)[0]


def check_hf_sharded(path: str) -> ReadCheck:
    """Plan ``verify`` of a sharded checkpoint (a missing shard is damage, not an error)."""

    def opener(p: str) -> Opened:
        try:
            ckpt, damaged, problems = _opened(p, strict=False)
        except CheckpointNotFoundError as e:
            raise CorruptCheckpointError(str(e)) from None
        return Opened(ckpt, damaged, problems=problems)

    return ReadCheck(str(path), opener)
