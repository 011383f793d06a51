"""Sentence embeddings: one vector per text from the encoder's last layer, pooled, optionally L2-normalised.

Poolings (over real tokens only, padding excluded):
    cls   h_[CLS]                        the paper's sequence representation
    mean  Σ_t m_t h_t / Σ_t m_t          sentence-transformers' recipe (all-MiniLM-L6-v2 is trained for it)
    max   max_t h_t (per dimension)

`Embedder.embed(texts)` tokenizes, sorts by length into buckets (`length_buckets.py`), runs the encoder under
`inference_mode`, pools in fp32 and returns an (N, H) float32 array in input order. With `mean` pooling
and `normalize=True` on all-MiniLM-L6-v2 this is sentence-transformers' `encode` (tests check it).

`dimensions=N` keeps each vector's first N dimensions (a Matryoshka model's shorter vectors; sentence-transformers'
`truncate_dim`), cut before the normalisation, so a normalised vector is unit-length at its new size.

Long documents: with `window_overlap` set, a text over the length limit is not truncated but cut into
overlapping windows of the limit's length (neighbours share `window_overlap` tokens), each window is
embedded with its own [CLS]/[SEP], and the window vectors (pooled, not yet normalised) are averaged,
weighted by their token counts, into one vector -- so a 5,000-word document gets one embedding of all of it.

`model_pooling(dir)` reads the pooling a sentence-transformers folder was trained with (`1_Pooling/config.json`)
and `model_normalize(dir)` whether its pipeline normalises (a Normalize module), so `embed`, `similarity` and
`serve` use them unless told otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from ..core.errors import BertlabError
from . import length_buckets
from .inputs import encode
from .multivector import is_colbert_folder
from .runtime import InferenceOptions, length_limit, load_encoder, load_tokenizer


def _cls(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return hidden[:, 0]


def _mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)


def _max(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return hidden.masked_fill(~mask.bool().unsqueeze(-1), float("-inf")).amax(1)


# (B, T, H) fp32 hidden states and (B, T) mask -> (B, H)
POOLINGS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {"cls": _cls, "mean": _mean, "max": _max}
DEFAULT_POOLING = "mean"

# sentence-transformers' Pooling config: before 6, a flag per mode (-> the mode's name, ours where we have it);
# from 6, `pooling_mode`: one name or a list of them
ST_POOLING_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                    "pooling_mode_max_tokens": "max", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                    "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}


def module_config(model_dir: str | Path | None, type_suffix: str) -> dict | None:
    """The config.json of the first module in a sentence-transformers folder's `modules.json` whose type ends
    with `type_suffix` ({} when that module has no readable config), or None when there is no such module."""
    if model_dir is None:
        return None
    folder = Path(model_dir)
    try:
        modules = json.loads((folder / "modules.json").read_text())
        path = next(m.get("path", "") for m in modules if str(m.get("type", "")).endswith(type_suffix))
    except (OSError, ValueError, StopIteration, TypeError, AttributeError):
        return None
    try:
        config = json.loads((folder / path / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def folder_prompts(model_dir: str | Path) -> dict[str, str]:
    """The `prompts` of a sentence-transformers folder's config_sentence_transformers.json ({} when none)."""
    try:
        prompts = json.loads((Path(model_dir) / "config_sentence_transformers.json").read_text()).get("prompts")
    except (OSError, ValueError, AttributeError):
        return {}
    return {str(k): str(v) for k, v in prompts.items()} if isinstance(prompts, dict) else {}


def model_normalize(model_dir: str | Path | None) -> bool | None:
    """Whether a sentence-transformers folder's pipeline L2-normalises its vectors (a Normalize module in
    `modules.json`), or None for a folder without a readable modules.json."""
    if model_dir is None:
        return None
    try:
        modules = json.loads((Path(model_dir) / "modules.json").read_text())
        return any(str(m.get("type", "")).endswith("Normalize") for m in modules)
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def resolve_normalize(model_dir: str | Path | None, asked: bool | None) -> bool:
    """`asked` when the user said; else as the folder's pipeline does (`model_normalize`) -- a model trained
    for dot products (no Normalize module) keeps its vectors' lengths, as sentence-transformers' `encode`
    does -- and normalised for a folder that does not say (cosine = dot product)."""
    return asked if asked is not None else model_normalize(model_dir) is not False


# A BGE-M3 folder (`bge_m3.py`): an encoder with these two layers beside it; its dense vector is the [CLS] vector
SPARSE_FILE = "sparse_linear.pt"
COLBERT_FILE = "colbert_linear.pt"


