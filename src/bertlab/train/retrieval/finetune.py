"""`finetune-embeddings`: a bi-encoder (sentence-embedding model) fine-tuned on the user's pairs.

From any family folder bertlab loads -- a sentence-transformers folder keeps its pooling, normalisation,
prompts and length limit (`st_folder.read_settings`), flags override them. The rows (`tasks.retrieval.pairs`)
are tokenized once (each distinct text once, its prompt before it); batches are drawn by a no-duplicates
sampler (`no_duplicate_batches`); each column is embedded (pooling in fp32) and a loss of `losses.py` applied;
the shared training loop (`loop.Trainer`) runs it: AdamW, linear warmup and decay, clipping, bf16, checkpoints,
exact resume, metrics.jsonl, progress.

With `validation` (a BEIR-layout folder) the model is evaluated every `eval_every` steps and at the end
(`evaluate.evaluate_embedder`: exact search, trec_eval's metrics), and the best by `metric` is kept in
OUT/best. OUT/final (and OUT/best) are sentence-transformers folders (`st_folder.write_settings`): the
encoder in the Hugging Face layout, its tokenizer, modules.json, pooling, Normalize, prompts, Matryoshka
dimensions -- `SentenceTransformer(OUT/final)` embeds as bertlab does, `bertlab serve` serves it.

The no-duplicates sampler: each epoch's order is a permutation seeded by (seed, epoch); a batch takes rows in
that order, skipping (for a later batch) any row with a text already in the batch, so no anchor meets a copy of
its own positive as an in-batch "negative" (sentence-transformers' NoDuplicatesBatchSampler). Batches are a
function of (seed, epoch) only, so resume seeks to any step.

`--loss splade` trains the folder's masked-LM head into a sparse retriever instead (`splade.py`: in-batch negatives
over dot products of SPLADE vectors plus FLOPS regularisation); OUT/final is then a SparseEncoder folder.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ...core.errors import BertlabError, ConfigError
from ...core.fsio import atomic_directory
from ...tasks.retrieval.data import load_retrieval_set
from ...tasks.retrieval.pairs import TrainingRows, read_rows
from ..loop import Trainer
from ..optim import adamw, linear_warmup_decay
from ..distributed import barrier, torchrun_world_size
from ..fsdp import join_job, shard_model, unsharded_copy
from ..runconfig import GroupedSettings
from ..options import ShardingOptions
from ..run_record import run_record, write_run_config
from . import colbert
from .evaluate import evaluate_colbert, evaluate_embedder, evaluate_sparse
from .losses import LOSS_ROWS, across_processes, build_objective, cached_loss, plain_loss
from .recipe import PairTraining, loop_config, start_run
from .splade import (DEFAULT_DOCUMENT_LAMBDA, DEFAULT_QUERY_LAMBDA, DEFAULT_WARMUP, SpladeModel, load_mlm,
                     save_sparse_folder, splade_loss)
from ...infer.st_folder import EmbeddingSettings, read_settings, write_settings

log = logging.getLogger(__name__)

BEST_RECORD = "validation.json"


@dataclass
class EmbeddingFinetuneConfig(GroupedSettings):
    """`bertlab finetune-embeddings`'s settings; the string under each field is its `--help`."""

    model: str | None = None
    """the starting model: a sentence-transformers folder, any Hugging Face-layout folder bertlab loads, or a
    model's name in the local Hugging Face cache"""
    train: str | None = None
    """the training rows: CSV/TSV/JSONL/Parquet of anchor, positive[, negative ...] (mnrl), sentence1,
    sentence2, score (cosent, cosine), or query, positive, negative, margin (margin-mse)"""
    out: str | None = None
    """OUT_DIR: final/ and best/ (sentence-transformers folders), checkpoints, metrics.jsonl, run_config.json"""
    loss: str = "mnrl"
    """mnrl (in-batch and hard negatives), cached-mnrl (the same with GradCache: large batches in small memory),
    cosent or cosine (scored pairs), margin-mse (a teacher's margins), splade (a sparse retriever from the masked-LM
    head: in-batch and hard negatives, FLOPS regularisation), colbert (a multi-vector model: in-batch and hard
    negatives on MaxSim; with --score-column, distillation from a teacher's score per candidate)"""
    scale: float = 20.0
    """mnrl, cosent: the similarity scale (1 / temperature)"""
    symmetric: bool = False
    """mnrl: add the positive -> anchors direction, the two averaged"""
    mini_batch_size: int = 32
    """cached-mnrl: texts per forward pass (memory); the gradient is the whole batch's"""
    matryoshka_dims: str | None = None
    """train the leading dimensions to work alone too, e.g. 384,256,128,64 (the loss summed over them)"""
    matryoshka_weights: str | None = None
    """weights of the matryoshka terms, one per dimension (default: all 1)"""
    anchor_column: str | None = None
    """the anchor (query) column (default: anchor, query, question, sentence1, ...)"""
    positive_column: str | None = None
    """the positive column (default: positive, passage, document, answer, sentence2, ...)"""
    negative_columns: str | None = None
    """comma-separated hard-negative columns (default: every column named negative*)"""
    score_column: str | None = None
    """the score (cosent, cosine), margin (margin-mse) or teacher's scores per candidate (colbert: distillation)
    column (default: score / label / margin; colbert: none)"""
    query_prompt: str | None = None
    """text put before every anchor, e.g. 'query: ' (default: the start folder's prompt; saved with the model)"""
    passage_prompt: str | None = None
    """text put before every positive and negative, e.g. 'passage: ' (default: the start folder's prompt)"""
    pooling: str | None = None
    """cls, mean or max (default: the start folder's sentence-transformers pooling, else mean)"""
    normalize: bool | None = None
    """write a Normalize module: vectors L2-normalised (default: as the start folder; yes for a plain folder)"""
    allow_duplicates: bool = False
    """let a batch hold rows that share a text (by default none do: no false in-batch negatives)"""
    validation: str | None = None
    """a BEIR-layout folder to evaluate on during training; the best model is kept in OUT/best"""
    validation_split: str = "test"
    """which qrels/<split>.tsv of --validation"""
    eval_every: int | None = None
    """steps between validations (default: the end only)"""
    metric: str = "ndcg@10"
    """the validation metric that picks the best model"""
    splade_query_lambda: float = DEFAULT_QUERY_LAMBDA
    """splade: weight of the FLOPS regulariser on the queries, reached after --splade-warmup"""
    splade_document_lambda: float = DEFAULT_DOCUMENT_LAMBDA
    """splade: weight of the FLOPS regulariser on the documents (positives and hard negatives)"""
    splade_warmup: float = round(DEFAULT_WARMUP, 4)
    """splade: the regulariser weights grow quadratically from 0 over this fraction of the steps (< 1) or steps"""
    early_stopping: int | None = None
    """stop after this many validations in a row without a better --metric (needs --validation and --eval-every);
    OUT/best holds the best model"""
    # length of the run, batch, optimiser, precision, seed, device, checkpoints, resume: shared with the reranker
    training: PairTraining = field(default_factory=PairTraining)
    # a multi-vector model's token dimensions and lengths (--loss colbert)
    colbert: colbert.ColbertOptions = field(default_factory=colbert.ColbertOptions)
    # under torchrun: DDP replicas or FSDP2 shards (`train/fsdp.py`), as for pre-training
    parallel: ShardingOptions = field(default_factory=ShardingOptions)

    def __post_init__(self) -> None:
        if self.loss not in LOSS_ROWS:
            raise ConfigError(f"unknown loss {self.loss!r}; expected one of {', '.join(LOSS_ROWS)}")
        if self.loss == "colbert" and (self.matryoshka_dims or self.symmetric or self.pooling or self.max_seq_length
                                       or self.normalize is not None):
            raise ConfigError("--loss colbert takes no --matryoshka-dims, --symmetric, --pooling, --normalize or "
                              "--max-seq-length: its vectors are one per token, L2-normalised, its lengths "
                              "--query-length / --document-length")
        if self.batch_size < 2 and self.loss in ("mnrl", "cached-mnrl", "cosent", "splade") or (
                self.batch_size < 2 and self.loss == "colbert" and not self.score_column):
            raise ConfigError(f"batch-size must be at least 2 for {self.loss}: it learns from the batch's other rows")
        if not self.scale > 0:
            raise ConfigError(f"scale must be positive, got {self.scale}")
        if self.early_stopping is not None and (self.early_stopping < 1 or not self.validation or not self.eval_every):
            raise ConfigError("early-stopping takes a patience of at least 1 validation, and needs --validation and "
                              "--eval-every")
        self.dims  # parses
        if self.loss == "splade":
            if self.matryoshka_dims or self.pooling not in (None, "splade"):
                raise ConfigError("--loss splade trains sparse vocabulary weights: no --matryoshka-dims or --pooling")
            if min(self.splade_query_lambda, self.splade_document_lambda, self.splade_warmup) < 0:
                raise ConfigError("splade-query-lambda, splade-document-lambda and splade-warmup must not be negative")

    @property
    def dims(self) -> list[int]:
        if not self.matryoshka_dims:
            return []
        try:
            dims = [int(d) for d in str(self.matryoshka_dims).split(",") if d.strip()]
        except ValueError:
            raise ConfigError(f"matryoshka-dims must be comma-separated integers, got {self.matryoshka_dims!r}") from None
        if not dims or min(dims) < 1:
            raise ConfigError(f"matryoshka-dims must be positive integers, got {self.matryoshka_dims!r}")
        return sorted(set(dims), reverse=True)

    @property
    def weights(self) -> list[float] | None:
        if not self.matryoshka_weights:
            return None
        try:
            return [float(w) for w in str(self.matryoshka_weights).split(",") if w.strip()]
        except ValueError:
            raise ConfigError(f"matryoshka-weights must be comma-separated numbers, got {self.matryoshka_weights!r}") \
                from None


