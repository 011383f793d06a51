"""SWAG (Zellers et al., 2018): pick the most plausible of four continuations of a video caption.

Input format (DATA_PATH is a folder with `train.csv`, `val.csv` (the dev split) and `test.csv`, as
released in rowanz/swagaf `data/`): comma-separated with CSV quoting (captions contain commas), a header
row, and the columns
    video-id, fold-ind, startphrase, sent1, sent2, gold-source, ending0, ending1, ending2, ending3, label
where `startphrase` = `sent1 + " " + sent2`; `label` (0-3) is absent from the test file. A row missing a
column, or with a label outside 0-3, is an error naming file and line.

Features, as in the paper (section 4.4): for each ending, [CLS] sent1 [SEP] sent2 + " " + ending [SEP];
the four sequences go through `BertForMultipleChoice`, which scores each from its [CLS] and takes the
softmax over the four. Score: accuracy.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..models.registry import default_head
from .base import Feature, FolderTask, data_error, iter_lines

ENDINGS = ("ending0", "ending1", "ending2", "ending3")


@dataclass(frozen=True)
class ChoiceExample:
    guid: str
    context: str  # sentence A: the first sentence of the caption
    start: str  # the second sentence's beginning, completed by each ending
    endings: tuple[str, ...]
    label: int | None
    source: str


class AccuracyMetric:
    def __init__(self) -> None:
        self.correct = self.total = 0

    def update(self, example: ChoiceExample, prediction: int) -> None:
        self.correct += int(prediction == example.label)
        self.total += 1

    def compute(self) -> dict[str, float]:
        return {"accuracy": self.correct / self.total if self.total else 0.0}


@dataclass(frozen=True)
class MultipleChoiceTask(FolderTask):
    def read(self, data_path: str | Path, split: str) -> list[ChoiceExample]:
        path = self.split_path(data_path, split)
        # csv parses (quoted fields may hold commas and newlines); `iter_lines` decodes line by line
        reader = csv.reader(line for _, line in iter_lines(path))
        header = next(reader, None)
        if header is None:
            raise data_error(path, 1, "empty file; expected a header row")
        missing = [c for c in ("sent1", "sent2", *ENDINGS) if c not in header]
        if missing:
            raise data_error(path, 1, f"header has no column {missing[0]!r} (columns: {', '.join(header)})")
        col = {name: i for i, name in enumerate(header)}
        needed = max(col[c] for c in ("sent1", "sent2", *ENDINGS, *(["label"] if "label" in col else [])))
        examples = []
        line = reader.line_num
        for row in reader:
            start_line, line = line + 1, reader.line_num  # a row starts on the line after the previous one
            if not row:
                continue
            if len(row) <= needed:
                raise data_error(path, start_line, f"expected {len(header)} comma-separated columns, got {len(row)}")
            label = None
            if "label" in col:
                text = row[col["label"]].strip()
                if text not in ("0", "1", "2", "3"):
                    raise data_error(path, start_line, f"label {text!r} is not one of 0, 1, 2, 3")
                label = int(text)
            examples.append(ChoiceExample(f"{split}-{len(examples)}", row[col["sent1"]], row[col["sent2"]],
                                          tuple(row[col[c]] for c in ENDINGS), label, f"{path}:{start_line}"))
        return examples

    def featurize(self, examples: Sequence[ChoiceExample], tokenizer, max_length: int,
                  train: bool) -> list[Feature]:
        """Four (context, start + ending) pairs per example, flattened for the tokenizer, regrouped by four."""
        firsts = [e.context for e in examples for _ in e.endings]
        seconds = [f"{e.start} {ending}" for e in examples for ending in e.endings]
        encoded = tokenizer(firsts, seconds, truncation=True, max_length=max_length, padding=False)
        features, k = [], 0
        for i, e in enumerate(examples):
            n = len(e.endings)
            f: Feature = {key: [list(x) for x in encoded[key][k:k + n]]
                          for key in ("input_ids", "token_type_ids", "attention_mask")}
            f["example_index"] = i
            if e.label is not None:
                f["labels"] = e.label
            features.append(f)
            k += n
        return features

    def decode(self, outputs, batch, features) -> list[int]:
        return outputs.logits.argmax(-1).tolist()  # (B, 4) -> the chosen ending

    def metric(self) -> AccuracyMetric:
        return AccuracyMetric()


SWAG = MultipleChoiceTask(name="swag", head=default_head("multiple-choice"), labels=None, main_metric="accuracy",
                          eval_splits=("dev",), test_splits=("test",), default_max_seq_length=128,
                          files={"train": "train.csv", "dev": "val.csv", "test": "test.csv"})
