"""Learned sparse embeddings (SPLADE): one vocabulary-sized, mostly zero vector per text from the masked-LM head.

    w_v = max over real tokens t of log(1 + ReLU(logit_{t,v}))          (Formal et al., SPLADE v2, 2021)

for any family with a masked-LM head (`models/heads.py`: its `vocab_projection()`); padding never counts. The
weights are token ids -> weight: an inverted index (Elasticsearch, OpenSearch, Qdrant, Vespa) stores them as
they are, and the score of a query and a document is the dot product of their vectors.

Memory: the logits of every token over the vocabulary are the big tensor (vocabulary 30,522 x 512 tokens x
batch 32 is 2 GB in fp32), and only their maximum over tokens is kept. Since log(1 + ReLU(x)) rises with x, the
maximum is taken over the raw logits and the activation applied once after, and the projection runs a slice of
token positions at a time (`LOGITS_BUDGET` logits: 64 MB), so a batch's peak beyond the encoder's activations is
one slice of logits plus the (B, V) running maximum and where it was found. Training goes through the same
slices (`_MaxOverTokens`): its backward recomputes nothing and keeps only the position of each maximum, so a
training step too holds one slice of logits (and its gradient) at a time, never (B, T, V).

Outputs (`SparseRows`, CSR: rows in input order, token ids ascending): JSON Lines of {token id: weight} (every
non-zero weight, or the `top_k` largest), and the `.npz` that `scipy.sparse.load_npz` reads (CSR, float32),
written here with numpy alone. A folder saved as a sentence-transformers `SparseEncoder` (MLMTransformer +
SpladePooling) is read as SPLADE (`folder_pooling`).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..core.errors import BertlabError
from . import length_buckets
from .inputs import encode
from .runtime import InferenceOptions, length_limit, load_head, load_tokenizer

SPARSE_POOLINGS = ("splade",)
# logits held at once (fp32: 64 MB); a slice of token positions is cut to fit: batch 32 x vocabulary 30,522 -> 17
# positions at a time
LOGITS_BUDGET = 1 << 24
SPARSE_OUTPUTS = (".jsonl", ".json", ".npz")  # and stdout (JSON Lines)


# ---------------------------------------------------------------------------------------------- the pooling
def _slice_max(x: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, V) fp32 max over the real positions of x · weightᵀ + bias, and the position of each maximum."""
    B, T, _ = x.shape
    best = torch.full((B, weight.shape[0]), float("-inf"), dtype=torch.float32, device=x.device)
    where = torch.zeros((B, weight.shape[0]), dtype=torch.long, device=x.device)
    for t0 in range(0, T, width):
        logits = F.linear(x[:, t0:t0 + width], weight, bias).float()  # (B, width, V): the one big tensor
        logits.masked_fill_(~mask[:, t0:t0 + width, None], float("-inf"))
        value, index = logits.max(dim=1)
        del logits
        better = value > best
        best = torch.where(better, value, best)
        where = torch.where(better, index + t0, where)
    return best, where


