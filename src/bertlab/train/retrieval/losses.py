"""The losses of bi-encoder fine-tuning, on sentence embeddings; GradCache; Matryoshka.

An objective maps the batch's embeddings -- one (B, H) fp32 tensor per text column: `anchor`, `positive`,
`negative_0`, ... (scored pairs: `anchor`, `positive` are sentence1, sentence2) -- and its `labels` to a scalar:

    mnrl        multiple negatives ranking (InfoNCE; Henderson et al., 2017): for each anchor, softmax cross-entropy
                over scale·cos(anchor, c) for every candidate c of the batch -- all positives, then every hard
                negative column -- the anchor's own positive being the target; in-batch negatives for free.
                `symmetric` adds positive -> anchors (each positive against every anchor), the two averaged
                (sentence-transformers' MultipleNegativesSymmetricRankingLoss). Scale 20 (temperature 0.05).
    cosent      CoSENT (Su, 2022) on scored pairs: log(1 + Σ_{s_i > s_j} exp(scale·(cos_j − cos_i))), scale 20
    cosine      mean squared error between cos(sentence1, sentence2) and the score
    margin-mse  MarginMSE (Hofstätter et al., 2020): mean squared error between the dot-product margin
                q·p − q·n and a teacher's margin (its score of the positive minus that of the negative)

as sentence-transformers' losses of those names compute them (their defaults). `matryoshka(objective, dims)`
sums the objective over the embeddings cut to each of `dims` leading dimensions (Kusupati et al., 2022), so a
model can be served at any of them (`serve`'s `dimensions`).

GradCache (Gao et al., 2021; `cached_loss`): the batch's texts are embedded in mini-batches without a graph,
the objective and its gradient with respect to the embeddings computed once on the whole batch, then each
mini-batch is embedded again with a graph -- under the random state of its first pass, so dropout draws the
same masks -- and back-propagated with its slice of that gradient. The parameters' gradient is the plain
objective's (to fp32 rounding: a test), while memory holds one mini-batch's activations: batch 1,024 in the
memory of batch 32. This happens inside `loss.backward()` (a hook on the returned loss), so the shared
training loop runs it like any other loss. Under torchrun (`rank`, `world_size`) each process embeds its share of
every column in as many mini-batches as every other process (FSDP gathers each block's weights at every
forward, DDP may sync buffers: the processes must run alike), gathers the whole batch's embeddings, computes the
objective on all of them -- the global batch's in-batch negatives, as `across_processes` -- and back-propagates
its own rows' slice of the gradient, times the processes (DDP and FSDP average what the processes send); DDP
reduces the gradients once, after the last mini-batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ...core.errors import ConfigError

Embeddings = Mapping[str, torch.Tensor]
Objective = Callable[[Embeddings, "torch.Tensor | None"], torch.Tensor]


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(A, B) cosine similarities of every row of `a` with every row of `b`."""
    return F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T


def negative_columns(embeddings: Embeddings) -> list[str]:
    return sorted((c for c in embeddings if c.startswith("negative_")), key=lambda c: int(c.split("_")[1]))


def mnrl(scale: float = 20.0, symmetric: bool = False) -> Objective:
    def objective(emb: Embeddings, labels=None) -> torch.Tensor:
        anchors, positives = emb["anchor"], emb["positive"]
        candidates = torch.cat([positives, *(emb[c] for c in negative_columns(emb))])
        scores = _cos(anchors, candidates) * scale  # (B, B * (1 + negatives))
        target = torch.arange(len(anchors), device=anchors.device)
        loss = F.cross_entropy(scores, target)
        if symmetric:  # each positive against every anchor
            loss = (loss + F.cross_entropy(scores[:, :len(anchors)].T, target)) / 2
        return loss
    return objective


def cosent(scale: float = 20.0) -> Objective:
    def objective(emb: Embeddings, labels: torch.Tensor) -> torch.Tensor:
        scores = F.cosine_similarity(emb["anchor"], emb["positive"]) * scale
        diff = scores[:, None] - scores[None, :]  # diff[i, j] = cos_i - cos_j, wanted negative where s_i < s_j
        wanted = (labels[:, None] < labels[None, :]).to(diff.dtype)
        diff = diff - (1 - wanted) * 1e12
        return torch.logsumexp(torch.cat([torch.zeros(1, dtype=diff.dtype, device=diff.device), diff.view(-1)]), 0)
    return objective


