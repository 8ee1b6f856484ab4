"""How Keras files are recognised (standard library and the signature modules only)."""

from __future__ import annotations

from ...errors import NotACheckpointError
from .._layout import HDF5_HEAD_BYTES, KERAS_SHARDED_INDEX_SUFFIX, ZIP_SIGNATURE, is_hdf5_head
from .._registry import Probe


def hdf5_file(probe: Probe) -> str | None:
    """Any HDF5 file (the reader tells legacy ``.h5``, ``.weights.h5`` and full models apart)."""
    return probe.path if is_hdf5_head(probe.head(HDF5_HEAD_BYTES)) else None


def keras_zip(probe: Probe) -> str | None:
    """Any zip archive no other family claimed (the reader says what is wrong with one that is
    not a ``.keras`` archive)."""
    return probe.path if probe.head(len(ZIP_SIGNATURE)) == ZIP_SIGNATURE else None


def sharded_index(probe: Probe) -> str | None:
    """The ``.weights.json`` index of sharded Keras 3 weights."""
    return probe.path if probe.name.endswith(KERAS_SHARDED_INDEX_SUFFIX) else None


def refuse_not_keras(probe: Probe) -> None:
    if probe.name.endswith((".h5", ".hdf5", ".keras")):
        raise NotACheckpointError(
            f"{probe.path}: has a Keras suffix but is neither HDF5 nor a zip archive (truncated or not a Keras file)"
        )
