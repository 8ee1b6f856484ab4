"""Checkpoint directories: the ``checkpoint`` state file that ``CheckpointManager`` and the
TF1 ``Saver`` keep, with a fallback to scanning ``*.index`` files.

The state file is a text-format ``CheckpointState``::

    model_checkpoint_path: "ckpt-4"
    all_model_checkpoint_paths: "ckpt-2"
    all_model_checkpoint_timestamps: 1612345678.9
    last_preserved_timestamp: 1612345600.1

A directory is read once per command (:func:`read_directory`): the checkpoints it holds,
each once (by real path, however the state file spells it), the one it resolves to, and what
is wrong with it: a state file that TensorFlow cannot parse (``tf.train.latest_checkpoint``
then finds nothing), one that is not a regular file or is absurdly large, one naming paths
outside the directory (never read), and temporaries left by interrupted ckptinspect writes.
"""

from __future__ import annotations

import os
import re
import time

from ... import model as m
from ..._atomic import leftover_temporaries
from ...errors import CkptError
from .. import _fs
from .variables import step_from_name
from .._layout import INDEX_SUFFIX, STATE_FILE, data_path
from .._listing import DirectoryListing
from .._step import MAX_STEP_LOOKUPS

__all__ = [
    "STATE_FILE",
    "MAX_STATE_FILE_BYTES",
    "CheckpointState",
    "DirectoryListing",
    "parse_state",
    "read_directory",
    "list_checkpoints",
    "checkpoint_step",
    "state_fingerprint",
    "state_changed",
    "checkpoint_present",
    "PLACED_LISTED",
    "PLACED_MEMBER",
    "PLACED_LATEST",
    "placement",
]

MAX_STATE_FILE_BYTES = 1 << 20  # ~8,000 retained checkpoints; anything larger is not a state file
# A retained checkpoint's step is read from its index (as ``ls`` reads the header's step) for at
# most MAX_STEP_LOOKUPS checkpoints, newest first, and only for indexes up to this size.
MAX_STEP_INDEX_BYTES = 1 << 20
# A directory whose state file changed this recently is being saved into: wait this long (polling)
# for its next write before calling a vanished checkpoint missing rather than rotated.
LIVE_SECONDS = 5.0
SETTLE_SECONDS = 1.0
SETTLE_POLL_SECONDS = 0.02
STATE_FIELDS = (
    "model_checkpoint_path",
    "all_model_checkpoint_paths",
    "all_model_checkpoint_timestamps",
    "last_preserved_timestamp",
)

_FIELD_RE = re.compile(
    r'^\s*(\w+)\s*:\s*(?:"((?:[^"\\]|\\.)*)"|\'((?:[^\'\\]|\\.)*)\'|([-+0-9.eE]+|inf|nan))\s*(?:#.*)?$'
)
_IGNORABLE_RE = re.compile(r"^\s*(#.*)?$")


class CheckpointState:
    """The parsed state file: the latest path and all retained paths with timestamps.

    Attributes:
        latest: ``model_checkpoint_path`` (None when the file has none).
        paths: ``all_model_checkpoint_paths``, plus ``latest`` when it is not among them.
        timestamps: ``all_model_checkpoint_timestamps``.
        bad_lines: ``(line number, text)`` of lines TensorFlow's text-format parser rejects.
    """

    def __init__(self, latest: str | None, paths: list[str], timestamps: list[float],
                 bad_lines: list[tuple[int, str]] | None = None):
        self.latest = latest
        self.paths = paths
        self.timestamps = timestamps
        self.bad_lines = bad_lines or []


def _unescape(text: str) -> str:
    return bytes(text, "utf-8").decode("unicode_escape").encode("latin-1").decode("utf-8", "replace")


def _parse(text: str) -> CheckpointState:
    latest = None
    paths: list[str] = []
    stamps: list[float] = []
    bad: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        match = _FIELD_RE.match(line)
        if not match:
            if not _IGNORABLE_RE.match(line):
                bad.append((number, line))
            continue
        field, double, single, value = match.groups()
        string = double if double is not None else single
        if field not in STATE_FIELDS or (string is None) == (field in ("model_checkpoint_path", "all_model_checkpoint_paths")):
            bad.append((number, line))
            continue
        if string is not None:
            try:
                string = _unescape(string)
            except (UnicodeDecodeError, UnicodeEncodeError):
                bad.append((number, line))
                continue
        if field == "model_checkpoint_path":
            latest = string
        elif field == "all_model_checkpoint_paths":
            paths.append(string)
        elif field == "all_model_checkpoint_timestamps":
            stamps.append(float(value))
    if latest is not None and latest not in paths:
        paths.append(latest)
    return CheckpointState(latest, paths, stamps, bad)


