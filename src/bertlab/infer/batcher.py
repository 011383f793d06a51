"""Dynamic batching for the service: concurrent requests' items are merged into one model call.

A request hands its items to `DynamicBatcher.submit` and awaits its results. One collector task per batcher
takes the first waiting request, then keeps taking requests until `max_items` items are gathered or
`max_wait` seconds have passed, and runs `fn(all items)` on the model thread (one thread shared by every
batcher: the model computes one batch at a time, with all CPU cores, while the event loop keeps accepting
connections). While a batch computes, new requests queue up and form the next batch -- so under load the
batches grow by themselves, and when idle a lone request waits at most `max_wait`.

Errors stay with the request that caused them: when a merged batch raises, each request is retried on its
own and only the failing ones get the exception. `Limits` holds the service's limits, batching included
(kept here, free of the web framework, so `bertlab serve --help` works without it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class Limits:
    """The service's limits (`bertlab serve` flags): request size, and how requests are merged."""

    max_body_bytes: int = 1 << 20  # 1 MiB
    max_items: int = 64  # texts / questions per request
    max_text_chars: int = 20_000  # characters per text (a context may be long; tokens are limited separately)
    max_batch_items: int = 256  # items merged into one model call
    max_wait_ms: float = 2.0  # how long a lone request waits for company


@dataclass
class BatcherStats:
    requests: int = 0
    items: int = 0
    batches: int = 0
    largest_batch: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "items": self.items, "batches": self.batches,
                "mean_items_per_batch": round(self.items / self.batches, 2) if self.batches else 0.0,
                "largest_batch": self.largest_batch}


@dataclass
class _Pending:
    items: list
    future: asyncio.Future


@dataclass
class DynamicBatcher:
    """`await batcher.submit(items)` -> `fn(items)`'s results for those items, computed together with other
    requests' items. `fn` takes a list and returns a list of the same length."""

    fn: Callable[[list], Sequence[Any]]
    executor: Executor = field(default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="bertlab-model"))
    max_items: int = 256
    max_wait: float = 0.002
    stats: BatcherStats = field(default_factory=BatcherStats)

    def __post_init__(self) -> None:
        self._queue: asyncio.Queue[_Pending] | None = None
        self._task: asyncio.Task | None = None

    async def submit(self, items: list) -> list:
        if self._queue is None:  # created on first use, inside the server's event loop
            self._queue = asyncio.Queue()
            self._task = asyncio.get_running_loop().create_task(self._collect())
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(list(items), future))
        return await future

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            group = [await self._queue.get()]
            count = len(group[0].items)
            deadline = loop.time() + self.max_wait
            while count < self.max_items:
                try:
                    timeout = deadline - loop.time()
                    nxt = self._queue.get_nowait() if timeout <= 0 else \
                        await asyncio.wait_for(self._queue.get(), timeout)
                except (asyncio.QueueEmpty, asyncio.TimeoutError):
                    break
                group.append(nxt)
                count += len(nxt.items)
            group = [p for p in group if not p.future.cancelled()]  # the client went away
            if group:
                await self._run(group)

    async def _run(self, group: list[_Pending]) -> None:
        loop = asyncio.get_running_loop()
        items = [x for p in group for x in p.items]
        self.stats.requests += len(group)
        self.stats.items += len(items)
        self.stats.batches += 1
        self.stats.largest_batch = max(self.stats.largest_batch, len(items))
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
