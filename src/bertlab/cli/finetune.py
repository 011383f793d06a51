"""`bertlab finetune TASK --model DIR --data PATH --out DIR`: one added layer, trained on a task (paper, section 4).

Writes OUT_DIR/metrics.json (the selected setting, mean ± sd over seeds, every run), the dev and test
predictions, the best model in OUT_DIR/model/ (Hugging Face layout) and OUT_DIR/run_config.json. Settings
come from the dataclass `bertlab.train.finetune.FinetuneConfig`: its defaults, then a JSON file (`--config
run.json`; a run's own OUT_DIR/run_config.json works), then the flags -- as for pretrain and distill.
"""

from __future__ import annotations

import argparse
import json

from ..tasks import TASKS

HELP = {
    "model": "a Hugging Face-layout BERT folder (ours or theirs), or a model's name in the local Hugging Face cache",
    "data": "the task's folder (GLUE, CoNLL, SWAG) or file(s) (SQuAD)",
    "out": "OUT_DIR: metrics.json, predictions, model/, run_config.json",
    "epochs": "training epochs",
    "lr": "peak learning rate (default: by model width, 1e-4 up to 512 wide, 5e-5 for 768, 3e-5 above)",
    "batch_size": "examples per optimizer step",
    "grad_accum": "split each batch into this many micro-batches",
    "max_seq_length": "tokens per sequence (default: the task's, 128 for GLUE)",
    "warmup_proportion": "share of steps with linear warmup",
    "weight_decay": "AdamW weight decay, not on biases/LayerNorm",
    "max_grad_norm": "gradient clipping norm",
    "group_by_length": "training batches of similar-length examples (little padding)",
    "layer_lr_decay": "layer-wise LR decay F: layer l gets lr * F^(L-l), embeddings the lowest (default off)",
    "seed": "first seed (run k uses seed + k)",
    "seeds": "runs per setting, reported as mean ± sd",
    "grid": "paper: batch 16/32 x lr 5e-5/3e-5/2e-5 x epochs 2/3/4, best on dev kept",
    "bf16": "bf16 autocast (CPU or GPU)",
    "eval_batch_size": "examples per prediction batch",
    "eval_every": "also score dev every N steps (logged per run)",
    "train_limit": "train on a seeded random N examples",
    "eval_limit": "score a seeded random N dev/test examples",
    "device": "cpu or cuda (default: cuda when available)",
    "progress": "progress: a bar on a terminal, a line every 30 s in a log file",
    "overwrite": "replace the results of an earlier run in OUT_DIR (without it, such an OUT_DIR is refused)",
    "retain_freed_memory": "CPU: keep freed tensor memory for reuse instead of paging it in anew each step",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..train.feature_ner import STRATEGIES
    from ..train.finetune import FinetuneConfig
    from ..train.runconfig import add_config_arguments

    p.add_argument("task", metavar="TASK", choices=list(TASKS), help=f"one of: {' '.join(TASKS)}")
    add_config_arguments(p, FinetuneConfig, HELP, skip=("task",))
    p.add_argument("--feature-based", metavar="STRATEGY", choices=list(STRATEGIES),
                   help=f"NER: train a BiLSTM on frozen features instead ({', '.join(STRATEGIES)}; paper Table 7)")


def mean_sd_text(score: dict) -> str:
    """`0.8012 ± 0.0041` over several seeds; one run's score alone (its spread is unknown, not zero)."""
    if len(score.get("runs", ())) > 1:
        return f"{score['mean']:.4f} ± {score['sd']:.4f}"
    return f"{score['mean']:.4f}"


def run(args: argparse.Namespace) -> int:
    from ..model_names import resolve_model
    from ..train.finetune import FinetuneConfig, finetune
    from ..train.runconfig import config_from_args

    if args.feature_based:  # the paper's feature-based approach: see bertlab.train.feature_ner
        from ..train.feature_ner import run_from_finetune_args
        return run_from_finetune_args(args)
    cfg = config_from_args(FinetuneConfig, args)
    if cfg.model:  # a folder, or a model's name in the local Hugging Face cache
        cfg.model = str(resolve_model(cfg.model))
    metrics = finetune(cfg)
    print(json.dumps({"task": metrics["task"], "selected": metrics["selected"],
                      "dev": {split: {k: mean_sd_text(v) for k, v in scores.items()}
                              for split, scores in metrics["dev"].items()},
                      "out": str(cfg.out)}, indent=2, ensure_ascii=False))
    return 0
