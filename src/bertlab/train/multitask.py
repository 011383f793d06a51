"""Multi-task fine-tuning (MT-DNN, Liu et al., 2019): one shared encoder, one head per task, then optionally
each task fine-tuned on its own from the multi-task model.

    bertlab finetune-multi --tasks mrpc,stsb,rte --data mrpc=glue/MRPC,stsb=glue/STS-B,rte=glue/RTE \\
        --model DIR --out OUT [--mixing proportional|temperature|equal] [--mixing-limit K]
        [--mixing-temperature T] [--per-task-epochs E]

Every task is its own `TaskSpec` (reader, features, metric, head class) and model; the task models share one
`bert` encoder module, so the union of their parameters is the encoder once plus each head. Each optimizer
step draws its micro-batches' tasks from the mixing rule (`data/mixing.py`: examples-proportional with an
optional limit K, temperature T, or equal), seeded, then a batch of that task; the loss is that task's own
(`spec.loss`). The run is the shared loop's (`loop.Trainer`): accumulation, precision, clipping, logging.
`--epochs` counts passes over all tasks' batches together (or `--max-steps`).

OUT/
    metrics.json            per task: dev scores of the multi-task model (and after per-task fine-tuning)
    multi_task.json         the multi-task stage is done: its scores, written after every {task}/model/
    runs/                   the multi-task training's metrics.jsonl, and its checkpoints while it runs
    {task}/model/           each task's model (Hugging Face layout: the shared encoder + that task's head)
    {task}/finetuned/       with --per-task-epochs: the bertlab finetune output of that task from {task}/model

Resume (`--resume`, after Ctrl-C, SIGTERM or a crash), as for one task: the multi-task training is
checkpointed on a signal and every `--save-every` steps (`runs/checkpoints/`, dropped once the stage is
done) and continues bitwise from there -- the mixing schedule and the batches seek to the step; a finished
stage (multi_task.json) is not trained again, and the per-task stage resumes each task's own sweep.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..core.fsio import atomic_write_text
from ..data.mixing import mixing_rates, task_schedule
from ..core.errors import BertlabError, ConfigError
from ..tasks import TASKS, evaluate
from ..tasks.base import feature_lengths
from .finetune import (MULTI_TASK, RESUME_MAY_CHANGE, FinetuneConfig, FinetuneInterrupted, MultiTaskOptions,
                       PretrainedStart, FinetuneTrainer, finetune, load_task_data, save_model, with_default_lr)
from .batches import mixed_batches, steps_per_epoch
from .distributed import refuse_torchrun
from .loop import LoopConfig
from .run_dir import CHECKPOINT_DIR, latest_checkpoint
from .optim import adamw, linear_warmup_decay
from .run_record import (RUN_CONFIG, autocast_dtype, resolve_device, resolve_resume_config, run_record, split_batch,
                    write_run_config)

log = logging.getLogger(__name__)

STAGE_FILE = "multi_task.json"  # the multi-task stage is done (its models saved): a resume skips it


class MultiTaskModel(nn.Module):
    """The task models, sharing one encoder: `models[name]` is a complete BertFor* whose `.bert` is shared."""

    def __init__(self, models: dict[str, nn.Module]):
        super().__init__()
        self.models = nn.ModuleDict(models)
        shared = next(iter(models.values())).bert
        for model in models.values():
            model.bert = shared


def task_data_paths(data: str, names: list[str]) -> dict[str, str]:
    """`mrpc=PATH,stsb=PATH` -> {task: path}; every task must have one."""
    paths = {}
    for part in data.split(","):
        name, sep, path = part.partition("=")
        if not sep:
            raise ConfigError(f"multi-task --data: expected TASK=PATH,TASK=PATH, got {part!r}")
        paths[name.strip()] = path.strip()
    missing = [n for n in names if n not in paths]
    if missing:
        raise ConfigError(f"multi-task --data has no path for {', '.join(missing)} (give TASK=PATH for each)")
    return paths


def finetune_multi(cfg: FinetuneConfig, given: Collection[str] | None = None) -> dict[str, Any]:
    """The recipe above, from a `FinetuneConfig` whose `task` is "multi" and `multi` holds the options;
    `given`: the settings stated on the command line (on resume, only those may override the run's own)."""
    from ..tokenizer import BertTokenizer

    refuse_torchrun("finetune-multi")
    out = Path(cfg.out)
    if cfg.resume:  # the run's own settings rule, as for one task
        cfg = resolve_resume_config(FinetuneConfig, cfg, out / RUN_CONFIG, RESUME_MAY_CHANGE, given)
    cfg = with_default_lr(cfg)
    options: MultiTaskOptions = cfg.multi
    names = options.names
    if len(names) < 2:
        raise ConfigError("finetune-multi needs --tasks with at least two task names, e.g. --tasks mrpc,stsb,rte")
    unknown = [n for n in names if n not in TASKS or n == MULTI_TASK]
    if unknown:
        raise ConfigError(f"unknown task {unknown[0]!r} in --tasks; expected names from: {', '.join(TASKS)}")
    paths = task_data_paths(cfg.data, names)
    run_dir = out / "runs"
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is not None and not cfg.resume:
        raise BertlabError(f"{out}: holds an interrupted multi-task fine-tuning ({checkpoint}); "
                           "pass --resume to continue it, or choose another --out")
    if cfg.resume and (out / STAGE_FILE).is_file():  # the multi-task stage finished in an earlier session
        log.info("the multi-task stage is done (%s); resuming after it", out / STAGE_FILE)
        metrics = json.loads((out / STAGE_FILE).read_text(encoding="utf-8"))
        return per_task_stage(cfg, options, names, paths, metrics, out)
    out.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.device)
    tokenizer = BertTokenizer.from_pretrained(cfg.model)
    specs, data, models = {}, {}, {}
    for name in names:
        task_cfg = dataclasses.replace(cfg, task=name, data=paths[name])
        specs[name] = TASKS[name].for_run(task_cfg)
        length = cfg.max_seq_length or specs[name].default_max_seq_length
        data[name] = load_task_data(specs[name], paths[name], tokenizer, length, cfg.train_limit, cfg.eval_limit)
        models[name] = PretrainedStart(specs[name], cfg.model).fresh(cfg.seed + names.index(name))
    model = MultiTaskModel(models).to(device)
    sizes = [len(data[n].train_features) for n in names]
    rates = mixing_rates(sizes, options.mixing, options.mixing_limit, options.mixing_temperature)
    micro, accum = split_batch(cfg.batch_size, grad_accum=cfg.grad_accum)
    total = cfg.max_steps or max(1, math.ceil(cfg.epochs * sum(steps_per_epoch(s, micro, accum) for s in sizes)))
    schedule = task_schedule(rates, total * accum, cfg.seed)
    write_run_config(out, run_record(cfg, {"tasks": names, "mixing_rates": dict(zip(names, rates)), "steps": total}))
    log.info("multi-task: %s; mixing %s rates %s; %d steps", ", ".join(f"{n} ({s})" for n, s in zip(names, sizes)),
             options.mixing, ", ".join(f"{r:.3f}" for r in rates), total)

    task_features = [data[name].train_features for name in names]
    lengths = [feature_lengths(fs) for fs in task_features] if cfg.group_by_length else None

    def batches(step: int):
        stream = mixed_batches(task_features, schedule, micro, [specs[n].collate for n in names], cfg.seed,
                               step * accum, lengths)
        for t, batch in zip(schedule[step * accum:], stream):
            batch["task_index"] = torch.tensor(t)
            yield batch

    def loss_fn(m, batch):
        name = names[int(batch["task_index"])]
        return specs[name].loss(m.models[name], batch), {}

    optimizer = adamw(model, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = linear_warmup_decay(optimizer, math.ceil(cfg.warmup_proportion * total), total)
    loop = LoopConfig(max_steps=total, out_dir=run_dir, grad_accum=accum, precision=cfg.precision,
                      max_grad_norm=cfg.max_grad_norm, log_every=max(1, total // 50), seed=cfg.seed,
                      progress=cfg.progress, retain_freed_memory=cfg.retain_freed_memory, tensorboard=False,
                      save_every=cfg.save_every)
    # Checkpoints on a signal and every --save-every steps only (as one task's runs: the models are exported
    # at the end anyway); a resume continues from the latest.
    trainer = FinetuneTrainer(model, optimizer, scheduler, loss_fn, batches, loop)
    result = trainer.fit(resume=bool(cfg.resume and checkpoint))
    if result.interrupted:
        raise FinetuneInterrupted(run_dir, result)
    metrics: dict[str, Any] = {"tasks": names, "mixing": options.mixing, "mixing_rates": dict(zip(names, rates)),
                               "steps": result.step, "train_seconds": round(trainer.elapsed, 1),
                               "multi_task": {}, "per_task": {}}
    for name in names:
        spec, task_model = specs[name], model.models[name]
        split = spec.eval_splits[0]
        length = cfg.max_seq_length or spec.default_max_seq_length
        metrics["multi_task"][name] = evaluate(
            spec, task_model, tokenizer, data[name].eval_examples[split], split, max_length=length,
            batch_size=cfg.eval_batch_size, out_dir=out / name, device=device, autocast_dtype=autocast_dtype(cfg.precision),
            features=data[name].eval_features[split])
        save_model(task_model, out / name / "model", tokenizer)
    atomic_write_text(out / STAGE_FILE, json.dumps(metrics, indent=2) + "\n")  # after every model: the stage is done
    shutil.rmtree(run_dir / CHECKPOINT_DIR, ignore_errors=True)  # its training state is no longer needed
    return per_task_stage(cfg, options, names, paths, metrics, out)


def per_task_stage(cfg: FinetuneConfig, options: MultiTaskOptions, names: list[str], paths: dict[str, str],
                   metrics: dict[str, Any], out: Path) -> dict[str, Any]:
    """MT-DNN's second stage (with --per-task-epochs): each task alone, from its multi-task model, as
    `bertlab finetune TASK` would (a resume continues a task's sweep where it stopped); then metrics.json."""
    if options.per_task_epochs:
        for name in names:
            single_out = out / name / "finetuned"
            single = FinetuneConfig(**{**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)},
                                       "task": name, "data": paths[name], "model": str(out / name / "model"),
                                       "out": str(single_out), "epochs": options.per_task_epochs,
                                       "multi": MultiTaskOptions(),
                                       "resume": cfg.resume and (single_out / RUN_CONFIG).is_file()})
            metrics["per_task"][name] = finetune(single)["best_run"]
    atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")
    return metrics
