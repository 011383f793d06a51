"""`text-classification`: sequence classification on the user's own CSV / TSV / JSON Lines / Parquet files.

    bertlab finetune text-classification --model DIR --train news.csv [--validation dev.csv] [--test new.csv]
        [--text-column text] [--text-pair-column NAME] [--label-column category] [--multi-label] ...

Columns: one or two text columns and a label column, named by flag or guessed from common names (`tables.py`;
the choice is logged and kept in metrics.json; reading the rows as examples is `text_examples.py`). Labels are discovered in the training file and sorted; the
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
column with a single class. Without a dev file a stratified share is held out (`own_splits.py`).

Long inputs (`--long-documents`): `truncate` (default) cuts each input to max-seq-length tokens and reports
how many were cut; `window` cuts each into overlapping windows of `--window-length` tokens sharing
`--window-stride` tokens (Hugging Face's tokenizer `stride`), runs every window, and aggregates the
windows' logits per document -- the mean (max for multi-label: a label present in one part of a document is
present in the document) -- in training (the loss is on the aggregated logits), evaluation and prediction.
A feature is then a document: its `input_ids` is a list of windows, flattened by `collate` with a
`window_owner` index saying which document each window belongs to (`text_features.py`: the packed features, the
windows and their aggregation). The metrics are `metrics.py`'s `SingleLabelMetric`, `MultiLabelMetric` and
`RegressionMetric`.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..models.heads import HeadOutput
from ..models.registry import default_head
from .base import Batch, DataError, Feature, PredictionWriter, TaskSpec, pad_collate
from .tables import Table, read_table
from .metrics import MultiLabelMetric, RegressionMetric, SingleLabelMetric, multi_label_sets, tune_threshold
from .own_splits import InputOptions, SplitFiles, split_rows, summarise_labels
from .text_examples import (MAX_CLASSES, MULTI, REGRESSION, SINGLE, Columns, TextExample, TextExamples, cut_fields,
                            decide_problem_type, distinct_labels, examples_from_table, field_chars, label_column,
                            resolve_columns, stratum, stratum_of)
from .text_features import SEQUENCE_KEYS, WINDOW_CHUNK, PackedFeatures, Windows, aggregate_windows, window_rows

log = logging.getLogger(__name__)

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
        max_length = cfg.max_seq_length or self.default_max_seq_length
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
            counts = distinct_labels(train.labels)
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
        cut = {"train": cut_fields(train_table, cap)}
        if files.dev is not None:
            dev_table = table(files.dev)
            dev = examples_from_table(dev_table, columns, problem_type, "dev", known=labels, labelled=True)
            cut["dev"] = cut_fields(dev_table, cap)
            report["dev_file"] = str(files.dev)
        else:
            train, dev, report["held_out"] = split_rows(train, stratum, options.validation_share, cfg.seed,
                                                        str(files.train), keys=[stratum_of(l) for l in train.labels])
        test = None
        if files.test is not None:
            test_table = table(files.test)
            test = examples_from_table(test_table, columns, problem_type, "test", known=labels)
            cut["test"] = cut_fields(test_table, cap)
            report["test_file"] = str(files.test)
        if any(cut.values()):
            report["fields_cut"] = {"chars": cap, **{split: n for split, n in cut.items() if n}}
        weights = class_weights(train, labels, problem_type) if options.class_weights else None
        if weights is not None:
            report["class_weights"] = summarise_labels(dict(zip(labels, weights)))
        report.update(examples={"train": len(train), "dev": len(dev), **({"test": len(test)} if test else {})},
                      long_documents=options.long_documents)
        if labels is not None:
            report["train_label_counts"] = summarise_labels(dict(sorted(distinct_labels(label_column(train)).items())))
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
    counts = distinct_labels(label_column(examples))
    if problem_type == MULTI:
        return tuple((n - counts[l]) / counts[l] if counts[l] else 1.0 for l in labels)
    return tuple(n / (len(labels) * counts[l]) if counts[l] else 1.0 for l in labels)


TEXT_CLASSIFICATION = TextClassificationTask(name="text-classification", head=default_head("text-classification"),
                                             labels=None, main_metric="accuracy", eval_splits=("dev",),
                                             test_splits=("test",), default_max_seq_length=128)
