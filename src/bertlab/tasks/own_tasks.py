"""`token-classification`, `question-answering`, `multiple-choice` on the user's own files.

Each is a benchmark task's code (CoNLL NER, SQuAD, SWAG: features, head, metric, prediction files) reading
the files given with `--train` / `--validation` / `--test` instead of a fixed folder layout:

    token-classification   JSON Lines with a word list and a tag list per line (`--tokens-column`,
                           `--tags-column`; default tokens/words and tags/ner_tags), or CoNLL-style text (one
                           `word ... tag` per line, blank line between sentences; any other file name).
                           Tags are discovered in the training file and sorted into id2label; entity-level F1
                           (conlleval's rules) and token accuracy.
    question-answering     SQuAD-format JSON (v1.1 or v2.0, under any file name); unanswerable questions in
                           the training file make it a v2.0 task (no-answer threshold tuned on dev).
    multiple-choice        a table (CSV, TSV, JSONL, ...) with a context column (`--context-column`; default
                           context / sent1 / question / premise), optionally a second segment each choice
                           completes (`--text-pair-column`; default sent2), the choice columns
                           (`--choice-columns a,b,c`; default ending0.. / choice0.. / option0..), and a label
                           column holding the right choice as an index from 0, a choice column's name, or the
                           choice's text. Accuracy.

No `--validation` file: a seeded share of the training file is held out (for QA whole paragraphs, so no
context is in both splits). The saved model's config.json keeps what evaluate / predict need (tags, columns,
SQuAD version).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..models.registry import default_head
from .base import DataError, TaskSpec
from .tables import TAGS_COLUMNS, TOKENS_COLUMNS, SUFFIXES, Table, guess_column, read_table
from .multiple_choice import ChoiceExample, MultipleChoiceTask
from .ner import NerTask, TaggedSentence, read_conll
from .own_splits import InputOptions, SplitFiles, split_rows
from .squad import SquadExample, SquadTask, read_squad

log = logging.getLogger(__name__)


class OwnFiles:
    """What the tasks on the user's files share: the rows read for a run (`splits`, set by `for_run`),
    `read` from them, or -- for `bertlab evaluate` on a saved model -- from the file given."""

    splits: dict[str, tuple | None] | None
    report: dict[str, Any]

    def read_file(self, path: Path, split: str, labels: Sequence[str] | None) -> list:
        raise NotImplementedError

    def read(self, data_path, split: str) -> list:
        if self.splits is not None:
            if self.splits.get(split) is None:
                raise DataError(f"{self.name}: no {split} file given")
            return list(self.splits[split])
        return self.read_file(Path(data_path), split, self.labels)

    def has_split(self, data_path, split: str) -> bool:
        return self.splits.get(split) is not None if self.splits is not None else True

    def describe(self) -> dict[str, Any]:
        return dict(self.report)

    def configured(self, cfg, discover: Callable[[list], tuple[str, ...] | None] = lambda examples: None,
                   group: Callable[[Any], Any] | None = None, **changes) -> TaskSpec:
        """The spec with the run's splits read: train, dev (a file, or held out: `group` keeps rows of one
        group together), test; labels from `discover(train examples)`, checked in dev and test."""
        options: InputOptions = cfg.inputs
        files = SplitFiles.from_options(cfg.data, options)
        spec = dataclasses.replace(self, **changes)
        train = spec.read_file(files.train, "train", None)
        if not train:
            raise DataError(f"{files.train}: no examples")
        labels = discover(train)
        spec = dataclasses.replace(spec, labels=labels) if labels is not None else spec
        report: dict[str, Any] = {"train_file": str(files.train), **({"labels": list(labels)} if labels else {})}
        if files.dev is not None:
            dev = spec.read_file(files.dev, "dev", labels)
            report["dev_file"] = str(files.dev)
        elif group is None:
            train, dev, report["held_out"] = split_rows(train, lambda e: None, options.validation_share, cfg.seed,
                                                        str(files.train))
        else:
            train, dev, report["held_out"] = split_groups(train, group, options.validation_share, cfg.seed,
                                                          str(files.train))
        test = spec.read_file(files.test, "test", labels) if files.test is not None else None
        report["examples"] = {"train": len(train), "dev": len(dev), **({"test": len(test)} if test else {})}
        log.info("%s: %d train / %d dev examples%s", self.name, len(train), len(dev),
                 f", {len(labels)} labels" if labels else "")
        return dataclasses.replace(spec, report=report, splits={"train": tuple(train), "dev": tuple(dev),
                                                                "test": tuple(test) if test is not None else None})


def split_groups(rows: Sequence[Any], group: Callable[[Any], Any], share: float, seed: int,
                 source: str) -> tuple[list, list, dict[str, Any]]:
    """Held-out dev rows by whole groups (QA: paragraphs): a seeded `share` of the groups."""
    keys = list(dict.fromkeys(group(r) for r in rows))
    if len(keys) < 2:
        raise DataError(f"{source}: one paragraph only; too few to hold out a dev split, give --validation FILE")
    held = set(random.Random(seed).sample(keys, min(len(keys) - 1, max(1, round(share * len(keys))))))
    train = [r for r in rows if group(r) not in held]
    dev = [r for r in rows if group(r) in held]
    log.info("no validation file: held out %d of %d paragraphs (%d questions) of %s as the dev split (seed %d)",
             len(held), len(keys), len(dev), source, seed)
    return train, dev, {"held_out_from": source, "share": share, "seed": seed, "train": len(train), "dev": len(dev)}


def _sorted_tags(examples: list[TaggedSentence], source: Path | str) -> tuple[str, ...]:
    tags = tuple(sorted({t for e in examples for t in e.label or ()}))
    if len(tags) < 2:
        raise DataError(f"{source}: the tags hold {len(tags)} distinct value(s) ({', '.join(tags)}); token "
                        "classification needs at least two")
    return tags


# ---------------------------------------------------------------------------------------------- token classification
@dataclass(frozen=True)
class TokenClassificationTask(OwnFiles, NerTask):
    tokens_column: str | None = None
    tags_column: str | None = None
    splits: dict[str, tuple | None] | None = field(default=None, compare=False, repr=False)
    report: dict[str, Any] = field(default_factory=dict, compare=False)

    def for_run(self, cfg) -> "TokenClassificationTask":
        options: InputOptions = cfg.inputs
        return self.configured(cfg, lambda train: _sorted_tags(train, cfg.data), tokens_column=options.tokens_column,
                               tags_column=options.tags_column)

    def with_model_config(self, config) -> "TokenClassificationTask":
        columns = config.extra.get("input_columns") or {}
        return dataclasses.replace(self, labels=tuple(config.id2label[i] for i in sorted(config.id2label)),
                                   tokens_column=columns.get("tokens"), tags_column=columns.get("tags"), splits=None)

    def saved_config(self) -> dict[str, Any]:
        if self.tokens_column or self.tags_column:
            return {"input_columns": {"tokens": self.tokens_column, "tags": self.tags_column}}
        return {}

    def read_file(self, path: Path, split: str, labels: Sequence[str] | None) -> list[TaggedSentence]:
        if SUFFIXES.get(path.suffix.lower()) not in ("jsonl", "json", "parquet"):
            return read_conll(path, split, labels)  # CoNLL-style text
        table = read_table(path)
        words_col = self._column(table, self.tokens_column, TOKENS_COLUMNS, "word list", "--tokens-column")
        tags_col = self._column(table, self.tags_column, TAGS_COLUMNS, "tag list", "--tags-column",
                                optional=split != "train", exclude=(words_col,))
        known = set(labels) if labels is not None else None
        sentences = []
        for row in table.rows:
            words = row.values.get(words_col)
            if not isinstance(words, list) or not all(isinstance(w, str) for w in words) or not words:
                raise table.error(row, f"column {words_col!r} must be a non-empty list of strings")
            tags = row.values.get(tags_col) if tags_col is not None else None
            if tags is not None:
                if not isinstance(tags, list) or len(tags) != len(words):
                    raise table.error(row, f"column {tags_col!r} must be a list of {len(words)} tags, one per word")
                tags = [str(t) for t in tags]
                unknown = [t for t in tags if known is not None and t not in known]
                if unknown:
                    raise table.error(row, f"tag {unknown[0]!r} is not among the training file's tags "
                                           f"({', '.join(labels)})")
            sentences.append(TaggedSentence(f"{split}-{row.line}", tuple(words),
                                            tuple(tags) if tags is not None else None, table.where(row)))
        return sentences

    @staticmethod
    def _column(table: Table, given: str | None, candidates, what: str, flag: str, optional: bool = False,
                exclude=()) -> str | None:
        if given is not None:
            return table.require(given, what) if not optional or given in table.columns else None
        guess = guess_column(table.columns, candidates, exclude)
        if guess is None and not optional:
            raise DataError(f"{table.path}: no {what} column among {', '.join(table.columns)}; name it with {flag}")
        return guess


# ---------------------------------------------------------------------------------------------- question answering
@dataclass(frozen=True)
class QuestionAnsweringTask(OwnFiles, SquadTask):
    splits: dict[str, tuple | None] | None = field(default=None, compare=False, repr=False)
    report: dict[str, Any] = field(default_factory=dict, compare=False)

    def for_run(self, cfg) -> "QuestionAnsweringTask":
        spec = self.configured(cfg, group=lambda e: e.context)
        version2 = any(e.is_impossible for split in ("train", "dev") for e in spec.splits[split])
        spec.report["squad_version"] = "2.0" if version2 else "1.1"
        return dataclasses.replace(spec, version2=version2)

    def with_model_config(self, config) -> "QuestionAnsweringTask":
        return dataclasses.replace(self, version2=bool(config.extra.get("version_2_with_negative")), splits=None)

    def saved_config(self) -> dict[str, Any]:
        return {"version_2_with_negative": self.version2}  # predict / serve may then answer ""

    def read_file(self, path: Path, split: str, labels) -> list[SquadExample]:
        return read_squad(path, None, version2=True, skip_bad_answers=self.skip_bad_answers)


# ---------------------------------------------------------------------------------------------- multiple choice
CONTEXT_COLUMNS = ("context", "sent1", "question", "premise", "prompt", "goal", "stem")
START_COLUMNS = ("sent2", "start")
CHOICE_PATTERNS = (r"ending\d+", r"choice\d+", r"option\d+", r"answer\d+", r"sol\d+", r"[A-E]")
ANSWER_COLUMNS = ("label", "answer", "gold", "correct", "target")


@dataclass(frozen=True)
class ChoiceColumns:
    context: str
    start: str | None
    choices: tuple[str, ...]
    label: str


@dataclass(frozen=True)
class MultipleChoiceFilesTask(OwnFiles, MultipleChoiceTask):
    columns: ChoiceColumns | None = None
    options: InputOptions | None = field(default=None, compare=False, repr=False)
    splits: dict[str, tuple | None] | None = field(default=None, compare=False, repr=False)
    report: dict[str, Any] = field(default_factory=dict, compare=False)

    def for_run(self, cfg) -> "MultipleChoiceFilesTask":
        with_options = dataclasses.replace(self, options=cfg.inputs)
        columns = with_options.resolve_columns(with_options._table(Path(cfg.data)))  # the training file decides
        spec = with_options.configured(cfg, columns=columns)
        spec.report["columns"] = dataclasses.asdict(columns)
        return spec

    def with_model_config(self, config) -> "MultipleChoiceFilesTask":
        saved = config.extra.get("input_columns")
        columns = ChoiceColumns(**{**saved, "choices": tuple(saved["choices"])}) if isinstance(saved, dict) else None
        return dataclasses.replace(self, columns=columns, splits=None)

    def saved_config(self) -> dict[str, Any]:
        return {"input_columns": dataclasses.asdict(self.columns)} if self.columns is not None else {}

    def resolve_columns(self, table: Table) -> ChoiceColumns:
        options = self.options or InputOptions()
        if options.choice_columns:
            choices = tuple(c.strip() for c in options.choice_columns.split(",") if c.strip())
            for c in choices:
                table.require(c, "choice")
        else:
            choices = ()
            for pattern in CHOICE_PATTERNS:
                choices = tuple(c for c in table.columns if re.fullmatch(pattern, c, re.IGNORECASE))
                if len(choices) >= 2:
                    break
            if len(choices) < 2:
                raise DataError(f"{table.path}: no choice columns (ending0, ending1, ... or choice0, ...) among "
                                f"{', '.join(table.columns)}; name them with --choice-columns a,b,c")
            log.info("%s: choice columns %s (guessed; --choice-columns to choose)", table.path, ", ".join(choices))
        context = table.require(options.context_column, "context") if options.context_column else \
            guess_column(table.columns, CONTEXT_COLUMNS, choices)
        if context is None:
            raise DataError(f"{table.path}: no context column among {', '.join(table.columns)}; name it with "
                            "--context-column")
        start = table.require(options.text_pair_column, "second segment") if options.text_pair_column else \
            guess_column(table.columns, START_COLUMNS, (context, *choices))
        label = table.require(options.label_column, "label") if options.label_column else \
            guess_column(table.columns, ANSWER_COLUMNS, (context, *choices))
        if label is None:
            raise DataError(f"{table.path}: no label column among {', '.join(table.columns)}; name it with "
                            "--label-column")
        return ChoiceColumns(context, start, choices, label)

    def read_file(self, path: Path, split: str, labels) -> list[ChoiceExample]:
        table = self._table(path)
        cols = self.columns or self.resolve_columns(table)  # a run's columns are the training file's
        for c in (cols.context, *cols.choices):
            table.require(c, "context" if c == cols.context else "choice")
        examples = []
        for row in table.rows:
            endings = tuple(str(row.values.get(c, "")) for c in cols.choices)
            label = None
            if cols.label in table.columns:
                label = self._answer(row.values.get(cols.label), endings, cols.choices, table, row)
            elif split == "train":
                table.require(cols.label, "label")
            start = str(row.values.get(cols.start) or "") if cols.start else ""
            examples.append(ChoiceExample(f"{split}-{row.line}", str(row.values[cols.context]), start, endings,
                                          label, table.where(row)))
        return examples

    def _table(self, path: Path) -> Table:
        options = self.options or InputOptions()
        return read_table(path, options.format, options.delimiter)

    def _answer(self, value, endings: tuple[str, ...], choices: tuple[str, ...], table: Table, row) -> int:
        """The right choice: an index from 0, a choice column's name, or the choice's text."""
        text = str(value).strip() if value is not None else ""
        if text.lstrip("-").isdigit() and 0 <= int(text) < len(endings):
            return int(text)
        if text in choices:
            return choices.index(text)
        if text and text in endings:
            return endings.index(text)
        raise table.error(row, f"label {text!r} is not a choice index (0-{len(endings) - 1}), a choice column "
                               f"({', '.join(choices)}) or one of the choices' text")


TOKEN_CLASSIFICATION = TokenClassificationTask(name="token-classification", head=default_head("token-classification"),
                                               labels=None, main_metric="f1", default_max_seq_length=256)
QUESTION_ANSWERING = QuestionAnsweringTask(name="question-answering", head=default_head("question-answering"),
                                           labels=None, main_metric="f1", test_splits=("test",),
                                           target_keys=("start_positions", "end_positions"), default_max_seq_length=384)
MULTIPLE_CHOICE = MultipleChoiceFilesTask(name="multiple-choice", head=default_head("multiple-choice"), labels=None,
                                          main_metric="accuracy", default_max_seq_length=128)
