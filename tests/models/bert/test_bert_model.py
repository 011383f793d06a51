"""The encoder against Hugging Face `transformers.BertModel`: same weights, same inputs, same numbers.

First on a random-initialised tiny config, then on the real all-MiniLM-L6-v2 weights, over batches with
padding and both segment ids; then the parts of the model a parity test cannot see (bf16, masks, init).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bertlab import BertConfig, BertModel

transformers = pytest.importorskip("transformers")

TOL = 1e-5


def hf_config(config: BertConfig):
    return transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "extra"},
                                   attn_implementation="eager")


def padded_batch(vocab_size: int, lengths=(13, 7, 1, 10), seed: int = 0):
    """Pairs `[CLS] a [SEP] b [SEP]` with right padding; segment B starts halfway."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    input_ids = torch.zeros(len(lengths), T, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    token_type_ids = torch.zeros_like(input_ids)
    for i, n in enumerate(lengths):
        input_ids[i, :n] = torch.randint(1, vocab_size, (n,), generator=g)
        attention_mask[i, :n] = 1
        token_type_ids[i, n // 2:n] = 1
    return input_ids, attention_mask, token_type_ids


def assert_same_outputs(ours, theirs, attention_mask):
    """Compare at real tokens only: padded positions are not defined by either model."""
    keep = attention_mask.bool()
    torch.testing.assert_close(ours.last_hidden_state[keep], theirs.last_hidden_state[keep], atol=TOL, rtol=0)
    torch.testing.assert_close(ours.pooler_output, theirs.pooler_output, atol=TOL, rtol=0)
    assert len(ours.hidden_states) == len(theirs.hidden_states)
    for a, b in zip(ours.hidden_states, theirs.hidden_states):
        torch.testing.assert_close(a[keep], b[keep], atol=TOL, rtol=0)


def run_both(ours, theirs, batch, **kwargs):
    input_ids, attention_mask, token_type_ids = batch
    with torch.no_grad():
        a = ours(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                 output_hidden_states=True, **kwargs)
        b = theirs(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                   output_hidden_states=True, **kwargs)
    return a, b


def test_parity_random_tiny(tiny_config):
    torch.manual_seed(0)
    ours = BertModel(tiny_config).eval()
    theirs = transformers.BertModel(hf_config(tiny_config)).eval()
    missing, unexpected = theirs.load_state_dict(ours.state_dict(), strict=False)
    assert not unexpected and set(missing) <= {"embeddings.position_ids", "embeddings.token_type_ids"}
    batch = padded_batch(tiny_config.vocab_size)
    a, b = run_both(ours, theirs, batch)
    assert_same_outputs(a, b, batch[1])


def test_parity_attention_probabilities(tiny_config):
    torch.manual_seed(1)
    ours = BertModel(tiny_config).eval()
    theirs = transformers.BertModel(hf_config(tiny_config)).eval()
    theirs.load_state_dict(ours.state_dict(), strict=False)
    batch = padded_batch(tiny_config.vocab_size)
    a, b = run_both(ours, theirs, batch, output_attentions=True)
    assert_same_outputs(a, b, batch[1])
    for pa, pb in zip(a.attentions, b.attentions):
        torch.testing.assert_close(pa, pb, atol=TOL, rtol=0)
    # the explicit math path and the SDPA path agree
    with torch.no_grad():
        fast = ours(batch[0], attention_mask=batch[1], token_type_ids=batch[2])
    keep = batch[1].bool()
    torch.testing.assert_close(fast.last_hidden_state[keep], a.last_hidden_state[keep], atol=TOL, rtol=0)


def test_parity_minilm(minilm_dir):
    ours = BertModel.from_pretrained(minilm_dir)
    theirs = transformers.BertModel.from_pretrained(str(minilm_dir), attn_implementation="eager").eval()
    assert not ours.training
    batch = padded_batch(ours.config.vocab_size, lengths=(40, 17, 5, 33, 2))
    a, b = run_both(ours, theirs, batch)
    assert_same_outputs(a, b, batch[1])


def test_padding_does_not_change_real_tokens(tiny_config):
    torch.manual_seed(0)
    model = BertModel(tiny_config).eval()
    ids = torch.randint(1, 99, (1, 9))
    with torch.no_grad():
        alone = model(ids).last_hidden_state
        padded = model(torch.cat([ids, torch.zeros(1, 5, dtype=torch.long)], 1),
                       attention_mask=torch.tensor([[1] * 9 + [0] * 5])).last_hidden_state
    torch.testing.assert_close(padded[:, :9], alone, atol=TOL, rtol=0)


@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu", "silu", "tanh"])
def test_inference_in_place_activation_equals_autograd_path(tiny_config, act, monkeypatch):
    """Without autograd the FFN activation overwrites its input; with it, it must not (and gradients flow). Bit
    for bit, with Add & Norm and the tanh GELU in torch on both paths (their C passes are checked below and in
    tests/test_nn_cpu_kernels.py)."""
    import dataclasses

    from bertlab.nn import elementwise

    monkeypatch.setattr(elementwise, "add_layer_norm_", lambda *args: None)
    monkeypatch.setattr(elementwise, "gelu_tanh_", lambda x: None)
    torch.manual_seed(0)
    model = BertModel(dataclasses.replace(tiny_config, hidden_act=act)).eval()
    ids = torch.randint(1, 99, (2, 9))
    with torch.inference_mode():
        fast = model(ids).last_hidden_state
    with torch.no_grad():
        no_grad = model(ids).last_hidden_state
    graph = model(ids).last_hidden_state
    graph.sum().backward()
    assert model.encoder.layer[0].intermediate.dense.weight.grad.abs().sum() > 0
    torch.testing.assert_close(fast, graph.detach(), atol=0, rtol=0)
    torch.testing.assert_close(no_grad, graph.detach(), atol=0, rtol=0)


def test_inference_add_and_norm_in_one_pass_equals_the_autograd_path(tiny_config):
    """Without autograd, fp32 on a CPU, each sub-layer's LayerNorm(y + residual) is one C pass (where built): the
    same outputs as the autograd path's add and LayerNorm to ~1e-7."""
    torch.manual_seed(0)
    model = BertModel(tiny_config).eval()
    ids = torch.randint(1, 99, (2, 9))
    with torch.inference_mode():
        fast = model(ids, attention_mask=torch.tensor([[1] * 9, [1] * 6 + [0] * 3])).last_hidden_state
    graph = model(ids, attention_mask=torch.tensor([[1] * 9, [1] * 6 + [0] * 3])).last_hidden_state
    torch.testing.assert_close(fast, graph.detach(), atol=2e-6, rtol=0)


def test_training_on_real_tokens_only_matches_hf_and_the_padded_computation(tiny_config):
    """In training the layers run on the real tokens only (TokenLayout) and Q, K, V as one matmul: the same
    outputs at real tokens and the same gradients as Hugging Face's padded computation (dropout off)."""
    import dataclasses

    config = dataclasses.replace(tiny_config, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    ours = BertModel(config).train()
    theirs = transformers.BertModel(hf_config(config)).train()
    theirs.load_state_dict(ours.state_dict(), strict=False)
    padded = BertModel(config).train()
    padded.load_state_dict(ours.state_dict())
    padded.encoder.unpad_in_training = False
    input_ids, attention_mask, token_type_ids = padded_batch(config.vocab_size)
    keep = attention_mask.bool()
    target = torch.randn(int(keep.sum()), config.hidden_size, generator=torch.Generator().manual_seed(1))

    def run(model):
        out = model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        loss = (out.last_hidden_state[keep] * target).sum() + out.pooler_output.sum()
        loss.backward()
        return out, {n: p.grad for n, p in model.named_parameters()}

    (a, grads_a), (b, grads_b), (c, grads_c) = run(ours), run(theirs), run(padded)
    for other, other_grads in ((b, grads_b), (c, grads_c)):
        torch.testing.assert_close(a.last_hidden_state[keep], other.last_hidden_state[keep], atol=TOL, rtol=0)
        torch.testing.assert_close(a.pooler_output, other.pooler_output, atol=TOL, rtol=0)
        for name, grad in grads_a.items():
            torch.testing.assert_close(grad, other_grads[name], atol=1e-4, rtol=1e-4, msg=name)
    assert (a.last_hidden_state[~keep] == 0).all()  # the padded positions nothing reads


def test_all_padding_row_is_finite(tiny_config):
    model = BertModel(tiny_config).eval()
    out = model(torch.ones(2, 4, dtype=torch.long), attention_mask=torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]]))
    assert torch.isfinite(out.last_hidden_state).all()


