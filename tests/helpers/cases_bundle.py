"""Bad-input catalogue: TF bundle index entries and object graphs (issue 11, the bundle reader).

Every input is built for real: a checkpoint written by TensorFlow (the ``fixtures/run`` and
``fixtures/sharded`` checkpoints, or ``tf.raw_ops.SaveV2``), whose ``.index`` entries are then
re-written with the project's own protobuf declarations and written back as a valid table
(``bundle_craft``), or whose object graph is a ``TrackableObjectGraph`` serialised here.

What TensorFlow itself does with each input (``tf.train.load_checkpoint`` and ``get_tensor`` of
every key, in a subprocess) is in :data:`TF_OUTCOME`, checked by
``test_bundle_hardening.test_what_tensorflow_does``.
"""

from __future__ import annotations

import pathlib

import numpy as np

from bundle_craft import (
    DEEP_KEY,
    chain_graph,
    edit_entry,
    graph_checkpoint,
    graph_in_own_shard,
    read_entries,
    save_tensors,
)
from catalogue import RUN, SHARDED, Case, _copy_prefix

KEY = "model/_operations/2/_kernel/.ATTRIBUTES/VARIABLE_VALUE"  # frozen/kernel, [16,16] float32 in ckpt-8
NAME = "frozen/kernel"
GRAPH_KEY = b"_CHECKPOINTABLE_OBJECT_GRAPH"


def _entry_case(**fields):
    """ckpt-8 with frozen/kernel's index entry changed."""

    def make(d: pathlib.Path) -> pathlib.Path:
        prefix = _copy_prefix(RUN / "ckpt-8", d)
        edit_entry(prefix, KEY.encode(), **fields)
        return prefix

    return make


def slice_unknown_dtype(d: pathlib.Path) -> pathlib.Path:
    """sharded/ckpt-4 with the second stored slice of frozen/kernel declaring dtype 99."""
    prefix = _copy_prefix(SHARDED / "ckpt-4", d)
    slice_keys = [k for k, _ in read_entries(pathlib.Path(f"{prefix}.index")) if k.startswith(b"\x00" + KEY.encode())]
    edit_entry(prefix, slice_keys[1], dtype=99)
    return prefix


def non_utf8_keys(d: pathlib.Path) -> pathlib.Path:
    """A name-based bundle written by SaveV2 whose keys ``w\\xff`` and ``w\\xfe`` are not UTF-8
    (and decode to the same text with errors='replace')."""
    d.mkdir(parents=True, exist_ok=True)
    return save_tensors(d / "model.ckpt-3", {
        b"w\xff": np.array([1.0, 2.0], np.float32),
        b"w\xfe": np.array([[1.0, 2.0, 3.0]], np.float32),
        b"global_step": np.int64(3),
    })


def _graph_entry_case(**fields):
    """ckpt-8 with the object graph's index entry changed."""

    def make(d: pathlib.Path) -> pathlib.Path:
        prefix = _copy_prefix(RUN / "ckpt-8", d)
        edit_entry(prefix, GRAPH_KEY, **fields)
        return prefix

    return make


def _graph_shard_case(damage):
    """ckpt-8 re-indexed so that its object graph lives alone in a second data shard, which
    ``damage`` then removes, empties or overwrites: every tensor is still intact."""

    def make(d: pathlib.Path) -> pathlib.Path:
        prefix = graph_in_own_shard(RUN / "ckpt-8", d)
        damage(pathlib.Path(f"{prefix}.data-00001-of-00002"))
        return prefix

    return make


def _garble(path: pathlib.Path) -> None:
    path.write_bytes(b"\xff" * path.stat().st_size)


def _chain_case(depth: int, every_node_holds: bool = False):
    def make(d: pathlib.Path) -> pathlib.Path:
        d.mkdir(parents=True, exist_ok=True)
        key = b"v1/.ATTRIBUTES/VARIABLE_VALUE" if every_node_holds else DEEP_KEY
        return graph_checkpoint(d / "ckpt-1", chain_graph(depth, every_node_holds=every_node_holds),
                                {key: np.arange(3, dtype=np.float32)})

    return make


def too_many_objects(d: pathlib.Path) -> pathlib.Path:
    """An object graph of 2,000,000 empty objects (4 MB): decoded, it would take gigabytes."""
    d.mkdir(parents=True, exist_ok=True)
    return graph_checkpoint(d / "ckpt-1", b"\n\x00" * 2_000_000, {DEEP_KEY: np.arange(3, dtype=np.float32)})


