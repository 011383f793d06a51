"""A checkpoint as a whole: its files (`PREFIX.index`, `PREFIX.data-*`), `TFCheckpointReader` and
`write_tf_checkpoint`."""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import numpy as np

from ..core.errors import CheckpointError
from .crc32c import _byte_view, crc32c, mask_crc, unmask_crc
from .protobuf import (_BUNDLE_VERSION, _DTYPE_BY_NUMPY, DT_BFLOAT16, DT_STRING, HEADER, TF_DTYPES, TensorEntry, _int,
                       _message, _parse_message, _read_varint, _varint)
from .sstable import BLOCK_SIZE, _read_table, _write_table

INDEX_SUFFIX = ".index"
DEFAULT_PREFIX = "bert_model.ckpt"  # the name in Google's release folders


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
