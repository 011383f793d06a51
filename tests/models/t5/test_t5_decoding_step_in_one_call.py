"""CPU inference runs each T5 decoder block's decoding step in one C call (`nn.decoder_layer`,
`cpu_kernels.decoder_layer_step`): the same bits as its modules one by one -- v1.0's ReLU FFN and v1.1's gated
tanh GELU, fp32 (a few rows' GEMV and the panel GEMM), int8 and bf16 (on AVX-512 BF16), greedy rows and beams
sharing the encoder's keys and values, padded inputs, 1 and 2 threads -- the same ids as `transformers`, and the
modules wherever the call does not apply."""

from __future__ import annotations

import importlib

import pytest
import torch

from bertlab.infer.runtime import InferenceOptions, prepare
from bertlab.models.t5 import T5ForConditionalGeneration, modeling
from bertlab.models.t5.generate import CachedDecoder
from bertlab.nn import cpu_kernels, decoder_layer

from test_t5_generate import after_eos_as_pad, assert_lively, hf_twin, inputs, lively_model

attention = importlib.import_module("bertlab.nn.attention")  # (the package exports the function by this name)

pytestmark = pytest.mark.skipif(cpu_kernels.cpu_isa() == "none" or not cpu_kernels.f32_gemm_available(),
                                reason="the one-call decoder step runs on bertlab's GEMMs (AVX2 or AVX-512)")


