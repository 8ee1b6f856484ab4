"""The variables of a TF bundle, built from its parsed index without TensorFlow.

:func:`build_variables` gives each entry its readable name and role: from the object graph
(``_CHECKPOINTABLE_OBJECT_GRAPH``, a ``TrackableObjectGraph`` stored as a string tensor, read
here and decoded by :mod:`.tf_object_graph`) for a TF2 object-based checkpoint, from the keys
alone for a TF1 name-based one or when the object graph cannot be read. :func:`step_candidates`
gathers every step-like number (step variables, the file name, optimizer and save counters),
small scalars read straight from the data files; :func:`step_from_name` reads a prefix's name.
"""

from __future__ import annotations

import collections
import re
import struct
from typing import Iterable

from ... import model as m
from ...errors import CorruptCheckpointError
from .. import _fs
from .._bulk import paused_gc
from .compact import CompactIndex
from .index import OBJECT_GRAPH_KEY, BundleIndex, IndexEntry, fits_tensorflow
from .._layout import INDEX_SUFFIX, data_path, prefix_number
from .wire import MalformedError
from .data import decode_string_scalar, read_raw
from .object_graph import (
    ATTRIBUTES_MARK,
    METADATA_LOCAL_NAMES,
    OPTIMIZER_SLOT_MARK,
    VARIABLE_VALUE,
    GraphNode,
    KeyFacts,
    analyse_object_graph,
    parse_object_graph,
)

__all__ = [
    "TF1_SLOT_RE",
    "TF1_OPTIMIZER_NAMES",
    "MAX_OBJECT_GRAPH_BYTES",
    "build_variables",
    "step_candidates",
    "step_from_name",
    "key_name",
    "tf1_role",
    "unreadable_entries",
]

# Names of step / counter variables (metadata).
STEP_NAMES = ("global_step", "step")
# TF1 name-based optimizer slots: ``<var>/<OptimizerName>[_N]`` as tf.compat.v1 optimizers name
# them. (Keras optimizer-v2 slots in graph mode live under ``training/`` or ``<Optimizer>/``,
# matched by TF1_OPTIMIZER_NAMES; bare suffixes such as ``/m`` or ``/linear`` are not used,
# since model variables can end that way too.)
TF1_SLOT_RE = re.compile(
    r"/(Adam|Momentum|Ftrl|RMSProp|Adagrad|AdagradDA|Adadelta|Adamax|Nadam|ProximalAdagrad|"
    r"LazyAdam)(_\d+)?$"
    # BERT's AdamWeightDecayOptimizer (google-research/bert optimization.py) and the TF1 ports
    # of it name its slots ``<var>/adam_m`` and ``<var>/adam_v``.
    r"|/adam_[mv]$"
)
TF1_OPTIMIZER_NAMES = re.compile(r"(^|/)(beta1_power|beta2_power)(_\d+)?$|^training/|^(Adam|SGD|RMSprop|Adagrad|Ftrl|Nadam|Adamax|Adadelta|optimizer)(_\d+)?/")
KERAS_METRICS_KEY_RE = re.compile(r"(^|/)keras_api/(layer_)?metrics/")
OPTIMIZER_KEY_PART = "optimizer"
KERAS3_MODEL_VARIABLES = "_trainable_variables"
# The object graph is read whole: far beyond any real one (tens of KB for hundreds of
# variables); tf_object_graph bounds what is decoded.
MAX_OBJECT_GRAPH_BYTES = 32 << 20


# -- small values read without TensorFlow ---------------------------------------------
def _read_int_scalar(prefix: str, index: BundleIndex | CompactIndex, entry: IndexEntry) -> int | None:
    if entry.shape != () or entry.slices or entry.problem is not None:
        return None
    fmt = {"int64": "<q", "int32": "<i", "uint64": "<Q", "uint32": "<I", "float32": "<f", "float64": "<d"}.get(entry.dtype)
    if fmt is None or entry.size != struct.calcsize(fmt):
        return None
    if not _fs.exists(data_path(prefix, entry.shard_id, index.num_shards)):
        return None  # a missing shard is for verify (and for reading its values) to report
    try:
        raw = read_raw(prefix, index.num_shards, entry)
    except CorruptCheckpointError:
        return None  # a short shard, likewise
    value = struct.unpack(fmt, raw)[0]
    return int(value) if value == value else None


