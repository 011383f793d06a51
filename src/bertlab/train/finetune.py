"""Fine-tuning (BERT paper, section 4 and appendix A.3): one pre-trained model + one added layer, per task.

The recipe configures the shared training loop (`loop.Trainer`) -- it has no loop of its own:

    for each hyper-parameter setting (one, or the paper's grid: batch 16/32 x lr 5e-5/3e-5/2e-5 x epochs 2/3/4)
      for each seed (`--seeds N`: small-data fine-tuning is unstable, so report mean ± sd)
        head on the pre-trained encoder (seeded) -> AdamW (decay 0.01, not on biases/LayerNorm; optional
        layer-wise LR decay) -> linear warmup over `warmup_proportion` of the steps, linear decay to 0
        -> Trainer.fit (gradient accumulation, bf16, clipping at 1.0) -> score every dev split, streaming
        predictions to disk
    keep the setting with the best mean dev score (the first dev split's `main_metric`), and of its seeds
    the best run: its model goes to OUT_DIR/model (Hugging Face layout, with vocab.txt), its dev predictions
    to OUT_DIR, and it writes the test-set prediction files; everything lands in OUT_DIR/metrics.json.

OUT_DIR/
    metrics.json                 task, config, the selected setting, mean ± sd per dev metric, every run
    model/                       config.json + model.safetensors + vocab.txt + tokenizer_config.json
    {split}_predictions.*        dev predictions of the saved model (format chosen by the task)
    {Task}.tsv, ...              test predictions (GLUE submission format, SQuAD JSON, ...)
    runs/{name}/                 per run: the loop's metrics.jsonl, dev predictions, run.json
    sweep.json                   which settings of a grid are done and which run was exported (for --resume)

Resume (`--resume`, after Ctrl-C, SIGTERM or a crash): a run's training state is checkpointed on a signal
and every `--save-every` steps (`runs/{name}/checkpoints/`, dropped once the run is done); a run is done
when its run.json exists, and the best run of the setting in progress keeps its weights in
`runs/{name}/model/` until the setting is decided. `bertlab finetune TASK --out OUT --resume` skips the
runs that are done, continues the one that was interrupted from its checkpoint -- bitwise as if never
stopped, through the same loop and the same checkpoints as pre-training -- and goes on with the sweep.

Under torchrun (`--sharding ddp | fsdp`, as for pre-training: `fsdp.py`) every process trains its share of each
global batch of every run, and rank 0 alone prepares OUT_DIR, scores, keeps the best run and exports it (an FSDP
model gathered whole first); a signal on any process stops them all with one checkpoint, sharded under FSDP.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import itertools
import json
import logging
import math
import random
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from ..checkpoint.hf_layout import materialize, model_keys
from ..data.mixing import MIXING_RULES
from ..core.errors import BertlabError, ConfigError
from ..core.fsio import atomic_write_text
from ..nn.adapters import add_saved_adapters
from ..tasks import TASKS, DataError, TaskSpec, evaluate
from ..tasks.metrics import brief_scores
from ..tasks.base import Feature, feature_lengths
from ..tasks.own_splits import InputOptions
from . import methods
from .batches import shuffled_batches, steps_for_epochs
from .distributed import DistInfo, _current_dist, barrier, seed_everything, torchrun_world_size
from .fsdp import join_job, shard_model, unsharded_copy
from .loop import LoopConfig, Trainer, TrainResult
from .run_dir import CHECKPOINT_DIR, check_writable, claim_run_dir, latest_checkpoint
from .optim import adamw, linear_warmup_decay
from .random_init import INIT_DIR, random_start, resolve_init
from .runconfig import GroupedSettings
from .options import EpochTraining, OptimOptions, RunOptions, ShardingOptions
from .run_record import (RUN_CONFIG, autocast_dtype, lr_for_width, resolve_resume_config, run_record, split_batch,
                    write_run_config)

log = logging.getLogger(__name__)

# Defaults for a run without --lr, by the model's hidden size (the nearest width at or above it). The
# paper's grid tops out at 5e-5 for BERT-base/large; small models need more: all-MiniLM-L6-v2 (384 wide) on 800
# SST-2 sentences, 1 epoch, batch 16 -> dev accuracy 0.52 at 5e-5 (near chance), 0.76 at 1e-4; the old
# defaults (2e-5, batch 32) 0.51. BERT-Tiny (128 wide) on SST-2, 300 steps of 32 at length 64, dev accuracy at
# 1e-4 / 3e-4 / 1e-3 / 3e-3: from random weights 0.509 (one class) / 0.758 / 0.774 / 0.509 (one class); from the
# demo's pre-trained model 0.522 / 0.577 / 0.611 / 0.509 (one class) -- 1e-3 for 128 wide. 256 wide sits between
# (3e-4, the top of Google's recommended range for its small BERTs). docs: benchmarks.md, "Fine-tuning defaults".
DEFAULT_LR_BY_WIDTH = {128: 1e-3, 256: 3e-4, 512: 1e-4, 768: 5e-5, 1024: 3e-5}


def finetuning_lr(hidden_size: int) -> float:
    """The fine-tuning learning rate for a model `hidden_size` wide (see DEFAULT_LR_BY_WIDTH)."""
    return lr_for_width(DEFAULT_LR_BY_WIDTH, hidden_size)


def with_default_lr(cfg: FinetuneConfig, model_dir: str | Path | None = None) -> FinetuneConfig:
    """`cfg` with an unstated `lr` set to the default for the width of the model in `model_dir` (default:
    `cfg.model`), said in the log."""
    if cfg.lr is not None:
        return cfg
    model_dir = model_dir or cfg.model
    from ..models.auto import AutoConfig

    cfg = dataclasses.replace(cfg, lr=finetuning_lr(AutoConfig.from_pretrained(model_dir).hidden_size))
    log.info("%s: learning rate %g, the default for a model of its width (--lr sets another)", cfg.model, cfg.lr)
    return cfg


# The paper's fine-tuning grid (appendix A.3); the best setting on dev is kept.
PAPER_GRID = {"batch_size": (16, 32), "lr": (5e-5, 3e-5, 2e-5), "epochs": (2, 3, 4)}
GRIDS = {"paper": PAPER_GRID}


MULTI_TASK = "multi"  # the task name of `bertlab finetune-multi` (train/multitask.py)


@dataclass
class MultiTaskOptions:
    """`bertlab finetune-multi` (train/multitask.py): the tasks sharing one encoder and how batches mix."""

    tasks: str | None = None  # comma-separated task names
    mixing: str = "proportional"  # proportional | temperature | equal
    mixing_limit: int | None = None  # proportional / temperature: cap each task's size at K examples
    mixing_temperature: float = 2.0
    per_task_epochs: float | None = None  # then fine-tune each task alone from the multi-task model

    def __post_init__(self) -> None:
        if self.mixing not in MIXING_RULES:
            raise ConfigError(f"mixing must be one of {', '.join(MIXING_RULES)}, got {self.mixing!r}")
        if not self.mixing_temperature > 0 or (self.mixing_limit is not None and self.mixing_limit < 1):
            raise ConfigError("mixing-temperature must be positive and mixing-limit at least 1")

    @property
    def names(self) -> list[str]:
        return [t.strip() for t in (self.tasks or "").split(",") if t.strip()]


@dataclass
class FinetuneConfig(GroupedSettings):
    """Everything a fine-tuning run needs: defaults < a JSON file (`--config`) < flags, as for pre-training
    (`runconfig.config_from_args`); the run writes it to OUT_DIR/run_config.json. The settings every recipe
    shares are the `run` and `optim` groups (train/options.py), read flat: `cfg.lr`, `cfg.seed`."""

    task: str
    model: str  # a Hugging Face-layout BERT folder (config.json, model.safetensors, vocab.txt), or a size (tiny)
    data: str  # the task's folder (GLUE, CoNLL, SWAG) or file (SQuAD JSON); own-data tasks: the training file
    out: str
    # epochs or max_steps, batch (micro-batch x grad_accum), seeds, bf16, training / evaluation subsets
    training: EpochTraining = field(default_factory=EpochTraining)
    max_seq_length: int | None = None  # None: the task's default (128; NER 256; SQuAD 384)
    warmup_proportion: float = 0.1
    group_by_length: bool = True  # training batches of similar-length examples (see batches.shuffled_batches)
    layer_lr_decay: float | None = None  # e.g. 0.9: layer l gets lr * 0.9^(L-l); None: one lr
    grid: str | None = None  # "paper"
    eval_every: int | None = None  # also score dev every N steps (logged in metrics.jsonl); --eval-steps
    early_stopping: int | None = None  # stop after N dev evaluations without a better score; the best is kept
    # seed, device, checkpoints and resume (see the module docstring: a run's training state is saved on
    # Ctrl-C/SIGTERM, and every `save_every` steps when given, then also at a run's last step)
    run: RunOptions = field(default_factory=RunOptions)
    optim: OptimOptions = field(default_factory=OptimOptions)  # lr (None: by the model's width), decay, clipping
    inputs: InputOptions = field(default_factory=InputOptions)  # tasks on the user's own files (tasks/own_splits.py)
    tuning: methods.TuningOptions = field(default_factory=methods.TuningOptions)  # full / adapters / LoRA
    multi: MultiTaskOptions = field(default_factory=MultiTaskOptions)  # task "multi": train/multitask.py
    # under torchrun: DDP replicas or FSDP2 shards (`train/fsdp.py`), as for pre-training
    parallel: ShardingOptions = field(default_factory=ShardingOptions)
    overwrite: bool = False  # replace an earlier run's results in `out`; without it such an `out` is refused
    # a random start (train/random_init.py): `model` a size with `vocab`'s tokenizer, or a folder's shape
    vocab: str | None = None
    init: str | None = None  # pretrained | random; None: random for a size or a vocab, else pretrained

    def __post_init__(self) -> None:
        if self.task not in TASKS and self.task != MULTI_TASK:
            TASKS[self.task]  # raises the one-line "unknown task ... expected one of" error
        for name in ("batch_size", "grad_accum", "seeds", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        split_batch(self.batch_size, grad_accum=self.grad_accum)
        if not self.epochs > 0:
            raise ConfigError(f"epochs must be positive, got {self.epochs}")
        if not 0 <= self.warmup_proportion < 1:
            raise ConfigError(f"warmup-proportion must be in [0, 1), got {self.warmup_proportion}")
        if self.layer_lr_decay is not None and not 0 < self.layer_lr_decay <= 1:
            raise ConfigError(f"layer-lr-decay must be in (0, 1], got {self.layer_lr_decay}")
        if self.grid is not None and self.grid not in GRIDS:
            raise ConfigError(f"unknown grid {self.grid!r}; expected one of {', '.join(GRIDS)}")
        if self.max_steps is not None and self.max_steps < 1 or self.early_stopping is not None and self.early_stopping < 1:
            raise ConfigError("max-steps and early-stopping must be at least 1")
        if self.max_seq_length is not None and not 8 <= self.max_seq_length <= 4096:
            raise ConfigError(f"max-seq-length must be in [8, 4096], got {self.max_seq_length}")

    @property
    def precision(self) -> str:
        return "bf16" if self.bf16 else "fp32"

    def settings(self) -> list[dict[str, Any]]:
        """The hyper-parameter settings to try: the grid's product, or just this config's own."""
        if self.grid is None:
            return [{"batch_size": self.batch_size, "lr": self.lr, "epochs": self.epochs}]
        grid = GRIDS[self.grid]
        return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


@dataclass
class TaskData:
    """Examples and features of the training split and every dev split, featurized once for all runs."""

    train_examples: list
    train_features: list[Feature]
    eval_examples: dict[str, list]
    eval_features: dict[str, list[Feature]]


@dataclass
class RunResult:
    setting: dict[str, Any]
    seed: int
    scores: dict[str, dict[str, float]]  # dev split -> metric -> value
    steps: int
    train_seconds: float
    eval_seconds: float
    train_loss: float | None
    run_dir: str
    state: dict[str, torch.Tensor] | None = field(default=None, repr=False)  # weights, kept only while needed
    config: Any = field(default=None, repr=False)  # the model's config (its family's), to rebuild it from `state`
    details: dict[str, Any] = field(default_factory=dict)  # method and parameter counts, early stopping

    def main_score(self, spec: TaskSpec) -> float:
        value = self.scores[spec.eval_splits[0]].get(spec.main_metric, float("nan"))
        return value if math.isfinite(value) else -math.inf

    def to_json(self) -> dict[str, Any]:
        return {**self.setting, "seed": self.seed, "steps": self.steps, "train_seconds": round(self.train_seconds, 2),
                "eval_seconds": round(self.eval_seconds, 2), "train_loss": self.train_loss, "dev": self.scores,
                "run_dir": self.run_dir, **self.details}


# ---------------------------------------------------------------------------------------------- building blocks
class FinetuneTrainer(Trainer):
    """The shared loop, checkpointing only when asked: on a signal (Ctrl-C, SIGTERM), and every `save_every`
    steps when the user gave it. A fine-tuning run exports its model itself (OUT_DIR/model); the loop's
    training state -- weights plus two Adam moments, 3x the model -- would otherwise cost a write of ~1.3 GB
    per BERT-base run at its end, 90 times over for the paper's grid with 5 seeds. Everything else
    (metrics.jsonl, accumulation, precision, clipping, signals, exact resume) is the loop's."""

    def save_checkpoint(self):
        # `stopping`, not this process's own signal: under torchrun the save is collective, and a signal that
        # reached one process stops them all (the loop shares the flag)
        if not self.stopping and not self.config.save_every:
            return None
        return super().save_checkpoint()


