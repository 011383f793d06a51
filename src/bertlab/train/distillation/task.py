"""Task-specific distillation: a student trained on a task against a fine-tuned teacher's soft labels (its
logits, computed once when the teacher need not run beside the student) and the gold labels, optionally with
a transfer set of unlabelled examples; the student goes to OUT_DIR/model with OUT_DIR/metrics.json, as
`bertlab finetune` writes them. The loss is `distillers.TaskDistiller`'s; the package docstring has the
whole recipe."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ...core.errors import ConfigError
from ..batches import shuffled_batches, steps_for_epochs
from ..distributed import init_distributed, seed_everything
from ..run_dir import CHECKPOINT_DIR, check_writable
from ..run_record import autocast_dtype, resolve_precision, resolved_settings, run_record, split_batch
from ..students import build_student, hidden_layer_map
from .config import MODEL_DIR, DistillConfig, DistillResult
from .distillers import TaskDistiller, soft_target
from .teachers import load_task_teacher
from .trainer import make_trainer, shard_distiller, student_alone, whole_student


@torch.no_grad()
def soft_labels(spec, teacher: nn.Module, features: list[dict], batch_size: int, device: torch.device,
                autocast_dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """The teacher's logits for every feature, computed once, in batches of similar length (little padding):
    (K,) per example for classification, (T_i, K) per token, (T_i, 2) start/end for QA; float32, on the CPU."""
    from ...tasks.base import batches as task_batches
    from ...tasks.base import feature_length

    order = sorted(range(len(features)), key=lambda i: feature_length(features[i]))
    out: list[torch.Tensor | None] = [None] * len(features)
    teacher.eval()
    with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
        for batch in task_batches(spec, features, batch_size, device, order):
            logits = spec.head.head_spec.logits(teacher(**spec.model_inputs(batch))).float().cpu()
            for row, i in enumerate(batch["feature_index"].tolist()):
                n = feature_length(features[i])
                out[i] = logits[row] if logits.dim() == 2 else logits[row, :n].clone()
    return out  # type: ignore[return-value]


def _with_soft_labels(collate):
    """The task's collate plus `teacher_logits`, padded along tokens like the inputs (padding is masked later),
    and `gold` (1 labelled, 0 transfer example) when the data has a transfer set."""
    def collate_fn(features):
        batch = collate(features)
        if "teacher_logits" in features[0]:
            batch["teacher_logits"] = nn.utils.rnn.pad_sequence([f["teacher_logits"] for f in features],
                                                                batch_first=True)
        if "gold" in features[0]:
            batch["gold"] = torch.tensor([f["gold"] for f in features], dtype=torch.float32)
        return batch
    return collate_fn


def transfer_examples(spec, cfg: DistillConfig, labelled_examples) -> list:
    """`cfg.transfer_limit` training examples outside the labelled subset, a seeded random choice."""
    from ..finetune import subset

    if soft_target(spec) not in ("classes", "regression"):
        raise ConfigError(f"transfer_limit: available for sentence-level tasks (GLUE, SWAG), not {spec.name}")
    labelled = {e.guid for e in labelled_examples}
    rest = [e for e in spec.read(cfg.data, "train") if e.guid not in labelled]
    if cfg.transfer_limit > len(rest):
        raise ConfigError(f"transfer_limit {cfg.transfer_limit}: only {len(rest)} training examples are left "
                          f"outside the {len(labelled)} labelled ones")
    return subset(rest, cfg.transfer_limit, seed=1)  # seed 1: independent of the labelled subset's 0


def unlabelled_features(spec, examples, tokenizer, max_length: int) -> list[dict]:
    """Features of transfer examples: labels replaced by 0 and `gold` = 0, so nothing of the gold label is
    left; the teacher's soft labels are their only target."""
    blank = 0.0 if spec.is_regression else 0
    return [{**f, "labels": blank, "gold": 0.0} for f in spec.featurize(examples, tokenizer, max_length, train=True)]


