"""Relative position bias (Shaw et al., 2018; T5's simplified form, Raffel et al., 2020, section 2.1).

Instead of position embeddings added to the input, each attention head adds a learned scalar to the score of
query i and key j that depends only on the offset j - i, looked up from a small table of "buckets": offsets
near zero get a bucket each, farther ones share log-spaced buckets, and everything beyond `max_distance`
falls into the last one. The table is (num_buckets, num_heads); a model owns it (T5: in the first layer of
each stack) and every layer of that stack adds the same bias.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def relative_position_bucket(relative_position: torch.Tensor, bidirectional: bool = True, num_buckets: int = 32,
                             max_distance: int = 128) -> torch.Tensor:
    """Offsets (key - query) -> bucket ids in [0, num_buckets). Mesh TensorFlow's function, as T5 trained with:

        bidirectional: half the buckets for keys after the query (offset > 0), half for the rest; n = |offset|
        one-directional (a decoder): only offsets <= 0 exist; n = max(-offset, 0)
        then, with B buckets left and exact = B // 2:
            n <  exact:   bucket n                                            (one bucket per offset)
            n >= exact:   bucket min(B - 1, exact + floor(log(n / exact) / log(max_distance / exact)
                                                          · (B - exact)))    (log-spaced up to max_distance)
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).to(torch.long) * num_buckets
        n = relative_position.abs()
    else:
        n = -torch.clamp(relative_position, max=0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    # float division by max_exact before the log, as the reference does (n = 0 is small, its log unused)
    if_large = max_exact + (torch.log(n.float() / max_exact) / math.log(max_distance / max_exact)
                            * (num_buckets - max_exact)).to(torch.long)
    if_large = torch.clamp(if_large, max=num_buckets - 1)
    return buckets + torch.where(is_small, n, if_large)


def relative_position_bias(table: nn.Embedding, query_length: int, key_length: int, bidirectional: bool,
                           max_distance: int, query_offset: int = 0, num_buckets: int | None = None) -> torch.Tensor:
    """The additive attention bias (1, num_heads, query_length, key_length) from a (num_buckets, num_heads)
    table. Query i sits at position `query_offset + i` (a decoder step with a cache of `query_offset` keys).
    `num_buckets`: the buckets offsets are sorted into, when a model fixes them apart from its table's size."""
    device = table.weight.device
    query = torch.arange(query_offset, query_offset + query_length, dtype=torch.long, device=device)[:, None]
    key = torch.arange(key_length, dtype=torch.long, device=device)[None, :]
    buckets = relative_position_bucket(key - query, bidirectional, num_buckets or table.num_embeddings,
                                       max_distance)  # (T_q, T_k)
    return table(buckets).permute(2, 0, 1).unsqueeze(0)  # (T_q, T_k, nh) -> (1, nh, T_q, T_k)
