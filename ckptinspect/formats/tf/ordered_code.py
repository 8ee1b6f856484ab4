"""TensorFlow's OrderedCode, as it keys the stored slices of a sliced tensor in a bundle index.

``checkpoint::EncodeTensorNameSlice`` (tensorflow/core/util/saved_tensor_slice_util.cc)
builds the key of one stored slice as, in OrderedCode (tensorflow/core/lib/strings/
ordered_code.cc): ``WriteNumIncreasing(0)`` (so every slice key starts with a zero byte and
sorts before the tensor names), ``WriteString(name)``, ``WriteNumIncreasing(dims)``, then for
each dimension ``WriteSignedNumIncreasing(start)`` and ``WriteSignedNumIncreasing(length)``
(start 0 and length -1 for a whole dimension). The encodings preserve order, so the keys of
one tensor's slices sort by their starts.
"""

from __future__ import annotations

from .wire import MalformedError

__all__ = [
    "write_num_increasing",
    "write_string",
    "write_signed_num_increasing",
    "read_signed_num_increasing",
    "encode_tensor_name_slice",
    "decode_tensor_name_slice",
]

_ESCAPE1 = 0x00
_NULL_CHARACTER = 0xFF  # after _ESCAPE1: a literal 0x00
_SEPARATOR = 0x01  # after _ESCAPE1: end of a string
_ESCAPE2 = 0xFF
_FF_CHARACTER = 0x00  # after _ESCAPE2: a literal 0xff
_MAX_SIGNED_LENGTH = 10
# Header bits of the first two bytes by encoded length (kLengthToHeaderBits).
_LENGTH_TO_HEADER_BITS = (
    (0, 0), (0x80, 0), (0xC0, 0), (0xE0, 0), (0xF0, 0), (0xF8, 0), (0xFC, 0), (0xFE, 0),
    (0xFF, 0), (0xFF, 0x80), (0xFF, 0xC0),
)
# Header bits overlapping the payload, removed when reading (kLengthToMask).
_LENGTH_TO_MASK = (
    0, 0x80, 0xC000, 0xE00000, 0xF0000000, 0xF800000000, 0xFC0000000000, 0xFE000000000000,
    0xFF00000000000000, 0x8000000000000000, 0,
)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_UINT64 = (1 << 64) - 1


def _signed_length(x: int) -> int:
    """Bytes of the signed encoding of a number whose magnitude bits are ``x`` (>= 0):
    ``kBitsToLength[Log2Floor64(x) + 1]``, 7 payload bits per byte."""
    return 1 + x.bit_length() // 7


def write_num_increasing(out: bytearray, value: int) -> None:
    """``OrderedCode::WriteNumIncreasing``: a length byte, then big-endian without leading zeros."""
    if not 0 <= value <= _UINT64:
        raise ValueError(f"not a uint64: {value}")
    body = value.to_bytes((value.bit_length() + 7) // 8, "big")
    out.append(len(body))
    out += body


def write_string(out: bytearray, value: bytes) -> None:
    """``OrderedCode::WriteString``: 0x00 and 0xff escaped, then the separator ``00 01``."""
    out += _escape(value)
    out += bytes([_ESCAPE1, _SEPARATOR])


def _escape(value: bytes) -> bytes:
    out = bytearray()
    for c in value:
        if c == _ESCAPE1:
            out += bytes([_ESCAPE1, _NULL_CHARACTER])
        elif c == _ESCAPE2:
            out += bytes([_ESCAPE2, _FF_CHARACTER])
        else:
            out.append(c)
    return bytes(out)


def write_signed_num_increasing(out: bytearray, value: int) -> None:
    """``OrderedCode::WriteSignedNumIncreasing`` (1 to 10 bytes, order-preserving)."""
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"not an int64: {value}")
    x = ~value if value < 0 else value
    if x < 64:
        out.append((_LENGTH_TO_HEADER_BITS[1][0] ^ value) & 0xFF)
        return
    length = _signed_length(x)
    buf = bytearray((value & ((1 << 80) - 1)).to_bytes(_MAX_SIGNED_LENGTH, "big"))[-length:]
    buf[0] ^= _LENGTH_TO_HEADER_BITS[length][0]
    buf[1] ^= _LENGTH_TO_HEADER_BITS[length][1]
    out += buf


