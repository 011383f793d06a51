"""Precision names, as the command line and run configs spell them, and the torch dtypes they stand for --
one map for training (autocast) and inference (the model's cast) alike -- and whether this CPU computes in
bf16 natively."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def dtype_of(precision: str) -> torch.dtype:
    """`bf16` -> torch.bfloat16; a ValueError naming the known names for anything else."""
    try:
        return DTYPES[precision]
    except KeyError:
        raise ValueError(f"unknown precision {precision!r}; expected one of {', '.join(DTYPES)}") from None


@functools.cache  # once per process
def cpu_has_native_bf16() -> bool:
    """Whether this CPU has bf16 dot products (AVX-512 BF16 or AMX); without them bf16 math is emulated and
    slower than fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(f in flags for f in ("avx512_bf16", "amx_bf16"))
