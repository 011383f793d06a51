"""Batch prediction with any fine-tuned model: classification, NER, question answering, multiple choice.

The head is read from the model folder (`config.json["architectures"]`, which `save_pretrained` -- ours and
Hugging Face's -- writes) and looked up in the head registry (`heads.HEADS`), whose entry names the kind of
prediction it serves, in the head kinds' words (`HeadSpec.task`); `TASK_RUNNERS` holds one runner per kind,
saying how to read an input record, featurize it, run the head and turn its output into a small JSON answer:

    text-classification    "text" or {"text", "text_pair"?}   {"label", "score", "scores"}
                                                               regression: {"score"}
                                                               multi-label: {"labels", "scores"}
    token-classification   "text" or {"text"} or {"tokens"}    {"words", "labels", "scores",
                                                                "entities": [{type, text, start, end, score}]}
    question-answering     {"question", "context"}             {"answer", "start", "end", "score"}
    multiple-choice        {"context"?, "start"?, "choices"}   {"label", "choice", "scores"}

A new head of one of these kinds needs only its registry entry to be predicted with and served.

Records are processed in chunks; within a chunk, features are sorted by length into buckets
(`length_buckets.py`), so the forward passes carry almost no padding, and answers come back in input order.
Long question-answering contexts are cut into overlapping windows (`tasks.squad`), the best span over all
windows wins; a classifier fine-tuned with `--long-documents window` (config.json `long_documents`) reads
long texts in windows too, aggregating their logits as in training (mean; max for multi-label); other long
inputs follow the `on_long` policy. A multi-label classifier (config.json `problem_type`
"multi_label_classification") answers the labels whose sigmoid is over its `multi_label_threshold`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.errors import BertlabError
from ..models.heads import HeadSpec
from . import length_buckets
from .inputs import encode, parse_record
from .runtime import (InferenceOptions, architectures, check_model_dir, length_limit, load_model, load_tokenizer,
                      model_family)

log = logging.getLogger(__name__)

Feature = dict[str, Any]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _text_field(record: dict, where: str, names: Sequence[str]) -> str:
    for name in names:
        if name in record:
            value = record[name]
            if not isinstance(value, str):
                raise BertlabError(f"{where}: field {name!r} must be a string, got {type(value).__name__}")
            return value
    raise BertlabError(f"{where}: missing field {names[0]!r}")


class TaskRunner:
    """How one kind of head is used for prediction; subclasses fill in the four steps."""

    task: str = ""  # the kind of head it predicts with (`HeadSpec.task`: a head kind), also named in messages

    def parse(self, item: Any, where: str) -> Any:
        raise NotImplementedError

    def featurize(self, examples: list, predictor: "Predictor", where) -> list[Feature]:
        """Features with `input_ids`, `token_type_ids` (rows, or (C, T) rows for multiple choice) and
        `example_index`; anything else is bookkeeping for `decode`."""
        raise NotImplementedError

    def outputs(self, model, inputs: dict[str, torch.Tensor]) -> list[Any]:
        """The head's output per row of the batch, as small CPU arrays."""
        raise NotImplementedError

    def decode(self, example: Any, features: list[Feature], outputs: list[Any], predictor: "Predictor") -> dict:
        raise NotImplementedError

    def length(self, feature: Feature) -> int:
        return len(feature["input_ids"])

    def inputs(self, features: list[Feature], device) -> dict[str, torch.Tensor]:
        return length_buckets.model_inputs([f["input_ids"] for f in features], [f["token_type_ids"] for f in features],
                                     device)


