"""The in-place rotary pass (`cpu_kernels.rotate_qk_`, csrc/rows.c at each level) against the torch formula it replaces, x · cos +
rotate_half(x) · sin: bit for bit, fp32 and bf16 (widened to fp32 and narrowed once, as `transformers` computes
it), over (B, T) rows and over unpadded (N) rows, and refused where it must not run."""

from __future__ import annotations

import pytest
import torch

from bertlab.nn import cpu_kernels as rotary


def formula(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.size(-1) // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def tables(R: int, hs: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    angles = torch.rand(R, hs // 2, generator=g) * 50
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


needs_c = pytest.mark.skipif(rotary._extension() is None, reason="the C extension is not built")


@needs_c
@pytest.mark.parametrize("isa", ["avx512", "avx2", "none"], indirect=True)  # each level's loop, no FMA contraction
@pytest.mark.parametrize("lead", [(2, 37), (1, 300), (53,)])  # (B, T) rows, one long row, N unpadded rows
@pytest.mark.parametrize("nh,hs", [(12, 64), (4, 16), (3, 6)])
def test_rotation_in_place_is_the_formula_bit_for_bit(lead, nh, hs, threads, isa):
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(*lead, 3, nh, hs, generator=g) * 4
    cos, sin = tables(lead[-1], hs)  # row t of a (B, T) batch takes table row t; an unpadded row its own
    c, s = cos[:, None, :], sin[:, None, :]  # broadcast over heads
    expected_q, expected_k = formula(qkv[..., 0, :, :], c, s), formula(qkv[..., 1, :, :], c, s)
    v = qkv[..., 2, :, :].clone()
    with torch.inference_mode():
        assert rotary.rotate_qk_(qkv, cos, sin)
    assert torch.equal(qkv[..., 0, :, :], expected_q)
    assert torch.equal(qkv[..., 1, :, :], expected_k)
    assert torch.equal(qkv[..., 2, :, :], v)  # v is left alone


def formula_bf16(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' `apply_rotary_pos_emb` at bf16: q.float() against the bf16 tables, back to bf16"""
    return formula(x.float(), cos, sin).to(torch.bfloat16)


@needs_c
@pytest.mark.parametrize("isa", ["avx512", "avx2", "none"], indirect=True)
@pytest.mark.parametrize("lead", [(2, 37), (53,)])
@pytest.mark.parametrize("nh,hs", [(12, 64), (3, 6), (2, 40), (1, 98)])  # halves of 3, 20, 49: vector tails
@pytest.mark.parametrize("theta", [10_000.0, 160_000.0])  # ModernBERT's local and global bases
def test_bf16_rotation_in_place_is_the_formula_bit_for_bit(lead, nh, hs, theta, threads, isa):
    g = torch.Generator().manual_seed(2)
    qkv = (torch.randn(*lead, 3, nh, hs, generator=g) * 4).to(torch.bfloat16)
    qkv.view(-1)[:: 97] = 1e-39  # a few fp32-denormal inputs: narrowed as torch narrows them, not flushed
    positions = torch.arange(lead[-1], dtype=torch.float32)[:, None]
    angles = positions * theta ** (-torch.arange(0, hs, 2, dtype=torch.float32) / hs)
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
    c, s = cos[:, None, :], sin[:, None, :]
    expected_q, expected_k = formula_bf16(qkv[..., 0, :, :], c, s), formula_bf16(qkv[..., 1, :, :], c, s)
    v = qkv[..., 2, :, :].clone()
    with torch.inference_mode():
        assert rotary.rotate_qk_(qkv, cos, sin)
    assert torch.equal(qkv[..., 0, :, :], expected_q)
    assert torch.equal(qkv[..., 1, :, :], expected_k)
    assert torch.equal(qkv[..., 2, :, :], v)


def test_refused_where_it_must_not_run():
    qkv = torch.randn(2, 8, 3, 2, 16)
    cos, sin = tables(8, 16)
    before = qkv.clone()
    assert not rotary.rotate_qk_(qkv.to(torch.bfloat16), cos, sin)  # bf16 rows take bf16 tables
    assert not rotary.rotate_qk_(qkv.half(), cos.half(), sin.half())  # fp32 and bf16 only
    assert not rotary.rotate_qk_(qkv.transpose(0, 1), cos, sin)  # rows not contiguous
    assert not rotary.rotate_qk_(qkv, *tables(5, 16))  # 16 rows do not take a table of 5
    assert not rotary.rotate_qk_(qkv, cos[:, :8], sin[:, :8])  # a table of another head size
    leaf = qkv.clone().requires_grad_()
    assert not rotary.rotate_qk_(leaf, cos, sin)  # autograd needs the formula
    assert torch.equal(qkv, before)
