"""The C loops of CPU inference (nn/csrc/) against their torch formulas (nn/cpu_kernels.py):
quantize and dequantize bit for bit, softmax to rounding, on one thread and split over threads; and the torch
path taken wherever the C one does not apply."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest
import torch

from bertlab.nn import cpu_kernels
from bertlab.nn.cpu_kernels import (
    dequantize_rows,
    dequantize_rows_reference,
    quantize_rows,
    quantize_rows_reference,
    softmax_,
)
from bertlab.nn.elementwise import add_and_norm

needs_c = pytest.mark.skipif(not cpu_kernels.available(), reason="bertlab.nn._cpu_kernels not built")


def _cpu_flag(name: str) -> bool:
    """Whether /proc/cpuinfo lists `name` ("amx_bf16") among the CPU's flags."""
    try:
        with open("/proc/cpuinfo") as f:
            return name in f.read().split()
    except OSError:
        return False


def test_the_extension_is_built_where_a_c_compiler_is():
    """`pip install -e .` builds it (setup.py); built optional, so a failed build would otherwise go unnoticed."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc})")
    code = "from bertlab.nn import cpu_kernels; print(cpu_kernels.available())"
    env = {k: v for k, v in __import__("os").environ.items() if k != "BERTLAB_NO_CPU_KERNELS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == "True", "the C kernels were not built: run `pip install -e .` (or setup.py build_ext)"


def rows_with_outliers(n: int, k: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Hidden-state-like rows: most values small, a few rows and columns far larger, an all-zero row, and
    values on the .5 boundaries that round-half-to-even must settle."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g) * 4
    x[:, 3] *= 50
    if n > 4 and k >= 8:
        x[1] *= 300
        x[2] = 0
        x[4] = x[4].clamp(-1, 1)
        x[4, :8] = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 127.0, -127.0])  # scale 1: ties exact
    return x.to(dtype)


# The row loops are built once per level (csrc/levels_*.c): each level's build is held to the reference
ROW_LEVELS = ["avx512", "avx2", "none"]


@needs_c
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7, 384), (300, 1536), (5, 33), (1, 17)])
@pytest.mark.parametrize("isa", ROW_LEVELS, indirect=True)
def test_quantize_rows_equals_the_torch_formula_bit_for_bit(shape, dtype, threads, isa):
    x = rows_with_outliers(*shape, dtype)
    q, s = quantize_rows(x)
    q_ref, s_ref = quantize_rows_reference(x)
    assert q.dtype == torch.int8 and s.shape == (shape[0], 1) and s.dtype == torch.float32
    assert torch.equal(q, q_ref) and torch.equal(s, s_ref)
    if shape[0] > 4 and shape[1] >= 8:
        assert q[4, :6].tolist() == [0, 2, 2, 0, -2, -2]  # ties to even, as torch.round
    assert q.abs().max() <= 127


@needs_c
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(9, 384, 1536), (260, 1536, 384), (3, 40, 19)])
@pytest.mark.parametrize("isa", ROW_LEVELS, indirect=True)
def test_dequantize_rows_equals_the_torch_formula_bit_for_bit(shape, bias, threads, isa):
    n, k, m = shape
    g = torch.Generator().manual_seed(1)
    xq = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    wq = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
    xs, ws = torch.rand(n, 1, generator=g) / 100, torch.rand(m, generator=g) / 100
    b = torch.randn(m, generator=g) if bias else None
    acc = xq.int() @ wq.int().t()
    want = dequantize_rows_reference(acc.clone(), xs, ws, b)
    got = dequantize_rows(acc.clone(), xs, ws, b)
    assert got.dtype == torch.float32 and got.shape == (n, m)
    assert torch.equal(got, want)


@needs_c
def test_dequantize_rows_writes_over_the_products_in_fp32_and_checks_the_scales():
    acc = torch.arange(12, dtype=torch.int32).view(3, 4)
    out = dequantize_rows(acc, torch.ones(3, 1), torch.full((4,), 0.5), None)
    assert out.data_ptr() == acc.data_ptr() and out.tolist()[1] == [2.0, 2.5, 3.0, 3.5]
    with pytest.raises(ValueError, match="do not fit"):
        dequantize_rows(torch.zeros(3, 4, dtype=torch.int32), torch.ones(2, 1), torch.ones(4), None)


@needs_c
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cols", [1, 7, 16, 72, 513])
@pytest.mark.parametrize("isa", ROW_LEVELS, indirect=True)
def test_softmax_matches_torch_to_rounding(cols, dtype, threads, isa):
    g = torch.Generator().manual_seed(cols)
    x = (torch.randn(6, 12, 5, cols, generator=g) * 4).to(dtype)
    if cols > 2:
        x[..., -2:] = torch.finfo(dtype).min  # masked keys: probability 0
        x[0, 0, 0] = torch.finfo(dtype).min  # a row with every key masked: uniform, not NaN
    x[1, 1, 1, 0] = 80.0  # one dominant score
    want = torch.softmax(x.float(), dim=-1)
    got = softmax_(x.clone())
    assert got.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 4e-3  # bf16: its own rounding of the result
    assert (got.float() - want).abs().max() <= tol
    if cols > 2:
        assert torch.all(got[1:, ..., -2:] == 0)
        assert torch.allclose(got[0, 0, 0].float(), torch.full((cols,), 1.0 / cols), atol=1e-3)
    assert torch.allclose(got.float().sum(-1), torch.ones(()), atol=1e-5 if dtype == torch.float32 else 2e-2)



@needs_c
@pytest.mark.parametrize("isa", ["avx512"], indirect=True)
def test_softmax_on_avx2_gives_the_avx512_bits(isa):
    """AVX2's exp runs in 8-float vectors with its branches as masks (the AVX-512 build's lane-wise loop ran
    scalar there): the same operations per lane, so the same floats -- masked keys, a row of -inf padding
    beyond the last 16-float block, scores just either side of exp's -87 cut and rows of every length mod 16."""
    for cols in (1, 7, 16, 72, 129):
        g = torch.Generator().manual_seed(cols)
        x = torch.randn(3, 12, 9, cols, generator=g) * 30
        x[..., -1] = torch.finfo(torch.float32).min
        x[0, 1] = -100.0  # a row's max 0 and scores around exp's -87 cut beside it
        x[0, 1, :, 0] = 0.0
        x[0, 1, :, 1 % cols] = -87.0 + torch.linspace(-0.01, 0.01, 9) if cols > 1 else 0.0
        x[2, 3, 4] = float("-inf")
        x[2, 3, 4, 0] = 0.0
        wide = softmax_(x.clone())
        cpu_kernels.force_cpu_isa("avx2")
        narrow = softmax_(x.clone())
        cpu_kernels.force_cpu_isa("avx512")
        assert torch.equal(wide, narrow), cols

def test_the_torch_formulas_run_where_the_c_loops_do_not_apply(monkeypatch):
    """Strided or grad-requiring tensors, other dtypes, and `BERTLAB_NO_CPU_KERNELS`: the torch formulas, with
    the same results."""
    x = rows_with_outliers(8, 64, torch.float32)
    strided = x.t().contiguous().t()
    assert not strided.is_contiguous()
    for a, b in zip(quantize_rows(strided), quantize_rows_reference(x)):
        assert torch.equal(a, b)
    fp16 = torch.randn(4, 9).half()
    assert torch.equal(softmax_(fp16.clone()), torch.softmax(fp16, -1))
    leaf = torch.randn(3, 5, requires_grad=True)
    q, _ = quantize_rows(leaf)
    assert torch.equal(q, quantize_rows_reference(leaf.detach())[0])

    monkeypatch.setenv("BERTLAB_NO_CPU_KERNELS", "1")
    cpu_kernels._dispatch.cache_clear()
    try:
        assert not cpu_kernels.available()
        for a, b in zip(quantize_rows(x), quantize_rows_reference(x)):
            assert torch.equal(a, b)
    finally:
        monkeypatch.delenv("BERTLAB_NO_CPU_KERNELS")
        cpu_kernels._dispatch.cache_clear()


@needs_c
@pytest.mark.parametrize("k", [16, 48, 512])
def test_few_rows_fp32_linear_equals_f_linear(k, threads):
    """Every row count the GEMV splits differently (tiles of 4, then 3, 2 or 1 rows), columns in whole blocks of
    16 and a remainder (N = 37, 80, 2064), with and without bias."""
    g = torch.Generator().manual_seed(k)
    for n in (37, 80, 2064):
        w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
        for m in (1, 2, 3, 4, 5, 7):
            x = torch.randn(m, k, generator=g)
            for bias in (b, None):
                got = cpu_kernels.linear_few_rows(x, w, bias)
                want = torch.nn.functional.linear(x.double(), w.double(), None if bias is None else bias.double())
                torch.testing.assert_close(got, want.float(), atol=1e-4, rtol=1e-5)  # sums of k products ~ N(0, k)


