"""Atomic outputs: write to a temporary path in the destination directory, rename into place.

Every command that writes (``extract``, ``transplant``, later surgery) goes through here, so
they all keep the same promises (shared/INTERFACE.md, "Writing"):

* an existing output is refused without ``force`` (:class:`~ckptinspect.errors.OutputExistsError`);
* an input is never overwritten, even with ``force`` (pass it as ``protected``);
* the bytes are written under a temporary name in the destination directory (same file
  system, so the final ``os.replace`` is atomic) and only renamed into place when the body of
  the ``with`` block finishes without an exception: check the written output inside the block;
* on any exception, ``KeyboardInterrupt`` included, the temporary files are removed and the
  previous output (if any) is left untouched;
* SIGTERM and SIGHUP (``kill``, ``timeout``, Slurm, ``docker stop``, a closed terminal) while
  an output is being written unwind the same way (:func:`signals_unwind`), and the process
  then exits with the signal's conventional code, 128 + its number; one arriving while the
  finished files are being renamed into place waits until they all are.

Two shapes of output::

    with atomic_file("out/model.weights.h5", force=force) as tmp:
        write(tmp)          # tmp keeps the whole file name as suffix: ".../.ckptinspect-tmp-<id>.model.weights.h5"
        check(tmp)

    with atomic_prefix("out/model", force=force) as tmp_prefix:
        write_bundle(tmp_prefix)      # writes tmp_prefix.index, tmp_prefix.data-00000-of-00001, ...
        check(tmp_prefix)             # the files are moved to out/model.*, data first, index last

Remote outputs (``s3://``, ``gs://``...; :func:`_remote_check_output` and the remote branches of
:func:`atomic_file` and :func:`atomic_prefix`): the same ``--force`` rules, judged on the objects
there; the output is written to a local temporary directory (``TMPDIR``), checked there, then
uploaded (``formats.remote.upload``: one PUT, or a multipart upload the store shows only once
complete), so each object appears whole or not at all and a failed or interrupted command
leaves the old objects as they were. A TF bundle's data objects go first and its ``.index``
last (an earlier output's ``.index`` is deleted first): a reader never pairs an index with
another bundle's data; between that delete and the new index, the prefix has no checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import re
import shutil
import posixpath
import signal
import stat
import tempfile
import threading
import uuid
import zipfile
from typing import Any, Callable, Iterable, Iterator

from .errors import OutputExistsError, OutputWriteError, UsageError

__all__ = [
    "TMP_MARK",
    "KIND_TF",
    "KIND_HDF5",
    "KIND_NPZ",
    "KIND_ZIP",
    "KIND_SAFETENSORS",
    "KIND_PNG",
    "atomic_file",
    "atomic_prefix",
    "prefix_files",
    "check_output",
    "output_kind_for",
    "unknown_prefix_suffix",
    "prefix_suffix_error",
    "leftover_temporaries",
]

TMP_MARK = ".ckptinspect-tmp-"
INDEX_SUFFIX = ".index"
STATE_FILE = "checkpoint"  # the CheckpointManager / Saver state file of a directory
_PREFIX_FILE_RE = r"(\.index|\.data-\d{5}-of-\d{5})$"
# Suffixes a TF prefix has: model.ckpt, model.ckpt-100, and numbers (weights.05-0.32, step.1000).
_TF_PREFIX_SUFFIX_RE = re.compile(r"\.(?:ckpt(?:-\d+)?|[\d_-]+)", re.IGNORECASE)
_BUNDLE_FILE_SUFFIX_RE = re.compile(r"\.(?:index|data-\d{5}-of-\d{5})$")

# What an output is, so --force replaces only an earlier output of the same kind.
KIND_TF = "tf"
KIND_HDF5 = "hdf5"
KIND_NPZ = "npz"
KIND_ZIP = "zip"
KIND_SAFETENSORS = "safetensors"
KIND_PNG = "png"  # a plot (``scan --plot``): named by the caller, never from the suffix
_KIND_BY_SUFFIX = ((".h5", KIND_HDF5), (".hdf5", KIND_HDF5), (".npz", KIND_NPZ), (".keras", KIND_ZIP),
                   (".safetensors", KIND_SAFETENSORS))
_KIND_NAMES = {
    KIND_TF: "a TF checkpoint prefix",
    KIND_HDF5: "an HDF5 file",
    KIND_NPZ: "a numpy .npz archive",
    KIND_ZIP: "a .keras zip archive",
    KIND_SAFETENSORS: "a .safetensors file",
    KIND_PNG: "a PNG image",
    None: "an output of a kind ckptinspect writes",
}
_INDEX_NAME = "a TF checkpoint index"
_DATA_NAME = "a TF checkpoint data shard"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
HDF5_USERBLOCK_OFFSETS = (0, 512, 1024, 2048)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ZIP_SIGNATURES = (b"PK\x03\x04", b"PK\x05\x06")  # a member first, or an empty archive
NPY_SUFFIX = ".npy"
TABLE_FOOTER_SIZE = 48  # an SSTable footer: handles, padding, 8-byte magic
TABLE_MAGIC = (0xDB4775248B80FB57).to_bytes(8, "little")
SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_TEXTS = ("no space left on device", "disk quota exceeded")
_REFUSE = "--force replaces only an earlier output of the same kind, refusing"


def prefix_files(prefix: str) -> list[str]:
    """The files of a TF bundle prefix on disk: ``PREFIX.index`` and ``PREFIX.data-*``."""
    if "://" in prefix:
        return _remote_prefix_files(prefix)
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


def _guarded_directories(protected: Iterable[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The directories an output must not change, by real path: (source directories, their
    holders). A source directory is a checkpoint directory given as the source (not a
    SavedModel root, which resolves through its ``variables/``): what it resolves to must not
    change. The holders are those and the directories holding a source TF prefix: no state
    file may appear there, and the checkpoints their state file lists are not replaced."""
    sources: dict[str, str] = {}
    holders: dict[str, str] = {}
    for p in protected:
        p = os.fspath(p)
        if "://" in p:
            continue
        if os.path.isdir(p):
            if not any(os.path.exists(os.path.join(p, f)) for f in SAVED_MODEL_FILES):
                sources.setdefault(os.path.realpath(p), p)
                holders.setdefault(os.path.realpath(p), p)
        elif prefix_files(p):
            directory = os.path.dirname(p) or "."
            holders.setdefault(os.path.realpath(directory), directory)
    return sources, holders


