"""What an Orbax step directory says about itself in plain files (JSON, read without tensorstore).

A Keras 3 ``OrbaxCheckpoint(directory=DIR)`` (orbax-checkpoint 0.12) writes, per kept step,
``DIR/<step>/``:

* ``_CHECKPOINT_METADATA``: JSON, the item handlers, ``init_timestamp_nsecs`` and
  ``commit_timestamp_nsecs`` (the commit is the moment every host finished);
* ``commit_success.txt`` (here and in each item folder): the commit markers;
* ``pytree/``: ``_METADATA`` (the tree: ``tree_metadata`` maps ``"('trainable_variables',
  'sequential', 'dense_1', 'kernel')"`` to its ``key_metadata`` and ``value_metadata``),
  ``_sharding`` (base64 of the dotted name -> JSON: mesh shape, axis names, partition spec,
  device ids), ``manifest.ocdbt`` with ``d/`` (the OCDBT database joining the processes'),
  ``ocdbt.process_N/`` (each process' own database), ``array_metadatas/process_N``;
* ``model_config/``: the model's Keras config as a string leaf (``_strings.json``).

An interrupted save leaves ``<step>.orbax-checkpoint-tmp``. Everything here is bounded: JSON files
by size, the tree by entries and depth, names refused when they could leave the directory.
"""

from __future__ import annotations

import ast
import base64
import binascii
import dataclasses
import json
import re
from typing import Any

from ... import model as m
from ...errors import CorruptCheckpointError, UnsafeFileError, one_line
from .. import _fs

__all__ = [
    "CHECKPOINT_METADATA",
    "COMMIT_MARKER",
    "PYTREE",
    "TMP_SUFFIX",
    "MANIFEST",
    "PROCESS_PREFIX",
    "MAX_ARRAYS",
    "ArrayEntry",
    "StepLayout",
    "read_step_layout",
    "read_json",
    "process_databases",
    "role_of",
    "readable_name",
    "summarize_config",
]

CHECKPOINT_METADATA = "_CHECKPOINT_METADATA"
COMMIT_MARKER = "commit_success.txt"
PYTREE = "pytree"
MODEL_CONFIG = "model_config"
TREE_METADATA = "_METADATA"
SHARDING = "_sharding"
MANIFEST = "manifest.ocdbt"
PROCESS_PREFIX = "ocdbt.process_"
ARRAY_METADATAS = "array_metadatas"
STRINGS = "_strings.json"
TMP_SUFFIX = ".orbax-checkpoint-tmp"

MAX_JSON_BYTES = 64 << 20  # far beyond the metadata of a model of millions of variables
MAX_ARRAYS = 1_000_000
MAX_DEPTH = 64
MAX_PROCESSES = 100_000
ARRAY_TYPES = frozenset({"jax.Array", "np.ndarray", "scalar", "jax.numpy.ndarray"})

# Keras' state tree groups, and the role of each.
GROUP_ROLES = {
    "trainable_variables": m.ROLE_MODEL,
    "non_trainable_variables": m.ROLE_MODEL,
    "optimizer_variables": m.ROLE_OPTIMIZER,
    "metrics_variables": m.ROLE_METADATA,
    # Other Orbax trees (Flax/optax training states).
    "params": m.ROLE_MODEL,
    "opt_state": m.ROLE_OPTIMIZER,
    "step": m.ROLE_METADATA,
}
# How a group's variables are named: the model's by their Keras path alone.
GROUP_NAMES = {
    "trainable_variables": "",
    "non_trainable_variables": "",
    "optimizer_variables": "optimizer/",
    "metrics_variables": "metrics/",
}
_PROCESS_RE = re.compile(r"^ocdbt\.process_(\d{1,6})$")
_ARRAY_METADATA_RE = re.compile(r"^process_(\d{1,6})$")


def read_json(path: str, what: str, limit: int = MAX_JSON_BYTES) -> Any:
    """A JSON file, bounded; a clear error when it is not JSON."""
    raw = _fs.read_bytes(path, limit=limit, what=what)
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise CorruptCheckpointError(f"{path}: {what} is not valid JSON: {one_line(e)}") from None


@dataclasses.dataclass(frozen=True)
class ArrayEntry:
    """One array of the tree (metadata only).

    Attributes:
        path: The tree path (``("trainable_variables", "sequential", "dense_1", "kernel")``).
        key: The dotted name Orbax stores it under in OCDBT (``trainable_variables.sequential...``).
        value_type: ``jax.Array``, ``np.ndarray``, ``scalar``.
        mesh: Axis name -> size of the mesh it was saved from, or {}.
        partition_spec: The partition spec (one entry per dimension: None, an axis or axes), or None.
        device_ids: The mesh's device ids, flattened.
    """

    path: tuple[str, ...]
    key: str
    value_type: str
    mesh: dict[str, int]
    partition_spec: tuple | None
    device_ids: tuple[int, ...] = ()

    @property
    def spec_text(self) -> str:
        """``(None, 'model')``: the partition spec as JAX prints a ``PartitionSpec``."""
        if self.partition_spec is None:
            return "-"
        return "(" + ", ".join(repr(p) if not isinstance(p, list) else repr(tuple(p)) for p in self.partition_spec) + (
            ",)" if len(self.partition_spec) == 1 else ")")


