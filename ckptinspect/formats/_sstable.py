"""Reader for the SSTable (LevelDB table) files TensorFlow writes.

A TF bundle ``.index`` file and a V1 checkpoint file are both such tables: data blocks of
prefix-compressed key/value entries, an index block pointing at them, and a 48-byte footer
ending in a magic number. Each block is followed by a one-byte compression type (0 none,
1 snappy) and a masked crc32c of the block and that byte.
"""

from __future__ import annotations

import struct
from typing import Iterator

from ._crc import masked_crc32c
from ._wire import MalformedError, read_varint, snappy_decompress

__all__ = ["TABLE_MAGIC", "FOOTER_SIZE", "iter_table", "is_table"]

TABLE_MAGIC = 0xDB4775248B80FB57
FOOTER_SIZE = 48
BLOCK_TRAILER_SIZE = 5
COMPRESSION_NONE = 0
COMPRESSION_SNAPPY = 1


def is_table(data: bytes) -> bool:
    """True when ``data`` ends with the table magic number."""
    return len(data) >= FOOTER_SIZE and struct.unpack_from("<Q", data, len(data) - 8)[0] == TABLE_MAGIC


def _block_handle(buf: bytes, pos: int) -> tuple[int, int, int]:
    offset, pos = read_varint(buf, pos)
    size, pos = read_varint(buf, pos)
    return offset, size, pos


def _read_block(data: bytes, offset: int, size: int, check_crc: bool) -> bytes:
    end = offset + size
    if end + BLOCK_TRAILER_SIZE > len(data):
        raise MalformedError(
            f"block at offset {offset} with size {size} runs past the end of the file ({len(data)} bytes)"
        )
    raw = data[offset:end]
    ctype = data[end]
    if check_crc:
        stored = struct.unpack_from("<I", data, end + 1)[0]
        if masked_crc32c(data[offset : end + 1]) != stored:
            raise MalformedError(f"block at offset {offset}: checksum does not match")
    if ctype == COMPRESSION_NONE:
        return raw
    if ctype == COMPRESSION_SNAPPY:
        return snappy_decompress(raw)
    raise MalformedError(f"block at offset {offset}: unknown compression type {ctype}")


def _iter_block(block: bytes) -> Iterator[tuple[bytes, bytes]]:
    if len(block) < 4:
        raise MalformedError("block shorter than its restart count")
    num_restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
    limit = len(block) - 4 - 4 * num_restarts
    if limit < 0:
        raise MalformedError(f"block declares {num_restarts} restarts, more than fit")
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


def iter_table(data: bytes, check_crc: bool = True) -> Iterator[tuple[bytes, bytes]]:
    """Yield every (key, value) of a table, in key order.

    Args:
        data: The whole table file.
        check_crc: Verify each block's checksum.

    Raises:
        MalformedError: Bad magic, truncation, bad checksum or a malformed block.
    """
    if len(data) < FOOTER_SIZE:
        raise MalformedError(f"file is {len(data)} bytes, shorter than the {FOOTER_SIZE}-byte table footer")
    if not is_table(data):
        raise MalformedError("not an sstable (bad magic number)")
    footer = data[len(data) - FOOTER_SIZE :]
    _meta_off, _meta_size, pos = _block_handle(footer, 0)
    index_off, index_size, _ = _block_handle(footer, pos)
    index = _read_block(data, index_off, index_size, check_crc)
    previous = None
    for _, handle in _iter_block(index):
        off, size, _ = _block_handle(handle, 0)
        for key, value in _iter_block(_read_block(data, off, size, check_crc)):
            if previous is not None and key <= previous:
                raise MalformedError("table keys out of order")
            previous = key
            yield key, value
