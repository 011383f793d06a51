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
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..train.retrieval.reranker import RerankerConfig
    from ..train.runconfig import add_config_arguments

    add_config_arguments(p, RerankerConfig, aliases={"warmup": ("--warmup-proportion",)})


def run(args: argparse.Namespace) -> int:
    from ..core.model_names import resolve_model
    from ..train.retrieval.reranker import RerankerConfig, run_reranker
    from ..train.runconfig import config_from_args, given_fields

    cfg = config_from_args(RerankerConfig, args)
    if cfg.model:
        cfg.model = str(resolve_model(cfg.model))
    result = run_reranker(cfg, given_fields(RerankerConfig, args))
    if result.train.interrupted:
        print(f"interrupted at step {result.train.step}; checkpoint {result.train.checkpoint}; continue with: "
              f"bertlab finetune-reranker --out {result.out_dir} --resume")
        return result.train.exit_status
    print(json.dumps({"final": str(result.final), "steps": result.train.step, "rows": result.rows,
                      "train_seconds": round(result.train.elapsed, 1), "loss": result.train.metrics.get("loss")},
                     indent=2))
    return 0
