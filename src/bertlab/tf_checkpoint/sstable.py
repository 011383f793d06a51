"""LevelDB's table format (SSTable), as TensorFlow writes a bundle's index: blocks, restarts, trailers with
masked CRC-32C, the index block and the footer; read and written."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Iterable, Iterator

from ..core.errors import CheckpointError
from .crc32c import crc32c, mask_crc, unmask_crc
from .protobuf import _read_varint, _varint


# ============================================================================================ SSTable
# LevelDB's table format, as TF's lib/io/table*.cc writes it:
#
#   [data block 0][trailer] ... [data block n][trailer] [metaindex block][trailer] [index block][trailer] [footer]
#
#   block    = entries, then uint32 restart offsets, then uint32 restart count (all little-endian). Each entry is
#              varint32 shared | varint32 non_shared | varint32 value_length | key[shared:] | value, where `shared`
#              is how many leading bytes the key has in common with the previous key (0 at restart points,
#              every 16th entry in data blocks, every entry in the index block).
#   trailer  = 1 byte compression type (0 = none; TF never compresses bundle indexes) + fixed32 masked CRC-32C
#              of the block contents and that type byte.
#   index    = a block whose entries map "a key >= every key of data block i and < every key of block i+1"
#              to block i's handle (varint64 offset, varint64 size, trailer excluded).
#   metaindex= an empty block (TF writes no filters or stats).
#   footer   = metaindex handle + index handle, zero-padded to 40 bytes, then the fixed64 magic number.
_TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_SIZE = 48
_TRAILER_SIZE = 5
BLOCK_SIZE = 262144  # TF's table::Options defaults
RESTART_INTERVAL = 16


def _read_block(data: bytes, offset: int, size: int, path: Path, what: str) -> bytes:
    end = offset + size + _TRAILER_SIZE
    if offset < 0 or size < 0 or end > len(data):
        raise CheckpointError(f"{path}: corrupt index: {what} [{offset}, {end}) lies outside the {len(data)}-byte file")
    contents = data[offset:offset + size]
    kind = data[offset + size]
    stored = int.from_bytes(data[offset + size + 1:end], "little")
    if unmask_crc(stored) != crc32c(bytes([kind]), crc32c(contents)):
        raise CheckpointError(f"{path}: corrupt index: {what} at offset {offset} fails its CRC-32C check")
    if kind != 0:
        raise CheckpointError(f"{path}: {what} uses compression type {kind}; only uncompressed indexes are supported")
    return contents


def _block_entries(block: bytes, path: Path, what: str) -> Iterator[tuple[bytes, bytes]]:
    if len(block) < 4:
        raise CheckpointError(f"{path}: corrupt index: {what} is {len(block)} bytes, too short for a block")
    num_restarts = int.from_bytes(block[-4:], "little")
    limit = len(block) - 4 * (num_restarts + 1)
    if num_restarts < 1 or limit < 0:
        raise CheckpointError(f"{path}: corrupt index: {what} claims {num_restarts} restart points")
    pos, key = 0, b""
    try:
        while pos < limit:
            shared, pos = _read_varint(block, pos)
            non_shared, pos = _read_varint(block, pos)
            value_length, pos = _read_varint(block, pos)
            if shared > len(key) or pos + non_shared + value_length > limit:
                raise ValueError("entry runs past the block")
            key = key[:shared] + block[pos:pos + non_shared]
            pos += non_shared
            yield key, block[pos:pos + value_length]
            pos += value_length
    except ValueError as e:
        raise CheckpointError(f"{path}: corrupt index: {what}: {e} at byte {pos}") from None


def _read_table(path: Path) -> list[tuple[bytes, bytes]]:
    """All (key, value) pairs of an SSTable file, in order, every block CRC-checked."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read the index ({e.strerror})") from None
    if len(data) < _FOOTER_SIZE or int.from_bytes(data[-8:], "little") != _TABLE_MAGIC:
        raise CheckpointError(f"{path}: not a TensorFlow checkpoint index (no table magic number at the end: "
                              "truncated, or not an .index file)")
    footer = data[-_FOOTER_SIZE:]
    try:
        _, pos = _read_varint(footer, 0)  # metaindex offset, size: nothing in it for us
        _, pos = _read_varint(footer, pos)
        index_offset, pos = _read_varint(footer, pos)
        index_size, pos = _read_varint(footer, pos)
    except ValueError:
        raise CheckpointError(f"{path}: corrupt index: unreadable footer") from None
    index = _read_block(data, index_offset, index_size, path, "index block")
    items: list[tuple[bytes, bytes]] = []
    for separator, handle in _block_entries(index, path, "index block"):
        try:
            offset, pos = _read_varint(handle, 0)
            size, _ = _read_varint(handle, pos)
        except ValueError:
            raise CheckpointError(f"{path}: corrupt index: bad block handle for key {separator!r}") from None
        block = _read_block(data, offset, size, path, "data block")
        for key, value in _block_entries(block, path, f"data block at offset {offset}"):
            if items and key <= items[-1][0]:
                raise CheckpointError(f"{path}: corrupt index: key {key!r} out of order")
            items.append((key, value))
    return items


