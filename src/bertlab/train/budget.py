"""A learning-rate schedule that ends at a wall-clock budget, however fast the machine turns out to be.

A run given `--time-budget` first fits its step count to step times measured before training
(`setup.fit_steps_to_budget`). On a machine shared with other jobs the speed then changes, and a plan
made at the start either stops at the budget with the learning rate still high (the decay, which is
worth a good part of the final accuracy, never happens) or ends early. So the plan is re-fitted as the
run goes:

    every `interval` seconds   steps/s over the last two intervals (every 1% of the budget until the
                               first change, so a first fit far too short is caught before it ends)
                               -> the steps that still fit before
                               (1 - REFIT_RESERVE) of the budget -> the run's new last step; the decay
                               continues linearly from the present learning rate to 0 at that step
                               (no jump), and the loop's `max_steps` moves with it

Each refit is a decision recorded in the schedule's state -- `RefittedLinearDecay.segments`, saved with
every checkpoint by `LambdaLR.state_dict` -- together with the timing window it was made from, so a
resumed run continues the same learning-rate curve exactly; what it decides afterwards depends only on
the (restored) elapsed time and its own clock readings. The clock is injected (the trainer's elapsed
training time, summed over resumed sessions), which is also how the tests replay a run exactly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from ..core.errors import ConfigError
log = logging.getLogger(__name__)

# Share of the budget the re-fitted plan leaves free. The first fit keeps setup.BUDGET_RESERVE (8%) for what a
# timing of a few steps cannot see; a plan re-measured every 5% of the run needs only a margin for the last
# interval's changes and the final evaluation (the loop stops at the budget itself in any case).
REFIT_RESERVE = 0.03


class RefittedLinearDecay:
    """LR multiplier: linear warmup over `warmup_steps`, the peak held, then linear decay along `segments`.

    `decay_fraction` is the share of the post-warmup steps over which the rate decays: 1.0 is the paper's
    warmup-then-linear-decay; below 1 the peak is held first (warmup-stable-decay), so re-fits of a budgeted
    run that come while the rate is still at its peak move the end without lowering the rate early -- a
    pessimistic first plan would otherwise decay it from the start, and BERT-Tiny then stays on the
    frequent-word plateau (docs/guide/pretraining.md: the demo).

    `segments` is a list of [start_step, multiplier_at_start, end_step]: from `start_step` on, the multiplier
    falls linearly from `multiplier_at_start` to 0 at `end_step`. The first segment is the current plan,
    [decay_start, 1.0, total]; a refit made before the decay started re-makes it; one made during the decay
    appends a segment beginning at that step, at the multiplier the curve had there, so the learning rate never
    jumps. A plain attribute object: `LambdaLR.state_dict` saves its `__dict__` (numbers, lists of numbers:
    `weights_only`-loadable)."""

    def __init__(self, warmup_steps: int, total_steps: int, decay_fraction: float = 1.0):
        if total_steps < 1 or not 0 <= warmup_steps <= total_steps:
            raise ConfigError(f"schedule: need 0 <= warmup_steps ({warmup_steps}) <= total_steps ({total_steps}), "
                              "total_steps >= 1")
        if not 0 < decay_fraction <= 1:
            raise ConfigError(f"schedule: decay fraction must be in (0, 1], got {decay_fraction}")
        self.warmup_steps = int(warmup_steps)
        self.decay_fraction = float(decay_fraction)
        self.segments: list[list[float]] = [self._first_segment(int(total_steps))]

    def _first_segment(self, total_steps: int) -> list[float]:
        decay_start = total_steps - int(round(self.decay_fraction * (total_steps - self.warmup_steps)))
        return [max(self.warmup_steps, decay_start), 1.0, total_steps]

    @property
    def total_steps(self) -> int:
        return int(self.segments[-1][2])

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return step / self.warmup_steps
        if step < self.segments[0][0]:
            return 1.0  # the stable phase before the decay
        start, mult, end = self.segments[0]
        for segment in reversed(self.segments):  # the latest decision made at or before `step`
            if step >= segment[0]:
                start, mult, end = segment
                break
        return max(0.0, mult * (end - step) / max(1, end - start))

    def refit(self, step: int, total_steps: int) -> None:
        """From `step` on, end at `total_steps` (`step` itself: end now). While the rate is still at its peak
        (warmup, or the stable phase) the plan is re-made; during the decay the decay continues from here."""
        total_steps = max(int(total_steps), int(step), self.warmup_steps)
        first = self._first_segment(total_steps)
        if len(self.segments) == 1 and step <= max(self.warmup_steps, min(self.segments[0][0], first[0])):
            self.segments = [first]
        else:
            self.segments.append([int(step), self(step), total_steps])


class BudgetScheduler(torch.optim.lr_scheduler.LambdaLR):
    """`LambdaLR` over a `RefittedLinearDecay` that re-fits the run's length to `budget_s` seconds.

    `clock()` returns the seconds of training so far (the trainer's `elapsed`, set with `attach`);
    `loop_config.max_steps` is kept equal to the plan's last step, so the loop stops where the learning
    rate reaches 0. `on_refit(old_total, new_total, step)` is told about each change (progress, logs)."""

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, budget_s: float,
                 interval_s: float | None = None, reserve: float = REFIT_RESERVE, decay_fraction: float = 1.0,
                 most_steps: int | None = None):
        self.plan = RefittedLinearDecay(warmup_steps, total_steps, decay_fraction)
        # A run planned by its work (`--steps` with `--time-budget`): the budget is a cap that can shorten the
        # plan, never lengthen it, so on any machine fast enough the run is the same `most_steps` steps.
        self.most_steps = int(most_steps) if most_steps else None
        self.budget_s = float(budget_s)
        self.reserve = float(reserve)
        # About 20 refits per run: often enough to follow a changing load, each from a window long enough
        # (two intervals) to average over evaluations and checkpoints.
        self.interval_s = float(interval_s if interval_s is not None else max(2.0, budget_s / 20))
        self.samples: list[list[float]] = []  # [elapsed, completed steps] at each refit point: the timing window
        self.refits = 0
        self._clock: Callable[[], float] | None = None
        self._loop_config: Any = None
        self._on_refit: Callable[[int, int, int], None] | None = None
        super().__init__(optimizer, self.plan)

    def attach(self, clock: Callable[[], float], loop_config: Any = None,
               on_refit: Callable[[int, int, int], None] | None = None) -> None:
        self._clock, self._loop_config, self._on_refit = clock, loop_config, on_refit
        if not self.samples:  # the start of the timing window (a resumed run restores its own)
            self.samples.append([float(clock()), self.last_epoch])  # elapsed time after that many steps
        self._sync_loop()

    @property
    def total_steps(self) -> int:
        return self.plan.total_steps

    def _sync_loop(self) -> None:
        if self._loop_config is not None:
            self._loop_config.max_steps = self.plan.total_steps

    def step(self, epoch: Any = None) -> None:  # type: ignore[override]
        # LambdaLR's constructor calls step() once, before the attributes below exist: no refit then.
        if getattr(self, "_clock", None) is not None and epoch is None:
            self._maybe_refit(self.last_epoch + 1)  # optimizer steps completed so far
        super().step() if epoch is None else super().step(epoch)

    def _maybe_refit(self, done: int) -> None:
        # The clock is the trainer's elapsed time, which the loop updates after this call: it covers the
        # steps before the current one, so each sample pairs it with `done - 1`.
        now, timed = float(self._clock()), done - 1
        if not self.samples:
            self.samples.append([now, timed])
            return
        # Due every interval; until the plan first changes, every 1% of the budget, so that a first fit
        # from a slow timing (a plan far too short) is corrected before it ends.
        due = self.interval_s if self.refits else min(self.interval_s, max(0.5, self.budget_s / 100))
        if now - self.samples[-1][0] < due:
            return
        self.samples = (self.samples + [[now, timed]])[-3:]  # the window: the last two checks back from now
        t0, s0 = self.samples[0]
        if timed <= s0 or now <= t0:
            return
        seconds_per_step = (now - t0) / (timed - s0)
        left = (1 - self.reserve) * self.budget_s - now
        new_total = timed + max(1, int(left / seconds_per_step))  # the current step is the last one left
        if self.most_steps is not None:
            new_total = min(new_total, self.most_steps)
        old_total = self.plan.total_steps
        # Small corrections are noise; near the end every step counts, so the threshold shrinks with it.
        if abs(new_total - old_total) < max(1, 0.01 * (old_total - done)):
            return
        self.plan.refit(done, new_total)
        self.refits += 1
        self._sync_loop()
        if self._on_refit is not None:
            self._on_refit(old_total, self.plan.total_steps, done)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        for key in ("_clock", "_loop_config", "_on_refit", "plan"):  # code and objects, not state
            state.pop(key, None)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        hooks = self._clock, self._loop_config, self._on_refit
        super().load_state_dict(state_dict)  # restores the plan through lr_lambdas, and our numbers
        self.plan = self.lr_lambdas[0]
        self._clock, self._loop_config, self._on_refit = hooks
        self._sync_loop()
