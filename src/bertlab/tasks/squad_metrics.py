"""SQuAD scoring, re-implemented to give the official scripts' numbers bit for bit.

`evaluate_v1(data, predictions)` is `evaluate-v1.1.py`'s `evaluate`; `evaluate_v2(data, predictions, na_probs,
na_prob_thresh)` is `evaluate-v2.0.py`'s `main` (without its plots). "Bit for bit" constrains the code more
than the rules do: the per-question scores, their Python types (v1.1 sums bools and a literal 0 with floats)
and the order of summation are the scripts' own, so the totals round the same way. `tests/test_tasks_squad.py`
runs both official scripts on the same prediction files and compares every number with `==`.

The two versions differ in more than no-answer handling -- keep them apart:

- v1.1: F1 is 0 when prediction and gold normalise to nothing (no common token); a question without a
  prediction counts in the total with score 0.
- v2.0: F1 (and EM) is 1 when both are empty -- an empty prediction is the answer "no answer"; gold
  answers that normalise to "" are dropped, and a question left with none is unanswerable (gold "");
  a question without a prediction is left out of the overall total (and the HasAns/NoAns splits then fail
  in the official script; here they raise a one-line error).
- v2.0 with `na_probs` (bertlab writes its null-score differences, `null_odds.json`): questions whose
  value exceeds `na_prob_thresh` (default 1.0) are scored as "no answer", and `best_exact`/`best_f1` with
  their thresholds are the best scores over every cut point of the sorted values.
"""

from __future__ import annotations

import collections
import re
import string
from typing import Iterable, Mapping, Sequence

from ..core.errors import BertlabError

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower-case, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace (both scripts)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


# ---------------------------------------------------------------------------------------------- v1.1
def exact_v1(prediction: str, gold: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(gold)


def f1_v1(prediction: str, gold: str) -> float:
    """Token-overlap F1 of the normalised strings; 0 (an int, as in the script) when nothing is shared --
    including when both are empty."""
    return _overlap_f1(normalize_answer(prediction).split(), normalize_answer(gold).split())


def _overlap_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    """Both scripts' F1 of two token lists: 0 (an int) when they share nothing."""
    num_same = sum((collections.Counter(pred_tokens) & collections.Counter(gold_tokens)).values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_tokens)
    recall = 1.0 * num_same / len(gold_tokens)
    return (2 * precision * recall) / (precision + recall)


def score_v1(prediction: str, golds: Sequence[str]) -> tuple[bool, float]:
    """(exact, f1) of one question: the best over its gold answers."""
    return max(exact_v1(prediction, g) for g in golds), max(f1_v1(prediction, g) for g in golds)


def evaluate_v1(data: Sequence[Mapping], predictions: Mapping[str, str]) -> dict[str, float]:
    """`evaluate-v1.1.py`: {'exact_match', 'f1'} in percent over every question of `data` (the file's
    "data" list); a question with no prediction scores 0."""
    f1 = exact_match = total = 0
    for article in data:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                total += 1
                if qa["id"] not in predictions:
                    continue
                exact, f = score_v1(predictions[qa["id"]], [a["text"] for a in qa["answers"]])
                exact_match += exact
                f1 += f
    return {"exact_match": 100.0 * exact_match / total, "f1": 100.0 * f1 / total}


# ---------------------------------------------------------------------------------------------- v2.0
def _tokens_v2(s: str) -> list[str]:
    return normalize_answer(s).split() if s else []


def exact_v2(gold: str, prediction: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(prediction))


def f1_v2(gold: str, prediction: str) -> float:
    """As v1.1, except that when either side is empty the score is 1 if both are, else 0."""
    gold_tokens, pred_tokens = _tokens_v2(gold), _tokens_v2(prediction)
    if len(gold_tokens) == 0 or len(pred_tokens) == 0:
        return int(gold_tokens == pred_tokens)
    return _overlap_f1(pred_tokens, gold_tokens)


def gold_answers_v2(texts: Iterable[str]) -> list[str]:
    """Gold answers that normalise to something; [""] (the no-answer answer) when none do."""
    return [t for t in texts if normalize_answer(t)] or [""]


def score_v2(prediction: str, gold_texts: Iterable[str]) -> tuple[int, float]:
    golds = gold_answers_v2(gold_texts)
    return max(exact_v2(g, prediction) for g in golds), max(f1_v2(g, prediction) for g in golds)


def raw_scores_v2(data: Sequence[Mapping], predictions: Mapping[str, str]
                  ) -> tuple[dict[str, bool], dict[str, int], dict[str, float]]:
    """has_answer for every question, and exact/f1 for every question that has a prediction, in file order."""
    has_ans: dict[str, bool] = {}
    exact: dict[str, int] = {}
    f1: dict[str, float] = {}
    for article in data:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                has_ans[qa["id"]] = bool(qa["answers"])
                if qa["id"] in predictions:
                    exact[qa["id"]], f1[qa["id"]] = score_v2(predictions[qa["id"]],
                                                             [a["text"] for a in qa["answers"]])
    return has_ans, exact, f1


def _apply_threshold(scores: Mapping[str, float], na_probs: Mapping[str, float], has_ans: Mapping[str, bool],
                     thresh: float) -> dict[str, float]:
    """A question whose no-answer value exceeds `thresh` is answered "": right exactly when it has no answer."""
    return {q: float(not has_ans[q]) if na_probs[q] > thresh else s for q, s in scores.items()}


def _eval_dict(exact: Mapping[str, float], f1: Mapping[str, float], qids: Sequence[str] | None = None):
    if not qids:
        total = len(exact)
        return collections.OrderedDict([("exact", 100.0 * sum(exact.values()) / total),
                                        ("f1", 100.0 * sum(f1.values()) / total), ("total", total)])
    missing = [q for q in qids if q not in exact]
    if missing:
        raise BertlabError(f"no prediction for question id {missing[0]} ({len(missing)} question(s) unanswered); "
                           "SQuAD v2.0 scoring needs one for every question")
    total = len(qids)
    return collections.OrderedDict([("exact", 100.0 * sum(exact[k] for k in qids) / total),
                                    ("f1", 100.0 * sum(f1[k] for k in qids) / total), ("total", total)])


def find_best_thresh(predictions: Mapping[str, str], scores: Mapping[str, float], na_probs: Mapping[str, float],
                     has_ans: Mapping[str, bool]) -> tuple[float, float]:
    """(best score in percent, threshold): start from "every question answered ''" and answer questions in
    increasing no-answer value; the threshold is the value at the best point (answer when value <= it)."""
    cur_score = best_score = sum(1 for q in has_ans if not has_ans[q])
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):  # stable: ties keep na_probs' order
        if qid not in scores:
            continue
        if has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1 if predictions[qid] else 0
        cur_score += diff
        if cur_score > best_score:
            best_score = cur_score
            best_thresh = na_probs[qid]
    return 100.0 * best_score / len(scores), best_thresh