def _index_warning(problem: str) -> str:
    return f"warning: {{p}}.index: '{NAME}': {problem} (`ckptinspect verify` reports it)"


def _read_error(problem: str, where: str = "{p}.index") -> str:
    return f"Error: {where}: cannot read '{NAME}' (key '{KEY}'): {problem} (`ckptinspect verify` reports it)"


def _entry_expect(problem: str, kind: str, diff: tuple, dtype: str = "float32", stats_read: bool = True) -> dict:
    """ls lists the entry, marked, with a warning on stderr; reading it is one clean error naming
    it, before TensorFlow sees the key; verify names it as damage of its kind. (ls --stats does
    not read non-numeric or empty values: it lists them, marked.)"""
    listed = (0, f"{NAME} … {dtype} (unreadable)", _index_warning(problem))
    return {
        "ls": listed,
        "ls-stats": (2, _read_error(problem)) if stats_read else listed,
        "verify": (1, f"first:   {NAME} in {{p}}.data-00000-of-00001: {problem} … DAMAGED: 1 damaged … "
                      f"{{p}}.data-00000-of-00001  {kind}"),
        "diff": diff,
        "extract": (2, _read_error(problem, "{p}")),
    }


def _diff_unread(status: str, problem: str) -> tuple:
    """diff against run/ckpt-8: the pair differs in dtype or shape, so no value is read; the
    warning is a note of the report."""
    return (1, f"note: A: {{p}}.index: '{NAME}': {problem} … {NAME} … {status}")


GRAPH_UNREAD = "the object graph (_CHECKPOINTABLE_OBJECT_GRAPH) cannot be read: "
KEY_NAMES_NOTE = "; names and roles below come from the keys (`ckptinspect verify` checks the files)"
EXTRACT_NEEDS_GRAPH = ("Error: {p}: the object graph cannot be read ( … ); extract needs it to write a restorable"
                       " checkpoint (an .npz output does not)")
# ls when the object graph cannot be read: names come from the keys.
KEY_NAMES = "model/_operations/2/_kernel  … optimizer/_trainable_variables/0 … model"


def _graph_expect(shard: str, why: str, verify: str) -> dict:
    """The object graph cannot be read but every tensor can: ls and ls --stats list with names
    from the keys and a warning; diff compares (by key) with the warning as a note; verify
    reports the graph's entry; extract refuses (a TF2 output needs the graph)."""
    warning = f"{shard}: {GRAPH_UNREAD}{why}{KEY_NAMES_NOTE}"
    return {
        "ls": (0, KEY_NAMES, "warning: " + warning),
        "ls-stats": (0, KEY_NAMES + " … -0.4326", "warning: " + warning),
        "verify": (1, verify),
        "diff": (0, f"note: A: {warning} … all 26 variables equal"),
        "extract": (2, EXTRACT_NEEDS_GRAPH),
    }


SHARD0 = "{p}.data-00000-of-00001"
SHARD1 = "{p}.data-00001-of-00002"

