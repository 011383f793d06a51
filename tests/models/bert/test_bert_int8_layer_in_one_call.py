"""CPU int8 inference runs each BERT block in one C call too (`nn.encoder_layer`, `cpu_kernels.post_ln_layer`):
the same bits as its int8 modules one by one -- padded and unpadded, 1 and 2 threads, rows below and above the
AMX tiles' threshold, fp32 attention and (on a CPU with native bf16) int8's bf16 attention -- and the modules
wherever the call does not apply."""

from __future__ import annotations

import pytest
import torch

from bertlab import BertModel
from bertlab.infer.runtime import InferenceOptions, load_model
from bertlab.models.bert import modeling
from bertlab.nn import cpu_kernels, int8_linear

from infer_support import one_call_against_modules, one_call_layers, tiny_model

pytestmark = pytest.mark.skipif(cpu_kernels.cpu_isa() not in ("avx512", "amx") or not cpu_kernels.int8_gemm_available(),
                                reason="the one-call int8 layer runs on AVX-512's attention loops and an int8 kernel")


def _int8(folder):
    model = load_model(BertModel, folder, InferenceOptions(dtype="int8"))
    assert type(model.encoder.layer[0].attention.self.stacked) is int8_linear.Int8Linear
    for layer in model.encoder.layer:  # fp32 attention, as int8 has it on a CPU without native bf16 (elsewhere:
        layer.attention.self.attn_implementation = "bmm"  # bf16 attention, which the one-call layer declines)
    return model


@pytest.mark.parametrize("shape", [dict(hidden_size=64, num_attention_heads=4, intermediate_size=80),
                                   dict(hidden_size=96, num_attention_heads=2, intermediate_size=128),
                                   dict(hidden_size=384, num_attention_heads=12, intermediate_size=1536)],
                         ids=["h64", "h96", "minilm"])
@pytest.mark.parametrize("threads", [1, 2])
def test_one_call_int8_layer_gives_the_modules_bits(shape, threads, tmp_path, monkeypatch):
    # heads of 16, 48 and 32; FFN widths whose second layer is (80) and is not (128 is) a multiple of 64: the
    # VNNI kernel or AMX tiles for it on an AMX CPU; 33 rows (AMX from 16) and 9 (below)
    model = _int8(tiny_model(tmp_path / "bert", num_hidden_layers=2, **shape))
    one_call_against_modules(model, modeling.BertLayer, monkeypatch, threads)


@pytest.mark.skipif(not cpu_kernels.bf16_dot_available(), reason="no AVX-512 BF16: int8's attention is fp32 there")
@pytest.mark.parametrize("threads", [1, 2])
def test_one_call_int8_layer_with_bf16_attention_gives_the_modules_bits(threads, tmp_path, monkeypatch):
    # a CPU with native bf16: int8's attention is `bmm_bf16` (bf16 dot products; on AMX up to 64 keys the fp32
    # loops), which the one call runs as the modules do
    folder = tiny_model(tmp_path / "bert", num_hidden_layers=2, hidden_size=384, num_attention_heads=12,
                        intermediate_size=1536)
    model = load_model(BertModel, folder, InferenceOptions(dtype="int8"))
    assert {layer.attention.self.attn_implementation for layer in model.encoder.layer} == {"bmm_bf16"}
    one_call_against_modules(model, modeling.BertLayer, monkeypatch, threads)


def test_one_call_int8_layer_declines_what_it_does_not_run(tmp_path, monkeypatch):
    calls = one_call_layers(monkeypatch)
    model = _int8(tiny_model(tmp_path / "bert", hidden_size=64, num_attention_heads=4, intermediate_size=80))
    ids = torch.randint(5, 40, (2, 6))
    with torch.inference_mode():
        model(ids, output_attentions=True)  # the probabilities: the eager modules
        model(ids[:, :1])  # one query a row: the decoding step's kernel
    model(ids)  # autograd on: the modules
    assert calls == []
    # an FFN width the int8 kernel does not take (40: not a multiple of 16) -- torch._int_mm there, so the modules
    odd = _int8(tiny_model(tmp_path / "odd", hidden_size=64, num_attention_heads=4, intermediate_size=40))
    # one layer left in fp32 among int8 ones: that block's modules, the other block in one call
    mixed = _int8(tiny_model(tmp_path / "mixed", hidden_size=64, num_attention_heads=4, intermediate_size=80,
                             num_hidden_layers=2))
    dense = mixed.encoder.layer[0].output.dense
    mixed.encoder.layer[0].output.dense = torch.nn.Linear(dense.in_features, dense.out_features)
    with torch.inference_mode():
        odd(ids)
        assert calls == []
        mixed(ids[:1])
    assert calls == [1]  # mixed's second block only


def test_gelu_pass_gives_the_gemm_epilogues_bits():
    if not cpu_kernels.f32_gemm_available():
        pytest.skip("no C fp32 GEMM at this level")
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(7, 48, generator=g), torch.randn(70, 48, generator=g), torch.randn(70, generator=g)
    panels = cpu_kernels.pack_f32_panels(w)
    with torch.inference_mode():
        fused = cpu_kernels.linear_f32(x, panels, b, 70, "gelu")
        plain = cpu_kernels.linear_f32(x, panels, b, 70)
        assert cpu_kernels.gelu_(plain) is plain
    assert torch.equal(fused, plain)
    torch.testing.assert_close(plain, torch.nn.functional.gelu(x @ w.t() + b), atol=2e-5, rtol=1e-5)
