"""Multi-head scaled dot-product attention with one explicit seam, for every model family:

    Attention(Q, K, V) = softmax(scale · Q Kᵀ + bias + mask) V          (Vaswani et al., 2017, eq. 1)

    mask    `AttentionMask`: which keys a query may see -- `bidirectional` (every real key: BERT, T5's
            encoder), `causal` (keys at or before the query: a decoder, a language model) or `prefix`
            (the row's first `prefix_lengths[b]` keys fully visible, causal after them: T5's prefix LM),
            each combined with key padding
    bias    an optional additive (1 | B, nh, T_q, T_k) tensor: T5's relative position bias
    scale   1/√d_k by default (BERT); T5 folds it into its initialisation and passes 1.0
    layout  a `TokenLayout` when q, k, v hold only the real tokens, (N, H): a kernel that needs the (B, T)
            rectangle gets it padded; a variable-length kernel can take the rows as they are. A packed row
            (several documents, numbered 1, 2, ... by the attention mask) attends within each document only
    kernel  chosen by name, explicitly (a model's `attn_implementation`), never by global autograd state:
              eager   the formula above as written; the only kernel that returns the probabilities
              sdpa    `F.scaled_dot_product_attention`, which picks PyTorch's fastest backend for the inputs;
                      on a GPU in bf16/fp16 it takes unpadded tokens as they are, through PyTorch's
                      variable-length FlashAttention (`varlen_flash`), with no (B, T) rectangle at all
              bmm     inference on a CPU: in bf16 the formula as batched matrix multiplies, a bounded slice of
                      the batch at a time (~1.8-2x SDPA's flash kernel); in fp32 fused C loops per (row, head)
                      (1.2-1.9x SDPA; see `bmm_attention`)
              bmm_bf16  for a model whose linear layers run in int8 on a CPU with native bf16: `bmm` in bf16
                      on long rows (q, k, v cast, the output cast back), `bmm`'s fp32 C loops up to 256 keys
            `register_attention_kernel` adds one.
    window  a local window (ModernBERT's sliding layers): `window_attention` runs it in one call where the kernel
            has a windowed form (the CPU inference kernels' fp32 C loops), each query tile computing only the
            keys its window reaches; elsewhere the model runs blocks of queries with the band as a mask.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .cpu_kernels import attention_bf16, attention_one_query, attention_short, bf16_dot_available, cpu_isa, softmax_
from .cpu_tuning import cpu_family
from .elementwise import dropout
from .token_layout import TokenLayout

MASK_KINDS = ("bidirectional", "causal", "prefix")


@dataclass
class AttentionMask:
    """Which keys each query may see; see the module docstring for the kinds."""

    kind: str = "bidirectional"
    keep: torch.Tensor | None = None  # (B, T_k) bool, True = a real token; None: no padding anywhere
    prefix_lengths: torch.Tensor | None = None  # (B,) for kind "prefix": visible-to-all keys per row
    # (B, T) document numbers of packed rows (0 padding, 1, 2, ...): a query sees keys of its own document
    # only; None: one document per row
    documents: torch.Tensor | None = None
    _additive: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in MASK_KINDS:
            raise ValueError(f"attention mask kind {self.kind!r}; expected one of {', '.join(MASK_KINDS)}")
        if (self.kind == "prefix") != (self.prefix_lengths is not None):
            raise ValueError("a prefix mask needs prefix_lengths, and only a prefix mask takes them")
        if self.documents is not None and self.kind == "prefix":
            raise ValueError("a prefix mask cannot hold packed rows (its prefix is a row's, not a document's)")

    @classmethod
    def padding(cls, attention_mask: torch.Tensor | None, kind: str = "bidirectional",
                prefix_lengths: torch.Tensor | None = None) -> AttentionMask:
        """From a (B, T) attention mask: 1/0, or 0 at padding and 1, 2, ... numbering the documents of packed
        rows. No padding at all gives `keep=None`, so a fused kernel may run without a mask tensor."""
        keep = documents = None
        if attention_mask is not None:
            low, high = torch.stack([attention_mask.min(), attention_mask.max()]).tolist()  # one device sync
            if low < 0:
                raise ValueError(f"attention mask values must be 0 (padding) or document numbers 1, 2, ...; got {low}")
            keep = attention_mask.bool() if low == 0 else None
            documents = attention_mask if high > 1 else None
        return cls(kind, keep, prefix_lengths, documents)

    def visible(self, T_q: int, T_k: int, device: torch.device) -> torch.Tensor | None:
        """(B | 1, 1, T_q, T_k) bool, True where query i may attend to key j; None when all may."""
        allowed = self.keep[:, None, None, :] if self.keep is not None else None  # (B, 1, 1, T_k)
        if self.kind != "bidirectional":
            # Queries are the last T_q positions of the T_k keys (T_q < T_k when decoding with a cache).
            i = torch.arange(T_k - T_q, T_k, device=device)[:, None]  # (T_q, 1)
            j = torch.arange(T_k, device=device)[None, :]  # (1, T_k)
            order = (j <= i)[None, None]  # (1, 1, T_q, T_k): causal
            if self.kind == "prefix":
                order = order | (j[None, None] < self.prefix_lengths.to(device)[:, None, None, None])
            allowed = order if allowed is None else allowed & order
        if self.documents is not None:  # packed rows: block-diagonal, one block per document
            docs = self.documents.to(device)
            same = docs[:, None, -T_q:, None] == docs[:, None, None, :]  # (B, 1, T_q, T_k)
            allowed = same if allowed is None else allowed & same
        return allowed

    def additive(self, T_q: int, T_k: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
        """The mask as an additive float tensor: 0 where visible, the dtype's minimum elsewhere; None when
        everything is visible. Additive rather than boolean: a row with no visible key (an all-padding
        sequence) then softmaxes to a uniform distribution instead of NaN. Built in the dtype attention runs
        in (bf16/fp16 under autocast), so the minimum is representable there; made once per shape and dtype
        and shared by every layer."""
        key = (T_q, T_k, dtype, device)
        if key not in self._additive:
            allowed = self.visible(T_q, T_k, device)
            self._additive[key] = None if allowed is None else (~allowed).to(dtype) * torch.finfo(dtype).min
        return self._additive[key]


# A kernel: (q, k, v) of (B, nh, T, hs), mask, bias, dropout p (0 when not training), scale, whether the
# probabilities are wanted -> ((B, nh, T_q, hs), probabilities or None).
Kernel = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def eager_attention(q, k, v, mask: AttentionMask | None, bias: torch.Tensor | None, dropout_p: float,
                    scale: float | None, need_weights: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The formula as written. In place where autograd allows: the matmul's backward needs q and k, not its
    output, so scaling, bias and mask may overwrite it instead of allocating more (B, nh, T, T) tensors."""
    T_q, T_k = q.size(-2), k.size(-2)
    scores = (q @ k.transpose(-2, -1)).mul_(scale if scale is not None else 1.0 / math.sqrt(q.size(-1)))
    if bias is not None:
        scores.add_(bias)  # broadcast over the batch; a learned bias gets its gradient through add_ too
    if mask is not None and (m := mask.additive(T_q, T_k, scores.dtype, scores.device)) is not None:
        scores.add_(m)
    probs = scores.softmax(dim=-1)  # (B, nh, T_q, T_k)
    return dropout(probs, dropout_p, dropout_p > 0) @ v, probs


