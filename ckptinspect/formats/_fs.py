"""File access for local paths (plain ``os``) and remote ones (``tf.io.gfile``).

Local paths never import TensorFlow. A path with a scheme (``gs://``, ``s3://``,
``ram://``...) goes through ``tf.io.gfile``, imported on first use.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
from typing import Iterator

from ..errors import CheckpointNotFoundError


def is_remote(path: str) -> bool:
    """True for paths with a URL scheme such as ``gs://`` or ``ram://``."""
    return "://" in path


def _gfile():
    import tensorflow as tf  # noqa: PLC0415 - remote paths only

    return tf.io.gfile


def join(a: str, *parts: str) -> str:
    return posixpath.join(a, *parts) if is_remote(a) else os.path.join(a, *parts)


def dirname(path: str) -> str:
    return posixpath.dirname(path) if is_remote(path) else os.path.dirname(path)


def basename(path: str) -> str:
    return posixpath.basename(path) if is_remote(path) else os.path.basename(path)


def exists(path: str) -> bool:
    return _gfile().exists(path) if is_remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
    return _gfile().isdir(path) if is_remote(path) else os.path.isdir(path)


def isfile(path: str) -> bool:
    return exists(path) and not isdir(path)


def listdir(path: str) -> list[str]:
    return sorted(_gfile().listdir(path) if is_remote(path) else os.listdir(path))


def getsize(path: str) -> int:
    if is_remote(path):
        return _gfile().stat(path).length
    return os.path.getsize(path)


@contextlib.contextmanager
def _reading(path: str) -> Iterator[None]:
    """Turn the OS's errors for an unreadable file into one-line CheckpointNotFoundErrors."""
    try:
        yield
    except FileNotFoundError as e:
        raise CheckpointNotFoundError(f"{path}: no such file") from e
    except IsADirectoryError as e:
        raise CheckpointNotFoundError(f"{path}: is a directory, not a file") from e
    except PermissionError as e:
        raise CheckpointNotFoundError(f"{path}: permission denied") from e
    except OSError as e:
        if is_remote(path) or not os.path.exists(path):
            raise CheckpointNotFoundError(f"{path}: cannot read ({e})") from e
        raise


def open_remote(path: str):
    """A binary file object for a remote path (through ``tf.io.gfile``)."""
    return _gfile().GFile(path, "rb")


def read_bytes(path: str) -> bytes:
    """The whole file. Raises CheckpointNotFoundError if it is missing or unreadable."""
    with _reading(path):
        if is_remote(path):
            with _gfile().GFile(path, "rb") as f:
                return f.read()
        with open(path, "rb") as f:
            return f.read()


def read_range(path: str, offset: int, size: int) -> bytes:
    """``size`` bytes at ``offset`` (fewer if the file is shorter).

    Raises CheckpointNotFoundError if the file is missing or unreadable.
    """
    with _reading(path):
        if is_remote(path):
            with _gfile().GFile(path, "rb") as f:
                f.seek(offset)
                return f.read(size)
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(size)


def read_head(path: str, size: int) -> bytes:
    """The first ``size`` bytes (for content sniffing); b'' for unreadable files."""
    try:
        return read_range(path, 0, size)
    except OSError:
        return b""