# settings a resumed run may take anew (the rest are the run's own)
MAY_CHANGE = ("progress", "save_every", "eval_every", "device", "sharding", "fsdp_cpu_offload")


# ---------------------------------------------------------------------------------------------- the model
class SentenceEncoder(nn.Module):
    """An encoder and its pooling: one column's inputs -> (B, H) fp32 sentence embeddings (not normalised)."""

    def __init__(self, encoder: nn.Module, pooling: str):
        super().__init__()
        from ...infer.embeddings import POOLINGS

        self.encoder, self.pooling, self.pool = encoder, pooling, POOLINGS[pooling]

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = self.encoder(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                              token_type_ids=inputs["token_type_ids"]).last_hidden_state
        return self.pool(hidden.float(), inputs["attention_mask"])


def encode(model: nn.Module, inputs) -> torch.Tensor:
    return model(inputs)


# ---------------------------------------------------------------------------------------------- the data
@dataclass
class TokenizedRows:
    """Each distinct text's token ids once; per role, each row's index into them."""

    ids: list[list[int]]
    rows: dict[str, list[int]]  # role -> text index per row
    labels: list[float] | None

    def __len__(self) -> int:
        return len(self.rows["anchor"])


def tokenize_rows(rows: TrainingRows, tokenizer, max_length: int, query_prompt: str = "",
                  passage_prompt: str = "") -> TokenizedRows:
    from ...infer.inputs import encode as encode_texts

    index: dict[str, int] = {}
    by_role: dict[str, list[int]] = {}
    for role, texts in rows.texts.items():
        prompt = query_prompt if role == "anchor" else passage_prompt
        by_role[role] = [index.setdefault(prompt + t, len(index)) for t in texts]
    unique = list(index)
    return TokenizedRows(encode_texts(tokenizer, unique, max_length).input_ids, by_role, rows.labels)