def parse_state(text: str) -> CheckpointState | None:
    """Parse a state file's text; None when it has no ``model_checkpoint_path``."""
    state = _parse(text)
    return state if state.latest is not None else None


def _resolve(directory: str, path: str) -> str:
    """A state-file path on this machine: a relative path is relative to the directory; an
    absolute one that does not exist (written on another machine) becomes its basename in the
    directory."""
    if not (os.path.isabs(path) or _fs.is_remote(path)):
        path = _fs.join(directory, path)
    elif not (_exists(path) or _fs.exists(path)):
        path = _fs.join(directory, _fs.basename(path))
    return _one_v1_shard(path)


def _one_v1_shard(path: str) -> str:
    """A sharded V1 Saver names its checkpoint by a pattern (``model.ckpt-7-?????-of-00001``);
    with one shard, that pattern is one file. (Several shards stay a pattern: not read.)"""
    if V1_SHARD_PATTERN not in path or not path.endswith(V1_ONE_SHARD):
        return path
    return path.replace(V1_SHARD_PATTERN + V1_ONE_SHARD, "-00000" + V1_ONE_SHARD)


V1_SHARD_PATTERN = "-?????"
V1_ONE_SHARD = "-of-00001"


def _exists(prefix: str) -> bool:
    """A bundle's index, or a V1 checkpoint file (a regular file: never a FIFO or device)."""
    return _fs.exists(prefix + INDEX_SUFFIX) or _fs.is_regular(prefix)


def _key(path: str) -> str:
    """Identity of a checkpoint path: one checkpoint however it is spelled."""
    try:
        return _fs.real_path(path)
    except OSError:  # pragma: no cover - realpath does not fail on Linux
        return path


def scan_prefixes(directory: str) -> list[str]:
    """Every ``PREFIX.index`` in a directory, as prefixes."""
    return [
        _fs.join(directory, name[: -len(INDEX_SUFFIX)])
        for name in _fs.listdir(directory)
        if name.endswith(INDEX_SUFFIX) and _fs.isfile(_fs.join(directory, name))
    ]


def _read_state(directory: str) -> tuple[CheckpointState | None, list[str]]:
    """The state file, parsed, and what is wrong with it."""
    state_path = _fs.join(directory, STATE_FILE)
    if not _fs.exists(state_path) and not os.path.islink(state_path):
        return None, []
    if _fs.isdir(state_path):
        return None, [f"{state_path}: is a directory, not a checkpoint state file"]
    try:
        raw = _fs.read_bytes(state_path, limit=MAX_STATE_FILE_BYTES, what="checkpoint state file")
    except CkptError as e:  # a FIFO, a device, a huge file, a dangling link, no permission
        return None, [f"{e}; the directory is read by scanning *.index instead"]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, [
            f"{state_path}: not a checkpoint state file (not UTF-8 text); tf.train.latest_checkpoint"
            " finds nothing here"
        ]
    state = _parse(text)
    if state.bad_lines:
        number, line = state.bad_lines[0]
        more = f" (+{len(state.bad_lines) - 1} more)" if len(state.bad_lines) > 1 else ""
        return None, [
            f"{state_path}: not a valid checkpoint state file: line {number} {line[:60]!r} is not a"
            f" CheckpointState field{more}; tf.train.latest_checkpoint finds nothing here"
        ]
    if state.latest is None:
        return None, [
            f"{state_path}: not a valid checkpoint state file (no model_checkpoint_path);"
            " tf.train.latest_checkpoint finds nothing here"
        ]
    return state, []


def state_fingerprint(directory: str) -> bytes | None:
    """The directory's state file as it is right now (its bytes), None when absent or
    unreadable: a CheckpointManager rewrites it on every save, so a change means the directory
    is live. (Not its inode and mtime: a rename can reuse the inode number, and two saves within
    one clock tick share an mtime.)"""
    try:
        return _fs.read_bytes(_fs.join(directory, STATE_FILE), limit=MAX_STATE_FILE_BYTES, what="checkpoint state file")
    except CkptError:
        return None


