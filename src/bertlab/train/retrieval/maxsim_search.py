"""Exact MaxSim search (ColBERT) over a corpus whose token vectors live on disk.

`encode_to_disk` embeds the corpus chunk by chunk (`search.CORPUS_CHUNK` documents at a time) and appends each
document's kept token vectors to one file -- float16 (default), float32, or int8 with a scale per vector (127 /
its largest absolute value; the scales in a file beside) -- keeping in memory only the offsets (8 bytes a
document). `maxsim_search` then scores every query against every document: a block of `QUERY_BLOCK` queries
(their vectors as one (queries x query tokens, dim) matrix) times a block of at most `TOKEN_BLOCK` document
vectors read from the memmap, fp32 dot products, each query vector's maximum within each document
(`numpy.maximum.reduceat` over the document's rows), summed over the query's vectors, then a running top-k merge
per query. Memory holds one such block of similarities (32 x 32 x 16,384 fp32 = 64 MB), whatever the corpus;
the result is the top-k of a brute-force scan, equal to `infer.multivector.maxsim` on the same vectors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from ...core.errors import BertlabError
from .search import CORPUS_CHUNK, STORE_DTYPES

QUERY_BLOCK = 32  # queries scored at a time
TOKEN_BLOCK = 16384  # document vectors read from the memmap at a time


class DiskTokenVectors:
    """Documents' token vectors one after another in `path` (the offsets in memory); int8 with scales beside."""

    def __init__(self, path: Path, dim: int, dtype: str = "float16"):
        if dtype not in STORE_DTYPES:
            raise BertlabError(f"unknown vector store {dtype!r}; expected one of {', '.join(STORE_DTYPES)}")
        self.path, self.dim, self.dtype = Path(path), dim, dtype
        self.scales_path = self.path.with_name(self.path.name + ".scales")
        self._file = open(self.path, "wb")
        self._scales = open(self.scales_path, "wb") if dtype == "int8" else None
        self.lengths: list[int] = []
        self.array: np.ndarray | None = None
        self.scales: np.ndarray | None = None

    def append(self, documents: Sequence[np.ndarray]) -> None:
        if any(len(d) == 0 for d in documents):
            raise BertlabError("a document without vectors cannot be scored")  # [CLS] and [D] are always kept
        flat = np.concatenate(documents).astype(np.float32, copy=False)
        if self.dtype == "int8":
            scale = np.maximum(np.abs(flat).max(axis=1), 1e-12) / 127.0
            self._file.write(np.round(flat / scale[:, None]).astype(np.int8).tobytes())
            self._scales.write(scale.astype(np.float32).tobytes())
        else:
            self._file.write(flat.astype(STORE_DTYPES[self.dtype]).tobytes())
        self.lengths += [len(d) for d in documents]

    def finish(self) -> "DiskTokenVectors":
        self._file.close()
        if self._scales is not None:
            self._scales.close()
        self.offsets = np.zeros(len(self.lengths) + 1, dtype=np.int64)
        self.offsets[1:] = np.cumsum(self.lengths)
        total = int(self.offsets[-1])
        self.array = np.memmap(self.path, dtype=STORE_DTYPES[self.dtype], mode="r", shape=(total, self.dim))
        if self.dtype == "int8":
            self.scales = np.memmap(self.scales_path, dtype=np.float32, mode="r", shape=(total,))
        return self

    def __len__(self) -> int:
        return len(self.lengths)

    def blocks(self) -> list[tuple[int, int]]:
        """Document ranges [d0, d1) of at most `TOKEN_BLOCK` vectors each (a longer document alone)."""
        out, d0 = [], 0
        while d0 < len(self):
            d1 = int(np.searchsorted(self.offsets, self.offsets[d0] + TOKEN_BLOCK, side="right")) - 1
            d1 = min(max(d1, d0 + 1), len(self))
            out.append((d0, d1))
            d0 = d1
        return out

    def block(self, d0: int, d1: int) -> torch.Tensor:
        """The vectors of documents d0..d1-1 as one fp32 (tokens, dim) tensor."""
        t0, t1 = int(self.offsets[d0]), int(self.offsets[d1])
        rows = torch.from_numpy(np.array(self.array[t0:t1], dtype=np.float32))  # a copy: the memmap is read-only
        if self.scales is not None:
            rows *= torch.from_numpy(np.array(self.scales[t0:t1]))[:, None]
        return rows

    def close(self) -> None:
        self.array = self.scales = None
        self.path.unlink(missing_ok=True)
        self.scales_path.unlink(missing_ok=True)


def encode_to_disk(embed: Callable[[Sequence[str]], list[np.ndarray]], texts: Sequence[str], dim: int, path: Path,
                   dtype: str = "float16", progress: Callable | None = None) -> DiskTokenVectors:
    """Every document's token vectors into `path`, `CORPUS_CHUNK` documents at a time."""
    store = DiskTokenVectors(path, dim, dtype)
    starts = range(0, len(texts), CORPUS_CHUNK)
    try:
        for start in (progress(starts, len(starts)) if progress else starts):
            store.append(embed(texts[start:start + CORPUS_CHUNK]))
    except BaseException:
        store.finish().close()
        raise
    return store.finish()


@torch.no_grad()
def maxsim_search(queries: Sequence[np.ndarray], corpus: DiskTokenVectors, top_k: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(Q, k) document indices and MaxSim scores of each query's `top_k` best documents, best first."""
    k = min(top_k, len(corpus))
    out_idx = np.empty((len(queries), k), dtype=np.int64)
    out_scores = np.empty((len(queries), k), dtype=np.float32)
    blocks = corpus.blocks()
    for q0 in range(0, len(queries), QUERY_BLOCK):
        group = [torch.from_numpy(np.asarray(q, dtype=np.float32)) for q in queries[q0:q0 + QUERY_BLOCK]]
        q = torch.nn.utils.rnn.pad_sequence(group, batch_first=True)  # zero rows add 0 to every score
        n, s = q.shape[:2]
        flat = q.reshape(n * s, -1)
        best_scores = torch.full((n, 0), float("-inf"))
        best_idx = torch.empty((n, 0), dtype=torch.int64)
        for d0, d1 in blocks:
            sims = (flat @ corpus.block(d0, d1).T).numpy()  # (n * s, tokens)
            starts = corpus.offsets[d0:d1] - corpus.offsets[d0]
            scores = torch.from_numpy(np.maximum.reduceat(sims, starts, axis=1)).view(n, s, -1).sum(1)
            top, i = scores.topk(min(k, scores.shape[1]), dim=1)
            best_scores, order = torch.cat([best_scores, top], 1).topk(min(k, best_scores.shape[1] + top.shape[1]),
                                                                      dim=1)
            best_idx = torch.cat([best_idx, i + d0], 1).gather(1, order)
        out_idx[q0:q0 + n] = best_idx.numpy()
        out_scores[q0:q0 + n] = best_scores.numpy()
    return out_idx, out_scores
