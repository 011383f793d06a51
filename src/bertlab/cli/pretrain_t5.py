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

from .pretrain import DEFAULTS as PRETRAIN_DEFAULTS, HELP as PRETRAIN_HELP, add_run_arguments, report

# BERT's help for the settings both recipes have; T5's optimizer and warmup are its `optim` group's (t5_optim.py)
HELP = {k: v for k, v in PRETRAIN_HELP.items() if k not in ("optimizer", "warmup")} | {
    "model": "T5 preset (t5-tiny, t5-mini, t5-small, t5-base, t5-large, t5-v1_1-*) or config.json / model folder",
    "architecture": "encoder-decoder, decoder-only or prefix-lm (default: the model config's)",
    "data": "DATA_DIR from `bertlab prepare --objective NAME`",
    "init_from": "Hugging Face-layout T5 folder to continue pre-training from",
    "objective": "span-corruption, iid-denoising, bert-style, mass-style, drop-tokens, deshuffle or prefix-lm, one "
                 "the data was prepared for (default: the data's)",
}


DEFAULTS = PRETRAIN_DEFAULTS | {"lr": "adafactor 1/sqrt(warmup) = 0.01, adamw 1e-3",
                                "max_grad_norm": "none, Adafactor clips its own updates",
                                "batch_size": "T5's 128; a budgeted CPU run the largest of 128, 64, ..., 8 that fits "
                                              "its budget"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..train.t5_pretrain import T5PretrainConfig

    add_run_arguments(p, T5PretrainConfig, __doc__, HELP, DEFAULTS)


def run(args: argparse.Namespace) -> int:
    from ..train.runconfig import config_from_args, given_fields
    from ..train.t5_pretrain import T5PretrainConfig, run_t5_pretraining

    cfg = config_from_args(T5PretrainConfig, args)
    return report(run_t5_pretraining(cfg, given=given_fields(T5PretrainConfig, args)), "pretrain-t5", cfg.out,
                  "T5ForConditionalGeneration")
