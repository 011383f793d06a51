"""SQuAD v1.1 and v2.0: span-extraction question answering (section 4.2-4.3 of the paper).

Reader -> sliding-window features -> per-window n-best spans -> one answer per question -> official scores.
Each step below states its rule; the rules are those of Google's `run_squad.py`, except that answer text is
cut from the original context through the tokenizer's character offsets (Google re-aligns detokenized
pieces with `get_final_text`), and the v2.0 no-answer threshold is tuned on the dev set in the same run.

Input: the SQuAD JSON files (`train-v1.1.json`, `dev-v1.1.json`, `train-v2.0.json`, `dev-v2.0.json`):

    {"version": "1.1" | "v2.0",
     "data": [{"title": str,
               "paragraphs": [{"context": str,
                               "qas": [{"id": str, "question": str,
                                        "answers": [{"text": str, "answer_start": int}, ...],
                                        "is_impossible": bool,                 # v2.0 only
                                        "plausible_answers": [...]}]}]}]}     # v2.0, impossible questions

`answer_start` is the character offset of `text` in `context`. v1.1 training files have one answer per
question and dev files three (any of them scores). In v2.0 an unanswerable question has `is_impossible:
true` and `answers: []`; its `plausible_answers` (same shape) are checked but not used.

Bad input is a one-line `DataError` naming the file and question id -- in particular an answer whose
`answer_start` does not point at its `text`. With `skip_bad_answers=True` such questions are skipped instead
and counted in one warning (for third-party files known to have a few; the official files have none).

DATA_PATH for `read(data_path, split)`:
  - a folder: the split's file is `{split}-v2.0.json`, `{split}-v1.1.json` or `{split}.json`, first found;
  - a file: it is the `dev` split (SQuAD ships train and dev as separate files);
  - `train=FILE,dev=FILE` or a dict {split: FILE}; any FILE may end in `#A:B` to take articles A..B-1
    (Python slice syntax), e.g. `train=dev-v1.1.json#:36,dev=dev-v1.1.json#36:` trains on the first 36
    articles of dev-v1.1 and scores the other 12.

Scores (`squad_metrics.py`) are the official scripts'; `metric().compute()` reports them divided by 100
(the task interface keeps scores in [0, 1]); the prediction files are the official formats.
"""

from __future__ import annotations

import bisect
import functools
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch

from . import squad_metrics
from ..models.registry import default_head
from .base import DataError, Feature, PredictionWriter, TaskSpec

log = logging.getLogger(__name__)

CLS_INDEX = 0  # the label of "no answer in this window": both start and end on [CLS]


# ================================================================================================ reading
@dataclass(frozen=True)
class SquadAnswer:
    text: str
    start: int  # character offset of `text` in the context


@dataclass(frozen=True)
class SquadExample:
    guid: str  # the question id
    question: str
    context: str  # shared (one string object) by the questions of a paragraph
    answers: tuple[SquadAnswer, ...] | None  # None: the file gives none (unlabelled); () unanswerable (v2.0)
    is_impossible: bool
    title: str
    source: str  # "FILE question ID", for messages


def resolve_split_file(data_path: str | Path | Mapping[str, Any], split: str) -> tuple[Path, slice | None]:
    """The file (and article slice) of `split` under the DATA_PATH rules in the module docstring."""
    if isinstance(data_path, Mapping):
        if split not in data_path:
            raise DataError(f"no file for split {split!r} in the data spec (have {', '.join(data_path)})")
        return _parse_file_spec(str(data_path[split]))
    text = str(data_path)
    if "=" in text:
        specs = {}
        for part in text.split(","):
            name, _, spec = part.partition("=")
            specs[name.strip()] = spec.strip()
        return resolve_split_file(specs, split)
    path, articles = _parse_file_spec(text)
    if path.is_dir():
        for name in (f"{split}-v2.0.json", f"{split}-v1.1.json", f"{split}.json"):
            if (path / name).is_file():
                return path / name, articles
        raise DataError(f"{path}: no {split}-v2.0.json, {split}-v1.1.json or {split}.json in this folder")
    if split != "dev":
        raise DataError(f"{path}: a single SQuAD file is the dev split; for {split!r} give a folder or "
                        f"'train=FILE,dev=FILE'")
    return path, articles


