"""The loops around CPU inference's matrix multiplies, each in C where the optional extension
`bertlab.nn._cpu_kernels` is built, and its torch formula otherwise (the reference the tests hold it to).

    quantize_rows(x)            x (N, K) -> int8 xq and (N, 1) scales s, x ≈ s · xq (symmetric, per row)
    dequantize_rows(acc, ...)   int32 GEMM output -> (acc · s_x[r]) · s_w[c] + b[c], over acc's own memory
    softmax_(x)                 softmax over the last dimension, in place (fp32 or bf16)
    rms_norm(x, w, eps)         T5's RMS layer norm in one call (fp32 or bf16)
    add_layer_norm_(y, r, w, b, eps)  post-LN's Add & Norm in one pass over y (fp32 or bf16)
    attention_one_query(...)    softmax(scale · q Kᵀ + add) V for one query per row and head (a decoding step
                                against its K/V cache), fp32
    attention_short(...)        the same for many queries, register-tiled per (row, head), fp32, heads of 16-64
    attention_bf16(...)         the same on AVX-512 BF16 dot products (`bf16_dot_available()`), or on AMX tiles
                                where the level is amx (`attention_bf16_kernel()`), fp32 or bf16 in and out,
                                scores and softmax in fp32
    gelu_(y)                    the exact GELU in place, fp32 (the fp32 GEMM's epilogue as a pass) or bf16
    gelu_tanh_(y)               GELU's tanh form (`gelu_new`) in place, fp32 or bf16
    post_ln_layer(...)          a post-LN encoder layer in one call (nn/encoder_layer.py)
    decoder_layer_step(...)     a pre-norm decoder layer's decoding step in one call (nn/decoder_layer.py)
    int8_linear(...)            an int8 linear layer (quantize, GEMM, dequantize) in one call, for up to
                                `int8_max_rows()` rows (AMX: every row count), on AMX tiles, AVX-512 VNNI,
                                AVX-VNNI or AVX2 (`int8_gemm_available()`)
    linear_f32(...), linear_bf16(...)  fp32 (AVX-512 or AVX2) and bf16 (AVX-512 BF16) GEMMs over packed panels;
                                the fp32 one applies an activation (the exact GELU) to its output blocks
    linear_few_rows(...)        an fp32 or bf16 linear layer for 1-4 rows: a GEMV over the plain weight
    beam_topk(...)              a beam-search step's best candidates, in one pass over the log-probabilities
    argmax_rows(x)              greedy decoding's argmax, the same pass with one candidate (bf16 logits widened)

Why: around an int8 GEMM the torch formulas take 6-8 passes over memory (abs, amax, divide, round, cast;
multiply, addcmul), several into fresh buffers; on all-MiniLM-L6-v2 in int8 at one thread they were about a
third of the forward pass, and torch's bf16 softmax another sixth. The C loops keep a row in L1 and write each
result once (see `csrc/` for the numbers they keep: quantize and dequantize are bit-identical to the
formulas here; softmax agrees to rounding).

The C path runs for CPU tensors that are contiguous, of a dtype it knows, and not part of an autograd graph;
anything else, and anything while torch records operators (a trace, `torch.compile`, an ONNX export), takes the
torch formula. `BERTLAB_NO_CPU_KERNELS=1` turns the C path off (to compare the two).

One CPU dispatch (`cpu_isa()`) picks the instruction-set level once, when the extension loads: AMX (oneDNN's
tiles for bf16 linear layers, bertlab's for bf16 attention and for int8 where they win), AVX-512, AVX-VNNI, AVX2, or none (oneDNN for every matrix
multiply). `BERTLAB_CPU_ISA=avx2` (or any lower level than the CPU's) forces it, to test and measure the AVX2
kernels on an AVX-512 machine. The extension's table for that level (`csrc/dispatch.c`) then says which kernel
runs, every one of them: the GEMMs, attention, search, and the element-wise loops (quantize, softmax, norms),
which are built once per level. The GEMMs' blocking (tile heights, rows per block, prefetch, the thread split)
follows the CPU: measured once per CPU, level and thread count at the first GEMM and cached (`cpu_tuning.py`;
`BERTLAB_CPU_TUNING=default` keeps the built-in one); every blocking gives the same bits.
"""

from __future__ import annotations

import functools
import os

import torch

_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}  # as the enum in csrc/kernels.h


@functools.cache
def _dispatch():
    """(the extension or None, the level `cpu_isa()` names, the names of the kernels the extension's table holds
    at that level beside its portable loops): the extension imported and its table selected once, before any
    kernel runs (again only after `use_c_kernels` or `force_cpu_isa`). A `BERTLAB_CPU_ISA` it cannot honour is
    refused in one line, here and on every later call."""
    ext = None
    if not os.environ.get("BERTLAB_NO_CPU_KERNELS"):
        # torch is imported first (above): its OpenMP runtime is then the one the extension links to
        try:
            from . import _cpu_kernels as ext
        except ImportError:
            ext = None
    found = "none" if ext is None else ext.cpu_level
    if found == "amx" and not _amx_present():
        found = "avx512"
    level = found
    asked = os.environ.get("BERTLAB_CPU_ISA", "").strip().lower()
    if asked:
        if asked not in ISA_LEVELS:
            raise ValueError(f"BERTLAB_CPU_ISA={asked!r}: expected one of {', '.join(ISA_LEVELS)}")
        if ISA_LEVELS.index(asked) > ISA_LEVELS.index(found):
            raise ValueError(f"BERTLAB_CPU_ISA={asked!r}: this CPU and build reach {found!r} at most")
        level = asked
    return ext, level, frozenset(() if ext is None else ext.select(level))


def _extension():
    return _dispatch()[0]


# (the `_dispatch()` result, the thread count) the GEMMs' blocking was set for, and the int8 row limit with it
_tuned_for: tuple | None = None


def _tuned() -> None:
    """Before a GEMM: the extension's blocking set for this level and thread count (`cpu_tuning.apply`: the
    default, the cached choice, or a sweep at the first GEMM on a CPU this user has no record of); again only
    after a new dispatch or another thread count."""
    global _tuned_for
    dispatch, threads = _dispatch(), torch.get_num_threads()
    if _tuned_for is not None and _tuned_for[0] is dispatch and _tuned_for[1] == threads:
        return
    from . import cpu_tuning

    # (the sweep calls the extension directly)
    _tuned_for = (dispatch, threads, cpu_tuning.apply(dispatch[0], dispatch[1], threads, int8_kernel(),
                                                      int_mm_exact()))


