"""The task interface: what a fine-tuning task (GLUE, SQuAD, CoNLL NER, SWAG) gives the recipe.

A task is a `TaskSpec` subclass instance registered by name in `bertlab.tasks.TASKS`. The recipe
(`bertlab.train.finetune`) and `bertlab evaluate` only ever talk to a task through these members:

    spec.head                 the default family's head class (BERT's BertFor*: one added layer, section 4 of the
                              paper); `head_kind` its kind, `head_class(folder)` the class of that kind in the
                              folder's model family
    spec.labels               label names in id order -> `config.id2label`; None when the head has no
                              label set of its own (regression has one output, QA has start/end)
    spec.num_labels           len(labels), or 1 for regression (MSE loss), or None (QA)
    spec.main_metric          the key of `metric().compute()` that picks the best run on dev
    spec.eval_splits          dev split names scored after training, e.g. ("dev",) or
                              ("dev_matched", "dev_mismatched"); the first one selects the best run
    spec.test_splits          unlabeled splits for which prediction files are written

    spec.read(data_path, split)              -> list[Example]
    spec.has_split(data_path, split)         -> bool (default True): is the optional split there?
        DATA_PATH is the task's folder (GLUE, CoNLL) or its file(s) (SQuAD JSON, SWAG CSV). The task
        documents the file layout where it reads it. Bad input raises `DataError` in one line naming the
        file and line ("train.tsv:17: expected 2 tab-separated columns, got 1"), or -- where skipping is
        the documented behaviour -- skips the item and logs a counted warning.
    spec.featurize(examples, tokenizer, max_length, train) -> list[Feature]
        One or more features per example (QA: sliding windows). A `Feature` is a plain dict:
          input_ids, token_type_ids, attention_mask   lists of ints (multiple choice: one list per choice)
          targets (training/dev only)                 the keys in `spec.target_keys`, e.g. `labels`
                                                      (int, float, or a per-token list with -100 =
                                                      ignored), or `start_positions`/`end_positions`
          example_index                               index of the example it came from (required)
          anything else                               task bookkeeping (offsets, word starts, ...);
                                                      never made into tensors, read back by index
        `train` tells the featurizer whether the features are for training (QA drops or
        labels windows without the answer differently) or for prediction.
    spec.collate(features)                   -> batch: dict of tensors, padded to the longest in the batch
        Pads `PAD_VALUES` keys (input ids 0, attention 0, per-token labels -100); adds `feature_index`
        (positions in the feature list) so a prediction step can look up its features' bookkeeping.
    spec.predictions(model, batches, examples, features) -> Iterator[(Example, prediction)]
        THE batch -> prediction step. Runs the model on each batch and reduces its logits at once to
        small per-example predictions (a label name, a float, a tag sequence, an answer string), so the
        logits of a large set are never held together. The default maps features 1:1 to examples and
        calls `spec.decode(outputs, batch, features)` -> one prediction per row. QA overrides
        `predictions` itself: several windows per example, start/end logits -> n-best spans -> text;
        its batches then come in feature order. Predictions must come out in example order.
    spec.metric()                            -> Metric: a fresh streaming accumulator,
        `update(example, prediction)` once per labelled example, then `compute()` -> dict[str, float]
        (scores in [0, 1] except correlations; e.g. {"accuracy": .91, "f1": .88}).
    spec.prediction_writer(out_dir, split)   -> PredictionWriter: a context manager with
        `write(example, prediction)` per example, streaming to a file it names (`.path`); default JSON
        lines {"id": guid, "prediction": ...}; GLUE test splits use the submission TSV, SQuAD its JSON.

Tasks on the user's own files (`text_classification.py`, `own_tasks.py`) are templates until configured;
for the benchmark tasks these hooks are the identity / the defaults:
    spec.for_run(cfg)                       -> the spec configured by a fine-tuning config (files, columns,
                                               labels discovered in the training file)
    spec.with_model_config(config)          -> the spec as a saved model was trained on it (its config.json)
    spec.loss(model, batch)                 -> the training loss (default: the head's own `.loss`)
    spec.forward(model, batch)              -> the head's outputs of a prediction batch (default: one pass)
    spec.saved_config()                     -> config.json keys of a model trained on the task (columns, ...)
    spec.export_config(scores)              -> config.json keys decided by the saved run's dev scores
    spec.describe()                         -> what the run read (columns, labels, split sizes), for metrics.json

`evaluate(spec, model, tokenizer, examples, ...)` below runs the whole chain: featurize -> batches ->
predictions -> (metric, writer), streaming, and is what the recipe and `bertlab evaluate` call.

Examples are the task's own (frozen) dataclasses; each carries `guid` (a stable id written with the
prediction) and `source` ("path:line", for error messages and debugging).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Protocol, Sequence

import torch

from ..core.errors import DataError
from ..core.labels import IGNORE_INDEX

log = logging.getLogger(__name__)

Feature = dict[str, Any]
Batch = dict[str, torch.Tensor]

# Keys made into tensors by `collate`, with the value that pads sequences to the batch's longest.
PAD_VALUES: dict[str, int] = {
    "input_ids": 0,  # [PAD] is id 0 in every BERT vocabulary
    "token_type_ids": 0,
    "attention_mask": 0,
    "labels": IGNORE_INDEX,  # per-token labels: padding predicts nothing
    "start_positions": 0,
    "end_positions": 0,
}


def data_error(source: str | Path, line: int | None, message: str) -> DataError:
    """`DataError("dev.tsv:17: message")` -- the one-line shape every reader uses."""
    where = f"{source}:{line}" if line is not None else str(source)
    return DataError(f"{where}: {message}")


def iter_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number from 1, text with its line end) of a UTF-8 file, streamed, a leading byte-order mark
    dropped (MRPC has one). Lines are decoded one by one, so a bad byte is reported at its exact line."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise data_error(path, lineno, f"not UTF-8 text (byte {raw[e.start]:#04x} at column "
                                               f"{e.start + 1})") from None


class Metric(Protocol):
    """A streaming score: fed one (example, prediction) at a time, so nothing large is held."""

    def update(self, example: Any, prediction: Any) -> None: ...

    def compute(self) -> dict[str, float]: ...


class PredictionWriter:
    """Streams predictions to `out_dir/{split}_predictions.jsonl`, one JSON object per line.

    Subclasses change `filename` and `format_line` (GLUE submission TSV) or replace it (SQuAD JSON)."""

    def __init__(self, out_dir: str | Path, split: str):
        self.path = Path(out_dir) / self.filename(split)
        self._file = None

    def filename(self, split: str) -> str:
        return f"{split}_predictions.jsonl"

    def header(self) -> str | None:
        return None

    def format_line(self, example: Any, prediction: Any) -> str:
        return json.dumps({"id": example.guid, "prediction": prediction}, ensure_ascii=False)

    def __enter__(self) -> "PredictionWriter":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "w", encoding="utf-8")
        if (head := self.header()) is not None:
            self._file.write(head + "\n")
        return self

    def write(self, example: Any, prediction: Any) -> None:
        self._file.write(self.format_line(example, prediction) + "\n")

    def __exit__(self, *exc) -> None:
        self._file.close()


@dataclass(frozen=True)
class TaskSpec:
    """One fine-tuning task. Subclasses implement `read`, `featurize`, `metric` (and `decode` unless they
    override `predictions`); the rest has defaults. See the module docstring for the contract."""

    name: str
    head: type  # the default family's head class of the task's kind (`registry.default_head`); a folder's: `head_class`
    labels: tuple[str, ...] | None
    main_metric: str
    eval_splits: tuple[str, ...] = ("dev",)
    test_splits: tuple[str, ...] = ("test",)
    input_keys: tuple[str, ...] = ("input_ids", "attention_mask", "token_type_ids")
    target_keys: tuple[str, ...] = ("labels",)
    default_max_seq_length: int = 128

    # -------------------------------------------------------------------------------------- labels
    @property
    def is_regression(self) -> bool:
        return False

    @property
    def num_labels(self) -> int | None:
        return 1 if self.is_regression else (len(self.labels) if self.labels else None)

    @property
    def id2label(self) -> dict[int, str] | None:
        if self.is_regression:
            return {0: "score"}
        return dict(enumerate(self.labels)) if self.labels else None

    @property
    def head_kind(self) -> str:
        """The kind of head the task adds (`models/heads.py`): text-classification, question-answering, ..."""
        return self.head.head_spec.name

    def head_class(self, model: str | Path | Any) -> type:
        """The class of the task's head in the family of `model`: a model folder (its config.json's model_type)
        or a loaded config."""
        from ..models.registry import family, family_of

        found = family_of(model) if isinstance(model, (str, Path)) else family(model.to_dict().get("model_type", "bert"))
        return found.head(self.head_kind, f"the {self.name} task").model_class

    def build_model(self, model_dir: str | Path, **config_overrides):
        """The head on a pre-trained encoder (any HF-layout folder of a supported family); a new head is
        initialised, and `saved_config()` goes into its config (so config.json keeps it)."""
        if self.id2label is not None:
            config_overrides.setdefault("id2label", self.id2label)
        built = self.head_class(model_dir).from_pretrained(model_dir, **config_overrides)
        (built[0] if isinstance(built, tuple) else built).config.extra.update(self.saved_config())
        return built

    def saved_config(self) -> dict[str, Any]:
        """config.json keys a model trained on this task keeps (columns, problem type, ...); none by default."""
        return {}

    # -------------------------------------------------------------------------------------- configuring
    def for_run(self, cfg: Any) -> "TaskSpec":
        """The spec for a fine-tuning run of `cfg` (a `FinetuneConfig`); a benchmark task is fixed."""
        return self

    def with_model_config(self, config: Any) -> "TaskSpec":
        """The spec as the saved model with `config` (its BertConfig) was trained on it."""
        return self

    def export_config(self, scores: dict[str, dict[str, float]]) -> dict[str, Any]:
        """config.json keys the saved run's dev `scores` decide (a tuned threshold); none by default."""
        return {}

    def describe(self) -> dict[str, Any]:
        """What a configured task read, for metrics.json; nothing for a benchmark task."""
        return {}

    # -------------------------------------------------------------------------------------- data
    def read(self, data_path: str | Path, split: str) -> list[Any]:
        raise NotImplementedError

    def has_split(self, data_path: str | Path, split: str) -> bool:
        """Whether DATA_PATH holds `split` (test files are optional; the recipe skips absent ones)."""
        return True

    def featurize(self, examples: Sequence[Any], tokenizer, max_length: int, train: bool) -> list[Feature]:
        raise NotImplementedError

    def collate(self, features: Sequence[Feature], indices: Sequence[int] | None = None) -> Batch:
        return pad_collate(features, indices)

    # -------------------------------------------------------------------------------------- prediction
    def model_inputs(self, batch: Batch, with_targets: bool = False) -> dict[str, torch.Tensor]:
        keys = self.input_keys + (self.target_keys if with_targets else ())
        return {k: batch[k] for k in keys if k in batch}

    def loss(self, model, batch: Batch) -> torch.Tensor:
        """The training loss of one batch: the head's own loss on the targets."""
        return model(**self.model_inputs(batch, with_targets=True)).loss

    def forward(self, model, batch: Batch) -> Any:
        """The head's outputs for one prediction batch (default `predictions`): one forward pass. A task whose
        batch rows can outnumber its examples (text classification's windows) runs them in parts."""
        return model(**self.model_inputs(batch))

    def decode(self, outputs: Any, batch: Batch, features: Sequence[Feature]) -> list[Any]:
        """One prediction per row of `batch` from the head's outputs (default `predictions` only)."""
        raise NotImplementedError

    def predictions(self, model, batches: Iterable[Batch], examples: Sequence[Any],
                    features: Sequence[Feature]) -> Iterator[tuple[Any, Any]]:
        """Default: one feature per example; logits -> `decode` -> predictions, batch by batch. Batches may
        come in any order (`evaluate` sorts them by length); predictions are yielded in example order as
        soon as every earlier one is done, so only small decoded predictions ever wait, never logits."""
        waiting: dict[int, Any] = {}
        next_index = 0
        for batch in batches:
            outputs = self.forward(model, batch)
            waiting.update(zip(batch["feature_index"].tolist(), self.decode(outputs, batch, features)))
            while next_index in waiting:
                yield examples[features[next_index]["example_index"]], waiting.pop(next_index)
                next_index += 1
        if waiting:
            raise RuntimeError(f"{self.name}: no prediction for feature {next_index}")

    def metric(self) -> Metric:
        raise NotImplementedError

    def has_gold(self, example: Any) -> bool:
        """Whether `example` carries a gold answer (test splits do not; they are only written)."""
        return getattr(example, "label", None) is not None

    def prediction_writer(self, out_dir: str | Path, split: str) -> PredictionWriter:
        return PredictionWriter(out_dir, split)