def summarize_v2(predictions: Mapping[str, str], has_ans: Mapping[str, bool], exact_raw: Mapping[str, int],
                 f1_raw: Mapping[str, float], na_probs: Mapping[str, float] | None = None,
                 na_prob_thresh: float = 1.0) -> dict[str, float]:
    """The official v2.0 report from per-question raw scores (see `evaluate_v2`)."""
    have_na_probs = na_probs is not None
    if na_probs is None:
        na_probs = {k: 0.0 for k in predictions}
    else:
        missing = [q for q in exact_raw if q not in na_probs]
        if missing:
            raise BertlabError(f"no no-answer value for question id {missing[0]} "
                               f"({len(missing)} question(s) missing from na_probs)")
    exact_t = _apply_threshold(exact_raw, na_probs, has_ans, na_prob_thresh)
    f1_t = _apply_threshold(f1_raw, na_probs, has_ans, na_prob_thresh)
    out = _eval_dict(exact_t, f1_t)
    has_ans_qids = [k for k, v in has_ans.items() if v]
    no_ans_qids = [k for k, v in has_ans.items() if not v]
    if has_ans_qids:
        for k, v in _eval_dict(exact_t, f1_t, has_ans_qids).items():
            out[f"HasAns_{k}"] = v
    if no_ans_qids:
        for k, v in _eval_dict(exact_t, f1_t, no_ans_qids).items():
            out[f"NoAns_{k}"] = v
    if have_na_probs:
        out["best_exact"], out["best_exact_thresh"] = find_best_thresh(predictions, exact_raw, na_probs, has_ans)
        out["best_f1"], out["best_f1_thresh"] = find_best_thresh(predictions, f1_raw, na_probs, has_ans)
    return dict(out)


def evaluate_v2(data: Sequence[Mapping], predictions: Mapping[str, str], na_probs: Mapping[str, float] | None = None,
                na_prob_thresh: float = 1.0) -> dict[str, float]:
    """`evaluate-v2.0.py data.json pred.json [-n na_probs.json] [-t thresh]`: exact, f1, total, HasAns_*,
    NoAns_* (percent), and with `na_probs` best_exact(_thresh), best_f1(_thresh)."""
    has_ans, exact_raw, f1_raw = raw_scores_v2(data, predictions)
    if not exact_raw:
        raise BertlabError("no question of the data set has a prediction")
    return summarize_v2(predictions, has_ans, exact_raw, f1_raw, na_probs, na_prob_thresh)


__all__ = ["normalize_answer", "exact_v1", "f1_v1", "score_v1", "evaluate_v1", "exact_v2", "f1_v2",
           "gold_answers_v2", "score_v2", "raw_scores_v2", "find_best_thresh", "summarize_v2", "evaluate_v2"]
