"""BGE-M3 (Chen et al., 2024): a dense vector, lexical (sparse) weights and ColBERT vectors from one encoder, and
their scores, computed as FlagEmbedding's `BGEM3FlagModel` computes them.

A BGE-M3 folder is a Hugging Face encoder folder (XLM-R with 8,194 positions for BAAI/bge-m3: 8,192 tokens) with
two files beside it, each a `torch.nn.Linear`'s state dict as FlagEmbedding saves it (`torch.save`):
`sparse_linear.pt` (weight (1, H), bias (1,)) and `colbert_linear.pt` (weight (D, H), bias (D,)). They are read
with `torch.load(weights_only=True)` and their shapes checked against the encoder before use.

For a text's tokens t_0 = <s>, ..., t_{n-1} = </s> and h_t the encoder's last layer (FlagEmbedding's
`EncoderOnlyEmbedderM3Model._dense_embedding` / `_sparse_embedding` / `_colbert_embedding`, and
`M3Embedder.encode_single_device`'s `_process_token_weights` / `_process_colbert_vecs`):

    dense    normalize(h_0)                                            ([CLS] pooling)
    sparse   w_t = ReLU(sparse_linear(h_t)); for each token id, the largest w_t over the positions holding it;
             the ids of the cls, eos, pad and unk tokens and zero weights dropped
    colbert  normalize(colbert_linear(h_t)) for t = 1 .. n-1 (every token after <s>, </s> included)

and for a query q and a passage p (`M3Embedder.compute_lexical_matching_score`, `colbert_score`,
`compute_score_single_device`):

    dense    q . p
    sparse   sum over the ids both hold of w_q * w_p
    colbert  (1 / |q|) sum_i max_j q_i . p_j              (MaxSim averaged over the query's vectors)
    hybrid   (a dense + b sparse + c colbert) / (a + b + c), weights (a, b, c) = (0.4, 0.2, 0.4) by default: the
             BGE-M3 README's `compute_score(..., weights_for_different_modes=[0.4, 0.2, 0.4])`

`normalize=False` leaves the dense and ColBERT vectors unnormalised, as FlagEmbedding's `normalize_embeddings`.
Queries and passages are encoded alike (BGE-M3 needs no instruction). The sparse weights are `SparseRows` (the
SPLADE formats: JSON Lines of {token id: weight}, scipy's CSR `.npz`), the ColBERT vectors one array per text
(the ColBERT formats), so `embed`, `evaluate-retrieval` and `serve` reuse what SPLADE and ColBERT write.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..core.errors import BertlabError
from . import length_buckets
from .embeddings import COLBERT_FILE, SPARSE_FILE, is_bge_m3_folder
from .inputs import encode
from .runtime import InferenceOptions, length_limit, load_encoder, load_tokenizer
from .sparse import SparseRows

OUTPUTS = ("dense", "sparse", "colbert")
VECTOR_CHOICES = (*OUTPUTS, "all")  # `--vectors`: one output, or the three
HYBRID_WEIGHTS = (0.4, 0.2, 0.4)  # dense, sparse, colbert


def outputs_of(vectors: str | None) -> tuple[str, ...]:
    """The outputs `--vectors` names: one of dense, sparse, colbert, or all three."""
    if vectors is None or vectors == "all":
        return OUTPUTS
    if vectors not in OUTPUTS:
        raise BertlabError(f"--vectors must be one of {', '.join(VECTOR_CHOICES)}, got {vectors!r}")
    return (vectors,)


def parse_weights(text: str | Sequence[float]) -> tuple[float, float, float]:
    """The hybrid's three weights (dense, sparse, colbert) from "0.4,0.2,0.4": finite, non-negative, not all 0."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    try:
        weights = tuple(float(p) for p in parts)
    except ValueError:
        weights = ()
    if len(weights) != 3 or not all(math.isfinite(w) and w >= 0 for w in weights) or sum(weights) <= 0:
        raise BertlabError(f"hybrid weights must be three non-negative numbers for dense, sparse and colbert, "
                           f"not all 0 (e.g. 0.4,0.2,0.4); got {text!r}")
    return weights  # type: ignore[return-value]