def int8_max_rows() -> int:
    """Up to how many rows `int8_linear` serves an int8 layer at this dispatch level and thread count, beyond them
    torch._int_mm (`cpu_tuning`: measured with the blocking, else the level's default; 0 where there is no
    kernel)."""
    if int8_kernel() is None:
        return 0
    _tuned()
    return _tuned_for[2]


def available() -> bool:
    """Whether the C loops are built (and not turned off)."""
    return _extension() is not None


def use_c_kernels(on: bool) -> bool:
    """Turn the C path on (where built) or off for this process, as `BERTLAB_NO_CPU_KERNELS` would at its start;
    what a resumed run calls to evaluate with the kernels it started with. Returns `available()` after."""
    if on:
        os.environ.pop("BERTLAB_NO_CPU_KERNELS", None)
    else:
        os.environ["BERTLAB_NO_CPU_KERNELS"] = "1"
    _dispatch.cache_clear()
    return available()


# ------------------------------------------------------------------------------------------- CPU dispatch
# The instruction-set levels the kernels are written for, lowest first: "none" leaves every matrix multiply to
# oneDNN (through torch); "avx2" is AVX2 + FMA (AMD before Zen 4, Intel before Haswell's successors' client
# AVX-VNNI); "avxvnni" adds AVX-VNNI's int8 dot products (Intel client CPUs from 12th gen); "avx512" is AVX-512
# (with VNNI and BF16 where present: bertlab's own fp32, bf16 and int8 GEMMs); "amx" is AVX-512 plus AMX tiles
# (Sapphire Rapids and later), where the bf16 GEMMs go to oneDNN's AMX kernel, bf16 attention and int8 GEMMs of
# many rows to bertlab's tiles. The same names as the extension's levels (csrc/kernels.h).
ISA_LEVELS = ("none", "avx2", "avxvnni", "avx512", "amx")


def _amx_present() -> bool:
    """Whether the CPU and OS give this process AMX (bf16 and int8 tiles), as torch's oneDNN sees them: not where
    oneDNN is held below AMX (`ONEDNN_MAX_CPU_ISA`, which bertlab's AMX path goes through)."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    if cap and "AMX" not in cap.upper() and cap.upper() != "ALL":
        return False
    probe = getattr(getattr(torch._C, "_cpu", None), "_is_amx_tile_supported", None)
    if probe is not None:
        return bool(probe())
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "amx_bf16" in flags and "amx_int8" in flags


def cpu_isa() -> str:
    """The level of `ISA_LEVELS` the kernels run at in this process: the highest this CPU and build have, or a
    lower one that `BERTLAB_CPU_ISA` names (to test and measure the AVX2 paths on an AVX-512 machine; a level
    above what the CPU has is refused, as is an unknown name). Without the extension, "none"."""
    return _dispatch()[1]


def force_cpu_isa(level: str | None) -> str:
    """Set (or with None clear) `BERTLAB_CPU_ISA` for this process, as at its start, and select the extension's
    table for it; returns `cpu_isa()` after."""
    if level is None:
        os.environ.pop("BERTLAB_CPU_ISA", None)
    else:
        os.environ["BERTLAB_CPU_ISA"] = level
    _dispatch.cache_clear()
    return cpu_isa()


def _cpu_has(kernel: str) -> bool:
    """Whether the extension's table at this process's level holds `kernel` ("gemm_f32", "gemm_bf16",
    "attention_bf16", "attention_amx", "beam_topk", "int8_amx", "int8_vnni", "int8_avxvnni", "int8_avx2"; asked before every
    kernel call: a cached call and a set lookup)."""
    return kernel in _dispatch()[2]


@functools.cache
def _onnx_exporting():
    """`torch.onnx.is_in_onnx_export`, which imports two modules on every call (~1 us; the C paths ask before
    each kernel, ~50 times a decoding step): the flags it reads, read directly where this torch has them."""
    try:
        from torch.onnx._internal.exporter import _flags
        from torch.onnx._internal.torchscript_exporter._globals import GLOBALS
    except ImportError:
        return torch.onnx.is_in_onnx_export
    return lambda: GLOBALS.in_onnx_export or _flags._is_onnx_exporting


def tracing() -> bool:
    """Whether torch is recording the operators (a trace, `torch.compile`, an ONNX export): the C calls would be
    invisible to it, so the torch formulas run instead."""
    return torch.jit.is_tracing() or torch.compiler.is_compiling() or _onnx_exporting()()


def _native(*tensors: torch.Tensor) -> bool:
    if _extension() is None or tracing():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:  # (a loop, not all() over a generator: a decoding step asks ~60 times)
        if not t.is_cpu or not t.is_contiguous() or (grad and t.requires_grad):
            return False
    return True


# ------------------------------------------------------------------------------------------- torch formulas
def quantize_rows_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = x.abs().amax(1, keepdim=True).float().clamp_(min=1e-8).div_(127.0)
    # A row with NaN or inf has a non-finite scale (amax and clamp keep NaN) and q = 0 -- what NaN / NaN and
    # x / inf cast to int8 are not guaranteed to give -- so everything dequantized from it is NaN.
    return (x / scale).round_().to(torch.int8).masked_fill_(~scale.isfinite(), 0), scale


def dequantize_rows_reference(acc: torch.Tensor, xscale: torch.Tensor, wscale: torch.Tensor,
                              bias: torch.Tensor | None) -> torch.Tensor:
    y = acc * xscale  # int32 · fp32 -> fp32, one pass
    if bias is not None:
        torch.addcmul(bias, y, wscale, out=y)  # in place: no second (N, M) buffer
    else:
        y.mul_(wscale)
    return y


# ------------------------------------------------------------------------------------------------- kernels
def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) fp32 or bf16 -> (N, K) int8 and the (N, 1) fp32 scales with x ≈ scale · xq: scale = max|x| / 127
    per row (at least 1e-8 / 127), xq = round(x / scale), ties to even. A row holding NaN or inf: scale NaN or
    inf, xq 0 (so what is dequantized from it is NaN, never finite)."""
    if x.dtype not in _DTYPE_CODES or x.dim() != 2 or not _native(x):
        return quantize_rows_reference(x)
    rows, cols = x.shape
    q = torch.empty((rows, cols), dtype=torch.int8)
    scale = torch.empty((rows, 1), dtype=torch.float32)
    _extension().quantize_rows(x.data_ptr(), _DTYPE_CODES[x.dtype], q.data_ptr(), scale.data_ptr(), rows, cols,
                               torch.get_num_threads())
    return q, scale


