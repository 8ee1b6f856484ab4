"""``verify`` for formats checked by reading: damage found when opening (per tensor) plus every
tensor read in blocks. The one reading check: the PyTorch, safetensors and Hugging Face readers
plan theirs with it, and so does the door for every format without a check of its own (Keras
files, ``.npz``)."""

from __future__ import annotations

from typing import Callable

from .. import model as m
from ..errors import CorruptCheckpointError, UnallocatedDataError

__all__ = ["Check", "Opened", "ReadCheck", "CHECK_BLOCK_ELEMENTS"]

CHECK_BLOCK_ELEMENTS = 1 << 20


class Check:
    """A planned check of one checkpoint: ``total`` tensors, checked by :meth:`run` (a format
    whose check is one call, such as a V1 table's)."""

    def __init__(self, path: str, fn: Callable[[m.Progress | None, int, int | None], m.CheckResult], total: int = 0):
        self.path = path
        self.total = total
        self._fn = fn

    def run(self, progress: m.Progress | None = None, done: int = 0, total: int | None = None,
            seen: m.Checkpoint | None = None) -> m.CheckResult:
        """Run it (``seen``, the checkpoint opened and read by the caller, is not used: this
        check reads its own bytes)."""
        return self._fn(progress, done, total)


class Opened:
    """A checkpoint opened for checking: the checkpoint, the damage found while opening (keys
    in ``damaged`` are not read again), and a function finding more damage (archive CRCs)."""

    def __init__(self, ckpt: m.Checkpoint, damaged: list[m.Damage] | None = None,
                 more: Callable[[], list[m.Damage]] | None = None, problems: list[str] | None = None):
        self.ckpt = ckpt
        self.damaged = list(damaged or [])
        self.more = more
        self.problems = tuple(problems or ())  # file-level problems (missing shards), one line each


class ReadCheck:
    """A planned check: ``total`` tensors, checked by :meth:`run` (the ``Check`` protocol of
    :func:`ckptinspect.formats.prepare_check`).

    Args:
        path: The checkpoint.
        opener: Opens it leniently, recording damage instead of raising where it can.
    """

    def __init__(self, path: str, opener: Callable[[str], Opened]):
        self.path = path
        self._problem: str | None = None
        self._opened: Opened | None = None
        try:
            self._opened = opener(path)
        except CorruptCheckpointError as e:
            self._problem = str(e)
        self.total = len(self._opened.ckpt.variables) if self._opened else 0

    def run(self, progress: m.Progress | None = None, done: int = 0, total: int | None = None,
            seen: m.Checkpoint | None = None) -> m.CheckResult:
        """Read every tensor; return the verdict (``seen``, the checkpoint opened and read by
        the caller, is not used: every tensor is read here)."""
        if self._opened is None:
            return m.CheckResult(self.path, None, m.STATUS_DAMAGED, problems=(self._problem or "unreadable",))
        opened = self._opened
        ckpt = opened.ckpt
        total = self.total if total is None else total
        damaged = list(opened.damaged)
        skip = {d.key for d in damaged}
        nbytes = 0
        with ckpt:
            if opened.more is not None:
                more = opened.more()
                damaged += more
                skip |= {d.key for d in more}
            for var in ckpt.variables:
                if var.key not in skip:
                    try:
                        for block in ckpt.iter_blocks(var, CHECK_BLOCK_ELEMENTS):
                            nbytes += int(getattr(block, "nbytes", 0))
                    except CorruptCheckpointError as e:
                        kind = m.DAMAGE_UNALLOCATED if isinstance(e, UnallocatedDataError) else m.DAMAGE_UNREADABLE
                        damaged.append(m.Damage(key=var.key, name=var.name, file=self.path, kind=kind, problem=str(e)))
                done += 1
                if progress is not None:
                    progress(done, total, var)
        status = m.STATUS_DAMAGED if damaged or opened.problems else m.STATUS_INTACT
        return m.CheckResult(self.path, ckpt.format, status, step=ckpt.step, tensors=len(ckpt.variables),
                             nbytes=nbytes, problems=opened.problems, damaged=tuple(damaged))
