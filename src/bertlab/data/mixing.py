"""Multi-task mixing: how often each task's batch is drawn when several tasks train one model.

The rules of T5 (Raffel et al., 2020, section 3.5.2), also what MT-DNN-style multi-task fine-tuning needs:

    proportional   r_m = min(e_m, K) / Σ_n min(e_n, K): examples-proportional, each task's size capped at
                   the artificial limit K (None: no cap), so a huge task does not drown the others
    temperature    r_m ∝ (min(e_m, K) / Σ_n min(e_n, K))^(1/T): T = 1 is proportional, T -> ∞ equal
    equal          r_m = 1 / M

`mixing_rates` gives the rates; `task_schedule` draws a seeded sequence of task indices from them (one per
batch), so the order of tasks is reproducible and independent of everything else's randomness.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MIXING_RULES = ("proportional", "temperature", "equal")


def mixing_rates(sizes: Sequence[int], rule: str = "proportional", limit: int | None = None,
                 temperature: float = 1.0) -> list[float]:
    """The share of batches each task gets (sums to 1), from the tasks' example counts `sizes`."""
    if rule not in MIXING_RULES:
        raise ValueError(f"mixing rule must be one of {', '.join(MIXING_RULES)}, got {rule!r}")
    if not sizes or any(s < 0 for s in sizes) or sum(sizes) == 0:
        raise ValueError(f"mixing needs task sizes >= 0, not all 0; got {list(sizes)}")
    if rule == "equal":
        return [1.0 / len(sizes)] * len(sizes)
    capped = np.array([min(s, limit) if limit is not None else s for s in sizes], dtype=np.float64)
    rates = capped / capped.sum()
    if rule == "temperature":
        if not temperature > 0:
            raise ValueError(f"mixing temperature must be positive, got {temperature}")
        rates = rates ** (1.0 / temperature)
        rates /= rates.sum()
    return rates.tolist()


def task_schedule(rates: Sequence[float], batches: int, seed: int) -> list[int]:
    """`batches` task indices drawn independently with probabilities `rates`, from their own seeded generator."""
    rng = np.random.default_rng(seed)
    return rng.choice(len(rates), size=batches, p=np.asarray(rates) / np.sum(rates)).tolist()
