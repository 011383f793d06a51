"""T5's optimisation (Raffel et al., 2020, section 3.1.2): Adafactor with the inverse square root schedule, and
AdamW as the alternative, for T5 pre-training and text-to-text fine-tuning.

    inverse-sqrt   lr_n = lr · sqrt(k / max(n, k)): constant for the first k steps, then ∝ 1/sqrt(n). T5's
                   schedule is 1/sqrt(max(n, k)) with k = 10^4, i.e. lr = 1/sqrt(k) = 0.01 (the default lr
                   when none is given: `t5_lr`)
    constant       lr throughout (T5's fine-tuning: 0.001)
    adafactor      `torch.optim.Adafactor` (Shazeer & Stern, 2018), as T5 ran it: factored second moments,
                   decay rate 0.8 (`beta2_decay=-0.8`), update clipping at 1.0 (`d`), no momentum, the step
                   relative to each parameter's RMS; its own relative step min(lr, 1/sqrt(t)) is never below
                   the inverse-sqrt schedule's lr, so the schedule decides
    adamw          BERT's AdamW (`optim.adamw`: β 0.9/0.999, ε 1e-6, decoupled weight decay)

Schedules are registered by name (`SCHEDULES`) and are classes, so `LambdaLR.state_dict()` saves them and a
resumed run continues on the same curve. `T5OptimOptions` is the settings group of both T5 recipes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..core.errors import ConfigError
from .optim import adamw, param_groups
from .options import OptimOptions

OPTIMIZERS = ("adafactor", "adamw")
ADAMW_DEFAULT_LR = 1e-3
T5_WARMUP = 10_000  # T5's constant-rate steps before the inverse square root decay


class InverseSqrt:
    """LR multiplier sqrt(k / max(n, k)) at step n: 1 for the first k (warmup) steps, then 1/sqrt decay."""

    def __init__(self, warmup_steps: int):
        if warmup_steps < 0:
            raise ConfigError(f"schedule: warmup steps must not be negative, got {warmup_steps}")
        self.warmup_steps = max(1, int(warmup_steps))

    def __call__(self, step: int) -> float:
        return math.sqrt(self.warmup_steps / max(step, self.warmup_steps))


class Constant:
    """LR multiplier 1 at every step."""

    def __init__(self, warmup_steps: int = 0):
        self.warmup_steps = warmup_steps

    def __call__(self, step: int) -> float:
        return 1.0


SCHEDULES = {"inverse-sqrt": InverseSqrt, "constant": Constant}


def check_optimization(optimizer: str, schedule: str) -> None:
    """One-line errors for an optimizer or schedule name that does not exist."""
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    if schedule not in SCHEDULES:
        raise ConfigError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")


@dataclass
class T5OptimOptions(OptimOptions):
    """T5's optimiser settings (the `optim` group of `pretrain-t5`; `finetune-t5` changes the defaults)."""

    optimizer: str = "adafactor"
    """adafactor (T5's) or adamw"""
    schedule: str = "inverse-sqrt"
    """inverse-sqrt (constant for --warmup steps, then 1/sqrt) or constant"""
    warmup: int = T5_WARMUP
    """steps at the constant rate before the inverse square root decay"""
    weight_decay: float = 0.0
    max_grad_norm: float | None = None  # Adafactor clips its updates itself

    def __post_init__(self) -> None:
        super().__post_init__()
        check_optimization(self.optimizer, self.schedule)
        if self.warmup < 0:
            raise ConfigError(f"warmup must not be negative, got {self.warmup}")


def t5_lr(optimizer: str, warmup_steps: int, schedule: str = "inverse-sqrt") -> float:
    """T5's rate when none is given: Adafactor 1/sqrt(k) under inverse-sqrt (0.01 at k = 10^4), 0.001 constant
    (T5's fine-tuning); AdamW 1e-3."""
    if optimizer == "adafactor":
        return 1 / math.sqrt(max(1, warmup_steps)) if schedule == "inverse-sqrt" else 1e-3
    return ADAMW_DEFAULT_LR


def build_t5_optimizer(name: str, model: nn.Module, lr: float, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """Adafactor (T5's) or AdamW over the trainable parameters, no weight decay on 1-D tensors (RMSNorm)."""
    check_optimization(name, "constant")
    if name == "adamw":
        return adamw(model, lr, weight_decay)
    groups = param_groups(model, weight_decay)
    for g in groups:
        g["lr"] = lr * g["lr_scale"]
    return torch.optim.Adafactor(groups, lr=lr, beta2_decay=-0.8, d=1.0, weight_decay=weight_decay, foreach=False)


def build_schedule(name: str, optimizer: torch.optim.Optimizer, warmup_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    check_optimization("adamw", name)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, SCHEDULES[name](warmup_steps))
