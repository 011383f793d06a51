"""Precision names, as the command line and run configs spell them, and the torch dtypes they stand for --
one map for training (autocast) and inference (the model's cast) alike."""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def dtype_of(precision: str) -> torch.dtype:
    """`bf16` -> torch.bfloat16; a ValueError naming the known names for anything else."""
    try:
        return DTYPES[precision]
    except KeyError:
        raise ValueError(f"unknown precision {precision!r}; expected one of {', '.join(DTYPES)}") from None