def no_duplicate_batches(data: TokenizedRows, batch_size: int, seed: int, epoch: int,
                         no_duplicates: bool = True) -> list[list[int]]:
    """Epoch `epoch`'s batches of row indices (see the module docstring); a function of (seed, epoch)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(len(data), generator=g).tolist()
    if not no_duplicates:
        return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    texts = [tuple(data.rows[role][i] for role in data.rows) for i in range(len(data))]
    remaining = dict.fromkeys(order)
    batches = []
    while remaining:
        seen: set[int] = set()
        batch: list[int] = []
        for i in remaining:
            if seen.intersection(texts[i]):
                continue
            batch.append(i)
            seen.update(texts[i])
            if len(batch) == batch_size:
                break
        for i in batch:
            del remaining[i]
        batches.append(batch)
    return batches


def collate(data: TokenizedRows, batch: Sequence[int]) -> dict:
    from ...infer.length_buckets import model_inputs

    out: dict = {role: model_inputs([data.ids[rows[i]] for i in batch]) for role, rows in data.rows.items()}
    if data.labels is not None:
        out["labels"] = torch.tensor([data.labels[i] for i in batch], dtype=torch.float32)
    return out


def count_batch_tokens(batch: dict) -> int:
    return sum(int(v["attention_mask"].sum()) for v in batch.values() if isinstance(v, dict))


class EpochPlan:
    """Batches epoch after epoch, each epoch's computed when first needed; `batches(step)` starts at `step`."""

    def __init__(self, data: TokenizedRows, batch_size: int, seed: int, no_duplicates: bool, collate=collate):
        self.data, self.batch_size, self.seed, self.no_duplicates = data, batch_size, seed, no_duplicates
        self.collate = collate
        self._epochs: dict[int, list[list[int]]] = {}

    def epoch(self, e: int) -> list[list[int]]:
        if e not in self._epochs:
            self._epochs[e] = no_duplicate_batches(self.data, self.batch_size, self.seed, e, self.no_duplicates)
        return self._epochs[e]

    def steps_for(self, epochs: float) -> int:
        whole = int(epochs)
        steps = sum(len(self.epoch(e)) for e in range(whole))
        return steps + int(round((epochs - whole) * len(self.epoch(whole)))) if epochs > whole else steps

    def batches(self, step: int) -> Iterator[dict]:
        e = 0
        while step >= len(self.epoch(e)):
            step -= len(self.epoch(e))
            e += 1
        while True:
            for batch in self.epoch(e)[step:]:
                yield self.collate(self.data, batch)
            e, step = e + 1, 0


