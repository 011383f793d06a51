"""Text-to-text fine-tuning of T5 (Raffel et al., 2020, sections 2.4, 3.5.1 and 3.5.2) on the one training loop.

    bertlab finetune-t5 --tasks rte,mrpc,stsb --model T5_DIR --data GLUE_DIR --out OUT
        [--mixing proportional|temperature|equal] [--mixing-limit K] [--mixing-temperature T]
        [--method full|adapters] [--gradual-unfreezing K] [--squad SPEC] [--per-task-epochs E]

    data       every task as text (`tasks.text_to_text.render`: "mrpc sentence1: ... sentence2: ..." ->
               "equivalent"), read by the task's own reader from GLUE_DIR/<GLUE folder> (CoLA, SST-2, MRPC,
               STS-B, QQP, MNLI, QNLI, RTE, WNLI), or from `--data task=PATH,...`; SQuAD from `--squad SPEC`
               (a SQuAD DATA_PATH: `train=FILE,dev=FILE`, `FILE#A:B` for articles A..B-1)
    mixing     one model, every task: each micro-batch's task is drawn by the mixing rule (`data/mixing.py`:
               examples-proportional with limit K, temperature T, equal; seeded), then a batch of that task;
               one task alone is the same with rate 1. `--epochs` counts passes over all tasks together
    model      a T5 folder (config.json, model.safetensors, its tokenizer: spiece.model or vocab.txt with the
               sentinels) -- `bertlab pretrain`'s final/, or a multi-task OUT/model for per-task fine-tuning
    methods    full; adapters (T5 section 3.5.1: a dense-ReLU-dense block of inner size `--adapter-size` after
               each feed-forward network, `nn.adapters`; only the adapters and the RMS norms train); gradual
               unfreezing `--gradual-unfreezing K`: the shared embedding (which is also the output layer) and
               the final norms train from the start, and every K steps one more block joins from the top --
               in an encoder-decoder the encoder's and the decoder's block of the same depth together, "in
               parallel, starting from the top in both cases", as T5 did
    optimiser  Adafactor at a constant rate (T5's fine-tuning: 0.001; narrower models more, see
               FINETUNE_LR_BY_WIDTH), or `--optimizer adamw` / `--schedule
               inverse-sqrt` (`t5_optim.py`)
    eval       greedy decoding (`model.generate`) on each task's dev split, the text read back into a label and
               scored by the task's own metric (`tasks.text_to_text.score`, the code the BERT path scores with);
               an output that is no label counts as wrong and is counted (`invalid_outputs`). Texts are
               compared after the tokenizer's own round trip, so a WordPiece vocabulary that writes
               "not_equivalent" back as "not _ equivalent" still reads as the label
    output     OUT/metrics.json (per task: dev scores, invalid outputs; mean ± sd over --seeds), OUT/<task>/
               dev_predictions.jsonl, OUT/model/ (Hugging Face layout + tokenizer: the best seed's), and with
               adapters OUT/adapters/ (only the adapter and norm weights; `load_adapters(base, OUT/adapters)`
               puts them on top of the base model); `--per-task-epochs E` then fine-tunes each task alone from
               OUT/model into OUT/per-task/<task>/ (multi-task training, then per-task fine-tuning)
    resume     as `bertlab finetune TASK`: a seed's run (OUT/runs/seed-N/) is checkpointed on Ctrl-C / SIGTERM
               (exit 130 / 143) and every `--save-every` steps; `--out OUT --resume` continues it bitwise, reads
               the seeds already done from their run.json, and resumes the per-task stage where it stopped
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..checkpoint.pretrained import save_model_folder
from ..core.fsio import atomic_directory, atomic_write_text
from ..data.mixing import mixing_rates, task_schedule
from ..core.errors import BertlabError, ConfigError
from ..nn.adapters import ADAPTERS_CONFIG_KEY, GradualUnfreezing, add_adapters, freeze_except, parameter_counts
from ..core.labels import IGNORE_INDEX
from ..models.objective import target_token_metrics
from ..models.registry import family_of
from ..tasks import TASKS
from ..tasks.base import warn_if_one_class
from ..tasks.text_to_text import TEXT_FORMATS, render, score, text_format
from . import methods
from .finetune import (RESUME_MAY_CHANGE, RUN_FILE, FinetuneInterrupted, FinetuneTrainer, MultiTaskOptions,
                       StepCallback, SweepState, mean_sd, subset)
from .batches import mixed_batches, steps_per_epoch
from .distributed import refuse_torchrun
from .loop import LoopConfig
from .run_dir import CHECKPOINT_DIR, check_writable, latest_checkpoint
from .random_init import random_start, resolve_init
from .run_record import (RUN_CONFIG, autocast_dtype, lr_for_width, resolve_device, resolve_resume_config, run_record,
                    split_batch, write_run_config)
from .runconfig import GroupedSettings
from .options import EpochTraining, RunOptions
from .t5_optim import T5OptimOptions, build_schedule, build_t5_optimizer, t5_lr

log = logging.getLogger(__name__)

# GLUE_DIR's subfolders, as GLUE's download script names them.
GLUE_FOLDERS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP", "mnli": "MNLI",
                "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}
T2T_METHODS = ("full", "adapters")
# T5 section 3.5.1: an adapter after each feed-forward network's output projection.
T5_ADAPTER_LAYERS = r"DenseReluDense\.wo$"
ADAPTERS_DIR, ADAPTER_WEIGHTS, ADAPTER_CONFIG = "adapters", "adapters.safetensors", "adapter_config.json"


@dataclass
class TextToTextOptim(T5OptimOptions):
    """T5's fine-tuning: Adafactor at a constant rate."""

    schedule: str = "constant"
    warmup: int = 0


