"""`mine-negatives`: hard negatives for each (anchor, positive) pair, found by an embedding model.

The candidates are the distinct positives of the file (and the passages of `corpus`, when given). Every anchor
(with the model's query prompt) is searched against them exactly (`search.exact_search`, vectors on disk; a
ColBERT folder's token vectors by MaxSim, `maxsim_search`); of its ranked candidates, those that are one of the
anchor's own positives (any row with the same anchor) are skipped, then those ranked before `range_min`, after
`range_max`, or scoring above (1 − `relative_margin`) × the positive's score (a near-duplicate of the positive is
likely a false negative; sentence-transformers' `mine_hard_negatives` filters alike) -- and the first
`num_negatives` left are kept. Out: `anchor, positive, negative_1, ..., negative_n` (the n-tuples mnrl reads;
`triplets` writes one `anchor, positive, negative` row per negative instead, the rows a reranker's BCE reads);
pairs that found fewer than `num_negatives` are dropped and counted.
"""

from __future__ import annotations

import csv
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...core.errors import ConfigError
from ...core.fsio import atomic_write_text
from ...infer.multivector import is_colbert_folder
from ...tasks.retrieval.data import CORPUS_TEXT_COLUMNS
from ...tasks.retrieval.pairs import read_rows
from ...tasks.tables import guess_column, read_table
from . import maxsim_search, search
from ...infer.st_folder import read_settings

log = logging.getLogger(__name__)


@dataclass
class MineConfig:
    """`bertlab mine-negatives`'s settings; the string under each field is its `--help`."""

    model: str | None = None
    """the embedding model that ranks the candidates"""
    train: str | None = None
    """the pairs (anchor, positive; CSV/TSV/JSONL/Parquet)"""
    output: str | None = None
    """the file to write (CSV)"""
    corpus: str | None = None
    """more candidate passages (a text column), beside the file's positives"""
    num_negatives: int = 3
    """negatives per pair"""
    range_min: int = 0
    """skip the best `range-min` candidates (the very top are often unlabelled positives)"""
    range_max: int = 100
    """look no further than this rank"""
    relative_margin: float = 0.05
    """keep a negative only when it scores at most (1 - margin) x the positive's score"""
    triplets: bool = False
    """one (anchor, positive, negative) row per negative instead of one n-tuple row per pair"""
    anchor_column: str | None = None
    """the anchor column (default: anchor, query, question, ...)"""
    positive_column: str | None = None
    """the positive column (default: positive, passage, document, ...)"""
    threads: int | None = None
    """CPU threads (default: torch's)"""
    progress: bool = True
    """progress: a bar on a terminal, a line every 30 s in a log file"""

    def __post_init__(self) -> None:
        if self.num_negatives < 1 or self.range_max < 1 or self.range_min < 0 or self.range_min >= self.range_max:
            raise ConfigError("need num-negatives >= 1 and 0 <= range-min < range-max")
        if not 0 <= self.relative_margin < 1:
            raise ConfigError(f"relative-margin must be in [0, 1), got {self.relative_margin}")


def read_passages(path: str | Path) -> list[str]:
    table = read_table(path)
    column = guess_column(table.columns, CORPUS_TEXT_COLUMNS)
    if column is None:
        raise ConfigError(f"{path}: no text column ({', '.join(CORPUS_TEXT_COLUMNS[:4])}); the file has columns: "
                          f"{', '.join(table.columns)}")
    return [table.text(row, column) for row in table.rows]


def _ranked_dense(cfg: MineConfig, anchors: list[str], own: dict[str, set[int]], candidates: list[str], k: int,
                  tmp: Path) -> tuple[np.ndarray, np.ndarray, list[dict[int, float]]]:
    """(Q, k) best candidates and their scores for each distinct anchor, and each anchor's positives' own scores:
    one vector a text, exact search (cosine or dot, as the folder says)."""
    from ...infer.embeddings import Embedder
    from ...infer.runtime import InferenceOptions

    settings = read_settings(cfg.model)
    settings.check_scored()
    embedder = Embedder.from_pretrained(cfg.model, settings.pooling, settings.scored_normalized,
                                        InferenceOptions(threads=cfg.threads))
    qv = embedder.embed([settings.query_prompt + a for a in anchors])
    store = search.encode_to_disk(lambda t: embedder.embed([settings.passage_prompt + x for x in t]), candidates,
                                  embedder.dim, tmp / "candidates.npy")
    idx, scores = search.exact_search(qv, store, k)
    positive_scores = []
    for q, a in enumerate(anchors):
        vectors = np.stack([store.block(j, j + 1)[0].numpy() for j in sorted(own[a])])
        positive_scores.append(dict(zip(sorted(own[a]), (vectors @ qv[q]).tolist())))
    return idx, scores, positive_scores


