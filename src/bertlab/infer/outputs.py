"""Writers for inference results: JSON Lines (small jobs, readable), `.npy` and safetensors (large jobs).

The array writers stream: rows are appended to the file as batches finish and the header, which records
the final shape, is written last into space reserved at the start. Memory stays at one batch however many
rows there are, and the files are the standard formats (`numpy.load`, `safetensors.safe_open`) --
numpy's header may be padded with spaces, and so may safetensors' (its spec allows trailing spaces).
"""

from __future__ import annotations

import json
import struct
import sys
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any, Iterator

import numpy as np

from ..core.errors import BertlabError, OutputError, is_write_failure, output_error

ARRAY_SUFFIXES = (".npy", ".safetensors")


def output_kind(path: str | Path | None) -> str:
    """'jsonl' (stdout or any other suffix), 'npy' or 'safetensors', from the output file's suffix."""
    if path is None or str(path) == "-":
        return "jsonl"
    return {".npy": "npy", ".safetensors": "safetensors"}.get(Path(path).suffix.lower(), "jsonl")


@contextmanager
def text_output(path: str | Path | None) -> Iterator[IO[str]]:
    """A text stream to write JSON Lines to: the file (written to a temporary name, renamed on success so a
    failed run leaves no half file) or stdout."""
    if path is None or str(path) == "-":
        yield sys.stdout
        sys.stdout.flush()
        return
    p = Path(path)
    tmp = temporary_path(p)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            yield f
        tmp.replace(p)
    except BaseException as e:
        with suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and is_write_failure(e, tmp):  # disk full, read-only: one line naming the
            raise output_error(p, e) from None                     # output, not its temporary
        raise


def json_line(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"


def temporary_path(p: Path) -> Path:
    """The hidden name a file is written under before it is renamed to `p` (refused: a missing folder, a folder)."""
    if not p.parent.exists():
        raise BertlabError(f"{p}: the folder {p.parent} does not exist")
    if p.is_dir():
        raise OutputError(f"{p}: is a folder; give a file name for the output")
    return p.with_name(f".{p.name}.tmp")


class _StreamingFile:
    """The temporary file an array writer streams into: a failed write (disk full, read-only) is one
    `OutputError` line naming the output, and the temporary is removed."""

    def __init__(self, path: Path, reserved: int):
        self.path, self.tmp = path, temporary_path(path)
        try:
            self.file = open(self.tmp, "wb")
            self.file.write(b"\0" * reserved)
        except OSError as e:
            self.abort()
            raise output_error(path, e) from None

    def write(self, data: bytes, at: int | None = None) -> None:
        try:
            if at is not None:
                self.file.seek(at)
            self.file.write(data)
        except OSError as e:
            self.abort()
            raise output_error(self.path, e) from None

    def finish(self) -> None:
        try:
            self.file.close()
            self.tmp.replace(self.path)
        except OSError as e:
            self.abort()
            raise output_error(self.path, e) from None

    def abort(self) -> None:
        with suppress(OSError):
            if hasattr(self, "file"):
                self.file.close()
        with suppress(OSError):
            self.tmp.unlink(missing_ok=True)


class NpyWriter:
    """Appends float32 rows of shape `row_shape` to a `.npy` file; the header is fixed up on `close`."""

    HEADER_BYTES = 128  # magic + version + length + dict padded: room for any shape of a few dimensions

    def __init__(self, path: str | Path, row_shape: tuple[int, ...], dtype: str = "<f4"):
        self.path, self.row_shape, self.dtype = Path(path), tuple(row_shape), np.dtype(dtype)
        self.rows = 0
        self._out = _StreamingFile(self.path, self.HEADER_BYTES)

    def write(self, rows: np.ndarray) -> None:
        rows = np.ascontiguousarray(rows, dtype=self.dtype)
        if rows.shape[1:] != self.row_shape:
            raise ValueError(f"rows of shape {rows.shape[1:]} written to an array of rows {self.row_shape}")
        self._out.write(rows.tobytes())
        self.rows += rows.shape[0]

    def close(self) -> None:
        header = {"descr": self.dtype.str, "fortran_order": False, "shape": (self.rows, *self.row_shape)}
        text = repr(header).encode("latin1")
        room = self.HEADER_BYTES - 10 - 1  # magic(6) + version(2) + length(2), then "\n"
        if len(text) > room:
            raise ValueError("npy header does not fit")  # cannot happen for the shapes written here
        self._out.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", self.HEADER_BYTES - 10)
                        + text + b" " * (room - len(text)) + b"\n", at=0)
        self._out.finish()

    def abort(self) -> None:
        self._out.abort()

    def __enter__(self) -> "NpyWriter":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.abort() if exc_type else self.close()


class SafetensorsWriter:
    """Streams one float32 tensor `name` of rows `row_shape` into a safetensors file; small extra tensors
    (`extras`, e.g. row offsets) and string metadata are added on `close`, after it."""

    HEADER_BYTES = 4096

    def __init__(self, path: str | Path, name: str, row_shape: tuple[int, ...]):
        self.path, self.name, self.row_shape = Path(path), name, tuple(row_shape)
        self.rows = 0
        self._out = _StreamingFile(self.path, 8 + self.HEADER_BYTES)

    def write(self, rows: np.ndarray) -> None:
        rows = np.ascontiguousarray(rows, dtype="<f4")
        if rows.shape[1:] != self.row_shape:
            raise ValueError(f"rows of shape {rows.shape[1:]} written to a tensor of rows {self.row_shape}")
        self._out.write(rows.tobytes())
        self.rows += rows.shape[0]

    def close(self, extras: dict[str, np.ndarray] | None = None, metadata: dict[str, str] | None = None) -> None:
        end = self.rows * int(np.prod(self.row_shape, dtype=np.int64)) * 4
        header: dict[str, Any] = {self.name: {"dtype": "F32", "shape": [self.rows, *self.row_shape],
                                              "data_offsets": [0, end]}}
        for key, arr in (extras or {}).items():
            arr = np.ascontiguousarray(arr)
            dtype = {np.dtype("<i8"): "I64", np.dtype("<f4"): "F32", np.dtype("<i4"): "I32"}[arr.dtype]
            header[key] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [end, end + arr.nbytes]}
            self._out.write(arr.tobytes())
            end += arr.nbytes
        if metadata:
            header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
        text = json.dumps(header, separators=(",", ":")).encode("utf-8")
        if len(text) > self.HEADER_BYTES:
            raise BertlabError(f"{self.path}: metadata too large for the safetensors header")
        self._out.write(struct.pack("<Q", self.HEADER_BYTES) + text + b" " * (self.HEADER_BYTES - len(text)), at=0)
        self._out.finish()

    def abort(self) -> None:
        self._out.abort()