# ---------------------------------------------------------------------------------------------- output
def save_folder(model: SentenceEncoder, tokenizer, settings: EmbeddingSettings, max_length: int, out: Path) -> Path:
    """`out` as a sentence-transformers folder, written whole or not at all."""
    from ...checkpoint.pretrained import save_pretrained

    with atomic_directory(out, keep_existing=False) as tmp:
        save_pretrained(model.encoder, tmp)
        tokenizer.save_pretrained(tmp)
        write_settings(tmp, settings, model.encoder.config.hidden_size, max_length)
    return out


@dataclass
class EmbeddingFinetuneResult:
    out_dir: Path
    final: Path | None
    best: Path | None
    train: object  # loop.TrainResult
    validation: dict
    best_validation: dict
    rows: int
    steps: int


def _settings(cfg: EmbeddingFinetuneConfig, model_dir: Path, start: EmbeddingSettings | None = None) -> EmbeddingSettings:
    settings = start or read_settings(model_dir, cfg.pooling)
    for name in ("pooling", "normalize", "query_prompt", "passage_prompt"):
        if getattr(cfg, name) is not None:
            setattr(settings, name, getattr(cfg, name))
    if cfg.loss == "margin-mse" and cfg.normalize is None:
        settings.normalize = False  # margins are dot products; a Normalize module would change what was learned
        settings.similarity = "dot"
    settings.matryoshka_dims = cfg.dims
    return settings


