"""Scores as GLUE and CoNLL define them, computed from streamed (gold, prediction) pairs.

Each accumulator takes one example at a time (`update`) and keeps only what its score needs: a confusion
matrix for accuracy/F1/MCC, two float lists for correlations (one float per example, never logits), chunk
counts for NER. The formulas are the ones scikit-learn, SciPy and conlleval use, edge cases included
(the tests check equality against them); none of those packages is imported here.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # the text-classification accumulators read an example's label
    from .text_examples import TextExample


# ---------------------------------------------------------------------------------------------- classification
class ConfusionMatrix:
    """Counts (gold, predicted) label pairs; accuracy, binary F1 and Matthews' correlation from them."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()

    def add(self, gold: str, predicted: str) -> None:
        self.counts[gold, predicted] += 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def accuracy(self) -> float:
        correct = sum(n for (g, p), n in self.counts.items() if g == p)
        return correct / self.total if self.total else 0.0

    def f1(self, positive: str) -> float:
        """F1 of the `positive` class (MRPC, QQP: "1"); 0 when there is no true positive (sklearn's zero_division)."""
        tp = self.counts[positive, positive]
        fp = sum(n for (g, p), n in self.counts.items() if p == positive and g != positive)
        fn = sum(n for (g, p), n in self.counts.items() if g == positive and p != positive)
        return 2 * tp / (2 * tp + fp + fn) if tp else 0.0

    def mcc(self) -> float:
        """Matthews correlation coefficient, K-class form (Gorodkin 2004; sklearn's `matthews_corrcoef`):
        (c·s − Σ_k p_k t_k) / sqrt((s² − Σ p_k²)(s² − Σ t_k²)), 0 when either factor is 0 (CoLA's metric)."""
        s = self.total
        c = sum(n for (g, p), n in self.counts.items() if g == p)
        t, p = Counter(), Counter()  # true and predicted counts per class
        for (gold, pred), n in self.counts.items():
            t[gold] += n
            p[pred] += n
        classes = set(t) | set(p)
        cov_ytyp = c * s - sum(p[k] * t[k] for k in classes)
        cov_ypyp = s * s - sum(p[k] ** 2 for k in classes)
        cov_ytyt = s * s - sum(t[k] ** 2 for k in classes)
        if cov_ypyp * cov_ytyt == 0:
            return 0.0
        return cov_ytyp / math.sqrt(cov_ypyp * cov_ytyt)


