"""crc32c as TensorFlow stores it, from the maintained ``google-crc32c`` package.

TensorFlow keeps *masked* checksums (tensorflow/core/lib/hash/crc32c.h ``Mask``): the crc
rotated right by 15 bits plus a constant, so that a checksum of data that embeds checksums
stays well distributed. Table blocks, tensors and string lengths all use it.
"""

from __future__ import annotations

__all__ = ["MASK_DELTA", "mask", "unmask", "masked_crc32c", "crc32c_module", "crc32c_combine"]

MASK_DELTA = 0xA282EAD8
_UINT32 = 0xFFFFFFFF
_POLY = 0x82F63B78  # crc32c (Castagnoli), bit-reflected
_X2N_TABLE_SIZE = 64  # x^(2^k) mod P for k < 64: lengths up to 2^61 bytes


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


def _multmodp(a: int, b: int) -> int:
    """a * b modulo the crc32c polynomial (bit-reflected, as zlib's ``multmodp``)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _x2n_table() -> list[int]:
    p = 1 << 30  # x^1
    table = [p]
    for _ in range(1, _X2N_TABLE_SIZE):
        p = _multmodp(p, p)
        table.append(p)
    return table


_X2N = _x2n_table()
_shift_cache: dict[int, int] = {}
_SHIFT_CACHE_MAX = 4096


def _x8nmodp(nbytes: int) -> int:
    """x^(8 * nbytes) modulo the polynomial: the operator that shifts a crc over nbytes bytes."""
    p = _shift_cache.get(nbytes)
    if p is None:
        p, n, k = 1 << 31, nbytes, 3
        while n:
            if n & 1:
                p = _multmodp(_X2N[k], p)
            n >>= 1
            k += 1
        if len(_shift_cache) < _SHIFT_CACHE_MAX:
            _shift_cache[nbytes] = p
    return p


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """The (plain) crc32c of ``A + B`` from ``crc1`` = crc32c(A), ``crc2`` = crc32c(B) and
    ``len2`` = len(B) (zlib's ``crc32_combine`` for the Castagnoli polynomial), so blocks
    checksummed apart (on several threads) give the checksum of the whole."""
    if len2 <= 0:
        return crc1
    return _multmodp(_x8nmodp(len2), crc1) ^ crc2
