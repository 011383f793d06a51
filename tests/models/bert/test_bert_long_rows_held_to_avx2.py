"""A process held to AVX2 (an AVX2 or AVX-VNNI laptop stood in for on a server CPU) runs long inputs (256-512
tokens) as such a CPU would: int8's attention in fp32 (`bmm`, not bf16 emulated without bf16 dot products: a
256-512-token row took 1.05 s there against 0.16 s in fp32) and every block in one C call, fp32 and int8, at 1
and 2 threads -- the same bits as the modules one by one."""

from __future__ import annotations

import pytest
import torch

from bertlab import BertModel
from bertlab.infer.runtime import InferenceOptions, load_model
from bertlab.models.bert import modeling
from bertlab.nn import cpu_kernels, int8_linear
from bertlab.nn.attention import SHORT_KEYS

from infer_support import one_call_layers, tiny_model

LONG = SHORT_KEYS + 44  # past the keys where int8 on a CPU with native bf16 switches to bf16 attention


@pytest.mark.parametrize("isa", ["avx2", "avxvnni"], indirect=True)
@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize("threads", [1, 2])
def test_long_rows_held_to_avx2_run_in_one_call_in_fp32_attention(isa, dtype, threads, tmp_path, monkeypatch):
    if not cpu_kernels.f32_gemm_available() or (dtype == "int8" and not cpu_kernels.int8_gemm_available()):
        pytest.skip(f"no C {dtype} GEMM at {isa}")
    # oneDNN held to AVX2 too, as that CPU's: torch._int_mm is not exact there, and bertlab's int8 kernel takes
    # every row count (cpu_kernels.int_mm_exact, as int8_linear reads it)
    monkeypatch.setattr(int8_linear, "int_mm_exact", lambda: False)
    folder = tiny_model(tmp_path / "bert", hidden_size=64, num_attention_heads=4, intermediate_size=80,
                        num_hidden_layers=2, max_position_embeddings=512)
    model = load_model(BertModel, folder, InferenceOptions(dtype=dtype))
    assert {layer.attention.self.attn_implementation for layer in model.encoder.layer} == {"bmm"}
    reference = load_model(BertModel, folder, InferenceOptions(dtype="fp32", cpu_attention=False))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 40, (2, LONG), generator=g)
    mask = torch.ones_like(ids)
    mask[1, LONG - 37:] = 0  # a padded row: the additive mask per row
    calls = one_call_layers(monkeypatch)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            fused = [model(ids[:1]).last_hidden_state, model(ids, attention_mask=mask).last_hidden_state]
            assert len(calls) == 4  # both blocks of both passes
            monkeypatch.setattr(modeling.BertLayer, "in_one_call", lambda self, x, m: None)
            modules = [model(ids[:1]).last_hidden_state, model(ids, attention_mask=mask).last_hidden_state]
            want = reference(ids, attention_mask=mask).last_hidden_state
    finally:
        torch.set_num_threads(before)
    for a, b in zip(fused, modules):
        assert torch.equal(a, b)
    got = fused[1][mask.bool()]
    cos = torch.nn.functional.cosine_similarity(got, want[mask.bool()], dim=-1)
    assert float(cos.min()) > (0.9999 if dtype == "fp32" else 0.99)
