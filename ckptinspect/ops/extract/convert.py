"""``extract --builder`` from another framework: a Keras 3 ``.weights.h5`` from PyTorch or
safetensors (or any source whose names, not an object graph, say where each value goes).

The builder's model is paired with the source by the one matcher, exactly as ``doctor`` pairs
them (:func:`ckptinspect.ops.doctor.operation.weight_plan`: the ``layers`` stage with PyTorch's dotted
names split, leaf spellings such as ``weight``/``kernel``, ``running_var``/``moving_variance``,
``--map`` rules, and the layout rules ``--transpose-dense`` / ``--conv-layout oihw``). Every
weight of the model must be paired; each value is rearranged by its layout fit, assigned, and
the file is written by ``model.save_weights`` and read back through ``model.load_weights``
(:func:`ckptinspect.ops.extract.writers.write_weights_through_model`), so a plain
``model.load_weights(OUT)`` loads it.
"""

from __future__ import annotations

from typing import Any, Callable

from ... import model as m
from ..doctor.operation import weight_plan
from .report import ExtractedVariable
from .writers import call_builder, write_weights_through_model
from ..match.layouts import Layout
from ..match.mapping import Rules

__all__ = ["write_weights_by_names"]

Progress = Callable[[int, int, m.Variable], None]
# doctor's notes about its assignment map do not concern a weights file.
ASSIGNMENT_MAP = "assignment map"
REFUSAL_HINT = "`ckptinspect doctor SRC --builder ...` with the same options lists the reasons"


def write_weights_by_names(
    ckpt: m.Checkpoint, tmp: str, out: str, builder: Callable[[], Any], rules: Rules, layout: Layout,
    progress: Progress | None,
) -> tuple[list[ExtractedVariable], int, list[str]]:
    """Write ``tmp`` (a ``.weights.h5``) from ``ckpt`` through the builder's model.

    Args:
        ckpt: The open source checkpoint.
        tmp: The temporary output path.
        out: The output, as messages name it.
        builder: Returns the built Keras 3 model.
        rules: Compiled ``--map`` rules for the source's names.
        layout: The layout rules.
        progress: Called after each weight.

    Returns:
        The planned variables (each source variable with the Keras path it went to, or None),
        how many weights were read back and checked, and notes.

    Raises:
        UsageError: The builder failed, or a weight of the model has no source value that fits.
        VerificationError: The written file did not load back equal to the source.
    """
    model = call_builder(builder)
    report, entries = weight_plan(ckpt, model, rules=rules, layout=layout, out=out, hint=REFUSAL_HINT)
    verified = write_weights_through_model(ckpt, tmp, model, entries, progress)
    keras_path = {v.key: str(getattr(w, "path", w.name)) for w, v, _ in entries}
    planned = [
        ExtractedVariable(v.name, v.key, keras_path.get(v.key), v.role, v.shape, v.dtype, v.nbytes)
        for v in ckpt.variables
    ]
    rearranged = sum(1 for _, _, f in entries if f is not None and not f.identity)
    notes = [
        "Keras 3 weights file written by model.save_weights of the builder's model, paired by name "
        "(as doctor pairs): load with model.load_weights(OUT)",
        *(n for n in report.notes if ASSIGNMENT_MAP not in n),
    ]
    if rearranged:
        notes.append(f"{rearranged} weight(s) rearranged by the layout rules ({' '.join(layout.describe())})")
    unused = [x.source for x in report.leftovers]
    if unused:
        notes.append(f"{len(unused)} model variable(s) of the source have no weight in the built model and are not "
                     f"written (e.g. {unused[0]!r})")
    return planned, verified, notes
