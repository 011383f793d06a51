"""Rotary positions (Su et al., RoFormer) written over q and k in place, for CPU inference in fp32.

    rotate_qk_(qkv, cos, sin)   the fused projection's output (..., 3, nh, hs): q and k rotated where they lie,
                                x · cos + rotate_half(x) · sin, bit for bit the torch formula's result

One C pass over q and k (`csrc/rotary.c`) where torch's formula takes five, each allocating (negate,
concatenate, two products, a sum). Optional like the other kernels: without the built extension, with autograd,
in a trace, or in another dtype it returns False and the caller runs the formula.
"""

from __future__ import annotations

import functools
import os

import torch

from .cpu_kernels import tracing


@functools.cache
def _extension():
    if os.environ.get("BERTLAB_NO_CPU_KERNELS"):
        return None
    try:
        from . import _rotary
    except ImportError:
        return None
    return _rotary


def rotate_qk_(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Rotate q and k of `qkv` (..., 3, nh, hs), contiguous, in place; cos and sin (R, hs) contiguous, row r of
    qkv's flattened leading dimensions rotated by table row r % R (R = T for (B, T) rows, N for N rows). True
    when done; False where the C pass does not apply (the caller then runs the formula)."""
    ext = _extension()
    if (ext is None or qkv.dtype != torch.float32 or not qkv.is_cpu or qkv.dim() < 4 or qkv.size(-3) != 3
            or not qkv.is_contiguous() or tracing() or (torch.is_grad_enabled() and qkv.requires_grad)):
        return False
    nh, hs = qkv.shape[-2:]
    rows = qkv.numel() // (3 * nh * hs)
    for t in (cos, sin):
        if t.dtype != torch.float32 or not t.is_cpu or not t.is_contiguous() or t.dim() != 2 or t.size(1) != hs:
            return False
    if cos.shape != sin.shape or not rows or rows % cos.size(0):
        return False
    ext.rotate_heads(qkv.data_ptr(), 3 * nh * hs, 2 * nh, hs, hs, rows, cos.data_ptr(), sin.data_ptr(),
                     cos.size(0), torch.get_num_threads())
    return True