def read_linear(path: Path, hidden: int, out_features: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A linear layer's (weight, bias) from FlagEmbedding's `torch.save` of its state dict, in fp32: weight
    (out_features, hidden), bias (out_features,); anything else is one line."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # weights_only refuses pickled code; a cut file fails to unpickle
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BertlabError(f"{path}: not a state dict torch.load(weights_only=True) reads ({reason})") from None
    if not isinstance(state, dict) or set(state) != {"weight", "bias"} or \
            not all(isinstance(v, torch.Tensor) and v.is_floating_point() for v in state.values()):
        found = ", ".join(sorted(map(str, state))) if isinstance(state, dict) else type(state).__name__
        raise BertlabError(f"{path}: expected a linear layer's floating-point weight and bias; found {found}")
    weight, bias = state["weight"], state["bias"]
    rows = out_features if out_features is not None else (weight.shape[0] if weight.dim() == 2 else "N")
    if weight.dim() != 2 or weight.shape[1] != hidden or weight.shape[0] != rows or tuple(bias.shape) != (rows,):
        raise BertlabError(f"{path}: weight {tuple(weight.shape)} and bias {tuple(bias.shape)}; the encoder "
                           f"(hidden size {hidden}) needs weight ({rows}, {hidden}) and bias ({rows},)")
    if not (torch.isfinite(weight).all() and torch.isfinite(bias).all()):
        raise BertlabError(f"{path}: the weights hold NaN or infinite values")
    return weight.float(), bias.float()


@dataclass
class M3Output:
    """The outputs of a list of texts, row i for text i; an output not asked for is None."""

    dense: np.ndarray | None  # (N, H) float32
    sparse: SparseRows | None  # lexical weights, token ids ascending
    colbert: list[np.ndarray] | None  # (tokens - 1, D) float32 each

    def split(self) -> list["M3Output"]:
        """One output per text (the service's batcher answers per item)."""
        n = len(self.dense) if self.dense is not None else len(self.sparse) if self.sparse is not None \
            else len(self.colbert)
        return [M3Output(None if self.dense is None else self.dense[k:k + 1],
                         None if self.sparse is None else self.sparse.take([k]),
                         None if self.colbert is None else [self.colbert[k]]) for k in range(n)]

    @staticmethod
    def join(parts: Sequence["M3Output"], n_cols: int) -> "M3Output":
        first = parts[0]
        return M3Output(None if first.dense is None else np.concatenate([p.dense for p in parts]),
                        None if first.sparse is None else SparseRows.concat([p.sparse for p in parts], n_cols),
                        None if first.colbert is None else [v for p in parts for v in p.colbert])


class BgeM3Encoder:
    """Texts -> BGE-M3's outputs (see the module docstring) with a loaded encoder, its tokenizer and the two
    layers."""

    def __init__(self, encoder, tokenizer, sparse_linear: tuple[torch.Tensor, torch.Tensor],
                 colbert_linear: tuple[torch.Tensor, torch.Tensor], max_length: int | None = None,
                 options: InferenceOptions | None = None, normalize: bool = True):
        self.encoder, self.tokenizer, self.normalize = encoder, tokenizer, normalize
        self.options = options or InferenceOptions()
        self.max_length = max_length or length_limit(None, encoder.config, tokenizer, None)
        self.device = next(encoder.parameters()).device
        self.sparse_linear = tuple(t.to(self.device) for t in sparse_linear)
        self.colbert_linear = tuple(t.to(self.device) for t in colbert_linear)
        # `_process_token_weights` drops the tokenizer's cls, eos, pad and unk tokens (a tokenizer without one of
        # them, e.g. BERT's without eos, drops the others)
        self.unused = torch.tensor(sorted({i for i in (getattr(tokenizer, f"{name}_token_id", None)
                                                       for name in ("cls", "eos", "pad", "unk")) if i is not None}),
                                   dtype=torch.long)
        self.pooling = "cls"
        self.top_k: int | None = None  # keep each text's top_k largest lexical weights (None: all)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, options: InferenceOptions | None = None,
                        normalize: bool = True) -> "BgeM3Encoder":
        options = options or InferenceOptions()
        folder = Path(model_dir)
        if not is_bge_m3_folder(folder):
            raise BertlabError(f"{folder}: not a BGE-M3 folder (no {SPARSE_FILE} and {COLBERT_FILE} beside the "
                               "encoder)")
        if options.engine != "bertlab":
            raise BertlabError(f"a BGE-M3 folder runs on --engine bertlab (its sparse and ColBERT layers are not "
                               f"part of an exported encoder), not {options.engine}")
        encoder = load_encoder(folder, options)
        return cls.on_encoder(encoder, load_tokenizer(folder), folder, options, normalize)

    @classmethod
    def on_encoder(cls, encoder, tokenizer, folder: Path, options: InferenceOptions,
                   normalize: bool = True) -> "BgeM3Encoder":
        """The two layers of `folder` on an encoder already loaded from it (the service's)."""
        hidden = int(encoder.config.hidden_size)
        sparse = read_linear(Path(folder) / SPARSE_FILE, hidden, 1)
        colbert = read_linear(Path(folder) / COLBERT_FILE, hidden)
        return cls(encoder, tokenizer, sparse, colbert, length_limit(folder, encoder.config, tokenizer,
                                                                     options.max_seq_length), options, normalize)

    @property
    def dim(self) -> int:
        return int(self.encoder.config.hidden_size)

    @property
    def colbert_dim(self) -> int:
        return int(self.colbert_linear[0].shape[0])

    @property
    def vocab_size(self) -> int:
        return int(self.encoder.config.vocab_size)

    def encode(self, texts: Sequence[str], outputs: Sequence[str] = OUTPUTS, where=None) -> M3Output:
        """The texts' outputs (those in `outputs`), cut to the length limit as FlagEmbedding's tokenizer call
        (`truncation=True`) cuts them, or refused under `--on-long reject`."""
        enc = encode(self.tokenizer, list(texts), self.max_length, self.options.on_long, where=where)
        return self.encode_ids(enc.input_ids, outputs)

    def encode_ids(self, rows: Sequence[Sequence[int]], outputs: Sequence[str] = OUTPUTS) -> M3Output:
        """Outputs of tokenized rows (with <s> and </s>), length-bucketed, in input order."""
        unknown = set(outputs) - set(OUTPUTS)
        if unknown or not outputs:
            raise BertlabError(f"BGE-M3's outputs are {', '.join(OUTPUTS)}; got {', '.join(map(str, outputs))}")
        n = len(rows)
        dense = np.empty((n, self.dim), dtype=np.float32) if "dense" in outputs else None
        lexical: list = [None] * n
        colbert: list = [None] * n
        for batch in length_buckets.plan_batches([len(r) for r in rows], self.options.max_tokens,
                                                 self.options.max_batch, max_waste=self.options.max_waste):
            d, s, c = self._forward([rows[i] for i in batch], outputs)
            if dense is not None:
                dense[batch] = d
            for k, i in enumerate(batch):
                if s is not None:
                    lexical[i] = s[k]
                if c is not None:
                    colbert[i] = c[k]
        return M3Output(dense, lexical_rows(lexical, self.vocab_size) if "sparse" in outputs else None,
                        colbert if "colbert" in outputs else None)

    @torch.inference_mode()
    def _forward(self, rows: list, outputs: Sequence[str]):
        inputs = length_buckets.model_inputs(rows, None, self.device)
        hidden = self.encoder(**inputs).last_hidden_state.float()  # (B, T, H): the layers run in fp32
        lengths = [len(r) for r in rows]
        dense = sparse = colbert = None
        if "dense" in outputs:  # _dense_embedding, pooling "cls"
            dense = hidden[:, 0]
            dense = (F.normalize(dense, dim=-1) if self.normalize else dense).cpu().numpy()
        if "sparse" in outputs:  # _sparse_embedding's token weights, then _process_token_weights
            weights = torch.relu(F.linear(hidden, *self.sparse_linear)).squeeze(-1).cpu()  # (B, T)
            ids = inputs["input_ids"].cpu()
            sparse = [token_weights(ids[k, :t], weights[k, :t], self.unused, self.top_k)
                      for k, t in enumerate(lengths)]
        if "colbert" in outputs:  # _colbert_embedding over the tokens after <s>, then _process_colbert_vecs
            vectors = F.linear(hidden[:, 1:], *self.colbert_linear)
            if self.normalize:
                vectors = F.normalize(vectors, dim=-1)
            vectors = vectors.cpu().numpy()
            colbert = [vectors[k, :t - 1] for k, t in enumerate(lengths)]
        return dense, sparse, colbert


