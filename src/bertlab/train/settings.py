"""The settings every training recipe shares, declared once: settings groups of the recipes' run configs.

    run     RunOptions        seed, device, progress, memory, checkpoint cadence, resume -- how a run goes
            LoopRunOptions    + keep_last, log_every, num_workers: the long runs (pre-training, distillation)
    optim   OptimOptions      lr, weight_decay, max_grad_norm -- the optimiser's knobs (T5's add optimizer,
                              schedule, warmup: `t5_optim.T5OptimOptions`)

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

from ..errors import ConfigError


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


__all__ = ["LoopRunOptions", "OptimOptions", "RunOptions"]