@dataclass(frozen=True)
class FolderTask(TaskSpec):
    """A task whose DATA_PATH is a folder with one file per split (GLUE, CoNLL-2003, SWAG). A file given
    instead of the folder is read as the requested split (handy for one-off files)."""

    files: dict[str, str] = None  # split -> file name in the folder

    def split_path(self, data_path: str | Path, split: str) -> Path:
        if split not in self.files:
            raise DataError(f"{self.name}: no split {split!r}; expected one of {', '.join(self.files)}")
        path = Path(data_path)
        path = path / self.files[split] if path.is_dir() else path
        if not path.is_file():
            raise DataError(f"{path}: no such file (the {self.name} {split} split)")
        return path

    def has_split(self, data_path: str | Path, split: str) -> bool:
        return split in self.files and (Path(data_path) / self.files[split]).is_file()


# ------------------------------------------------------------------------------------------ batching
def _pad(seqs: list, value: int) -> list:
    """Right-pad nested int lists to a rectangle: [[1,2],[3]] -> [[1,2],[3,0]]; (C, T) rows likewise."""
    if not seqs or not isinstance(seqs[0], list):
        return seqs
    if isinstance(seqs[0][0] if seqs[0] else None, list):  # (N, C, T): pad every T to the global max
        width = max(len(t) for s in seqs for t in s)
        return [[t + [value] * (width - len(t)) for t in s] for s in seqs]
    width = max(len(s) for s in seqs)
    return [s + [value] * (width - len(s)) for s in seqs]