class FinetuneInterrupted(KeyboardInterrupt):
    """A signal stopped a run of the sweep; `result.checkpoint` is what `--resume` continues from (None:
    nothing was saved, and the run starts again)."""

    def __init__(self, run_dir: Path, result: TrainResult):
        super().__init__(f"{run_dir}: interrupted at step {result.step}")
        self.run_dir, self.result = run_dir, result


class PretrainedStart:
    """The task model as loaded from the pre-trained folder, read once; `fresh(seed)` is a copy whose new
    layers (the head, and a pooler the checkpoint lacked) are initialised from `seed`. Every run of a grid
    then starts from the same encoder without re-reading and re-initialising the whole model from disk."""

    def __init__(self, spec: TaskSpec, model_dir: str | Path, reinitialise: bool = False, runs: int | None = None):
        self.reinitialise = reinitialise  # a random start: every seed draws the whole model anew, not only the head
        self.model_dir = str(Path(model_dir).resolve())  # an unmerged LoRA adapter names it as its base
        self.runs = runs  # fresh copies still to give; the last run gets the model itself (None: always copies)
        self.model, report = spec.build_model(model_dir, return_report=True)
        self.model.config.extra["finetuning_task"] = spec.name
        own = model_keys(self.model)  # the report names weights canonically (`pooler.dense.weight`), not as
        # the task model does (`bert.pooler.dense.weight`): a checkpoint without a pooler (MLM-only) needs this
        self.new_modules = sorted({own.get(name, name).rsplit(".", 1)[0] for name in report.initialized})

    def fresh(self, seed: int):
        seed_everything(seed)  # the new head's initialisation is part of what a seed decides
        if self.runs is not None:
            self.runs -= 1
        # the last run takes the loaded model itself: a second copy of the weights is held only while needed
        if self.runs is None or self.runs > 0:
            model = copy.deepcopy(self.model)
        else:
            model, self.model = self.model, None
        if self.reinitialise:
            model.init_weights()
        for name in self.new_modules:
            model.init_weights(model.get_submodule(name))
        return model