class _MaxOverTokens(torch.autograd.Function):
    """max_t (x_t · Wᵀ + b) per vocabulary entry, with a backward that sends each entry's gradient to the one
    position holding its maximum, a slice of positions at a time (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, mask, weight, bias, width):
        best, where = _slice_max(x, mask, weight, bias, width)
        ctx.save_for_backward(x, weight, where)
        ctx.width, ctx.has_bias = width, bias is not None
        kind = x.device.type  # the backward's products run in the forward's autocast precision (bf16 training)
        ctx.autocast = (kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind))
        return best

    @staticmethod
    def backward(ctx, grad):
        x, weight, where = ctx.saved_tensors
        B, T, E = x.shape
        V = weight.shape[0]
        need_x, _, need_w, need_b, _ = ctx.needs_input_grad
        grad = grad.float()
        gx = torch.zeros_like(x) if need_x else None
        gw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        kind, enabled, dtype = ctx.autocast
        for t0 in range(0, T, ctx.width):
            width = min(ctx.width, T - t0)
            inside = (where >= t0) & (where < t0 + width)  # (B, V): entries whose maximum is in this slice
            if not bool(inside.any()):
                continue
            g = torch.zeros((B, width, V), dtype=torch.float32, device=grad.device)
            g.scatter_(1, (where - t0).clamp(0, width - 1).unsqueeze(1), torch.where(inside, grad, 0.0).unsqueeze(1))
            with torch.autocast(kind, dtype=dtype, enabled=enabled):
                if need_x:
                    gx[:, t0:t0 + width] = (g @ weight.float()).to(x.dtype)
                if need_w:
                    gw += (g.reshape(-1, V).T @ x[:, t0:t0 + width].reshape(-1, E).float()).float()
        gb = grad.sum(0).to(weight.dtype) if need_b and ctx.has_bias else None
        return gx, None, gw.to(weight.dtype) if gw is not None else None, gb, None


def max_logits(hidden: torch.Tensor, mask: torch.Tensor, projection, budget: int = LOGITS_BUDGET) -> torch.Tensor:
    """(B, V) fp32: for each vocabulary entry, its largest masked-LM logit over the real tokens of each row.
    `projection` is the head's `VocabProjection`; differentiable (through `_MaxOverTokens`)."""
    x = projection.transform(hidden)
    V = projection.weight.shape[0]
    width = max(1, budget // max(1, x.shape[0] * V))
    mask = mask.bool()
    if torch.is_grad_enabled() and (x.requires_grad or projection.weight.requires_grad):
        return _MaxOverTokens.apply(x, mask, projection.weight, projection.bias, width)
    return _slice_max(x, mask, projection.weight, projection.bias, width)[0]


def splade_vectors(model, inputs: dict[str, torch.Tensor], budget: int = LOGITS_BUDGET) -> torch.Tensor:
    """(B, V) fp32 SPLADE weights of a batch (`length_buckets.model_inputs`) through a masked-LM model."""
    encoder = getattr(model, model.base_model_prefix)
    hidden = encoder(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                     token_type_ids=inputs.get("token_type_ids")).last_hidden_state
    # log1p(relu(max)) = max of log1p(relu(.)): the activation is monotone. A row with no real token is all -inf
    # here and 0 after the ReLU.
    return torch.log1p(torch.relu(max_logits(hidden, inputs["attention_mask"], model.vocab_projection(), budget)))


def has_vocab_projection(model) -> bool:
    return callable(getattr(model, "vocab_projection", None))


# ---------------------------------------------------------------------------------------------- sparse rows
@dataclass
class SparseRows:
    """Rows of token id -> weight in CSR form: row i's ids are `indices[indptr[i]:indptr[i+1]]` (ascending),
    its weights `data[...]` (float32); `n_cols` is the vocabulary size."""

    indptr: np.ndarray  # (N + 1,) int64
    indices: np.ndarray  # (nnz,) int32
    data: np.ndarray  # (nnz,) float32
    n_cols: int

    def __len__(self) -> int:
        return len(self.indptr) - 1

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1])

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.indptr[i], self.indptr[i + 1]
        return self.indices[a:b], self.data[a:b]

    @classmethod
    def from_dense(cls, dense: torch.Tensor | np.ndarray, top_k: int | None = None) -> "SparseRows":
        """The non-zero entries of an (N, V) array; with `top_k`, each row's `top_k` largest (ties: lower id)."""
        dense = torch.as_tensor(dense, dtype=torch.float32).cpu()
        if top_k is not None and top_k < dense.shape[1]:
            # a stable sort on -w keeps the lower id first among equal weights, so pruning is deterministic
            order = torch.sort(-dense, dim=1, stable=True).indices[:, :top_k]
            kept = torch.zeros_like(dense)
            kept.scatter_(1, order, dense.gather(1, order))
            dense = kept
        rows, cols = torch.nonzero(dense, as_tuple=True)  # row-major: ids ascending within a row
        counts = torch.bincount(rows, minlength=dense.shape[0])
        indptr = np.zeros(dense.shape[0] + 1, dtype=np.int64)
        np.cumsum(counts.numpy(), out=indptr[1:])
        return cls(indptr, cols.numpy().astype(np.int32), dense[rows, cols].numpy(), int(dense.shape[1]))

    @classmethod
    def concat(cls, parts: Sequence["SparseRows"], n_cols: int) -> "SparseRows":
        if not parts:
            return cls(np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32), n_cols)
        offsets = np.cumsum([0] + [p.nnz for p in parts[:-1]])
        indptr = np.concatenate([[0]] + [p.indptr[1:] + o for p, o in zip(parts, offsets)]).astype(np.int64)
        return cls(indptr, np.concatenate([p.indices for p in parts]), np.concatenate([p.data for p in parts]), n_cols)

    def take(self, order: Sequence[int]) -> "SparseRows":
        """Rows in the order given (`order[k]` is the row that becomes row k)."""
        order = np.asarray(order, dtype=np.int64)
        starts = self.indptr[order]
        lengths = self.indptr[order + 1] - starts
        indptr = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        gather = np.repeat(starts - indptr[:-1], lengths) + np.arange(indptr[-1])
        return SparseRows(indptr, self.indices[gather], self.data[gather], self.n_cols)

    def to_torch(self) -> torch.Tensor:
        """A torch sparse CSR tensor of the rows (for exact sparse-dense products)."""
        with warnings.catch_warnings():  # "sparse CSR support is in beta": the product used here is not
            warnings.simplefilter("ignore", UserWarning)
            return torch.sparse_csr_tensor(torch.from_numpy(self.indptr),
                                           torch.from_numpy(self.indices.astype(np.int64)),
                                           torch.from_numpy(self.data), size=(len(self), self.n_cols))

    def to_dense(self) -> np.ndarray:
        out = np.zeros((len(self), self.n_cols), dtype=np.float32)
        for i in range(len(self)):
            ids, w = self.row(i)
            out[i, ids] = w
        return out

    def json_weights(self, i: int) -> str:
        """Row i as a JSON object {"token id": weight} (ids ascending; weights to 8 significant digits)."""
        ids, w = self.row(i)
        return "{" + ", ".join(f'"{t}": {v:.8g}' for t, v in zip(ids.tolist(), w.tolist())) + "}"

    def save_npz(self, path: str | Path) -> None:
        """`scipy.sparse.save_npz`'s file of a CSR matrix (compressed), written to a temporary name and renamed."""
        from .outputs import temporary_path

        path = Path(path)
        tmp = temporary_path(path)
        try:
            with open(tmp, "wb") as f:
                np.savez_compressed(f, indices=self.indices, indptr=self.indptr, format=np.bytes_(b"csr"),
                                    shape=np.array([len(self), self.n_cols]), data=self.data)
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @classmethod
    def load_npz(cls, path: str | Path) -> "SparseRows":
        """A CSR `.npz` as `scipy.sparse.save_npz` writes it (and `save_npz` here)."""
        try:
            with np.load(path, allow_pickle=False) as z:
                fmt = z["format"].item()
                if (fmt.decode() if isinstance(fmt, bytes) else fmt) != "csr":
                    raise BertlabError(f"{path}: a {fmt!r} sparse matrix; expected CSR")
                return cls(z["indptr"].astype(np.int64), z["indices"].astype(np.int32), z["data"].astype(np.float32),
                           int(z["shape"][1]))
        except (OSError, KeyError, ValueError) as e:
            raise BertlabError(f"{path}: not a scipy.sparse CSR .npz file ({e})") from None


