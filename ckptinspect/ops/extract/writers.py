"""The outputs ``extract`` writes, each read back and compared with the source, bit for bit.

* the TF bundle output is in :mod:`.extract_tf` (ckptinspect's own writer);
* :func:`write_npz`: numpy's ``savez`` layout, one array at a time (the npz writer,
  ``formats.write_npz``);
* :func:`write_h5_copy`: a Keras HDF5 file copied group by group without the optimizer's group
  (the Keras family's writer, ``formats.copy_h5``);
* :func:`write_weights_through_model`: a Keras 3 ``.weights.h5`` through a built model (the
  pairing is :mod:`ckptinspect.ops.model.plan`'s, in :mod:`.convert`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ... import model as m
from ..._tf import missing_tensorflow, optional_tf
from ...errors import CkptError, CorruptCheckpointError, UsageError, VerificationError
from ...formats import (
    capabilities,
    open_checkpoint,
    safetensors_run_metadata,
    write_safetensors,
)
from ..bit_equality import bit_equal
from ..match.layouts import Fit, apply_fit

from .report import ExtractedVariable

__all__ = [
    "Verifier",
    "write_npz",
    "write_safetensors_output",
    "gather_blocks",
    "write_h5_copy",
    "call_builder",
    "write_weights_through_model",
    "source_matcher",
]

COMPARE_CHUNK = 4 << 20

Progress = Callable[[int, int, m.Variable], None]
Builder = Callable[[], Any]



def source_matcher(ckpt: m.Checkpoint) -> Callable[[Any, m.Variable], bool]:
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
    """Reads one source value. TF bundles: a whole numeric tensor from its data file in blocks
    (crc-checked), anything else (strings, slices, V1 tables) through the checkpoint's own
    decoder; other formats through their own reader. No TensorFlow."""
    can = capabilities(ckpt.format)
    if "tf-restorable" not in can:
        return ckpt.read
    streamed = "stored-bytes" in can  # a TF bundle's values stream from its data files (not a V1 table)

    def read(v: m.Variable) -> np.ndarray:
        dtype = m.numpy_dtype(v.dtype)
        if not streamed or v.sliced or dtype is None:
            return ckpt.read(v)
        return gather_blocks(ckpt, v, COMPARE_CHUNK // max(1, dtype.itemsize),
                             lambda n: CorruptCheckpointError(f"{ckpt.path}: {v.key!r} holds {n} of {v.size} values"))

    return read


def gather_blocks(ckpt: m.Checkpoint, v: m.Variable, elements: int, short: Callable[[int], CkptError]) -> np.ndarray:
    """A numeric variable read whole from its streamed blocks (``Checkpoint.iter_blocks``: for TF
    bundles crc-checked, without TensorFlow); ``short(n)`` is raised when the blocks hold ``n``
    values instead of ``v.size``."""
    out = np.empty(v.size, dtype=m.numpy_dtype(v.dtype))
    pos = 0
    for block in ckpt.iter_blocks(v, elements):
        flat = np.asarray(block).reshape(-1)
        out[pos : pos + flat.size] = flat
        pos += flat.size
    if pos != v.size:
        raise short(pos)
    return out.reshape(v.shape)


class Verifier:
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
def need_object_graph(ckpt: m.Checkpoint) -> None:
    """A TF2 output (or a builder's match by object-graph path) needs the source's object graph.

    Raises:
        CorruptCheckpointError: The reader could not read it (``info["object_graph"]["error"]``).
    """
    graph = ckpt.info.get("object_graph") or {}
    if graph.get("error"):
        raise CorruptCheckpointError(
            f"{ckpt.path}: the object graph cannot be read ({graph['error']}); extract needs it to write a"
            " restorable checkpoint (an .npz output does not)"
        )


# -- npz output ----------------------------------------------------------------------------
def _npz_name(ckpt: m.Checkpoint, v: m.Variable) -> str:
    """The readable name; a ``torch.save`` training dict's variables by their state_dict key
    (``model_state_dict/`` dropped), as the safetensors output names them."""
    return _state_dict_name(ckpt, v)


def write_npz(
    ckpt: m.Checkpoint, tmp: str, keep: tuple[str, ...], progress: Progress | None
) -> tuple[list[ExtractedVariable], int, list[str]]:
    kept_vars = [v for v in ckpt.variables if v.role in keep]
    names: dict[str, str] = {}
    for v in kept_vars:
        name = _npz_name(ckpt, v)
        if name in names.values():
            raise UsageError(f"{ckpt.path}: two kept variables share the readable name {name!r}; npz needs unique names")
        names[v.key] = name
    planned = [
        ExtractedVariable(v.name, v.key, names.get(v.key), v.role, v.shape, v.dtype, v.nbytes) for v in ckpt.variables
    ]
    from ...formats import npy_array, read_npz, write_npz as write_npz_file  # noqa: PLC0415 - the npz writer on use

    verifier = Verifier(progress, len(kept_vars))
    read = _value_reader(ckpt)
    with write_npz_file(tmp) as npz:
        for v in kept_vars:
            value = npy_array(read(v))
            if value is None:
                raise UsageError(f"{v.name}: dtype {v.dtype} has no numpy .npy encoding; use a .safetensors output (or a TF one from a TF source)")
            verifier.record(names[v.key], v)
            npz.add(names[v.key], value)
            del value
    with read_npz(tmp) as npz:
        verified = verifier.check(tmp, npz.files, lambda k: npz[k], source_matcher(ckpt))
    return planned, verified, ["npz: load with numpy.load(OUT); one array per readable name"]


# -- safetensors output ------------------------------------------------------------------------
SAFETENSORS_FORMAT = "safetensors"


def _state_dict_name(ckpt: m.Checkpoint, v: m.Variable) -> str:
    prefix = ckpt.info.get("state_dict_prefix") or ""
    return v.name[len(prefix):] if prefix and v.name.startswith(prefix) else v.name


def write_safetensors_output(
    ckpt: m.Checkpoint,
    tmp: str,
    keep: tuple[str, ...],
    progress: Progress | None,
    extra_metadata: Callable[[dict[str, str]], dict[str, str]] | None = None,
) -> tuple[list[ExtractedVariable], int, list[str]]:
    """The kept variables as one safetensors file, ``__metadata__`` ``{source, step, format: pt}``
    (plus what ``extra_metadata(names)`` returns for the source key -> tensor name map), read
    back through ckptinspect's safetensors reader and compared bit for bit."""
    kept_vars = [v for v in ckpt.variables if v.role in keep]
    names: dict[str, str] = {}
    for v in kept_vars:
        name = _state_dict_name(ckpt, v)
        if name in names.values():
            raise UsageError(f"{ckpt.path}: two kept variables share the name {name!r}; safetensors needs unique names")
        if v.dtype not in m.NUMERIC_DTYPES or v.dtype == "complex128":
            raise UsageError(f"{v.name}: dtype {v.dtype} cannot be stored in safetensors")
        names[v.key] = name
    planned = [
        ExtractedVariable(v.name, v.key, names.get(v.key), v.role, v.shape, v.dtype, v.nbytes) for v in ckpt.variables
    ]
    verifier = Verifier(progress, len(kept_vars))
    read = _value_reader(ckpt)
    metadata = {"source": ckpt.path, "format": "pt", **safetensors_run_metadata(ckpt)}
    extra = extra_metadata(names) if extra_metadata is not None else {}
    metadata.update(extra)

    def reader(v: m.Variable) -> Callable[[], np.ndarray]:
        def go() -> np.ndarray:
            verifier.record(names[v.key], v)
            return read(v)

        return go

    write_safetensors(tmp, [(names[v.key], v.dtype, v.shape, reader(v)) for v in kept_vars], metadata)
    with open_checkpoint(tmp) as written:
        if written.format != SAFETENSORS_FORMAT or written.info.get("metadata") != metadata or written.step != ckpt.step:
            raise VerificationError(f"{tmp}: read-back check failed: the safetensors header is not what was written")
        verified = verifier.check(tmp, written.keys(), written.read, source_matcher(ckpt))
    notes = ["safetensors: load with safetensors' load_file(OUT); keys are the readable names"]
    if extra:
        notes.append("the TF object graph and checkpoint keys are in __metadata__: `ckptinspect extract OUT -o PREFIX`"
                     " writes the TF2 checkpoint back")
    return planned, verified, notes


# -- HDF5 outputs --------------------------------------------------------------------------
def _require_written(ckpt: m.Checkpoint, variable: m.Variable) -> None:
    """Raise for a dataset declared but never written (its format raises
    :class:`~ckptinspect.errors.UnallocatedDataError` on the first block, before allocating):
    a copy would pass its fill values off as weights."""
    blocks = ckpt.iter_blocks(variable, 1)
    try:
        next(iter(blocks), None)
    finally:
        close = getattr(blocks, "close", None)
        if close is not None:
            close()


def write_h5_copy(
    ckpt: m.Checkpoint, tmp: str, drop_group: str, open_source: Callable[[], Any], progress: Progress | None
) -> tuple[list[ExtractedVariable], int]:
    """Copy an HDF5 file without ``drop_group`` (the Keras family's writer); check the roles
    agree with the groups."""
    from ...formats import copy_h5, h5_value, read_h5_output  # noqa: PLC0415 - h5py for HDF5 outputs only

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
    for p in kept:
        _require_written(ckpt, ckpt[p.key])
    verifier = Verifier(progress, len(kept))
    src_h5 = open_source()
    try:
        copy_h5(src_h5, tmp, drop=drop_group)
        for p in kept:
            verifier.record(p.output_key, ckpt[p.key])
        with read_h5_output(tmp) as out:
            if drop_group in out:
                raise VerificationError(f"{tmp}: read-back check failed: {drop_group!r} is still there")
            name = out.differing_root_attr(src_h5)
            if name is not None:
                raise VerificationError(f"{tmp}: read-back check failed: root attribute {name!r} differs")
            verified = verifier.check(
                tmp, out.datasets(), out.read, lambda value, v: bit_equal(value, h5_value(src_h5, v.key))
            )
    finally:
        src_h5.close()
    return planned, verified


# -- weights-h5 from a TF2 checkpoint, through a built model -------------------------------
def _sentinel(value: np.ndarray) -> np.ndarray:
    if value.dtype.kind == "f":
        return np.full(value.shape, np.nan, dtype=value.dtype)
    if value.dtype.kind in "iu":
        return np.full(value.shape, np.iinfo(value.dtype).max, dtype=value.dtype)
    if value.dtype.kind == "b":
        return ~value
    return value


def write_weights_through_model(
    ckpt: m.Checkpoint, tmp: str, model: Any, plan: Sequence[tuple[Any, m.Variable, Fit | None]], progress: Progress | None,
    left_at_init: Sequence[Any] = (),
) -> int:
    """Assign each source value to its model weight, ``model.save_weights(tmp)``, and check the
    file through Keras: every weight is poisoned, ``model.load_weights(tmp)`` is called, and each
    weight must then equal its source value (rearranged by its layout fit, cast to the weight's
    float dtype), bit for bit; each weight ``left_at_init`` must equal the value it held before.

    Args:
        ckpt: The source checkpoint.
        tmp: The ``.weights.h5`` path to write (a temporary name).
        model: A built Keras 3 model.
        plan: ``(model weight, source variable, fit or None)`` for every weight that receives a
            source value (every weight of the model, unless ``left_at_init`` names the others).
        progress: Called after each weight.
        left_at_init: The weights that keep their initial values (``--no-strict``).

    Returns:
        How many weights were checked (those given a source value).

    Raises:
        VerificationError: A weight read back differs from its source value (or from its
            initial value).
    """
    from ..model.assign import expected_value  # noqa: PLC0415 - assign imports the model side (targets)

    verifier = Verifier(progress, len(plan))
    read = _value_reader(ckpt)
    exact = True
    for w, v, layout_fit in plan:
        value = apply_fit(read(v), layout_fit)
        dtype = np.dtype(w.dtype).name
        if (layout_fit is not None and not layout_fit.identity) or str(value.dtype) != dtype:
            exact = False
        w.assign(expected_value(np.asarray(value), dtype))
        verifier.record(v.key, v)
        del value
    initial = [np.array(w.numpy()) for w in left_at_init]
    model.save_weights(tmp)
    # Read back through Keras: poison every weight, load the file, compare with the source.
    weights = [w for w, _, _ in plan] + list(left_at_init)
    for w in weights:
        w.assign(_sentinel(np.asarray(w.numpy())))
    model.load_weights(tmp)
    for w, value in zip(left_at_init, initial):
        if not bit_equal(np.asarray(w.numpy()), value):
            raise VerificationError(f"{tmp}: read-back check failed: {getattr(w, 'path', w.name)!r} (left at init) differs from the "
                                    "model's initial value; nothing was written")
    values = {v.key: w for w, v, _ in plan}
    fits = {v.key: f for _, v, f in plan}
    if exact:
        matches = source_matcher(ckpt)
    else:
        def matches(value: Any, v: m.Variable) -> bool:
            value = np.asarray(value)
            return bit_equal(value, expected_value(np.asarray(apply_fit(ckpt.read(v), fits[v.key])), str(value.dtype)))
    return verifier.check(tmp, values, lambda k: np.asarray(values[k].numpy()), matches)


def call_builder(builder: Builder) -> Any:
    """The built Keras model ``builder()`` returns (TensorFlow, where it is installed, imported
    quietly first; a Keras 3 model of any backend is built without it).

    Raises:
        UsageError: The builder failed, or did not return a built Keras model.
        MissingDependencyError: The builder imports TensorFlow, which is not installed.
    """
    optional_tf()  # quietly, before the builder touches TensorFlow
    try:
        model = builder()
    except CkptError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's builder failed
        spec = getattr(builder, "spec", None)  # as the command line named it
        missing = missing_tensorflow(e, f"--builder {spec}" if spec else "the --builder model")
        if missing is not None:
            raise missing from None
        raise UsageError(f"the builder failed: {type(e).__name__}: {e}") from None
    if not hasattr(model, "save_weights") or not hasattr(model, "weights"):
        raise UsageError(f"the builder returned {type(model).__name__}, not a Keras model")
    if not model.weights:
        raise UsageError("the builder returned a model without weights; build it (call it on an input or model.build(shape))")
    return model
