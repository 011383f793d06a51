"""Element-wise pieces of a Transformer block, written for speed on a CPU without changing the numbers:
activations by their config names (also overwriting their input; `linear_activate` lets the linear layer before
them apply one as it computes, to ~1e-6 of torch's), inverted dropout with a cheap mask, a residual add into a
buffer nothing else needs, and the post-LN sub-layer's "Add & Norm" in one pass."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .cpu_kernels import add_layer_norm_, gelu_, gelu_tanh_

ACTIVATIONS = {
    "gelu": nn.GELU(),  # exact: x · Φ(x), with the erf, as Google's `gelu`
    "gelu_new": nn.GELU(approximate="tanh"),
    "gelu_pytorch_tanh": nn.GELU(approximate="tanh"),
    "relu": nn.ReLU(),
    "silu": nn.SiLU(),
    "swish": nn.SiLU(),
    "tanh": nn.Tanh(),
}


def gelu_tanh_inplace(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh form in place: a C pass where it applies (fp32 or bf16 on the CPU, `cpu_kernels.gelu_tanh_`:
    within 6e-7 of the formula, as torch's own is within 4.3e-7; the pass a decoder layer's one-call step runs, so
    both give the same bits), torch's otherwise."""
    if (y := gelu_tanh_(x)) is not None:
        return y
    return torch.ops.aten.gelu_(x, approximate="tanh")


def gelu_inplace(x: torch.Tensor) -> torch.Tensor:
    """The exact GELU in place: for bf16 on the CPU a C pass (`cpu_kernels.gelu_`: each value widened, the fp32
    formula within 1.4e-6 of the exact GELU, rounded once, as torch's bf16 gelu rounds its fp32 result; torch's
    took ~1 ns a value, ~5% of a bf16 MiniLM pass), torch's otherwise (fp32's GELU is mostly its GEMM's epilogue,
    `linear_activate`)."""
    if x.dtype == torch.bfloat16 and (y := gelu_(x)) is not None:
        return y
    return torch.ops.aten.gelu_(x)


# The same functions overwriting their input. Without autograd (inference) the FFN's widest tensor, (B, T, 4H),
# then needs one buffer instead of two: on a CPU a fresh buffer that size costs page faults, and the extra
# allocation was ~10% of a MiniLM forward pass.
INPLACE_ACTIVATIONS = {
    "gelu": gelu_inplace,
    "gelu_new": gelu_tanh_inplace,
    "gelu_pytorch_tanh": gelu_tanh_inplace,
    "relu": torch.relu_,
    "silu": lambda x: F.silu(x, inplace=True),
    "swish": lambda x: F.silu(x, inplace=True),
    "tanh": torch.tanh_,
}


def activate(h: torch.Tensor, name: str) -> torch.Tensor:
    """`ACTIVATIONS[name](h)`, in place when autograd does not need `h` for the backward pass."""
    if torch.is_grad_enabled() and h.requires_grad:
        return ACTIVATIONS[name](h)  # autograd keeps h for the backward pass
    return INPLACE_ACTIVATIONS[name](h)


def linear_activate(layer: nn.Module, x: torch.Tensor, name: str) -> torch.Tensor:
    """`activate(layer(x), name)`, a feed-forward block's first half. A layer that applies the activation as it
    computes (`activated(x, name)` not None: `PackedLinear`'s fp32 GEMM with its GELU epilogue) does: one call,
    and no pass of its own over the (B, T, 4H) output."""
    fused = getattr(layer, "activated", None)
    if fused is not None and (y := fused(x, name)) is not None:
        return y
    return activate(layer(x), name)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout. On the CPU the keep-mask comes from 16-bit slices of 64-bit random integers, which
    is ~10x faster than `F.dropout`'s per-element Bernoulli draws (dropout was a fifth of a BERT-Mini training
    step on CPU); p is quantised to 1/65536. In eval mode (or at p = 0) x itself, as `F.dropout` returns it;
    elsewhere `F.dropout`."""
    if not training or p == 0.0:
        return x  # what F.dropout returns here, without its call: a decoding step passes dozens of these
    if x.device.type != "cpu":
        return F.dropout(x, p, training)
    n = x.numel()
    bits = torch.randint(-2**63, 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64).view(torch.int16)[:n].view(x.shape)
    keep = bits >= round(p * 65536) - 32768  # P(int16 < t) = (t + 32768) / 65536 = p
    return x * (keep.to(x.dtype) * (1.0 / (1.0 - p)))


class Dropout(nn.Dropout):
    """`nn.Dropout` through `dropout` above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


def add_residual(y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """y + residual, written into y: neither a linear layer's nor dropout's backward needs its own output, so
    the sum can take y's buffer instead of a new (B, T, H) one. (Under autocast y may be bf16 and the residual
    fp32; the sum then needs the wider type and a new tensor.)"""
    if y.dtype != torch.promote_types(y.dtype, residual.dtype):
        return y + residual
    return y.add_(residual)


def add_and_norm(y: torch.Tensor, residual: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    """LayerNorm(y + residual): a post-LN sub-layer's output (Vaswani et al., 2017: "Add & Norm"), y being the
    sub-layer's own output after dropout. fp32 and bf16 inference on a CPU take one C pass written over y (1 call
    for torch's 2, and y + residual never makes a trip through memory of its own; bf16 rounded as torch's two
    calls round it); elsewhere `add_residual`, then `norm`."""
    if type(norm) is nn.LayerNorm and norm.elementwise_affine and (
            out := add_layer_norm_(y, residual, norm.weight, norm.bias, norm.eps)) is not None:
        return out
    return norm(add_residual(y, residual))