def feature_length(feature: Feature) -> int:
    """Tokens of a feature (multiple choice: its longest choice): what dynamic padding pads to."""
    ids = feature["input_ids"]
    return max(len(c) for c in ids) if ids and isinstance(ids[0], list) else len(ids)


def feature_lengths(features: Sequence[Feature]) -> list[int]:
    """`feature_length` of every feature (from packed arrays' offsets when the features have them)."""
    return features.lengths() if hasattr(features, "lengths") else [feature_length(f) for f in features]


def pad_collate(features: Sequence[Feature], indices: Sequence[int] | None = None) -> Batch:
    """Features -> tensors, padded to the longest sequence in the batch (dynamic padding: a batch of short
    sentences costs what short sentences cost). Keys outside `PAD_VALUES` stay in the feature list."""
    batch: Batch = {}
    for key, value in PAD_VALUES.items():
        if key not in features[0]:
            continue
        column = [f[key] for f in features]
        dtype = torch.float32 if isinstance(column[0], float) else torch.long
        batch[key] = torch.tensor(_pad(column, value), dtype=dtype)
    batch["feature_index"] = torch.tensor(list(indices) if indices is not None else range(len(features)))
    return batch


def batches(spec: TaskSpec, features: Sequence[Feature], batch_size: int, device: torch.device | str = "cpu",
            order: Sequence[int] | None = None) -> Iterator[Batch]:
    """Batches of `features` in `order` (default: as they are), collated and moved to `device`."""
    order = list(order) if order is not None else list(range(len(features)))
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        batch = spec.collate([features[i] for i in idx], idx)
        yield {k: v.to(device) for k, v in batch.items()}


