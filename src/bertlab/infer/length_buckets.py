"""Length bucketing: group sequences of similar length into batches, so inference pays for real tokens.

On variable-length input, padding every batch to its longest row is most of the work: with lengths spread
evenly over 16-128 tokens, a batch of 32 in arrival order is padded to ~125 tokens while its rows average
~72, so ~40% of every matmul (and more of attention, which is quadratic) is spent on padding. Sorting the
rows by length and cutting the sorted list into batches under a token budget leaves almost no padding;
runs of equal length need no attention mask at all (the encoder then takes SDPA's unmasked path).

`plan_batches` is the pure part (lengths in, index batches out); `pad_rows` turns rows of ids into tensors;
`run_bucketed` runs a function over the buckets and puts the results back in input order. Used by
embeddings, features, fill-mask, predict and the service's dynamic batcher.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import torch

T = TypeVar("T")

# Tokens per forward pass. On a CPU ~1k already keeps the matmuls at full speed, and larger batches were
# slower (measured with all-MiniLM-L6-v2, one thread, 256-512-token inputs: 2k tokens 3% below 1k in fp32, 6% in
# int8; 8k 4% below 2k): their (T, 4H) activations leave the caches, and a batch over oneDNN's row tile
# (nn/packed_linear.py, 1,024 rows) is cut into calls whose outputs are copied into one. Short inputs measured
# the same at 1k and 2k. A GPU wants far more rows per kernel.
DEFAULT_MAX_TOKENS = 1024
DEFAULT_MAX_TOKENS_GPU = 16384
DEFAULT_MAX_BATCH = 256
# The padding a large bucket may hold, as a share of its real tokens (see `plan_batches`). On a CPU every padded
# position is computed. On a GPU the encoder unpads (variable-length attention), so padding costs next to
# nothing there and fewer, larger batches win: measured on an H200 with MiniLM's shape, 1,024 rows of 16-128
# tokens, max_batch 256, the 2% rule made ~6x more forward passes than the token budget alone.
MAX_WASTE = 0.02
MAX_WASTE_GPU = float("inf")


def plan_batches(lengths: Sequence[int], max_tokens: int = DEFAULT_MAX_TOKENS,
                 max_batch: int = DEFAULT_MAX_BATCH, sort: bool = True, max_waste: float = MAX_WASTE) -> list[list[int]]:
    """Indices of `lengths` grouped into batches whose padded size (rows x longest row) stays within
    `max_tokens` and whose row count stays within `max_batch`; a row longer than `max_tokens` gets a
    batch of its own. With `sort` (the point of it all) rows are taken shortest first, so each batch
    holds rows of nearly the same length; without it, in input order (the naive baseline).

    Short rows are many to a batch, so a batch of them may span a wide range of lengths: once a batch holds
    a quarter of `max_tokens`, it is also closed when the next row would make its padding exceed
    `max_waste` of its real tokens. Batches stay large enough for efficient matmuls, padding stays ~2%."""
    if max_tokens < 1 or max_batch < 1:
        raise ValueError(f"max_tokens and max_batch must be positive, got {max_tokens} and {max_batch}")
    order = sorted(range(len(lengths)), key=lengths.__getitem__) if sort else list(range(len(lengths)))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = real = 0
    for i in order:
        n = max(1, lengths[i])
        if current:
            width = max(longest, n)
            padded = (len(current) + 1) * width
            if (len(current) >= max_batch or padded > max_tokens
                    or (sort and len(current) * width >= max_tokens // 4 and padded > (real + n) * (1 + max_waste))):
                batches.append(current)
                current, longest, real = [], 0, 0
        current.append(i)
        longest, real = max(longest, n), real + n
    if current:
        batches.append(current)
    return batches


def pad_rows(rows: Sequence[Sequence[int]], pad_value: int = 0, width: int | None = None) -> torch.Tensor:
    """Right-pad integer rows into a (B, width) long tensor (width: the longest row)."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    width = int(lengths.max(initial=0)) if width is None else width
    if lengths.size and lengths.max() > width:
        raise ValueError(f"a row of {int(lengths.max())} ids does not fit a width of {width}")
    # one pass over all ids, not one tensor per row: a GPU runs a batch of 256 rows faster than Python
    # copies them row by row
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum()))
    out = np.full((len(rows), width), pad_value, dtype=np.int64)
    out[np.arange(width)[None, :] < lengths[:, None]] = flat
    return torch.from_numpy(out)


def model_inputs(input_ids: Sequence[Sequence[int]], token_type_ids: Sequence[Sequence[int]] | None = None,
                 device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """`input_ids`, `attention_mask` and `token_type_ids` tensors for one batch of unpadded rows. When every
    row has the same length the mask is all ones, and `BertModel` drops it (no masking work at all)."""
    ids = pad_rows(input_ids)
    lengths = torch.tensor([len(r) for r in input_ids])
    mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
    types = pad_rows(token_type_ids) if token_type_ids is not None else torch.zeros_like(ids)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "token_type_ids": types.to(device)}


def run_bucketed(fn: Callable[[list[int]], Sequence[T]], lengths: Sequence[int],
                 max_tokens: int = DEFAULT_MAX_TOKENS, max_batch: int = DEFAULT_MAX_BATCH,
                 max_waste: float = MAX_WASTE) -> list[T]:
    """Call `fn(indices)` once per length bucket; `fn` returns one result per index, in the order given.
    Returns all results in input order."""
    results: list[Any] = [None] * len(lengths)
    for batch in plan_batches(lengths, max_tokens, max_batch, max_waste=max_waste):
        out = fn(batch)
        if len(out) != len(batch):
            raise RuntimeError(f"batch function returned {len(out)} results for {len(batch)} rows")
        for i, r in zip(batch, out):
            results[i] = r
    return results


def padding_ratio(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Padded tokens computed / real tokens (1.0 = no padding): how much a batching plan wastes."""
    real = sum(lengths)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches if b)
    return padded / real if real else 1.0
