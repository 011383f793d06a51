"""The pre-training recipe (section 3.1 and appendix A.2 of the paper) on top of the one training loop.

    objective a registered `bertlab.objectives.Objective` (`--objective`): mlm+nsp (BERT's, the default)
              or mlm; it names the head, the loss and the held-out metrics
    data      a directory from `bertlab prepare`: segment pairs with NSP labels (or packed sequences for
              an objective without NSP), a held-out split, and the vocabulary the ids come from
    model     the objective's head kind in the model's family (BertForPreTraining for mlm+nsp, BertForMaskedLM
              or RobertaForMaskedLM for mlm) from a preset, a config.json, or a Hugging Face-layout folder to
              continue from (`init_from`). The family is `family` when given, else the config's model_type,
              else the data's tokenizer (byte-level BPE data: RoBERTa, said in one line; WordPiece: BERT).
              A RoBERTa preset is BERT's size with RoBERTa's differences: the data's vocabulary, pad id 1,
              positions from pad id + 1 (514 for 512 tokens), one token type, layer_norm_eps 1e-5
    schedule  AdamW (or LAMB), linear warmup over `warmup` then linear decay to 0 at the last step;
              steps given, or fitted to a wall-clock budget (`time_budget`, measured on this machine)
    phases    the paper's 90% of steps at length 128, then 10% at 512 -- one LR schedule -- when the data
              directory holds a 512 instance set (`bertlab prepare --out DATA --max-seq-length 512`)
    eval      the objective's held-out metrics (MLM loss, accuracy, perplexity; NSP accuracy), every
              `eval_every` steps
    output    RUN_DIR/{run_config.json, metrics.jsonl, checkpoints/, final/}; `final/` is the Hugging
              Face layout with vocab.txt (RoBERTa: vocab.json + merges.txt) and tokenizer_config.json, which
              `transformers` loads as is

Everything the user can get wrong (a data directory from another tokenizer, a truncated shard, an
unwritable RUN_DIR, a corrupt checkpoint on `resume`) is checked before the first training step.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import torch

from ..checkpoint.pretrained import save_pretrained
from ..core.jsonconfig import JsonConfig
from ..models.family import Family
from ..models.registry import (DEFAULT_MODEL_TYPE, FAMILIES, data_tokenizers, family as family_named, family_of,
                               model_type_of, pretrain_command)
from ..core.errors import BertlabError, ConfigError
from ..objectives import OBJECTIVES, Objective, get_objective, is_text_to_text
from .budget import BudgetScheduler, RefittedLinearDecay
from .batches import time_step, to_device
from .distributed import init_distributed, seed_everything
from .fsdp import resolve_sharding, shard_model, unsharded_copy
from .loop import LoopConfig, SLOWDOWN_WARNING, Trainer, TrainResult
from .run_dir import check_writable, latest_checkpoint
from .optim import build_optimizer, linear_warmup_decay
from .runconfig import GroupedSettings, changed_settings, parse_duration
from .options import AdamOptimOptions, LoopRunOptions, PretrainEval, ShardingOptions, StepTraining
from .run_record import (RUN_CONFIG, check_precision, eval_seconds, fit_steps_to_budget, heldout_sequences, lr_for_width,
                    resolve_precision, resolve_resume_config, resolved_settings, run_record, split_batch,
                    write_run_config)

log = logging.getLogger(__name__)

FINAL_DIR = "final"


@dataclass
class PretrainTraining(StepTraining):
    time_budget: str | None = None
    """wall-clock budget, e.g. 2h, 90m, 1h30m: the step count is fitted to it and re-fitted as the run goes;
    with --steps, a cap: the run does those steps, fewer when this machine cannot do them in time"""
    batch_size: int = 128  # the paper: 256


@dataclass
class PretrainOptim(AdamOptimOptions):
    warmup: float = 0.01  # < 1: fraction of the steps (the paper: 10k of 1M); >= 1: steps


@dataclass
class PretrainConfig(GroupedSettings):
    # what to train, on what, where
    model: str = "mini"  # preset (tiny, mini, small, ..., L4-H256) or a config.json / model folder
    data: str = ""  # DATA_DIR from `bertlab prepare`
    out: str = ""  # RUN_DIR
    init_from: str | None = None  # a Hugging Face-layout folder to continue pre-training from
    objective: str = "mlm+nsp"  # a name in bertlab.objectives.OBJECTIVES: mlm+nsp (BERT) | mlm (packed data)
    family: str | None = None  # a model_type this command pre-trains; None: the config's, else the objective's and data tokenizer's
    # how long (steps, or a time budget the schedule is fitted to), batch over all ranks, precision
    training: PretrainTraining = field(default_factory=PretrainTraining)
    max_seq_length: int = 128  # phase 1 sequence length (an instance set of that length must exist)
    phase2_max_seq_length: int | None = None  # None: the longest longer set in the data (512), if any; 0: off
    phase2_fraction: float = 0.1  # share of the steps at phase2_max_seq_length (the paper: the last 10%)
    phase2_batch_size: int | None = None  # default: batch_size
    # packed data (prepare --mode full-sentences): each document of a row attends to itself only, not across the
    # row (on a GPU one variable-length sequence per document; positions still run along the row)
    document_attention: bool = False
    # optimisation
    optimizer: str = "adamw"  # adamw | lamb | stableadamw (ModernBERT's: per-tensor update clipping, decoupled decay)
    optim: PretrainOptim = field(default_factory=PretrainOptim)  # lr (None: by the model's width), decay, clipping
    decay_fraction: float = 1.0  # share of the post-warmup steps the rate decays over; < 1 holds the peak first
    eval: PretrainEval = field(default_factory=PretrainEval)  # eval_every None: `num_evals` spread over the run
    # seed, device, checkpoints (save_every None: 10 per run, plus the last one, and on signals), resume
    run: LoopRunOptions = field(default_factory=LoopRunOptions)
    # under torchrun: DDP replicas or FSDP2 shards (`train/fsdp.py`)
    parallel: ShardingOptions = field(default_factory=ShardingOptions)

    def validate(self) -> None:
        if not self.data:
            raise ConfigError("pretrain: give the data directory (--data DATA_DIR, from `bertlab prepare`)")
        if not self.out:
            raise ConfigError("pretrain: give the run directory (--out RUN_DIR)")
        if is_text_to_text(get_objective(self.objective)):  # unknown: the one-line "expected one of" error
            raise ConfigError(f"objective {self.objective} trains T5 (bertlab.train.t5_pretrain): give a T5 "
                              "--model (t5-small, t5-tiny, a T5 config.json) and text-to-text data")
        if self.steps is None and self.time_budget is None:
            raise ConfigError("pretrain: give the length of the run, --steps N or --time-budget 2h")
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"steps must be at least 1, got {self.steps}")
        check_precision(self.precision)
        if not 0 < self.decay_fraction <= 1:
            raise ConfigError(f"decay_fraction must be in (0, 1], got {self.decay_fraction}")
        if not 0 <= self.phase2_fraction < 1:
            raise ConfigError(f"phase2_fraction must be in [0, 1), got {self.phase2_fraction}")
        for name in ("batch_size", "max_seq_length", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.time_budget is not None:
            parse_duration(self.time_budget)
        if self.family is not None and self.family not in (kinds := data_tokenizers()):
            raise ConfigError(f"family must be one of {', '.join(kinds)}, got {self.family!r}"
                              + _other_command(self.family))



# Peak learning rate by hidden size when --lr is not given. The paper's 1e-4 (batch 256) is for BERT-base;
# a narrow model at 1e-4 learns the word frequencies and stays there for thousands of steps (BERT-Tiny:
# held-out MLM accuracy 0.08), while 1e-3 trains it (docs/guide/pretraining.md, learning rate).
# Narrower models take larger rates, as ELECTRA-small (5e-4) and the Cramming recipe do; 3e-3 was too much for
# BERT-Tiny in the demo's measurements (stuck at 0.08 as well).
DEFAULT_LR_BY_WIDTH = {128: 1e-3, 256: 5e-4, 512: 2e-4, 768: 1e-4, 1024: 1e-4}


def pretraining_lr(hidden_size: int) -> float:
    """The peak learning rate for a model `hidden_size` wide: the table's nearest width at or above it."""
    return lr_for_width(DEFAULT_LR_BY_WIDTH, hidden_size)


