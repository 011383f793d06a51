"""Sentence embeddings: one vector per text from the encoder's last layer, pooled, optionally L2-normalised.

Poolings (over real tokens only, padding excluded):
    cls   h_[CLS]                        the paper's sequence representation
    mean  Σ_t m_t h_t / Σ_t m_t          sentence-transformers' recipe (all-MiniLM-L6-v2 is trained for it)
    max   max_t h_t (per dimension)

`Embedder.embed(texts)` tokenizes, sorts by length into buckets (`batching.py`), runs the encoder under
`inference_mode`, pools in fp32 and returns an (N, H) float32 array in input order. With `mean` pooling
and `normalize=True` on all-MiniLM-L6-v2 this is sentence-transformers' `encode` (tests check it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from ..errors import BertlabError
from . import batching
from .inputs import encode
from .runtime import InferenceOptions, length_limit, load_model, load_tokenizer


def _cls(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return hidden[:, 0]


def _mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)


def _max(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return hidden.masked_fill(~mask.bool().unsqueeze(-1), float("-inf")).amax(1)


# (B, T, H) fp32 hidden states and (B, T) mask -> (B, H)
POOLINGS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {"cls": _cls, "mean": _mean, "max": _max}


class Embedder:
    """Texts -> (N, H) float32 sentence embeddings with a loaded `BertModel` and its tokenizer."""

    def __init__(self, model, tokenizer, pooling: str = "mean", normalize: bool = False,
                 max_length: int | None = None, options: InferenceOptions | None = None):
        if pooling not in POOLINGS:
            raise BertlabError(f"unknown pooling {pooling!r}; expected one of {', '.join(POOLINGS)}")
        self.model, self.tokenizer = model, tokenizer
        self.pooling, self.normalize = pooling, normalize
        self.options = options or InferenceOptions()
        self.max_length = max_length or length_limit(None, model.config, tokenizer, None)
        self.device = next(model.parameters()).device

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, pooling: str = "mean", normalize: bool = False,
                        options: InferenceOptions | None = None) -> "Embedder":
        from ..model import BertModel

        options = options or InferenceOptions()
        model = load_model(BertModel, Path(model_dir), options)
        tokenizer = load_tokenizer(Path(model_dir))
        return cls(model, tokenizer, pooling, normalize, length_limit(model_dir, model.config, tokenizer,
                                                                      options.max_length), options)

    @property
    def dim(self) -> int:
        return self.model.config.hidden_size

    def embed(self, texts: Sequence[str], where=None) -> np.ndarray:
        """(len(texts), H) float32 embeddings, row i for texts[i]."""
        enc = encode(self.tokenizer, texts, self.max_length, self.options.on_long, where=where)
        return self.embed_ids(enc.input_ids)

    def embed_ids(self, input_ids: Sequence[Sequence[int]],
                  token_type_ids: Sequence[Sequence[int]] | None = None) -> np.ndarray:
        """Embeddings of already tokenized rows (with [CLS]/[SEP]); length-bucketed."""
        out = np.empty((len(input_ids), self.dim), dtype=np.float32)
        lengths = [len(r) for r in input_ids]
        for batch in batching.plan_batches(lengths, self.options.max_tokens, self.options.max_batch):
            rows = [input_ids[i] for i in batch]
            types = [token_type_ids[i] for i in batch] if token_type_ids is not None else None
            out[batch] = self._forward(rows, types)
        return out

    @torch.inference_mode()
    def _forward(self, rows, types) -> np.ndarray:
        inputs = batching.model_inputs(rows, types, self.device)
        hidden = self.model(**inputs).last_hidden_state.float()  # (B, T, H)
        pooled = POOLINGS[self.pooling](hidden, inputs["attention_mask"])
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, dim=-1)
        return pooled.cpu().numpy()


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two (N, H) arrays."""
    a = a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=-1, keepdims=True), 1e-12)
    return (a * b).sum(-1)
