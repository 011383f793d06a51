"""Attention over long rows on a CPU: from `long_keys()` keys fp32 runs PyTorch's SDPA instead of the C loops
(`LONG_KEYS`, or the bound its CPU family was measured to want: on AMD Zen 4 the loops at every length), and from
`AMX_SDPA_KEYS` keys an int8 or bf16 model's bf16 attention runs SDPA in bf16 on a CPU with AMX. Each against the
formula in float64, with key padding (a whole padded row too) and keys shared by groups of query rows."""

from __future__ import annotations

import importlib

import pytest
import torch

attention = importlib.import_module("bertlab.nn.attention")

pytestmark = pytest.mark.usefixtures("one_thread")


def reference(q, k, v, mask):
    k, v = attention.expand_shared_rows(k, v, q.size(0))
    q, k, v = (t.double() for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / q.size(-1) ** 0.5 + mask.additive(q.size(-2), k.size(-2), torch.float64, q.device)
    return scores.softmax(-1) @ v


def inputs(T_k: int, shared: bool):
    g = torch.Generator().manual_seed(T_k)
    B, nh, T_q, hs = 4, 2, 96, 64
    q = torch.randn(B, nh, T_q, hs, generator=g)
    k, v = (torch.randn(B // 2 if shared else B, nh, T_k, hs, generator=g) for _ in range(2))
    keep = torch.ones(B // 2 if shared else B, T_k, dtype=torch.bool)
    keep[0, T_k // 3:] = False
    keep[-1, :] = False  # a row of padding only: uniform weights, not NaN
    keep = keep.repeat_interleave(2, 0) if shared else keep
    return q, k, v, attention.AttentionMask("bidirectional", keep)


@pytest.fixture
def cpu_family(monkeypatch):
    """Set the CPU family and dispatch level `long_keys()` reads: `cpu_family(("GenuineIntel", 6), "avx512")`."""
    def use(family, level="avx512"):
        monkeypatch.setattr(attention, "cpu_family", lambda: family)
        monkeypatch.setattr(attention, "cpu_isa", lambda: level)

    return use


def test_long_keys_follow_the_cpu_family_and_level(cpu_family):
    cpu_family(("GenuineIntel", 6))
    assert attention.long_keys() == attention.LONG_KEYS
    cpu_family(None)  # no /proc/cpuinfo
    assert attention.long_keys() == attention.LONG_KEYS
    cpu_family(("AuthenticAMD", 25))  # Zen 4 at avx512: the loops at every length
    assert attention.long_keys() > 1 << 40
    cpu_family(("AuthenticAMD", 25), "avx2")  # Zen 3, or Zen 4 held to AVX2: SDPA from LONG_KEYS
    assert attention.long_keys() == attention.LONG_KEYS


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("family", [("GenuineIntel", 6), ("AuthenticAMD", 25)])
def test_fp32_long_rows_take_the_cpus_kernel_exactly(shared, family, cpu_family, monkeypatch):
    """At LONG_KEYS keys: SDPA where the CPU's bound says so, else the C loops (the matmuls where they are not
    built); either exact."""
    cpu_family(family)
    T_k = attention.LONG_KEYS
    q, k, v, mask = inputs(T_k, shared)
    called = []
    sdpa = attention.F.scaled_dot_product_attention
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", lambda *a, **kw: called.append(1) or sdpa(*a, **kw))
    y, _ = attention.bmm_attention(q, k, v, mask, None, 0.0, None, False)
    assert called == ([] if family == ("AuthenticAMD", 25) else [1])
    expected = reference(q, k, v, mask)
    assert torch.isfinite(y).all()
    assert ((y.double() - expected).norm() / expected.norm()).item() <= 1e-6


@pytest.mark.parametrize("shared", [False, True])
def test_int8_models_long_rows_on_amx(shared):
    if attention.cpu_isa() != "amx":
        pytest.skip("no AMX here: the long bf16 path is not taken")
    q, k, v, mask = inputs(attention.AMX_SDPA_KEYS, shared)
    y, _ = attention.bmm_bf16_attention(q, k, v, mask, None, 0.0, None, False)
    assert y.dtype == torch.float32 and torch.isfinite(y).all()
    expected = reference(q, k, v, mask)
    assert ((y.double() - expected).norm() / expected.norm()).item() <= 1e-2  # bf16 operands


@pytest.mark.parametrize("shared", [False, True])
def test_bf16_models_long_rows_take_sdpa_on_amx(shared, monkeypatch):
    if attention.cpu_isa() != "amx":
        pytest.skip("no AMX here: the long bf16 path is not taken")
    q, k, v, mask = inputs(attention.AMX_SDPA_KEYS, shared)
    q16, k16, v16 = (t.to(torch.bfloat16) for t in (q, k, v))
    called = []
    sdpa = attention.F.scaled_dot_product_attention
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", lambda *a, **kw: called.append(1) or sdpa(*a, **kw))
    y, _ = attention.bmm_attention(q16, k16, v16, mask, None, 0.0, None, False)
    assert called and y.dtype == torch.bfloat16 and torch.isfinite(y).all()
    expected = reference(q16, k16, v16, mask)
    assert ((y.double() - expected).norm() / expected.norm()).item() <= 1e-2  # bf16 operands and result


def test_fp32_long_rows_from_strided_heads_are_sdpas_bit_for_bit(monkeypatch, cpu_family):
    # as `attention()` passes them: each head a strided view of the (B, T, H) projections; the long path copies
    # them contiguous before SDPA (faster there), which must not change a bit of the result
    cpu_family(("GenuineIntel", 6))  # a CPU whose long rows take SDPA
    g = torch.Generator().manual_seed(1)
    B, T, nh, hs = 1, attention.LONG_KEYS, 2, 64
    q, k, v = (torch.randn(B, T, nh * hs, generator=g).view(B, T, nh, hs).transpose(1, 2) for _ in range(3))
    assert not q.is_contiguous()
    sdpa, fed = attention.F.scaled_dot_product_attention, []
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention",
                        lambda *a, **kw: fed.append([t.is_contiguous() for t in a[:3]]) or sdpa(*a, **kw))
    y, _ = attention.bmm_attention(q, k, v, None, None, 0.0, None, False)
    assert fed == [[True, True, True]]
    assert torch.equal(y, sdpa(q, k, v))  # SDPA on the views as they came
    expected = reference(q, k, v, attention.AttentionMask("bidirectional", torch.ones(B, T, dtype=torch.bool)))
    assert ((y.double() - expected).norm() / expected.norm()).item() <= 1e-6