def sdpa_attention(q, k, v, mask: AttentionMask | None, bias: torch.Tensor | None, dropout_p: float,
                   scale: float | None, need_weights: bool, layout: TokenLayout | None = None):
    """PyTorch's fused attention. CPU training with dropout goes to the eager formula instead: SDPA takes that
    same math path there, but with the slow per-element dropout (see `elementwise.dropout`). (A caller who
    wants the probabilities never gets here: `attention` runs eager for them.)

    With `layout`, q, k, v are (N, nh, hs) rows of real tokens: on a GPU in bf16/fp16 PyTorch's
    variable-length FlashAttention takes them as they are (`varlen_flash`) and the result is (N, nh, hs);
    None where it does not run (the caller then pads to rectangles)."""
    if layout is not None:
        if bias is None and (mask is None or mask.kind != "prefix") and varlen_flash_runs(q.device, q.dtype, q.size(-1)):
            return varlen_flash(q, k, v, layout, dropout_p, scale, causal=mask is not None and mask.kind == "causal")
        return None
    if dropout_p > 0 and q.device.type == "cpu":
        return eager_attention(q, k, v, mask, bias, dropout_p, scale, need_weights)
    T_q, T_k = q.size(-2), k.size(-2)
    if mask is not None and mask.kind == "causal" and mask.keep is None and mask.documents is None \
            and bias is None and T_q == T_k:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale), None
    attn_mask = mask.additive(T_q, T_k, q.dtype, q.device) if mask is not None else None
    if bias is not None:
        attn_mask = bias.to(q.dtype) if attn_mask is None else bias.to(q.dtype) + attn_mask
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale), None


