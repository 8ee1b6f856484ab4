"""Byte-level decoders shared by the TF formats: varints, protobuf wire format, snappy.

Everything here is bounds-checked and raises :class:`MalformedError` on bad input; the
format modules turn that into a :class:`~ckptinspect.errors.CorruptCheckpointError` that
names the file.
"""

from __future__ import annotations

__all__ = ["MalformedError", "read_varint", "parse_message", "first", "snappy_decompress"]

# Protobuf wire types.
WIRE_VARINT = 0
WIRE_FIXED64 = 1
WIRE_LEN = 2
WIRE_FIXED32 = 5

_MAX_SNAPPY_OUTPUT = 1 << 28  # an index block is KBs; refuse absurd declared sizes


class MalformedError(ValueError):
    """Bytes that do not decode; the message says what and where."""


def read_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Decode a base-128 varint at ``pos``. Returns (value, new position)."""
    result = 0
    shift = 0
    n = len(buf)
    while True:
        if pos >= n:
            raise MalformedError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise MalformedError("varint longer than 10 bytes")


def parse_message(buf: bytes | memoryview) -> dict[int, list[int | bytes]]:
    """All fields of a message, grouped by field number (repeated fields keep order).

    The hot path of listing (one call per index entry and object-graph node), so one-byte
    tags and varints are decoded inline.
    """
    out: dict[int, list[int | bytes]] = {}
    pos = 0
    n = len(buf)
    while pos < n:
        tag = buf[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = read_varint(buf, pos)
        field, wire = tag >> 3, tag & 7
        if field == 0:
            raise MalformedError("protobuf field number 0")
        if wire == WIRE_VARINT:
            if pos < n and buf[pos] < 0x80:
                value = buf[pos]
                pos += 1
            else:
                value, pos = read_varint(buf, pos)
        elif wire == WIRE_LEN:
            if pos < n and buf[pos] < 0x80:
                size = buf[pos]
                pos += 1
            else:
                size, pos = read_varint(buf, pos)
            if pos + size > n:
                raise MalformedError(f"length-delimited field {field} runs past the end")
            value = bytes(buf[pos : pos + size])
            pos += size
        elif wire == WIRE_FIXED32:
            if pos + 4 > n:
                raise MalformedError("truncated fixed32")
            value = int.from_bytes(buf[pos : pos + 4], "little")
            pos += 4
        elif wire == WIRE_FIXED64:
            if pos + 8 > n:
                raise MalformedError("truncated fixed64")
            value = int.from_bytes(buf[pos : pos + 8], "little")
            pos += 8
        else:
            raise MalformedError(f"unsupported protobuf wire type {wire}")
        values = out.get(field)
        if values is None:
            out[field] = [value]
        else:
            values.append(value)
    return out


def first(fields: dict[int, list], number: int, default=None):
    """The last value of a singular field (protobuf's last-one-wins), or ``default``."""
    values = fields.get(number)
    return values[-1] if values else default


def snappy_decompress(data: bytes) -> bytes:
    """Decompress a raw snappy block (as TensorFlow's table writer stores compressed blocks)."""
    expected, pos = read_varint(data, 0)
    if expected > _MAX_SNAPPY_OUTPUT:
        raise MalformedError(f"snappy block declares {expected} bytes")
    out = bytearray()
    n = len(data)
    while pos < n:
        tag = data[pos]
        pos += 1
        kind = tag & 3
        if kind == 0:  # literal
            length = tag >> 2
            if length >= 60:
                extra = length - 59
                if pos + extra > n:
                    raise MalformedError("truncated snappy literal length")
                length = int.from_bytes(data[pos : pos + extra], "little")
                pos += extra
            length += 1
            if pos + length > n:
                raise MalformedError("truncated snappy literal")
            out += data[pos : pos + length]
            pos += length
        else:
            if kind == 1:
                if pos + 1 > n:
                    raise MalformedError("truncated snappy copy")
                length = ((tag >> 2) & 7) + 4
                offset = ((tag >> 5) << 8) | data[pos]
                pos += 1
            else:
                width = 2 if kind == 2 else 4
                if pos + width > n:
                    raise MalformedError("truncated snappy copy")
                length = (tag >> 2) + 1
                offset = int.from_bytes(data[pos : pos + width], "little")
                pos += width
            if offset == 0 or offset > len(out):
                raise MalformedError("snappy copy offset out of range")
            start = len(out) - offset
            if offset >= length:
                out += out[start : start + length]
            else:
                for i in range(length):
                    out.append(out[start + i])
        if len(out) > expected:
            raise MalformedError("snappy block decodes to more bytes than declared")
    if len(out) != expected:
        raise MalformedError(f"snappy block decodes to {len(out)} bytes, declared {expected}")
    return bytes(out)
