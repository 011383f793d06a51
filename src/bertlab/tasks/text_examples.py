"""The user's text-classification files as examples: which columns hold the texts and the label (named by flag
or guessed, `resolve_columns`), the problem type (`decide_problem_type`: single-label, multi-label or regression),
each row's label parsed with its file and line (`parse_label`), and the examples kept in a few flat arrays rather
than one object per row (`TextExamples`). The task (`text_classification.py`) builds on these.
"""

from __future__ import annotations

import logging
import math
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .base import DataError
from .tables import ID_COLUMNS, LABEL_COLUMNS, TEXT_COLUMNS, TEXT_PAIR_COLUMNS, Row, Table, guess_column
from .own_splits import InputOptions
from .text_features import MAX_WINDOWS, Windows

log = logging.getLogger(__name__)

SINGLE, MULTI, REGRESSION = "single_label_classification", "multi_label_classification", "regression"
# Distinct classes a classification may have: more is an id or free-text column taken for the label (100,000
# "labels" made a 10.7 MB log line and an 80 MB metrics.json), and a head the size of a vocabulary.
MAX_CLASSES = 10_000
# Characters kept of a text field (`field_chars`): every token the model reads comes from at least one character
# of the text, and real text has 3-6 per token, so 64 per token cuts only what the model would not read --
# while a 50 MB field costs 8 KB (truncate, 128 tokens), not a tokenization of 50 MB.
CHARS_PER_TOKEN = 64


@dataclass(frozen=True)
class TextExample:
    guid: str  # the file's id column, or "split-line"
    text_a: str
    text_b: str | None
    label: str | tuple[str, ...] | float | None  # a class, a set of classes (sorted), a number; None: unlabelled
    source: str  # "path:line"


@dataclass(frozen=True)
class Columns:
    """Which columns hold the texts and the label (the label column may be absent from a test file)."""

    text: str
    text_pair: str | None
    label: str
    label_separator: str = ","


# ---------------------------------------------------------------------------------------------- reading
def resolve_columns(table: Table, options: InputOptions) -> Columns:
    """The columns named by the options, or guessed from common names; guesses are logged."""
    def pick(given: str | None, candidates, what: str, flag: str, exclude=()) -> str | None:
        if given is not None:
            return table.require(given, what)
        guess = guess_column(table.columns, candidates, exclude)
        if guess is not None:
            log.info("%s: %s column %r (guessed; %s NAME to choose another)", table.path, what, guess, flag)
        return guess

    text = pick(options.text_column, TEXT_COLUMNS, "text", "--text-column")
    if text is None:
        raise DataError(f"{table.path}: no text column among {', '.join(table.columns)}; name it with --text-column")
    label = pick(options.label_column, LABEL_COLUMNS, "label", "--label-column", exclude=(text,))
    if label is None:
        raise DataError(f"{table.path}: no label column among {', '.join(table.columns)}; name it with "
                        "--label-column")
    pair = options.text_pair_column
    if pair is not None:
        table.require(pair, "second text")
    elif options.text_column is None and text.lower() in ("sentence1", "question", "premise"):
        pair = guess_column(table.columns, TEXT_PAIR_COLUMNS, exclude=(text, label))
        if pair is not None:
            log.info("%s: second text column %r (guessed; --text-pair-column NAME to choose)", table.path, pair)
    return Columns(text, pair, label, options.label_separator)


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    try:
        float(str(value))
        return str(value).strip() != ""
    except ValueError:
        return False


def decide_problem_type(values: Sequence[Any], options: InputOptions, table: Table, column: str) -> str:
    """The option's problem type; else multi-label for --multi-label or list labels; else regression when
    every label is a number and some have a fraction; else single-label classification."""
    if options.problem_type is not None:
        return options.problem_type
    if options.multi_label:
        return MULTI
    if any(isinstance(v, list) for v in values):
        log.info("%s: column %r holds lists: multi-label classification", table.path, column)
        return MULTI
    present = [v for v in values if v is not None and v != ""]
    if present and all(_is_number(v) for v in present) and \
            any(not float(v).is_integer() for v in present):
        log.info("%s: column %r holds numbers with fractions: regression (--problem-type "
                 "single_label_classification to treat them as classes)", table.path, column)
        return REGRESSION
    return SINGLE


