"""CPU inference: a post-LN Transformer encoder layer (BERT's: attention, Add & Norm, a GELU feed-forward block,
Add & Norm) in one C call, fp32, int8 or bf16.

Why: at batch 1 on a short input the kernels themselves are fast, and the Python around them is not -- eleven
module calls a layer, operand checks before each of seven kernels, the views and transposes that cut q, k and v
out of the stacked projection and put the heads back. With the kernels stubbed out, all-MiniLM-L6-v2's layer cost
~125 us of that per call at one thread on the Intel Xeon (under load from other jobs), ~6% of a 70-token input's
time. `post_ln_layer` checks the layer's parts (the modules a family's block holds) and hands their tensors to
one C function that runs the same kernels in the same order (`cpu_kernels.post_ln_layer`): the same bits as the
modules one by one. Int8 layers (`Int8Linear`, all four on bertlab's int8 kernel at that row count) take the
same steps with the int8 GEMMs, and the GELU a C pass that `Int8Linear`'s own `activated` runs too (the modules
and the one call: the same bits); their attention is int8's: fp32, or on a CPU with native bf16 the bf16
dot products (`cpu_kernels.attention_bf16`, as the `bmm_bf16` kernel picks it). bf16 layers (a CPU with AVX-512
BF16 and no AMX: `PackedLinear`'s bf16 panel GEMM) take the bf16 GEMM, `attention_bf16`'s loops, and the bf16 C
passes the modules run too (`add_layer_norm_`, `gelu_`: each value rounded to bf16 as torch's two operators
would). On all-MiniLM-L6-v2 int8, one 70-token
row, one thread, under load, torch's profiler put torch's in-place GELU at ~300 us a layer and the views, slices
and new tensors between the kernels at ~310 us a layer, of ~23 ms a call (six layers) in all. Anything else --
training, autograd, bf16 layers on oneDNN's kernel (AMX's), a mix of int8 and fp32 layers, another attention kernel or activation, padded
rows held as a `TokenLayout`, heads the C attention does not take, a trace -- returns None and the family's
modules run as before.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .attention import AMX_SHORT_KEYS, LONG_KEYS, SHORT_KEYS, AttentionMask
from .cpu_kernels import (bf16_dot_available, cpu_isa, linear_bf16, linear_f32, loop_heads,
                          post_ln_layer as _post_ln_layer)
from .int8_linear import Int8Linear
from .packed_linear import GEMV_ROWS, PackedLinear

PANEL_KERNELS = {torch.float32: linear_f32, torch.bfloat16: linear_bf16}  # a PackedLinear's C GEMM by dtype


def panel_operands(layer: nn.Module, shape: tuple[int, int], dtype: torch.dtype = torch.float32) -> tuple | None:
    """A PackedLinear on the C GEMM of `dtype` (fp32's, or bf16's on AVX-512 BF16) mapping shape[0] -> shape[1]
    features: its panels and bias (fp32 for both), as `cpu_kernels.post_ln_layer` takes such a layer."""
    if (type(layer) is not PackedLinear or layer.panels is None or layer.panels.dtype != dtype
            or (layer.in_features, layer.out_features) != shape or layer.kernel is not PANEL_KERNELS.get(dtype)
            or (dtype == torch.bfloat16 and shape[0] % 2)):  # (`linear_bf16` takes an even K)
        return None
    return layer.panels, layer.panel_bias, None, None, False


def int8_operands(layer: nn.Module, shape: tuple[int, int], rows: int) -> tuple | None:
    """An Int8Linear mapping shape[0] -> shape[1] features whose forward takes bertlab's int8 kernel at `rows`
    rows: its packed weight, bias, compensation, scales and whether its weights are narrowed, as
    `cpu_kernels.post_ln_layer` takes an int8 layer."""
    if type(layer) is not Int8Linear or (layer.in_features, layer.out_features) != shape:
        return None
    packed = layer.packed_for_rows(rows)
    if packed is None:
        return None
    weight, comp, narrow = packed
    return weight, layer.fbias, comp, layer.wscale, narrow


def _norm(norm: nn.Module, hidden: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
    if (type(norm) is not nn.LayerNorm or not norm.elementwise_affine or norm.bias is None
            or norm.normalized_shape != (hidden,) or norm.weight.dtype != dtype or norm.bias.dtype != dtype):
        return None
    return norm.weight, norm.bias


def post_ln_layer(x: torch.Tensor, mask: AttentionMask | None, qkv: nn.Module, heads: int, attention_kernel: str,
                  attention_out: nn.Module, norm1: nn.Module, ffn_in: nn.Module, activation: str,
                  ffn_out: nn.Module, norm2: nn.Module, scale: float | None = None) -> torch.Tensor | None:
    """LayerNorm(y + FFN(y)) with y = LayerNorm(x + Attention(x) W_o + b_o) and FFN(y) = GELU(y W_1 + b_1) W_2 + b_2,
    for x (B, T, H) fp32 or bf16 and a bidirectional `mask` (key padding or none), in one C call: `qkv` the stacked
    (H -> 3H) projection, then the attention output, the two norms and the FFN's two layers, each a
    `PackedLinear` on the C fp32 GEMM (bf16: on the bf16 GEMM, a CPU with AVX-512 BF16 and no AMX), or each an
    `Int8Linear` on bertlab's int8 kernel (and nn.LayerNorm of x's dtype); `attention_kernel` must be "bmm" (whose
    C loops it runs: fp32's, or bf16's `attention_bf16`) or "bmm_bf16" (int8's on a CPU with native bf16: its bf16
    dot-product loops, or the fp32 ones where it takes them) and `activation` "gelu". Returns (B, T, H), or None
    where it does not apply (see the module docstring), the caller then running its modules."""
    dtype = x.dtype
    if (torch.is_grad_enabled() or attention_kernel not in ("bmm", "bmm_bf16") or activation != "gelu"
            or x.dim() != 3 or dtype not in (torch.float32, torch.bfloat16)
            or (dtype == torch.bfloat16 and (attention_kernel != "bmm" or not bf16_dot_available()))):
        return None
    B, T, H = x.shape
    if not 2 <= T < LONG_KEYS or H % heads or not loop_heads(H // heads):
        return None  # (one query: the decoding step's kernel; long rows: the modules, whose attention reads each
        # head's rows contiguous, see nn/attention.py LONG_KEYS; heads the C loops do not take)
    bf16_attention = False
    if attention_kernel == "bmm_bf16":  # what `attention.bmm_bf16_attention` runs for these fp32 rows
        bf16_attention = bf16_dot_available() and not (T <= AMX_SHORT_KEYS and cpu_isa() == "amx")
        if not bf16_attention and T > SHORT_KEYS:
            return None  # (its bf16 matmuls there: the modules)
    inter = getattr(ffn_in, "out_features", 0)
    norms = (_norm(norm1, H, dtype), _norm(norm2, H, dtype))
    shapes = ((qkv, (H, 3 * H)), (attention_out, (H, H)), (ffn_in, (H, inter)), (ffn_out, (inter, H)))
    if type(qkv) is Int8Linear:  # int8 layers: all four of them, each on bertlab's int8 kernel at B·T rows
        if dtype != torch.float32:
            return None
        linears = tuple(int8_operands(layer, shape, B * T) for layer, shape in shapes)
    else:
        linears = tuple(panel_operands(layer, shape, dtype) for layer, shape in shapes)
        if B * T <= GEMV_ROWS and any(getattr(layer, "plain", None) is not None for layer, _ in shapes):
            return None  # a few rows take the GEMV over a plain weight there: other sums
    if any(p is None for p in linears + norms):
        return None
    add = None
    if mask is not None:
        if mask.kind != "bidirectional" or mask.documents is not None:
            return None
        add = mask.additive(T, T, dtype, x.device)  # (B, 1, 1, T) or None, as the modules' attention takes it
    scale = scale if scale is not None else 1.0 / math.sqrt(H // heads)
    return _post_ln_layer(x, add, heads, scale, linears, norms[0] + norms[1], (norm1.eps, norm2.eps), inter,
                          bf16_attention)
