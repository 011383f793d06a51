"""`bertlab finetune TASK --model DIR --data PATH --out DIR`: one added layer, trained on a task (paper, section 4).

Writes OUT_DIR/metrics.json (the selected setting, mean ± sd over seeds, every run), the dev and test
predictions, and the best model in OUT_DIR/model/ (Hugging Face layout). See `bertlab.train.finetune`.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..tasks import TASKS

# flag -> FinetuneConfig field, for the flags that are plain values
_FIELDS = ("model", "data", "out", "epochs", "lr", "batch_size", "grad_accum", "max_seq_length", "warmup_proportion",
           "weight_decay", "group_by_length", "layer_lr_decay", "seed", "seeds", "grid", "bf16", "eval_batch_size",
           "eval_every", "train_limit", "eval_limit", "device", "retain_freed_memory")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("task", metavar="TASK", choices=list(TASKS), help=f"one of: {' '.join(TASKS)}")
    p.add_argument("--model", metavar="MODEL_DIR", help="a Hugging Face-layout BERT folder (ours or theirs)")
    p.add_argument("--data", metavar="DATA_PATH", help="the task's folder (GLUE, CoNLL, SWAG) or file(s) (SQuAD)")
    p.add_argument("--out", metavar="OUT_DIR", help="where metrics.json, predictions and model/ go")
    p.add_argument("--config", metavar="FILE", help="a JSON run config (FinetuneConfig fields); flags override it")
    p.add_argument("--epochs", type=float, help="training epochs (default 3)")
    p.add_argument("--lr", type=float, help="peak learning rate (default 2e-5)")
    p.add_argument("--batch-size", type=int, help="examples per optimizer step (default 32)")
    p.add_argument("--grad-accum", type=int, help="split each batch into this many micro-batches (default 1)")
    p.add_argument("--max-seq-length", type=int, help="tokens per sequence (default: the task's, 128 for GLUE)")
    p.add_argument("--warmup-proportion", type=float, help="share of steps with linear warmup (default 0.1)")
    p.add_argument("--weight-decay", type=float, help="AdamW weight decay, not on biases/LayerNorm (default 0.01)")
    p.add_argument("--no-group-by-length", dest="group_by_length", action="store_false", default=None,
                   help="draw training batches without regard to length (default: length-grouped batches, "
                        "little padding)")
    p.add_argument("--layer-lr-decay", type=float, metavar="F",
                   help="layer-wise LR decay: layer l gets lr * F^(L-l), embeddings the lowest (default off)")
    p.add_argument("--seed", type=int, help="first seed (default 42; run k uses seed + k)")
    p.add_argument("--seeds", type=int, help="runs per setting, reported as mean ± sd (default 1)")
    p.add_argument("--grid", choices=["paper"], help="paper: batch 16/32 x lr 5e-5/3e-5/2e-5 x epochs 2/3/4, "
                                                     "best on dev kept")
    p.add_argument("--bf16", action="store_true", default=None, help="bf16 autocast (CPU or GPU)")
    p.add_argument("--eval-batch-size", type=int, help="examples per prediction batch (default 64)")
    p.add_argument("--eval-every", type=int, help="also score dev every N steps (logged per run)")
    p.add_argument("--train-limit", type=int, metavar="N", help="train on a seeded random N examples")
    p.add_argument("--eval-limit", type=int, metavar="N", help="score a seeded random N dev/test examples")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-retain-freed-memory", dest="retain_freed_memory", action="store_false", default=None,
                   help="CPU: let glibc return freed tensor memory to the OS (default: kept for reuse, faster)")
    from ..train.feature_ner import STRATEGIES
    p.add_argument("--feature-based", metavar="STRATEGY", choices=list(STRATEGIES),
                   help=f"NER: train a BiLSTM on frozen features instead ({', '.join(STRATEGIES)}; paper Table 7)")


def run(args: argparse.Namespace) -> int:
    from ..errors import ConfigError
    from ..train.finetune import FinetuneConfig, finetune

    if args.feature_based:  # the paper's feature-based approach: see bertlab.train.feature_ner
        from ..train.feature_ner import run_from_finetune_args
        return run_from_finetune_args(args)
    values = {f: getattr(args, f) for f in _FIELDS if getattr(args, f) is not None}
    values.update(task=args.task, progress=not args.no_progress and sys.stderr.isatty())
    if args.config:
        cfg = FinetuneConfig.from_json_file(args.config, **values)
    else:
        missing = [f"--{f}" for f in ("model", "data", "out") if f not in values]
        if missing:
            raise ConfigError(f"missing {', '.join(missing)} (or give them in --config FILE)")
        cfg = FinetuneConfig(**values)
    metrics = finetune(cfg)
    print(json.dumps({"task": metrics["task"], "selected": metrics["selected"],
                      "dev": {split: {k: f"{v['mean']:.4f} ± {v['sd']:.4f}" for k, v in scores.items()}
                              for split, scores in metrics["dev"].items()},
                      "out": str(cfg.out)}, indent=2, ensure_ascii=False))
    return 0

