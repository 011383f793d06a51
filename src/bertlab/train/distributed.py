"""One process or many under `torchrun`: the process group and each rank's device, and every random
generator's state (python, numpy, torch, cuda) captured and restored, so a resumed run draws what an
uninterrupted one would have."""

from __future__ import annotations

import contextlib
import datetime
import gc
import logging
import os
import random
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import torch
import torch.distributed as torch_dist

from ..core.errors import ConfigError

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- distributed
@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str | None = None, timeout: datetime.timedelta | None = None) -> DistInfo:
    """Join the process group `torchrun` describes in the environment (gloo on CPU, NCCL on GPU).

    Without torchrun (no WORLD_SIZE) this is one process and no group. `device`: "cpu", "cuda" or None for
    CUDA when available. Each rank uses the GPU of its LOCAL_RANK. `timeout`: how long a collective waits for
    the slowest process (None: torch's default, 30 minutes on gloo).
    """
    world_size = torchrun_world_size()
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    if use_cuda and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' requested but no CUDA device is available")
    dev = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if world_size > 1 and not torch_dist.is_initialized():
        torch_dist.init_process_group(backend="nccl" if use_cuda else "gloo",
                                      **({"timeout": timeout} if timeout is not None else {}))
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=dev)


def end_distributed() -> None:
    """Leave the process group at the end of a run that finished, on every process: wait for the others, drop what
    holds the group (DTensor's sharding caches keep FSDP's device meshes, and through them the group; reference
    cycles keep sharded tensors) and destroy it while the interpreter is whole. Not for a run that failed:
    destroying the group while another process waits in a collective hangs. Nothing to do in one process."""
    if not (torch_dist.is_available() and torch_dist.is_initialized()):
        return
    torch_dist.barrier()
    if "torch.distributed.tensor" in sys.modules:
        from torch.distributed.tensor import debug

        clear = getattr(debug, "_clear_sharding_prop_cache", None)  # private, present since torch 2.5
        if clear is not None:
            clear()
    gc.collect()
    torch_dist.destroy_process_group()
    gc.collect()


def leave_job(code: int) -> NoReturn:
    """End this process of a `torchrun` job whose run finished: leave the group (`end_distributed`), flush what
    was printed and logged, and exit with `code` without the interpreter's teardown. After FSDP, torch still
    holds the gloo group from C++ once it is destroyed; its threads then meet the interpreter's teardown and
    can abort the process ("terminate called without an active exception", once in 98 two-process FSDP jobs
    on a loaded 2-core machine), and torchrun reports a finished run as failed. Every file of the run is
    closed by then (the Trainer closes its metrics and TensorBoard files; checkpoints are written whole)."""
    end_distributed()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def torchrun_world_size() -> int:
    """The number of processes of the `torchrun` job this process is one of (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def refuse_torchrun(command: str) -> None:
    """A recipe that trains in one process only, refused in one line under torchrun -- rather than N processes
    each running the whole recipe and writing one output folder at once."""
    if torchrun_world_size() > 1:
        raise ConfigError(f"{command} trains in one process: run it without torchrun (pretrain, finetune, distill, "
                          "finetune-embeddings and finetune-reranker train across the processes of a torchrun job)")


def barrier(dist: DistInfo) -> None:
    """Wait for every process of the job (nothing to wait for in one process)."""
    if dist.world_size > 1:
        torch_dist.barrier()


def gather_rows(local: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """Every process's rows of a batch, in rank order, with gradients: process r holds `sizes[r]` rows (`local`,
    cut along the first dimension; the other dimensions alike everywhere). The backward sums what every process's
    loss wants of this process's rows (torch.distributed.nn's all_gather), so a loss computed the same on every
    process from the gathered batch gives each process W times its rows' share of the gradient, and DDP's or
    FSDP's average over the W processes is the one-process gradient of that loss."""
    from torch.distributed.nn.functional import all_gather

    most = max(sizes)
    padded = torch.cat([local, local.new_zeros((most - len(local), *local.shape[1:]))]) if len(local) < most else local
    return torch.cat([part[:n] for part, n in zip(all_gather(padded), sizes)])


def _current_dist(device: torch.device) -> DistInfo:
    if torch_dist.is_available() and torch_dist.is_initialized():
        return DistInfo(torch_dist.get_rank(), torch_dist.get_world_size(),
                        int(os.environ.get("LOCAL_RANK", "0")), device)
    return DistInfo(device=device)


# ---------------------------------------------------------------------------------------------- random state
def seed_everything(seed: int) -> None:
    """Seed python's `random`, numpy's global generator and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def get_rng_state() -> dict[str, Any]:
    """Every global random generator, as plain values `torch.load(weights_only=True)` can read back."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def isolated_rng() -> Iterator[None]:
    """Run a block without it moving the global CPU random generators.

    Used around data loading: a DataLoader draws worker seeds from the global torch generator when it
    starts, which a resumed run does at a different step than an uninterrupted one. Isolated, the data
    side cannot shift the dropout masks of training, so resume stays bitwise exact. (Data randomness
    itself must come from seeds the data code derives -- see `bertlab.data`.)
    """
    py, npy, th = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(th)
