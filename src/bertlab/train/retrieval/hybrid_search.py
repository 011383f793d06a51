"""Exact search with a BGE-M3 model's outputs -- dense, sparse, ColBERT -- and their hybrid (`infer.bge_m3`).

`encode_corpus` runs the encoder once per chunk of passages and keeps each output asked for where the
single-output searches keep it: the dense vectors in a memmap (`search.DiskVectors`), the lexical weights as CSR
rows in memory (`sparse_search`), the ColBERT vectors on disk (`maxsim_search.DiskTokenVectors`). `search_all`
then scores each block of queries against every passage with each output -- dot products of the dense vectors,
dot products of the lexical weights (FlagEmbedding's lexical matching score), MaxSim divided by the query's
vector count (its `colbert_score`) -- and ranks by each; with all three it also ranks by their hybrid
(`bge_m3.hybrid`) over every passage, with no candidate cut-off, so the hybrid's top-k is a brute-force scan's.
Memory: what the searches hold, plus, for the hybrid, a block of queries x passages fp32 scores per output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ...infer.bge_m3 import BgeM3Encoder, hybrid
from ...infer.sparse import SparseRows
from . import maxsim_search, search, sparse_search

QUERY_BLOCK = 64  # queries scored at a time for the hybrid: 64 x passages fp32 scores per output


@dataclass
class M3Corpus:
    """A corpus's outputs, each where its search reads it (None: not asked for)."""

    size: int
    dense: search.DiskVectors | None = None
    sparse: list = field(default_factory=list)  # sparse_search.corpus_blocks
    colbert: maxsim_search.DiskTokenVectors | None = None

    def close(self) -> None:
        if self.colbert is not None:
            self.colbert.close()
        if self.dense is not None:
            self.dense.array = None
            self.dense.path.unlink(missing_ok=True)
            self.dense.path.with_suffix(".scales.npy").unlink(missing_ok=True)


def encode_corpus(encoder: BgeM3Encoder, texts: Sequence[str], outputs: Sequence[str], work_dir: Path,
                  store: str = "float16", progress: Callable | None = None) -> M3Corpus:
    """Every passage's outputs, `search.CORPUS_CHUNK` passages per encoder pass."""
    corpus = M3Corpus(len(texts))
    if "dense" in outputs:
        corpus.dense = search.DiskVectors(work_dir / "corpus.dense.npy", (len(texts), encoder.dim), store)
    if "colbert" in outputs:
        corpus.colbert = maxsim_search.DiskTokenVectors(work_dir / "corpus.tokens", encoder.colbert_dim, store)
    sparse_parts: list[SparseRows] = []
    starts = range(0, len(texts), search.CORPUS_CHUNK)
    try:
        for start in (progress(starts, len(starts)) if progress else starts):
            out = encoder.encode(texts[start:start + search.CORPUS_CHUNK], outputs)
            if corpus.dense is not None:
                corpus.dense.write(start, out.dense)
            if out.sparse is not None:
                sparse_parts.append(out.sparse)
            if corpus.colbert is not None:
                corpus.colbert.append(out.colbert)
    except BaseException:
        if corpus.colbert is not None:
            corpus.colbert.finish()
        corpus.close()
        raise
    if corpus.dense is not None:
        corpus.dense.flush()
    if corpus.colbert is not None:
        corpus.colbert.finish()
    if "sparse" in outputs:
        corpus.sparse = sparse_search.corpus_blocks(SparseRows.concat(sparse_parts, encoder.vocab_size))
    return corpus


def _ranked(scores: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    s, i = scores.topk(k, dim=1)
    return i.numpy(), s.numpy()


def _full(idx: np.ndarray, scores: np.ndarray, size: int) -> torch.Tensor:
    """(Q, size) scores from every passage's (index, score) of a search asked for all of them."""
    out = torch.empty((len(idx), size), dtype=torch.float32)
    out.scatter_(1, torch.from_numpy(idx), torch.from_numpy(scores))
    return out


def search_queries(encoder: BgeM3Encoder, queries: Sequence[str], corpus: M3Corpus, outputs: Sequence[str],
                   top_k: int, weights: Sequence[float]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Output name (and "hybrid" with all three) -> (Q, k) passage indices and scores, best first."""
    out = encoder.encode(queries, outputs)
    k = min(top_k, corpus.size)
    every = len(outputs) == 3  # the hybrid needs each output's score of every passage
    want = corpus.size if every else k
    hits: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if "dense" in outputs:
        hits["dense"] = search.exact_search(out.dense, corpus.dense, want)
    if "sparse" in outputs:
        hits["sparse"] = sparse_search.sparse_search(out.sparse, corpus.sparse, want)
    if "colbert" in outputs:
        idx, scores = maxsim_search.maxsim_search(out.colbert, corpus.colbert, want)
        counts = np.array([max(len(q), 1) for q in out.colbert], dtype=np.float32)[:, None]
        hits["colbert"] = (idx, scores / counts)  # colbert_score: MaxSim over the query's vector count
    if not every:
        return hits
    full = {name: _full(*hits[name], corpus.size) for name in ("dense", "sparse", "colbert")}
    ranked = {name: _ranked(full[name], k) for name in full}
    ranked["hybrid"] = _ranked(hybrid(full["dense"], full["sparse"], full["colbert"], weights), k)
    return ranked


def search_all(encoder: BgeM3Encoder, queries: Sequence[str], corpus: M3Corpus, outputs: Sequence[str], top_k: int,
               weights: Sequence[float]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """`search_queries` a block of `QUERY_BLOCK` queries at a time, the hits stacked."""
    parts = [search_queries(encoder, queries[q0:q0 + QUERY_BLOCK], corpus, outputs, top_k, weights)
             for q0 in range(0, len(queries), QUERY_BLOCK)]
    if not parts:
        k = min(top_k, corpus.size)
        names = [*outputs, "hybrid"] if len(outputs) == 3 else list(outputs)
        return {n: (np.empty((0, k), dtype=np.int64), np.empty((0, k), dtype=np.float32)) for n in names}
    return {name: (np.concatenate([p[name][0] for p in parts]), np.concatenate([p[name][1] for p in parts]))
            for name in parts[0]}
