"""The one door from the operations into the formats: detection, opening and checking.

Operations import only this package's public names (an import-linter contract): they open a
:class:`~ckptinspect.model.Checkpoint` with :func:`open_checkpoint` and read through its
tensor source, or check one with :func:`prepare_check`. One module per format family,
picked by content (:func:`detect`) and registered once in :data:`_FORMATS`. Detection uses the
signature modules only (``_layout``, ``_sstable``, ``_torch_layout``); a format's module is
imported when its format is opened or checked, and the public names that come from the TF
readers (:data:`_LAZY_NAMES`) on first use, so listing one format loads no other reader:

* :mod:`.tf_bundle` - TF bundle checkpoints (``.index`` + ``.data-*``), TF1 and TF2, with
  :mod:`.tf_data` for their data files at the byte level and :mod:`.tf_object_graph` for a
  TF2 checkpoint's object graph (names and roles).
* :mod:`.tf_v1` - TF V1 table checkpoints (one file, no ``.index``).
* :mod:`.tf_state` - checkpoint directories (``checkpoint`` state file).
* :mod:`.keras_h5` - Keras HDF5 files (legacy ``.h5``, ``.weights.h5``, sharded weights).
* :mod:`.keras_zip` - ``.keras`` zip archives.
* :mod:`.npz` - numpy ``.npz`` files (what ``extract -o out.npz`` writes).
* :mod:`.tf_writer` - writing TF bundles (``extract``, ``transplant``).
* :mod:`.bundle_writer` - writing TF bundles without TensorFlow, copying unchanged tensors
  byte for byte.
* :mod:`.tf_graph_edit` - editing a TF2 object graph without TensorFlow (``rewrite``).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
from typing import TYPE_CHECKING, Any, Callable

from .. import model as m
from ..errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    NotACheckpointError,
    UnallocatedDataError,
)
from . import _fs
from ._layout import (
    DATA_FILE_RE,
    HDF5_HEAD_BYTES,
    INDEX_SUFFIX,
    STATE_FILE,
    ZIP_SIGNATURE,
    is_hdf5_head,
)
from .tf.sstable import is_table
from ._torch_layout import hf_weights_in, is_hf_index, is_safetensors_head, is_torch_legacy_head, is_torch_zip
from .tf.crc import mask as mask_crc32c

if TYPE_CHECKING:  # imported on first use (see _LAZY_NAMES): `ls x.safetensors` never loads the TF readers
    from .tf.index import OBJECT_GRAPH_KEY
    from .tf.bundle import StoredSliceBlocks, object_graph_bytes, stored_slice_blocks, stream_blocks
    from .tf.directory import DirectoryListing, checkpoint_present, checkpoint_step

__all__ = [
    "Kind",
    "detect",
    "open_checkpoint",
    "prepare_check",
    "Check",
    "list_directory",
    "DirectoryListing",
    "directory_fingerprint",
    "directory_changed",
    "checkpoint_step",
    "checkpoint_present",
    "is_remote",
    "check_regular",
    "DATA_FILE_RE",
    "INDEX_SUFFIX",
    "STATE_FILE",
    # writing TF bundles (extract, transplant)
    "OBJECT_GRAPH_KEY",
    "BundleTensor",
    "write_bundle",
    "object_graph_tensor",
    "prune_object_graph",
    "restore_tensor",
    "numpy_view",
    # writing TF bundles without TensorFlow (bundle_writer)
    "OutputTensor",
    "TensorData",
    "StoredBytes",
    "WriteSummary",
    "write_bundle_native",
    "save_bundle_native",
    "copy_tensor",
    "compare_copy",
    # writing safetensors (extract)
    "write_safetensors",
    # editing TF2 object graphs without TensorFlow (rewrite)
    "GraphEdit",
    "EditedGraph",
    "edit_object_graph",
    "escape_path",
    "unescape_path",
    # average: streaming stored slices, the object graph's bytes, TF's checksum mask
    "StoredSliceBlocks",
    "stored_slice_blocks",
    "object_graph_bytes",
    "mask_crc32c",
    # scan: blocks of a bundle's values read without TensorFlow, from several threads
    "stream_blocks",
]
check_regular = _fs.check_regular  # outputs copy from source files: refuse FIFOs and devices first
SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
SAVED_MODEL_VARIABLES = "variables/variables"
KERAS_SHARDED_INDEX_SUFFIX = ".weights.json"
KERAS_SUFFIXES = (".h5", ".hdf5", ".keras", KERAS_SHARDED_INDEX_SUFFIX)
MAX_LISTED = 5  # paths named in a "pass one of them" message
RESOLVE_ATTEMPTS = 3  # listings of a live directory whose resolved checkpoint vanished before it opened
EXPECTED = (
    "expected a TF checkpoint prefix or its .index file, a checkpoint directory, a SavedModel "
    "directory, a Keras .h5/.weights.h5/.keras file, a torch.save file, a .safetensors file or a Hugging Face"
    " weights folder/index"
)


class Kind(enum.Enum):
    """What a path turned out to be."""

    TF_BUNDLE = "tf-bundle"
    TF_DIRECTORY = "tf-directory"
    TF_SAVEDMODEL = "tf-savedmodel"
    TF_V1 = "tf-v1-table"
    HDF5 = "hdf5"
    KERAS_SHARDED = "keras-sharded"
    ZIP = "zip"
    NPZ = "npz"
    SAFETENSORS = "safetensors"
    TORCH_ZIP = "torch-zip"
    TORCH_LEGACY = "torch-legacy"
    HF_SHARDED = "hf-sharded"


def _is_hdf5(path: str) -> bool:
    return is_hdf5_head(_fs.read_head(path, HDF5_HEAD_BYTES))


def _is_savedmodel(directory: str) -> bool:
    return any(_fs.exists(_fs.join(directory, f)) for f in SAVED_MODEL_FILES) and _fs.exists(
        _fs.join(directory, SAVED_MODEL_VARIABLES + ".index")
    )


def _table_kind(path: str) -> Kind | None:
    """TF_BUNDLE or TF_V1 for an SSTable file, None for anything else (special files included).

    Reads the 48-byte footer, and for a table the index block and first data block only.
    """
    if not _fs.is_regular(path):
        return None
    size = _fs.getsize(path)
    if size < 48:
        return None
    tail = _fs.read_range(path, size - 48, 48)
    if not is_table(tail):
        return None
    from .tf.v1 import is_v1_table  # noqa: PLC0415 - the TF readers load for tables only

    return Kind.TF_V1 if is_v1_table(path) else Kind.TF_BUNDLE


def detect(path: str) -> tuple[Kind, str]:
    """Decide what ``path`` is from its content.

    Returns:
        (kind, the path to open: a prefix for bundles, the directory, or the file).

    Raises:
        CheckpointNotFoundError: Nothing at ``path``.
        NotACheckpointError: Something that is not a checkpoint, or a part of one.
    """
    _fs.check_remote(path)  # an unsupported scheme or an unreachable file system: say so first
    name = _fs.basename(path)
    data_match = DATA_FILE_RE.match(name)
    if (
        name
        and _fs.exists(path + INDEX_SUFFIX)
        and (_fs.is_remote(path) or not _fs.isdir(path))
        and not (_fs.is_regular(path) and not _fs.is_regular(path + INDEX_SUFFIX))
    ):
        # A prefix. (Remote file systems such as ram:// report prefixes as directories.) A
        # regular file next to a FIFO or device named like its index is that file.
        return Kind.TF_BUNDLE, path
    if not _fs.exists(path):
        if data_match:
            raise CheckpointNotFoundError(f"{path}: no such file (and data shards are not checkpoints)")
        raise CheckpointNotFoundError(f"{path}: no such file, directory or checkpoint prefix")
    if _fs.isdir(path):
        if _is_savedmodel(path):
            return Kind.TF_SAVEDMODEL, path
        if (hf := hf_weights_in(path)) is not None:
            return detect(hf)
        return Kind.TF_DIRECTORY, path
    if not _fs.is_remote(path):
        _fs.check_regular(path)  # a FIFO would block every read below; a device never ends
    if data_match:
        prefix = path[: len(path) - len(name)] + data_match.group("prefix")
        raise NotACheckpointError(
            f"{path}: is a data shard, not a checkpoint; pass the prefix {prefix} (or {prefix}{INDEX_SUFFIX})"
        )
    if name in SAVED_MODEL_FILES:
        directory = _fs.dirname(path) or "."
        if _is_savedmodel(directory):
            raise NotACheckpointError(
                f"{path}: is a SavedModel's graph, not a checkpoint; pass its directory {directory}"
                f" (its variables are in {_fs.join(directory, SAVED_MODEL_VARIABLES)})"
            )
        raise NotACheckpointError(f"{path}: is a SavedModel's graph, and its directory holds no"
                                  f" {SAVED_MODEL_VARIABLES}.index: no variables to inspect")
    if name == STATE_FILE and not _is_hdf5(path):
        directory = _fs.dirname(path) or "."
        raise NotACheckpointError(
            f"{path}: is the checkpoint state file, not a checkpoint; pass its directory {directory}"
            " or a checkpoint prefix it names"
        )
    if _is_hdf5(path):
        return Kind.HDF5, path
    head = _fs.read_head(path, 4)
    if head == ZIP_SIGNATURE:
        if is_torch_zip(path):
            return Kind.TORCH_ZIP, path
        from .npz import is_npz  # noqa: PLC0415 - numpy only for zip files

        return (Kind.NPZ if is_npz(path) else Kind.ZIP), path
    if is_hf_index(name):
        return Kind.HF_SHARDED, path
    if is_torch_legacy_head(_fs.read_head(path, 32)):
        return Kind.TORCH_LEGACY, path
    if name.endswith(KERAS_SHARDED_INDEX_SUFFIX):
        return Kind.KERAS_SHARDED, path
    kind = _table_kind(path)
    if kind is Kind.TF_BUNDLE:
        if not path.endswith(INDEX_SUFFIX):
            raise NotACheckpointError(f"{path}: is a checkpoint index without the .index suffix; {EXPECTED}")
        return Kind.TF_BUNDLE, path[: -len(INDEX_SUFFIX)]
    if kind is Kind.TF_V1:
        return Kind.TF_V1, path
    if is_safetensors_head(_fs.read_head(path, 10)):
        return Kind.SAFETENSORS, path
    if name.endswith(INDEX_SUFFIX):
        size = _fs.getsize(path)
        raise CorruptCheckpointError(
            f"{path}: not a valid checkpoint index ({size} bytes, no table footer: truncated or not an index)"
        )
    if name.endswith(".meta"):
        raise NotACheckpointError(f"{path}: is a MetaGraphDef, not a checkpoint; pass the prefix {path[:-5]}")
    if name.endswith((".h5", ".hdf5", ".keras")):
        raise NotACheckpointError(f"{path}: has a Keras suffix but is neither HDF5 nor a zip archive (truncated or not a Keras file)")
    raise NotACheckpointError(f"{path}: not a checkpoint; {EXPECTED}")


def _v1_in_directory(directory: str) -> str | None:
    """The last V1 checkpoint file of a directory that holds no TF bundle."""
    for name in reversed(_fs.listdir(directory)):
        candidate = _fs.join(directory, name)
        if _fs.isfile(candidate) and _table_kind(candidate) is Kind.TF_V1:
            return candidate
    return None


def _nothing_found(directory: str, problems: tuple[str, ...] = ()) -> NotACheckpointError:
    """Why a directory holds no checkpoint, pointing at what it does hold."""
    names = _fs.listdir(directory)
    exports = [n for n in names if _fs.isdir(_fs.join(directory, n)) and _is_savedmodel(_fs.join(directory, n))]
    if exports:
        shown = sorted(exports, key=lambda n: (n.isdigit(), int(n) if n.isdigit() else 0, n), reverse=True)
        listed = ", ".join(_fs.join(directory, n) for n in shown[:MAX_LISTED])
        more = f" (+{len(shown) - MAX_LISTED} more)" if len(shown) > MAX_LISTED else ""
        return NotACheckpointError(
            f"{directory}: an export directory holding {len(exports)} SavedModel{'s' if len(exports) != 1 else ''},"
            f" not a checkpoint; pass one of them: {listed}{more}"
        )
    keras = [n for n in names if n.endswith(KERAS_SUFFIXES) and _fs.isfile(_fs.join(directory, n))]
    if keras:
        listed = ", ".join(_fs.join(directory, n) for n in keras[:MAX_LISTED])
        more = f" (+{len(keras) - MAX_LISTED} more)" if len(keras) > MAX_LISTED else ""
        return NotACheckpointError(
            f"{directory}: holds Keras file{'s' if len(keras) != 1 else ''}, not a TF checkpoint directory;"
            f" pass one of them: {listed}{more}"
        )
    message = (f"{directory}: no checkpoint found in the directory (no 'checkpoint' state file naming"
               " existing files, no *.index, no saved_model.pb)")
    return NotACheckpointError(message + (f"; also: {problems[0]}" if problems else ""))


def _open_directory(directory: str) -> m.Checkpoint:
    """The checkpoint a directory resolves to, opened and pinned (its data files held open, so
    a process saving into the directory can rotate it out while the command reads it); the
    directory's problems (state file, leftover temporaries) ride along in ``info["warnings"]``.

    A checkpoint deleted between listing the directory and opening it (rotated out by a
    CheckpointManager) is not an error: the directory is listed again, up to
    :data:`RESOLVE_ATTEMPTS` times. Once open, the command sticks to that checkpoint.
    """
    from .tf.bundle import open_bundle  # noqa: PLC0415 - see _LAZY_NAMES
    from .tf.directory import checkpoint_present  # noqa: PLC0415
    from .tf.v1 import open_v1  # noqa: PLC0415

    for attempt in range(1, RESOLVE_ATTEMPTS + 1):
        listing = list_directory(directory)
        if listing.v1 is not None:  # a directory holding only V1 checkpoint files (export-00000-of-00001)
            return _with_warnings(open_v1(listing.v1), listing.warnings)
        latest = listing.latest
        if latest is None:  # the state file names checkpoints, none of them exists
            v1 = _v1_in_directory(directory)  # a V1 Saver's state file may name a pattern
            if v1 is None:
                raise _nothing_found(directory, listing.problems)
            return _with_warnings(open_v1(v1), listing.warnings)
        try:
            if not _fs.exists(latest + INDEX_SUFFIX) and _fs.isfile(latest):
                ckpt = open_v1(latest, checkpoints=listing.checkpoints)
            else:
                ckpt = open_bundle(latest, checkpoints=listing.checkpoints)
                if (ckpt.info.get("object_graph") or {}).get("error") and attempt < RESOLVE_ATTEMPTS \
                        and not checkpoint_present(latest):
                    ckpt.close()  # its files went while it was read (rotated out), not damage: resolve again
                    continue
                pin = getattr(ckpt.source, "pin", None)
                if pin is not None:
                    pin()
        except CheckpointNotFoundError:
            if attempt < RESOLVE_ATTEMPTS and not checkpoint_present(latest):
                continue  # rotated out before we could open it: resolve again
            raise
        return _with_warnings(ckpt, listing.warnings)
    raise AssertionError("unreachable")  # pragma: no cover


def _with_warnings(ckpt: m.Checkpoint, warnings: tuple[str, ...]) -> m.Checkpoint:
    if not warnings:
        return ckpt
    # The directory's first, then the checkpoint's own (an unreadable entry or object graph).
    return dataclasses.replace(ckpt, info={**ckpt.info, "warnings": [*warnings, *ckpt.info.get("warnings", ())]})


def _open_bundle(prefix: str) -> m.Checkpoint:
    from .tf.bundle import open_bundle  # noqa: PLC0415 - see _LAZY_NAMES

    return open_bundle(prefix)


def _open_savedmodel(directory: str) -> m.Checkpoint:
    from .tf.bundle import open_bundle  # noqa: PLC0415

    return open_bundle(_fs.join(directory, SAVED_MODEL_VARIABLES), format=m.FORMAT_TF_SAVEDMODEL)


# -- checking (verify) -------------------------------------------------------------------------
class Check:
    """A planned check of one checkpoint: ``total`` tensors, checked by :meth:`run`.

    Formats with a byte-level plan (TF bundles) provide their own; this one wraps a function.
    """

    def __init__(self, path: str, fn: Callable[[m.Progress | None, int, int | None], m.CheckResult], total: int = 0):
        self.path = path
        self.total = total
        self._fn = fn

    def run(self, progress: m.Progress | None = None, done: int = 0, total: int | None = None) -> m.CheckResult:
        return self._fn(progress, done, total)


def _check_by_reading(path: str, opener: Callable[[str], m.Checkpoint]) -> Check:
    """Open the file (with its reader's safety checks) and read every variable, in blocks."""
    from ._zip import member_damage  # noqa: PLC0415 - only for zip archives (.keras, .npz)

    try:
        ckpt = opener(path)
    except CorruptCheckpointError as e:
        result = m.CheckResult(path, None, m.STATUS_DAMAGED, problems=(str(e),))
        return Check(path, lambda *_: result)

    def run(progress: m.Progress | None, done: int, total: int | None) -> m.CheckResult:
        total = len(ckpt.variables) if total is None else total
        damaged: list[m.Damage] = []
        nbytes = 0
        with ckpt:
            if ckpt.format in (m.FORMAT_KERAS_ZIP, m.FORMAT_NPZ) and not _fs.is_remote(path):
                damaged = member_damage(path)
            for var in ckpt.variables:
                try:
                    for block in ckpt.iter_blocks(var, CHECK_BLOCK_ELEMENTS):
                        nbytes += int(getattr(block, "nbytes", 0))
                except CorruptCheckpointError as e:
                    kind = m.DAMAGE_UNALLOCATED if isinstance(e, UnallocatedDataError) else m.DAMAGE_UNREADABLE
                    damaged.append(m.Damage(key=var.key, name=var.name, file=path, kind=kind, problem=str(e)))
                done += 1
                if progress is not None:
                    progress(done, total, var)
        status = m.STATUS_DAMAGED if damaged else m.STATUS_INTACT
        return m.CheckResult(path, ckpt.format, status, step=ckpt.step, tensors=len(ckpt.variables),
                             nbytes=nbytes, damaged=tuple(damaged))

    return Check(path, run, len(ckpt.variables))


def _check_bundle(prefix: str) -> Any:
    from .tf.bundle import check_bundle  # noqa: PLC0415 - see _LAZY_NAMES

    if _fs.isdir(prefix + INDEX_SUFFIX):
        raise NotACheckpointError(f"{prefix}{INDEX_SUFFIX}: is a directory, not an index file")
    return check_bundle(prefix)


def _check_savedmodel(directory: str) -> Any:
    from .tf.bundle import check_bundle  # noqa: PLC0415

    return check_bundle(_fs.join(directory, SAVED_MODEL_VARIABLES), format=m.FORMAT_TF_SAVEDMODEL)


def _open_v1(path: str) -> m.Checkpoint:
    from .tf.v1 import open_v1  # noqa: PLC0415 - see _LAZY_NAMES

    return open_v1(path)


def _check_v1(path: str) -> Check:
    from .tf.v1 import check_v1  # noqa: PLC0415

    return Check(path, lambda *_: check_v1(path), 1)


# -- the registry ------------------------------------------------------------------------------
class _Format:
    """How to open and how to check one kind of path (a plain class: a dataclass costs start-up)."""

    __slots__ = ("open", "check")

    def __init__(self, open: Callable[[str], m.Checkpoint], check: Callable[[str], Any]):  # noqa: A002
        self.open = open
        self.check = check


def _deferred(module: str, name: str) -> Callable[[str], Any]:
    """``module.name(path)``, the module imported on first call: the Keras, npz and PyTorch
    readers bring numpy (and h5py), which listing a TF bundle does without."""
    return lambda path: getattr(importlib.import_module(f".{module}", __name__), name)(path)


def _reading(module: str, name: str) -> _Format:
    """A format checked by opening it and reading every value."""
    opener = _deferred(module, name)
    return _Format(opener, lambda path: _check_by_reading(path, opener))


def _lazy(module: str, open_name: str, check_name: str) -> _Format:
    """A format with its own check."""
    return _Format(_deferred(module, open_name), _deferred(module, check_name))


_FORMATS: dict[Kind, _Format] = {
    Kind.TF_BUNDLE: _Format(_open_bundle, _check_bundle),
    Kind.TF_SAVEDMODEL: _Format(_open_savedmodel, _check_savedmodel),
    Kind.TF_V1: _Format(_open_v1, _check_v1),
    Kind.HDF5: _reading("keras.h5", "open_h5"),
    Kind.KERAS_SHARDED: _reading("keras.h5", "open_sharded"),
    Kind.ZIP: _reading("keras.zip", "open_zip"),
    Kind.NPZ: _reading("npz", "open_npz"),
    Kind.SAFETENSORS: _lazy("safetensors.file", "open_safetensors", "check_safetensors"),
    Kind.TORCH_ZIP: _lazy("torch.reader", "open_torch_zip", "check_torch"),
    Kind.TORCH_LEGACY: _lazy("torch.reader", "open_torch_legacy", "check_torch"),
    Kind.HF_SHARDED: _lazy("hf.sharded", "open_hf_sharded", "check_hf_sharded"),
}
CHECK_BLOCK_ELEMENTS = 1 << 20


def open_checkpoint(path: str) -> m.Checkpoint:
    """Open any supported checkpoint (metadata only; values are read on demand).

    Args:
        path: A TF prefix, ``.index`` file, checkpoint directory, SavedModel directory,
            V1 checkpoint file, Keras ``.h5``/``.weights.h5``/``.keras`` file, or the
            ``.weights.json`` index of sharded Keras weights.

    Returns:
        The :class:`~ckptinspect.model.Checkpoint`.

    Raises:
        CheckpointNotFoundError, NotACheckpointError, CorruptCheckpointError, UnsafeFileError.
    """
    path = str(path)
    kind, target = detect(path)
    if kind is Kind.TF_DIRECTORY:
        return _open_directory(target)
    return _FORMATS[kind].open(target)


def _classify(path: str) -> tuple[Kind, str]:
    """Like :func:`detect`, but a damaged ``.index`` is still a bundle (to be reported)."""
    _fs.check_remote(path)
    if path.endswith(INDEX_SUFFIX) and _fs.isfile(path):
        return Kind.TF_BUNDLE, path[: -len(INDEX_SUFFIX)]
    if (not _fs.exists(path) or _fs.basename(path) == "") and _fs.isfile(path + INDEX_SUFFIX):
        return Kind.TF_BUNDLE, path  # a damaged prefix, or an empty-basename one (saver.save(sess, "dir/"))
    return detect(path)


def prepare_check(path: str) -> tuple[Kind, Any]:
    """Plan the check of one checkpoint (not a directory): what ``verify`` runs.

    Returns:
        (kind, a check with ``.total`` and ``.run(progress, done=0, total=None)`` returning a
        :class:`~ckptinspect.model.CheckResult`). Damage is reported in the result.

    Raises:
        CheckpointNotFoundError, NotACheckpointError, UnsafeFileError: The path cannot be
            checked at all.
    """
    kind, target = _classify(str(path))
    if kind is Kind.TF_DIRECTORY:
        return kind, None
    return kind, _FORMATS[kind].check(target)


def list_directory(directory: str, *, steps: bool = True) -> DirectoryListing:
    """A checkpoint directory, read once, without opening any checkpoint.

    Args:
        directory: The directory.
        steps: Read the last checkpoints' steps from their indexes (as ``ls`` shows them);
            False: from their names only (for callers that open every checkpoint anyway).

    Returns:
        The :class:`~ckptinspect.formats.tf.directory.DirectoryListing`: retained checkpoints, the
        prefix it resolves to, its problems (state file) and leftover temporaries; ``v1`` is
        a V1 file when the directory holds no bundle but V1 checkpoint files.

    Raises:
        NotACheckpointError: No checkpoint at all in the directory (saying what it holds
            instead: SavedModel exports, Keras files).
    """
    from .tf.directory import read_directory  # noqa: PLC0415 - see _LAZY_NAMES

    listing = read_directory(directory, steps=steps)
    if listing.latest is None and not listing.checkpoints:
        v1 = _v1_in_directory(directory)
        if v1 is None:
            raise _nothing_found(directory, listing.problems)
        listing = dataclasses.replace(listing, v1=v1)
    return listing


is_remote = _fs.is_remote

# Public names of the TF readers, imported on first use: detection reads a file's first bytes
# and imports the one format module it picked, so `ls x.safetensors` or `ls model.h5` never
# loads the TF bundle, directory or V1 readers (nor concurrent.futures, glob, the object graph).
_LAZY_NAMES = {
    "OBJECT_GRAPH_KEY": ("tf.index", "OBJECT_GRAPH_KEY"),
    "StoredSliceBlocks": ("tf.bundle", "StoredSliceBlocks"),
    "stored_slice_blocks": ("tf.bundle", "stored_slice_blocks"),
    "object_graph_bytes": ("tf.bundle", "object_graph_bytes"),
    "stream_blocks": ("tf.bundle", "stream_blocks"),
    "DirectoryListing": ("tf.directory", "DirectoryListing"),
    "checkpoint_step": ("tf.directory", "checkpoint_step"),
    "checkpoint_present": ("tf.directory", "checkpoint_present"),
    "directory_fingerprint": ("tf.directory", "state_fingerprint"),
    "directory_changed": ("tf.directory", "state_changed"),
}

# Writing TF bundles (extract, transplant) goes through TensorFlow and numpy: those names are
# imported on first use, so that listing imports neither.
_WRITER_NAMES = ("BundleTensor", "write_bundle", "object_graph_tensor", "prune_object_graph", "restore_tensor",
                 "numpy_view")


_NATIVE_WRITER_NAMES = ("WriteSummary", "write_bundle_native", "save_bundle_native", "copy_tensor", "compare_copy")
_NATIVE_TENSOR_NAMES = ("OutputTensor", "TensorData", "StoredBytes")

_GRAPH_EDIT_NAMES = ("GraphEdit", "EditedGraph", "edit_object_graph", "escape_path", "unescape_path")


def __getattr__(name: str) -> Any:
    lazy = _LAZY_NAMES.get(name)
    if lazy is not None:
        value = getattr(importlib.import_module(f".{lazy[0]}", __name__), lazy[1])
        globals()[name] = value  # once: later lookups are plain module attributes
        return value
    if name in _WRITER_NAMES:
        from .tf.write import through_tf as tf_writer  # noqa: PLC0415

        return getattr(tf_writer, name)
    if name in _NATIVE_WRITER_NAMES:
        from .tf.write import bundle as bundle_writer  # noqa: PLC0415

        return getattr(bundle_writer, name)
    if name in _NATIVE_TENSOR_NAMES:
        from .tf.write import tensors as bundle_tensors  # noqa: PLC0415

        return getattr(bundle_tensors, name)
    if name in _GRAPH_EDIT_NAMES:
        from .tf import graph_edit as tf_graph_edit  # noqa: PLC0415

        return getattr(tf_graph_edit, name)
    if name == "write_safetensors":
        from .safetensors.file import write_safetensors  # noqa: PLC0415

        return write_safetensors
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