# ------------------------------------------------------------------------------- variable-length, on a GPU
# (device, dtype, head size) -> whether varlen FlashAttention runs: answered once, then a dict lookup (a plain
# dict, which torch.compile reads without stopping its graph; the answer reads the GPU's properties and backend
# flags, which do not change during a run)
_VARLEN_RUNS: dict[tuple, bool] = {}


def varlen_flash_runs(device: torch.device, dtype: torch.dtype, head_size: int) -> bool:
    """Whether PyTorch's variable-length FlashAttention runs for inputs on `device` in `dtype`: a CUDA GPU of
    compute capability 8.0+ (Ampere or newer), bf16 or fp16, heads of a multiple of 8 up to 256, the flash
    backend enabled."""
    if device.type != "cuda":
        return False
    key = (device, dtype, head_size)
    if key not in _VARLEN_RUNS:
        index = device.index if device.index is not None else torch.cuda.current_device()
        _VARLEN_RUNS[key] = (dtype in (torch.float16, torch.bfloat16) and head_size % 8 == 0 and head_size <= 256
                             and hasattr(torch.ops.aten, "_flash_attention_forward")
                             and torch.backends.cuda.flash_sdp_enabled()
                             and torch.cuda.get_device_capability(index)[0] >= 8)
    return _VARLEN_RUNS[key]


def varlen_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TokenLayout, dropout_p: float,
                 scale: float | None, causal: bool = False, window: tuple[int, int] | None = None) -> torch.Tensor:
    """softmax(scale · q kᵀ) v within each sequence of `layout`, for q, k, v (N, nh, hs) rows of real tokens
    (any row stride, hs contiguous) -> (N, nh, hs). One FlashAttention launch for the whole batch: no padding
    computed, no (B, T) rectangle or mask tensor made, sequences of a packed row kept apart by `cu_seqlens`.
    `window` (left, right): query i sees keys i - left .. i + right only (local attention, as ModernBERT's
    sliding-window layers). PyTorch's own varlen kernel (the op behind `torch.nn.attention.varlen`, which
    leaves out dropout), with its autograd; dropout as SDPA applies it."""
    cu = layout.cu_seqlens
    left, right = window if window is not None else (-1, -1)
    return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, layout.max_seqlen, layout.max_seqlen, dropout_p,
                                                   causal, False, scale=scale, window_size_left=left,
                                                   window_size_right=right)[0]


def attention_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype projections of `x` come out in: the autocast dtype where autocast is on for x's device."""
    try:
        if torch.is_autocast_enabled(x.device.type):
            return torch.get_autocast_dtype(x.device.type)
    except (TypeError, AttributeError, RuntimeError):  # torch < 2.4: autocast state by device kind only
        if x.is_cuda and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
    return x.dtype


def takes_rows(kernel: str, x: torch.Tensor, head_size: int) -> bool:
    """Whether attention kernel `kernel` takes the unpadded rows of `x` (N, H) as they are here, so a model
    may unpad for inference too (training unpads anyway)."""
    return get_kernel(kernel).unpadded and varlen_flash_runs(x.device, attention_dtype(x), head_size)