def _ranked_colbert(cfg: MineConfig, anchors: list[str], own: dict[str, set[int]], candidates: list[str], k: int,
                    tmp: Path) -> tuple[np.ndarray, np.ndarray, list[dict[int, float]]]:
    """The same for a ColBERT folder: its token vectors (float32 on disk), exact MaxSim search."""
    from ...infer.multivector import ColbertEmbedder, maxsim
    from ...infer.runtime import InferenceOptions

    settings = read_settings(cfg.model)
    embedder = ColbertEmbedder.from_pretrained(cfg.model, InferenceOptions(threads=cfg.threads))
    qv = embedder.embed([settings.query_prompt + a for a in anchors], "query")
    store = maxsim_search.encode_to_disk(
        lambda t: embedder.embed([settings.passage_prompt + x for x in t], "document"), candidates, embedder.dim,
        tmp / "candidates.tokens", "float32")
    try:
        idx, scores = maxsim_search.maxsim_search(qv, store, k)
        positive_scores = []
        for q, a in enumerate(anchors):
            positives = sorted(own[a])
            row = maxsim([torch.from_numpy(qv[q])], [store.block(j, j + 1) for j in positives])[0]
            positive_scores.append(dict(zip(positives, row.tolist())))
    finally:
        store.close()
    return idx, scores, positive_scores


def mine(cfg: MineConfig) -> dict:
    """Write cfg.output (see the module docstring); returns counts."""
    if not (cfg.model and cfg.train and cfg.output):
        raise ConfigError("give --model, --train and --output")
    rows = read_rows(cfg.train, "pairs", cfg.anchor_column, cfg.positive_column, negatives=[])
    anchors, positives = rows.texts["anchor"], rows.texts["positive"]
    candidates = list(dict.fromkeys(positives + (read_passages(cfg.corpus) if cfg.corpus else [])))
    where = {text: i for i, text in enumerate(candidates)}
    own: dict[str, set[int]] = {}
    for a, p in zip(anchors, positives):
        own.setdefault(a, set()).add(where[p])
    distinct = list(own)
    k = min(cfg.range_max + max(len(s) for s in own.values()), len(candidates))
    ranked_by = _ranked_colbert if is_colbert_folder(cfg.model) else _ranked_dense
    with tempfile.TemporaryDirectory() as tmp:
        idx, scores, own_scores = ranked_by(cfg, distinct, own, candidates, k, Path(tmp))
    positive_scores = dict(zip(distinct, own_scores))  # each anchor's positives' own scores (for the margin)
    found: dict[str, list[tuple[int, float]]] = {}
    for q, a in enumerate(distinct):
        ranked = [(int(j), float(s)) for j, s in zip(idx[q], scores[q]) if int(j) not in own[a]]
        found[a] = ranked[cfg.range_min:cfg.range_max]
    out_rows, dropped = [], 0
    for a, p in zip(anchors, positives):
        ceiling = (1 - cfg.relative_margin) * positive_scores[a][where[p]]
        negatives = [candidates[j] for j, s in found[a] if s <= ceiling][:cfg.num_negatives]
        if len(negatives) < cfg.num_negatives:
            dropped += 1
            continue
        if cfg.triplets:
            out_rows += [[a, p, n] for n in negatives]
        else:
            out_rows.append([a, p, *negatives])
    header = ["anchor", "positive", "negative"] if cfg.triplets else \
        ["anchor", "positive", *(f"negative_{i + 1}" for i in range(cfg.num_negatives))]
    import io

    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(header)
    writer.writerows(out_rows)
    atomic_write_text(Path(cfg.output), text.getvalue())
    return {"pairs": len(anchors), "written": len(out_rows), "dropped": dropped, "candidates": len(candidates)}
