"""What the tasks on the user's own files share: their options, which file is which split, a held-out dev split.

The benchmark tasks (GLUE, SQuAD, ...) know their files; a task on the user's own data
(`text-classification`, `token-classification`, `question-answering`, `multiple-choice`) is told them:

    bertlab finetune text-classification --model DIR --train train.csv [--validation dev.csv] [--test test.csv]
        [--text-column text] [--label-column category] ...

`InputOptions` is that group of settings (a field of the fine-tuning config, flags of `bertlab finetune`);
`SplitFiles` resolves it to one file per split. Without a validation file a seeded, stratified share of
the training file (`--validation-share`, 10%) is held out as the dev split (`held_out_split`): every class
keeps its share, so a rare class is not left out of dev by chance; the recipe reports the split.

A task spec configured for a run (`TaskSpec.for_run`) carries the rows it read, so the recipe's later
`read(data, split)` calls do not read or split the files again.
"""

from __future__ import annotations

import logging
import random
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError
from .base import DataError

log = logging.getLogger(__name__)

LONG_DOCUMENTS = ("truncate", "window")
PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression")  # HF's names


@dataclass
class InputOptions:
    """Settings of a task on the user's own files (ignored by the benchmark tasks)."""

    validation: str | None = None  # dev file; None: a held-out share of the training file
    test: str | None = None  # file to predict (labels optional)
    validation_share: float = 0.1  # held out when there is no validation file (seeded, stratified)
    format: str | None = None  # csv, tsv, jsonl, json, parquet; None: from the file name
    delimiter: str | None = None  # CSV/TSV field separator, when not the format's own
    text_column: str | None = None  # None: guessed from common names (text, sentence, content, ...)
    text_pair_column: str | None = None  # second text of sentence-pair tasks
    label_column: str | None = None  # None: guessed (label, category, class, ...)
    multi_label: bool = False  # several labels per row: a JSON list, or a string split on label_separator
    label_separator: str = ","
    problem_type: str | None = None  # single_label_classification | multi_label_classification | regression
    class_weights: bool = False  # weight the loss by inverse class frequency (scikit-learn's "balanced")
    long_documents: str = "truncate"  # truncate | window: inputs over max-seq-length
    window_length: int | None = None  # tokens per window, [CLS]/[SEP] included (default: max-seq-length)
    window_stride: int | None = None  # tokens consecutive windows share (default: a quarter of the window)
    # window mode: tokens (windows x padded length) per forward pass; None: the batch's documents x the window
    # length, i.e. what a truncated batch of the same size holds, so memory does not grow with the documents
    max_tokens: int | None = None
    tokens_column: str | None = None  # token-classification JSONL: the word list (default: tokens / words)
    tags_column: str | None = None  # token-classification JSONL: the tag list (default: tags / ner_tags)
    context_column: str | None = None  # multiple-choice CSV: the shared context (default: context / sent1)
    choice_columns: str | None = None  # multiple-choice CSV: comma-separated choice columns (default: ending0..)

    def __post_init__(self) -> None:
        if not 0 < self.validation_share < 1:
            raise ConfigError(f"validation-share must be in (0, 1), got {self.validation_share}")
        if self.long_documents not in LONG_DOCUMENTS:
            raise ConfigError(f"long-documents must be one of {', '.join(LONG_DOCUMENTS)}, got {self.long_documents!r}")
        if self.problem_type is not None and self.problem_type not in PROBLEM_TYPES:
            raise ConfigError(f"problem-type must be one of {', '.join(PROBLEM_TYPES)}, got {self.problem_type!r}")
        if self.window_length is not None and self.window_length < 8:
            raise ConfigError(f"window-length must be at least 8, got {self.window_length}")
        if self.window_stride is not None and self.window_stride < 0:
            raise ConfigError(f"window-stride must not be negative, got {self.window_stride}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ConfigError(f"max-tokens must be at least 1, got {self.max_tokens}")
        if not self.label_separator:
            raise ConfigError("label-separator must not be empty")


@dataclass(frozen=True)
class SplitFiles:
    """The user's file for each split: train always; dev a file or held out of train; test optional."""

    train: Path
    dev: Path | None
    test: Path | None

    @classmethod
    def from_options(cls, data: str | Path, options: InputOptions) -> "SplitFiles":
        files = cls(Path(data), Path(options.validation) if options.validation else None,
                    Path(options.test) if options.test else None)
        for path in (files.train, files.dev, files.test):
            if path is not None and not path.is_file():
                raise DataError(f"{path}: no such file")
        return files


def held_out_split(keys: Sequence[Hashable], share: float, seed: int) -> tuple[list[int], list[int]]:
    """(train indices, dev indices): `share` of each stratum (rows with equal `keys[i]`) held out, seeded.

    Every stratum of two or more rows gives at least one row to dev and keeps at least one for training; a
    stratum of one row stays in training. Indices come back sorted (file order)."""
    strata: dict[Hashable, list[int]] = defaultdict(list)
    for i, key in enumerate(keys):
        strata[key].append(i)
    rng = random.Random(seed)
    dev: list[int] = []
    for key in sorted(strata, key=repr):  # a fixed order, so the seed alone decides
        rows = strata[key]
        if len(rows) < 2:
            continue
        take = min(len(rows) - 1, max(1, round(share * len(rows))))
        dev.extend(rng.sample(rows, take))
    held = set(dev)
    return [i for i in range(len(keys)) if i not in held], sorted(dev)


def split_rows(rows: Sequence[Any], key: Callable[[Any], Hashable], share: float, seed: int,
               source: str, keys: Sequence[Hashable] | None = None) -> tuple[Sequence[Any], Sequence[Any], dict[str, Any]]:
    """Training rows, held-out dev rows and a report of the split (for the log and metrics.json). `keys`: the
    rows' strata when known (else `key(row)` of each); rows with a `take(indices)` (a column store) are split
    by it, not copied row by row."""
    train_idx, dev_idx = held_out_split(keys if keys is not None else [key(r) for r in rows], share, seed)
    if not dev_idx:
        raise DataError(f"{source}: {len(rows)} rows are too few to hold out a dev split; give --validation FILE")
    report = {"held_out_from": source, "share": share, "seed": seed, "train": len(train_idx), "dev": len(dev_idx)}
    log.info("no validation file: held out %d of %d rows of %s as the dev split (stratified, seed %d)",
             len(dev_idx), len(rows), source, seed)
    if hasattr(rows, "take"):
        return rows.take(train_idx), rows.take(dev_idx), report
    return [rows[i] for i in train_idx], [rows[i] for i in dev_idx], report


LABELS_SHOWN = 50  # a label list or per-label table longer than this is summarised in logs and metrics.json


def summarise_labels(labels: Sequence[str] | dict[str, Any] | None, shown: int = LABELS_SHOWN) -> Any:
    """`labels` (a list, or a dict by label) as they are when short; else a summary -- how many, and the first
    `shown` -- so that thousands of labels do not make a megabyte log line or metrics.json entry."""
    if labels is None or len(labels) <= shown:
        return dict(labels) if isinstance(labels, dict) else (list(labels) if labels is not None else None)
    first = list(labels)[:shown]
    return {"count": len(labels), "first": {k: labels[k] for k in first} if isinstance(labels, dict) else first}
