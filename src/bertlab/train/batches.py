"""Seekable batches for the loop: `batches(step)` must start at an optimizer step without replaying the ones
before it -- shuffled epochs, multi-task mixing, epoch arithmetic -- and what a batch costs: its tokens, its
move to the device, and the timing of a step that time budgets are fitted with."""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..core.errors import BertlabError
from .distributed import isolated_rng
from .run_record import autocast_dtype

log = logging.getLogger(__name__)

Batch = Any  # whatever `batches` yields and `loss_fn` reads: usually a dict of tensors



# ---------------------------------------------------------------------------------------------- data helpers
def to_device(batch: Batch, device: torch.device) -> Batch:
    """Move every tensor in a (nested) dict / list / tuple to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def count_tokens(batch: Batch) -> int:
    """Real (non-padding) tokens of a batch, for tokens/s: the attention mask's non-zero entries (a packed
    row's mask numbers its documents), else input_ids' size."""
    if isinstance(batch, Mapping):
        if isinstance(batch.get("attention_mask"), torch.Tensor):
            return int(batch["attention_mask"].count_nonzero())
        if isinstance(batch.get("input_ids"), torch.Tensor):
            return batch["input_ids"].numel()
    return 0


class _SeekableBatchSampler:
    """Index lists for one rank, epoch after epoch, starting at global micro-batch `start` (see below)."""

    def __init__(self, n: int, batch_size: int, seed: int, start: int, rank: int, world_size: int,
                 shuffle: bool, drop_last: bool, lengths: Sequence[int] | None = None, group: int = 50):
        self.n, self.batch_size, self.seed, self.start = n, batch_size, seed, start
        self.rank, self.world_size, self.shuffle, self.drop_last = rank, world_size, shuffle, drop_last
        self.lengths, self.group = lengths, group
        if lengths is not None and len(lengths) != n:
            raise ValueError(f"lengths has {len(lengths)} entries for {n} examples")
        if group < 1:
            raise ValueError(f"group must be at least 1, got {group}")
        block = batch_size * world_size
        self.per_epoch = n // block if drop_last else math.ceil(n / block)
        if self.per_epoch == 0:
            raise BertlabError(f"{n} examples are fewer than one global batch ({batch_size} x {world_size} ranks)")

    def epoch_order(self, epoch: int) -> list[int]:
        """Every example index once, in epoch `epoch`'s order; a function of (seed, epoch) only, so any step
        can be reached at once."""
        if not self.shuffle:
            return list(range(self.n))
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(self.n, generator=g).tolist()
        if self.lengths is None:
            return order
        # Length grouping: cut the shuffled order into runs of `group` global batches, sort each run by
        # length and shuffle the batches it makes. Every batch is still a random draw, but of rows of
        # similar length, so dynamic padding costs little (a random batch of CoNLL or SST-2 sentences is
        # mostly padding). Same idea as Hugging Face's `group_by_length` and fairseq's length buckets.
        block = self.batch_size * self.world_size
        run = block * self.group
        order = [i for r in range(0, self.n, run) for i in sorted(order[r:r + run], key=self.lengths.__getitem__)]
        blocks = [order[b:b + block] for b in range(0, self.n, block)]
        tail = blocks.pop() if len(blocks[-1]) < block else None  # a short last batch stays last
        blocks = [blocks[i] for i in torch.randperm(len(blocks), generator=g).tolist()]
        return [i for b in blocks + ([tail] if tail else []) for i in b]

    def __iter__(self) -> Iterator[list[int]]:
        block = self.batch_size * self.world_size
        epoch, offset = divmod(self.start, self.per_epoch)
        while True:
            order = self.epoch_order(epoch)
            for b in range(offset, self.per_epoch):
                chunk = order[b * block:(b + 1) * block]
                if len(chunk) < block and self.world_size > 1:  # every rank needs a batch: wrap around
                    chunk = (chunk + order)[:block]
                yield chunk[self.rank * self.batch_size:(self.rank + 1) * self.batch_size] if self.world_size > 1 \
                    else chunk
            epoch, offset = epoch + 1, 0


def shuffled_batches(dataset, batch_size: int, collate_fn: Callable | None = None, *, seed: int = 0, start: int = 0,
                     rank: int = 0, world_size: int = 1, shuffle: bool = True, drop_last: bool = False,
                     lengths: Sequence[int] | None = None, group: int = 50,
                     num_workers: int = 0, pin_memory: bool = False) -> Iterable[Batch]:
    """Micro-batches of a map-style dataset for this rank, epoch after epoch without end, from micro-batch `start`.

    Epoch `e` is a permutation seeded by (seed, e); global micro-batch `i` is epoch i // per_epoch, position
    i % per_epoch of it, split across ranks. So `start` is reached in O(1) -- the seek `Trainer` resume
    needs: `batches = lambda step: shuffled_batches(..., start=step * grad_accum)`.

    With `lengths` (one per example), batches are length-grouped: each run of `group` consecutive global
    batches of the permutation is sorted by length before it is cut, then the batches are shuffled.
    """
    sampler = _SeekableBatchSampler(len(dataset), batch_size, seed, start, rank, world_size, shuffle, drop_last,
                                    lengths, group)
    return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_fn,
                                       num_workers=num_workers, pin_memory=pin_memory)


def mixed_batches(features: Sequence[Sequence[dict]], schedule: Sequence[int], micro: int, collate, seed: int,
                  start: int, lengths: Sequence[Sequence[int] | None] | None = None) -> Iterator[Batch]:
    """Micro-batches of a multi-task run from micro-batch `start` on: the task of micro-batch i is
    `schedule[i]` (`data.mixing.task_schedule`). Each task has its own seeded stream (`shuffled_batches`, seed
    `seed + task`) that seeks past the batches it already gave, so a run resumed at any step continues
    exactly. `collate`: one function, or one per task; `lengths`: per task, feature lengths for
    length-grouped batches (or None)."""
    collates = collate if isinstance(collate, Sequence) else [collate] * len(features)
    streams = [iter(shuffled_batches(f, micro, collate_fn=collates[i], seed=seed + i,
                                     start=list(schedule[:start]).count(i),
                                     lengths=lengths[i] if lengths is not None else None))
               for i, f in enumerate(features)]
    for task in schedule[start:]:
        yield next(streams[task])


def steps_per_epoch(num_examples: int, batch_size: int, grad_accum: int = 1, world_size: int = 1,
                    drop_last: bool = False) -> int:
    """Optimizer steps in one epoch of `shuffled_batches` (for `max_steps = epochs * steps_per_epoch(...)`)."""
    block = batch_size * world_size
    micro = num_examples // block if drop_last else math.ceil(num_examples / block)
    return max(1, micro // grad_accum)


def steps_for_epochs(epochs: float, num_examples: int, batch_size: int, grad_accum: int = 1,
                     world_size: int = 1) -> int:
    """Optimizer steps for `epochs` (fractional allowed) passes of `shuffled_batches`, at least 1."""
    return max(1, math.ceil(epochs * steps_per_epoch(num_examples, batch_size, grad_accum, world_size)))


def time_step(model: nn.Module, loss_fn: Callable, loader: Iterable[Batch], accum: int, precision: str,
              device: torch.device, repeats: int = 3) -> float:
    """Seconds per optimizer step (forward + backward of `accum` micro-batches), measured on real batches.

    Runs without moving the random generators and leaves no gradient behind, so a run with a time budget
    trains exactly as one given the resulting step count would."""
    dtype = autocast_dtype(precision)
    times = []
    with isolated_rng(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        it = iter(loader)
        for r in range(repeats + 1):  # the first pass pays one-off costs (kernel selection, allocation)
            start = time.perf_counter()
            for _ in range(accum):
                batch = to_device(next(it), device)
                with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                    loss, _ = loss_fn(model, batch)
                loss.backward()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if r:
                times.append(time.perf_counter() - start)
    model.zero_grad(set_to_none=True)
    return statistics.median(times)