def state_changed(directory: str, before: bytes | None) -> bool:
    """Whether the state file changed since ``before`` (a :func:`state_fingerprint`).

    A CheckpointManager deletes an old checkpoint between two writes of the state file, so a
    reader can see the deletion before the state file that records it. When the state file
    was written within the last :data:`LIVE_SECONDS`, wait up to :data:`SETTLE_SECONDS` for
    that second write; an idle directory is answered at once.
    """
    if state_fingerprint(directory) != before:
        return True
    try:
        age = time.time() - os.stat(_fs.join(directory, STATE_FILE)).st_mtime
    except OSError:
        return False
    if _fs.is_remote(directory) or age > LIVE_SECONDS:
        return False
    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline:
        time.sleep(SETTLE_POLL_SECONDS)
        if state_fingerprint(directory) != before:
            return True
    return False


def checkpoint_present(prefix: str) -> bool:
    """Whether a checkpoint's files are all there now: its index and every data shard the
    index names (or a V1 file)."""
    index = prefix + INDEX_SUFFIX
    if not _fs.exists(index):
        return _fs.is_regular(prefix)
    try:
        from .index import read_index  # noqa: PLC0415

        num_shards = read_index(prefix).num_shards
    except (CkptError, OSError):
        return _fs.exists(index)
    return all(_fs.exists(data_path(prefix, i, num_shards)) for i in range(num_shards))


def _mtime(prefix: str) -> float:
    try:
        return os.path.getmtime(prefix + INDEX_SUFFIX)
    except OSError:
        return 0.0


def _order(prefix: str, mtime: float) -> tuple[bool, int, float]:
    """Where a checkpoint found only on disk sorts (the last one is what the directory resolves
    to when no state file decides): numbered ones by number, then unnumbered ones, each by time."""
    step = step_from_name(prefix)
    return (step is None, step or 0, mtime)


def checkpoint_step(prefix: str, *, from_index: bool = True) -> int | None:
    """The training step of one checkpoint, as ``ls`` shows it in its header (the step rule:
    a step variable, else the optimizer's iterations), for a bundle whose index is small
    (:data:`MAX_STEP_INDEX_BYTES`); None when it has none, when the index is larger or cannot
    be read, or when ``from_index`` is False. The number in its name is the listing's
    :attr:`~ckptinspect.model.RetainedCheckpoint.number`, not a step.

    Args:
        prefix: A bundle prefix or V1 file.
        from_index: Read the index (False: no step).
    """
    if not from_index:
        return None
    index = prefix + INDEX_SUFFIX
    try:
        if not _fs.is_remote(prefix) and (not _fs.is_regular(index) or _fs.getsize(index) > MAX_STEP_INDEX_BYTES):
            return None
        from .bundle import open_bundle  # noqa: PLC0415

        with open_bundle(prefix) as ckpt:
            return ckpt.step
    except (CkptError, OSError):
        return None