# ---------------------------------------------------------------------------------------------- classification
class SequenceClassification(TaskRunner):
    task = "text-classification"

    def parse(self, item, where):
        record = parse_record(item, where) if isinstance(item, str) else item
        if isinstance(record, str):
            return record, None
        if not isinstance(record, dict):
            raise BertlabError(f"{where}: expected a text or a JSON object")
        text = _text_field(record, where, ("text", "sentence", "text_a"))
        pair = _text_field(record, where, ("text_pair", "text_b")) if any(
            k in record for k in ("text_pair", "text_b")) else None
        return text, pair

    def featurize(self, examples, predictor, where):
        windows = predictor.model.config.extra.get("long_documents") or {}
        if windows.get("mode") == "window":
            return self._windows(examples, predictor, windows)
        enc = encode(predictor.tokenizer, [t for t, _ in examples], predictor.max_length, predictor.options.on_long,
                     pairs=[p for _, p in examples], where=where)
        return [{"input_ids": enc.input_ids[i], "token_type_ids": enc.token_type_ids[i], "example_index": i}
                for i in range(len(enc))]

    @staticmethod
    def _windows(examples, predictor, windows: dict) -> list[Feature]:
        """One feature per window, as the model was trained (`tasks.text_features.window_rows`)."""
        from ..tasks.text_features import Windows, window_rows

        length, stride = Windows(windows.get("length"), windows.get("stride")).resolve(predictor.max_length)
        length = min(length, predictor.max_length)
        features: list[Feature] = []
        for paired in (False, True):  # single texts and pairs tokenize in separate calls
            idx = [i for i, (_, p) in enumerate(examples) if (p is not None) == paired]
            if not idx:
                continue
            rows, owners = window_rows(predictor.tokenizer, [examples[i][0] for i in idx],
                                       [examples[i][1] for i in idx] if paired else None, length, stride)
            features += [{"input_ids": r["input_ids"], "token_type_ids": r["token_type_ids"],
                          "example_index": idx[o]} for r, o in zip(rows, owners)]
        return features

    def outputs(self, model, inputs):
        return list(model(**inputs).logits.float().cpu().numpy())

    def decode(self, example, features, outputs, predictor):
        config = predictor.model.config.extra
        multi = config.get("problem_type") == "multi_label_classification"
        # a document read in windows: their logits aggregated as in training (max for multi-label)
        logits = np.max(outputs, axis=0) if multi else np.mean(outputs, axis=0)
        labels = predictor.labels
        if multi:
            probs = 1 / (1 + np.exp(-logits.astype(np.float64)))
            threshold = float(config.get("multi_label_threshold", 0.5))
            return {"labels": [labels[k] for k, p in enumerate(probs) if p > threshold],
                    "scores": {labels[k]: float(p) for k, p in enumerate(probs)}}
        if logits.shape[-1] == 1:  # regression (STS-B)
            return {"score": float(logits[0])}
        probs = _softmax(logits)
        best = int(probs.argmax())
        return {"label": labels[best], "score": float(probs[best]),
                "scores": {labels[k]: float(p) for k, p in enumerate(probs)}}