def is_bge_m3_folder(model_dir: str | Path | None) -> bool:
    """Whether the folder holds BGE-M3's two extra layers (both: one alone is refused in one line)."""
    if model_dir is None:
        return False
    folder = Path(model_dir)
    have = [(folder / name).is_file() for name in (SPARSE_FILE, COLBERT_FILE)]
    if any(have) and not all(have):
        missing = COLBERT_FILE if have[0] else SPARSE_FILE
        raise BertlabError(f"{folder}: a BGE-M3 folder holds {SPARSE_FILE} and {COLBERT_FILE}; {missing} is missing")
    return all(have)


# A sentence-transformers pipeline bertlab computes as a sentence vector: these modules, in this order
SENTENCE_MODULES = ("Transformer", "Pooling", "Normalize")
# Pipelines with a vector of another kind, each computed by its own path: SPLADE's (`sparse.folder_pooling`), marked
# by this module; ColBERT's (`multivector.is_colbert_folder`)
SPARSE_MODULE = "SpladePooling"


def _check_sentence_modules(model_dir: str | Path) -> None:
    """Refuse, in one line, a sentence-transformers pipeline whose sentence vector bertlab would not compute as
    that library does (a Dense or LayerNorm after the pooling, no pooling at all...): read as a plain encoder
    it would give another vector without a word. Folders without modules.json, and those of the other kinds
    above, pass (their own paths read them)."""
    folder = Path(model_dir)
    try:
        modules = json.loads((folder / "modules.json").read_text())
        names = tuple(str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules)
    except (OSError, ValueError, TypeError, AttributeError):
        return
    if "Pooling" not in names and (SPARSE_MODULE in names or is_colbert_folder(folder)):
        return
    if names not in (SENTENCE_MODULES[:2], SENTENCE_MODULES):
        raise BertlabError(f"{folder}/modules.json: {' -> '.join(names) or 'no modules'}; bertlab computes a "
                           f"sentence vector as {' -> '.join(SENTENCE_MODULES[:2])} [-> Normalize] only (--pooling "
                           "pools the encoder's last layer instead)")


def model_pooling(model_dir: str | Path | None) -> str | None:
    """The pooling a sentence-transformers folder declares (`modules.json` -> its Pooling module's config), or
    None when the folder has none; "cls" for a BGE-M3 folder, whatever it declares (FlagEmbedding's dense
    vector). Refused in one line, as bertlab would compute another vector: a pooling it does not have
    (mean-sqrt-len, weighted mean, last token, several at once), a pooling that leaves the prompt out, a
    pipeline with other modules around its pooling (`_check_sentence_modules`)."""
    if is_bge_m3_folder(model_dir):
        return "cls"
    if model_dir is not None:
        _check_sentence_modules(model_dir)
    config = module_config(model_dir, "Pooling") or {}
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        modes = [mode] if isinstance(mode, str) else [str(m) for m in mode] if isinstance(mode, list) else [str(mode)]
    else:
        modes = [ST_POOLING_FLAGS.get(k, k) for k, v in sorted(config.items()) if k.startswith("pooling_mode") and v]
    if not modes:  # no Pooling module, or SpladePooling's config (the sparse path reads it)
        return None
    if len(modes) != 1 or modes[0] not in POOLINGS:
        raise BertlabError(f"{model_dir}: its Pooling module pools by {' + '.join(modes)}; bertlab pools by one of "
                           f"{', '.join(POOLINGS)} (--pooling picks one)")
    if config.get("include_prompt") is False and any(folder_prompts(model_dir).values()):
        raise BertlabError(f"{model_dir}: its Pooling module leaves the prompt's tokens out (include_prompt: "
                           "false); bertlab pools every token")
    return modes[0]


def windows(ids: Sequence[int], max_length: int, overlap: int, cls_id: int, sep_id: int) -> list[list[int]]:
    """`ids` (no special tokens) as rows `[CLS] piece [SEP]` of at most `max_length` tokens, neighbouring pieces
    sharing `overlap` tokens; one row when it fits."""
    size = max_length - 2
    if size < 1 or not 0 <= overlap < size:
        raise BertlabError(f"window overlap must be between 0 and {max(size - 1, 0)} tokens (windows of "
                           f"{max_length} tokens), got {overlap}")
    step = size - overlap
    starts = range(0, max(len(ids) - overlap, 1), step)
    return [[cls_id, *ids[s:s + size], sep_id] for s in starts]


def combine_windows(vectors: np.ndarray, weights: Sequence[float]) -> np.ndarray:
    """One vector from a document's window vectors: their mean weighted by each window's token count."""
    w = np.asarray(weights, dtype=np.float32)[:, None]
    return (vectors * w).sum(0) / w.sum()


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)