def token_weights(ids: torch.Tensor, weights: torch.Tensor, unused: torch.Tensor,
                  top_k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One text's lexical weights: (token ids ascending, each id's largest positive weight), the unused ids
    dropped (`_process_token_weights`: `if idx not in unused_tokens and w > 0: result[idx] = max(...)`); with
    `top_k`, the `top_k` largest (ties: the lower id), as `embed --top-k` prunes SPLADE's."""
    keep = (weights > 0) & ~torch.isin(ids, unused)
    ids, weights = ids[keep], weights[keep]
    unique, inverse = torch.unique(ids, sorted=True, return_inverse=True)
    best = torch.zeros(len(unique), dtype=weights.dtype).scatter_reduce(0, inverse, weights, "amax",
                                                                        include_self=False)
    unique, best = unique.numpy().astype(np.int32), best.numpy().astype(np.float32)
    if top_k is not None and len(unique) > top_k:
        kept = np.sort(np.lexsort((unique, -best))[:top_k])  # by weight, then id; kept in id order
        unique, best = unique[kept], best[kept]
    return unique, best


def lexical_rows(rows: Sequence[tuple[np.ndarray, np.ndarray]], n_cols: int) -> SparseRows:
    """Texts' (ids, weights) as CSR rows."""
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(ids) for ids, _ in rows], out=indptr[1:])
    if not rows:
        return SparseRows(indptr, np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32), n_cols)
    return SparseRows(indptr, np.concatenate([ids for ids, _ in rows]).astype(np.int32),
                      np.concatenate([w for _, w in rows]).astype(np.float32), n_cols)


