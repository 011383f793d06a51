"""Root-mean-square layer normalisation (Zhang & Sennrich, 2019), as T5 uses it:

    y = w · x / sqrt(mean(x²) + ε)

scale only: no mean subtraction and no bias. The mean of squares is taken in fp32 whatever the input's dtype
(a bf16/fp16 sum over d_model values loses too much), and the result is cast back to the weight's dtype when
the weight is half precision -- Hugging Face's `T5LayerNorm`, so the numbers are the same.
"""

from __future__ import annotations

import torch
from torch import nn

from . import cpu_kernels


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if (y := cpu_kernels.rms_norm(x, weight, eps)) is not None:  # fp32 inference: one C call (equal to ~1e-7)
        return y
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)  # (..., 1), fp32
    x = x * torch.rsqrt(variance + eps)  # fp32 (promoted)
    if weight.dtype in (torch.float16, torch.bfloat16):
        x = x.to(weight.dtype)
    return weight * x


class RMSNorm(nn.Module):
    """`rms_norm` with a learned per-channel scale, initialised to 1. The parameter is `weight` (HF's name)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.eps}"
