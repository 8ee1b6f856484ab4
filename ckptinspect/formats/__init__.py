"""The one door from the operations into the formats: detection, opening, checking, the series
of a directory, and the writers' names.

Operations import only this package's public names (an import-linter contract): they open a
:class:`~ckptinspect.model.Checkpoint` with :func:`open_checkpoint` and read through its
tensor source, check one with :func:`prepare_check`, list a directory's checkpoints with
:func:`list_directory` (the series seam, :mod:`.series`), decide an output's kind with
:func:`output_kind` (:mod:`.outputs`), and ask what a format can do with :func:`capabilities`
or :func:`spec_of`. What each format is comes from the registry (:mod:`._registry`, the built-in
list in :mod:`._catalog`): detection runs the families' sniff modules only, and a format's reader
is imported when its format is opened or checked; the public names of the readers and writers
(:data:`_LAZY_NAMES`) load on first use, so listing one format loads no other reader.

Families: :mod:`.tf` (bundles, SavedModels, V1 tables, directories, graph editing, ``write/``),
:mod:`.keras` (HDF5 files, ``.keras`` zips, the HDF5 writer), :mod:`.torch` (``torch.save``
files, read without torch or pickle), :mod:`.safetensors`, :mod:`.hf` (Hugging Face folders),
:mod:`.npz`. Shared pieces: :mod:`._fs` (file access), :mod:`._layout` and
:mod:`._torch_layout` (signatures), :mod:`._zip`, :mod:`._readcheck`, :mod:`._listing`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .. import model as m
from ..errors import CheckpointNotFoundError, NotACheckpointError
from . import _catalog, _fs, _registry  # noqa: F401 - importing _catalog registers the built-in formats
from ._layout import DATA_FILE_RE, INDEX_SUFFIX, STATE_FILE
from ._readcheck import Check, Opened, ReadCheck
from ._step import apply_step_rule
from .outputs import (  # the one vocabulary of output kinds (standard library only)
    FORMAT_OF,
    OUTPUT_KINDS,
    TO_H5,
    TO_KERAS,
    TO_NPZ,
    TO_SAFETENSORS,
    TO_TF,
    TO_WEIGHTS_H5,
    output_kind,
)
from ._registry import AFTER_FILES, AT_DIRECTORY, AT_FILE, AT_PREFIX, BEFORE_FILES, MISSING, FormatSpec, Kind, Probe
from .tf.crc import mask as mask_crc32c

if TYPE_CHECKING:  # imported on first use (see _LAZY_NAMES): `ls x.safetensors` never loads the TF readers
    from .tf.index import OBJECT_GRAPH_KEY
    from .tf.bundle import StoredSliceBlocks, object_graph_bytes, stored_slice_blocks, stream_blocks
    from .keras.h5_write import copy_attrs as copy_h5_attrs
    from .keras.write import (
        LEGACY_OPTIMIZER_GROUP as KERAS_LEGACY_OPTIMIZER_GROUP,
        OPTIMIZER_GROUP as KERAS_OPTIMIZER_GROUP,
        copy_h5,
        copy_keras_zip,
        h5_value,
        legacy_h5_renames,
        read_h5_output,
        row_block_elements,
        update_h5_copy,
        weights_h5_renames,
    )
    from .npz import npy_array, read_npz, write_npz
    from .safetensors.file import run_metadata as safetensors_run_metadata
    from .series import DirectoryListing, name_numbers
    from .tf.object_graph import ATTRIBUTES_MARK, OPTIMIZER_SLOT_MARK
    from .tf.directory import checkpoint_present, checkpoint_step

__all__ = [
    "Kind",
    "FormatSpec",
    "FORMATS",
    "detect",
    "spec_of",
    "described",
    "capabilities",
    "open_checkpoint",
    "prepare_check",
    "Check",
    "list_directory",
    "DirectoryListing",
    "name_numbers",
    "output_kind",
    "OUTPUT_KINDS",
    "FORMAT_OF",
    "TO_TF",
    "TO_WEIGHTS_H5",
    "TO_H5",
    "TO_NPZ",
    "TO_SAFETENSORS",
    "TO_KERAS",
    "ATTRIBUTES_MARK",
    "OPTIMIZER_SLOT_MARK",
    "copy_h5_attrs",
    "directory_fingerprint",
    "directory_changed",
    "checkpoint_step",
    "checkpoint_present",
    "is_remote",
    "check_regular",
    # paths local or remote (s3://, gs://...): what operations ask of a directory
    "path_exists",
    "path_isdir",
    "path_listdir",
    "path_join",
    "path_basename",
    "path_size",
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
    # writing safetensors (extract, rewrite)
    "write_safetensors",
    "safetensors_run_metadata",
    # writing Keras HDF5 files (extract, rewrite, average: formats/keras/write.py)
    "KERAS_OPTIMIZER_GROUP",
    "KERAS_LEGACY_OPTIMIZER_GROUP",
    "copy_h5",
    "copy_keras_zip",
    "h5_value",
    "read_h5_output",
    "weights_h5_renames",
    "legacy_h5_renames",
    "update_h5_copy",
    "row_block_elements",
    # writing .npz files (extract: formats/npz.py)
    "npy_array",
    "write_npz",
    "read_npz",
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
path_exists = _fs.exists  # local or remote: one listing answers for a remote directory's names
path_isdir = _fs.isdir
path_listdir = _fs.listdir
path_join = _fs.join
path_basename = _fs.basename
path_size = _fs.getsize
FORMATS = _registry.format_names()  # every Checkpoint.format name, in registry order


def described() -> str:
    """Every kind of path the tool opens, from the registry (the help of PATH arguments)."""
    return _registry.described()


def expected() -> str:
    """What a path may be ("expected a TF checkpoint prefix ..."), from the registry."""
    return _registry.expected()


def _sniff(probe: Probe, at: str) -> tuple[FormatSpec, str] | None:
    for spec in _registry.SPECS:
        if spec.at == at:
            target = spec.sniff(probe)
            if target is not None:
                return spec, target
    return None


def _refuse(probe: Probe, phase: str) -> None:
    for refuse in _registry.REFUSALS[phase]:
        refuse(probe)


def detect(path: str) -> tuple[FormatSpec, str]:
    """Decide what ``path`` is from its content, trying the registry's specs in order: those
    found at a prefix (which need not exist), then those of a directory or of a regular file,
    with each family's near-miss refusals before and after the file sniffs.

    Returns:
        (the kind: a :class:`FormatSpec`, also reachable as ``Kind.MEMBER``; the path to open: a
        prefix for bundles, the directory, or the file).

    Raises:
        CheckpointNotFoundError: Nothing at ``path``.
        NotACheckpointError: Something that is not a checkpoint, or a part of one.
    """
    _fs.check_remote(path)  # an unsupported scheme or an unreachable file system: say so first
    probe = Probe(path)
    found = _sniff(probe, AT_PREFIX)
    if found is not None:
        return found
    if not probe.exists:
        why = _fs.too_long(path)
        if why is not None:  # the system cannot look the path up at all: not "no such file"
            raise CheckpointNotFoundError(f"{path}: name too long: {why}")
        _refuse(probe, MISSING)
        raise CheckpointNotFoundError(f"{path}: no such file, directory or checkpoint prefix")
    if probe.isdir:
        found = _sniff(probe, AT_DIRECTORY)
    else:
        if not _fs.is_remote(path):
            _fs.check_regular(path)  # a FIFO would block every read below; a device never ends
        _refuse(probe, BEFORE_FILES)
        found = _sniff(probe, AT_FILE)
    if found is not None:
        spec, target = found
        return detect(target) if spec.redirect else found
    _refuse(probe, AFTER_FILES)
    raise NotACheckpointError(f"{path}: not a checkpoint; {expected()}")


capabilities = _registry.capabilities  # what a Checkpoint.format can do: capabilities(ckpt.format)


def spec_of(path: str) -> FormatSpec:
    """The registry's spec for what ``path`` is (its capabilities: ``spec_of(p).can("slices")``)."""
    return detect(str(path))[0]


