"""oneDNN-packed linear layers for CPU inference (fp32, bf16): same numbers as `nn.Linear`, same state_dict, the
plain path whenever gradients are needed, and used by default by the inference loader."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from bertlab.nn import cpu_kernels
from bertlab.nn import packed_linear
from bertlab.infer.runtime import InferenceOptions, load_model

from infer_support import tiny_model

pytestmark = pytest.mark.skipif(not packed_linear.available(), reason="this torch build has no oneDNN linear operators")

def oneDNN_only(monkeypatch):
    """Layers made from here on take oneDNN, as on a CPU without AVX-512 (fp32) or AVX-512 BF16 (bf16)."""
    monkeypatch.setattr(packed_linear, "f32_gemm_available", lambda: False)
    monkeypatch.setattr(packed_linear, "bf16_dot_available", lambda: False)


@pytest.mark.parametrize("kernel", ["own", "onednn"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7, 48), (3, 5, 48), (1, 1, 48), (0, 48), (5, 20, 48)])
def test_packed_linear_equals_nn_linear(shape, dtype, kernel, monkeypatch):
    if kernel == "onednn":
        oneDNN_only(monkeypatch)
    torch.manual_seed(0)
    linear = nn.Linear(48, 80).to(dtype)
    x = torch.randn(shape).to(dtype)
    packed = packed_linear.PackedLinear(linear)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), linear(x), atol=tol, rtol=tol)
    assert packed(x).shape == (*shape[:-1], 80)


def test_a_few_rows_take_the_gemv_and_more_take_the_packed_kernel(monkeypatch):
    """A decoding step's rows (up to GEMV_ROWS) go to the C GEMV over the plain weight; more rows to the packed
    kernel."""
    torch.manual_seed(0)
    linear = nn.Linear(48, 80)
    packed = packed_linear.PackedLinear(linear)
    calls = []
    real = packed_linear.linear_few_rows
    monkeypatch.setattr(packed_linear, "linear_few_rows", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    with torch.inference_mode():
        for rows in range(1, packed_linear.GEMV_ROWS + 3):
            x = torch.randn(rows, 48)
            torch.testing.assert_close(packed(x), linear(x), atol=1e-5, rtol=1e-5)
    assert calls == list(range(1, packed_linear.GEMV_ROWS + 1))


def test_the_gemv_gives_the_same_bits_at_avx2_as_at_avx512():
    """The GEMV's AVX2 build (8-float halves in registers for 1-2 rows) sums in the AVX-512 build's order: the same
    bits at every row count (1-5: 4 + 1), both dtypes, K with and without a 16-wide tail, within 1e-4 of torch."""
    levels = {}
    for level in ("avx2", "avx512"):
        try:
            cpu_kernels.force_cpu_isa(level)
        except ValueError as e:
            cpu_kernels.force_cpu_isa(os.environ.get("BERTLAB_CPU_ISA"))
            pytest.skip(str(e))
        try:
            out = []
            for dtype in (torch.float32, torch.bfloat16):
                for rows in range(1, 6):
                    for k, n in ((48, 80), (64, 32), (272, 48)):
                        g = torch.Generator().manual_seed(rows * 1000 + k + n)
                        x, w, b = (torch.randn(*shape, generator=g).to(dtype) for shape in ((rows, k), (n, k), (n,)))
                        y = cpu_kernels.linear_few_rows(x, w, b)
                        tol = 1e-4 if dtype == torch.float32 else 2e-2
                        torch.testing.assert_close(y.float(), nn.functional.linear(x.float(), w.float(), b.float()),
                                                   atol=tol, rtol=tol)
                        out.append(y)
            levels[level] = out
        finally:
            cpu_kernels.force_cpu_isa(os.environ.get("BERTLAB_CPU_ISA"))
    assert all(torch.equal(a, b) for a, b in zip(levels["avx2"], levels["avx512"]))


@pytest.mark.parametrize("release", [False, True])
def test_linear_activate_fuses_gelu_into_the_c_gemm_where_it_can(release, monkeypatch):
    """`linear_activate` on a layer of the fp32 C GEMM: GELU in the GEMM's epilogue, one C call and no gelu op,
    within 1.5e-6 of the layer then torch's gelu; everything else -- another activation, a decoding step's few
    rows on the plain weight, bf16, autograd -- the layer then `activate`, the numbers of before."""
    from bertlab.nn.elementwise import activate, linear_activate

    if not cpu_kernels.f32_gemm_available():
        pytest.skip("no C fp32 GEMM at this level")
    torch.manual_seed(0)
    linear = nn.Linear(48, 80)
    packed = packed_linear.PackedLinear(linear)
    if release:
        packed.release_plain()
    fused = []
    real = packed_linear.linear_f32
    monkeypatch.setattr(packed_linear, "linear_f32", lambda *a: fused.append(a[4:]) or real(*a))
    monkeypatch.setattr(packed, "kernel", packed_linear.linear_f32)
    with torch.inference_mode():
        for rows in (1, packed_linear.GEMV_ROWS + 1, 70):
            x = torch.randn(2, rows, 48)
            plain = packed(x)
            for name in ("gelu", "relu", "gelu_new"):
                fused.clear()
                got = linear_activate(packed, x, name)
                torch.testing.assert_close(got, activate(plain.clone(), name), atol=1.5e-6, rtol=1e-6)
                on_plain_weight = 2 * rows <= packed_linear.GEMV_ROWS and not release
                assert fused == ([("gelu",)] if name == "gelu" and not on_plain_weight else [] if on_plain_weight
                                 else [()])
    x = torch.randn(5, 48, requires_grad=True)
    assert packed.activated(x, "gelu") is None  # autograd: the plain path
    bf16 = packed_linear.PackedLinear(nn.Linear(48, 80).bfloat16())
    with torch.inference_mode():
        assert bf16.activated(torch.randn(70, 48).bfloat16(), "gelu") is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_c_gemm_layers_keep_no_onednn_copy(dtype, monkeypatch):
    """fp32 on AVX-512, bf16 on AVX-512 BF16: the weight lives in the GEMM's panels only; an input of another
    dtype or a trace gets torch's own operator (its error, its graph) instead of the kernel reading the wrong
    bytes."""
    available = (cpu_kernels.f32_gemm_available() if dtype == torch.float32
                 else cpu_kernels.bf16_dot_available() and cpu_kernels.cpu_isa() != "amx")  # AMX: oneDNN's
    if not available:
        pytest.skip("no C GEMM for this dtype here")
    torch.manual_seed(0)
    linear = nn.Linear(48, 80).to(dtype)
    packed = packed_linear.PackedLinear(linear)
    assert packed.packed is None and packed.panels.shape[:2] == ((3, 48) if dtype == torch.float32 else (3, 24))
    assert list(packed.state_dict()) == ["weight", "bias"]
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", None, raising=False)  # oneDNN must not be called
    x = torch.randn(2, 9, 48).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), linear(x), atol=tol, rtol=tol)
        with pytest.raises(RuntimeError):
            packed(x.double())  # as nn.Linear refuses it
    traced = torch.jit.trace(packed, x, check_trace=False)
    assert "aten::linear" in str(traced.graph)
    torch.testing.assert_close(traced(x), linear(x), atol=tol, rtol=tol)


def test_packed_linear_keeps_parameters_and_falls_back_for_autograd():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    keys = model.state_dict().keys()
    assert packed_linear.pack_linear_layers(model) == 2
    assert all(isinstance(model[i], packed_linear.PackedLinear) for i in (0, 2))
    assert model.state_dict().keys() == keys
    x = torch.randn(3, 16, requires_grad=True)
    model(x).sum().backward()  # the plain path: oneDNN's operator has no backward
    assert x.grad is not None and model[0].weight.grad is not None


def test_inference_loader_packs_fp32_cpu_models_and_matches_plain(tmp_path, monkeypatch):
    folder = tiny_model(tmp_path / "m", "BertForMaskedLM")
    from bertlab import BertForMaskedLM
    from bertlab.infer import runtime

    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: True)  # bf16 as asked, whatever this CPU has

    packed = load_model(BertForMaskedLM, folder, InferenceOptions())
    plain = load_model(BertForMaskedLM, folder, InferenceOptions(packed_linear=False))
    bf16 = load_model(BertForMaskedLM, folder, InferenceOptions(dtype="bf16"))
    bf16_plain = load_model(BertForMaskedLM, folder, InferenceOptions(dtype="bf16", packed_linear=False))
    assert any(isinstance(m, packed_linear.PackedLinear) for m in packed.modules())
    assert not any(isinstance(m, packed_linear.PackedLinear) for m in plain.modules())
    assert any(isinstance(m, packed_linear.PackedLinear) for m in bf16.modules())
    # The tied MLM decoder still shares the word embeddings.
    assert packed.cls.predictions.decoder.weight is packed.bert.embeddings.word_embeddings.weight
    ids = torch.randint(5, 40, (2, 9))
    with torch.inference_mode():
        torch.testing.assert_close(packed(ids).prediction_logits, plain(ids).prediction_logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(bf16(ids).prediction_logits.float(), bf16_plain(ids).prediction_logits.float(),
                                   atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("family", ["bert", "t5"])
def test_attention_projections_are_stacked_into_one_packed_layer(tmp_path, family):
    """q, k and v read one input: the loader packs them as one (3H, H) layer in `stacked` and leaves the three
    plain (state_dict unchanged); outputs as the unstacked model's. T5's have no bias; BERT's do."""
    from bertlab import BertModel, T5ForConditionalGeneration

    if family == "bert":
        folder, cls = tiny_model(tmp_path / "m", "BertModel"), BertModel
    else:
        from transformers import T5Config as HFT5Config, T5ForConditionalGeneration as HFT5

        torch.manual_seed(0)
        folder = tmp_path / "t5"
        HFT5(HFT5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
                        decoder_start_token_id=0)).save_pretrained(folder)
        cls = T5ForConditionalGeneration
    model = load_model(cls, folder, InferenceOptions())
    plain = load_model(cls, folder, InferenceOptions(packed_linear=False))
    owners = [m for m in model.modules() if getattr(m, "stacked_projections", ())]
    assert owners and all(isinstance(m.stacked, packed_linear.PackedLinear) for m in owners)
    assert all(type(getattr(m, n)) is nn.Linear for m in owners for n in m.stacked_projections)
    assert model.state_dict().keys() == plain.state_dict().keys()
    ids = torch.randint(5, 40, (2, 9))
    with torch.inference_mode():
        if family == "bert":
            torch.testing.assert_close(model(ids).last_hidden_state, plain(ids).last_hidden_state,
                                       atol=1e-5, rtol=1e-5)
        else:
            torch.testing.assert_close(model(ids, decoder_input_ids=ids[:, :4]).logits,
                                       plain(ids, decoder_input_ids=ids[:, :4]).logits, atol=1e-5, rtol=1e-5)