def _parse_file_spec(spec: str) -> tuple[Path, slice | None]:
    """'FILE' or 'FILE#A:B' -> (path, slice of articles)."""
    path, sep, selection = spec.partition("#")
    if not sep:
        return Path(path), None
    try:
        bounds = [int(b) if b.strip() else None for b in selection.split(":")]
        if len(bounds) != 2:
            raise ValueError
    except ValueError:
        raise DataError(f"{spec}: expected FILE#A:B to select articles A..B-1, got '#{selection}'") from None
    return Path(path), slice(*bounds)


def load_squad_json(path: str | Path, articles: slice | None = None) -> dict[str, Any]:
    """The parsed file, with `data` cut to `articles`; one-line errors for a missing or non-JSON file."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as f:
            dataset = json.load(f)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno})") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not isinstance(dataset, dict) or not isinstance(dataset.get("data"), list):
        raise DataError(f"{path}: not a SQuAD file (expected an object with a 'data' list of articles)")
    if articles is not None:
        dataset = {**dataset, "data": dataset["data"][articles]}
    return dataset


def _field(obj: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise DataError(f"{where}: missing field '{key}'")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise DataError(f"{where}: field '{key}' must be {kind.__name__}, got {type(value).__name__}")
    return value


def _answers(qa: dict, key: str, context: str, where: str) -> tuple[SquadAnswer, ...]:
    """Parse `qa[key]` and check the rule every answer obeys: context[start:start+len(text)] == text."""
    out = []
    for n, a in enumerate(_field(qa, key, list, where)):
        text = _field(a, "text", str, f"{where} {key}[{n}]")
        start = _field(a, "answer_start", int, f"{where} {key}[{n}]")
        found = context[start:start + len(text)] if 0 <= start else ""
        if found != text:
            raise _BadAnswer(f"{where}: {key}[{n}] answer_start {start} points at {found!r}, "
                             f"not at the answer text {text!r}")
        out.append(SquadAnswer(text, start))
    return tuple(out)


class _BadAnswer(DataError):
    """An answer_start that does not match its text: an error, or a counted skip with skip_bad_answers."""


def examples_from_json(dataset: Mapping[str, Any], source: str, version2: bool,
                       skip_bad_answers: bool = False) -> list[SquadExample]:
    """One `SquadExample` per question of `dataset["data"]`, validated (see the module docstring)."""
    examples: list[SquadExample] = []
    seen: set[str] = set()
    skipped: list[str] = []
    for i, article in enumerate(dataset["data"]):
        title = article.get("title", "") if isinstance(article, dict) else ""
        for j, paragraph in enumerate(_field(article, "paragraphs", list, f"{source}: article {i}")):
            context = _field(paragraph, "context", str, f"{source}: article {i} paragraph {j}")
            for k, qa in enumerate(_field(paragraph, "qas", list, f"{source}: article {i} paragraph {j}")):
                qid = qa.get("id") if isinstance(qa, dict) else None
                if not isinstance(qa, dict) or not isinstance(qid, (str, int)) or isinstance(qid, bool):
                    raise DataError(f"{source}: article {i} paragraph {j} question {k}: no 'id'")
                qid = str(qid)
                where = f"{source}: question id {qid}"
                if qid in seen:
                    raise DataError(f"{where}: the id appears twice (predictions are keyed by it)")
                seen.add(qid)
                question = _field(qa, "question", str, where)
                try:
                    answers = _answers(qa, "answers", context, where) if "answers" in qa else None
                    if "plausible_answers" in qa:
                        _answers(qa, "plausible_answers", context, where)
                except _BadAnswer:
                    if not skip_bad_answers:
                        raise
                    skipped.append(qid)
                    continue
                impossible = bool(qa.get("is_impossible", answers == ()))
                if answers is not None:
                    if impossible and answers:
                        raise DataError(f"{where}: is_impossible is true but the question has answers")
                    if not answers and not version2:
                        raise DataError(f"{where}: no answers; SQuAD v1.1 questions all have one "
                                        "(unanswerable questions are task squad2)")
                    if not answers and not impossible:
                        raise DataError(f"{where}: no answers but is_impossible is false")
                examples.append(SquadExample(qid, question, context, answers, impossible, title, where))
    if skipped:
        log.warning("%s: skipped %d question(s) whose answer_start does not match the answer text (first: %s)",
                    source, len(skipped), skipped[0])
    return examples


def read_squad(path: str | Path, articles: slice | None = None, version2: bool = True,
               skip_bad_answers: bool = False) -> list[SquadExample]:
    """The questions of one SQuAD JSON file (optionally of articles[articles] only)."""
    dataset = load_squad_json(path, articles)
    return examples_from_json(dataset, str(path), version2, skip_bad_answers)


# ================================================================================================ features
@dataclass(frozen=True)
class EncodedText:
    """A text's WordPiece ids (no special tokens) and each piece's (start, end) characters in the text."""

    ids: list[int]
    offsets: list[tuple[int, int]]

    @functools.cached_property
    def starts(self) -> list[int]:  # sorted: pieces come in text order (for bisect)
        return [s for s, _ in self.offsets]

    @functools.cached_property
    def ends(self) -> list[int]:
        return [e for _, e in self.offsets]


def encode_texts(tokenizer, texts: Sequence[str], batch_size: int = 256) -> list[EncodedText]:
    """Token ids + character offsets of each text, without [CLS]/[SEP] (windows add them). Any tokenizer
    with Hugging Face's call convention works (`add_special_tokens`, `return_offsets_mapping`)."""
    out: list[EncodedText] = []
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(list(texts[i:i + batch_size]), add_special_tokens=False, return_offsets_mapping=True,
                        return_token_type_ids=False, return_attention_mask=False)
        for ids, offsets in zip(enc["input_ids"], enc["offset_mapping"]):
            out.append(EncodedText(list(ids), [(int(s), int(e)) for s, e in offsets]))
    return out


