"""The settings every training recipe shares, declared once: settings groups of the recipes' run configs.

    run       RunOptions        seed, device, progress, memory, checkpoint cadence, resume -- how a run goes
              LoopRunOptions    + keep_last, log_every, num_workers: the long runs (pre-training, distillation)
    sharding  ShardingOptions   DDP or FSDP2 under torchrun, CPU offload (pre-training, fine-tuning)
    optim     OptimOptions      lr, weight_decay, max_grad_norm -- the optimiser's knobs
              WarmupOptimOptions  + warmup, of BERT's linear schedule (pre-training, distillation); T5's add
              AdamOptimOptions  + Adam's β1, β2, ε (pre-training: RoBERTa's β2 0.98, ε 1e-6 for large batches)
                                optimizer, schedule, warmup steps: `t5_optim.T5OptimOptions`
    training  EpochTraining     fine-tuning (finetune, finetune-multi, finetune-t5): epochs or max_steps,
                                batch, micro-batches, seeds, bf16, subsets
              StepTraining      the long runs: steps or a time budget, batch over all processes, precision
    eval      HeldOutEval       the long runs' held-out evaluations (pre-training adds num_evals, eval_at_start)

A recipe's config holds a group as a field (`run: RunOptions = field(default_factory=RunOptions)`); the
group's settings stay flat flags (`--seed`, `--lr`) and flat attributes (`cfg.lr`, `runconfig.GroupedSettings`),
and are an object in run_config.json (`"optim": {"lr": ...}`; a flat file from before the groups still
loads). A recipe whose defaults differ subclasses the group and overrides the default alone; the help -- the
string under each field, read by `runconfig.field_help` -- is written here once, for `--help` and the docs.
How a command picks a default the dataclass leaves open (`lr`: by the model's width) is the command's
(`add_config_arguments(..., defaults=...)`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import ConfigError


@dataclass
class RunOptions:
    """How a run goes, not what it learns."""

    seed: int = 42
    """seed of the weights a run draws, its data order and dropout (with --seeds N: run k uses seed + k)"""
    device: str | None = None
    """auto, cpu or cuda (auto, or none given: CUDA when available)"""
    progress: bool = True
    """progress: a bar on a terminal, a line every 30 s in a log file"""
    retain_freed_memory: bool = True
    """CPU: keep freed tensor memory for reuse instead of paging it in anew each step"""
    save_every: int | None = None
    """steps between checkpoints of the training state (one is always written on Ctrl-C / SIGTERM)"""
    resume: bool = False
    """continue the interrupted run in --out from its last checkpoint, exactly, with the run's own settings"""

    def __post_init__(self) -> None:
        if self.save_every is not None and self.save_every < 1:
            raise ConfigError(f"save-every must be at least 1, got {self.save_every}")


@dataclass
class LoopRunOptions(RunOptions):
    """Pre-training and distillation: one long run, under torchrun too."""

    seed: int = 0
    device: str | None = "auto"
    keep_last: int = 3
    """checkpoints to keep"""
    log_every: int = 1
    """steps between lines of metrics.jsonl"""
    num_workers: int = 1
    """data loader workers per process"""


@dataclass
class ShardingOptions:
    """How the processes of a torchrun job share the training: each a whole replica (DDP) or a shard (FSDP2)."""

    sharding: str = "auto"
    """auto (ddp under torchrun with several processes, none for one), none, ddp (every process holds the whole
    model, gradients all-reduced) or fsdp (FSDP2: parameters, gradients and optimizer state sharded over the
    processes, one unit per layer block; checkpoints sharded, resumable on another number of processes)"""
    fsdp_cpu_offload: bool = False
    """with --sharding fsdp: keep the shards and the optimizer step on the CPU (GPU memory for activations only)"""


