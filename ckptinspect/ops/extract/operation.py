"""``extract``: the model's weights alone, optimizer state stripped, still restorable.

Which variables are the model's is decided by the reader's roles (:attr:`Variable.role`: the
object graph for TF2 checkpoints, names for TF1, groups for Keras files), never by key
prefixes: a Keras 3 model saved with ``tf.train.Checkpoint(model=..., optimizer=...)`` has its
weights keyed ``optimizer/_trainable_variables/N/...``, and they are the model's.

Output formats (chosen from the output's suffix unless ``format`` says otherwise):

* ``tf`` (any other suffix): a TF bundle written by ckptinspect's own writer without
  TensorFlow (see :mod:`.extract_tf`: tensors copied byte for byte from bundle sources). From a TF2
  object-based source, a TF2 checkpoint whose object graph is the source's minus the
  optimizer and the root's counters, every value re-keyed by its path through the model
  (``model/<path>/.ATTRIBUTES/VARIABLE_VALUE``), so ``tf.train.Checkpoint(model=fresh_model)
  .read(OUT).assert_consumed()`` passes. From a TF1 name-based source, a name-based bundle
  with the same keys minus the optimizer's slots. A SavedModel source gives a checkpoint of
  its variables with the SavedModel's root as root. A ``.safetensors`` that ``extract`` wrote
  from a TF2 checkpoint gives that TF2 checkpoint back (its ``__metadata__`` carries the object
  graph and keys); any other source gives a name-based bundle keyed by the variables' names.
* ``weights-h5`` (``.weights.h5``): a Keras 3 weights file. Its positional layout is defined by
  the model's Python structure, which a TF checkpoint does not record, so from a TF2
  checkpoint it needs ``builder`` (a function building the same architecture): every weight of
  the built model is matched to the checkpoint by its object-graph path, assigned, and Keras
  writes the file. From a ``.keras`` / ``.weights.h5`` source it is copied group by group
  without the ``optimizer`` group (no builder needed). ``strict=False`` (``--no-strict``, as
  ``transplant`` and ``doctor`` take it) writes what ``transplant --no-strict`` would: unused
  source variables left out, weights without a value that fits at the builder model's initial
  values (:attr:`ExtractReport.left_at_init`; the CLI exits 1 after writing).
* ``h5`` (``.h5`` / ``.hdf5``, legacy Keras source only): the file copied group by group (the
  Keras family's writer), without ``optimizer_weights``; ``model_config`` and the other root attributes kept.
* ``npz`` (``.npz``): numpy's ``savez`` layout, one ``<readable name>.npy`` per model variable,
  written one array at a time.
* ``safetensors`` (``.safetensors``): one tensor per model variable, named by its readable name
  (for a ``torch.save`` training dict, its state_dict key: ``model_state_dict/`` dropped), with
  ``__metadata__`` ``{source, step, format: pt}``; from any readable source.

The source is never modified. The output is written under a temporary name in its directory,
read back and compared tensor by tensor, bit for bit, with the source (an unsliced tensor
against its stored bytes in the source's data file, chunk by chunk, so one tensor is in memory),
and only then renamed into place.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, Sequence


from ... import _atomic
from ... import model as m
from ...errors import CorruptCheckpointError, UsageError
from ...formats import (
    capabilities,
    TO_H5,
    TO_KERAS,
    TO_NPZ,
    TO_SAFETENSORS,
    TO_TF,
    TO_WEIGHTS_H5,
    output_kind,
    open_checkpoint,
)
from ..model.builder import load_builder
from ..match.layouts import CONV_HWIO
from ..match.mapping import RulesLike
from ..model.plan import PairingOptions
from ..roles import mark_optimizer, optimizer_regex
from ..sources import files_size, source_files
from .report import ExtractedVariable, ExtractReport
from .to_tf import tf_metadata, write_tf
from .writers import (
    write_h5_copy,
    write_npz,
    write_safetensors_output,
)

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

FORMAT_TF = TO_TF
FORMAT_WEIGHTS_H5 = TO_WEIGHTS_H5
FORMAT_H5 = TO_H5
FORMAT_NPZ = TO_NPZ
FORMAT_SAFETENSORS = TO_SAFETENSORS
OUTPUT_FORMATS = (FORMAT_TF, FORMAT_WEIGHTS_H5, FORMAT_H5, FORMAT_NPZ, FORMAT_SAFETENSORS)  # what extract writes

KEEPABLE_ROLES = (m.ROLE_MODEL, m.ROLE_METADATA)
# The pairing flags (doctor's and transplant's too), for the messages that name them.
PAIRING_FLAGS = ("--map", "--by-order", "--transpose-dense", "--conv-layout", "--allow-reshape", "--no-strict")
KERAS3_SOURCE_FORMATS = (m.FORMAT_KERAS_WEIGHTS_H5, m.FORMAT_KERAS_ZIP)

Progress = Callable[[int, int, m.Variable], None]
Builder = Callable[[], Any]


def output_format_for(out: str, format: str | None = None) -> str:  # noqa: A002
    """The output format: ``format`` if given, else from ``out``'s suffix.

    ``.weights.h5`` -> weights-h5, ``.npz`` -> npz, ``.safetensors`` -> safetensors,
    ``.h5``/``.hdf5`` -> h5 (legacy Keras sources), no suffix (``out/model``, ``ckpt-5``) or a TF prefix's (``model.ckpt``,
    ``model.ckpt-100``) -> a TF prefix.

    Raises:
        UsageError: Unknown format, a ``.keras`` output, or any other suffix (``.pt`` would
            silently become ``out.pt.index``) without ``format``.
    """
    kind = output_kind(out, format)
    if kind == TO_KERAS:
        raise UsageError(
            f"{out}: extract does not write .keras archives (they hold the model config and "
            "optimizer); use a .weights.h5, .npz or TF prefix output"
        )
    if kind is not None:
        return kind
    error = _atomic.prefix_suffix_error(
        out, "extract writes a TF prefix (no suffix, .ckpt or .ckpt-N), .weights.h5, .h5/.hdf5, .npz or .safetensors",
        "pass --to tf, weights-h5, h5, npz or safetensors (format=...) to write one under this name")
    if error is not None:
        raise error
    return FORMAT_TF


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


# -- the operation -------------------------------------------------------------------------
def extract(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    format: str | None = None,  # noqa: A002 - the CLI's --to
    force: bool = False,
    keep: Sequence[str] = (m.ROLE_MODEL,),
    builder: Builder | str | None = None,
    max_shard_bytes: int | None = None,
    progress: Progress | None = None,
    optimizer_pattern: str | None = None,
    mapping: RulesLike = None,
    transpose_dense: bool = False,
    conv_layout: str = CONV_HWIO,
    by_order: bool = False,
    allow_reshape: bool = False,
    strict: bool = True,
) -> ExtractReport:
    """Write the model's weights of ``src`` to ``out``, optimizer state stripped.

    Args:
        src: Any checkpoint :func:`ckptinspect.open` accepts.
        out: The output: a TF prefix, or a ``.weights.h5`` / ``.h5`` / ``.npz`` / ``.safetensors`` file.
        format: ``tf``, ``weights-h5``, ``h5``, ``npz`` or ``safetensors``; default from ``out``'s suffix.
        force: Replace an existing output.
        keep: Roles to keep: ``model`` (always) and optionally ``metadata`` (step counters,
            ``save_counter``, TF1 ``global_step``). Optimizer state is never kept.
        builder: For a ``.weights.h5`` output from a TF2 checkpoint: a function (or
            ``"module:function"``) returning the built Keras 3 model of the same architecture.
        max_shard_bytes: TF output: bytes per data shard, filled in turn (a bigger tensor gets
            its own shard). Default: one data file; 0 puts every tensor (or slice) in its own.
            Memory does not depend on it: tensors are copied or streamed.
        progress: Called as ``progress(done, total, variable)`` for each kept tensor (TF output:
            as it is planned, before the data is copied in one pass).
        optimizer_pattern: Regex of names (or keys) that are optimizer state although no rule
            knows them (see :func:`ckptinspect.ops.roles.mark_optimizer`): they are stripped too.
        mapping: ``.weights.h5`` through ``builder``: ``--map`` rules for the source's names
            (docs/INTERFACE.md, "Pairing variables"). The pairing options are ``doctor``'s and
            ``transplant``'s, with the same defaults (:mod:`ckptinspect.ops.model.plan`).
        transpose_dense: Likewise: the source's 2-D kernels are ``[out, in]`` (PyTorch ``Linear``).
        conv_layout: Likewise: ``oihw`` when the source's conv kernels are ``[out, in, *spatial]``.
        by_order: Likewise: also pair layers nothing else paired by layer order and shape.
        allow_reshape: Likewise: a source value with as many elements as the weight is reshaped.
        strict: Likewise (``--strict``, default): any problem refuses the output, unused source
            variables included. False (``--no-strict``): unused source variables are left out
            and weights without a value that fits keep the builder model's initial values
            (named in :attr:`ExtractReport.left_at_init`); refused when no weight receives a value.

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
    options = PairingOptions.make(mapping, by_order=by_order, transpose_dense=transpose_dense,
                                  conv_layout=conv_layout, allow_reshape=allow_reshape, strict=strict)
    if (options.names_decide or not options.strict) and fmt != FORMAT_WEIGHTS_H5:
        raise UsageError(f"{', '.join(PAIRING_FLAGS)} apply to a .weights.h5 output (with --builder)")
    if isinstance(builder, str):
        builder = load_builder(builder)
    optimizer_regex(optimizer_pattern)

    ckpt = open_checkpoint(src)
    try:
        ckpt = mark_optimizer(ckpt, optimizer_pattern)
        _check_source(ckpt, keep, fmt)
        protected = [src, ckpt.path, *source_files(ckpt)]
        source_bytes = files_size(source_files(ckpt))
        if fmt == FORMAT_TF:
            written = _write_prefix(ckpt, out, keep, max_shard_bytes, force, protected, progress)
        else:
            kind = {FORMAT_NPZ: _atomic.KIND_NPZ, FORMAT_SAFETENSORS: _atomic.KIND_SAFETENSORS}.get(fmt, _atomic.KIND_HDF5)
            with _atomic.atomic_file(out, force=force, kind=kind, protected=protected) as tmp:
                planned, verified, notes, left = _write_file(fmt, ckpt, tmp, out, keep, builder, options, progress)
                written = _Written(planned, verified, notes, [out], os.path.getsize(tmp), left_at_init=left)
    finally:
        ckpt.close()
    return ExtractReport(
        source=ckpt.path,
        source_format=ckpt.format,
        output=out,
        output_format=fmt,
        files=tuple(written.files),
        variables=tuple(written.planned),
        source_file_bytes=source_bytes,
        output_file_bytes=written.out_bytes,
        verified=written.verified,
        num_shards=written.num_shards,
        seconds=time.perf_counter() - start,
        object_graph=written.object_graph,
        notes=tuple(written.notes),
        copied=written.copied,
        copied_bytes=written.copied_bytes,
        left_at_init=tuple(written.left_at_init),
    )


