"""CPU inference: a pre-norm decoder layer's decoding step (T5's: RMSNorm before self-attention over a key/value
cache, before cross-attention to the encoder, before a feed-forward block -- ReLU, or v1.1's gated tanh GELU) in
one C call, fp32, int8 or bf16.

Why: a decoding step feeds one new position per sequence, so each layer's kernels are small (GEMVs at batch 1)
and the Python around them is not: t5-small's six decoder layers make ~40 linear-layer calls, 12 attention calls
and 19 norms a step, each through a module, its operand checks and the views that cut q, k and v out of the
stacked projection. At batch 1, two threads, on an Intel Xeon, that was ~2.1 ms a step (the GEMVs stubbed out)
against ~7.9 ms of GEMVs. In bf16 the modules' step also ran a dozen torch operators per norm and residual: on an
AMD EPYC (Zen 4) with AVX-512 BF16, whose bf16 GEMVs read half fp32's bytes at the same speed, bf16 generation ran
at 0.84x fp32's. `decoder_layer_step` checks the layer's parts once per generation -- the modules a family's
block holds, at the row count of that generation -- and returns a `DecoderLayerStep` whose call hands their
tensors to one C function (`cpu_kernels.decoder_layer_step`) running the kernels the modules call, in their
order: the same bits as the modules one by one. Each linear layer is what its module runs at that row count:
`PackedLinear`'s GEMV over the plain weight (up to `GEMV_ROWS` rows) or its panel GEMM (fp32, or bf16 on AVX-512
BF16), or `Int8Linear` on bertlab's int8 kernel; the norms `cpu_kernels.rms_norm`, the tanh GELU the C pass the
modules run too (`elementwise.gelu_tanh_inplace`); a bf16 step's attention `cpu_kernels.attention_bf16`, its
residual sums and gate products rounded to bf16 once each, as torch's bf16 operators. Anything else --
autograd, a bf16 layer on oneDNN's kernel (AMX's), another activation (the exact GELU: torch's in the modules),
an attention kernel other than the C loops' (`bmm`, `bmm_bf16`: one query per row runs `attention_one_query` in
both; bf16 `attention_bf16`, or SDPA on AMX's long rows: `attention.bf16_sdpa`), a self-attention mask beside the
position bias -- gives None (or the step returns None) and the family's modules run as before.
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import bf16_sdpa
from .cpu_kernels import (bf16_dot_available, cpu_isa, decoder_layer_step as _decoder_layer_step, f32_gemm_available,
                          loop_heads, tracing)
from .encoder_layer import int8_operands, panel_operands
from .int8_linear import Int8Linear
from .packed_linear import GEMV_ROWS, PackedLinear
from .rms_norm import RMSNorm

# The attention kernels whose one-query path is `cpu_kernels.attention_one_query` over fp32 operands
# (`cpu_kernels.attention_bf16` over bf16 ones)
ONE_QUERY_KERNELS = ("bmm", "bmm_bf16")
# The FFN activations the C step applies as the modules do (`elementwise.INPLACE_ACTIVATIONS`: torch's ReLU, the
# C pass of GELU's tanh form), by their config names -> csrc/kernels.h's BL_ACT_* codes
ACTIVATIONS = {"relu": 2, "gelu_new": 3, "gelu_pytorch_tanh": 3}
NO_LAYER = (None, None, None, None, False, False)


def _linear(layer: nn.Module | None, shape: tuple[int, int], rows: int, dtype: torch.dtype) -> tuple | None:
    """The C call's operands for `layer` mapping shape[0] -> shape[1] features at `rows` rows of `dtype`, as its
    module's forward computes them there: (weight, bias, comp, scale, narrow, gemv) -- the one-call encoder layer's
    int8 and fp32 panel operands (`encoder_layer`), bf16 panels with their fp32 bias, or a few rows' GEMV over the
    plain weight -- or None where it is none of these."""
    if type(layer) is Int8Linear:
        operands = int8_operands(layer, shape, rows) if dtype == torch.float32 else None
        return None if operands is None else (*operands, False)
    if type(layer) is not PackedLinear or (layer.in_features, layer.out_features) != shape:
        return None
    plain = layer.plain
    if rows <= GEMV_ROWS and plain is not None:  # PackedLinear.forward's GEMV (cpu_kernels.linear_few_rows)
        weight, bias = plain
        if (shape[0] % 16 == 0 and weight.dtype == dtype and weight.is_contiguous()
                and (bias is None or (bias.dtype == dtype and bias.is_contiguous()))):
            return weight.detach(), None if bias is None else bias.detach(), None, None, False, True
    operands = panel_operands(layer, shape, dtype)  # forward's panel GEMM: cpu_kernels.linear_f32 or linear_bf16
    return None if operands is None else (*operands, False)


def _norm(norm: nn.Module | None, hidden: int, dtype: torch.dtype) -> tuple[torch.Tensor, float] | None:
    if (type(norm) is not RMSNorm or norm.weight.dtype != dtype or norm.weight.shape != (hidden,)
            or not norm.weight.is_contiguous()):
        return None
    return norm.weight.detach(), float(norm.eps)


class DecoderLayerStep:
    """One decoder layer's decoding step over `rows` sequences in one C call (see `decoder_layer_step`)."""

    def __init__(self, rows: int, hidden: int, heads: int, head_size: int, cross: bool, dtype: torch.dtype,
                 operands: tuple, tensors: list):
        self.rows, self.hidden, self.heads, self.head_size, self.cross = rows, hidden, heads, head_size, cross
        self.dtype = dtype  # of the layer's weights, its input and output, caches and additive parts
        self.operands = operands  # the layer's part of the C call: sizes, pointers, eps, scale
        self._tensors = tensors  # what the pointers point into, kept alive with them

    def __call__(self, x: torch.Tensor, self_k: torch.Tensor, self_v: torch.Tensor, start: int,
                 self_add: torch.Tensor | None, cross_k: torch.Tensor | None = None,
                 cross_v: torch.Tensor | None = None, cross_add: torch.Tensor | None = None) -> torch.Tensor | None:
        """x (rows, 1, hidden): the new position's input -> (rows, 1, hidden), its keys and values written into
        the caches self_k, self_v (rows, T_max, inner) at `start`. `self_add` (1 | rows, heads, 1, start + 1): the
        scores' position bias; `cross_k`, `cross_v` (rows / G, T_enc, inner) the encoder's keys and values (G
        rows sharing one), `cross_add` (rows | 1, 1, 1, T_enc) the encoder's padding, or None. All of the step's
        dtype. None where the operands are not what the C call takes (the caller then runs the modules)."""
        rows, inner, dtype = self.rows, self.heads * self.head_size, self.dtype
        if (x.shape != (rows, 1, self.hidden) or x.dtype != dtype or not x.is_contiguous()
                or torch.is_grad_enabled() or tracing()):
            return None
        T_max = self_k.size(1)
        for cache in (self_k, self_v):
            if cache.shape != (rows, T_max, inner) or cache.dtype != dtype or not cache.is_contiguous():
                return None
        if not 0 <= start < T_max:
            return None
        add, add_rows, add_heads = None, 0, 0
        if self_add is not None:
            if (self_add.dim() != 4 or self_add.size(0) not in (1, rows) or self_add.size(1) not in (1, self.heads)
                    or self_add.size(3) != start + 1 or self_add.dtype != dtype or self_add.stride(3) != 1):
                return None
            add = self_add.data_ptr()
            add_rows = self_add.stride(0) if self_add.size(0) > 1 else 0
            add_heads = self_add.stride(1) if self_add.size(1) > 1 else 0
        ck = cv = ca = None
        group = T_enc = ca_rows = 0
        if self.cross:
            if cross_k is None or cross_v is None:
                return None
            B_enc, T_enc = cross_k.size(0), cross_k.size(1)
            for t in (cross_k, cross_v):
                if (t.shape != (B_enc, T_enc, inner) or t.dtype != dtype or not t.is_contiguous()
                        or B_enc == 0 or rows % B_enc):
                    return None
            group = rows // B_enc
            ck, cv = cross_k.data_ptr(), cross_v.data_ptr()
            if cross_add is not None:
                if (cross_add.dim() != 4 or cross_add.size(0) not in (1, rows) or cross_add.shape[1:3] != (1, 1)
                        or cross_add.size(3) != T_enc or cross_add.dtype != dtype or cross_add.stride(3) != 1):
                    return None
                ca = cross_add.data_ptr()
                ca_rows = cross_add.stride(0) if cross_add.size(0) > 1 else 0
        if bf16_sdpa(dtype, max(start + 1, T_enc)):
            return None  # the modules' attention is SDPA there (nn.attention.bmm_attention)
        out = torch.empty_like(x)
        _decoder_layer_step(x.data_ptr(), out.data_ptr(), rows, self_k.data_ptr(), self_v.data_ptr(), T_max, start,
                            add, add_rows, add_heads, ck, cv, ca, group, T_enc, ca_rows, self.operands, dtype)
        return out


