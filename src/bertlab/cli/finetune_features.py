"""`bertlab finetune-features [TASK] --strategy STRATEGY --model DIR --data DIR --out DIR`: the paper's feature-based NER.

No BERT weight is trained: a BiLSTM tagger learns from frozen features of chosen layers (the paper's Table 7:
embeddings, second-to-last, last, sum-last-4, concat-last-4, sum-all), cached on disk so that several
strategies share one pass of the encoder (`bertlab.train.feature_ner`). TASK is a token-classification task
(default conll2003). OUT_DIR gets metrics.json, dev predictions and the tagger. Settings: the dataclass
`FeatureNerConfig`, then `--config FILE`, then the flags.
"""

from __future__ import annotations

import argparse
import json

def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..tasks import TASKS
    from ..train.feature_ner import FeatureNerConfig
    from ..train.runconfig import add_config_arguments

    p.add_argument("task", metavar="TASK", nargs="?", choices=list(TASKS),
                   help="a token-classification task (default: conll2003)")
    add_config_arguments(p, FeatureNerConfig, skip=("task",))  # the help: FeatureNerConfig's docstrings


def run(args: argparse.Namespace) -> int:
    from ..core.model_names import resolve_model
    from ..train.feature_ner import FeatureNerConfig, train_feature_ner
    from ..train.runconfig import config_from_args

    cfg = config_from_args(FeatureNerConfig, args)
    cfg.model = str(resolve_model(cfg.model))
    metrics = train_feature_ner(cfg)
    print(json.dumps({"task": metrics["task"], "strategy": cfg.strategy, "layers": metrics["layers"],
                      "dev": {k: round(v, 4) for k, v in metrics["dev"].items()}, "out": cfg.out}, indent=2))
    return 0
