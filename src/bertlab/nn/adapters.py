"""Parameter-efficient fine-tuning, for any model made of `nn.Linear` layers: bottleneck adapters, LoRA,
freezing, gradual unfreezing. Nothing here knows BERT (or T5): layers are chosen by their module names.

    BottleneckAdapter   h + W_up · act(W_down · h + b_down) + b_up, inner size m (Houlsby et al., 2019: after
                        the attention output projection and after the feed-forward output, before the
                        residual and LayerNorm; T5 section 3.5.1: dense-ReLU-dense after each feed-forward).
                        W_up starts at zero, so an adapted model starts as the model it adapts.
    AdaptedLinear       an `nn.Linear` followed by its adapter: same `weight`/`bias` names as the layer it
                        replaces (checkpoints keep their keys; the adapter's are `<layer>.adapter.*`)
    add_adapters        replace the linears whose names match with AdaptedLinear; returns their names
    LoRA                W + (α/r) · B A as a parametrization of the weight (Hu et al., 2021): every read of
                        `layer.weight` -- a module call or code that reads the weight directly, as BERT's fused
                        Q/K/V projection does -- sees the adapted weight. B starts at zero.
    add_lora            LoRA on the linears whose names match (recorded in `config.extra["lora"]`); `merge_lora`
                        folds B A into the weights and removes the parametrizations, leaving plain `nn.Linear`
                        layers; `lora_layers` the unmerged ones by module name
    freeze_except       requires_grad only where a predicate on the parameter name says so
    parameter_counts    (trainable, total) parameters, shared ones counted once
    GradualUnfreezing   a list of blocks, bottom to top, unfrozen from the top, one more every K steps (ULMFiT)
    add_saved_adapters  rebuild the adapters and unmerged LoRA a saved model's config.json describes (before its
                        weights load)
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from ..core.errors import shorten
from .elementwise import ACTIVATIONS

ADAPTERS_CONFIG_KEY = "adapters"  # config.json: {"size", "activation", "layers": [module names]}
LORA_CONFIG_KEY = "lora"  # config.json, while unmerged: {"rank", "alpha", "layers": [module names], ...}


# A layer-name pattern from a file (a PEFT adapter's `target_modules`) is searched in every module name; a
# pattern that repeats a group holding another repetition or an alternation (`(.*.*)*X`, `(a|a)*`) can take
# exponential time to fail on one 40-character name, and Python's `re` has no time limit. Such patterns are
# refused before they run (none is needed to name layers), as is one longer than any sane layer pattern.
MAX_PATTERN_CHARS = 1000
_REPEATS = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")


def _risky_repetition(items, inside_repeat: bool = False) -> bool:
    """Whether a parsed regex (sre_parse's items) repeats something that can itself match in many ways."""
    for op, arg in items:
        name = str(op)
        if name in _REPEATS:
            low, high, body = arg
            if inside_repeat and high != low:  # a variable repetition inside a repetition
                return True
            if _risky_repetition(body, inside_repeat or high > 1):
                return True
        elif name == "BRANCH":
            if inside_repeat:
                return True
            if any(_risky_repetition(branch, inside_repeat) for branch in arg[1]):
                return True
        elif name in ("SUBPATTERN", "ATOMIC_GROUP"):
            if _risky_repetition(arg[-1], inside_repeat):
                return True
        elif name in ("ASSERT", "ASSERT_NOT"):
            if _risky_repetition(arg[1], inside_repeat):
                return True
    return False


def compile_layer_pattern(pattern: str) -> re.Pattern:
    """`pattern` compiled, or a ValueError naming why it is refused: not a regular expression, too long, or a
    nested repetition whose search time can explode (see above)."""
    from re import _parser  # the stdlib's own parser: the structure `re.compile` would build

    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"a layer pattern of {len(pattern):,} characters (at most {MAX_PATTERN_CHARS:,})")
    try:
        parsed = _parser.parse(pattern)
        compiled = re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise ValueError(f"{shorten(pattern)} is not a regular expression ({e})") from None
    if _risky_repetition(list(parsed)):
        raise ValueError(f"{shorten(pattern)} repeats a group that itself repeats or has alternatives; such a "
                         "pattern can take exponential time, name the layers or use a flat pattern")
    return compiled


