"""`finetune-embeddings --loss colbert`: a ColBERT (multi-vector) model trained on the user's rows.

The model is the encoder and ColBERT's projection (`infer.multivector.ColbertModel`); from a ColBERT folder it
keeps the folder's projection, markers and lengths, from any other folder it adds the markers to the vocabulary
and draws a new projection (seeded). Queries are tokenized as ColBERT queries ([Q], [MASK]-padded to the query
length), every other column as documents ([D], punctuation dropped from the scores). The losses, on MaxSim
scores (`infer.multivector.padded_maxsim`: each query vector's best match among the document's kept vectors,
summed):

    contrastive   rows `query, positive[, negative_1, ...]`: softmax cross-entropy of each query over every
                  document of the batch -- all positives (in-batch negatives) and every hard negative -- its own
                  positive the target, on raw MaxSim scores (PyLate's Contrastive, temperature 1)
    distillation  with `--score-column` (a teacher's score per candidate: the positive, then each negative):
                  KL divergence of the student's softmax over the row's candidates, its MaxSim scores min-max
                  scaled to [0, 1] per row, from the teacher's softmax (PyLate's Distillation, its defaults)

One difference from PyLate's training losses, kept on purpose: there a dropped document token (padding,
punctuation) counts as a similarity of 0 in the max; here it is not a candidate at all, as in MaxSim at search
time and in ColBERT's own code. OUT/final is a PyLate folder (`infer.multivector.write_colbert_files`). Under torchrun each process embeds its
share of every column and the loss sees every process's vectors (`losses.across_processes`), as for `mnrl`: the
in-batch negatives are the global batch's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ...core.errors import ConfigError
from ...core.fsio import atomic_directory
from ...infer.multivector import (TEXT_KINDS, ColbertModel, ColbertSettings, Rows, add_markers, batch_inputs,
                                  is_colbert_folder, markers, padded_maxsim, read_colbert_settings, read_projection,
                                  resize_embeddings, tokenize, write_colbert_files)
from .losses import negative_columns

log = logging.getLogger(__name__)


@dataclass
class ColbertOptions:
    """ColBERT's settings of a `--loss colbert` run; a ColBERT start folder's own by default, else PyLate's."""

    colbert_dim: int | None = None
    """colbert: dimensions of each token's vector (default: the start folder's projection, else 128)"""
    query_length: int | None = None
    """colbert: tokens per query, [MASK]-padded (default: the start folder's, else 32)"""
    document_length: int | None = None
    """colbert: tokens per document at most (default: the start folder's, else 180)"""


def row_kind(score_column: str | None) -> str:
    """What the rows of a colbert run hold: scored candidates (distillation) or pairs (contrastive)."""
    return "candidate-scores" if score_column else "pairs"


def settings_for(model_dir: Path, options: ColbertOptions) -> ColbertSettings:
    settings = read_colbert_settings(model_dir) if is_colbert_folder(model_dir) else ColbertSettings()
    if is_colbert_folder(model_dir) and options.colbert_dim not in (None, settings.dim):
        raise ConfigError(f"{model_dir}: its projection gives {settings.dim} dimensions, not --colbert-dim "
                          f"{options.colbert_dim}")
    for name, value in (("dim", options.colbert_dim), ("query_length", options.query_length),
                        ("document_length", options.document_length)):
        if value is not None:
            setattr(settings, name, value)
    settings.__post_init__()
    return settings


def build_model(model_dir: Path, encoder, tokenizer, settings: ColbertSettings, seed: int) -> ColbertModel:
    """The encoder with ColBERT's projection: the folder's, or a new one drawn from `seed` (markers added)."""
    added = add_markers(tokenizer, settings, model_dir)
    if is_colbert_folder(model_dir):
        if added:
            raise ConfigError(f"{model_dir}: its tokenizer files lack the marker tokens {added}")
        return ColbertModel(encoder, settings.dim, read_projection(model_dir))
    resize_embeddings(encoder, len(tokenizer))
    if added:
        log.info("marker tokens %s added to the vocabulary (ids from %d)", added, len(tokenizer) - len(added))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ColbertModel(encoder, settings.dim)


# ---------------------------------------------------------------------------------------------- the data
@dataclass
class ColbertRows:
    """Each distinct (kind, text) tokenized once; per role, each row's index into them; teacher scores."""

    tokens: Rows
    rows: dict[str, list[int]]
    labels: list | None

    @property
    def ids(self) -> list[list[int]]:
        return self.tokens.ids

    def __len__(self) -> int:
        return len(self.rows["anchor"])


