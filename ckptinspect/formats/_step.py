"""The step rule: one answer to "which step is this checkpoint?" for every format and command.

A checkpoint has a *training step* when one of its variables records it: an explicit step
variable (``global_step``, ``step``, a training dict's ``iteration``, a safetensors
``__metadata__`` ``step``) first, else the optimizer's iteration count. That is
:attr:`~ckptinspect.model.Checkpoint.step`, with its source.

The number in a checkpoint's name is not a training step: ``ckpt-7`` is a ``CheckpointManager``'s
seventh save, ``weights.03.weights.h5`` a ``ModelCheckpoint``'s third epoch. It is
:attr:`~ckptinspect.model.Checkpoint.number`, shown as what it is; so is an epoch or a save
counter a variable records. Which numbers a *name* carries is the series seam's rule
(:func:`ckptinspect.formats._names.name_numbers`); a bare number in a file's name counts only in
a series (the listing's :attr:`~ckptinspect.model.RetainedCheckpoint.number`), since outside one it
is as likely a version (``mobilenet_v2_1.0_224.h5``) as an epoch.

Families report every candidate they find (``{"variable:global_step": 120, "optimizer:iter":
9360, "save_counter": 7}``, best first, in ``info["step_candidates"]`` or as the checkpoint's
``step``/``step_source``); the door applies :func:`apply_step_rule` to what every opener returns.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from .. import model as m
from . import _fs
from ._layout import prefix_number
from ._names import name_numbers

__all__ = ["MAX_STEP_LOOKUPS", "STEP_NAMES", "is_training_step", "training_step", "name_number", "apply_step_rule"]

# The last part of a variable's (or metadata key's) name that makes it an explicit step counter.
# A series' newest checkpoints (a TF directory's, a file series', an Orbax run's) opened for their
# training steps, at most this many: listing a long series stays cheap.
MAX_STEP_LOOKUPS = 32
STEP_NAMES = frozenset({"global_step", "step", "iteration", "iter_num", "iter", "steps", "global_steps"})


def _last(label: str) -> str:
    return label.partition(":")[2].replace(".", "/").rsplit("/", 1)[-1].lower()


def is_training_step(label: str) -> bool:
    """Whether a candidate's source names a training step (an explicit step variable or
    metadata key, or an optimizer's iteration count), not an epoch, a save count or a name."""
    kind = label.partition(":")[0]
    if kind == "optimizer":
        return True
    return kind in ("variable", "metadata") and _last(label) in STEP_NAMES


def training_step(candidates: Mapping[str, int]) -> tuple[int | None, str | None]:
    """The training step among ``candidates`` (label -> value, in the family's order): the first
    explicit step variable, else the first optimizer counter; (None, None) when there is none."""
    explicit = [k for k in candidates if is_training_step(k) and not k.startswith("optimizer:")]
    counters = [k for k in candidates if k.startswith("optimizer:")]
    best = (explicit or counters or [None])[0]
    return (candidates[best], best) if best is not None else (None, None)


def name_number(path: str, format: str) -> tuple[int | None, str | None]:
    """The number a checkpoint's own name carries, as what it is: a TF prefix's ``-N`` (a
    ``CheckpointManager``'s or ``Saver``'s count, ``name:checkpoint``), or a keyed ``epoch=N``
    (else ``step=N``) in any file's name (``name:epoch``, ``name:step``); (None, None) otherwise."""
    base = _fs.basename(path.rstrip("/"))
    if format in (m.FORMAT_TF_BUNDLE, m.FORMAT_TF_V1):
        number = prefix_number(base)
        return (number, "name:checkpoint") if number is not None else (None, None)
    numbers = name_numbers(base)
    if numbers.epoch is not None:  # Lightning's epoch=2-step=60: the step is a variable's too
        return numbers.epoch, "name:epoch"
    if numbers.step is not None:
        return numbers.step, "name:step"
    return None, None


def apply_step_rule(ckpt: m.Checkpoint) -> m.Checkpoint:
    """``ckpt`` with :attr:`step` the training step and :attr:`number` the number in its name
    (else an epoch or save counter its variables record), whatever its family reported."""
    candidates: dict[str, int] = dict(ckpt.info.get("step_candidates") or {})
    if ckpt.step is not None and ckpt.step_source and ckpt.step_source not in candidates:
        candidates = {ckpt.step_source: ckpt.step, **candidates}
    step, source = training_step(candidates)
    number, number_source = name_number(ckpt.path, ckpt.format)
    if number is None and ckpt.number is not None:  # what the opener knew (a series' listing)
        number, number_source = ckpt.number, ckpt.number_source
    elif number is None:
        others = [k for k in candidates if not is_training_step(k) and k != "filename"]
        if others:
            number, number_source = candidates[others[0]], others[0]
    if (step, source, number, number_source) == (ckpt.step, ckpt.step_source, ckpt.number, ckpt.number_source):
        return ckpt
    return dataclasses.replace(ckpt, step=step, step_source=source, number=number, number_source=number_source)