def subset(items: Sequence, limit: int | None, seed: int = 0) -> list:
    """A seeded random `limit` of `items`, in their original order (all of them when `limit` is None)."""
    if limit is None or limit >= len(items):
        return items if hasattr(items, "take") else list(items)  # a column store is shared, not copied row by row
    keep = sorted(random.Random(seed).sample(range(len(items)), limit))
    return items.take(keep) if hasattr(items, "take") else [items[i] for i in keep]


def load_task_data(spec: TaskSpec, data: str | Path, tokenizer, max_length: int, train_limit: int | None = None,
                   eval_limit: int | None = None) -> TaskData:
    train = subset(spec.read(data, "train"), train_limit)
    evals = {s: subset(spec.read(data, s), eval_limit) for s in spec.eval_splits}
    return TaskData(train, spec.featurize(train, tokenizer, max_length, train=True), evals,
                    {s: spec.featurize(ex, tokenizer, max_length, train=False) for s, ex in evals.items()})


def train_once(spec: TaskSpec, cfg: FinetuneConfig, data: TaskData, pretrained: "PretrainedStart",
               setting: dict[str, Any], seed: int, run_dir: Path, tokenizer, max_length: int,
               device: torch.device, sharding: str = "none") -> tuple[Any, RunResult | None]:
    """One fine-tuning run on the shared loop, then every dev split scored; returns (model, result).

    Under torchrun every process trains its share of each global batch (`sharding`: ddp or fsdp, as
    `join_processes` resolved it); rank 0 then holds the whole trained model and scores it, the others return
    (None, None)."""
    dist = _current_dist(device)
    batch_size, lr, epochs = setting["batch_size"], setting["lr"], setting["epochs"]
    # a grid's batch sizes are checked here: the global batch is micro x grad_accum x processes
    micro, _ = split_batch(batch_size, world_size=dist.world_size, grad_accum=cfg.grad_accum)
    model = pretrained.fresh(seed).to(device)
    tuning = methods.prepare(model, cfg.tuning, pretrained.new_modules, pretrained.model_dir)  # what trains
    total = cfg.max_steps or steps_for_epochs(epochs, len(data.train_features), micro, cfg.grad_accum,
                                              dist.world_size)
    head_class = type(model)
    if sharding == "fsdp":  # before the optimizer: FSDP2 replaces the parameters by their shards
        shard_model(model, cfg.precision, cfg.fsdp_cpu_offload)
    optimizer = adamw(model, lr=lr, weight_decay=cfg.weight_decay, layerwise_decay=cfg.layer_lr_decay)
    scheduler = linear_warmup_decay(optimizer, math.ceil(cfg.warmup_proportion * total), total)
    on_step = tuning.after_optimizer()  # gradual unfreezing: the optimizer holds every block, most frozen
    if on_step is not None:
        scheduler = StepCallback(scheduler, on_step)
    target_keys = spec.target_keys

    def loss_fn(m, batch):
        return spec.loss(m, batch), {}

    # Length-grouped batches: with dynamic padding a random batch is padded to its longest row, and on
    # GLUE/CoNLL sentences that is most of the compute; grouped, the padding nearly vanishes.
    lengths = feature_lengths(data.train_features) if cfg.group_by_length else None
    stopper = EarlyStopping(cfg.early_stopping, spec.main_metric) if cfg.early_stopping else None

    def batches(step: int):  # seekable: the loop asks for the data from optimizer step `step` on
        for batch in shuffled_batches(data.train_features, micro, collate_fn=spec.collate, seed=seed,
                                      start=step * cfg.grad_accum, lengths=lengths, rank=dist.rank,
                                      world_size=dist.world_size):
            if stopper is not None and stopper.stop:
                return  # the loop ends the run here ("data_exhausted")
            yield batch

    dev = spec.eval_splits[0]
    eval_every = cfg.eval_every or (max(1, total // max(1, round(epochs))) if stopper else None)
    periodic = None
    if eval_every:
        def periodic(m):
            scores = evaluate(spec, m, tokenizer, data.eval_examples[dev], dev, max_length=max_length,
                              batch_size=cfg.eval_batch_size, device=device, features=data.eval_features[dev])
            if stopper is not None:
                stopper.update(m, scores)
            return scores
    loop = LoopConfig(max_steps=total, out_dir=run_dir, grad_accum=cfg.grad_accum,
                      precision=cfg.precision, max_grad_norm=cfg.max_grad_norm, save_every=cfg.save_every,
                      keep_last=1,
                      log_every=max(1, total // 50), eval_every=eval_every, seed=seed, progress=cfg.progress,
                      retain_freed_memory=cfg.retain_freed_memory,
                      tensorboard=False)
    missing = [k for k in target_keys if k not in data.train_features[0]]
    if missing:  # e.g. a test file given as the training split
        raise DataError(f"{spec.name}: the training examples have no labels ({', '.join(missing)}); "
                        f"is {cfg.data} a labelled training set?")
    trainer = FinetuneTrainer(model, optimizer, scheduler, loss_fn, batches, loop, evaluate=periodic)
    t0 = time.perf_counter()
    result = trainer.fit(resume=bool(cfg.resume and latest_checkpoint(run_dir)))  # an interrupted run goes on
    train_seconds = time.perf_counter() - t0
    if result.interrupted:  # the loop stopped cleanly on Ctrl-C/SIGTERM: stop the whole grid, not just this run
        raise FinetuneInterrupted(run_dir, result)
    if sharding == "fsdp":  # gathered whole on rank 0 (collective): scored and exported as one process's model
        model = unsharded_copy(model, lambda: head_class(model.config))
        model = model.to(device) if model is not None else None
    if not dist.is_main:
        return None, None
    details = dict(tuning.report)
    if stopper is not None:
        details["early_stopping"] = stopper.restore_best(model, result.step)
    t0 = time.perf_counter()
    scores = {split: evaluate(spec, model, tokenizer, data.eval_examples[split], split, max_length=max_length,
                              batch_size=cfg.eval_batch_size, out_dir=run_dir, device=device,
                              autocast_dtype=autocast_dtype(cfg.precision),
                              features=data.eval_features[split])
              for split in spec.eval_splits}
    tuning.finish(model)  # LoRA merged into the weights (unless --no-lora-merge): a plain BERT with its head
    eval_seconds = time.perf_counter() - t0
    run = RunResult(setting, seed, scores, result.step, train_seconds, eval_seconds, result.metrics.get("loss"),
                    str(run_dir), details=details)
    return model, run  # run.json, which marks the run done, is the sweep's to write (`SweepState.finish_run`)


class StepCallback:
    """An LR scheduler that also calls `callback(step)` after each optimizer step (gradual unfreezing)."""

    def __init__(self, scheduler, callback):
        self.scheduler, self.callback, self.steps = scheduler, callback, 0

    def step(self) -> None:
        self.scheduler.step()
        self.steps += 1
        self.callback(self.steps)

    def state_dict(self) -> dict[str, Any]:
        return {**self.scheduler.state_dict(), "callback_steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = state.pop("callback_steps", 0)
        self.scheduler.load_state_dict(state)
        self.callback(self.steps)


class EarlyStopping:
    """Patience on the dev score: after `patience` evaluations without a better `metric`, `stop` turns true
    (the run's data then ends); the best evaluation's weights are kept (CPU copy) and restored at the end."""

    def __init__(self, patience: int, metric: str):
        self.patience, self.metric = patience, metric
        self.best, self.best_evaluation, self.evaluations, self.stop = -math.inf, 0, 0, False
        self.state: dict[str, torch.Tensor] | None = None

    def update(self, model, scores: dict[str, float]) -> None:
        self.evaluations += 1
        value = scores.get(self.metric, -math.inf)
        if math.isfinite(value) and value > self.best:
            self.best, self.best_evaluation = value, self.evaluations
            self.state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        elif self.evaluations - self.best_evaluation >= self.patience:
            self.stop = True

    def restore_best(self, model, steps: int) -> dict[str, Any]:
        if self.state is not None:
            model.load_state_dict(self.state)
        log.info("early stopping: best %s %.4f at evaluation %d of %d (%d steps)%s", self.metric, self.best,
                 self.best_evaluation, self.evaluations, steps, "; stopped early" if self.stop else "")
        return {"best_evaluation": self.best_evaluation, "evaluations": self.evaluations, "stopped": self.stop,
                "best_score": self.best}


def mean_sd(values: Sequence[float]) -> dict[str, float]:
    """Mean and sample standard deviation (0 for a single run)."""
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "runs": list(values)}


def summarize(spec: TaskSpec, runs: Sequence[RunResult]) -> dict[str, dict[str, dict[str, float]]]:
    """dev split -> metric -> mean ± sd over `runs` (the seeds of one setting)."""
    return {split: {k: mean_sd([r.scores[split][k] for r in runs]) for k in runs[0].scores[split]}
            for split in spec.eval_splits}


def truncation_report(data: TaskData) -> dict[str, int]:
    """Inputs cut to max-seq-length per split (features flagged `truncated` by their task), so nothing is
    cut silently."""
    splits = {"train": data.train_features, **data.eval_features}
    return {split: int(features.truncated.sum()) if hasattr(features, "truncated") else
            sum(bool(f.get("truncated")) for f in features) for split, features in splits.items()}


def save_model(model, out: Path, tokenizer) -> Path:
    """OUT_DIR/model in the Hugging Face layout, with the tokenizer's vocab.txt and tokenizer_config.json."""
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# ---------------------------------------------------------------------------------------------- resume
RUN_FILE = "run.json"
SWEEP_FILE = "sweep.json"
RUN_MODEL_DIR = "model"  # runs/{name}/model: the weights of the best run of the setting in progress
# Settings a resumed fine-tuning may change when stated again; the rest (task, data, grid, seeds, the
# schedule) is the run's own.
RESUME_MAY_CHANGE = ("eval_batch_size", "eval_every", "save_every", "device", "progress", "retain_freed_memory",
                     "resume", "sharding", "fsdp_cpu_offload")


def run_name(setting: dict[str, Any], seed: int) -> str:
    return f"bs{setting['batch_size']}-lr{setting['lr']:g}-ep{setting['epochs']:g}-seed{seed}"


class SweepState:
    """What a sweep (settings x seeds) has done, on disk, so that `--resume` continues it where it stopped:

      runs/{name}/run.json     the run is done (its scores); written after the weights it may still need
      runs/{name}/model/       the weights of the best run so far of the setting in progress
      sweep.json               the settings decided, and the run exported to OUT/model (the best setting's
                               best run); written after the export

    A fresh sweep reads none of it; a resumed one trusts it."""

    def __init__(self, out: Path, spec: TaskSpec, resume: bool):
        self.out, self.spec, self.resume = out, spec, resume
        self.state = {"decided": [], "best": None}
        if resume and (out / SWEEP_FILE).is_file():
            self.state = json.loads((out / SWEEP_FILE).read_text(encoding="utf-8"))
        elif not resume:
            interrupted = self.interrupted_runs(out)
            if interrupted:
                raise BertlabError(f"{out}: holds an interrupted fine-tuning ({interrupted[0]}); pass --resume to "
                                   "continue it, or choose another --out")

    @staticmethod
    def interrupted_runs(out: Path) -> list[Path]:
        """The run folders of `out` holding a training checkpoint: a sweep stopped in the middle of a run."""
        return sorted({p.parent.parent for p in (out / "runs").glob(f"*/{CHECKPOINT_DIR}/step-*")})

    def done_run(self, run_dir: Path, setting: dict[str, Any], seed: int) -> RunResult | None:
        """The result of a run an earlier session finished (resume only), else None."""
        if not self.resume or not (run_dir / RUN_FILE).is_file():
            return None
        saved = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
        standard = {*setting, "seed", "steps", "train_seconds", "eval_seconds", "train_loss", "dev", "run_dir"}
        return RunResult(setting, seed, saved["dev"], saved["steps"], saved["train_seconds"], saved["eval_seconds"],
                         saved["train_loss"], str(run_dir),
                         details={k: v for k, v in saved.items() if k not in standard})

    def finish_run(self, run: RunResult, model, best_of_setting: bool, others: list[RunResult]) -> None:
        """A run is done: the best of its setting so far keeps its weights on disk (the setting may be decided
        in a later session), the others' are dropped; then run.json; then its training state goes."""
        run_dir = Path(run.run_dir)
        if best_of_setting:
            model.save_pretrained(run_dir / RUN_MODEL_DIR)
            for other in others:
                shutil.rmtree(Path(other.run_dir) / RUN_MODEL_DIR, ignore_errors=True)
        atomic_write_text(run_dir / RUN_FILE, json.dumps(run.to_json(), indent=2) + "\n")
        shutil.rmtree(run_dir / CHECKPOINT_DIR, ignore_errors=True)

    def decided(self, index: int) -> bool:
        return self.resume and index in self.state["decided"]

    def best(self, settings: list[dict[str, Any]], runs_of: dict[int, list[RunResult]]):
        """(mean, setting, runs, chosen run) of the best setting decided so far, or None."""
        best = self.state["best"]
        if best is None or best["setting"] not in runs_of:
            return None
        runs = runs_of[best["setting"]]
        chosen = next(r for r in runs if Path(r.run_dir).name == best["run"])
        return best["mean"], settings[best["setting"]], runs, chosen

    def decide(self, index: int, runs: list[RunResult], best: tuple | None, best_index: int | None) -> None:
        """Setting `index` is decided (its export, if it won, is done): record it, then drop its runs' weights."""
        self.state["decided"] = sorted({*self.state["decided"], index})
        if best is not None:
            self.state["best"] = {"mean": best[0], "setting": best_index, "run": Path(best[3].run_dir).name}
        atomic_write_text(self.out / SWEEP_FILE, json.dumps(self.state, indent=2) + "\n")
        for r in runs:
            shutil.rmtree(Path(r.run_dir) / RUN_MODEL_DIR, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- the recipe
RANK_0_WORK_TIMEOUT = datetime.timedelta(hours=6)  # how long the other processes wait for rank 0's scoring


def join_processes(cfg: FinetuneConfig) -> tuple[DistInfo, str]:
    """One process on `cfg.device`, or this process's place in a torchrun job; and the resolved sharding. What
    does not run across processes is refused here in one line, before any model is built."""
    if torchrun_world_size() > 1:  # refused before the process group is joined
        if cfg.early_stopping:
            raise ConfigError("--early-stopping runs in one process (the stop is decided from rank 0's dev scores "
                              "alone); drop it under torchrun, or keep the best of --eval-steps yourself")
        if cfg.gradual_unfreezing:
            raise ConfigError("--gradual-unfreezing runs in one process (DDP and FSDP fix what trains when they "
                              "wrap the model); drop it under torchrun")
    if cfg.sharding == "fsdp" and cfg.method != "full":
        raise ConfigError(f"--sharding fsdp trains every weight (--method full); --method {cfg.method} trains a "
                          "small part of the model: use --sharding ddp")
    # Between the runs of a grid or of --seeds rank 0 alone scores every dev split (SQuAD's or MNLI's can take an
    # hour on CPUs) while the others wait at the next run's start: longer than torch's 30 minutes.
    return join_job(cfg.device, cfg.sharding, cfg.precision, cfg.fsdp_cpu_offload, RANK_0_WORK_TIMEOUT)


def finetune(cfg: FinetuneConfig, given: Sequence[str] | set[str] | None = None) -> dict[str, Any]:
    """Run the whole recipe (see the module docstring); returns what it writes to OUT_DIR/metrics.json."""
    from ..models.auto import AutoTokenizer

    out = Path(cfg.out)
    if cfg.resume:  # the run's own settings rule; `given`: what the user stated again (see run_record.py)
        task = cfg.task
        cfg = resolve_resume_config(FinetuneConfig, cfg, out / RUN_CONFIG, RESUME_MAY_CHANGE, given)
        if cfg.task != task:
            raise ConfigError(f"{out}: is a fine-tuning of {cfg.task}, not {task}")
    dist, sharding = join_processes(cfg)
    if dist.is_main:  # rank 0 prepares OUT_DIR; the others wait for it
        if cfg.resume:
            check_writable(out)
        else:  # an earlier run's results are replaced only when asked (--overwrite)
            claim_output_dir(out, cfg.overwrite)  # which also proves `out` writable
    start = None
    if resolve_init(cfg.model, cfg.vocab, cfg.init) == "random":  # the baseline: no pre-trained weights
        if dist.is_main:
            start = random_start(cfg.model, cfg.vocab, out, cfg.seed, reuse=cfg.resume)
        barrier(dist)
        if not dist.is_main:  # the start rank 0 drew
            start = random_start(cfg.model, cfg.vocab, out, cfg.seed, reuse=True)
    barrier(dist)
    model_dir = str(start.folder) if start else cfg.model
    cfg = with_default_lr(cfg, model_dir)
    spec = TASKS[cfg.task].for_run(cfg)  # own-data tasks read their files here (columns, labels, dev split)
    sweep = SweepState(out, spec, cfg.resume)
    device = dist.device
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    max_length = cfg.max_seq_length or spec.default_max_seq_length
    init = start.record if start else {"init": "pretrained", "model": cfg.model}
    if dist.is_main:
        write_run_config(out, run_record(cfg, {"max_seq_length": max_length, "device": str(device),
                                               "settings": cfg.settings(), "init": init,
                                               "world_size": dist.world_size, "sharding": sharding}))
    t_start = time.perf_counter()
    data = load_task_data(spec, cfg.data, tokenizer, max_length, cfg.train_limit, cfg.eval_limit)
    log.info("%s: %d training examples (%d features), dev %s", spec.name, len(data.train_examples),
             len(data.train_features), {s: len(e) for s, e in data.eval_examples.items()})

    pretrained = PretrainedStart(spec, model_dir, reinitialise=start is not None, runs=len(cfg.settings()) * cfg.seeds)
    all_runs: list[RunResult] = []
    best: tuple[float, dict, list[RunResult], RunResult] | None = None  # (mean score, setting, runs, best run)
    settings = cfg.settings()
    runs_of: dict[int, list[RunResult]] = {}
    for index, setting in enumerate(settings):
        runs: list[RunResult] = runs_of.setdefault(index, [])
        for k in range(cfg.seeds):
            seed = cfg.seed + k
            name = run_name(setting, seed)
            done = sweep.done_run(out / "runs" / name, setting, seed)
            if done is not None:  # finished in an earlier session (resume)
                runs.append(done)
                continue
            barrier(dist)  # every process trains the same run (a resumed sweep: rank 0 wrote run.json before)
            model, run = train_once(spec, cfg, data, pretrained, setting, seed, out / "runs" / name, tokenizer,
                                    max_length, device, sharding)
            if run is None:  # a process other than rank 0 of a torchrun job: rank 0 scores, keeps and exports
                continue
            log.info("%s: %s", name, json.dumps({s: brief_scores(v) for s, v in run.scores.items()}))
            # Of a setting's seeds only the best run's weights are kept (in CPU memory, one copy; and on disk
            # until the setting is decided, for a resume).
            best_of_setting = not runs or run.main_score(spec) > max(r.main_score(spec) for r in runs)
            if best_of_setting:
                for r in runs:
                    r.state = None
                run.state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
                run.config = model.config
            sweep.finish_run(run, model, best_of_setting, runs)
            runs.append(run)
            del model
        if not dist.is_main:
            continue
        all_runs.extend(runs)
        if sweep.decided(index):  # decided (and exported, if it won) in an earlier session
            best = sweep.best(settings, runs_of) or best
            continue
        mean = statistics.fmean(r.main_score(spec) for r in runs)
        best_index = None
        if best is None or mean > best[0]:
            chosen = max(runs, key=lambda r: r.main_score(spec))
            best, best_index = (mean, setting, runs, chosen), index
            _export(spec, cfg, chosen, out, tokenizer, device)
        sweep.decide(index, runs, best if best_index is not None else None, best_index)
        for r in runs:
            r.state = None

    if not dist.is_main:
        return {}  # rank 0 reports
    _, setting, runs, chosen = best
    test_files, test_scores = _predict_test(spec, cfg, out, tokenizer, max_length, device)
    metrics = {
        "task": spec.name,
        "main_metric": spec.main_metric,
        "init": init,  # pre-trained weights, or a random start (the baseline)
        "selected": {**setting, "seed": chosen.seed},
        "dev": summarize(spec, runs),  # the selected setting, mean ± sd over its seeds
        "best_run": chosen.scores,  # the saved model's dev scores
        "test_predictions": test_files,
        **test_scores,  # a labelled test file's scores, by split name ("test"), from the saved model
        **({"data": {**spec.describe(), "truncated": truncation_report(data)}} if spec.describe() else {}),
        "seconds": round(time.perf_counter() - t_start, 1),
        "config": dataclasses.asdict(cfg),
        "runs": [r.to_json() for r in all_runs],
    }
    atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")
    return metrics


RESULT_NAMES = (RUN_CONFIG, "metrics.json", "model", "runs", INIT_DIR)  # what a fine-tuning run writes to OUT_DIR by name
FINISHED_MARKS = ("metrics.json", "model")  # results worth protecting: a run that got as far as saving a model


def previous_results(out: Path) -> list[Path]:
    """What an earlier fine-tuning run wrote to `out`: run_config.json, metrics.json, model/, runs/, and the
    dev / test prediction files copied beside them (named by its runs' folders and its metrics.json)."""
    found = [out / name for name in RESULT_NAMES if (out / name).exists()]
    names: set[str] = set()
    for run_dir in (out / "runs").glob("*/") if (out / "runs").is_dir() else ():
        names |= {f.name for f in run_dir.iterdir() if f.is_file()}
    if (out / "metrics.json").is_file():
        try:
            names |= set(json.loads((out / "metrics.json").read_text()).get("test_predictions") or [])
        except (OSError, ValueError, AttributeError):
            pass
    return found + sorted(out / n for n in names if (out / n).is_file() and n not in RESULT_NAMES)


def claim_output_dir(out: Path, overwrite: bool) -> None:
    """Make `out` ready for a fine-tuning run (`run_dir.claim_run_dir`): an earlier run's results (a saved model,
    metrics.json) are replaced only with `overwrite`, which also clears an interrupted sweep (runs/ with
    checkpoints) that would otherwise need --resume."""
    claim_run_dir(out, overwrite, previous_results, FINISHED_MARKS, "fine-tuning run",
                  interrupted=SweepState.interrupted_runs(out))


def model_from_state(head: type, config, state: dict[str, torch.Tensor]):
    """`head(config)` holding `state`'s tensors themselves: built on the meta device and given the kept weights
    (assign), so the export makes no third copy of the model (it set the run's peak memory) and initialises
    nothing only to overwrite it. A head with tied weights (an MLM decoder sharing the word embeddings) gets
    storage that keeps them one matrix (`checkpoint.materialize`) and a copy instead: assigning would untie
    them."""
    with torch.device("meta"):
        model = head(config)
        add_saved_adapters(model)  # --method adapters: the adapters config.json records, before the weights
    if len(list(model.named_parameters(remove_duplicate=False))) == len(list(model.parameters())):
        model.load_state_dict(state, assign=True)
    else:
        materialize(model)
        model.load_state_dict(state)
    return model


def _export(spec: TaskSpec, cfg: FinetuneConfig, run: RunResult, out: Path, tokenizer, device) -> None:
    """The best run so far becomes OUT_DIR/model, and its dev predictions OUT_DIR's."""
    if run.state is not None:
        model = model_from_state(spec.head_class(run.config), run.config, run.state)
        model.config.extra.update(spec.export_config(run.scores))  # e.g. a multi-label threshold tuned on dev
    else:  # a run an earlier session finished (resume): its weights were kept on disk (SweepState)
        model = spec.head_class(Path(run.run_dir) / RUN_MODEL_DIR).from_pretrained(Path(run.run_dir) / RUN_MODEL_DIR)
        model.config.extra.update(spec.export_config(run.scores))
    save_model(model, out / "model", tokenizer)
    for f in Path(run.run_dir).iterdir():
        if f.is_file() and f.name not in ("run.json", "metrics.jsonl"):
            shutil.copyfile(f, out / f.name)


def _predict_test(spec: TaskSpec, cfg: FinetuneConfig, out: Path, tokenizer, max_length: int,
                  device: torch.device) -> tuple[list[str], dict[str, dict[str, float]]]:
    """Prediction files for the test splits present in DATA_PATH, from the saved model, and the scores of
    those that carry labels (split -> scores; an unlabelled split, as GLUE's test files, has none)."""
    written, scores = [], {}
    model = None
    for split in spec.test_splits:
        if not spec.has_split(cfg.data, split):  # a test file is optional: most users fine-tune without one
            log.info("%s: no %s split in %s, no test predictions", spec.name, split, cfg.data)
            continue
        examples = spec.read(cfg.data, split)
        if model is None:
            model = spec.head_class(out / "model").from_pretrained(out / "model").to(device)
        scoring = spec.with_model_config(model.config)  # as saved: e.g. the tuned multi-label threshold
        writer_path = scoring.prediction_writer(out, split).path
        scored = evaluate(scoring, model, tokenizer, subset(examples, cfg.eval_limit), split, max_length=max_length,
                          batch_size=cfg.eval_batch_size, out_dir=out, device=device,
                          autocast_dtype=autocast_dtype(cfg.precision))
        written.append(writer_path.name)
        if scored:
            scores[split] = scored
            log.info("%s %s: %s", spec.name, split, json.dumps(scored))
    return written, scores