def check_sparse_output(path: str | None, what: str = "--pooling splade") -> None:
    """One line for an output format sparse vectors cannot go to (.npy, .safetensors: dense arrays)."""
    if path is None or str(path) == "-":
        return
    suffix = Path(path).suffix.lower()
    if suffix not in SPARSE_OUTPUTS:
        raise BertlabError(f"--output {path}: {what} writes sparse vectors as JSON Lines (.jsonl, or "
                           f"stdout) or a scipy.sparse CSR .npz, not {suffix or 'a file without a suffix'}")


# ---------------------------------------------------------------------------------------------- the encoder
def folder_pooling(model_dir: str | Path | None) -> str | None:
    """"splade" for a sentence-transformers SparseEncoder folder (its modules.json has a SpladePooling module
    with max pooling and ReLU), else None."""
    from .embeddings import module_config

    config = module_config(model_dir, "SpladePooling")
    if config is None:
        return None
    strategy, activation = config.get("pooling_strategy", "max"), config.get("activation_function", "relu")
    if (strategy, activation) != ("max", "relu"):
        raise BertlabError(f"{model_dir}: its SpladePooling is {strategy} pooling with {activation}; bertlab computes "
                           "SPLADE's max pooling with ReLU only")
    return "splade"


class SpladeEncoder:
    """Texts -> `SparseRows` of SPLADE weights with a loaded masked-LM model and its tokenizer."""

    def __init__(self, model, tokenizer, max_length: int | None = None, options: InferenceOptions | None = None,
                 top_k: int | None = None, budget: int = LOGITS_BUDGET):
        if not has_vocab_projection(model):
            raise BertlabError(f"{type(model).__name__} has no masked-LM vocabulary projection; SPLADE needs one")
        if top_k is not None and top_k < 1:
            raise BertlabError(f"--top-k must be at least 1, got {top_k}")
        self.model, self.tokenizer, self.top_k, self.budget = model, tokenizer, top_k, budget
        self.options = options or InferenceOptions()
        self.max_length = max_length or length_limit(None, model.config, tokenizer, None)
        self.device = next(model.parameters()).device
        self.pooling = "splade"

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, options: InferenceOptions | None = None,
                        top_k: int | None = None) -> "SpladeEncoder":
        options = options or InferenceOptions()
        if options.engine != "bertlab":
            raise BertlabError(f"--pooling splade runs on --engine bertlab (the peer engines run the encoder "
                               f"without its masked-LM head), not {options.engine}")
        if options.dtype == "int8":
            raise BertlabError("--pooling splade runs in fp32 or bf16; --dtype int8 quantizes the vocabulary "
                               "projection it reads")
        model = load_head("masked-lm", Path(model_dir), options, purpose="--pooling splade")
        tokenizer = load_tokenizer(Path(model_dir))
        return cls(model, tokenizer, length_limit(model_dir, model.config, tokenizer, options.max_seq_length), options,
                   top_k)

    @classmethod
    def for_folder(cls, model, model_dir: str | Path, options: InferenceOptions) -> "SpladeEncoder":
        """An encoder on a masked-LM model already loaded from `model_dir` (the service's fill-mask model), with
        the folder's tokenizer and length limit."""
        tokenizer = load_tokenizer(Path(model_dir))
        return cls(model, tokenizer, length_limit(model_dir, model.config, tokenizer, options.max_seq_length), options)

    @property
    def dim(self) -> int:
        return int(self.model.config.vocab_size)

    def encode(self, texts: Sequence[str], where=None) -> SparseRows:
        """The texts' sparse vectors, row i for texts[i]."""
        enc = encode(self.tokenizer, texts, self.max_length, self.options.on_long, where=where)
        return self.encode_ids(enc.input_ids)

    embed = encode  # the name `Embedder` has: retrieval's code takes either

    def encode_ids(self, input_ids: Sequence[Sequence[int]]) -> SparseRows:
        """Sparse vectors of tokenized rows (with special tokens), length-bucketed, in input order."""
        parts, order = [], []
        for batch in length_buckets.plan_batches([len(r) for r in input_ids], self.options.max_tokens,
                                                 self.options.max_batch, max_waste=self.options.max_waste):
            parts.append(SparseRows.from_dense(self.dense([input_ids[i] for i in batch]), self.top_k))
            order += batch
        rows = SparseRows.concat(parts, self.dim)
        position = np.empty(len(order), dtype=np.int64)
        position[np.asarray(order, dtype=np.int64)] = np.arange(len(order))
        return rows.take(position)

    @torch.inference_mode()
    def dense(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """(len(rows), V) fp32 weights of one batch of rows, on the CPU."""
        inputs = length_buckets.model_inputs(rows, None, self.device)
        return splade_vectors(self.model, inputs, self.budget).cpu()


# ---------------------------------------------------------------------------------------------- the folder
def write_sparse_encoder_files(folder: Path, vocab_size: int, max_seq_length: int, query_prompt: str = "",
                               passage_prompt: str = "") -> None:
    """The sentence-transformers files that make a saved masked-LM model and its tokenizer in `folder` a
    `SparseEncoder` folder: its masked-LM transformer, then SPLADE pooling (max over tokens, ReLU, log1p), dot
    product as the similarity."""
    def write(path: Path, data) -> None:
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")

    # The module names sentence-transformers 5 wrote (and SPLADE folders on the Hub have): 5.x loads them as they
    # are, 6.x maps them to its own modules
    write(folder / "modules.json",
          [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.sparse_encoder.models.MLMTransformer"},
           {"idx": 1, "name": "1", "path": "1_SpladePooling",
            "type": "sentence_transformers.sparse_encoder.models.SpladePooling"}])
    (folder / "1_SpladePooling").mkdir(exist_ok=True)
    write(folder / "1_SpladePooling" / "config.json",
          {"pooling_strategy": "max", "activation_function": "relu", "word_embedding_dimension": vocab_size})
    write(folder / "sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})
    prompts = {k: v for k, v in (("query", query_prompt), ("document", passage_prompt)) if v}
    write(folder / "config_sentence_transformers.json",
          {"model_type": "SparseEncoder", "prompts": prompts, "default_prompt_name": None,
           "similarity_fn_name": "dot"})
