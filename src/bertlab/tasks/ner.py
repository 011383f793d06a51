"""CoNLL-2003 named-entity recognition (Tjong Kim Sang & De Meulder, 2003) as token classification.

Input format (DATA_PATH is a folder with `train.txt`, `valid.txt` (the dev split) and `test.txt`):
  * one token per line, space-separated columns, the word first and the NER tag last (the release has
    `word POS chunk NER`; two-column `word NER` files read the same);
  * a blank line ends a sentence; `-DOCSTART-` lines separate documents and are not sentences;
  * tags are IOB1 (the original release: I-X opens an entity unless it continues one, B-X only separates
    two adjacent entities of one type) or IOB2 (every entity opens with B-X); both are read as they are --
    the label set is the same nine tags, and the chunk rules of conlleval (tasks/metrics.py) find the same
    entities in either;
  * a line with a single column, or with another number of columns than the file's first token line, or
    a tag that is not O / B-TYPE / I-TYPE of the four types, is an error naming file and line.

Features: each word is tokenized on its own (`is_split_into_words`, so a word's pieces never cross a
word boundary, as in Hugging Face's run_ner); each word's label goes on its FIRST word piece, later pieces get -100 (ignored by the loss and by prediction), as in the BERT paper
(section 5.3). A word the window cannot hold (the sentence is longer than `max_length` pieces) or the
tokenizer drops entirely (only control characters) is predicted `O`, and counted in a warning.
Score: entity-level micro F1, identical to conlleval and seqeval's default mode.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..core.labels import IGNORE_INDEX
from ..models.registry import default_head
from .base import Feature, FolderTask, PredictionWriter, data_error, iter_lines
from .metrics import ChunkCounts

log = logging.getLogger(__name__)

CONLL_TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")


@dataclass(frozen=True)
class TaggedSentence:
    guid: str
    words: tuple[str, ...]
    label: tuple[str, ...] | None  # one tag per word; None when the file has no tags
    source: str  # "path:line" of the first word


class NerMetric:
    """Streams sentences into conlleval chunk counts."""

    def __init__(self) -> None:
        self.counts = ChunkCounts()

    def update(self, example: TaggedSentence, prediction: list[str]) -> None:
        self.counts.add(example.label, prediction)

    def compute(self) -> dict[str, float]:
        return self.counts.compute()


class ConllWriter(PredictionWriter):
    """`{split}_predictions.txt` in conlleval's input layout: `word gold predicted` per line, a blank line
    between sentences (the gold column is `O` where unknown), so `conlleval < file` re-scores it."""

    def filename(self, split: str) -> str:
        return f"{split}_predictions.txt"

    def format_line(self, example: TaggedSentence, prediction: list[str]) -> str:
        gold = example.label or ("O",) * len(example.words)
        return "".join(f"{w} {g} {p}\n" for w, g, p in zip(example.words, gold, prediction))


def read_conll(path: Path, split: str, labels: Sequence[str] | None = None) -> list[TaggedSentence]:
    """Sentences of a CoNLL-style file (the format above); a tag outside `labels` (when given) is an error
    naming its line. Also what `token-classification` reads the user's CoNLL files with."""
    known = set(labels) if labels is not None else None
    sentences: list[TaggedSentence] = []
    words: list[str] = []
    tags: list[str] = []
    first_line = 0
    columns: tuple[int, int] | None = None  # (count, line): every token line has as many columns as the first

    def flush() -> None:
        if words:
            sentences.append(TaggedSentence(f"{split}-{len(sentences)}", tuple(words), tuple(tags),
                                            f"{path}:{first_line}"))
            words.clear()
            tags.clear()

    for lineno, line in iter_lines(path):
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            flush()
            continue
        if len(fields) < 2:
            raise data_error(path, lineno, f"expected 'word ... tag' (at least 2 space-separated columns), "
                                           f"got {line.strip()!r}")
        if columns is None:
            columns = (len(fields), lineno)
        elif len(fields) != columns[0]:  # e.g. a word holding a space: its tag would be read from a column
            raise data_error(path, lineno, f"{len(fields)} space-separated columns where line {columns[1]} "
                                           f"has {columns[0]}; got {line.strip()!r}")
        if known is not None and fields[-1] not in known:
            raise data_error(path, lineno, f"unknown tag {fields[-1]!r}; expected one of {', '.join(labels)}")
        if not words:
            first_line = lineno
        words.append(fields[0])
        tags.append(fields[-1])
    flush()
    if not sentences:
        raise data_error(path, None, "no sentences in this file")
    return sentences


@dataclass(frozen=True)
class NerTask(FolderTask):
    # -------------------------------------------------------------------------------------- reading
    def read(self, data_path: str | Path, split: str) -> list[TaggedSentence]:
        return read_conll(self.split_path(data_path, split), split, self.labels)

    # -------------------------------------------------------------------------------------- features
    def featurize(self, examples: Sequence[TaggedSentence], tokenizer, max_length: int,
                  train: bool) -> list[Feature]:
        """Label each word's first piece; record where each word's first piece is (`word_starts`)."""
        encoded = tokenizer([list(e.words) for e in examples], is_split_into_words=True, truncation=True,
                            max_length=max_length, padding=False)
        label2id = {name: i for i, name in enumerate(self.labels)}
        features, lost = [], 0
        for i, e in enumerate(examples):
            word_starts = [-1] * len(e.words)  # token position of each word's first piece; -1: none
            for t, w in enumerate(encoded.word_ids(i)):
                if w is not None and word_starts[w] < 0:
                    word_starts[w] = t
            lost += word_starts.count(-1)
            f: Feature = {"input_ids": list(encoded["input_ids"][i]),
                          "token_type_ids": list(encoded["token_type_ids"][i]),
                          "attention_mask": list(encoded["attention_mask"][i]),
                          "example_index": i, "word_starts": word_starts}
            if e.label is not None:
                labels = [IGNORE_INDEX] * len(f["input_ids"])
                for w, t in enumerate(word_starts):
                    if t >= 0:
                        labels[t] = label2id[e.label[w]]
                f["labels"] = labels
            features.append(f)
        if lost:
            log.warning("%s: %d words have no word piece in the window (sentence longer than %d pieces, or "
                        "no visible characters); they are predicted O", self.name, lost, max_length)
        return features

    # -------------------------------------------------------------------------------------- predictions
    def decode(self, outputs, batch, features) -> list[list[str]]:
        best = outputs.logits.argmax(-1).tolist()  # (B, T): the tag of every piece
        predictions = []
        for row, i in zip(best, batch["feature_index"].tolist()):
            predictions.append([self.labels[row[t]] if t >= 0 else "O" for t in features[i]["word_starts"]])
        return predictions

    def metric(self) -> NerMetric:
        return NerMetric()

    def has_gold(self, example: TaggedSentence) -> bool:
        return example.label is not None

    def prediction_writer(self, out_dir: str | Path, split: str) -> PredictionWriter:
        return ConllWriter(out_dir, split)


CONLL2003 = NerTask(name="conll2003", head=default_head("token-classification"), labels=CONLL_TAGS, main_metric="f1",
                    eval_splits=("dev",), test_splits=("test",), default_max_seq_length=256,
                    files={"train": "train.txt", "dev": "valid.txt", "test": "test.txt"})
