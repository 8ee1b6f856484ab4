"""``extract``: the model's weights alone, optimizer state stripped, still restorable.

Which variables are the model's is decided by the reader's roles (:attr:`Variable.role`: the
object graph for TF2 checkpoints, names for TF1, groups for Keras files), never by key
prefixes: a Keras 3 model saved with ``tf.train.Checkpoint(model=..., optimizer=...)`` has its
weights keyed ``optimizer/_trainable_variables/N/...``, and they are the model's.

Output formats (chosen from the output's suffix unless ``format`` says otherwise):

* ``tf`` (any other suffix): a TF bundle written by TensorFlow's own SaveV2. From a TF2
  object-based source, a TF2 checkpoint whose object graph is the source's minus the
  optimizer and the root's counters, every value re-keyed by its path through the model
  (``model/<path>/.ATTRIBUTES/VARIABLE_VALUE``), so ``tf.train.Checkpoint(model=fresh_model)
  .read(OUT).assert_consumed()`` passes. From a TF1 name-based source, a name-based bundle
  with the same keys minus the optimizer's slots. A SavedModel source gives a checkpoint of
  its variables with the SavedModel's root as root.
* ``weights-h5`` (``.weights.h5``): a Keras 3 weights file. Its positional layout is defined by
  the model's Python structure, which a TF checkpoint does not record, so from a TF2
  checkpoint it needs ``builder`` (a function building the same architecture): every weight of
  the built model is matched to the checkpoint by its object-graph path, assigned, and Keras
  writes the file. From a ``.keras`` / ``.weights.h5`` source it is copied group by group
  without the ``optimizer`` group (no builder needed).
* ``h5`` (``.h5`` / ``.hdf5``, legacy Keras source only): the file copied group by group with
  h5py, without ``optimizer_weights``; ``model_config`` and the other root attributes kept.
* ``npz`` (``.npz``): numpy's ``savez`` layout, one ``<readable name>.npy`` per model variable,
  written one array at a time.

The source is never modified. The output is written under a temporary name in its directory,
read back and compared tensor by tensor, bit for bit, with the source (an unsliced tensor
against its stored bytes in the source's data file, chunk by chunk, so one tensor is in memory),
and only then renamed into place.
"""

from __future__ import annotations

import dataclasses
import os
import time
import zipfile
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .. import _atomic
from .. import model as m
from .._tf import import_tf, load_checkpoint
from ..errors import CkptError, UsageError, VerificationError
from ..formats import (
    OBJECT_GRAPH_KEY,
    BundleTensor,
    numpy_view,
    object_graph_tensor,
    open_checkpoint,
    prune_object_graph,
    restore_tensor,
    write_bundle,
)
from .builder import load_builder
from .compare import bit_equal
from .matching import Item, graph_path_stage, items, match
from .targets import graph_paths, tf_variable

__all__ = [
    "OUTPUT_FORMATS",
    "FORMAT_TF",
    "FORMAT_WEIGHTS_H5",
    "FORMAT_H5",
    "FORMAT_NPZ",
    "ExtractedVariable",
    "ExtractReport",
    "extract",
    "output_format_for",
    "load_builder",
]

FORMAT_TF = "tf"
FORMAT_WEIGHTS_H5 = "weights-h5"
FORMAT_H5 = "h5"
FORMAT_NPZ = "npz"
OUTPUT_FORMATS = (FORMAT_TF, FORMAT_WEIGHTS_H5, FORMAT_H5, FORMAT_NPZ)

SUFFIX_WEIGHTS_H5 = ".weights.h5"
SUFFIXES_H5 = (".h5", ".hdf5")
SUFFIX_NPZ = ".npz"
SUFFIX_KERAS = ".keras"
NPY_SUFFIX = ".npy"
COMPARE_CHUNK = 4 << 20

KERAS3_OPTIMIZER_GROUP = "optimizer"
LEGACY_OPTIMIZER_GROUP = "optimizer_weights"
KEEPABLE_ROLES = (m.ROLE_MODEL, m.ROLE_METADATA)
TF_SOURCE_FORMATS = (m.FORMAT_TF_BUNDLE, m.FORMAT_TF_SAVEDMODEL, m.FORMAT_TF_V1)
KERAS3_SOURCE_FORMATS = (m.FORMAT_KERAS_WEIGHTS_H5, m.FORMAT_KERAS_ZIP)

