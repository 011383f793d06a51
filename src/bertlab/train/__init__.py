"""Training: the one loop (`loop.py`), BERT's optimisation (`optim.py`) and the recipes that configure them
(`pretrain.py`; fine-tuning and distillation live beside it). See `loop.py`'s docstring for an example."""

from .loop import (
    DistInfo,
    LoopConfig,
    NonFiniteLossError,
    Trainer,
    TrainResult,
    checkpoint_dirs,
    count_tokens,
    init_distributed,
    isolated_rng,
    latest_checkpoint,
    read_checkpoint,
    read_metrics,
    seed_everything,
    shuffled_batches,
    steps_per_epoch,
    to_device,
)
from .optim import (
    Lamb,
    WarmupLinearDecay,
    adamw,
    build_optimizer,
    lamb,
    layerwise_lr_scale,
    linear_warmup_decay,
    no_weight_decay,
    param_groups,
)

__all__ = [
    "DistInfo", "LoopConfig", "NonFiniteLossError", "Trainer", "TrainResult", "checkpoint_dirs", "count_tokens",
    "init_distributed", "isolated_rng", "latest_checkpoint", "read_checkpoint", "read_metrics", "seed_everything",
    "shuffled_batches", "steps_per_epoch", "to_device", "Lamb", "WarmupLinearDecay", "adamw", "build_optimizer",
    "lamb", "layerwise_lr_scale", "linear_warmup_decay", "no_weight_decay", "param_groups",
]