@dataclasses.dataclass
class _Written:
    """What writing the output gave, for the report."""

    planned: list
    verified: int
    notes: list[str]
    files: list[str]
    out_bytes: int
    num_shards: int = 1
    object_graph: Any = None
    copied: int = 0
    copied_bytes: int = 0
    left_at_init: list[str] = dataclasses.field(default_factory=list)


def _check_source(ckpt: m.Checkpoint, keep: tuple[str, ...], fmt: str) -> None:
    """Refuse a source the output cannot be made from: unreadable kept values, names an npz or
    safetensors file cannot hold, no model variable at all."""
    _refuse_unreadable(ckpt, keep)
    if fmt in (FORMAT_NPZ, FORMAT_SAFETENSORS):
        _require_text_names(ckpt, keep, fmt)
    if not any(v.role == m.ROLE_MODEL for v in ckpt.variables):
        raise UsageError(f"{ckpt.path}: no model variables to extract (roles: {_role_summary(ckpt)})")


def _write_prefix(ckpt: m.Checkpoint, out: str, keep: tuple[str, ...], max_shard_bytes: int | None, force: bool,
                  protected: list[str], progress: Progress | None) -> _Written:
    """A TF prefix, written under a temporary prefix and renamed into place."""
    with _atomic.atomic_prefix(out, force=force, protected=protected) as tmp:
        w = write_tf(ckpt, tmp, keep, max_shard_bytes, progress)
        files = [out + p[len(tmp):] for p in _atomic.prefix_files(tmp)]
        return _Written(w.planned, w.verified, w.notes, files, files_size(_atomic.prefix_files(tmp)), w.num_shards,
                        w.object_graph, w.copied, w.copied_bytes)


