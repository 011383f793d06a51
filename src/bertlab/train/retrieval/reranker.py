"""`finetune-reranker`: a cross-encoder (a sequence classifier with one output, scoring a (query, passage) pair
read together) fine-tuned on the user's rows.

Rows (`tasks.tables` formats):

    query, passage, label      pointwise: a relevance label in [0, 1] per pair            (bce)
    query, passage, score      a teacher's score per pair                                 (distill)
    query, positive, negative_1, ..., negative_k    groups (`mine-negatives`'s output):
                               bce reads each as 1 + k pointwise pairs (1, then 0s);
                               listwise takes the softmax cross-entropy over the group's k + 1 scores, the
                               positive the target (the InfoNCE of a cross-encoder)

Losses: `bce` -- binary cross-entropy with logits (sentence-transformers' BinaryCrossEntropyLoss); `listwise`
as above; `distill` -- mean squared error between the logit and the teacher's score (its MSELoss). The head
is the family's text-classification head with one label, new on an encoder folder, kept on a reranker
folder. The shared training loop runs it (AdamW, warmup and linear decay, bf16, checkpoints, exact resume).
OUT/final is a Hugging Face folder that `bertlab serve --classify-model` serves on /rerank and
sentence-transformers' `CrossEncoder` loads with the same scores (tests check both).

Under torchrun (`--sharding ddp|fsdp`, `train/fsdp.py`) each process trains its contiguous share of every global
batch's groups (`batches.shuffled_batches` with the process's rank): every loss here is a mean over groups of one
size (listwise) or over pairs (bce, distill), so the mean of the equal shares' losses that DDP's and FSDP's
gradient averaging takes is the global batch's loss -- the batch size must divide by the processes.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ...core.errors import BertlabError, ConfigError
from ...core.fsio import atomic_directory
from ...tasks.tables import guess_column, read_table
from ..batches import shuffled_batches, steps_for_epochs
from ..distributed import barrier, torchrun_world_size
from ..fsdp import join_job, shard_model, unsharded_copy
from ..loop import Trainer
from ..optim import adamw, linear_warmup_decay
from ..options import ShardingOptions
from ..runconfig import GroupedSettings
from ..run_record import run_record, write_run_config
from .recipe import PairTraining, loop_config, start_run

log = logging.getLogger(__name__)

LOSSES = ("bce", "listwise", "distill")
QUERY_COLUMNS = ("query", "anchor", "question", "sentence1")
PASSAGE_COLUMNS = ("passage", "document", "text", "sentence2")
RELEVANCE_COLUMNS = ("label", "score", "relevance")
# settings a resumed run may take anew (the rest are the run's own)
MAY_CHANGE = ("progress", "save_every", "device", "sharding", "fsdp_cpu_offload")


@dataclass
class RerankerTraining(PairTraining):
    """A reranker's training: its defaults where they differ from an embedding model's."""

    batch_size: int = 16
    """rows (groups for listwise) per optimizer step"""
    lr: float = 2e-5
    weight_decay: float = 0.01
    adam_eps: float = 1e-6
    # Freed memory is returned to the system, not kept in the process (`host_memory`): a reranker's batches change
    # shape every step (groups of pairs up to max_length), and the kept heap only grew -- all-MiniLM-L6-v2, batch 8
    # groups of 4 pairs of up to 256 tokens: 6.0 GB after 8 steps, 9.3 GB after 24, killed for memory (24 GB)
    # after ~250; without it 5.0 GB after 24 steps.
    retain_freed_memory: bool = False


@dataclass
class RerankerConfig(GroupedSettings):
    """`bertlab finetune-reranker`'s settings; the string under each field is its `--help`."""

    model: str | None = None
    """the starting model: an encoder folder (a new one-output head) or a cross-encoder folder"""
    train: str | None = None
    """the rows: query, passage, label|score; or query, positive, negative_1 ... groups"""
    out: str | None = None
    """OUT_DIR: final/ (the reranker), checkpoints, metrics.jsonl, run_config.json"""
    loss: str = "bce"
    """bce (pointwise labels, or groups as 1/0 pairs), listwise (groups: softmax over positive and negatives),
    distill (MSE to a teacher's scores)"""
    query_column: str | None = None
    """the query column (default: query, anchor, question)"""
    passage_column: str | None = None
    """pointwise rows: the passage column (default: passage, document, text)"""
    label_column: str | None = None
    """pointwise rows: the label or teacher-score column (default: label, score)"""
    # length of the run, batch, optimiser, precision, seed, device, checkpoints, resume: shared with
    # finetune-embeddings
    training: RerankerTraining = field(default_factory=RerankerTraining)
    # under torchrun: DDP replicas or FSDP2 shards (`train/fsdp.py`), as for fine-tuning
    parallel: ShardingOptions = field(default_factory=ShardingOptions)

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ConfigError(f"unknown loss {self.loss!r}; expected one of {', '.join(LOSSES)}")


