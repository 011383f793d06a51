"""What every training recipe (pre-training, distillation, fine-tuning, feature-based NER) sets up alike.

    run_record, write_run_config   OUT/run_config.json: the run's settings plus what the run decided
                                   (`_resolved`: steps fitted to a budget, precision, ...); it is itself a
                                   valid `--config` file
    resolve_resume_config          on `--resume`, the saved run config rules; flags change only the
                                   runtime (and optimiser) settings a recipe lists as may-change
    numerics, restore_numerics     what changes a run's numbers besides its config (CPU threads, the C
                                   kernels): recorded in `_resolved`, restored on `--resume`
    resume_base                    the saved settings, as the base of a resumed command's flags
    resolved_settings              what the first session of a resumed run decided
    resolve_precision              `auto` -> bf16 where the hardware does it natively, else fp32
    autocast_dtype                 the one precision -> autocast dtype map
    resolve_device                 `cuda` / `cpu` / None (CUDA when available), for one-process recipes
    split_batch                    a global batch -> (micro-batch per rank, accumulation steps)
    fit_steps_to_budget            a wall-clock budget -> optimizer steps, from step times measured with
                                   `batches.time_step` (epochs -> steps is `batches.steps_for_epochs`)

The recipes keep what is theirs (data, model, loss); this module keeps them from each deciding these
things a little differently.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any, TypeVar

import torch

from ..core.fsio import atomic_write_text
from ..core.jsonconfig import read_json_object
from ..core.errors import BertlabError, ConfigError
from ..nn.precision import DTYPES, cpu_has_native_bf16
from .runconfig import changed_settings, config_from_dict, flat_dict, flat_settings

C = TypeVar("C")
log = logging.getLogger(__name__)

RUN_CONFIG = "run_config.json"
PRECISIONS = ("auto", *DTYPES)  # what a run config may say; `auto` resolves to one of DTYPES

# Share of a time budget kept back for what timing a training step does not see: the optimizer step,
# checkpoints, logging, data loader start-up. Evaluations are estimated and subtracted on top of it
# (`eval_seconds`), so this covers only the untimed rest; 8% kept runs inside their budget in the tests
# and benchmarks of this repository (the loop also stops at the budget, so an overrun costs steps, not time).
BUDGET_RESERVE = 0.08


# ---------------------------------------------------------------------------------------------- run config
def run_record(cfg: Any, resolved: dict[str, Any]) -> dict[str, Any]:
    """What OUT/run_config.json holds: the config's fields, and under `_resolved` what the run decided,
    with this process's `numerics` (which a resume restores)."""
    return dataclasses.asdict(cfg) | {"_resolved": {**resolved, "numerics": numerics()}}


def numerics() -> dict[str, Any]:
    """The settings of this process that change a run's numbers but are not in its config: torch's intra-op
    threads (a reduction split over another number of threads rounds differently) and whether the C kernels
    run (evaluation's attention and layer norm take them under no_grad)."""
    from ..nn import cpu_kernels

    return {"threads": torch.get_num_threads(), "cpu_kernels": cpu_kernels.available()}


def restore_numerics(saved: dict[str, Any] | None, say: Callable[[str], None]) -> None:
    """A resumed run goes on with the `numerics` its run recorded -- so it ends bitwise equal to an uninterrupted
    run -- except what the user stated again (`--threads N`, BERTLAB_NO_CPU_KERNELS), which wins and is said in
    one line. A run from before they were recorded (`saved` None) keeps this process's."""
    from ..nn import cpu_kernels
    from ..core.threads import set_threads, stated_threads

    if not saved:
        return
    overridden, restored = [], []
    threads, stated = saved.get("threads"), stated_threads()
    if threads is not None and stated is not None and stated != threads:
        overridden.append(f"--threads {stated} (the run used {threads})")
    elif threads is not None and torch.get_num_threads() != threads:
        set_threads(threads)
        restored.append(f"{threads} CPU threads")
    kernels = saved.get("cpu_kernels")
    if kernels is not None and kernels != cpu_kernels.available():
        if kernels and os.environ.get("BERTLAB_NO_CPU_KERNELS"):
            overridden.append("BERTLAB_NO_CPU_KERNELS (the run used the C kernels)")
        elif cpu_kernels.use_c_kernels(kernels) == kernels:
            restored.append("the C kernels " + ("on" if kernels else "off"))
        else:
            overridden.append("no C kernels (not built here; the run used them)")
    if restored:
        log.info("resume restores the run's %s", ", ".join(restored))
    if overridden:
        say("resume runs with " + ", ".join(overridden) + " as stated: the continuation is not bitwise an "
            "uninterrupted run's")