@needs_c
def test_few_rows_bf16_linear_is_the_exact_product_rounded_once(threads):
    """bf16 in and out, fp32 sums: the exact result rounded to bf16, give or take one bf16 step where the fp32
    sum (off by ~1e-5 at these sizes) sits next to a rounding boundary."""
    g = torch.Generator().manual_seed(1)
    for k, n in ((48, 37), (512, 2064)):
        w, b = torch.randn(n, k, generator=g).bfloat16(), torch.randn(n, generator=g).bfloat16()
        for m in (1, 2, 3, 4, 5):
            x = torch.randn(m, k, generator=g).bfloat16()
            for bias in (b, None):
                got = cpu_kernels.linear_few_rows(x, w, bias)
                exact = x.double() @ w.double().t() + (0 if bias is None else bias.double())
                assert got.dtype == torch.bfloat16 and got.shape == (m, n)
                step = exact.abs().clamp(min=1e-30).log2().floor().exp2() / 128  # one bf16 step at each value
                assert ((got.double() - exact).abs() <= step + 1e-4).all()
                assert (got == exact.bfloat16()).float().mean() > 0.99


@needs_c
def test_few_rows_linear_declines_what_it_does_not_take():
    w = torch.randn(32, 48)
    assert cpu_kernels.linear_few_rows(torch.randn(2, 40), torch.randn(32, 40), None) is None  # K % 16
    assert cpu_kernels.linear_few_rows(torch.randn(2, 48).bfloat16(), w, None) is None  # mixed dtypes
    assert cpu_kernels.linear_few_rows(torch.randn(2, 48).half(), w.half(), None) is None
    assert cpu_kernels.linear_few_rows(torch.randn(48, 2).t(), w, None) is None  # not contiguous
    assert cpu_kernels.linear_few_rows(torch.randn(2, 48), torch.randn(48, 64).t(), None) is None
    assert cpu_kernels.linear_few_rows(torch.randn(2, 48), w, torch.randn(31)) is None  # bias size
    assert cpu_kernels.linear_few_rows(torch.randn(2, 48, requires_grad=True), w, None) is None


needs_avx512 = pytest.mark.skipif(getattr(cpu_kernels._extension(), "cpu_level", "none") not in ("avx512", "amx"),
                                  reason="no AVX-512 (or no C kernels)")


@pytest.mark.parametrize("isa", ["avx512", "avx2"], indirect=True)
@pytest.mark.parametrize("k", [1, 7, 48, 384])
def test_f32_gemm_equals_the_float64_product(k, threads, isa):
    """Any row count (AVX-512: tiles of 12 rows and each tail of 1-11; AVX2: tiles of 6 and each tail of 1-5;
    chunks of 192 rows and what is left), any column count (whole panels of 32 and a last one of 2, 1 or 4
    columns; AVX2: a half panel of 16 and what is left), any K, with and without bias."""
    assert cpu_kernels.f32_gemm_available()
    g = torch.Generator().manual_seed(k)
    for n in (2, 32, 33, 100):
        w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
        panels = cpu_kernels.pack_f32_panels(w)
        assert panels.shape == (-(-n // 32), k, 32)
        for m in (1, 5, 11, 12, 13, 25, 192, 205, 397):
            x = torch.randn(m, k, generator=g)
            for bias in (b, None):
                got = cpu_kernels.linear_f32(x, panels, bias, n)
                want = torch.nn.functional.linear(x.double(), w.double(), None if bias is None else bias.double())
                assert got.shape == (m, n)
                torch.testing.assert_close(got, want.float(), atol=1e-4, rtol=1e-5)  # sums of k products ~ N(0, k)


@pytest.mark.parametrize("isa", ["avx512"], indirect=True)
def test_f32_gemm_on_avx2_gives_the_avx512_bits(isa):
    """The AVX2 tile runs the AVX-512 tile's FMA chain (from the bias, in k order) on half the columns: the
    same floats, bit for bit."""
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(100, 384, generator=g), torch.randn(100, generator=g)
    panels = cpu_kernels.pack_f32_panels(w)
    x = torch.randn(205, 384, generator=g)
    wide = cpu_kernels.linear_f32(x, panels, b, 100)
    cpu_kernels.force_cpu_isa("avx2")
    narrow = cpu_kernels.linear_f32(x, panels, b, 100)
    assert torch.equal(wide, narrow)


def _exact_gelu(y: torch.Tensor) -> torch.Tensor:
    """x · Φ(x) in float64, of fp32 values"""
    y = y.double()
    return 0.5 * y * (1 + torch.erf(y / 2 ** 0.5))


@pytest.mark.parametrize("isa", ["avx512", "avx2"], indirect=True)
def test_f32_gemm_gelu_epilogue_is_gelu_of_the_product(isa, threads):
    """The GELU epilogue on every tile height, tail panel and row block: the plain GEMM's output (the same bits
    before the epilogue) through the exact GELU, to 1.5e-6 -- as close as torch's own fp32 gelu is."""
    g = torch.Generator().manual_seed(3)
    for n, k in ((33, 48), (100, 384)):
        w, b = torch.randn(n, k, generator=g) / k ** 0.5, torch.randn(n, generator=g)
        panels = cpu_kernels.pack_f32_panels(w)
        for m in (1, 11, 13, 205):
            x = torch.randn(m, k, generator=g) * 3
            for bias in (b, None):
                plain = cpu_kernels.linear_f32(x, panels, bias, n)
                got = cpu_kernels.linear_f32(x, panels, bias, n, "gelu")
                torch.testing.assert_close(got.double(), _exact_gelu(plain), atol=1.5e-6, rtol=1e-6)
                torch.testing.assert_close(got, torch.nn.functional.gelu(plain), atol=2.5e-6, rtol=1e-6)
    assert cpu_kernels.linear_f32(x, panels, b, n, "relu") is None  # no epilogue for it: the caller's own path


@pytest.mark.parametrize("isa", ["avx512", "avx2"], indirect=True)
def test_f32_gemm_gelu_on_edge_values(isa):
    """Through a GEMM that passes x unchanged (K 1, W 1, no bias): GELU on a dense grid over [-12, 12] and at the
    edges -- the clamp of erf's argument at ±4 (x ±5.657), the tails where torch gives -0.0, tiny and huge
    values, infinities and NaN."""
    grid = torch.linspace(-12, 12, 200_001)
    edges = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e-7, -1e-7, 1.0, -1.0, 5.6568542, -5.6568542, 5.66, -5.66,
                          -5.9, -6.0, -9.0, -30.0, 30.0, 3e38, -3e38])
    x = torch.cat([grid, edges])[:, None]
    panels = cpu_kernels.pack_f32_panels(torch.ones(1, 1))
    assert torch.equal(cpu_kernels.linear_f32(x, panels, None, 1), x)  # the GEMM passes x through exactly
    got = cpu_kernels.linear_f32(x, panels, None, 1, "gelu")[:, 0]
    want = _exact_gelu(x[:, 0])
    torch.testing.assert_close(got.double(), want, atol=1.5e-6, rtol=1e-6)
    finite = x[:, 0].abs() < 1e38  # (torch's fp32 gelu overflows to inf at 3e38: x · (1 + erf) before the 0.5)
    torch.testing.assert_close(got[finite], torch.nn.functional.gelu(x[finite, 0]), atol=2.5e-6, rtol=1e-6)
    assert (got[x[:, 0] > 0] > 0).all() and (got[x[:, 0] < 0] <= 0).all()  # the sign of x, never another
    special = torch.tensor([[float("inf")], [float("-inf")], [float("nan")]])
    inf, minus_inf, nan = cpu_kernels.linear_f32(special, panels, None, 1, "gelu")[:, 0].tolist()
    assert inf == float("inf") and minus_inf != minus_inf and nan != nan  # -inf: NaN, as torch's fp32 gelu


@pytest.mark.parametrize("isa", ["avx512"], indirect=True)
def test_f32_gemm_gelu_on_avx2_gives_the_avx512_bits(isa):
    """AVX-512 and AVX2 run the epilogue's same vector code (AVX2 after each half panel): the same bits."""
    g = torch.Generator().manual_seed(2)
    w, b = torch.randn(100, 384, generator=g) / 20, torch.randn(100, generator=g)
    panels, x = cpu_kernels.pack_f32_panels(w), torch.randn(205, 384, generator=g) * 2
    wide = cpu_kernels.linear_f32(x, panels, b, 100, "gelu")
    cpu_kernels.force_cpu_isa("avx2")
    assert torch.equal(wide, cpu_kernels.linear_f32(x, panels, b, 100, "gelu"))


def _tanh_gelu(y: torch.Tensor) -> torch.Tensor:
    y = y.double()
    return 0.5 * y * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (y + 0.044715 * y ** 3)))