def _check_directory(dest: str, prefix: bool, protected: list[str]) -> None:
    """Refuse an output that would change what a source's directory resolves to (see
    :func:`check_output`)."""
    sources, holders = _guarded_directories(protected)
    real_dir = os.path.realpath(os.path.dirname(dest) or ".")
    if real_dir not in holders:
        return
    shown = holders[real_dir]
    if os.path.basename(dest) == STATE_FILE and not prefix:
        raise UsageError(f"{dest}: would be the checkpoint state file of {shown}, the source's directory; "
                         "write the output elsewhere")
    if not prefix:
        return
    # TF's resolution rule, from the TF family itself: through the door, the TF family (whose
    # writers import this module) would depend on every other family (lint-imports' contract)
    from .formats.tf.directory import PLACED_LATEST, PLACED_LISTED, placement  # noqa: PLC0415

    name = os.path.basename(dest)
    placed = placement(shown, os.path.join(shown, name))
    if placed == PLACED_LISTED:
        if os.path.lexists(dest + INDEX_SUFFIX):
            raise UsageError(f"{dest}: would replace {name}, a checkpoint the state file of {shown} (the source "
                             "checkpoint's directory) lists; write the output elsewhere")
        raise UsageError(f"{dest}: would write {name}, a checkpoint the state file of {shown} (the source "
                         "checkpoint's directory) lists, and change what it resolves to; write the output elsewhere")
    if real_dir not in sources or placed is None:
        return
    if placed == PLACED_LATEST:
        raise UsageError(f"{dest}: would add {name}{INDEX_SUFFIX} to {shown}, the source directory, and make it "
                         f"resolve to {name} (it has no '{STATE_FILE}' state file naming a checkpoint); write the "
                         "output elsewhere")
    raise UsageError(f"{dest}: would replace a checkpoint of {shown}, the source directory, which resolves by its "
                     f"*{INDEX_SUFFIX} files (no '{STATE_FILE}' state file naming a checkpoint); write the output elsewhere")