@dataclasses.dataclass(frozen=True)
class StepLayout:
    """The plain-file facts of one step directory."""

    path: str
    pytree: str
    arrays: tuple[ArrayEntry, ...]
    skipped: tuple[str, ...]  # leaves that are not arrays (strings, None)
    metadata: dict[str, Any]
    committed: bool
    processes: tuple[int, ...]  # ocdbt.process_N folders present
    array_metadata_processes: tuple[int, ...]  # array_metadatas/process_N files present
    has_manifest: bool
    config_summary: dict[str, Any]
    problems: tuple[str, ...]


def _tree_key(text: str, where: str) -> tuple[str, ...]:
    """``"('a', 'b')"``: a tuple of strings (or ints, as strings), never code."""
    if len(text) > 64 << 10:
        raise UnsafeFileError(f"{where}: a tree key of {len(text)} characters; refusing")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise CorruptCheckpointError(f"{where}: tree key {text[:80]!r} is not a tuple of names") from None
    if not isinstance(value, tuple) or not value or not all(isinstance(p, (str, int)) and not isinstance(p, bool) for p in value):
        raise CorruptCheckpointError(f"{where}: tree key {text[:80]!r} is not a tuple of names")
    if len(value) > MAX_DEPTH:
        raise UnsafeFileError(f"{where}: a tree path {len(value)} deep (limit {MAX_DEPTH}); refusing")
    parts = tuple(str(p) for p in value)
    for p in parts:
        if p in ("", ".", "..") or "/" in p or "\\" in p or "\x00" in p:
            raise UnsafeFileError(f"{where}: tree path {'/'.join(parts)[:120]!r} has a part {p!r} that could leave the checkpoint; refusing")
    return parts


