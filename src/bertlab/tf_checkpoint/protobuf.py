"""The protobuf wire format, decoded and encoded by hand for the three tiny messages of a tensor bundle, and
those messages: the header, and `TensorEntry` (a tensor's dtype, shape, shard, offset, size, checksum)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np


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