# ---------------------------------------------------------------------------------------------- NER
class TokenClassification(TaskRunner):
    task = "token-classification"

    def parse(self, item, where):
        record = parse_record(item, where) if isinstance(item, str) else item
        if isinstance(record, str):
            return record
        if not isinstance(record, dict):
            raise BertlabError(f"{where}: expected a text or a JSON object")
        if "tokens" in record:
            words = record["tokens"]
            if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
                raise BertlabError(f"{where}: field 'tokens' must be a list of strings")
            return list(words)
        return _text_field(record, where, ("text",))

    def featurize(self, examples, predictor, where):
        features: list[Feature] = [None] * len(examples)  # type: ignore[list-item]
        # Raw texts and pre-split words tokenize differently; encode each kind in one call.
        for split in (False, True):
            idx = [i for i, e in enumerate(examples) if isinstance(e, list) == split]
            if not idx:
                continue
            enc = encode(predictor.tokenizer, [examples[i] for i in idx], predictor.max_length,
                         predictor.options.on_long, offsets=not split, words=True, split_into_words=split,
                         where=lambda k: where(idx[k]))
            for k, i in enumerate(idx):
                features[i] = {"input_ids": enc.input_ids[k], "token_type_ids": enc.token_type_ids[k],
                               "example_index": i, "word_ids": enc.word_ids[k],
                               "offsets": enc.offsets[k] if enc.offsets is not None else None}
        return features

    def outputs(self, model, inputs):
        return list(model(**inputs).logits.float().cpu().numpy())  # rows of (T, K)

    def decode(self, example, features, outputs, predictor):
        from ..tasks.metrics import chunks

        f, logits = features[0], outputs[0]
        probs = _softmax(logits[:len(f["input_ids"])])
        first: dict[int, int] = {}
        spans: dict[int, list[int]] = {}
        for t, w in enumerate(f["word_ids"]):
            if w is None:
                continue
            first.setdefault(w, t)
            if f["offsets"] is not None:
                spans.setdefault(w, [f["offsets"][t][0], 0])[1] = f["offsets"][t][1]
        if isinstance(example, list):
            words, n = list(example), len(example)
        else:
            n = 1 + max(first, default=-1)
            words = [example[spans[w][0]:spans[w][1]] if w in spans else "" for w in range(n)]
        labels, scores = [], []
        for w in range(n):
            if w in first:
                k = int(probs[first[w]].argmax())
                labels.append(predictor.labels[k])
                scores.append(float(probs[first[w], k]))
            else:  # truncated away, or no visible characters
                labels.append("O")
                scores.append(0.0)
        entities = []
        for kind, a, b in sorted(chunks(labels), key=lambda c: c[1]):
            entity = {"type": kind, "score": float(np.mean(scores[a:b + 1]))}
            if isinstance(example, list):
                entity.update(text=" ".join(words[a:b + 1]), start=a, end=b + 1)  # word indices
            else:
                s, e = spans[a][0], spans[b][1]
                entity.update(text=example[s:e], start=s, end=e)  # character offsets
            entities.append(entity)
        return {"words": words, "labels": labels, "scores": scores, "entities": entities}


# ---------------------------------------------------------------------------------------------- QA
class QuestionAnswering(TaskRunner):
    task = "question-answering"
    doc_stride, max_query_length, n_best, max_answer_length = 128, 64, 20, 30

    def parse(self, item, where):
        record = parse_record(item, where, ("question", "context")) if isinstance(item, str) else item
        if not isinstance(record, dict):
            raise BertlabError(f"{where}: expected a JSON object with 'question' and 'context'")
        return _text_field(record, where, ("question",)), _text_field(record, where, ("context",))

    def featurize(self, examples, predictor, where):
        from ..tasks.squad import SquadExample, featurize_squad

        squad = [SquadExample(str(i), q, c, None, False, "", where(i)) for i, (q, c) in enumerate(examples)]
        max_query = min(self.max_query_length, predictor.max_length - 4 - 1)
        return featurize_squad(squad, predictor.tokenizer, predictor.max_length, self.doc_stride, max_query,
                               train=False)

    def outputs(self, model, inputs):
        out = model(**inputs)
        return list(zip(out.start_logits.float().cpu().numpy(), out.end_logits.float().cpu().numpy()))

    def decode(self, example, features, outputs, predictor):
        from ..tasks.squad import CLS_INDEX, best_span_exhaustive, window_spans

        spans, null = [], math.inf
        for f, (start, end) in zip(features, outputs):
            found = window_spans(start, end, f, self.n_best, self.max_answer_length) or \
                [s for s in [best_span_exhaustive(start, end, f, self.max_answer_length)] if s is not None]
            spans.extend(found)
            null = min(null, float(start[CLS_INDEX] + end[CLS_INDEX]))
        context = example[1]
        spans.sort(key=lambda s: s[0], reverse=True)
        top = spans[:self.n_best]
        candidates = [s[0] for s in top] + ([null] if predictor.allow_null else [])
        probs = _softmax(np.asarray(candidates, dtype=np.float64)) if candidates else np.zeros(0)
        if not top or (predictor.allow_null and null > top[0][0]):
            return {"answer": "", "start": None, "end": None, "score": float(probs[-1]) if len(probs) else 0.0}
        _, _, _, a, b = top[0]
        return {"answer": context[a:b], "start": a, "end": b, "score": float(probs[0])}