def plan_windows(num_doc_tokens: int, max_doc_tokens: int, doc_stride: int) -> list[tuple[int, int]]:
    """(first doc token, length) of each window: windows of up to `max_doc_tokens` tokens, one starting every
    `doc_stride` tokens, until one reaches the end (Google's rule: the stride is the step, not the overlap).
    An empty context still gets one (empty) window, so every question gets a prediction."""
    windows = []
    start = 0
    while True:
        length = min(num_doc_tokens - start, max_doc_tokens)
        windows.append((start, length))
        if start + length >= num_doc_tokens:
            return windows
        start += min(length, doc_stride)


def max_context_owner(windows: Sequence[tuple[int, int]], num_doc_tokens: int) -> np.ndarray:
    """For each doc token, the window in which it has the most context: score = min(tokens left, tokens
    right) + 0.01 * window length, first window on ties (Google's `_check_is_max_context`). An answer may
    only start in its token's owner window, so overlapping windows do not vote twice for one span."""
    owner = np.zeros(num_doc_tokens, dtype=np.int32)
    best = np.full(num_doc_tokens, -1.0)
    for w, (start, length) in enumerate(windows):
        pos = np.arange(start, start + length)
        score = np.minimum(pos - start, start + length - 1 - pos) + 0.01 * length
        better = score > best[start:start + length]
        owner[start:start + length][better] = w
        best[start:start + length][better] = score[better]
    return owner


def answer_token_span(doc: EncodedText, char_start: int, char_end: int) -> tuple[int, int] | None:
    """(first, last) doc token covering characters [char_start, char_end): the first token ending after the
    start and the last token starting before the end. None when no token does (an answer made only of
    characters the tokenizer drops)."""
    first = bisect.bisect_right(doc.ends, char_start)
    last = bisect.bisect_left(doc.starts, char_end) - 1
    return (first, last) if first <= last else None