def _describe(path: str, st: os.stat_result) -> str:
    """What is at ``path``, for a refusal: ``a regular file (9 bytes)``, ``a FIFO``..."""
    mode = st.st_mode
    if stat.S_ISREG(mode):
        if os.path.basename(path) == STATE_FILE:
            return f"the checkpoint state file of {os.path.dirname(path) or '.'} ({st.st_size} bytes)"
        return f"a regular file ({st.st_size} bytes)"
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "a special file"  # pragma: no cover


def _read_regular(path: str, spans: Iterable[tuple[int, int]]) -> list[bytes]:
    """Read a few (offset, size) spans of a regular file without following a link or blocking
    on a FIFO swapped in since it was looked at."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        return [os.pread(fd, size, offset) for offset, size in spans]
    finally:
        os.close(fd)


def _is_kind(path: str, size: int, kind: str | None) -> bool:
    """Whether the regular file at ``path`` holds what an output of ``kind`` would."""
    try:
        if kind == "index":
            tail = _read_regular(path, [(max(size - len(TABLE_MAGIC), 0), len(TABLE_MAGIC))])
            return size >= TABLE_FOOTER_SIZE and tail == [TABLE_MAGIC]
        if kind == "data":
            return True  # raw tensor bytes: any content
        if kind == KIND_HDF5:
            heads = _read_regular(path, [(o, len(HDF5_SIGNATURE)) for o in HDF5_USERBLOCK_OFFSETS])
            return HDF5_SIGNATURE in heads
        if kind == KIND_PNG:
            return _read_regular(path, [(0, len(PNG_SIGNATURE))]) == [PNG_SIGNATURE]
        if kind == KIND_SAFETENSORS:  # an 8-byte header length, then the JSON header
            head = _read_regular(path, [(8, 1)])
            return size > 8 and head == [b"{"]
        if kind in (KIND_NPZ, KIND_ZIP):
            head = _read_regular(path, [(0, 4)])
            if not head or head[0] not in ZIP_SIGNATURES:
                return False
            if kind == KIND_ZIP:
                return True
            with zipfile.ZipFile(path) as archive:
                return all(name.endswith(NPY_SUFFIX) for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False
    return False


def _check_replaceable(path: str, kind: str | None, what: str) -> None:
    """Refuse ``path`` unless it is a regular file holding an earlier output of ``kind``."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UsageError(f"{path}: is a symbolic link (to {os.readlink(path)}); --force replaces only regular files "
                         "of an earlier output, refusing")
    if not stat.S_ISREG(st.st_mode) or not _is_kind(path, st.st_size, kind):
        raise UsageError(f"{path}: exists and is {_describe(path, st)}, not {what}; {_REFUSE}")


def unknown_prefix_suffix(dest: str) -> str | None:
    """The suffix of ``dest`` when a TF prefix would not have it, else None.

    ``out/model``, ``ckpt-5``, ``model.ckpt``, ``model.ckpt-100`` and numeric suffixes
    (``weights.05-0.32``) are prefixes; ``out.safetensors`` is not (it would silently become
    ``out.safetensors.index``), nor is ``X.index`` or ``X.data-00000-of-00001`` (a file of the
    bundle whose prefix is ``X``).
    """
    name = os.path.basename(os.fspath(dest))
    bundle_file = _BUNDLE_FILE_SUFFIX_RE.search(name)
    if bundle_file:
        return bundle_file.group()
    suffix = os.path.splitext(name)[1]
    if not suffix or _TF_PREFIX_SUFFIX_RE.fullmatch(suffix):
        return None
    return suffix


