"""What both distillation recipes set up alike: which student parameters train, the sharding under torchrun, and
the loop (`loop.Trainer`) configured from `DistillConfig` -- optimizer, schedule, checkpoints, resume,
run_config.json."""

from __future__ import annotations

from typing import Any

from torch import nn

from ...core.errors import BertlabError
from ..fsdp import gathered, resolve_sharding, shard_model, unsharded_copy
from ..loop import LoopConfig, Trainer
from ..optim import adamw, linear_warmup_decay
from ..run_dir import latest_checkpoint
from ..runconfig import parse_duration
from ..run_record import run_record, write_run_config
from .config import DistillConfig


def freeze_unused(student: nn.Module, prefixes: tuple[str, ...]) -> None:
    """Parameters the objective gives no gradient (the pooler and NSP head in MLM distillation) are frozen:
    kept as they are (copied from the teacher when the student was cut from it), out of the optimizer, and
    no `find_unused_parameters` needed under DDP."""
    for name, p in student.named_parameters():
        if name.startswith(prefixes):
            p.requires_grad_(False)


def shard_distiller(cfg: DistillConfig, distiller: nn.Module, world_size: int, precision: str) -> str:
    """`--sharding` resolved; with fsdp the distiller sharded before its optimizer is built: every layer block of
    the student and of a teacher it runs is a unit, the rest (embeddings, heads, a projection) the whole's. The
    student is then evaluated alone inside `fsdp.gathered(distiller)`."""
    sharding = resolve_sharding(cfg.sharding, world_size, precision, cfg.fsdp_cpu_offload)
    if sharding == "fsdp":
        shard_model(distiller, precision, cfg.fsdp_cpu_offload)
    return sharding


def student_alone(evaluate):
    """`evaluate(student)` as the loop's evaluation of the distiller: the student run alone, within the distiller's
    gathered unit when it is sharded (every process runs it then; rank 0 logs)."""
    def run(distiller: nn.Module):
        with gathered(distiller):
            return evaluate(distiller.student)
    return run


def whole_student(student: nn.Module, student_class: type, sharding: str) -> nn.Module | None:
    """The student as rank 0 scores and exports it: a sharded one gathered whole into a plain `student_class`
    (collective; None on the other ranks), any other as it is."""
    if sharding != "fsdp":
        return student
    return unsharded_copy(student, lambda: student_class(student.config))


def make_trainer(cfg: DistillConfig, distiller: nn.Module, batches, steps: int, accum: int, precision: str,
                  evaluate, eval_every: int | None, save_every: int | None, resolved: dict[str, Any]) -> Trainer:
    """The loop configured for `cfg`, resumed from the last checkpoint on `cfg.resume`; rank 0 writes
    OUT/run_config.json (the config plus `resolved`), and checkpoints carry the same record."""
    record = run_record(cfg, resolved)
    optimizer = adamw(distiller, lr=cfg.resolved("lr"), weight_decay=cfg.weight_decay)
    warmup = cfg.resolved("warmup")
    scheduler = linear_warmup_decay(optimizer, warmup if warmup < 1 else int(warmup), steps)
    loop = LoopConfig(max_steps=steps, out_dir=cfg.out, grad_accum=accum, precision=precision,
                      max_grad_norm=cfg.max_grad_norm, log_every=cfg.log_every, eval_every=eval_every,
                      save_every=save_every, keep_last=cfg.keep_last,
                      time_budget=parse_duration(cfg.time_budget) if cfg.time_budget else None,
                      seed=cfg.seed, progress=cfg.progress,
                      retain_freed_memory=cfg.retain_freed_memory, tensorboard=False)
    trainer = Trainer(distiller, optimizer, scheduler, lambda model, batch: model(batch), batches, loop,
                      evaluate=evaluate, extra_state={"run_config": record})
    if cfg.resume:
        resume_from = latest_checkpoint(cfg.out)
        if resume_from is None:
            raise BertlabError(f"{cfg.out}: no checkpoint to resume from")
        trainer.load_checkpoint(resume_from)  # a corrupt checkpoint is reported here, before any step
    if trainer.dist.is_main:
        write_run_config(cfg.out, record)
    return trainer



__all__ = ["freeze_unused", "make_trainer", "shard_distiller", "student_alone", "whole_student"]
