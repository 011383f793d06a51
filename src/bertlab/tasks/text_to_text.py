"""GLUE and SQuAD as text-to-text problems (T5, Raffel et al. 2020, §2.4 and Appendix D).

T5 feeds every task to one model as text and reads every answer back as text:

    "mnli hypothesis: The cat sat. premise: A cat was sitting."   ->  "entailment"
    "stsb sentence1: ... sentence2: ..."                           ->  "3.8"
    "question: Where is it? context: ... it is in Paris ..."      ->  "in Paris"

Input format, as T5's `glue` preprocessor writes it: the task name, then each text field as `name: text`,
the fields in alphabetical order of their names (so MNLI's hypothesis comes before its premise, QNLI's
question before its sentence). The field names and label words are those of the TensorFlow Datasets GLUE
release T5 trained on; our readers (`tasks/glue.py`) keep GLUE's own labels ("0"/"1"), so each task below
maps its labels to T5's words. STS-B's score is rounded to the nearest 0.2 and written with one decimal:
21 classes "0.0" ... "5.0", read back as numbers.

Scoring reuses the task's own metric (`spec.metric()`): a generated text is turned back into the label or
score the BERT path would have predicted, so both paths are scored by the same code. A text that is no
label counts as wrong -- as T5's postprocessors do it, it becomes a prediction of no class (STS-B: -1.0) --
and is counted, so a report can say how many outputs were not valid labels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from .base import DataError
from .glue import GLUE_TASKS, SentenceExample
from .squad import SQUAD, SQUAD2, SquadExample, SquadPrediction

INVALID = "<invalid>"  # the prediction of an output that is no label: wrong for every gold label
STSB_INVALID = -1.0  # T5's `string_to_float` default: an unreadable score


# ================================================================================================ formats
@dataclass(frozen=True)
class GlueTextFormat:
    """How one GLUE task is written as text: its prefix, field names, and label words."""

    task: str  # our task name (a key of GLUE_TASKS)
    fields: tuple[str, ...]  # T5's names of text_a, text_b -- in the order of the example's fields
    words: Mapping[str, str] | None = None  # our label -> T5's word; None: labels are already words

    @property
    def spec(self):
        return GLUE_TASKS[self.task]

    @property
    def regression(self) -> bool:
        return self.spec.is_regression

    def inputs(self, example: SentenceExample) -> str:
        texts = dict(zip(self.fields, (example.text_a, example.text_b)))
        # T5 sorts the field names: `sorted(set(x.keys()) - {"label", "idx"})`
        return " ".join([self.task] + [f"{name}: {texts[name]}" for name in sorted(texts)])

    def target(self, example: SentenceExample) -> str:
        if self.regression:
            return format_stsb(float(example.label))
        return self.words[example.label] if self.words else example.label

    def parse(self, text: str) -> tuple[Any, bool]:
        """(prediction in our label space, whether `text` was a valid label)."""
        text = text.strip()
        if self.regression:
            try:
                value = float(text)
            except ValueError:
                return STSB_INVALID, False
            return (value, True) if math.isfinite(value) else (STSB_INVALID, False)
        labels = {word: label for label, word in self.words.items()} if self.words else \
            {label: label for label in self.spec.labels}
        return (labels[text], True) if text in labels else (INVALID, False)

    def label_texts(self) -> tuple[str, ...]:
        """Every valid target text (STS-B: the 26 rounded scores)."""
        if self.regression:
            return STSB_TEXTS
        return tuple(self.words[label] for label in self.spec.labels) if self.words else self.spec.labels


def format_stsb(score: float) -> str:
    """A similarity score in [0, 5] as T5 writes it: rounded to the nearest 0.2, one decimal."""
    return f"{round(score * 5) / 5:.1f}"


# 0.0, 0.2, ..., 5.0. The paper calls this "a 21-class classification problem"; rounding [0, 5] to steps
# of 0.2 gives 26 values, and 26 is what T5's code produces.
STSB_TEXTS = tuple(f"{i / 5:.1f}" for i in range(26))


@dataclass(frozen=True)
class SquadTextFormat:
    """SQuAD as text (T5 Appendix D): "question: Q context: C" -> the first gold answer's text. SQuAD v2.0,
    which T5 did not use, writes an unanswerable question's target as the word "unanswerable"."""

    task: str  # "squad" or "squad2"
    no_answer: str = "unanswerable"

    @property
    def spec(self):
        return SQUAD2 if self.task == "squad2" else SQUAD

    def inputs(self, example: SquadExample) -> str:
        return f"question: {example.question} context: {example.context}"

    def target(self, example: SquadExample) -> str:
        return example.answers[0].text if example.answers else self.no_answer

    def parse(self, text: str) -> tuple[SquadPrediction, bool]:
        """Every text is a valid answer. v2.0: "unanswerable" is the null answer, told to the metric as a
        null score above the threshold (0) and anything else as one below it."""
        text = text.strip()
        null = self.spec.version2 and text == self.no_answer
        return SquadPrediction(text="" if null else text, score=0.0, null_score=1.0 if null else -1.0,
                               nbest=()), True

    def metric(self):
        # v2.0 with the threshold fixed at 0: the generated text decides, nothing is tuned on the dev set
        return type(self.spec.metric())(0.0) if self.spec.version2 else self.spec.metric()


