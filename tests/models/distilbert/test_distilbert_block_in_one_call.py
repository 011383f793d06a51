"""CPU fp32 and int8 inference run each DistilBERT block in one C call (`nn.encoder_layer`), the same bits as its
modules."""

from __future__ import annotations

import pytest
import torch

from bertlab.infer.runtime import InferenceOptions, load_model
from bertlab.models.distilbert.modeling import DistilBertModel
from bertlab.nn import cpu_kernels, encoder_layer, packed_linear

pytestmark = pytest.mark.skipif(cpu_kernels.cpu_isa() == "none" or not packed_linear.available(),
                                reason="the one-call layer runs on the fp32 GEMM and attention loops of AVX2 and up")


@pytest.mark.parametrize("isa", ["avx512", "avx2"], indirect=True)
@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_distilbert_block_in_one_call_gives_the_modules_bits(isa, dtype, tmp_path, monkeypatch):
    import transformers

    if dtype == "int8" and not cpu_kernels.int8_gemm_available():
        pytest.skip("no int8 kernel at this level")

    torch.manual_seed(0)
    hidden_dim = 37 if dtype == "fp32" else 80  # (the int8 kernel takes multiples of 16)
    config = transformers.DistilBertConfig(vocab_size=50, dim=64, n_layers=2, n_heads=4, hidden_dim=hidden_dim,
                                           max_position_embeddings=32)
    transformers.DistilBertModel(config).save_pretrained(tmp_path / "m")
    model = load_model(DistilBertModel, tmp_path / "m", InferenceOptions(dtype=dtype))
    for block in model.transformer.layer:  # int8: fp32 attention, as on a CPU without native bf16
        block.attention.attn_implementation = "bmm"
    calls, real = [], encoder_layer._post_ln_layer
    monkeypatch.setattr(encoder_layer, "_post_ln_layer", lambda *a: calls.append(real(*a)) or calls[-1])
    ids = torch.randint(5, 50, (2, 8))  # (16 rows: within the int8 kernel's reach at every level)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    with torch.inference_mode():
        fused = model(ids, attention_mask=mask).last_hidden_state
        assert len(calls) == 2 and all(out is not None for out in calls)  # (the kernels ran both blocks)
        monkeypatch.setattr(encoder_layer, "_post_ln_layer", lambda *a: None)  # every block on its modules
        assert torch.equal(fused, model(ids, attention_mask=mask).last_hidden_state)