@dataclass
class OptimOptions:
    """The optimiser: learning rate, weight decay, gradient clipping."""

    lr: float | None = None
    """peak learning rate"""
    weight_decay: float = 0.01
    """weight decay, not on biases and norm weights"""
    max_grad_norm: float | None = 1.0
    """gradient clipping norm"""

    def __post_init__(self) -> None:
        for name in ("lr", "max_grad_norm"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{name.replace('_', '-')} must be a positive number, got {value}")
        if not self.weight_decay >= 0:
            raise ConfigError(f"weight-decay must not be negative, got {self.weight_decay}")


@dataclass
class WarmupOptimOptions(OptimOptions):
    """The optimiser on BERT's schedule: linear warmup to the peak learning rate, then linear decay."""

    warmup: float | None = None
    """warmup: a fraction of the steps (< 1) or a step count"""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.warmup is not None and not self.warmup >= 0:
            raise ConfigError(f"warmup must not be negative, got {self.warmup}")


@dataclass
class AdamOptimOptions(WarmupOptimOptions):
    """BERT's schedule with Adam's (AdamW's or LAMB's) moment settings stated: RoBERTa trains with β2 = 0.98 (more
    stable at large batches and peak rates) where BERT used 0.999."""

    adam_beta1: float = 0.9
    """Adam's β1: decay of the gradient's running mean"""
    adam_beta2: float = 0.999
    """Adam's β2: decay of the squared gradient's running mean (BERT 0.999; RoBERTa 0.98)"""
    adam_eps: float = 1e-6
    """Adam's ε, added to the update's denominator (BERT's and RoBERTa's 1e-6)"""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("adam_beta1", "adam_beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be in [0, 1), got {getattr(self, name)}")
        if not self.adam_eps > 0:
            raise ConfigError(f"adam-eps must be a positive number, got {self.adam_eps}")

    @property
    def adam_settings(self) -> dict:
        """`betas` and `eps` as `optim.build_optimizer` takes them."""
        return {"betas": (self.adam_beta1, self.adam_beta2), "eps": self.adam_eps}


@dataclass
class EpochTraining:
    """How long and on how much a fine-tuning run trains."""

    epochs: float = 3.0
    """training epochs"""
    max_steps: int | None = None
    """optimizer steps per run instead of --epochs"""
    batch_size: int = 16
    """examples per optimizer step"""
    grad_accum: int = 1
    """split each batch into this many micro-batches (memory holds batch-size / grad-accum examples)"""
    seeds: int = 1
    """runs per setting, reported as mean ± sd"""
    bf16: bool = False
    """bf16 autocast (CPU or GPU)"""
    eval_batch_size: int = 64
    """examples per prediction batch"""
    train_limit: int | None = None
    """train on a seeded random N examples (of each task)"""
    eval_limit: int | None = None
    """score a seeded random N dev/test examples (of each task)"""


@dataclass
class StepTraining:
    """How long a long run trains, and on how large batches."""

    steps: int | None = None
    """optimizer steps (or --time-budget)"""
    time_budget: str | None = None
    """wall-clock budget, e.g. 2h, 90m, 1h30m: the step count is fitted to it"""
    batch_size: int | None = None
    """sequences (examples) per optimizer step over all processes"""
    micro_batch_size: int | None = None
    """sequences per forward pass per process (the rest is gradient accumulation)"""
    precision: str = "auto"
    """auto (bf16 where the hardware does it natively, else fp32), fp32, bf16 or fp16 (loss-scaled; meant for
    CUDA)"""


@dataclass
class HeldOutEval:
    """Held-out evaluations during a long run."""

    eval_every: int | None = None
    """steps between held-out evaluations"""
    eval_batches: int | None = 50
    """held-out batches per evaluation (none: the whole split)"""
    eval_batch_size: int = 64
    """sequences per held-out batch"""


@dataclass
class PretrainEval(HeldOutEval):
    """Held-out evaluations during pre-training."""

    num_evals: int = 10
    """held-out evaluations per run when --eval-every is not given"""
    eval_at_start: bool = True
    """score the untrained model too, for comparison"""


__all__ = ["AdamOptimOptions", "EpochTraining", "HeldOutEval", "LoopRunOptions", "OptimOptions", "PretrainEval", "RunOptions",
           "ShardingOptions", "StepTraining", "WarmupOptimOptions"]
