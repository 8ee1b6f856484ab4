"""The checkpoints a ``scan`` goes through, and what is wrong with their directory.

A series is one of:

* a TF checkpoint directory (``CheckpointManager`` / ``Saver``): every checkpoint its state
  file lists, then those only on disk (:func:`ckptinspect.formats.list_directory`, as ``ls``
  and ``verify`` read it; steps from the names here, ``scan`` opens each checkpoint for its own);
* a directory of checkpoint files a training callback wrote, each with its epoch or step in its
  name (Keras ``ModelCheckpoint``: ``weights.03.weights.h5``, ``model-05.h5``, ``ckpt_7.keras``;
  Lightning: ``epoch=2-step=60.ckpt``), in step order;
* a list of paths, each one checkpoint (a directory in the list is the checkpoint it resolves to).

Which checkpoints a directory holds is the formats' series seam
(:func:`ckptinspect.formats.list_directory`), as for ``ls``, ``verify`` and ``average``. The
directory's health is read here, without opening a checkpoint: the state file's problems
(garbage, paths outside the directory), checkpoints listed but missing or on disk but not
listed, absolute paths written on another machine, data shards no checkpoint owns, and
temporaries left by interrupted writes (ckptinspect's own and TensorFlow's).
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import re
from typing import Any, Sequence

from ..._atomic import leftover_temporaries
from ...formats import (DATA_FILE_RE, INDEX_SUFFIX, STATE_FILE, is_remote, list_directory, name_numbers, path_basename,
                         path_exists, path_isdir, path_join, path_listdir)

__all__ = [
    "SERIES_DIRECTORY",
    "SERIES_KERAS",
    "SERIES_PATHS",
    "HEALTH_KINDS",
    "Entry",
    "Problem",
    "Series",
    "find_series",
    "shard_problems",
    "name_step",
]

SERIES_DIRECTORY = "tf-directory"
SERIES_KERAS = "keras-files"
SERIES_TORCH = "torch-files"
SERIES_PATHS = "paths"

# Health problem kinds (``Problem.kind``).
HEALTH_STATE_FILE = "state-file"  # garbage, not a regular file, outside paths, or no state file at all
HEALTH_MISSING = "missing"  # listed by the state file, its files are not on disk
HEALTH_UNLISTED = "unlisted"  # on disk, not listed by the state file
HEALTH_FOREIGN = "foreign-path"  # an absolute path from another machine in the state file
HEALTH_STALE_SHARD = "stale-shard"  # a data shard whose checkpoint has no index
HEALTH_EXTRA_SHARD = "extra-shard"  # a data shard its checkpoint's index does not name
HEALTH_TEMP = "temp-file"  # left by an interrupted write (ckptinspect's or TensorFlow's)
HEALTH_DAMAGED = "damaged"  # fails verify's checks
HEALTH_KINDS = (HEALTH_STATE_FILE, HEALTH_MISSING, HEALTH_UNLISTED, HEALTH_FOREIGN, HEALTH_STALE_SHARD,
                HEALTH_EXTRA_SHARD, HEALTH_TEMP, HEALTH_DAMAGED)

# TensorFlow's temporaries: a sharded save writes into ``PREFIX_temp/`` (older versions
# ``PREFIX_temp_<32 hex>/``) and renames; the state file is written as ``checkpoint.tmp<32 hex>``.
TF_TEMP_RE = re.compile(r"^(?:.+_temp(?:_[0-9a-f]{32})?|.+\.tmp[0-9a-f]{32})$")
_NUMBER_RE = re.compile(r"(\d+)")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One checkpoint of the series, before it is opened.

    Attributes:
        path: What to open (a prefix, a file, or a path as given).
        number: The number in its name, as the listing reads it (``ckpt-7``: 7,
            ``weights.03.weights.h5``: 3), or None; its training step comes from opening it.
        exists: Whether its files are there.
        in_state_file: Listed by the directory's state file (None outside a TF directory).
        order: Its position in the listing (ties keep it).
        number_source: What ``number`` is (``name:checkpoint`` in a TF directory, ``name``).
    """

    path: str
    number: int | None
    exists: bool = True
    in_state_file: bool | None = None
    order: int = 0
    number_source: str | None = None


@dataclasses.dataclass(frozen=True)
class Problem:
    """One health problem of the series.

    Attributes:
        kind: One of :data:`HEALTH_KINDS`.
        path: The file or checkpoint concerned.
        problem: One line saying what is wrong.
    """

    kind: str
    path: str
    problem: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Series:
    """The checkpoints to scan and the directory's problems.

    Attributes:
        kind: :data:`SERIES_DIRECTORY`, :data:`SERIES_KERAS`, :data:`SERIES_TORCH` or
            :data:`SERIES_PATHS`.
        directory: The directory (None for a list of paths).
        entries: The checkpoints, in listing order.
        problems: Health problems found without opening any checkpoint.
    """

    kind: str
    directory: str | None
    entries: tuple[Entry, ...]
    problems: tuple[Problem, ...] = ()


