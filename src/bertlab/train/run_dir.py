"""A run folder: its checkpoints (`checkpoints/step-N/`, atomic, keep-last-K, diverged ones set aside), the
latest one to resume from, the metrics log, and the checks that a folder can be written."""

from __future__ import annotations

import logging
import math
import os
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..checkpoint.hf_layout import torch_load_failure
from ..core.errors import BertlabError, CheckpointError, ConfigError, output_error

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
STATE_FILE = "state.pt"
SHARDS_DIR = "shards"  # a sharded (FSDP) run's model and optimizer state: torch.distributed.checkpoint's files
META_FILE = "meta.json"
METRICS_FILE = "metrics.jsonl"
STATE_FORMAT = "bertlab-train-state/1"
DIVERGED_PREFIX = "diverged-"  # checkpoints set aside after a NaN/inf loss: kept, never resumed from


# ---------------------------------------------------------------------------------------------- checkpoints
def checkpoint_dirs(out_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints of a run, oldest first (atomic writes mean a present folder is a complete one)."""
    root = Path(out_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-") and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    dirs = checkpoint_dirs(out_dir)
    return dirs[-1] if dirs else None


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a training-state checkpoint (a `step-N` folder or its `state.pt`), or raise a one-line error."""
    p = Path(path)
    file = p / STATE_FILE if p.is_dir() else p
    if not file.is_file():
        raise CheckpointError(f"{file}: no such checkpoint file")
    try:
        # weights_only: a checkpoint is data, never code. Everything we write is tensors and plain values.
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated zip, bad pickle, refused object
        raise CheckpointError(f"{file}: {torch_load_failure(e)}; delete it to resume from the one before") \
            from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise CheckpointError(f"{file}: not a bertlab training checkpoint (format {state.get('format')!r} "
                              f"expected {STATE_FORMAT!r})" if isinstance(state, dict)
                              else f"{file}: not a bertlab training checkpoint")
    return state


def check_writable(out_dir: str | os.PathLike) -> Path:
    """Create `out_dir` and prove we can write into it -- before any training step, not after an hour."""
    path = Path(out_dir)
    if path.exists() and not path.is_dir():
        raise BertlabError(f"{path}: exists and is not a folder; choose another output directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise output_error(path, e, "output directory is not writable") from None
    return path


def claim_run_dir(out: str | os.PathLike, overwrite: bool, results: Callable[[Path], list[Path]],
                  finished: Iterable[str], what: str, interrupted: Sequence[Path] = ()) -> Path:
    """Make `out` ready for a run of `what` ("fine-tuning run", "demo run"). An earlier run's results -- marked
    by one of the `finished` names in `out` -- are never replaced silently: refused (one line) unless
    `overwrite`, which deletes exactly what that run wrote (`results(out)`; other files in `out` stay). An
    `interrupted` run is refused with how to continue it. A run that failed before saving anything is simply
    started again."""
    out = Path(out)
    previous = results(out) if overwrite or any((out / name).exists() for name in finished) else []
    if interrupted and not overwrite:  # say how to continue it, not only how to throw it away
        raise ConfigError(f"{out}: holds an interrupted {what} ({interrupted[0]}); pass --resume to continue "
                          "it, --overwrite to replace it, or choose another --out")
    if previous and not overwrite:
        raise ConfigError(f"{out}: already holds a {what} ({', '.join(p.name for p in previous[:4])}"
                          f"{', ...' if len(previous) > 4 else ''}); choose another --out, or pass --overwrite "
                          "to replace it")
    for path in previous:
        log.warning("%s: replacing the earlier run's %s (--overwrite)", out, path.name)
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    return check_writable(out)


def checkpoint_step(path: Path) -> int:
    return int(path.name.rpartition("-")[2])


def weights_are_finite(state: Mapping[str, torch.Tensor]) -> bool:
    """No NaN or inf in any floating-point tensor of a state dict."""
    return all(bool(torch.isfinite(t).all()) for t in state.values()
               if isinstance(t, torch.Tensor) and t.is_floating_point())


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN; keep it readable
    return value
