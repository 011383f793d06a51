"""General distillation (DistilBERT): a student trained to match a pre-trained teacher's masked-LM
distributions (and optionally its hidden states) on the data of `bertlab prepare`; the student goes to
RUN_DIR/final. The loss is `distillers.MLMDistiller`'s; the package docstring has the whole recipe."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ...core.errors import ConfigError
from ...objectives import get_objective
from ..batches import time_step
from ..distributed import init_distributed, seed_everything
from ..pretrain import FINAL_DIR
from ..run_dir import check_writable
from ..runconfig import parse_duration
from ..run_record import (eval_seconds, fit_steps_to_budget, heldout_sequences, resolve_precision, resolved_settings,
                     split_batch)
from ..students import build_student, hidden_layer_map
from .config import GENERAL_EVALS, GENERAL_OBJECTIVE, DistillConfig, DistillResult
from .distillers import MLMDistiller
from .teachers import load_mlm_teacher
from .trainer import freeze_unused, make_trainer, shard_distiller, student_alone, whole_student


def run_general(cfg: DistillConfig, echo: Callable[[str], None] = print) -> DistillResult:
    """General distillation on `bertlab prepare` data (see the module docstring)."""
    from ...data import DataInfo, PretrainingDataset
    from ..pretrain import check_same_vocabulary, evaluate_pretraining, export_final, heldout_batches

    objective = get_objective(GENERAL_OBJECTIVE)

    dist = init_distributed(None if cfg.device == "auto" else cfg.device)
    say = echo if dist.is_main else (lambda s: None)
    if dist.is_main:
        check_writable(cfg.out)

    # ---- teacher, data, student: every mismatch reported before the first step
    teacher = load_mlm_teacher(cfg.teacher)
    length = cfg.resolved("max_seq_length")
    info = DataInfo.load(cfg.data, max_seq_length=length)
    if info.max_seq_length != length:
        raise ConfigError(f"{cfg.data}: no instances of length {length} (found {info.max_seq_length}); "
                          f"pass --max-seq-length {info.max_seq_length} or prepare that length")
    if teacher.config.vocab_size != info.vocab_size:
        raise ConfigError(f"{cfg.teacher}: the teacher's vocabulary has {teacher.config.vocab_size} tokens, "
                          f"{cfg.data} was prepared with {info.vocab_size} ({info.vocab_file})")
    check_same_vocabulary(cfg.teacher, info)
    if length > teacher.config.max_position_embeddings:
        raise ConfigError(f"sequence length {length} exceeds the teacher's max_position_embeddings "
                          f"({teacher.config.max_position_embeddings})")
    seed_everything(cfg.seed)  # a fresh student's weights and the projection are drawn from this seed
    student, init = build_student(cfg.student, teacher, cfg.teacher, random_init=cfg.init == "random")
    if length > student.config.max_position_embeddings:
        raise ConfigError(f"sequence length {length} exceeds the student's max_position_embeddings "
                          f"({student.config.max_position_embeddings})")
    freeze_unused(student, ("bert.pooler.", "cls.seq_relationship."))
    student_class = type(student)  # (under FSDP the sharded student's class is FSDP's subclass of it)
    L_s, L_t = student.config.num_hidden_layers, teacher.config.num_hidden_layers
    layer_map = hidden_layer_map(init, L_s, L_t) if cfg.cosine_layers == "all" else [(L_s, L_t)]
    distiller = MLMDistiller(student, teacher, cfg.temperature, cfg.resolved("alpha"), cfg.resolved("beta"),
                             cfg.resolved("gamma"), layer_map, kl_positions=cfg.kl_positions)
    distiller.to(dist.device).train()
    teacher.to(dist.device)
    earlier = resolved_settings(cfg.out) if cfg.resume else {}  # what the run's first session decided
    precision = earlier.get("precision") or resolve_precision(cfg.precision, dist.device)

    micro, accum = split_batch(cfg.resolved("batch_size"), cfg.micro_batch_size, dist.world_size)
    samples_per_step = micro * accum * dist.world_size

    def stream(start_sample: int):
        ds = PretrainingDataset(cfg.data, "train", seed=cfg.seed, rank=dist.rank, world_size=dist.world_size,
                                start_index=start_sample, batch_size=micro, max_seq_length=length)
        return ds.dataloader(num_workers=cfg.num_workers, pin_memory=dist.device.type == "cuda")

    def batches(step: int):  # seeks to the sample the step starts at: exact resume, no replay
        return stream(step * samples_per_step)

    stream(0)  # open the training split now: a bad data directory is reported before training
    has_heldout = info.num_instances.get("heldout", 0) > 0

    def held_out(model: nn.Module) -> dict[str, float]:
        batches = heldout_batches(cfg.data, length, cfg.seed, cfg.eval_batch_size, cfg.eval_batches)
        return evaluate_pretraining(model, batches, dist.device, objective)

    # ---- run length: given, or fitted to the time budget by timing real steps
    steps = earlier.get("steps") or cfg.steps
    if steps is None:
        per_step = time_step(distiller, lambda m, b: m(b), stream(0), accum, precision, dist.device)
        # Held-out evaluations (GENERAL_EVALS by default, and the teacher's once) come out of the budget too.
        eval_seqs = heldout_sequences(info.num_instances.get("heldout", 0), cfg.eval_batches, cfg.eval_batch_size)
        eval_s = eval_seconds(eval_seqs, samples_per_step, per_step)
        steps = fit_steps_to_budget(parse_duration(cfg.time_budget), per_step, eval_s, GENERAL_EVALS, cfg.eval_every,
                                    dist)
        say(f"time budget {cfg.time_budget}: {per_step:.2f}s per step -> {steps} steps")
    eval_every = cfg.eval_every or max(1, steps // GENERAL_EVALS)
    save_every = cfg.save_every or max(1, steps // 10)
    resolved = {"steps": steps, "precision": precision, "grad_accum": accum, "micro_batch_size": micro,
                "world_size": dist.world_size, "alpha": distiller.alpha, "beta": distiller.beta,
                "gamma": distiller.gamma, "lr": cfg.resolved("lr"), "warmup": cfg.resolved("warmup"),
                "student_init": init.to_json(), "layer_map": layer_map,
                "student_config": student.config.to_dict()}
    n_t, n_s = teacher.num_parameters(), student.num_parameters()
    say(f"distilling {cfg.teacher} ({L_t} layers, {n_t / 1e6:.1f}M parameters) into {type(student).__name__} "
        f"from {cfg.student} ({L_s} layers, {n_s / 1e6:.1f}M): {steps} steps x {cfg.resolved('batch_size')} "
        f"sequences of {length}, loss {distiller.alpha:g}·T²·KL + {distiller.beta:g}·MLM + "
        f"{distiller.gamma:g}·cos, T={cfg.temperature:g}, {precision}, {dist.world_size} process(es)")

    teacher_eval: dict[str, float] = {}
    if has_heldout and cfg.eval_teacher and dist.is_main and not cfg.resume:
        with torch.no_grad():
            teacher_eval = held_out(teacher)
        say("teacher held-out: " + "  ".join(f"{k} {v:.4f}" for k, v in teacher_eval.items()))
    # (sharded after the teacher's score, which rank 0 computes alone)
    resolved["sharding"] = sharding = shard_distiller(cfg, distiller, dist.world_size, precision)
    trainer = make_trainer(cfg, distiller, batches, steps, accum, precision,
                           student_alone(held_out) if has_heldout else None, eval_every, save_every, resolved)
    result = trainer.fit()

    final_dir = None
    if result.stopped in ("max_steps", "time_budget", "data_exhausted"):
        student = whole_student(student, student_class, sharding)
    if result.stopped in ("max_steps", "time_budget", "data_exhausted") and dist.is_main:
        final_dir = export_final(student, Path(cfg.out) / FINAL_DIR, info)
        say(f"saved the student in Hugging Face layout to {final_dir}")
    if dist.world_size > 1:
        torch.distributed.barrier()
    return DistillResult(Path(cfg.out), final_dir, result, result.eval_metrics, teacher_eval, n_t, n_s, cfg)



__all__ = ["run_general"]