def dequantize_rows(acc: torch.Tensor, xscale: torch.Tensor, wscale: torch.Tensor,
                    bias: torch.Tensor | None) -> torch.Tensor:
    """(N, M) int32 products of int8 rows and columns -> (acc · xscale[r]) · wscale[c] + bias[c] in fp32,
    written over `acc`'s memory (which the caller gives up). xscale (N, 1), wscale (M,), bias (M,) or None, all
    fp32."""
    parts = (acc, xscale, wscale) + (() if bias is None else (bias,))
    if (acc.dtype != torch.int32 or acc.dim() != 2 or not _native(*parts)
            or any(t.dtype != torch.float32 for t in parts[1:])):
        return dequantize_rows_reference(acc, xscale, wscale, bias)
    rows, cols = acc.shape
    if xscale.numel() != rows or wscale.numel() != cols or (bias is not None and bias.numel() != cols):
        raise ValueError(f"dequantize_rows: scales {tuple(xscale.shape)}, {tuple(wscale.shape)} do not fit "
                         f"products {tuple(acc.shape)}")
    out = acc.view(torch.float32)
    _extension().dequantize_rows(acc.data_ptr(), out.data_ptr(), xscale.data_ptr(), wscale.data_ptr(),
                                 None if bias is None else bias.data_ptr(), rows, cols, torch.get_num_threads())
    return out