@dataclass
class TextToTextTraining(EpochTraining):
    batch_size: int = 32  # T5: 128


@dataclass
class TextToTextConfig(GroupedSettings):
    model: str = ""  # a T5 folder with its tokenizer, or a size (t5-tiny) with `vocab` (train/random_init.py)
    data: str = ""  # GLUE_DIR (task subfolders) or task=PATH,task=PATH
    out: str = ""
    squad: str | None = None  # SQuAD DATA_PATH (train=FILE,dev=FILE; FILE#A:B articles) for task squad / squad2
    # epochs or max_steps, batch, seeds, bf16, subsets (a seeded random N training / dev examples per task)
    training: TextToTextTraining = field(default_factory=TextToTextTraining)
    # optimizer, schedule, warmup, lr (None: adafactor constant by width, FINETUNE_LR_BY_WIDTH; adamw 1e-3), decay
    optim: TextToTextOptim = field(default_factory=TextToTextOptim)
    max_seq_length: int | None = None  # longest input (None: the task's default, 128 for GLUE, 384 SQuAD)
    max_target_length: int = 64  # longest target in training; and the generation limit (with max_new_tokens)
    max_new_tokens: int | None = None  # generation limit (None: the longest label's tokens + 2; SQuAD 32)
    # seed, device; checkpoints and resume, as `bertlab finetune TASK`'s: a run's training state is saved on
    # Ctrl-C/SIGTERM and every `save_every` steps when given; `resume` continues the seed in progress
    run: RunOptions = field(default_factory=RunOptions)
    tuning: methods.TuningOptions = field(default_factory=methods.TuningOptions)  # method, adapter_size, unfreezing
    multi: MultiTaskOptions = field(default_factory=MultiTaskOptions)  # tasks, mixing, limit, temperature
    vocab: str | None = None  # a random start of a size: its tokenizer (vocab.txt or SentencePiece .model)
    init: str | None = None  # pretrained | random; None: random for a size or a vocab, else pretrained

    def __post_init__(self) -> None:
        names = self.multi.names
        if not names:
            raise ConfigError("finetune-t5: give the tasks, e.g. --tasks rte,mrpc,stsb (or --tasks sst2)")
        for name in names:
            if name not in TASKS:
                raise ConfigError(f"unknown task {name!r} in --tasks; expected names from: {', '.join(TEXT_FORMATS)}")
            text_format(name)  # a task without a text-to-text form: one line naming those with one
        if len(set(names)) != len(names):
            raise ConfigError(f"--tasks names a task twice: {self.multi.tasks}")
        if self.tuning.method not in T2T_METHODS:
            raise ConfigError(f"finetune-t5: --method must be one of {', '.join(T2T_METHODS)}, got {self.tuning.method!r}")
        for name in ("batch_size", "grad_accum", "seeds", "eval_batch_size", "max_target_length"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        split_batch(self.batch_size, grad_accum=self.grad_accum)

    @property
    def tasks(self) -> list[str]:
        return self.multi.names

    @property
    def precision(self) -> str:
        return "bf16" if self.bf16 else "fp32"


# ---------------------------------------------------------------------------------------------- data
@dataclass
class TaskTexts:
    """One task's examples as text and as ids."""

    name: str
    train: list  # TextPair
    dev: list
    train_features: list[dict[str, list[int]]]
    dev_features: list[dict[str, list[int]]]
    truncated: dict[str, int]
    max_new_tokens: int


def task_paths(cfg: TextToTextConfig) -> dict[str, str]:
    """Each task's DATA_PATH: `task=PATH,...`, else GLUE_DIR's subfolder; SQuAD from --squad."""
    names = cfg.tasks
    paths: dict[str, str] = {}
    if "=" in cfg.data:
        for part in cfg.data.split(","):
            name, _, path = part.partition("=")
            paths[name.strip()] = path.strip()
    for name in names:
        if name in paths:
            continue
        if name in ("squad", "squad2"):
            if not cfg.squad:
                raise ConfigError(f"task {name}: give its data with --squad SPEC (e.g. train=FILE,dev=FILE)")
            paths[name] = cfg.squad
        elif "=" in cfg.data:
            raise ConfigError(f"--data has no path for task {name} (give {name}=PATH)")
        else:
            if not cfg.data:
                raise ConfigError("finetune-t5: give --data GLUE_DIR (a folder with CoLA, SST-2, MRPC, ...)")
            folder = Path(cfg.data) / GLUE_FOLDERS[name]
            if not folder.is_dir():
                raise ConfigError(f"{folder}: no such folder (task {name} in GLUE_DIR {cfg.data})")
            paths[name] = str(folder)
    return paths


def encode_pairs(pairs: Sequence, tokenizer, max_input: int, max_target: int) -> tuple[list[dict], int]:
    """(features {input_ids, labels}, inputs truncated): the eos kept, so a cut input still ends like one."""
    features, cut = [], 0
    for pair in pairs:
        ids = tokenizer.encode(pair.inputs)
        if len(ids) > max_input:
            ids, cut = ids[:max_input - 1] + [tokenizer.eos_token_id], cut + 1
        labels = tokenizer.encode(pair.target)[:max_target] if pair.target is not None else []
        features.append({"input_ids": ids, "labels": labels})
    return features, cut


def load_texts(name: str, path: str, tokenizer, cfg: TextToTextConfig) -> TaskTexts:
    spec = TASKS[name]
    fmt = text_format(name)
    split = spec.eval_splits[0]
    train = render(name, subset(spec.read(path, "train"), cfg.train_limit))
    dev = render(name, subset(spec.read(path, split), cfg.eval_limit))
    train = [p for p in train if p.target is not None]
    if not train or not dev:
        raise BertlabError(f"task {name}: {path} has {len(train)} labelled training and {len(dev)} dev examples; "
                           "need some of each")
    max_input = cfg.max_seq_length or spec.default_max_seq_length
    train_features, train_cut = encode_pairs(train, tokenizer, max_input, cfg.max_target_length)
    dev_features, dev_cut = encode_pairs(dev, tokenizer, max_input, cfg.max_target_length)
    if cfg.max_new_tokens is not None:
        new_tokens = cfg.max_new_tokens
    elif hasattr(fmt, "label_texts"):  # a closed set of labels: room for the longest and its eos, and a spare
        new_tokens = max(len(tokenizer.encode(t)) for t in fmt.label_texts()) + 1
    else:  # SQuAD: free text, as long as the training answers go
        new_tokens = min(cfg.max_target_length, max(len(f["labels"]) for f in train_features))
    return TaskTexts(name, train, dev, train_features, dev_features, {"train": train_cut, "dev": dev_cut},
                     new_tokens)


class TextPairCollator:
    """{input_ids, labels} lists -> padded tensors: inputs with the pad id and an attention mask, targets
    with -100 (the model shifts them right behind its decoder start token)."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, features: Sequence[dict]) -> dict[str, torch.Tensor]:
        width = max(len(f["input_ids"]) for f in features)
        target = max(1, max(len(f["labels"]) for f in features))
        ids = torch.full((len(features), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(features), width), dtype=torch.long)
        labels = torch.full((len(features), target), IGNORE_INDEX, dtype=torch.long)
        for k, f in enumerate(features):
            ids[k, :len(f["input_ids"])] = torch.tensor(f["input_ids"])
            mask[k, :len(f["input_ids"])] = 1
            labels[k, :len(f["labels"])] = torch.tensor(f["labels"], dtype=torch.long)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


# ---------------------------------------------------------------------------------------------- methods
def unfreezing_blocks(model) -> list[nn.Module]:
    """The blocks gradual unfreezing releases, bottom to top: in an encoder-decoder, the encoder and decoder
    blocks of the same depth from the top as one unit (T5 unfroze both stacks in parallel); else the blocks."""
    decoder = list(model.decoder.block)
    if model.encoder is None:
        return decoder
    encoder = list(model.encoder.block)
    depth = max(len(encoder), len(decoder))
    pad = lambda blocks: [None] * (depth - len(blocks)) + blocks  # noqa: E731  (aligned at the top)
    return [nn.ModuleList([b for b in pair if b is not None]) for pair in zip(pad(encoder), pad(decoder))]


def prepare_tuning(model, options: methods.TuningOptions) -> methods.Tuning:
    """Apply the fine-tuning method to a T5 model (see the module docstring); logs trainable / total."""
    tuning = methods.Tuning(options)
    if options.method == "adapters":
        saved = model.config.extra.get(ADAPTERS_CONFIG_KEY)  # a model fine-tuned with adapters keeps its own
        layers = saved["layers"] if saved else add_adapters(model, T5_ADAPTER_LAYERS, options.adapter_size,
                                                            activation="relu")
        freeze_except(model, is_adapter_parameter)
        tuning.report["adapters"] = len(layers)
    elif options.gradual_unfreezing:
        tuning.unfreezing = GradualUnfreezing(unfreezing_blocks(model), options.gradual_unfreezing)
    trainable, total = parameter_counts(model)
    tuning.report.update(method=options.method, trainable_parameters=trainable, total_parameters=total)
    log.info("%s: %s of %s parameters train (%.2f%%)", options.method, f"{trainable:,}", f"{total:,}",
             100 * trainable / total)
    return tuning


def is_adapter_parameter(name: str) -> bool:
    """What adapter fine-tuning trains: the adapters and the RMS norms (T5 section 3.5.1)."""
    return ".adapter." in name or "layer_norm" in name


def save_adapters(model, path: Path, base_model: str) -> Path:
    """OUT/adapters: only what adapter fine-tuning changed (adapters + norms) and where the adapters sit."""
    from safetensors.torch import save_file

    weights = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items() if is_adapter_parameter(k)}
    config = {"base_model": str(base_model), **model.config.extra[ADAPTERS_CONFIG_KEY]}
    with atomic_directory(path, keep_existing=False) as tmp:
        save_file(weights, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return path


def load_adapters(model, path: str | Path):
    """Put the adapters saved in `path` (OUT/adapters) on top of `model` (the base T5 they were trained from,
    loaded as usual): the adapter layers are added, then their weights and the tuned norms loaded."""
    from safetensors.torch import load_file

    path = Path(path)
    for name in (ADAPTER_WEIGHTS, ADAPTER_CONFIG):
        if not (path / name).is_file():
            raise BertlabError(f"{path}: no {name} (not an adapters folder from `bertlab finetune-t5 --method "
                               "adapters`)")
    config = json.loads((path / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    add_adapters(model, list(config["layers"]), int(config["size"]), config.get("activation", "relu"))
    weights = load_file(str(path / ADAPTER_WEIGHTS))
    missing = [k for k in model.state_dict() if is_adapter_parameter(k) and k not in weights]
    unknown = [k for k in weights if k not in model.state_dict()]
    if missing or unknown:
        raise BertlabError(f"{path}: adapter weights do not fit this model (missing {missing[:3]}, unknown "
                           f"{unknown[:3]})")
    model.load_state_dict(weights, strict=False)
    return model


# ---------------------------------------------------------------------------------------------- evaluation
def canonical_label_texts(task: str, tokenizer) -> dict[str, str]:
    """The tokenizer's round trip of every valid label text -> that text (`"not _ equivalent"` ->
    `"not_equivalent"` for a WordPiece vocabulary); empty for free-text tasks."""
    fmt = TEXT_FORMATS[task]
    if not hasattr(fmt, "label_texts"):
        return {}
    return {tokenizer.decode(tokenizer.encode(t), skip_special_tokens=True).strip(): t for t in fmt.label_texts()}


@torch.no_grad()
def generate_texts(model, tokenizer, features: Sequence[dict], max_new_tokens: int, batch_size: int,
                   device: torch.device, dtype: torch.dtype | None = None) -> list[str]:
    """Greedy decoding of every feature's inputs, in their order (batched by length: little padding)."""
    model.eval()
    collate = TextPairCollator(tokenizer.pad_token_id)
    order = sorted(range(len(features)), key=lambda i: len(features[i]["input_ids"]))
    texts: list[str] = [""] * len(features)
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        batch = collate([{"input_ids": features[i]["input_ids"], "labels": []} for i in rows])
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            out = model.generate(batch["input_ids"].to(device), batch["attention_mask"].to(device),
                                 max_new_tokens=max_new_tokens)
        for i, ids in zip(rows, out[:, 1:].tolist()):  # drop the decoder start token
            if tokenizer.eos_token_id in ids:
                ids = ids[:ids.index(tokenizer.eos_token_id)]
            texts[i] = tokenizer.decode(ids, skip_special_tokens=True).strip()
    return texts