def _opener(spec: FormatSpec):
    """The opening function of a kind (the spec registered first for it carries it), its
    checkpoint's step decided by the one step rule (:func:`~ckptinspect.formats._step.apply_step_rule`)."""
    open_ = _registry.resolve(_registry.spec_for(spec.kind).open)
    return lambda target: apply_step_rule(open_(target))


def open_checkpoint(path: str) -> m.Checkpoint:
    """Open any supported checkpoint (metadata only; values are read on demand).

    Args:
        path: Any path the registry recognises (see :func:`detect`): a TF prefix, ``.index``
            file, checkpoint or SavedModel directory, V1 checkpoint file, Keras
            ``.h5``/``.weights.h5``/``.keras`` file or sharded-weights index, a ``torch.save``
            file, a ``.safetensors`` file, a Hugging Face weights folder or index, an ``.npz``.

    Returns:
        The :class:`~ckptinspect.model.Checkpoint`.

    Raises:
        CheckpointNotFoundError, NotACheckpointError, CorruptCheckpointError, UnsafeFileError.
    """
    spec, target = detect(str(path))
    return _opener(spec)(target)


def _classify(path: str) -> tuple[FormatSpec, str]:
    """Like :func:`detect`, but a damaged ``.index`` is still a bundle (to be reported)."""
    _fs.check_remote(path)
    if path.endswith(INDEX_SUFFIX) and _fs.isfile(path):
        return Kind.TF_BUNDLE, path[: -len(INDEX_SUFFIX)]
    if (not _fs.exists(path) or _fs.basename(path) == "") and _fs.isfile(path + INDEX_SUFFIX):
        return Kind.TF_BUNDLE, path  # a damaged prefix, or an empty-basename one (saver.save(sess, "dir/"))
    return detect(path)


