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
as it is. Only the whole ``optimizer_weights`` group can be dropped. Casting Keras files is not
supported yet.
"""

from __future__ import annotations

import os

import numpy as np

from ... import _atomic
from ... import model as m
from ...errors import UsageError, VerificationError
from ...formats import open_checkpoint
from ..bit_equality import bit_equal

__all__ = ["rewrite_keras"]


def rewrite_keras(ckpt: m.Checkpoint, out: str, plans: list, force: bool, protected: list[str]):
    """Write the rewritten Keras HDF5 file (see the module docstring).

    Returns:
        (files, output format, copied bytes, notes, None).

    Raises:
        UsageError: What this format cannot do (a rename of a position, part of a group
            dropped, a cast).
        VerificationError: The output does not read back as planned.
    """
    from ...formats import (  # noqa: PLC0415 - the Keras writer (h5py) once the rewrite is possible
        KERAS_LEGACY_OPTIMIZER_GROUP,
        KERAS_OPTIMIZER_GROUP,
        copy_h5,
        legacy_h5_renames,
        weights_h5_renames,
    )

    if any(p.new_dtype != p.var.dtype for p in plans):
        raise UsageError(f"{ckpt.path}: --cast of Keras files is not supported yet")
    if _atomic.output_kind_for(out) != _atomic.KIND_HDF5:
        raise UsageError(f"{out}: a Keras HDF5 source is rewritten to an HDF5 file (.weights.h5 / .h5)")
    legacy = ckpt.format == m.FORMAT_KERAS_H5
    drop_group = KERAS_LEGACY_OPTIMIZER_GROUP if legacy else KERAS_OPTIMIZER_GROUP
    dropped_keys = {p.var.key for p in plans if p.dropped}
    in_optimizer = {p.var.key for p in plans if p.var.key.startswith(drop_group + "/")}
    if dropped_keys and dropped_keys != in_optimizer:
        raise UsageError(f"{ckpt.path}: a Keras HDF5 file loads by position: only the whole {drop_group} group"
                         " can be dropped (--role model, or --drop matching every optimizer variable)")
    renames = [(p.var.name, p.var.key, p.new_name) for p in plans]
    src_h5 = ckpt.source.open_hdf5()
    try:
        has_config = "model_config" in src_h5.attrs
        if legacy:
            edit = legacy_h5_renames(ckpt.path, src_h5, renames)
        else:
            edit = weights_h5_renames(ckpt.path, renames)
        with _atomic.atomic_file(out, force=force, kind=_atomic.KIND_HDF5, protected=protected) as tmp:
            copy_h5(src_h5, tmp, drop=drop_group if dropped_keys else None, edit=edit)
            _check(ckpt, tmp, plans)
    finally:
        src_h5.close()
    notes = ["load with model.load_weights(OUT) into the model with the renamed layers"]
    if legacy and has_config:
        notes.append("model_config keeps the layer names it had: rebuild the model in code and load the weights")
    return (out,), ckpt.format, 0, notes, None


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
            if not bit_equal(np.asarray(written.read(w)), np.asarray(ckpt.read(p.var))):
                raise VerificationError(f"{tmp}: read-back check failed: {p.new_name!r} differs; nothing was written")
    if not os.path.getsize(tmp):  # pragma: no cover
        raise VerificationError(f"{tmp}: empty output")