# From this many keys fp32 attention goes to PyTorch's SDPA (its CPU flash kernel: blocked, no T x T scores) and
# not the C loops, which are built for short rows: one head of 64, one query row per key, one thread, on the
# AMX Xeon (load average ~1.5): level at 512-1,024 keys, SDPA 1.18x at 2,048, 2.6x at 8,192 (139 vs 368 ms).
LONG_KEYS = 2048
# There q, k, v go to SDPA as contiguous (B, nh, T, hs) copies, not strided views of the (B, T, H) projections (a
# head's rows 9 KB apart in ModernBERT's fused qkv), copies included: one ModernBERT-base global layer at 8,192
# tokens, fp32, one thread, the AMX Xeon at load ~1.1, 8 interleaved rounds -- 1.11x (medians 2.33 against 2.58 s;
# each round ahead, 1.01-1.36x); SDPA alone, load 5.7-7.7, 7 rounds: 1.23x. In bf16 the same copies measured
# level (1.09x median, 0.97-1.62x, under load), so the bf16 paths keep the views. The C loops on long rows take
# contiguous keys and values too: they read a head's value rows one after another for each tile of queries, and
# as views of the fused projections those rows lie 9 KB apart, 18 MB for 2,048 keys, past what the TLB maps --
# 12 heads of 64 through the loops, one thread, an AMD EPYC (Zen 4): from views 1.53x slower on one row of 2,048
# keys (244 against 159 ms) and of 8,192 (3.80 against 2.48 s); level on 4 rows of 128 to 1,024.
# From this many keys, on a CPU with AMX, an int8 or bf16 model's bf16 attention goes to SDPA in bf16 (its flash
# kernel's GEMMs on AMX tiles) and not `attention_bf16`'s AMX tile kernel: one row of 12 heads of 64, one thread, the
# AMX Xeon (load ~1), medians of interleaved rounds -- the kernel 1.33x SDPA at 1,024 keys (11.6 vs 15.4 ms), 1.42x
# at 2,048, 1.26x at 4,096, SDPA 1.21x at 8,192 (857 vs 1,036 ms). (Against the AVX-512 BF16 loops alone, before
# the tile kernel, SDPA led from 1,024 keys: 3.3-3.9x.)
AMX_SDPA_KEYS = 6144

# Where a CPU family was measured to want another bound than `LONG_KEYS` at a dispatch level, by (vendor, family,
# level) (`cpu_tuning.cpu_family`, `cpu_isa()`; None: the C loops at every length). AMD Zen 4 (family 25) at the
# avx512 level: the loops ahead of SDPA at every length -- one row of 12 heads of 64, medians of 3 interleaved
# rounds, an AMD EPYC (family 25, model 17), the machine quiet: one thread 1.02x at 1,024 keys, 1.12x at 2,048 and
# 4,096, 1.15x at 8,192 (2.22 against 2.55 s); two threads 1.06-1.25x; heads of 32, one thread, 1.05-1.10x. Not at
# the avx2 level (the same CPU held to AVX2, torch's kernels too: the loops 0.81-0.85x SDPA from 2,048 keys), which
# family 25's Zen 3 CPUs (AVX2 only) run at.
LONG_KEYS_BY_CPU: dict[tuple[str, int, str], int | None] = {("AuthenticAMD", 25, "avx512"): None}


def long_keys() -> int:
    """From how many keys fp32 attention runs SDPA rather than the C loops on this CPU at its dispatch level
    (`LONG_KEYS`, or `LONG_KEYS_BY_CPU`'s bound; a bound no row reaches where the loops take every length)."""
    family = cpu_family()
    bound = LONG_KEYS if family is None else LONG_KEYS_BY_CPU.get((*family, cpu_isa()), LONG_KEYS)
    return 1 << 62 if bound is None else bound


def bf16_sdpa(dtype: torch.dtype, keys: int) -> bool:
    """Whether `bmm_attention` hands rows of `keys` keys in `dtype` to SDPA on AMX (a bf16 model's long rows, from
    `AMX_SDPA_KEYS`) rather than to the C loops -- which a one-call block must not run in its place."""
    return dtype == torch.bfloat16 and keys >= AMX_SDPA_KEYS and cpu_isa() == "amx"

# The most bytes of attention scores `bmm_attention` holds at once. A whole batch's (B, nh, T_q, T_k) scores
# outgrow the caches (4 rows of 512 tokens, 12 heads: 25 MB in bf16) and then memory traffic sets the pace;
# slices of a few MB measured fastest at 1 and 2 threads, and bound the memory a long batch needs.
SCORE_CHUNK_BYTES = 8 << 20


