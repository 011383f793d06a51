"""GLUE (Wang et al., 2018): nine sentence and sentence-pair tasks in their released TSV layout.

Input format (DATA_PATH is the task's folder of the GLUE release, e.g. `glue_data/MRPC/`):
  * one example per line, fields separated by TAB ONLY -- no CSV quoting: several files contain unmatched
    quotes that a CSV reader would run across lines;
  * a header row names the columns, except CoLA's train/dev files, which have none (columns: source,
    label, original label, sentence) -- their test file does have one;
  * MRPC's files start with a UTF-8 byte-order mark (read as `utf-8-sig`, which is harmless elsewhere);
  * blank lines are skipped; a row without a needed column, or with a label outside the task's label set,
    is an error naming the file and line -- except in QQP, where (as in Google's and Hugging Face's
    readers) a short row is skipped with a counted warning.
Test files carry no labels; predictions for them are written in the GLUE submission format
(`{Task}.tsv`: a header `index<TAB>prediction`, then one row per test example).

Model: `BertForSequenceClassification` on the pooled [CLS] (cross-entropy; STS-B regression with MSE).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..models.registry import default_head
from .base import Feature, FolderTask, PredictionWriter, data_error, iter_lines
from .metrics import ConfusionMatrix, pearson, spearman

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SentenceExample:
    guid: str  # the test file's index (written in the submission) or "split-line"
    text_a: str
    text_b: str | None
    label: str | float | None  # a label name, an STS-B score, or None on test splits
    source: str  # "path:line"


@dataclass(frozen=True)
class Columns:
    """Where a split's fields are: header names, or 0-based positions for header-less files (CoLA)."""

    text_a: str | int
    text_b: str | int | None = None
    label: str | int | None = None  # None: an unlabeled (test) file
    guid: str | int | None = None  # optional: rows of files without it are named "split-line"
    header: bool = True


# ------------------------------------------------------------------------------------------ metrics
class ClassificationMetric:
    """Accuracy, plus F1 of `positive` (MRPC, QQP) and/or Matthews' correlation (CoLA)."""

    def __init__(self, positive: str | None = None, mcc: bool = False):
        self.matrix = ConfusionMatrix()
        self.positive, self.with_mcc = positive, mcc

    def update(self, example: SentenceExample, prediction: str) -> None:
        self.matrix.add(example.label, prediction)

    def compute(self) -> dict[str, float]:
        scores = {"accuracy": self.matrix.accuracy()}
        if self.positive is not None:
            scores["f1"] = self.matrix.f1(self.positive)
            scores["accuracy_and_f1"] = (scores["accuracy"] + scores["f1"]) / 2
        if self.with_mcc:
            scores["mcc"] = self.matrix.mcc()
        return scores


class CorrelationMetric:
    """STS-B: Pearson's r and Spearman's rho between predicted and gold similarity scores."""

    def __init__(self) -> None:
        self.predicted: list[float] = []  # one float per example: small even for a large set
        self.gold: list[float] = []

    def update(self, example: SentenceExample, prediction: float) -> None:
        self.predicted.append(float(prediction))
        self.gold.append(float(example.label))

    def compute(self) -> dict[str, float]:
        p, s = pearson(self.predicted, self.gold), spearman(self.predicted, self.gold)
        return {"pearson": p, "spearman": s, "corr": (p + s) / 2}


# ------------------------------------------------------------------------------------------ prediction files
class GlueSubmissionWriter(PredictionWriter):
    """`{Task}.tsv` as the GLUE server takes it: `index<TAB>prediction`, label names or scores (3 decimals)
    for test splits; dev splits get the same TSV under `{split}_predictions.tsv` plus the gold label."""

    def __init__(self, out_dir: str | Path, split: str, submission_name: str):
        self.submission_name, self.split = submission_name, split
        super().__init__(out_dir, split)

    def filename(self, split: str) -> str:
        return f"{self.submission_name}.tsv" if split.startswith("test") else f"{split}_predictions.tsv"

    def header(self) -> str:
        return "index\tprediction" if self.split.startswith("test") else "index\tprediction\tlabel"

    def format_line(self, example: SentenceExample, prediction: Any) -> str:
        value = f"{prediction:.3f}" if isinstance(prediction, float) else str(prediction)
        if self.split.startswith("test"):
            return f"{example.guid}\t{value}"
        return f"{example.guid}\t{value}\t{example.label}"