def featurize_squad(examples: Sequence[SquadExample], tokenizer, max_length: int = 384, doc_stride: int = 128,
                    max_query_length: int = 64, train: bool = False) -> list[Feature]:
    """Sliding-window features: `[CLS] question [SEP] context window [SEP]`, token types 0 then 1.

    The question keeps its first `max_query_length` tokens; each window holds up to
    `max_length - len(question) - 3` context tokens (`plan_windows`). Labels (`start_positions`,
    `end_positions`) are the answer's first/last token in the window, or [CLS] (0) when the answer is not
    entirely inside it and for unanswerable questions. Training uses the first answer (train files have
    one); dev features carry the first answer's labels too (for a dev loss), and unlabelled ones 0.

    Bookkeeping for prediction (shared objects, not copies, across a question's windows): `window`,
    `num_windows`, `context_start` (index of the first context token in input_ids), `doc_start`,
    `doc_len`, `doc` (the context's EncodedText) and `owner` (`max_context_owner`)."""
    if max_length < max_query_length + 4:
        raise DataError(f"max_length {max_length} leaves no room for context after a question of up to "
                        f"{max_query_length} tokens")
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    contexts: dict[int, int] = {}  # id(context string) -> index in `unique`: paragraphs are encoded once
    unique: list[str] = []
    for ex in examples:
        if id(ex.context) not in contexts:
            contexts[id(ex.context)] = len(unique)
            unique.append(ex.context)
    docs = encode_texts(tokenizer, unique)
    questions = encode_texts(tokenizer, [ex.question for ex in examples])
    features: list[Feature] = []
    for index, (ex, q) in enumerate(zip(examples, questions)):
        if train and ex.answers is None:
            raise DataError(f"{ex.source}: training needs answers, the question has none")
        doc = docs[contexts[id(ex.context)]]
        query = q.ids[:max_query_length]
        windows = plan_windows(len(doc.ids), max_length - len(query) - 3, doc_stride)
        owner = None if train else max_context_owner(windows, len(doc.ids))
        span = None
        if ex.answers:
            answer = ex.answers[0]
            span = answer_token_span(doc, answer.start, answer.start + len(answer.text))
        context_start = len(query) + 2
        for w, (doc_start, doc_len) in enumerate(windows):
            input_ids = [cls_id, *query, sep_id, *doc.ids[doc_start:doc_start + doc_len], sep_id]
            start = end = CLS_INDEX
            if span is not None and doc_start <= span[0] and span[1] < doc_start + doc_len:
                start = context_start + span[0] - doc_start
                end = context_start + span[1] - doc_start
            feature: Feature = {
                "input_ids": input_ids,
                "token_type_ids": [0] * context_start + [1] * (doc_len + 1),
                "attention_mask": [1] * len(input_ids),
                "start_positions": start,
                "end_positions": end,
                "example_index": index,
            }
            if not train:
                feature.update(window=w, num_windows=len(windows), context_start=context_start,
                               doc_start=doc_start, doc_len=doc_len, doc=doc, owner=owner)
            features.append(feature)
    return features


# ================================================================================================ prediction
@dataclass(frozen=True)
class SquadPrediction:
    """A question's answer before the no-answer decision: its best non-null span and the null score."""

    text: str  # best span's text, cut from the original context ("" only when the context has no span)
    score: float  # start_logit + end_logit of that span (-inf when there is none)
    null_score: float  # start[CLS] + end[CLS], the lowest over the question's windows
    nbest: tuple[dict, ...]  # Google's n-best entries: text, probability, start_logit, end_logit

    @property
    def null_score_diff(self) -> float:
        """null - best non-null: v2.0 answers "" when this exceeds the threshold (written as null_odds)."""
        return self.null_score - self.score


def window_spans(start_logits: np.ndarray, end_logits: np.ndarray, feature: Feature, n_best: int,
                 max_answer_length: int) -> list[tuple[float, float, float, int, int]]:
    """Candidate spans of one window as (score, start_logit, end_logit, char_start, char_end).

    Rule (Google's): the `n_best` highest start and end logits, pairs with start <= end and at most
    `max_answer_length` tokens, starts only where this window is the token's max-context window. Unlike
    Google's, the top-n are taken among context tokens only (question, [SEP] and padding can never be an
    answer), so a window never comes back empty-handed because its top logits fell outside the context."""
    c0, n = feature["context_start"], feature["doc_len"]
    d0, window = feature["doc_start"], feature["window"]
    s = start_logits[c0:c0 + n].astype(np.float64)
    e = end_logits[c0:c0 + n].astype(np.float64)
    allowed = np.flatnonzero(feature["owner"][d0:d0 + n] == window)
    starts = allowed[np.argsort(-s[allowed], kind="stable")[:n_best]]
    ends = np.argsort(-e, kind="stable")[:n_best]
    offsets = feature["doc"].offsets
    spans = []
    for i in starts.tolist():
        for j in ends.tolist():
            if j < i or j - i + 1 > max_answer_length:
                continue
            spans.append((float(s[i] + e[j]), float(s[i]), float(e[j]), offsets[d0 + i][0], offsets[d0 + j][1]))
    return spans