def _glue(task: str, fields: tuple[str, ...], words: tuple[str, ...] | None = None) -> GlueTextFormat:
    labels = GLUE_TASKS[task].labels
    return GlueTextFormat(task, fields, dict(zip(labels, words)) if words else None)


# T5's field names and label words (the TensorFlow Datasets GLUE release), mapped onto our readers' labels
# in their id order: GLUE's "0"/"1" files -> ("unacceptable", "acceptable") etc.
TEXT_FORMATS: dict[str, GlueTextFormat | SquadTextFormat] = {
    "cola": _glue("cola", ("sentence",), ("unacceptable", "acceptable")),
    "sst2": _glue("sst2", ("sentence",), ("negative", "positive")),
    "mrpc": _glue("mrpc", ("sentence1", "sentence2"), ("not_equivalent", "equivalent")),
    "qqp": _glue("qqp", ("question1", "question2"), ("not_duplicate", "duplicate")),
    "stsb": _glue("stsb", ("sentence1", "sentence2")),
    "mnli": _glue("mnli", ("premise", "hypothesis")),  # labels are words already
    "qnli": _glue("qnli", ("question", "sentence")),
    "rte": _glue("rte", ("sentence1", "sentence2")),
    "wnli": _glue("wnli", ("sentence1", "sentence2"), ("not_entailment", "entailment")),
    "squad": SquadTextFormat("squad"),
    "squad2": SquadTextFormat("squad2"),
}


def text_format(task: str) -> GlueTextFormat | SquadTextFormat:
    """The text-to-text format of `task`, with a one-line error naming the tasks that have one."""
    if task not in TEXT_FORMATS:
        raise DataError(f"task {task!r} has no text-to-text format; expected one of {', '.join(TEXT_FORMATS)}")
    return TEXT_FORMATS[task]


# ================================================================================================ examples
@dataclass(frozen=True)
class TextPair:
    """One example as text: what the encoder reads, what the decoder should write."""

    inputs: str
    target: str | None  # None on unlabelled (test) splits
    example: Any = field(repr=False, compare=False, default=None)


def render(task: str, examples: Iterable[Any]) -> list[TextPair]:
    """`examples` read by the task's own reader (`TASKS[task].read`), written as text pairs."""
    fmt = text_format(task)
    spec = fmt.spec
    return [TextPair(fmt.inputs(e), fmt.target(e) if spec.has_gold(e) else None, e) for e in examples]


# ================================================================================================ scoring
@dataclass
class TextToTextScore:
    """The task's scores on generated texts, and how many texts were no valid label."""

    scores: dict[str, float]
    invalid: int
    total: int

    def report(self) -> dict[str, float]:
        return {**self.scores, "invalid_outputs": self.invalid, "total": self.total}


def score(task: str, examples: Sequence[Any], outputs: Sequence[str]) -> TextToTextScore:
    """Score generated `outputs` (one text per example, in order) with the task's own metric."""
    if len(examples) != len(outputs):
        raise ValueError(f"{len(examples)} examples but {len(outputs)} outputs")
    fmt = text_format(task)
    metric = fmt.metric() if isinstance(fmt, SquadTextFormat) else fmt.spec.metric()
    invalid = total = 0
    for example, text in zip(examples, outputs):
        if not fmt.spec.has_gold(example):
            continue
        prediction, valid = fmt.parse(text)
        metric.update(example, prediction)
        invalid += not valid
        total += 1
    return TextToTextScore(metric.compute() if total else {}, invalid, total)


__all__ = ["TEXT_FORMATS", "GlueTextFormat", "SquadTextFormat", "TextPair", "TextToTextScore", "render", "score",
           "text_format", "format_stsb", "STSB_TEXTS", "INVALID"]