# Settings a resumed run may change when stated again: runtime settings, and the optimiser's (a run that
# diverged continues from its last good checkpoint at a lower --lr; the change is printed). Everything else
# is taken from the run's own run_config.json, since changing it (batch, schedule, data) would make the
# continuation a different run.
RESUME_MAY_CHANGE = ("eval_every", "eval_batches", "save_every", "keep_last", "log_every", "num_workers",
                     "device", "progress", "resume", "eval_at_start", "lr", "weight_decay", "max_grad_norm",
                     "sharding", "fsdp_cpu_offload")


@dataclass
class PretrainResult:
    run_dir: Path
    final_dir: Path | None
    train: TrainResult
    eval_before: dict[str, float] = field(default_factory=dict)
    eval_after: dict[str, float] = field(default_factory=dict)
    config: PretrainConfig | None = None


# ---------------------------------------------------------------------------------------------- helpers
@torch.no_grad()
def evaluate_pretraining(model: torch.nn.Module, batches: Iterable[dict], device: torch.device,
                         objective: Objective) -> dict[str, float]:
    """`objective`'s held-out metrics of `model` over `batches` (its streaming evaluation)."""
    evaluation = objective.new_eval()
    for batch in batches:
        batch = to_device(batch, device)
        evaluation.update(model(**objective.model_inputs(batch)), batch)
    return evaluation.compute()


