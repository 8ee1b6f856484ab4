"""Which numbers a checkpoint file's name carries (``weights.03.weights.h5``, ``epoch=2-step=60.ckpt``,
``ckpt-7``): the one rule the series seam orders files by and the step rule reads numbers from.
Standard library only, imported by both."""

from __future__ import annotations

import dataclasses
import os
import re

from ._layout import INDEX_SUFFIX, SERIES_KERAS, SERIES_TORCH

__all__ = ["FILE_SERIES_SUFFIXES", "NameNumbers", "name_numbers"]

# The file suffixes of each kind of file series, longest first where one ends another.
FILE_SERIES_SUFFIXES = {
    SERIES_KERAS: (".weights.h5", ".h5", ".hdf5", ".keras"),
    SERIES_TORCH: (".ckpt", ".pt", ".pth"),
}

# ``epoch=2-step=60``: Lightning's ``{epoch}-{step}`` template writes key=value pairs.
_KEY_NUMBER_RE = re.compile(r"(?:^|[^A-Za-z0-9])(epoch|step|global_step|iter|iteration)=(\d+)(?![\d.])", re.I)
# A number standing alone between separators (``weights.03``, ``model-05``, ``ckpt_7``), not part
# of a word (``keras2``) nor of a decimal (``0.45``).
_TOKEN_RE = re.compile(r"(?:^|(?<=[._\-=]))(\d+)(?=$|[._\-])")


@dataclasses.dataclass(frozen=True)
class NameNumbers:
    """The numbers a checkpoint's file name carries.

    Attributes:
        epoch: ``epoch=N``, or None.
        step: ``step=N`` (``global_step=``, ``iter=``), or None.
        number: The name's number when it carries no ``key=value`` (a ``ModelCheckpoint``
            ``{epoch}``, a ``CheckpointManager`` number), or None.
    """

    epoch: int | None = None
    step: int | None = None
    number: int | None = None

    @property
    def order(self) -> int | None:
        """What the series is ordered by: the step, else the epoch, else the number."""
        for value in (self.step, self.epoch, self.number):
            if value is not None:
                return value
        return None


def _stem(name: str) -> str:
    for suffixes in FILE_SERIES_SUFFIXES.values():
        for suffix in suffixes:
            if name.endswith(suffix):
                return name[: -len(suffix)]
    return name[: -len(INDEX_SUFFIX)] if name.endswith(INDEX_SUFFIX) else name


def name_numbers(path: str) -> NameNumbers:
    """The epoch, step or number in a checkpoint file's name (its suffix aside).

    ``epoch=2-step=60.ckpt`` -> epoch 2, step 60; ``weights.03.weights.h5`` -> 3;
    ``model.05-0.42.h5`` -> 5 (the loss is a decimal); ``keras2_model.h5`` -> none.
    """
    stem = _stem(os.path.basename(path.rstrip("/")))
    keyed = {k.lower(): int(v) for k, v in _KEY_NUMBER_RE.findall(stem)}
    if keyed:
        step = keyed.get("step", keyed.get("global_step", keyed.get("iter", keyed.get("iteration"))))
        return NameNumbers(epoch=keyed.get("epoch"), step=step)
    tokens = _TOKEN_RE.findall(stem)
    return NameNumbers(number=int(tokens[0])) if tokens else NameNumbers()
