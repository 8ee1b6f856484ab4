"""``rewrite`` of Keras HDF5 files: Keras 3 ``.weights.h5`` and legacy ``.h5`` (h5py; imported
only for them).

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
import re
from typing import Any

import numpy as np

from ... import _atomic
from ... import model as m
from ...errors import UsageError, VerificationError
from ...formats import copy_h5_attrs, open_checkpoint
from ..bit_equality import bit_equal

__all__ = ["rewrite_keras"]

VARS = "/vars/"
OPTIMIZER_GROUP = "optimizer"
LEGACY_OPTIMIZER_GROUP = "optimizer_weights"
WEIGHT_NAMES = "weight_names"
LAYER_NAMES = "layer_names"
WEIGHT_SUFFIX_RE = re.compile(r":\d+$")


def _split(name: str) -> tuple[str, str] | None:
    """``head/vars/0`` -> (``head``, ``/vars/0``)."""
    pos = name.rfind(VARS)
    return (name[:pos], name[pos:]) if pos > 0 else None


def rewrite_keras(ckpt: m.Checkpoint, out: str, plans: list, force: bool, protected: list[str]):
    """Write the rewritten Keras HDF5 file (see the module docstring).

    Returns:
        (files, output format, copied bytes, notes, None).

    Raises:
        UsageError: What this format cannot do (a rename of a position, part of a group
            dropped, a cast).
        VerificationError: The output does not read back as planned.
    """
    import h5py  # noqa: PLC0415

    if any(p.new_dtype != p.var.dtype for p in plans):
        raise UsageError(f"{ckpt.path}: --cast of Keras files is not supported yet")
    if _atomic.output_kind_for(out) != _atomic.KIND_HDF5:
        raise UsageError(f"{out}: a Keras HDF5 source is rewritten to an HDF5 file (.weights.h5 / .h5)")
    legacy = ckpt.format == m.FORMAT_KERAS_H5
    drop_group = LEGACY_OPTIMIZER_GROUP if legacy else OPTIMIZER_GROUP
    dropped_keys = {p.var.key for p in plans if p.dropped}
    in_optimizer = {p.var.key for p in plans if p.var.key.startswith(drop_group + "/")}
    if dropped_keys and dropped_keys != in_optimizer:
        raise UsageError(f"{ckpt.path}: a Keras HDF5 file loads by position: only the whole {drop_group} group"
                         " can be dropped (--role model, or --drop matching every optimizer variable)")
    src_h5 = ckpt.source.open_hdf5()
    try:
        has_config = "model_config" in src_h5.attrs
        if legacy:
            edit = _legacy_edit(ckpt.path, src_h5, plans)
        else:
            edit = _weights_h5_edit(ckpt.path, plans)
        with _atomic.atomic_file(out, force=force, kind=_atomic.KIND_HDF5, protected=protected) as tmp:
            with h5py.File(tmp, "w") as dst:
                copy_h5_attrs(src_h5, dst)
                for name in src_h5:
                    if name == drop_group and dropped_keys:
                        continue
                    src_h5.copy(src_h5[name], dst, name=name, without_attrs=False)
                edit(dst)
            _check(ckpt, tmp, plans)
    finally:
        src_h5.close()
    notes = ["load with model.load_weights(OUT) into the model with the renamed layers"]
    if legacy and has_config:
        notes.append("model_config keeps the layer names it had: rebuild the model in code and load the weights")
    return (out,), ckpt.format, 0, notes, None


def _weights_h5_edit(path: str, plans: list):
    """Keras 3 ``.weights.h5``: renames change the ``name`` attribute of ``vars`` groups."""
    names: dict[str, str] = {}  # vars group -> new name attribute
    for p in plans:
        if p.new_name == p.var.name:
            continue
        old, new, key = _split(p.var.name), _split(p.new_name), _split(p.var.key)
        if old is None or new is None or key is None or old[1] != new[1] or old[1] != key[1]:
            raise UsageError(
                f"{path}: {p.var.name!r} -> {p.new_name!r}: a Keras 3 .weights.h5 loads by position, so a"
                " rename may change the layer name only (the part before /vars/N)"
            )
        group = key[0] + VARS.rstrip("/")
        if names.setdefault(group, new[0]) != new[0]:
            raise UsageError(f"{path}: the weights of one layer ({group}) would get different names")

    def apply(dst) -> None:
        for group, new in names.items():
            if group not in dst:
                raise VerificationError(f"{dst.filename}: group {group!r} was not copied")
            dst[group].attrs["name"] = new

    return apply


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


def _strings(values: Any) -> list[str]:
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]


def _encoded(names: list[str], like: Any) -> Any:
    if getattr(like, "dtype", None) is not None and like.dtype.kind == "S":
        return np.array([n.encode("utf-8") for n in names])
    return names


def _legacy_edit(path: str, h5: Any, plans: list):
    """Legacy ``.h5``: datasets and ``weight_names`` entries renamed; a layer group whose weights
    all move from ``<layer>/...`` to ``<new>/...`` is renamed too (with ``layer_names``)."""
    import h5py  # noqa: PLC0415

    where: dict[str, tuple[str, int]] = {}  # dataset key -> (group, index in weight_names)
    weight_names: dict[str, list[str]] = {}

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Group) and WEIGHT_NAMES in obj.attrs:
            names = _strings(obj.attrs[WEIGHT_NAMES])
            weight_names[name] = names
            for i, w in enumerate(names):
                where[f"{name}/{w}"] = (name, i)

    h5.visititems(visit)
    new_names = {g: list(ws) for g, ws in weight_names.items()}
    for p in plans:
        if p.new_name == p.var.name:
            continue
        if p.var.key not in where:
            raise UsageError(f"{path}: {p.var.name!r} is not listed in any weight_names attribute; cannot rename it")
        group, i = where[p.var.key]
        w = weight_names[group][i]
        base = WEIGHT_SUFFIX_RE.sub("", w)
        prefix = p.var.name[: len(p.var.name) - len(base)]
        if not p.var.name.endswith(base) or not p.new_name.startswith(prefix) or p.new_name == prefix:
            raise UsageError(f"{path}: {p.var.name!r} -> {p.new_name!r}: only the part stored as the weight's name"
                             f" ({base!r}) can be renamed")
        new_names[group][i] = p.new_name[len(prefix):] + w[len(base):]
    renamed_groups: dict[str, str] = {}
    for group, olds in weight_names.items():
        news = new_names[group]
        if olds == news or "/" in group.rsplit("/", 1)[-1]:
            continue
        parent, _, layer = group.rpartition("/")
        heads = {n.split("/", 1)[0] for n in news}
        if all(o.startswith(layer + "/") for o in olds) and all("/" in n for n in news) and len(heads) == 1:
            new_layer = heads.pop()
            if new_layer != layer:
                target = f"{parent}/{new_layer}" if parent else new_layer
                if target in h5:
                    raise UsageError(f"{path}: renaming layer {layer!r} to {new_layer!r} collides with the existing"
                                     f" group {target!r}")
                renamed_groups[group] = target

    def apply(dst: Any) -> None:
        for group, olds in weight_names.items():
            news = new_names[group]
            if group not in dst:  # a dropped group
                continue
            for old, new in zip(olds, news):
                if old != new:
                    target = f"{group}/{new}"
                    dst.require_group(target.rsplit("/", 1)[0])
                    dst.move(f"{group}/{old}", target)
                    _prune_empty(dst, f"{group}/{old}".rsplit("/", 1)[0], group)
            if olds != news:
                dst[group].attrs[WEIGHT_NAMES] = _encoded(news, h5[group].attrs[WEIGHT_NAMES])
        for group, target in renamed_groups.items():
            dst.move(group, target)
            holder = dst[group.rpartition("/")[0]] if "/" in group else dst
            if LAYER_NAMES in holder.attrs:
                old_layer, new_layer = group.rsplit("/", 1)[-1], target.rsplit("/", 1)[-1]
                names = [new_layer if n == old_layer else n for n in _strings(holder.attrs[LAYER_NAMES])]
                holder.attrs[LAYER_NAMES] = _encoded(names, holder.attrs[LAYER_NAMES])

    return apply


def _prune_empty(dst: Any, group: str, stop: str) -> None:
    """Remove ``group`` and its parents up to ``stop`` (excluded) while they are empty."""
    while group != stop and group.startswith(stop + "/") and group in dst and len(dst[group]) == 0:
        del dst[group]
        group = group.rsplit("/", 1)[0]