# ------------------------------------------------------------------------------------------ the task
@dataclass(frozen=True)
class GlueTask(FolderTask):
    """A GLUE task: which file holds each split, which columns to read, the metric, the submission name."""

    columns: dict[str, Columns] = None  # split -> where its fields are
    positive: str | None = None  # the class F1 is computed for (MRPC, QQP)
    mcc: bool = False
    regression: bool = False
    submission: dict[str, str] = None  # test split -> submission file stem (MNLI-m, MNLI-mm)
    skip_short_rows: bool = False

    @property
    def is_regression(self) -> bool:
        return self.regression

    # -------------------------------------------------------------------------------------- reading
    def read(self, data_path: str | Path, split: str) -> list[SentenceExample]:
        path = self.split_path(data_path, split)
        cols = self.columns[split]
        lines = iter_lines(path)
        positions = self._positions(cols, lines, path)
        needed = max(positions.values())
        known = set(self.labels or ())
        examples, skipped = [], 0
        for lineno, line in lines:
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            fields = line.split("\t")  # tab only: quotes are text here
            if len(fields) <= needed:
                if self.skip_short_rows:
                    skipped += 1
                    continue
                raise data_error(path, lineno, f"expected at least {needed + 1} tab-separated columns, got "
                                               f"{len(fields)}")
            get = lambda key: fields[positions[key]] if key in positions else None  # noqa: E731
            label: str | float | None = get("label")
            if label is not None:
                if self.regression:
                    try:
                        label = float(label)
                    except ValueError:
                        raise data_error(path, lineno, f"score {label!r} is not a number") from None
                elif label not in known:
                    raise data_error(path, lineno, f"unknown label {label!r}; expected one of "
                                                   f"{', '.join(self.labels)}")
            guid = get("guid") if "guid" in positions else f"{split}-{lineno}"
            examples.append(SentenceExample(guid, get("text_a"), get("text_b"), label, f"{path}:{lineno}"))
        if skipped:
            log.warning("%s: skipped %d rows with missing columns", path, skipped)
        if not examples:  # a header-only file would otherwise fail deep in training (no first feature)
            raise data_error(path, None, "no examples in this file (only a header?)")
        return examples

    def _positions(self, cols: Columns, lines, path: Path) -> dict[str, int]:
        """Column position of each field, from the header (consumed from `lines`) or fixed (CoLA)."""
        wanted = {k: getattr(cols, k) for k in ("text_a", "text_b", "label", "guid") if getattr(cols, k) is not None}
        if not cols.header:
            return wanted
        _, first = next(lines, (1, ""))
        header = first.rstrip("\r\n").split("\t")
        positions = {}
        for field, column in wanted.items():
            if field == "guid" and column not in header:  # an id is nice to have, not needed: use the line
                continue
            if column not in header:
                raise data_error(path, 1, f"header has no column {column!r} (columns: {', '.join(header)})")
            positions[field] = header.index(column)
        return positions

    # -------------------------------------------------------------------------------------- features
    def featurize(self, examples: Sequence[SentenceExample], tokenizer, max_length: int,
                  train: bool) -> list[Feature]:
        """[CLS] a [SEP] (b [SEP]), the longer side truncated first to fit `max_length` (Google's rule)."""
        pairs = [e.text_b for e in examples] if self.files_have_pairs else None
        encoded = tokenizer([e.text_a for e in examples], pairs, truncation=True, max_length=max_length,
                            padding=False)
        label2id = {name: i for i, name in enumerate(self.labels or ())}
        features = []
        for i, example in enumerate(examples):
            f: Feature = {"input_ids": list(encoded["input_ids"][i]),
                          "token_type_ids": list(encoded["token_type_ids"][i]),
                          "attention_mask": list(encoded["attention_mask"][i]),
                          "example_index": i}
            if example.label is not None:
                f["labels"] = float(example.label) if self.regression else label2id[example.label]
            features.append(f)
        return features

    @property
    def files_have_pairs(self) -> bool:
        return any(cols.text_b is not None for cols in self.columns.values())

    # -------------------------------------------------------------------------------------- predictions
    def decode(self, outputs, batch, features) -> list[Any]:
        logits = outputs.logits.float()
        if self.regression:
            return logits.view(-1).tolist()
        return [self.labels[i] for i in logits.argmax(-1).tolist()]

    def metric(self):
        return CorrelationMetric() if self.regression else ClassificationMetric(self.positive, self.mcc)

    def prediction_writer(self, out_dir: str | Path, split: str) -> PredictionWriter:
        return GlueSubmissionWriter(out_dir, split, self.submission.get(split, f"{self.name}-{split}"))