def prefix_suffix_error(dest: str, writes: str, override: str) -> UsageError | None:
    """The error for a TF prefix output whose name has a suffix a prefix would not have.

    Args:
        dest: The output.
        writes: What the command writes, for the message (``a TF prefix, .weights.h5 or .npz``).
        override: How to write a TF bundle under that name anyway ("" when there is no way).
    """
    suffix = unknown_prefix_suffix(dest)
    if suffix is None:
        return None
    if _BUNDLE_FILE_SUFFIX_RE.fullmatch(suffix):
        prefix = dest[: -len(suffix)]
        return UsageError(f"{dest}: names a file of a TF checkpoint, not an output; give the prefix {prefix} "
                          f"(it writes {os.path.basename(prefix)}.index and {os.path.basename(prefix)}.data-*)")
    return UsageError(f"{dest}: unknown output suffix {suffix!r}; {writes}" + (f"; {override}" if override else ""))


def output_kind_for(dest: str) -> str | None:
    """The kind of a file output from its suffix (``.h5``, ``.hdf5``, ``.npz``, ``.keras``), or None."""
    name = os.path.basename(dest).lower()
    return next((kind for suffix, kind in _KIND_BY_SUFFIX if name.endswith(suffix)), None)


def check_output(
    dest: str,
    *,
    force: bool = False,
    prefix: bool = False,
    kind: str | None = None,
    protected: Iterable[str] = (),
) -> list[str]:
    """Check that ``dest`` may be written, before any work is done.

    ``force`` replaces only an earlier output of the same kind: the ``.index`` (a real
    checkpoint index) and ``.data-*`` files of a prefix, or a regular file whose content is
    the output's kind (HDF5, an ``.npz`` of ``.npy`` members, a zip). Anything else at the
    output's names (a plain file named like the prefix, the ``checkpoint`` state file, a
    directory, a symlink, a FIFO, a file of another kind) is refused, with or without
    ``force``. So is an output that would change what a source's directory resolves to: a
    file named ``checkpoint`` (a state file) in a source directory or in the directory of a
    source prefix; a checkpoint the state file there lists; and, in a checkpoint directory
    given as the source that no state file decides (it resolves to its newest ``*.index``), a
    new prefix it would then resolve to or one of its checkpoints. A new prefix beside a
    source prefix, or in a directory whose state file names an existing checkpoint, changes
    nothing a directory resolves to and is written.

    Args:
        dest: The output file, or the output prefix when ``prefix`` is set.
        force: Allow replacing an existing output of the same kind.
        prefix: ``dest`` is a TF bundle prefix (``dest.index`` + ``dest.data-*``).
        kind: For a file output, what it holds: :data:`KIND_HDF5`, :data:`KIND_NPZ`,
            :data:`KIND_ZIP`, :data:`KIND_SAFETENSORS` or :data:`KIND_PNG` (default: from the
            suffix; a PNG only when named).
        protected: Inputs that must never be overwritten (files, directories or TF prefixes);
            what a source directory, and the directory of a source prefix, resolve to must
            not change.

    Returns:
        The existing files the write will replace (empty unless ``force``).

    Raises:
        UsageError: ``dest`` is remote, is a directory, would overwrite a protected input or
            change what a source directory resolves to, or something that is not an earlier
            output of the same kind is in the way.
        OutputExistsError: An earlier output is at ``dest`` and ``force`` is not set.
    """
    dest = os.fspath(dest)
    protected = [os.fspath(p) for p in protected]
    if "://" in dest:
        return _remote_check_output(dest, force=force, prefix=prefix, kind=kind, protected=protected)
    if not os.path.basename(dest):
        raise UsageError(f"{dest}: the output needs a file name, not a directory")
    if os.path.isdir(dest) and not os.path.islink(dest):
        raise UsageError(f"{dest}: is a directory; give an output file name or prefix inside it")
    kind = KIND_TF if prefix else (kind or output_kind_for(dest))
    existing = prefix_files(dest) if prefix else ([dest] if os.path.lexists(dest) else [])
    targets = existing + ([dest + INDEX_SUFFIX] if prefix else [dest])
    for guarded in _protected_files(protected):
        for target in targets:
            if os.path.lexists(target) and os.path.lexists(guarded) and _same(target, guarded):
                raise UsageError(f"{dest}: is the input {guarded}; refusing to overwrite an input")
            if os.path.realpath(target) == os.path.realpath(guarded):
                raise UsageError(f"{dest}: is the input {guarded}; refusing to overwrite an input")
    if prefix and os.path.lexists(dest):
        # TF never writes a file at the prefix itself: whatever is there is not our output.
        _check_replaceable(dest, None, _KIND_NAMES[KIND_TF])
    for path in existing:
        if prefix:
            _check_replaceable(path, *(("index", _INDEX_NAME) if path.endswith(INDEX_SUFFIX) else ("data", _DATA_NAME)))
        else:
            _check_replaceable(path, kind, _KIND_NAMES[kind])
    _check_directory(dest, prefix, protected)
    if existing and not force:
        what = dest if not prefix else f"{dest} ({', '.join(os.path.basename(p) for p in existing)})"
        raise OutputExistsError(f"{what}: output exists; pass --force (force=True) to replace it")
    return existing


