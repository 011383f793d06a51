"""Multi-head scaled dot-product attention with one explicit seam, for every model family:

    Attention(Q, K, V) = softmax(scale · Q Kᵀ + bias + mask) V          (Vaswani et al., 2017, eq. 1)

    mask    `AttentionMask`: which keys a query may see -- `bidirectional` (every real key: BERT, T5's
            encoder), `causal` (keys at or before the query: a decoder, a language model) or `prefix`
            (the row's first `prefix_lengths[b]` keys fully visible, causal after them: T5's prefix LM),
            each combined with key padding
    bias    an optional additive (1 | B, nh, T_q, T_k) tensor: T5's relative position bias
    scale   1/√d_k by default (BERT); T5 folds it into its initialisation and passes 1.0
    layout  a `TokenLayout` when q, k, v hold only the real tokens, (N, H): a kernel that needs the (B, T)
            rectangle gets it padded; a variable-length kernel can take the rows as they are
    kernel  chosen by name, explicitly (a model's `attn_implementation`), never by global autograd state:
              eager   the formula above as written; the only kernel that returns the probabilities
              sdpa    `F.scaled_dot_product_attention`, which picks PyTorch's fastest backend for the inputs
            `register_attention_kernel` adds one (a FlashAttention varlen kernel on a GPU, say).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .elementwise import dropout
from .token_layout import TokenLayout

MASK_KINDS = ("bidirectional", "causal", "prefix")


@dataclass
class AttentionMask:
    """Which keys each query may see; see the module docstring for the kinds."""

    kind: str = "bidirectional"
    keep: torch.Tensor | None = None  # (B, T_k) bool, True = a real token; None: no padding anywhere
    prefix_lengths: torch.Tensor | None = None  # (B,) for kind "prefix": visible-to-all keys per row
    _additive: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in MASK_KINDS:
            raise ValueError(f"attention mask kind {self.kind!r}; expected one of {', '.join(MASK_KINDS)}")
        if (self.kind == "prefix") != (self.prefix_lengths is not None):
            raise ValueError("a prefix mask needs prefix_lengths, and only a prefix mask takes them")

    @classmethod
    def padding(cls, attention_mask: torch.Tensor | None, kind: str = "bidirectional",
                prefix_lengths: torch.Tensor | None = None) -> AttentionMask:
        """From a (B, T) 1/0 attention mask. No padding at all gives `keep=None`, so a fused kernel may run
        without a mask tensor."""
        keep = None
        if attention_mask is not None and not bool(attention_mask.all()):
            keep = attention_mask.bool()
        return cls(kind, keep, prefix_lengths)

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
                   scale: float | None, need_weights: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """PyTorch's fused attention. CPU training with dropout goes to the eager formula instead: SDPA takes that
    same math path there, but with the slow per-element dropout (see `elementwise.dropout`). (A caller who
    wants the probabilities never gets here: `attention` runs eager for them.)"""
    if dropout_p > 0 and q.device.type == "cpu":
        return eager_attention(q, k, v, mask, bias, dropout_p, scale, need_weights)
    T_q, T_k = q.size(-2), k.size(-2)
    if mask is not None and mask.kind == "causal" and mask.keep is None and bias is None and T_q == T_k:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale), None
    attn_mask = mask.additive(T_q, T_k, q.dtype, q.device) if mask is not None else None
    if bias is not None:
        attn_mask = bias.to(q.dtype) if attn_mask is None else bias.to(q.dtype) + attn_mask
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale), None


@dataclass(frozen=True)
class AttentionKernel:
    fn: Kernel
    unpadded: bool = False  # True: takes (N, nh, hs) rows with the layout's cu_seqlens instead of rectangles


ATTENTION_KERNELS: dict[str, AttentionKernel] = {
    "eager": AttentionKernel(eager_attention),
    "sdpa": AttentionKernel(sdpa_attention),
}


def register_attention_kernel(name: str, fn: Kernel, unpadded: bool = False) -> None:
    """Make `fn` selectable as `attn_implementation = name`."""
    ATTENTION_KERNELS[name] = AttentionKernel(fn, unpadded)


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
    with `layout`. Returns the heads' output in q's shape, and the (B, nh, T_q, T_k) probabilities when
    `need_weights` (which takes the eager kernel)."""
    impl = get_kernel("eager" if need_weights else kernel)
    p = dropout_p if training else 0.0
    if layout is not None and impl.unpadded:
        return impl.fn(q, k, v, mask, bias, p, scale, need_weights, layout=layout)
    if layout is not None:  # the kernel needs the (B, T) rectangle: pad here, drop the padding at the end
        q, k, v = layout.pad(q), layout.pad(k), layout.pad(v)
    B, T_q, H = q.shape
    # (B, T, H) -> (B, nh, T, hs)
    q, k, v = (t.view(B, t.size(1), num_heads, H // num_heads).transpose(1, 2) for t in (q, k, v))
    y, probs = impl.fn(q, k, v, mask, bias, p, scale, need_weights)
    y = y.transpose(1, 2).reshape(B, T_q, H)  # re-assemble the heads side by side
    return (layout.unpad(y) if layout is not None else y), probs
