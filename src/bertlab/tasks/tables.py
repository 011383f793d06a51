"""Reading the user's own tables -- CSV, TSV, JSON Lines, a JSON array, Parquet -- with line numbers.

Tasks built from the user's files (`text_classification.py`, `own_tasks.py`) read them through `read_table`,
which gives every row with the line (or record) it came from, so each later complaint -- an unknown label,
an empty text -- names the file and line. The format comes from the file name (`.csv`, `.tsv`/`.tab`,
`.jsonl`/`.ndjson`, `.json`, `.parquet`/`.pq`) or is given (`format=`); `FORMATS` is the registry of readers.

    CSV      comma-separated, a header row, standard quoting (fields may hold commas, quotes and newlines)
    TSV      tab-separated, a header row, NO quoting (quotes are text, as in GLUE's files; a quote-aware
             reader would run an unmatched quote across lines)
    JSONL    one JSON object per line; blank lines skipped
    JSON     a JSON array of objects (or, if the file does not start with `[`, JSON Lines, as Hugging Face's
             `run_glue.py` reads `.json`)
    Parquet  needs `pyarrow`; rows are numbered from 1 ("row N")

Bad input is a one-line `DataError` naming the file and line: an empty file, a malformed JSON line, a row
with more or fewer fields than the header (the usual sign of a wrong delimiter, also caught at the header:
a CSV whose only column name holds tabs or semicolons), a missing column (the message lists the columns
that exist).

Memory: a `Table`'s rows are not held. `read_table` reads the header (JSON: every record's keys, in one
streaming pass) and checks that a row follows; `Table.rows` then reads the file again, row by row, each time
it is iterated, so a caller that turns rows into something compact (token ids, a column of texts) holds that
and one row, never the file. `max_chars` caps every text field: a longer one is cut to that many characters
as it is read (counted in `Table.cut`, with its first place), so one 50 MB field costs its line, not a
tokenization of 50 MB.

Column defaults: `guess_column` picks the first of a role's common names (`TEXT_COLUMNS`, `LABEL_COLUMNS`,
...) present in the header, case-insensitively; the task reports which it chose.
"""

from __future__ import annotations

import csv
import itertools
import json
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import DataError, data_error, iter_lines

# Common column names per role, most usual first (Hugging Face datasets, Kaggle, GLUE).
TEXT_COLUMNS = ("text", "sentence", "sentence1", "content", "document", "review", "body", "article", "question",
                "premise", "text_a", "comment", "tweet", "title")
TEXT_PAIR_COLUMNS = ("text_pair", "sentence2", "hypothesis", "text_b", "question2")
LABEL_COLUMNS = ("label", "labels", "category", "class", "target", "topic", "sentiment", "y", "tag", "intent",
                 "score")
TOKENS_COLUMNS = ("tokens", "words")
ID_COLUMNS = ("id", "guid", "idx", "index")  # a row's own id, carried into its prediction
TAGS_COLUMNS = ("tags", "ner_tags", "labels", "label")


@dataclass(frozen=True)
class Row:
    line: int  # the line (CSV/TSV/JSONL) or record number (JSON array, Parquet) it starts at, from 1
    values: dict[str, Any]


class FileRows:
    """A table's rows, read from the file on each iteration (streaming); text fields over `max_chars` cut, and
    counted in `cut` (column -> fields cut in the latest complete pass) with `first_cut`, the first place."""

    def __init__(self, path: Path, open_rows: Callable[[], Iterator[Row]], max_chars: int | None = None):
        self.path, self._open, self.max_chars = path, open_rows, max_chars
        self.cut: Counter = Counter()
        self.first_cut: int | None = None
        self._len: int | None = None

    def __iter__(self) -> Iterator[Row]:
        cut: Counter = Counter()
        n = 0
        for row in self._open():
            n += 1
            if self.max_chars is not None:
                for key, value in row.values.items():
                    if isinstance(value, str) and len(value) > self.max_chars:
                        row.values[key] = value[:self.max_chars]
                        cut[key] += 1
                        if self.first_cut is None:
                            self.first_cut = row.line
            yield row
        self.cut, self._len = cut, n

    def __getitem__(self, index: int | slice) -> Row | list[Row]:
        """Row `index` (or a slice), read up to it: for a few rows, not for walking the table (iterate)."""
        if isinstance(index, slice):
            return list(self)[index] if (index.start or 0) < 0 or (index.stop or 0) < 0 or index.stop is None \
                else list(itertools.islice(self._open(), index.start, index.stop, index.step))
        if index < 0:
            index += len(self)
        row = next(itertools.islice(self, index, None), None) if index >= 0 else None
        if row is None:
            raise IndexError(f"{self.path}: no row {index}")
        return row

    def __len__(self) -> int:
        if self._len is None:
            self._len = sum(1 for _ in self._open())
        return self._len