@needs_c
@pytest.mark.parametrize("isa", ["avx512", "avx2", "none"], indirect=True)
def test_gelu_tanh_pass_is_the_formula(isa, threads):
    """GELU's tanh form (`gelu_new`) in one C pass: on a dense grid over [-12, 12] and at the edges, within 6e-7
    of the formula in float64 (1e-6 relative for x > -3) -- torch's own fp32 tanh GELU is within 4.3e-7 and
    1.2e-5 -- the sign of x kept, +inf and NaN through (-inf: NaN, as torch's); the same bits from AVX2 up and
    split over threads; and the in-place activation (`elementwise`'s gelu_new) is this pass."""
    from bertlab.nn.elementwise import INPLACE_ACTIVATIONS

    grid = torch.linspace(-12, 12, 200_001)
    edges = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e-7, -1e-7, 1.0, -1.0, -5.9, -9.0, -30.0, 30.0, 3e38, -3e38])
    x = torch.cat([grid, edges])
    got = cpu_kernels.gelu_tanh_(x.clone())
    want = _tanh_gelu(x)
    assert (got.double() - want).abs().max() <= 6e-7
    near = x > -3
    assert ((got.double() - want).abs()[near] / want.abs()[near].clamp(min=1e-30)).max() <= 1e-6
    assert (got[x > 0] > 0).all() and (got[x < 0] <= 0).all()
    inf, minus_inf, nan = cpu_kernels.gelu_tanh_(torch.tensor([float("inf"), float("-inf"), float("nan")])).tolist()
    assert inf == float("inf") and minus_inf != minus_inf and nan != nan  # -inf: NaN, as torch's
    odd = torch.randn(37, 101, generator=torch.Generator().manual_seed(5)) * 4  # tails of 5 floats a row
    assert torch.equal(cpu_kernels.gelu_tanh_(odd.clone()), cpu_kernels.gelu_tanh_(odd.flatten().clone()).view(37, 101))
    with torch.inference_mode():
        assert torch.equal(INPLACE_ACTIVATIONS["gelu_new"](odd.clone()), cpu_kernels.gelu_tanh_(odd.clone()))
    # bf16: each value widened, the same fp32 pass, rounded once -- and so within one rounding of torch's bf16
    x16 = x.bfloat16()
    got16 = cpu_kernels.gelu_tanh_(x16.clone())
    assert got16.dtype == torch.bfloat16
    assert torch.equal(got16, cpu_kernels.gelu_tanh_(x16.float()).bfloat16())
    torch_16 = torch.nn.functional.gelu(x16, approximate="tanh")
    finite = torch_16.isfinite()
    bound = torch_16.float().abs()[finite] * 2 ** -7 + 6e-7  # a bf16 step, or the fp32 pass's absolute bound
    assert ((got16.float() - torch_16.float()).abs()[finite] <= bound).all()
    with torch.inference_mode():
        assert torch.equal(INPLACE_ACTIVATIONS["gelu_new"](odd.bfloat16()), cpu_kernels.gelu_tanh_(odd.bfloat16()))
    if cpu_kernels.cpu_isa() != "avx512":
        return
    wide = cpu_kernels.gelu_tanh_(x.clone())
    cpu_kernels.force_cpu_isa("avx2")  # (the level none has no FMA: other roundings, within the same bounds)
    assert torch.equal(cpu_kernels.gelu_tanh_(x.clone()), wide)
    assert torch.equal(cpu_kernels.gelu_tanh_(x16.clone()), got16)


def test_cpu_isa_refuses_an_unknown_or_unreachable_level():
    before = os.environ.get("BERTLAB_CPU_ISA")
    try:
        with pytest.raises(ValueError, match="expected one of none, avx2"):
            cpu_kernels.force_cpu_isa("sse9")
        if cpu_kernels.force_cpu_isa(None) != "amx":
            with pytest.raises(ValueError, match="at most"):
                cpu_kernels.force_cpu_isa("amx")
        assert cpu_kernels.force_cpu_isa("none") == "none"
        # at "none" every GEMM is oneDNN's: the C entries decline and the layers take torch
        assert not cpu_kernels.f32_gemm_available() and not cpu_kernels.int8_gemm_available()
        assert cpu_kernels.linear_f32(torch.randn(3, 8), cpu_kernels.pack_f32_panels(torch.randn(4, 8)), None, 4) is None
    finally:
        cpu_kernels.force_cpu_isa(before)


@needs_c
@pytest.mark.parametrize("isa", ["amx", "avx512", "avxvnni", "avx2", "none"], indirect=True)
def test_each_level_runs_its_own_table(isa):
    """One table per level says which kernel runs: nothing of bertlab's own for matrix multiplies at "none", the
    AVX2 GEMMs at "avx2" (int8 on AVX-VNNI from "avxvnni" up), the AVX-512 ones from "avx512" (bf16 and VNNI where
    the CPU has them), AMX tiles for int8 at "amx" -- and what Python reports is what the table holds."""
    table = cpu_kernels._dispatch()[2]
    # (a CPU with AVX-512 VNNI but not AVX-VNNI's 256-bit form -- AMD Zen 4 -- held to avxvnni: AVX2's int8 kernel)
    want = {"none": set(), "avx2": {"gemm_f32", "int8_avx2", "beam_topk"},
            "avxvnni": {"gemm_f32", "int8_avxvnni" if _cpu_flag("avx_vnni") else "int8_avx2", "beam_topk"}}
    if isa in want:
        assert table == want[isa]
    else:
        assert {"gemm_f32", "beam_topk"} <= table and ("int8_amx" in table) == (isa == "amx")
        assert ("gemm_bf16" in table) == ("attention_bf16" in table) == cpu_kernels.bf16_dot_available()
        assert ("attention_amx" in table) == (isa == "amx" and "attention_bf16" in table and _cpu_flag("amx_bf16"))
        assert len(table & {"int8_vnni", "int8_avxvnni", "int8_avx2"}) == 1
    assert cpu_kernels.f32_gemm_available() == (isa != "none")
    assert cpu_kernels.int8_kernel() == (None if isa == "none" else "amx" if isa == "amx"
                                         else next(k[5:] for k in table if k.startswith("int8_")))


