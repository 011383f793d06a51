"""CRC-32C (Castagnoli), the checksum TensorFlow and LevelDB store (masked) beside every tensor and block, at
hundreds of MB/s in numpy."""

from __future__ import annotations

import functools

import numpy as np


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
