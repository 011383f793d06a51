"""Distillation's settings (`DistillConfig`, read by `bertlab distill`), the defaults that differ between the
general and the task recipe, and what a run returns (`DistillResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.errors import ConfigError
from ..loop import TrainResult
from ..random_init import INITS
from ..runconfig import GroupedSettings, parse_duration
from ..options import HeldOutEval, LoopRunOptions, ShardingOptions, StepTraining, WarmupOptimOptions
from ..run_record import check_precision


MODEL_DIR = "model"  # task distillation: OUT_DIR/model, as fine-tuning
KL_POSITIONS = ("masked", "all")
COSINE_LAYERS = ("last", "all")

# General distillation's hard-label term is masked LM: its held-out metrics are that objective's, whatever
# heads the teacher has (NSP is not distilled; the student keeps the teacher's NSP head, frozen).
GENERAL_OBJECTIVE = "mlm"
GENERAL_EVALS = 10  # held-out evaluations over a general distillation run unless --eval-every says otherwise
# Defaults that differ between the two recipes (None in DistillConfig means "the recipe's default").
GENERAL_DEFAULTS = dict(alpha=5.0, beta=2.0, gamma=1.0, batch_size=128, lr=1e-4, warmup=0.05, max_seq_length=128)
TASK_DEFAULTS = dict(alpha=1.0, beta=1.0, gamma=0.0, batch_size=32, lr=5e-5, warmup=0.1)



@dataclass
class DistillRunOptions(LoopRunOptions):
    seed: int = 42
    keep_last: int = 2


@dataclass
class DistillConfig(GroupedSettings):
    """Everything a distillation run needs; `bertlab distill` fills it from flags (or a JSON file)."""

    teacher: str = ""  # a Hugging Face-layout folder: pre-trained with its MLM head, or fine-tuned on `task`
    student: str = "every-other-layer"  # every-other-layer | every-K-layers | layers:I,J | PRESET | CONFIG | DIR
    init: str | None = None  # random: the student's weights drawn anew (the baseline); None: as --student makes it
    student_layout: str = "bert"  # general: bert | distilbert (the student written as a DistilBERT at the end)
    data: str = ""  # DATA_DIR from `bertlab prepare` (general), or the task's folder/file (task)
    out: str = ""  # RUN_DIR / OUT_DIR
    task: str | None = None  # a task name (sst2, squad, ...): task-specific distillation
    # the loss
    temperature: float = 2.0
    alpha: float | None = None  # soft-label (KL) weight; default 5 general, 1 task
    beta: float | None = None  # hard-label weight (MLM / gold); default 2 general, 1 task
    gamma: float | None = None  # hidden-state cosine weight; default 1 general, 0 task
    kl_positions: str = "masked"  # general: masked | all (every non-padding token, as DistilBERT)
    cosine_layers: str = "last"  # last | all (every student layer against its teacher layer)
    # how long, batches, precision: steps (general: required unless time_budget; task: default epochs x the
    # data), time_budget (general), batch_size (default 128 general, 32 task), micro_batch_size, precision
    training: StepTraining = field(default_factory=StepTraining)
    epochs: float = 3.0  # task only
    max_seq_length: int | None = None  # general: the instance set's length (128); task: default the task's (SQuAD 384)
    train_limit: int | None = None  # task: a seeded random subset of N training examples
    eval_limit: int | None = None  # task: a seeded random subset of N dev examples
    transfer_limit: int | None = None  # task: N more training examples without their labels (a transfer set)
    # optimisation
    # lr (None: 1e-4 general, 5e-5 task), decay, clipping, warmup (None: 0.05 general, 0.1 task)
    optim: WarmupOptimOptions = field(default_factory=WarmupOptimOptions)
    # evaluation (eval_every default: general 10 per run, task at the end only; eval_batches: general), logs
    eval: HeldOutEval = field(default_factory=HeldOutEval)
    eval_teacher: bool = True  # score the teacher once too, for comparison
    # seed, device, checkpoints (save_every None: general 10 per run; task: on signals only, see the
    # docstring), resume; num_workers: general only
    run: DistillRunOptions = field(default_factory=DistillRunOptions)
    # under torchrun: DDP replicas or FSDP2 shards (`train/fsdp.py`), as for pre-training
    parallel: ShardingOptions = field(default_factory=ShardingOptions)

    @classmethod
    def upgrade_settings(cls, data: dict[str, Any]) -> dict[str, Any]:
        """A run_config.json written when general distillation's length was `seq_len` (beside the task recipe's
        `max_seq_length`): it is `max_seq_length` now, for a general run only (a task run never read it)."""
        if "seq_len" in data:
            old = data.pop("seq_len")
            if data.get("task") is None and data.get("max_seq_length") is None:
                data["max_seq_length"] = old
        return data

    def resolved(self, name: str) -> Any:
        """A field's value, or the recipe's default for it when it is None."""
        value = getattr(self, name)
        defaults = TASK_DEFAULTS if self.task else GENERAL_DEFAULTS
        return defaults[name] if value is None and name in defaults else value

    def validate(self) -> None:
        for name, flag in (("teacher", "--teacher DIR"), ("data", "--data PATH"), ("out", "--out DIR")):
            if not getattr(self, name):
                raise ConfigError(f"distill: give {flag}")
        if self.task is not None:
            from ...tasks import TASKS

            TASKS[self.task]  # the one-line "unknown task ...; expected one of" error
        elif self.steps is None and self.time_budget is None:
            raise ConfigError("distill: give the length of the run, --steps N or --time-budget 2h")
        if not self.temperature > 0:
            raise ConfigError(f"temperature must be positive, got {self.temperature}")
        for name in ("alpha", "beta", "gamma"):
            if self.resolved(name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {self.resolved(name)}")
        if self.resolved("alpha") == self.resolved("beta") == self.resolved("gamma") == 0:
            raise ConfigError("alpha, beta and gamma are all 0: nothing to train on")
        if self.init is not None and self.init not in INITS:
            raise ConfigError(f"init must be one of {', '.join(INITS)}, got {self.init!r}")
        if self.student_layout not in ("bert", "distilbert"):
            raise ConfigError(f"student_layout must be bert or distilbert, got {self.student_layout!r}")
        if self.student_layout == "distilbert" and self.task is not None:
            raise ConfigError("student_layout distilbert: for general distillation (a task head on BERT's pooler "
                              "has no DistilBERT equivalent)")
        if self.kl_positions not in KL_POSITIONS:
            raise ConfigError(f"kl_positions must be one of {', '.join(KL_POSITIONS)}, got {self.kl_positions!r}")
        if self.cosine_layers not in COSINE_LAYERS:
            raise ConfigError(f"cosine_layers must be one of {', '.join(COSINE_LAYERS)}, got {self.cosine_layers!r}")
        check_precision(self.precision)
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"steps must be at least 1, got {self.steps}")
        if not self.epochs > 0 or not self.resolved("lr") > 0:
            raise ConfigError(f"epochs and lr must be positive, got {self.epochs} and {self.resolved('lr')}")
        for name in ("batch_size", "micro_batch_size", "max_seq_length"):
            if self.resolved(name) is not None and self.resolved(name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {self.resolved(name)}")
        if self.time_budget is not None:
            parse_duration(self.time_budget)
        if self.transfer_limit is not None:
            if self.task is None or self.transfer_limit < 1:
                raise ConfigError("transfer_limit: a positive number of extra examples, for task distillation")
            if self.resolved("alpha") == 0:
                raise ConfigError("transfer_limit: the transfer examples have no labels, only soft labels; "
                                  "alpha must be > 0")


# Settings a resumed run may change; the rest comes from the run's own run_config.json.
RESUME_MAY_CHANGE = ("eval_every", "eval_batches", "save_every", "keep_last", "log_every", "num_workers", "device",
                     "progress", "resume", "eval_teacher", "sharding", "fsdp_cpu_offload")


@dataclass
class DistillResult:
    out_dir: Path
    model_dir: Path | None  # the exported student (None when the run was interrupted)
    train: TrainResult
    student_eval: dict[str, Any] = field(default_factory=dict)  # held-out MLM numbers / dev scores
    teacher_eval: dict[str, Any] = field(default_factory=dict)
    teacher_parameters: int = 0
    student_parameters: int = 0
    config: DistillConfig | None = None


__all__ = ["COSINE_LAYERS", "DistillConfig", "DistillResult", "DistillRunOptions", "GENERAL_DEFAULTS", "KL_POSITIONS",
           "MODEL_DIR", "RESUME_MAY_CHANGE", "TASK_DEFAULTS"]
