"""TensorFlow's checkpoint format ("V2" tensor bundles), read and written in plain Python + numpy.

Google's BERT release and every checkpoint its `run_pretraining.py` / `run_classifier.py` / `run_squad.py`
wrote are in this format. Reading them here means converting them needs neither TensorFlow nor its
protobuf runtime; writing it lets a bertlab model go back to Google's code. This module knows the file
format only -- tensor names are opaque strings here; the BERT-specific name map lives in `convert.py`.

A checkpoint is a *prefix* (`bert_model.ckpt`) naming two or more files:

    PREFIX.index                  an SSTable (LevelDB's table format, see `_read_table`) whose keys are the tensor
                                  names, sorted bytewise, and whose values are serialized `BundleEntryProto`s
                                  (dtype, shape, shard, offset, size, crc32c). The empty key "" sorts first and
                                  holds the `BundleHeaderProto` (number of shards, endianness, format version).
    PREFIX.data-00000-of-00001    the shards: each tensor's bytes back to back at the offsets the index gives,
                                  little-endian, row-major (C order), no padding (TF's default alignment is 1).

Every tensor's bytes carry a CRC-32C (Castagnoli) in the index, *masked* as TF and LevelDB store CRCs (a
rotation plus a constant, so that a CRC stored inside CRC-checked data does not checksum to a fixed value);
every SSTable block carries its own masked CRC-32C too. All of them are verified on read; a mismatch, a
truncated shard or a malformed index raises `CheckpointError` naming the file and the tensor.

The protobuf messages are decoded by hand (`_parse_message`): they are three tiny messages and only the
wire format's varints, fixed32s and length-delimited fields occur in them.

References: tensorflow/core/util/tensor_bundle/tensor_bundle.{h,cc}, tensorflow/core/protobuf/
tensor_bundle.proto, tensorflow/core/lib/io/{format,block_builder,table_builder}.cc (LevelDB's table format).
"""

from __future__ import annotations

import functools
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import numpy as np

from .errors import CheckpointError

INDEX_SUFFIX = ".index"
DEFAULT_PREFIX = "bert_model.ckpt"  # the name in Google's release folders

# ============================================================================================ CRC-32C
# CRC-32C (Castagnoli polynomial 0x1EDC6F41, bit-reflected 0x82F63B78), init and final XOR 0xFFFFFFFF: the
# checksum TF, LevelDB and iSCSI use. A byte-at-a-time table loop in Python runs at ~10 MB/s, far too slow for a
# 440 MB BERT-base checkpoint, so large buffers are cut into many equal *lanes* whose CRC registers advance
# together, one numpy operation per 4-byte column across all lanes ("slicing-by-4"), and the lane registers are
# then combined with the linear operator "advance the register over k zero bytes" (the trick of zlib's
# crc32_combine), pairwise in a tree. ~300 MB/s on one core.
_POLY = 0x82F63B78
_MASK_DELTA = 0xA282EAD8


def _crc_tables() -> np.ndarray:
    """T[k][b]: the register contribution of byte b followed by k zero bytes (slicing-by-4 tables)."""
    t = np.zeros((4, 256), dtype=np.uint32)
    for b in range(256):
        c = b
        for _ in range(8):
            c = (c >> 1) ^ (_POLY if c & 1 else 0)
        t[0, b] = c
    for k in range(1, 4):
        t[k] = (t[k - 1] >> 8) ^ t[0][t[k - 1] & 0xFF]
    return t


_TABLES = _crc_tables()
_TABLE0 = [int(x) for x in _TABLES[0]]
_VECTOR_MIN_BYTES = 1024  # below this the per-call numpy overhead exceeds the byte loop's cost


def _crc_bytes(reg: int, data) -> int:
    """Advance the raw (un-inverted) register over `data`, one byte at a time."""
    table = _TABLE0
    for b in bytes(data):
        reg = table[(reg ^ b) & 0xFF] ^ (reg >> 8)
    return reg


