"""Length bucketing and the service's dynamic batcher: pure logic, no model."""

from __future__ import annotations

import asyncio
import random

import pytest

from bertlab.infer import length_buckets
from bertlab.infer.dynamic_batcher import DynamicBatcher


def test_plan_batches_covers_every_row_once_within_budget():
    rng = random.Random(0)
    lengths = [rng.randint(1, 128) for _ in range(500)]
    plan = length_buckets.plan_batches(lengths, max_tokens=1024, max_batch=32)
    assert sorted(i for b in plan for i in b) == list(range(500))
    for b in plan:
        assert len(b) <= 32
        assert len(b) * max(lengths[i] for i in b) <= 1024 or len(b) == 1


def test_bucketing_removes_most_padding():
    rng = random.Random(1)
    lengths = [rng.randint(16, 128) for _ in range(1000)]
    naive = [list(range(i, min(i + 32, 1000))) for i in range(0, 1000, 32)]
    assert length_buckets.padding_ratio(lengths, naive) > 1.5  # the waste bucketing is for
    bucketed = length_buckets.plan_batches(lengths, max_tokens=4096, max_batch=256)
    assert length_buckets.padding_ratio(lengths, bucketed) < 1.03


def test_unsorted_plan_keeps_input_order_and_long_rows_alone():
    assert length_buckets.plan_batches([5, 1, 9], max_tokens=100, sort=False) == [[0, 1, 2]]
    assert length_buckets.plan_batches([500, 2, 2], max_tokens=100) == [[1, 2], [0]]
    with pytest.raises(ValueError):
        length_buckets.plan_batches([1], max_tokens=0)


def test_run_bucketed_returns_results_in_input_order():
    lengths = [7, 3, 9, 1, 3]
    calls = []

    def fn(idx):
        calls.append(idx)
        return [f"row{i}" for i in idx]

    assert length_buckets.run_bucketed(fn, lengths, max_tokens=9) == [f"row{i}" for i in range(5)]
    assert calls[0][0] == 3  # shortest first


def test_model_inputs_mask_and_padding():
    x = length_buckets.model_inputs([[1, 2, 3], [4]], [[0, 0, 1], [0]])
    assert x["input_ids"].tolist() == [[1, 2, 3], [4, 0, 0]]
    assert x["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert x["token_type_ids"].tolist() == [[0, 0, 1], [0, 0, 0]]


def test_dynamic_batcher_merges_concurrent_requests_and_isolates_errors():
    seen = []

    def fn(items):
        seen.append(list(items))
        if "bad" in items:
            raise ValueError("bad item")
        return [x.upper() for x in items]

    async def main():
        b = DynamicBatcher(fn, max_items=100, max_wait=0.05)
        results = await asyncio.gather(b.submit(["a", "b"]), b.submit(["c"]), b.submit(["bad"]),
                                       b.submit(["d"]), return_exceptions=True)
        return b, results

    b, results = asyncio.run(main())
    assert results[0] == ["A", "B"] and results[1] == ["C"] and results[3] == ["D"]
    assert isinstance(results[2], ValueError)
    assert seen[0] == ["a", "b", "c", "bad", "d"]  # all four requests in one merged call first
    assert b.stats.requests == 4 and b.stats.batches == 1