CASES = [
    # -- index entries TensorFlow cannot read (frozen/kernel of run/ckpt-8) ------------------------
    # TF: load_checkpoint lists it; get_tensor aborts the process (SIGABRT, "Unexpected type: 99").
    Case("entry-unknown-dtype", _entry_case(dtype=99), _entry_expect(
        "unknown dtype 99: TensorFlow cannot read it", "dtype",
        _diff_unread("dtype_mismatch", "unknown dtype 99"), dtype="dtype99", stats_read=False)),
    # TF: get_tensor aborts ("Type not set").
    Case("entry-invalid-dtype-0", _entry_case(dtype=0), _entry_expect(
        "unknown dtype 0: TensorFlow cannot read it", "dtype",
        _diff_unread("dtype_mismatch", "unknown dtype 0"), dtype="dtype0", stats_read=False)),
    # TF: get_tensor fails ("Invalid size in bundle entry ... expected size 51200"): verify said INTACT.
    Case("entry-resource-dtype", _entry_case(dtype=20), _entry_expect(
        "dtype resource: a resource handle, not a stored value; TensorFlow cannot read it", "dtype",
        _diff_unread("dtype_mismatch", "dtype resource"), dtype="resource", stats_read=False)),
    # TF: load_checkpoint aborts the process (tensor_shape.cc "Check failed: 0 <= new_num_elements").
    Case("entry-dims-overflow", _entry_case(dims=[2**62, 4]), _entry_expect(
        "shape [4611686018427387904, 4] holds more elements than int64 can count", "size",
        _diff_unread("shape_mismatch", "shape [4611686018427387904, 4]"))),
    # TF: load_checkpoint aborts (the product overflows before the 0 is reached).
    Case("entry-dims-overflow-then-zero", _entry_case(dims=[2**40, 2**40, 0]), _entry_expect(
        "shape [1099511627776, 1099511627776, 0] holds more elements than int64 can count", "size",
        _diff_unread("shape_mismatch", "shape [1099511627776, 1099511627776, 0]"), stats_read=False)),
    # TF: load_checkpoint aborts (more than 254 dimensions).
    Case("entry-rank-255", _entry_case(dims=[1] * 255, size=4), _entry_expect(
        "shape has 255 dimensions, more than TensorFlow's 254", "size",
        _diff_unread("shape_mismatch", "shape has 255 dimensions"))),
    # TF: get_tensor fails ("Invalid size in bundle entry: ... stored size 1000000000000; expected
    # size 1024"); diff compared shape x itemsize bytes and said equal.
    Case("entry-size-1e12", _entry_case(size=10**12), _entry_expect(
        "the index records 1000000000000 bytes, a float32 tensor of shape [16, 16] takes 1024", "size",
        (2, _read_error("the index records 1000000000000 bytes, a float32 tensor of shape [16, 16] takes 1024")))),
    # TF: get_tensor fails ("Invalid size ... stored size 1000; expected size 1024").
    Case("entry-size-short", _entry_case(size=1000), _entry_expect(
        "the index records 1000 bytes, a float32 tensor of shape [16, 16] takes 1024", "size",
        (2, _read_error("the index records 1000 bytes, a float32 tensor of shape [16, 16] takes 1024")))),
    # sharded/ckpt-4, a stored slice of frozen/kernel. TF: get_tensor aborts ("Unexpected type: 99").
    Case("slice-entry-unknown-dtype", slice_unknown_dtype, {
        "ls": (0, f"{NAME} … float32 (unreadable)",
               f"warning: {{p}}.index: '{NAME}': a stored slice: unknown dtype 99: TensorFlow cannot read it"),
        "ls-stats": (2, _read_error("a stored slice: unknown dtype 99: TensorFlow cannot read it")),
        "verify": (1, f"first:   {NAME}[1:16,0:16] in {{p}}.data-00003-of-00005: unknown dtype 99: TensorFlow cannot"
                      " read it"),
        "diff": (2, _read_error("a stored slice: unknown dtype 99: TensorFlow cannot read it")),
        "extract": (2, _read_error("a stored slice: unknown dtype 99: TensorFlow cannot read it", "{p}")),
    }),
    # TF: get_variable_to_shape_map() raises UnicodeDecodeError; get_tensor(b"w\xff") reads. With
    # errors="replace" both keys were 'w\ufffd': diff said shape_mismatch, ls --stats "not found".
    Case("non-utf8-keys", non_utf8_keys, {
        "ls": (0, "w\\xfe … [1,3] … w\\xff … [2]"),
        "ls-stats": (0, "w\\xfe … 0.8165 … w\\xff … 1.5"),
        "verify": (0, "verdict: INTACT: 1 of 1 checkpoint whole, 3 tensors (28 B) checked"),
        "diff": (1, "w\\xfe … removed … w\\xff … 26 added, 3 removed"),
        "extract": (0, "all        2       20 B         1          8 B"),
    }),
    # -- the object graph (of run/ckpt-8) -------------------------------------------------------------
    # TF: reads every key, the graph too (a string's size is not checked against the entry).
    Case("object-graph-huge-size", _graph_entry_case(size=10**12), _graph_expect(
        SHARD0, "'_CHECKPOINTABLE_OBJECT_GRAPH' declares 1000000000000 bytes, more than the 33554432 this entry may take",
        f"first:   _CHECKPOINTABLE_OBJECT_GRAPH in {SHARD0}: needs bytes 4172..1000000004172, the shard has 7924 … truncated")),
    # TF: get_tensor of the graph raises IndexError ("Read less bytes than requested").
    Case("object-graph-huge-offset", _graph_entry_case(offset=2**62), _graph_expect(
        SHARD0, "truncated: '_CHECKPOINTABLE_OBJECT_GRAPH' needs bytes 4611686018427387904..4611686018427391656, the file has 7924",
        f"first:   _CHECKPOINTABLE_OBJECT_GRAPH in {SHARD0}: needs bytes 4611686018427387904..4611686018427391656")),
    # The graph alone in a second shard. TF: every tensor reads; only the graph's key fails.
    Case("object-graph-shard-missing", _graph_shard_case(lambda p: p.unlink()), _graph_expect(
        SHARD1, "the data shard is missing",
        f"first:   _CHECKPOINTABLE_OBJECT_GRAPH in {SHARD1}: its data shard is missing … missing-shard")),
    Case("object-graph-shard-empty", _graph_shard_case(lambda p: p.write_bytes(b"")), _graph_expect(
        SHARD1, "truncated: '_CHECKPOINTABLE_OBJECT_GRAPH' needs bytes 0..3752, the file has 0",
        f"first:   _CHECKPOINTABLE_OBJECT_GRAPH in {SHARD1}: needs bytes 0..3752, the shard has 0")),
    # TF: get_tensor of the graph raises IndexError ("Parsed past limit.").
    Case("object-graph-shard-garbage", _graph_shard_case(_garble), _graph_expect(
        SHARD1, "varint longer than 10 bytes",
        f"first:   _CHECKPOINTABLE_OBJECT_GRAPH in {SHARD1}: string tensor does not decode: varint longer than 10 bytes")),
    # A 40,000-deep chain of objects (the old walk: 14 GB and 47 s for ls). TF reads every key.
    Case("object-graph-chain-40k", _chain_case(40_000), {
        "ls": (0, "deep/v … [3] … model"),
        "ls-stats": (0, "deep/v … [3] … 0.8165"),
        "verify": (0, "verdict: INTACT: 1 of 1 checkpoint whole, 2 tensors"),
        "diff": (1, "deep/v … removed"),
        "extract": (0, "graph:    40001 -> 40001 objects, root keeps: c"),
    }),
    # 300,000 deep (the old walk: MemoryError).
    Case("object-graph-chain-300k", _chain_case(300_000), {
        "ls": (0, "deep/v … [3] … model"),
        "verify": (0, "verdict: INTACT: 1 of 1 checkpoint whole, 2 tensors"),
    }),
    # 2,000,000 empty objects: counted on the wire and refused before anything is decoded.
    Case("object-graph-too-many-objects", too_many_objects, {
        "ls": (0, "deep … [3] … model", f"warning: {SHARD0}: {GRAPH_UNREAD}object graph holds more than 1000000"
               " objects"),
        "verify": (0, "verdict: INTACT: 1 of 1 checkpoint whole, 2 tensors"),
        "extract": (2, EXTRACT_NEEDS_GRAPH),
    }),
    # 3,000 chained objects each holding a value: 4.5 million path elements, over the budget.
    Case("object-graph-paths-over-budget", _chain_case(3_000, every_node_holds=True), {
        "ls": (0, "v1 … [3] … model", f"warning: {SHARD0}: {GRAPH_UNREAD}object graph paths add up"
               " to more than 4000000 elements"),
        "verify": (0, "verdict: INTACT: 1 of 1 checkpoint whole, 2 tensors"),
        "extract": (2, EXTRACT_NEEDS_GRAPH),
    }),
]