@needs_c
def test_the_kernels_build_and_run_from_c(tmp_path):
    """The kernels are plain C behind csrc/kernels.h: the benchmark csrc/bench.c, built by the command in its header
    (no Python, no pip), runs every kernel at every level this CPU reaches and finds the bits each level must
    share (the fp32 GEMM, the int8 layer and quantize at every level, softmax from AVX2 up); a timing run prints
    a line per kernel; a level the CPU does not reach is refused in one line."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None or not sys.platform.startswith("linux"):
        pytest.skip(f"no C compiler ({cc}) or not Linux")
    csrc = os.path.join(os.path.dirname(cpu_kernels.__file__), "csrc")
    root = os.path.abspath(os.path.join(csrc, *[os.pardir] * 4))
    header = open(os.path.join(csrc, "bench.c")).read().split("*/")[0]
    lines = [line.strip(" *") for line in header.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("cc "))
    command = lines[start]
    while command.endswith("\\"):
        start += 1
        command = command[:-1] + lines[start]
    exe = tmp_path / "bench_kernels"
    command = command.replace("-o bench_kernels", f"-o {exe}").replace("cc ", f"{cc} ", 1)
    subprocess.run(["bash", "-c", command], cwd=root, check=True, capture_output=True, text=True)
    for rows, threads in ((37, 2), (5, 1)):
        run = subprocess.run([exe, "--check", "--rows", str(rows), "--k", "128", "--n", "80", "--threads",
                              str(threads)], capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr
        assert run.stdout.count("same bits") == 1 + cpu_kernels.ISA_LEVELS.index(cpu_kernels._extension().cpu_level)
    timed = subprocess.run([exe, "--ms", "1", "--rows", "8", "--k", "64", "--n", "32"], capture_output=True,
                           text=True, check=True).stdout
    assert all(name in timed for name in ("linear_f32", "linear_int8", "quantize", "softmax"))
    refused = subprocess.run([exe, "--level", "sse9"], capture_output=True, text=True)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "--level sse9" in refused.stderr


needs_bf16dot = pytest.mark.skipif(not cpu_kernels.bf16_dot_available(), reason="no AVX-512 BF16 (or no C kernels)")


@needs_bf16dot
@pytest.mark.parametrize("k", [2, 48, 384])
def test_bf16_gemm_is_the_exact_product_rounded_once(k, threads):
    """bf16 in and out, fp32 sums from the fp32 bias: the exact result rounded to bf16, give or take one bf16 step
    where the fp32 sum sits next to a rounding boundary; every row tail, a last panel of 2, 1 or 4 columns."""
    g = torch.Generator().manual_seed(k)
    for n in (2, 32, 33, 100):
        w, b = torch.randn(n, k, generator=g).bfloat16(), torch.randn(n, generator=g).bfloat16()
        panels = cpu_kernels.pack_bf16_panels(w)
        assert panels.shape == (-(-n // 32), k // 2, 32, 2)
        for m in (1, 5, 11, 12, 13, 25, 205):
            x = torch.randn(m, k, generator=g).bfloat16()
            for bias in (b, None):
                got = cpu_kernels.linear_bf16(x, panels, None if bias is None else bias.float(), n)
                exact = x.double() @ w.double().t() + (0 if bias is None else bias.double())
                assert got.dtype == torch.bfloat16 and got.shape == (m, n)
                step = exact.abs().clamp(min=1e-30).log2().floor().exp2() / 128  # one bf16 step at each value
                assert ((got.double() - exact).abs() <= step + 1e-4).all()
                assert (got == exact.bfloat16()).float().mean() > 0.98


@needs_bf16dot
def test_bf16_gemm_declines_what_it_does_not_take():
    w, b = torch.randn(40, 48).bfloat16(), torch.randn(40)
    panels = cpu_kernels.pack_bf16_panels(w)
    x = torch.randn(3, 48).bfloat16()
    assert cpu_kernels.linear_bf16(x, panels, b, 40) is not None
    assert cpu_kernels.linear_bf16(x.float(), panels, b, 40) is None  # another dtype
    assert cpu_kernels.linear_bf16(x, panels, b.bfloat16(), 40) is None  # the bias goes in fp32
    assert cpu_kernels.linear_bf16(torch.randn(48, 3).bfloat16().t(), panels, b, 40) is None  # not contiguous
    assert cpu_kernels.linear_bf16(torch.randn(3, 47).bfloat16(), panels, b, 40) is None  # K odd, not the panels'
    assert cpu_kernels.linear_bf16(x, panels, torch.randn(39), 40) is None


@needs_avx512
def test_f32_gemm_declines_what_it_does_not_take():
    w, b = torch.randn(40, 48), torch.randn(40)
    panels = cpu_kernels.pack_f32_panels(w)
    x = torch.randn(3, 48)
    assert cpu_kernels.linear_f32(x, panels, b, 40) is not None
    assert cpu_kernels.linear_f32(x.bfloat16(), panels, b, 40) is None  # another dtype
    assert cpu_kernels.linear_f32(torch.randn(48, 3).t(), panels, b, 40) is None  # not contiguous
    assert cpu_kernels.linear_f32(torch.randn(3, 40), panels, b, 40) is None  # K is not the panels'
    assert cpu_kernels.linear_f32(x, panels, b, 70) is None  # more columns than the panels hold
    assert cpu_kernels.linear_f32(x, panels, torch.randn(39), 40) is None  # bias size
    assert cpu_kernels.linear_f32(x, panels, b.double(), 40) is None
    assert cpu_kernels.linear_f32(torch.randn(3, 48, requires_grad=True), panels, b, 40) is None


@needs_avx512
@pytest.mark.parametrize("B,K,V,keep", [(3, 4, 1000, 8), (2, 1, 37, 2), (1, 5, 16, 10), (4, 2, 7, 14), (2, 3, 33, 1)])
def test_beam_topk_equals_the_sum_and_topk(B, K, V, keep, threads):
    g = torch.Generator().manual_seed(V)
    log_probs = torch.randn(B * K, V, generator=g).log_softmax(-1)
    running = torch.randn(B, K, generator=g)
    if keep <= V:  # the first step: only the first beam counts (beyond V its sums tie at -1e9, in torch's order)
        running[0, 1:] = -1.0e9
    best, index = cpu_kernels.beam_topk(log_probs, running, keep)
    want = (log_probs.view(B, K, V) + running[..., None]).view(B, K * V).topk(keep)
    assert torch.equal(best, want.values) and torch.equal(index, want.indices)


@needs_avx512
@pytest.mark.parametrize("B,K,V,keep", [(3, 4, 1000, 8), (2, 1, 37, 2), (4, 2, 7, 14)])
def test_beam_topk_takes_the_log_softmax_on_the_way(B, K, V, keep, threads):
    """From logits: the same candidates as torch's log_softmax + add + topk, sums to ~1e-6 (another exp)."""
    g = torch.Generator().manual_seed(V)
    logits = torch.randn(B * K, V, generator=g) * 4
    running = torch.randn(B, K, generator=g) * 3
    best, index = cpu_kernels.beam_topk(logits, running, keep, log_softmax=True)
    want = (logits.log_softmax(-1).view(B, K, V) + running[..., None]).view(B, K * V).topk(keep)
    assert torch.equal(index, want.indices)
    torch.testing.assert_close(best, want.values, atol=2e-6, rtol=1e-6)


@pytest.mark.parametrize("isa", ["avx512"], indirect=True)
def test_beam_topk_on_avx2_gives_the_avx512_bits(isa):
    """AVX2's pass (8 scores at a time) and its row statistics (row_logsumexp's exp in 8-float vectors, the 16
    lanes' sums in two halves) give AVX-512's candidates and sums bit for bit: rows of every length mod 16, ties,
    -inf, logits either side of exp's -87 cut."""
    for V in (1, 7, 8, 16, 24, 37, 1000):
        g = torch.Generator().manual_seed(V)
        logits = torch.randn(6, V, generator=g) * 30
        logits[1] = logits[1].round()  # ties
        logits[2, : V // 2] = -float("inf")
        logits[3, 0], logits[3, 1:] = 0.0, -87.0 + torch.linspace(-0.01, 0.01, V - 1)
        running = torch.randn(2, 3, generator=g)
        for log_softmax in (False, True):
            for keep in (1, min(5, 3 * V)):
                cpu_kernels.force_cpu_isa("avx512")
                wide = cpu_kernels.beam_topk(logits, running, keep, log_softmax=log_softmax)
                cpu_kernels.force_cpu_isa("avx2")
                narrow = cpu_kernels.beam_topk(logits, running, keep, log_softmax=log_softmax)
                assert wide is not None and narrow is not None
                assert torch.equal(wide[0], narrow[0]) and torch.equal(wide[1], narrow[1]), (V, log_softmax, keep)


@needs_avx512
def test_beam_topk_breaks_ties_to_the_lower_index_and_keeps_minus_infinity():
    log_probs = torch.tensor([[0.0, -1.0, 0.0, -float("inf")], [-1.0, 0.0, -float("inf"), -float("inf")]])
    best, index = cpu_kernels.beam_topk(log_probs, torch.zeros(1, 2), 8)
    assert best.tolist() == [[0.0, 0.0, 0.0, -1.0, -1.0, -float("inf"), -float("inf"), -float("inf")]]
    assert index.tolist() == [[0, 2, 5, 1, 4, 3, 6, 7]]
    assert cpu_kernels.beam_topk(log_probs.bfloat16(), torch.zeros(1, 2), 2) is None
    assert cpu_kernels.beam_topk(log_probs, torch.zeros(1, 2), 9) is None  # more than K·V


@needs_avx512
def test_argmax_rows_equals_torch_first_of_ties_and_declines_nan():
    x = torch.randn(5, 1003, generator=torch.Generator().manual_seed(0))
    assert torch.equal(cpu_kernels.argmax_rows(x), x.argmax(-1))
    ties = torch.zeros(2, 40)
    ties[0, 7] = ties[0, 9] = 1.0
    assert cpu_kernels.argmax_rows(ties).tolist() == [7, 0] == ties.argmax(-1).tolist()
    x16 = x.bfloat16()  # a bf16 model's logits: many equal values, the first of them
    assert torch.equal(cpu_kernels.argmax_rows(x16), x16.argmax(-1))
    assert torch.equal(cpu_kernels.argmax_rows(ties.bfloat16()), ties.argmax(-1))
    x[3, 5] = float("nan")
    assert cpu_kernels.argmax_rows(x) is None  # torch's argmax picks the NaN: the caller takes it
    assert cpu_kernels.beam_topk(torch.tensor([[0.0, float("nan")]]), torch.zeros(1, 1), 1) is None


# AMX tiles from 16 rows (VNNI below); AVX-512 VNNI; AVX2 with AVX-VNNI's dot products; AVX2 alone
INT8_LEVELS = ["amx", "avx512", "avxvnni", "avx2"]


@pytest.mark.parametrize("isa", INT8_LEVELS, indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(384, 384), (512, 2064), (2048, 48), (64, 80)])
def test_int8_linear_equals_quantize_int_mm_dequantize_bit_for_bit(shape, dtype, threads, isa):
    """Every row count its tiles split differently (AVX-512: 8, 4, 2, 1 rows; 8, 4, 2, 1 column blocks; from 16
    rows panels of two blocks by 12 rows and each tail, 192 rows at a time, an odd block left over; AVX-VNNI: one
    row x 4 blocks, 3 x 2 and each tail, 6 x 1 and each tail; AVX2 alone: 1 x 4, 2 x 2, 4 x 1 and each tail; AMX: tiles of 16 rows and a last of 1-15, pairs of
    blocks and an odd one alone), with and without bias. On AVX2 alone the
    products go through VPMADDUBSW's int16 pairs: x and w of ±127 at once (the outlier rows) must not saturate."""
    assert cpu_kernels.int8_gemm_available()
    k, n = shape
    g = torch.Generator().manual_seed(k + n)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    packed = cpu_kernels.pack_int8_weight(w)
    ws, b = torch.rand(n, generator=g) / 50, torch.randn(n, generator=g)
    for m in (1, 2, 3, 5, 8, 13, 16, 23, 64, 205):
        x = rows_with_outliers(m, k, dtype, seed=m)
        xq, xs = quantize_rows_reference(x)
        for bias in (b, None):
            want = dequantize_rows_reference(torch._int_mm(xq, w.t()), xs, ws, bias)
            got = cpu_kernels.int8_linear(x, packed, ws, bias)
            assert torch.equal(got, want), (m, bias is None)


