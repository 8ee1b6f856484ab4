"""Atomic outputs: write to a temporary path in the destination directory, rename into place.

Every command that writes (``extract``, ``transplant``, later surgery) goes through here, so
they all keep the same promises (shared/INTERFACE.md, "Writing"):

* an existing output is refused without ``force`` (:class:`~ckptinspect.errors.OutputExistsError`);
* an input is never overwritten, even with ``force`` (pass it as ``protected``);
* the bytes are written under a temporary name in the destination directory (same file
  system, so the final ``os.replace`` is atomic) and only renamed into place when the body of
  the ``with`` block finishes without an exception: check the written output inside the block;
* on any exception, ``KeyboardInterrupt`` included, the temporary files are removed and the
  previous output (if any) is left untouched.

Two shapes of output::

    with atomic_file("out/model.weights.h5", force=force) as tmp:
        write(tmp)          # tmp keeps the whole file name as suffix: ".../.ckptinspect-tmp-<id>.model.weights.h5"
        check(tmp)

    with atomic_prefix("out/model", force=force) as tmp_prefix:
        write_bundle(tmp_prefix)      # writes tmp_prefix.index, tmp_prefix.data-00000-of-00001, ...
        check(tmp_prefix)             # the files are moved to out/model.*, data first, index last

Local paths only (a rename on object stores is not atomic).
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import uuid
from typing import Iterable, Iterator

from .errors import OutputExistsError, UsageError

__all__ = ["TMP_MARK", "atomic_file", "atomic_prefix", "prefix_files", "check_output", "leftover_temporaries"]

TMP_MARK = ".ckptinspect-tmp-"
INDEX_SUFFIX = ".index"
_PREFIX_FILE_RE = r"(\.index|\.data-\d{5}-of-\d{5})$"


def prefix_files(prefix: str) -> list[str]:
    """The files of a TF bundle prefix on disk: ``PREFIX.index`` and ``PREFIX.data-*``."""
    pattern = re.compile(re.escape(os.path.basename(prefix)) + _PREFIX_FILE_RE)
    directory = os.path.dirname(prefix) or "."
    if not os.path.isdir(directory):
        return []
    return sorted(
        os.path.join(os.path.dirname(prefix), name)
        for name in os.listdir(directory)
        if pattern.fullmatch(name)
    )


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _protected_files(protected: Iterable[str]) -> list[str]:
    out = []
    for p in protected:
        p = os.fspath(p)
        out.append(p)
        out.extend(prefix_files(p))  # a TF prefix protects its index and data files
    return out


def check_output(dest: str, *, force: bool = False, prefix: bool = False, protected: Iterable[str] = ()) -> list[str]:
    """Check that ``dest`` may be written, before any work is done.

    Args:
        dest: The output file, or the output prefix when ``prefix`` is set.
        force: Allow replacing an existing output.
        prefix: ``dest`` is a TF bundle prefix (``dest.index`` + ``dest.data-*``).
        protected: Inputs that must never be overwritten (files, directories or TF prefixes).

    Returns:
        The existing files the write will replace (empty unless ``force``).

    Raises:
        UsageError: ``dest`` is remote, is a directory, or would overwrite a protected input.
        OutputExistsError: ``dest`` exists and ``force`` is not set.
    """
    dest = os.fspath(dest)
    if "://" in dest:
        raise UsageError(f"{dest}: outputs must be local paths (a rename on object stores is not atomic)")
    if not os.path.basename(dest):
        raise UsageError(f"{dest}: the output needs a file name, not a directory")
    if os.path.isdir(dest):
        raise UsageError(f"{dest}: is a directory; give an output file name or prefix inside it")
    existing = prefix_files(dest) if prefix else ([dest] if os.path.lexists(dest) else [])
    if prefix and os.path.lexists(dest) and dest not in existing:
        existing.append(dest)
    targets = existing + ([dest + INDEX_SUFFIX] if prefix else [dest])
    for guarded in _protected_files(protected):
        for target in targets:
            if os.path.lexists(target) and os.path.lexists(guarded) and _same(target, guarded):
                raise UsageError(f"{dest}: is the input {guarded}; refusing to overwrite an input")
            if os.path.realpath(target) == os.path.realpath(guarded):
                raise UsageError(f"{dest}: is the input {guarded}; refusing to overwrite an input")
    if existing and not force:
        what = dest if not prefix else f"{dest} ({', '.join(os.path.basename(p) for p in existing)})"
        raise OutputExistsError(f"{what}: output exists; pass --force (force=True) to replace it")
    return existing


def _make_directory(dest: str) -> str:
    directory = os.path.dirname(dest) or "."
    try:
        os.makedirs(directory, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"{dest}: cannot write there: {directory} exists and is not a directory") from None
    except OSError as e:
        raise UsageError(f"{dest}: cannot create the output directory {directory}: {e.strerror or e}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"{dest}: cannot write there: {directory} is not writable")
    return directory


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)


@contextlib.contextmanager
def atomic_file(dest: str, *, force: bool = False, protected: Iterable[str] = ()) -> Iterator[str]:
    """Write one file atomically.

    Yields a temporary path in ``dest``'s directory whose name ends with ``dest``'s whole
    file name (so suffix checks such as Keras' ``.weights.h5`` pass). When the ``with`` body
    returns, the file is renamed to ``dest``; when it raises, the file is removed.

    Args:
        dest: The final path. Its directory is created when missing.
        force: Replace an existing ``dest``.
        protected: Inputs that must never be overwritten.

    Raises:
        OutputExistsError, UsageError: See :func:`check_output`.
    """
    dest = os.fspath(dest)
    check_output(dest, force=force, protected=protected)
    directory = _make_directory(dest)
    tmp = os.path.join(directory, f"{TMP_MARK}{uuid.uuid4().hex[:12]}.{os.path.basename(dest)}")
    try:
        yield tmp
        if not os.path.exists(tmp):
            raise UsageError(f"{dest}: nothing was written")
        check_output(dest, force=force, protected=protected)  # someone may have created it meanwhile
        os.replace(tmp, dest)
    except BaseException:
        _remove(tmp)
        raise


@contextlib.contextmanager
def atomic_prefix(dest: str, *, force: bool = False, protected: Iterable[str] = ()) -> Iterator[str]:
    """Write a TF bundle (``dest.index`` + ``dest.data-*``) atomically.

    Yields a temporary prefix inside a temporary directory in ``dest``'s directory. When the
    ``with`` body returns, every file the bundle wrote (``tmp.index``, ``tmp.data-*``) is
    renamed to ``dest.*``, data files first and the index last, so a reader never finds an
    index whose data is missing; stale files of a replaced output (a ``.data`` shard the new
    bundle does not have) are removed. When the body raises, the temporary directory is
    removed and any previous output is left as it was.

    Args:
        dest: The final prefix. Its directory is created when missing.
        force: Replace an existing bundle at ``dest``.
        protected: Inputs that must never be overwritten.

    Raises:
        OutputExistsError, UsageError: See :func:`check_output`.
    """
    dest = os.fspath(dest)
    check_output(dest, force=force, prefix=True, protected=protected)
    directory = _make_directory(dest)
    tmp_dir = os.path.join(directory, f"{TMP_MARK}{uuid.uuid4().hex[:12]}")
    os.mkdir(tmp_dir)
    tmp_prefix = os.path.join(tmp_dir, os.path.basename(dest))
    try:
        yield tmp_prefix
        written = prefix_files(tmp_prefix)
        if tmp_prefix + INDEX_SUFFIX not in written:
            raise UsageError(f"{dest}: nothing was written (no {os.path.basename(dest)}.index)")
        old = check_output(dest, force=force, prefix=True, protected=protected)
        # The old index goes first and the new one comes last: the index is what makes a
        # prefix a checkpoint, so no reader ever pairs an index with another bundle's data.
        _remove(dest + INDEX_SUFFIX)
        written.sort(key=lambda p: p.endswith(INDEX_SUFFIX))
        new_names = set()
        for path in written:
            target = dest + path[len(tmp_prefix):]
            new_names.add(target)
            os.replace(path, target)
        for path in old:
            if path not in new_names:
                _remove(path)
    finally:
        _remove(tmp_dir)


def leftover_temporaries(directory: str) -> list[str]:
    """Temporary files or directories of interrupted writes in ``directory`` (for tests and cleanup)."""
    return sorted(glob.glob(os.path.join(glob.escape(directory), TMP_MARK + "*")))