@dataclass
class Table:
    """A user's file: its column names (header order) and its rows (`FileRows`: streamed, or a list)."""

    path: Path
    format: str
    columns: list[str]
    rows: FileRows | list[Row]
    by_line: bool = True  # rows are numbered by line (CSV, TSV, JSON Lines), else by record (JSON array, Parquet)

    @property
    def cut(self) -> Counter:
        """Text fields cut to the `max_chars` the table was read with, per column (after a pass over the rows)."""
        return self.rows.cut if isinstance(self.rows, FileRows) else Counter()

    def where(self, row: Row) -> str:
        """`file:line` (or `file: record N` where lines do not apply), for messages."""
        return f"{self.path}:{row.line}" if self.by_line else f"{self.path}: record {row.line}"

    def error(self, row: Row, message: str) -> DataError:
        return DataError(f"{self.where(row)}: {message}")

    def require(self, name: str, what: str) -> str:
        """`name` if the table has that column; otherwise a one-line error listing the columns it has."""
        if name not in self.columns:
            raise DataError(f"{self.path}: no column {name!r} (the {what}); the file has columns: "
                            f"{', '.join(self.columns) or 'none'}")
        return name

    def text(self, row: Row, column: str) -> str:
        """The text in `row`'s `column`: a number is its text (spreadsheets write "42" as 42), anything else
        that is not a string -- nothing, a list, a bool -- is a one-line error naming the line."""
        value = row.values.get(column)
        if value is None:
            raise self.error(row, f"missing text in column {column!r}")
        if not isinstance(value, str):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return str(value)
            raise self.error(row, f"column {column!r} holds {type(value).__name__}, expected text")
        return value


def guess_column(columns: Sequence[str], candidates: Sequence[str], exclude: Sequence[str] = ()) -> str | None:
    """The first of `candidates` among `columns` (case-insensitive; the file's spelling is returned)."""
    lowered = {c.lower(): c for c in columns if c not in exclude}
    return next((lowered[c] for c in candidates if c in lowered), None)


# ---------------------------------------------------------------------------------------------- readers
def _delimited(path: Path, delimiter: str, quoting: int) -> tuple[list[str], list[Row]]:
    header, rows = _delimited_stream(path, delimiter, quoting)
    return header, list(rows)


# Python's csv refuses a field over 128 KB; JSON has no such limit. Fields are bounded by the caller's
# `max_chars` (cut, counted) for every format alike, so csv's own limit is lifted to this sanity bound.
FIELD_LIMIT = 1 << 28