def name_step(path: str) -> int | None:
    """The number a checkpoint's name carries (``weights.03.weights.h5`` -> 3, ``model-05.h5`` ->
    5, ``ckpt-8`` -> 8, ``epoch=1-step=8.ckpt`` -> 8), or None: the series seam's rule
    (:func:`ckptinspect.formats.name_numbers`). Its place in the series, not a training step."""
    return name_numbers(path).order


def _temporaries(directory: str) -> list[Problem]:
    found = [Problem(HEALTH_TEMP, p, f"{p}: left over from an interrupted ckptinspect write (safe to delete)")
             for p in ([] if is_remote(directory) else leftover_temporaries(directory))]
    for name in path_listdir(directory):
        if TF_TEMP_RE.match(name):
            p = path_join(directory, name)
            found.append(Problem(HEALTH_TEMP, p, f"{p}: a temporary of an interrupted TensorFlow save"))
    return found


def _directory_series(directory: str) -> Series:
    listing = list_directory(directory, steps=False)  # scan opens each checkpoint for its step
    if listing.kind != SERIES_DIRECTORY:  # a folder of checkpoint files, in step order
        entries = tuple(Entry(c.path, c.number, order=i, number_source="name") for i, c in enumerate(listing.checkpoints))
        return Series(listing.kind, directory, entries, tuple(_temporaries(directory)))
    problems = [Problem(HEALTH_STATE_FILE, path_join(directory, STATE_FILE), p) for p in listing.problems]
    state_path = path_join(directory, STATE_FILE)
    if not listing.has_state_file and not listing.problems:
        problems.append(Problem(HEALTH_STATE_FILE, state_path, f"{directory}: no '{STATE_FILE}' state file;"
                                " tf.train.latest_checkpoint finds nothing here"))
    for raw in listing.foreign:
        problems.append(Problem(HEALTH_FOREIGN, state_path, (
            f"{state_path}: names {raw!r}, an absolute path that does not exist here (written on another"
            f" machine?); TensorFlow restores from that path as written; read as {path_basename(raw)} in the directory")))
    entries = []
    if listing.v1 is not None:
        entries.append(Entry(listing.v1, name_step(listing.v1), number_source="name:checkpoint"))
    for i, c in enumerate(listing.checkpoints):
        entries.append(Entry(c.path, c.number, c.exists, c.in_state_file, i, "name:checkpoint"))
        if c.in_state_file and not c.exists:
            problems.append(Problem(HEALTH_MISSING, c.path, f"{c.path}: listed by {state_path} but its files are missing"))
        elif listing.has_state_file and not c.in_state_file:
            problems.append(Problem(HEALTH_UNLISTED, c.path, f"{c.path}: on disk but not listed by {state_path}"
                                    " (CheckpointManager neither restores nor deletes it)"))
    if not path_isdir(directory):  # pragma: no cover - gone meanwhile
        return Series(SERIES_DIRECTORY, directory, tuple(entries), tuple(problems))
    return Series(SERIES_DIRECTORY, directory, tuple(entries), tuple(problems + _temporaries(directory)))


def find_series(paths: Sequence[str]) -> Series:
    """The checkpoints ``paths`` name, and the directory's problems.

    Args:
        paths: One directory (a TF checkpoint directory, or one holding Keras files), or
            checkpoints (each one checkpoint).

    Raises:
        CheckpointNotFoundError, NotACheckpointError: From the listing.
    """
    paths = [str(p) for p in paths]
    if len(paths) == 1 and path_isdir(paths[0]) and not path_exists(paths[0] + INDEX_SUFFIX):
        from ...formats import spec_of  # noqa: PLC0415

        if spec_of(paths[0]).can("series"):
            return _directory_series(paths[0])
    return Series(SERIES_PATHS, None, tuple(Entry(p, name_step(p), order=i, number_source="name") for i, p in enumerate(paths)))


def shard_problems(directory: str, shards: dict[str, int | None]) -> list[Problem]:
    """Data shards of ``directory`` that no checkpoint owns.

    Args:
        directory: The checkpoint directory.
        shards: The number of shards each checkpoint's index names, by prefix (None: its
            index could not be read: its shards are not judged).
    """
    norm = posixpath.normpath if is_remote(directory) else os.path.normpath
    known = {norm(p): n for p, n in shards.items()}
    out = []
    for name in path_listdir(directory):
        match = DATA_FILE_RE.match(name)
        if not match:
            continue
        path = path_join(directory, name)
        prefix = norm(path_join(directory, match.group("prefix")))
        if prefix not in known and not path_exists(prefix + INDEX_SUFFIX):
            out.append(Problem(HEALTH_STALE_SHARD, path, f"{path}: a data shard with no {match.group('prefix')}{INDEX_SUFFIX}"
                               " (left by a deleted or interrupted checkpoint)"))
        elif prefix in known and known[prefix] is not None and int(match.group("num")) != known[prefix]:
            out.append(Problem(HEALTH_EXTRA_SHARD, path, f"{path}: not one of the {known[prefix]} shard(s)"
                               f" {match.group('prefix')}{INDEX_SUFFIX} names (left by an earlier save of that prefix)"))
    return out
