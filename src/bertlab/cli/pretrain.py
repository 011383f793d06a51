"""`bertlab pretrain`: pre-train BERT or T5 on a directory from `bertlab prepare`.

    bertlab pretrain --model mini --data DATA_DIR --out RUN_DIR --steps 10000 --batch-size 256
    bertlab pretrain --model base --data DATA_DIR --out RUN_DIR --time-budget 2h --bf16
    bertlab pretrain --out RUN_DIR --resume                        # after Ctrl-C, a crash, or a SIGTERM
    torchrun --nproc_per_node 8 -m bertlab.cli pretrain ...        # one process per GPU (NCCL) or CPU (gloo)
    bertlab pretrain --demo                                        # the whole story on the stdlib's docs, on CPU
    bertlab pretrain --model t5-small --data T5_DATA --out RUN_DIR --steps 100000   # T5 (data: prepare --objective)

A T5 run -- a T5 objective, a T5 model (t5-small, t5-tiny, a T5 config.json) or text-to-text data -- follows
`bertlab.train.t5_pretrain` and its `T5PretrainConfig` (Adafactor, inverse square root schedule; the objective
defaults to the data's). BERT's settings come from the dataclass `bertlab.train.pretrain.PretrainConfig`: its
defaults, then a JSON file
(`--config run.json`; a run's own RUN_DIR/run_config.json works), then the flags. The model is exported in
the Hugging Face layout to RUN_DIR/final/; metrics go to RUN_DIR/metrics.jsonl (`bertlab plot RUN_DIR`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = {
    "model": "preset (tiny, mini, small, medium, base, large, L4-H256, ...; T5: t5-tiny, t5-mini, t5-small, ...) "
             "or config.json / model folder",
    "architecture": "T5: encoder-decoder, decoder-only or prefix-lm (default: the model config's)",
    "schedule": "T5: inverse-sqrt (constant for --warmup steps, then 1/sqrt) or constant",
    "data": "DATA_DIR from `bertlab prepare`",
    "out": "RUN_DIR: checkpoints, metrics.jsonl, final/",
    "init_from": "Hugging Face-layout folder to continue pre-training from",
    "objective": "a registered objective (bertlab.objectives): mlm+nsp (BERT), mlm, mlm+sop (sentence order, "
                 "ALBERT's; data: prepare --mode segment-order); T5: span-corruption, "
                 "iid-denoising, bert-style, mass-style, drop-tokens, deshuffle, prefix-lm (default: the data's: "
                 "mlm+nsp on segment pairs, mlm+sop on sentence-order pairs, mlm on data without pairs)",
    "steps": "optimizer steps",
    "time_budget": "wall-clock budget, e.g. 2h, 90m, 1h30m: the schedule is fitted to it",
    "batch_size": "sequences per optimizer step over all processes",
    "micro_batch_size": "sequences per forward pass per process (the rest is gradient accumulation)",
    "seq_len": "phase-1 sequence length: 128 where DATA_DIR has it, else its shortest instance set "
               "(--seq-len: the old spelling)",
    "phase2_seq_len": "phase-2 length (default: the longest longer instance set in DATA_DIR; 0: no phase 2)",
    "phase2_fraction": "share of steps in phase 2",
    "phase2_batch_size": "global batch in phase 2",
    "optimizer": "adamw or lamb (T5: adafactor, the default, or adamw)",
    "lr": "peak learning rate (default: BERT by model width, 1e-3 for 128 wide ... 1e-4 for 768 and up; T5: "
          "adafactor 1/sqrt(warmup) = 0.01, adamw 1e-3)",
    "warmup": "warmup: a fraction of the steps (< 1) or a step count (T5: constant-rate steps, default 10000)",
    "decay_fraction": "share of the steps after warmup over which the learning rate decays linearly to 0 (1: the "
                      "paper's; below 1 the peak is held first, warmup-stable-decay)",
    "precision": "auto, fp32, bf16 or fp16 (loss-scaled; meant for CUDA)",
    "eval_every": "steps between held-out evaluations (default: --num-evals per run)",
    "num_evals": "held-out evaluations per run when --eval-every is not given",
    "eval_batches": "held-out batches per evaluation",
    "save_every": "steps between checkpoints (default: 10 per run)",
    "keep_last": "checkpoints to keep",
    "num_workers": "data loader workers per process",
    "device": "auto, cpu or cuda",
    "resume": "continue RUN_DIR from its last checkpoint, exactly",
    "retain_freed_memory": "CPU: keep freed tensor memory for reuse instead of paging it in anew each step",
}


RENAMED = {"seq_len": "--max-seq-length"}  # one spelling across commands: as `prepare` and `finetune` spell it


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..train.pretrain import PretrainConfig
    from ..train.runconfig import add_config_arguments
    from ..train.t5_pretrain import T5PretrainConfig

    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.description = __doc__.split("\n\n", 1)[1]
    add_config_arguments(p, PretrainConfig, HELP, renamed=RENAMED)
    add_config_arguments(p, T5PretrainConfig, HELP, skip=_field_names(PretrainConfig))  # T5's own settings
    p.add_argument("--bf16", dest="precision", action="store_const", const="bf16", help="same as --precision bf16")
    g = p.add_argument_group("demo")
    g.add_argument("--demo", action="store_true",
                   help="build a vocabulary and data from the Python docs (pydoc_data.topics) or --demo-corpus, "
                        "pre-train a small BERT on CPU for a few minutes, show held-out accuracy before/after "
                        "and fill-in-the-blank predictions, draw the curves, export to RUN_DIR/run/final "
                        "(default RUN_DIR: runs/demo)")
    g.add_argument("--demo-corpus", type=Path, nargs="+", default=None, metavar="PATH",
                   help="text files to use instead of the Python docs")
    g.add_argument("--overwrite", action="store_true", default=None,
                   help="--demo: replace an earlier demo's results in RUN_DIR (without it they are kept and the demo "
                        "stops with one line)")
    g.add_argument("--demo-minutes", type=float, default=None,
                   help="the whole --demo, end to end; training gets what the other stages leave (default: 4.8)")


def run(args: argparse.Namespace) -> int:
    from ..train.pretrain import PretrainConfig, run_pretraining
    from ..train.runconfig import config_from_args, given_fields, refuse_foreign_settings
    from ..train.t5_pretrain import T5PretrainConfig, is_t5_request, run_t5_pretraining

    if args.overwrite and not args.demo:
        from ..errors import ConfigError

        raise ConfigError("--overwrite goes with --demo (a pre-training run continues with --resume)")
    if args.demo:
        from ..train.demo import run_demo

        return run_demo(out=Path(args.out or "runs/demo"), corpus=args.demo_corpus, minutes=args.demo_minutes,
                        resume=bool(args.resume), progress=args.progress is not False,
                        overwrite=bool(args.overwrite))
    if is_t5_request(_stated(args)):
        refuse_foreign_settings(args, T5PretrainConfig, PretrainConfig, "T5 pre-training", renamed=RENAMED)
        cfg = config_from_args(T5PretrainConfig, args)
        result = run_t5_pretraining(cfg, given=given_fields(T5PretrainConfig, args))
    else:
        refuse_foreign_settings(args, PretrainConfig, T5PretrainConfig, "BERT pre-training")
        cfg = config_from_args(PretrainConfig, args)
        result = run_pretraining(cfg, given=given_fields(PretrainConfig, args))
    train = result.train
    if train.interrupted:  # exit 130 after Ctrl-C, 143 after SIGTERM, as the shell's convention has it
        print(f"interrupted at step {train.step}; checkpoint {train.checkpoint}; continue with: "
              f"bertlab pretrain --out {cfg.out} --resume")
        return train.exit_status
    for name, values in (("held-out before", result.eval_before), ("held-out after", result.eval_after)):
        if values:
            print(f"{name}: " + "  ".join(f"{k} {v:.4f}" for k, v in values.items()))
    if result.final_dir is not None:
        loader = "T5ForConditionalGeneration" if isinstance(cfg, T5PretrainConfig) else "BertForPreTraining"
        print(f"model: {result.final_dir} (load with {loader}.from_pretrained or transformers)")
    return 0


def _field_names(cls) -> tuple[str, ...]:
    import dataclasses

    return tuple(f.name for f in dataclasses.fields(cls))


def _stated(args: argparse.Namespace) -> dict:
    """What the command says, flags over the `--config` file: enough to tell a T5 run from a BERT one."""
    from ..jsonconfig import read_json_object

    stated = dict(read_json_object(args.config)) if args.config is not None else {}
    stated.update({k: v for k, v in vars(args).items() if v is not None and not k.startswith("_")})
    return stated
