"""What the torchrun tests' scripts share: a signal that reaches one process of the job alone."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

from bertlab.train.loop import Trainer


@contextlib.contextmanager
def signal_on_rank_0(rank: int) -> Iterator[None]:
    """As if Ctrl-C reached rank 0 alone during step 1 (set once its update is done): the stop flag travels with
    step 2's loss, so every process stops after step 2 with one checkpoint."""
    bound_heap = Trainer._bound_heap

    def signalled(self, micro_batches):
        bound_heap(self, micro_batches)
        if self.step == 0 and rank == 0:
            self._stop_signal = signal.SIGINT
    Trainer._bound_heap = signalled
    try:
        yield
    finally:
        Trainer._bound_heap = bound_heap