def tokenize_rows(rows, tokenizer, settings: ColbertSettings, query_prompt: str = "",
                  passage_prompt: str = "") -> ColbertRows:
    marks = markers(tokenizer, settings)
    index: dict[tuple[str, str], int] = {}
    keys_by_role: dict[str, list[tuple[str, str]]] = {}
    for role, texts in rows.texts.items():
        kind, prompt = ("query", query_prompt) if role == "anchor" else ("document", passage_prompt)
        keys_by_role[role] = [(kind, prompt + t) for t in texts]
        for key in keys_by_role[role]:
            index.setdefault(key, -1)
    tokens = Rows([], [], [])
    for kind in TEXT_KINDS:
        keys = [k for k in index if k[0] == kind]
        part = tokenize(tokenizer, [t for _, t in keys], kind, settings, marks)
        for j, key in enumerate(keys, len(tokens.ids)):
            index[key] = j
        tokens.ids += part.ids
        tokens.attended += part.attended
        tokens.kept += part.kept
    return ColbertRows(tokens, {role: [index[k] for k in keys] for role, keys in keys_by_role.items()}, rows.labels)


def collate(data: ColbertRows, batch: Sequence[int]) -> dict:
    out: dict = {role: batch_inputs(data.tokens, [rows[i] for i in batch]) for role, rows in data.rows.items()}
    if data.labels is not None:
        out["labels"] = torch.tensor([data.labels[i] for i in batch], dtype=torch.float32)
    return out


# ---------------------------------------------------------------------------------------------- the losses
def vectors(model: ColbertModel, inputs) -> torch.Tensor:
    """A column's token vectors (B, T, dim)."""
    return model(inputs)


def encode_with(vectors_of):
    """`encode` from a function giving a column's token vectors: under torchrun `losses.across_processes(vectors)`,
    every process's rows gathered (the batch's whole width T on every process: a query's [MASK]s attend to nothing
    but give vectors, so no row is cut to its attended tokens)."""
    def encode(model: ColbertModel, inputs) -> tuple[torch.Tensor, torch.Tensor]:
        """(vectors (B, T, dim), kept (B, T)): a column's token vectors and which of them count."""
        return vectors_of(model, inputs), inputs["kept"]
    return encode


def _query(emb) -> torch.Tensor:
    q, kept = emb["anchor"]
    return q * kept[..., None]  # a dropped query vector is a zero row: it adds 0 to every score


def contrastive():
    def objective(emb, labels=None) -> torch.Tensor:
        q = _query(emb)
        scores = torch.cat([padded_maxsim(q, *emb[c]) for c in ("positive", *negative_columns(emb))], dim=1)
        return F.cross_entropy(scores, torch.arange(len(q), device=q.device))
    return objective


def pairwise_maxsim(q: torch.Tensor, d: torch.Tensor, d_kept: torch.Tensor) -> torch.Tensor:
    """(B,) MaxSim of query i with document i."""
    sims = torch.einsum("bsh,bth->bst", q, d).masked_fill(~d_kept[:, None, :], float("-inf"))
    return sims.amax(-1).sum(-1)


def distillation():
    def objective(emb, labels: torch.Tensor) -> torch.Tensor:
        q = _query(emb)
        scores = torch.stack([pairwise_maxsim(q, *emb[c]) for c in ("positive", *negative_columns(emb))], dim=1)
        low, high = scores.min(1, keepdim=True).values, scores.max(1, keepdim=True).values
        scores = (scores - low) / (high - low + 1e-8)
        return F.kl_div(F.log_softmax(scores, -1), F.log_softmax(labels.to(scores.dtype), -1),
                        reduction="batchmean", log_target=True)
    return objective


def build_objective(distill: bool):
    return distillation() if distill else contrastive()


# ---------------------------------------------------------------------------------------------- output
def save_folder(model: ColbertModel, tokenizer, settings: ColbertSettings, prompts: dict, out: Path) -> Path:
    """`out` as a PyLate ColBERT folder, written whole or not at all."""
    from ...checkpoint.pretrained import save_pretrained

    with atomic_directory(out, keep_existing=False) as tmp:
        save_pretrained(model.encoder, tmp)
        tokenizer.save_pretrained(tmp)
        write_colbert_files(tmp, settings, model.linear.weight, prompts, tokenizer)
    return out