# ------------------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def evaluate(spec: TaskSpec, model, tokenizer, examples: Sequence[Any], split: str, *, max_length: int,
             batch_size: int = 64, out_dir: str | Path | None = None, device: torch.device | str = "cpu",
             autocast_dtype: torch.dtype | None = None, features: Sequence[Feature] | None = None
             ) -> dict[str, float]:
    """Predict `examples`, stream predictions to the writer (when `out_dir`) and to the metric (for examples
    with gold labels); return the scores ({} for an unlabeled split). Never holds more than one batch
    of logits."""
    was_training = model.training
    model.eval()
    if features is None:
        features = spec.featurize(examples, tokenizer, max_length, train=False)
    metric = spec.metric()
    scored = 0
    classes: Counter = Counter()  # class predictions (labels, choice indices), to catch a collapsed model
    device_type = torch.device(device).type
    try:
        with contextlib.ExitStack() as stack:
            writer = stack.enter_context(spec.prediction_writer(out_dir, split)) if out_dir is not None else None
            stack.enter_context(torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None))
            # Batches of similar lengths waste less compute on padding. Only the default `predictions`
            # restores example order itself; a task that overrides it (QA) gets its features in order.
            order = None
            if type(spec).predictions is TaskSpec.predictions:
                order = sorted(range(len(features)), key=lambda i: feature_length(features[i]))
            for example, prediction in spec.predictions(model, batches(spec, features, batch_size, device, order),
                                                        examples, features):
                if writer is not None:
                    writer.write(example, prediction)
                if isinstance(prediction, (str, int)) and not isinstance(prediction, bool):
                    classes[prediction] += 1
                if spec.has_gold(example):
                    metric.update(example, prediction)
                    scored += 1
    finally:
        model.train(was_training)
    warn_if_one_class(spec.name, split, classes)
    return metric.compute() if scored else {}


def warn_if_one_class(task: str, split: str, classes: Counter, at_least: int = 20) -> bool:
    """Warn when every one of (at least `at_least`) predictions is the same class: the model learned only the
    majority class (too few steps, or a learning rate too low or too high), whatever its accuracy says."""
    total = sum(classes.values())
    if len(classes) != 1 or total < at_least:
        return False
    (only, _), = classes.items()
    log.warning("%s %s: the model predicted %r for all %d examples -- it has learned no more than one class; "
                "train longer (--epochs), try another --lr (docs: Fine-tuning), or use more training data",
                task, split, only, total)
    return True