def _write_file(fmt: str, ckpt: m.Checkpoint, tmp: str, out: str, keep: tuple[str, ...], builder: Builder | None,
                options: PairingOptions, progress: Progress | None) -> tuple[list, int, list[str], list[str]]:
    """A one-file output (npz, safetensors, legacy .h5, .weights.h5) written to ``tmp``:
    (the planned variables, how many were verified, notes, the model weights left at init)."""
    if fmt == FORMAT_NPZ:
        return (*write_npz(ckpt, tmp, keep, progress), [])
    if fmt == FORMAT_SAFETENSORS:
        return (*write_safetensors_output(ckpt, tmp, keep, progress, lambda names: tf_metadata(ckpt, keep, names)), [])
    if fmt == FORMAT_H5:
        if ckpt.format != m.FORMAT_KERAS_H5:
            raise UsageError(
                f"{ckpt.path}: a legacy .h5 output needs a legacy Keras .h5 source (this is "
                f"{ckpt.format}); use a TF prefix, .weights.h5 or .npz output"
            )
        from ...formats import KERAS_LEGACY_OPTIMIZER_GROUP  # noqa: PLC0415 - h5py for HDF5 outputs only

        planned, verified = write_h5_copy(ckpt, tmp, KERAS_LEGACY_OPTIMIZER_GROUP, ckpt.source.open_hdf5, progress)
        return planned, verified, ["legacy Keras .h5 without optimizer_weights; model_config and training_config kept"], []
    return _write_weights_h5(ckpt, tmp, out, builder, options, progress)