def decoder_layer_step(rows: int, heads: int, norm_self: nn.Module, qkv: nn.Module, attention_out: nn.Module,
                       norm_ffn: nn.Module, ffn_in: nn.Module, activation: str, ffn_out: nn.Module,
                       attention_kernel: str, norm_cross: nn.Module | None = None, cross_q: nn.Module | None = None,
                       cross_out: nn.Module | None = None, ffn_gate: nn.Module | None = None,
                       scale: float = 1.0) -> DecoderLayerStep | None:
    """The decoding step of a pre-norm decoder layer over `rows` sequences in one C call, for inference:
    x + Attention(RMSNorm(x)) W_o over the key/value cache (`qkv` the stacked projection, heads of inner /
    `heads`), then x + CrossAttention(RMSNorm(x)) (where `norm_cross` is given: `cross_q`, `cross_out`; the keys
    and values the caller's), then x + act(RMSNorm(x) W_i) W_f -- or, with `ffn_gate` (T5 v1.1's gated FFN),
    x + (act(RMSNorm(x) W_i) * RMSNorm(x) W_g) W_f; `activation` a name in `ACTIVATIONS`; no biases needed (any
    there are added). fp32: each linear layer a `PackedLinear` or an `Int8Linear`, each norm an fp32 `RMSNorm`;
    bf16 (a CPU with AVX-512 BF16): each linear layer a bf16 `PackedLinear`, each norm a bf16 `RMSNorm`; one eps.
    Returns None where it does not apply (see the module docstring): the caller then runs its modules."""
    if (torch.is_grad_enabled() or tracing() or activation not in ACTIVATIONS
            or attention_kernel not in ONE_QUERY_KERNELS or cpu_isa() == "none" or not f32_gemm_available()
            or rows < 1 or type(norm_self) is not RMSNorm):
        return None
    dtype = norm_self.weight.dtype  # the model's: the norms' weights are the step's dtype
    if dtype not in (torch.float32, torch.bfloat16) or (dtype == torch.bfloat16 and not bf16_dot_available()):
        return None  # (bf16 attention runs on AVX-512 BF16's C loops only where the CPU has them)
    inner = getattr(qkv, "out_features", 0) // 3
    hidden = getattr(attention_out, "out_features", 0)
    inter = getattr(ffn_in, "out_features", 0)
    if not (inner and hidden and inter) or inner % heads:
        return None
    cross = norm_cross is not None
    gated = ffn_gate is not None
    shapes = [(qkv, (hidden, 3 * inner), True), (attention_out, (inner, hidden), True),
              (cross_q, (hidden, inner), cross), (cross_out, (inner, hidden), cross),
              (ffn_in, (hidden, inter), True), (ffn_gate, (hidden, inter), gated), (ffn_out, (inter, hidden), True)]
    linears = []
    for layer, shape, present in shapes:
        if not present:
            linears.append(NO_LAYER)
        elif (operands := _linear(layer, shape, rows, dtype)) is None:
            return None
        else:
            linears.append(operands)
    norms = [_norm(n, hidden, dtype) for n in (norm_self, norm_cross if cross else None, norm_ffn)]
    if norms[0] is None or norms[2] is None or (cross and norms[1] is None):
        return None
    if dtype == torch.bfloat16 and not loop_heads(inner // heads):
        return None  # attention_bf16's heads (the modules' torch formula elsewhere)
    eps = {n[1] for n in norms if n is not None}
    if len(eps) != 1:
        return None
    tensors = [t for operands in linears for t in operands[:4] if t is not None] + [n[0] for n in norms if n]
    pointers = []
    for operands in linears:
        pointers += [None if t is None else t.data_ptr() for t in operands[:4]] + [int(operands[4]), int(operands[5])]
    operands = (hidden, heads, inner // heads, inter, ACTIVATIONS[activation], *pointers,
                *(None if n is None else n[0].data_ptr() for n in norms), eps.pop(), float(scale))
    return DecoderLayerStep(rows, hidden, heads, inner // heads, cross, dtype, operands, tensors)
