"""``rewrite`` to a ``.safetensors`` file, from any source ckptinspect reads.

The renames, drops and casts :func:`~.rewrite.rewrite` planned are applied to the readable
names (a ``torch.save`` training dict's ``model_state_dict/`` prefix dropped, as ``extract``
names its safetensors output); ``__metadata__`` records the source, its step and
``format: pt``. Values are written one tensor at a time through ckptinspect's safetensors
writer, then read back through its reader and compared bit for bit with the source value
(cast as planned) before the file is renamed into place.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ... import _atomic
from ... import model as m
from ...errors import UsageError, VerificationError
from ...formats import open_checkpoint, safetensors_run_metadata, write_safetensors
from ..bit_equality import bit_equal

__all__ = ["rewrite_safetensors", "SAFETENSORS_SUFFIX"]

SAFETENSORS_SUFFIX = ".safetensors"
UNSTORABLE_DTYPES = ("complex128",)  # numeric, but safetensors has no code for it


def _output_name(ckpt: m.Checkpoint, new_name: str) -> str:
    prefix = ckpt.info.get("state_dict_prefix") or ""
    return new_name[len(prefix):] if prefix and new_name.startswith(prefix) else new_name


def _value(ckpt: m.Checkpoint, plan: Any) -> np.ndarray:
    value = np.asarray(ckpt.read(plan.var))
    if plan.new_dtype != plan.var.dtype:
        with np.errstate(over="ignore", under="ignore"):  # counted (and refused) by rewrite's _cast_losses
            value = value.astype(m.numpy_dtype(plan.new_dtype))
    return value


def rewrite_safetensors(
    ckpt: m.Checkpoint, out: str, plans: list, force: bool, protected: list[str]
) -> tuple[tuple[str, ...], str, int, list[str], None]:
    """Write the kept variables of ``plans`` (``rewrite``'s per-variable plan) to ``out``.

    Returns:
        ``(files, output format, bytes copied unchanged (0: every value is re-encoded), notes,
        object-graph info (None))``.

    Raises:
        UsageError: A dtype safetensors cannot store (strings, complex128), or two kept
            variables that would share a name.
        VerificationError: The file did not read back as planned (nothing is left behind).
    """
    kept = [p for p in plans if not p.dropped]
    names: dict[str, Any] = {}
    for p in kept:
        if p.new_dtype not in m.NUMERIC_DTYPES or p.new_dtype in UNSTORABLE_DTYPES:
            raise UsageError(f"{p.var.name}: dtype {p.new_dtype} cannot be stored in safetensors (--drop it)")
        name = _output_name(ckpt, p.new_name)
        if name in names:
            raise UsageError(
                f"{ckpt.path}: {names[name].var.name!r} and {p.var.name!r} would both be written as {name!r};"
                " safetensors needs unique names"
            )
        names[name] = p
        p.new_key = name  # the tensor's name in the file
    metadata = {"source": ckpt.path, "format": "pt", **safetensors_run_metadata(ckpt)}

    def reader(p: Any) -> Callable[[], np.ndarray]:
        return lambda: _value(ckpt, p)

    with _atomic.atomic_file(out, force=force, kind=_atomic.KIND_SAFETENSORS, protected=protected) as tmp:
        write_safetensors(tmp, [(name, p.new_dtype, p.var.shape, reader(p)) for name, p in names.items()], metadata)
        with open_checkpoint(tmp) as written:
            if set(written.keys()) != set(names) or written.info.get("metadata") != metadata:
                raise VerificationError(f"{out}: read-back check failed: the safetensors header is not what was planned")
            for name, p in names.items():
                if not bit_equal(written.read(name), _value(ckpt, p)):
                    raise VerificationError(f"{out}: read-back check failed: {name!r} differs from the planned value")
    notes = ["safetensors: load with safetensors' load_file(OUT); keys are the readable names after the renames"]
    return (out,), "safetensors", 0, notes, None
