"""Fine-tuning methods beside full fine-tuning: which parameters train, and how that changes over a run.

    full        every parameter trains (the paper); optionally `gradual_unfreezing` K: the head alone first,
                then one more block from the top every K steps (embeddings last)
    adapters    Houlsby bottleneck adapters (inner size `adapter_size`) after each layer's attention output
                projection and feed-forward output; the pre-trained weights are frozen, the adapters, every
                norm and the new task head train
    lora        LoRA of rank `lora_rank`, scale `lora_alpha / lora_rank` on the linear layers named in
                `lora_targets` (default the family's attention query and value projections: `query,value` in
                BERT's layout, `query_proj,value_proj` in DeBERTa's, ModernBERT's fused `Wqkv`); the pre-trained
                weights are frozen,
                the low-rank factors and the task head train. On save the factors are merged into the weights,
                so the saved model is a plain BERT with a head that `transformers` loads as such; with
                `lora_merge` off, the factors and the head alone are saved, in PEFT's adapter layout over
                the pre-trained model's folder (checkpoint/peft.py: bertlab and `peft` load it)

The generic machinery (adapters, LoRA, freezing, unfreezing over a list of blocks) is `bertlab.nn.adapters`;
which layers a family adapts is its `Family` record's (`lora_targets`, `adapter_layers`, `adapter_norms`);
this module holds the choices across families (which blocks unfreeze) and the hooks the fine-tuning recipe
calls: `prepare` before the optimizer is built, `after_optimizer` once it is, `finish` before the weights
are kept. A saved adapter model records its adapters in config.json and loads with them (checkpoint/).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from torch import nn

from ..core.errors import ConfigError
from ..models.family import Family, layer_blocks
from ..models.registry import DEFAULT_MODEL_TYPE, family as family_named
from ..nn.adapters import (LORA_CONFIG_KEY, GradualUnfreezing, add_adapters, add_lora, freeze_except, merge_lora,
                           parameter_counts)

log = logging.getLogger(__name__)

METHODS = ("full", "adapters", "lora")


@dataclass
class TuningOptions:
    method: str = "full"  # full | adapters | lora
    adapter_size: int = 64  # bottleneck width m of each adapter
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_targets: str | None = None  # comma-separated names of the linear layers LoRA adapts; None: the family's
    lora_merge: bool = True  # merge the factors into the weights on save (a plain model); off: a PEFT adapter
    gradual_unfreezing: int | None = None  # full fine-tuning: unfreeze one more block every K steps from the top

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.adapter_size < 1 or self.lora_rank < 1 or not self.lora_alpha > 0:
            raise ConfigError("adapter-size and lora-rank must be at least 1 and lora-alpha positive")
        if self.gradual_unfreezing is not None and (self.gradual_unfreezing < 1 or self.method != "full"):
            raise ConfigError("gradual-unfreezing K needs K >= 1 and --method full (adapters and LoRA keep the "
                              "pre-trained weights frozen throughout)")

    def targets(self, family: Family) -> list[str]:
        """The linear layers LoRA adapts: those named, else the family's attention query and value."""
        if self.lora_targets is None:
            return list(family.lora_targets)
        return [t.strip() for t in self.lora_targets.split(",") if t.strip()]


@dataclass
class Tuning:
    """What `prepare` set up for one run: the report for metrics.json and the per-step update, if any."""

    options: TuningOptions
    report: dict[str, Any] = field(default_factory=dict)
    unfreezing: GradualUnfreezing | None = None

    def after_optimizer(self) -> Callable[[int], None] | None:
        """Called once the optimizer holds every parameter: freeze what gradual unfreezing starts without;
        returns the per-step update (step -> None) for the recipe to call after each optimizer step."""
        if self.unfreezing is None:
            return None
        self.unfreezing.update(0)
        return self.unfreezing.update

    def finish(self, model: nn.Module) -> None:
        """Before the weights are kept: LoRA merged into them (a plain model) unless kept apart, everything
        trainable again."""
        if self.options.method == "lora" and self.options.lora_merge:
            merge_lora(model)
        for p in model.parameters():
            p.requires_grad_(True)


def unfreezing_groups(encoder: nn.Module) -> list[nn.Module]:
    """What gradual unfreezing walks, bottom to top: the embeddings, then each block of the layer stack (a
    shared block once: ALBERT's groups). An encoder with pre-trained parts beside those (a final norm, a
    projection, a relative-position table) lists its groups itself (`unfreezing_groups()`), so that no
    pre-trained part trains from the first step as if it were the new head."""
    if callable(getattr(encoder, "unfreezing_groups", None)):
        return encoder.unfreezing_groups()
    blocks = layer_blocks(encoder)  # bottom to top; a shared block once (ALBERT)
    if not blocks:
        raise ConfigError(f"gradual-unfreezing: {type(encoder).__name__} has no layer stack to unfreeze "
                          "(no blocks())")
    return [encoder.embeddings, *blocks]


def prepare(model: nn.Module, options: TuningOptions, new_modules: list[str], base_model: str | None = None) -> Tuning:
    """Apply the method to a fresh task model; `new_modules` (the head, a pooler the checkpoint lacked) always
    train; `base_model`: the pre-trained folder an unmerged LoRA adapter is saved over. Logs and reports
    trainable / total parameters."""
    def is_new(name: str) -> bool:
        return any(name.startswith(m + ".") for m in new_modules)

    tuning = Tuning(options)
    family = family_named(model.config.to_dict().get("model_type", DEFAULT_MODEL_TYPE))  # whose layer names
    if options.method == "adapters":
        # Houlsby et al.: an adapter after the attention block's output projection and after the feed-forward
        # output, each before its residual add
        layers = add_adapters(model, family.adapter_layers, options.adapter_size)
        freeze_except(model, lambda n: ".adapter." in n or family.adapter_norms in n or is_new(n))
        tuning.report["adapters"] = len(layers)
    elif options.method == "lora":
        targets = options.targets(family)
        try:
            layers = add_lora(model, targets, options.lora_rank, options.lora_alpha)
        except ValueError as e:
            if "no linear layer matches" not in str(e):  # a rank over a layer's size: the rank is the problem
                raise ConfigError(f"lora-rank: {e}") from None
            raise ConfigError(f"lora-targets {','.join(targets)!r} names no linear layer of the {family.name} "
                              f"model (its attention's: {','.join(family.lora_targets)})") from None
        freeze_except(model, lambda n: "lora_" in n or is_new(n))
        tuning.report["lora_layers"] = len(layers)
        # what an unmerged save needs beside the factors: the modules trained whole, and where the rest is
        model.config.extra[LORA_CONFIG_KEY].update(modules_to_save=list(new_modules),
                                                   base_model_name_or_path=base_model)
    elif options.gradual_unfreezing:
        encoder = getattr(model, model.base_model_prefix)  # model.bert, model.distilbert, model.albert
        tuning.unfreezing = GradualUnfreezing(unfreezing_groups(encoder), options.gradual_unfreezing)
    trainable, total = parameter_counts(model)
    tuning.report.update(method=options.method, trainable_parameters=trainable, total_parameters=total)
    log.info("%s: %s of %s parameters train (%.2f%%)", options.method, f"{trainable:,}", f"{total:,}",
             100 * trainable / total)
    return tuning
