"""Exact dense search over a corpus whose vectors live on disk, and reranking of its top hits.

`encode_to_disk` embeds the corpus chunk by chunk (`CORPUS_CHUNK` passages at a time) into a `numpy.memmap` of
float16 (default), float32, or int8 (each vector scaled by 127 / its largest absolute value; the scale kept
beside), so the process holds one chunk of vectors, never the corpus's: 10⁶ passages of 384 dimensions are
768 MB of float16 on disk and ~25 MB in memory at a time. `exact_search` then scores every query against
every passage -- query blocks x corpus blocks read from the memmap, fp32 dot products, a running top-k merge
per query -- which is exact (no index, no approximation): the top-k of a brute-force scan.

Scores are cosine similarities when the vectors are L2-normalised (the default), dot products otherwise.
`rerank` replaces each query's top `n` scores by a cross-encoder's (`infer.predict.Predictor`, one output).
`write_trec_run` writes the standard TREC run file (`qid Q0 docid rank score tag`), ranked as trec_eval ranks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from ...core.errors import BertlabError
from ...tasks.retrieval.metrics import ranked

log = logging.getLogger(__name__)

CORPUS_CHUNK = 4096  # passages embedded (and written) at a time
QUERY_BLOCK = 512  # queries scored at a time
CORPUS_BLOCK = 16384  # passages read from the memmap at a time: QUERY_BLOCK x CORPUS_BLOCK fp32 scores = 32 MB
STORE_DTYPES = {"float16": np.float16, "float32": np.float32, "int8": np.int8}


class DiskVectors:
    """An (N, H) matrix of vectors in a memmap (`path`), int8 rows with their scales in `path.scales.npy`."""

    def __init__(self, path: Path, shape: tuple[int, int], dtype: str):
        if dtype not in STORE_DTYPES:
            raise BertlabError(f"unknown vector store {dtype!r}; expected one of {', '.join(STORE_DTYPES)}")
        self.path, self.shape, self.dtype = Path(path), shape, dtype
        self.array = np.lib.format.open_memmap(self.path, mode="w+", dtype=STORE_DTYPES[dtype], shape=shape)
        self.scales = np.ones(shape[0], dtype=np.float32) if dtype == "int8" else None

    def write(self, start: int, vectors: np.ndarray) -> None:
        if self.dtype == "int8":
            peak = np.maximum(np.abs(vectors).max(axis=1), 1e-12)
            self.scales[start:start + len(vectors)] = peak / 127.0
            self.array[start:start + len(vectors)] = np.round(vectors * (127.0 / peak)[:, None]).astype(np.int8)
        else:
            self.array[start:start + len(vectors)] = vectors

    def block(self, start: int, stop: int) -> torch.Tensor:
        """Rows start..stop as fp32 (int8 rows scaled back)."""
        rows = torch.from_numpy(np.asarray(self.array[start:stop], dtype=np.float32))
        if self.scales is not None:
            rows *= torch.from_numpy(self.scales[start:stop])[:, None]
        return rows

    def flush(self) -> None:
        self.array.flush()
        if self.scales is not None:
            np.save(self.path.with_suffix(".scales.npy"), self.scales)


def encode_to_disk(embed: Callable[[Sequence[str]], np.ndarray], texts: Sequence[str], dim: int, path: Path,
                   dtype: str = "float16", progress: Callable | None = None) -> DiskVectors:
    """Every text's vector into a memmap at `path`, `CORPUS_CHUNK` texts at a time."""
    store = DiskVectors(path, (len(texts), dim), dtype)
    starts = range(0, len(texts), CORPUS_CHUNK)
    for start in (progress(starts, len(starts)) if progress else starts):
        store.write(start, embed(texts[start:start + CORPUS_CHUNK]))
    store.flush()
    return store


@torch.no_grad()
def exact_search(queries: np.ndarray, corpus: DiskVectors, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """(Q, k) passage indices and scores of each query's `top_k` best passages, best first, by brute force."""
    k = min(top_k, corpus.shape[0])
    out_idx = np.empty((len(queries), k), dtype=np.int64)
    out_scores = np.empty((len(queries), k), dtype=np.float32)
    for q0 in range(0, len(queries), QUERY_BLOCK):
        q = torch.from_numpy(np.ascontiguousarray(queries[q0:q0 + QUERY_BLOCK], dtype=np.float32))
        best_scores = torch.full((len(q), 0), float("-inf"))
        best_idx = torch.empty((len(q), 0), dtype=torch.int64)
        for c0 in range(0, corpus.shape[0], CORPUS_BLOCK):
            scores = q @ corpus.block(c0, c0 + CORPUS_BLOCK).T
            s, i = scores.topk(min(k, scores.shape[1]), dim=1)
            best_scores, order = torch.cat([best_scores, s], 1).topk(min(k, best_scores.shape[1] + s.shape[1]), dim=1)
            best_idx = torch.cat([best_idx, i + c0], 1).gather(1, order)
        out_idx[q0:q0 + len(q)] = best_idx.numpy()
        out_scores[q0:q0 + len(q)] = best_scores.numpy()
    return out_idx, out_scores


class HitsRun(Mapping):
    """A run (query id -> {passage id: score}) over the (Q, k) arrays of `exact_search`, each query's dict made
    when asked for: the metrics and the run file walk it query by query, so memory holds the arrays (12 bytes a
    hit), not Q x k Python objects (~100 bytes a hit)."""

    def __init__(self, query_ids: Sequence[str], corpus_ids: Sequence[str], idx: np.ndarray, scores: np.ndarray):
        self.rows = {qid: i for i, qid in enumerate(query_ids)}
        self.corpus_ids, self.idx, self.scores = corpus_ids, idx, scores

    def __getitem__(self, qid: str) -> dict[str, float]:
        i = self.rows[qid]
        return {self.corpus_ids[j]: s for j, s in zip(self.idx[i].tolist(), self.scores[i].tolist())}

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


def run_from_hits(query_ids: Sequence[str], corpus_ids: Sequence[str], idx: np.ndarray,
                  scores: np.ndarray) -> HitsRun:
    return HitsRun(query_ids, corpus_ids, idx, scores)


def rerank(run: Mapping[str, Mapping[str, float]], queries: dict[str, str], passages: Callable[[str], str],
           score_pairs: Callable[[list[tuple[str, str]]], list[float]], top: int,
           progress: Callable | None = None) -> dict[str, dict[str, float]]:
    """Each query's `top` best passages scored anew by `score_pairs` (a cross-encoder), ranked by those scores;
    the rest of the run is dropped (as BEIR's reranking does)."""
    out: dict[str, dict[str, float]] = {}
    items = list(run.items())
    for qid, hits in (progress(items, len(items)) if progress else items):
        docs = ranked(hits)[:top]
        scores = score_pairs([(queries[qid], passages(doc)) for doc in docs])
        out[qid] = dict(zip(docs, map(float, scores)))
    return out


def write_trec_run(path: Path, run: Mapping[str, Mapping[str, float]], tag: str = "bertlab") -> None:
    """`qid Q0 docid rank score tag` per line, each query's passages in trec_eval's order."""
    with open(path, "w", encoding="utf-8") as f:
        for qid, hits in run.items():
            for rank, doc in enumerate(ranked(hits), 1):
                f.write(f"{qid} Q0 {doc} {rank} {hits[doc]:.9g} {tag}\n")