def heldout_batches(data_dir: str, max_seq_length: int, seed: int, batch_size: int,
                    max_batches: int | None, document_attention: bool = False) -> Iterable[dict]:
    """The held-out split of `data_dir` at `max_seq_length`: its first `max_batches` batches (None: all of them)."""
    from ..data import PretrainingDataset

    ds = PretrainingDataset(data_dir, "heldout", seed=seed, batch_size=batch_size, max_seq_length=max_seq_length)
    loader = ds.dataloader(num_workers=0, collate_fn=ds.collator(document_attention=document_attention))
    return islice(loader, max_batches) if max_batches else loader


def _available_lengths(data_dir: str) -> list[int]:
    from ..data.shards import load_manifest

    manifest = load_manifest(data_dir)  # verifies every file's size: a truncated shard stops us here
    return sorted({s["instances"]["max_seq_length"] for s in manifest.get("instance_sets", [])})


def stated_fields(cfg, given: Collection[str] | None) -> set[str]:
    """The settings the user stated: `given` (flags and --config keys), or for a config built in Python the
    fields that differ from the dataclass defaults (as `setup.resolve_resume_config` reads them)."""
    return set(given) if given is not None else changed_settings(cfg)


def settings_from_data(cfg: PretrainConfig, lengths: list[int], stated: Collection[str],
                       say: Callable[[str], None]) -> PretrainConfig:
    """What `bertlab prepare` was told, for the settings the user did not state: the sequence length (128
    where the data has it, else its shortest instance set -- phase 1 -- with longer sets left to phase 2) and
    the objective (mlm when those instances carry no next-sentence pairs, mlm+sop on sentence-order pairs). A stated setting that contradicts
    the data stays the user's and is refused by the checks that follow, in one line."""
    from ..data import DataInfo

    changes: dict = {}
    if "max_seq_length" not in stated and lengths and cfg.max_seq_length not in lengths:
        changes["max_seq_length"] = lengths[0]
    max_seq_length = changes.get("max_seq_length", cfg.max_seq_length)
    if "objective" not in stated and max_seq_length in lengths:
        info = DataInfo.load(cfg.data, max_seq_length=max_seq_length)
        if get_objective(cfg.objective).needs_next_sentence_labels and not info.has_nsp:
            changes["objective"] = "mlm"  # BERT's objective less NSP: what such instances were made for
            why = f"its instances are {info.mode}, without next-sentence pairs"
        elif info.has_nsp and info.mode not in get_objective(cfg.objective).data_modes:
            changes["objective"] = next(n for n, o in OBJECTIVES.items() if info.mode in o.data_modes)
            why = f"its instances are {info.mode} pairs"
    if "family" not in stated and cfg.family is None and not _names_a_config(cfg) and lengths:
        length = max_seq_length if max_seq_length in lengths else None
        kind = DataInfo.load(cfg.data, max_seq_length=length).tokenizer_kind
        kinds = data_tokenizers()
        if kind != kinds[DEFAULT_MODEL_TYPE]:  # (the default family on its own data, as before families: nothing to say)
            changes["family"] = next((f for f, k in kinds.items() if k == kind), None)
    if changes:
        shown = ", ".join(f"--{k.replace('_', '-')} {v}"
                          for k, v in changes.items())
        reasons = ([why] if "objective" in changes else []) + \
            ([f"its tokens are {kind}, {changes['family']}'s tokenizer"] if "family" in changes else [])
        say(f"from {cfg.data}'s manifest: {shown}" + (f" ({'; '.join(reasons)})" if reasons else ""))
    return dataclasses.replace(cfg, **changes) if changes else cfg


def _names_a_config(cfg: PretrainConfig) -> bool:
    """Whether the model comes from a config.json or model folder (which says its family) rather than a preset."""
    return cfg.init_from is not None or not is_preset(cfg.model)


def is_preset(name: str) -> bool:
    """Whether `name` is one of the presets (`mini`, `L4-H256`) the pre-trained families share: the default
    family's, which the others take their sizes from."""
    return family_named(DEFAULT_MODEL_TYPE).config_class.preset_lookup()[0](name)


def _other_command(model_type: str) -> str:
    """" (... `bertlab pretrain-t5`)" when another command pre-trains `model_type`'s family, else ""."""
    if model_type not in FAMILIES or (command := pretrain_command(model_type)) in (None, "pretrain"):
        return ""
    return f" ({family_named(model_type).name}: `bertlab {command}`)"