@functools.lru_cache(maxsize=None)
def _zero_shift_columns(log2_bytes: int) -> tuple[int, ...]:
    """The GF(2)-linear map "advance a register over 2**log2_bytes zero bytes", as the images of the 32 bits."""
    if log2_bytes == 0:
        return tuple(_crc_bytes(1 << i, b"\0") for i in range(32))
    half = _zero_shift_columns(log2_bytes - 1)
    return tuple(_apply_columns(half, c) for c in half)  # squaring: apply the half-length map twice


def _apply_columns(columns: tuple[int, ...], x: int) -> int:
    out, i = 0, 0
    while x:
        if x & 1:
            out ^= columns[i]
        x >>= 1
        i += 1
    return out


@functools.lru_cache(maxsize=None)
def _zero_shift_tables(log2_bytes: int) -> np.ndarray:
    """The same map as four 256-entry byte tables, to apply it to a whole numpy array of registers at once."""
    columns = _zero_shift_columns(log2_bytes)
    tables = np.zeros((4, 256), dtype=np.uint32)
    for byte in range(4):
        for b in range(1, 256):
            low = b & -b
            tables[byte, b] = tables[byte, b ^ low] ^ columns[8 * byte + low.bit_length() - 1]
    return tables


def _crc_lanes(reg: int, data: memoryview, log2_lane: int) -> tuple[int, int]:
    """Advance `reg` over the longest prefix of `data` made of whole 2**log2_lane-byte lanes; return (reg, bytes)."""
    lane = 1 << log2_lane
    n = len(data) // lane
    words = np.frombuffer(data, dtype="<u4", count=n * lane // 4).reshape(n, lane // 4)
    crc = np.zeros(n, dtype=np.uint32)
    crc[0] = reg  # only the first lane starts from the incoming register; the others from 0, combined below
    t0, t1, t2, t3 = _TABLES
    x = np.empty(n, dtype=np.uint32)
    x_bytes = x.view(np.uint8).reshape(n, 4)  # the 4 bytes of each lane's register, without shifts or masks
    tmp = np.empty(n, dtype=np.uint32)
    for j in range(0, lane // 4, 16):
        # 16 columns at a time, transposed so each column is contiguous (a strided gather is ~2x slower)
        for column in np.ascontiguousarray(words[:, j:j + 16].T):
            np.bitwise_xor(crc, column, out=x)
            t3.take(x_bytes[:, 0], out=crc)
            t2.take(x_bytes[:, 1], out=tmp)
            crc ^= tmp
            t1.take(x_bytes[:, 2], out=tmp)
            crc ^= tmp
            t0.take(x_bytes[:, 3], out=tmp)
            crc ^= tmp
    # reg(A ‖ B) = shift_|B|(reg(A)) ^ reg_0(B). Zero registers in front change nothing, so pad to a power of two.
    size = 1 << (n - 1).bit_length()
    if size != n:
        crc = np.concatenate([np.zeros(size - n, dtype=np.uint32), crc])
    log2_len = log2_lane
    while len(crc) > 1:
        pairs = crc.reshape(-1, 2)
        t = _zero_shift_tables(log2_len)
        a = pairs[:, 0]
        crc = t[0][a & 0xFF] ^ t[1][(a >> 8) & 0xFF] ^ t[2][(a >> 16) & 0xFF] ^ t[3][a >> 24] ^ pairs[:, 1]
        log2_len += 1
    return int(crc[0]), n * lane


def _byte_view(data) -> memoryview:
    """The bytes of a bytes-like object or a numpy array, without copying when they are contiguous."""
    if isinstance(data, np.ndarray):
        return memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
    return memoryview(data).cast("B")


def crc32c(data, value: int = 0) -> int:
    """CRC-32C of `data` (bytes-like or a numpy array); `value` continues an earlier CRC, so
    `crc32c(a + b) == crc32c(b, crc32c(a))` (TF's `crc32c::Extend`)."""
    data = _byte_view(data)
    reg = value ^ 0xFFFFFFFF
    pos = 0
    while len(data) - pos >= _VECTOR_MIN_BYTES:
        rest = len(data) - pos
        # ~2**13+ lanes for large buffers (keeps numpy's per-call overhead small), lanes of 64 B .. 2 KiB
        log2_lane = max(6, min(11, rest.bit_length() - 1 - 13))
        reg, used = _crc_lanes(reg, data[pos:], log2_lane)
        pos += used
    return _crc_bytes(reg, data[pos:]) ^ 0xFFFFFFFF


def mask_crc(crc: int) -> int:
    """The masked form TF and LevelDB store: rotate right by 15 bits, add a constant."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def unmask_crc(masked: int) -> int:
    rot = (masked - _MASK_DELTA) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


# ============================================================================================ protobuf
# Wire format: each field is a varint key (field_number << 3 | wire_type) and a value: wire type 0 = varint
# (base-128, little-endian groups of 7 bits, high bit = "more"), 1 = 8 bytes, 2 = varint length + bytes
# (strings and sub-messages), 5 = 4 bytes. Unknown fields are skipped, as protobuf does.
def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated or overlong varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _varint(value: int) -> bytes:
    if value < 0:
        value &= (1 << 64) - 1  # int32/int64 negatives are sent as 10-byte two's complement
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _parse_message(buf: bytes) -> dict[int, list]:
    """field number -> list of values (ints for varint/fixed fields, bytes for length-delimited ones)."""
    fields: dict[int, list] = {}
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 1:
            if pos + 8 > len(buf):
                raise ValueError("truncated fixed64")
            value, pos = int.from_bytes(buf[pos:pos + 8], "little"), pos + 8
        elif wire == 2:
            length, pos = _read_varint(buf, pos)
            if pos + length > len(buf):
                raise ValueError("truncated length-delimited field")
            value, pos = bytes(buf[pos:pos + length]), pos + length
        elif wire == 5:
            if pos + 4 > len(buf):
                raise ValueError("truncated fixed32")
            value, pos = int.from_bytes(buf[pos:pos + 4], "little"), pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if number == 0:
            raise ValueError("field number 0")
        fields.setdefault(number, []).append(value)
    return fields


def _int(fields: dict[int, list], number: int) -> int:
    """The last value of a scalar integer field (protobuf's "last one wins"), 0 when absent."""
    value = fields.get(number, [0])[-1]
    if not isinstance(value, int):
        raise ValueError(f"field {number} has the wrong wire type")
    return value


def _message(fields: dict[int, list], number: int) -> dict[int, list]:
    value = fields.get(number, [b""])[-1]
    if not isinstance(value, bytes):
        raise ValueError(f"field {number} has the wrong wire type")
    return _parse_message(value)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    return _varint(number << 3 | wire) + payload


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


# TF's DataType enum (tensorflow/core/framework/types.proto) -> (name, numpy dtype). Only plain-old-data types
# and strings occur in checkpoints of models; bfloat16 has no numpy dtype and is read as float32 (exact).
TF_DTYPES: dict[int, tuple[str, np.dtype | None]] = {
    1: ("float32", np.dtype("<f4")), 2: ("float64", np.dtype("<f8")), 3: ("int32", np.dtype("<i4")),
    4: ("uint8", np.dtype("u1")), 5: ("int16", np.dtype("<i2")), 6: ("int8", np.dtype("i1")),
    7: ("string", None), 8: ("complex64", np.dtype("<c8")), 9: ("int64", np.dtype("<i8")),
    10: ("bool", np.dtype("?")), 14: ("bfloat16", np.dtype("<u2")), 17: ("uint16", np.dtype("<u2")),
    18: ("complex128", np.dtype("<c16")), 19: ("float16", np.dtype("<f2")), 22: ("uint32", np.dtype("<u4")),
    23: ("uint64", np.dtype("<u8")),
}
DT_STRING, DT_BFLOAT16 = 7, 14
_DTYPE_BY_NUMPY = {dt: code for code, (name, dt) in TF_DTYPES.items() if dt is not None and name != "bfloat16"}


@dataclass(frozen=True)
class TensorEntry:
    """One `BundleEntryProto`: where a tensor's bytes are and what they are.

        message BundleEntryProto {
          DataType dtype = 1;                  // varint, the enum above
          TensorShapeProto shape = 2;          // { repeated Dim dim = 2 { int64 size = 1; string name = 2; } }
          int32 shard_id = 3;                  // which .data-NNNNN-of-MMMMM file
          int64 offset = 4;                    // byte offset in that shard
          int64 size = 5;                      // byte count
          fixed32 crc32c = 6;                  // masked CRC-32C of those bytes
          repeated TensorSliceProto slices = 7;  // set only for partitioned variables
        }
    """

    name: str
    dtype: int
    shape: tuple[int, ...]
    shard_id: int = 0
    offset: int = 0
    size: int = 0
    crc32c: int = 0  # masked, as stored
    num_slices: int = 0

    @property
    def dtype_name(self) -> str:
        return TF_DTYPES.get(self.dtype, (f"DataType {self.dtype}", None))[0]

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @classmethod
    def parse(cls, name: str, buf: bytes) -> "TensorEntry":
        f = _parse_message(buf)
        shape_fields = _message(f, 2)
        if _int(shape_fields, 3):
            raise ValueError("unknown rank")
        shape = []
        for dim in shape_fields.get(2, []):
            if not isinstance(dim, bytes):
                raise ValueError("shape dimension has the wrong wire type")
            size = _signed64(_int(_parse_message(dim), 1))
            if size < 0:
                raise ValueError(f"negative dimension {size}")
            shape.append(size)
        return cls(name=name, dtype=_int(f, 1), shape=tuple(shape), shard_id=_int(f, 3),
                   offset=_signed64(_int(f, 4)), size=_signed64(_int(f, 5)), crc32c=_int(f, 6),
                   num_slices=len(f.get(7, [])))

    def serialize(self) -> bytes:
        """proto3 serialization as TF writes it: fields in number order, zero values left out."""
        dims = b"".join(_field(2, 2, _length_prefixed(_field(1, 0, _varint(d)) if d else b"")) for d in self.shape)
        out = _field(1, 0, _varint(self.dtype)) + _field(2, 2, _length_prefixed(dims))
        for number, value in ((3, self.shard_id), (4, self.offset), (5, self.size)):
            if value:
                out += _field(number, 0, _varint(value))
        if self.crc32c:
            out += _field(6, 5, struct.pack("<I", self.crc32c))
        return out


def _length_prefixed(payload: bytes) -> bytes:
    return _varint(len(payload)) + payload


# BundleHeaderProto { int32 num_shards = 1; Endianness endianness = 2 (LITTLE = 0, BIG = 1);
#                     VersionDef version = 3 { int32 producer = 1; int32 min_consumer = 2;
#                                              repeated int32 bad_consumers = 3 } }
_BUNDLE_VERSION = 1  # kTensorBundleVersion: what this code reads and writes
HEADER = _field(1, 0, _varint(1)) + _field(3, 2, _length_prefixed(_field(1, 0, _varint(_BUNDLE_VERSION))))


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


# ============================================================================================ reading
def data_filename(prefix: str | os.PathLike, shard: int, num_shards: int) -> Path:
    return Path(f"{prefix}.data-{shard:05d}-of-{num_shards:05d}")


def resolve_prefix(path: str | os.PathLike) -> Path:
    """The checkpoint prefix for what a user may point at: the prefix itself, its `.index` or a `.data-*` file,
    or a folder holding `bert_model.ckpt.index`, exactly one `*.index`, or TF's `checkpoint` state file."""
    p = Path(path)
    if Path(f"{p}{INDEX_SUFFIX}").is_file():
        return p
    if p.is_file() and p.name.endswith(INDEX_SUFFIX):
        return p.with_name(p.name[: -len(INDEX_SUFFIX)])
    m = re.fullmatch(r"(.*)\.data-\d{5}-of-\d{5}", p.name)
    if p.is_file() and m:
        return p.with_name(m[1])
    if p.is_dir():
        if (p / f"{DEFAULT_PREFIX}{INDEX_SUFFIX}").is_file():
            return p / DEFAULT_PREFIX
        state = p / "checkpoint"  # text proto written by tf.train.Saver: model_checkpoint_path: "model.ckpt-1000"
        if state.is_file():
            m = re.search(r'^model_checkpoint_path:\s*"(.*)"', state.read_text(errors="replace"), re.M)
            if m and Path(f"{p / m[1]}{INDEX_SUFFIX}").is_file():
                return p / m[1]
        found = sorted(p.glob(f"*{INDEX_SUFFIX}"))
        if len(found) == 1:
            return found[0].with_name(found[0].name[: -len(INDEX_SUFFIX)])
        if found:
            raise CheckpointError(f"{p}: several TensorFlow checkpoints ({', '.join(f.name for f in found)}); "
                                  "name one by its prefix")
        raise CheckpointError(f"{p}: no TensorFlow checkpoint (*.index) in this folder")
    raise CheckpointError(f"{p}: no TensorFlow checkpoint here (expected {p}{INDEX_SUFFIX})")


def is_tf_checkpoint(path: str | os.PathLike) -> bool:
    try:
        resolve_prefix(path)
        return True
    except CheckpointError:
        return False


class TFCheckpointReader:
    """The tensors of one TensorFlow checkpoint, read one at a time (only that tensor's bytes in memory).

        with TFCheckpointReader("uncased_L-12_H-768_A-12/bert_model.ckpt") as ckpt:
            for name in ckpt.names():
                array = ckpt.read(name)       # numpy, checksum verified
    """

    def __init__(self, prefix: str | os.PathLike):
        self._files: dict[int, object] = {}  # shard id -> open data file, opened on first read
        self.prefix = resolve_prefix(prefix)
        self.index_path = Path(f"{self.prefix}{INDEX_SUFFIX}")
        items = _read_table(self.index_path)
        if not items or items[0][0] != b"":
            raise CheckpointError(f"{self.index_path}: corrupt index: the header entry (empty key) is missing")
        try:
            header = _parse_message(items[0][1])
            self.num_shards, big_endian = _int(header, 1), _int(header, 2)
            version = _message(header, 3)
            min_consumer = _int(version, 2)
        except ValueError as e:
            raise CheckpointError(f"{self.index_path}: corrupt index: unreadable header ({e})") from None
        if big_endian:
            raise CheckpointError(f"{self.index_path}: big-endian checkpoints are not supported")
        if min_consumer > _BUNDLE_VERSION or _BUNDLE_VERSION in version.get(3, []):
            raise CheckpointError(f"{self.index_path}: written in a newer bundle format (min_consumer "
                                  f"{min_consumer}); this reader understands version {_BUNDLE_VERSION}")
        if self.num_shards < 1:
            raise CheckpointError(f"{self.index_path}: corrupt index: header says {self.num_shards} shards")
        self.entries: dict[str, TensorEntry] = {}
        for key, value in items[1:]:
            # Keys of the pieces of partitioned variables start with a 0 byte (TF's OrderedCode); the full
            # tensor's own entry lists them in `slices`, and reading it is refused below.
            if key.startswith(b"\0"):
                continue
            name = key.decode("utf-8", errors="replace")
            try:
                entry = TensorEntry.parse(name, value)
            except ValueError as e:
                raise CheckpointError(f"{self.index_path}: corrupt index: entry of tensor {name!r}: {e}") from None
            if entry.shard_id >= self.num_shards and not entry.num_slices:
                raise CheckpointError(f"{self.index_path}: corrupt index: tensor {name!r} is in shard "
                                      f"{entry.shard_id} of {self.num_shards}")
            self.entries[name] = entry

    # ------------------------------------------------------------------ listing
    def names(self) -> list[str]:
        return list(self.entries)

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: e.shape for name, e in self.entries.items()}

    def data_path(self, shard: int) -> Path:
        return data_filename(self.prefix, shard, self.num_shards)

    @property
    def data_bytes(self) -> int:
        """Total size of the data shards on disk."""
        return sum(self.data_path(i).stat().st_size for i in range(self.num_shards) if self.data_path(i).exists())

    # ------------------------------------------------------------------ reading
    def read(self, name: str) -> np.ndarray:
        """The tensor `name` as a numpy array (bfloat16 widened to float32, strings as an object array of bytes),
        after checking its size against the file and its CRC-32C against the index."""
        entry = self.entries.get(name)
        if entry is None:
            raise CheckpointError(f"{self.index_path}: no tensor {name!r} in this checkpoint")
        path = self.data_path(entry.shard_id)
        if entry.num_slices:
            raise CheckpointError(f"{self.index_path}: tensor {name!r} is a partitioned variable "
                                  f"({entry.num_slices} slices); partitioned checkpoints are not supported")
        if entry.dtype not in TF_DTYPES:
            raise CheckpointError(f"{self.index_path}: tensor {name!r} has unsupported {entry.dtype_name}")
        dtype = TF_DTYPES[entry.dtype][1]
        if dtype is not None and entry.size != entry.numel * dtype.itemsize:
            raise CheckpointError(f"{self.index_path}: corrupt index: tensor {name!r} is {entry.dtype_name} "
                                  f"{list(entry.shape)} but its entry says {entry.size} bytes")
        buf = self._read_bytes(path, entry)
        if entry.dtype == DT_STRING:
            array, actual = self._decode_strings(buf, entry, path)
        else:
            array, actual = buf.view(dtype).reshape(entry.shape), crc32c(buf)
        if actual != unmask_crc(entry.crc32c):
            raise CheckpointError(f"{path}: tensor {name!r}: checksum mismatch (index says "
                                  f"{unmask_crc(entry.crc32c):#010x}, bytes give {actual:#010x}); the data file is "
                                  "corrupt")
        if entry.dtype == DT_BFLOAT16:  # bfloat16 is the top half of a float32
            array = (array.astype(np.uint32) << 16).view(np.float32)
        return array

    def __getitem__(self, name: str) -> np.ndarray:
        return self.read(name)

    def _read_bytes(self, path: Path, entry: TensorEntry) -> np.ndarray:
        f = self._files.get(entry.shard_id)
        if f is None:
            try:
                f = self._files[entry.shard_id] = open(path, "rb")
            except OSError as e:
                raise CheckpointError(f"{path}: cannot open data shard for tensor {entry.name!r} ({e.strerror})") \
                    from None
        file_size = os.fstat(f.fileno()).st_size
        if entry.offset < 0 or entry.offset + entry.size > file_size:
            raise CheckpointError(f"{path}: truncated: tensor {entry.name!r} needs bytes [{entry.offset}, "
                                  f"{entry.offset + entry.size}) but the file has {file_size}")
        buf = np.empty(entry.size, dtype=np.uint8)
        f.seek(entry.offset)
        if f.readinto(memoryview(buf)) != entry.size:
            raise CheckpointError(f"{path}: truncated while reading tensor {entry.name!r}")
        return buf

    def _decode_strings(self, buf: np.ndarray, entry: TensorEntry, path: Path) -> tuple[np.ndarray, int]:
        # [varint64 length] * n, [fixed32 masked CRC of the lengths], then the strings' bytes back to back. The
        # CRCs are not over these bytes as stored: both run over each length as a uint32 (uint64 if it does not
        # fit), the entry's then goes on over the 4 length-checksum bytes and the string bytes. Returns the
        # array and that CRC, which the caller checks against the entry's.
        data = buf.tobytes()
        n = entry.numel
        try:
            lengths, pos, crc = [], 0, 0
            for _ in range(n):
                length, pos = _read_varint(data, pos)
                lengths.append(length)
                crc = crc32c(struct.pack("<I" if length <= 0xFFFFFFFF else "<Q", length), crc)
            if pos + 4 > len(data) or unmask_crc(int.from_bytes(data[pos:pos + 4], "little")) != crc:
                raise ValueError("length checksum mismatch")
            crc = crc32c(data[pos + 4:], crc32c(data[pos:pos + 4], crc))
            pos += 4
            if pos + sum(lengths) != len(data):
                raise ValueError("string lengths do not add up to the entry's size")
        except ValueError as e:
            raise CheckpointError(f"{path}: tensor {entry.name!r}: corrupt string tensor ({e})") from None
        out = np.empty(n, dtype=object)
        for i, length in enumerate(lengths):
            out[i] = data[pos:pos + length]
            pos += length
        return out.reshape(entry.shape), crc

    def close(self) -> None:
        for f in self._files.values():
            f.close()  # type: ignore[attr-defined]
        self._files.clear()

    def __enter__(self) -> "TFCheckpointReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


# ============================================================================================ writing
def _to_bfloat16_bits(array: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, rounding to nearest even (as TF's conversion); NaN stays NaN."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    rounded = ((bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(array), np.uint16(0x7FC0), rounded)


def _string_payload(array: np.ndarray) -> tuple[bytes, int]:
    """A string tensor's bytes and its entry CRC (see `TFCheckpointReader._decode_strings` for the layout)."""
    items = [s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in array.reshape(-1)]
    crc = 0
    for s in items:
        crc = crc32c(struct.pack("<I" if len(s) <= 0xFFFFFFFF else "<Q", len(s)), crc)
    length_crc = struct.pack("<I", mask_crc(crc))
    strings = b"".join(items)
    crc = crc32c(strings, crc32c(length_crc, crc))
    return b"".join(_varint(len(s)) for s in items) + length_crc + strings, crc


def write_tf_checkpoint(prefix: str | os.PathLike, tensors: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray]],
                        bfloat16: Iterable[str] = (), block_size: int = BLOCK_SIZE) -> Path:
    """Write `tensors` as a one-shard TensorFlow checkpoint `prefix.index` + `prefix.data-00000-of-00001`.

    `tensors` may be a mapping or an iterable of (name, array) pairs -- a generator keeps only one tensor in
    memory at a time. Arrays of numpy's numeric and bool dtypes are written as they are; arrays of bytes/str
    (dtype object or `S`) as TF strings; names listed in `bfloat16` are rounded to bfloat16. Data goes in the
    order given, the index sorted by name, both exactly as TensorFlow's BundleWriter lays them out.
    """
    prefix = Path(prefix)
    bfloat16 = set(bfloat16)
    entries: dict[bytes, TensorEntry] = {}
    data_path = data_filename(prefix, 0, 1)
    offset = 0
    pairs = tensors.items() if isinstance(tensors, Mapping) else tensors
    with open(data_path, "wb") as f:
        for name, value in pairs:
            key = name.encode("utf-8")
            if not name or key in entries:
                raise CheckpointError(f"{prefix}: tensor name {name!r} is empty or appears twice")
            array = np.asarray(value)
            crc = None
            if array.dtype == object or array.dtype.kind in "SU":
                dtype = DT_STRING
                payload, crc = _string_payload(array)
            elif name in bfloat16:
                dtype, payload = DT_BFLOAT16, _to_bfloat16_bits(array)
            else:
                code = _DTYPE_BY_NUMPY.get(array.dtype.newbyteorder("<") if array.dtype.byteorder == ">"
                                           else array.dtype)
                if code is None:
                    raise CheckpointError(f"{prefix}: tensor {name!r}: numpy dtype {array.dtype} has no "
                                          "TensorFlow equivalent")
                dtype, payload = code, np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
            view = _byte_view(payload)
            f.write(view)
            entries[key] = TensorEntry(name=name, dtype=dtype, shape=tuple(int(d) for d in array.shape),
                                       offset=offset, size=len(view),
                                       crc32c=mask_crc(crc32c(view) if crc is None else crc))
            offset += len(view)
        f.flush()
        os.fsync(f.fileno())
    items = [(b"", HEADER)] + [(key, entries[key].serialize()) for key in sorted(entries)]
    index_path = Path(f"{prefix}{INDEX_SUFFIX}")
    with open(index_path, "wb") as f:
        f.write(_write_table(items, block_size=block_size))
        f.flush()
        os.fsync(f.fileno())
    return prefix


__all__ = ["TFCheckpointReader", "TensorEntry", "write_tf_checkpoint", "resolve_prefix", "is_tf_checkpoint",
           "crc32c", "mask_crc", "unmask_crc", "TF_DTYPES", "DEFAULT_PREFIX", "data_filename"]