def read_reranker_rows(cfg: RerankerConfig) -> tuple[list[list[tuple[str, str]]], list[list[float]]]:
    """Groups of (query, passage) pairs and their targets: one pair per group for pointwise rows."""
    table = read_table(cfg.train)
    cols = table.columns
    query = table.require(cfg.query_column, "query") if cfg.query_column else guess_column(cols, QUERY_COLUMNS)
    if query is None:
        raise BertlabError(f"{table.path}: no query column ({', '.join(QUERY_COLUMNS)}); the file has columns: "
                           f"{', '.join(cols)} -- name it with --query-column")
    grouped = "positive" in cols
    negatives = sorted((c for c in cols if c.lower().startswith("negative")), key=lambda c: (len(c), c))
    if grouped and not negatives:
        raise BertlabError(f"{table.path}: a positive column but no negative column; groups are query, positive, "
                           "negative_1, ...")
    if cfg.loss == "listwise" and not grouped:
        raise BertlabError(f"{table.path}: listwise needs groups (query, positive, negative_1, ...); the file has "
                           f"columns: {', '.join(cols)}")
    if cfg.loss == "distill" and grouped:
        raise BertlabError(f"{table.path}: distill needs query, passage, score rows (a teacher's score per pair)")
    passage = label = None
    if not grouped:
        passage = table.require(cfg.passage_column, "passage") if cfg.passage_column else \
            guess_column(cols, PASSAGE_COLUMNS, exclude=(query,))
        label = table.require(cfg.label_column, "label") if cfg.label_column else guess_column(cols, RELEVANCE_COLUMNS)
        if passage is None or label is None:
            raise BertlabError(f"{table.path}: pointwise rows need a passage and a label column; the file has "
                               f"columns: {', '.join(cols)}")
    groups, targets = [], []
    for row in table.rows:
        q = table.text(row, query)
        texts = [table.text(row, c) for c in (["positive", *negatives] if grouped else [passage])]
        for c, t in zip(["positive", *negatives] if grouped else [passage], texts):
            if not t.strip():
                raise table.error(row, f"empty text in column {c!r}")
        if not q.strip():
            raise table.error(row, f"empty text in column {query!r}")
        if grouped:
            group_targets = [1.0] + [0.0] * len(negatives)
        else:
            try:
                group_targets = [float(row.values.get(label))]
            except (TypeError, ValueError):
                raise table.error(row, f"column {label!r} holds {row.values.get(label)!r}, expected a number") from None
            if cfg.loss == "bce" and not 0 <= group_targets[0] <= 1:
                raise table.error(row, f"label {group_targets[0]} is outside [0, 1] (bce); a teacher's scores: "
                                       "--loss distill")
        groups.append([(q, t) for t in texts])
        targets.append(group_targets)
    if cfg.loss == "bce" and grouped:  # pointwise: every pair its own row
        groups = [[pair] for g in groups for pair in g]
        targets = [[t] for g in targets for t in g]
    return groups, targets


class PairGroups(torch.utils.data.Dataset):
    def __init__(self, features: list[list[dict]], targets: list[list[float]]):
        self.features, self.targets = features, targets

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, i: int):
        return self.features[i], self.targets[i]


def collate_groups(items) -> dict:
    from ...infer.length_buckets import model_inputs

    rows = [f for group, _ in items for f in group]
    inputs = model_inputs([r["input_ids"] for r in rows], [r["token_type_ids"] for r in rows])
    inputs["labels"] = torch.tensor([t for _, targets in items for t in targets], dtype=torch.float32)
    inputs["group_size"] = torch.tensor(len(items[0][0]))
    return inputs


def reranker_loss(loss: str):
    def loss_fn(model, batch):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       token_type_ids=batch["token_type_ids"]).logits[:, 0].float()
        labels = batch["labels"]
        if loss == "bce":
            return F.binary_cross_entropy_with_logits(logits, labels), {}
        if loss == "distill":
            return F.mse_loss(logits, labels), {}
        grouped = logits.view(-1, int(batch["group_size"]))  # listwise: the positive is each group's first
        return F.cross_entropy(grouped, torch.zeros(len(grouped), dtype=torch.long, device=grouped.device)), {}
    return loss_fn