def pretraining_family(cfg: PretrainConfig, info) -> Family:
    """The family to pre-train: `cfg.family` (set from the data by `settings_from_data` when not stated), else the
    model config's `model_type`, else BERT's. It must be one whose tokenizer made the data, and agree with a
    config that names its own."""
    source = cfg.init_from or cfg.model
    # (a path that does not exist is reported by the config reader: "neither a preset ... nor an existing file")
    named = model_type_of(source) if _names_a_config(cfg) and Path(source).exists() else None
    chosen = cfg.family or named or family_training(cfg.objective, info.tokenizer_kind) or DEFAULT_MODEL_TYPE
    if named is not None and named != chosen:
        raise ConfigError(f"{source}: model_type {named!r} but --family {chosen}; give a {chosen} config or preset")
    kinds = data_tokenizers()
    if chosen not in kinds:
        raise ConfigError(f"{source}: model_type {chosen!r} is not pre-trained by this command (it trains "
                          f"{', '.join(kinds)}){_other_command(chosen)}")
    if kinds[chosen] != info.tokenizer_kind:
        fits = next((f for f, k in kinds.items() if k == info.tokenizer_kind), None)
        raise ConfigError(f"{cfg.data}: tokenized with a {info.tokenizer_kind} vocabulary, but {chosen} models use "
                          f"{kinds[chosen]}" + (f"; use --family {fits}" if fits else "")
                          + f", or prepare the data with a {kinds[chosen]} vocabulary")
    return family_named(chosen)


def family_training(objective: str, tokenizer_kind: str) -> str | None:
    """The first family (registry order) on `tokenizer_kind` data that has the head `objective` trains (ELECTRA
    for rtd on WordPiece data); None when the objective names no head kind."""
    head_kind = get_objective(objective).head_kind
    if head_kind is None:
        return None
    return next((f for f, kind in data_tokenizers().items()
                 if kind == tokenizer_kind and head_kind in family_named(f).heads), None)


def build_model_config(cfg: PretrainConfig, info, family: Family | None = None) -> JsonConfig:
    """The model's config in `family` (the default family's when None), checked against the data: same
    vocabulary, long enough positions. A preset takes the data's vocabulary and special ids (pad; a config that
    carries bos/eos ids, as RoBERTa's does, takes the data's first and separator tokens for them)."""
    source = cfg.init_from or cfg.model
    config_class = (family or family_named(DEFAULT_MODEL_TYPE)).config_class
    config = config_class.from_name_or_path(source)
    if cfg.init_from is None and is_preset(cfg.model):  # a preset takes its vocabulary from the data
        # the first and separator tokens' ids, where the config carries them: RoBERTa's <s>, </s> (in `extra`),
        # ModernBERT's [CLS], [SEP] (fields of their own, bos/eos and cls/sep)
        ids = {"bos_token_id": info.cls_id, "eos_token_id": info.sep_id, "cls_token_id": info.cls_id,
               "sep_token_id": info.sep_id}
        own = {k: v for k, v in ids.items() if k in {f.name for f in dataclasses.fields(config)}}
        carried = {k: v for k, v in ids.items() if k not in own and k in config.to_dict()}
        config = config.replace(vocab_size=info.vocab_size, pad_token_id=info.pad_id, **own,
                                extra={**config.extra, **carried})
    elif config.vocab_size != info.vocab_size:
        raise ConfigError(f"{source}: vocab_size {config.vocab_size} but {cfg.data} was tokenized with a "
                          f"{info.vocab_size}-token vocabulary ({info.vocab_file}); prepare the data with "
                          "this model's vocab.txt, or use a preset")
    if cfg.init_from is not None:
        check_same_vocabulary(cfg.init_from, info, family)
    return config


def check_same_vocabulary(model_dir: str | Path, info, family: Family | None = None) -> None:
    """A model folder's vocabulary (vocab.txt or tokenizer.json; BPE: vocab.json and merges.txt, or the family's
    tokenizer.json) must be the one the data was prepared with: equal sizes are not enough, the token ids would
    not match. `family`: the model's (None: the folder's config says)."""
    from ..tokenizer import folder_vocabulary, read_vocab

    if info.tokenizer_kind != "wordpiece":
        family = family or family_of(model_dir)  # byte-level BPE, read by the family's own tokenizer
        from ..tokenizer.roberta import is_bpe_path

        data_tok = family.load_tokenizer(info.vocab_file.parent)
        tok = family.load_tokenizer(model_dir) if is_bpe_path(model_dir) else None
        if tok is not None and (tok.vocab != data_tok.vocab or tok.bpe.merges != data_tok.bpe.merges):
            raise ConfigError(f"{model_dir}: its vocabulary or merges differ from those {info.data_dir} was prepared "
                              f"with ({info.vocab_file.parent}); the token ids would not match")
        return
    tokens = folder_vocabulary(model_dir)
    if tokens is not None and tokens != read_vocab(info.vocab_file):
        raise ConfigError(f"{model_dir}: its vocabulary differs from the one {info.data_dir} was prepared with "
                          f"({info.vocab_file}); the token ids would not match")