def run_finetune(cfg: EmbeddingFinetuneConfig, given: set[str] | None = None) -> EmbeddingFinetuneResult:
    from ...infer.embeddings import POOLINGS, Embedder
    from ...infer.multivector import ColbertEmbedder
    from ...infer.runtime import length_limit, model_family
    from ...infer.sparse import SpladeEncoder

    cfg = start_run(EmbeddingFinetuneConfig, cfg, MAY_CHANGE, given, "the training rows")
    if torchrun_world_size() > 1:  # refused before the process group is joined
        if cfg.early_stopping:
            raise ConfigError("--early-stopping runs in one process (the stop is decided from rank 0's validation "
                              "alone); drop it under torchrun")
        if cfg.validation and cfg.sharding == "fsdp":
            raise ConfigError("--validation runs on rank 0's whole model: use --sharding ddp with it")
    out = Path(cfg.out)
    model_dir = Path(cfg.model)
    family = model_family(model_dir)
    if family.base_model is None:
        raise BertlabError(f"{model_dir}: {family.name} models have no bare encoder to embed with")
    settings = _settings(cfg, model_dir)
    sparse, multi_vector = cfg.loss == "splade", cfg.loss == "colbert"
    if sparse:
        settings.pooling, settings.normalize, settings.similarity = "splade", False, "dot"
    elif not multi_vector and settings.pooling not in POOLINGS:
        raise ConfigError(f"unknown pooling {settings.pooling!r}; expected one of {', '.join(POOLINGS)}")

    kind = colbert.row_kind(cfg.score_column) if multi_vector else LOSS_ROWS[cfg.loss]
    rows = read_rows(cfg.train, kind, cfg.anchor_column, cfg.positive_column,
                     [c.strip() for c in cfg.negative_columns.split(",")] if cfg.negative_columns else None,
                     cfg.score_column)
    if len(rows) < 2 and kind != "margin":
        raise BertlabError(f"{cfg.train}: {len(rows)} row; training needs at least 2")
    precision = "bf16" if cfg.bf16 else "fp32"
    dist, sharding = join_job(cfg.device, cfg.sharding, precision, cfg.fsdp_cpu_offload)
    device = dist.device
    tokenizer = family.load_tokenizer(model_dir)
    encoder = load_mlm(model_dir) if sparse else family.base_model.from_pretrained(model_dir)
    max_length = length_limit(model_dir, encoder.config, tokenizer, cfg.max_seq_length or settings.max_seq_length)
    hidden = encoder.config.hidden_size
    if cfg.dims and max(cfg.dims) > hidden:
        raise ConfigError(f"matryoshka-dims {cfg.dims} exceed the model's {hidden} dimensions")
    if multi_vector:
        multi = colbert.settings_for(model_dir, cfg.colbert)
        model = colbert.build_model(model_dir, encoder, tokenizer, multi, cfg.seed).to(device)
        data = colbert.tokenize_rows(rows, tokenizer, multi, settings.query_prompt, settings.passage_prompt)
        plan = EpochPlan(data, cfg.batch_size, cfg.seed, not cfg.allow_duplicates, colbert.collate)
        prompts = {k: v for k, v in (("query", settings.query_prompt), ("document", settings.passage_prompt)) if v}

        def save(m, where: Path) -> Path:
            return colbert.save_folder(m, tokenizer, multi, prompts, where)
    else:
        model = (SpladeModel(encoder) if sparse else SentenceEncoder(encoder, settings.pooling)).to(device)
        data = tokenize_rows(rows, tokenizer, max_length, settings.query_prompt, settings.passage_prompt)
        plan = EpochPlan(data, cfg.batch_size, cfg.seed, not cfg.allow_duplicates)

        def save(m, where: Path) -> Path:
            return (save_sparse_folder if sparse else save_folder)(m, tokenizer, settings, max_length, where)
    steps = cfg.max_steps or plan.steps_for(cfg.epochs)
    plain_encoder = type(model.encoder) if sharding == "fsdp" else None
    if sharding == "fsdp":  # before the optimizer: FSDP2 replaces the parameters by their shards
        shard_model(model, precision, cfg.fsdp_cpu_offload)
    # Under torchrun every process collates the whole global batch and embeds its share of it: the objective sees
    # every process's rows (`losses.across_processes`), so in-batch negatives are the global batch's.
    shared = (lambda fn, **kw: across_processes(fn, dist.rank, dist.world_size, **kw)) if dist.world_size > 1 \
        else (lambda fn, **kw: fn)
    log.info("%d rows (%s), %d distinct texts; %d steps of %d rows; loss %s; pooling %s%s", len(rows),
             ", ".join(f"{r}={c}" for r, c in rows.columns.items()), len(data.ids), steps, cfg.batch_size, cfg.loss,
             "colbert" if multi_vector else settings.pooling,
             f"; prompts {settings.query_prompt!r} / {settings.passage_prompt!r}"
             if settings.query_prompt or settings.passage_prompt else "")

    if sparse:
        ramp = int(cfg.splade_warmup * steps) if cfg.splade_warmup < 1 else int(cfg.splade_warmup)
        loss_fn = splade_loss(lambda: trainer.step, ramp, cfg.splade_query_lambda, cfg.splade_document_lambda,
                              encode=shared(encode))
    elif multi_vector:
        loss_fn = plain_loss(colbert.build_objective(kind == "candidate-scores"),
                             colbert.encode_with(shared(colbert.vectors, whole_width=True)))
    else:
        objective = build_objective(cfg.loss, cfg.scale, cfg.symmetric, cfg.dims, cfg.weights)
        loss_fn = cached_loss(objective, encode, cfg.mini_batch_size, dist.rank, dist.world_size) \
            if cfg.loss == "cached-mnrl" else plain_loss(objective, shared(encode))
    optimizer = adamw(model, lr=cfg.lr, weight_decay=cfg.weight_decay, eps=cfg.adam_eps)
    scheduler = linear_warmup_decay(optimizer, cfg.training.warmup_steps, steps)

    out.mkdir(parents=True, exist_ok=True)
    if dist.is_main:
        write_run_config(out, run_record(cfg, {"steps": steps, "max_seq_length": max_length,
                                               "pooling": settings.pooling, "normalize": settings.normalize,
                                               "rows": len(rows), "world_size": dist.world_size,
                                               "sharding": sharding}))
    evaluate, best = None, {"value": None, "metrics": {}}
    if cfg.validation:
        valset = load_retrieval_set(cfg.validation, cfg.validation_split)
        cutoffs = sorted({int(cfg.metric.split("@")[1]) if "@" in cfg.metric else 10, 1, 10, 100})
        record = out / "best" / BEST_RECORD
        if cfg.resume and record.is_file():
            best = json.loads(record.read_text())

        def evaluate(m):
            if sparse:
                metrics = evaluate_sparse(SpladeEncoder(m.encoder, tokenizer, max_length), settings, valset, cutoffs)
            elif multi_vector:
                metrics = evaluate_colbert(ColbertEmbedder(m, tokenizer, multi), settings, valset, cutoffs, out)
            else:
                embedder = Embedder(m.encoder, tokenizer, settings.pooling, settings.scored_normalized, max_length)
                metrics = evaluate_embedder(embedder, settings, valset, cutoffs, out)
            if cfg.metric not in metrics:
                raise ConfigError(f"metric {cfg.metric!r} is not one of {', '.join(metrics)}")
            if best["value"] is None or metrics[cfg.metric] > best["value"]:
                best.update(value=metrics[cfg.metric], metrics=metrics, step=trainer.step)
                save(m, out / "best")
                (out / "best" / BEST_RECORD).write_text(json.dumps(best, indent=2) + "\n")
            return metrics

    def batches(step: int) -> Iterator[dict]:
        """The plan's batches from `step` on, ending once --early-stopping's patience is spent. Judged from the
        best validation's step alone (saved in OUT/best), so a resumed run stops where the whole one would."""
        for batch in plan.batches(step):
            if stale(step):
                log.info("early stopping at step %d: %d validations without a better %s than %.4f (step %d)", step,
                         step // cfg.eval_every - best["step"] // cfg.eval_every, cfg.metric, best["value"],
                         best["step"])
                best["stopped_at"] = step
                return
            yield batch
            step += 1

    def stale(step: int) -> bool:
        return (cfg.early_stopping is not None and best["value"] is not None
                and step // cfg.eval_every - best["step"] // cfg.eval_every >= cfg.early_stopping)

    loop = loop_config(cfg, out, steps, cfg.eval_every if cfg.validation else None)
    # DDP: an encoder's pooler (BERT's) gets no gradient from sentence embeddings, which DDP must be told
    loop.find_unused_parameters = sharding == "ddp"
    trainer = Trainer(model, optimizer, scheduler, loss_fn, batches, loop, evaluate=evaluate,
                      # every process collates the whole batch and embeds 1/N of it: its tokens are 1/N
                      token_counter=lambda batch: count_batch_tokens(batch) // dist.world_size)
    started = time.perf_counter()
    result = trainer.fit(resume=cfg.resume)
    final = None
    if not result.interrupted and sharding == "fsdp":  # gathered whole on rank 0 (collective), saved as always
        def plain() -> nn.Module:
            bare = plain_encoder(model.encoder.config)
            if sparse:
                return SpladeModel(bare)
            return colbert.ColbertModel(bare, multi.dim) if multi_vector else SentenceEncoder(bare, settings.pooling)
        model = unsharded_copy(model, plain)
    if not result.interrupted and dist.is_main:
        final = save(model, out / "final")
        summary = {"steps": result.step, "rows": len(rows), "train_seconds": round(result.elapsed, 1),
                   "wall_seconds": round(time.perf_counter() - started, 1), "loss": result.metrics.get("loss"),
                   "validation": result.eval_metrics, "best": best}
        (out / "metrics.json").write_text(json.dumps(summary, indent=2) + "\n")
    barrier(dist)
    return EmbeddingFinetuneResult(out, final, (out / "best") if best["value"] is not None else None, result,
                                   result.eval_metrics, best, len(rows), steps)