def best_span_exhaustive(start_logits: np.ndarray, end_logits: np.ndarray, feature: Feature,
                         max_answer_length: int) -> tuple[float, float, float, int, int] | None:
    """The best valid span of a window over all pairs -- the fallback when no top-n pair is valid."""
    c0, n, d0 = feature["context_start"], feature["doc_len"], feature["doc_start"]
    s = start_logits[c0:c0 + n].astype(np.float64)
    e = end_logits[c0:c0 + n].astype(np.float64)
    best = None
    for i in np.flatnonzero(feature["owner"][d0:d0 + n] == feature["window"]).tolist():
        j = i + int(np.argmax(e[i:i + max_answer_length]))  # the best end within reach of this start
        if best is None or s[i] + e[j] > best[0]:
            best = (float(s[i] + e[j]), float(s[i]), float(e[j]), i, j)
    if best is None:
        return None
    offsets = feature["doc"].offsets
    return best[:3] + (offsets[d0 + best[3]][0], offsets[d0 + best[4]][1])


def _softmax(scores: Sequence[float]) -> list[float]:
    if not scores:
        return []
    top = max(scores)
    exps = [math.exp(x - top) for x in scores]
    total = sum(exps)
    return [x / total for x in exps]


def nbest_answers(context: str, spans: list[tuple[float, float, float, int, int]], null: tuple[float, float],
                  n_best: int, with_null: bool) -> tuple[dict, ...]:
    """The question's n-best list: spans of all its windows by score, text cut from the context, duplicates
    of a text dropped, at most `n_best`; for v2.0 the null answer "" competes (added at the end when it did
    not make the list, as Google does). Probabilities are a softmax over the list."""
    candidates = list(spans)
    if with_null:
        candidates.append((null[0] + null[1], null[0], null[1], -1, -1))
    candidates.sort(key=lambda c: c[0], reverse=True)  # stable: ties keep window order
    entries: list[tuple[str, float, float]] = []
    seen: set[str] = set()
    for _, start_logit, end_logit, a, b in candidates:
        if len(entries) >= n_best:
            break
        text = "" if a < 0 else context[a:b]
        if (a >= 0 and not text) or text in seen:
            continue
        seen.add(text)
        entries.append((text, start_logit, end_logit))
    if with_null and "" not in seen:
        entries.append(("", null[0], null[1]))
    probs = _softmax([s + e for _, s, e in entries])
    return tuple({"text": t, "probability": p, "start_logit": s, "end_logit": e}
                 for (t, s, e), p in zip(entries, probs))


class SquadDecoder:
    """Streams window logits into per-question predictions: each window's candidate spans are kept (not its
    logits) until the question's last window arrives, then the question is decided and forgotten."""

    def __init__(self, spec: "SquadTask", examples: Sequence[SquadExample], features: Sequence[Feature]):
        self.spec, self.examples, self.features = spec, examples, features
        self._pending: dict[int, dict] = {}

    def add(self, feature_index: int, start_logits: np.ndarray, end_logits: np.ndarray
            ) -> tuple[SquadExample, SquadPrediction] | None:
        f = self.features[feature_index]
        state = self._pending.setdefault(f["example_index"], {"spans": [], "null": None, "seen": 0,
                                                                "fallback": None})
        spans = window_spans(start_logits, end_logits, f, self.spec.n_best_size, self.spec.max_answer_length)
        state["spans"].extend(spans)
        if not spans:
            alt = best_span_exhaustive(start_logits, end_logits, f, self.spec.max_answer_length)
            if alt is not None and (state["fallback"] is None or alt[0] > state["fallback"][0]):
                state["fallback"] = alt
        null = (float(start_logits[CLS_INDEX]), float(end_logits[CLS_INDEX]))
        if state["null"] is None or sum(null) < sum(state["null"]):
            state["null"] = null
        state["seen"] += 1
        if state["seen"] < f["num_windows"]:
            return None
        del self._pending[f["example_index"]]
        example = self.examples[f["example_index"]]
        spans = state["spans"] or ([state["fallback"]] if state["fallback"] else [])
        nbest = nbest_answers(example.context, spans, state["null"], self.spec.n_best_size, self.spec.version2)
        best = next((e for e in nbest if e["text"]), None)
        text, score = (best["text"], best["start_logit"] + best["end_logit"]) if best else ("", -math.inf)
        return example, SquadPrediction(text, score, sum(state["null"]), nbest)