Progress = Callable[[int, int, m.Variable], None]
Builder = Callable[[], Any]


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


def _totals(variables: Iterable[ExtractedVariable], kept: bool) -> dict[str, dict[str, int]]:
    out = {r: {"count": 0, "nbytes": 0} for r in (*m.ROLES, "all")}
    for v in variables:
        if v.kept == kept:
            for r in (v.role, "all"):
                out[r]["count"] += 1
                out[r]["nbytes"] += v.nbytes
    return out


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

    @property
    def kept(self) -> dict[str, dict[str, int]]:
        """Count and bytes kept, per role and ``all``."""
        return _totals(self.variables, True)

    @property
    def dropped(self) -> dict[str, dict[str, int]]:
        """Count and bytes dropped, per role and ``all``."""
        return _totals(self.variables, False)

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
            "seconds": round(self.seconds, 3),
            "object_graph": self.object_graph,
            "notes": list(self.notes),
            "variables": [v.to_dict() for v in self.variables],
        }


# -- helpers -------------------------------------------------------------------------------
def _matcher(ckpt: m.Checkpoint) -> Callable[[Any, m.Variable], bool]:
    """Compares a value read back with its source variable, bit for bit.

    Numeric values are compared block by block with the source's streamed blocks (for a local
    bundle tensor, its stored bytes read from the data file in chunks and crc32c-checked), so
    only the value read back is in memory; strings are read from the source whole.
    """

    def matches(value: Any, v: m.Variable) -> bool:
        value = np.asarray(value)
        if tuple(value.shape) != tuple(v.shape):
            return False
        if v.dtype not in m.NUMERIC_DTYPES or str(value.dtype) != v.dtype:
            return bit_equal(value, ckpt.read(v))
        flat = np.ascontiguousarray(value).reshape(-1)
        pos = 0
        for block in ckpt.iter_blocks(v, max(1, COMPARE_CHUNK // value.dtype.itemsize)):
            if not bit_equal(flat[pos : pos + block.size], block):
                return False
            pos += block.size
        return pos == flat.size

    return matches


def _value_reader(ckpt: m.Checkpoint) -> Callable[[m.Variable], np.ndarray]:
    """Reads one source value: TF sources through RestoreV2 into TensorFlow's buffer, viewed
    without a copy; other formats through the checkpoint's own reader."""
    if ckpt.format not in TF_SOURCE_FORMATS:
        return ckpt.read
    return lambda v: numpy_view(restore_tensor(ckpt.path, v.key, v.dtype))


def output_format_for(out: str, format: str | None = None) -> str:  # noqa: A002
    """The output format: ``format`` if given, else from ``out``'s suffix.

    ``.weights.h5`` -> weights-h5, ``.npz`` -> npz, ``.h5``/``.hdf5`` -> h5 (legacy Keras
    sources), anything else -> a TF prefix.

    Raises:
        UsageError: Unknown format, or a ``.keras`` output.
    """
    if format is not None:
        fmt = format.lower()
        if fmt not in OUTPUT_FORMATS:
            raise UsageError(f"unknown output format {format!r}; expected one of {', '.join(OUTPUT_FORMATS)}")
        return fmt
    name = os.path.basename(out).lower()
    if name.endswith(SUFFIX_WEIGHTS_H5):
        return FORMAT_WEIGHTS_H5
    if name.endswith(SUFFIX_NPZ):
        return FORMAT_NPZ
    if name.endswith(SUFFIXES_H5):
        return FORMAT_H5
    if name.endswith(SUFFIX_KERAS):
        raise UsageError(
            f"{out}: extract does not write .keras archives (they hold the model config and "
            "optimizer); use a .weights.h5, .npz or TF prefix output"
        )
    return FORMAT_TF


def _source_files(ckpt: m.Checkpoint) -> list[str]:
    return [f for f in ckpt.files() if os.path.isfile(f)]


def _size(paths: Iterable[str]) -> int:
    return sum(os.path.getsize(p) for p in paths if os.path.isfile(p))


def _check_keep(keep: Sequence[str]) -> tuple[str, ...]:
    keep = tuple(dict.fromkeys(keep))
    for role in keep:
        if role == m.ROLE_OPTIMIZER:
            raise UsageError("keep=optimizer: extract strips optimizer state; copy the checkpoint to keep it")
        if role not in KEEPABLE_ROLES:
            raise UsageError(f"unknown role {role!r} to keep; expected model and/or metadata")
    if m.ROLE_MODEL not in keep:
        raise UsageError("keep must include model")
    return keep


class _Verifier:
    """What was written, checked against the source when it is read back."""

    def __init__(self, progress: Progress | None, total: int):
        self.expected: dict[str, m.Variable] = {}
        self.progress = progress
        self.total = total

    def record(self, out_key: str, variable: m.Variable) -> None:
        """``variable`` was written as ``out_key``."""
        self.expected[out_key] = variable
        if self.progress is not None:
            self.progress(len(self.expected), self.total, variable)

    def check(
        self,
        label: str,
        keys: Iterable[str],
        read_output: Callable[[str], Any],
        matches: Callable[[Any, m.Variable], bool],
    ) -> int:
        """Every recorded key is in the output, nothing else is, and each value read back
        ``matches`` its source variable (bit for bit)."""
        found = set(keys)
        missing = sorted(set(self.expected) - found)
        extra = sorted(found - set(self.expected))
        if missing or extra:
            what = f"missing {missing[0]!r}" if missing else f"unexpected {extra[0]!r}"
            raise VerificationError(
                f"{label}: read-back check failed: {len(missing)} kept tensor(s) missing and "
                f"{len(extra)} unexpected in the written output ({what}); nothing was written"
            )
        for key, variable in self.expected.items():
            if not matches(read_output(key), variable):
                raise VerificationError(
                    f"{label}: read-back check failed: {key!r} differs from the source value; nothing was written"
                )
        return len(self.expected)


# -- TF output -----------------------------------------------------------------------------
def _write_tf(
    ckpt: m.Checkpoint, tmp: str, keep: tuple[str, ...], max_shard_bytes: int | None, progress: Progress | None
) -> tuple[list[ExtractedVariable], int, int, dict[str, Any] | None, list[str]]:
    notes: list[str] = []
    object_graph = None
    kept_keys = {v.key for v in ckpt.variables if v.role in keep}
    if ckpt.info.get("kind") == "tf2-object":
        # Through RestoreV2 (a scalar string comes back as exact bytes; numpy's fixed-width
        # bytes would drop a serialized graph's trailing NUL bytes).
        blob = restore_tensor(ckpt.path, OBJECT_GRAPH_KEY, "string").numpy()
        pruned = prune_object_graph(blob, kept_keys)
        blob = pruned.blob
        key_map = pruned.key_map
        for v in ckpt.variables:  # the pruning and the reader agree on every model path
            if v.role == m.ROLE_MODEL and v.graph_path is not None and pruned.paths.get(v.key) != v.graph_path:
                raise CkptError(
                    f"{ckpt.path}: internal disagreement on the model path of {v.key!r}: reader "
                    f"{v.graph_path!r}, pruned graph {pruned.paths.get(v.key)!r}"
                )
        object_graph = {
            "source_nodes": pruned.source_nodes,
            "nodes": pruned.num_nodes,
            "root_children": list(pruned.root_children),
        }
        if len(pruned.root_children) == 1:
            notes.append(
                f"restore with tf.train.Checkpoint({pruned.root_children[0]}=model).read(OUT).assert_consumed() "
                "(compile the model after restoring: a compiled model brings optimizer variables)"
            )
        else:
            shown = ", ".join(pruned.root_children[:4]) + (", ..." if len(pruned.root_children) > 4 else "")
            notes.append(
                f"the root is the saved object itself (children {shown}): restore into the same kind of "
                "root, e.g. model.load_weights(OUT) for Keras 2 save_weights, or "
                "tf.train.Checkpoint(root=obj).read(OUT)"
            )
    else:
        blob = None
        key_map = {key: key for key in kept_keys}
        notes.append("name-based (TF1) checkpoint: restore with tf.compat.v1.train.Saver over the model's variables")
        if ckpt.format == m.FORMAT_TF_V1:
            notes.append("the V1 table source was rewritten as a V2 bundle (.index + .data)")

    planned = [
        ExtractedVariable(v.name, v.key, key_map.get(v.key), v.role, v.shape, v.dtype, v.nbytes)
        for v in ckpt.variables
    ]
    by_key = {v.key: v for v in ckpt.variables}
    kept = [p for p in planned if p.kept]
    by_out = {p.output_key: by_key[p.key] for p in kept}
    verifier = _Verifier(progress, len(kept))

    def tensors() -> Iterable[BundleTensor]:
        if blob is not None:
            yield object_graph_tensor(blob)
        for p in kept:
            var = by_key[p.key]
            yield BundleTensor(
                key=p.output_key,
                read=lambda var=var: restore_tensor(ckpt.path, var.key, var.dtype),
                nbytes=var.nbytes,
                slices=var.slices,
            )

    def on_value(t: BundleTensor, value: np.ndarray) -> None:
        if t.key == OBJECT_GRAPH_KEY:
            return
        verifier.record(t.key, by_out[t.key])

    num_shards = write_bundle(tmp, list(tensors()), max_shard_bytes=max_shard_bytes, on_value=on_value)

    # Read back: the keys, every value, the object graph, and the roles our reader gives.
    reader = load_checkpoint(tmp)
    keys = set(reader.get_variable_to_shape_map())
    if blob is not None:
        if OBJECT_GRAPH_KEY not in keys or restore_tensor(tmp, OBJECT_GRAPH_KEY, "string").numpy() != blob:
            raise VerificationError(f"{tmp}: read-back check failed: the object graph was not written as built")
        keys.discard(OBJECT_GRAPH_KEY)
    dtypes = {p.output_key: p.dtype for p in kept}
    verified = verifier.check(
        tmp,
        keys,
        lambda k: numpy_view(restore_tensor(tmp, k, dtypes[k])),
        _matcher(ckpt),
    )
    del reader
    with open_checkpoint(tmp) as written:
        for v in written.variables:
            if by_out[v.key].role == m.ROLE_MODEL and v.role != m.ROLE_MODEL:
                raise VerificationError(f"{tmp}: read-back check failed: {v.key!r} is no longer a model variable")
    return planned, verified, num_shards, object_graph, notes


# -- npz output ----------------------------------------------------------------------------
def _npz_name(v: m.Variable) -> str:
    return v.name


def _write_npz(
    ckpt: m.Checkpoint, tmp: str, keep: tuple[str, ...], progress: Progress | None
) -> tuple[list[ExtractedVariable], int, list[str]]:
    kept_vars = [v for v in ckpt.variables if v.role in keep]
    names: dict[str, str] = {}
    for v in kept_vars:
        name = _npz_name(v)
        if name in names.values():
            raise UsageError(f"{ckpt.path}: two kept variables share the readable name {name!r}; npz needs unique names")
        names[v.key] = name
    planned = [
        ExtractedVariable(v.name, v.key, names.get(v.key), v.role, v.shape, v.dtype, v.nbytes) for v in ckpt.variables
    ]
    verifier = _Verifier(progress, len(kept_vars))
    read = _value_reader(ckpt)
    # numpy.savez's own layout (a zip of NAME.npy members), written one array at a time.
    with zipfile.ZipFile(tmp, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for v in kept_vars:
            value = np.asarray(read(v))
            if value.dtype.kind == "O":
                value = value.astype(np.bytes_)
            if value.dtype.kind == "V" or value.dtype.name not in np.sctypeDict and value.dtype.kind not in "SU":
                raise UsageError(f"{v.name}: dtype {v.dtype} has no numpy .npy encoding; use the TF output format")
            verifier.record(names[v.key], v)
            with zf.open(names[v.key] + NPY_SUFFIX, mode="w", force_zip64=True) as f:
                np.lib.format.write_array(f, value, allow_pickle=False)
            del value
    with np.load(tmp, allow_pickle=False) as npz:
        verified = verifier.check(tmp, npz.files, lambda k: npz[k], _matcher(ckpt))
    return planned, verified, ["npz: load with numpy.load(OUT); one array per readable name"]


# -- HDF5 outputs --------------------------------------------------------------------------
def _copy_attrs(src: Any, dst: Any) -> None:
    for name in src.attrs:
        dst.attrs.create(name, src.attrs[name], dtype=src.attrs.get_id(name).dtype)


def _h5_copy_without(src_h5: Any, tmp: str, drop_group: str) -> None:
    import h5py  # noqa: PLC0415

    with h5py.File(tmp, "w") as dst:
        _copy_attrs(src_h5, dst)
        for name in src_h5:
            if name == drop_group:
                continue
            src_h5.copy(src_h5[name], dst, name=name, without_attrs=False)


def _h5_read(h5: Any, key: str) -> np.ndarray:
    ds = h5[key]
    return ds[()]


def _write_h5_copy(
    ckpt: m.Checkpoint, tmp: str, drop_group: str, open_source: Callable[[], Any], progress: Progress | None
) -> tuple[list[ExtractedVariable], int]:
    """Copy an HDF5 file without ``drop_group``; check the roles agree with the groups."""
    import h5py  # noqa: PLC0415

    planned = []
    for v in ckpt.variables:
        in_dropped = v.key == drop_group or v.key.startswith(drop_group + "/")
        if in_dropped != (v.role == m.ROLE_OPTIMIZER):
            raise CkptError(
                f"{ckpt.path}: {v.key!r} has role {v.role} but is {'inside' if in_dropped else 'outside'} "
                f"the {drop_group!r} group; refusing to guess what to drop"
            )
        planned.append(ExtractedVariable(v.name, v.key, None if in_dropped else v.key, v.role, v.shape, v.dtype, v.nbytes))
    kept = [p for p in planned if p.kept]
    verifier = _Verifier(progress, len(kept))
    src_h5 = open_source()
    try:
        _h5_copy_without(src_h5, tmp, drop_group)
        for p in kept:
            verifier.record(p.output_key, ckpt[p.key])
        with h5py.File(tmp, "r") as out:
            if drop_group in out:
                raise VerificationError(f"{tmp}: read-back check failed: {drop_group!r} is still there")
            for name in src_h5.attrs:
                if name not in out.attrs or not np.array_equal(np.asarray(out.attrs[name]), np.asarray(src_h5.attrs[name])):
                    raise VerificationError(f"{tmp}: read-back check failed: root attribute {name!r} differs")
            datasets: list[str] = []
            out.visititems(lambda name, obj: datasets.append(name) if isinstance(obj, h5py.Dataset) else None)
            verified = verifier.check(
                tmp, datasets, lambda k: _h5_read(out, k), lambda value, v: bit_equal(value, _h5_read(src_h5, v.key))
            )
    finally:
        src_h5.close()
    return planned, verified


def _open_keras_source(ckpt: m.Checkpoint) -> Callable[[], Any]:
    """Opens the source's HDF5 file (the weights file inside a ``.keras`` archive) with the
    reader's safety checks."""
    return ckpt.source.open_hdf5


# -- weights-h5 from a TF2 checkpoint, through a built model -------------------------------
def _sentinel(value: np.ndarray) -> np.ndarray:
    if value.dtype.kind == "f":
        return np.full(value.shape, np.nan, dtype=value.dtype)
    if value.dtype.kind in "iu":
        return np.full(value.shape, np.iinfo(value.dtype).max, dtype=value.dtype)
    if value.dtype.kind == "b":
        return ~value
    return value


def _pair_with_built_model(ckpt: m.Checkpoint, model: Any) -> dict[int, m.Variable]:
    """Each weight of the built model (by id) -> the checkpoint's model variable at the same
    object-graph path (below the root, or below the node the model was saved as).

    Raises:
        UsageError: A weight is not reachable in the model's object graph, the two structures
            differ (what does not match is named, in both directions), or a shape/dtype differs.
    """
    paths = graph_paths(import_tf(), model)
    weights = []
    for i, w in enumerate(model.weights):
        path = paths.get(id(w), paths.get(id(tf_variable(w))))
        if path is None:
            raise UsageError(f"weight {getattr(w, 'path', w.name)!r} of the built model is not reachable in its object graph")
        name = str(getattr(w, "path", w.name))
        weights.append(Item(name, name, tuple(w.shape), np.dtype(w.dtype).name, m.ROLE_MODEL, path, i, (), w))
    sources = items(v for v in ckpt.variables if v.graph_path is not None and v.role == m.ROLE_MODEL)
    paired = match(sources, weights, (graph_path_stage(complete=False),), labels=("the checkpoint", "the built model"))
    # What is unused counts only below the node the model was found under (other root children
    # of a tf.train.Checkpoint are not the model's).
    lead = ""
    if paired.pairs:
        first = paired.pairs[0]
        lead = first.a.graph_path[: len(first.a.graph_path) - len(first.b.graph_path)]
    unmatched = [y.name for y in paired.only_b]
    unused = [x.name for x in paired.only_a if x.graph_path.startswith(lead)]
    if unmatched or unused or paired.ambiguous:
        parts = [a.reason for a in paired.ambiguous]
        if unmatched:
            parts.append(f"{len(unmatched)} weight(s) of the built model are not in the checkpoint (e.g. {unmatched[0]!r})")
        if unused:
            parts.append(f"{len(unused)} model variable(s) of the checkpoint are not in the built model (e.g. {unused[0]!r})")
        raise UsageError(f"{ckpt.path}: the builder's architecture does not match: " + "; ".join(parts))
    for p in paired.pairs:
        v, w = p.a.ref, p.b
        if w.shape != v.shape or w.dtype != v.dtype:
            raise UsageError(f"{v.name}: the checkpoint has {v.dtype}{list(v.shape)}, the built model {w.dtype}{list(w.shape)}")
    return {id(p.b.ref): p.a.ref for p in paired.pairs}


def _write_weights_from_builder(
    ckpt: m.Checkpoint, tmp: str, builder: Builder, progress: Progress | None
) -> tuple[list[ExtractedVariable], int, list[str]]:
    if ckpt.info.get("kind") != "tf2-object":
        raise UsageError(
            f"{ckpt.path}: a .weights.h5 output needs a TF2 object-based source (its object graph "
            "maps weights to the built model); this one is name-based"
        )
    import_tf()  # quietly, before the builder touches TensorFlow
    try:
        model = builder()
    except CkptError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's builder failed
        raise UsageError(f"the builder failed: {type(e).__name__}: {e}") from None
    if not hasattr(model, "save_weights") or not hasattr(model, "weights"):
        raise UsageError(f"the builder returned {type(model).__name__}, not a Keras model")
    if not model.weights:
        raise UsageError("the builder returned a model without weights; build it (call it on an input or model.build(shape))")
    matches = _pair_with_built_model(ckpt, model)
    model_vars = list(model.weights)
    verifier = _Verifier(progress, len(model_vars))
    read = _value_reader(ckpt)
    for w in model_vars:
        v = matches[id(w)]
        value = read(v)
        w.assign(value)
        verifier.record(v.key, v)
        del value
    model.save_weights(tmp)
    # Read back through Keras: poison every weight, load the file, compare with the source.
    for w in model_vars:
        w.assign(_sentinel(np.asarray(w.numpy())))
    model.load_weights(tmp)
    values = {matches[id(w)].key: w for w in model_vars}
    verified = verifier.check(tmp, values, lambda k: np.asarray(values[k].numpy()), _matcher(ckpt))
    # The file's dataset paths are Keras's positional ones; name each kept value by its Keras path.
    keras_path = {matches[id(w)].key: str(getattr(w, "path", w.name)) for w in model_vars}
    planned = [
        ExtractedVariable(v.name, v.key, keras_path.get(v.key), v.role, v.shape, v.dtype, v.nbytes)
        for v in ckpt.variables
    ]
    notes = ["Keras 3 weights file written by model.save_weights of the builder's model: load with model.load_weights(OUT)"]
    return planned, verified, notes


# -- the operation -------------------------------------------------------------------------
def extract(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    format: str | None = None,  # noqa: A002 - the CLI's --format
    force: bool = False,
    keep: Sequence[str] = (m.ROLE_MODEL,),
    builder: Builder | str | None = None,
    max_shard_bytes: int | None = None,
    progress: Progress | None = None,
) -> ExtractReport:
    """Write the model's weights of ``src`` to ``out``, optimizer state stripped.

    Args:
        src: Any checkpoint :func:`ckptinspect.open` accepts.
        out: The output: a TF prefix, or a ``.weights.h5`` / ``.h5`` / ``.npz`` file.
        format: ``tf``, ``weights-h5``, ``h5`` or ``npz``; default from ``out``'s suffix.
        force: Replace an existing output.
        keep: Roles to keep: ``model`` (always) and optionally ``metadata`` (step counters,
            ``save_counter``, TF1 ``global_step``). Optimizer state is never kept.
        builder: For a ``.weights.h5`` output from a TF2 checkpoint: a function (or
            ``"module:function"``) returning the built Keras 3 model of the same architecture.
        max_shard_bytes: TF output: bytes per data shard, which bounds memory. Default: the
            largest kept tensor (at least 64 MiB), so memory stays about one tensor; a bigger
            tensor gets its own shard; 0 puts every tensor in its own shard.
        progress: Called as ``progress(done, total, variable)`` after each kept tensor.

    Returns:
        The :class:`ExtractReport`.

    Raises:
        OutputExistsError: ``out`` exists and ``force`` is not set.
        UsageError: The output format does not fit the source, or bad arguments.
        CheckpointNotFoundError, NotACheckpointError, CorruptCheckpointError: Bad source.
        CkptError: The written output did not read back identical (nothing is left behind).
    """

    start = time.perf_counter()
    src, out = os.fspath(src), os.fspath(out)
    fmt = output_format_for(out, format)
    keep = _check_keep(keep)
    if max_shard_bytes is not None and max_shard_bytes < 0:
        raise UsageError(f"max_shard_bytes must be >= 0. Received: {max_shard_bytes}")
    if isinstance(builder, str):
        builder = load_builder(builder)

    ckpt = open_checkpoint(src)
    try:
        if not any(v.role == m.ROLE_MODEL for v in ckpt.variables):
            raise UsageError(f"{ckpt.path}: no model variables to extract (roles: {_role_summary(ckpt)})")
        protected = [src, ckpt.path, *_source_files(ckpt)]
        source_bytes = _size(_source_files(ckpt))
        object_graph = None
        num_shards = 1
        if fmt == FORMAT_TF:
            if ckpt.format not in TF_SOURCE_FORMATS:
                raise UsageError(
                    f"{ckpt.path}: a TF checkpoint output needs a TF source (this is {ckpt.format}); "
                    "use a .h5, .weights.h5 or .npz output"
                )
            with _atomic.atomic_prefix(out, force=force, protected=protected) as tmp:
                planned, verified, num_shards, object_graph, notes = _write_tf(ckpt, tmp, keep, max_shard_bytes, progress)
                files = [out + p[len(tmp):] for p in _atomic.prefix_files(tmp)]
                out_bytes = _size(_atomic.prefix_files(tmp))
        else:
            with _atomic.atomic_file(out, force=force, protected=protected) as tmp:
                if fmt == FORMAT_NPZ:
                    planned, verified, notes = _write_npz(ckpt, tmp, keep, progress)
                elif fmt == FORMAT_H5:
                    if ckpt.format != m.FORMAT_KERAS_H5:
                        raise UsageError(
                            f"{ckpt.path}: a legacy .h5 output needs a legacy Keras .h5 source (this is "
                            f"{ckpt.format}); use a TF prefix, .weights.h5 or .npz output"
                        )
                    planned, verified = _write_h5_copy(ckpt, tmp, LEGACY_OPTIMIZER_GROUP, _open_keras_source(ckpt), progress)
                    notes = ["legacy Keras .h5 without optimizer_weights; model_config and training_config kept"]
                else:  # weights-h5
                    if ckpt.format in KERAS3_SOURCE_FORMATS:
                        planned, verified = _write_h5_copy(ckpt, tmp, KERAS3_OPTIMIZER_GROUP, _open_keras_source(ckpt), progress)
                        notes = ["Keras 3 weights without the optimizer group: load with model.load_weights(OUT)"]
                    elif ckpt.format in TF_SOURCE_FORMATS:
                        if builder is None:
                            raise UsageError(
                                f"{ckpt.path}: a .weights.h5 output from a TF checkpoint needs --builder "
                                "module:function (Keras 3's positional layout comes from the model's structure)"
                            )
                        planned, verified, notes = _write_weights_from_builder(ckpt, tmp, builder, progress)
                    else:
                        raise UsageError(
                            f"{ckpt.path}: a .weights.h5 output needs a TF2, .keras or .weights.h5 source (this is "
                            f"{ckpt.format}); use a .h5 or .npz output"
                        )
                files = [out]
                out_bytes = os.path.getsize(tmp)
    finally:
        ckpt.close()
    return ExtractReport(
        source=ckpt.path,
        source_format=ckpt.format,
        output=out,
        output_format=fmt,
        files=tuple(files),
        variables=tuple(planned),
        source_file_bytes=source_bytes,
        output_file_bytes=out_bytes,
        verified=verified,
        num_shards=num_shards,
        seconds=time.perf_counter() - start,
        object_graph=object_graph,
        notes=tuple(notes),
    )


def _role_summary(ckpt: m.Checkpoint) -> str:
    t = ckpt.totals()
    return ", ".join(f"{r} {t[r]['count']}" for r in m.ROLES)

