"""`bertlab pretrain-t5`: pre-train T5 with a denoising objective on a directory from `bertlab prepare --objective`.

    bertlab pretrain-t5 --model t5-small --data T5_DATA --out RUN_DIR --steps 524288 --bf16
    bertlab pretrain-t5 --model t5-tiny --architecture prefix-lm --data T5_DATA --out RUN_DIR --time-budget 20m
    bertlab pretrain-t5 --out RUN_DIR --resume                       # after Ctrl-C, a crash, or a SIGTERM

The recipe is `bertlab.train.t5_pretrain` (Adafactor with the inverse square root schedule; the objective
defaults to the data's). Settings come from the dataclass `T5PretrainConfig`: its defaults, then a JSON file
(`--config run.json`; a run's own RUN_DIR/run_config.json works), then the flags. The model is exported in
the Hugging Face layout to RUN_DIR/final/; metrics go to RUN_DIR/metrics.jsonl (`bertlab plot RUN_DIR`).
"""

from __future__ import annotations

import argparse

from .pretrain import HELP as PRETRAIN_HELP, report

HELP = PRETRAIN_HELP | {
    "model": "T5 preset (t5-tiny, t5-mini, t5-small, t5-base, t5-large, t5-v1_1-*) or config.json / model folder",
    "architecture": "encoder-decoder, decoder-only or prefix-lm (default: the model config's)",
    "data": "DATA_DIR from `bertlab prepare --objective NAME`",
    "init_from": "Hugging Face-layout T5 folder to continue pre-training from",
    "objective": "span-corruption, iid-denoising, bert-style, mass-style, drop-tokens, deshuffle or prefix-lm, one "
                 "the data was prepared for (default: the data's)",
    "batch_size": "sequences per optimizer step over all processes (default: T5's 128; a budgeted CPU run the "
                  "largest of 128, 64, ..., 8 that fits its budget)",
    "optimizer": "adafactor (T5's) or adamw",
    "schedule": "inverse-sqrt (constant for --warmup steps, then 1/sqrt) or constant",
    "lr": "learning rate (default: adafactor 1/sqrt(warmup) = 0.01, adamw 1e-3)",
    "warmup": "steps at the constant rate before the inverse square root decay",
    "max_grad_norm": "gradient clipping norm (default: none; Adafactor clips its own updates)",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..train.runconfig import add_config_arguments
    from ..train.t5_pretrain import T5PretrainConfig

    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.description = __doc__.split("\n\n", 1)[1]
    add_config_arguments(p, T5PretrainConfig, HELP)
    p.add_argument("--bf16", dest="precision", action="store_const", const="bf16", help="same as --precision bf16")


def run(args: argparse.Namespace) -> int:
    from ..train.runconfig import config_from_args, given_fields
    from ..train.t5_pretrain import T5PretrainConfig, run_t5_pretraining

    cfg = config_from_args(T5PretrainConfig, args)
    return report(run_t5_pretraining(cfg, given=given_fields(T5PretrainConfig, args)), "pretrain-t5", cfg.out,
                  "T5ForConditionalGeneration")