def cosine() -> Objective:
    def objective(emb: Embeddings, labels: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(F.cosine_similarity(emb["anchor"], emb["positive"]), labels.to(emb["anchor"].dtype))
    return objective


def margin_mse() -> Objective:
    def objective(emb: Embeddings, labels: torch.Tensor) -> torch.Tensor:
        q, p, n = emb["anchor"], emb["positive"], emb["negative_0"]
        margin = (q * p).sum(-1) - (q * n).sum(-1)
        return F.mse_loss(margin, labels.to(margin.dtype))
    return objective


def matryoshka(objective: Objective, dims: Sequence[int], weights: Sequence[float] | None = None) -> Objective:
    weights = list(weights) if weights is not None else [1.0] * len(dims)
    if len(weights) != len(dims):
        raise ConfigError(f"matryoshka: {len(weights)} weights for {len(dims)} dimensions")

    def wrapped(emb: Embeddings, labels=None) -> torch.Tensor:
        return sum(w * objective({c: e[..., :d] for c, e in emb.items()}, labels) for d, w in zip(dims, weights))
    return wrapped


# loss name -> what its rows hold: "pairs" (anchor, positive[, negatives]), "scored" pairs or "margin" triplets
# (splade: sparse vectors, its own loss in splade.py; colbert: a multi-vector model, its losses in colbert.py)
LOSS_ROWS = {"mnrl": "pairs", "cached-mnrl": "pairs", "cosent": "scored", "cosine": "scored", "margin-mse": "margin",
             "splade": "pairs", "colbert": "pairs"}


def build_objective(loss: str, scale: float = 20.0, symmetric: bool = False,
                    matryoshka_dims: Sequence[int] = (), matryoshka_weights: Sequence[float] | None = None) -> Objective:
    if loss in ("mnrl", "cached-mnrl"):
        objective = mnrl(scale, symmetric)
    elif loss == "cosent":
        objective = cosent(scale)
    elif loss == "cosine":
        objective = cosine()
    elif loss == "margin-mse":
        objective = margin_mse()
    else:
        raise ConfigError(f"unknown loss {loss!r}; expected one of {', '.join(LOSS_ROWS)}")
    return matryoshka(objective, matryoshka_dims, matryoshka_weights) if matryoshka_dims else objective


# ---------------------------------------------------------------------------------------------- the model side
Encode = Callable[[nn.Module, Mapping[str, torch.Tensor]], torch.Tensor]  # (model, one column's inputs) -> (B, H)


def text_columns(batch: Mapping) -> list[str]:
    return [c for c in batch if isinstance(batch[c], Mapping)]


def plain_loss(objective: Objective, encode: Encode) -> Callable:
    """loss_fn(model, batch) for the training loop: every column embedded with a graph, then the objective."""
    def loss_fn(model, batch):
        emb = {c: encode(model, batch[c]) for c in text_columns(batch)}
        return objective(emb, batch.get("labels")), {}
    return loss_fn


def across_processes(encode: Encode, rank: int, world_size: int, whole_width: bool = False) -> Encode:
    """`encode` for one process of a torchrun job. Every process collates the whole global batch alike; each embeds
    its own contiguous share of a column's rows and gets every process's back (`distributed.gather_rows`), so an
    objective sees the whole batch -- every in-batch negative of every process, as one process with the global
    batch does -- and computes the same loss everywhere, whose gradient reaches each process's share only (the
    sum DDP / FSDP average is the one-process gradient). A process whose share is empty (a last batch of an epoch
    smaller than the processes) embeds one row and keeps none of it, so its backward still runs the model.
    A share is cut to its rows' attended tokens, unless `whole_width` (per-token outputs, gathered at the batch's
    width)."""
    from ..distributed import gather_rows

    cut = (lambda inputs, start, stop: {k: v[start:stop] for k, v in inputs.items()}) if whole_width else _slice

    def shared(model: nn.Module, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        sizes, start, stop = _share(len(inputs["input_ids"]), rank, world_size)
        local = encode(model, cut(inputs, start, stop)) if stop > start else encode(model, cut(inputs, 0, 1))[:0]
        return gather_rows(local, sizes)
    return shared


def _rng_state(device: torch.device):
    return (torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(state, device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _slice(inputs: Mapping[str, torch.Tensor], start: int, stop: int) -> dict[str, torch.Tensor]:
    """Rows start..stop, trimmed of the columns that are padding in all of them."""
    rows = {k: v[start:stop] for k, v in inputs.items()}
    width = int(rows["attention_mask"].sum(1).max())
    return {k: v[:, :width] for k, v in rows.items()}


def _share(n: int, rank: int, world_size: int) -> tuple[list[int], int, int]:
    """Every process's rows of an n-row column (contiguous, in rank order) and this process's start and stop."""
    sizes = [n // world_size + (r < n % world_size) for r in range(world_size)]
    start = sum(sizes[:rank])
    return sizes, start, start + sizes[rank]


def _spans(start: int, stop: int, pieces: int) -> list[tuple[int, int]]:
    """start..stop cut into `pieces` contiguous spans of near-equal size (some empty when rows are fewer)."""
    n = stop - start
    bounds = [start + i * (n // pieces) + min(i, n % pieces) for i in range(pieces + 1)]
    return list(zip(bounds, bounds[1:]))


def _gradient_sync(model: nn.Module, sync: bool):
    """DDP's `no_sync` for a backward that is not the step's last: its gradients accumulate locally and the last
    backward reduces them all at once. (FSDP2 reduce-scatters after every backward and adds up the shards: that
    keeps its gradients sharded, which is what it is used for.)"""
    if isinstance(model, nn.parallel.DistributedDataParallel) and not sync:
        return model.no_sync()
    return contextlib.nullcontext()


def cached_loss(objective: Objective, encode: Encode, mini_batch_size: int, rank: int = 0,
                world_size: int = 1) -> Callable:
    """loss_fn(model, batch) with GradCache (see the module docstring): the returned loss's backward runs the
    mini-batches again with a graph. `rank`, `world_size`: this process's place in a torchrun job, whose every
    process collates the whole global batch alike."""
    if mini_batch_size < 1:
        raise ConfigError(f"mini-batch-size must be at least 1, got {mini_batch_size}")
    from ..distributed import gather_rows

    def embed(model, inputs, start: int, stop: int) -> torch.Tensor:
        if stop > start:
            return encode(model, _slice(inputs, start, stop)).float()
        return encode(model, _slice(inputs, 0, 1)).float()[:0]  # an empty span: the model runs, keeps no row

    def loss_fn(model, batch):
        device = next(model.parameters()).device
        columns = text_columns(batch)
        pieces: list[tuple[str, int, int, tuple]] = []  # (column, start, stop, random state before its pass)
        reps: dict[str, torch.Tensor] = {}
        own: dict[str, tuple[int, int]] = {}  # this process's rows of each column
        with torch.no_grad():
            for c in columns:
                n = len(batch[c]["input_ids"])
                sizes, lo, hi = _share(n, rank, world_size)
                spans = _spans(lo, hi, -(-max(sizes) // mini_batch_size)) if world_size > 1 else \
                    [(s, min(s + mini_batch_size, n)) for s in range(0, n, mini_batch_size)]
                chunks = []
                for start, stop in spans:
                    pieces.append((c, start, stop, _rng_state(device)))
                    chunks.append(embed(model, batch[c], start, stop))
                reps[c] = torch.cat(chunks) if world_size == 1 else gather_rows(torch.cat(chunks), sizes)
                own[c] = (lo, hi)
        end_state = _rng_state(device)
        autocast = (torch.is_autocast_enabled(device.type), torch.get_autocast_dtype(device.type))
        leaves = {c: r.detach().requires_grad_() for c, r in reps.items()}
        with torch.enable_grad():
            loss = objective(leaves, batch.get("labels"))
            grads = dict(zip(columns, torch.autograd.grad(loss, [leaves[c] for c in columns])))
        # every process computed the same loss: each back-propagates its own rows' part, and the processes'
        # average of those parts, times the processes, is the whole gradient
        grads = {c: g[own[c][0]:own[c][1]] * world_size for c, g in grads.items()}

        def backward(grad_output: torch.Tensor) -> torch.Tensor:
            with torch.enable_grad(), torch.autocast(device.type, dtype=autocast[1], enabled=autocast[0]):
                for i, (c, start, stop, state) in enumerate(pieces):
                    _set_rng_state(state, device)
                    with _gradient_sync(model, world_size == 1 or i == len(pieces) - 1):
                        emb = embed(model, batch[c], start, stop)
                        lo = own[c][0]
                        (emb * (grads[c][start - lo:stop - lo] * grad_output)).sum().backward()
            _set_rng_state(end_state, device)
            return grad_output

        out = loss.detach().requires_grad_()
        out.register_hook(backward)
        return out, {}
    return loss_fn