def count_pair_tokens(batch: dict) -> int:
    return int(batch["attention_mask"].sum())


@dataclass
class RerankerResult:
    out_dir: Path
    final: Path | None
    train: object
    rows: int
    steps: int


def run_reranker(cfg: RerankerConfig, given: set[str] | None = None) -> RerankerResult:
    from ...checkpoint.pretrained import save_pretrained
    from ...infer.inputs import encode as encode_texts
    from ...infer.runtime import length_limit, model_family

    cfg = start_run(RerankerConfig, cfg, MAY_CHANGE, given, "the rows")
    out = Path(cfg.out)
    if cfg.batch_size % torchrun_world_size():  # refused before the process group is joined
        raise ConfigError(f"batch-size ({cfg.batch_size}) must be a multiple of the {torchrun_world_size()} "
                          "processes: each trains an equal share of every batch's groups")
    groups, targets = read_reranker_rows(cfg)
    precision = "bf16" if cfg.bf16 else "fp32"
    dist, sharding = join_job(cfg.device, cfg.sharding, precision, cfg.fsdp_cpu_offload)
    micro = cfg.batch_size // dist.world_size
    model_dir = Path(cfg.model)
    family = model_family(model_dir)
    head = family.head("text-classification", "finetune-reranker")
    tokenizer = family.load_tokenizer(model_dir)
    torch.manual_seed(cfg.seed)  # the new head's weights
    model = head.model_class.from_pretrained(model_dir, id2label={0: "LABEL_0"})
    if getattr(model, "num_labels", model.config.num_labels) != 1:
        raise BertlabError(f"{model_dir}: a classifier with {model.config.num_labels} labels; a reranker has one output")
    max_length = length_limit(None, model.config, tokenizer, cfg.max_seq_length)
    flat = [pair for g in groups for pair in g]
    enc = encode_texts(tokenizer, [q for q, _ in flat], max_length, pairs=[p for _, p in flat])
    features, start = [], 0
    for g in groups:
        features.append([{"input_ids": enc.input_ids[start + i], "token_type_ids": enc.token_type_ids[start + i]}
                         for i in range(len(g))])
        start += len(g)
    data = PairGroups(features, targets)
    steps = cfg.max_steps or steps_for_epochs(cfg.epochs, len(data), micro, world_size=dist.world_size)
    model = model.to(dist.device)
    plain_class = type(model)  # (under FSDP the sharded model's class is FSDP's subclass of it)
    if sharding == "fsdp":  # before the optimizer: FSDP2 replaces the parameters by their shards
        shard_model(model, precision, cfg.fsdp_cpu_offload)
    log.info("%d %s of %d pair(s); %d steps of %d; loss %s", len(data), "groups" if len(groups[0]) > 1 else "rows",
             len(groups[0]), steps, cfg.batch_size, cfg.loss)
    optimizer = adamw(model, lr=cfg.lr, weight_decay=cfg.weight_decay, eps=cfg.adam_eps)
    scheduler = linear_warmup_decay(optimizer, cfg.training.warmup_steps, steps)
    out.mkdir(parents=True, exist_ok=True)
    if dist.is_main:
        write_run_config(out, run_record(cfg, {"steps": steps, "max_seq_length": max_length, "rows": len(data),
                                               "world_size": dist.world_size, "sharding": sharding}))
    trainer = Trainer(model, optimizer, scheduler, reranker_loss(cfg.loss),
                      lambda step: shuffled_batches(data, micro, collate_groups, seed=cfg.seed, start=step,
                                                    rank=dist.rank, world_size=dist.world_size),
                      loop_config(cfg, out, steps), token_counter=count_pair_tokens)
    started = time.perf_counter()
    result = trainer.fit(resume=cfg.resume)
    final = None
    if not result.interrupted and sharding == "fsdp":  # gathered whole on rank 0 (collective), saved as always
        model = unsharded_copy(model, lambda: plain_class(model.config))
    if not result.interrupted and dist.is_main:
        final = out / "final"
        with atomic_directory(final, keep_existing=False) as tmp:
            save_pretrained(model, tmp)
            tokenizer.save_pretrained(tmp)
        (out / "metrics.json").write_text(json.dumps({
            "steps": result.step, "rows": len(data), "train_seconds": round(result.elapsed, 1),
            "wall_seconds": round(time.perf_counter() - started, 1), "loss": result.metrics.get("loss")}, indent=2) + "\n")
    barrier(dist)
    return RerankerResult(out, final, result, len(data), steps)