# ---------------------------------------------------------------------------------------------- scores
def lexical_score(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """`compute_lexical_matching_score`: the sum over the ids both texts hold of the product of their weights."""
    _, i, j = np.intersect1d(a[0], b[0], assume_unique=True, return_indices=True)
    return float(np.dot(a[1][i].astype(np.float64), b[1][j].astype(np.float64)))


def colbert_score(q: np.ndarray, p: np.ndarray) -> float:
    """`colbert_score`: each query vector's best dot product with the passage's, averaged over the query's."""
    if len(q) == 0 or len(p) == 0:
        return 0.0
    return float((torch.from_numpy(q).float() @ torch.from_numpy(p).float().T).max(-1).values.sum() / len(q))


def hybrid(dense, sparse, colbert, weights: Sequence[float] = HYBRID_WEIGHTS):
    """`compute_score`'s "colbert+sparse+dense": the weighted sum divided by the weights' sum (numbers or arrays)."""
    a, b, c = weights
    return (dense * a + sparse * b + colbert * c) / (a + b + c)


def pair_scores(query: M3Output, passages: M3Output, weights: Sequence[float] = HYBRID_WEIGHTS) -> dict[str, np.ndarray]:
    """The one query's (row 0 of `query`, all three outputs) scores against each passage: dense, sparse,
    colbert and hybrid, (P,) float32 each."""
    n = len(passages.dense)
    q_lex = query.sparse.row(0)
    dense = passages.dense @ query.dense[0]
    sparse = np.array([lexical_score(q_lex, passages.sparse.row(k)) for k in range(n)], dtype=np.float32)
    colbert = np.array([colbert_score(query.colbert[0], passages.colbert[k]) for k in range(n)], dtype=np.float32)
    return {"dense": dense.astype(np.float32), "sparse": sparse, "colbert": colbert,
            "hybrid": hybrid(dense, sparse, colbert, weights).astype(np.float32)}


# ---------------------------------------------------------------------------------------------- views
class LexicalView:
    """BGE-M3's lexical weights with `sparse.SpladeEncoder`'s interface (exact sparse search, /embed_sparse)."""

    def __init__(self, m3: BgeM3Encoder):
        self.m3, self.tokenizer, self.max_length, self.pooling = m3, m3.tokenizer, m3.max_length, "bge-m3 sparse"

    @property
    def dim(self) -> int:
        return self.m3.vocab_size

    def encode(self, texts: Sequence[str], where=None) -> SparseRows:
        return self.m3.encode(texts, ("sparse",), where).sparse

    embed = encode

    def encode_ids(self, rows: Sequence[Sequence[int]]) -> SparseRows:
        return self.m3.encode_ids(rows, ("sparse",)).sparse


class ColbertView:
    """BGE-M3's ColBERT vectors with `multivector.ColbertEmbedder`'s interface; queries and documents alike
    (BGE-M3 marks neither)."""

    def __init__(self, m3: BgeM3Encoder):
        self.m3 = m3

    @property
    def dim(self) -> int:
        return self.m3.colbert_dim

    def embed(self, texts: Sequence[str], kind: str = "document", where=None) -> list[np.ndarray]:
        return self.m3.encode(texts, ("colbert",), where).colbert