def _delimited_stream(path: Path, delimiter: str, quoting: int) -> tuple[list[str], Iterator[Row]]:
    """The header (read and checked now) and a generator of the rows after it."""
    if csv.field_size_limit() < FIELD_LIMIT:
        csv.field_size_limit(FIELD_LIMIT)
    lines = iter_lines(path)
    name = {",": "comma", "\t": "tab", ";": "semicolon", "|": "pipe"}.get(delimiter, repr(delimiter))
    # csv parses (quoted fields may span lines); iter_lines decodes line by line for exact error lines
    reader = csv.reader((text for _, text in lines), delimiter=delimiter, quoting=quoting, strict=True)
    try:
        header = next(reader, None)
        while header is not None and not any(h.strip() for h in header):  # leading blank lines
            header = next(reader, None)
    except csv.Error as e:
        raise data_error(path, reader.line_num, f"not valid {name}-separated text ({e})") from None
    if header is None:
        raise data_error(path, None, f"empty file; expected a header row of {name}-separated column names")
    header = [h.strip() for h in header]
    if len(header) == 1:
        for other, other_name in (("\t", "tab"), (";", "semicolon"), (",", "comma"), ("|", "pipe")):
            if other != delimiter and other in header[0]:
                raise data_error(path, reader.line_num, f"the header is one column {header[0][:60]!r}: the file "
                                 f"looks {other_name}-separated, not {name}-separated (name it .tsv / .csv to "
                                 "match, or pass --delimiter)")
    if len(set(header)) != len(header):
        dup = next(h for h in header if header.count(h) > 1)
        raise data_error(path, reader.line_num, f"column {dup!r} appears twice in the header")
    return header, _delimited_rows(path, reader, header, name)


def _delimited_rows(path: Path, reader, header: list[str], name: str) -> Iterator[Row]:
    previous_end = reader.line_num
    try:
        for fields in reader:
            start, previous_end = previous_end + 1, reader.line_num
            if not fields or (len(fields) == 1 and not fields[0].strip()):
                continue
            if len(fields) != len(header):
                raise data_error(path, start, f"expected {len(header)} {name}-separated fields (the header's "
                                 f"{', '.join(header)}), got {len(fields)}: a wrong delimiter or an unquoted "
                                 f"{name} in a field?")
            yield Row(start, dict(zip(header, fields)))
    except csv.Error as e:
        raise data_error(path, reader.line_num, f"not valid {name}-separated text ({e})") from None


def read_csv(path: Path, delimiter: str | None = None) -> tuple[list[str], list[Row]]:
    return _delimited(path, delimiter or ",", csv.QUOTE_MINIMAL)


def read_tsv(path: Path, delimiter: str | None = None) -> tuple[list[str], list[Row]]:
    return _delimited(path, delimiter or "\t", csv.QUOTE_NONE)


def _records(path: Path, items: Iterator[tuple[int, Any]], keep: bool = True) -> tuple[list[str], list[Row]]:
    """Every record's keys (first-seen order) and, with `keep`, the rows (else an empty list)."""
    columns: dict[str, None] = {}  # first-seen order
    rows = []
    seen = False
    for row in _record_rows(path, items):
        columns.update(dict.fromkeys(row.values))
        seen = True
        if keep:
            rows.append(row)
    if not seen:
        raise data_error(path, None, "empty file; expected one JSON object per line")
    return list(columns), rows


def _jsonl_items(path: Path) -> Iterator[tuple[int, Any]]:
    for line, text in iter_lines(path):
        if not text.strip():
            continue
        try:
            yield line, json.loads(text)
        except json.JSONDecodeError as e:
            raise data_error(path, line, f"not valid JSON ({e.msg} at column {e.colno})") from None


def read_jsonl(path: Path, delimiter: str | None = None) -> tuple[list[str], list[Row]]:
    return _records(path, _jsonl_items(path))


def _record_rows(path: Path, items: Iterator[tuple[int, Any]]) -> Iterator[Row]:
    for line, obj in items:
        if not isinstance(obj, dict):
            raise data_error(path, line, f"expected a JSON object, got {type(obj).__name__}")
        yield Row(line, obj)


