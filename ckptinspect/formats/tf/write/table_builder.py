"""Writer of the SSTable (LevelDB table) files TensorFlow reads: the ``.index`` of a TF bundle.

It produces what TensorFlow's ``table::TableBuilder`` (xla/tsl/lib/io/table_builder.cc,
block_builder.cc, format.cc) writes with the options ``BundleWriter`` and ``MergeBundles``
use (``TableBuilderOptions()``: no compression, 256 KiB blocks, a restart point every 16
keys), so that for the same entries the bytes are the same:

* data blocks of prefix-compressed entries (``varint32 shared, varint32 non_shared,
  varint32 value_length, key delta, value``) with a restart point (a full key) every
  ``block_restart_interval`` entries, then the restart offsets and their count
  (``uint32`` little-endian); a block is cut once its estimated size reaches ``block_size``,
  and cut before an entry of at least twice ``block_size``;
* each block followed by a 5-byte trailer: the compression type (0) and the masked crc32c
  of the block and that byte;
* an empty metaindex block, then the index block (a restart at every entry) whose keys are
  TensorFlow's shortest separators between blocks (``FindShortestSeparator``) and, for the
  last block, the shortest successor of its last key (``FindShortSuccessor``); its values
  are block handles (``varint64 offset, varint64 size``);
* the 48-byte footer: the metaindex and index handles padded to 40 bytes, then the magic
  number as two little-endian ``uint32`` (low word first).

Nothing here knows what the keys and values mean (:mod:`._bundle_plan` does).
"""

from __future__ import annotations

import struct
from typing import Callable

from ..crc import crc32c_module, mask
from ..sstable import BLOCK_TRAILER_SIZE, COMPRESSION_NONE, FOOTER_SIZE, TABLE_MAGIC

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_RESTART_INTERVAL",
    "TableBuilder",
    "put_varint",
    "shortest_separator",
    "short_successor",
]

DEFAULT_BLOCK_SIZE = 262144  # table::Options::block_size
DEFAULT_RESTART_INTERVAL = 16  # table::Options::block_restart_interval
OVERLY_LARGE_BLOCK_RATIO = 2  # TableBuilder::Add: kOverlyLargeBlockRatio
BLOCK_HANDLE_MAX_LENGTH = 20  # BlockHandle::kMaxEncodedLength: two varint64
_UINT32_MAX = 0xFFFFFFFF


def put_varint(out: bytearray, value: int) -> None:
    """Append ``value`` as a base-128 varint (``core::PutVarint32/64``)."""
    if value < 0:
        raise ValueError(f"varint of a negative number {value}")
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def shortest_separator(start: bytes, limit: bytes) -> bytes:
    """TensorFlow's ``FindShortestSeparator``: a short key in ``[start, limit)``."""
    n = min(len(start), len(limit))
    i = 0
    while i < n and start[i] == limit[i]:
        i += 1
    if i >= n:
        return start  # one is a prefix of the other: not shortened
    byte = start[i]
    if byte < 0xFF and byte + 1 < limit[i]:
        return start[:i] + bytes([byte + 1])
    return start


def short_successor(key: bytes) -> bytes:
    """TensorFlow's ``FindShortSuccessor``: a short key at or after ``key``."""
    for i, byte in enumerate(key):
        if byte != 0xFF:
            return key[:i] + bytes([byte + 1])
    return key  # a run of 0xff: left alone


class _BlockBuilder:
    """One block being built (``table::BlockBuilder``)."""

    def __init__(self, restart_interval: int):
        if restart_interval < 1:
            raise ValueError(f"restart interval must be at least 1, got {restart_interval}")
        self.restart_interval = restart_interval
        self.reset()

    def reset(self) -> None:
        self.buffer = bytearray()
        self.restarts = [0]
        self.counter = 0
        self.last_key = b""

    @property
    def empty(self) -> bool:
        return not self.buffer

    def size_estimate(self) -> int:
        return len(self.buffer) + 4 * len(self.restarts) + 4

    def add(self, key: bytes, value: bytes) -> None:
        shared = 0
        if self.counter < self.restart_interval:
            last = self.last_key
            n = min(len(last), len(key))
            while shared < n and last[shared] == key[shared]:
                shared += 1
        else:
            if len(self.buffer) > _UINT32_MAX:
                raise ValueError("table block larger than 4 GiB")
            self.restarts.append(len(self.buffer))
            self.counter = 0
        buf = self.buffer
        put_varint(buf, shared)
        put_varint(buf, len(key) - shared)
        put_varint(buf, len(value))
        buf += key[shared:]
        buf += value
        self.last_key = key
        self.counter += 1

    def finish(self) -> bytes:
        out = self.buffer
        for r in self.restarts:
            out += struct.pack("<I", r)
        out += struct.pack("<I", len(self.restarts))
        return bytes(out)


