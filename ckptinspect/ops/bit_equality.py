"""Bit-for-bit equality of two arrays: :func:`bit_equal` (shape, dtype and bytes; strings as
bytes) and :func:`same_bytes` (the bytes of two contiguous arrays: one libc ``memcmp``, which
releases the GIL and stops at the first difference, or numpy in chunks where it cannot be
called). Shared by ``diff`` (equal blocks before any arithmetic), ``scan`` (a block unchanged
since the previous checkpoint), ``extract``, ``rewrite`` and ``transplant`` (read-back checks).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

__all__ = ["COMPARE_CHUNK_BYTES", "bit_equal", "same_bytes"]

# Without memcmp, bytes are compared at most this many at a time (np.array_equal of whole
# tensors would allocate a third tensor-sized buffer).
COMPARE_CHUNK_BYTES = 4 << 20
# Bytes compared first when arrays are compared without memcmp (a changed tensor almost always
# differs there, so the full comparison is skipped).
PEEK_BYTES = 256
STRING_KINDS = "OSU"


def _as_bytes(item: Any) -> bytes:
    return item if isinstance(item, bytes) else str(item).encode("utf-8")


def _libc_memcmp() -> Callable[[int, int, int], int] | None:
    """The C library's ``memcmp`` through ctypes (which releases the GIL while it runs: the other
    worker thread keeps going), checked on a known answer first; None where it cannot be called
    (then numpy compares)."""
    try:
        import ctypes  # noqa: PLC0415 - only where values are compared

        fn = ctypes.CDLL(None).memcmp
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        a, b = ctypes.create_string_buffer(b"ab\x00c"), ctypes.create_string_buffer(b"ab\x00d")
        if fn(a, a, 4) != 0 or fn(a, b, 4) == 0 or fn(a, b, 3) != 0:
            return None
        return fn
    except (OSError, AttributeError, TypeError):
        return None


_UNRESOLVED = object()
_MEMCMP: Any = _UNRESOLVED  # libc's memcmp, looked up at the first comparison (not at import)


def _memcmp() -> Callable[[int, int, int], int] | None:
    """libc's ``memcmp`` (None where it cannot be called), loaded when values are first
    compared: importing the module loads no native library (a refused file never gets there)."""
    global _MEMCMP  # noqa: PLW0603 - resolved once; two threads resolving at once get the same function
    if _MEMCMP is _UNRESOLVED:
        _MEMCMP = _libc_memcmp()
    return _MEMCMP


def _address(a: np.ndarray) -> int:
    """The address of a C-contiguous array's first byte (a writable one through ctypes' view of
    its buffer, 2.5x cheaper than ``__array_interface__``, which builds a dict). The caller
    holds ``a`` for as long as the address is used."""
    if a.flags.writeable:
        import ctypes  # noqa: PLC0415 - loaded by _libc_memcmp already

        try:
            return ctypes.addressof(ctypes.c_char.from_buffer(a))
        except ValueError:  # the buffer protocol has no format for dtypes such as bfloat16: a byte view has
            return ctypes.addressof(ctypes.c_char.from_buffer(a.reshape(-1).view(np.uint8)))
    return a.__array_interface__["data"][0]


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two C-contiguous arrays of one size in bytes hold the same bytes: one ``memcmp``
    (no temporary, the GIL released, stops at the first difference: a changed block costs
    next to nothing), else numpy 8 bytes at a time, :data:`COMPARE_CHUNK_BYTES` at a time."""
    if a.nbytes != b.nbytes:
        return False
    if not a.nbytes:
        return True
    memcmp = _memcmp()
    if memcmp is not None and a.flags.c_contiguous and b.flags.c_contiguous:
        return memcmp(_address(a), _address(b), a.nbytes) == 0
    x = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    y = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    if x[:PEEK_BYTES].tobytes() != y[:PEEK_BYTES].tobytes():
        return False
    whole = x.size - x.size % 8
    if whole < x.size and x[whole:].tobytes() != y[whole:].tobytes():
        return False
    wx, wy = x[:whole].view(np.uint64), y[:whole].view(np.uint64)
    step = COMPARE_CHUNK_BYTES // 8
    return all(np.array_equal(wx[i : i + step], wy[i : i + step]) for i in range(0, wx.size, step))


def bit_equal(a: Any, b: Any) -> bool:
    """Bit-for-bit equality: same shape, same dtype, same bytes (NaN payloads included).

    Strings and objects are compared element by element as bytes (``str`` as UTF-8), so a
    ``bytes`` array equals an object array of the same bytes. Arrays read straight from a
    ``bytes`` buffer are compared as those bytes, others by :func:`same_bytes` (a
    non-contiguous view through a contiguous copy), so no further tensor-sized temporary is made.

    Args:
        a: An array (or anything ``np.asarray`` takes).
        b: Another.

    Returns:
        Whether they are identical.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype.kind in STRING_KINDS or b.dtype.kind in STRING_KINDS:
        if not (a.dtype.kind in STRING_KINDS and b.dtype.kind in STRING_KINDS):
            return False
        return [_as_bytes(x) for x in a.reshape(-1)] == [_as_bytes(x) for x in b.reshape(-1)]
    if a.dtype != b.dtype:
        return False
    ba, bb = a.base, b.base
    if isinstance(ba, bytes) and isinstance(bb, bytes) and len(ba) == a.nbytes and len(bb) == b.nbytes:
        return ba == bb
    return same_bytes(np.ascontiguousarray(a), np.ascontiguousarray(b))  # a view is copied, as numpy must
