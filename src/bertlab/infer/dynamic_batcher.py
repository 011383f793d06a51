"""Dynamic batching for the service: concurrent requests' items are merged into one model call.

A request hands its items (and how many tokens they hold) to `DynamicBatcher.submit` and awaits its results.
One collector task per batcher takes the oldest waiting request, then keeps taking requests in arrival order
until the next one would pass `max_tokens` tokens or `max_items` items, or `max_wait` seconds have passed,
and runs `fn(all items)` on the model thread (one thread shared by every batcher: the model computes one
batch at a time, with all its CPU cores, while the event loop keeps accepting connections). While a batch
computes, new requests queue up and form the next batch -- so under load the batches grow by themselves up to
the token budget, and when idle a lone request waits at most `max_wait`. Inside a model call the items are
sorted by length into forward passes (`length_buckets.py`), so a larger batch also wastes less on padding.

Errors stay with the request that caused them: when a merged batch raises, each request is retried on its
own and only the failing ones get the exception. A request whose future was cancelled (its client timed out
or went away) is dropped before it is computed. `Limits` holds the service's limits, batching and
back-pressure included (kept here, free of the web framework, so `bertlab serve --help` works without it).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class Limits:
    """The service's limits (`bertlab serve` flags): request size, how requests are merged, back-pressure."""

    max_body_bytes: int = 1 << 20  # 1 MiB
    max_items: int = 64  # texts / questions per request (TEI: max_client_batch_size)
    max_text_chars: int = 100_000  # characters per text (a context or a long document may be long)
    max_batch_items: int = 256  # items merged into one model call
    max_wait_ms: float = 2.0  # how long a lone request waits for company
    max_batch_tokens: int = 8192  # tokens merged into one model call (TEI's --max-batch-tokens)
    max_concurrent_requests: int = 512  # requests queued or computing; more get 429 (TEI's flag of that name)
    request_timeout_s: float = 60.0  # a request not answered by then gets 504 and is dropped from the queue

    def __post_init__(self) -> None:
        from ..core.errors import BertlabError

        for name in ("max_body_bytes", "max_items", "max_text_chars", "max_batch_items", "max_batch_tokens",
                     "max_concurrent_requests"):
            if getattr(self, name) < 1:
                raise BertlabError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if self.max_wait_ms < 0 or self.request_timeout_s <= 0:
            raise BertlabError("--max-wait-ms must be >= 0 and --request-timeout positive")


@dataclass
class BatcherStats:
    requests: int = 0
    items: int = 0
    tokens: int = 0
    batches: int = 0
    largest_batch: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "items": self.items, "tokens": self.tokens, "batches": self.batches,
                "mean_items_per_batch": round(self.items / self.batches, 2) if self.batches else 0.0,
                "largest_batch": self.largest_batch}


@dataclass
class _Pending:
    items: list
    tokens: int
    future: asyncio.Future


@dataclass
class DynamicBatcher:
    """`await batcher.submit(items, tokens)` -> `fn(items)`'s results for those items, computed together with
    other requests' items. `fn` takes a list and returns a list of the same length. `on_batch(items, tokens)`
    is told the size of every model call (metrics)."""

    fn: Callable[[list], Sequence[Any]]
    executor: Executor = field(default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="bertlab-model"))
    max_items: int = 256
    max_wait: float = 0.002
    max_tokens: int = 1 << 62
    stats: BatcherStats = field(default_factory=BatcherStats)
    on_batch: Callable[[int, int], None] | None = None

    def __post_init__(self) -> None:
        self._pending: deque[_Pending] = deque()
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    @property
    def waiting(self) -> int:
        """Requests queued, not yet in a model call."""
        return len(self._pending)

    async def submit(self, items: list, tokens: int = 0) -> list:
        loop = asyncio.get_running_loop()
        if self._task is None:  # created on first use, inside the server's event loop
            self._wakeup = asyncio.Event()
            self._task = loop.create_task(self._collect())
        future = loop.create_future()
        self._pending.append(_Pending(list(items), tokens, future))
        self._wakeup.set()
        return await future

    def _fits(self, items: int, tokens: int, nxt: _Pending) -> bool:
        return items + len(nxt.items) <= self.max_items and tokens + nxt.tokens <= self.max_tokens

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
            deadline = loop.time() + self.max_wait
            # Wait for company until the budget is full or the deadline passes (an Event wait is safe to
            # time out: nothing is taken from the queue until the group is formed below).
            while loop.time() < deadline and self._budget_open():
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), deadline - loop.time())
                except asyncio.TimeoutError:
                    break
            group = [self._pending.popleft()]  # the oldest always goes, whatever its size
            items, tokens = len(group[0].items), group[0].tokens
            while self._pending and self._fits(items, tokens, self._pending[0]):
                nxt = self._pending.popleft()
                group.append(nxt)
                items, tokens = items + len(nxt.items), tokens + nxt.tokens
            group = [p for p in group if not p.future.done()]  # timed out or the client went away
            if group:
                await self._run(group)

    def _budget_open(self) -> bool:
        items = sum(len(p.items) for p in self._pending)
        tokens = sum(p.tokens for p in self._pending)
        return items < self.max_items and tokens < self.max_tokens

    async def _run(self, group: list[_Pending]) -> None:
        loop = asyncio.get_running_loop()
        items = [x for p in group for x in p.items]
        tokens = sum(p.tokens for p in group)
        self.stats.requests += len(group)
        self.stats.items += len(items)
        self.stats.tokens += tokens
        self.stats.batches += 1
        self.stats.largest_batch = max(self.stats.largest_batch, len(items))
        if self.on_batch is not None:
            self.on_batch(len(items), tokens)
        try:
            results = await loop.run_in_executor(self.executor, self.fn, items)
        except Exception as merged_error:  # noqa: BLE001 -- sorted out per request below
            if len(group) == 1:
                _settle(group[0].future, error=merged_error)
                return
            for p in group:  # find who caused it; the others still get their answers
                try:
                    _settle(p.future, await loop.run_in_executor(self.executor, self.fn, p.items))
                except Exception as e:  # noqa: BLE001
                    _settle(p.future, error=e)
            return
        start = 0
        for p in group:
            _settle(p.future, list(results[start:start + len(p.items)]))
            start += len(p.items)


def _settle(future: asyncio.Future, result: Any = None, error: BaseException | None = None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