# What TensorFlow itself does with each input: tf.train.load_checkpoint, then get_tensor of
# every key of the index as bytes (bundle_craft.tf_reads, in a subprocess): "abort" (the process
# dies of SIGABRT), "ok", or the start of "error: <last line>".
TF_OUTCOME = {
    "entry-unknown-dtype": "abort",
    "entry-invalid-dtype-0": "abort",
    "entry-resource-dtype": "error: tensorflow.python.framework.errors_impl.OpError: Invalid size in bundle entry",
    "entry-dims-overflow": "abort",
    "entry-dims-overflow-then-zero": "abort",
    "entry-rank-255": "abort",
    "entry-size-1e12": "error: tensorflow.python.framework.errors_impl.OpError: Invalid size in bundle entry",
    "entry-size-short": "error: tensorflow.python.framework.errors_impl.OpError: Invalid size in bundle entry",
    "slice-entry-unknown-dtype": "abort",
    "non-utf8-keys": "ok",
    "object-graph-huge-size": "ok",
    "object-graph-huge-offset": "error: IndexError: Read less bytes than requested",
    "object-graph-shard-missing": "error: tensorflow.python.framework.errors_impl.OpError:",
    "object-graph-shard-empty": "error: IndexError: Read less bytes than requested",
    "object-graph-shard-garbage": "error: IndexError: Parsed past limit.",
    "object-graph-chain-40k": "ok",
    "object-graph-chain-300k": "ok",
    "object-graph-too-many-objects": "ok",
    "object-graph-paths-over-budget": "ok",
}