def test_row_tiles_cover_every_row_with_a_bounded_set_of_shapes():
    seen = set()
    for rows in range(0, 3 * packed_linear.ROW_TILE + 7):
        tiles = packed_linear.row_tiles(rows)
        assert [r for a, b, _ in tiles for r in range(a, b)] == list(range(rows))
        assert all(b - a <= padded < b - a + 32 for a, b, padded in tiles)
        seen |= {padded for _, _, padded in tiles}
    assert seen == set(packed_linear.ROW_BUCKETS) and len(seen) <= 44


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padding_rows_are_read_from_the_inputs_own_storage_where_it_has_them(dtype, monkeypatch):
    """A chain of layers on oneDNN, as a model's: each output is a view of oneDNN's padded buffer, so the next
    layer reads its padding rows from there (no F.pad), whatever they hold (NaN here); single tile and several
    (ROW_TILE 64); the same numbers as nn.Linear, and the padded copy where the storage ends with the rows."""
    oneDNN_only(monkeypatch)
    torch.manual_seed(0)
    first, second = nn.Linear(48, 64).to(dtype), nn.Linear(64, 48).to(dtype)
    pads = []
    real_pad = packed_linear.F.pad
    monkeypatch.setattr(packed_linear.F, "pad", lambda *a, **k: pads.append(1) or real_pad(*a, **k))
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for tile in (512, 64):
        monkeypatch.setattr(packed_linear, "ROW_TILE", tile)
        for rows in (13, 70, 150):
            pads.clear()
            x = torch.randn(rows, 48).to(dtype)
            with torch.inference_mode():
                h = packed_linear.PackedLinear(first)(x)  # (rows, 64): its input has no slack, so one padded copy
                base = h.untyped_storage().nbytes() // h.element_size()
                assert base >= packed_linear.row_tiles(rows)[-1][0] * 64 + packed_linear.row_tiles(rows)[-1][2] * 64
                h.as_strided((base - h.numel(),), (1,), h.numel()).fill_(float("nan"))  # the padding rows: NaN
                y = packed_linear.PackedLinear(second)(h)
                want = second(first(x))
            torch.testing.assert_close(y, want, atol=tol, rtol=tol)
            assert not torch.isnan(y).any()
            padded_tiles = sum(p != stop - start for start, stop, p in packed_linear.row_tiles(rows))
            assert len(pads) == padded_tiles  # the first layer's only; none for the second


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/status"), reason="needs /proc (Linux)")
@pytest.mark.parametrize("kernel", ["own", "onednn"])
def test_many_row_counts_do_not_grow_memory(kernel, monkeypatch):
    """Each new row count used to leave a ~1 MB oneDNN primitive cached (up to 1,024 of them), so a service's
    memory grew with every new batch shape; 200 row counts now cost no more than the first 50, on oneDNN's row
    buckets and on the C GEMM (which keeps nothing per shape)."""
    if kernel == "onednn":
        oneDNN_only(monkeypatch)
    torch.manual_seed(0)
    linear = nn.Linear(256, 1024)
    packed = packed_linear.PackedLinear(linear)
    inputs = torch.randn(250, 256)
    with torch.inference_mode():
        for rows in range(1, 50):
            packed(inputs[:rows])
        before = _rss_mb()
        for rows in range(50, 250):  # was ~+120 MB
            y = packed(inputs[:rows])
        grown = _rss_mb() - before
        x = torch.randn(2 * packed_linear.ROW_TILE + 76, 256)  # three tiles, the last padded
        torch.testing.assert_close(packed(x), linear(x), atol=1e-4, rtol=1e-4)
    assert y.shape == (249, 1024)
    assert grown < 30, f"RSS grew {grown:.0f} MB over 200 new row counts"


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_t5_decoding_steps_take_the_gemv_and_match_the_full_forward(dtype, tmp_path, monkeypatch):
    """A T5 loaded for inference decodes one and three sequences through the GEMV (every decoder layer and the LM
    head at 1-3 rows), and each cached step's logits equal the full forward pass's at that position (bf16: to its
    rounding)."""
    from bertlab.models.t5.config import T5Config
    from bertlab.models.t5.generate import CachedDecoder
    from bertlab.models.t5.modeling import T5ForConditionalGeneration

    torch.manual_seed(0)
    T5ForConditionalGeneration(T5Config(vocab_size=96, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
                                        relative_attention_num_buckets=8)).save_pretrained(tmp_path)
    model = load_model(T5ForConditionalGeneration, tmp_path, InferenceOptions(dtype=dtype))
    rows = []
    real = packed_linear.linear_few_rows
    monkeypatch.setattr(packed_linear, "linear_few_rows", lambda x, *a: rows.append(x.shape[0]) or real(x, *a))
    g = torch.Generator().manual_seed(1)
    for batch in (1, 3):
        ids = torch.randint(5, 90, (batch, 9), generator=g)
        target = torch.randint(5, 90, (batch, 6), generator=g)
        with torch.inference_mode():
            full = model(ids, decoder_input_ids=target).logits.float()  # (B, 6, V)
            decoder = CachedDecoder(model, ids, None, 1, target.size(1))
            rows.clear()
            steps = torch.stack([decoder(target[:, i:i + 1]).float() for i in range(target.size(1))], 1)
        assert rows and set(rows) == {batch}  # every step's layers through the GEMV
        tol = 1e-4 if dtype == "fp32" else 0.1
        torch.testing.assert_close(steps, full, atol=tol, rtol=tol)