def read_directory(directory: str, *, steps: bool = True) -> DirectoryListing:
    """The checkpoints of a directory, the prefix it resolves to, and its problems.

    The state file's list comes first, in its order, with timestamps; checkpoints on disk
    that it does not list follow. Each checkpoint appears once (paths are compared after
    symlinks and ``..``, so a state file's absolute spelling and the scan's relative one are
    one checkpoint). A path the state file names outside the directory is reported and never
    read. The directory resolves to the state file's latest when its files exist, else to the
    newest retained one that exists, else to the newest ``*.index`` on disk.

    Args:
        directory: The checkpoint directory.
        steps: Read each checkpoint's step from its index when cheap (see
            :func:`checkpoint_step`); False: none (the number in each name is read either way).
    """
    state, problems = _read_state(directory)
    state_path = _fs.join(directory, STATE_FILE)
    entries: list[tuple[str, float | None, bool]] = []
    seen: set[str] = set()
    latest = None

    foreign: list[str] = []

    def admit(raw: str) -> str | None:
        path = _resolve(directory, raw)
        if os.path.isabs(raw) and not _fs.is_remote(raw) and path != _one_v1_shard(raw) and raw not in foreign:
            foreign.append(raw)
        if not _fs.is_inside(path, directory):
            problems.append(
                f"{state_path}: names {raw!r}, outside the directory {directory}; not read as a checkpoint"
            )
            return None
        if not _fs.exists(path + INDEX_SUFFIX) and _fs.exists(path) and not _fs.is_regular(path):
            problems.append(f"{state_path}: names {raw!r}, which is not a regular file; not read as a checkpoint")
            return None
        return path

    if state is not None:
        stamps = state.timestamps if len(state.timestamps) == len(state.paths) else [None] * len(state.paths)
        admitted: dict[str, str | None] = {}
        for raw, stamp in zip(state.paths, stamps):
            if raw not in admitted:
                admitted[raw] = admit(raw)
            path = admitted[raw]
            if path is None or _key(path) in seen:
                continue
            seen.add(_key(path))
            entries.append((path, stamp, True))
        latest = admitted.get(state.latest)
        if latest is not None:  # the state file's own spelling of it, as listed
            latest = next(p for p, _, _ in entries if _key(p) == _key(latest))
    on_disk = sorted((p for p in scan_prefixes(directory) if _key(p) not in seen), key=lambda p: _order(p, _mtime(p)))
    entries += [(p, None, False) for p in on_disk]
    if latest is None or not _exists(latest):
        existing = [p for p, _, in_state in entries if in_state and _exists(p)]
        latest = existing[-1] if existing else (on_disk[-1] if on_disk else None)
    lookups = {p for p, _, _ in entries[-MAX_STEP_LOOKUPS:]} | ({latest} if latest else set())
    checkpoints = tuple(
        m.RetainedCheckpoint(
            path=p,
            step=checkpoint_step(p, from_index=steps and p in lookups),
            timestamp=stamp,
            exists=_exists(p),
            in_state_file=in_state,
            latest=p == latest,
            number=step_from_name(p),
        )
        for p, stamp, in_state in entries
    )
    leftovers = () if _fs.is_remote(directory) else tuple(leftover_temporaries(directory))
    return DirectoryListing(directory, checkpoints, latest, tuple(problems), leftovers,
                            foreign=tuple(foreign), has_state_file=state is not None)


# What writing a checkpoint at a prefix in a directory would do to the directory (:func:`placement`).
PLACED_LISTED = "listed"  # it replaces a checkpoint the state file lists
PLACED_MEMBER = "member"  # it replaces a checkpoint the directory, resolved by its *.index files, holds
PLACED_LATEST = "latest"  # new, it would be what the directory resolves to


def placement(directory: str, prefix: str) -> str | None:
    """What a checkpoint written now at ``prefix`` (a prefix in ``directory``) would change in
    what ``directory`` resolves to (:func:`read_directory`'s rule).

    A directory whose state file names an existing checkpoint resolves to it: a new prefix
    beside it changes nothing (TensorFlow and CheckpointManager read the state file only), and
    an unlisted one is none of its checkpoints. Without one (no state file, or none of the
    checkpoints it names exists) the directory resolves to the last of its ``*.index`` files
    in :func:`_order`, where a checkpoint written now is the newest of its number.

    Returns:
        :data:`PLACED_LISTED` (a checkpoint the state file lists, its files present or not),
        :data:`PLACED_MEMBER` (an existing one the directory resolves among, no state file
        deciding), :data:`PLACED_LATEST` (a new one the directory would then resolve to), or
        None (nothing the directory resolves to changes).
    """
    listing = read_directory(directory, steps=False)
    here = _key(prefix)
    state_decides = any(c.latest and c.in_state_file for c in listing.checkpoints)
    for c in listing.checkpoints:
        if _key(c.path) == here and c.in_state_file:
            return PLACED_LISTED  # listed: restored or rotated by name, present or not
        if _key(c.path) == here and c.exists:
            return None if state_decides else PLACED_MEMBER
    if state_decides:
        return None
    if listing.latest is None or not _exists(listing.latest):
        return PLACED_LATEST
    return PLACED_LATEST if _order(prefix, float("inf")) > _order(listing.latest, _mtime(listing.latest)) else None


def list_checkpoints(directory: str) -> tuple[list[m.RetainedCheckpoint], str | None]:
    """The checkpoints of a directory and the prefix it resolves to (see :func:`read_directory`).

    Returns:
        (checkpoints, resolved prefix or None when nothing exists).
    """
    listing = read_directory(directory)
    return list(listing.checkpoints), listing.latest
