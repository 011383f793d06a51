"""BERT's optimisation: AdamW with its parameter groups, LAMB, the warmup/decay schedule, layer-wise LR decay.

    AdamW   β1 0.9, β2 0.999, ε 1e-6, weight decay 0.01 on every weight except biases and LayerNorm (Google's
            `AdamWeightDecayOptimizer` excludes "LayerNorm", "layer_norm" and "bias" by name)
    LR      linear warmup from 0 over `warmup_steps`, then linear decay to 0 at `total_steps` (the paper's
            10k-of-1M shape, scaled to the run)
    LAMB    You et al. (2019): Adam's update rescaled per tensor by ‖w‖ / ‖update‖, for very large batches
    StableAdamW  Wortsman et al. (2023), ModernBERT's: AdamW with Adafactor's per-tensor update clipping and
            weight decay decoupled from the learning rate
    LLRD    layer-wise LR decay for fine-tuning: lr_l = lr · decay^(L − l) for encoder layer l = 1..L,
            embeddings l = 0 (the lowest rate), everything above the encoder (pooler, heads) the full lr

Everything here takes the model only to read its parameter *names*; nothing depends on BERT beyond the
default name rules, which a caller can replace.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from ..core.errors import ConfigError

NO_DECAY_PATTERNS = ("bias", "LayerNorm", "layer_norm")


def no_weight_decay(name: str, param: torch.Tensor) -> bool:
    """Google's rule: biases and LayerNorm parameters are not decayed (1-D tensors, by name or shape)."""
    return param.ndim < 2 or any(p in name for p in NO_DECAY_PATTERNS)


def param_groups(model: nn.Module, weight_decay: float = 0.01,
                 exclude: Callable[[str, torch.Tensor], bool] = no_weight_decay,
                 lr_scale: Callable[[str], float] | None = None) -> list[dict[str, Any]]:
    """Trainable parameters split into groups by (weight decay, LR scale); tied weights appear once.

    Each group carries `lr_scale` (1.0 without `lr_scale`); `adamw`/`lamb` turn it into the group's `lr`.
    Groups also keep `names` (for inspection and tests; torch ignores extra keys).
    """
    groups: dict[tuple[float, float], dict[str, Any]] = {}
    for name, p in model.named_parameters():  # named_parameters() yields a tied tensor once
        if not p.requires_grad:
            continue
        wd = 0.0 if exclude(name, p) else weight_decay
        scale = lr_scale(name) if lr_scale is not None else 1.0
        g = groups.setdefault((wd, scale), {"params": [], "names": [], "weight_decay": wd, "lr_scale": scale})
        g["params"].append(p)
        g["names"].append(name)
    return sorted(groups.values(), key=lambda g: (-g["lr_scale"], -g["weight_decay"]))


_LAYER = re.compile(r"(?:^|\.)layer\.(\d+)\.")


def bert_layer_index(name: str, num_layers: int) -> int:
    """Depth of a BERT parameter: embeddings 0, encoder layer i -> i + 1, anything above (pooler, heads) L + 1."""
    if "embeddings." in name and not name.startswith("cls."):
        return 0
    m = _LAYER.search(name)
    if m and "encoder." in name:
        return int(m[1]) + 1
    return num_layers + 1


def layerwise_lr_scale(num_layers: int, decay: float,
                       depth: Callable[[str, int], int] = bert_layer_index) -> Callable[[str], float]:
    """lr multiplier per parameter name: decay^(L − l) for layer l = 1..L, decay^L for the embeddings (l = 0),
    1 for the pooler and task heads. `decay` = 1 is plain fine-tuning; 0.8-0.95 is usual."""
    if not 0 < decay <= 1:
        raise ConfigError(f"layer-wise LR decay must be in (0, 1], got {decay}")

    def scale(name: str) -> float:
        layer = min(depth(name, num_layers), num_layers)  # heads share the top layer's full rate
        return decay ** (num_layers - layer)

    return scale


def _with_lr(groups: list[dict[str, Any]], lr: float) -> list[dict[str, Any]]:
    for g in groups:
        g["lr"] = lr * g["lr_scale"]
    return groups


def _fused_ok(params: Iterable[torch.Tensor]) -> bool:
    """The fused AdamW kernel runs on CUDA and (torch >= 2.4) CPU, for float tensors; one kernel per step
    instead of a handful of ops per tensor, which is most of the optimizer's cost on a small model."""
    params = list(params)
    return bool(params) and all(p.is_floating_point() and p.device.type in ("cuda", "cpu") for p in params) \
        and len({p.device for p in params}) == 1


def adamw(model: nn.Module, lr: float, weight_decay: float = 0.01, betas: tuple[float, float] = (0.9, 0.999),
          eps: float = 1e-6, fused: bool | None = None, groups: list[dict[str, Any]] | None = None,
          layerwise_decay: float | None = None, num_layers: int | None = None) -> torch.optim.AdamW:
    """BERT's AdamW. `layerwise_decay` (with `num_layers`, default `model.config.num_hidden_layers`) gives
    each layer its own rate (see `layerwise_lr_scale`); `groups` overrides the grouping altogether."""
    if groups is None:
        scale = None
        if layerwise_decay is not None:
            L = num_layers if num_layers is not None else model.config.num_hidden_layers
            scale = layerwise_lr_scale(L, layerwise_decay)
        groups = param_groups(model, weight_decay, lr_scale=scale)
    groups = _with_lr(groups, lr)
    if fused is None:
        fused = _fused_ok(p for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                             fused=fused or None, foreach=None if fused else True)