@pytest.mark.parametrize("isa", ["avxvnni", "avx2"], indirect=True)
def test_int8_linear_on_avx2_is_exact_where_every_pair_is_at_the_int16_edge(isa):
    """VPMADDUBSW (AVX2 without VNNI) sums two u8 x s8 products into int16 with saturation; bertlab feeds it |x|
    and w · sign(x), so a pair is at most 2 · 127² = 32,258 < 2^15 and never saturates. Here every product is
    ±127² with both of a pair the same sign (the largest pairs, positive and negative), and runs of same-sign
    pairs long enough that any int16 accumulation would wrap; AVX-VNNI's unsigned x + 128 is held to the
    same sums."""
    k, n, m = 256, 48, 7
    g = torch.Generator().manual_seed(5)
    w = torch.where(torch.rand(n, k, generator=g) < 0.5, -127, 127).to(torch.int8)
    w[0] = 127
    w[1] = -127
    w[2, 0::2] = -127  # pairs (k, k + 1) of opposite signs cancel: 0, alternating with the edge
    x = torch.where(torch.rand(m, k, generator=g) < 0.5, -1.0, 1.0)  # |x| equal: every x quantizes to ±127
    x[0] = 1.0
    x[1] = -1.0
    x[2, ::4] = 2.0  # 127 where 2.0, 64 (63.5 rounded to even) elsewhere
    xq, xs = quantize_rows_reference(x)
    assert xq[:2].abs().min() == 127 and torch.equal(xq[0], -xq[1])
    packed = cpu_kernels.pack_int8_weight(w)
    ws = torch.full((n,), 0.01)
    # (AVX2's kernel at avxvnni on a CPU without AVX-VNNI's 256-bit form: AMD Zen 4)
    assert cpu_kernels.int8_kernel() == (isa if isa == "avx2" or _cpu_flag("avx_vnni") else "avx2")
    acc = xq.double() @ w.double().t()  # exact: |sums| < 2^53
    assert acc[0, 0] == acc[1, 1] == 127 * 127 * k and acc[0, 1] == acc[1, 0] == -127 * 127 * k
    want = dequantize_rows_reference(acc.to(torch.int32), xs, ws, None)
    assert torch.equal(cpu_kernels.int8_linear(x, packed, ws, None), want)


def test_pack_int8_weight_layout_and_shapes_it_refuses():
    w = torch.arange(32 * 8, dtype=torch.int32).remainder(251).sub(125).to(torch.int8).view(32, 8)
    packed, comp, narrow = cpu_kernels.pack_int8_weight(w)
    assert packed.shape == (2, 2, 16, 4)
    assert torch.equal(packed[1, 1, 3], w[16 + 3, 4:8])  # block 1, k-quad 1: column 19's k = 4..7
    assert torch.equal(comp, w.int().sum(1) * 128)
    assert not narrow
    assert cpu_kernels.pack_int8_weight(w[:20]) is None and cpu_kernels.pack_int8_weight(w[:, :6]) is None
    # narrow: every weight within ±64 -- and -128 (whose int8 abs is -128 again) is not
    edge = torch.full((16, 4), 64, dtype=torch.int8)
    edge[0, 0] = -64
    assert cpu_kernels.pack_int8_weight(edge)[2]
    for wide in (65, -65, -128):
        edge[3, 1] = wide
        assert not cpu_kernels.pack_int8_weight(edge)[2], wide


@pytest.mark.parametrize("isa", ["avx2", "avxvnni", "avx512"], indirect=True)
@pytest.mark.parametrize("shape", [(384, 384), (512, 2064), (64, 80)])
def test_int8_linear_on_narrow_weights_equals_quantize_int_mm_dequantize(shape, threads, isa):
    """Weights within ±64 (what Int8Linear quantizes to where the kernel is AVX2's without VNNI): AVX2 alone takes
    its narrow kernel (unsigned x + 128 straight into VPMADDUBSW; tiles 5 x 1, 2 x 2, 1 x 4 and each tail), the
    other levels their own; bit for bit the torch formulas either way."""
    k, n = shape
    g = torch.Generator().manual_seed(k + n + 1)
    w = torch.randint(-64, 65, (n, k), dtype=torch.int8, generator=g)
    packed = cpu_kernels.pack_int8_weight(w)
    assert packed[2]
    ws, b = torch.rand(n, generator=g) / 50, torch.randn(n, generator=g)
    for m in (1, 2, 3, 4, 5, 7, 11, 16, 64, 205):
        x = rows_with_outliers(m, k, torch.float32, seed=m)
        xq, xs = quantize_rows_reference(x)
        for bias in (b, None):
            want = dequantize_rows_reference(torch._int_mm(xq, w.t()), xs, ws, bias)
            assert torch.equal(cpu_kernels.int8_linear(x, packed, ws, bias), want), (m, bias is None)


@pytest.mark.parametrize("isa", ["avx2"], indirect=True)
def test_int8_linear_on_avx2_narrow_weights_is_exact_at_the_int16_edge(isa):
    """AVX2's narrow kernel sums two products of the unsigned x + 128 and w into int16 with saturation: at
    x = 127 (255) and w = ±64 a pair is ±2 · 255 · 64 = ±32,640, the edge of int16. Every pair here is at it,
    both signs, in runs long enough that any int16 accumulation would wrap; x = -127 (1) beside it."""
    k, n, m = 256, 48, 6
    g = torch.Generator().manual_seed(6)
    w = torch.where(torch.rand(n, k, generator=g) < 0.5, -64, 64).to(torch.int8)
    w[:, 1::2] = w[:, 0::2]  # both of each pair the same sign
    w[0] = 64
    w[1] = -64
    x = torch.where(torch.rand(m, k, generator=g) < 0.5, -1.0, 1.0)
    x[0] = 1.0  # every x quantizes to 127: x + 128 = 255
    x[1] = -1.0
    xq, xs = quantize_rows_reference(x)
    packed = cpu_kernels.pack_int8_weight(w)
    assert packed[2] and cpu_kernels.int8_kernel() == "avx2"
    acc = xq.double() @ w.double().t()  # exact
    assert acc[0, 0] == 127 * 64 * k and acc[0, 1] == -127 * 64 * k and acc[1, 0] == -127 * 64 * k
    ws = torch.full((n,), 0.01)
    want = dequantize_rows_reference(acc.to(torch.int32), xs, ws, None)
    for rows in (1, 2, 5, 6):  # the 1 x 4, 2 x 2 and 5 x 1 tiles and a tail
        assert torch.equal(cpu_kernels.int8_linear(x[:rows], packed, ws, None), want[:rows]), rows


