"""How TF checkpoints are recognised, and the TF near misses refused with what to pass instead.

Standard library and the signature modules only: detection runs for every path.
"""

from __future__ import annotations

from ...errors import CheckpointNotFoundError, CorruptCheckpointError, NotACheckpointError
from .. import _fs
from .._layout import DATA_FILE_RE, HDF5_HEAD_BYTES, INDEX_SUFFIX, STATE_FILE, is_hdf5_head
from .._registry import Probe, expected
from .sstable import is_table

SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
SAVED_MODEL_VARIABLES = "variables/variables"
TABLE_FOOTER_BYTES = 48
KIND_BUNDLE = "tf-bundle"
KIND_V1 = "tf-v1-table"
_TABLE_MEMO = "tf.table_kind"


def is_savedmodel(directory: str) -> bool:
    """True for a directory holding a SavedModel graph and its ``variables/variables.index``."""
    return any(_fs.exists(_fs.join(directory, f)) for f in SAVED_MODEL_FILES) and _fs.exists(
        _fs.join(directory, SAVED_MODEL_VARIABLES + ".index")
    )


def table_kind(path: str) -> str | None:
    """:data:`KIND_BUNDLE` or :data:`KIND_V1` for an SSTable file, None for anything else
    (special files included).

    Reads the 48-byte footer, and for a table the index block and first data block only.
    """
    if not _fs.is_regular(path):
        return None
    size = _fs.getsize(path)
    if size < TABLE_FOOTER_BYTES:
        return None
    tail = _fs.read_range(path, size - TABLE_FOOTER_BYTES, TABLE_FOOTER_BYTES)
    if not is_table(tail):
        return None
    from .v1 import is_v1_table  # noqa: PLC0415 - the TF readers load for tables only

    return KIND_V1 if is_v1_table(path) else KIND_BUNDLE


def _table_kind_of(probe: Probe) -> str | None:
    if _TABLE_MEMO not in probe.memo:
        probe.memo[_TABLE_MEMO] = table_kind(probe.path)
    return probe.memo[_TABLE_MEMO]


# -- sniffs --------------------------------------------------------------------------------------
def bundle_prefix(probe: Probe) -> str | None:
    """A prefix whose ``.index`` exists. (Remote file systems such as ram:// report prefixes as
    directories.) A regular file next to a FIFO or device named like its index is that file."""
    path = probe.path
    if (
        probe.name
        and _fs.exists(path + INDEX_SUFFIX)
        and (_fs.is_remote(path) or not probe.isdir)
        and (_fs.is_regular(path + INDEX_SUFFIX) or not _fs.is_regular(path))  # the index first: known already
    ):
        return path
    return None


def savedmodel_directory(probe: Probe) -> str | None:
    return probe.path if is_savedmodel(probe.path) else None


def checkpoint_directory(probe: Probe) -> str | None:
    """Any other directory: resolved through its state file and its files (the last directory
    kind: a directory no other family claims is looked at as a TF checkpoint directory)."""
    return probe.path


def bundle_index_file(probe: Probe) -> str | None:
    """A bundle's ``.index`` file: the prefix to open."""
    if _table_kind_of(probe) != KIND_BUNDLE:
        return None
    if not probe.path.endswith(INDEX_SUFFIX):
        raise NotACheckpointError(f"{probe.path}: is a checkpoint index without the .index suffix; {expected()}")
    return probe.path[: -len(INDEX_SUFFIX)]


def v1_table_file(probe: Probe) -> str | None:
    return probe.path if _table_kind_of(probe) == KIND_V1 else None


# -- refusals --------------------------------------------------------------------------------------
def refuse_missing_data_shard(probe: Probe) -> None:
    if DATA_FILE_RE.match(probe.name):
        raise CheckpointNotFoundError(f"{probe.path}: no such file (and data shards are not checkpoints)")


def refuse_data_shard(probe: Probe) -> None:
    data_match = DATA_FILE_RE.match(probe.name)
    if data_match:
        path = probe.path
        prefix = path[: len(path) - len(probe.name)] + data_match.group("prefix")
        raise NotACheckpointError(
            f"{path}: is a data shard, not a checkpoint; pass the prefix {prefix} (or {prefix}{INDEX_SUFFIX})"
        )


def refuse_savedmodel_graph(probe: Probe) -> None:
    if probe.name not in SAVED_MODEL_FILES:
        return
    path = probe.path
    directory = _fs.dirname(path) or "."
    if is_savedmodel(directory):
        raise NotACheckpointError(
            f"{path}: is a SavedModel's graph, not a checkpoint; pass its directory {directory}"
            f" (its variables are in {_fs.join(directory, SAVED_MODEL_VARIABLES)})"
        )
    raise NotACheckpointError(f"{path}: is a SavedModel's graph, and its directory holds no"
                              f" {SAVED_MODEL_VARIABLES}.index: no variables to inspect")


def refuse_state_file(probe: Probe) -> None:
    if probe.name == STATE_FILE and not is_hdf5_head(probe.head(HDF5_HEAD_BYTES)):
        directory = _fs.dirname(probe.path) or "."
        raise NotACheckpointError(
            f"{probe.path}: is the checkpoint state file, not a checkpoint; pass its directory {directory}"
            " or a checkpoint prefix it names"
        )


def refuse_damaged_index(probe: Probe) -> None:
    if probe.name.endswith(INDEX_SUFFIX):
        size = _fs.getsize(probe.path)
        raise CorruptCheckpointError(
            f"{probe.path}: not a valid checkpoint index ({size} bytes, no table footer: truncated or not an index)"
        )


def refuse_meta_graph(probe: Probe) -> None:
    if probe.name.endswith(".meta"):
        raise NotACheckpointError(f"{probe.path}: is a MetaGraphDef, not a checkpoint; pass the prefix {probe.path[:-5]}")
