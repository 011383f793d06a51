"""What `bertlab predict` reads: plain text lines, or a table read as fine-tuning reads it, in the model's columns.

A file whose name says it is a table (`.csv`, `.tsv`, `.jsonl`, `.json`, `.parquet`, ...; `tasks.tables`) is
read through the same readers `bertlab finetune` uses, so a CSV's header is a header and its label column is
never part of a text. Which column holds the text:

    --text-column NAME           the user's choice (and --text-pair-column for a second text)
    config.json input_columns    the column the model was fine-tuned on (`finetune text-classification`)
    common names                 text, sentence, content, ... (`tasks.tables.TEXT_COLUMNS`), as finetune guesses,
                                 with a second text where the file has one (text_pair, sentence2, ...)

Other tasks' rows (question/context, tokens, choices) go to the model as the JSON objects they are. The row's
id is the file's id column (id, guid, idx, index) when it has one, else its line (record) number.

Anything else -- a `.txt` file, no extension, stdin -- is one item per line, as before: a plain text, or a JSON
object; a JSON object holding the model's trained column instead of "text" is read from that column. A file
whose content contradicts its name (JSON in a .csv, text in a .jsonl, no Parquet magic) is refused in one line
by the readers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import BertlabError
from ..tasks.tables import ID_COLUMNS, SUFFIXES, TEXT_COLUMNS, TEXT_PAIR_COLUMNS, FORMATS, guess_column, read_table
from .inputs import parse_record, read_lines

TEXT_FORMAT = "text"  # one item per line
INPUT_FORMATS = (TEXT_FORMAT, *FORMATS)


@dataclass(frozen=True)
class TextColumns:
    """Where a record's text (and second text) are: the user's names, else the model's trained ones."""

    text: str | None = None
    text_pair: str | None = None
    trained: bool = False  # the names come from the model's config.json

    @classmethod
    def for_model(cls, text_column: str | None, text_pair_column: str | None, config_extra: dict) -> "TextColumns":
        if text_column is not None:
            return cls(text_column, text_pair_column)
        trained = config_extra.get("input_columns")
        if isinstance(trained, dict) and isinstance(trained.get("text"), str):
            pair = text_pair_column or trained.get("text_pair")
            return cls(trained["text"], pair if isinstance(pair, str) else None, trained=True)
        return cls(None, text_pair_column)


@dataclass
class InputRow:
    """One input item: its id for the output row, where it came from (for messages), and the item itself --
    a text, a JSON object, or None for a blank line (answered as skipped, so output row i is input line i)."""

    id: Any
    where: str
    item: dict[str, Any] | str | None
    blank: str = ""  # a blank line as it was (spaces kept), echoed in its skipped row


def input_format(path: str | Path | None, format: str | None = None) -> str:
    """`format`, else the file name's (a table suffix), else one item per line."""
    if format is not None:
        if format not in INPUT_FORMATS:
            raise BertlabError(f"--format {format!r}: expected one of {', '.join(INPUT_FORMATS)}")
        return format
    if path is None or str(path) == "-":
        return TEXT_FORMAT
    return SUFFIXES.get(Path(path).suffix.lower(), TEXT_FORMAT)


def read_inputs(path: str | Path | None, columns: TextColumns, format: str | None = None,
                classify: bool = True, id_column: str | None = None) -> tuple[list[InputRow], str]:
    """The input items of `path` (stdin for None / '-') and a name for the source. `classify`: the model reads
    texts (a classifier, a text-to-text model), so a table's text columns are picked; otherwise a table's rows go
    to the model as JSON objects. `id_column`: a table's id column (default: id, guid, idx, index)."""
    kind = input_format(path, format)
    if kind == TEXT_FORMAT:
        if id_column is not None:
            raise BertlabError(f"{path or '<stdin>'}: --id-column applies to tables (.csv, .tsv, .jsonl, .json, "
                               ".parquet, or --format); this input is one item per line")
        lines = read_lines(path)
        rows = []
        for i, line in enumerate(lines.items):
            if not line.strip():
                rows.append(InputRow(i + 1, lines.where(i), None, line))
                continue
            record = parse_record(line, lines.where(i))
            if isinstance(record, dict):
                item = select_text(record, columns, lines.where(i)) if classify else record
                rows.append(InputRow(record.get("id", i + 1), lines.where(i), item))
            else:
                rows.append(InputRow(i + 1, lines.where(i), record))
        if not any(r.item is not None for r in rows):
            raise BertlabError(f"{lines.source}: only blank lines; expected one text or JSON object per line")
        return rows, lines.source
    if path is None or str(path) == "-":
        raise BertlabError(f"--format {kind}: tables are read from a file (--input FILE), not stdin")
    table = read_table(path, kind)
    text = pair = None
    if classify:
        text, pair = table_columns(table.columns, columns, table.path)
    if id_column is not None and id_column not in table.columns:
        raise BertlabError(f"{table.path}: no column {id_column!r} (--id-column); the file has columns: "
                           f"{', '.join(table.columns)}")
    id_column = id_column or guess_column(table.columns, ID_COLUMNS, exclude=tuple(c for c in (text, pair) if c))
    rows = []
    for row in table.rows:
        where = table.where(row)
        if classify:  # the texts as finetune reads them (`Table.text`)
            item = {"text": table.text(row, text)}
            if pair is not None and row.values.get(pair) is not None:  # a record without one: a single text
                item["text_pair"] = table.text(row, pair)
        else:
            item = dict(row.values)
        rows.append(InputRow(row.values.get(id_column, row.line) if id_column is not None else row.line, where, item))
    return rows, str(table.path)