@needs_c
@pytest.mark.parametrize("hs", [64, 32, 24])
@pytest.mark.parametrize("keys", [1, 15, 16, 37])
def test_attention_one_query_matches_the_formula_on_cache_views(keys, hs, threads):
    """One query per row against a K/V cache's views (rows T_max apart), with a padding mask (per row) plus a
    transposed position bias (per head), with either alone, and with neither."""
    from bertlab.nn.attention import AttentionMask

    B, nh, T_max = 3, 4, 40
    g = torch.Generator().manual_seed(keys * hs)
    q = torch.randn(B, 1, nh * hs, generator=g).view(B, 1, nh, hs).transpose(1, 2)
    cache_k, cache_v = (torch.randn(B, T_max, nh * hs, generator=g) for _ in range(2))
    k, v = (c[:, :keys].view(B, keys, nh, hs).transpose(1, 2) for c in (cache_k, cache_v))
    keep = torch.ones(B, keys, dtype=torch.long)
    keep[1, : keys // 2] = 0
    mask = AttentionMask.padding(keep).additive(1, keys, torch.float32, q.device)  # (B, 1, 1, keys) or None
    bias = torch.randn(keys, nh, generator=g).t()[None, :, None, :]  # (1, nh, 1, keys), last stride nh
    for add in (None, bias, mask, None if mask is None else mask + bias):
        scores = q @ k.transpose(-1, -2) * 0.5 + (0 if add is None else add)
        want = torch.softmax(scores, dim=-1) @ v
        got = cpu_kernels.attention_one_query(q, k, v, add, 0.5)
        assert got.shape == (B, nh, 1, hs)
        assert (got - want).abs().max() < 2e-5


@needs_c
@pytest.mark.parametrize("isa", ["avx512"], indirect=True)
def test_attention_one_query_on_avx2_gives_the_avx512_bits(isa):
    """AVX2 takes each key's 16 lane sums as two 8-float halves folded in fold16's order, 4 keys at a time, and the
    outputs 16 or 32 at a time: the same floats as AVX-512 -- 1 to 40 keys, every head size, with and without a
    mask, beams sharing their input's keys and values, and heads of 8 (the dot products' scalar loop)."""
    g = torch.Generator().manual_seed(0)
    for keys in (1, 5, 16, 17, 40):
        for hs in (8, 16, 32, 48, 64):
            q = torch.randn(6, 4, 1, hs, generator=g)
            k, v = torch.randn(3, 4, keys, hs, generator=g), torch.randn(3, 4, keys, hs, generator=g)
            add = torch.zeros(6, 1, 1, keys)
            add[1, ..., : keys // 2] = torch.finfo(torch.float32).min
            for a in (None, add):
                cpu_kernels.force_cpu_isa("avx512")
                wide = cpu_kernels.attention_one_query(q, k, v, a, 0.3)
                cpu_kernels.force_cpu_isa("avx2")
                narrow = cpu_kernels.attention_one_query(q, k, v, a, 0.3)
                assert narrow is not None and torch.equal(wide, narrow), (keys, hs)


def test_attention_one_query_declines_what_it_does_not_take():
    q, k = torch.randn(2, 3, 1, 16), torch.randn(2, 3, 5, 16)
    assert cpu_kernels.attention_one_query(q.repeat(1, 1, 2, 1), k, k, None, 1.0) is None  # two queries
    assert cpu_kernels.attention_one_query(q.bfloat16(), k.bfloat16(), k.bfloat16(), None, 1.0) is None
    assert cpu_kernels.attention_one_query(q, k, k, torch.zeros(2, 3, 2, 5), 1.0) is None


def attention_case(T_q: int, T_k: int, hs: int, dtype: torch.dtype = torch.float32):
    """q (4, 3, T_q, hs) and k, v shared by groups of 2 rows, all strided as attention() passes them; k and v
    repeated per row (for the reference); and the additive parts to try: none, a padding mask per row, a causal
    mask per query, and a bias per head as a transposed view (last stride T_q·nh) plus padding."""
    B, nh, G = 4, 3, 2
    g = torch.Generator().manual_seed(T_q * T_k + hs)
    q = torch.randn(B, T_q, nh, hs, generator=g).transpose(1, 2).to(dtype)
    k, v = (torch.randn(B // G, T_k, nh, hs, generator=g).transpose(1, 2).to(dtype) for _ in range(2))
    padding = torch.zeros(B, 1, 1, T_k)
    padding[1, ..., T_k // 2:] = torch.finfo(torch.float32).min
    causal = torch.full((T_q, T_k), torch.finfo(torch.float32).min).triu(T_k - T_q + 1)[None, None]
    bias = torch.randn(T_k, T_q, nh, generator=g).permute(2, 1, 0)[None]  # (1, nh, T_q, T_k)
    adds = [None] + [a.to(dtype) for a in (padding, causal, bias + padding)]
    return q, k, v, k.repeat_interleave(G, 0), v.repeat_interleave(G, 0), adds


@needs_c
@pytest.mark.parametrize("hs", [16, 32, 48, 64])
@pytest.mark.parametrize("T_q,T_k", [(1, 7), (5, 5), (13, 70), (40, 40), (130, 300)])
def test_attention_short_matches_the_formula(T_q, T_k, hs, threads):
    """Query tiles of 8 (heads up to 32) or 4 with a partial last one, key blocks of 16-64 with a partial last
    one; masks per row, a causal mask per query, a bias per head as a transposed view; keys and values shared by
    groups of rows."""
    B, nh = 4, 3
    q, k, v, kk, vv, adds = attention_case(T_q, T_k, hs)
    for add in adds:
        want = torch.softmax(q @ kk.transpose(-1, -2) * 0.25 + (0 if add is None else add), dim=-1) @ vv
        got = cpu_kernels.attention_short(q, k, v, add, 0.25)
        assert got.shape == (B, nh, T_q, hs)
        assert (got - want).abs().max() < 2e-5


@needs_c
@pytest.mark.parametrize("isa", ["avx512"], indirect=True)
def test_attention_short_on_avx2_gives_the_avx512_bits(isa):
    """AVX2's tiles (6 queries x 16 keys or values, 8-float vectors, K transposed in 8 x 8 blocks) run each score's
    FMA chain over hs and each output's over the keys in the AVX-512 tiles' order: the same floats, bit for bit --
    partial query tiles and key blocks, every head size, every kind of mask, keys shared by groups of rows."""
    for T_q, T_k in ((1, 7), (5, 5), (13, 70), (40, 40)):
        for hs in (16, 32, 48, 64):
            q, k, v, _, _, adds = attention_case(T_q, T_k, hs)
            for add in adds:
                cpu_kernels.force_cpu_isa("avx512")
                wide = cpu_kernels.attention_short(q, k, v, add, 0.25)
                cpu_kernels.force_cpu_isa("avx2")
                narrow = cpu_kernels.attention_short(q, k, v, add, 0.25)
                assert narrow is not None and torch.equal(wide, narrow), (T_q, T_k, hs)


def band_mask(T: int, window: int) -> torch.Tensor:
    """(1, 1, T, T): 0 where |i - j| <= window, -inf elsewhere (a local window's keys)"""
    i = torch.arange(T)
    return torch.zeros(T, T).masked_fill((i[:, None] - i[None, :]).abs() > window, float("-inf"))[None, None]


@needs_c
@pytest.mark.parametrize("isa", ["avx2", "avx512"], indirect=True)
@pytest.mark.parametrize("hs", [16, 32, 64])
@pytest.mark.parametrize("T,window", [(5, 1), (40, 3), (70, 8), (130, 64), (300, 64), (300, 7)])
def test_attention_short_with_a_window_is_the_banded_formula(isa, T, window, hs, threads):
    """A local window: query i sees the keys |i - j| <= window and each tile of queries computes only the key
    blocks its window reaches -- the formula with -inf outside the band to 2e-5 in float64, with every mask
    (padding rows, a per-head bias), windows narrower and wider than a key block and than the row, at both
    levels; and bit for bit the kernel's own result with no window and the band as its mask."""
    B, nh = 4, 3
    q, k, v, kk, vv, adds = attention_case(T, T, hs)
    band = band_mask(T, window)
    for add in adds:
        full = band if add is None else add + band
        want = torch.softmax((q.double() @ kk.double().transpose(-1, -2)) * 0.25 + full.double(), dim=-1) @ vv.double()
        got = cpu_kernels.attention_short(q, k, v, add, 0.25, window=window)
        assert got is not None and got.shape == (B, nh, T, hs)
        assert (got.double() - want).abs().max() < 2e-5, (T, window, hs)
        assert torch.equal(got, cpu_kernels.attention_short(q, k, v, full.expand(-1, -1, T, T), 0.25))


@needs_c
def test_attention_short_with_a_window_declines_cross_attention():
    q, k = torch.randn(2, 3, 4, 16), torch.randn(2, 3, 6, 16)
    assert cpu_kernels.attention_short(q, k, k, None, 1.0, window=2) is None
    assert cpu_kernels.attention_short(q, q, q, None, 1.0, window=-1) is None


def test_attention_short_declines_what_it_does_not_take():
    q = torch.randn(2, 3, 4, 16)
    assert cpu_kernels.attention_short(q[..., :8], q[..., :8], q[..., :8], None, 1.0) is None  # hs 8
    wide = torch.randn(2, 3, 4, 80)
    assert cpu_kernels.attention_short(wide, wide, wide, None, 1.0) is None  # hs over 64
    assert cpu_kernels.attention_short(q.bfloat16(), q.bfloat16(), q.bfloat16(), None, 1.0) is None
    assert cpu_kernels.attention_short(q, q, q, torch.zeros(2, 3, 3, 4), 1.0) is None  # add for 3 queries


needs_bf16_dot = pytest.mark.skipif(not cpu_kernels.bf16_dot_available(), reason="no AVX-512 BF16 (or no C kernels)")


def _bf16_attention_reference(q, k, v, add, scale):
    """What attention_bf16 computes: products of bf16-rounded q, k, v and probabilities, sums and softmax in fp32."""
    bq, bk, bv = (t.to(torch.bfloat16).float() for t in (q, k, v))
    scores = scale * bq @ bk.transpose(-1, -2) + (0 if add is None else add.float())
    return torch.softmax(scores, dim=-1).to(torch.bfloat16).float() @ bv


@needs_bf16_dot
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T_q,T_k,hs", [(1, 7, 32), (5, 33, 16), (13, 64, 48), (40, 97, 64), (130, 300, 32),
                                        (16, 16, 64), (17, 130, 16), (3, 700, 48), (700, 700, 64)])
@pytest.mark.parametrize("isa", ["amx", "avx512"], indirect=True)
def test_attention_bf16_matches_the_formula_on_bf16_operands(dtype, T_q, T_k, hs, threads, isa):
    """Query tiles of 4 (AVX-512 BF16) or 16 (AMX) with a partial last one; keys padded to 32 with partial
    blocks; heads of 16-64 (AMX: padded to 32 or 64 dimensions); masks per row, causal per query, a bias per
    head as a transposed view; keys and values shared by groups of rows; fp32 and bf16 in and out; 1 to 700
    tokens. The bound is the rounding of probabilities to bf16 (its exp differs from torch's by < 6e-5
    relative, which can move a probability across a bf16 rounding boundary: up to 2^-8 of it, times |v|) plus,
    for bf16 out, the output's own rounding; on average far less. The level amx runs the AMX kernel wherever
    the CPU has AMX-BF16 (the level is skipped where the CPU has no AMX)."""
    amx = isa == "amx" and _cpu_flag("amx_bf16")
    assert cpu_kernels.attention_bf16_kernel() == ("amx" if amx else "avx512bf16")
    B, nh = 4, 3
    q, k, v, kk, vv, adds = attention_case(T_q, T_k, hs, dtype)
    for add in adds:
        want = _bf16_attention_reference(q, kk, vv, add, 0.25)
        got = cpu_kernels.attention_bf16(q, k, v, add, 0.25)
        assert got.shape == (B, nh, T_q, hs) and got.dtype == dtype
        assert (got.float() - want).abs().max() < 2e-2
        assert (got.float() - want).abs().mean() < (1e-4 if dtype == torch.float32 else 2e-3)


@needs_bf16_dot
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hs", [16, 48, 64])
@pytest.mark.parametrize("isa", ["amx", "avx512"], indirect=True)
def test_attention_bf16_with_a_window_is_the_banded_formula(dtype, hs, threads, isa):
    """A local window on the AVX-512 BF16 loops (at the level amx too: the tiles take no window): each tile of 4
    queries computes only the 32-key chunks its window reaches -- within attention_bf16's bound of the formula
    on bf16 operands with -inf outside the band, with every mask (padding rows at the dtype's lowest finite
    value, as a model's mask holds it; a causal one; a per-head bias), windows narrower and wider than a chunk
    and than the row; and bit for bit the kernel's own result with no window and the band as its mask (the
    keys outside a window add exact zeros there)."""
    B, nh = 4, 3
    for T, window in ((5, 1), (40, 3), (70, 8), (130, 64), (300, 64), (300, 7), (33, 40)):
        q, k, v, kk, vv, adds = attention_case(T, T, hs, dtype)
        band = band_mask(T, window)
        for add in adds:
            add = None if add is None else add.clamp(min=torch.finfo(dtype).min)
            full = band if add is None else add.float() + band
            want = _bf16_attention_reference(q, kk, vv, full, 0.25)
            got = cpu_kernels.attention_bf16(q, k, v, add, 0.25, window=window)
            assert got is not None and got.shape == (B, nh, T, hs) and got.dtype == dtype
            assert (got.float() - want).abs().max() < 2e-2, (T, window, hs)
            assert (got.float() - want).abs().mean() < (1e-4 if dtype == torch.float32 else 2e-3)
            masked = full.to(dtype).expand(B, -1, T, T).contiguous()
            cpu_kernels.force_cpu_isa("avx512")  # the loops without a window, not the AMX tiles
            try:
                assert torch.equal(got, cpu_kernels.attention_bf16(q, k, v, masked, 0.25)), (T, window, hs)
            finally:
                cpu_kernels.force_cpu_isa(isa)


@needs_bf16_dot
def test_attention_bf16_with_a_window_declines_cross_attention():
    q, k = torch.randn(2, 3, 4, 16), torch.randn(2, 3, 6, 16)
    assert cpu_kernels.attention_bf16(q, k, k, None, 1.0, window=2) is None
    assert cpu_kernels.attention_bf16(q, q, q, None, 1.0, window=-1) is None


def test_attention_bf16_declines_what_it_does_not_take():
    q = torch.randn(2, 3, 4, 16)
    assert cpu_kernels.attention_bf16(q[..., :8], q[..., :8], q[..., :8], None, 1.0) is None  # hs 8
    wide = torch.randn(2, 3, 4, 80)
    assert cpu_kernels.attention_bf16(wide, wide, wide, None, 1.0) is None  # hs over 64
    assert cpu_kernels.attention_bf16(q.half(), q.half(), q.half(), None, 1.0) is None  # fp16
    assert cpu_kernels.attention_bf16(q, q.bfloat16(), q, None, 1.0) is None  # mixed dtypes
    assert cpu_kernels.attention_bf16(q, q, q, torch.zeros(2, 3, 3, 4), 1.0) is None  # add for 3 queries


@needs_bf16_dot
def test_bf16_and_int8_attention_take_the_bf16_dot_kernel(monkeypatch):
    """bmm_attention on bf16 and bmm_bf16_attention on fp32 (an int8 model's) both end in attention_bf16."""
    import importlib

    attention_module = importlib.import_module("bertlab.nn.attention")  # the package exports a function of that name
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 12, 40, 32, generator=g) for _ in range(3))
    mask = attention_module.AttentionMask.padding(torch.tensor([[1] * 40, [1] * 25 + [0] * 15]))
    want = _bf16_attention_reference(q, k, v, mask.additive(40, 40, torch.float32, q.device), 32 ** -0.5)
    calls = []
    monkeypatch.setattr(attention_module, "attention_bf16",
                        lambda *args: calls.append(args[0].dtype) or cpu_kernels.attention_bf16(*args))
    monkeypatch.setattr(attention_module, "cpu_isa", lambda: "avx512")  # (with AMX short rows stay fp32: below)
    for fn, dtype in ((attention_module.bmm_attention, torch.bfloat16),
                      (attention_module.bmm_bf16_attention, torch.float32)):
        calls.clear()
        got, _ = fn(q.to(dtype), k.to(dtype), v.to(dtype), mask, None, 0.0, None, False)
        assert calls == [dtype] and got.dtype == dtype
        assert (got.float() - want).abs().max() < 2e-2


@needs_bf16_dot
def test_int8_attention_with_amx_keeps_short_rows_in_fp32(monkeypatch):
    """On a CPU with AMX an int8 model's attention over up to AMX_SHORT_KEYS keys runs the fp32 C loops, bit for
    bit bmm_attention's; longer rows take the bf16 kernel."""
    import importlib

    attention_module = importlib.import_module("bertlab.nn.attention")
    g = torch.Generator().manual_seed(0)
    calls = []
    monkeypatch.setattr(attention_module, "attention_bf16",
                        lambda *args: calls.append(args[2].size(-2)) or cpu_kernels.attention_bf16(*args))
    monkeypatch.setattr(attention_module, "cpu_isa", lambda: "amx")
    short = attention_module.AMX_SHORT_KEYS
    for keys, bf16_taken in ((40, False), (short, False), (short + 16, True), (256, True)):
        q, k, v = (torch.randn(2, 12, keys, 32, generator=g) for _ in range(3))
        mask = attention_module.AttentionMask.padding(torch.tensor([[1] * keys, [1] * 25 + [0] * (keys - 25)]))
        calls.clear()
        got, _ = attention_module.bmm_bf16_attention(q, k, v, mask, None, 0.0, None, False)
        assert calls == ([keys] if bf16_taken else [])
        if not bf16_taken:
            assert torch.equal(got, attention_module.bmm_attention(q, k, v, mask, None, 0.0, None, False)[0])


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::torch.jit.TracerWarning")
def test_traced_graphs_get_the_torch_formulas():
    """Under a trace (what an ONNX export runs) the C calls would vanish from the graph: the torch formulas run."""
    x = torch.randn(3, 40)
    traced = torch.jit.trace(lambda t: softmax_(t.clone()), (x,))
    assert "softmax" in str(traced.graph)
    torch.testing.assert_close(traced(x * 2), torch.softmax(x * 2, -1))
    seen = []
    torch.jit.trace(lambda t: seen.append(cpu_kernels.tracing()) or t * 1, (x,), check_trace=False)
    assert seen == [True] and not cpu_kernels.tracing()


def test_an_onnx_export_in_progress_counts_as_tracing(monkeypatch):
    """The flags torch.onnx.is_in_onnx_export reads, read directly: both exporters' flags are seen."""
    assert not cpu_kernels.tracing()
    try:
        from torch.onnx._internal.exporter import _flags
        from torch.onnx._internal.torchscript_exporter._globals import GLOBALS
    except ImportError:
        pytest.skip("this torch keeps its ONNX export flags elsewhere (the public function is used)")
    monkeypatch.setattr(_flags, "_is_onnx_exporting", True)
    assert cpu_kernels.tracing() and torch.onnx.is_in_onnx_export()
    monkeypatch.setattr(_flags, "_is_onnx_exporting", False)
    monkeypatch.setattr(GLOBALS, "in_onnx_export", True)
    assert cpu_kernels.tracing() and torch.onnx.is_in_onnx_export()


@needs_c
@pytest.mark.parametrize("shape", [(1, 512), (3, 7, 48), (1000, 40)])
@pytest.mark.parametrize("isa", ROW_LEVELS, indirect=True)
def test_rms_norm_equals_the_formula(shape, threads, isa):
    g = torch.Generator().manual_seed(shape[-1])
    x, w = torch.randn(shape, generator=g) * 3, torch.randn(shape[-1], generator=g)
    want = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(cpu_kernels.rms_norm(x, w, 1e-6), want, atol=1e-5, rtol=1e-6)
    # bf16, as transformers' T5LayerNorm computes a bf16 model's: x · 1/sqrt(mean(x²) + eps) in fp32, rounded to
    # bf16, times the bf16 weight (rounded again). The fp32 factor is the kernel's to ~1e-7, so a product can land
    # on the other side of a bf16 rounding boundary: one bf16 step at most, and rarely
    x16, w16 = x.bfloat16(), w.bfloat16()
    xf = x16.float()
    want16 = w16 * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16()
    got16 = cpu_kernels.rms_norm(x16, w16, 1e-6)
    assert got16.dtype == torch.bfloat16 and got16.shape == x16.shape
    step = want16.float().abs() * 2 ** -7 + 1e-30  # one bf16 step (8 bits of mantissa) at each value's size
    assert ((got16.float() - want16.float()).abs() <= step).all()
    assert (got16 == want16).float().mean() >= 0.99
    assert cpu_kernels.rms_norm(x16, w, 1e-6) is None  # mixed dtypes: the torch formula
    assert cpu_kernels.rms_norm(x.requires_grad_(), w, 1e-6) is None  # autograd: the torch formula
    assert cpu_kernels.rms_norm(torch.randn(4, 64)[:, ::2], torch.randn(32), 1e-6) is None  # not contiguous


@needs_c
@pytest.mark.parametrize("shape", [(1, 384), (37, 384), (5, 3, 768), (9, 20), (3, 7)])
@pytest.mark.parametrize("isa", ROW_LEVELS, indirect=True)
def test_add_and_norm_equals_layer_norm_of_the_sum(shape, threads, isa):
    g = torch.Generator().manual_seed(shape[-1])
    y, res = torch.randn(shape, generator=g) * 3 + 1, torch.randn(shape, generator=g)
    norm = torch.nn.LayerNorm(shape[-1], eps=1e-12)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(shape[-1], generator=g))
        norm.bias.copy_(torch.randn(shape[-1], generator=g))
        want = torch.nn.functional.layer_norm((y + res).double(), shape[-1:], norm.weight.double(),
                                              norm.bias.double(), 1e-12).float()
        got = cpu_kernels.add_layer_norm_(y.clone(), res, norm.weight, norm.bias, 1e-12)
        torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-6)
        torch.testing.assert_close(add_and_norm(y.clone(), res, norm), want, atol=2e-6, rtol=1e-6)
        # a large mean: the variance is taken about the mean, not as E[s²] - mean² (which cancels)
        torch.testing.assert_close(cpu_kernels.add_layer_norm_(y + 1000, res, norm.weight, norm.bias, 1e-12),
                                   want, atol=1e-3, rtol=1e-4)
        # bf16, as a bf16 model's modules compute it with torch: the sum rounded to bf16, then the fp32 pass over
        # it (the same statistics, bit for bit), rounded once; within one bf16 step of torch's bf16 LayerNorm
        y16, res16, norm16 = y.bfloat16(), res.bfloat16(), copy.deepcopy(norm).bfloat16()
        w16, b16 = norm16.weight, norm16.bias
        got16 = cpu_kernels.add_layer_norm_(y16.clone(), res16, w16, b16, 1e-12)
        assert got16.dtype == torch.bfloat16
        s = (y16 + res16).float()
        exact = cpu_kernels.add_layer_norm_(s, torch.zeros_like(s), w16.float(), b16.float(), 1e-12).bfloat16()
        assert torch.equal(got16, exact)
        torch_16 = norm16(y16 + res16)
        step = torch_16.float().abs() * 2 ** -7 + 1e-6
        assert ((got16.float() - torch_16.float()).abs() <= step).all()
        assert (got16 == torch_16).float().mean() >= 0.97
        assert torch.equal(add_and_norm(y16.clone(), res16, norm16), got16)
        assert cpu_kernels.add_layer_norm_(y16.clone(), res16, norm.weight, norm.bias, 1e-12) is None  # mixed


