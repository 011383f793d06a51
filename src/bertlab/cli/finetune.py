"""`bertlab finetune TASK --model DIR --data PATH --out DIR`: one added layer, trained on a task (paper, section 4).

Tasks on the user's own files take `--train FILE` (the same setting as `--data`) with optional
`--validation FILE` and `--test FILE`, e.g. `bertlab finetune text-classification --model DIR --train news.csv
--text-column text --label-column category --out runs/news` (see `bertlab.tasks.own_splits`).

Writes OUT_DIR/metrics.json (the selected setting, mean ± sd over seeds, every run), the dev and test
predictions, the best model in OUT_DIR/model/ (Hugging Face layout) and OUT_DIR/run_config.json. Settings
come from the dataclass `bertlab.train.finetune.FinetuneConfig`: its defaults, then a JSON file (`--config
run.json`; a run's own OUT_DIR/run_config.json works), then the flags -- as for pretrain and distill.

Under torchrun (`torchrun --nproc-per-node N -m bertlab.cli finetune TASK ... --sharding ddp|fsdp`) the processes
share every batch and rank 0 reports; docs/guide/scaling.md.

The other fine-tuning recipes are commands of their own: `finetune-multi` (several tasks, one encoder),
`finetune-t5` (T5 text-to-text), `finetune-features` (the paper's feature-based NER).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..tasks import TASKS
from ..tasks.metrics import brief_scores

HELP = {
    "model": "a Hugging Face-layout model folder (ours or theirs), a model's name in the local Hugging Face cache, "
             "or a size (tiny, mini, ..., base) with --vocab: a randomly initialised model",
    "vocab": "with a size as --model: its tokenizer (a vocab.txt); the model "
             "starts from random weights (the baseline that shows what pre-training bought)",
    "init": "pretrained (the model's weights) or random (its shape and tokenizer, new weights); default: random "
            "for a size, else pretrained; recorded in metrics.json",
    "data": "the task's folder (GLUE, CoNLL, SWAG) or file(s) (SQuAD); own-data tasks: the training file "
            "(CSV, TSV, JSONL, JSON, Parquet)",
    "out": "OUT_DIR: metrics.json, predictions, model/, run_config.json",
    "max_seq_length": "tokens per sequence (default: the task's, 128 for GLUE)",
    "warmup_proportion": "share of steps with linear warmup",
    "group_by_length": "training batches of similar-length examples (little padding)",
    "layer_lr_decay": "layer-wise LR decay F: layer l gets lr * F^(L-l), embeddings the lowest (default off)",
    "grid": "paper: batch 16/32 x lr 5e-5/3e-5/2e-5 x epochs 2/3/4, best on dev kept",
    "eval_every": "also score dev every N steps (logged per run; --eval-steps)",
    "early_stopping": "stop after N dev evaluations (each --eval-steps, default each epoch) without a better "
                      "score; the best weights are kept",
    "method": "full, adapters (Houlsby bottleneck adapters, base frozen) or lora (low-rank updates, merged on save unless --no-lora-merge)",
    "adapter_size": "adapters: bottleneck width",
    "lora_rank": "lora: rank r of the update B A",
    "lora_alpha": "lora: scale alpha (the update is multiplied by alpha / r)",
    "lora_targets": "lora: comma-separated names of the linear layers to adapt (default: the family's attention "
                    "query and value projections)",
    "lora_merge": "lora: merge the factors into the weights on save, a plain model transformers loads (default); "
                  "--no-lora-merge: save the factors and the head alone, as a PEFT adapter over --model",
    "gradual_unfreezing": "full: train the head alone, then unfreeze one more block from the top every K steps",
    "overwrite": "replace the results of an earlier run in OUT_DIR (without it, such an OUT_DIR is refused)",
    # tasks on the user's own files (text-classification, ...)
    "validation": "own data: the dev file (default: a stratified share of --train held out)",
    "test": "own data: a file to predict (labels optional)",
    "validation_share": "own data: share of --train held out as dev when there is no --validation",
    "format": "own data: csv, tsv, jsonl, json or parquet (default: from the file name)",
    "delimiter": "own data: the CSV/TSV field separator, when not the format's own",
    "text_column": "own data: the text column (default: guessed: text, sentence, content, ...)",
    "text_pair_column": "own data: the second text of sentence pairs",
    "label_column": "own data: the label column (default: guessed: label, category, class, ...)",
    "multi_label": "own data: several labels per row (a JSON list, or split on --label-separator)",
    "label_separator": "own data: separator of multi-label labels in a CSV/TSV field",
    "problem_type": "own data: single_label_classification, multi_label_classification or regression "
                    "(default: from the labels)",
    "class_weights": "own data: weight the loss by inverse class frequency",
    "long_documents": "own data: truncate (cut at max-seq-length, counted) or window (overlapping windows, "
                      "logits averaged; max for multi-label)",
    "window_length": "own data: tokens per window (default: max-seq-length)",
    "window_stride": "own data: tokens shared by consecutive windows (default: a quarter of the window)",
    "max_tokens": "own data, --long-documents window: tokens per forward pass (windows x length); a batch's "
                  "windows go through the model in parts of this size (default: batch size x window length, "
                  "the memory of a truncated batch)",
    "tokens_column": "token-classification: the word-list column (default: tokens / words)",
    "tags_column": "token-classification: the tag-list column (default: tags / ner_tags)",
    "context_column": "multiple-choice: the context column (default: context / sent1)",
    "choice_columns": "multiple-choice: comma-separated choice columns (default: ending0,ending1,...)",
}


PER_CLASS_DETAIL = ("precision_", "recall_", "support_")  # per-class scores printed as F1 only


ALIASES = {"data": ("--train",), "eval_every": ("--eval-steps",)}
# how a default the dataclass leaves open is decided (the settings' help is their docstring, train/options.py)
DEFAULTS = {"lr": "by model width, 1e-3 for 128 wide, 3e-4 for 256, 1e-4 up to 512, 5e-5 for 768, 3e-5 above"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..train.finetune import FinetuneConfig
    from ..train.runconfig import add_config_arguments

    p.add_argument("task", metavar="TASK", choices=list(TASKS), help=f"one of: {' '.join(TASKS)}")
    # several tasks at once is `finetune-multi`'s (the `multi` group); T5 is `finetune-t5`'s
    add_config_arguments(p, FinetuneConfig, HELP, skip=("task", "multi"), aliases=ALIASES, defaults=DEFAULTS)


def mean_sd(score: dict) -> float | dict[str, float]:
    """A dev score as the printed summary gives it, a number as the test scores are: {"mean": 0.8012, "sd":
    0.0041} over several seeds; one run's score alone, 0.8012 (its spread is unknown, not zero)."""
    if len(score.get("runs", ())) > 1:
        return {"mean": round(score["mean"], 4), "sd": round(score["sd"], 4)}
    return round(score["mean"], 4)