def table_columns(names: Sequence[str], columns: TextColumns, source) -> tuple[str, str | None]:
    """(text column, second text column or None) of a table with columns `names`."""
    def need(name: str, what: str) -> str:
        if name not in names:
            told = " (the column the model was fine-tuned on; --text-column NAME to read another)" \
                if columns.trained else ""
            raise BertlabError(f"{source}: no column {name!r}{told} for the {what}; the file has columns: "
                               f"{', '.join(names) or 'none'}")
        return name

    if columns.text is not None:
        text = need(columns.text, "text")
        return text, need(columns.text_pair, "second text") if columns.text_pair is not None else None
    text = guess_column(names, TEXT_COLUMNS)
    if text is None:
        raise BertlabError(f"{source}: no text column among {', '.join(names)}; name it with --text-column")
    if columns.text_pair is not None:
        return text, need(columns.text_pair, "second text")
    # A model with no recorded columns: a second-text column the file has is read (dropping it would change
    # what a pair model sees, silently).
    return text, guess_column(names, TEXT_PAIR_COLUMNS, exclude=(text,))


def select_text(record: dict[str, Any], columns: TextColumns, where: str) -> dict[str, Any]:
    """A JSON object's text fields under the names the runners read ("text", "text_pair"): from the named
    (or trained) columns when the object has them; otherwise the object as it is."""
    if columns.text is None or columns.text not in record:
        if columns.text is not None and not columns.trained:  # the user named it: it must be there
            raise BertlabError(f"{where}: missing field {columns.text!r} (--text-column)")
        return record
    picked = {k: v for k, v in record.items() if k not in ("text", "text_pair")}
    picked["text"] = record[columns.text]
    if columns.text_pair is not None and columns.text_pair in record:
        picked["text_pair"] = record[columns.text_pair]
    return picked


@dataclass
class TextInputs:
    """The texts `embed`, `features`, `fill-mask` and `similarity` read (`read_texts`), with each one's id and
    place. `ids` is None for one-text-per-line input (its rows are its lines, as always); for a table it holds
    each row's id column (id, guid, ...), else its line (record) number, for the output rows to carry.
    `pairs` holds a table's second texts (`with_pair`), None elsewhere."""

    items: list[str]
    source: str
    ids: list[Any] | None = None
    pairs: list[str] | None = None
    places: list[str] | None = None

    def where(self, i: int) -> str:
        return self.places[i] if self.places is not None else f"{self.source}:{i + 1}"

    @property
    def table(self) -> bool:
        return self.ids is not None


def table_files(spec: str | Path, format: str | None = None) -> list[Path]:
    """The table files `spec` names, in a fixed order: a folder's files with a table suffix (or, with `format`,
    all its visible files), a glob pattern's matches, or the one file. Sorted by name, so the rows of a folder
    come in the same order every time."""
    import glob

    spec = str(spec)
    if Path(spec).is_dir():
        files = [p for p in Path(spec).iterdir() if p.is_file() and not p.name.startswith((".", "_"))
                 and (format is not None or p.suffix.lower() in SUFFIXES)]
        what = f"{spec}: no table files (.csv, .tsv, .jsonl, .json, .parquet) in this folder"
    elif glob.has_magic(spec):
        files = [Path(p) for p in glob.glob(spec) if Path(p).is_file()]
        what = f"{spec}: no file matches this pattern"
    else:
        return [Path(spec)]
    if not files:
        raise BertlabError(what)
    return sorted(files)


def is_many(spec: str | Path | None) -> bool:
    """Whether `--input` names several files (a folder or a glob pattern) rather than one file or stdin."""
    import glob

    return spec is not None and str(spec) != "-" and (Path(spec).is_dir() or glob.has_magic(str(spec)))


@dataclass
class TableTexts:
    """A table opened for its texts: the text (and second-text) column and the id column, picked as `predict`
    picks them. `rows()` streams (id, text, second text or None, place) from the file."""

    table: Any  # tasks.tables.Table
    text: str
    pair: str | None
    id: str | None

    @property
    def path(self) -> str:
        return str(self.table.path)

    def rows(self, with_pair: bool = False, need_id: bool = False):
        """(id, text, second text, place) per row. The id is the id column's value, else the row's line (record)
        number; with `need_id` a row without one is refused (ids must then tell rows of several files apart)."""
        table = self.table
        for row in table.rows:
            row_id = row.values.get(self.id) if self.id is not None else None
            if row_id is None:
                if need_id:
                    raise BertlabError(f"{table.where(row)}: no id (column {self.id or 'id'!r}); every row needs "
                                       "one here (--id-column NAME)")
                row_id = row.line
            yield row_id, table.text(row, self.text), table.text(row, self.pair) if with_pair else None, \
                table.where(row)


