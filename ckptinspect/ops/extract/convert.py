"""``extract --builder``: a Keras 3 ``.weights.h5`` through the builder's model, from a TF
checkpoint, PyTorch, safetensors or any source but a Keras 3 file (which is copied).

The builder's model is paired with the source by the one plan ``doctor`` and ``transplant``
use, with the same options and defaults (:func:`ckptinspect.ops.model.plan.plan_load` through
:func:`ckptinspect.ops.doctor.operation.weight_plan`: the object-graph path, then the ``layers``
stage with PyTorch's dotted names split, leaf spellings such as ``weight``/``kernel``,
``running_var``/``moving_variance``, ``--map`` rules, ``--by-order``, and the layout rules
``--transpose-dense`` / ``--conv-layout oihw`` / ``--allow-reshape``, ``--strict``). Strict (the
default), the plan must have no problem (every weight paired with a value that fits, every
source model variable used; counters such as ``num_batches_tracked`` are skipped by rule). With
``--no-strict`` it writes what ``transplant --no-strict`` would: unused source variables left
out, weights without a value that fits at the builder model's initial values (refused only when
no weight receives a value). Each value is rearranged by its layout fit, assigned, and the file
is written by ``model.save_weights`` and read back through ``model.load_weights``
(:func:`ckptinspect.ops.extract.writers.write_weights_through_model`: the weights left at init
read back equal to their initial values too), so a plain ``model.load_weights(OUT)`` loads it.
"""

from __future__ import annotations

from typing import Any, Callable

from ... import model as m
from ..doctor.operation import weight_plan
from .report import ExtractedVariable
from .writers import call_builder, write_weights_through_model
from ..model.plan import PairingOptions

__all__ = ["write_weights_by_names"]

Progress = Callable[[int, int, m.Variable], None]
# doctor's notes about its assignment map do not concern a weights file.
ASSIGNMENT_MAP = "assignment map"
REFUSAL_HINT = "`ckptinspect doctor SRC --builder ...` with the same options lists the reasons"


def write_weights_by_names(
    ckpt: m.Checkpoint, tmp: str, out: str, builder: Callable[[], Any], options: PairingOptions,
    progress: Progress | None,
) -> tuple[list[ExtractedVariable], int, list[str], list[str]]:
    """Write ``tmp`` (a ``.weights.h5``) from ``ckpt`` through the builder's model.

    Args:
        ckpt: The open source checkpoint.
        tmp: The temporary output path.
        out: The output, as messages name it.
        builder: Returns the built Keras 3 model.
        options: The pairing options.
        progress: Called after each weight.

    Returns:
        The planned variables (each source variable with the Keras path it went to, or None),
        how many weights were read back and checked, notes, and the Keras paths of the weights
        left at init (``--no-strict``).

    Raises:
        UsageError: The builder failed, or the plan has problems (named as ``transplant`` names
            them; with ``--no-strict``, only when no weight receives a value).
        VerificationError: The written file did not load back equal to the source.
    """
    model = call_builder(builder)
    planned_write = weight_plan(ckpt, model, options=options, out=out, hint=REFUSAL_HINT)
    report, entries, left = planned_write.report, planned_write.entries, planned_write.left_at_init
    verified = write_weights_through_model(ckpt, tmp, model, entries, progress, left_at_init=left)
    keras_path = {v.key: _path(w) for w, v, _ in entries}
    planned = [
        ExtractedVariable(v.name, v.key, keras_path.get(v.key), v.role, v.shape, v.dtype, v.nbytes)
        for v in ckpt.variables
    ]
    rearranged = sum(1 for _, _, f in entries if f is not None and not f.identity)
    notes = [
        "Keras 3 weights file written by model.save_weights of the builder's model, paired as doctor and "
        "transplant pair: load with model.load_weights(OUT)",
        *(n for n in report.notes if ASSIGNMENT_MAP not in n),
    ]
    if rearranged:
        notes.append(f"{rearranged} weight(s) rearranged by the layout rules ({' '.join(options.layout.describe())})")
    if left:
        notes.append(f"--no-strict: {len(left)} weight(s) left at the builder model's initial values (read back equal)")
    return planned, verified, notes, [_path(w) for w in left]


def _path(weight: Any) -> str:
    """A Keras weight's path (``layer/kernel``)."""
    return str(getattr(weight, "path", weight.name))
