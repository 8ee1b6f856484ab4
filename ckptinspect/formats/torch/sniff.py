"""How PyTorch files are recognised (standard library and the signature modules only)."""

from __future__ import annotations

from .._layout import ZIP_SIGNATURE
from .._registry import Probe
from .._torch_layout import LEGACY_HEAD_BYTES, is_torch_legacy_head, is_torch_zip


def torch_zip(probe: Probe) -> str | None:
    """A zip archive holding ``<root>/data.pkl``."""
    if probe.head(len(ZIP_SIGNATURE)) == ZIP_SIGNATURE and is_torch_zip(probe.path):
        return probe.path
    return None


def torch_legacy(probe: Probe) -> str | None:
    """A legacy ``torch.save`` file (pickles in a row, starting with the pickled magic number)."""
    return probe.path if is_torch_legacy_head(probe.head(LEGACY_HEAD_BYTES)) else None