def test_bf16_autocast_close_to_fp32(tiny_config):
    torch.manual_seed(0)
    model = BertModel(tiny_config).eval()
    input_ids, attention_mask, token_type_ids = padded_batch(99)
    with torch.no_grad():
        ref = model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state
        pure = model.to(torch.bfloat16)(input_ids, attention_mask=attention_mask,
                                        token_type_ids=token_type_ids).last_hidden_state
    keep = attention_mask.bool()
    assert (low.float()[keep] - ref[keep]).abs().max() < 0.1
    assert (pure.float()[keep] - ref[keep]).abs().max() < 0.2


def test_google_initialisation(tiny_config):
    torch.manual_seed(0)
    model = BertModel(tiny_config.replace(hidden_size=64, num_attention_heads=4, vocab_size=2000))
    w = model.embeddings.word_embeddings.weight
    assert w.abs().max() <= 2 * 0.02 + 1e-7  # truncated at two standard deviations
    assert 0.012 < w.std() < 0.02  # the std of N(0, 0.02) truncated at 2σ is ~0.0176
    assert torch.all(model.encoder.layer[0].output.LayerNorm.weight == 1)
    assert torch.all(model.encoder.layer[0].attention.self.query.bias == 0)


def test_task_output_layers_start_untruncated(tiny_config):
    """A task's added layer is N(0, σ) (HF's rule, measured better for fine-tuning); the encoder stays Google's."""
    from bertlab import BertForSequenceClassification, BertForTokenClassification
    from bertlab.models.bert.heads import TaskOutputLayer

    torch.manual_seed(0)
    config = tiny_config.replace(hidden_size=256, num_attention_heads=4, id2label={i: str(i) for i in range(64)})
    for cls in (BertForSequenceClassification, BertForTokenClassification):
        w = cls(config).classifier
        assert isinstance(w, TaskOutputLayer) and torch.all(w.bias == 0)
        assert w.weight.abs().max() > 2 * 0.02  # not truncated: 16k draws reach past 2σ
        assert 0.019 < w.weight.std() < 0.021


