"""Training: the one loop (`loop.py`), BERT's optimisation (`optim.py`) and the recipes that configure them.

    pretrain.py     pre-training (MLM + NSP, or another objective of `bertlab.objectives`)
    finetune.py     fine-tuning on a task, with seeds and the paper's grid
    distillation/   general and task-specific distillation; `students.py` builds the student
    feature_ner.py  the paper's feature-based NER: a BiLSTM over frozen, cached features (Table 7)
    run_record.py   what every recipe sets up alike: resume config, precision, batch split, time budget
    fsdp.py         FSDP2 under torchrun: `fully_shard` per layer block, sharded checkpoints (DCP), the gathered export
    runconfig.py    typed run configs: dataclass defaults < --config FILE < flags
    options.py      the settings every recipe shares, declared once: the `run` and `optim` groups

See `loop.py`'s docstring for an example."""

from .batches import count_tokens, shuffled_batches, steps_for_epochs, steps_per_epoch, time_step, to_device

from .distributed import DistInfo, end_distributed, init_distributed, isolated_rng, leave_job, seed_everything

from .loop import LoopConfig, NonFiniteLossError, Trainer, TrainResult, read_metrics

from .run_dir import checkpoint_dirs, latest_checkpoint, read_checkpoint
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
    "end_distributed", "init_distributed", "isolated_rng", "latest_checkpoint", "leave_job", "read_checkpoint",
    "read_metrics", "seed_everything", "shuffled_batches", "steps_for_epochs", "steps_per_epoch", "time_step",
    "to_device", "Lamb", "WarmupLinearDecay", "adamw", "build_optimizer", "lamb", "layerwise_lr_scale",
    "linear_warmup_decay", "no_weight_decay", "param_groups",
]
