"""Training rows of a bi-encoder: pairs, triplets, n-tuples and scored pairs from the user's file.

Any table `tasks.tables` reads (CSV, TSV, JSON Lines, JSON, Parquet). Columns by name, or given:

    pairs / triplets   anchor, positive[, negative | negative_1, negative_2, ...]   (mnrl, cached-mnrl)
                       also query/question and passage/document/answer for anchor and positive
    scored pairs       sentence1, sentence2, score                                  (cosent, cosine)
    margins            query, positive, negative, and a teacher's `margin` (score of the positive minus
                       that of the negative), or `positive_score` and `negative_score`   (margin-mse)

`read_rows` returns the texts by role -- `anchor`, `positive`, `negative_0`, ... -- and the labels (scores or
margins). One-line errors name the file and line of an empty text or a missing score, and a file with fewer
columns than the loss needs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..base import DataError
from ..tables import guess_column, read_table

ANCHOR_COLUMNS = ("anchor", "query", "question", "sentence1", "text1", "sentence_a")
POSITIVE_COLUMNS = ("positive", "pos", "passage", "document", "answer", "sentence2", "text2", "sentence_b")
SCORE_COLUMNS = ("score", "label", "similarity")
MARGIN_COLUMNS = ("margin", "label", "score")


@dataclass
class TrainingRows:
    texts: dict[str, list[str]]  # role -> one text per row: anchor, positive, negative_0, ...
    labels: list[float] | None = None
    columns: dict[str, str] = field(default_factory=dict)  # role -> the file's column

    def __len__(self) -> int:
        return len(self.texts["anchor"])


def read_rows(path: str | Path, kind: str, anchor: str | None = None, positive: str | None = None,
              negatives: list[str] | None = None, score: str | None = None) -> TrainingRows:
    """The rows of `path` for a loss reading `kind` rows: pairs, scored or margin (module docstring)."""
    table = read_table(path)
    cols = table.columns
    anchor = table.require(anchor, "anchor") if anchor else guess_column(cols, ANCHOR_COLUMNS)
    positive = table.require(positive, "positive") if positive else guess_column(cols, POSITIVE_COLUMNS,
                                                                                  exclude=(anchor,) if anchor else ())
    if anchor is None or positive is None:
        if len(cols) < 2:
            raise DataError(f"{table.path}: one column ({', '.join(cols)}); a bi-encoder learns from rows of two "
                            "texts or more: anchor, positive[, negative ...]")
        raise DataError(f"{table.path}: no {'anchor' if anchor is None else 'positive'} column (looked for "
                        f"{', '.join(ANCHOR_COLUMNS if anchor is None else POSITIVE_COLUMNS)}); the file has columns: "
                        f"{', '.join(cols)} -- name them with --anchor-column / --positive-column")
    if negatives is None:
        negatives = sorted((c for c in cols if c.lower().startswith("negative") and "score" not in c.lower()),
                           key=lambda c: (len(c), c)) if kind != "scored" else []
    else:
        negatives = [table.require(c, "negative") for c in negatives]
    label_cols: list[str] = []
    if kind == "candidate-scores":
        label_cols = [table.require(score, "score") if score else guess_column(cols, ("scores",))]
        if label_cols[0] is None:
            raise DataError(f"{table.path}: no teacher scores column (scores); name it with --score-column")
        negatives = [c for c in negatives if c != label_cols[0]]
    elif kind == "scored":
        found = table.require(score, "score") if score else guess_column(cols, SCORE_COLUMNS)
        if found is None:
            raise DataError(f"{table.path}: no score column (score, label) for scored pairs; the file has columns: "
                            f"{', '.join(cols)} -- name it with --score-column")
        label_cols = [found]
    elif kind == "margin":
        if not negatives:
            raise DataError(f"{table.path}: margin-mse needs a negative column beside anchor and positive")
        negatives = negatives[:1]
        found = table.require(score, "margin") if score else guess_column(cols, MARGIN_COLUMNS)
        if found is not None:
            label_cols = [found]
        elif "positive_score" in cols and "negative_score" in cols:
            label_cols = ["positive_score", "negative_score"]
        else:
            raise DataError(f"{table.path}: margin-mse needs a teacher's margin column (margin) or positive_score "
                            f"and negative_score; the file has columns: {', '.join(cols)}")
    roles = {"anchor": anchor, "positive": positive, **{f"negative_{i}": c for i, c in enumerate(negatives)}}
    texts: dict[str, list[str]] = {role: [] for role in roles}
    labels: list[float] | None = [] if label_cols else None
    for row in table.rows:
        for role, column in roles.items():
            text = table.text(row, column)
            if not text.strip():
                raise table.error(row, f"empty text in column {column!r}")
            texts[role].append(text)
        if kind == "candidate-scores":
            labels.append(candidate_scores(table, row, label_cols[0], 1 + len(negatives)))
        elif labels is not None:
            values = []
            for column in label_cols:
                value = row.values.get(column)
                try:
                    values.append(float(value))
                except (TypeError, ValueError):
                    raise table.error(row, f"column {column!r} holds {value!r}, expected a number") from None
                if not math.isfinite(values[-1]):
                    raise table.error(row, f"column {column!r} holds {value!r}, expected a finite number")
            labels.append(values[0] if len(values) == 1 else values[0] - values[1])
    return TrainingRows(texts, labels, roles)


def candidate_scores(table, row, column: str, count: int) -> list[float]:
    """A row's `count` teacher scores from `column`: a list, or a text holding a JSON array or numbers
    separated by commas."""
    value = row.values.get(column)
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text) if text.startswith("[") else [float(v) for v in text.split(",")]
        except ValueError:
            value = None
    try:
        scores = [float(v) for v in value]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise table.error(row, f"column {column!r} holds {row.values.get(column)!r}, expected {count} numbers "
                               "(one per candidate: the positive, then each negative)") from None
    if len(scores) != count or not all(map(math.isfinite, scores)):
        raise table.error(row, f"column {column!r} holds {len(scores)} scores, expected {count} finite numbers "
                               "(one per candidate: the positive, then each negative)")
    return scores