def test_output_indexing_and_sequence_limit(tiny_config):
    model = BertModel(tiny_config).eval()
    out = model(torch.ones(1, 3, dtype=torch.long))
    assert out[0] is out.last_hidden_state and out[1] is out.pooler_output
    assert out.last_hidden_state.shape == (1, 3, 32) and out.pooler_output.shape == (1, 32)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(torch.ones(1, 65, dtype=torch.long))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16(tiny_config):
    model = BertModel(tiny_config).cuda().eval()
    batch = [t.cuda() for t in padded_batch(99)]
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(batch[0], attention_mask=batch[1], token_type_ids=batch[2])
    assert torch.isfinite(out.last_hidden_state).all()


def test_a_packed_row_computes_each_document_as_if_alone(tiny_config):
    """An attention mask numbering a row's documents (1, 2, ...; 0 padding) keeps attention within each
    document: every document's states equal those of the document run on its own at the same positions, in
    training (unpadded, one sequence per document) and in eval (padded, block-diagonal mask)."""
    torch.manual_seed(0)
    config = dataclasses.replace(tiny_config, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertModel(config)
    ids = torch.randint(5, config.vocab_size, (2, 12))
    packed = torch.tensor([[1] * 5 + [2] * 4 + [3] * 2 + [0], [1] * 7 + [2] * 5])
    docs = [(0, 0, 5), (0, 5, 9), (0, 9, 11), (1, 0, 7), (1, 7, 12)]
    for training in (True, False):
        model.train(training)
        out = model(ids, attention_mask=packed).last_hidden_state
        for b, start, end in docs:
            alone = model(ids[b:b + 1, start:end], position_ids=torch.arange(start, end)[None]).last_hidden_state
            torch.testing.assert_close(out[b, start:end], alone[0], atol=1e-5, rtol=1e-5)
