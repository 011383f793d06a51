"""`bertlab finetune-embeddings --model M --train FILE --out DIR [--loss mnrl]`: fine-tune a sentence-embedding
model (bi-encoder) on your own pairs.

    bertlab finetune-embeddings --model all-MiniLM-L6-v2 --train pairs.csv --out runs/emb --loss mnrl \\
        --batch-size 32 --epochs 1 --lr 5e-5 --warmup-proportion 0.1 --validation beir_dev_dir
    bertlab finetune-embeddings --model M --train triplets.jsonl --out runs/emb --loss cached-mnrl --batch-size 1024
    bertlab finetune-embeddings --model M --train sts.csv --out runs/sts --loss cosent --matryoshka-dims 384,128,64
    bertlab finetune-embeddings --out runs/emb --resume               # after Ctrl-C, a crash, or a SIGTERM

Losses: mnrl (in-batch and hard negatives, --symmetric), cached-mnrl (GradCache: the same gradient, one
mini-batch's memory), cosent and cosine (scored pairs), margin-mse (a teacher's margins); --matryoshka-dims
around any of them. OUT_DIR/final (and OUT_DIR/best with --validation) is a sentence-transformers folder.
Settings: the dataclass `bertlab.train.retrieval.finetune.EmbeddingFinetuneConfig`, then `--config FILE`, then
the flags.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..train.retrieval.finetune import EmbeddingFinetuneConfig
    from ..train.retrieval.recipe import add_arguments as add_training_arguments

    add_training_arguments(p, EmbeddingFinetuneConfig)


def run(args: argparse.Namespace) -> int:
    from ..train.retrieval.finetune import EmbeddingFinetuneConfig, run_finetune
    from ..train.retrieval.recipe import run_command

    return run_command(args, EmbeddingFinetuneConfig, run_finetune, "finetune-embeddings", lambda result: {
        "best": str(result.best) if result.best else None, "validation": result.validation,
        "best_validation": result.best_validation.get("metrics") or None,
        "stopped_early_at": result.best_validation.get("stopped_at")})
