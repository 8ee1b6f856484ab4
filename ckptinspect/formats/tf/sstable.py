"""Reader for the SSTable (LevelDB table) files TensorFlow writes.

A TF bundle ``.index`` file and a V1 checkpoint file are both such tables: data blocks of
prefix-compressed key/value entries, an index block pointing at them, and a 48-byte footer
ending in a magic number. Each block is followed by a one-byte compression type (0 none,
1 snappy) and a masked crc32c of the block and that byte.
"""

from __future__ import annotations

import struct
from typing import Iterator, Protocol

from .crc import masked_crc32c
from .wire import MalformedError, read_varint, snappy_decompress

__all__ = ["TABLE_MAGIC", "FOOTER_SIZE", "TableSource", "iter_table", "iter_data_blocks", "block_limit", "is_table"]

TABLE_MAGIC = 0xDB4775248B80FB57
FOOTER_SIZE = 48
BLOCK_TRAILER_SIZE = 5
COMPRESSION_NONE = 0
COMPRESSION_SNAPPY = 1


class _Bytes:
    """A table held in memory, read through the same ``size`` / ``read_at`` as a file."""

    def __init__(self, data: bytes):
        self.size = len(data)
        self._data = data

    def read_at(self, offset: int, size: int) -> bytes:
        return self._data[offset : offset + size]


class TableSource(Protocol):
    """Random access to a table: a :class:`~ckptinspect.formats._fs.RangeReader` or bytes."""

    size: int

    def read_at(self, offset: int, size: int) -> bytes:  # pragma: no cover - protocol
        ...


def is_table(data: bytes) -> bool:
    """True when ``data`` ends with the table magic number."""
    return len(data) >= FOOTER_SIZE and struct.unpack_from("<Q", data, len(data) - 8)[0] == TABLE_MAGIC


def _block_handle(buf: bytes, pos: int) -> tuple[int, int, int]:
    offset, pos = read_varint(buf, pos)
    size, pos = read_varint(buf, pos)
    return offset, size, pos


def _source(data: bytes | TableSource) -> TableSource:
    return _Bytes(data) if isinstance(data, (bytes, bytearray, memoryview)) else data


def _read_block(src: bytes | TableSource, offset: int, size: int, check_crc: bool) -> bytes:
    src = _source(src)
    end = offset + size
    if end + BLOCK_TRAILER_SIZE > src.size:
        raise MalformedError(
            f"block at offset {offset} with size {size} runs past the end of the file ({src.size} bytes)"
        )
    data = src.read_at(offset, size + BLOCK_TRAILER_SIZE)  # bounded by the file size, checked above
    if len(data) != size + BLOCK_TRAILER_SIZE:
        raise MalformedError(f"block at offset {offset}: the file ended while reading it")
    raw = data[:size]
    ctype = data[size]
    if check_crc:
        stored = struct.unpack_from("<I", data, size + 1)[0]
        if masked_crc32c(data[: size + 1]) != stored:
            raise MalformedError(f"block at offset {offset}: checksum does not match")
    if ctype == COMPRESSION_NONE:
        return raw
    if ctype == COMPRESSION_SNAPPY:
        return snappy_decompress(raw)
    raise MalformedError(f"block at offset {offset}: unknown compression type {ctype}")


def block_limit(block: bytes) -> int:
    """Where a block's entries end (before its restart array and restart count)."""
    if len(block) < 4:
        raise MalformedError("block shorter than its restart count")
    num_restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
    limit = len(block) - 4 - 4 * num_restarts
    if limit < 0:
        raise MalformedError(f"block declares {num_restarts} restarts, more than fit")
    return limit


def _iter_block(block: bytes) -> Iterator[tuple[bytes, bytes]]:
    limit = block_limit(block)
    pos = 0
    key = b""
    while pos < limit:
        shared, pos = read_varint(block, pos)
        non_shared, pos = read_varint(block, pos)
        value_len, pos = read_varint(block, pos)
        if shared > len(key) or pos + non_shared + value_len > limit:
            raise MalformedError("block entry runs past its block")
        key = key[:shared] + block[pos : pos + non_shared]
        pos += non_shared
        value = block[pos : pos + value_len]
        pos += value_len
        yield key, value


def iter_data_blocks(data: bytes | TableSource, check_crc: bool = True) -> Iterator[bytes]:
    """Yield the data blocks of a table, decoded (checked, decompressed), in table order: what
    :func:`iter_table` reads its entries from (the footer, the index block and each block's
    checksum checked alike).

    Raises:
        MalformedError: Bad magic, truncation, bad checksum or a malformed index block.
    """
    src = _source(data)
    if src.size < FOOTER_SIZE:
        raise MalformedError(f"file is {src.size} bytes, shorter than the {FOOTER_SIZE}-byte table footer")
    footer = src.read_at(src.size - FOOTER_SIZE, FOOTER_SIZE)
    if not is_table(footer):
        raise MalformedError("not an sstable (bad magic number)")
    _meta_off, _meta_size, pos = _block_handle(footer, 0)
    index_off, index_size, _ = _block_handle(footer, pos)
    index = _read_block(src, index_off, index_size, check_crc)
    for _, handle in _iter_block(index):
        off, size, _ = _block_handle(handle, 0)
        yield _read_block(src, off, size, check_crc)


def iter_table(data: bytes | TableSource, check_crc: bool = True) -> Iterator[tuple[bytes, bytes]]:
    """Yield every (key, value) of a table, in key order.

    Args:
        data: The whole table file as bytes, or a :class:`TableSource` (an open file read one
            block at a time, so memory stays bounded by the largest block).
        check_crc: Verify each block's checksum.

    Raises:
        MalformedError: Bad magic, truncation, bad checksum or a malformed block.
    """
    previous = None
    for block in iter_data_blocks(data, check_crc):
        for key, value in _iter_block(block):
            if previous is not None and key <= previous:
                raise MalformedError("table keys out of order")
            previous = key
            yield key, value
