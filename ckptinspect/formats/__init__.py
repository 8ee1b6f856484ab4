"""Format detection and opening: one module per format family, picked by content.

* :mod:`.tf_bundle` - TF bundle checkpoints (``.index`` + ``.data-*``), TF1 and TF2.
* :mod:`.tf_v1` - TF V1 table checkpoints (one file, no ``.index``).
* :mod:`.tf_state` - checkpoint directories (``checkpoint`` state file).
* :mod:`.keras_h5` - Keras HDF5 files (legacy ``.h5``, ``.weights.h5``, sharded weights).
* :mod:`.keras_zip` - ``.keras`` zip archives.
"""

from __future__ import annotations

import enum

from .. import model as m
from ..errors import CheckpointNotFoundError, NotACheckpointError
from . import _fs
from ._layout import DATA_FILE_RE, INDEX_SUFFIX, STATE_FILE
from ._sstable import is_table

__all__ = ["Kind", "detect", "open_checkpoint"]

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
HDF5_USERBLOCK_OFFSETS = (0, 512, 1024, 2048)
ZIP_SIGNATURE = b"PK\x03\x04"
SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
SAVED_MODEL_VARIABLES = "variables/variables"
KERAS_SHARDED_INDEX_SUFFIX = ".weights.json"
EXPECTED = (
    "expected a TF checkpoint prefix or its .index file, a checkpoint directory, a SavedModel "
    "directory, or a Keras .h5/.weights.h5/.keras file"
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


def _is_hdf5(path: str) -> bool:
    head = _fs.read_head(path, 2048 + 8)
    return any(head[o : o + 8] == HDF5_SIGNATURE for o in HDF5_USERBLOCK_OFFSETS)


def _is_savedmodel(directory: str) -> bool:
    return any(_fs.exists(_fs.join(directory, f)) for f in SAVED_MODEL_FILES) and _fs.exists(
        _fs.join(directory, SAVED_MODEL_VARIABLES + ".index")
    )


def _table_kind(path: str) -> Kind | None:
    """TF_BUNDLE or TF_V1 for an SSTable file, None for anything else."""
    if _fs.getsize(path) < 48:
        return None
    tail = _fs.read_range(path, _fs.getsize(path) - 48, 48)
    if not is_table(tail):
        return None
    from .tf_v1 import is_v1_table  # noqa: PLC0415

    return Kind.TF_V1 if is_v1_table(_fs.read_bytes(path)) else Kind.TF_BUNDLE


def detect(path: str) -> tuple[Kind, str]:
    """Decide what ``path`` is from its content.

    Returns:
        (kind, the path to open: a prefix for bundles, the directory, or the file).

    Raises:
        CheckpointNotFoundError: Nothing at ``path``.
        NotACheckpointError: Something that is not a checkpoint, or a part of one.
    """
    name = _fs.basename(path)
    data_match = DATA_FILE_RE.match(name)
    if name and _fs.exists(path + INDEX_SUFFIX) and (_fs.is_remote(path) or not _fs.isdir(path)):
        # A prefix. (Remote file systems such as ram:// report prefixes as directories.)
        return Kind.TF_BUNDLE, path
    if not _fs.exists(path):
        if data_match:
            raise CheckpointNotFoundError(f"{path}: no such file (and data shards are not checkpoints)")
        raise CheckpointNotFoundError(f"{path}: no such file, directory or checkpoint prefix")
    if _fs.isdir(path):
        if _is_savedmodel(path):
            return Kind.TF_SAVEDMODEL, path
        return Kind.TF_DIRECTORY, path
    if data_match:
        prefix = path[: len(path) - len(name)] + data_match.group("prefix")
        raise NotACheckpointError(
            f"{path}: is a data shard, not a checkpoint; pass the prefix {prefix} (or {prefix}{INDEX_SUFFIX})"
        )
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
        return Kind.ZIP, path
    if name.endswith(KERAS_SHARDED_INDEX_SUFFIX):
        return Kind.KERAS_SHARDED, path
    kind = _table_kind(path)
    if kind is Kind.TF_BUNDLE:
        if not path.endswith(INDEX_SUFFIX):
            raise NotACheckpointError(f"{path}: is a checkpoint index without the .index suffix; {EXPECTED}")
        return Kind.TF_BUNDLE, path[: -len(INDEX_SUFFIX)]
    if kind is Kind.TF_V1:
        return Kind.TF_V1, path
    if name.endswith(INDEX_SUFFIX):
        size = _fs.getsize(path)
        from ..errors import CorruptCheckpointError  # noqa: PLC0415

        raise CorruptCheckpointError(
            f"{path}: not a valid checkpoint index ({size} bytes, no table footer: truncated or not an index)"
        )
    if name.endswith(".meta"):
        raise NotACheckpointError(f"{path}: is a MetaGraphDef, not a checkpoint; pass the prefix {path[:-5]}")
    if name.endswith((".h5", ".hdf5", ".keras")):
        raise NotACheckpointError(f"{path}: has a Keras suffix but is neither HDF5 nor a zip archive (truncated or not a Keras file)")
    raise NotACheckpointError(f"{path}: not a checkpoint; {EXPECTED}")


def _open_directory(directory: str) -> m.Checkpoint:
    from .tf_bundle import open_bundle  # noqa: PLC0415
    from .tf_state import list_checkpoints  # noqa: PLC0415

    retained, latest = list_checkpoints(directory)
    if latest is None:
        # A directory holding only V1 checkpoint files (export-00000-of-00001).
        for name in reversed(_fs.listdir(directory)):
            candidate = _fs.join(directory, name)
            if _fs.isfile(candidate) and _table_kind(candidate) is Kind.TF_V1:
                from .tf_v1 import open_v1  # noqa: PLC0415

                return open_v1(candidate)
        raise NotACheckpointError(
            f"{directory}: no checkpoint found in the directory (no 'checkpoint' state file naming"
            " existing files, no *.index, no saved_model.pb)"
        )
    if not _fs.exists(latest + ".index") and _fs.isfile(latest):
        from .tf_v1 import open_v1  # noqa: PLC0415

        return open_v1(latest, checkpoints=tuple(retained))
    return open_bundle(latest, checkpoints=tuple(retained))


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
    match kind:
        case Kind.TF_BUNDLE:
            from .tf_bundle import open_bundle  # noqa: PLC0415

            return open_bundle(target)
        case Kind.TF_DIRECTORY:
            return _open_directory(target)
        case Kind.TF_SAVEDMODEL:
            from .tf_bundle import open_bundle  # noqa: PLC0415

            return open_bundle(_fs.join(target, SAVED_MODEL_VARIABLES), format=m.FORMAT_TF_SAVEDMODEL)
        case Kind.TF_V1:
            from .tf_v1 import open_v1  # noqa: PLC0415

            return open_v1(target)
        case Kind.HDF5:
            from .keras_h5 import open_h5  # noqa: PLC0415

            return open_h5(target)
        case Kind.KERAS_SHARDED:
            from .keras_h5 import open_sharded  # noqa: PLC0415

            return open_sharded(target)
        case Kind.ZIP:
            from .keras_zip import open_zip  # noqa: PLC0415

            return open_zip(target)
    raise NotACheckpointError(f"{path}: not a checkpoint; {EXPECTED}")  # pragma: no cover