def read_signed_num_increasing(buf: bytes, pos: int) -> tuple[int, int]:
    """``OrderedCode::ReadSignedNumIncreasing``. Returns (value, new position).

    Raises:
        MalformedError: Truncated, or longer than 64 bits.
    """
    if pos >= len(buf):
        raise MalformedError("truncated ordered-code signed number")
    xor = 0 if buf[pos] & 0x80 else 0xFF  # negative numbers are stored inverted
    first = buf[pos] ^ xor
    if first != 0xFF:
        length = 7 - ((first ^ 0xFF).bit_length() - 1)
    else:
        length = 8
        second = buf[pos + 1] ^ xor if pos + 1 < len(buf) else 0
        if second >= 0x80:
            third = buf[pos + 2] ^ xor if pos + 2 < len(buf) else 0xFF
            if second < 0xC0:
                length = 9
            elif second == 0xC0 and third < 0x80:
                length = 10
            else:
                raise MalformedError("ordered-code signed number longer than 64 bits")
    if pos + length > len(buf):
        raise MalformedError("truncated ordered-code signed number")
    x = _UINT64 if xor else 0  # sign extension
    for b in buf[pos : pos + length]:
        x = ((x << 8) | b) & _UINT64
    x ^= _LENGTH_TO_MASK[length]
    return (x - (1 << 64) if x >> 63 else x), pos + length


def _read_num_increasing(buf: bytes, pos: int) -> tuple[int, int]:
    if pos >= len(buf):
        raise MalformedError("truncated ordered-code number")
    n = buf[pos]
    if n > 8 or pos + 1 + n > len(buf):
        raise MalformedError("truncated ordered-code number")
    return int.from_bytes(buf[pos + 1 : pos + 1 + n], "big"), pos + 1 + n


def _read_string(buf: bytes, pos: int) -> tuple[bytes, int]:
    out = bytearray()
    n = len(buf)
    while pos < n:
        c = buf[pos]
        if c == _ESCAPE1 or c == _ESCAPE2:
            if pos + 1 >= n:
                break
            nxt = buf[pos + 1]
            if c == _ESCAPE1 and nxt == _SEPARATOR:
                return bytes(out), pos + 2
            if c == _ESCAPE1 and nxt == _NULL_CHARACTER:
                out.append(0x00)
            elif c == _ESCAPE2 and nxt == _FF_CHARACTER:
                out.append(0xFF)
            else:
                raise MalformedError("bad ordered-code escape")
            pos += 2
            continue
        out.append(c)
        pos += 1
    raise MalformedError("unterminated ordered-code string")


def encode_tensor_name_slice(name: str, starts: tuple[int, ...], lengths: tuple[int, ...]) -> bytes:
    """The index key of one stored slice (``checkpoint::EncodeTensorNameSlice``).

    Args:
        name: The full tensor's key.
        starts: Start of the slice in each dimension.
        lengths: Length in each dimension, ``-1`` for a whole dimension (start 0).
    """
    if len(starts) != len(lengths):
        raise ValueError(f"slice of {name!r}: {len(starts)} starts and {len(lengths)} lengths")
    out = bytearray()
    write_num_increasing(out, 0)
    write_string(out, name.encode("utf-8", "surrogateescape"))
    write_num_increasing(out, len(starts))
    for start, length in zip(starts, lengths):
        write_signed_num_increasing(out, start)
        write_signed_num_increasing(out, length)
    return bytes(out)


def decode_tensor_name_slice(key: bytes) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
    """The inverse of :func:`encode_tensor_name_slice`: (name, starts, lengths).

    Raises:
        MalformedError: Not such a key.
    """
    zero, pos = _read_num_increasing(key, 0)
    if zero != 0:
        raise MalformedError("a slice key starts with the number 0")
    name, pos = _read_string(key, pos)
    dims, pos = _read_num_increasing(key, pos)
    if dims > len(key):
        raise MalformedError(f"slice key declares {dims} dimensions")
    starts, lengths = [], []
    for _ in range(dims):
        start, pos = read_signed_num_increasing(key, pos)
        length, pos = read_signed_num_increasing(key, pos)
        starts.append(start)
        lengths.append(length)
    if pos != len(key):
        raise MalformedError(f"{len(key) - pos} bytes after the slice key's extents")
    return name.decode("utf-8", "surrogateescape"), tuple(starts), tuple(lengths)
