"""Exact search over sparse (SPLADE) vectors: every query-passage dot product, no pruning.

The corpus's vectors (`infer.sparse.SparseRows`, CSR: one row per passage) are cut into blocks of
`CORPUS_BLOCK` passages, each a torch sparse CSR matrix; a block of `QUERY_BLOCK` queries is made dense (Q x V
fp32: 62 MB for 512 queries over a 30,522-word vocabulary) and each corpus block multiplied by it -- for every
passage, the sum over its non-zero terms of its weight times the query's, which is what an inverted index's
term-at-a-time accumulation computes when it skips no posting. Each block keeps its `top_k` best per query; the
best `top_k` of those are the answer: the top-k of a brute-force scan (a test compares it with dense dot
products). Memory: the corpus's non-zero weights (12 bytes each, in memory, not on disk), one dense query block,
and Q x `CORPUS_BLOCK` scores at a time.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ...infer.sparse import SparseRows

QUERY_BLOCK = 512
CORPUS_BLOCK = 16384  # QUERY_BLOCK x CORPUS_BLOCK fp32 scores = 32 MB


def corpus_blocks(corpus: SparseRows, block: int = CORPUS_BLOCK) -> list[tuple[int, torch.Tensor]]:
    """(first row, CSR tensor of the rows) per block of the corpus."""
    out = []
    for start in range(0, len(corpus), block):
        stop = min(start + block, len(corpus))
        a, b = corpus.indptr[start], corpus.indptr[stop]
        part = SparseRows(corpus.indptr[start:stop + 1] - a, corpus.indices[a:b], corpus.data[a:b], corpus.n_cols)
        out.append((start, part.to_torch()))
    return out


@torch.no_grad()
def sparse_search(queries: SparseRows, corpus: SparseRows | list, top_k: int,
                  progress: Callable | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(Q, k) passage indices and scores (dot products) of each query's `top_k` best passages, best first.
    `corpus`: the passages' rows, or `corpus_blocks` of them (made once for several calls)."""
    blocks = corpus_blocks(corpus) if isinstance(corpus, SparseRows) else corpus
    n = sum(int(m.shape[0]) for _, m in blocks)
    k = min(top_k, n)
    out_idx = np.empty((len(queries), k), dtype=np.int64)
    out_scores = np.empty((len(queries), k), dtype=np.float32)
    starts = range(0, len(queries), QUERY_BLOCK)
    for q0 in (progress(starts, len(starts)) if progress else starts):
        q1 = min(q0 + QUERY_BLOCK, len(queries))
        a, b = queries.indptr[q0], queries.indptr[q1]
        dense_t = SparseRows(queries.indptr[q0:q1 + 1] - a, queries.indices[a:b], queries.data[a:b],
                             queries.n_cols).to_torch().to_dense().T.contiguous()  # (V, Qb)
        found_scores, found_idx = [], []
        for c0, matrix in blocks:
            scores = (matrix @ dense_t).T  # (Qb, block): sparse rows x dense columns
            s, i = scores.topk(min(k, scores.shape[1]), dim=1)
            found_scores.append(s)
            found_idx.append(i + c0)
        s, pick = torch.cat(found_scores, 1).topk(k, dim=1)
        out_scores[q0:q1] = s.numpy()
        out_idx[q0:q1] = torch.cat(found_idx, 1).gather(1, pick).numpy()
    return out_idx, out_scores