def pretraining_loop(cfg, steps: int, run_dir: Path, accum: int, precision: str) -> LoopConfig:
    """The loop settings every pre-training recipe derives the same way from its config: evaluations
    `num_evals` times a run and a checkpoint every tenth of it unless stated, the time budget in seconds."""
    return LoopConfig(max_steps=steps, out_dir=run_dir, grad_accum=accum, precision=precision,
                      max_grad_norm=cfg.max_grad_norm, log_every=cfg.log_every,
                      eval_every=cfg.eval_every or max(1, steps // max(1, cfg.num_evals)),
                      save_every=cfg.save_every or max(1, steps // 10), keep_last=cfg.keep_last,
                      time_budget=parse_duration(cfg.time_budget) if cfg.time_budget else None,
                      seed=cfg.seed, progress=cfg.progress, retain_freed_memory=cfg.retain_freed_memory)


def start_run(config_class: type, cfg, may_change: Collection[str], given: Collection[str] | None,
              echo: Callable[[str], None]):
    """What every pre-training recipe does first (BERT's here, T5's in `t5_pretrain.py`): on resume take the
    run's own settings for what the user did not state again, validate, join the process group and prove the
    run directory writable. Returns (cfg, dist, say, run_dir); `say` prints on the main process only."""
    if cfg.resume and not cfg.out:
        raise ConfigError("pretrain: --resume needs the run directory (--out RUN_DIR)")
    cfg = resolve_resume_config(config_class, cfg, Path(cfg.out) / RUN_CONFIG, may_change, given)
    cfg.validate()
    dist = init_distributed(None if cfg.device == "auto" else cfg.device)
    say = echo if dist.is_main else (lambda s: None)
    run_dir = Path(cfg.out)
    if dist.is_main:
        check_writable(run_dir)
    return cfg, dist, say, run_dir


# ---------------------------------------------------------------------------------------------- the recipe
def run_pretraining(cfg: PretrainConfig, echo: Callable[[str], None] = print,
                    given: Collection[str] | None = None,
                    on_plan: Callable[[int, float], None] | None = None) -> PretrainResult:
    """`given`: the settings the user stated (`runconfig.given_fields`); on resume the others are the run's
    own (see `setup.resolve_resume_config`). `on_plan(steps, seconds_per_step)` is told the plan a time
    budget fitted, before training (the demo says from it what the run will reach)."""
    from ..data import DataInfo, PretrainingDataset

    cfg, dist, say, run_dir = start_run(PretrainConfig, cfg, RESUME_MAY_CHANGE, given, echo)

    # ---- data: every file checked against the manifest, the vocabulary against the model
    lengths = _available_lengths(cfg.data)
    if not cfg.resume:  # a resumed run keeps its own settings (run_config.json), decided at its start
        cfg = settings_from_data(cfg, lengths, stated_fields(cfg, given), say)
    if cfg.max_seq_length not in lengths:
        raise ConfigError(f"{cfg.data}: no instances of length {cfg.max_seq_length} (have {lengths}); make them "
                          f"with `bertlab prepare --out {cfg.data} --max-seq-length {cfg.max_seq_length}`")
    info = DataInfo.load(cfg.data, max_seq_length=cfg.max_seq_length)
    phase2_len = cfg.phase2_max_seq_length
    if phase2_len is None:
        longer = [n for n in lengths if n > cfg.max_seq_length]
        phase2_len = longer[-1] if longer and cfg.phase2_fraction > 0 else 0
    elif phase2_len and phase2_len not in lengths:
        raise ConfigError(f"{cfg.data}: no instances of length {phase2_len} for phase 2 (have {lengths})")
    objective = get_objective(cfg.objective)
    if objective.needs_next_sentence_labels and not info.has_nsp:
        others = [f"--objective {name}" for name, o in OBJECTIVES.items()
                  if not o.needs_next_sentence_labels and not is_text_to_text(o)]
        raise ConfigError(f"{cfg.data}: instances are {info.mode!r}, which has no next-sentence labels for "
                          f"objective {objective.name}; use {' or '.join(others)}, or prepare segment pairs")
    if objective.needs_next_sentence_labels and info.mode not in objective.data_modes:
        fits = [name for name, o in OBJECTIVES.items() if info.mode in o.data_modes]
        raise ConfigError(f"{cfg.data}: instances are {info.mode!r}, whose pair labels are not what objective "
                          f"{objective.name} trains (needs --mode {' or '.join(objective.data_modes)}"
                          + (f"; these fit --objective {' or '.join(fits)})" if fits else ")"))
    resolved = resolved_settings(run_dir) if cfg.resume else {}  # the first session's steps, precision, model
    if resolved.get("model_config"):
        # A resumed run's model is the one it started with (its weights come from the checkpoint): the
        # --init-from folder is not read again, so it may have moved or changed since.
        family = family_named(resolved["model_config"].get("model_type", DEFAULT_MODEL_TYPE))
        model_config = family.config_class.from_dict(resolved["model_config"], source=str(run_dir / RUN_CONFIG))
        if model_config.vocab_size != info.vocab_size:
            raise ConfigError(f"{run_dir / RUN_CONFIG}: the run's model has vocab_size {model_config.vocab_size} "
                              f"but {cfg.data} was tokenized with a {info.vocab_size}-token vocabulary")
    else:
        family = pretraining_family(cfg, info)
        model_config = build_model_config(cfg, info, family)
    for length in (cfg.max_seq_length, phase2_len):  # phase 2's instances are another set, prepared on their own
        problem = length and objective.data_problem(DataInfo.load(cfg.data, max_seq_length=length), model_config)
        if problem:
            raise ConfigError(f"{cfg.data}: {'' if length == cfg.max_seq_length else f'length {length}: '}{problem}")
    if max(cfg.max_seq_length, phase2_len) > model_config.max_sequence_length:
        raise ConfigError(f"sequence length {max(cfg.max_seq_length, phase2_len)} exceeds the model's "
                          f"{model_config.max_sequence_length} positions (max_position_embeddings "
                          f"{model_config.max_position_embeddings})")

    # ---- batch arithmetic: global batch = micro x accumulation x ranks
    micro1, accum = split_batch(cfg.batch_size, cfg.micro_batch_size, dist.world_size)
    micro2, accum2 = split_batch(cfg.phase2_batch_size or cfg.batch_size, cfg.micro_batch_size, dist.world_size)
    if phase2_len and accum2 != accum:
        # The loop has one accumulation count; phase 2 keeps the global batch by its micro-batch size.
        if (cfg.phase2_batch_size or cfg.batch_size) % (accum * dist.world_size):
            raise ConfigError("phase 2 batch size must be divisible by gradient accumulation x ranks")
        micro2 = (cfg.phase2_batch_size or cfg.batch_size) // (accum * dist.world_size)

    # ---- model, on every rank from the same seed (DDP also broadcasts rank 0's weights)
    seed_everything(cfg.seed)
    model_cls = objective.model_class_for(family)
    if cfg.init_from is not None and not resolved:
        model = model_cls.from_pretrained(cfg.init_from)
    else:
        model = model_cls(model_config)
    model.to(dist.device).train()
    loss_fn = objective.loss
    precision = resolved.get("precision") or resolve_precision(cfg.precision, dist.device)
    sharding = resolve_sharding(cfg.sharding, dist.world_size, precision, cfg.fsdp_cpu_offload)
    if sharding == "fsdp":  # before the optimizer: FSDP2 replaces the parameters by their shards
        shard_model(model, precision, cfg.fsdp_cpu_offload)

    def stream(length: int, micro: int, start_sample: int):
        ds = PretrainingDataset(cfg.data, "train", seed=cfg.seed, rank=dist.rank, world_size=dist.world_size,
                                start_index=start_sample, batch_size=micro, max_seq_length=length)
        return ds.dataloader(num_workers=cfg.num_workers, pin_memory=dist.device.type == "cuda",
                             persistent_workers=False, collate_fn=ds.collator(document_attention=cfg.document_attention))

    # Open every split now: a bad data directory is reported before training, not at the first evaluation.
    stream(cfg.max_seq_length, micro1, 0)
    if phase2_len:
        stream(phase2_len, micro2, 0)
    heldout_batches(cfg.data, cfg.max_seq_length, cfg.seed, cfg.eval_batch_size, cfg.eval_batches,
                    cfg.document_attention)

    # ---- run length: given, or fitted to the time budget by timing real steps on this machine
    steps = resolved.get("steps") or cfg.steps
    # --steps with --time-budget: the run's work is the steps, the budget a cap that shortens the plan when
    # this machine cannot do them in time (and re-fits it as the run goes, never past the steps).
    capped = cfg.steps is not None and cfg.time_budget is not None
    if steps is None or (capped and not resolved.get("steps")):
        budget = parse_duration(cfg.time_budget)
        t1 = time_step(model, loss_fn, stream(cfg.max_seq_length, micro1, 0), accum, precision, dist.device)
        t2 = time_step(model, loss_fn, stream(phase2_len, micro2, 0), accum, precision, dist.device) \
            if phase2_len else t1
        f = cfg.phase2_fraction if phase2_len else 0.0
        per_step = (1 - f) * t1 + f * t2
        eval_seqs = heldout_sequences(info.num_instances.get("heldout", 0), cfg.eval_batches, cfg.eval_batch_size)
        eval_s = eval_seconds(eval_seqs, micro1 * accum * dist.world_size, t1)
        fitted = fit_steps_to_budget(budget, per_step, eval_s, cfg.num_evals, cfg.eval_every, dist)
        steps = min(fitted, cfg.steps) if capped else fitted
        say(f"time budget {cfg.time_budget}: {t1:.2f}s per step at length {cfg.max_seq_length}"
            + (f", {t2:.2f}s at {phase2_len}" if phase2_len else "") + f" -> {steps} steps"
            + (f" (of the {cfg.steps} asked for)" if capped and steps < cfg.steps else ""))
        if on_plan is not None:
            on_plan(steps, per_step)
    phase2_start = steps - int(round(cfg.phase2_fraction * steps)) if phase2_len else steps
    samples1 = micro1 * accum * dist.world_size
    samples2 = micro2 * accum * dist.world_size

    def batches(step: int) -> Iterator[dict]:
        # Phase 1 then phase 2; each stream seeks to the sample the step starts at (no replay).
        if not phase2_len:  # one phase, endless: the loop's max_steps (which a budget refit moves) ends it
            yield from stream(cfg.max_seq_length, micro1, step * samples1)
            return
        if step < phase2_start:
            yield from islice(stream(cfg.max_seq_length, micro1, step * samples1), (phase2_start - step) * accum)
            step = phase2_start
        if phase2_len:
            yield from stream(phase2_len, micro2, (step - phase2_start) * samples2)

    # ---- optimisation
    lr = cfg.lr if cfg.lr is not None else pretraining_lr(model_config.hidden_size)
    optimizer = build_optimizer(cfg.optimizer, model, lr, cfg.weight_decay, **cfg.optim.adam_settings)
    warmup = cfg.warmup if cfg.warmup < 1 else int(cfg.warmup)
    # A budgeted run re-fits its plan as it goes (train/budget.py), so the decay ends at the budget
    # whatever the machine's speed does; with a phase 2 the switch step is fixed, so the first fit rules.
    budget_s = parse_duration(cfg.time_budget) if cfg.time_budget else None
    refitting = budget_s is not None and not phase2_len and dist.world_size == 1
    if refitting:
        scheduler = BudgetScheduler(optimizer, warmup_steps(warmup, steps), steps, budget_s,
                                    decay_fraction=cfg.decay_fraction, most_steps=cfg.steps)
    elif cfg.decay_fraction < 1:
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, RefittedLinearDecay(warmup_steps(warmup, steps), steps, cfg.decay_fraction))
    else:
        scheduler = linear_warmup_decay(optimizer, warmup, steps)

    # ---- evaluation on the held-out split (at phase 1 length, so numbers compare across the run)
    def evaluate(m: torch.nn.Module) -> dict[str, float]:
        batches = heldout_batches(cfg.data, cfg.max_seq_length, cfg.seed, cfg.eval_batch_size, cfg.eval_batches,
                                  cfg.document_attention)
        return evaluate_pretraining(m, batches, dist.device, objective)

    loop = pretraining_loop(cfg, steps, run_dir, accum, precision)
    trainer = Trainer(model, optimizer, scheduler, loss_fn, batches, loop, evaluate=evaluate,
                      extra_state={"run_config": dataclasses.asdict(cfg)})
    if refitting:
        scheduler.attach(clock=lambda: trainer.elapsed, loop_config=loop,
                         on_refit=lambda old, new, at: log.debug("step %d: plan refitted, %d -> %d steps", at, old, new))

    resume_or_refuse(trainer, cfg, run_dir, dist, say)
    if dist.is_main:
        write_run_config(run_dir, run_record(cfg, {
            "steps": steps, "phase2_max_seq_length": phase2_len, "phase2_start": phase2_start, "precision": precision,
            "lr": lr, "grad_accum": accum, "micro_batch_size": micro1, "world_size": dist.world_size,
            "sharding": sharding,
            "model_config": model_config.to_dict()}))

    say(f"pre-training {model_cls.__name__} ({model.num_parameters() / 1e6:.1f}M parameters) on {cfg.data}: "
        f"{steps} steps x {cfg.batch_size} sequences of {cfg.max_seq_length}"
        + (f" (last {steps - phase2_start} at {phase2_len})" if phase2_len else "")
        + f", peak lr {lr:g}{'' if cfg.lr is not None else ' (the default for its width)'}, {precision}, "
        f"{dist.world_size} process(es)" + (f" ({sharding})" if dist.world_size > 1 else "")
        + f", grad accumulation {accum}")

    eval_before: dict[str, float] = {}
    if cfg.eval_at_start and not cfg.resume:
        eval_before = trainer.run_evaluation()
    result = trainer.fit()  # continues from the loaded checkpoint, if any
    if dist.is_main and budget_s is not None:
        say(budget_outcome(result, budget_s, steps, scheduler))

    final_dir = None
    if result.stopped in ("max_steps", "time_budget", "data_exhausted"):
        # A sharded model is gathered whole on rank 0 first: the export is the usual single folder.
        whole = unsharded_copy(model, lambda: model_cls(model_config)) if sharding == "fsdp" else model
        if dist.is_main:
            final_dir = export_final(whole, run_dir / FINAL_DIR, info)
            say(f"saved the model in Hugging Face layout to {final_dir}")
    if dist.world_size > 1:
        torch.distributed.barrier()
    return PretrainResult(run_dir, final_dir, result, eval_before, result.eval_metrics, cfg)


def resume_or_refuse(trainer: Trainer, cfg, run_dir: Path, dist, say: Callable[[str], None]) -> None:
    """`cfg.resume`: load the run's latest checkpoint into `trainer` (a corrupt one is reported here, before any
    step) and apply a new lr / weight decay / clipping stated again; otherwise refuse a RUN_DIR that already
    holds checkpoints. Shared by the pre-training recipes (BERT's here, T5's in `t5_pretrain.py`)."""
    if cfg.resume:
        resume_from = latest_checkpoint(run_dir)
        if resume_from is None:
            raise BertlabError(f"{run_dir}: no checkpoint to resume from")
        trainer.load_checkpoint(resume_from)
        changes = trainer.change_optimization(lr=cfg.lr, weight_decay=cfg.weight_decay,
                                              max_grad_norm=cfg.max_grad_norm)
        if changes:
            say(f"resuming {resume_from.name} with " + ", ".join(changes))
    elif dist.is_main and latest_checkpoint(run_dir) is not None:
        raise BertlabError(f"{run_dir}: already holds checkpoints; pass --resume to continue it, or choose "
                           "another --out")


def warmup_steps(warmup: float | int, total: int) -> int:
    """`warmup` as `linear_warmup_decay` reads it: < 1 a fraction of `total` (rounded up), else a count."""
    return int(math.ceil(warmup * total)) if isinstance(warmup, float) and warmup < 1 else int(warmup)


def budget_outcome(result: TrainResult, budget_s: float, first_plan: int, scheduler) -> str:
    """One line on how a budgeted run ended: the plan completed, or the budget cut it short, and where the
    learning rate was then; and, when the machine slowed it down, that it did a fraction of its usual steps."""
    from ..core.progress import format_duration

    planned = getattr(scheduler, "total_steps", first_plan)
    refits = getattr(scheduler, "refits", 0)
    refitted = f"; plan refitted {refits} times, {first_plan} -> {planned} steps" if refits else ""
    budget_text = format_duration(budget_s)
    short = shortfall(result, first_plan)
    short = f". {short}" if short else ""
    lr_left = scheduler.lr_lambdas[0](result.step)  # T5's inverse-sqrt schedule is still at its peak here
    lr_text = "learning rate decayed to 0" if lr_left < 1e-6 else f"the learning rate at {lr_left:.0%} of its peak"
    if result.stopped == "time_budget":
        return (f"the time budget ({budget_text}) ended the run at step {result.step} of {planned} planned, with "
                f"{lr_text}{refitted}{short}")
    if result.stopped == "max_steps":
        return (f"the step plan ended the run: {result.step} steps in {format_duration(result.elapsed)} of the "
                f"{budget_text} budget, {lr_text}{refitted}{short}")
    return f"the run stopped ({result.stopped}) at step {result.step} of {planned}, {format_duration(result.elapsed)} " \
           f"into the {budget_text} budget{short}"


SHORT_RUN = 0.5  # a budgeted run that did under half the steps its first timing promised fell short


def shortfall(result: TrainResult, first_plan: int) -> str | None:
    """What a budgeted run that the machine slowed down must say instead of looking like a normal one: it ran
    several times slower than its first steps promised (`TrainResult.slowdown`), or did under SHORT_RUN of
    the steps its first timing planned. None for a run that went as planned."""
    if result.slowdown >= SLOWDOWN_WARNING:
        return (f"WARNING: the run went {result.slowdown:.1f}x slower than its first steps promised, so it did about "
                f"1/{result.slowdown:.0f} of the steps this budget gets on a free machine and learned less; other "
                "work was likely using the CPU (run it alone, or with --threads 1 beside other work)")
    if result.stopped in ("time_budget", "max_steps") and result.step < SHORT_RUN * first_plan:
        return (f"WARNING: the run did {result.step} of the {first_plan} steps its first timing promised and learned "
                "less than this budget allows; other work was likely using the CPU (run it alone, or with "
                "--threads 1 beside other work)")
    return None


def export_final(model: torch.nn.Module, path: Path, info) -> Path:
    """config.json + model.safetensors + vocab.txt + tokenizer_config.json (byte-level BPE data: the files the
    model family's tokenizer saves -- vocab.json + merges.txt + tokenizer_config.json as RoBERTa's folders hold
    them, ModernBERT's tokenizer.json), in one atomic write."""
    from ..tokenizer import BertTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        if info.tokenizer_kind != "wordpiece":
            family = family_named(model.config.to_dict().get("model_type", DEFAULT_MODEL_TYPE))
            family.load_tokenizer(info.vocab_file.parent).save_pretrained(tmp)
            vocab_file = None
        else:
            BertTokenizer(str(info.vocab_file), do_lower_case=info.do_lower_case).save_pretrained(tmp)
            vocab_file = info.vocab_file
        names = ("tokenizer_config.json",) if vocab_file is not None else \
            tuple(sorted(p.name for p in Path(tmp).iterdir()))
        tokenizer_files = {name: (Path(tmp) / name).read_text(encoding="utf-8") for name in names}
    model.eval()
    # A model pre-trained as several (ELECTRA's generator beside its discriminator) saves each as the model it is
    # used as, the others in sub-folders, written first: the folder's own atomic write carries them over.
    parts = model.exported_parts() if hasattr(model, "exported_parts") else {"": model}
    for sub in sorted(parts, key=lambda name: name == ""):
        save_pretrained(parts[sub], path / sub if sub else path, vocab_file=vocab_file, extra_files=tokenizer_files)
    return path
