"""The files a checkpoint's values live in, as the writing operations need them: to keep
``--force`` from replacing them and to size what a copy will read."""

from __future__ import annotations

import os
from typing import Iterable

from ..formats import is_remote, path_exists, path_size
from ..model import Checkpoint

__all__ = ["source_files", "files_size"]


def source_files(ckpt: Checkpoint) -> list[str]:
    """The checkpoint's files that exist as regular files now (``Checkpoint.files()`` less
    what is gone or not a file; a remote object counts), in its order."""
    return [f for f in ckpt.files() if _is_file(f)]


def _is_file(path: str) -> bool:
    return path_exists(path) if is_remote(path) else os.path.isfile(path)


def files_size(paths: Iterable[str]) -> int:
    """The bytes of those of ``paths`` that are regular files or remote objects (the rest count nothing)."""
    return sum(path_size(p) if is_remote(p) else os.path.getsize(p) for p in paths if _is_file(p))