@needs_c
@pytest.mark.parametrize("isa", ["avx512"], indirect=True)
def test_add_and_norm_on_avx2_gives_the_avx512_bits(isa):
    """AVX2 keeps the 16 lanes' sums as two 8-float halves and normalises 8 at a time: each lane the same chain of
    operations as the AVX-512 build's, so the same floats -- rows of whole 16-float blocks, with an 8-float tail,
    and shorter than one block. (A tail of 4 floats, as in rows of 20, gave other last bits than the AVX-512 build
    before this kernel too, in the same elements: the tail's sum; the formula test above holds it.)"""
    for cols in (3, 8, 384, 392, 768, 1000):
        g = torch.Generator().manual_seed(cols)
        y, res = torch.randn(7, cols, generator=g) * 3 + 1, torch.randn(7, cols, generator=g)
        w, b = torch.randn(cols, generator=g), torch.randn(cols, generator=g)
        wide = cpu_kernels.add_layer_norm_(y.clone(), res, w, b, 1e-12)
        cpu_kernels.force_cpu_isa("avx2")
        narrow = cpu_kernels.add_layer_norm_(y.clone(), res, w, b, 1e-12)
        cpu_kernels.force_cpu_isa("avx512")
        assert torch.equal(wide, narrow), cols


def test_add_and_norm_takes_torch_where_the_c_pass_does_not_apply():
    g = torch.Generator().manual_seed(0)
    y, res = torch.randn(4, 32, generator=g), torch.randn(4, 32, generator=g)
    norm = torch.nn.LayerNorm(32)
    w, b = norm.weight.detach(), norm.bias.detach()
    assert cpu_kernels.add_layer_norm_(y.half(), res.half(), w.half(), b.half(), 1e-5) is None  # fp16
    assert cpu_kernels.add_layer_norm_(y.bfloat16(), res, w, b, 1e-5) is None  # mixed dtypes
    assert cpu_kernels.add_layer_norm_(y.clone(), res, norm.weight, norm.bias, 1e-5) is None  # autograd
    assert cpu_kernels.add_layer_norm_(y.clone(), res, w, None, 1e-5) is None  # no bias
    assert cpu_kernels.add_layer_norm_(y.clone(), res[:2], w, b, 1e-5) is None  # shapes differ
    assert cpu_kernels.add_layer_norm_(torch.randn(4, 64)[:, ::2], res, w, b, 1e-5) is None  # not contiguous
    leaf = y.clone().requires_grad_()
    out = add_and_norm(leaf * 1.0, res, norm)  # training: the torch formula, differentiable
    out.sum().backward()
    assert leaf.grad is not None
    torch.testing.assert_close(out, norm(y + res))
    without_affine = torch.nn.LayerNorm(32, elementwise_affine=False)
    with torch.no_grad():
        torch.testing.assert_close(add_and_norm(y.clone(), res, without_affine), without_affine(y + res))