def write_run_config(out_dir: str | Path, record: dict[str, Any]) -> None:
    atomic_write_text(Path(out_dir) / RUN_CONFIG, json.dumps(record, indent=2) + "\n")


def resolve_resume_config(cls: type[C], cfg: C, run_file: str | Path, may_change: Iterable[str],
                          given: Collection[str] | None = None,
                          say: Callable[[str], None] | None = None) -> C:
    """On resume (`cfg.resume`), the config saved in `run_file` rules: every setting not stated again is the
    run's own, never a default. Of the settings stated again (`given`: the flags and `--config` keys the user
    passed; None, for a config built in Python: the fields that differ from the dataclass defaults), those in
    `may_change` (runtime settings -- logging, evaluation and checkpoint cadence, workers, device -- and the
    optimiser's lr / weight decay / clipping) follow `cfg`; others (data, batch, schedule: changing them
    would make the continuation another run) keep the saved value, with a line saying so. The run directory
    is `cfg.out` -- wherever the run is now, so a moved or copied run resumes in place. Without `resume`,
    `cfg` as it is."""
    if not getattr(cfg, "resume", False):
        return cfg
    say = say or log.warning
    run_file = Path(run_file)
    if not run_file.is_file():
        raise BertlabError(f"{run_file.parent}: nothing to resume (no {run_file.name}); start the run without "
                           "--resume")
    saved = read_json_object(run_file)
    restore_numerics(saved.pop("_resolved", {}).get("numerics"), say)
    saved = flat_dict(cls, saved)  # settings by their flat names, groups' too (a file from before them is flat)
    current = flat_settings(cfg)
    if given is None:
        given = changed_settings(cfg)
    may_change = set(may_change)
    stated = {k: current[k] for k in given if k in current and k not in ("out", "resume")}
    ignored = [k for k, v in stated.items() if k not in may_change and k in saved and v != saved[k]]
    if ignored:
        say("resume keeps the run's own " + ", ".join(f"{k} ({saved[k]!r}; {stated[k]!r} ignored)" for k in ignored)
            + ": changing it would make the continuation another run")
    changed = {k: v for k, v in stated.items() if k in may_change}
    return config_from_dict(cls, {**saved, **changed, "out": getattr(cfg, "out"), "resume": True}, str(run_file))


def resume_base(out_dir: str | Path) -> dict[str, Any]:
    """The settings saved in OUT/run_config.json (without `_resolved`), as the base a resumed command's flags
    go on top of -- so `--resume` needs only `--out` even where a fresh start requires --model and --data.
    {} when there is no file (the resume then reports that)."""
    run_file = Path(out_dir) / RUN_CONFIG
    if not run_file.is_file():
        return {}
    saved = read_json_object(run_file)
    saved.pop("_resolved", None)
    return saved


def resolved_settings(out_dir: str | Path) -> dict[str, Any]:
    """The `_resolved` part of OUT/run_config.json (steps, precision, ...), {} when there is none."""
    run_file = Path(out_dir) / RUN_CONFIG
    return read_json_object(run_file).get("_resolved", {}) if run_file.is_file() else {}