def _sharding_entries(path: str) -> dict[str, dict[str, Any]]:
    if not _fs.exists(path):
        return {}
    raw = read_json(path, "Orbax sharding file")
    if not isinstance(raw, dict):
        raise CorruptCheckpointError(f"{path}: the sharding file is not a JSON object")
    out: dict[str, dict[str, Any]] = {}
    for k, v in raw.items():
        try:
            name = base64.b64decode(k, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise CorruptCheckpointError(f"{path}: sharding entry {k[:60]!r} is not a base64 name") from None
        try:
            spec = json.loads(v) if isinstance(v, str) else v
        except ValueError:
            raise CorruptCheckpointError(f"{path}: sharding entry for {name!r} is not JSON") from None
        if isinstance(spec, dict):
            out[name] = spec
    return out


def _mesh(spec: dict[str, Any]) -> tuple[dict[str, int], tuple | None, tuple[int, ...]]:
    names, sizes = spec.get("axis_names"), spec.get("shape")
    mesh: dict[str, int] = {}
    if isinstance(names, list) and isinstance(sizes, list) and len(names) == len(sizes):
        mesh = {str(n): int(s) for n, s in zip(names, sizes) if isinstance(s, int) and not isinstance(s, bool)}
    ps = spec.get("partition_spec")
    partition = tuple(ps) if isinstance(ps, list) else None
    ids: list[int] = []

    def walk(x: Any, depth: int = 0) -> None:
        if depth > MAX_DEPTH or len(ids) > MAX_PROCESSES:
            return
        if isinstance(x, list):
            for y in x:
                walk(y, depth + 1)
        elif isinstance(x, dict) and isinstance(x.get("id"), int):
            ids.append(x["id"])

    walk((spec.get("device_mesh") or {}).get("mesh") if isinstance(spec.get("device_mesh"), dict) else None)
    return mesh, partition, tuple(ids)


def process_databases(pytree: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ``ocdbt.process_N`` folders and the ``array_metadatas/process_N`` files present."""
    names = _fs.listdir(pytree)
    if len(names) > MAX_PROCESSES + 16:
        raise UnsafeFileError(f"{pytree}: {len(names)} entries; refusing")
    dbs = sorted(int(mt.group(1)) for n in names if (mt := _PROCESS_RE.match(n)) and _fs.isdir(_fs.join(pytree, n)))
    meta_dir = _fs.join(pytree, ARRAY_METADATAS)
    metas: list[int] = []
    if _fs.isdir(meta_dir):
        metas = sorted(int(mt.group(1)) for n in _fs.listdir(meta_dir)[: MAX_PROCESSES] if (mt := _ARRAY_METADATA_RE.match(n)))
    return tuple(dbs), tuple(metas)


def summarize_config(step: str) -> dict[str, Any]:
    """The saved Keras model config, summarised: class, name, layer count and classes."""
    path = _fs.join(step, MODEL_CONFIG, STRINGS)
    if not _fs.isfile(path):
        return {}
    try:
        strings = read_json(path, "model config")
        config = json.loads(strings.get("config")) if isinstance(strings, dict) and isinstance(strings.get("config"), str) else None
    except (CorruptCheckpointError, UnsafeFileError, ValueError, RecursionError):
        return {"model_config": "unreadable"}
    if not isinstance(config, dict):
        return {}
    inner = config.get("config") if isinstance(config.get("config"), dict) else {}
    layers = inner.get("layers") if isinstance(inner.get("layers"), list) else []
    classes = [la.get("class_name") for la in layers if isinstance(la, dict) and isinstance(la.get("class_name"), str)]
    classes = [c for c in classes if c != "InputLayer"]
    out: dict[str, Any] = {}
    if isinstance(config.get("class_name"), str):
        out["model_class"] = config["class_name"]
    if isinstance(inner.get("name"), str):
        out["model_name"] = inner["name"]
    if classes:
        out["layer_count"] = len(classes)
        out["layer_classes"] = classes[:64]
    compile_config = config.get("compile_config")
    if isinstance(compile_config, dict):
        opt = compile_config.get("optimizer")
        if isinstance(opt, dict) and isinstance(opt.get("class_name"), str):
            out["optimizer_class"] = opt["class_name"]
    out["model_config_json"] = True
    return out


def read_step_layout(step: str) -> StepLayout:
    """Read the plain files of an Orbax step directory (no tensorstore, no array bytes).

    Raises:
        NotACheckpointError, CorruptCheckpointError, UnsafeFileError.
    """
    from ...errors import NotACheckpointError  # noqa: PLC0415

    problems: list[str] = []
    meta_path = _fs.join(step, CHECKPOINT_METADATA)
    metadata: dict[str, Any] = {}
    if _fs.exists(meta_path):
        raw = read_json(meta_path, "Orbax checkpoint metadata")
        if not isinstance(raw, dict):
            raise CorruptCheckpointError(f"{meta_path}: not a JSON object")
        metadata = raw
    else:
        problems.append(f"{meta_path}: missing (the save never finished)")
    pytree = _fs.join(step, PYTREE)
    tree_path = _fs.join(pytree, TREE_METADATA)
    if not _fs.isdir(pytree) or not _fs.exists(tree_path):
        raise NotACheckpointError(f"{step}: an Orbax checkpoint without {PYTREE}/{TREE_METADATA} (not a Keras OrbaxCheckpoint step?)")
    tree = read_json(tree_path, "Orbax tree metadata")
    entries = tree.get("tree_metadata") if isinstance(tree, dict) else None
    if not isinstance(entries, dict):
        raise CorruptCheckpointError(f"{tree_path}: no 'tree_metadata' object")
    if len(entries) > MAX_ARRAYS:
        raise UnsafeFileError(f"{tree_path}: {len(entries)} tree entries (limit {MAX_ARRAYS}); refusing")
    shardings = _sharding_entries(_fs.join(pytree, SHARDING))
    arrays: list[ArrayEntry] = []
    skipped: list[str] = []
    seen: set[str] = set()
    for text, value in entries.items():
        parts = _tree_key(text, tree_path)
        key = ".".join(parts)
        if key in seen:
            raise CorruptCheckpointError(f"{tree_path}: two tree entries are stored as {key!r}")
        seen.add(key)
        vm = value.get("value_metadata") if isinstance(value, dict) else None
        vtype = vm.get("value_type") if isinstance(vm, dict) else None
        if vtype not in ARRAY_TYPES:
            skipped.append(key)
            continue
        mesh, partition, ids = _mesh(shardings.get(key, {}))
        arrays.append(ArrayEntry(parts, key, vtype, mesh, partition, ids))
    committed = _fs.exists(_fs.join(step, COMMIT_MARKER)) or "commit_timestamp_nsecs" in metadata
    if not _fs.exists(_fs.join(step, COMMIT_MARKER)) and not _fs.exists(_fs.join(pytree, COMMIT_MARKER)):
        problems.append(f"{step}: no {COMMIT_MARKER} (the save was not committed)")
    dbs, metas = process_databases(pytree)
    missing = sorted(set(metas) - set(dbs))
    for n in missing:
        problems.append(f"{_fs.join(pytree, PROCESS_PREFIX + str(n))}: missing (process {n} wrote array metadata but its database is not here)")
    has_manifest = _fs.isfile(_fs.join(pytree, MANIFEST))
    return StepLayout(step, pytree, tuple(arrays), tuple(skipped), metadata, committed, dbs, metas, has_manifest,
                      summarize_config(step), tuple(problems))


def role_of(path: tuple[str, ...]) -> str:
    """``trainable_variables`` and ``non_trainable_variables``: model; ``optimizer_variables``:
    optimizer; ``metrics_variables``: metadata."""
    return GROUP_ROLES.get(path[0], m.ROLE_MODEL) if len(path) > 1 else GROUP_ROLES.get(path[0], m.ROLE_METADATA)


def readable_name(path: tuple[str, ...]) -> str:
    """``sequential/dense_1/kernel`` for a model variable, ``optimizer/adam/iteration``,
    ``metrics/loss/total``; other trees' paths joined with ``/``."""
    if len(path) > 1 and path[0] in GROUP_NAMES:
        return GROUP_NAMES[path[0]] + "/".join(path[1:])
    return "/".join(path)