# ------------------------------------------------------------------------------------------ the nine tasks
def _glue(name: str, labels, main: str, train: Columns, dev: Columns, test: Columns, submission: str,
          dev_files=("dev.tsv",), test_files=("test.tsv",), **kw) -> GlueTask:
    eval_splits = ("dev",) if len(dev_files) == 1 else ("dev_matched", "dev_mismatched")
    test_splits = ("test",) if len(test_files) == 1 else ("test_matched", "test_mismatched")
    files = {"train": "train.tsv", **dict(zip(eval_splits, dev_files)), **dict(zip(test_splits, test_files))}
    columns = {"train": train, **{s: dev for s in eval_splits}, **{s: test for s in test_splits}}
    subs = {test_splits[0]: submission} if len(test_files) == 1 else \
        {"test_matched": f"{submission}-m", "test_mismatched": f"{submission}-mm"}
    return GlueTask(name=name, head=default_head("text-classification"), labels=labels, main_metric=main,
                    eval_splits=eval_splits, test_splits=test_splits, files=files, columns=columns,
                    submission=subs, **kw)


BINARY = ("0", "1")
ENTAILMENT = ("entailment", "not_entailment")


def _pair(a: str, b: str, label: str, guid: str = "index") -> tuple[Columns, Columns]:
    """(train/dev columns, test columns) of a headed sentence-pair file."""
    return Columns(a, b, label, guid), Columns(a, b, None, guid)


_cola_rows = Columns(text_a=3, label=1, header=False)  # source, label, original label, sentence
COLA = _glue("cola", BINARY, "mcc", _cola_rows, _cola_rows, Columns("sentence", guid="index"), "CoLA", mcc=True)
_sst = Columns("sentence", label="label")
SST2 = _glue("sst2", BINARY, "accuracy", _sst, _sst, Columns("sentence", guid="index"), "SST-2")
_mrpc, _mrpc_test = _pair("#1 String", "#2 String", "Quality")  # train/dev have no index column: ids by line
MRPC = _glue("mrpc", BINARY, "f1", _mrpc, _mrpc, _mrpc_test, "MRPC", positive="1")
_stsb, _stsb_test = _pair("sentence1", "sentence2", "score")
STSB = _glue("stsb", None, "spearman", _stsb, _stsb, _stsb_test, "STS-B", regression=True)
_qqp, _qqp_test = _pair("question1", "question2", "is_duplicate", guid="id")
QQP = _glue("qqp", BINARY, "f1", _qqp, _qqp, _qqp_test, "QQP", positive="1", skip_short_rows=True)
_mnli, _mnli_test = _pair("sentence1", "sentence2", "gold_label")
MNLI = _glue("mnli", ("contradiction", "entailment", "neutral"), "accuracy", _mnli, _mnli, _mnli_test, "MNLI",
             dev_files=("dev_matched.tsv", "dev_mismatched.tsv"),
             test_files=("test_matched.tsv", "test_mismatched.tsv"))
_qnli, _qnli_test = _pair("question", "sentence", "label")
QNLI = _glue("qnli", ENTAILMENT, "accuracy", _qnli, _qnli, _qnli_test, "QNLI")
_rte, _rte_test = _pair("sentence1", "sentence2", "label")
RTE = _glue("rte", ENTAILMENT, "accuracy", _rte, _rte, _rte_test, "RTE")
WNLI = _glue("wnli", BINARY, "accuracy", _rte, _rte, _rte_test, "WNLI")

GLUE_TASKS = {t.name: t for t in (COLA, SST2, MRPC, STSB, QQP, MNLI, QNLI, RTE, WNLI)}
