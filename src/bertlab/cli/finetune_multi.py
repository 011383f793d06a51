"""`bertlab finetune-multi --tasks a,b,c --data a=PATH,b=PATH,... --model DIR --out DIR`: MT-DNN multi-task fine-tuning.

One shared encoder, a head per task, each optimizer step's task drawn by a mixing rule; then optionally each
task fine-tuned alone from the multi-task model (`--per-task-epochs`). The recipe is `bertlab.train.multitask`;
its settings are `bertlab finetune TASK`'s (`FinetuneConfig`) plus the `multi` group, read as `finetune` reads
them (defaults, then `--config FILE`, then the flags; `--resume` takes the run's own).
"""

from __future__ import annotations

import argparse
import json

from .finetune import ALIASES, DEFAULTS, HELP as FINETUNE_HELP, run_recipe

HELP = FINETUNE_HELP | {
    "tasks": "comma-separated task names sharing one encoder, e.g. mrpc,stsb,rte (--data mrpc=PATH,...)",
    "mixing": "how batches are drawn: proportional (to task size), temperature, equal",
    "mixing_limit": "cap each task's size at K examples in proportional/temperature mixing",
    "mixing_temperature": "temperature T (rates ∝ size^(1/T))",
    "per_task_epochs": "then fine-tune each task alone from the multi-task model for E epochs",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..train.finetune import FinetuneConfig
    from ..train.runconfig import add_config_arguments

    add_config_arguments(p, FinetuneConfig, HELP, skip=("task", "parallel"), aliases=ALIASES, defaults=DEFAULTS)
    p.set_defaults(task="multi")


def run(args: argparse.Namespace) -> int:
    from ..train.finetune import FinetuneConfig
    from ..train.multitask import finetune_multi

    cfg, metrics = run_recipe(args, FinetuneConfig, finetune_multi, "finetune-multi")
    if isinstance(metrics, int):  # stopped by a signal
        return metrics
    print(json.dumps({key: metrics[key] for key in ("tasks", "mixing_rates", "multi_task", "per_task")}
                     | {"out": str(cfg.out)}, indent=2, ensure_ascii=False))
    return 0