def read_json(path: Path, delimiter: str | None = None) -> tuple[list[str], list[Row]]:
    """A JSON array of objects; a file that does not start with `[` is read as JSON Lines."""
    if not _is_array(path):
        return read_jsonl(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        raise data_error(path, e.lineno, f"not valid JSON ({e.msg} at column {e.colno})") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    return _records(path, ((i + 1, obj) for i, obj in enumerate(data)))


def _is_array(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4096).lstrip(b"\xef\xbb\xbf").lstrip().startswith(b"[")


def read_parquet(path: Path, delimiter: str | None = None) -> tuple[list[str], list[Row]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow), or give CSV/JSONL") from None
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises its own error types for damaged files
        raise DataError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
    columns = list(table.column_names)
    rows = [Row(i + 1, record) for i, record in enumerate(table.to_pylist())]
    if not rows:
        raise DataError(f"{path}: empty file; no rows")
    return columns, rows


def check_content(path: Path, kind: str) -> None:
    """A file whose first bytes contradict its format (JSON in a .csv, a CSV or plain text in a .jsonl, no
    Parquet magic): one line saying what it looks like, before a reader makes something odd of it."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if kind == "parquet":
        if head[:4] != b"PAR1":
            raise DataError(f"{path}: not a Parquet file (it does not start with the PAR1 mark); name it after "
                            "what it holds (.csv, .jsonl, ...) or pass --format")
        return
    start = head.lstrip(b"\xef\xbb\xbf").lstrip()
    if not start:
        return  # empty: the reader says so
    first = start[:1]
    line = start.split(b"\n", 1)[0][:60].decode("utf-8", "replace")
    if kind in ("csv", "tsv") and first in (b"{", b"["):
        raise DataError(f"{path}: looks like JSON ({line!r}), not {kind.upper()}; name it .jsonl / .json or "
                        "pass --format jsonl")
    if kind in ("jsonl", "json") and first not in (b"{", b"["):
        raise DataError(f"{path}:1: not JSON: the file starts with {line!r}; a CSV, TSV or text file? name it "
                        ".csv / .tsv / .txt, or pass --format")


Reader = Callable[..., tuple[list[str], list[Row]]]
FORMATS: dict[str, Reader] = {"csv": read_csv, "tsv": read_tsv, "jsonl": read_jsonl, "json": read_json,
                              "parquet": read_parquet}
SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json",
            ".parquet": "parquet", ".pq": "parquet"}


def table_format(path: str | Path, format: str | None = None) -> str:
    if format is not None:
        if format not in FORMATS:
            raise DataError(f"unknown format {format!r}; expected one of {', '.join(FORMATS)}")
        return format
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIXES:
        raise DataError(f"{path}: cannot tell the format from the name; expected a file ending in "
                        f"{', '.join(SUFFIXES)} (or pass --format)")
    return SUFFIXES[suffix]


def _stream(path: Path, kind: str, delimiter: str | None) -> tuple[list[str], Callable[[], Iterator[Row]]]:
    """The columns and a function opening a fresh pass over the rows. CSV/TSV: the header; JSON Lines: the keys
    of every record (one streaming pass); a JSON array and Parquet are read whole (their own formats' limits)."""
    if kind in ("csv", "tsv"):
        sep, quoting = (delimiter or ",", csv.QUOTE_MINIMAL) if kind == "csv" else (delimiter or "\t", csv.QUOTE_NONE)
        header, _ = _delimited_stream(path, sep, quoting)
        return header, lambda: _delimited_stream(path, sep, quoting)[1]
    if kind in ("jsonl", "json") and (kind == "jsonl" or not _is_array(path)):
        columns, _ = _records(path, _jsonl_items(path), keep=False)
        return columns, lambda: _record_rows(path, _jsonl_items(path))
    columns, rows = FORMATS[kind](path, delimiter)
    return columns, lambda: iter(rows)


def read_table(path: str | Path, format: str | None = None, delimiter: str | None = None,
               max_chars: int | None = None) -> Table:
    """The file as a `Table` whose rows stream from the file (see the module docstring); one-line `DataError`s
    for a missing, empty or malformed file (a malformed row: when the rows are read). `max_chars` caps text
    fields."""
    path = Path(path)
    kind = table_format(path, format)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    check_content(path, kind)
    columns, open_rows = _stream(path, kind, delimiter)
    if next(open_rows(), None) is None:
        raise DataError(f"{path}: no rows after the header")
    return Table(path, kind, columns, FileRows(path, open_rows, max_chars),
                 by_line=kind != "parquet" and not (kind == "json" and _is_array(path)))
