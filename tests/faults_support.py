"""Signals in the middle of a run, for the interrupt-and-resume tests: a patched function or generator sends
SIGINT (Ctrl-C) or SIGTERM (a scheduler) to this process at its n-th call or item, as a user would mid-step."""

from __future__ import annotations

import os
import signal


def signal_on_call(patched, owner, name: str, n: int, sig: int = signal.SIGINT) -> dict[str, int]:
    """Patch `owner.name` (a function, or a method on a class) so that its n-th call sends `sig` first;
    returns the running call count ({"n": ...}). `patched`: a pytest MonkeyPatch (or its context)."""
    original, count = getattr(owner, name), {"n": 0}

    def calling(*args, **kwargs):
        count["n"] += 1
        if count["n"] == n:
            os.kill(os.getpid(), sig)
        return original(*args, **kwargs)

    patched.setattr(owner, name, calling)
    return count


def signal_on_item(patched, owner, name: str, n: int, sig: int = signal.SIGINT) -> dict[str, int]:
    """Patch the generator function `owner.name` so that its n-th item, counted over all its calls, sends
    `sig` before it is yielded; returns the running item count (n = -1: only count)."""
    original, count = getattr(owner, name), {"n": 0}

    def counting(*args, **kwargs):
        for item in original(*args, **kwargs):
            count["n"] += 1
            if count["n"] == n:
                os.kill(os.getpid(), sig)
            yield item

    patched.setattr(owner, name, counting)
    return count


def check_pretraining_resumes_bitwise(patched, tmp_path, args, objective: str) -> None:
    """`bertlab pretrain` with `args(out)` (argv for a run directory, 6 steps, a checkpoint every 2): a run sent
    SIGINT in step 4 and then resumed ends with the weights of an uninterrupted run, every step logged once.
    `patched`: a pytest MonkeyPatch; `objective`: the registered objective whose loss the signal interrupts."""
    import torch
    from safetensors.torch import load_file

    from bertlab.cli import main
    from bertlab.objectives import get_objective
    from bertlab.train import read_metrics

    reference, run = tmp_path / "reference", tmp_path / "run"
    assert main(args(reference)) == 0
    with patched.context() as p:
        signal_on_call(p, type(get_objective(objective)), "loss", 4)  # SIGINT during step 4, as Ctrl-C
        assert main(args(run)) == 130
    assert not (run / "final").exists()
    assert main(["--log-level", "WARNING", "pretrain", "--out", str(run), "--resume", "--no-progress",
                 "--num-workers", "0"]) == 0
    a, b = (load_file(str(d / "final" / "model.safetensors")) for d in (reference, run))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["step"] for r in read_metrics(run) if "loss" in r] == list(range(1, 7))