def run_task(cfg: DistillConfig, echo: Callable[[str], None] = print) -> DistillResult:
    """Task-specific distillation (see the module docstring)."""
    from ...tasks import TASKS, evaluate
    from ...tokenizer import BertTokenizer
    from ..finetune import load_task_data, save_model

    spec = TASKS[cfg.task]
    dist = init_distributed(None if cfg.device == "auto" else cfg.device)
    say = echo if dist.is_main else (lambda s: None)
    out = Path(cfg.out)
    if dist.is_main:
        check_writable(out)
    alpha, beta, gamma = (cfg.resolved(k) for k in ("alpha", "beta", "gamma"))
    needs_teacher = alpha > 0 or gamma > 0

    # ---- teacher, student, data: every mismatch reported before the first step
    teacher = load_task_teacher(spec, cfg.teacher)
    tokenizer = BertTokenizer.from_pretrained(cfg.teacher)
    if len(tokenizer.vocab) != teacher.config.vocab_size:
        raise ConfigError(f"{cfg.teacher}: vocab.txt has {len(tokenizer.vocab)} tokens, the model "
                          f"{teacher.config.vocab_size}")
    seed_everything(cfg.seed)
    overrides = {"id2label": spec.id2label} if spec.id2label is not None else {}  # for a fresh or loaded student
    student, init = build_student(cfg.student, teacher, cfg.teacher, model_cls=spec.head,
                                  random_init=cfg.init == "random", **overrides)
    student.config.extra["finetuning_task"] = spec.name
    L_s, L_t = student.config.num_hidden_layers, teacher.config.num_hidden_layers
    layer_map = hidden_layer_map(init, L_s, L_t) if cfg.cosine_layers == "all" else [(L_s, L_t)]
    max_length = cfg.max_seq_length or spec.default_max_seq_length
    for who, model in (("teacher", teacher), ("student", student)):
        if max_length > model.config.max_position_embeddings:
            raise ConfigError(f"max sequence length {max_length} exceeds the {who}'s max_position_embeddings "
                              f"({model.config.max_position_embeddings})")
    data = load_task_data(spec, cfg.data, tokenizer, max_length, cfg.train_limit, cfg.eval_limit)
    # a resumed run keeps the precision its first session resolved (`auto` may resolve otherwise elsewhere)
    precision = (resolved_settings(cfg.out) if cfg.resume else {}).get("precision") \
        or resolve_precision(cfg.precision, dist.device)
    amp_dtype = autocast_dtype(precision)
    teacher.to(dist.device)

    teacher_eval: dict[str, dict[str, float]] = {}
    if cfg.eval_teacher and dist.is_main and not cfg.resume:
        teacher_eval = {split: evaluate(spec, teacher, tokenizer, data.eval_examples[split], split,
                                        max_length=max_length, batch_size=cfg.eval_batch_size, device=dist.device,
                                        autocast_dtype=amp_dtype, features=data.eval_features[split])
                        for split in spec.eval_splits}
        say(f"teacher dev: {json.dumps(teacher_eval)}")
    features = data.train_features
    transfer: list[dict] = []
    if cfg.transfer_limit:
        transfer = unlabelled_features(spec, transfer_examples(spec, cfg, data.train_examples), tokenizer, max_length)
        features = [{**f, "gold": 1.0} for f in features] + transfer
    if alpha > 0 and gamma == 0:  # soft labels once (see the module docstring); with γ > 0 the teacher runs live
        logits = soft_labels(spec, teacher, features, cfg.eval_batch_size, dist.device, amp_dtype)
        features = [{**f, "teacher_logits": t} for f, t in zip(features, logits)]
    distiller = TaskDistiller(student, teacher if needs_teacher else None, cfg.temperature, alpha, beta, gamma,
                              layer_map, spec=spec)
    distiller.to(dist.device).train()

    micro, accum = split_batch(cfg.resolved("batch_size"), cfg.micro_batch_size, dist.world_size)
    steps = cfg.steps or steps_for_epochs(cfg.epochs, len(features), micro, accum, dist.world_size)
    collate = _with_soft_labels(spec.collate)

    def batches(step: int):  # seekable: epoch e's order depends on (seed, e) only
        return shuffled_batches(features, micro, collate_fn=collate, seed=cfg.seed, start=step * accum,
                                rank=dist.rank, world_size=dist.world_size)

    dev = spec.eval_splits[0]

    def score_dev(student: nn.Module) -> dict[str, float]:
        return evaluate(spec, student, tokenizer, data.eval_examples[dev], dev, max_length=max_length,
                        batch_size=cfg.eval_batch_size, device=dist.device, features=data.eval_features[dev])

    resolved = {"steps": steps, "precision": precision, "grad_accum": accum, "micro_batch_size": micro,
                "world_size": dist.world_size, "alpha": alpha, "beta": beta, "gamma": gamma,
                "lr": cfg.resolved("lr"), "warmup": cfg.resolved("warmup"), "student_init": init.to_json(),
                "layer_map": layer_map, "train_examples": len(data.train_examples), "transfer_examples": len(transfer),
                "train_features": len(features)}
    student_class = type(student)  # (under FSDP the sharded student's class is FSDP's subclass of it)
    resolved["sharding"] = sharding = shard_distiller(cfg, distiller, dist.world_size, precision)
    trainer = make_trainer(cfg, distiller, batches, steps, accum, precision,
                           student_alone(score_dev) if cfg.eval_every else None, cfg.eval_every, cfg.save_every, resolved)
    record = run_record(cfg, resolved)
    n_t, n_s = teacher.num_parameters(), student.num_parameters()
    say(f"distilling {spec.name}: teacher {cfg.teacher} ({L_t} layers, {n_t / 1e6:.1f}M parameters) -> student "
        f"{cfg.student} ({L_s} layers, {n_s / 1e6:.1f}M); {len(data.train_examples)} examples"
        + (f" + {len(transfer)} without labels" if transfer else "") + f", {steps} steps x "
        f"{cfg.resolved('batch_size')}, loss {alpha:g}·soft + {beta:g}·gold + {gamma:g}·cos, T={cfg.temperature:g}, "
        f"{precision}")
    result = trainer.fit()

    model_dir, scores = None, {}
    if result.stopped in ("max_steps", "time_budget", "data_exhausted"):
        student = whole_student(student, student_class, sharding)
    if result.stopped in ("max_steps", "time_budget", "data_exhausted") and dist.is_main:
        student.eval()
        scores = {split: evaluate(spec, student, tokenizer, data.eval_examples[split], split, max_length=max_length,
                                  batch_size=cfg.eval_batch_size, out_dir=out, device=dist.device,
                                  autocast_dtype=amp_dtype, features=data.eval_features[split])
                  for split in spec.eval_splits}
        model_dir = save_model(student, out / MODEL_DIR, tokenizer)
        metrics = {"task": spec.name, "main_metric": spec.main_metric, "student_init": resolved["student_init"],
                   "dev": scores, "teacher_dev": teacher_eval,
                   "parameters": {"teacher": n_t, "student": n_s}, "layers": {"teacher": L_t, "student": L_s},
                   "steps": result.step, "train_seconds": round(result.elapsed, 1),
                   "train_loss": result.metrics.get("loss"), "config": record}
        if cfg.resume and (out / "metrics.json").is_file():  # keep the first session's teacher scores
            metrics["teacher_dev"] = json.loads((out / "metrics.json").read_text()).get("teacher_dev", {}) \
                or teacher_eval
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        say(f"student dev: {json.dumps(scores)}; model: {model_dir}")
        if not cfg.save_every:
            # As with fine-tuning: the training state (3x the student) is only for resuming an interrupted run;
            # a finished one is OUT_DIR/model. Kept when checkpoints were asked for (--save-every).
            shutil.rmtree(out / CHECKPOINT_DIR, ignore_errors=True)
    if dist.world_size > 1:
        torch.distributed.barrier()
    return DistillResult(out, model_dir, result, scores, teacher_eval, n_t, n_s, cfg)



__all__ = ["run_task", "soft_labels", "transfer_examples", "unlabelled_features"]