def _write_weights_h5(ckpt: m.Checkpoint, tmp: str, out: str, builder: Builder | None, options: PairingOptions,
                      progress: Progress | None) -> tuple[list, int, list[str], list[str]]:
    """A ``.weights.h5``: a Keras 3 source copied without its optimizer; anything else through
    the built model, paired by the one plan doctor and transplant use."""
    if ckpt.format in KERAS3_SOURCE_FORMATS:
        if options.names_decide or not options.strict:
            raise UsageError(f"{ckpt.path}: a Keras 3 source is copied as it is: {', '.join(PAIRING_FLAGS)} do not apply")
        from ...formats import KERAS_OPTIMIZER_GROUP  # noqa: PLC0415 - h5py for HDF5 outputs only

        planned, verified = write_h5_copy(ckpt, tmp, KERAS_OPTIMIZER_GROUP, ckpt.source.open_hdf5, progress)
        return planned, verified, ["Keras 3 weights without the optimizer group: load with model.load_weights(OUT)"], []
    if builder is None:
        why = ("Keras 3's positional layout comes from the model's structure" if "tf-restorable" in capabilities(ckpt.format)
               else "the Keras model its values go into")
        raise UsageError(f"{ckpt.path}: a .weights.h5 output from the {ckpt.format} source needs --builder "
                         f"module:function ({why})")
    from .convert import write_weights_by_names  # noqa: PLC0415 - TF, Keras

    return write_weights_by_names(ckpt, tmp, out, builder, options, progress)


def _refuse_unreadable(ckpt: m.Checkpoint, keep: Sequence[str]) -> None:
    """Fail before anything is read or written when a kept variable cannot be read (the
    format names such entries in ``info["unreadable"]``: TensorFlow would abort or misread)."""
    unreadable = ckpt.info.get("unreadable") or {}
    for v in ckpt.variables:
        if v.role in keep and v.key in unreadable:
            name, key = m.display_name(v.name), m.display_name(v.key)
            label = f"'{name}'" if name == key else f"'{name}' (key '{key}')"
            raise CorruptCheckpointError(
                f"{ckpt.path}: cannot read {label}: {unreadable[v.key]} (`ckptinspect verify` reports it)"
            )


def _require_text_names(ckpt: m.Checkpoint, keep: Sequence[str], fmt: str) -> None:
    """``.npz`` member names and ``.safetensors`` header keys are text: a name holding bytes
    that are not UTF-8 (a raw TF key, kept as surrogate escapes) cannot be written there."""
    for v in ckpt.variables:
        if v.role in keep:
            try:
                v.name.encode("utf-8")
            except UnicodeEncodeError:
                raise UsageError(
                    f"{ckpt.path}: '{m.display_name(v.name)}' is not valid UTF-8 (its key holds raw bytes), and a"
                    f" .{fmt} output names its tensors with text; write a TF checkpoint instead"
                ) from None


def _role_summary(ckpt: m.Checkpoint) -> str:
    t = ckpt.totals()
    return ", ".join(f"{r} {t[r]['count']}" for r in m.ROLES)