class _BlockBuilder:
    """One block being filled (LevelDB's BlockBuilder)."""

    def __init__(self, restart_interval: int):
        self.restart_interval = restart_interval
        self.reset()

    def reset(self) -> None:
        self.buffer = bytearray()
        self.restarts = [0]
        self.counter = 0
        self.last_key = b""

    def add(self, key: bytes, value: bytes) -> None:
        shared = 0
        if self.counter < self.restart_interval:
            limit = min(len(key), len(self.last_key))
            while shared < limit and key[shared] == self.last_key[shared]:
                shared += 1
        else:
            self.restarts.append(len(self.buffer))
            self.counter = 0
        self.buffer += _varint(shared) + _varint(len(key) - shared) + _varint(len(value)) + key[shared:] + value
        self.last_key = key
        self.counter += 1

    def size_estimate(self) -> int:
        return len(self.buffer) + 4 * len(self.restarts) + 4

    def finish(self) -> bytes:
        return bytes(self.buffer) + b"".join(struct.pack("<I", r) for r in self.restarts) + \
            struct.pack("<I", len(self.restarts))


def _shortest_separator(start: bytes, limit: bytes) -> bytes:
    """A short key k with start <= k < limit (TF's FindShortestSeparator), for the index block."""
    n = 0
    while n < min(len(start), len(limit)) and start[n] == limit[n]:
        n += 1
    if n < min(len(start), len(limit)) and start[n] < 0xFF and start[n] + 1 < limit[n]:
        return start[:n] + bytes([start[n] + 1])
    return start


def _short_successor(key: bytes) -> bytes:
    """A short key >= `key` (TF's FindShortSuccessor), for the last block's index entry."""
    for i, b in enumerate(key):
        if b != 0xFF:
            return key[:i] + bytes([b + 1])
    return key


def _write_table(items: Iterable[tuple[bytes, bytes]], block_size: int = BLOCK_SIZE,
                 restart_interval: int = RESTART_INTERVAL) -> bytes:
    """An SSTable of sorted (key, value) pairs, byte for byte as TF's TableBuilder writes it."""
    out = bytearray()
    data_block, index_block = _BlockBuilder(restart_interval), _BlockBuilder(1)
    pending: tuple[int, int] | None = None  # handle of the last flushed data block, awaiting its index key
    last_key = b""

    def write_block(block: _BlockBuilder) -> tuple[int, int]:
        contents = block.finish()
        handle = (len(out), len(contents))
        out.extend(contents)
        out.extend(b"\0" + struct.pack("<I", mask_crc(crc32c(b"\0", crc32c(contents)))))
        block.reset()
        return handle

    def flush() -> None:
        nonlocal pending
        if data_block.buffer:
            pending = write_block(data_block)

    for n, (key, value) in enumerate(items):
        if n and key <= last_key:
            raise ValueError(f"SSTable keys must be unique and sorted: {key!r} after {last_key!r}")
        if n and len(key) + len(value) >= 2 * block_size:
            flush()  # an overly large entry gets a block of its own
        if pending is not None:
            index_block.add(_shortest_separator(last_key, key), _varint(pending[0]) + _varint(pending[1]))
            pending = None
        last_key = key
        data_block.add(key, value)
        if data_block.size_estimate() >= block_size:
            flush()
    flush()
    metaindex = write_block(_BlockBuilder(restart_interval))
    if pending is not None:
        index_block.add(_short_successor(last_key), _varint(pending[0]) + _varint(pending[1]))
    index = write_block(index_block)
    footer = b"".join(_varint(v) for v in (*metaindex, *index))
    out.extend(footer.ljust(_FOOTER_SIZE - 8, b"\0") + struct.pack("<Q", _TABLE_MAGIC))
    return bytes(out)
