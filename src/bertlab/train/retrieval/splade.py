"""`finetune-embeddings --loss splade`: a learned sparse retriever (SPLADE) trained from any masked-LM model.

The model is the folder's masked-LM head (`models/heads.py`; a folder without its weights starts it fresh, tied to
the word embeddings, and says so -- with its output bias at `NEW_HEAD_BIAS`, see below); each text's vector is `infer.sparse.splade_vectors` (max over tokens of
log(1 + ReLU(logits))). The loss of a batch of B anchors (queries), their positives and any hard-negative
columns (documents):

    rank   softmax cross-entropy over the dot products q·d of each query with every document of the batch -- all
           positives, then every hard negative -- its own positive the target (in-batch negatives; SPLADE v2,
           Formal et al., 2021; sentence-transformers' SparseMultipleNegativesRankingLoss: dot product, scale 1)
    FLOPS  Σ_v (mean over the batch's queries of w_v)²  and the same over its documents (Paria et al., 2020): the
           expected number of floating-point operations of an inverted-index lookup, smoothed
    loss = rank + λ_q(t)·FLOPS(queries) + λ_d(t)·FLOPS(documents),  λ(t) = λ·min(1, t / T_w)²

The quadratic warm-up of the λs is SPLADE's (the papers ramp them over the first 50k of 150k+ steps: sparsity
pressure from the first step collapses the vectors before ranking is learned). Defaults follow
sentence-transformers' SPLADE training (the values of its SpladeLoss examples, λ_q 5e-5 and λ_d 3e-5, and its
SpladeRegularizerWeightSchedulerCallback's quadratic warm-up over the first third of the steps), because a run
of a few hundred or thousand steps is what they are set for; the papers' λs (an order larger) and fixed 50k-step
ramp are for MS MARCO-sized runs. Each term is logged (rank_loss, flops_query, flops_document, and the mean
number of non-zero terms per query and document).

A new head's bias: initialised to zero (as `transformers` does) about half of its logits are positive, so every
text starts with all 30,522 terms active and query-document dot products in the thousands; the ranking loss is
then in the hundreds, clipped gradients barely move it, and the FLOPS terms, in the tens of thousands, swamp
their small λs (measured from all-MiniLM-L6-v2: rank loss 920-1,624 over the first four steps, every term of
every document non-zero). A trained masked-LM head's logits are mostly negative; a new head starts its bias at
-3 instead (logits of a new head are about N(0, 1), so about 1 token in 700 gives a term a positive weight), so
the vectors start sparse and the dot products small.

OUT/final (and OUT/best) are sentence-transformers SparseEncoder folders (`infer.sparse.write_sparse_encoder_files`):
`embed --pooling splade`, `evaluate-retrieval` and `serve`'s /embed_sparse read them as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ...core.errors import BertlabError
from ...core.fsio import atomic_directory
from .losses import negative_columns, text_columns
from ...infer.st_folder import EmbeddingSettings

log = logging.getLogger(__name__)

DEFAULT_QUERY_LAMBDA = 5e-5
DEFAULT_DOCUMENT_LAMBDA = 3e-5
DEFAULT_WARMUP = 1 / 3  # of the steps: λ reaches its value a third of the way in
NEW_HEAD_BIAS = -3.0  # a new masked-LM head's output bias (see the module docstring)


class SpladeModel(nn.Module):
    """A masked-LM model as a sparse encoder: one column's inputs -> (B, V) fp32 SPLADE weights."""

    def __init__(self, mlm: nn.Module):
        super().__init__()
        self.encoder = mlm  # the saved model: a masked-LM head, as `transformers`' AutoModelForMaskedLM loads it

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        from ...infer.sparse import splade_vectors

        return splade_vectors(self.encoder, inputs)


def load_mlm(model_dir: Path):
    """The folder's masked-LM model for training; its head is new (and said so) when the checkpoint has none."""
    from ...infer.runtime import model_family
    from ...infer.sparse import has_vocab_projection

    family = model_family(model_dir)
    head = family.head("masked-lm", "--loss splade")
    model, report = head.model_class.from_pretrained(model_dir, return_report=True)
    if not has_vocab_projection(model):
        raise BertlabError(f"{model_dir}: {family.name}'s masked-LM head has no vocabulary projection for SPLADE")
    fresh = sorted(k for k in report.initialized if k.startswith(head.prefix))
    if fresh:
        bias = model.vocab_projection().bias
        if bias is not None:
            with torch.no_grad():
                bias.fill_(NEW_HEAD_BIAS)
        log.warning("%s has no masked-LM head weights (%s): SPLADE starts from a new head (transform initialised, "
                    "bias %g, the projection tied to the word embeddings)", model_dir, ", ".join(fresh[:4]),
                    NEW_HEAD_BIAS)
    return model


def flops(weights: torch.Tensor) -> torch.Tensor:
    """Σ_v (mean_i w_iv)²: the FLOPS regulariser of a batch of (N, V) weights."""
    return (weights.mean(0) ** 2).sum()


def warmup_scale(step: int, warmup_steps: int) -> float:
    """min(1, step / warmup_steps)²: the quadratic ramp of the regulariser weights."""
    return 1.0 if warmup_steps <= 0 else min(1.0, step / warmup_steps) ** 2


def splade_loss(step: Callable[[], int], warmup_steps: int, query_lambda: float = DEFAULT_QUERY_LAMBDA,
                document_lambda: float = DEFAULT_DOCUMENT_LAMBDA, encode: Callable | None = None) -> Callable:
    """loss_fn(model, batch) for the training loop (see the module docstring); `step()` is the current optimizer
    step, read for the warm-up; `encode(model, column)`: the column's vectors (default: the model's forward; under
    torchrun `losses.across_processes`)."""
    encode = encode or (lambda model, inputs: model(inputs))

    def loss_fn(model, batch):
        emb = {c: encode(model, batch[c]) for c in text_columns(batch)}
        queries = emb["anchor"]
        documents = torch.cat([emb["positive"], *(emb[c] for c in negative_columns(emb))])
        scores = queries @ documents.T  # (B, B * (1 + negatives)) dot products
        rank = F.cross_entropy(scores, torch.arange(len(queries), device=queries.device))
        fq, fd = flops(queries), flops(documents)
        ramp = warmup_scale(step(), warmup_steps)
        loss = rank + ramp * (query_lambda * fq + document_lambda * fd)
        with torch.no_grad():
            extra = {"rank_loss": rank.detach(), "flops_query": fq.detach(), "flops_document": fd.detach(),
                     "query_terms": (queries > 0).sum(1).float().mean(),
                     "document_terms": (documents > 0).sum(1).float().mean()}
        return loss, extra
    return loss_fn


def save_sparse_folder(model: SpladeModel, tokenizer, settings: EmbeddingSettings, max_length: int, out: Path) -> Path:
    """`out` as a sentence-transformers SparseEncoder folder, written whole or not at all."""
    from ...checkpoint.pretrained import save_pretrained
    from ...infer.sparse import write_sparse_encoder_files

    with atomic_directory(out, keep_existing=False) as tmp:
        save_pretrained(model.encoder, tmp)
        tokenizer.save_pretrained(tmp)
        write_sparse_encoder_files(tmp, int(model.encoder.config.vocab_size), max_length, settings.query_prompt,
                                   settings.passage_prompt)
    return out
