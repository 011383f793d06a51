"""`bertlab finetune TASK --model DIR --data PATH --out DIR`: one added layer, trained on a task (paper, section 4).

Writes OUT_DIR/metrics.json (the selected setting, mean ± sd over seeds, every run), the dev and test
predictions, the best model in OUT_DIR/model/ (Hugging Face layout) and OUT_DIR/run_config.json. Settings
come from the dataclass `bertlab.train.finetune.FinetuneConfig`: its defaults, then a JSON file (`--config
run.json`; a run's own OUT_DIR/run_config.json works), then the flags -- as for pretrain and distill.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..tasks import TASKS

HELP = {
    "model": "a Hugging Face-layout BERT folder (ours or theirs)",
    "data": "the task's folder (GLUE, CoNLL, SWAG) or file(s) (SQuAD)",
    "out": "OUT_DIR: metrics.json, predictions, model/, run_config.json",
    "epochs": "training epochs",
    "lr": "peak learning rate",
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
    "progress": "progress bar (default: when stderr is a terminal)",
    "retain_freed_memory": "CPU: keep freed tensor memory for reuse instead of paging it in anew each step",
    "save_every": "also checkpoint a run's training state every N steps (it is always saved on Ctrl-C/SIGTERM)",
    "resume": "continue an interrupted fine-tuning in OUT_DIR (a grid or seed sweep at the run it was in)",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..train.feature_ner import STRATEGIES
    from ..train.finetune import FinetuneConfig
    from ..train.runconfig import add_config_arguments

    p.add_argument("task", metavar="TASK", choices=list(TASKS), help=f"one of: {' '.join(TASKS)}")
    add_config_arguments(p, FinetuneConfig, HELP, skip=("task",))
    p.add_argument("--feature-based", metavar="STRATEGY", choices=list(STRATEGIES),
                   help=f"NER: train a BiLSTM on frozen features instead ({', '.join(STRATEGIES)}; paper Table 7)")


def run(args: argparse.Namespace) -> int:
    from ..train.finetune import FinetuneConfig, FinetuneInterrupted, finetune
    from ..train.runconfig import config_from_args, given_fields
    from ..train.setup import resume_base

    if args.feature_based:  # the paper's feature-based approach: see bertlab.train.feature_ner
        from ..train.feature_ner import run_from_finetune_args
        return run_from_finetune_args(args)
    base = {"progress": sys.stderr.isatty()}
    if args.resume and args.out is not None:  # the run's own settings; the flags given again override them
        base.update(resume_base(args.out))
    cfg = config_from_args(FinetuneConfig, args, base=base)
    try:
        metrics = finetune(cfg, given=given_fields(FinetuneConfig, args))
    except FinetuneInterrupted as stop:  # tell the truth: --resume continues only from a saved checkpoint
        where = stop.result.checkpoint
        print(f"interrupted in {stop.run_dir} at step {stop.result.step}; "
              + (f"checkpoint {where}; continue with: bertlab finetune {cfg.task} --out {cfg.out} --resume"
                 if where is not None else "no checkpoint was written"), file=sys.stderr)
        return stop.result.exit_status
    print(json.dumps({"task": metrics["task"], "selected": metrics["selected"],
                      "dev": {split: {k: f"{v['mean']:.4f} ± {v['sd']:.4f}" for k, v in scores.items()}
                              for split, scores in metrics["dev"].items()},
                      "out": str(cfg.out)}, indent=2, ensure_ascii=False))
    return 0