def key_name(key: str) -> str:
    """A readable name derived from a key: ``a/b/.ATTRIBUTES/VARIABLE_VALUE`` -> ``a/b``."""
    if key.endswith(ATTRIBUTES_MARK + VARIABLE_VALUE):
        return key[: -len(ATTRIBUTES_MARK + VARIABLE_VALUE)]
    return key.replace(ATTRIBUTES_MARK, "/")


def tf1_role(key: str, entry: IndexEntry) -> str:
    """The role of a TF1 name-based key: a scalar step counter is metadata, a known optimizer
    variable or slot is the optimizer's, the rest is the model's."""
    return _tf1_role(key, entry.shape == ())


def _tf1_role(key: str, scalar: bool) -> str:
    """:func:`tf1_role` of a key whose entry is a scalar or not."""
    base = key.rsplit("/", 1)[-1]
    if base in STEP_NAMES and scalar:
        return m.ROLE_METADATA
    if TF1_OPTIMIZER_NAMES.search(key) or TF1_SLOT_RE.search(key):
        return m.ROLE_OPTIMIZER
    return m.ROLE_MODEL


def step_from_name(prefix: str) -> int | None:
    """The number at the end of a prefix's file name (``ckpt-10``, ``model.ckpt-100``, ``ckpt_1``;
    ``model.ckpt-7-00000-of-00001``, a sharded V1 file, is step 7)."""
    return prefix_number(_fs.basename(prefix))


def _entry_shards(index: BundleIndex, entry: IndexEntry) -> tuple[tuple[int, ...], int, tuple[m.SliceInfo, ...]]:
    if not entry.slices:
        return (entry.shard_id,), entry.size, ()
    infos = tuple(
        m.SliceInfo(starts=st, lengths=ln, shard=se.shard_id, nbytes=se.size)
        for st, ln, se in index.slice_entries.get(entry.key, ())
    )
    return tuple(sorted({s.shard for s in infos})), sum(s.nbytes for s in infos), infos


def _nbytes(entry: IndexEntry, stored: int) -> int:
    """Bytes the value takes: shape x dtype where both make sense (an entry whose recorded size
    is wrong shows what it should take), else what the index records."""
    item = m.ITEMSIZE.get(entry.dtype)
    if item is None or not fits_tensorflow(entry.shape):
        return stored
    n = item
    for d in entry.shape:
        n *= d
    return n


def _keyed_role(key: str, entry: IndexEntry) -> str:
    """The role of a TF2 key when the object graph cannot be read: a guess from the key alone
    (an ``optimizer`` path element or an optimizer slot: optimizer, except a Keras 3
    optimizer's ``_trainable_variables``, which are the model's; Keras metrics, counters at the
    top level and non-variable attributes: metadata; else model)."""
    if OPTIMIZER_SLOT_MARK in key:
        return m.ROLE_OPTIMIZER
    if not key.endswith(ATTRIBUTES_MARK + VARIABLE_VALUE) or KERAS_METRICS_KEY_RE.search(key):
        return m.ROLE_METADATA
    parts = key_name(key).split("/")
    if KERAS3_MODEL_VARIABLES in parts[:-1]:
        return m.ROLE_MODEL  # a Keras 3 optimizer's list of the model's trainable variables
    if OPTIMIZER_KEY_PART in parts[:-1]:
        return m.ROLE_OPTIMIZER
    if len(parts) == 1 and parts[0] in METADATA_LOCAL_NAMES:
        return m.ROLE_METADATA
    return m.ROLE_MODEL


def _read_object_graph(prefix: str, index: BundleIndex, entry: IndexEntry) -> list[GraphNode]:
    """The object graph's nodes.

    Raises:
        MalformedError: The entry, its bytes or the graph are damaged, or its shard is missing.
        CheckpointNotFoundError: The shard exists but cannot be read (permission denied).
    """
    if entry.problem is not None:
        raise MalformedError(entry.problem[1])
    if entry.dtype != "string" or entry.shape != () or entry.slices:
        raise MalformedError(f"the entry is a {entry.dtype} tensor of shape {list(entry.shape)}, not a scalar string")
    path = data_path(prefix, entry.shard_id, index.num_shards)
    if not _fs.exists(path):
        raise MalformedError("the data shard is missing")
    try:
        raw = read_raw(prefix, index.num_shards, entry, limit=MAX_OBJECT_GRAPH_BYTES)
    except CorruptCheckpointError as e:
        raise MalformedError(str(e).removeprefix(f"{path}: ")) from None
    return parse_object_graph(decode_string_scalar(raw))


