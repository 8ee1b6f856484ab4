"""crc32c as TensorFlow stores it, from the maintained ``google-crc32c`` package.

TensorFlow keeps *masked* checksums (tensorflow/core/lib/hash/crc32c.h ``Mask``): the crc
rotated right by 15 bits plus a constant, so that a checksum of data that embeds checksums
stays well distributed. Table blocks, tensors and string lengths all use it.
"""

from __future__ import annotations

__all__ = ["MASK_DELTA", "mask", "unmask", "masked_crc32c", "crc32c_module"]

MASK_DELTA = 0xA282EAD8
_UINT32 = 0xFFFFFFFF


def crc32c_module():
    """The ``google_crc32c`` module (imported when a checksum is wanted)."""
    import google_crc32c  # noqa: PLC0415

    return google_crc32c


def mask(crc: int) -> int:
    """TensorFlow's ``crc32c::Mask``."""
    return ((((crc >> 15) | (crc << 17)) & _UINT32) + MASK_DELTA) & _UINT32


def unmask(masked: int) -> int:
    """TensorFlow's ``crc32c::Unmask``: the plain crc32c of a stored (masked) checksum."""
    rot = (masked - MASK_DELTA) & _UINT32
    return ((rot >> 17) | (rot << 15)) & _UINT32


def masked_crc32c(data: bytes | memoryview) -> int:
    """The masked crc32c of ``data``."""
    return mask(crc32c_module().value(bytes(data)))