def _label_name(value: Any, table: Table, row: Row) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise table.error(row, f"label {value!r} is not a string or a number")
    name = str(value).strip()
    if isinstance(value, float) and value.is_integer():
        name = str(int(value))
    return name


def parse_label(value: Any, problem_type: str, columns: Columns, table: Table, row: Row):
    """A row's label value -> a class name, a sorted tuple of class names, or a float."""
    if problem_type == REGRESSION:
        if not _is_number(value):
            raise table.error(row, f"label {value!r} in column {columns.label!r} is not a number (regression)")
        number = float(value)
        if not math.isfinite(number):
            raise table.error(row, f"label {value!r} in column {columns.label!r} is not a finite number")
        return number
    if problem_type == MULTI:
        if isinstance(value, list):
            names = [_label_name(v, table, row) for v in value]
        elif isinstance(value, str):
            names = [part.strip() for part in value.split(columns.label_separator)]
        else:
            names = [_label_name(value, table, row)]
        return tuple(sorted({n for n in names if n}))
    if value is None or (isinstance(value, str) and not value.strip()):
        raise table.error(row, f"empty label in column {columns.label!r}")
    if isinstance(value, list):
        raise table.error(row, f"label {value!r} is a list; pass --multi-label for several labels per row")
    return _label_name(value, table, row)


class TextExamples(Sequence):
    """The examples of one file column by column -- a list per field, not an object per row: a row costs its
    text and a few pointers (1,000,000 short rows ~150 MB, where a `TextExample` each took ~3x that). Indexing
    gives the `TextExample`; `take(indices)` a subset; `labels` is the label column (None: unlabelled)."""

    def __init__(self, where: str, by_line: bool, split: str, texts: list[str], pairs: list[str] | None,
                 labels: list | None, lines: array, ids: list[str] | None, problem_type: str | None = None):
        self.where, self.by_line, self.split = where, by_line, split
        self.texts, self.pairs, self.labels, self.lines, self.ids = texts, pairs, labels, lines, ids
        self.problem_type = problem_type

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        line = self.lines[i]
        return TextExample(self.ids[i] if self.ids is not None else f"{self.split}-{line}", self.texts[i],
                           self.pairs[i] if self.pairs is not None else None,
                           self.labels[i] if self.labels is not None else None,
                           f"{self.where}:{line}" if self.by_line else f"{self.where}: record {line}")

    def __iter__(self) -> Iterator[TextExample]:
        return (self[i] for i in range(len(self)))

    def take(self, indices: Sequence[int]) -> "TextExamples":
        pick = (lambda column: [column[i] for i in indices] if column is not None else None)
        return TextExamples(self.where, self.by_line, self.split, pick(self.texts), pick(self.pairs),
                            pick(self.labels), array("q", (self.lines[i] for i in indices)), pick(self.ids),
                            self.problem_type)


def label_column(examples: Sequence[TextExample]) -> list:
    """The labels of `examples` (their column when they are `TextExamples`: no object built per row)."""
    return examples.labels if isinstance(examples, TextExamples) and examples.labels is not None else \
        [e.label for e in examples]