# ---------------------------------------------------------------------------------------------- multiple choice
class MultipleChoice(TaskRunner):
    task = "multiple-choice"

    def parse(self, item, where):
        record = parse_record(item, where, ("choices",)) if isinstance(item, str) else item
        if not isinstance(record, dict) or "choices" not in record:
            raise BertlabError(f"{where}: expected a JSON object with 'choices'")
        choices = record["choices"]
        if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) for c in choices):
            raise BertlabError(f"{where}: field 'choices' must be a list of at least 2 strings")
        context = _text_field(record, where, ("context", "question")) if any(
            k in record for k in ("context", "question")) else ""
        start = _text_field(record, where, ("start",)) if "start" in record else ""
        return context, start, list(choices)

    def featurize(self, examples, predictor, where):
        firsts = [c for c, _, choices in examples for _ in choices]
        seconds = [f"{s} {ch}".strip() for _, s, choices in examples for ch in choices]
        owner = [i for i, (_, _, choices) in enumerate(examples) for _ in choices]
        enc = encode(predictor.tokenizer, firsts, predictor.max_length, predictor.options.on_long, pairs=seconds,
                     where=lambda k: where(owner[k]))
        features, k = [], 0
        for i, (_, _, choices) in enumerate(examples):
            n = len(choices)
            features.append({"input_ids": enc.input_ids[k:k + n], "token_type_ids": enc.token_type_ids[k:k + n],
                             "example_index": i})
            k += n
        return features

    def length(self, feature):
        return len(feature["input_ids"]) * max(len(r) for r in feature["input_ids"])

    def inputs(self, features, device):
        # (B, C, T): every choice of every example padded to the batch's longest; choice counts may differ,
        # so missing choices are padding rows whose scores are dropped in `outputs`.
        C = max(len(f["input_ids"]) for f in features)
        rows = [r for f in features for r in f["input_ids"] + [[0]] * (C - len(f["input_ids"]))]
        types = [r for f in features for r in f["token_type_ids"] + [[0]] * (C - len(f["input_ids"]))]
        flat = length_buckets.model_inputs(rows, types, device)
        return {k: v.view(len(features), C, -1) for k, v in flat.items()}

    def outputs(self, model, inputs):
        return list(model(**inputs).logits.float().cpu().numpy())

    def decode(self, example, features, outputs, predictor):
        choices = example[2]
        probs = _softmax(outputs[0][:len(choices)])
        best = int(probs.argmax())
        return {"label": best, "choice": choices[best], "scores": [float(p) for p in probs]}


# Kind of prediction (`HeadSpec.task`) -> how to predict with a head of that kind.
TASK_RUNNERS: dict[str, TaskRunner] = {r.task: r for r in (
    SequenceClassification(), TokenClassification(), QuestionAnswering(), MultipleChoice())}


def predictable_heads(family, task: str | None = None) -> list[HeadSpec]:
    """The registered heads of a family a runner can predict with (of kind `task` only, when given)."""
    return [h for h in family.heads.values() if h.task in TASK_RUNNERS and task in (None, h.task)]


def find_head(model_dir: Path, architecture: str | None = None, task: str | None = None) -> HeadSpec | None:
    """The predictable head of a model folder: its config.json architecture (or `architecture`), among its
    family's heads."""
    names = [architecture] if architecture else architectures(model_dir)
    wanted = predictable_heads(model_family(model_dir), task)
    return next((h for h in wanted if h.architecture in names), None)