class TableBuilder:
    """Build a table in memory, key by key in increasing byte order; :meth:`finish` returns
    the file's bytes (an index is small: KiBs per thousand tensors).

    Args:
        block_size: Target size of a data block before it is cut (TensorFlow: 256 KiB).
        restart_interval: Entries between restart points in data blocks (TensorFlow: 16).
        write: Optional sink for the bytes as blocks are finished (else they are kept and
            returned by :meth:`finish`).

    Raises:
        ValueError: Keys not strictly increasing, or a block over 4 GiB.
    """

    def __init__(
        self,
        block_size: int = DEFAULT_BLOCK_SIZE,
        restart_interval: int = DEFAULT_RESTART_INTERVAL,
        write: Callable[[bytes], None] | None = None,
    ):
        if block_size < 1:
            raise ValueError(f"block size must be positive, got {block_size}")
        self.block_size = block_size
        self._data = _BlockBuilder(restart_interval)
        self._index = _BlockBuilder(1)  # index_block_options.block_restart_interval = 1
        self._chunks: list[bytes] = []
        self._write = write if write is not None else self._chunks.append
        self._offset = 0
        self._last_key: bytes | None = None
        self._pending: tuple[int, int] | None = None  # handle of a block awaiting its index entry
        self._crc = crc32c_module()
        self.num_entries = 0

    def _write_block(self, block: _BlockBuilder) -> tuple[int, int]:
        raw = block.finish()
        block.reset()
        crc = self._crc.extend(self._crc.value(raw), bytes([COMPRESSION_NONE]))
        handle = (self._offset, len(raw))
        self._write(raw + bytes([COMPRESSION_NONE]) + struct.pack("<I", mask(crc)))
        self._offset += len(raw) + BLOCK_TRAILER_SIZE
        return handle

    @staticmethod
    def _handle(handle: tuple[int, int]) -> bytes:
        out = bytearray()
        put_varint(out, handle[0])
        put_varint(out, handle[1])
        return bytes(out)

    def _flush(self) -> None:
        if self._data.empty:
            return
        self._pending = self._write_block(self._data)

    def add(self, key: bytes, value: bytes) -> None:
        """Add one entry; keys must come in strictly increasing byte order."""
        if self._last_key is not None:
            if key <= self._last_key:
                raise ValueError(f"table keys must increase: {key!r} after {self._last_key!r}")
            if len(key) + len(value) >= OVERLY_LARGE_BLOCK_RATIO * self.block_size:
                self._flush()
        if self._pending is not None:
            separator = shortest_separator(self._last_key or b"", key)
            self._index.add(separator, self._handle(self._pending))
            self._pending = None
        self._last_key = key
        self.num_entries += 1
        self._data.add(key, value)
        if self._data.size_estimate() >= self.block_size:
            self._flush()

    def finish(self) -> bytes:
        """Write the last block, the metaindex and index blocks and the footer.

        Returns:
            The whole table when no ``write`` sink was given, else ``b""``.
        """
        self._flush()
        metaindex = self._write_block(_BlockBuilder(self._data.restart_interval))
        if self._pending is not None:
            self._index.add(short_successor(self._last_key or b""), self._handle(self._pending))
            self._pending = None
        index = self._write_block(self._index)
        footer = self._handle(metaindex) + self._handle(index)
        footer = footer.ljust(2 * BLOCK_HANDLE_MAX_LENGTH, b"\0")
        footer += struct.pack("<II", TABLE_MAGIC & _UINT32_MAX, TABLE_MAGIC >> 32)
        assert len(footer) == FOOTER_SIZE
        self._write(footer)
        self._offset += len(footer)
        out = b"".join(self._chunks)
        self._chunks = []
        return out