def softmax_(x: torch.Tensor) -> torch.Tensor:
    """softmax(x, dim=-1) written over x (fp32 or bf16; other dtypes through torch)."""
    if x.dtype not in _DTYPE_CODES or x.numel() == 0 or not _native(x):
        return torch.softmax(x, dim=-1, out=x)  # in place: each row's max and sum are taken before writing
    cols = x.size(-1)
    _extension().softmax_rows(x.data_ptr(), _DTYPE_CODES[x.dtype], x.numel() // cols, cols, torch.get_num_threads())
    return x


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """weight · x / sqrt(mean(x²) + eps) over the last dimension (T5's layer norm, `nn.rms_norm`), in one C call:
    fp32, or bf16 as `transformers` computes a bf16 model's (the mean of squares and the product with x in fp32,
    rounded to bf16, then times the weight in bf16). x and weight of one dtype. None where it does not apply
    (other dtypes, non-contiguous, autograd, no extension)."""
    if (x.dtype not in _DTYPE_CODES or weight.dtype != x.dtype or weight.dim() != 1 or x.dim() == 0
            or x.size(-1) != weight.numel() or not _native(x, weight)):
        return None
    y = torch.empty_like(x)
    cols = weight.numel()
    _extension().rms_norm_rows(x.data_ptr(), weight.data_ptr(), y.data_ptr(), _DTYPE_CODES[x.dtype],
                               x.numel() // max(cols, 1), cols, float(eps), torch.get_num_threads())
    return y


def rotate_qk_(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Rotary positions (Su et al., RoFormer) over q and k of the fused projection's output `qkv` (..., 3, nh, hs),
    contiguous, fp32 or bf16, in place: x · cos + rotate_half(x) · sin, bit for bit the torch formula (one C pass
    where the formula takes five, each allocating; in bf16 widened to fp32 and narrowed once, as `transformers`
    computes it). cos and sin (R, hs) contiguous, of qkv's dtype: row r of qkv's flattened leading dimensions
    takes table row r % R (R = T for (B, T) rows, N for N unpadded rows). True when done; False where the C pass
    does not apply (the caller then runs the formula)."""
    if (qkv.dtype not in _DTYPE_CODES or qkv.dim() < 4 or qkv.size(-3) != 3 or not _native(qkv, cos, sin)):
        return False
    nh, hs = qkv.shape[-2:]
    rows = qkv.numel() // (3 * nh * hs)
    for t in (cos, sin):
        if t.dtype != qkv.dtype or t.dim() != 2 or t.size(1) != hs:
            return False
    if cos.shape != sin.shape or not rows or rows % cos.size(0):
        return False
    _extension().rotate_heads(qkv.data_ptr(), _DTYPE_CODES[qkv.dtype], 3 * nh * hs, 2 * nh, hs, hs, rows,
                              cos.data_ptr(), sin.data_ptr(), cos.size(0), torch.get_num_threads())
    return True


def add_layer_norm_(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                    eps: float) -> torch.Tensor | None:
    """LayerNorm(y + residual) over the last dimension, written over y (the Transformer's "Add & Norm", post-LN),
    in one C call: fp32, or bf16 as a bf16 model's modules compute it with torch (the sum rounded to bf16, the
    norm's statistics and arithmetic in fp32, rounded once; another summation order than torch's, so a value can
    land one bf16 step apart, rarely). y, residual, weight and bias of one dtype. None where it does not apply
    (other dtypes or shapes, non-contiguous, autograd, no extension); y is then unchanged."""
    cols = y.size(-1) if y.dim() else 0
    dtype = y.dtype
    if (dtype not in _DTYPE_CODES or residual.dtype != dtype or weight.dtype != dtype
            or bias is None or bias.dtype != dtype or y.shape != residual.shape or weight.dim() != 1
            or weight.numel() != cols or bias.numel() != cols or not cols or not _native(y, residual, weight, bias)):
        return None
    _extension().add_layer_norm_rows(y.data_ptr(), residual.data_ptr(), weight.data_ptr(), bias.data_ptr(),
                                     y.data_ptr(), _DTYPE_CODES[dtype], y.numel() // cols, cols, float(eps),
                                     torch.get_num_threads())
    return y


# ------------------------------------------------------------------------------------------------ attention
def _attention_operands(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, add: torch.Tensor | None
                        ) -> tuple[torch.Tensor | None, tuple[int, int, int]] | None:
    """What the attention kernels check. q (B, nh, T_q, hs); k, v (B / G, nh, T_k, hs); add (B | 1, nh | 1,
    T_q | 1, T_k) or None; CPU tensors of q's dtype with hs contiguous, outside autograd and traces (the dtype
    each kernel takes is its own check). Returns add with its last dimension contiguous and its (row, head,
    query) strides, 0 where it broadcasts -- or None where the C kernels do not apply."""
    B, nh, T_q, hs = q.shape
    B_kv, nh_kv, T_k, hs_kv = k.shape
    if (_extension() is None or tracing() or not (T_q and T_k and B_kv) or B % B_kv or nh_kv != nh or hs_kv != hs
            or v.shape != k.shape):
        return None
    # (written out rather than as any() over a generator: a decoding step makes a dozen of these calls)
    grad, dtype = torch.is_grad_enabled(), q.dtype
    for t in (q, k, v):
        if t.dtype != dtype or not t.is_cpu or t.stride(-1) != 1 or (grad and t.requires_grad):
            return None
    if add is None:
        return None, (0, 0, 0)
    if add.dtype != dtype or not add.is_cpu or (grad and add.requires_grad) or add.dim() != 4:
        return None
    add_B, add_nh, add_T, add_k = add.shape
    if add_k != T_k or add_B not in (1, B) or add_nh not in (1, nh) or add_T not in (1, T_q):
        return None
    add = add if add.stride(-1) == 1 else add.contiguous()  # T5's position bias is a transposed view, and small
    strides = add.stride()
    return add, (strides[0] if add_B > 1 else 0, strides[1] if add_nh > 1 else 0, strides[2] if add_T > 1 else 0)


def attention_one_query(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, add: torch.Tensor | None,
                        scale: float) -> torch.Tensor | None:
    """softmax(scale · q kᵀ + add) v for one query per row and head: q (B, nh, 1, hs) and k, v (B / G, nh,
    T_k, hs) -- any strides with hs contiguous, so a K/V cache's views go in as they are; G rows of q in turn
    share a row of k and v (the beams of one input) -- and `add` (B | 1, nh | 1, 1, T_k) or None; fp32.
    Returns (B, nh, 1, hs), or None where the C kernel does not apply (the caller then takes its own path)."""
    B, nh, T_q, hs = q.shape
    if T_q != 1 or q.dtype != torch.float32 or (operands := _attention_operands(q, k, v, add)) is None:
        return None
    add, add_strides = operands
    out = torch.empty((B, 1, nh, hs), dtype=torch.float32)
    _extension().attention_one_query(
        q.data_ptr(), *q.stride()[:2], k.data_ptr(), *k.stride()[:3], v.data_ptr(), *v.stride()[:3],
        None if add is None else add.data_ptr(), *add_strides[:2], out.data_ptr(), B, nh, hs, k.size(2),
        float(scale), torch.get_num_threads(), B // k.size(0))
    return out.transpose(1, 2)  # (B, nh, 1, hs)


def _rows_operands(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, add: torch.Tensor | None,
                   add_strides: tuple[int, int, int], out: torch.Tensor, scale: float) -> tuple:
    """The 25 operands of `attention_rows` and `attention_bf16` (csrc/module.c, parse_rows), in its order."""
    B, nh, T_q, hs = q.shape
    return (q.data_ptr(), *q.stride()[:3], k.data_ptr(), *k.stride()[:3], v.data_ptr(), *v.stride()[:3],
            None if add is None else add.data_ptr(), *add_strides, out.data_ptr(), B, nh, hs, T_q, k.size(2),
            float(scale), torch.get_num_threads(), B // k.size(0))


def loop_heads(hs: int) -> bool:
    """Whether the C attention loops (`attention_short`, `attention_bf16`) take heads of `hs`: a multiple of 16 up
    to 64 (their tiles' widths); the one-call blocks ask it of a layer before building its call."""
    return hs % 16 == 0 and 16 <= hs <= 64


def attention_short(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, add: torch.Tensor | None,
                    scale: float, window: int | None = None) -> torch.Tensor | None:
    """softmax(scale · q kᵀ + add) v for q (B, nh, T_q, hs), k, v (B / G, nh, T_k, hs) (any strides, hs
    contiguous; G rows of q share a row of k and v) and `add` (B | 1, nh | 1, T_q | 1, T_k) or None, fp32, with
    hs a multiple of 16 up to 64. Returns (B, nh, T_q, hs), or None where the C kernel does not apply.

    `window` (T_q == T_k): query i sees only the keys j with |i - j| <= window (local attention), as if the scores
    outside were -inf; each tile of queries computes only the key blocks its window reaches."""
    B, nh, T_q, hs = q.shape
    # Not at the level `none`: its loops hold 16-float vectors in SSE's 16 registers of 4 and spill (AVX2 has tiles
    # of its own, csrc/attention.c)
    if (not loop_heads(hs) or q.dtype != torch.float32 or cpu_isa() == "none"
            or (window is not None and (window < 0 or T_q != k.size(2)))
            or (operands := _attention_operands(q, k, v, add)) is None):
        return None
    add, add_strides = operands
    out = q.new_empty((B, T_q, nh, hs))  # (q's dtype, fp32: `new_empty` skips the keyword parsing, ~2 us a call)
    band = 0 if window is None else window + 1  # csrc: Rows.band, |i - j| < band
    _extension().attention_rows(*_rows_operands(q, k, v, add, add_strides, out, scale), band)
    return out.transpose(1, 2)  # (B, nh, T_q, hs)


def relative_attention(q: torch.Tensor, k_scaled: torch.Tensor, v: torch.Tensor,
                       c2p: tuple[torch.Tensor, int] | None, p2c: tuple[torch.Tensor, int] | None,
                       relative: torch.Tensor, pair_mask: torch.Tensor | None, start: int, span: int,
                       scale: float) -> torch.Tensor | None:
    """DeBERTa's disentangled attention (models/deberta_v2/modeling.py) for the queries start .. start + T_q in one C
    call: softmax(q k_scaledᵀ + c2p + p2c, masked) v, with
        c2p[i, j] = q_i · K_r[clamp(k + δ(i, j))] / scale      p2c[i, j] = k_scaled_j · Q_r[clamp(k - δ(j, i))]
    (their sum added to the score, the lowest float where pair_mask is False), each (row, head) making its own
    products with the table rows instead of reading (B, nh, T, rows) tables. q (B, nh, T_q, hs): the block's
    queries; k_scaled (the keys divided by `scale`) and v (B, nh, T, hs); c2p, p2c: (K_r or Q_r (nh, rows, hs),
    the table row it starts at) or None where the term is off; relative (T, T) δ; pair_mask (B, 1, T, T) bool or
    None; k = span. fp32, hs contiguous, hs a multiple of 16 up to 64. Returns the context (B, T_q, nh · hs), or
    None where the kernel does not apply. The same formula as the torch path in another order of sums (tests hold
    them to 1e-6). A table whose rows do not hold every row the block reaches is refused (ValueError), not read.

    bf16 operands (a bf16 model's) are widened to fp32, exactly, and the context rounded to bf16 once: closer to
    fp32 than the torch formulas in bf16, and faster (DeBERTa-v3-base's shape, 4 layers, one thread, AMD EPYC Zen
    4: 1.27x the model's bf16 pass on 4 x 384 tokens, 1.08x on 8 x 96, 1.19x on 1 x 256)."""
    if q.dtype == torch.bfloat16 and k_scaled.dtype == v.dtype == torch.bfloat16:
        wide = [None if term is None else (term[0].float(), term[1]) for term in (c2p, p2c)]
        out = relative_attention(q.float(), k_scaled.float(), v.float(), *wide, relative, pair_mask, start, span,
                                 scale)
        return None if out is None else out.to(torch.bfloat16)
    B, nh, T_q, hs = q.shape
    T = k_scaled.size(2)
    tables = [term[0] for term in (c2p, p2c) if term is not None]
    if (not tables or not loop_heads(hs) or q.dtype != torch.float32 or cpu_isa() == "none"
            or relative.dtype != torch.int64 or (pair_mask is not None and pair_mask.dtype != torch.bool)
            or _attention_operands(q, k_scaled, v, None) is None or k_scaled.size(0) != B
            or any(t.dtype != torch.float32 or t.dim() != 3 or t.shape[0] != nh or t.shape[2] != hs
                   or t.stride(-1) != 1 for t in tables)
            or not _native(relative, *(() if pair_mask is None else (pair_mask,)))):
        return None
    if relative.shape != (T, T) or (pair_mask is not None and pair_mask.shape != (B, 1, T, T)):
        raise ValueError(f"relative_attention: keys {T} do not fit relative {tuple(relative.shape)} or the mask "
                         f"{None if pair_mask is None else tuple(pair_mask.shape)}")
    out = q.new_empty((B, T_q, nh, hs))

    def table(term):
        if term is None:
            return (None, 0, 0, 0, 0)
        t, first = term
        return (t.data_ptr(), t.stride(0), t.stride(1), t.size(1), first)

    _extension().relative_attention_rows(*_rows_operands(q, k_scaled, v, None, (0, 0, 0), out, 1.0), *table(c2p),
                                         *table(p2c), 1.0 / scale, relative.data_ptr(),
                                         None if pair_mask is None else pair_mask.data_ptr(), start, span)
    return out.view(B, T_q, nh * hs)


def bf16_dot_available() -> bool:
    """Whether `attention_bf16` and `linear_bf16` run here: the extension is built and the dispatch level has
    AVX-512 BF16."""
    return _cpu_has("attention_bf16")


def attention_bf16_kernel() -> str | None:
    """Which kernel `attention_bf16` runs at the dispatch level: "amx" (AMX-BF16 tiles: the level amx on a CPU
    with AMX-BF16, from 8 queries a row; fewer take AVX-512 BF16's tiles of 4 queries, faster there),
    "avx512bf16" (AVX-512 BF16 dot products), or None (neither: it declines). Both compute the
    same formula (bf16 products, fp32 sums, softmax in fp32, probabilities rounded to bf16) in another
    summation order."""
    return "amx" if _cpu_has("attention_amx") else "avx512bf16" if bf16_dot_available() else None


def attention_bf16(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, add: torch.Tensor | None,
                   scale: float, window: int | None = None) -> torch.Tensor | None:
    """softmax(scale · q kᵀ + add) v with bf16 products and fp32 sums: q, k, v rounded to bf16, scores and
    softmax in fp32, probabilities rounded to bf16 for P V; on AMX tiles at the level amx, else on AVX-512 BF16
    (`attention_bf16_kernel()`). Shapes as `attention_short`; q, k, v and add all
    fp32 or all bf16, hs a multiple of 16 up to 64. Returns (B, nh, T_q, hs) in q's dtype, or None where the
    C kernel does not apply (no AVX-512 BF16, other dtypes or shapes). The reference is the same formula in
    torch on bf16-rounded operands (tests/test_nn_cpu_kernels.py).

    `window` as `attention_short`'s: each tile of 4 queries computes only the 32-key chunks its window reaches,
    on AVX-512 BF16 dot products at every level (the AMX tiles take no window)."""
    B, nh, T_q, hs = q.shape
    if (not loop_heads(hs) or q.dtype not in _DTYPE_CODES or not bf16_dot_available()
            or (window is not None and (window < 0 or T_q != k.size(2)))
            or (operands := _attention_operands(q, k, v, add)) is None):
        return None
    add, add_strides = operands
    out = q.new_empty((B, T_q, nh, hs))
    band = 0 if window is None else window + 1  # csrc: Rows.band, |i - j| < band
    _extension().attention_bf16(_DTYPE_CODES[q.dtype], *_rows_operands(q, k, v, add, add_strides, out, scale), band)
    return out.transpose(1, 2)  # (B, nh, T_q, hs)


# ----------------------------------------------------------------------------------- fp32/bf16 GEMV, few rows
def linear_few_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """x Wᵀ + b for a few rows x (M, K), with W (N, K) as `nn.Linear` holds it, fp32 or bf16 (all one dtype; sums
    in fp32, a bf16 result rounded once): each 16 rows of W read once from memory, in memory order. Returns
    (M, N) of x's dtype, or None where the C kernel does not apply (another dtype, K not a multiple of 16,
    non-contiguous operands, no extension)."""
    dtype = x.dtype
    if x.dim() != 2 or weight.dim() != 2 or dtype not in _DTYPE_CODES or weight.dtype != dtype:
        return None
    (m, k), (n, k_w) = x.shape, weight.shape
    if k % 16 or k_w != k or (bias is not None and (bias.dtype != dtype or bias.shape != (n,))):
        return None
    if not (_native(x, weight) if bias is None else _native(x, weight, bias)):
        return None
    y = x.new_empty((m, n))
    _extension().linear_few_rows(x.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(),
                                 y.data_ptr(), m, k, n, _DTYPE_CODES[dtype], torch.get_num_threads())
    return y


# --------------------------------------------------------------------------------------- fp32 GEMM, panels
PANEL = 32  # columns per panel of a packed fp32 weight (linear.c)


def f32_gemm_available() -> bool:
    """The C fp32 GEMM runs here: the extension is built and the dispatch level has AVX-512 or AVX2 + FMA."""
    return _cpu_has("gemm_f32")


def _zero_padded(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """W (N, K) -> (ceil(N / 32) · 32, K) of `dtype`, the rows past N zero: the last panel's missing columns."""
    n, k = weight.shape
    padded = torch.zeros(-(-n // PANEL) * PANEL, k, dtype=dtype)
    padded[:n] = weight.detach()
    return padded


def pack_f32_panels(weight: torch.Tensor) -> torch.Tensor:
    """W (N, K) fp32, as `nn.Linear` holds it -> (ceil(N / 32), K, 32): panel p holds W[p·32 + c, k] at [p, k, c],
    the last panel's missing columns zero. `linear_f32` streams a panel in memory order for each tile of rows."""
    padded = _zero_padded(weight, torch.float32)
    return padded.view(-1, PANEL, padded.shape[1]).transpose(1, 2).contiguous()


def pack_bf16_panels(weight: torch.Tensor) -> torch.Tensor:
    """W (N, K) bf16, K even -> (ceil(N / 32), K / 2, 32, 2): panel p holds the pair W[p·32 + c, 2k'], W[p·32 + c,
    2k' + 1] at [p, k', c], the last panel's missing columns zero -- the operand order of AVX-512 BF16's dot
    product, which `linear_bf16` takes a pair of k at a time."""
    padded = _zero_padded(weight, torch.bfloat16)
    return padded.view(-1, PANEL, padded.shape[1] // 2, 2).permute(0, 2, 1, 3).contiguous()


def _panel_gemm(entry: str, x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None, n: int,
                dtype: torch.dtype, panel_shape, *epilogue: int) -> torch.Tensor | None:
    """What the panel GEMMs share: x (M, K) of `dtype`, `panels` of `dtype` and of the shape `panel_shape(K)`
    its packing gives, the bias fp32 (n,) or None, all contiguous on the CPU outside a trace -- else None --
    then the C entry `entry` into a fresh (M, n) output of `dtype` (with `epilogue`: its BL_ACT_* code)."""
    if x.dim() != 2 or x.dtype != dtype or panels.dtype != dtype or panels.shape != panel_shape(x.shape[1]):
        return None
    if bias is not None and (bias.dtype != torch.float32 or bias.shape != (n,)):
        return None
    if not (_native(x, panels) if bias is None else _native(x, panels, bias)):
        return None
    m, k = x.shape
    y = x.new_empty((m, n))  # x's dtype is `dtype`
    getattr(_extension(), entry)(x.data_ptr(), panels.data_ptr(), None if bias is None else bias.data_ptr(),
                                 y.data_ptr(), m, k, n, torch.get_num_threads(), *epilogue)
    return y


# The activations the fp32 GEMM applies to its output blocks (csrc/kernels.h: BL_ACT_*), by their config names
EPILOGUES = {"gelu": 1}


def linear_f32(x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None, n: int,
               activation: str | None = None) -> torch.Tensor | None:
    """x (M, K) · Wᵀ + b, fp32, with W (n, K) packed by `pack_f32_panels` into `panels`: any M, no padded rows.
    The sum over k runs in k order from the bias, one FMA chain per output (~1e-6 of `F.linear`'s, another
    summation order; the AVX-512 and AVX2 kernels run the same chain and give the same bits). `activation`
    (a name in `EPILOGUES`: "gelu", the exact erf form) is applied to each block of the output right after it
    is stored, still in L1, instead of a pass of its own over the output (within 1.4e-6 of the exact GELU, as torch's own fp32 gelu is
    within 1.2e-6: csrc/common.h). Returns (M, n), or None where the C kernel does not apply (neither AVX-512
    nor AVX2 at the dispatch level, another dtype, a non-contiguous x, a trace, an activation it lacks)."""
    if not f32_gemm_available() or (activation is not None and activation not in EPILOGUES):
        return None
    _tuned()
    return _panel_gemm("linear_f32", x, panels, bias, n, torch.float32, lambda k: (-(-n // PANEL), k, PANEL),
                       *(() if activation is None else (EPILOGUES[activation],)))


def linear_bf16(x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None, n: int) -> torch.Tensor | None:
    """x (M, K) · Wᵀ + b in bf16 on AVX-512 BF16 dot products, with W (n, K) packed by `pack_bf16_panels` and the
    bias in fp32 (`bias.float()`): exact products, fp32 sums from the bias, rounded to bf16 once -- oneDNN's
    bf16 numbers up to the summation order. Returns (M, n) bf16, or None where the kernel does not apply (no
    AVX-512 BF16, another dtype, K odd, a non-contiguous x, a trace)."""
    if not bf16_dot_available() or x.dim() != 2 or x.shape[1] % 2:
        return None
    _tuned()  # (its one-tile calls' prefetch: bl_tuning.few_prefetch)
    return _panel_gemm("linear_bf16", x, panels, bias, n, torch.bfloat16,
                       lambda k: (-(-n // PANEL), k // 2, PANEL, 2))


# ------------------------------------------------------------------------------------ an encoder layer, one call
def post_ln_layer(x: torch.Tensor, add: torch.Tensor | None, heads: int, scale: float, linears: tuple,
                  norms: tuple, eps: tuple[float, float], inter: int, bf16_attention: bool = False
                  ) -> torch.Tensor | None:
    """A post-LN encoder layer over x (B, T, H) fp32 or bf16 in one C call (csrc/kernels.h: bl_post_ln_layer): the
    stacked qkv projection, `attention_short`'s loops (bf16: `attention_bf16`'s), the attention output,
    `add_layer_norm_`, the FFN's two layers with the GELU between them, `add_layer_norm_` -- in that order, with
    the kernels the modules call, so bit for bit the layer computed one call at a time. `linears`: the four linear
    layers (qkv, attention output, FFN in, FFN out), each (weight, bias | None, comp, wscale, narrow): fp32 panels
    with comp and wscale None (the GELU the GEMM's epilogue), bf16 panels with an fp32 bias for a bf16 x (the GELU
    `gelu_`'s bf16 pass), or int8 -- `pack_int8_weight`'s weight, compensation and narrowing with the per-channel
    scales (`int8_linear`'s kernel; the GELU `gelu_`'s pass); `norms`: the two LayerNorms' weight and bias (x's
    dtype); all checked by the caller (nn/encoder_layer.py). `add` (B | 1, 1, 1, T) of x's dtype, or None.
    `bf16_attention`: an fp32 x's attention `attention_bf16`'s (fp32 in and out), as int8's bf16 attention kernel
    runs it. None where the kernels do not apply (the level below AVX2, a trace, x not a contiguous fp32 or bf16
    CPU tensor outside autograd, no int8 kernel, no bf16 dot products for bf16 or `bf16_attention`)."""
    int8 = linears[0][2] is not None
    bf16 = x.dtype == torch.bfloat16
    if (x.dtype not in _DTYPE_CODES or x.dim() != 3 or cpu_isa() == "none" or not _native(x)
            or not f32_gemm_available() or (int8 and (bf16 or not int8_gemm_available()))
            or ((bf16 or bf16_attention) and not bf16_dot_available())):
        return None
    B, T, H = x.shape
    out = x.new_empty((B, T, H))
    _tuned()
    args = []
    for weight, bias, comp, wscale, narrow in linears:
        args += [weight.data_ptr(), None if bias is None else bias.data_ptr(),
                 None if comp is None else comp.data_ptr(), None if wscale is None else wscale.data_ptr(),
                 int(narrow)]
    _extension().post_ln_layer(x.data_ptr(), out.data_ptr(), B, T, None if add is None else add.data_ptr(),
                               T if add is not None and add.size(0) > 1 else 0, H, heads, inter, *args,
                               *(w.data_ptr() for w in norms), float(eps[0]), float(eps[1]), float(scale),
                               int(bf16_attention), torch.get_num_threads(), _DTYPE_CODES[x.dtype])
    return out


def decoder_layer_step(x: int, out: int, rows: int, self_k: int, self_v: int, cache_len: int, start: int,
                       self_add: int | None, self_add_rows: int, self_add_heads: int, cross_k: int | None,
                       cross_v: int | None, cross_add: int | None, group: int, enc_len: int, cross_add_rows: int,
                       layer: tuple, dtype: torch.dtype) -> None:
    """A pre-norm decoder layer's decoding step in one C call (csrc/kernels.h: bl_decoder_layer_step): RMSNorm, the
    stacked qkv projection, this step's keys and values into the caches, `attention_one_query`'s loops (bf16:
    `attention_bf16`'s), the attention output and the residual; the same for cross-attention; RMSNorm, the FFN's
    two layers with a ReLU between (GELU's tanh form, and a gate, where the layer has them), the residual -- the
    kernels the modules call, in their order, in `dtype` (fp32 or bf16). Pointers and sizes, all checked by the
    caller (nn/decoder_layer.py, which also builds `layer`: the sizes and activation, the seven linear layers as
    (weight, bias, comp, scale, narrow, gemv), the three norms' weights, eps and scale)."""
    _tuned()
    _extension().decoder_layer_step(x, out, rows, self_k, self_v, cache_len, start, self_add, self_add_rows,
                                    self_add_heads, cross_k, cross_v, cross_add, group, enc_len, cross_add_rows,
                                    torch.get_num_threads(), *layer, _DTYPE_CODES[dtype])


def gelu_(y: torch.Tensor) -> torch.Tensor | None:
    """GELU (the exact form) over y in place, in one C pass: fp32, the fp32 GEMM's GELU epilogue (`linear_f32`'s
    "gelu", within 1.4e-6 of the exact GELU) for a layer without one (int8); bf16, each value widened, the same
    formula, rounded once (torch's bf16 gelu took ~1 ns a value). None where it does not apply (other dtypes,
    non-contiguous, autograd, a trace, no extension); y is then unchanged."""
    if y.dtype not in _DTYPE_CODES or not y.numel() or not _native(y):
        return None
    cols = y.size(-1)
    _extension().gelu_rows(y.data_ptr(), _DTYPE_CODES[y.dtype], y.numel() // cols, cols, torch.get_num_threads())
    return y


def gelu_tanh_(y: torch.Tensor) -> torch.Tensor | None:
    """GELU's tanh form (`gelu_new`, torch's approximate="tanh") over y in place, in one C pass: x · σ(2u) with
    u = √(2/π)(x + 0.044715 x³), within 6e-7 of the formula in float64 (1e-6 relative for x > -3; torch's own fp32:
    4.3e-7, 1.2e-5; csrc/common.h); bf16 widened, the same fp32 formula, rounded once. None where it does not apply
    (other dtypes, non-contiguous, autograd, a trace, no extension); y is then unchanged."""
    if y.dtype not in _DTYPE_CODES or not y.numel() or not _native(y):
        return None
    _extension().gelu_tanh(y.data_ptr(), _DTYPE_CODES[y.dtype], y.numel(), torch.get_num_threads())
    return y


def beam_topk(scores: torch.Tensor, running: torch.Tensor, keep: int, log_softmax: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A beam-search step's candidates: scores (B·K, V) and the beams' running scores (B, K), fp32 -> the `keep`
    best sums scores[b·K + k, v] + running[b, k] of each input b over its K beams and V words, (B, keep) sums
    descending and (B, keep) int64 indices k·V + v -- `(scores.view(B, K, V) + running[..., None]).view(B,
    -1).topk(keep)` in one pass, ties to the lower index. With `log_softmax`, `scores` are logits and each row's
    log-softmax is taken on the way, (x - max) - logsumexp as torch orders it (to ~1e-6 of torch's: another
    exp and summation order), without writing the (B·K, V) log-probabilities. None where the C kernel does not
    apply (below AVX2, other dtypes) or a sum is NaN (torch's topk ranks NaN first; the caller's torch path
    then does)."""
    if (not _cpu_has("beam_topk") or scores.dim() != 2 or running.dim() != 2
            or scores.size(0) != running.numel() or not 1 <= keep <= running.size(1) * scores.size(1)
            or scores.dtype != torch.float32 or running.dtype != torch.float32 or not _native(scores, running)):
        return None
    (B, K), V = running.shape, scores.size(1)
    best = torch.empty((B, keep), dtype=torch.float32)
    index = torch.empty((B, keep), dtype=torch.int64)
    if _extension().beam_topk(scores.data_ptr(), running.data_ptr(), best.data_ptr(), index.data_ptr(), B, K, V,
                              keep, int(log_softmax), torch.get_num_threads()):
        return None
    return best, index


def argmax_rows(x: torch.Tensor) -> torch.Tensor | None:
    """x.argmax(-1) for fp32 or bf16 x (B, V), the first of equal maxima, as torch -- greedy decoding's next tokens,
    in one pass (`beam_topk` with one beam and one candidate; torch's argmax took ~0.6 ms over 32 x 32k fp32
    logits at one thread, and 0.125 ms over one row of 32k bf16 ones, where widening them first takes ~0.01 ms: the
    same values, so the same maxima). None where `beam_topk` does not apply, or a value is NaN."""
    if x.dim() != 2 or x.size(1) == 0:
        return None
    if x.dtype == torch.bfloat16:
        x = x.float()
    found = beam_topk(x, x.new_zeros(x.size(0), 1), 1)
    return None if found is None else found[1][:, 0]


# --------------------------------------------------------------- int8 GEMM: AMX, AVX-512 VNNI, AVX-VNNI, AVX2
def int8_kernel() -> str | None:
    """Which of bertlab's int8 GEMMs `int8_linear` runs at the dispatch level: "amx" (AMX tiles from 16 rows
    where K % 64 == 0 -- below, the AVX-512 VNNI kernel's row-streaming tiles keep up and a tile of 16 rows would
    be mostly empty -- AVX-512 VNNI otherwise), "vnni" (AVX-512 VNNI), "avxvnni", "avx2", or None (no extension,
    or the level "none"). The extension's table decides; this names its choice (asked before every int8 layer's
    call: looked up once per dispatch table)."""
    global _int8_kernel_for
    table = _dispatch()
    if _int8_kernel_for[0] is not table:
        _int8_kernel_for = (table, next((k for k in ("amx", "vnni", "avxvnni", "avx2") if f"int8_{k}" in table[2]),
                                        None))
    return _int8_kernel_for[1]


_int8_kernel_for: tuple = (None, None)  # (the dispatch table it was read from, int8_kernel()'s answer)


def int8_gemm_available() -> bool:
    """Whether `int8_linear` runs here: the extension is built and the dispatch level has AMX, AVX-512 VNNI,
    AVX-VNNI or AVX2."""
    return int8_kernel() is not None


@functools.cache  # once per process
def int_mm_exact() -> bool:
    """Whether this torch has a CPU int8 GEMM (torch._int_mm) that gives exact integer products (probed on a small
    case). Not where oneDNN is held to AVX2 (`ONEDNN_MAX_CPU_ISA=AVX2`, and so presumably on an AVX2-only CPU):
    there its s8 x s8 GEMM saturates (measured on an Intel Xeon: off by up to 25,114 on this probe's 5 x 40 x 24
    products of values in [-127, 127])."""
    try:
        g = torch.Generator().manual_seed(0)
        a = torch.randint(-127, 128, (5, 40), dtype=torch.int8, generator=g)
        b = torch.randint(-127, 128, (24, 40), dtype=torch.int8, generator=g)
        return bool(torch.equal(torch._int_mm(a, b.t()), a.int() @ b.int().t()))
    except (RuntimeError, AttributeError, TypeError):  # (no CPU int8 GEMM in this build)
        return False


# The widest weights AVX2's narrow int8 kernel takes: VPMADDUBSW sums two products of an unsigned x + 128 (at most
# 255) and a signed weight into int16 with saturation; with |w| <= 64 a pair stays within 2 · 255 · 64 = 32,640
# < 2^15, so the sums are exact in three instructions a vector. Wider weights take the four-instruction kernel.
NARROW_WEIGHT_MAX = 64


def pack_int8_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool] | None:
    """(N, K) int8 weight -> the layout `int8_linear` reads, [N/16][K/4][16][4] (16 columns with 4 consecutive k
    each per 64 bytes), the (N,) int32 correction 128 · Σ_k W[n, k] for the kernels' unsigned inputs, and whether
    every weight is within ±NARROW_WEIGHT_MAX (then AVX2 without VNNI takes its narrow kernel). None when N is
    not a multiple of 16 or K of 4."""
    n, k = weight.shape
    if n % 16 or k % 4:
        return None
    packed = weight.reshape(n // 16, 16, k // 4, 4).permute(0, 2, 1, 3).contiguous()
    # (min and max, not abs: an int8 -128's abs is -128)
    narrow = bool(weight.numel() == 0 or -NARROW_WEIGHT_MAX <= weight.min() and weight.max() <= NARROW_WEIGHT_MAX)
    return packed, weight.sum(1, dtype=torch.int32).mul_(128), narrow


def int8_linear(x: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor, bool], wscale: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
    """An int8 linear layer in one call -- on AMX tiles, AVX-512 VNNI, AVX-VNNI or AVX2, as the dispatch level's
    table has it (`int8_kernel()`; `int8_gemm_available()` must hold): x (M, K) fp32 or bf16, quantized per row as `quantize_rows`,
    times W packed by `pack_int8_weight`, dequantized as `dequantize_rows` -- bit for bit the result of those
    two around torch._int_mm, in one pass over W that serves every row. Returns (M, N) fp32."""
    weight, comp, narrow = packed
    (m, k), n = x.shape, comp.numel()
    if (x.dtype not in _DTYPE_CODES or not _native(x) or weight.numel() != n * k or wscale.numel() != n
            or (bias is not None and bias.numel() != n)):
        raise ValueError(f"int8_linear: x {tuple(x.shape)} {x.dtype} does not fit a packed "
                         f"({n}, {weight.numel() // max(n, 1)}) weight")
    y = wscale.new_empty((m, n))  # fp32, as the scales
    _tuned()
    _extension().linear_int8(x.data_ptr(), _DTYPE_CODES[x.dtype], weight.data_ptr(), comp.data_ptr(),
                             wscale.data_ptr(), None if bias is None else bias.data_ptr(), y.data_ptr(), m, k, n,
                             narrow, torch.get_num_threads())
    return y