@dataclass
class Predictor:
    """A loaded task model with its tokenizer and runner: `predict(items)` -> one answer dict per item."""

    model: Any
    tokenizer: Any
    runner: TaskRunner
    max_length: int
    options: InferenceOptions
    chunk_size: int = 2048
    allow_null: bool = False  # QA: may answer "" (SQuAD 2.0 models)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, options: InferenceOptions | None = None,
                        architecture: str | None = None, task: str | None = None) -> "Predictor":
        """The task model in `model_dir`; `architecture` overrides its config.json, `task` (a head kind:
        text-classification, token-classification, question-answering, multiple-choice) accepts only a head of
        that kind."""
        if task is not None and task not in TASK_RUNNERS:
            raise BertlabError(f"unknown task {task!r}; expected one of {', '.join(TASK_RUNNERS)}")
        options = options or InferenceOptions()
        model_dir = check_model_dir(Path(model_dir))
        head = find_head(model_dir, architecture, task)
        if head is None:
            wanted = ", ".join(h.architecture for h in predictable_heads(model_family(model_dir), task))
            if architecture is not None:
                raise BertlabError(f"unknown architecture {architecture!r}; expected one of {wanted}")
            found = ", ".join(architectures(model_dir)) or "none"
            raise BertlabError(f"{model_dir}: not a fine-tuned task model (config.json architectures: {found}); "
                               f"predict needs one of {wanted}")
        model = load_model(head.model_class, model_dir, options, head_prefix=head.prefix,
                           purpose=f"predict ({head.architecture})")
        tokenizer = load_tokenizer(model_dir)
        finetuned_on = model.config.extra.get("finetuning_task")
        return cls(model, tokenizer, TASK_RUNNERS[head.task],
                   length_limit(None, model.config, tokenizer, options.max_seq_length), options,
                   allow_null=finetuned_on == "squad2" or bool(model.config.extra.get("version_2_with_negative")))

    @property
    def labels(self) -> list[str]:
        config = self.model.config
        n = getattr(self.model, "num_labels", config.num_labels)
        id2label = config.id2label or {}
        return [id2label.get(k, f"LABEL_{k}") for k in range(n)]

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def parse(self, items: Sequence[Any], where=None) -> list[Any]:
        where = where or (lambda i: f"input {i + 1}")
        return [self.runner.parse(item, where(i)) for i, item in enumerate(items)]

    def predict(self, items: Sequence[Any], where=None) -> list[dict]:
        """Answers for raw items (lines of text / JSON, or already parsed dicts), in order."""
        return list(self.iter_predict(items, where))

    def iter_predict(self, items: Sequence[Any], where=None) -> Iterator[dict]:
        where = where or (lambda i: f"input {i + 1}")
        for start in range(0, len(items), self.chunk_size):
            at = (lambda i, s=start: where(s + i))
            chunk = [self.runner.parse(item, at(i)) for i, item in enumerate(items[start:start + self.chunk_size])]
            yield from self.predict_parsed(chunk, at)

    def predict_parsed(self, examples: list, where=None) -> list[dict]:
        where = where or (lambda i: f"input {i + 1}")
        features = self.runner.featurize(examples, self, where)
        outputs: list[Any] = [None] * len(features)
        lengths = [self.runner.length(f) for f in features]
        for batch in length_buckets.plan_batches(lengths, self.options.max_tokens, self.options.max_batch,
                                           max_waste=self.options.max_waste):
            with torch.inference_mode():
                rows = self.runner.outputs(self.model, self.runner.inputs([features[i] for i in batch], self.device))
            for i, out in zip(batch, rows):
                outputs[i] = out
        by_example: list[list[int]] = [[] for _ in examples]
        for i, f in enumerate(features):
            by_example[f["example_index"]].append(i)
        return [self.runner.decode(ex, [features[i] for i in idx], [outputs[i] for i in idx], self)
                for ex, idx in zip(examples, by_example)]
