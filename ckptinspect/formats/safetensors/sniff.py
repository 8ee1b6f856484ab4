"""How ``.safetensors`` files are recognised (standard library and the signature modules only)."""

from __future__ import annotations

from .._registry import Probe
from .._torch_layout import SAFETENSORS_HEADER_LENGTH, is_safetensors_head

HEAD_BYTES = SAFETENSORS_HEADER_LENGTH.size + 2


def safetensors_file(probe: Probe) -> str | None:
    return probe.path if is_safetensors_head(probe.head(HEAD_BYTES)) else None