def check_by_reading(path: str, opener) -> ReadCheck:
    """``verify``'s plan for a format without a check of its own: open it and read every value."""
    return ReadCheck(path, lambda p: Opened(opener(p)))


def prepare_check(path: str) -> tuple[FormatSpec, Any]:
    """Plan the check of one checkpoint (not a directory): what ``verify`` runs.

    Returns:
        (kind, a check with ``.total`` and ``.run(progress, done=0, total=None, seen=None)``
        returning a :class:`~ckptinspect.model.CheckResult`; ``seen``: the same checkpoint,
        opened and read by the caller, whose reads a format's check may take instead of reading
        the bytes again, with the same verdict: a TF bundle's checksums). Damage is reported in
        the result; the check is None for a directory of checkpoints, a series (``verify``
        lists it and checks each checkpoint).

    Raises:
        CheckpointNotFoundError, NotACheckpointError, UnsafeFileError: The path cannot be
            checked at all.
    """
    spec, target = _classify(str(path))
    if spec.can("series"):
        return spec, None
    first = _registry.spec_for(spec.kind)
    if first.check is not None:
        return spec, _registry.resolve(first.check)(target)
    return spec, check_by_reading(target, _opener(spec))


def list_directory(directory: str, *, steps: bool = True) -> DirectoryListing:
    """The checkpoints a directory holds, in order, and its problems, without opening any: a TF
    checkpoint directory or a folder of Keras/PyTorch checkpoint files (the series seam,
    :func:`ckptinspect.formats.series.list_series`).

    Args:
        directory: The directory.
        steps: Read the newest checkpoints' training steps (a TF directory's from their indexes,
            a file series' or an Orbax run's from their metadata; as ``ls`` shows them); False:
            none, their names' numbers only (for callers that open every checkpoint).

    Returns:
        The :class:`~ckptinspect.formats.series.DirectoryListing`.

    Raises:
        NotACheckpointError: No checkpoint at all in the directory (saying what it holds instead).
    """
    from .series import list_series  # noqa: PLC0415 - see _LAZY_NAMES

    return list_series(directory, steps=steps)


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
    "DirectoryListing": ("series", "DirectoryListing"),
    "name_numbers": ("series", "name_numbers"),
    "ATTRIBUTES_MARK": ("tf.object_graph", "ATTRIBUTES_MARK"),
    "OPTIMIZER_SLOT_MARK": ("tf.object_graph", "OPTIMIZER_SLOT_MARK"),
    "copy_h5_attrs": ("keras.h5_write", "copy_attrs"),
    # The writers of formats written without TensorFlow (h5py and numpy load with them).
    "KERAS_OPTIMIZER_GROUP": ("keras.write", "OPTIMIZER_GROUP"),
    "KERAS_LEGACY_OPTIMIZER_GROUP": ("keras.write", "LEGACY_OPTIMIZER_GROUP"),
    "copy_h5": ("keras.write", "copy_h5"),
    "copy_keras_zip": ("keras.write", "copy_keras_zip"),
    "h5_value": ("keras.write", "h5_value"),
    "read_h5_output": ("keras.write", "read_h5_output"),
    "weights_h5_renames": ("keras.write", "weights_h5_renames"),
    "legacy_h5_renames": ("keras.write", "legacy_h5_renames"),
    "update_h5_copy": ("keras.write", "update_h5_copy"),
    "row_block_elements": ("keras.write", "row_block_elements"),
    "safetensors_run_metadata": ("safetensors.file", "run_metadata"),
    "npy_array": ("npz", "npy_array"),
    "write_npz": ("npz", "write_npz"),
    "read_npz": ("npz", "read_npz"),
    "checkpoint_step": ("tf.directory", "checkpoint_step"),
    "checkpoint_present": ("tf.directory", "checkpoint_present"),
    "directory_fingerprint": ("series", "series_fingerprint"),
    "directory_changed": ("series", "series_changed"),
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