def open_table_texts(path: str | Path, text_column: str | None = None, format: str | None = None,
                     text_pair_column: str | None = None, id_column: str | None = None,
                     with_pair: bool = False, need_id: bool = False) -> TableTexts:
    """A table file's `TableTexts`: the text from `text_column`, else a common name (text, sentence, ...); with
    `with_pair` the second text from `text_pair_column`, else a common name (text_pair, sentence2, ...); the id
    from `id_column`, else a common name (id, guid, ...). `need_id`: a table without an id column is refused."""
    kind = input_format(path, format)
    if kind == TEXT_FORMAT:
        raise BertlabError(f"{path}: not a table (.csv, .tsv, .jsonl, .json, .parquet); name it after what it "
                           "holds or pass --input-format")
    table = read_table(path, kind)
    text, pair = table_columns(table.columns, TextColumns(text_column, text_pair_column), table.path)
    if with_pair and pair is None:
        raise BertlabError(f"{table.path}: no second-text column among {', '.join(table.columns)}; name it "
                           "with --text-pair-column")
    if id_column is not None:
        if id_column not in table.columns:
            raise BertlabError(f"{table.path}: no column {id_column!r} (--id-column); the file has columns: "
                               f"{', '.join(table.columns)}")
        ids = id_column
    else:
        ids = guess_column(table.columns, ID_COLUMNS, exclude=tuple(c for c in (text, pair) if c))
    if ids is None and need_id:
        raise BertlabError(f"{table.path}: no id column among {', '.join(table.columns)}; name it with --id-column")
    return TableTexts(table, text, pair if with_pair else None, ids)


def read_texts(path: str | Path | None, text_column: str | None = None, format: str | None = None,
               with_pair: bool = False, text_pair_column: str | None = None,
               id_column: str | None = None) -> TextInputs:
    """The texts of `path` (stdin for None / '-'): a table (told by the file name, or `format`) as `predict`
    reads one -- the text from `text_column`, else a common name (text, sentence, ...), and with `with_pair`
    the second text from `text_pair_column`, else a common name (text_pair, sentence2, ...) -- or anything else
    one text per line, as it is (a line that looks like JSON is still that text). A folder or a glob pattern
    is its table files (`table_files`) one after the other, each row keeping its own id."""
    if is_many(path):
        parts = [read_texts(p, text_column, format, with_pair, text_pair_column, id_column)
                 for p in table_files(path, format)]
        if not all(part.table for part in parts):
            raise BertlabError(f"{path}: a folder or pattern is read as tables; "
                               f"{next(p.source for p in parts if not p.table)} is not one")
        return TextInputs([t for p in parts for t in p.items], str(path), [i for p in parts for i in p.ids],
                          [t for p in parts for t in p.pairs] if with_pair else None,
                          [w for p in parts for w in p.places])
    kind = input_format(path, format)
    if kind == TEXT_FORMAT:
        if text_column is not None or text_pair_column is not None or id_column is not None:
            raise BertlabError(f"{path or '<stdin>'}: --text-column and --id-column apply to tables (.csv, .tsv, "
                               ".jsonl, .json, .parquet, or --format); this input is one text per line")
        lines = read_lines(path)
        return TextInputs(lines.items, lines.source)
    if path is None or str(path) == "-":
        raise BertlabError(f"--format {kind}: tables are read from a file (--input FILE), not stdin")
    opened = open_table_texts(path, text_column, format, text_pair_column, id_column, with_pair)
    texts, seconds, ids, places = [], [], [], []
    for row_id, text, second, where in opened.rows(with_pair):
        texts.append(text)
        seconds.append(second)
        ids.append(row_id)
        places.append(where)
    if not texts:
        raise BertlabError(f"{opened.path}: no rows; expected a header and one row per text")
    return TextInputs(texts, opened.path, ids, seconds if with_pair else None, places)


def add_text_input_arguments(p, what: str = "one text per line") -> None:
    """`--input`, `--format` and `--text-column` as `embed`, `features`, `fill-mask` and `similarity` spell them."""
    p.add_argument("--input", metavar="FILE",
                   help=f"a table (.csv, .tsv, .jsonl, .json, .parquet: its text column, the id carried into the "
                        f"output), or {what} (default: stdin)")
    p.add_argument("--input-format", choices=INPUT_FORMATS,
                   help="how to read --input when its name does not say (text: one text per line)")
    p.add_argument("--text-column", metavar="NAME",
                   help="a table's column holding the text (default: text, sentence, ...)")
    p.add_argument("--id-column", metavar="NAME",
                   help="a table's column holding the row's id, carried into the output (default: id, guid, idx, "
                        "index; else the row's line number)")


def write_ids(output: str | Path, ids: list[Any]) -> Path:
    """FILE.ids.json beside an array output (.npy / .safetensors): the table's id of each row, in order."""
    import json

    from ..core.fsio import atomic_write_text

    target = Path(str(output) + ".ids.json")
    atomic_write_text(target, json.dumps(ids) + "\n")
    return target