def evaluate_task(model, tokenizer, texts: TaskTexts, cfg: TextToTextConfig, device: torch.device,
                  out_dir: Path | None = None) -> dict[str, float]:
    """Greedy outputs on the task's dev split, scored by the task's own metric; invalid outputs counted."""
    outputs = generate_texts(model, tokenizer, texts.dev_features, texts.max_new_tokens, cfg.eval_batch_size,
                             device, autocast_dtype(cfg.precision))
    canonical = canonical_label_texts(texts.name, tokenizer)
    read = [canonical.get(o, o) for o in outputs]
    if canonical:  # a classification task: one answer for every example is a collapsed model, as on the BERT path
        warn_if_one_class(texts.name, "dev", Counter(read))
    result = score(texts.name, [p.example for p in texts.dev], read)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps({"inputs": p.inputs, "target": p.target, "output": o, "read_as": r}, ensure_ascii=False)
                 for p, o, r in zip(texts.dev, outputs, read)]
        atomic_write_text(out_dir / "dev_predictions.jsonl", "\n".join(lines) + "\n")
    return result.report()


def main_metric(task: str) -> str:
    return TASKS[task].main_metric


# ---------------------------------------------------------------------------------------------- the recipe
# Adafactor's constant fine-tuning rate without --lr, by the model's width (d_model; the nearest at or above it).
# T5 fine-tuned every size at 1e-3; a narrow model needs more: t5-tiny (128 wide) from random weights on SST-2,
# 300 steps of 32 at length 64, 400 dev sentences: 0.575 at 1e-3, 0.715 at 3e-3, 0.708 at 1e-2 (a pre-trained
# t5-tiny at 1e-3 answered "positive" 398 times of 400). 256 wide sits between; 512 and up keep T5's 1e-3.
FINETUNE_LR_BY_WIDTH = {128: 3e-3, 256: 2e-3, 512: 1e-3}


