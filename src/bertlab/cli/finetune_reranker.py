"""`bertlab finetune-reranker --model M --train FILE --out DIR [--loss bce|listwise|distill]`: fine-tune a
cross-encoder reranker on your own rows.

    bertlab mine-negatives --model all-MiniLM-L6-v2 --train pairs.csv --output groups.csv --num-negatives 4
    bertlab finetune-reranker --model all-MiniLM-L6-v2 --train groups.csv --out runs/rr --loss listwise
    bertlab finetune-reranker --model M --train labelled.csv --out runs/rr          # query, passage, label
    bertlab evaluate-retrieval --model all-MiniLM-L6-v2 --data DIR --reranker runs/rr/final --rerank-top 100
    bertlab serve --model all-MiniLM-L6-v2 --classify-model runs/rr/final           # POST /rerank

OUT_DIR/final loads in sentence-transformers' CrossEncoder with the same scores. Settings: the dataclass
`bertlab.train.retrieval.reranker.RerankerConfig`, then `--config FILE`, then the flags.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..train.retrieval.recipe import add_arguments as add_training_arguments
    from ..train.retrieval.reranker import RerankerConfig

    add_training_arguments(p, RerankerConfig)


def run(args: argparse.Namespace) -> int:
    from ..train.retrieval.recipe import run_command
    from ..train.retrieval.reranker import RerankerConfig, run_reranker

    return run_command(args, RerankerConfig, run_reranker, "finetune-reranker")
