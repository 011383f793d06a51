"""`text-classification`: sequence classification on the user's own CSV / TSV / JSON Lines / Parquet files.

    bertlab finetune text-classification --model DIR --train news.csv [--validation dev.csv] [--test new.csv]
        [--text-column text] [--text-pair-column NAME] [--label-column category] [--multi-label] ...

Columns: one or two text columns and a label column, named by flag or guessed from common names (`files.py`;
the choice is logged and kept in metrics.json). Labels are discovered in the training file and sorted; the
saved model's config.json gets them as `id2label`/`label2id`, and `problem_type` as Hugging Face names it:

    single_label_classification   one label per row; softmax + cross-entropy (optionally class-weighted);
                                  accuracy, micro/macro F1, per-class precision/recall/F1
    multi_label_classification    a set of labels per row -- a JSON list, or a string split on
                                  `--label-separator` (","); an empty set is allowed; one sigmoid per label +
                                  binary cross-entropy; micro/macro F1 and exact-match accuracy at a
                                  probability threshold tuned on dev (0.05 ... 0.95, best micro F1), stored in
                                  config.json as `multi_label_threshold`
    regression                    a number per row (chosen when every label is a number and some have a
                                  fraction, or by --problem-type); MSE; Pearson, Spearman, MSE

A label in the dev or test file that the training file lacks is an error naming its line; so is a label
column with a single class. Without a dev file a stratified share is held out (`own_data.py`).

Long inputs (`--long-documents`): `truncate` (default) cuts each input to max-seq-length tokens and reports
how many were cut; `window` cuts each into overlapping windows of `--window-length` tokens sharing
`--window-stride` tokens (Hugging Face's tokenizer `stride`), runs every window, and aggregates the
windows' logits per document -- the mean (max for multi-label: a label present in one part of a document is
present in the document) -- in training (the loss is on the aggregated logits), evaluation and prediction.
A feature is then a document: its `input_ids` is a list of windows, flattened by `collate` with a
`window_owner` index saying which document each window belongs to.

Memory in window mode is bounded by a token budget, not by the documents: a batch's windows go through the
model in parts of at most `--max-tokens` tokens (rows x padded length; default: the batch's documents x the
window length, what a truncated batch of the same size holds). In training each part is a
`torch.utils.checkpoint` region: its activations are dropped after the forward pass and recomputed, one part
at a time, in the backward pass (random state restored, so dropout is the same), so the loss on the
aggregated logits and its gradients are those of one pass over every window -- at the price of a second
forward pass for batches over the budget. Evaluation and prediction run the parts without gradients.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..models.bert.heads import BertForSequenceClassification, HeadOutput
from .base import Batch, DataError, Feature, PredictionWriter, TaskSpec, pad_collate
from .files import ID_COLUMNS, LABEL_COLUMNS, TEXT_COLUMNS, TEXT_PAIR_COLUMNS, Row, Table, guess_column, read_table
from .metrics import LabelCounts, multi_label_sets, pearson, spearman, tune_threshold
from .own_data import InputOptions, SplitFiles, split_rows, summarise_labels

log = logging.getLogger(__name__)

SINGLE, MULTI, REGRESSION = "single_label_classification", "multi_label_classification", "regression"
SEQUENCE_KEYS = ("input_ids", "token_type_ids", "attention_mask")
# Distinct classes a classification may have: more is an id or free-text column taken for the label (100,000
# "labels" made a 10.7 MB log line and an 80 MB metrics.json), and a head the size of a vocabulary.
MAX_CLASSES = 10_000
# Characters kept of a text field (`field_chars`): every token the model reads comes from at least one character
# of the text, and real text has 3-6 per token, so 64 per token cuts only what the model would not read --
# while a 50 MB field costs 8 KB (truncate, 128 tokens), not a tokenization of 50 MB.
CHARS_PER_TOKEN = 64
MAX_WINDOWS = 512  # --long-documents window: windows read of one document (~50,000 words at 128 tokens)
FEATURE_CHUNK = 8192  # examples tokenized at a time into the packed arrays
WINDOW_CHUNK = 64  # --long-documents window: documents tokenized at a time


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


@dataclass(frozen=True)
class Windows:
    """`--long-documents window`: `length` tokens per window (None: max-seq-length), `stride` shared."""

    length: int | None = None
    stride: int | None = None

    def resolve(self, max_length: int) -> tuple[int, int]:
        length = self.length or max_length
        return length, self.stride if self.stride is not None else length // 4


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


def _distinct_labels(labels: Sequence) -> Counter:
    return Counter(l for label in labels for l in (label if isinstance(label, tuple) else (label,)))


def _stratum(example: TextExample) -> Any:
    """What the held-out split keeps proportional: the class, the label set; numbers are not stratified."""
    return _stratum_of(example.label)


def _stratum_of(label: Any) -> Any:
    return label if not isinstance(label, float) else None


def _cut_fields(table: Table, chars: int) -> int:
    """Fields of `table` cut to `chars` characters as they were read: logged (first place, column), counted."""
    cut = sum(table.cut.values())
    if cut:
        first = table.rows.first_cut
        log.warning("%s: %d text field(s) over %d characters cut to that length before tokenizing (columns %s; "
                    "first at %s); the model reads at most max-seq-length tokens of them", table.path, cut, chars,
                    ", ".join(sorted(table.cut)), f"line {first}" if table.by_line else f"record {first}")
    return cut


# ---------------------------------------------------------------------------------------------- metrics
class SingleLabelMetric:
    """Accuracy, micro/macro F1 (scikit-learn's, over the labels seen in gold or predictions) and
    per-class precision/recall/F1/support."""

    def __init__(self, labels: Sequence[str]):
        self.labels, self.counts = list(labels), LabelCounts()

    def update(self, example: TextExample, prediction: str) -> None:
        self.counts.add(frozenset([example.label]), frozenset([prediction]))

    def compute(self) -> dict[str, float]:
        seen = [l for l in self.labels if self.counts.support[l] or self.counts.tp[l] or self.counts.fp[l]]
        return {"accuracy": self.counts.exact / self.counts.examples if self.counts.examples else 0.0,
                "micro_f1": self.counts.micro_f1(), "macro_f1": self.counts.macro_f1(seen),
                **self.counts.report(self.labels)}


class MultiLabelMetric:
    """Micro/macro F1 (over every training label, as scikit-learn's on indicator matrices), exact-match
    accuracy, per-label scores, at `threshold` -- or at the threshold tuned on these examples."""

    def __init__(self, labels: Sequence[str], threshold: float, tune: bool):
        self.labels, self.threshold, self.tune = list(labels), threshold, tune
        self.gold: list[frozenset[str]] = []
        self.probabilities: list[list[float]] = []  # K floats per example: small beside the logits

    def update(self, example: TextExample, prediction: dict) -> None:
        self.gold.append(frozenset(example.label))
        self.probabilities.append([prediction["scores"][l] for l in self.labels])

    def compute(self) -> dict[str, float]:
        threshold = tune_threshold(self.gold, self.probabilities, self.labels) if self.tune else self.threshold
        counts = LabelCounts()
        for gold, predicted in zip(self.gold, multi_label_sets(self.probabilities, self.labels, threshold)):
            counts.add(gold, predicted)
        return {"micro_f1": counts.micro_f1(), "macro_f1": counts.macro_f1(self.labels),
                "exact_match": counts.exact / counts.examples if counts.examples else 0.0,
                "threshold": threshold, **counts.report(self.labels)}


class RegressionMetric:
    def __init__(self) -> None:
        self.predicted: list[float] = []
        self.gold: list[float] = []

    def update(self, example: TextExample, prediction: float) -> None:
        self.predicted.append(float(prediction))
        self.gold.append(float(example.label))

    def compute(self) -> dict[str, float]:
        mse = math.fsum((p - g) ** 2 for p, g in zip(self.predicted, self.gold)) / max(1, len(self.gold))
        return {"pearson": pearson(self.predicted, self.gold), "spearman": spearman(self.predicted, self.gold),
                "mse": mse}


class TextPredictionWriter(PredictionWriter):
    """`{split}_predictions.jsonl`: {"id", "prediction", "label" (gold, when known)}, plus "scores" (each
    label's probability) for multi-label. Multi-label predictions of a labelled split are held until the
    end and written at the threshold tuned on that split (the one the metric reports), when the task tunes."""

    def __init__(self, out_dir: str | Path, split: str, spec: "TextClassificationTask"):
        super().__init__(out_dir, split)
        self.spec = spec
        self._held: list[tuple[TextExample, Any]] = []

    def format_line(self, example: TextExample, prediction: Any) -> str:
        record: dict[str, Any] = {"id": example.guid}
        if isinstance(prediction, dict):
            record.update(prediction=prediction["labels"], scores=prediction["scores"])
        else:
            record["prediction"] = prediction
        if example.label is not None:
            record["label"] = list(example.label) if isinstance(example.label, tuple) else example.label
        return json.dumps(record, ensure_ascii=False)

    def write(self, example: TextExample, prediction: Any) -> None:
        if self.spec.problem_type == MULTI and self.spec.tune_threshold:
            self._held.append((example, prediction))
        else:
            super().write(example, prediction)

    def __exit__(self, *exc) -> None:
        if self._held:
            labels = self.spec.labels
            probabilities = [[p["scores"][l] for l in labels] for _, p in self._held]
            threshold = self.spec.threshold
            if all(e.label is not None for e, _ in self._held):
                threshold = tune_threshold([frozenset(e.label) for e, _ in self._held], probabilities, labels)
            for (example, prediction), chosen in zip(self._held, multi_label_sets(probabilities, labels, threshold)):
                super().write(example, {**prediction, "labels": sorted(chosen)})
        super().__exit__(*exc)


# ---------------------------------------------------------------------------------------------- the task
@dataclass(frozen=True)
class TextClassificationTask(TaskSpec):
    """Sequence classification on the user's files. The registered spec is a template (no labels yet):
    `for_run` configures it from the fine-tuning options and the training file, `with_model_config` from a
    saved model's config.json (for `bertlab evaluate` and test predictions)."""

    problem_type: str = SINGLE
    columns: Columns | None = None  # None: guessed from each file read
    threshold: float = 0.5  # multi-label: a label is predicted when its probability is over this
    tune_threshold: bool = True  # multi-label: tune the threshold on the labelled split scored (training runs)
    class_weights: tuple[float, ...] | None = None  # per class (single-label) / positive weight per label (multi)
    windows: Windows | None = None  # None: truncate long inputs
    max_tokens: int | None = None  # windows: tokens per forward pass (None: documents in the batch x window length)
    splits: dict[str, tuple[TextExample, ...] | None] | None = field(default=None, compare=False, repr=False)
    report: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def is_regression(self) -> bool:
        return self.problem_type == REGRESSION

    # -------------------------------------------------------------------------------------- configuring
    def for_run(self, cfg) -> "TextClassificationTask":
        """Read the run's files (cfg.data = training file, cfg.inputs = `InputOptions`): columns, problem
        type, labels, the dev split (a file or held out), class weights, windows."""
        options: InputOptions = cfg.inputs
        files = SplitFiles.from_options(cfg.data, options)
        max_length = cfg.max_seq_length or self.default_max_length
        windows = None
        if options.long_documents == "window":  # resolved now: config.json keeps the numbers trained with
            windows = Windows(*Windows(options.window_length, options.window_stride).resolve(max_length))
        cap = field_chars(max_length, windows)  # a field's characters read: the rest is never tokenized

        def table(path: Path) -> Table:
            return read_table(path, options.format, options.delimiter, max_chars=cap)

        train_table = table(files.train)
        columns = resolve_columns(train_table, options)
        train_table.require(columns.label, "label")
        train = examples_from_table(train_table, columns, lambda values: decide_problem_type(
            values, options, train_table, columns.label), "train", labelled=True)
        problem_type = train.problem_type
        labels = None
        if problem_type != REGRESSION:
            counts = _distinct_labels(train.labels)
            labels = tuple(sorted(counts))
            if len(labels) > MAX_CLASSES:
                raise DataError(f"{files.train}: column {columns.label!r} holds {len(labels):,} distinct labels, over "
                                f"the limit of {MAX_CLASSES:,} for classification -- an id or free-text column? Name "
                                "the label column with --label-column (--problem-type regression for numbers)")
            if len(labels) < 2 and problem_type == SINGLE:
                raise DataError(f"{files.train}: column {columns.label!r} holds one class only "
                                f"({labels[0] if labels else 'none'!r} in {len(train)} rows); classification needs "
                                "at least two (--problem-type regression for numbers)")
            if not labels:
                raise DataError(f"{files.train}: column {columns.label!r} holds no labels at all")
        report: dict[str, Any] = {"train_file": str(files.train), "columns": dataclasses.asdict(columns),
                                  "problem_type": problem_type, "labels": summarise_labels(labels)}
        cut = {"train": _cut_fields(train_table, cap)}
        if files.dev is not None:
            dev_table = table(files.dev)
            dev = examples_from_table(dev_table, columns, problem_type, "dev", known=labels, labelled=True)
            cut["dev"] = _cut_fields(dev_table, cap)
            report["dev_file"] = str(files.dev)
        else:
            train, dev, report["held_out"] = split_rows(train, _stratum, options.validation_share, cfg.seed,
                                                        str(files.train), keys=[_stratum_of(l) for l in train.labels])
        test = None
        if files.test is not None:
            test_table = table(files.test)
            test = examples_from_table(test_table, columns, problem_type, "test", known=labels)
            cut["test"] = _cut_fields(test_table, cap)
            report["test_file"] = str(files.test)
        if any(cut.values()):
            report["fields_cut"] = {"chars": cap, **{split: n for split, n in cut.items() if n}}
        weights = class_weights(train, labels, problem_type) if options.class_weights else None
        if weights is not None:
            report["class_weights"] = summarise_labels(dict(zip(labels, weights)))
        report.update(examples={"train": len(train), "dev": len(dev), **({"test": len(test)} if test else {})},
                      long_documents=options.long_documents)
        if labels is not None:
            report["train_label_counts"] = summarise_labels(dict(sorted(_distinct_labels(label_column(train)).items())))
        log.info("text-classification: %s, %d labels, %d train / %d dev examples", problem_type,
                 len(labels or ()), len(train), len(dev))
        main = {SINGLE: "accuracy", MULTI: "micro_f1", REGRESSION: "pearson"}[problem_type]
        return dataclasses.replace(self, labels=labels, main_metric=main, problem_type=problem_type, columns=columns,
                                   class_weights=weights, windows=windows, max_tokens=options.max_tokens, report=report,
                                   splits={"train": train, "dev": dev, "test": test})

    def with_model_config(self, config) -> "TextClassificationTask":
        """The task as a saved model was trained on it: labels, problem type, columns, windows, threshold."""
        extra = config.extra
        problem_type = extra.get("problem_type") or (REGRESSION if config.num_labels == 1 else SINGLE)
        labels = None if problem_type == REGRESSION else \
            tuple(config.id2label[i] for i in sorted(config.id2label or {}))
        columns = Columns(**extra["input_columns"]) if isinstance(extra.get("input_columns"), dict) else None
        long = extra.get("long_documents") or {}
        windows = Windows(long.get("length"), long.get("stride")) if long.get("mode") == "window" else None
        main = {SINGLE: "accuracy", MULTI: "micro_f1", REGRESSION: "pearson"}[problem_type]
        return dataclasses.replace(self, labels=labels, main_metric=main, problem_type=problem_type, columns=columns,
                                   windows=windows, threshold=float(extra.get("multi_label_threshold", 0.5)),
                                   tune_threshold=False, splits=None)

    def saved_config(self) -> dict[str, Any]:
        """What config.json keeps of the task, so evaluate / predict / serve use the model as trained."""
        saved: dict[str, Any] = {"problem_type": self.problem_type}
        if self.columns is not None:
            saved["input_columns"] = dataclasses.asdict(self.columns)
        if self.windows is not None:
            saved["long_documents"] = {"mode": "window", "length": self.windows.length, "stride": self.windows.stride}
        if self.problem_type == MULTI:
            saved["multi_label_threshold"] = self.threshold
        return saved

    def export_config(self, scores: dict[str, dict[str, float]]) -> dict[str, Any]:
        """config.json keys decided by the run's dev scores: the tuned multi-label threshold."""
        dev = scores.get(self.eval_splits[0], {})
        return {"multi_label_threshold": dev["threshold"]} if self.problem_type == MULTI and "threshold" in dev else {}

    def describe(self) -> dict[str, Any]:
        return dict(self.report)

    # -------------------------------------------------------------------------------------- data
    def read(self, data_path, split: str) -> list[TextExample]:
        if self.splits is not None:  # configured for a run: the rows read (and split) by `for_run`
            if self.splits.get(split) is None:
                raise DataError(f"{self.name}: no {split} file given")
            return self.splits[split]  # `TextExamples`: a column store, shared, never changed
        table = read_table(data_path)  # evaluate: the given file is the split
        columns = self.columns or resolve_columns(table, InputOptions())
        return examples_from_table(table, columns, self.problem_type, split, known=self.labels)

    def has_split(self, data_path, split: str) -> bool:
        return self.splits.get(split) is not None if self.splits is not None else True

    def featurize(self, examples: Sequence[TextExample], tokenizer, max_length: int, train: bool) -> Sequence[Feature]:
        if isinstance(examples, TextExamples):
            texts, pairs = examples.texts, examples.pairs
        else:
            texts = [e.text_a for e in examples]
            pairs = [e.text_b for e in examples] if examples and examples[0].text_b is not None else None
        if self.windows is None:
            features = PackedFeatures.build(tokenizer, texts, pairs, max_length, self._targets(examples))
            if features.truncated.any():
                log.warning("%s: %d of %d inputs are over %d tokens and were truncated (--long-documents window "
                            "reads them whole)", self.name, int(features.truncated.sum()), len(examples), max_length)
            return features
        length, stride = self.windows.resolve(max_length)
        features = [{**{k: [] for k in SEQUENCE_KEYS}, "example_index": i} for i in range(len(examples))]
        windows = 0
        for start in range(0, len(texts), WINDOW_CHUNK):  # a few documents at a time: the tokenizer's lists
            rows, owners = window_rows(tokenizer, texts[start:start + WINDOW_CHUNK],
                                       pairs[start:start + WINDOW_CHUNK] if pairs is not None else None, length, stride)
            for row, owner in zip(rows, owners):
                for k in SEQUENCE_KEYS:
                    features[start + owner][k].append(row[k])
            windows += len(rows)
        cut = sum(len(f["input_ids"]) > 1 for f in features)
        if cut:
            log.info("%s: %d of %d inputs over %d tokens, cut into %d windows in all", self.name, cut,
                     len(examples), length, windows)
        targets = self._targets(examples)
        if targets is not None:
            for f, target in zip(features, targets.tolist()):
                f["labels"] = target
        return features

    def _targets(self, examples: Sequence[TextExample]) -> np.ndarray | None:
        """The examples' targets as one array (class ids, multi-hot rows, numbers); None when unlabelled."""
        labels = label_column(examples)
        if not labels or labels[0] is None:
            return None
        if self.problem_type == SINGLE:
            index = {l: i for i, l in enumerate(self.labels)}
            return np.fromiter((index[l] for l in labels), dtype=np.int64, count=len(labels))
        return np.array([self._target(l) for l in labels], dtype=np.float32 if self.problem_type == MULTI else np.float64)

    def _target(self, label) -> Any:
        if self.problem_type == REGRESSION:
            return float(label)
        if self.problem_type == MULTI:
            present = set(label)
            return [1.0 if l in present else 0.0 for l in self.labels]
        return self.labels.index(label)

    def collate(self, features: Sequence[Feature], indices: Sequence[int] | None = None) -> Batch:
        """Dynamic padding; with windows, every window of every document is one row, `window_owner` says
        whose. Labels: class ids (long), multi-hot rows or numbers (float)."""
        if self.windows is not None:
            rows = [{k: f[k][w] for k in SEQUENCE_KEYS} for f in features for w in range(len(f["input_ids"]))]
        else:
            rows = [{k: f[k] for k in SEQUENCE_KEYS} for f in features]
        batch = pad_collate(rows)
        batch["feature_index"] = torch.tensor(list(indices) if indices is not None else range(len(features)))
        if self.windows is not None:
            batch["window_owner"] = torch.tensor([b for b, f in enumerate(features) for _ in f["input_ids"]])
        if "labels" in features[0]:
            dtype = torch.long if self.problem_type == SINGLE else torch.float32
            batch["labels"] = torch.tensor([f["labels"] for f in features], dtype=dtype)
        return batch

    # -------------------------------------------------------------------------------------- model
    def document_logits(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        """(rows, K) logits -> (documents, K): windows aggregated by mean (max for multi-label)."""
        if "window_owner" not in batch:
            return logits
        return aggregate_windows(logits, batch["window_owner"], batch["feature_index"].numel(),
                                 "max" if self.problem_type == MULTI else "mean")

    def window_parts(self, batch: Batch) -> list[slice]:
        """The batch's rows cut into parts of at most `max_tokens` tokens (rows x padded length; at least one
        row a part); one part when the batch is not windowed or fits."""
        rows, width = batch["input_ids"].shape
        if "window_owner" not in batch or self.windows is None:
            return [slice(0, rows)]
        budget = self.max_tokens or batch["feature_index"].numel() * (self.windows.length or width)
        per_part = max(1, budget // max(1, width))
        return [slice(start, min(rows, start + per_part)) for start in range(0, rows, per_part)]

    def row_logits(self, model, batch: Batch) -> torch.Tensor:
        """(rows, K) float logits of every row of the batch, the windows run in parts (see the module
        docstring): with gradients, each part is a checkpointed region, recomputed in the backward pass."""
        inputs = self.model_inputs(batch)
        parts = self.window_parts(batch)
        if len(parts) == 1:
            return model(**inputs).logits.float()
        names = list(inputs)

        def run(anchor: torch.Tensor, *tensors: torch.Tensor) -> torch.Tensor:
            return model(**dict(zip(names, tensors))).logits.float() * anchor

        regions = torch.is_grad_enabled() and any(p.requires_grad for p in model.parameters())
        # The reentrant form runs a part's forward pass without autograd, so nothing of it is kept (the
        # non-reentrant one keeps what fused kernels store on their autograd context); `anchor` (1.0, exact)
        # is the input requiring a gradient that makes it call backward through the part at all.
        anchor = torch.ones((), device=inputs["input_ids"].device, requires_grad=True)
        outputs = []
        for part in parts:
            tensors = [inputs[k][part] for k in names]
            outputs.append(checkpoint(run, anchor, *tensors, use_reentrant=True) if regions else
                           run(anchor.detach(), *tensors))
        return torch.cat(outputs)

    def forward(self, model, batch: Batch) -> Any:
        return HeadOutput(logits=self.row_logits(model, batch))

    def loss(self, model, batch: Batch) -> torch.Tensor:
        logits = self.document_logits(self.row_logits(model, batch), batch)
        labels = batch["labels"]
        weights = torch.tensor(self.class_weights, device=logits.device) if self.class_weights else None
        if self.problem_type == REGRESSION:
            return F.mse_loss(logits.view(-1), labels.view(-1))
        if self.problem_type == MULTI:
            return F.binary_cross_entropy_with_logits(logits, labels, pos_weight=weights)
        return F.cross_entropy(logits, labels.view(-1), weight=weights)

    def decode(self, outputs, batch: Batch, features) -> list[Any]:
        logits = self.document_logits(outputs.logits.float(), batch)
        if self.problem_type == REGRESSION:
            return logits.view(-1).tolist()
        if self.problem_type == MULTI:
            probabilities = torch.sigmoid(logits).tolist()
            return [{"labels": sorted(chosen), "scores": {l: round(p, 6) for l, p in zip(self.labels, probs)}}
                    for probs, chosen in zip(probabilities,
                                             multi_label_sets(probabilities, self.labels, self.threshold))]
        return [self.labels[i] for i in logits.argmax(-1).tolist()]

    def metric(self):
        if self.problem_type == REGRESSION:
            return RegressionMetric()
        if self.problem_type == MULTI:
            return MultiLabelMetric(self.labels, self.threshold, self.tune_threshold)
        return SingleLabelMetric(self.labels)

    def prediction_writer(self, out_dir, split: str) -> PredictionWriter:
        return TextPredictionWriter(out_dir, split, self)


# ---------------------------------------------------------------------------------------------- helpers
def class_weights(examples: Sequence[TextExample], labels: Sequence[str], problem_type: str) -> tuple[float, ...]:
    """Single-label: n / (K · n_c) per class (scikit-learn's "balanced"); multi-label: the positive weight
    (n − n_c) / n_c per label (PyTorch's `pos_weight`), so each label's positives weigh as its negatives."""
    n = len(examples)
    counts = _distinct_labels(label_column(examples))
    if problem_type == MULTI:
        return tuple((n - counts[l]) / counts[l] if counts[l] else 1.0 for l in labels)
    return tuple(n / (len(labels) * counts[l]) if counts[l] else 1.0 for l in labels)


class PackedFeatures(Sequence):
    """Features of one-row examples (truncate mode) in flat arrays, not a dict of lists per example: the token
    ids back to back (int32) with offsets, token types (int8; None: all 0), targets, truncated flags. A
    million short rows take ~80 MB, where Python lists took ~3 KB a row; `features[i]` is the usual feature
    dict, built when the batch is."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray, types: np.ndarray | None, targets: np.ndarray | None,
                 truncated: np.ndarray):
        self.ids, self.offsets, self.types, self.targets, self.truncated = ids, offsets, types, targets, truncated

    @classmethod
    def build(cls, tokenizer, texts: Sequence[str], pairs: Sequence[str] | None, max_length: int,
              targets: np.ndarray | None) -> "PackedFeatures":
        """Tokenized `FEATURE_CHUNK` texts at a time (`truncated_rows`' ids exactly), packed as they come."""
        ids, types, lengths, truncated = [], [], [], []  # numpy arrays, one per chunk
        special = _special_ids(tokenizer) if pairs is None else None
        for start in range(0, len(texts), FEATURE_CHUNK):
            chunk = texts[start:start + FEATURE_CHUNK]
            if special is not None:  # single texts: the flat corpus encoder, [CLS] a[:max - 2] [SEP]
                parts = _single_rows(tokenizer.encode_corpus(chunk, num_workers=1, flat=True), max_length, special)
                ids.append(parts[0]), lengths.append(parts[1]), truncated.append(parts[2])
                continue
            rows, cut = truncated_rows(tokenizer, chunk, pairs[start:start + FEATURE_CHUNK] if pairs else None,
                                       max_length)
            ids.append(np.array([t for r in rows for t in r["input_ids"]], dtype=np.int32))
            types.append(np.array([t for r in rows for t in r["token_type_ids"]], dtype=np.int8))
            lengths.append(np.array([len(r["input_ids"]) for r in rows], dtype=np.int64))
            truncated.append(np.array([i in cut for i in range(len(rows))], dtype=bool))
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        if texts:
            np.cumsum(np.concatenate(lengths), out=offsets[1:])
        packed_types = np.concatenate(types) if types else None
        if packed_types is not None and not packed_types.any():
            packed_types = None
        return cls(np.concatenate(ids) if ids else np.zeros(0, np.int32), offsets, packed_types, targets,
                   np.concatenate(truncated) if truncated else np.zeros(0, bool))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> Feature:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        n = b - a
        feature = {"input_ids": self.ids[a:b].tolist(),
                   "token_type_ids": self.types[a:b].tolist() if self.types is not None else [0] * n,
                   "attention_mask": [1] * n, "example_index": i, "truncated": bool(self.truncated[i])}
        if self.targets is not None:
            feature["labels"] = self.targets[i].tolist()
        return feature

    def __iter__(self) -> Iterator[Feature]:
        return (self[i] for i in range(len(self)))

    def lengths(self) -> list[int]:
        return np.diff(self.offsets).tolist()


def _single_rows(encoded: tuple[np.ndarray, np.ndarray], max_length: int,
                 special: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, lengths, truncated) of `[CLS] text[:max_length - 2] [SEP]` rows, from the flat ids and offsets of
    the texts (`encode_corpus(flat=True)`), without a Python object per token."""
    flat, offsets = encoded
    lengths = np.diff(offsets)
    keep = np.minimum(lengths, max_length - 2)
    owner = np.repeat(np.arange(len(lengths)), lengths)
    inner = flat[(np.arange(len(flat)) - offsets[:-1][owner]) < keep[owner]]
    out_lengths = keep + 2
    ends = np.cumsum(out_lengths)
    starts = ends - out_lengths
    out = np.empty(int(out_lengths.sum()), dtype=np.int32)
    body = np.ones(len(out), dtype=bool)
    body[starts] = body[ends - 1] = False
    out[starts], out[ends - 1] = special
    out[body] = inner
    return out, out_lengths.astype(np.int64), lengths > max_length - 2


def _special_ids(tokenizer) -> tuple[int, int] | None:
    """([CLS], [SEP]) ids when `tokenizer` encodes one text as [CLS] ids [SEP] and has the flat corpus encoder
    (BERT's WordPiece tokenizer); else None (the general path)."""
    if not hasattr(tokenizer, "encode_corpus"):
        return None
    empty = list(tokenizer("", None, truncation=False, padding=False)["input_ids"])
    probe = list(tokenizer("a b", None, truncation=False, padding=False)["input_ids"])
    inner = tokenizer.encode_corpus(["a b"], num_workers=1)[0]
    return (empty[0], empty[1]) if len(empty) == 2 and probe == [empty[0], *inner, empty[1]] else None


def truncated_rows(tokenizer, texts: Sequence[str], pairs: Sequence[str] | None,
                   max_length: int) -> tuple[list[Feature], set[int]]:
    """Rows of at most `max_length` tokens (the longer text cut first, Google's rule) and which were cut."""
    full = tokenizer(list(texts), pairs, truncation=False, padding=False)
    rows = [{k: list(full[k][i]) for k in SEQUENCE_KEYS} for i in range(len(texts))]
    long = [i for i, r in enumerate(rows) if len(r["input_ids"]) > max_length]
    if long:
        cut = tokenizer([texts[i] for i in long], [pairs[i] for i in long] if pairs is not None else None,
                        truncation=True, max_length=max_length, padding=False)
        for k, i in enumerate(long):
            rows[i] = {key: list(cut[key][k]) for key in SEQUENCE_KEYS}
    return rows, set(long)


def window_rows(tokenizer, texts: Sequence[str], pairs: Sequence[str] | None, length: int,
                stride: int) -> tuple[list[Feature], list[int]]:
    """Overlapping windows of `length` tokens over the first text (a second text goes whole into every
    window), consecutive windows sharing `stride` tokens; (rows, the example each row came from)."""
    enc = tokenizer(list(texts), pairs, truncation="only_first" if pairs is not None else True, max_length=length,
                    stride=stride, return_overflowing_tokens=True, padding=False)
    rows = [{k: list(enc[k][i]) for k in SEQUENCE_KEYS} for i in range(len(enc["input_ids"]))]
    return rows, list(enc["overflow_to_sample_mapping"])


def aggregate_windows(logits: torch.Tensor, owner: torch.Tensor, documents: int, how: str) -> torch.Tensor:
    """(W, K) window logits -> (documents, K): the mean or the max over each document's windows."""
    index = owner.view(-1, 1).expand_as(logits)
    start = torch.zeros(documents, logits.size(-1), dtype=logits.dtype, device=logits.device)
    return start.scatter_reduce(0, index, logits, reduce="amax" if how == "max" else "mean", include_self=False)


TEXT_CLASSIFICATION = TextClassificationTask(name="text-classification", head=BertForSequenceClassification,
                                             labels=None, main_metric="accuracy", eval_splits=("dev",),
                                             test_splits=("test",), default_max_length=128)
