"""What `finetune-embeddings` and `finetune-reranker` share: their training settings group, the start of a run
(the out folder, resume, a run already there), the loop's settings, and the commands' flags and summary.

`PairTraining` is the `training` group of both configs (`runconfig.GroupedSettings`: the flags stay flat,
`--lr`, `--seed`; run_config.json holds `"training": {...}`, and a flat run_config.json written before the
group still loads); a command whose defaults differ subclasses it and overrides the default alone
(`RerankerTraining`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ...core.errors import BertlabError, ConfigError
from ..loop import LoopConfig
from ..options import RunOptions
from ..run_record import resolve_resume_config

C = TypeVar("C")

RUN_CONFIG = "run_config.json"


@dataclass
class PairTraining(RunOptions):
    """How a retrieval model trains: length of the run, batch, the optimiser on a linear warmup and decay,
    precision; and how the run goes (seed, device, checkpoints, resume)."""

    max_seq_length: int | None = None
    """tokens per text (a reranker: per (query, passage) pair) (default: the start folder's, else the model's)"""
    epochs: float = 1.0
    """passes over the training rows"""
    max_steps: int | None = None
    """optimizer steps instead of --epochs"""
    batch_size: int = 32
    """rows per optimizer step"""
    lr: float = 5e-5
    """peak learning rate"""
    warmup: float = 0.1
    """warmup: a fraction of the steps (< 1) or a step count"""
    weight_decay: float = 0.0
    """AdamW's weight decay, not on biases and norm weights"""
    max_grad_norm: float | None = 1.0
    """gradient clipping norm"""
    adam_eps: float = 1e-8
    """AdamW's ε"""
    bf16: bool = False
    """bf16 autocast (CPU or GPU)"""
    seed: int = 42
    """seed of the batch order, dropout and any new weights"""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("epochs", "lr"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.batch_size < 1:
            raise ConfigError(f"batch-size must be at least 1, got {self.batch_size}")
        if not self.warmup >= 0:
            raise ConfigError(f"warmup must not be negative, got {self.warmup}")

    @property
    def warmup_steps(self) -> float | int:
        """`warmup` as `optim.linear_warmup_decay` takes it: a fraction (< 1) or a step count."""
        return self.warmup if self.warmup < 1 else int(self.warmup)


def start_run(cls: type[C], cfg: C, may_change: tuple[str, ...], given: set[str] | None, train_help: str) -> C:
    """`cfg` as the run goes: on `--resume` the saved run_config.json's settings (`setup.resolve_resume_config`);
    refused in one line without --out, --model or --train, or on an --out holding another run."""
    if not cfg.out:
        raise ConfigError("give --out OUT_DIR")
    out = Path(cfg.out)
    cfg = resolve_resume_config(cls, cfg, out / RUN_CONFIG, may_change, given)
    if not cfg.model or not cfg.train:
        raise ConfigError(f"give --model (the starting model) and --train ({train_help})")
    if not cfg.resume and (out / "checkpoints").is_dir() and any((out / "checkpoints").iterdir()):
        raise BertlabError(f"{out}: holds a run already; continue it with --resume or choose a new --out")
    return cfg


def loop_config(cfg: PairTraining, out: Path, steps: int, eval_every: int | None = None) -> LoopConfig:
    """The shared loop's settings of a retrieval run (one checkpoint kept: the run resumes from its last)."""
    return LoopConfig(max_steps=steps, out_dir=out, precision="bf16" if cfg.bf16 else "fp32",
                      max_grad_norm=cfg.max_grad_norm, eval_every=eval_every, save_every=cfg.save_every,
                      keep_last=1, seed=cfg.seed, progress=cfg.progress,
                      retain_freed_memory=cfg.retain_freed_memory)


# ---------------------------------------------------------------------------------------------- the commands
def add_arguments(p, cls: type) -> None:
    """A retrieval training command's flags: `cls`'s settings (`--warmup-proportion` for `--warmup`, as
    `finetune` names it), `--config FILE`."""
    from ..runconfig import add_config_arguments

    add_config_arguments(p, cls, aliases={"warmup": ("--warmup-proportion",)})


def run_command(args, cls: type, runner: Callable, command: str, extra: Callable[[Any], dict] | None = None) -> int:
    """Run a retrieval training command from its parsed flags: the model's name resolved, the run, then one
    line on how to go on after Ctrl-C / SIGTERM, or the run's summary as JSON (`extra(result)` added)."""
    from ...core.model_names import resolve_model
    from ..runconfig import config_from_args, given_fields

    cfg = config_from_args(cls, args)
    if cfg.model:
        cfg.model = str(resolve_model(cfg.model))
    result = runner(cfg, given_fields(cls, args))
    if int(os.environ.get("RANK", "0")) != 0:  # another process of a torchrun job: rank 0 reports
        return result.train.exit_status
    if result.train.interrupted:
        print(f"interrupted at step {result.train.step}; checkpoint {result.train.checkpoint}; continue with: "
              f"bertlab {command} --out {result.out_dir} --resume")
        return result.train.exit_status
    print(json.dumps({"final": str(result.final), "steps": result.train.step, "rows": result.rows,
                      "train_seconds": round(result.train.elapsed, 1), "loss": result.train.metrics.get("loss"),
                      **(extra(result) if extra else {})}, indent=2))
    return 0