def resolved_model(model: str | None) -> str | None:
    """A folder, or a model's name in the local Hugging Face cache, as a path; a size (tiny, t5-tiny) as it is."""
    from ..core.model_names import resolve_model
    from ..train.random_init import names_a_size

    return str(resolve_model(model)) if model and not names_a_size(model) else model


def read_config(cls: type, args: argparse.Namespace):
    """The run's config: on `--resume`, the run's own settings with the flags given again over them; a
    `--model` folder or cached model's name as a path (a size as it is)."""
    from ..train.runconfig import config_from_args
    from ..train.run_record import resume_base

    base = resume_base(args.out) if args.resume and args.out is not None else {}
    cfg = config_from_args(cls, args, base=base)
    cfg.model = resolved_model(cfg.model)
    return cfg


def run_recipe(args: argparse.Namespace, cls: type, recipe, command: str | None = None) -> tuple[Any, Any]:
    """`recipe(cfg, given=...)` on the config of class `cls` the arguments make (`read_config`): (cfg, the
    recipe's metrics), or (cfg, the exit status) when a signal stopped it, said as `interrupted` says it
    (`command`: the command that continues it; default `finetune TASK`)."""
    from ..train.finetune import FinetuneInterrupted
    from ..train.runconfig import given_fields

    cfg = read_config(cls, args)
    try:
        return cfg, recipe(cfg, given=given_fields(cls, args))
    except FinetuneInterrupted as stop:
        return cfg, interrupted(stop, command or f"finetune {cfg.task}", cfg.out)


def run(args: argparse.Namespace) -> int:
    from ..train.finetune import FinetuneConfig, finetune

    cfg, metrics = run_recipe(args, FinetuneConfig, finetune)
    if isinstance(metrics, int):  # stopped by a signal
        return metrics
    if not metrics:  # another process of a torchrun job: rank 0 reports
        return 0
    print(json.dumps({"task": metrics["task"], "selected": metrics["selected"],
                      "dev": {split: {k: mean_sd(v) if isinstance(v, dict) else v
                                      for k, v in brief_scores(scores).items()
                                      if not k.startswith(PER_CLASS_DETAIL)}  # those stay in metrics.json
                              for split, scores in metrics["dev"].items()},
                      **{split: {k: round(v, 4) if isinstance(v, float) else v for k, v in metrics[split].items()
                                 if not k.startswith(PER_CLASS_DETAIL)}  # a labelled test file's scores
                         for split in TASKS[cfg.task].test_splits if split in metrics},
                      "out": str(cfg.out)}, indent=2, ensure_ascii=False))
    return 0


def interrupted(stop, command: str, out: str) -> int:
    """A signal stopped a run: say where, and tell the truth -- --resume continues only from a saved
    checkpoint (`command`: `finetune sst2`, `finetune-t5`, ...); the exit status is the shell's for that signal
    (130 Ctrl-C, 143 SIGTERM)."""
    where = stop.result.checkpoint
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun every process stopped; rank 0 says so
        print(f"interrupted in {stop.run_dir} at step {stop.result.step}; "
              + (f"checkpoint {where}; continue with: bertlab {command} --out {out} --resume"
                 if where is not None else "no checkpoint was written"), file=sys.stderr)
    return stop.result.exit_status
