"""Fully sharded data parallel training: torch's FSDP2 (`fully_shard`) and distributed checkpoint (DCP), wired to
bertlab's models and training loop -- no sharding of bertlab's own.

    join_job               one process on its device, or this process's place in a torchrun job, and the sharding
    shard_model            one `fully_shard` per layer block (the stacks' `blocks()`, `models.family.layer_blocks`)
                           and one for the whole model; bf16 mixed precision (parameters gathered and computed in
                           bf16, gradients reduced in fp32, the sharded fp32 master weights updated); CPU offload
    gathered               a sharded model's own unit held whole while a part of it runs alone
    is_fully_sharded       whether a model was sharded so (the loop then keeps gradient sync, evaluation and
                           checkpoints collective)
    save_sharded_state /   model and optimizer state as each process's shards (`torch.distributed.checkpoint`), read
    load_sharded_state     back by any number of processes: 2 -> 2, 2 -> 1, 1 -> 4 (DCP reshards on load)
    full_state_dict        the whole model's weights gathered on rank 0, for the usual single-folder export

A block that runs at several layers (ALBERT's shared one) is not a unit of its own: it stays in the whole model's
unit, so its parameters are gathered once per step, not re-gathered and reduced at every layer that runs it.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from ..core.errors import ConfigError
from ..models.family import layer_blocks, shared_blocks
from .distributed import DistInfo, init_distributed, torchrun_world_size
from .run_record import resolve_device

SHARDINGS = ("auto", "none", "ddp", "fsdp")


def _fsdp_api():
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch < 2.6 has FSDP2 under a private name only
        raise ConfigError(f"--sharding fsdp needs torch >= 2.6 (FSDP2's fully_shard); this is torch "
                          f"{torch.__version__}") from None
    return fully_shard, FSDPModule, MixedPrecisionPolicy, CPUOffloadPolicy


def resolve_sharding(sharding: str | None, world_size: int, precision: str, cpu_offload: bool) -> str:
    """`auto` (or None) -> `ddp` under torchrun with several processes, `none` for one; the combinations that cannot
    run are refused in one line before any model is built."""
    sharding = sharding or "auto"
    if sharding not in SHARDINGS:
        raise ConfigError(f"sharding must be one of {', '.join(SHARDINGS)}, got {sharding!r}")
    if sharding == "auto":
        sharding = "ddp" if world_size > 1 else "none"
    if sharding == "fsdp" and world_size < 2:
        raise ConfigError("--sharding fsdp shards the model over the processes of a torchrun job: launch it with "
                          "`torchrun --nproc-per-node N -m bertlab.cli ...` (one process: --sharding none)")
    if sharding == "ddp" and world_size < 2:
        sharding = "none"  # DDP of one process is the bare model
    if cpu_offload and sharding != "fsdp":
        raise ConfigError("--fsdp-cpu-offload offloads FSDP's shards: it needs --sharding fsdp")
    if sharding == "fsdp" and precision == "fp16":
        raise ConfigError("--sharding fsdp runs in fp32 or bf16 (its mixed-precision policy); fp16's loss scaling "
                          "is not wired to sharded gradients: use --precision bf16")
    if sharding == "fsdp":
        _fsdp_api()
    return sharding


def join_job(device: str | None, sharding: str | None, precision: str, cpu_offload: bool = False,
             timeout=None) -> tuple[DistInfo, str]:
    """What a recipe that runs as one process or as the processes of a torchrun job does first: one process on
    `device` (`setup.resolve_device`), or this process's place in the job (`distributed.init_distributed`,
    `timeout` for its collectives); and the sharding `resolve_sharding` decides."""
    if torchrun_world_size() == 1:
        dist = DistInfo(device=resolve_device(device))
    else:
        dist = init_distributed(None if device in (None, "auto") else device, timeout=timeout)
    return dist, resolve_sharding(sharding, dist.world_size, precision, cpu_offload)


def shard_model(model: nn.Module, precision: str = "fp32", cpu_offload: bool = False) -> nn.Module:
    """Shard `model` (on its device, before its optimizer is built: FSDP2 replaces the parameters by sharded
    DTensors) over all processes of the group: each layer block, then the whole. Returns the same module."""
    fully_shard, _, MixedPrecisionPolicy, CPUOffloadPolicy = _fsdp_api()
    shared = shared_blocks(model)
    blocks = [b for b in layer_blocks(model) if id(b) not in shared]
    if not blocks:
        raise ConfigError(f"--sharding fsdp: {type(model).__name__} has no layer stack to shard block by block "
                          "(its family's encoder has no blocks()); use --sharding ddp")
    options: dict[str, Any] = {}
    if precision == "bf16":
        # bf16 gathers and compute; fp32 gradient reduction and master weights: as precise an update as DDP's
        # (the inputs are left as they are: the blocks get bf16 hidden states from bf16 embeddings, and masks are
        # no floats to cast)
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                                    cast_forward_inputs=False)
    if cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    for block in blocks:
        fully_shard(block, **options)
    fully_shard(model, **options)  # embeddings, heads, final norms: the root unit
    return model


def is_fully_sharded(model: nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def gathered(model: nn.Module) -> Iterator[None]:
    """A sharded model's own unit (embeddings, heads: all but its layer blocks, which gather as they run) held whole
    for the block, so that a part of the model can run alone, outside the model's forward -- distillation's
    student, evaluated on its own. Collective; after the model's first forward. Any other model as it is."""
    if not is_fully_sharded(model):
        yield
        return
    model.unshard()
    try:
        yield
    finally:
        model.reshard()


