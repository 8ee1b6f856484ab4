"""The files a checkpoint's values live in, as the writing operations need them: to keep
``--force`` from replacing them and to size what a copy will read."""

from __future__ import annotations

import os
from typing import Iterable

from ..model import Checkpoint

__all__ = ["source_files", "files_size"]


def source_files(ckpt: Checkpoint) -> list[str]:
    """The checkpoint's files that exist as regular files now (``Checkpoint.files()`` less
    what is gone, remote or not a file), in its order."""
    return [f for f in ckpt.files() if os.path.isfile(f)]


def files_size(paths: Iterable[str]) -> int:
    """The bytes of those of ``paths`` that are regular files (the rest count nothing)."""
    return sum(os.path.getsize(p) for p in paths if os.path.isfile(p))
