"""GLUE and SQuAD as text (T5 §2.4): the formats T5 wrote, STS-B's 0.2 buckets, and scores that come from
the same metric code as the BERT path."""

from __future__ import annotations

import random

import pytest

from bertlab.tasks import TASKS, DataError
from bertlab.tasks.glue import SentenceExample
from bertlab.tasks.text_to_text import (INVALID, STSB_TEXTS, TEXT_FORMATS, format_stsb, render, score,
                                        text_format)


def _ex(a, b=None, label=None):
    return SentenceExample("g", a, b, label, "t:1")


def test_formats_are_t5s():
    # T5 Appendix D and its `glue` preprocessor: the task name, then `field: text` in sorted field order
    cases = {
        "mnli": (_ex("A cat sat.", "An animal sat.", "entailment"),
                 "mnli hypothesis: An animal sat. premise: A cat sat.", "entailment"),
        "qnli": (_ex("Where?", "Here.", "not_entailment"), "qnli question: Where? sentence: Here.", "not_entailment"),
        "cola": (_ex("Him went.", label="0"), "cola sentence: Him went.", "unacceptable"),
        "sst2": (_ex("great film", label="1"), "sst2 sentence: great film", "positive"),
        "mrpc": (_ex("a", "b", "1"), "mrpc sentence1: a sentence2: b", "equivalent"),
        "qqp": (_ex("q1", "q2", "0"), "qqp question1: q1 question2: q2", "not_duplicate"),
        "rte": (_ex("a", "b", "entailment"), "rte sentence1: a sentence2: b", "entailment"),
        "wnli": (_ex("a", "b", "1"), "wnli sentence1: a sentence2: b", "entailment"),
        "stsb": (_ex("a", "b", 3.84), "stsb sentence1: a sentence2: b", "3.8"),
    }
    for task, (example, inputs, target) in cases.items():
        pair, = render(task, [example])
        assert (pair.inputs, pair.target) == (inputs, target), task


def test_every_label_has_a_distinct_word_that_parses_back():
    for task, fmt in TEXT_FORMATS.items():
        if task.startswith("squad") or fmt.regression:
            continue
        words = fmt.label_texts()
        assert len(set(words)) == len(fmt.spec.labels)
        assert [fmt.parse(w) for w in words] == [(label, True) for label in fmt.spec.labels]
        assert fmt.parse("banana") == (INVALID, False)


def test_stsb_buckets_round_trip():
    fmt = text_format("stsb")
    assert STSB_TEXTS[0] == "0.0" and STSB_TEXTS[-1] == "5.0" and len(STSB_TEXTS) == 26
    rng = random.Random(0)
    for _ in range(1000):
        x = rng.uniform(0, 5)
        text = format_stsb(x)
        assert text in STSB_TEXTS
        value, valid = fmt.parse(text)
        assert valid and abs(value - x) <= 0.1 + 1e-9
        assert format_stsb(value) == text  # a bucket maps to itself
    # the nearest 0.2; a tie (2.5 = 12.5 fifths) rounds half to even, as TensorFlow's `tf.round` does
    assert (format_stsb(2.5), format_stsb(2.7), format_stsb(2.69), format_stsb(0.1)) == ("2.4", "2.8", "2.6", "0.0")
    assert fmt.parse("nonsense") == (-1.0, False) and fmt.parse("nan") == (-1.0, False)


def test_glue_scores_are_the_bert_paths(shared_data):
    """Generated label words scored by `score` == the task's own metric fed the same labels."""
    for task, folder in (("mrpc", "MRPC"), ("cola", "CoLA"), ("stsb", "STS-B")):
        spec = TASKS[task]
        examples = spec.read(shared_data / "glue" / folder, "dev")[:300]
        fmt = text_format(task)
        rng = random.Random(1)
        if spec.is_regression:
            predictions = [rng.uniform(0, 5) for _ in examples]
            outputs = [format_stsb(p) for p in predictions]
            predictions = [fmt.parse(o)[0] for o in outputs]
        else:
            predictions = [rng.choice(spec.labels) for _ in examples]
            outputs = [fmt.words[p] for p in predictions]
        reference = spec.metric()
        for e, p in zip(examples, predictions):
            reference.update(e, p)
        result = score(task, examples, outputs)
        assert result.scores == reference.compute() and result.invalid == 0 and result.total == len(examples)


def test_invalid_outputs_count_as_wrong_and_are_counted():
    examples = [_ex("a", "b", "1"), _ex("c", "d", "0"), _ex("e", "f", "1")]
    result = score("mrpc", examples, ["equivalent", "not_equivalent", "maybe"])
    assert result.invalid == 1 and result.total == 3
    assert result.scores["accuracy"] == pytest.approx(2 / 3)
    assert result.report()["invalid_outputs"] == 1


def test_squad_as_text(shared_data):
    spec = TASKS["squad"]
    examples = spec.read(shared_data / "squad" / "dev-v1.1.json", "dev")[:50]
    pairs = render("squad", examples)
    assert pairs[0].inputs == f"question: {examples[0].question} context: {examples[0].context}"
    assert pairs[0].target == examples[0].answers[0].text
    perfect = score("squad", examples, [p.target for p in pairs])
    assert perfect.scores == {"exact_match": 1.0, "f1": 1.0}
    empty = score("squad", examples, ["" for _ in pairs])
    assert empty.scores["exact_match"] == 0.0


def test_unknown_task_is_one_line():
    with pytest.raises(DataError, match="no text-to-text format"):
        text_format("conll2003")
