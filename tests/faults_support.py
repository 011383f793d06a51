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
