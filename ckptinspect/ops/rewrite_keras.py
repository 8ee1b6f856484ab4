"""``rewrite`` of Keras 3 ``.weights.h5`` files (h5py; imported only for them).

Keras 3 loads ``.weights.h5`` by position: datasets are ``<object path>/vars/<i>``, where the
object path is built from the model's structure (``layers/dense_1``), not from layer names;
the layer's name is the ``name`` attribute of its ``vars`` group, which is what ``ls`` shows
(``head/vars/0``). So a rename changes that attribute (every weight of the group must agree);
the groups stay where ``model.load_weights`` looks for them. Dropping is possible for the whole
``optimizer`` group only (a model loads without it). Casting and legacy ``.h5`` files are not
supported yet.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .. import _atomic
from .. import model as m
from ..errors import UsageError, VerificationError
from ..formats import open_checkpoint
from .compare import bit_equal

__all__ = ["rewrite_keras"]

VARS = "/vars/"
OPTIMIZER_GROUP = "optimizer"


def _split(name: str) -> tuple[str, str] | None:
    """``head/vars/0`` -> (``head``, ``/vars/0``)."""
    pos = name.rfind(VARS)
    return (name[:pos], name[pos:]) if pos > 0 else None


def _copy_attrs(src: Any, dst: Any) -> None:
    for name in src.attrs:
        dst.attrs.create(name, src.attrs[name], dtype=src.attrs.get_id(name).dtype)


def rewrite_keras(ckpt: m.Checkpoint, out: str, plans: list, force: bool, protected: list[str]):
    """Write the rewritten ``.weights.h5`` (see the module docstring).

    Returns:
        (files, output format, copied bytes, notes, None).

    Raises:
        UsageError: What this format cannot do (a rename that is not a layer name, part of a
            group dropped, a cast, a legacy ``.h5`` source).
        VerificationError: The output does not read back as planned.
    """
    import h5py  # noqa: PLC0415

    if ckpt.format != m.FORMAT_KERAS_WEIGHTS_H5:
        raise UsageError(f"{ckpt.path}: rewrite of legacy Keras .h5 files is not supported yet; "
                         "save the model with model.save_weights('x.weights.h5') and rewrite that")
    if any(p.new_dtype != p.var.dtype for p in plans):
        raise UsageError(f"{ckpt.path}: --cast of Keras files is not supported yet")
    if _atomic.output_kind_for(out) != _atomic.KIND_HDF5:
        raise UsageError(f"{out}: a .weights.h5 source is rewritten to a .weights.h5 file")
    # Renames: the vars group's name attribute.
    names: dict[str, str] = {}  # vars group -> new name attribute
    for p in plans:
        if p.new_name == p.var.name:
            continue
        old, new, key = _split(p.var.name), _split(p.new_name), _split(p.var.key)
        if old is None or new is None or key is None or old[1] != new[1] or old[1] != key[1]:
            raise UsageError(
                f"{ckpt.path}: {p.var.name!r} -> {p.new_name!r}: a Keras 3 .weights.h5 loads by position, so a"
                " rename may change the layer name only (the part before /vars/N)"
            )
        group = key[0] + VARS.rstrip("/")
        if names.setdefault(group, new[0]) != new[0]:
            raise UsageError(f"{ckpt.path}: the weights of one layer ({group}) would get different names")
    dropped_keys = {p.var.key for p in plans if p.dropped}
    in_optimizer = {p.var.key for p in plans if p.var.key.startswith(OPTIMIZER_GROUP + "/")}
    if dropped_keys and dropped_keys != in_optimizer:
        raise UsageError(f"{ckpt.path}: a Keras 3 .weights.h5 loads by position: only the whole optimizer group"
                         " can be dropped (--role model, or --drop matching every optimizer variable)")

    src_h5 = ckpt.source.open_hdf5()
    try:
        with _atomic.atomic_file(out, force=force, kind=_atomic.KIND_HDF5, protected=protected) as tmp:
            with h5py.File(tmp, "w") as dst:
                _copy_attrs(src_h5, dst)
                for name in src_h5:
                    if name == OPTIMIZER_GROUP and dropped_keys:
                        continue
                    src_h5.copy(src_h5[name], dst, name=name, without_attrs=False)
                for group, new in names.items():
                    if group not in dst:
                        raise VerificationError(f"{tmp}: group {group!r} was not copied")
                    dst[group].attrs["name"] = new
            _check(ckpt, tmp, plans)
    finally:
        src_h5.close()
    notes = ["Keras 3 weights: load with model.load_weights(OUT) into the model with the renamed layers"]
    return (out,), m.FORMAT_KERAS_WEIGHTS_H5, 0, notes, None


def _check(ckpt: m.Checkpoint, tmp: str, plans: list) -> None:
    kept = [p for p in plans if not p.dropped]
    for p in kept:
        p.new_key = p.var.key
    with open_checkpoint(tmp) as written:
        got = {v.key: v for v in written.variables}
        if set(got) != {p.new_key for p in kept}:
            raise VerificationError(f"{tmp}: read-back check failed: the datasets differ from the plan; nothing was written")
        for p in kept:
            w = got[p.new_key]
            if w.name != p.new_name:
                raise VerificationError(f"{tmp}: read-back check failed: {p.new_key!r} reads back as {w.name!r},"
                                        f" expected {p.new_name!r}; nothing was written")
            if not bit_equal(np.asarray(written.read(w)), np.asarray(ckpt.read(p.var))):
                raise VerificationError(f"{tmp}: read-back check failed: {p.new_key!r} differs; nothing was written")
    if not os.path.getsize(tmp):  # pragma: no cover
        raise VerificationError(f"{tmp}: empty output")