class AdamMoments(torch.optim.Optimizer):
    """An optimizer on Adam's moments, kept per tensor: each step updates m and v of every tensor with a gradient,
    then `update(p, group, m, v, t)` moves the tensor (t: its step count, from 1)."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                self.update(p, group, m, v, float(state["step"]))
        return loss

    def update(self, p: torch.Tensor, group: dict[str, Any], m: torch.Tensor, v: torch.Tensor, t: float) -> None:
        raise NotImplementedError


class Lamb(AdamMoments):
    """LAMB (You et al., 2019): Adam moments, decoupled weight decay, then a per-tensor trust ratio
    ‖w‖ / ‖update‖ that keeps every layer's step proportional to its weights, so very large batches
    (32k in the paper) train stably. Tensors without weight decay (biases, LayerNorm) skip the ratio, as
    in Google's and NVIDIA's implementations (`exclude_from_layer_adaptation`)."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01, bias_correction: bool = True):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      bias_correction=bias_correction))

    def update(self, p: torch.Tensor, group: dict[str, Any], m: torch.Tensor, v: torch.Tensor, t: float) -> None:
        beta1, beta2 = group["betas"]
        if group["bias_correction"]:
            m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
        else:
            m_hat, v_hat = m, v
        update = m_hat / (v_hat.sqrt() + group["eps"])
        if group["weight_decay"] != 0:
            update.add_(p, alpha=group["weight_decay"])
            w_norm, u_norm = p.norm(), update.norm()
            # ratio 1 when either norm is 0 (fresh zero-initialised tensors, zero updates)
            trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
            update.mul_(trust)
        p.add_(update, alpha=-group["lr"])


def lamb(model: nn.Module, lr: float, weight_decay: float = 0.01, betas: tuple[float, float] = (0.9, 0.999),
         eps: float = 1e-6, groups: list[dict[str, Any]] | None = None) -> Lamb:
    groups = _with_lr(groups if groups is not None else param_groups(model, weight_decay), lr)
    return Lamb(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


class StableAdamW(AdamMoments):
    """StableAdamW (Wortsman et al., 2023), ModernBERT's optimizer: AdamW whose step on each tensor is shrunk
    by Adafactor's update clipping instead of clipping the gradient's global norm,

        m, v      Adam's moments, bias-corrected: m̂ = m / (1 − β1^t), v̂ = v / (1 − β2^t)
        RMS       √ mean(g² / max(v̂, ε²)) over the tensor: how far this gradient is beyond its running scale
        η         lr / max(1, RMS)  -- a spike in one tensor's gradient slows that tensor alone
        θ         θ · (1 − λ · lr / lr_peak) − η · m̂ / (√v̂ + ε)

    with weight decay decoupled from the learning rate as ModernBERT's trainer (Composer's decoupled optimizers)
    has it: λ is the fraction taken off a weight per step at the peak rate (ModernBERT: 1e-5), following the
    schedule's shape rather than multiplied by lr (AdamW's λ · lr). `lr_peak` is the group's rate when the
    schedule was made (`initial_lr`), else its current one."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.98), eps: float = 1e-6,
                 weight_decay: float = 1e-5):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def update(self, p: torch.Tensor, group: dict[str, Any], m: torch.Tensor, v: torch.Tensor, t: float) -> None:
        beta1, beta2 = group["betas"]
        eps, lr = group["eps"], group["lr"]
        peak = group.get("initial_lr") or lr
        m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
        rms = (p.grad.square() / v_hat.clamp(min=eps * eps)).mean().sqrt()
        if group["weight_decay"] != 0 and peak > 0:
            p.mul_(1 - group["weight_decay"] * lr / peak)
        p.add_(m_hat / (v_hat.sqrt() + eps), alpha=-lr / max(1.0, float(rms)))


def stable_adamw(model: nn.Module, lr: float, weight_decay: float = 1e-5, betas: tuple[float, float] = (0.9, 0.98),
                 eps: float = 1e-6, groups: list[dict[str, Any]] | None = None) -> StableAdamW:
    groups = _with_lr(groups if groups is not None else param_groups(model, weight_decay), lr)
    return StableAdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


OPTIMIZERS = ("adamw", "lamb", "stableadamw")


def build_optimizer(name: str, model: nn.Module, lr: float, weight_decay: float = 0.01,
                    **kwargs: Any) -> torch.optim.Optimizer:
    if name == "adamw":
        return adamw(model, lr, weight_decay, **kwargs)
    if name == "lamb":
        return lamb(model, lr, weight_decay, **kwargs)
    if name == "stableadamw":
        return stable_adamw(model, lr, weight_decay, **kwargs)
    raise ConfigError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")


# ---------------------------------------------------------------------------------------------- schedule
class WarmupLinearDecay:
    """LR multiplier at step s: s / warmup during warmup, then (total − s) / (total − warmup) down to 0.

    A class rather than a lambda so `LambdaLR.state_dict()` saves it (and resume restores it)."""

    def __init__(self, warmup_steps: int, total_steps: int):
        if total_steps < 1 or not 0 <= warmup_steps <= total_steps:
            raise ConfigError(f"schedule: need 0 <= warmup_steps ({warmup_steps}) <= total_steps ({total_steps}), "
                              "total_steps >= 1")
        self.warmup_steps, self.total_steps = warmup_steps, total_steps

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return step / self.warmup_steps
        return max(0.0, (self.total_steps - step) / max(1, self.total_steps - self.warmup_steps))


def linear_warmup_decay(optimizer: torch.optim.Optimizer, warmup_steps: int | float,
                        total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup then linear decay to zero. `warmup_steps` < 1 is a fraction of `total_steps`
    (the paper: 10k of 1M = 0.01)."""
    if isinstance(warmup_steps, float) and warmup_steps < 1:
        warmup_steps = int(math.ceil(warmup_steps * total_steps))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupLinearDecay(int(warmup_steps), total_steps))
