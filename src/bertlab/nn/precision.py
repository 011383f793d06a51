"""Precision names, as the command line and run configs spell them, and the torch dtypes they stand for --
one map for training (autocast) and inference (the model's cast) alike -- and whether this CPU computes in
bf16 natively."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def dtype_of(precision: str) -> torch.dtype:
    """`bf16` -> torch.bfloat16; a ValueError naming the known names for anything else."""
    try:
        return DTYPES[precision]
    except KeyError:
        raise ValueError(f"unknown precision {precision!r}; expected one of {', '.join(DTYPES)}") from None


# oneDNN's ISA caps (`ONEDNN_MAX_CPU_ISA`) below its first level with bf16 dot products: a process held to one of
# these computes bf16 as a CPU without them would (emulated), whatever /proc/cpuinfo says.
_ONEDNN_CAPS_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")

# bertlab's kernel levels (`BERTLAB_CPU_ISA`) without its bf16 kernels
_KERNEL_LEVELS_WITHOUT_BF16 = ("none", "avx2", "avxvnni")


@functools.cache  # once per process
def _cpuinfo_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(f in flags for f in ("avx512_bf16", "amx_bf16"))


def cpu_has_native_bf16() -> bool:
    """Whether this CPU has bf16 dot products (AVX-512 BF16 or AMX) and this process may use them; without them
    bf16 math is emulated and slower than fp32. A process held below them -- oneDNN by `ONEDNN_MAX_CPU_ISA`, or
    bertlab's kernels by `BERTLAB_CPU_ISA` (an AVX2 laptop stood in for on a server CPU) -- is answered as that
    CPU would be, so it picks what that CPU would run."""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").upper()
    if cap in _ONEDNN_CAPS_WITHOUT_BF16:
        return False
    if os.environ.get("BERTLAB_CPU_ISA", "").lower() in _KERNEL_LEVELS_WITHOUT_BF16:
        return False
    return _cpuinfo_has_bf16()