def unreadable_entries(index: BundleIndex | CompactIndex) -> dict[str, str]:
    """Keys TensorFlow cannot read (see :attr:`IndexEntry.problem`), with why."""
    if isinstance(index, CompactIndex):  # no slices; the rows with a problem only
        return {index.key_of(r): index.problems[index.problem_codes[r]][1] for r in index.problem_rows()}
    out = {}
    for e in index.entries:
        if e.problem is not None:
            out[e.key] = e.problem[1]
        elif e.slices:
            bad = next((se.problem[1] for *_, se in index.slice_entries.get(e.key, ()) if se.problem), None)
            if bad is not None:
                out[e.key] = f"a stored slice: {bad}"
    return out


def build_variables(prefix: str, index: BundleIndex | CompactIndex
                    ) -> tuple[list[m.Variable] | m.VariableTable, dict[str, object]]:
    """The variables of a bundle, with names and roles, and header facts.

    An object graph that cannot be read (missing or short shard, bytes that do not parse, a
    hostile shape) does not stop the listing: names and roles then come from the keys, and
    ``info["warnings"]`` says so. Entries TensorFlow cannot read are listed, named in
    ``info["unreadable"]`` (key -> why) and in a warning.

    Returns:
        (variables in key order, info dict with ``kind``, ``object_graph``, and when there is
        something to say ``warnings`` and ``unreadable``).

    Raises:
        CheckpointNotFoundError: The object graph's shard exists but cannot be read.
    """
    with paused_gc():  # a variable per entry, no reference cycles
        if isinstance(index, CompactIndex) and index.graph_row() is None:
            table = _table_variables(prefix, index)
            if table is not None:
                return table
        return _build_variables(prefix, index)


def _table_variables(prefix: str, index: CompactIndex) -> tuple[m.VariableTable | list[m.Variable], dict[str, object]] | None:
    """The variables of a name-based (TF1) compact index, as :func:`_build_variables` makes them,
    straight from its columns: a :class:`~ckptinspect.model.VariableTable` sharing them (a list
    below :data:`~.._bulk.COMPACT_MIN_VARIABLES` variables, as ``compact_variables`` leaves it);
    None when a size does not fit the table's int64 column."""
    import numpy as np  # noqa: PLC0415 - the columns

    from .._bulk import COMPACT_MIN_VARIABLES  # noqa: PLC0415

    try:
        nbytes = index.variable_nbytes()
    except OverflowError:
        return None
    scalar = [shape == () for shape in index.shapes]
    roles: dict[str, int] = {}
    role_codes = np.fromiter(
        (roles.setdefault(_tf1_role(key, scalar[code]), len(roles))
         for key, code in zip(map(index.key_of, range(len(index))), index.shape_codes.tolist())),
        np.int8, len(index))
    table = m.VariableTable(index.keys, index.key_ends, index.shapes, index.shape_codes, index.dtype_names,
                            index.dtype_codes, nbytes, list(roles), role_codes,
                            [(s,) for s in index.shard_numbers], index.shard_codes)
    info: dict[str, object] = {"kind": "tf1-name"}
    unreadable = unreadable_entries(index)
    if unreadable:
        info["unreadable"] = unreadable
        index_path = prefix + INDEX_SUFFIX
        info["warnings"] = [f"{index_path}: '{m.display_name(key)}': {why} (`ckptinspect verify` reports it)"
                            for key, why in unreadable.items()]
    if len(table) < COMPACT_MIN_VARIABLES:
        return list(table), info
    return table, info


def _build_variables(prefix: str, index: BundleIndex) -> tuple[list[m.Variable], dict[str, object]]:
    info, facts, warnings = _graph_facts(prefix, index)
    tf2 = info["kind"] == "tf2-object"
    pending = [(entry, *_named_role(entry, facts, tf2)) for entry in index.entries if entry.key != OBJECT_GRAPH_KEY]
    names_seen = collections.Counter(name for *_, name in pending)
    variables = []
    for entry, fact, role, name in pending:
        if names_seen[name] > 1:
            name = key_name(entry.key)
        shards, stored, slices = _entry_shards(index, entry)
        variables.append(
            m.Variable(
                key=entry.key,
                name=name,
                shape=entry.shape,
                dtype=entry.dtype,
                nbytes=_nbytes(entry, stored),
                shards=shards,
                role=role,
                slices=slices,
                graph_path=fact.graph_path if fact else None,
            )
        )
    unreadable = {k: v for k, v in unreadable_entries(index).items() if k != OBJECT_GRAPH_KEY}
    if unreadable:
        info["unreadable"] = unreadable
        index_path = prefix + INDEX_SUFFIX
        names = {v.key: v.name for v in variables}
        warnings += [f"{index_path}: '{m.display_name(names[k])}': {why} (`ckptinspect verify` reports it)"
                     for k, why in unreadable.items()]
    if warnings:
        info["warnings"] = warnings
    return variables, info


