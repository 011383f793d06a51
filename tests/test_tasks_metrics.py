"""Task metrics equal the references: GLUE's scikit-learn/SciPy scores, CoNLL's seqeval (= conlleval)."""

from __future__ import annotations

import math
import random

import pytest

from bertlab.tasks.glue import ClassificationMetric, CorrelationMetric, SentenceExample
from bertlab.tasks.metrics import ChunkCounts, ConfusionMatrix, average_ranks, chunks, pearson, spearman

sklearn_metrics = pytest.importorskip("sklearn.metrics")
scipy_stats = pytest.importorskip("scipy.stats")


def _labels(rng: random.Random, n: int, classes=("0", "1"), bias=0.5):
    return [classes[0] if rng.random() < bias else rng.choice(classes) for _ in range(n)]


@pytest.mark.parametrize("seed", range(8))
def test_accuracy_f1_mcc_equal_sklearn(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 300)
    gold, pred = _labels(rng, n, bias=rng.random()), _labels(rng, n, bias=rng.random())
    cm = ConfusionMatrix()
    for g, p in zip(gold, pred):
        cm.add(g, p)
    assert cm.accuracy() == pytest.approx(sklearn_metrics.accuracy_score(gold, pred), abs=1e-12)
    assert cm.f1("1") == pytest.approx(sklearn_metrics.f1_score(gold, pred, pos_label="1", zero_division=0), abs=1e-12)
    assert cm.mcc() == pytest.approx(sklearn_metrics.matthews_corrcoef(gold, pred), abs=1e-12)


@pytest.mark.parametrize("gold,pred", [
    (["1"] * 5, ["1"] * 5),  # one class only: MCC 0 (sklearn), F1 1
    (["0"] * 5, ["0"] * 5),  # no positives anywhere: F1 0
    (["0", "1", "0"], ["0", "0", "0"]),  # constant prediction: MCC 0
    (["0", "1"], ["1", "0"]),  # all wrong: MCC -1
])
@pytest.mark.filterwarnings("ignore:A single label")
def test_metric_edge_cases_equal_sklearn(gold, pred):
    cm = ConfusionMatrix()
    for g, p in zip(gold, pred):
        cm.add(g, p)
    assert cm.mcc() == pytest.approx(sklearn_metrics.matthews_corrcoef(gold, pred), abs=1e-12)
    assert cm.f1("1") == pytest.approx(sklearn_metrics.f1_score(gold, pred, pos_label="1", zero_division=0))


def test_multiclass_mcc_equals_sklearn():  # MNLI-sized label set; CoLA's MCC formula is the K-class one
    rng = random.Random(3)
    classes = ("contradiction", "entailment", "neutral")
    gold, pred = _labels(rng, 500, classes, 0.2), _labels(rng, 500, classes, 0.5)
    cm = ConfusionMatrix()
    for g, p in zip(gold, pred):
        cm.add(g, p)
    assert cm.mcc() == pytest.approx(sklearn_metrics.matthews_corrcoef(gold, pred), abs=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_pearson_spearman_equal_scipy(seed):
    rng = random.Random(seed)
    n = rng.randint(3, 400)
    # STS-B gold scores come in steps of 0.2 (many ties); predictions are continuous, sometimes tied too
    gold = [round(rng.uniform(0, 5) * 5) / 5 for _ in range(n)]
    pred = [g + rng.gauss(0, 1.5) if rng.random() < 0.8 else 2.5 for g in gold]
    assert pearson(pred, gold) == pytest.approx(scipy_stats.pearsonr(pred, gold)[0], abs=1e-10)
    assert spearman(pred, gold) == pytest.approx(scipy_stats.spearmanr(pred, gold)[0], abs=1e-10)
    assert average_ranks(gold) == pytest.approx(list(scipy_stats.rankdata(gold)))


def test_correlation_of_constant_is_nan():
    assert math.isnan(pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))


def test_glue_metric_objects_stream():
    metric = ClassificationMetric(positive="1", mcc=True)
    gold, pred = ["1", "0", "1", "1"], ["1", "1", "1", "0"]
    for g, p in zip(gold, pred):
        metric.update(SentenceExample("x", "a", None, g, "f:1"), p)
    scores = metric.compute()
    assert scores["accuracy"] == 0.5
    assert scores["f1"] == pytest.approx(sklearn_metrics.f1_score(gold, pred, pos_label="1"))
    assert scores["mcc"] == pytest.approx(sklearn_metrics.matthews_corrcoef(gold, pred))
    corr = CorrelationMetric()
    for g, p in [(1.0, 1.2), (2.0, 1.9), (3.0, 3.5), (4.0, 3.0)]:
        corr.update(SentenceExample("x", "a", "b", g, "f:1"), p)
    s = corr.compute()
    assert s["pearson"] == pytest.approx(scipy_stats.pearsonr([1.2, 1.9, 3.5, 3.0], [1, 2, 3, 4])[0])
    assert s["spearman"] == pytest.approx(scipy_stats.spearmanr([1.2, 1.9, 3.5, 3.0], [1, 2, 3, 4])[0])