def finetune_lr(cfg: TextToTextConfig, width: int) -> float:
    """The rate of a run without --lr: by width for Adafactor at a constant rate (the default); T5's otherwise."""
    if cfg.optimizer != "adafactor" or cfg.schedule != "constant":
        return t5_lr(cfg.optimizer, cfg.warmup, cfg.schedule)
    lr = lr_for_width(FINETUNE_LR_BY_WIDTH, width)
    log.info("learning rate %g, the default for a T5 %d wide (--lr sets another)", lr, width)
    return lr


@dataclass
class RunOutcome:
    seed: int
    scores: dict[str, dict[str, float]]  # task -> metric -> value
    steps: int
    train_seconds: float
    tuning: dict[str, Any]

    @classmethod
    def read(cls, run_dir: Path) -> "RunOutcome | None":
        """The outcome of a run an earlier session finished (its run.json), else None."""
        if not (run_dir / RUN_FILE).is_file():
            return None
        saved = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
        return cls(**{f.name: saved[f.name] for f in dataclasses.fields(cls)})

    @property
    def average(self) -> float:
        """The mean of the tasks' main scores: what picks the run whose model is kept."""
        return statistics.fmean(s.get(main_metric(t), 0.0) for t, s in self.scores.items())


def train_once(cfg: TextToTextConfig, texts: list[TaskTexts], tokenizer, seed: int, device: torch.device,
               run_dir: Path):
    """One mixed (or single-task) fine-tuning run on the shared loop, then every task scored on dev."""
    model_class, _ = family_of(cfg.model).text_to_text("finetune-t5", cfg.model)
    torch.manual_seed(seed)
    model = model_class.from_pretrained(cfg.model)
    tuning = prepare_tuning(model, cfg.tuning)
    model.to(device).train()
    micro, accum = split_batch(cfg.batch_size, grad_accum=cfg.grad_accum)
    sizes = [len(t.train_features) for t in texts]
    options = cfg.multi
    rates = mixing_rates(sizes, options.mixing, options.mixing_limit, options.mixing_temperature)
    total = cfg.max_steps or max(1, math.ceil(cfg.epochs * sum(steps_per_epoch(s, micro, accum) for s in sizes)))
    schedule = task_schedule(rates, total * accum, seed)
    collate = TextPairCollator(tokenizer.pad_token_id)
    lr = cfg.lr or finetune_lr(cfg, model.config.d_model)
    optimizer = build_t5_optimizer(cfg.optimizer, model, lr, cfg.weight_decay)
    scheduler: Any = build_schedule(cfg.schedule, optimizer, cfg.warmup)
    on_step = tuning.after_optimizer()  # gradual unfreezing: the optimizer holds every block, most frozen
    if on_step is not None:
        scheduler = StepCallback(scheduler, on_step)

    def loss_fn(m, batch):
        out = m(batch["input_ids"], batch["attention_mask"], labels=batch["labels"])
        return out.loss, target_token_metrics(out.logits, batch["labels"])

    def batches(step: int):
        return mixed_batches([t.train_features for t in texts], schedule, micro, collate, seed, step * accum)

    loop = LoopConfig(max_steps=total, out_dir=run_dir, grad_accum=accum, precision=cfg.precision,
                      max_grad_norm=cfg.max_grad_norm, log_every=max(1, total // 50), seed=seed,
                      progress=cfg.progress, tensorboard=False, retain_freed_memory=cfg.retain_freed_memory,
                      save_every=cfg.save_every)
    # Checkpoints on a signal and every --save-every steps only, as BERT fine-tuning's; a resume continues the
    # run bitwise from the latest (the mixing schedule and the batches seek to its step).
    trainer = FinetuneTrainer(model, optimizer, scheduler, loss_fn, batches, loop)
    result = trainer.fit(resume=bool(cfg.resume and latest_checkpoint(run_dir)))
    if result.interrupted:
        raise FinetuneInterrupted(run_dir, result)
    tuning.finish(model)  # everything trainable again (the saved model is a plain one, adapters included)
    scores = {t.name: evaluate_task(model, tokenizer, t, cfg, device, run_dir / t.name) for t in texts}
    report = {**tuning.report, "mixing_rates": dict(zip(cfg.tasks, rates)), "lr": lr}
    return model, RunOutcome(seed, scores, result.step, round(trainer.elapsed, 1), report)


def finetune_text_to_text(cfg: TextToTextConfig, given: Sequence[str] | set[str] | None = None) -> dict[str, Any]:
    """The recipe of the module docstring; returns what OUT/metrics.json holds. `given`: on resume, the
    settings stated again (as for `finetune`: only the runtime ones may change)."""
    refuse_torchrun("finetune-t5")
    out = Path(cfg.out)
    if not cfg.out:
        raise ConfigError("finetune-t5: give --out OUT")
    if cfg.resume:  # the run's own settings rule, as for one BERT task
        cfg = resolve_resume_config(TextToTextConfig, cfg, out / RUN_CONFIG, RESUME_MAY_CHANGE, given)
    if not cfg.model:
        raise ConfigError("finetune-t5: give --model T5_DIR (a T5 folder with its tokenizer)")
    check_writable(out)
    interrupted = SweepState.interrupted_runs(out)  # the same layout: runs/<run>/checkpoints/step-*
    if interrupted and not cfg.resume:
        raise BertlabError(f"{out}: holds an interrupted fine-tuning ({interrupted[0]}); pass --resume to "
                           "continue it, or choose another --out")
    paths = task_paths(cfg)
    init: dict[str, Any] = {"init": "pretrained", "model": cfg.model}
    if resolve_init(cfg.model, cfg.vocab, cfg.init) == "random":  # the baseline: no pre-trained weights
        start = random_start(cfg.model, cfg.vocab, out, cfg.seed, generates_text=True)
        init = start.record
        cfg = dataclasses.replace(cfg, model=str(start.folder), vocab=None, init="pretrained")
    if not (Path(cfg.model) / "config.json").is_file():
        raise ConfigError(f"{cfg.model}: no config.json (give a T5 model folder, e.g. a pretrain run's final/)")
    family = family_of(cfg.model)
    _, load_tokenizer = family.text_to_text("finetune-t5", cfg.model)  # an encoder's folder: one line
    family.config_class.from_json_file(cfg.model)  # its config checked before anything is read
    tokenizer = load_tokenizer(cfg.model)
    texts = [load_texts(name, paths[name], tokenizer, cfg) for name in cfg.tasks]
    device = resolve_device(cfg.device)
    write_run_config(out, run_record(cfg, {"tasks": cfg.tasks, "data": paths, "init": init}))
    runs: list[RunOutcome] = []
    best: RunOutcome | None = None  # the first of equals
    for k in range(cfg.seeds):
        run_dir = out / "runs" / f"seed-{cfg.seed + k}"
        run = RunOutcome.read(run_dir) if cfg.resume else None  # finished in an earlier session
        if run is None:
            model, run = train_once(cfg, texts, tokenizer, cfg.seed + k, device, run_dir)
            log.info("seed %d: %s", run.seed, "; ".join(f"{t} {json.dumps(s)}" for t, s in run.scores.items()))
            if best is None or run.average > best.average:  # exported as it is found: no weights kept aside
                save_model_folder(model, out / "model", tokenizer)
                if cfg.tuning.method == "adapters":
                    save_adapters(model, out / ADAPTERS_DIR, cfg.model)
            # run.json after the export it may have led to; then its training state is no longer needed
            atomic_write_text(run_dir / RUN_FILE, json.dumps(dataclasses.asdict(run), indent=2) + "\n")
            shutil.rmtree(run_dir / CHECKPOINT_DIR, ignore_errors=True)
            del model
        runs.append(run)
        if best is None or run.average > best.average:
            best = run
    for t in texts:  # the best run's predictions beside the metrics
        src = out / "runs" / f"seed-{best.seed}" / t.name / "dev_predictions.jsonl"
        (out / t.name).mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / t.name / "dev_predictions.jsonl", src.read_text(encoding="utf-8"))
    metrics: dict[str, Any] = {
        "tasks": cfg.tasks, "init": init, "mixing": cfg.multi.mixing, "mixing_rates": runs[0].tuning["mixing_rates"],
        "train_examples": {t.name: len(t.train) for t in texts}, "dev_examples": {t.name: len(t.dev) for t in texts},
        "truncated_inputs": {t.name: t.truncated for t in texts},
        "dev": {t.name: {m: mean_sd([r.scores[t.name][m] for r in runs]) for m in best.scores[t.name]}
                for t in texts},
        "best_seed": best.seed, "steps": best.steps, "tuning": {k: v for k, v in best.tuning.items()
                                                               if k != "mixing_rates"},
        "runs": [{"seed": r.seed, "scores": r.scores, "steps": r.steps, "train_seconds": r.train_seconds}
                 for r in runs],
        "model": str(out / "model"), "per_task": {}}
    if cfg.multi.per_task_epochs:  # T5 section 3.5.3: multi-task training, then each task fine-tuned alone
        for t in texts:
            single_out = out / "per-task" / t.name
            single = dataclasses.replace(cfg, model=str(out / "model"), out=str(single_out),
                                         epochs=cfg.multi.per_task_epochs, max_steps=None, data=f"{t.name}="
                                         f"{paths[t.name]}" if t.name not in ("squad", "squad2") else cfg.data,
                                         multi=MultiTaskOptions(tasks=t.name),
                                         resume=cfg.resume and (single_out / RUN_CONFIG).is_file())
            metrics["per_task"][t.name] = finetune_text_to_text(single)["dev"][t.name]
    atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")
    return metrics


__all__ = ["GLUE_FOLDERS", "TextToTextConfig", "finetune_text_to_text", "load_adapters",
           "prepare_tuning", "unfreezing_blocks"]