def with_non_finite_rows(x: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """`x` with NaN, inf and -inf put into some rows (one each, and one row with all three); which rows."""
    x = x.clone()
    bad = [0, x.shape[0] // 2, x.shape[0] - 1]
    x[bad[0], 1] = float("nan")
    x[bad[1], 2] = float("inf")
    x[bad[2], 0] = float("-inf")
    x[bad[2], 3] = float("nan")
    return x, sorted(set(bad))


@pytest.mark.parametrize("isa", [*INT8_LEVELS, "none"], indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3, 16, 40, 205])
def test_non_finite_rows_stay_non_finite_on_every_int8_path(m, dtype, threads, isa):
    """A row holding NaN or inf comes out all NaN -- from the torch formulas, the C quantize and dequantize
    around torch._int_mm, and the VNNI kernel alike, as F.linear gives a non-finite row -- and the other rows
    are unchanged: the C paths stay bit for bit the formulas' on non-finite input."""
    k, n = 64, 48
    g = torch.Generator().manual_seed(m)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    ws, b = torch.rand(n, generator=g) / 50, torch.randn(n, generator=g)
    x, bad = with_non_finite_rows(rows_with_outliers(m, k, dtype, seed=m))
    good = [r for r in range(m) if r not in bad]
    xq, xs = quantize_rows_reference(x)
    want = dequantize_rows_reference(torch._int_mm(xq, w.t()), xs, ws, b)
    assert want[bad].isnan().all() and want[good].isfinite().all()
    paths = {}
    if cpu_kernels.available():
        q, s = quantize_rows(x)
        assert torch.equal(q, xq) and torch.equal(s.isnan(), xs.isnan()) and torch.equal(s.nan_to_num(), xs.nan_to_num())
        paths["C quantize + dequantize"] = dequantize_rows(torch._int_mm(q, w.t()), s, ws, b)
    if cpu_kernels.int8_gemm_available():
        paths[f"{isa} kernel"] = cpu_kernels.int8_linear(x, cpu_kernels.pack_int8_weight(w), ws, b)
    for name, got in paths.items():
        assert got[bad].isnan().all(), name
        assert torch.equal(got[good], want[good]), name