# ---------------------------------------------------------------------------------------------- NER
seqeval_metrics = pytest.importorskip("seqeval.metrics")

TYPES = ("PER", "ORG", "LOC", "MISC")


def _random_tags(rng: random.Random, n: int, scheme: str) -> list[str]:
    """Tag sequences as found in files and in (imperfect) predictions: `valid2` is clean IOB2, `iob1` uses
    I- to open entities and B- only between two of one type, `noisy` is any mix (I after O, type switches)."""
    tags = []
    for i in range(n):
        r = rng.random()
        if r < 0.5:
            tags.append("O")
            continue
        kind = rng.choice(TYPES)
        prev = tags[-1] if tags else "O"
        if scheme == "noisy":
            tags.append(rng.choice("BI") + "-" + kind)
        elif scheme == "valid2":
            tags.append(f"I-{prev[2:]}" if prev != "O" and rng.random() < 0.6 else f"B-{kind}")
        else:  # iob1
            if prev != "O" and rng.random() < 0.5:
                tags.append(f"I-{prev[2:]}")
            elif prev != "O" and prev[2:] == kind:
                tags.append(f"B-{kind}")
            else:
                tags.append(f"I-{kind}")
    return tags


@pytest.mark.parametrize("scheme", ["valid2", "iob1", "noisy"])
@pytest.mark.parametrize("seed", range(4))
def test_entity_f1_equals_seqeval(scheme, seed):
    rng = random.Random(seed)
    gold = [_random_tags(rng, rng.randint(1, 30), scheme) for _ in range(200)]
    pred = [[t if rng.random() < 0.8 else rng.choice(["O", "B-PER", "I-PER", "I-ORG", "B-LOC"]) for t in s]
            for s in gold]
    counts = ChunkCounts()
    for g, p in zip(gold, pred):
        counts.add(g, p)
    scores = counts.compute()
    assert scores["f1"] == pytest.approx(seqeval_metrics.f1_score(gold, pred), abs=1e-12)
    assert scores["precision"] == pytest.approx(seqeval_metrics.precision_score(gold, pred), abs=1e-12)
    assert scores["recall"] == pytest.approx(seqeval_metrics.recall_score(gold, pred), abs=1e-12)
    assert scores["accuracy"] == pytest.approx(seqeval_metrics.accuracy_score(gold, pred), abs=1e-12)
    per_type = seqeval_metrics.classification_report(gold, pred, output_dict=True, zero_division=0)
    for kind in TYPES:
        if kind in per_type:
            assert scores[f"f1_{kind}"] == pytest.approx(per_type[kind]["f1-score"], abs=1e-12)


def test_chunks_follow_conlleval_rules():
    # IOB2 and the IOB1 spelling of the same entities give the same chunks
    assert chunks(["B-PER", "I-PER", "O", "B-LOC"]) == {("PER", 0, 1), ("LOC", 3, 3)}
    assert chunks(["I-PER", "I-PER", "O", "I-LOC"]) == {("PER", 0, 1), ("LOC", 3, 3)}
    assert chunks(["I-PER", "B-PER"]) == {("PER", 0, 0), ("PER", 1, 1)}  # IOB1: B- splits two of one type
    assert chunks(["B-PER", "I-ORG"]) == {("PER", 0, 0), ("ORG", 1, 1)}  # a type switch opens a new chunk
    assert chunks(["O", "O"]) == set()


def test_ner_f1_on_real_conll_file_equals_seqeval(shared_data):
    """A perturbed copy of the real CoNLL-2003 dev tags, scored by both."""
    from bertlab.tasks import TASKS

    sentences = TASKS["conll2003"].read(shared_data / "conll2003" / "iob2", "dev")
    rng = random.Random(0)
    gold = [list(s.label) for s in sentences]
    pred = [[t if rng.random() < 0.9 else rng.choice(TASKS["conll2003"].labels) for t in s] for s in gold]
    counts = ChunkCounts()
    for g, p in zip(gold, pred):
        counts.add(g, p)
    assert counts.compute()["f1"] == pytest.approx(seqeval_metrics.f1_score(gold, pred), abs=1e-12)