def counted_steps(monkeypatch) -> list:
    """The one-call steps run from here on, counted (each by the C call: the gate passed it)."""
    calls, real = [], decoder_layer._decoder_layer_step

    def counted(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(decoder_layer, "_decoder_layer_step", counted)
    return calls


def prepared(tmp_path, dtype: str, variant: str = "v1.0", architecture: str = "encoder-decoder", d_kv: int = 8):
    folder = tmp_path / f"{variant}-{architecture}-{d_kv}"
    lively_model(variant, architecture, d_kv=d_kv).save_pretrained(folder)
    return prepare(T5ForConditionalGeneration.from_pretrained(folder), InferenceOptions(dtype=dtype))


def modules_only(monkeypatch) -> None:
    monkeypatch.setattr(modeling.T5Block, "decoding_step", lambda self, rows: None)


@pytest.mark.parametrize("dtype", ["fp32", "int8", "bf16"])
@pytest.mark.parametrize("rows, beams", [(1, 1), (3, 1), (6, 1), (2, 3)], ids=["1", "3", "6", "2x3beams"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("variant", ["v1.0", "v1.1"])  # ReLU FFN; gated tanh-GELU FFN
def test_one_call_step_gives_the_modules_bits(dtype, rows, beams, threads, variant, tmp_path, monkeypatch):
    if dtype == "int8" and not cpu_kernels.int8_gemm_available():
        pytest.skip("no int8 kernel at this level")
    if dtype == "bf16" and not cpu_kernels.bf16_dot_available():
        pytest.skip("no AVX-512 BF16 here (--dtype bf16 runs fp32)")
    # bf16 attention's C loops take heads of a multiple of 16
    model = prepared(tmp_path, dtype, variant, d_kv=16 if dtype == "bf16" else 8)
    if dtype == "bf16":
        assert model.shared.weight.dtype == torch.bfloat16
    ids, mask = inputs(B=rows)  # padded rows (an additive mask per row in cross-attention)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            calls = counted_steps(monkeypatch)
            one_call = CachedDecoder(model, ids, mask, beams, 8)
            assert all(step is not None for step in one_call.steps)
            with monkeypatch.context() as m:
                modules_only(m)
                modules = CachedDecoder(model, ids, mask, beams, 8)
            assert modules.steps == [None, None]
            tokens = torch.zeros(rows * beams, 1, dtype=torch.long)
            for step in range(8):
                got, want = one_call(tokens), modules(tokens)
                assert torch.equal(got, want), f"step {step}: {(got - want).abs().max()}"
                for a, b in zip(one_call.layers, modules.layers):  # the caches written alike
                    assert torch.equal(a.self_k[:, :step + 1], b.self_k[:, :step + 1])
                    assert torch.equal(a.self_v[:, :step + 1], b.self_v[:, :step + 1])
                # beams: a row continues another's (as beam search moves them), in both
                order = torch.arange(rows * beams).flip(0) if beams > 1 else torch.arange(rows)
                one_call.reorder(order)
                modules.reorder(order)
                tokens = got.argmax(-1, keepdim=True)
    finally:
        torch.set_num_threads(before)
    assert len(calls) == 8 * 2  # every step of both blocks in one call


@pytest.mark.parametrize("num_beams", [1, 3])
@pytest.mark.parametrize("variant", ["v1.0", "v1.1"])
def test_prepared_generation_matches_transformers(num_beams, variant, tmp_path, monkeypatch):
    model = prepared(tmp_path, "fp32", variant)
    calls = counted_steps(monkeypatch)
    ids, mask = inputs()
    ours = model.generate(ids, mask, max_new_tokens=20, num_beams=num_beams)
    theirs = hf_twin(lively_model(variant), tmp_path).generate(ids, attention_mask=mask, max_new_tokens=20,
                                                               num_beams=num_beams, do_sample=False)
    assert calls
    assert_lively(ours)
    assert torch.equal(after_eos_as_pad(ours), after_eos_as_pad(theirs))


@pytest.mark.parametrize("num_beams", [1, 3])
@pytest.mark.parametrize("architecture", ["encoder-decoder", "decoder-only"])
def test_bf16_generation_in_one_call_gives_the_modules_ids(num_beams, architecture, tmp_path, monkeypatch):
    """A bf16 model's generation (where the CPU has AVX-512 BF16) with every step in one call: the ids its modules
    give, greedy (the bf16 logits' argmax) and beam search; with cross-attention, and without (a decoder-only
    model's unpadded prompt: every step after the prompt's in one call)."""
    if not cpu_kernels.bf16_dot_available():
        pytest.skip("no AVX-512 BF16 here (--dtype bf16 runs fp32)")
    model = prepared(tmp_path, "bf16", "v1.1", architecture, d_kv=16)
    ids, mask = inputs()
    if architecture == "decoder-only":
        mask = None
    with monkeypatch.context() as m:
        modules_only(m)
        want = model.generate(ids, mask, max_new_tokens=12, num_beams=num_beams)
    calls = counted_steps(monkeypatch)
    got = model.generate(ids, mask, max_new_tokens=12, num_beams=num_beams)
    assert calls and torch.equal(got, want)


def test_one_call_step_declines_what_it_does_not_run(tmp_path, monkeypatch):
    ids, mask = inputs(B=2)
    calls = counted_steps(monkeypatch)
    with torch.inference_mode():
        # an unprepared model (nn.Linear), an activation the step does not apply as the modules do (the exact
        # GELU: torch's there): the modules
        assert CachedDecoder(lively_model(), ids, mask, 1, 4).steps == [None, None]
        exact = prepared(tmp_path, "fp32", "v1.1")
        for block in exact.decoder.block:
            block.layer[-1].DenseReluDense.act = "gelu"
        assert CachedDecoder(exact, ids, mask, 1, 4).steps == [None, None]
        # bf16 with heads of 8 (bf16 attention's C loops take multiples of 16; torch's formula in the modules)
        bf16 = prepared(tmp_path, "bf16")
        if bf16.shared.weight.dtype == torch.bfloat16:
            assert CachedDecoder(bf16, ids, mask, 1, 4).steps == [None, None]
        # the attention a bf16 model's modules run from AMX_SDPA_KEYS keys on AMX is SDPA: the step declines
        bf16 = prepared(tmp_path, "bf16", d_kv=16)
        if bf16.shared.weight.dtype == torch.bfloat16 and cpu_kernels.bf16_dot_available():
            decoder = CachedDecoder(bf16, ids, mask, 1, 4)
            step, layer = decoder.steps[0], decoder.layers[0]
            x = torch.zeros(2, 1, 32, dtype=torch.bfloat16)
            bias = torch.zeros(1, 4, 1, 1, dtype=torch.bfloat16)
            assert step(x, layer.self_k, layer.self_v, 0, bias, layer.cross_k, layer.cross_v) is not None
            monkeypatch.setattr(attention, "cpu_isa", lambda: "amx")
            monkeypatch.setattr(attention, "AMX_SDPA_KEYS", 4)
            assert step(x, layer.self_k, layer.self_v, 0, bias, layer.cross_k, layer.cross_v) is None
            monkeypatch.undo()
            calls = counted_steps(monkeypatch)
    # autograd on: no step is built
    model = prepared(tmp_path, "fp32")
    assert model.decoder.block[0].decoding_step(2) is None
    # a decoder-only model's padded prompt keeps a mask beside the position bias every step: the modules; without
    # padding, every step after the prompt's in one call
    lm = prepared(tmp_path, "fp32", architecture="decoder-only")
    lm.generate(ids, mask, max_new_tokens=4)
    assert calls == []
    out = lm.generate(ids, max_new_tokens=4)
    steps = out.size(1) - 1  # (rows that ended early stop the search sooner)
    assert steps > 1 and len(calls) == (steps - 1) * 2  # (the first step feeds the whole prompt: the modules)
