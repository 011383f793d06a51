"""CPU fp32 and bf16 inference runs each BERT block in one C call (`nn.encoder_layer`): the same bits as its modules
one by one, with and without padding, and the modules wherever the call does not apply."""

from __future__ import annotations

import pytest
import torch

from bertlab import BertModel
from bertlab.infer.runtime import InferenceOptions, load_model
from bertlab.models.bert import modeling
from bertlab.nn import cpu_kernels, packed_linear

from infer_support import one_call_against_modules, one_call_layers, tiny_model

pytestmark = pytest.mark.skipif(cpu_kernels.cpu_isa() == "none" or not packed_linear.available(),
                                reason="the one-call layer runs on the fp32 GEMM and attention loops of AVX2 and up")



@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    # heads of 16 (the C attention's smallest), an FFN width that leaves a last panel of 5 columns
    return tiny_model(tmp_path_factory.mktemp("m") / "bert", hidden_size=64, num_attention_heads=4,
                      intermediate_size=37, num_hidden_layers=2)


@pytest.mark.parametrize("isa", ["avx512", "avx2"], indirect=True)
def test_one_call_layer_gives_the_modules_bits(isa, folder, monkeypatch):
    model = load_model(BertModel, folder, InferenceOptions())
    one_call_against_modules(model, modeling.BertLayer, monkeypatch)


@pytest.fixture(scope="module")
def even_folder(tmp_path_factory):
    # bf16's panel GEMM takes an even K: an FFN width of 38 (a last panel of 6 columns)
    return tiny_model(tmp_path_factory.mktemp("m") / "bert", hidden_size=64, num_attention_heads=4,
                      intermediate_size=38, num_hidden_layers=2)


@pytest.mark.parametrize("threads", [1, 2])
def test_bf16_one_call_layer_gives_the_modules_bits(threads, even_folder, monkeypatch):
    """A bf16 model (a CPU with AVX-512 BF16 and no AMX: the bf16 panel GEMM): the bf16 GEMM, the bf16 attention
    loops, and the C passes its modules run too (Add & Norm, GELU), in one call; 1 and 2 threads."""
    if not cpu_kernels.bf16_dot_available() or cpu_kernels.cpu_isa() == "amx":
        pytest.skip("bf16 linear layers on bertlab's panel GEMM need AVX-512 BF16 without AMX")
    model = load_model(BertModel, even_folder, InferenceOptions(dtype="bf16"))
    assert model.embeddings.word_embeddings.weight.dtype == torch.bfloat16
    one_call_against_modules(model, modeling.BertLayer, monkeypatch, threads)


def test_one_call_layer_declines_what_it_does_not_run(folder, tmp_path, monkeypatch):
    calls = one_call_layers(monkeypatch)
    model = load_model(BertModel, folder, InferenceOptions())
    ids = torch.randint(5, 40, (2, 6))
    with torch.inference_mode():
        model(ids, output_attentions=True)  # the probabilities: the eager modules
        model(ids[:, :1])  # one query a row: the decoding step's kernel
    model(ids)  # autograd on: the modules
    model.train()
    with torch.inference_mode():
        model(ids)  # training mode (dropout): the modules
    assert calls == []
    narrow = load_model(BertModel, tiny_model(tmp_path / "narrow", hidden_size=32, num_attention_heads=4),
                        InferenceOptions())  # heads of 8: not the C attention's
    relu = load_model(BertModel, tiny_model(tmp_path / "relu", hidden_size=64, num_attention_heads=4,
                                            hidden_act="relu"), InferenceOptions())
    with torch.inference_mode():
        narrow(ids), relu(ids)
    assert calls == []
    # bf16 with an odd FFN width (the bf16 panel GEMM takes an even K: its modules run oneDNN's or torch's there)
    odd = load_model(BertModel, folder, InferenceOptions(dtype="bf16"))
    with torch.inference_mode():
        odd(ids)
    assert calls == []


def test_one_call_layer_split_over_two_threads_gives_the_one_thread_bits(folder, monkeypatch):
    """Two threads split the GEMMs' panels, the attention's (row, head) tasks and the Add & Norm rows: the same
    sums in the same order, so one thread's bits; and a row after rows of other lengths gives what its first call
    gave (nothing carried over in the layer's scratch)."""
    calls = one_call_layers(monkeypatch)
    model = load_model(BertModel, folder, InferenceOptions())
    g = torch.Generator().manual_seed(1)
    ids = [torch.randint(5, 40, shape, generator=g) for shape in ((1, 120), (1, 5), (2, 64))]
    ids.append(ids[0])  # the first row again
    before = torch.get_num_threads()
    out = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            with torch.inference_mode():
                out[threads] = [model(x).last_hidden_state for x in ids]
    finally:
        torch.set_num_threads(before)
    assert len(calls) == 2 * 2 * len(ids)
    for one, two in zip(out[1], out[2]):
        assert torch.equal(one, two)
    assert torch.equal(out[1][0], out[1][3]) and torch.equal(out[2][0], out[2][3])
