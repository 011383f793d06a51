"""`bertlab finetune-t5 --tasks a,b,c --model T5_DIR --data GLUE_DIR --out DIR`: T5's text-to-text fine-tuning.

Every task written as text ("mrpc sentence1: ... sentence2: ..." -> "equivalent"), one task or several mixed
into one model, Adafactor at a constant rate by default, greedy decoding scored by each task's own metric
(`bertlab.train.text_to_text`). Settings: the dataclass `TextToTextConfig`, then `--config FILE`, then the flags;
`--resume` continues the seed in progress with the run's own settings.
"""

from __future__ import annotations

import argparse
import json

from .finetune import HELP as FINETUNE_HELP, mean_sd, run_recipe
from .finetune_multi import HELP as MULTI_HELP

HELP = FINETUNE_HELP | MULTI_HELP | {
    "model": "a T5 folder with its tokenizer (spiece.model, or vocab.txt with the sentinels), a model's name in the "
             "local Hugging Face cache, or a size (t5-tiny, t5-mini, t5-small, ...) with --vocab: a randomly "
             "initialised model",
    "vocab": "with a size as --model: its tokenizer (a SentencePiece .model or a vocab.txt); the model starts from "
             "random weights",
    "data": "GLUE_DIR (a folder of GLUE task folders) or task=PATH,task=PATH",
    "tasks": "comma-separated task names, one or several mixed into one model, e.g. rte,mrpc,stsb",
    "squad": "SQuAD DATA_PATH for task squad/squad2 (train=FILE,dev=FILE; FILE#A:B takes articles A..B-1)",
    "max_target_length": "longest target in tokens (training)",
    "max_new_tokens": "generation limit (default: the longest label + 2 tokens)",
    "method": "full, or adapters (T5's dense-ReLU-dense adapters after each feed-forward network, base frozen)",
}


DEFAULTS = {"lr": "Adafactor 3e-3 for 128 wide, 2e-3 for 256, T5's 1e-3 from 512; adamw 1e-3"}
LORA = ("lora_rank", "lora_alpha", "lora_targets", "lora_merge")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..train.runconfig import add_config_arguments
    from ..train.text_to_text import TextToTextConfig

    add_config_arguments(p, TextToTextConfig, HELP, skip=LORA, defaults=DEFAULTS)  # full and adapters; LoRA is BERT's alone


def run(args: argparse.Namespace) -> int:
    from ..train.text_to_text import TextToTextConfig, finetune_text_to_text

    cfg, metrics = run_recipe(args, TextToTextConfig, finetune_text_to_text, "finetune-t5")
    if isinstance(metrics, int):  # stopped by a signal
        return metrics
    print(json.dumps({"tasks": metrics["tasks"], "mixing_rates": metrics["mixing_rates"],
                      "dev": {task: {k: mean_sd(v) for k, v in scores.items()}
                              for task, scores in metrics["dev"].items()},
                      "per_task": metrics["per_task"], "out": str(cfg.out)}, indent=2, ensure_ascii=False))
    return 0
