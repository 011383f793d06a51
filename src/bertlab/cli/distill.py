"""`bertlab distill`: a smaller, faster BERT trained to match a teacher (DistilBERT's recipe).

    bertlab distill --teacher RUN/final --student every-other-layer --data DATA_DIR --out RUN_DIR --steps 10000
    bertlab distill --teacher RUN/final --student L4-H256 --data DATA_DIR --out RUN_DIR --time-budget 2h --bf16
    bertlab distill --task sst2 --teacher FT/model --data glue/SST-2 --out OUT_DIR [--student every-other-layer]
    bertlab distill --out RUN_DIR --resume                         # after Ctrl-C, a crash, or a SIGTERM
    torchrun --nproc_per_node 8 -m bertlab.cli distill ...         # one process per GPU (NCCL) or CPU (gloo)

General distillation (no --task): loss = α·T²·KL(teacher ‖ student MLM distributions, masked positions)
+ β·MLM + γ·cosine(last hidden states); DistilBERT's T=2, α=5, β=2, γ=1 by default. The student goes to
RUN_DIR/final. Task-specific (--task): α·T²·KL to the fine-tuned teacher's soft labels + β·gold loss
(T=2, α=1, β=1, γ=0); the student goes to OUT_DIR/model with OUT_DIR/metrics.json. Both are Hugging Face
layout folders with vocab.txt. Settings: the dataclass `bertlab.train.distillation.DistillConfig`, then a JSON
file (`--config run.json`), then the flags.
"""

from __future__ import annotations

import argparse
import json
import os

HELP = {
    "teacher": "Hugging Face-layout folder: pre-trained with its MLM head (general) or fine-tuned on --task",
    "student": "every-other-layer, every-K-layers, layers:I,J,..., a preset (mini, L4-H256, ...), a config.json, "
               "or a model folder",
    "init": "random: the student's weights drawn anew whatever --student makes (the baseline a distilled student "
            "is compared with, e.g. with --alpha 0 --gamma 0); recorded in metrics.json / run_config.json",
    "student_layout": "general: write the student as a DistilBERT (DistilBertForMaskedLM; token type 0 folded "
                      "into the positions) instead of BERT's layout",
    "data": "DATA_DIR from `bertlab prepare` (general), or the task's folder/file (--task)",
    "out": "RUN_DIR (general) / OUT_DIR (--task)",
    "task": "task-specific distillation on this task (sst2, mrpc, squad, ...)",
    "temperature": "softmax temperature T of the soft labels",
    "alpha": "weight of the soft-label term T²·KL (default 5 general, 1 task)",
    "beta": "weight of the hard-label term, MLM or gold (default 2 general, 1 task)",
    "gamma": "weight of the hidden-state cosine term (default 1 general, 0 task)",
    "kl_positions": "general: masked (the MLM head's rows) or all (every real token, as DistilBERT)",
    "cosine_layers": "last hidden state only, or all layers against the teacher layers they map to",
    "epochs": "task: passes over the training set",
    "max_seq_length": "tokens per sequence: general, the instance set's (default 128); task, default the task's",
    "train_limit": "task: train on a seeded random N examples",
    "eval_limit": "task: score a seeded random N dev examples",
    "transfer_limit": "task (GLUE-style): N more training examples without their labels; the teacher's soft "
                      "labels are their only target",
    "eval_teacher": "score the teacher too, for comparison",
}


# how a default the dataclass leaves open is decided (the settings' help is their docstring, train/options.py)
DEFAULTS = {"lr": "1e-4 general, 5e-5 task", "save_every": "general 10 per run; task: none kept once finished",
            "steps": "general: none, give it or --time-budget; task: --epochs x the data",
            "batch_size": "128 general, 32 task", "eval_every": "general 10 per run; task: the end only",
            "warmup": "0.05 general, 0.1 task"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..train.distillation import DistillConfig
    from .pretrain import add_run_arguments

    add_run_arguments(p, DistillConfig, __doc__, HELP, DEFAULTS)


def run(args: argparse.Namespace) -> int:
    from ..core.model_names import resolve_model
    from ..train.distillation import DistillConfig, run_distillation
    from ..train.runconfig import config_from_args

    cfg = config_from_args(DistillConfig, args)
    if cfg.teacher:  # a folder, or a model's name in the local Hugging Face cache
        cfg.teacher = str(resolve_model(cfg.teacher))
    result = run_distillation(cfg)
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun rank 0 reports
        return result.train.exit_status
    if result.train.interrupted:
        print(f"interrupted at step {result.train.step}; checkpoint {result.train.checkpoint}; continue with: "
              f"bertlab distill --out {result.out_dir} --resume")
        return result.train.exit_status  # 130 after Ctrl-C, 143 after SIGTERM
    summary = {"student": str(result.model_dir) if result.model_dir else None,
               "parameters": {"teacher": result.teacher_parameters, "student": result.student_parameters},
               "teacher": result.teacher_eval, "student_eval": result.student_eval}
    print(json.dumps(summary, indent=2, ensure_ascii=False))
    return 0