def _disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a full disk or an exceeded quota, however the
    writer (Python, h5py, TensorFlow) reported it."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _DISK_FULL_ERRNOS:
            return True
        if any(text in str(exc).lower() for text in _DISK_FULL_TEXTS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _disk_full_error(dest: str) -> OutputWriteError:
    return OutputWriteError(f"{dest}: cannot write the output: no space left on device; nothing was written")


def _make_directory(dest: str) -> tuple[str, list[str]]:
    """Create ``dest``'s directory; return it and the directories created, outermost first."""
    directory = os.path.dirname(dest) or "."
    created = []
    parent = directory
    while parent and not os.path.lexists(parent):
        created.insert(0, parent)
        parent = os.path.dirname(parent)
    try:
        os.makedirs(directory, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"{dest}: cannot write there: {directory} exists and is not a directory") from None
    except OSError as e:
        _remove_created(created)
        if _disk_full(e):
            raise _disk_full_error(dest) from None
        raise UsageError(f"{dest}: cannot create the output directory {directory}: {e.strerror or e}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"{dest}: cannot write there: {directory} is not writable")
    return directory, created


def _remove_created(created: list[str]) -> None:
    """Remove the directories a failed write created, innermost first, if they are empty."""
    for path in reversed(created):
        with contextlib.suppress(OSError):
            os.rmdir(path)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)


# -- signals ---------------------------------------------------------------------------------
UNWINDING_SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s)