class Embedder:
    """Texts -> (N, H) float32 sentence embeddings with a loaded `BertModel` and its tokenizer."""

    def __init__(self, model, tokenizer, pooling: str = "mean", normalize: bool = False,
                 max_length: int | None = None, options: InferenceOptions | None = None,
                 window_overlap: int | None = None, dimensions: int | None = None):
        if pooling not in POOLINGS:
            raise BertlabError(f"unknown pooling {pooling!r}; expected one of {', '.join(POOLINGS)}")
        hidden = model.config.hidden_size
        if dimensions is not None and not 1 <= dimensions <= hidden:
            raise BertlabError(f"--dimensions keeps the first N of the model's {hidden} dimensions; got {dimensions}")
        # Matryoshka: each vector's first `dimensions` (sentence-transformers' truncate_dim), normalised after
        self.dimensions = dimensions
        self.model, self.tokenizer = model, tokenizer
        self.pooling, self.normalize = pooling, normalize
        self.options = options or InferenceOptions()
        self.max_length = max_length or length_limit(None, model.config, tokenizer, None)
        self.window_overlap = window_overlap
        if window_overlap is not None:
            windows([], self.max_length, window_overlap, 0, 0)  # checks the overlap fits a window
        self.device = next(model.parameters()).device

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, pooling: str | None = "mean", normalize: bool = False,
                        options: InferenceOptions | None = None, window_overlap: int | None = None,
                        dimensions: int | None = None) -> "Embedder":
        """`pooling=None`: the pooling the folder declares (sentence-transformers' config), else mean."""
        options = options or InferenceOptions()
        model = load_encoder(Path(model_dir), options)
        if isinstance(getattr(model, "pooler", None), torch.nn.Module):
            # the [CLS] summary a task head reads (tanh(W h_[CLS] + b)): nothing here reads it, and at batch 1 its
            # layer is a GEMV that streams H² weights from memory; the encoders that have one skip it when None
            model.pooler = None
        tokenizer = load_tokenizer(Path(model_dir))
        return cls(model, tokenizer, pooling or model_pooling(model_dir) or DEFAULT_POOLING, normalize,
                   length_limit(model_dir, model.config, tokenizer, options.max_seq_length), options, window_overlap,
                   dimensions)

    @property
    def dim(self) -> int:
        return self.dimensions or self.model.config.hidden_size

    def embed(self, texts: Sequence[str], where=None) -> np.ndarray:
        """(len(texts), H) float32 embeddings, row i for texts[i]."""
        if self.window_overlap is not None:
            return self.embed_documents([self.tokenizer.encode(t, add_special_tokens=False) for t in texts])
        enc = encode(self.tokenizer, texts, self.max_length, self.options.on_long, where=where)
        return self.embed_ids(enc.input_ids)

    def document_rows(self, ids: Sequence[int]) -> list[list[int]]:
        """One text's rows (ids without special tokens in): one row, or its windows when over the limit."""
        return windows(ids, self.max_length, self.window_overlap or 0, self.tokenizer.cls_token_id,
                       self.tokenizer.sep_token_id)

    def embed_documents(self, documents: Sequence[Sequence[int]], normalize: bool | None = None) -> np.ndarray:
        """Embeddings of texts given as ids without special tokens, each over the limit embedded as
        overlapping windows mean-pooled into one vector (see the module docstring)."""
        rows = [self.document_rows(ids) for ids in documents]
        flat = self.embed_ids([r for doc in rows for r in doc], normalize=False)
        out = np.empty((len(documents), self.dim), dtype=np.float32)
        start = 0
        for i, doc in enumerate(rows):
            out[i] = combine_windows(flat[start:start + len(doc)], [len(r) for r in doc])
            start += len(doc)
        return l2_normalize(out) if (self.normalize if normalize is None else normalize) else out

    def embed_ids(self, input_ids: Sequence[Sequence[int]], token_type_ids: Sequence[Sequence[int]] | None = None,
                  normalize: bool | None = None) -> np.ndarray:
        """Embeddings of already tokenized rows (with [CLS]/[SEP]); length-bucketed. `normalize` overrides the
        embedder's setting for this call."""
        normalize = self.normalize if normalize is None else normalize
        out = np.empty((len(input_ids), self.dim), dtype=np.float32)
        lengths = [len(r) for r in input_ids]
        for batch in length_buckets.plan_batches(lengths, self.options.max_tokens, self.options.max_batch,
                                           max_waste=self.options.max_waste):
            rows = [input_ids[i] for i in batch]
            types = [token_type_ids[i] for i in batch] if token_type_ids is not None else None
            out[batch] = self._forward(rows, types, normalize)
        return out

    @torch.inference_mode()
    def _forward(self, rows, types, normalize: bool) -> np.ndarray:
        inputs = length_buckets.model_inputs(rows, types, self.device)
        hidden = self.model(**inputs).last_hidden_state.float()  # (B, T, H)
        pooled = POOLINGS[self.pooling](hidden, inputs["attention_mask"])[:, :self.dim]  # (B, dim)
        if normalize:
            pooled = torch.nn.functional.normalize(pooled, dim=-1)
        return pooled.cpu().numpy()


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two (N, H) arrays."""
    a = a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=-1, keepdims=True), 1e-12)
    return (a * b).sum(-1)