# ================================================================================================ scoring
def _golds(example: SquadExample) -> list[str]:
    return [a.text for a in example.answers or ()]


def v2_report(examples: Sequence[SquadExample], non_null: Mapping[str, str], null_odds: Mapping[str, float],
              threshold: float | None = None) -> tuple[float, dict[str, str], dict[str, float]]:
    """The one-step v2.0 decision: (threshold, final predictions, official report in percent).

    The threshold is `best_f1_thresh` of the official script run on the best non-null answers with the null
    score differences as no-answer values (the threshold maximising F1 on this set), unless given. Final
    answer: "" when null - best > threshold, else the best span. The report is the official scores of the
    final answers (exact, f1, HasAns_*, NoAns_*) plus best_exact/best_f1 with their thresholds and
    `null_score_diff_threshold`, the threshold applied."""
    has_ans = {ex.guid: bool(ex.answers) for ex in examples}
    golds = {ex.guid: _golds(ex) for ex in examples}
    raw = {q: squad_metrics.score_v2(non_null[q], golds[q]) for q in has_ans}
    tuned = squad_metrics.summarize_v2(non_null, has_ans, {q: r[0] for q, r in raw.items()},
                                       {q: r[1] for q, r in raw.items()}, na_probs=null_odds)
    if threshold is None:
        threshold = tuned["best_f1_thresh"]
    final = {q: "" if null_odds[q] > threshold else non_null[q] for q in has_ans}
    final_raw = {q: squad_metrics.score_v2(final[q], golds[q]) for q in has_ans}
    report = squad_metrics.summarize_v2(final, has_ans, {q: r[0] for q, r in final_raw.items()},
                                        {q: r[1] for q, r in final_raw.items()})
    for key in ("best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"):
        report[key] = tuned[key]
    report["null_score_diff_threshold"] = threshold
    return threshold, final, report


def _as_fraction(report: Mapping[str, float]) -> dict[str, float]:
    """Percent scores -> [0, 1] (the task interface's scale); counts and thresholds unchanged."""
    return {k: (v / 100.0 if not (k.endswith("total") or k.endswith("thresh") or k.endswith("threshold")) else v)
            for k, v in report.items()}


class SquadV1Metric:
    """evaluate-v1.1.py, fed one question at a time: {'exact_match', 'f1'}."""

    def __init__(self):
        self.exact = self.f1 = self.total = 0

    def update(self, example: SquadExample, prediction: SquadPrediction) -> None:
        exact, f1 = squad_metrics.score_v1(prediction.text, _golds(example))
        self.exact += exact
        self.f1 += f1
        self.total += 1

    def compute(self) -> dict[str, float]:
        return _as_fraction({"exact_match": 100.0 * self.exact / self.total, "f1": 100.0 * self.f1 / self.total})


class SquadV2Metric:
    """evaluate-v2.0.py after the one-step threshold (`v2_report`). Keeps a string and a float per question:
    the threshold needs every question's null score difference before any answer is final."""

    def __init__(self, threshold: float | None = None):
        self.threshold = threshold
        self.examples: list[SquadExample] = []
        self.non_null: dict[str, str] = {}
        self.odds: dict[str, float] = {}

    def update(self, example: SquadExample, prediction: SquadPrediction) -> None:
        self.examples.append(example)
        self.non_null[example.guid] = prediction.text
        self.odds[example.guid] = prediction.null_score_diff

    def compute(self) -> dict[str, float]:
        return _as_fraction(v2_report(self.examples, self.non_null, self.odds, self.threshold)[2])