def _matching_linears(model: nn.Module, pattern: str | Sequence[str]) -> list[str]:
    """Names of the `nn.Linear` modules whose full name matches `pattern` (a regex searched in the name) or
    ends with one of the names in a list (`["query", "value"]`)."""
    if isinstance(pattern, str):
        rule = compile_layer_pattern(pattern)
        match = lambda name: rule.search(name) is not None  # noqa: E731
    else:
        match = lambda name: any(name == p or name.endswith("." + p) for p in pattern)  # noqa: E731
    return [name for name, module in model.named_modules() if isinstance(module, nn.Linear) and match(name)]


def _replace(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def _config_extra(model: nn.Module) -> dict[str, Any] | None:
    """The model config's free-form part (config.json's own keys), where the adapted layers are recorded."""
    extra = getattr(getattr(model, "config", None), "extra", None)
    return extra if isinstance(extra, dict) else None


# ---------------------------------------------------------------------------------------------- adapters
class BottleneckAdapter(nn.Module):
    """h -> h + up(act(down(h))): d -> m -> d with a residual; `up` zero at the start (identity)."""

    def __init__(self, dim: int, size: int, activation: str = "gelu", init_std: float = 0.02):
        super().__init__()
        self.down = nn.Linear(dim, size)
        self.up = nn.Linear(size, dim)
        self.activation = activation
        nn.init.normal_(self.down.weight, std=init_std)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.up(ACTIVATIONS[self.activation](self.down(h)))


class AdaptedLinear(nn.Linear):
    """A linear layer followed by a bottleneck adapter; its own parameters keep the linear's names."""

    def __init__(self, in_features: int, out_features: int, size: int, activation: str = "gelu",
                 bias: bool = True, device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.adapter = BottleneckAdapter(out_features, size, activation).to(device=device, dtype=dtype)

    @classmethod
    def wrap(cls, linear: nn.Linear, size: int, activation: str) -> "AdaptedLinear":
        adapted = cls(linear.in_features, linear.out_features, size, activation, bias=linear.bias is not None,
                      device="meta")  # placeholders, replaced by the linear's own parameters
        adapted.weight, adapted.bias = linear.weight, linear.bias  # the same Parameters, not copies
        adapted.adapter = BottleneckAdapter(linear.out_features, size, activation).to(
            device=linear.weight.device, dtype=linear.weight.dtype)
        return adapted

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.adapter(F.linear(x, self.weight, self.bias))


def add_adapters(model: nn.Module, layers: str | Sequence[str], size: int, activation: str = "gelu") -> list[str]:
    """Put a bottleneck adapter of inner size `size` after every linear layer whose name matches `layers`;
    records {"size", "activation", "layers"} in `model.config.extra["adapters"]` when the model has one."""
    names = _matching_linears(model, layers)
    if not names:
        raise ValueError(f"no linear layer matches {shorten(layers)}")
    for name in names:
        _replace(model, name, AdaptedLinear.wrap(model.get_submodule(name), size, activation))
    extra = _config_extra(model)
    if extra is not None:
        extra[ADAPTERS_CONFIG_KEY] = {"size": size, "activation": activation, "layers": names}
    return names


def add_saved_adapters(model: nn.Module) -> list[str]:
    """The adapters `model.config.extra["adapters"]` and the unmerged LoRA `extra["lora"]` describe, added
    before a saved model's weights load."""
    extra = _config_extra(model) or {}
    names = []
    saved = extra.get(ADAPTERS_CONFIG_KEY)
    if saved:
        names += add_adapters(model, list(saved["layers"]), int(saved["size"]), saved.get("activation", "gelu"))
    lora = extra.get(LORA_CONFIG_KEY)
    if lora:
        names += add_lora(model, list(lora["layers"]), int(lora["rank"]), float(lora["alpha"]))
    return names


# ---------------------------------------------------------------------------------------------- LoRA
class LoRA(nn.Module):
    """The parametrization W -> W + (alpha / rank) · B A, A (rank, in) ~ Kaiming-uniform, B (out, rank) = 0."""

    def __init__(self, out_features: int, in_features: int, rank: int, alpha: float, device=None, dtype=None):
        super().__init__()
        self.lora_A = nn.Parameter(torch.empty(rank, in_features, device=device, dtype=dtype))
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank, device=device, dtype=dtype))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # as nn.Linear's, and as the LoRA paper's code
        self.scaling = alpha / rank

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight + (self.lora_B @ self.lora_A) * self.scaling