# ---------------------------------------------------------------------------------------------- hardware
def check_precision(precision: str, allowed: Iterable[str] = PRECISIONS) -> None:
    """A one-line `ConfigError` unless `precision` is one of `allowed` (the run-config names, `auto` too)."""
    if precision not in allowed:
        raise ConfigError(f"precision must be one of {', '.join(allowed)}, got {precision!r}")


def resolve_precision(precision: str, device: torch.device) -> str:
    """`auto`: bf16 on GPUs that support it and on CPUs with native bf16 math (AVX512-BF16 / AMX), else fp32."""
    check_precision(precision)
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if cpu_has_native_bf16() else "fp32"


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The dtype `torch.autocast` runs in for a resolved precision (fp32, bf16, fp16); None: no autocast."""
    check_precision(precision, DTYPES)
    return None if precision == "fp32" else DTYPES[precision]


def resolve_device(name: str | None) -> torch.device:
    """A recipe's device for one process: `name` ("cpu", "cuda", "cuda:1"), or (None, "auto") CUDA when
    available."""
    if name is None or name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' requested but no CUDA device is available")
    return torch.device(name)


# ---------------------------------------------------------------------------------------------- run length
def split_batch(global_batch: int, micro: int | None = None, world_size: int = 1,
                grad_accum: int | None = None) -> tuple[int, int]:
    """(micro-batch per rank, accumulation steps), global batch = micro x accumulation x ranks. Given is the
    micro-batch (pre-training, distillation: `micro_batch_size`) or the accumulation (fine-tuning:
    `grad_accum`); neither: each rank's whole share in one pass."""
    if grad_accum is not None:
        if global_batch % (grad_accum * world_size):
            ranks = f" x {world_size} ranks" if world_size > 1 else ""
            raise ConfigError(f"batch-size ({global_batch}) must be a multiple of grad-accum ({grad_accum}){ranks}")
        return global_batch // (grad_accum * world_size), grad_accum
    micro = micro or max(1, global_batch // world_size)
    if global_batch % (micro * world_size):
        raise ConfigError(f"batch size {global_batch} is not a multiple of micro batch {micro} x {world_size} ranks")
    return micro, global_batch // (micro * world_size)


def heldout_sequences(heldout: int, eval_batches: int | None, eval_batch_size: int) -> int:
    """Sequences one held-out evaluation reads: `eval_batches` batches (None: the whole split) of the split."""
    return min(heldout, eval_batches * eval_batch_size) if eval_batches else heldout


def eval_seconds(eval_sequences: int, sequences_per_step: int, step_seconds: float) -> float:
    """One evaluation's estimated seconds: a forward pass costs about a third of forward + backward."""
    return eval_sequences / sequences_per_step * step_seconds / 3


def fit_steps_to_budget(budget_s: float, step_s: float, eval_s: float = 0.0, num_evals: int = 0,
                        eval_every: int | None = None, dist: Any = None) -> int:
    """Optimizer steps that fit in `budget_s` seconds at `step_s` per step, after `BUDGET_RESERVE` and the
    evaluations: `num_evals` over the run (or one per `eval_every` steps) plus one at the start, `eval_s`
    each. Under torchrun every rank must agree on the schedule: rank 0's estimate is broadcast (`dist`)."""
    usable = (1 - BUDGET_RESERVE) * budget_s
    steps = max(1, int((usable - (num_evals + 1) * eval_s) / step_s))
    if eval_every:
        steps = max(1, int((usable - (steps // eval_every + 1) * eval_s) / step_s))
    if dist is not None and dist.world_size > 1:
        t = torch.tensor([steps], device=dist.device)
        torch.distributed.broadcast(t, 0)
        steps = int(t.item())
    return steps


def lr_for_width(table: dict[int, float], hidden_size: int) -> float:
    """The learning rate `table` gives a model `hidden_size` wide: the entry of the nearest width at or above
    it (the widest entry's beyond the table). Narrow models take larger rates than the paper's BERT-Base."""
    for width in sorted(table):
        if hidden_size <= width:
            return table[width]
    return table[max(table)]
