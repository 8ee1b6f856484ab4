"""``rewrite`` of Keras HDF5 files: Keras 3 ``.weights.h5`` and legacy ``.h5``: what is
rewritten (renames, the optimizer's group dropped) and the read-back; the files are written by
the Keras family (``formats/keras/write.py``: ``copy_h5`` with the layout's rename edit).

Keras 3 loads ``.weights.h5`` by position: datasets are ``<object path>/vars/<i>``, where the
object path is built from the model's structure (``layers/dense_1``), not from layer names;
the layer's name is the ``name`` attribute of its ``vars`` group, which is what ``ls`` shows
(``head/vars/0``). So a rename changes that attribute (every weight of the group must agree);
the groups stay where ``model.load_weights`` looks for them. Dropping is possible for the whole
``optimizer`` group only (a model loads without it).

Legacy ``.h5`` files (Keras 2, or Keras 3's legacy writer) store each layer's weights under
``[model_weights/]<layer>/<weight name>``, listed in the layer group's ``weight_names``
attribute, and the layers in ``layer_names``: a rename moves the datasets and rewrites those
lists; a layer whose weights all move from ``<layer>/...`` to ``<new>/...`` has its group
renamed too (``load_weights(by_name=True)`` finds it by its new name). ``model_config`` is left
as it is. Only the whole ``optimizer_weights`` group can be dropped.

A cast writes the cast datasets with their new values (the others are copied), as Keras stores
the dtype: bfloat16 as Keras 3 writes it (opaque 2-byte values with a ``dtype="bfloat16"``
attribute). ``model.load_weights`` converts each value to its variable's dtype, so any model
loads the file; legacy ``.h5`` files are not cast to bfloat16, which Keras' legacy loaders (tf_keras
and Keras 3's ``legacy_h5_format``) cannot read back, not even from their own files.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from ... import _atomic
from ... import model as m
from ...errors import UsageError, VerificationError
from ...formats import open_checkpoint
from ..bit_equality import bit_equal

__all__ = ["rewrite_keras"]

BFLOAT16 = "bfloat16"
HALF_TYPES = ("float16", "bfloat16")


def rewrite_keras(ckpt: m.Checkpoint, out: str, plans: list, force: bool, protected: list[str]):
    """Write the rewritten Keras HDF5 file (see the module docstring).

    Returns:
        (files, output format, copied bytes, notes, None).

    Raises:
        UsageError: What this format cannot do (a rename of a position, part of a group
            dropped, a legacy file cast to bfloat16).
        VerificationError: The output does not read back as planned.
    """
    from ...formats import (  # noqa: PLC0415 - the Keras writer (h5py) once the rewrite is possible
        KERAS_LEGACY_OPTIMIZER_GROUP,
        KERAS_OPTIMIZER_GROUP,
        copy_h5,
        legacy_h5_renames,
        weights_h5_renames,
    )

    if _atomic.output_kind_for(out) != _atomic.KIND_HDF5:
        raise UsageError(f"{out}: a Keras HDF5 source is rewritten to an HDF5 file (.weights.h5 / .h5)")
    legacy = ckpt.format == m.FORMAT_KERAS_H5
    cast = {p.var.key: p for p in plans if p.new_dtype != p.var.dtype and not p.dropped}
    drop_group = KERAS_LEGACY_OPTIMIZER_GROUP if legacy else KERAS_OPTIMIZER_GROUP
    dropped_keys = {p.var.key for p in plans if p.dropped}
    in_optimizer = {p.var.key for p in plans if p.var.key.startswith(drop_group + "/")}
    if dropped_keys and dropped_keys != in_optimizer:
        raise UsageError(f"{ckpt.path}: a Keras HDF5 file loads by position: only the whole {drop_group} group"
                         " can be dropped (--role model, or --drop matching every optimizer variable)")
    if legacy and any(p.new_dtype == BFLOAT16 for p in cast.values()):
        raise UsageError(f"{ckpt.path}: --cast bfloat16 of a legacy .h5 file is refused: Keras' legacy HDF5 loaders"
                         " (tf_keras, Keras 3's legacy_h5_format) cannot read bfloat16 values back, not even from their"
                         " own files; cast to float16, or write a .safetensors file")
    renames = [(p.var.name, p.var.key, p.new_name) for p in plans]
    src_h5 = ckpt.source.open_hdf5()
    try:
        has_config = "model_config" in src_h5.attrs
        if legacy:
            edit = legacy_h5_renames(ckpt.path, src_h5, renames)
        else:
            edit = weights_h5_renames(ckpt.path, renames)
        values = {key: _cast_value(ckpt, p) for key, p in cast.items()}
        with _atomic.atomic_file(out, force=force, kind=_atomic.KIND_HDF5, protected=protected) as tmp:
            copy_h5(src_h5, tmp, drop=drop_group if dropped_keys else None, edit=edit, values=values)
            _check(ckpt, tmp, plans)
    finally:
        src_h5.close()
    notes = ["load with model.load_weights(OUT)" + (" into the model with the renamed layers"
                                                     if any(p.new_name != p.var.name for p in plans) else "")]
    if legacy and has_config:
        notes.append("model_config keeps the layer names it had: rebuild the model in code and load the weights")
    if cast:
        notes.append(_cast_note(sorted({p.new_dtype for p in cast.values()})[0]))
    return (out,), ckpt.format, 0, notes, None


def rewrite_keras_zip(ckpt: m.Checkpoint, out: str, plans: list, force: bool, protected: list[str]):
    """Write the ``.keras`` archive ``out``: the source's members copied, its weights cast (the
    source's ``config.json`` as it was: ``keras.models.load_model`` builds the model with the dtype
    policy saved there and converts the values to it).

    Returns:
        (files, output format, copied bytes, notes, None).

    Raises:
        UsageError: A rename or drop (the archive's names come from its config: write a
            ``.weights.h5`` or ``.safetensors`` for those), or no cast.
        VerificationError: The output does not read back as planned.
    """
    from ...formats import copy_h5, copy_keras_zip  # noqa: PLC0415 - the Keras writer (h5py)

    if ckpt.format != m.FORMAT_KERAS_ZIP:
        raise UsageError(f"{out}: a .keras output is written from a .keras source; {ckpt.path} is {ckpt.format}")
    if any(p.dropped or p.new_name != p.var.name for p in plans):
        raise UsageError(f"{ckpt.path}: a .keras archive is rewritten with --cast only (its names come from its"
                         " config); for renames or drops write a .safetensors, or extract a .weights.h5 first")
    cast = {p.var.key: p for p in plans if p.new_dtype != p.var.dtype}
    if not cast:
        raise UsageError(f"{ckpt.path}: nothing to rewrite: a .keras archive is rewritten with --cast")
    values = {key: _cast_value(ckpt, p) for key, p in cast.items()}
    src_h5 = ckpt.source.open_hdf5()
    try:
        with _atomic.atomic_file(out, force=force, kind=_atomic.KIND_ZIP, protected=protected) as tmp:
            copy_keras_zip(ckpt.path, tmp, lambda weights: copy_h5(src_h5, weights, values=values))
            _check(ckpt, tmp, plans)
    finally:
        src_h5.close()
    dtype = sorted({p.new_dtype for p in cast.values()})[0]
    notes = [f"keras.models.load_model(OUT) builds the model with the dtype policy its config names (as the"
             f" source's) and converts the {dtype} values to it; or build the model and model.load_weights(OUT)",
             _cast_note(dtype)]
    return (out,), ckpt.format, 0, notes, None


def _cast_value(ckpt: m.Checkpoint, plan: Any) -> Callable[[], np.ndarray]:
    """The cast value of one variable, read when it is written (one value in memory at a time)."""
    def value() -> np.ndarray:
        with np.errstate(over="ignore", under="ignore"):  # counted and refused by the operation
            return np.asarray(ckpt.read(plan.var)).astype(m.numpy_dtype(plan.new_dtype))

    return value


def _cast_note(dtype: str) -> str:
    """Which dtype policy a model needs for the cast weights (checked with Keras 3 and tf_keras:
    ``load_weights`` converts each value to its variable's dtype)."""
    if dtype in HALF_TYPES:
        return (f"model.load_weights converts the {dtype} values to the model's variable dtype: a float32 or"
                f" mixed_{dtype} model holds them as float32 (rounded to {dtype}); build it under"
                f" keras.mixed_precision.set_global_policy('{dtype}') to keep them {dtype}")
    return f"model.load_weights converts the {dtype} values to the model's variable dtype"


def _check(ckpt: m.Checkpoint, tmp: str, plans: list) -> None:
    kept = [p for p in plans if not p.dropped]
    with open_checkpoint(tmp) as written:
        got = {v.name: v for v in written.variables}
        expected = {p.new_name for p in kept}
        if set(got) != expected:
            what = sorted(expected ^ set(got))[0]
            raise VerificationError(f"{tmp}: read-back check failed: {what!r} is not where planned; nothing was written")
        for p in kept:
            w = got[p.new_name]
            p.new_key = w.key
            expected = np.asarray(ckpt.read(p.var))
            if p.new_dtype != p.var.dtype:
                expected = _cast_value(ckpt, p)()
            if w.dtype != p.new_dtype or not bit_equal(np.asarray(written.read(w)), expected):
                raise VerificationError(f"{tmp}: read-back check failed: {p.new_name!r} differs; nothing was written")
    if not os.path.getsize(tmp):  # pragma: no cover
        raise VerificationError(f"{tmp}: empty output")