class Terminated(SystemExit):
    """SIGTERM or SIGHUP while an output was being written: raised in the main thread so that
    the temporary files are removed on the way out; exits with 128 + the signal's number."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


class _SignalState(threading.local):
    depth = 0
    deferring = 0
    pending: int | None = None
    previous: dict = {}


_signals = _SignalState()


def _on_signal(signum: int, frame: Any) -> None:
    if _signals.deferring:
        _signals.pending = signum  # raised once the files are in place
        return
    raise Terminated(signum)


@contextlib.contextmanager
def signals_unwind() -> Iterator[None]:
    """While the body runs (in the main thread), SIGTERM and SIGHUP raise :class:`Terminated`
    instead of ending the process at once, so ``finally`` and ``except BaseException`` blocks
    remove what was being written. Handlers someone else installed are left alone; nesting is
    fine; the previous handlers come back afterwards. Elsewhere than the main thread (where
    Python cannot set handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _signals.depth == 0:
        previous = {}
        for sig in UNWINDING_SIGNALS:
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                previous[sig] = signal.signal(sig, _on_signal)
        _signals.previous = previous
    _signals.depth += 1
    try:
        yield
    finally:
        _signals.depth -= 1
        if _signals.depth == 0:
            for sig, handler in _signals.previous.items():
                signal.signal(sig, handler)
            _signals.previous = {}


@contextlib.contextmanager
def _signals_wait() -> Iterator[None]:
    """A signal arriving in the body (renames into place) is raised only when it is done."""
    _signals.deferring += 1
    try:
        yield
    finally:
        _signals.deferring -= 1
        pending, _signals.pending = _signals.pending, None
        if pending is not None and not _signals.deferring:
            raise Terminated(pending)


@contextlib.contextmanager
def atomic_file(
    dest: str, *, force: bool = False, kind: str | None = None, protected: Iterable[str] = ()
) -> Iterator[str]:
    """Write one file atomically.

    Yields a temporary path in ``dest``'s directory whose name ends with ``dest``'s whole
    file name (so suffix checks such as Keras' ``.weights.h5`` pass). When the ``with`` body
    returns, the file is renamed to ``dest``; when it raises, the file (and any directory
    created for it) is removed. A full disk is reported against ``dest``, not the temporary.

    Args:
        dest: The final path. Its directory is created when missing.
        force: Replace an existing ``dest`` of the same kind.
        kind: What the file holds (:data:`KIND_HDF5`, :data:`KIND_NPZ`, :data:`KIND_ZIP`;
            default from the suffix), which ``force`` checks an existing ``dest`` against.
        protected: Inputs that must never be overwritten.

    Raises:
        OutputExistsError, UsageError: See :func:`check_output`.
        OutputWriteError: The disk is full (or the quota exceeded).
    """
    dest = os.fspath(dest)
    check_output(dest, force=force, kind=kind, protected=protected)
    if "://" in dest:
        with _remote_temporary() as tmp_dir:
            tmp = os.path.join(tmp_dir, f"{TMP_MARK}{uuid.uuid4().hex[:12]}.{posixpath.basename(dest)}")
            with signals_unwind():
                yield tmp
                if not os.path.exists(tmp):
                    raise UsageError(f"{dest}: nothing was written")
                check_output(dest, force=force, kind=kind, protected=protected)  # someone may have written it meanwhile
                with _signals_wait():
                    _remote_api().upload(tmp, dest)
        return
    directory, created = _make_directory(dest)
    tmp = os.path.join(directory, f"{TMP_MARK}{uuid.uuid4().hex[:12]}.{os.path.basename(dest)}")
    try:
        with signals_unwind():
            yield tmp
            if not os.path.exists(tmp):
                raise UsageError(f"{dest}: nothing was written")
            check_output(dest, force=force, kind=kind, protected=protected)  # someone may have created it meanwhile
            with _signals_wait():
                os.replace(tmp, dest)
    except BaseException as e:
        _remove(tmp)
        _remove_created(created)
        if isinstance(e, Exception) and _disk_full(e):
            raise _disk_full_error(dest) from e
        raise


@contextlib.contextmanager
def atomic_prefix(dest: str, *, force: bool = False, protected: Iterable[str] = ()) -> Iterator[str]:
    """Write a TF bundle (``dest.index`` + ``dest.data-*``) atomically.

    Yields a temporary prefix inside a temporary directory in ``dest``'s directory. When the
    ``with`` body returns, every file the bundle wrote (``tmp.index``, ``tmp.data-*``) is
    renamed to ``dest.*``, data files first and the index last, so a reader never finds an
    index whose data is missing; stale files of a replaced output (a ``.data`` shard the new
    bundle does not have) are removed. When the body raises, the temporary directory (and
    any directory created for the output) is removed and any previous output is left as it
    was. A full disk is reported against ``dest``, not the temporary.

    Args:
        dest: The final prefix. Its directory is created when missing.
        force: Replace an existing bundle at ``dest``.
        protected: Inputs that must never be overwritten.

    Raises:
        OutputExistsError, UsageError: See :func:`check_output`.
        OutputWriteError: The disk is full (or the quota exceeded).
    """
    dest = os.fspath(dest)
    check_output(dest, force=force, prefix=True, protected=protected)
    if "://" in dest:
        with _remote_temporary() as tmp_dir, signals_unwind():
            tmp_prefix = os.path.join(tmp_dir, posixpath.basename(dest))
            yield tmp_prefix
            written = _written_bundle(tmp_prefix, dest)
            old = check_output(dest, force=force, prefix=True, protected=protected)
            remote = _remote_api()
            with _signals_wait():
                _publish_bundle(written, tmp_prefix, dest, old, remote.upload, remote.remove)
        return
    directory, created = _make_directory(dest)
    tmp_dir = os.path.join(directory, f"{TMP_MARK}{uuid.uuid4().hex[:12]}")
    tmp_prefix = os.path.join(tmp_dir, os.path.basename(dest))
    done = False
    unwind = signals_unwind()
    try:
        unwind.__enter__()
        os.mkdir(tmp_dir)
        yield tmp_prefix
        written = _written_bundle(tmp_prefix, dest)
        old = check_output(dest, force=force, prefix=True, protected=protected)
        with _signals_wait():  # a signal now waits until every file is in place
            _publish_bundle(written, tmp_prefix, dest, old, os.replace, _remove)
            done = True
    except Exception as e:
        if _disk_full(e):
            _remove(tmp_dir)
            _remove_created(created)
            raise _disk_full_error(dest) from e
        raise
    finally:
        _remove(tmp_dir)
        if not done:
            _remove_created(created)
        unwind.__exit__(None, None, None)


def _written_bundle(tmp_prefix: str, dest: str) -> list[str]:
    """The files the ``with`` body wrote at ``tmp_prefix``; an error when it wrote no index."""
    written = prefix_files(tmp_prefix)
    if tmp_prefix + INDEX_SUFFIX not in written:
        raise UsageError(f"{dest}: nothing was written (no {posixpath.basename(dest)}.index)")
    return written


def _publish_bundle(written: list[str], tmp_prefix: str, dest: str, old: list[str],
                    move: Callable[[str, str], Any], remove: Callable[[str], Any]) -> None:
    """Put a written bundle in place at ``dest``, on disk (``os.replace``) or in an object store
    (upload): the old index goes first and the new one comes last, since the index is what makes
    a prefix a checkpoint, so no reader ever pairs an index with another bundle's data; then the
    old files the new bundle does not have (a ``.data`` shard) are removed."""
    if dest + INDEX_SUFFIX in old:
        remove(dest + INDEX_SUFFIX)
    new_names = set()
    for path in sorted(written, key=lambda p: p.endswith(INDEX_SUFFIX)):
        target = dest + path[len(tmp_prefix):]
        new_names.add(target)
        move(path, target)
    for path in old:
        if path not in new_names:
            remove(path)


# -- remote outputs --------------------------------------------------------------------------
def _remote_api() -> Any:
    from .formats import remote  # noqa: PLC0415 - object stores only

    return remote


@contextlib.contextmanager
def _remote_temporary() -> Iterator[str]:
    """A local temporary directory for an output on its way to an object store, removed after."""
    tmp_dir = tempfile.mkdtemp(prefix=TMP_MARK)
    try:
        yield tmp_dir
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def _remote_prefix_files(prefix: str) -> list[str]:
    remote = _remote_api()
    directory = posixpath.dirname(prefix)
    info = remote.stat(directory) if "://" in directory and not directory.endswith("://") else None
    if info is None or info.kind != "dir":
        return []
    pattern = re.compile(re.escape(posixpath.basename(prefix)) + _PREFIX_FILE_RE)
    return sorted(posixpath.join(directory, n) for n in remote.listdir(directory) if pattern.fullmatch(n))


def _remote_is_kind(path: str, size: int, kind: str | None) -> bool:
    remote = _remote_api()
    try:
        with remote.open_file(path) as f:
            if kind == "index":
                return size >= TABLE_FOOTER_SIZE and f.pread(size - len(TABLE_MAGIC), len(TABLE_MAGIC)) == TABLE_MAGIC
            if kind == "data":
                return True
            if kind == KIND_HDF5:
                return any(f.pread(o, len(HDF5_SIGNATURE)) == HDF5_SIGNATURE for o in HDF5_USERBLOCK_OFFSETS)
            if kind == KIND_PNG:
                return f.pread(0, len(PNG_SIGNATURE)) == PNG_SIGNATURE
            if kind == KIND_SAFETENSORS:
                return size > 8 and f.pread(8, 1) == b"{"
            if kind in (KIND_NPZ, KIND_ZIP):
                if f.pread(0, 4) not in ZIP_SIGNATURES:
                    return False
                if kind == KIND_ZIP:
                    return True
                with zipfile.ZipFile(f) as archive:
                    return all(name.endswith(NPY_SUFFIX) for name in archive.namelist())
    except (OSError, ValueError, zipfile.BadZipFile):
        return False
    return False


def _remote_check_output(dest: str, *, force: bool, prefix: bool, kind: str | None, protected: list[str]) -> list[str]:
    """:func:`check_output` for an output on an object store (the same rules, on its objects)."""
    remote = _remote_api()
    if not posixpath.basename(dest) or dest.endswith("/"):
        raise UsageError(f"{dest}: the output needs a file name, not a directory")
    here = remote.stat(dest)
    if here is not None and here.kind == "dir":
        raise UsageError(f"{dest}: is a directory; give an output file name or prefix inside it")
    kind = KIND_TF if prefix else (kind or output_kind_for(dest))
    existing = _remote_prefix_files(dest) if prefix else ([dest] if here is not None else [])
    targets = existing + ([dest + INDEX_SUFFIX] if prefix else [dest])
    def norm(p: str) -> str:  # posixpath.normpath would turn s3://b into s3:/b
        scheme, _, rest = p.partition("://")
        return f"{scheme}://{posixpath.normpath(rest)}"

    guarded = {norm(p) for p in protected if "://" in p}
    guarded |= {norm(f) for p in protected if "://" in p for f in _remote_prefix_files(p)}
    for target in targets:
        if norm(target) in guarded:
            raise UsageError(f"{dest}: is the input {target}; refusing to overwrite an input")
    if prefix and here is not None:
        raise UsageError(f"{dest}: exists and is an object, not {_KIND_NAMES[KIND_TF]}; {_REFUSE}")
    for path in existing:
        size = (remote.stat(path) or remote.Stat("file", 0)).size or 0
        if prefix:
            part, what = ("index", _INDEX_NAME) if path.endswith(INDEX_SUFFIX) else ("data", _DATA_NAME)
        else:
            part, what = kind, _KIND_NAMES[kind]
        if not _remote_is_kind(path, size, part):
            raise UsageError(f"{path}: exists and is an object of {size} bytes, not {what}; {_REFUSE}")
    directory = norm(posixpath.dirname(dest))
    for p in protected:
        if "://" not in p:
            continue
        info = remote.stat(p)
        source_dir = norm(p) if info is not None and info.kind == "dir" else (
            norm(posixpath.dirname(p)) if _remote_prefix_files(p) else None)
        if prefix and source_dir == directory:
            raise UsageError(f"{dest}: would change {source_dir}, the source checkpoint's directory; write the output"
                             " elsewhere")
    if existing and not force:
        what = dest if not prefix else f"{dest} ({', '.join(posixpath.basename(p) for p in existing)})"
        raise OutputExistsError(f"{what}: output exists; pass --force (force=True) to replace it")
    return existing


def leftover_temporaries(directory: str) -> list[str]:
    """Temporary files or directories of interrupted writes in ``directory`` (for tests and cleanup)."""
    return sorted(glob.glob(os.path.join(glob.escape(directory), TMP_MARK + "*")))
