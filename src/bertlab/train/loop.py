"""The one training loop. Pre-training, fine-tuning and distillation all run through `Trainer`.

The trainer knows nothing about BERT. A recipe gives it

  model                         any `nn.Module`, already on its device: the module the optimizer updates
                                   (under torchrun a model sharded by `fsdp.shard_model` -- FSDP2 -- before its
                                   optimizer was built trains sharded; any other is wrapped in DDP)
  optimizer, scheduler          any torch optimizer / LR scheduler (`bertlab.train.optim` builds BERT's)
  loss_fn(model, batch)         -> (loss, metrics): the scalar loss of one micro-batch (a mean), and a dict
                                   of numbers / 0-d tensors to log, averaged over micro-batches and ranks
  batches(step)                 -> an iterable of this rank's micro-batches starting at optimizer step
                                   `step` (it yields `grad_accum` micro-batches per step). Resume calls it
                                   with the step to continue from, so it must seek there, not replay.
                                   Endless (epoch after epoch) or ending at the same step on every rank;
                                   when it ends, training ends (`stopped == "data_exhausted"`)
  evaluate(model)               -> metrics, optional; run on rank 0, in eval mode, without gradients
  LoopConfig                    steps, accumulation, precision, clipping, logging and checkpoint cadence

and the trainer does the rest: gradient accumulation, bf16 autocast (CPU/CUDA) or fp16 with loss scaling
(meant for CUDA; it runs on CPU too, slowly), clipping, DistributedDataParallel or FSDP2 under `torchrun` (only
rank 0 logs and writes), a tqdm bar on a terminal and progress lines in a log file,
`metrics.jsonl` (+ TensorBoard when installed), atomic checkpoints every `save_every` steps and on
SIGINT/SIGTERM, keep-last-K, exact resume, and a stop with a clear message when the loss turns NaN/inf.

Example -- fine-tuning a classifier (distillation is the same with a teacher captured by `loss_fn`):

    from bertlab.train import (LoopConfig, Trainer, adamw, init_distributed, linear_warmup_decay,
                               shuffled_batches)

    dist = init_distributed()                                   # rank/world size from torchrun, or 1 process
    model = BertForSequenceClassification.from_pretrained(path).to(dist.device)
    optimizer = adamw(model, lr=2e-5)                           # no decay on biases/LayerNorm, eps 1e-6
    scheduler = linear_warmup_decay(optimizer, warmup_steps=100, total_steps=1000)

    def loss_fn(model, batch):
        out = model(**batch)
        return out.loss, {"acc": (out.logits.argmax(-1) == batch["labels"]).float().mean()}

    def batches(step):                                          # epoch after epoch, seekable to `step`
        return shuffled_batches(train_set, batch_size=32, collate_fn=collate, seed=0,
                                start=step * 1, rank=dist.rank, world_size=dist.world_size)

    trainer = Trainer(model, optimizer, scheduler, loss_fn, batches,
                      LoopConfig(out_dir="runs/x", max_steps=1000, precision="bf16", eval_every=200),
                      evaluate=lambda m: {"accuracy": accuracy(m, dev_set)})
    result = trainer.fit(resume=False)                          # resume=True continues from the last checkpoint

Checkpoints live in `out_dir/checkpoints/step-NNNNNNNN/` (`state.pt` + a readable `meta.json`): model,
optimizer, scheduler, grad scaler, every random generator of every rank (python, numpy, torch, cuda) and
the data position (the step: `batches(step)` seeks there). Resuming from one gives, on CPU, final weights
bitwise equal to those of a run that was never interrupted. A sharded model's checkpoint holds its weights and
optimizer state as every process's shards (`shards/`, torch.distributed.checkpoint) beside `state.pt`; any number
of processes resumes from it, sharded or not. Exporting the final model in a published
format is the recipe's job; the trainer only keeps the training state.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import signal
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist
from torch import nn

from ..core.fsio import atomic_directory, remove_stale_temporaries
from ..core.errors import BertlabError, CheckpointError, ConfigError, output_error
from ..nn.precision import DTYPES
from ..core.host_memory import retain_freed_memory, trim_heap
from .batches import Batch, count_tokens, to_device
from .distributed import _current_dist, get_rng_state, isolated_rng, seed_everything, set_rng_state
from .fsdp import (compute_device, is_fully_sharded, load_sharded_state, save_sharded_state, set_gradient_sync,
                   weights_finite)
from .run_dir import (CHECKPOINT_DIR, DIVERGED_PREFIX, META_FILE, METRICS_FILE, SHARDS_DIR, STATE_FILE, STATE_FORMAT,
                      _jsonable, check_writable, checkpoint_dirs, checkpoint_step, latest_checkpoint, read_checkpoint,
                      weights_are_finite)
from .run_record import autocast_dtype, check_precision

log = logging.getLogger(__name__)

LossFn = Callable[[nn.Module, Batch], "tuple[torch.Tensor, Mapping[str, Any]]"]



class NonFiniteLossError(BertlabError):
    """The loss became NaN or infinite: the run stops instead of writing garbage weights."""


# ---------------------------------------------------------------------------------------------- configuration
@dataclass
class LoopConfig:
    """How to run the loop; what is being trained is the recipe's business."""

    max_steps: int  # optimizer steps (each `grad_accum` micro-batches on every rank)
    out_dir: str | os.PathLike | None = None  # checkpoints + metrics.jsonl; None: keep nothing on disk
    grad_accum: int = 1  # micro-batches per optimizer step: global batch = micro x grad_accum x world size
    precision: str = "fp32"  # fp32 | bf16 (autocast, CPU or CUDA) | fp16 (autocast + GradScaler; for CUDA)
    max_grad_norm: float | None = 1.0  # clip the global gradient norm (BERT: 1.0); None: no clipping
    log_every: int = 1  # metrics.jsonl / TensorBoard line every N steps
    eval_every: int | None = None  # call `evaluate` every N steps (and after the last one)
    save_every: int | None = None  # checkpoint every N steps (and after the last one, and on SIGINT/SIGTERM)
    keep_last: int = 3  # checkpoints kept on disk; older ones are deleted once a newer one is complete
    time_budget: float | None = None  # seconds of training (summed over resumes) after which the run stops
    seed: int | None = None  # seeds python/numpy/torch (+ rank) at the start of a fresh run; None: leave as is
    progress: bool = True  # tqdm bar on rank 0
    tensorboard: bool = True  # event files in out_dir/tensorboard when `tensorboard` is installed
    find_unused_parameters: bool = False  # DDP: set when some parameters get no gradient (e.g. a frozen head)
    handle_signals: bool = True  # SIGINT/SIGTERM -> checkpoint at the end of the current step, then stop
    retain_freed_memory: bool = True  # CPU: keep freed tensor memory in the process (see `host_memory`)

    def __post_init__(self) -> None:
        check_precision(self.precision, DTYPES)  # resolved: `auto` was decided by the recipe
        for name in ("max_steps", "grad_accum", "log_every", "keep_last"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < (0 if name == "max_steps" else 1):
                raise ConfigError(f"loop config: {name} must be a positive integer, got {value!r}")
        for name in ("eval_every", "save_every"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"loop config: {name} must be a positive integer or None, got {value!r}")


@dataclass
class TrainResult:
    step: int  # optimizer steps done (over all sessions of this run)
    stopped: str  # "max_steps" | "time_budget" | "signal" | "data_exhausted"
    checkpoint: Path | None  # the last checkpoint written, if any
    metrics: dict[str, float] = field(default_factory=dict)  # the last step's training metrics
    eval_metrics: dict[str, float] = field(default_factory=dict)  # the last evaluation
    tokens: int = 0  # tokens seen, all ranks, all sessions
    elapsed: float = 0.0  # seconds of training, all sessions
    signal: int | None = None  # the signal that stopped the run (SIGINT, SIGTERM), when one did
    pace: dict[str, float] = field(default_factory=dict)  # tokens/s promised by the first steps vs done (`Pace`)

    @property
    def slowdown(self) -> float:
        """How many times slower the run went than its first steps promised (1.0: as promised or unknown)."""
        return self.pace.get("slowdown", 1.0)

    @property
    def interrupted(self) -> bool:
        return self.stopped == "signal"

    @property
    def exit_status(self) -> int:
        """The shell's convention for a run a signal stopped: 128 + the signal (130 Ctrl-C, 143 SIGTERM)."""
        return 128 + (self.signal or signal.SIGINT) if self.interrupted else 0


# ---------------------------------------------------------------------------------------------- pace
SLOWDOWN_WARNING = 3.0  # a run this many times slower than its first steps promised says so (once)
PACE_FIRST_STEPS = 10  # steps whose median tokens/s is the promise (after the first, which pays one-off costs)
PACE_WINDOW = 20  # steps of each later comparison (a median: a slow batch or a checkpoint write is no slowdown)


class Pace:
    """Training speed against what the first steps of the session promised. A machine that gets busy (another
    job starts) can make a run several times slower; a budgeted run then does a fraction of its usual steps and
    learns less, and it must say so rather than look like a normal run. Tokens/s, not step time: length-grouped
    batches differ in length by design."""

    def __init__(self) -> None:
        self.first: list[float] = []
        self.window: collections.deque[float] = collections.deque(maxlen=PACE_WINDOW)
        self.promised: float | None = None
        self.slowest = 1.0  # the largest windowed slowdown seen
        self.seen = 0
        self.tokens = 0
        self.seconds = 0.0

    def update(self, tokens: int, seconds: float) -> float | None:
        """One step; returns the slowdown when it first reaches SLOWDOWN_WARNING, else None."""
        self.seen += 1
        if self.seen == 1 or tokens <= 0 or seconds <= 0:
            return None
        rate = tokens / seconds
        if self.promised is None:
            self.first.append(rate)
            if len(self.first) == PACE_FIRST_STEPS:
                self.promised = statistics.median(self.first)
            return None
        self.tokens += tokens
        self.seconds += seconds
        self.window.append(rate)
        if len(self.window) < PACE_WINDOW:
            return None
        slowdown = self.promised / max(statistics.median(self.window), 1e-9)
        warn = slowdown >= SLOWDOWN_WARNING > self.slowest
        self.slowest = max(self.slowest, slowdown)
        return slowdown if warn else None

    def report(self) -> dict[str, float]:
        """Promised and achieved tokens/s after the first steps, and their ratio; {} before there is one."""
        if self.promised is None or not self.seconds:
            return {}
        done = self.tokens / self.seconds
        return {"promised_tokens_per_s": round(self.promised, 1), "tokens_per_s": round(done, 1),
                "slowdown": round(self.promised / max(done, 1e-9), 2)}


def slowdown_warning(step: int, slowdown: float, promised: float) -> str:
    return (f"step {step}: training runs {slowdown:.1f}x slower than its first steps promised ({promised / slowdown:,.0f} "
            f"vs {promised:,.0f} tokens/s) -- other work is likely using the CPU ({torch.get_num_threads()} threads "
            "here). A run with a time budget will do fewer steps and learn less; --threads 1 or a quieter machine helps")


# ---------------------------------------------------------------------------------------------- the trainer
class Trainer:
    """See the module docstring. `fit()` runs the loop; `save_checkpoint` / `load_checkpoint` are public
    for recipes that need them (e.g. to checkpoint before a risky phase change)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                 loss_fn: LossFn, batches: Callable[[int], Iterable[Batch]], config: LoopConfig, *,
                 evaluate: Callable[[nn.Module], Mapping[str, Any]] | None = None,
                 token_counter: Callable[[Batch], int] = count_tokens,
                 extra_state: dict[str, Any] | None = None):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.loss_fn, self.batches, self.config = loss_fn, batches, config
        self.evaluate_fn, self.token_counter = evaluate, token_counter
        self.extra_state = dict(extra_state or {})  # saved with every checkpoint (e.g. the run config)

        # A model sharded by `fsdp.shard_model` (FSDP2) before its optimizer was built trains as it is: FSDP
        # gathers its weights and reduces its gradients; checkpoints are each process's shards (DCP).
        self.sharded = is_fully_sharded(model)
        self.device = compute_device(model) if self.sharded else next(model.parameters()).device
        self.dist = _current_dist(self.device)
        if self.sharded and config.precision == "fp16":
            raise ConfigError("a sharded (FSDP) model trains in fp32 or bf16; fp16's loss scaling is not wired to "
                              "sharded gradients")
        if config.precision == "fp16" and not hasattr(torch.amp, "GradScaler"):
            raise ConfigError("precision fp16 needs torch >= 2.3 (its device-generic loss scaler); use bf16")
        if config.precision == "fp16" and self.device.type != "cuda":
            # fp16 is a GPU format; on a CPU it is slow except with AMX-FP16, and bf16 needs no scaling. It is
            # allowed so the loss-scaling path runs where the tests run.
            log.warning("precision fp16 on %s: loss scaling works, but bf16 is the faster choice here",
                        self.device.type)
        if config.precision == "bf16" and self.device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ConfigError("precision bf16 is not supported by this GPU; use fp16")
        self.out_dir = Path(config.out_dir) if config.out_dir is not None else None
        if self.out_dir is not None and self.dist.is_main:
            check_writable(self.out_dir)
            # A save killed half-way (kill -9, power loss) left a temporary folder of a checkpoint's size.
            remove_stale_temporaries(self.out_dir / CHECKPOINT_DIR)

        # DDP averages gradients across ranks in backward; one process trains the bare module.
        self.wrapped: nn.Module = model
        if self.dist.world_size > 1 and not self.sharded:
            self.wrapped = nn.parallel.DistributedDataParallel(
                model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=config.find_unused_parameters)
        # fp16's narrow range underflows small gradients: scale the loss up, unscale before clipping, skip a
        # step whose gradients overflowed and lower the scale (Micikevicius et al., 2018).
        self.scaler = torch.amp.GradScaler(self.device.type) if config.precision == "fp16" else None
        self.autocast_dtype = autocast_dtype(config.precision)

        # Progress, restored by load_checkpoint.
        self.step = 0
        self.tokens = 0
        self.elapsed = 0.0
        self.last_checkpoint: Path | None = None
        self.last_eval: dict[str, float] = {}
        self._resumed = False
        # The tensor shapes of the last step's batches: a step of other shapes hands free heap pages back
        # (`_bound_heap`).
        self._last_shapes: tuple | None = None
        self._stop_signal: int | None = None
        self.stopping = False  # a signal reached some process: this step is the last (the same on every rank)
        self._metrics_file = None
        self._tb = None

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The training state; a sharded model's weights and optimizer state are not in it (see `save_checkpoint`)."""
        return {
            "format": STATE_FORMAT,
            "step": self.step,
            "data_position": {"step": self.step, "micro_batches_per_rank": self.step * self.config.grad_accum},
            "tokens": self.tokens,
            "elapsed": self.elapsed,
            "world_size": self.dist.world_size,
            "model": None if self.sharded else self.model.state_dict(),
            "optimizer": None if self.sharded else self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "loop_config": {k: _jsonable(v) for k, v in dataclasses.asdict(self.config).items()},
            "last_eval": self.last_eval,
            "extra": self.extra_state,
        }

    def save_checkpoint(self) -> Path | None:
        """Write `out_dir/checkpoints/step-N` atomically (rank 0), then drop checkpoints beyond `keep_last`."""
        rng = get_rng_state()
        if self.dist.world_size > 1:  # every rank's generators, so each rank resumes its own dropout stream
            all_rng: list[Any] = [None] * self.dist.world_size
            torch_dist.all_gather_object(all_rng, rng)
        else:
            all_rng = [rng]
        if self.out_dir is None:
            return None
        path = self.out_dir / CHECKPOINT_DIR / f"step-{self.step:08d}"  # every rank knows the name
        if self.sharded:
            self._save_sharded(path, all_rng)
        elif self.dist.is_main:
            try:
                with atomic_directory(path, keep_existing=False) as tmp:
                    self._write_state(tmp, all_rng)
            except BertlabError as e:
                raise type(e)(f"{e}; the previous checkpoints are intact") from None
        if self.dist.is_main:
            # Retention: of this run's checkpoints up to this step, the last `keep_last` stay. A later one (a
            # run resumed from an earlier checkpoint) is not this policy's to delete.
            done = [d for d in checkpoint_dirs(self.out_dir) if checkpoint_step(d) <= self.step]
            for old in done[:-self.config.keep_last]:
                shutil.rmtree(old, ignore_errors=True)
        if self.dist.world_size > 1:
            torch_dist.barrier()  # no rank runs ahead of a checkpoint that is still being written
        self.last_checkpoint = path
        return path

    def _write_state(self, folder: Path, all_rng: list[Any], **extra: Any) -> None:
        state = {**self.state_dict(), "rng": all_rng, **extra}
        meta = {"step": self.step, "tokens": self.tokens, "elapsed": round(self.elapsed, 3),
                "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "last_eval": self.last_eval}
        # Through a Python file: a failed write then carries its OSError (ENOSPC: "disk full"), where torch's own
        # file writer only says "unexpected pos".
        with open(folder / STATE_FILE, "wb") as f:
            torch.save(state, f)
        (folder / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")

    def _save_sharded(self, path: Path, all_rng: list[Any]) -> None:
        """A sharded model's checkpoint: every process writes its shards (DCP) into the temporary folder rank 0
        opened, rank 0 the rest of the state, and only then is the folder renamed into place -- a run killed
        mid-write leaves the previous checkpoints and no half-written one. (Several nodes: `out_dir` must be a
        file system they share.)"""
        finite = weights_finite(self.model)  # collective: every shard checked
        stack = contextlib.ExitStack()
        where: list[str | None] = [None]
        failure: BertlabError | None = None
        if self.dist.is_main:
            try:
                where[0] = str(stack.enter_context(atomic_directory(path, keep_existing=False)))
            except BertlabError as e:
                failure = e
        torch_dist.broadcast_object_list(where, src=0)
        if where[0] is None:
            raise type(failure or CheckpointError)(f"{failure or f'{path}: rank 0 could not start the write'}; the "
                                                   "previous checkpoints are intact")
        try:
            with stack:  # rank 0: renamed into place on success, removed on any failure
                save_sharded_state(self.model, self.optimizer, Path(where[0]) / SHARDS_DIR)
                if self.dist.is_main:
                    self._write_state(Path(where[0]), all_rng, sharded=SHARDS_DIR, weights_finite=finite)
        except BertlabError as e:
            raise type(e)(f"{e}; the previous checkpoints are intact") from None

    def load_checkpoint(self, path: str | os.PathLike) -> None:
        """Restore everything `save_checkpoint` wrote; the next `fit()` continues from its step. A sharded
        checkpoint (FSDP's) is read by any number of processes, sharded or not; a whole one by an unsharded model."""
        state = read_checkpoint(path)
        sharded = state.get("sharded")
        if not (state.get("weights_finite", True) if sharded else weights_are_finite(state["model"])):
            raise CheckpointError(f"{path}: holds NaN/inf weights (the run had diverged); move it aside to "
                                  "resume from the one before")
        if self.sharded and not sharded:
            raise CheckpointError(f"{path}: holds the whole model (a run without --sharding fsdp); resume it as it "
                                  "ran (--sharding ddp or none)")
        try:
            if sharded:
                load_sharded_state(self.model, self.optimizer, Path(path) / sharded)
            else:
                self.model.load_state_dict(state["model"])
                self.optimizer.load_state_dict(state["optimizer"])
            if self.scheduler is not None and state["scheduler"] is not None:
                self.scheduler.load_state_dict(state["scheduler"])
            if self.scaler is not None and state["scaler"] is not None:
                self.scaler.load_state_dict(state["scaler"])
        except (RuntimeError, KeyError, ValueError) as e:
            raise CheckpointError(f"{path}: checkpoint does not fit this model/optimizer "
                                  f"({str(e).splitlines()[0]})") from None
        self.step, self.tokens, self.elapsed = state["step"], state["tokens"], state["elapsed"]
        self.last_eval = state.get("last_eval") or {}
        rngs = state["rng"]
        if state["world_size"] == self.dist.world_size:
            set_rng_state(rngs[self.dist.rank])
        else:  # a different number of ranks: data stays exact (it seeks by step), dropout cannot
            log.warning("%s: saved with %d ranks, resuming with %d: random state re-seeded, resume is not "
                        "bitwise exact", path, state["world_size"], self.dist.world_size)
            set_rng_state(rngs[0])
            torch.manual_seed(int(torch.randint(0, 2**31, ())) + self.dist.rank)
        self.last_checkpoint = Path(path)
        self._resumed = True

    def change_optimization(self, lr: float | None = None, weight_decay: float | None = None,
                            max_grad_norm: float | None = None) -> list[str]:
        """After `load_checkpoint`: give the run a new peak learning rate, weight decay or clipping norm from
        here on (None: keep the checkpoint's). The schedule keeps its shape and position; layer-wise scales
        stay. Returns what changed ("lr 1e+10 -> 0.0001"), [] when nothing did -- and then nothing was
        touched, so an unchanged resume stays bitwise exact."""
        changed = []
        groups = self.optimizer.param_groups
        has_base = self.scheduler is not None and hasattr(self.scheduler, "base_lrs")
        if lr is not None:
            first = groups[0]
            peak = (self.scheduler.base_lrs[0] if has_base else first.get("initial_lr", first["lr"])) \
                / first.get("lr_scale", 1.0)
            if not math.isclose(lr, peak, rel_tol=1e-9):
                ratio = lr / peak
                for i, g in enumerate(groups):
                    g["lr"] *= ratio
                    if "initial_lr" in g:
                        g["initial_lr"] *= ratio
                    if has_base:
                        self.scheduler.base_lrs[i] *= ratio
                if hasattr(self.scheduler, "_last_lr"):
                    self.scheduler._last_lr = [g["lr"] for g in groups]
                changed.append(f"lr {peak:g} -> {lr:g}")
        if weight_decay is not None:
            decayed = [g for g in groups if g.get("weight_decay", 0.0) > 0] or groups
            old = decayed[0].get("weight_decay", 0.0)
            if not math.isclose(weight_decay, old, rel_tol=1e-9):
                for g in decayed:
                    g["weight_decay"] = weight_decay
                changed.append(f"weight_decay {old:g} -> {weight_decay:g}")
        if max_grad_norm is not None and max_grad_norm != self.config.max_grad_norm:
            changed.append(f"max_grad_norm {self.config.max_grad_norm} -> {max_grad_norm:g}")
            self.config.max_grad_norm = max_grad_norm
        return changed

    # ------------------------------------------------------------------ the loop
    def fit(self, resume: bool | str | os.PathLike = False) -> TrainResult:
        """Train until `max_steps`, the time budget, the end of the data or a signal; return what happened.

        `resume=True` continues from the latest checkpoint in `out_dir` (an error when there is none);
        a path continues from that checkpoint.
        """
        cfg = self.config
        if resume:
            path = latest_checkpoint(self.out_dir) if resume is True and self.out_dir is not None else None
            if resume is not True:
                path = Path(resume)
            if path is None:
                raise CheckpointError(f"{self.out_dir}: no checkpoint to resume from")
            self.load_checkpoint(path)
            log.info("resuming from %s (step %d)", path, self.step)
        elif cfg.seed is not None and not self._resumed:
            seed_everything(cfg.seed + self.dist.rank)  # ranks draw different dropout masks
        if cfg.retain_freed_memory and self.device.type == "cpu":
            retain_freed_memory()  # process-wide, once: big per-step buffers are reused, not paged in anew
        self._open_logs()
        previous_handlers = self._install_signal_handlers()
        try:
            return self._run()
        finally:
            self._restore_signal_handlers(previous_handlers)
            self._close_logs()

    def _run(self) -> TrainResult:
        cfg, dist = self.config, self.dist
        self.model.train()
        with isolated_rng():
            data = iter(self.batches(self.step))
        bar = self._progress_bar()
        metrics: dict[str, float] = {}
        stopped = "max_steps"
        tokens_per_s = None
        pace = Pace()
        session_start = time.perf_counter() - self.elapsed
        step_start = time.perf_counter()
        while self.step < cfg.max_steps:
            # ---- one optimizer step: grad_accum micro-batches, gradients synchronised on the last one
            sums: torch.Tensor | None = None
            names: list[str] = []
            micro_batches: list[Batch] = []
            tokens = 0
            exhausted = False
            for micro in range(cfg.grad_accum):
                try:
                    with isolated_rng():
                        batch = next(data)
                except StopIteration:
                    exhausted = True
                    break
                micro_batches.append(batch)
                tokens += self.token_counter(batch)
                batch = to_device(batch, self.device)
                sync = micro == cfg.grad_accum - 1 or not isinstance(self.wrapped, nn.parallel.DistributedDataParallel)
                if self.sharded:  # FSDP: reduce-scatter on the step's last micro-batch only
                    set_gradient_sync(self.wrapped, micro == cfg.grad_accum - 1)
                with (contextlib.nullcontext() if sync else self.wrapped.no_sync()):
                    with torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float32,
                                        enabled=self.autocast_dtype is not None):
                        loss, extra = self.loss_fn(self.wrapped, batch)
                    scaled = loss / cfg.grad_accum  # the step's gradient is the mean over its micro-batches
                    (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
                names = ["loss", *extra]
                values = torch.stack([loss.detach().float(), *(torch.as_tensor(v, dtype=torch.float32,
                                      device=self.device).detach().reshape(()) for v in extra.values())])
                sums = values if sums is None else sums + values
            if exhausted:
                # A partial step would differ from every other; drop its gradients and end here.
                self.optimizer.zero_grad(set_to_none=True)
                stopped = "data_exhausted"
                log.warning("the data ran out at step %d of %d", self.step, cfg.max_steps)
                break

            # ---- one small all-reduce carries loss, metrics, token count and the stop flag for all ranks
            stop_flag = float(self._stop_signal is not None)
            packed = torch.cat([sums, torch.tensor([float(tokens), stop_flag], device=self.device)])
            if dist.world_size > 1:
                torch_dist.all_reduce(packed)
            values = packed.tolist()  # the one host sync per step
            n = cfg.grad_accum * dist.world_size
            metrics = {name: v / n for name, v in zip(names, values[:len(names)])}
            step_tokens, stop_requested = int(values[-2]), values[-1] > 0
            self.stopping = stop_requested
            if not math.isfinite(metrics["loss"]):
                self._fail_non_finite(metrics["loss"], micro_batches)

            # ---- update
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
            grad_norm = None
            if cfg.max_grad_norm is not None:
                grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm, foreach=True)
                if hasattr(grad_norm, "full_tensor"):  # sharded gradients: the norm over all shards
                    grad_norm = grad_norm.full_tensor()
            if self.scaler is not None:
                self.scaler.step(self.optimizer)  # skipped when gradients overflowed; the scale then drops
                self.scaler.update()
            else:
                self.optimizer.step()
            lr = self.optimizer.param_groups[0]["lr"]
            if self.scheduler is not None:
                self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self._bound_heap(micro_batches)
            self.step += 1
            self.tokens += step_tokens

            # ---- visibility
            now = time.perf_counter()
            step_time, step_start = now - step_start, now
            self.elapsed = now - session_start
            rate = step_tokens / max(step_time, 1e-9)
            tokens_per_s = rate if tokens_per_s is None else 0.9 * tokens_per_s + 0.1 * rate
            metrics.update(lr=lr, tokens_per_s=rate, step_time=step_time)
            slowdown = pace.update(step_tokens, step_time)
            if slowdown is not None and dist.is_main:
                log.warning("%s", slowdown_warning(self.step, slowdown, pace.promised))
            if grad_norm is not None and self.step % cfg.log_every == 0:
                metrics["grad_norm"] = float(grad_norm)
            if self.step % cfg.log_every == 0 or self.step == cfg.max_steps:
                self._log({"step": self.step, "tokens": self.tokens, "elapsed": round(self.elapsed, 3), **metrics})
            if bar is not None:
                if bar.total != cfg.max_steps:  # the recipe re-fitted its plan to a time budget
                    bar.set_total(cfg.max_steps)
                bar.set_postfix(loss=f"{metrics['loss']:.4f}", tok_s=f"{tokens_per_s:,.0f}", lr=f"{lr:.2e}",
                                refresh=False)
                bar.update(1)  # after the postfix: a log line reports this step's loss

            # ---- evaluate, checkpoint, stop
            out_of_time = cfg.time_budget is not None and self.elapsed >= cfg.time_budget
            if dist.world_size > 1 and cfg.time_budget is not None:  # clocks differ: rank 0 decides
                flag = torch.tensor([float(out_of_time)], device=self.device)
                torch_dist.broadcast(flag, 0)
                out_of_time = bool(flag.item())
            last = self.step == cfg.max_steps or out_of_time or stop_requested
            # A signal is no end of the run: no evaluation of its own at the stop step, or the resumed run's
            # metrics.jsonl would hold a held-out row that the uninterrupted run's has not.
            ends = self.step == cfg.max_steps or out_of_time
            if self.evaluate_fn is not None and ((cfg.eval_every and self.step % cfg.eval_every == 0) or ends):
                self.run_evaluation()
            if self.out_dir is not None and ((cfg.save_every and self.step % cfg.save_every == 0) or last):
                self.save_checkpoint()
            if stop_requested:
                stopped = "signal"
                break
            if out_of_time:
                stopped = "time_budget"
                break
            step_start = time.perf_counter()  # tokens/s measures training; evaluations and saves are apart
        if bar is not None:
            bar.close()
        if stopped == "signal" and dist.is_main:
            if self.last_checkpoint is not None:
                log.warning("stopped by signal at step %d; checkpoint %s; run again with --resume to continue",
                            self.step, self.last_checkpoint)
            else:  # no out_dir, or a recipe that keeps no checkpoints: do not promise a resume
                log.warning("stopped by signal at step %d; no checkpoint was written", self.step)
        return TrainResult(step=self.step, stopped=stopped, checkpoint=self.last_checkpoint, metrics=metrics,
                           eval_metrics=self.last_eval, tokens=self.tokens, elapsed=self.elapsed,
                           signal=self._stop_signal if stopped == "signal" else None, pace=pace.report())

    # ------------------------------------------------------------------ evaluation
    def _bound_heap(self, micro_batches: list[Batch]) -> None:
        """On CPU, after a step whose batches changed shape: hand the free pages of the C heap back (`trim_heap`).

        Why: a step frees its activations and gradients, and glibc keeps freed blocks in its heap (always
        below its adaptive mmap threshold, every block once `retain_freed_memory` raised it). With the same
        shapes every step (pre-training's fixed-length batches) the next step reuses them exactly. With
        shapes that change every step -- fine-tuning's dynamic padding, length-grouped batches -- the next
        step's blocks fit the holes only partly, so the heap's free part only grew: all-MiniLM-L6-v2 on a GLUE
        pair task, batch 16 up to 128 tokens, held 3.2-3.6 GB; a 2-layer BERT on batches of 8-256 tokens
        grew 637 -> 1,026 MB over 120 steps (431 MB of it free heap). Handing the free pages back after such
        a step keeps resident memory at the step's own peak; a fixed-shape run never pays for it."""
        if self.device.type != "cpu":
            return
        if not all(isinstance(b, Mapping) for b in micro_batches):
            return
        shapes = tuple(tuple(v.shape) for b in micro_batches for v in b.values() if isinstance(v, torch.Tensor))
        if shapes != self._last_shapes and self._last_shapes is not None:
            trim_heap()
        self._last_shapes = shapes

    def run_evaluation(self) -> dict[str, float]:
        """`evaluate(model)` on rank 0, in eval mode, without gradients and without moving any RNG. A sharded
        model is evaluated by every process alike (its forward gathers weights from all); rank 0 logs."""
        results: dict[str, float] = {}
        if self.dist.is_main or self.sharded:
            self._open_logs()  # an evaluation before `fit` (the untrained model) is logged too (rank 0)
            self.model.eval()
            # The evaluation must not shift training's random streams (dropout), or a run that evaluates
            # at different moments -- e.g. once more after a resume -- would no longer be reproducible.
            with isolated_rng(), torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []), \
                    torch.no_grad(), torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float32,
                                                    enabled=self.autocast_dtype is not None):
                results = {k: float(_jsonable(v)) for k, v in self.evaluate_fn(self.model).items()}
            self.model.train()
            if self.device.type == "cpu":
                trim_heap()  # the evaluation's batches are not training's shapes (see `_bound_heap`)
            if not self.dist.is_main:
                results = {}  # one process reports, as without sharding
            self.last_eval = results
            self._log({"step": self.step, **{f"eval/{k}": v for k, v in results.items()}})
            from ..core import progress

            if self.dist.is_main:
                progress.write(f"step {self.step}: " + "  ".join(f"{k} {v:.4g}" for k, v in results.items()))
        if self.dist.world_size > 1:
            torch_dist.barrier()
        return results

    # ------------------------------------------------------------------ failures and signals
    def _fail_non_finite(self, loss: float, micro_batches: list[Batch]) -> None:
        first = self.step * self.config.grad_accum
        where = f"micro-batches {first}..{first + len(micro_batches) - 1} of rank {self.dist.rank}"
        dump = None
        if self.out_dir is not None:
            dump = self.out_dir / f"bad-batch-step{self.step + 1}-rank{self.dist.rank}.pt"
            with contextlib.suppress(Exception):
                torch.save(micro_batches, dump)
        good, set_aside = None, []
        if self.out_dir is not None and self.dist.is_main:
            good, set_aside = self._set_aside_diverged()
        aside = f"; set aside as {DIVERGED_PREFIX}*: {', '.join(p.name for p in set_aside)}" if set_aside else ""
        raise NonFiniteLossError(
            f"loss is {loss} at step {self.step + 1} ({where}"
            + (f", saved to {dump}" if dump is not None else "") + "); last good checkpoint: "
            + (str(good) if good else "none") + aside + " -- lower the learning rate (--resume --lr ...) or check "
            "the data, then resume")

    def _set_aside_diverged(self) -> tuple[Path | None, list[Path]]:
        """After a NaN/inf loss at step `self.step + 1`: find the last checkpoint whose weights and loss were
        finite, and rename every later one `diverged-step-N` (kept for inspection, never resumed from), so
        that `--resume` continues from the good one. The checkpoint of step `self.step` is the one whose
        weights just gave the non-finite loss; an earlier one is good when its weights are finite (a loss
        computed from them was: the run got past it)."""
        set_aside: list[Path] = []
        good = None
        for path in reversed(checkpoint_dirs(self.out_dir)):
            if checkpoint_step(path) < self.step:
                try:
                    state = read_checkpoint(path)
                    finite = state.get("weights_finite", True) if state.get("sharded") \
                        else weights_are_finite(state["model"])
                except CheckpointError:
                    finite = False
                if finite:
                    good = path
                    break
            aside = path.with_name(DIVERGED_PREFIX + path.name)
            with contextlib.suppress(OSError):
                shutil.rmtree(aside, ignore_errors=True)  # an older set-aside copy of the same step
                os.replace(path, aside)
                set_aside.append(aside)
        return good, list(reversed(set_aside))

    def _install_signal_handlers(self) -> dict[int, Any]:
        import threading

        if not self.config.handle_signals or threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}

        def handler(signum, frame):
            if self._stop_signal is not None and signum == signal.SIGINT:
                raise KeyboardInterrupt  # a second Ctrl-C: stop now, without the checkpoint
            self._stop_signal = signum
            if self.dist.is_main:
                log.warning("%s received: finishing step %d, then saving a checkpoint (Ctrl-C again to abort)",
                            signal.Signals(signum).name, self.step + 1)

        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
        return previous

    def _restore_signal_handlers(self, previous: dict[int, Any]) -> None:
        for sig, h in previous.items():
            signal.signal(sig, h)
        self._stop_signal = None

    # ------------------------------------------------------------------ logs
    def _progress_bar(self):
        """A tqdm bar on a terminal, a progress line every 30 s in a log file (`bertlab.core.progress`)."""
        if not (self.config.progress and self.dist.is_main):
            return None
        from ..core.progress import progress

        return progress(total=self.config.max_steps, initial=self.step, unit="step", desc="train", smoothing=0.1)

    def _open_logs(self) -> None:
        if self._metrics_file is not None or not (self.dist.is_main and self.out_dir is not None):
            return
        path = self.out_dir / METRICS_FILE
        try:
            if self.step > 0 and path.exists():
                # Resuming: drop what the interrupted session logged after its checkpoint, so curves have no
                # repeats, and a line cut short (a full disk, a kill mid-write) that no reader could parse.
                records, torn = parse_metrics_lines(path.read_text(encoding="utf-8", errors="replace"))
                if torn:
                    log.warning("%s: dropped %d unreadable line(s) (line %s; a write cut short)", path, len(torn),
                                ", ".join(map(str, torn)))
                kept = "".join(line + "\n" for line, record in records if record.get("step", 0) <= self.step)
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text(kept, encoding="utf-8")
                os.replace(tmp, path)
            elif self.step == 0 and path.exists():
                path.unlink()
            self._metrics_file = open(path, "a", encoding="utf-8")
        except OSError as e:
            raise output_error(path, e) from None
        if self.config.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # optional: `pip install tensorboard`
                self._tb = None
            else:
                self._tb = SummaryWriter(str(self.out_dir / "tensorboard"), purge_step=self.step or None)

    def _log(self, record: dict[str, Any]) -> None:
        if self._metrics_file is not None:
            try:
                self._metrics_file.write(json.dumps({k: _jsonable(v) for k, v in record.items()}) + "\n")
                self._metrics_file.flush()
            except OSError as e:
                raise output_error(self._metrics_file.name, e) from None
        if self._tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(k if "/" in k else f"train/{k}", v, record["step"])

    def _close_logs(self) -> None:
        if self._metrics_file is not None:
            file, self._metrics_file = self._metrics_file, None
            with contextlib.suppress(OSError):  # a full disk was reported by the write that met it
                file.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def parse_metrics_lines(text: str) -> tuple[list[tuple[str, dict[str, Any]]], list[int]]:
    """The (line, record) pairs of a metrics.jsonl text, and the numbers of the lines that are not a JSON
    object (a write cut short by a full disk or a kill leaves a torn last line)."""
    records, torn = [], []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict):
            records.append((line, record))
        else:
            torn.append(i)
    return records, torn


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of `RUN_DIR/metrics.jsonl` (training steps and `eval/*` lines). A torn last line (the
    run was killed or the disk filled mid-write) is dropped with a warning; a bad line before it is an error."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise BertlabError(f"{path}: no metrics file (is {run_dir} a training run directory?)")
    text = path.read_text(encoding="utf-8", errors="replace")
    records, torn = parse_metrics_lines(text)
    last = len(text.splitlines())
    if torn and torn[0] != last:
        raise BertlabError(f"{path}: line {torn[0]} is not a JSON object")
    if torn:
        log.warning("%s: dropped the unreadable last line %d (a write cut short)", path, last)
    return [record for _, record in records]