needs_amx = pytest.mark.skipif(cpu_kernels.cpu_isa() != "amx", reason="no AMX here (or held below it)")


@pytest.mark.parametrize("isa", ["amx", "avx512"], indirect=True)
def test_bf16_layers_take_onednn_on_amx_and_the_c_gemm_below(isa):
    """On AMX a bf16 layer keeps oneDNN's reordered weight (its AMX kernel) and no panels; held to AVX-512 (with
    AVX-512 BF16) it takes bertlab's panels. Either way the exact products summed in fp32, rounded once."""
    if isa == "avx512" and not cpu_kernels.bf16_dot_available():
        pytest.skip("no AVX-512 BF16 here")
    torch.manual_seed(0)
    linear = nn.Linear(384, 96).bfloat16()
    packed = packed_linear.PackedLinear(linear)
    assert (packed.panels is None) == (isa == "amx") and (packed.packed is None) == (isa != "amx")
    with torch.inference_mode():
        for rows in (7, 64, 700):
            x = torch.randn(rows, 384).bfloat16()
            exact = x.double() @ linear.weight.double().t() + linear.bias.double()
            got = packed(x)
            step = exact.abs().clamp(min=1e-30).log2().floor().exp2() / 128  # one bf16 step at each value
            assert ((got.double() - exact).abs() <= step + 1e-3).all(), rows