# ---------------------------------------------------------------------------------------------- correlations
def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson's r (SciPy's `pearsonr`); nan when either side is constant."""
    n = len(x)
    if n < 2:
        return float("nan")
    mx, my = math.fsum(x) / n, math.fsum(y) / n
    dx = [a - mx for a in x]
    dy = [b - my for b in y]
    sxy = math.fsum(a * b for a, b in zip(dx, dy))
    sxx = math.fsum(a * a for a in dx)
    syy = math.fsum(b * b for b in dy)
    if sxx == 0 or syy == 0:
        return float("nan")
    return max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))


def average_ranks(values: Sequence[float]) -> list[float]:
    """Ranks from 1, ties sharing the mean of the ranks they span (SciPy's `rankdata(method="average")`)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho = Pearson's r of the average ranks (SciPy's `spearmanr`)."""
    return pearson(average_ranks(x), average_ranks(y))


# ---------------------------------------------------------------------------------------------- NER chunks
def _split_tag(tag: str) -> tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); 'O' -> ('O', ''); a bare type 'PER' (no prefix) is an inside tag, as conlleval."""
    if tag == "O":
        return "O", ""
    prefix, sep, kind = tag.partition("-")
    if sep and prefix in ("B", "I", "E", "S"):
        return prefix, kind
    return "I", tag


def _end_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    """conlleval's endOfChunk: does a chunk end between the previous token and this one?"""
    return (
        prev_tag in ("E", "S")
        or (prev_tag in ("B", "I") and tag in ("B", "S", "O"))
        or (prev_tag != "O" and prev_type != type_)
    )


def _start_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    """conlleval's startOfChunk: does a chunk start at this token? (I-X after O or after another type starts
    one, which is why the same logic reads IOB1, IOB2 and IOBES files.)"""
    return (
        tag in ("B", "S")
        or (tag in ("I", "E") and prev_tag in ("E", "S", "O"))
        or (tag != "O" and prev_type != type_)
    )


def chunks(tags: Sequence[str]) -> set[tuple[str, int, int]]:
    """The entities of one sentence as (type, first, last) token spans, by conlleval's rules."""
    found: set[tuple[str, int, int]] = set()
    prev_tag, prev_type, start = "O", "", None
    for i, tag in enumerate([*tags, "O"]):  # the trailing O closes a chunk that runs to the end
        t, kind = _split_tag(tag)
        if start is not None and _end_of_chunk(prev_tag, t, prev_type, kind):
            found.add((prev_type, start, i - 1))
            start = None
        if _start_of_chunk(prev_tag, t, prev_type, kind):
            start = i
        prev_tag, prev_type = t, kind
    return found


class ChunkCounts:
    """Entity-level micro precision/recall/F1 over sentences (conlleval's and seqeval's default mode): an
    entity is correct when its type, first and last token all match."""

    def __init__(self) -> None:
        self.correct: Counter[str] = Counter()
        self.gold: Counter[str] = Counter()
        self.predicted: Counter[str] = Counter()
        self.tokens = 0
        self.tokens_correct = 0

    def add(self, gold: Sequence[str], predicted: Sequence[str]) -> None:
        if len(gold) != len(predicted):
            raise ValueError(f"{len(gold)} gold tags but {len(predicted)} predicted")
        g, p = chunks(gold), chunks(predicted)
        for kind, *_ in g:
            self.gold[kind] += 1
        for kind, *_ in p:
            self.predicted[kind] += 1
        for kind, *_ in g & p:
            self.correct[kind] += 1
        self.tokens += len(gold)
        self.tokens_correct += sum(a == b for a, b in zip(gold, predicted))

    @staticmethod
    def _prf(correct: int, gold: int, predicted: int) -> tuple[float, float, float]:
        precision = correct / predicted if predicted else 0.0
        recall = correct / gold if gold else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return precision, recall, f1

    def compute(self) -> dict[str, float]:
        p, r, f = self._prf(sum(self.correct.values()), sum(self.gold.values()), sum(self.predicted.values()))
        scores = {"f1": f, "precision": p, "recall": r,
                  "accuracy": self.tokens_correct / self.tokens if self.tokens else 0.0}
        for kind in sorted(set(self.gold) | set(self.predicted)):
            scores[f"f1_{kind}"] = self._prf(self.correct[kind], self.gold[kind], self.predicted[kind])[2]
        return scores


# ---------------------------------------------------------------------------------------------- label sets
class LabelCounts:
    """Per-label true/false positives and false negatives over examples whose gold and predicted answers are
    SETS of labels (multi-label; a single-label answer is a set of one). Micro F1 pools the counts over
    labels, macro F1 averages the per-label F1s; both as scikit-learn's `f1_score(average="micro"/"macro")`
    on the same predictions (a label with no gold and no predicted occurrence scores 0, its zero_division)."""

    def __init__(self) -> None:
        self.tp: Counter[str] = Counter()
        self.fp: Counter[str] = Counter()
        self.fn: Counter[str] = Counter()
        self.support: Counter[str] = Counter()
        self.examples = 0
        self.exact = 0

    def add(self, gold: set[str] | frozenset[str], predicted: set[str] | frozenset[str]) -> None:
        for label in gold & predicted:
            self.tp[label] += 1
        for label in predicted - gold:
            self.fp[label] += 1
        for label in gold - predicted:
            self.fn[label] += 1
        for label in gold:
            self.support[label] += 1
        self.examples += 1
        self.exact += gold == predicted

    @staticmethod
    def _f1(tp: int, fp: int, fn: int) -> float:
        return 2 * tp / (2 * tp + fp + fn) if tp else 0.0

    def f1(self, label: str) -> float:
        return self._f1(self.tp[label], self.fp[label], self.fn[label])

    def micro_f1(self) -> float:
        return self._f1(sum(self.tp.values()), sum(self.fp.values()), sum(self.fn.values()))

    def macro_f1(self, labels: Sequence[str]) -> float:
        return math.fsum(self.f1(label) for label in labels) / len(labels) if labels else 0.0

    def report(self, labels: Sequence[str]) -> dict[str, float]:
        """Per-label precision, recall, F1 and gold count (`f1_LABEL`, ...), as scikit-learn's
        `classification_report`."""
        scores: dict[str, float] = {}
        for label in labels:
            tp, fp, fn = self.tp[label], self.fp[label], self.fn[label]
            scores[f"precision_{label}"] = tp / (tp + fp) if tp + fp else 0.0
            scores[f"recall_{label}"] = tp / (tp + fn) if tp + fn else 0.0
            scores[f"f1_{label}"] = self._f1(tp, fp, fn)
            scores[f"support_{label}"] = float(self.support[label])
        return scores


PER_LABEL_PREFIXES = ("precision_", "recall_", "f1_", "support_")  # `LabelCounts.report`'s keys


def brief_scores(scores: dict, per_label: int = 20) -> dict:
    """One split's scores (metric -> value) for a log line or the console: per-label scores dropped where
    there are more than `per_label` labels (they stay in metrics.json), with a count saying so."""
    labelled = [k for k in scores if k.startswith("f1_")]
    if len(labelled) <= per_label:
        return scores
    kept = {k: v for k, v in scores.items() if not k.startswith(PER_LABEL_PREFIXES)}
    return {**kept, "per_label_scores": f"{len(labelled)} labels: in metrics.json"}


THRESHOLDS = tuple(round(0.05 * k, 2) for k in range(1, 20))  # 0.05 ... 0.95, tried when tuning on dev


def multi_label_sets(probabilities: Sequence[Sequence[float]], labels: Sequence[str],
                     threshold: float) -> list[frozenset[str]]:
    """The labels whose probability is over `threshold`, per example."""
    return [frozenset(label for label, p in zip(labels, probs) if p > threshold) for probs in probabilities]


def tune_threshold(gold: Sequence[frozenset[str]], probabilities: Sequence[Sequence[float]],
                   labels: Sequence[str], candidates: Sequence[float] = THRESHOLDS) -> float:
    """The probability threshold of `candidates` with the best micro F1 on these examples (ties: the one
    nearest 0.5), the one global threshold a multi-label classifier is then used with."""
    def micro(threshold: float) -> float:
        counts = LabelCounts()
        for g, p in zip(gold, multi_label_sets(probabilities, labels, threshold)):
            counts.add(g, p)
        return counts.micro_f1()

    return max(candidates, key=lambda t: (micro(t), -abs(t - 0.5)))


# ------------------------------------------------------------- text classification on the user's files
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