def examples_from_table(table: Table, columns: Columns, problem_type: str | Callable[[list], str], split: str,
                        known: Sequence[str] | None = None, labelled: bool | None = None) -> TextExamples:
    """One example per row, in one streaming pass over the file. `known` labels (dev/test): any other label is
    an error naming its line. `labelled` None: labels are read when the file has the label column (test files
    may lack it). `problem_type` may be a function of the label column's values (the training file's, decided
    once they are read)."""
    table.require(columns.text, "text")
    if columns.text_pair is not None:
        table.require(columns.text_pair, "second text")
    if labelled is None:
        labelled = columns.label in table.columns
    elif labelled:
        table.require(columns.label, "label")
    id_column = guess_column(table.columns, ID_COLUMNS, exclude=(columns.text, columns.text_pair, columns.label))
    texts: list[str] = []
    pairs: list[str] | None = [] if columns.text_pair is not None else None
    ids: list[str] | None = [] if id_column is not None else None
    values: list = []
    lines = array("q")
    shared: dict = {}  # a label column repeats a few values: one object per value, not per row
    for row in table.rows:
        texts.append(table.text(row, columns.text))
        if pairs is not None:
            pairs.append(table.text(row, columns.text_pair))
        if ids is not None:
            ids.append(str(row.values[id_column]))
        lines.append(row.line)
        if labelled:
            value = row.values.get(columns.label)
            if isinstance(value, (str, int, float)) and len(shared) <= MAX_CLASSES:
                value = shared.setdefault((type(value), value), value)
            values.append(value)
    if callable(problem_type):
        problem_type = problem_type(values)
    labels = _parse_labels(values, lines, problem_type, columns, table, known) if labelled else None
    by_line = table.by_line
    return TextExamples(str(table.path), by_line, split, texts, pairs, labels, lines, ids, problem_type)


def _parse_labels(values: list, lines: array, problem_type: str, columns: Columns, table: Table,
                  known: Sequence[str] | None) -> list:
    """The label column's values parsed (`parse_label`, once per distinct value), checked against `known`."""
    known_set = set(known) if known is not None else None
    parsed: dict = {}
    labels = []
    for value, line in zip(values, lines):
        key = (type(value), value) if isinstance(value, (str, int, float)) else None
        label = parsed.get(key) if key is not None else None
        if label is None:
            row = Row(line, {columns.label: value})
            label = parse_label(value, problem_type, columns, table, row)
            if known_set is not None and problem_type != REGRESSION:
                for name in (label if isinstance(label, tuple) else (label,)):
                    if name not in known_set:
                        shown = ", ".join(sorted(known_set)[:20]) + (", ..." if len(known_set) > 20 else "")
                        raise table.error(row, f"label {name!r} is not among the training file's labels ({shown})")
            if key is not None and len(parsed) <= MAX_CLASSES:
                parsed[key] = label
        labels.append(label)
    return labels


def field_chars(max_length: int, windows: "Windows | None") -> int:
    """The characters of a text field kept (`CHARS_PER_TOKEN` per token the model can read of it)."""
    if windows is None:
        return CHARS_PER_TOKEN * max_length
    length, stride = windows.resolve(max_length)
    return CHARS_PER_TOKEN * (length + (MAX_WINDOWS - 1) * max(1, length - stride))


def distinct_labels(labels: Sequence) -> Counter:
    return Counter(l for label in labels for l in (label if isinstance(label, tuple) else (label,)))


def stratum(example: TextExample) -> Any:
    """What the held-out split keeps proportional: the class, the label set; numbers are not stratified."""
    return stratum_of(example.label)


def stratum_of(label: Any) -> Any:
    return label if not isinstance(label, float) else None


def cut_fields(table: Table, chars: int) -> int:
    """Fields of `table` cut to `chars` characters as they were read: logged (first place, column), counted."""
    cut = sum(table.cut.values())
    if cut:
        first = table.rows.first_cut
        log.warning("%s: %d text field(s) over %d characters cut to that length before tokenizing (columns %s; "
                    "first at %s); the model reads at most max-seq-length tokens of them", table.path, cut, chars,
                    ", ".join(sorted(table.cut)), f"line {first}" if table.by_line else f"record {first}")
    return cut


# ---------------------------------------------------------------------------------------------- metrics
