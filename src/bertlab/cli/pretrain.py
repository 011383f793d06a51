"""`bertlab pretrain`: pre-train an encoder of any family `--family` lists on a directory from `bertlab prepare`
(T5: `bertlab pretrain-t5`).

    bertlab pretrain --model mini --data DATA_DIR --out RUN_DIR --steps 10000 --batch-size 256
    bertlab pretrain --model base --data DATA_DIR --out RUN_DIR --time-budget 2h --bf16
    bertlab pretrain --out RUN_DIR --resume                        # after Ctrl-C, a crash, or a SIGTERM
    torchrun --nproc_per_node 8 -m bertlab.cli pretrain ...        # one process per GPU (NCCL) or CPU (gloo)
    torchrun --nproc_per_node 8 -m bertlab.cli pretrain --sharding fsdp ...   # FSDP2: each process holds 1/8
    bertlab pretrain --demo                                        # the whole story on the stdlib's docs, on CPU

Settings come from the dataclass `bertlab.train.pretrain.PretrainConfig`: its defaults, then a JSON file
(`--config run.json`; a run's own RUN_DIR/run_config.json works), then the flags. The model is exported in
the Hugging Face layout to RUN_DIR/final/; metrics go to RUN_DIR/metrics.jsonl (`bertlab plot RUN_DIR`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = {
    "model": "preset (tiny, mini, small, medium, base, large, L4-H256, ...) or config.json / model folder",
    "data": "DATA_DIR from `bertlab prepare`",
    "out": "RUN_DIR: checkpoints, metrics.jsonl, final/",
    "init_from": "Hugging Face-layout folder to continue pre-training from",
    "objective": "mlm+nsp (BERT), mlm, mlm+sop (sentence order, ALBERT's; data: prepare --mode segment-order), "
                 "or mlm+sbo (span boundary, SpanBERT's; data: prepare --objective mlm+sbo) "
                 "(default: the data's: mlm+nsp on segment pairs, mlm+sop on sentence-order pairs, mlm on data "
                 "without pairs); T5's objectives: bertlab pretrain-t5",
    "max_seq_length": "phase-1 sequence length: 128 where DATA_DIR has it, else its shortest instance set",
    "phase2_max_seq_length": "phase-2 length (default: the longest longer instance set in DATA_DIR; 0: no phase 2)",
    "phase2_fraction": "share of steps in phase 2",
    "phase2_batch_size": "global batch in phase 2",
    "document_attention": "packed data (prepare --mode full-sentences): each document of a row attends to itself "
                          "only, not across the row (on a GPU, one variable-length sequence per document)",
    "optimizer": "adamw or lamb",
    "decay_fraction": "share of the steps after warmup over which the learning rate decays linearly to 0 (1: the "
                      "paper's; below 1 the peak is held first, warmup-stable-decay)",
}


# how a default the dataclass leaves open is decided (the settings' help is their docstring, train/options.py)
DEFAULTS = {"lr": "by model width, 1e-3 for 128 wide ... 1e-4 for 768 and up", "save_every": "10 per run",
            "eval_every": "--num-evals per run"}  # one spelling across commands: as `prepare` and `finetune` spell it


def add_run_arguments(p: argparse.ArgumentParser, cls: type, doc: str, help: dict[str, str],
                      defaults: dict[str, str]) -> None:
    """The flags of a long run (pretrain, pretrain-t5, distill): the command module's docstring `doc` past its
    first paragraph as the description, one flag per setting of `cls`, and `--bf16`."""
    from ..train.runconfig import add_config_arguments

    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.description = doc.split("\n\n", 1)[1]
    add_config_arguments(p, cls, help, defaults=defaults)
    p.add_argument("--bf16", dest="precision", action="store_const", const="bf16", help="same as --precision bf16")


def family_help() -> str:
    """`--family`'s help, from the families that say which data `pretrain` trains them on (the registry)."""
    from ..models.registry import data_tokenizers

    kinds = data_tokenizers()
    return (f"{' or '.join(kinds)} (default: a config's model_type; with a preset, the family of the data's "
            f"tokenizer, said in one line when not {next(iter(kinds))}: "
            f"{', '.join(f'{family} on {kind} data' for family, kind in kinds.items())})")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..train.pretrain import PretrainConfig

    add_run_arguments(p, PretrainConfig, __doc__, {**HELP, "family": family_help()}, DEFAULTS)
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
                   help="the most the whole --demo may take, end to end: it trains a planned number of steps (about "
                        "4-5 minutes on a free 2-core CPU), longer on a busy machine up to this cap, and says before "
                        "training what the cap allows (default: 15)")


def run(args: argparse.Namespace) -> int:
    from ..train.pretrain import PretrainConfig, run_pretraining
    from ..train.runconfig import config_from_args, given_fields

    if args.overwrite and not args.demo:
        from ..core.errors import ConfigError

        raise ConfigError("--overwrite goes with --demo (a pre-training run continues with --resume)")
    if args.demo:
        from ..train.demo import run_demo

        return run_demo(out=Path(args.out or "runs/demo"), corpus=args.demo_corpus, minutes=args.demo_minutes,
                        resume=bool(args.resume), progress=args.progress is not False,
                        overwrite=bool(args.overwrite))
    cfg = config_from_args(PretrainConfig, args)
    return report(run_pretraining(cfg, given=given_fields(PretrainConfig, args)), "pretrain", cfg.out)


def report(result, command: str, out: str, loader: str | None = None) -> int:
    """Print how a pre-training run ended (BERT's or T5's `PretrainResult`); its exit status. `loader`: the class
    that loads the final folder (None: its config.json's architecture, BertForMaskedLM or RobertaForMaskedLM)."""
    train = result.train
    if train.interrupted:  # exit 130 after Ctrl-C, 143 after SIGTERM, as the shell's convention has it
        print(f"interrupted at step {train.step}; checkpoint {train.checkpoint}; continue with: "
              f"bertlab {command} --out {out} --resume")
        return train.exit_status
    for name, values in (("held-out before", result.eval_before), ("held-out after", result.eval_after)):
        if values:
            print(f"{name}: " + "  ".join(f"{k} {v:.4f}" for k, v in values.items()))
    if result.final_dir is not None:
        if loader is None:
            from ..core.jsonconfig import read_json_object

            loader = (read_json_object(result.final_dir / "config.json").get("architectures") or ["the model"])[0]
        print(f"model: {result.final_dir} (load with {loader}.from_pretrained or transformers)")
    return 0
