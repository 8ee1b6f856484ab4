"""How Hugging Face weights folders and their indexes are recognised (standard library only)."""

from __future__ import annotations

from .._registry import Probe
from .._torch_layout import hf_weights_in, is_hf_index


def weights_folder(probe: Probe) -> str | None:
    """A model folder: the weights file (or index) to detect in its place."""
    return hf_weights_in(probe.path)


def sharded_index(probe: Probe) -> str | None:
    """``*.safetensors.index.json`` or ``*.bin.index.json``."""
    return probe.path if is_hf_index(probe.name) else None