class SquadPredictionWriter(PredictionWriter):
    """The official prediction files: `predictions.json` {id: answer}, `nbest_predictions.json` {id: [n-best
    entries]} (streamed as questions are decided), and for v2.0 `null_odds.json` {id: null - best}, the
    file evaluate-v2.0.py takes with `--na-prob-file`. Splits other than `dev` prefix the names."""

    def __init__(self, out_dir: str | Path, split: str, spec: "SquadTask"):
        self.spec = spec
        self.prefix = "" if split == "dev" else f"{split}_"
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / f"{self.prefix}predictions.json"
        self.nbest_path = self.out_dir / f"{self.prefix}nbest_predictions.json"
        self.null_odds_path = self.out_dir / f"{self.prefix}null_odds.json"
        self.threshold: float | None = None
        self._nbest = None

    def __enter__(self) -> "SquadPredictionWriter":
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._nbest = open(self.nbest_path, "w", encoding="utf-8")
        self._nbest.write("{")
        self._first = True
        self._examples: list[SquadExample] = []
        self._texts: dict[str, str] = {}
        self._odds: dict[str, float] = {}
        return self

    def write(self, example: SquadExample, prediction: SquadPrediction) -> None:
        self._nbest.write(("\n" if self._first else ",\n") + json.dumps(example.guid) + ": "
                          + json.dumps(list(prediction.nbest), ensure_ascii=False))
        self._first = False
        self._examples.append(example)
        self._texts[example.guid] = prediction.text
        self._odds[example.guid] = prediction.null_score_diff

    def __exit__(self, *exc) -> None:
        self._nbest.write("\n}\n")
        self._nbest.close()
        answers = self._texts
        if self.spec.version2:
            self.threshold = self.spec.null_score_diff_threshold
            labelled = bool(self._examples) and all(ex.answers is not None for ex in self._examples)
            if self.threshold is None and labelled:
                self.threshold, answers, _ = v2_report(self._examples, self._texts, self._odds)
            else:
                self.threshold = 0.0 if self.threshold is None else self.threshold  # Google's default
                answers = {q: "" if self._odds[q] > self.threshold else t for q, t in self._texts.items()}
            _write_json(self.null_odds_path, self._odds)
        _write_json(self.path, answers)


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=2)
        f.write("\n")


# ================================================================================================ the task
@dataclass(frozen=True)
class SquadTask(TaskSpec):
    """SQuAD as a `TaskSpec` (see base.py): windows in `featurize`, span decoding in `predictions`."""

    version2: bool = False
    doc_stride: int = 128
    max_query_length: int = 64
    n_best_size: int = 20
    max_answer_length: int = 30  # tokens
    null_score_diff_threshold: float | None = None  # v2.0: None = tuned on the scored set (one step)
    skip_bad_answers: bool = False

    def read(self, data_path, split: str) -> list[SquadExample]:
        path, articles = resolve_split_file(data_path, split)
        return read_squad(path, articles, self.version2, self.skip_bad_answers)

    def featurize(self, examples: Sequence[SquadExample], tokenizer, max_length: int, train: bool
                  ) -> list[Feature]:
        return featurize_squad(examples, tokenizer, max_length, self.doc_stride, self.max_query_length, train)

    @torch.no_grad()
    def predictions(self, model, batches: Iterable, examples: Sequence[SquadExample],
                    features: Sequence[Feature]) -> Iterator[tuple[SquadExample, SquadPrediction]]:
        decoder = SquadDecoder(self, examples, features)
        for batch in batches:
            out = model(**self.model_inputs(batch))
            starts = out.start_logits.float().cpu().numpy()  # (B, T): one batch of logits at a time
            ends = out.end_logits.float().cpu().numpy()
            for row, index in enumerate(batch["feature_index"].tolist()):
                done = decoder.add(index, starts[row], ends[row])
                if done is not None:
                    yield done

    def has_gold(self, example: SquadExample) -> bool:
        return example.answers is not None

    def metric(self):
        return SquadV2Metric(self.null_score_diff_threshold) if self.version2 else SquadV1Metric()

    def prediction_writer(self, out_dir, split: str) -> SquadPredictionWriter:
        return SquadPredictionWriter(out_dir, split, self)


_COMMON = dict(head=default_head("question-answering"), labels=None, main_metric="f1", eval_splits=("dev",),
               test_splits=(), target_keys=("start_positions", "end_positions"), default_max_seq_length=384)
SQUAD = SquadTask(name="squad", version2=False, **_COMMON)
SQUAD2 = SquadTask(name="squad2", version2=True, **_COMMON)

__all__ = ["SQUAD", "SQUAD2", "SquadTask", "SquadExample", "SquadAnswer", "SquadPrediction", "SquadDecoder",
           "SquadV1Metric", "SquadV2Metric", "SquadPredictionWriter", "read_squad", "load_squad_json",
           "examples_from_json", "resolve_split_file", "featurize_squad", "encode_texts", "plan_windows",
           "max_context_owner", "answer_token_span", "window_spans", "nbest_answers", "v2_report"]
