"""T5's pre-training recipe (Raffel et al., 2020, sections 3.1-3.3) on the one training loop.

    bertlab pretrain-t5 --model t5-small --data DATA_DIR --out RUN_DIR --steps 524288 [--objective NAME]
                        [--architecture encoder-decoder|decoder-only|prefix-lm] [--optimizer adafactor|adamw]

    objective  one of T5's denoising objectives (`bertlab.models.t5.objectives`), as the data was prepared with it
               (`bertlab prepare --objective NAME`): by default the data's own; a name the data was not
               prepared for is one line saying what it holds. The corruption is applied as batches are made
               (`data.t5_loader`), anew each epoch, from (seed, position)
    model      `T5ForConditionalGeneration` from a preset (t5-small ... t5-large, t5-v1_1-*, and the CPU-sized
               t5-tiny, t5-mini: vocabulary and special ids taken from the data), a config.json, or a model
               folder to continue from (`init_from`); `architecture` switches a preset or config to one of the
               paper's three Transformer variants (section 3.2), all trained on the same batches
    schedule   Adafactor with the inverse square root schedule: lr constant for `warmup` steps (10^4), then
               lr · sqrt(warmup / step); lr by default 1/sqrt(warmup) = 0.01, so lr_n = 1/sqrt(max(n, 10^4)),
               T5's. `--optimizer adamw` is the alternative (lr 1e-3 by default); `--schedule constant` too.
               No gradient clipping by default (Adafactor clips its own updates)
    run        the `Trainer`'s: exact resume (`--resume`, also after SIGKILL from the last periodic
               checkpoint), `--time-budget` fitted from measured steps, bf16 autocast, torchrun
    eval       held-out loss, perplexity, token accuracy and whole-target accuracy over the targets
    output     RUN_DIR/{run_config.json, metrics.jsonl, checkpoints/, final/}; final/ is the Hugging Face layout
               with the data's tokenizer (spiece.model, or vocab.txt with the sentinels), which `transformers`
               (encoder-decoder) and `bertlab generate` load as is
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import torch

from ..checkpoint.pretrained import save_model_folder
from ..core.errors import ConfigError
from ..objectives import OBJECTIVES, get_objective, is_text_to_text
from ..models.registry import corruptions, family
from .batches import time_step
from .distributed import seed_everything
from .loop import Trainer
from .pretrain import (FINAL_DIR, RESUME_MAY_CHANGE, PretrainResult, budget_outcome, evaluate_pretraining,
                       pretraining_loop, resume_or_refuse, start_run)
from .runconfig import parse_duration
from .run_record import (BUDGET_RESERVE, check_precision, eval_seconds, fit_steps_to_budget, heldout_sequences,
                    resolve_precision, resolved_settings, run_record, split_batch,
                    write_run_config)
from .runconfig import GroupedSettings
from .options import LoopRunOptions, PretrainEval, StepTraining
from .t5_optim import (OPTIMIZERS, SCHEDULES, T5OptimOptions, build_schedule, build_t5_optimizer,
                       t5_lr)

log = logging.getLogger(__name__)

T5_BATCH = 128  # T5's sequences per step
# A budgeted run on a CPU: T5's 128 x 512 takes ~30 s a step for t5-tiny on 2 cores, so a 5-minute budget
# would do 9 steps (and the timing alone took two minutes). The batch is halved, from 128 down to CPU_MIN_BATCH,
# until the budget fits at least this many steps, from the timing of a small probe batch.
CPU_TARGET_STEPS = 300
CPU_MIN_BATCH = 8


@dataclass
class T5PretrainConfig(GroupedSettings):
    # what to train, on what, where
    model: str = "t5-small"  # T5 preset, config.json or model folder
    architecture: str | None = None  # encoder-decoder | decoder-only | prefix-lm (default: the config's)
    data: str = ""  # DATA_DIR from `bertlab prepare --objective NAME`
    out: str = ""  # RUN_DIR
    init_from: str | None = None  # a Hugging Face-layout T5 folder to continue pre-training from
    objective: str | None = None  # a T5 objective the data was prepared for (default: the data's)
    # steps or a time budget; batch_size None: T5's 128 (of 512 tokens) -- except for a run with a time budget on
    # a CPU, which takes the largest of 128, 64, ..., 8 that fits CPU_TARGET_STEPS in the budget; precision
    training: StepTraining = field(default_factory=StepTraining)
    # optimisation: optimizer, schedule, warmup, lr (None: adafactor 1/sqrt(warmup) = T5's 0.01, adamw 1e-3),
    # weight decay, clipping (None: Adafactor clips its updates itself)
    optim: T5OptimOptions = field(default_factory=T5OptimOptions)
    eval: PretrainEval = field(default_factory=PretrainEval)
    run: LoopRunOptions = field(default_factory=LoopRunOptions)  # seed, device, checkpoints, resume

    def validate(self) -> None:
        if not self.data:
            raise ConfigError("pretrain: give the data directory (--data DATA_DIR, from `bertlab prepare "
                              "--objective NAME`)")
        if not self.out:
            raise ConfigError("pretrain: give the run directory (--out RUN_DIR)")
        if self.objective is not None and not is_text_to_text(get_objective(self.objective)):
            raise ConfigError(f"objective {self.objective} trains BERT, not T5; T5's objectives: "
                              f"{', '.join(n for n, o in OBJECTIVES.items() if is_text_to_text(o))}")
        architectures = text_to_text_architectures()
        if self.architecture is not None and self.architecture not in architectures:
            raise ConfigError(f"architecture must be one of {', '.join(architectures)}, got {self.architecture!r}")
        if self.steps is None and self.time_budget is None:
            raise ConfigError("pretrain: give the length of the run, --steps N or --time-budget 2h")
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"steps must be at least 1, got {self.steps}")
        check_precision(self.precision)  # the optimiser's settings: checked by their group (T5OptimOptions)
        for name in ("batch_size", "eval_batch_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.time_budget is not None:
            parse_duration(self.time_budget)


# ---------------------------------------------------------------------------------------------- data, model
def select_data(data_dir: str, objective: str | None):
    """The text-to-text instance set to train on: the data's default one, or the one prepared for `objective`.
    Every file is checked against the manifest here (a truncated shard stops the run before it starts)."""
    from ..data.shards import load_manifest
    from ..data.t5_data import TextToTextInfo, is_text_to_text as is_t5_set, select_text_to_text_set

    manifest = load_manifest(data_dir)
    chosen = select_text_to_text_set(manifest, Path(data_dir))  # none at all: the one-line "prepare" error
    if objective is not None and chosen["objective"]["name"] != objective:
        matching = [s for s in manifest["instance_sets"] if is_t5_set(s) and s["objective"]["name"] == objective]
        if not matching:
            have = sorted({s["objective"]["name"] for s in manifest["instance_sets"] if is_t5_set(s)})
            raise ConfigError(f"{data_dir}: prepared for objective {', '.join(have)}, not {objective}; leave out "
                              f"--objective, or add it with `bertlab prepare --out {data_dir} --objective {objective}`")
        chosen = matching[-1]
    return TextToTextInfo.from_manifest(Path(data_dir), manifest, chosen)


def text_to_text_architectures() -> tuple[str, ...]:
    """The architectures the text-to-text objectives train (`Objective.architectures`: T5's three), in order."""
    found: dict[str, None] = {}
    for objective in OBJECTIVES.values():
        if is_text_to_text(objective):
            found.update(dict.fromkeys(objective.architectures))
    return tuple(found)


def build_t5_config(cfg: T5PretrainConfig, info, config_class: type | None = None):
    """The model's config (of `config_class`, the class the objective trains's; default: the objective's), made
    to fit the data: a preset takes the data's vocabulary and special ids (and room for the longest sequence); a
    given config must already agree with them."""
    if config_class is None:
        config_class = get_objective(info.objective.name).model_class.config_class
    source = cfg.init_from or cfg.model
    config = config_class.from_name_or_path(source)
    vocab = info.vocab
    special = dict(vocab_size=vocab.vocab_size, pad_token_id=vocab.pad_id, eos_token_id=vocab.eos_id,
                   decoder_start_token_id=vocab.pad_id)
    is_preset, _, _ = config_class.preset_lookup()
    preset = cfg.init_from is None and is_preset(source)
    if preset:
        config = config.replace(**special)
    else:
        wrong = [f"{k} {getattr(config, k)} (the data's: {v})" for k, v in special.items() if getattr(config, k) != v]
        if wrong:
            raise ConfigError(f"{source}: {'; '.join(wrong)} -- {cfg.data} was prepared with another vocabulary "
                              f"({info.vocab_file}); prepare the data with this model's, or use a preset")
    if cfg.architecture is not None and cfg.architecture != config.architecture:
        if cfg.init_from is not None:
            raise ConfigError(f"{cfg.init_from} is a {config.architecture} model; --architecture {cfg.architecture} "
                              "would need other weights")
        config = config.replace(architecture=cfg.architecture)
    # The longest sequence a step reads: the inputs, and for the decoder-only kinds the targets after them.
    longest = info.max_seq_length + (0 if config.is_encoder_decoder else info.targets_length)
    if longest > config.n_positions:
        if not preset:
            raise ConfigError(f"{source}: n_positions {config.n_positions} is shorter than the data's examples "
                              f"({longest} tokens for a {config.architecture} model)")
        config = config.replace(n_positions=longest)
    return config


def data_tokenizer(info):
    """The tokenizer of a text-to-text data directory's vocabulary, as the family of its corruption transforms
    reads it (T5's), saved beside the model."""
    _, load_tokenizer = family(corruptions()[info.objective.name].model_type).text_to_text("pretrain-t5")
    return load_tokenizer(info.vocab_file)


def count_text_to_text_tokens(batch: Mapping[str, torch.Tensor]) -> int:
    """Tokens a text-to-text step processes: the inputs' and the targets' (for tokens/s and compute budgets)."""
    return int(batch["attention_mask"].sum()) + int((batch["labels"] != -100).sum())


# ---------------------------------------------------------------------------------------------- the recipe
def run_t5_pretraining(cfg: T5PretrainConfig, echo: Callable[[str], None] = print,
                       given: Collection[str] | None = None) -> PretrainResult:
    """`given`: the settings the user stated; on resume the others are the run's own."""
    from ..data.t5_loader import TextToTextDataset

    cfg, dist, say, run_dir = start_run(T5PretrainConfig, cfg, RESUME_MAY_CHANGE, given, echo)

    # ---- data and model, checked against each other before anything trains
    info = select_data(cfg.data, cfg.objective)
    cfg = dataclasses.replace(cfg, objective=info.objective.name)  # recorded: a resumed run trains the same
    objective = get_objective(cfg.objective)
    model_class = objective.model_class  # the text-to-text model its data's family trains (T5's)
    model_config = build_t5_config(cfg, info, model_class.config_class)

    seed_everything(cfg.seed)
    if cfg.init_from is not None:
        model = model_class.from_pretrained(cfg.init_from)
    else:
        model = model_class(model_config)
    model.to(dist.device).train()
    resolved = resolved_settings(run_dir) if cfg.resume else {}
    precision = resolved.get("precision") or resolve_precision(cfg.precision, dist.device)

    def stream(start_sample: int, micro_batch: int | None = None):
        ds = TextToTextDataset(cfg.data, "train", seed=cfg.seed, instance_set=info.instance_set, rank=dist.rank,
                               world_size=dist.world_size, start_index=start_sample, batch_size=micro_batch or micro)
        return ds.dataloader(num_workers=cfg.num_workers, pin_memory=dist.device.type == "cuda",
                             persistent_workers=False)

    if cfg.batch_size is None:  # recorded in run_config.json: a resumed run keeps it
        batch = T5_BATCH
        if dist.device.type == "cpu" and cfg.steps is None and cfg.time_budget and not resolved:
            batch = cpu_batch_for_budget(model, objective.loss, stream, precision, dist, parse_duration(cfg.time_budget),
                                         info.max_seq_length, say)
        cfg = dataclasses.replace(cfg, batch_size=batch, eval_batch_size=min(cfg.eval_batch_size, batch))
    micro, accum = split_batch(cfg.batch_size, cfg.micro_batch_size, dist.world_size)

    def heldout() -> Iterable[dict]:
        ds = TextToTextDataset(cfg.data, "heldout", seed=cfg.seed, instance_set=info.instance_set,
                               batch_size=cfg.eval_batch_size)
        loader = ds.dataloader(num_workers=0)
        return islice(loader, cfg.eval_batches) if cfg.eval_batches else loader

    stream(0)  # open every split now: a bad data directory is reported before training
    heldout()

    # ---- run length: given, or fitted to the time budget by timing real steps here
    steps = first_plan = resolved.get("steps") or cfg.steps
    if steps is None:
        budget = parse_duration(cfg.time_budget)
        per_step = time_step(model, objective.loss, stream(0), accum, precision, dist.device)
        eval_seqs = heldout_sequences(info.num_instances.get("heldout", 0), cfg.eval_batches, cfg.eval_batch_size)
        eval_s = eval_seconds(eval_seqs, micro * accum * dist.world_size, per_step)
        steps = fit_steps_to_budget(budget, per_step, eval_s, cfg.num_evals, cfg.eval_every, dist)
        say(f"time budget {cfg.time_budget}: {per_step:.2f}s per step -> {steps} steps")
        first_plan = steps
    samples = micro * accum * dist.world_size

    def batches(step: int) -> Iterator[dict]:
        return iter(stream(step * samples))  # seeks to the step's first sample: no replay on resume

    # ---- optimisation: Adafactor (or AdamW) on T5's inverse square root schedule
    lr = resolved.get("lr") or cfg.lr or t5_lr(cfg.optimizer, cfg.warmup, cfg.schedule)
    optimizer = build_t5_optimizer(cfg.optimizer, model, lr, cfg.weight_decay)
    scheduler = build_schedule(cfg.schedule, optimizer, cfg.warmup)

    def evaluate(m: torch.nn.Module) -> dict[str, float]:
        return evaluate_pretraining(m, heldout(), dist.device, objective)

    loop = pretraining_loop(cfg, steps, run_dir, accum, precision)
    trainer = Trainer(model, optimizer, scheduler, objective.loss, batches, loop, evaluate=evaluate,
                      token_counter=count_text_to_text_tokens, extra_state={"run_config": dataclasses.asdict(cfg)})
    resume_or_refuse(trainer, cfg, run_dir, dist, say)
    if dist.is_main:
        write_run_config(run_dir, run_record(cfg, {
            "steps": steps, "precision": precision, "lr": lr, "grad_accum": accum, "micro_batch_size": micro,
            "world_size": dist.world_size, "instance_set": info.instance_set,
            "objective_params": info.objective.params(), "model_config": model_config.to_dict()}))

    say(f"pre-training T5 {model_config.architecture} ({model.num_parameters() / 1e6:.1f}M parameters) with "
        f"{objective.name} on {cfg.data}: {steps} steps x {cfg.batch_size} examples of <= {info.max_seq_length} "
        f"input tokens, {cfg.optimizer} lr {lr:g} ({cfg.schedule}, {cfg.warmup} warmup steps), {precision}, "
        f"{dist.world_size} process(es), grad accumulation {accum}")

    eval_before: dict[str, float] = {}
    if cfg.eval_at_start and not cfg.resume:
        eval_before = trainer.run_evaluation()
    result = trainer.fit()
    if dist.is_main and cfg.time_budget and cfg.steps is None:  # how the budget ended the run, as BERT's says
        say(budget_outcome(result, parse_duration(cfg.time_budget), first_plan, scheduler))

    final_dir = None
    if result.stopped in ("max_steps", "time_budget", "data_exhausted"):
        if dist.is_main:
            final_dir = save_model_folder(model, run_dir / FINAL_DIR, data_tokenizer(info))
            say(f"saved the model in Hugging Face layout to {final_dir}")
    if dist.world_size > 1:
        torch.distributed.barrier()
    return PretrainResult(run_dir, final_dir, result, eval_before, result.eval_metrics, cfg)


def cpu_batch_for_budget(model, loss_fn, stream, precision: str, dist, budget_s: float, length: int,
                         say: Callable[[str], None]) -> int:
    """The batch a budgeted T5 run on a CPU takes (see CPU_TARGET_STEPS): a probe of CPU_MIN_BATCH sequences is
    timed (seconds, not the minutes a step of 128 x 512 takes), the step time taken as proportional to the batch,
    and the largest of 128, 64, ..., CPU_MIN_BATCH kept that fits CPU_TARGET_STEPS steps in the budget; when even
    the smallest does not, one line says what to change."""
    probe = time_step(model, loss_fn, stream(0, CPU_MIN_BATCH), 1, precision, dist.device, repeats=1)
    per_sequence = probe / CPU_MIN_BATCH
    usable = (1 - BUDGET_RESERVE) * budget_s
    batch = T5_BATCH
    while batch > CPU_MIN_BATCH and usable / (batch * per_sequence) < CPU_TARGET_STEPS:
        batch //= 2
    steps = int(usable / (batch * per_sequence))
    say(f"T5 on a CPU with a time budget: batch {batch} of up to {length} tokens (about {batch * per_sequence:.2f}s "
        f"a step, {steps} steps; T5's own is {T5_BATCH}; --batch-size sets another)")
    if steps < CPU_TARGET_STEPS:
        say(f"WARNING: even {batch} sequences of {length} tokens take {batch * per_sequence:.1f}s a step here: the "
            f"budget fits about {steps} steps, too few to learn much. Prepare shorter examples (`bertlab prepare "
            f"... --objective span-corruption --max-seq-length 128`), give a longer --time-budget, or use a GPU")
    return batch


__all__ = ["OPTIMIZERS", "SCHEDULES", "T5PretrainConfig", "build_t5_config", "run_t5_pretraining", "select_data"]
