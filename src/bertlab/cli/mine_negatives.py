"""`bertlab mine-negatives --model M --train pairs.csv --output triplets.csv`: hard negatives for each pair.

    bertlab mine-negatives --model all-MiniLM-L6-v2 --train pairs.csv --output mined.csv --num-negatives 3
    bertlab finetune-embeddings --model all-MiniLM-L6-v2 --train mined.csv --out runs/emb   # mnrl + hard negatives
    bertlab mine-negatives --model M --train pairs.csv --output triplets.csv --triplets      # reranker rows

Each anchor is searched (exactly) against every positive of the file (and `--corpus`); its own positives are
skipped, as are candidates outside ranks `--range-min`..`--range-max` or scoring above (1 - `--relative-margin`)
x the positive's score. Settings: the dataclass `bertlab.train.retrieval.mine.MineConfig`, then `--config
FILE`, then the flags.
"""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..train.retrieval.mine import MineConfig
    from ..train.runconfig import add_config_arguments

    add_config_arguments(p, MineConfig)


def run(args: argparse.Namespace) -> int:
    from ..core.model_names import resolve_model
    from ..train.retrieval.mine import MineConfig, mine
    from ..train.runconfig import config_from_args

    cfg = config_from_args(MineConfig, args)
    if cfg.model:
        cfg.model = str(resolve_model(cfg.model))
    counts = mine(cfg)
    print(json.dumps({"output": cfg.output, **counts}))
    return 0
