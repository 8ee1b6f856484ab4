"""Checkpoint directories: the ``checkpoint`` state file that ``CheckpointManager`` and the
TF1 ``Saver`` keep, with a fallback to scanning ``*.index`` files.

The state file is a text-format ``CheckpointState``::

    model_checkpoint_path: "ckpt-4"
    all_model_checkpoint_paths: "ckpt-2"
    all_model_checkpoint_timestamps: 1612345678.9
    last_preserved_timestamp: 1612345600.1
"""

from __future__ import annotations

import re

from .. import model as m
from . import _fs
from ._layout import INDEX_SUFFIX, STATE_FILE
from .tf_bundle import step_from_name

__all__ = ["STATE_FILE", "CheckpointState", "parse_state", "list_checkpoints"]

_FIELD_RE = re.compile(r'^\s*(\w+)\s*:\s*(?:"((?:[^"\\]|\\.)*)"|([-+0-9.eE]+))\s*$')


class CheckpointState:
    """The parsed state file: the latest path and all retained paths with timestamps."""

    def __init__(self, latest: str | None, paths: list[str], timestamps: list[float]):
        self.latest = latest
        self.paths = paths
        self.timestamps = timestamps


def parse_state(text: str) -> CheckpointState | None:
    """Parse a state file's text; None when it has no ``model_checkpoint_path``."""
    latest = None
    paths: list[str] = []
    stamps: list[float] = []
    for line in text.splitlines():
        match = _FIELD_RE.match(line)
        if not match:
            continue
        field, string, number = match.groups()
        if string is not None:
            string = bytes(string, "utf-8").decode("unicode_escape").encode("latin-1").decode("utf-8", "replace")
        if field == "model_checkpoint_path" and string is not None:
            latest = string
        elif field == "all_model_checkpoint_paths" and string is not None:
            paths.append(string)
        elif field == "all_model_checkpoint_timestamps" and number is not None:
            stamps.append(float(number))
    if latest is None:
        return None
    if latest not in paths:
        paths.append(latest)
    return CheckpointState(latest, paths, stamps)


def _resolve(directory: str, path: str) -> str:
    """A state-file path on this machine: relative to the directory; an absolute path that
    does not exist (written on another machine) falls back to its basename in the directory."""
    if not (path.startswith("/") or _fs.is_remote(path)):
        return _fs.join(directory, path)
    if _exists(path):
        return path
    local = _fs.join(directory, _fs.basename(path))
    return local if _exists(local) else path


def _exists(prefix: str) -> bool:
    return _fs.exists(prefix + INDEX_SUFFIX) or _fs.isfile(prefix)


def scan_prefixes(directory: str) -> list[str]:
    """Every ``PREFIX.index`` in a directory, as prefixes."""
    return [
        _fs.join(directory, name[: -len(INDEX_SUFFIX)])
        for name in _fs.listdir(directory)
        if name.endswith(INDEX_SUFFIX) and _fs.isfile(_fs.join(directory, name))
    ]


def list_checkpoints(directory: str) -> tuple[list[m.RetainedCheckpoint], str | None]:
    """The checkpoints of a directory and the prefix it resolves to.

    The state file's list comes first, in its order, with timestamps; checkpoints on disk
    that it does not list follow. The directory resolves to the state file's latest when
    its files exist, else to the newest retained one that exists, else to the newest
    ``*.index`` on disk.

    Returns:
        (checkpoints, resolved prefix or None when nothing exists).
    """
    state = None
    state_path = _fs.join(directory, STATE_FILE)
    if _fs.isfile(state_path):
        try:
            state = parse_state(_fs.read_bytes(state_path).decode("utf-8", "replace"))
        except UnicodeDecodeError:
            state = None
    entries: list[tuple[str, float | None, bool]] = []
    latest = None
    if state is not None:
        stamps = state.timestamps if len(state.timestamps) == len(state.paths) else [None] * len(state.paths)
        for raw, stamp in zip(state.paths, stamps):
            entries.append((_resolve(directory, raw), stamp, True))
        latest = _resolve(directory, state.latest)
    listed = {p for p, _, _ in entries}
    on_disk = sorted(
        (p for p in scan_prefixes(directory) if p not in listed),
        key=lambda p: (step_from_name(p) is None, step_from_name(p) or 0, _mtime(p)),
    )
    entries += [(p, None, False) for p in on_disk]
    if latest is None or not _exists(latest):
        existing = [p for p, _, in_state in entries if in_state and _exists(p)]
        latest = existing[-1] if existing else (on_disk[-1] if on_disk else None)
    result = [
        m.RetainedCheckpoint(
            path=p,
            step=step_from_name(p),
            timestamp=stamp,
            exists=_exists(p),
            in_state_file=in_state,
            latest=p == latest,
        )
        for p, stamp, in_state in entries
    ]
    return result, latest


def _mtime(prefix: str) -> float:
    import os  # noqa: PLC0415

    try:
        return os.path.getmtime(prefix + INDEX_SUFFIX)
    except OSError:
        return 0.0