def check_lora_settings(rank: Any, alpha: Any) -> None:
    """A ValueError unless `rank` is a whole number >= 1 and `alpha` a finite positive number (a NaN or an
    infinite alpha gives NaN scores; rank 0 divides by zero)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"r must be a whole number of at least 1, got {shorten(rank)}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"lora_alpha must be a finite positive number, got {shorten(alpha)}")


def add_lora(model: nn.Module, layers: str | Sequence[str], rank: int, alpha: float) -> list[str]:
    """LoRA of rank `rank` on the weight of every linear layer whose name matches `layers`. The rank is checked
    against every layer (at most min(in, out): a higher rank adds nothing) before any factor is allocated."""
    check_lora_settings(rank, alpha)
    names = _matching_linears(model, layers)
    if not names:
        raise ValueError(f"no linear layer matches {shorten(layers)}")
    for name in names:
        linear = model.get_submodule(name)
        if rank > min(linear.in_features, linear.out_features):
            raise ValueError(f"r {rank:,} is over {name}'s {linear.out_features} x {linear.in_features} weight "
                             f"(at most {min(linear.in_features, linear.out_features)})")
    for name in names:
        linear = model.get_submodule(name)
        parametrize.register_parametrization(linear, "weight", LoRA(
            linear.out_features, linear.in_features, rank, alpha, linear.weight.device, linear.weight.dtype))
    extra = _config_extra(model)
    if extra is not None:  # a save before merging records them, so that the model loads with them
        extra[LORA_CONFIG_KEY] = {**extra.get(LORA_CONFIG_KEY, {}), "rank": rank, "alpha": alpha, "layers": names}
    return names


def lora_layers(model: nn.Module) -> dict[str, LoRA]:
    """The unmerged LoRA parametrizations, by the name of the linear layer they adapt."""
    return {name: p for name, module in model.named_modules()
            if parametrize.is_parametrized(module, "weight")
            for p in module.parametrizations["weight"] if isinstance(p, LoRA)}


@torch.no_grad()
def merge_lora(model: nn.Module) -> int:
    """Fold every LoRA into its weight (W + (α/r) B A) and drop the parametrization; returns how many."""
    merged = 0
    for module in model.modules():
        if parametrize.is_parametrized(module, "weight") and \
                any(isinstance(p, LoRA) for p in module.parametrizations["weight"]):
            parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)
            merged += 1
    extra = _config_extra(model)
    if extra is not None:
        extra.pop(LORA_CONFIG_KEY, None)  # a plain model now
    return merged


# ---------------------------------------------------------------------------------------------- freezing
def freeze_except(model: nn.Module, trainable: Callable[[str], bool]) -> None:
    """requires_grad = trainable(name) for every parameter."""
    for name, p in model.named_parameters():
        p.requires_grad_(trainable(name))


def parameter_counts(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameters; a tensor shared by two modules counts once."""
    unique = {id(p): p for p in model.parameters()}.values()
    return sum(p.numel() for p in unique if p.requires_grad), sum(p.numel() for p in unique)


class GradualUnfreezing:
    """`blocks` bottom to top (e.g. embeddings, layer 0 ... layer L-1); the parameters outside them (the task
    head) always train. At step s the top ⌊s / every⌋ blocks train too, the rest stay frozen (Howard &
    Ruder, 2018): the head first settles on the frozen features, then each lower block joins in turn."""

    def __init__(self, blocks: Sequence[nn.Module], every: int):
        if every < 1:
            raise ValueError(f"gradual unfreezing: every must be at least 1 step, got {every}")
        self.blocks, self.every = list(blocks), every
        self.unfrozen = -1

    def update(self, step: int) -> int:
        """Set requires_grad for `step`; returns how many blocks train now."""
        n = min(len(self.blocks), step // self.every)
        if n != self.unfrozen:
            for i, block in enumerate(self.blocks):
                for p in block.parameters():
                    p.requires_grad_(i >= len(self.blocks) - n)
            self.unfrozen = n
        return n