@needs_amx
def test_onednn_runs_its_amx_kernel_for_bf16():
    """What the AMX level relies on: oneDNN (through torch) picks its AMX kernel for a bf16 packed linear layer,
    as its verbose log names it."""
    code = (
        "import torch\n"
        "w = torch.randn(384, 384).bfloat16(); x = torch.randn(128, 384).bfloat16()\n"
        "p = torch.ops.mkldnn._reorder_linear_weight(w, 2048)\n"
        "torch.ops.mkldnn._linear_pointwise(x, p, None, 'none', [], '')\n"
    )
    env = {**os.environ, "ONEDNN_VERBOSE": "1"}
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    lines = [l for l in out.splitlines() if l.startswith("onednn_verbose") and ",exec," in l]
    assert any("amx" in l and "bf16" in l for l in lines), "\n".join(lines)


def test_a_loaded_model_holds_each_panel_weight_once(tmp_path):
    """The loader's packed layers drop the plain weight the panels hold (the tied MLM decoder keeps it: the word
    embeddings are the same tensor); state_dict() gives the same keys and exactly the same tensors, unpacked;
    the outputs, the few-row calls included, are the plain model's; a state_dict loaded into it is packed anew."""
    if not cpu_kernels.f32_gemm_available():
        pytest.skip("no C fp32 GEMM here: every layer keeps oneDNN's copy and its plain weight")
    folder = tiny_model(tmp_path / "m", "BertForMaskedLM")
    from bertlab import BertForMaskedLM

    model = load_model(BertForMaskedLM, folder, InferenceOptions())
    plain = load_model(BertForMaskedLM, folder, InferenceOptions(packed_linear=False))
    layers = [m for m in model.modules() if isinstance(m, packed_linear.PackedLinear)]
    decoder = model.cls.predictions.decoder
    assert all(m.released == (m is not decoder) for m in layers) and len(layers) > 3
    assert decoder.weight is model.bert.embeddings.word_embeddings.weight
    ours, theirs = model.state_dict(), plain.state_dict()
    assert list(ours) == list(theirs) and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    # every tensor the model holds: its parameters and buffers, and the panels -- the linear weights once
    held = {t.data_ptr(): t.untyped_storage().nbytes() for t in (*model.parameters(), *model.buffers())}
    held.update({m.panels.data_ptr(): m.panels.untyped_storage().nbytes() for m in layers})
    stacked = sum(p.numel() * 4 for m in plain.modules() for n in getattr(m, "stacked_projections", ())
                  for p in getattr(m, n).parameters())  # q, k, v: plain (state_dict) and stacked panels
    padding = sum(m.panels.numel() - m.out_features * m.in_features for m in layers) * 4
    tied = decoder.out_features * decoder.in_features * 4  # the decoder's panels beside the embeddings
    own = {t.data_ptr(): t.untyped_storage().nbytes() for t in (*plain.parameters(), *plain.buffers())}
    assert sum(held.values()) == sum(own.values()) + stacked + padding + tied
    with torch.inference_mode():
        for rows in (2, 9):  # a few rows (the panel GEMM, no plain weight for the GEMV) and more
            ids = torch.randint(5, 40, (1, rows))
            torch.testing.assert_close(model(ids).prediction_logits, plain(ids).prediction_logits,
                                       atol=1e-5, rtol=1e-5)
    torch.manual_seed(1)
    other = {k: torch.randn_like(v) if v.is_floating_point() else v for k, v in theirs.items()}
    other["cls.predictions.decoder.weight"] = other["bert.embeddings.word_embeddings.weight"]  # tied
    model.load_state_dict(other)  # (the stacked q, k, v copy is made once: the loader's model is not reloaded)
    assert all(torch.equal(model.state_dict()[k], other[k]) for k in other)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_released_weight_is_unpacked_exactly(dtype, monkeypatch):
    """Both panel layouts read back bit for bit: state_dict() unpacks without keeping the copy, `.weight` keeps it
    (and the few-row GEMV over it returns). The layer is only built here (the bf16 panels as on a CPU with AVX-512
    BF16 and no AMX), not run."""
    monkeypatch.setattr(packed_linear, "f32_gemm_available", lambda: True)
    monkeypatch.setattr(packed_linear, "bf16_dot_available", lambda: True)
    monkeypatch.setattr(packed_linear, "cpu_isa", lambda: "avx512")
    torch.manual_seed(0)
    linear = nn.Linear(48, 80).to(dtype)  # 80 outputs: the last panel half empty
    packed = packed_linear.PackedLinear(linear)
    assert packed.panels is not None and packed.release_plain()
    assert "weight" not in dict(packed.named_parameters()) and packed.plain is None
    state = packed.state_dict()
    assert list(state) == ["weight", "bias"] and torch.equal(state["weight"], linear.weight)
    assert "weight" not in packed.__dict__  # state_dict's copy was not kept
    weight = packed.weight
    assert torch.equal(weight, linear.weight) and packed.weight is weight and packed.plain[0] is weight
