"""crc32c as TensorFlow stores it, from the maintained ``google-crc32c`` package.

TensorFlow keeps *masked* checksums (tensorflow/core/lib/hash/crc32c.h ``Mask``): the crc
rotated right by 15 bits plus a constant, so that a checksum of data that embeds checksums
stays well distributed. Table blocks, tensors and string lengths all use it.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

__all__ = ["MASK_DELTA", "mask", "unmask", "masked_crc32c", "crc32c_module", "crc32c_combine", "buffer_crc32c"]

MASK_DELTA = 0xA282EAD8
_UINT32 = 0xFFFFFFFF
_POLY = 0x82F63B78  # crc32c (Castagnoli), bit-reflected
_X2N_TABLE_SIZE = 64  # x^(2^k) mod P for k < 64: lengths up to 2^61 bytes
_CHECK = (b"123456789", 0xE3069283)  # the crc32c check value (RFC 3720, B.4)


def crc32c_module():
    """The ``google_crc32c`` module (imported when a checksum is wanted)."""
    import google_crc32c  # noqa: PLC0415

    return google_crc32c


_LIB: list[Any] = []
_LIB_LOCK = threading.Lock()


def _crc32c_library() -> Any:
    """google/crc32c's C library as the ``google-crc32c`` wheel ships it (or the system's), its
    ``crc32c_extend`` called through ctypes, which releases the GIL during the call (the
    package's own ``extend`` keeps the GIL for anything but ``bytes``, so two threads
    checksumming blocks would take turns); None when it cannot be found or gives a wrong
    check value."""
    with _LIB_LOCK:
        if _LIB:
            return _LIB[0]
        lib = None
        try:
            import ctypes  # noqa: PLC0415 - loaded with the first streamed checksum (`ls` never needs it)
            import ctypes.util  # noqa: PLC0415
            import glob  # noqa: PLC0415

            here = os.path.dirname(crc32c_module().__file__)
            candidates = [
                *sorted(glob.glob(os.path.join(here, os.pardir, "google_crc32c.libs", "libcrc32c*"))),  # manylinux
                *sorted(glob.glob(os.path.join(here, ".dylibs", "libcrc32c*"))),  # macOS
                *sorted(glob.glob(os.path.join(here, "*crc32c*.dll"))),  # Windows
            ]
            for path in _then_system(candidates, ctypes.util.find_library):
                try:
                    candidate = ctypes.CDLL(path)
                    fn = candidate.crc32c_extend
                except (OSError, AttributeError):
                    continue
                fn.restype = ctypes.c_uint32
                fn.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
                data, expected = _CHECK
                if fn(0, data, len(data)) == expected:
                    lib = fn
                    break
        except Exception:  # noqa: BLE001 - any surprise: the package's own extend is used
            lib = None
        _LIB.append(lib)
        return lib


def _then_system(candidates: list[str], find_library: Callable[[str], str | None]) -> Any:
    """The wheel's libraries, then the system's: ``find_library`` runs ``ldconfig`` (tens of
    milliseconds at the first read of a value), so only when the wheel's did not do."""
    yield from candidates
    found = find_library("crc32c")
    if found:
        yield found


def buffer_crc32c() -> Callable[..., int]:
    """``extend(crc, buffer, nbytes, start=0)``: the crc32c of ``nbytes`` of a ``bytearray`` from ``start``,
    continuing ``crc``, releasing the GIL while it runs when the C library can be called
    directly (else through ``google_crc32c.extend``, on a read-only view: no copy)."""
    fn = _crc32c_library()
    if fn is not None:
        import ctypes  # noqa: PLC0415 - loaded by _crc32c_library already

        def extend(crc: int, buffer: bytearray, nbytes: int, start: int = 0) -> int:
            if not (0 <= start and 0 <= nbytes and start + nbytes <= len(buffer)):
                raise ValueError(f"bytes {start}..{start + nbytes} asked of a buffer of {len(buffer)}")
            if not nbytes:
                return crc
            anchor = ctypes.c_char.from_buffer(buffer)  # holds the buffer (no resize) during the call
            try:
                return fn(crc, ctypes.addressof(anchor) + start, nbytes)
            finally:
                del anchor

        return extend
    module = crc32c_module()

    def extend_package(crc: int, buffer: bytearray, nbytes: int, start: int = 0) -> int:
        import numpy as np  # noqa: PLC0415 - only where values are read

        raw = np.frombuffer(buffer, dtype=np.uint8, count=nbytes, offset=start)
        raw.flags.writeable = False  # google-crc32c reads a read-only buffer in place (no copy)
        return module.extend(crc, raw)

    return extend_package


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