def _graph_facts(prefix: str, index: BundleIndex) -> tuple[dict[str, object], dict[str, KeyFacts] | None, list[str]]:
    """The bundle's kind (``tf2-object`` when it stores an object graph, else ``tf1-name``)
    and the graph's facts per key, read when the graph reads: a graph that does not gives no
    facts (None) and a warning, and the names and roles then come from the keys.

    Returns:
        (info with ``kind`` and for TF2 ``object_graph``, the facts or None, warnings).
    """
    info: dict[str, object] = {}
    warnings: list[str] = []
    graph_entry = next((e for e in index.entries if e.key == OBJECT_GRAPH_KEY), None)
    if graph_entry is None:
        info["kind"] = "tf1-name"
        return info, None, warnings
    info["kind"] = "tf2-object"
    facts = None
    graph_info: dict[str, object] = {"nodes": None, "shard": graph_entry.shard_id, "nbytes": graph_entry.size}
    try:
        nodes = _read_object_graph(prefix, index, graph_entry)
        facts = analyse_object_graph(nodes)
        graph_info["nodes"] = len(nodes)
    except MalformedError as e:
        shard = data_path(prefix, graph_entry.shard_id, index.num_shards)
        graph_info["error"] = str(e)
        warnings.append(
            f"{shard}: the object graph ({OBJECT_GRAPH_KEY}) cannot be read: {e}; names and roles"
            " below come from the keys (`ckptinspect verify` checks the files)"
        )
    info["object_graph"] = graph_info
    return info, facts, warnings


def _named_role(entry: IndexEntry, facts: dict[str, KeyFacts] | None, tf2: bool) -> tuple[KeyFacts | None, str, str]:
    """An entry's graph facts, role and readable name (before names shared by several keys
    fall back to the keys): from the object graph when it was read (a scalar integer the
    root tracks is a counter, metadata), from a TF2 key when it was not, from TF1 rules."""
    fact = facts.get(entry.key) if facts is not None else None
    if facts is not None:
        role = fact.role if fact else (m.ROLE_OPTIMIZER if OPTIMIZER_SLOT_MARK in entry.key else m.ROLE_METADATA)
        if role == m.ROLE_MODEL and fact.root_child and entry.shape == () and entry.dtype in m.INTEGER_DTYPES:
            role = m.ROLE_METADATA  # a counter tracked by the root (episode_counter, epoch...)
        return fact, role, (fact.name if fact else None) or key_name(entry.key)
    if tf2:
        return fact, _keyed_role(entry.key, entry), key_name(entry.key)
    return fact, tf1_role(entry.key, entry), entry.key


def step_candidates(prefix: str, index: BundleIndex | CompactIndex, variables: Iterable[m.Variable]) -> dict[str, int]:
    """Every step-like number the variables of a checkpoint record, best first: explicit step
    variables, then the optimizer's iteration counters and the save counter (the step rule,
    :func:`ckptinspect.formats._step.training_step`, chooses among them)."""
    if isinstance(variables, m.VariableTable):  # only scalars can be counters: the others stay columns
        import numpy as np  # noqa: PLC0415 - a table's columns

        scalar = [i for i, shape in enumerate(variables.shapes) if shape == ()]
        rows = variables.positions()
        rows = rows[np.isin(variables.shape_codes[rows], scalar)] if scalar else rows[:0]
        variables = [variables.variable(r) for r in rows.tolist()]
    by_key = index if isinstance(index, CompactIndex) else {e.key: e for e in index.entries}
    found: dict[str, int] = {}
    counters: dict[str, int] = {}
    for v in variables:
        if v.shape != () or v.sliced:
            continue
        base = key_name(v.key).rsplit("/", 1)[-1]
        label = None
        if v.role == m.ROLE_METADATA and base in STEP_NAMES:
            label, target = f"variable:{key_name(v.key)}", found
        elif v.role == m.ROLE_OPTIMIZER and base in ("iter", "_iterations", "iterations", "iteration"):
            label, target = f"optimizer:{key_name(v.key)}", counters
        elif base == "save_counter":
            label, target = "save_counter", counters
        if label is not None:
            value = _read_int_scalar(prefix, index, by_key.get(v.key))
            if value is not None:
                target[label] = value
    return {**found, **counters}