def _additive(mask: AttentionMask | None, bias: torch.Tensor | None, q: torch.Tensor,
              T_k: int) -> torch.Tensor | None:
    """The scores' additive part, bias + mask, in q's dtype: (B | 1, nh | 1, T_q | 1, T_k), or None."""
    add = mask.additive(q.size(-2), T_k, q.dtype, q.device) if mask is not None else None  # (B | 1, 1, T_q | 1, T_k)
    if bias is not None:
        bias = bias.to(q.dtype)  # (1 | B, nh, T_q, T_k)
        add = bias if add is None else bias + add
    return add


def _scale(scale: float | None, q: torch.Tensor) -> float:
    return scale if scale is not None else 1.0 / math.sqrt(q.size(-1))


def bmm_attention(q, k, v, mask: AttentionMask | None, bias: torch.Tensor | None, dropout_p: float,
                  scale: float | None, need_weights: bool) -> tuple[torch.Tensor, None]:
    """The formula as batched matrix multiplies, for inference: a few rows of the batch at a time, or a few
    heads of one row when a row's scores are bigger than `SCORE_CHUNK_BYTES`.

    Why not SDPA: on a CPU, PyTorch's flash kernel is tuned for fp32 and large heads. With bf16 inputs and
    BERT's heads (hs 32-64) it runs at fp32's pace, while oneDNN's bf16 GEMMs behind `matmul` use the CPU's
    bf16 dot products: measured on all-MiniLM-L6-v2's shapes (nh 12, hs 32), one thread, AVX-512 BF16,
    1.8-2.0x faster than SDPA at 32 to 512 tokens (4 x 384 tokens: 6.6 against 13.0 ms a layer). In fp32 the
    matmuls are no faster than SDPA (both ~100 GFLOP/s on an AMD EPYC, where oneDNN's GEMMs reach ~250), so
    fp32 runs the C loops of `cpu_kernels.attention_short` where built (heads of 16-64; 1.2-1.9x SDPA), and a
    decoding step (one query per row) `cpu_kernels.attention_one_query`; bf16 runs `cpu_kernels.attention_bf16`
    where the CPU has AVX-512 BF16 (measured on MiniLM's heads, one thread: 1.39x these matmuls at 32 x 48
    tokens, 1.54x at 4 x 384), on AMX tiles where the dispatch level is amx. Training with dropout takes the
    eager formula."""
    if dropout_p > 0:
        return eager_attention(q, *expand_shared_rows(k, v, q.size(0)), mask, bias, dropout_p, scale, need_weights)
    B, nh, T_q, hs = q.shape
    T_k = k.size(-2)
    add, scale = _additive(mask, bias, q, T_k), _scale(scale, q)
    if T_q == 1 and (y := attention_one_query(q, k, v, add, scale)) is not None:
        return y, None  # a decoding step, in one C call (nn/cpu_kernels.py)
    if T_k >= LONG_KEYS and q.dtype == torch.float32:  # long rows: each head's rows made contiguous first (see
        # LONG_KEYS), the same arithmetic bit for bit; then PyTorch's blocked flash kernel, or the C loops below
        if T_k >= long_keys():
            q, k, v = (t.contiguous() for t in (q, *expand_shared_rows(k, v, B)))
            return F.scaled_dot_product_attention(q, k, v, attn_mask=add, scale=scale), None
        k, v = k.contiguous(), v.contiguous()
    if bf16_sdpa(q.dtype, T_k):
        # a bf16 model's long rows: SDPA in bf16 (GEMMs on AMX tiles) over the tile kernel, as an int8 model's
        # (`AMX_SDPA_KEYS`; bf16 inputs, 12 heads of 64, 8,192 keys, one thread, load ~10: SDPA 1.36x the tiles)
        k, v = expand_shared_rows(k, v, B)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=add, scale=scale), None
    if (y := attention_short(q, k, v, add, scale)) is not None:
        return y, None  # fp32: register-tiled C loops per (row, head), 1.2-1.9x SDPA from 24 to 512 tokens
    if q.dtype == torch.bfloat16 and (y := attention_bf16(q, k, v, add, scale)) is not None:
        return y, None  # bf16: the same loops on AVX-512 BF16 dot products, 1.4-1.5x the matmuls below
    k, v = expand_shared_rows(k, v, B)
    out = q.new_empty(B, T_q, nh, hs)  # written head by head; its transpose is the (B, nh, T_q, hs) result
    heads_out = out.transpose(1, 2)
    per_head = T_q * T_k * q.element_size()  # bytes of one head's scores
    if nh * per_head <= SCORE_CHUNK_BYTES:
        rows = max(1, SCORE_CHUNK_BYTES // (nh * per_head))
        chunks = [(slice(b, b + rows), slice(None)) for b in range(0, B, rows)]
        heads_per_slice = min(rows, B) * nh
    else:
        heads = max(1, SCORE_CHUNK_BYTES // per_head)
        chunks = [(slice(b, b + 1), slice(h, h + heads)) for b in range(B) for h in range(0, nh, heads)]
        heads_per_slice = min(heads, nh)
    kt = k.transpose(-1, -2)  # (B, nh, hs, T_k)
    # One buffer for every slice's scores: a fresh multi-MB tensor per slice costs page faults each time.
    buffer = q.new_empty(heads_per_slice * T_q * T_k)
    for rows, heads in chunks:
        qc = q[rows, heads]  # (b, h, T_q, hs)
        b, h = qc.shape[:2]
        q3, k3 = qc.reshape(b * h, T_q, hs), kt[rows, heads].reshape(b * h, hs, T_k)
        scores = buffer[:b * h * T_q * T_k].view(b * h, T_q, T_k)
        if add is not None:  # scale · Q Kᵀ + bias + mask in one GEMM (the additive part as its C matrix)
            a = add[rows] if add.size(0) > 1 else add
            a = a[:, heads] if a.size(1) > 1 else a  # (b | 1, h | 1, T_q | 1, T_k)
            a = a.expand(b, h, a.size(2), T_k).reshape(b * h, a.size(2), T_k)
            torch.baddbmm(a, q3, k3, alpha=scale, out=scores)
        else:
            torch.bmm(q3, k3, out=scores).mul_(scale)
        softmax_(scores)  # in place
        heads_out[rows, heads] = torch.bmm(scores, v[rows, heads].reshape(b * h, T_k, hs)).view(b, h, T_q, hs)
    return heads_out, None


def window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int, window: int,
                     keep: torch.Tensor | None, kernel: str) -> torch.Tensor | None:
    """Local attention -- query i sees the keys j with |i - j| <= window, and of those the real tokens -- in one
    call, where the model's kernel has a windowed form: the CPU inference kernels' C loops
    (`cpu_kernels.attention_short` / `attention_bf16` with `window`), whose query tiles each compute only the
    key blocks their window reaches, where blocks of queries through the padded kernel compute 2w x 4w scores
    with half of them masked. q, k, v (B, T, H); keep (B, T) bool (None: no padding) -> (B, T, H), or None where
    it does not run.

    Each model's kernel keeps its arithmetic: fp32 (`bmm` on fp32) the fp32 loops; bf16 (`bmm` on bf16) and int8
    (`bmm_bf16`, fp32 in and out) the AVX-512 BF16 loops, where the CPU has them -- an int8 model without them
    the fp32 loops, as its blocks ran. A local layer of ModernBERT-base's shape on an AMD EPYC (Zen 4), one
    thread, 256-8,192 tokens (`benchmarks/bench_modernbert.py local`): 1.59-1.71x the blocks (fp32), 1.60-1.73x
    (bf16), 1.37-1.84x (int8). Not on an AMX CPU, whose bf16 and int8 blocks run on AMX tiles or bf16
    SDPA (the windowed loops not measured against them there)."""
    bf16 = (kernel == "bmm" and q.dtype == torch.bfloat16) or (kernel == "bmm_bf16" and q.dtype == torch.float32)
    if not (bf16 or (kernel == "bmm" and q.dtype == torch.float32)) or (bf16 and cpu_isa() == "amx"):
        return None
    B, T, H = q.shape
    hs = H // num_heads
    add = AttentionMask(keep=keep).additive(1, T, q.dtype, q.device)  # (B, 1, 1, T) at the padding keys, or None
    q, k, v = (t.view(B, T, num_heads, hs).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
    scale = 1.0 / math.sqrt(hs)
    y = attention_bf16(q, k, v, add, scale, window=window) if bf16 else None
    if y is None and q.dtype == torch.float32:  # fp32, or an int8 model on a CPU without AVX-512 BF16
        y = attention_short(q, k, v, add, scale, window=window)
    return None if y is None else y.transpose(1, 2).reshape(B, T, H)


# Without AVX-512 BF16, up to this many keys an int8 model's attention stays in fp32 with bmm_attention's C
# loops: measured against the bf16 matmuls on MiniLM's heads (12 x 32), one thread, 1.4x faster at 128 keys,
# level at 192-256, slower at 384 and beyond (casting q, k, v and the output costs a fixed share).
SHORT_KEYS = 256
# On a CPU with AMX, up to this many keys the fp32 C loops, not `attention_bf16`'s AMX tile kernel: 12 heads of
# 32 and of 64, ~4,096 tokens a call, the AMX Xeon (load ~1), medians of interleaved rounds -- one thread: within
# 0.85-1.18x either way at 24 and 48 keys, at 72 level for heads of 32 and the tiles 1.58x for heads of 64, the
# tiles 1.6x at 128 and 256; two threads: the tiles ahead from 48 keys (1.2-1.3x), 2.1x at 256. End to end
# (all-MiniLM-L6-v2 int8, 16-128 tokens) this rule and the fp32 loops up to 256 keys measured level.
# (Before the tile kernel, the AVX-512 BF16 loops ran 0.29-0.68x the fp32 loops up to 256 keys here.)
AMX_SHORT_KEYS = 64


def bmm_bf16_attention(q, k, v, mask: AttentionMask | None, bias: torch.Tensor | None, dropout_p: float,
                       scale: float | None, need_weights: bool) -> tuple[torch.Tensor, None]:
    """`bmm_attention` in bf16, returned in q's dtype. For a model whose linear layers run in int8: their
    outputs carry 8 bits anyway, and attention in bf16 is ~1.6x fp32 SDPA's speed (see `bmm_attention`).
    Where the CPU has AVX-512 BF16, `cpu_kernels.attention_bf16` reads fp32 q, k, v as they are (rounding
    them as it packs) and returns fp32: on a Zen 5 core 1.07x the fp32 C loops at 32 x 48 tokens, 1.3x at
    16 x 100, 1.7-2.0x at 384-512. On a CPU with AMX it runs on tiles, up to `AMX_SHORT_KEYS` keys the fp32
    loops run instead (level there), and from `AMX_SDPA_KEYS` SDPA in bf16. One query per row (a decoder step
    against its K/V cache) stays in q's dtype: casting the whole cache for one query cost more than it saved (T5 int8 greedy decoding, batch 8: 0.21 against 0.18-0.21 s)."""
    if q.size(-2) > 1 and dropout_p == 0 and k.size(-2) >= AMX_SDPA_KEYS and cpu_isa() == "amx":
        add = _additive(mask, bias, q, k.size(-2))
        q16, k16, v16 = (t.to(torch.bfloat16) for t in (q, *expand_shared_rows(k, v, q.size(0))))
        add = add.to(torch.bfloat16).clamp_(min=torch.finfo(torch.bfloat16).min) if add is not None else None
        y = F.scaled_dot_product_attention(q16, k16, v16, attn_mask=add, scale=_scale(scale, q))
        return y.to(q.dtype), None
    short = k.size(-2) <= SHORT_KEYS
    if (q.size(-2) > 1 and dropout_p == 0 and q.dtype == torch.float32 and bf16_dot_available()
            and not (k.size(-2) <= AMX_SHORT_KEYS and cpu_isa() == "amx")):
        add = _additive(mask, bias, q, k.size(-2))
        if (y := attention_bf16(q, k, v, add, _scale(scale, q))) is not None:
            return y, None
    if q.size(-2) == 1 or (q.dtype == torch.float32 and short):
        # a decoding step, or keys few enough that bmm_attention's fp32 C loops beat casting to bf16
        if q.dtype == torch.float32:
            return bmm_attention(q, k, v, mask, bias, dropout_p, scale, need_weights)
        return sdpa_attention(q, *expand_shared_rows(k, v, q.size(0)), mask, bias, dropout_p, scale, need_weights)
    y, _ = bmm_attention(q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16), mask,
                         bias, dropout_p, scale, need_weights)
    return y.to(q.dtype), None


def expand_shared_rows(k: torch.Tensor, v: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """k, v with one row per `rows // k.size(0)` query rows (see `AttentionKernel.shared_kv`) -> one per query
    row, repeated (a copy); unchanged when they already have `rows`."""
    if k.size(0) == rows:
        return k, v
    group = rows // k.size(0)
    return k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)


@dataclass(frozen=True)
class AttentionKernel:
    fn: Kernel
    # True: given a `layout=`, takes (N, nh, hs) rows with the layout's cu_seqlens instead of rectangles and
    # returns (N, nh, hs) -- or None where it does not run for these inputs (they are padded for it then)
    unpadded: bool = False
    # True: takes k, v with fewer rows than q -- query row b reads key/value row b // (B_q / B_kv) -- so the
    # beams of one input can share its encoder's keys and values instead of holding a copy each
    shared_kv: bool = False


ATTENTION_KERNELS: dict[str, AttentionKernel] = {
    "eager": AttentionKernel(eager_attention),
    "sdpa": AttentionKernel(sdpa_attention, unpadded=True),
    "bmm": AttentionKernel(bmm_attention, shared_kv=True),
    "bmm_bf16": AttentionKernel(bmm_bf16_attention, shared_kv=True),
}


def register_attention_kernel(name: str, fn: Kernel, unpadded: bool = False, shared_kv: bool = False) -> None:
    """Make `fn` selectable as `attn_implementation = name`."""
    ATTENTION_KERNELS[name] = AttentionKernel(fn, unpadded, shared_kv)


def use_attention_kernel(model: torch.nn.Module, name: str) -> int:
    """Run every attention layer of `model` (a module with an `attn_implementation`) with kernel `name`;
    returns how many. For inference: the model's config still names the kernel it was saved with."""
    get_kernel(name)
    layers = [m for m in model.modules() if isinstance(getattr(m, "attn_implementation", None), str)]
    for m in layers:
        m.attn_implementation = name
    return len(layers)


def get_kernel(name: str) -> AttentionKernel:
    try:
        return ATTENTION_KERNELS[name]
    except KeyError:
        raise ValueError(f"unknown attention kernel {name!r}; expected one of {', '.join(ATTENTION_KERNELS)}") from None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int, mask: AttentionMask | None = None,
              bias: torch.Tensor | None = None, *, layout: TokenLayout | None = None, kernel: str = "sdpa",
              dropout_p: float = 0.0, training: bool = False, scale: float | None = None,
              need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Multi-head attention over projected q (B, T_q, H), k and v (B, T_k, H) -- or (N, H) rows of real tokens
    with `layout`. k and v may have B / G rows, each shared by G consecutive rows of q (the beams of one
    input); kernels without `shared_kv` get them repeated. Returns the heads' output in q's shape, and the
    (B, nh, T_q, T_k) probabilities when `need_weights` (which takes the eager kernel)."""
    impl = get_kernel("eager" if need_weights else kernel)
    p = dropout_p if training else 0.0
    if layout is not None and impl.unpadded:
        N, H = q.shape
        rows = [t.view(N, num_heads, H // num_heads) for t in (q, k, v)]  # (N, nh, hs)
        y = impl.fn(*rows, mask, bias, p, scale, need_weights, layout=layout)
        if y is not None:
            return y.reshape(N, H), None
    if layout is not None:  # the kernel needs rectangles: pad here, drop the padding at the end
        packed, layout = layout.packed, layout.sequences  # a packed row's documents become rows of their own
        q, k, v = layout.pad(q), layout.pad(k), layout.pad(v)
        if packed and mask is not None:
            mask = AttentionMask(mask.kind, layout.keep())
    B, T_q, H = q.shape
    if k.size(0) != B:
        if k.size(0) == 0 or B % k.size(0) or v.size(0) != k.size(0):
            raise ValueError(f"attention: {k.size(0)} rows of keys for {B} rows of queries (a divisor expected)")
        if not impl.shared_kv:
            k, v = expand_shared_rows(k, v, B)
    # (B, T, H) -> (B, nh, T, hs)
    q, k, v = (t.view(t.size(0), t.size(1), num_heads, H // num_heads).transpose(1, 2) for t in (q, k, v))
    y, probs = impl.fn(q, k, v, mask, bias, p, scale, need_weights)
    y = y.transpose(1, 2).reshape(B, T_q, H)  # re-assemble the heads side by side
    return (layout.unpad(y) if layout is not None else y), probs