def set_gradient_sync(model: nn.Module, sync: bool) -> None:
    """FSDP2's `no_sync`: accumulate unsharded gradients locally on the micro-batches before the step's last."""
    model.set_requires_gradient_sync(sync)


def compute_device(model: nn.Module) -> torch.device:
    """The device a sharded model computes on (with CPU offload its sharded parameters live on the CPU)."""
    device = next(model.parameters()).device
    if device.type == "cpu" and torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return device


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard; any other tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


def local_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes this process holds of `tensors` (their local shards)."""
    return sum(local_tensor(t).numel() * local_tensor(t).element_size() for t in tensors)


def weights_finite(model: nn.Module) -> bool:
    """No NaN/inf in any process's shards of `model` (collective when sharded)."""
    finite = all(bool(torch.isfinite(local_tensor(p.detach())).all()) for p in model.parameters()
                 if p.is_floating_point())
    if is_fully_sharded(model):
        flag = torch.tensor([float(finite)], device=compute_device(model))
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
        finite = bool(flag.item())
    return finite


# ---------------------------------------------------------------------------------------------- checkpoints
def save_sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer, folder: str | os.PathLike) -> None:
    """Every process writes its shards of the model and optimizer state into `folder` (collective; rank 0 also
    writes DCP's `.metadata`, which maps the shards to the whole tensors)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(folder))


def load_sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer, folder: str | os.PathLike) -> None:
    """Read `folder` (from `save_sharded_state`, any number of processes) into `model` and `optimizer` as they are
    sharded here: under FSDP each process reads the pieces of its own shards, a single process the whole."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    # (The optimizer's state tensors must exist to be read into: `get_state_dict` creates them by a step of
    # zero gradients at learning rate 0, which leaves the weights as they are.)
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    one_process = not (torch.distributed.is_available() and torch.distributed.is_initialized())
    with warnings.catch_warnings():  # one process reading a sharded checkpoint is meant, not a missing group
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(folder), no_dist=one_process)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on CPU, gathered on rank 0 (collective; other ranks get {})."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def unsharded_copy(model: nn.Module, build) -> nn.Module | None:
    """On rank 0, a plain module from `build()` holding `model`'s gathered weights (what the single-folder export
    saves); None on the other ranks. Collective."""
    state = full_state_dict(model)
    if not state:
        return None
    with torch.random.fork_rng(devices=[]):  # building draws initial weights: the run's generators stay put
        plain = build()
    plain.load_state_dict(state)
    return plain.eval()


__all__ = ["SHARDINGS", "compute_device", "full_state_dict", "gathered", "is_fully_sharded", "join_job",
           "load_sharded_state",
           "local_bytes",
           "resolve_sharding", "save_sharded_state", "set_gradient_sync", "shard_model", "unsharded_copy",
           "weights_finite"]
