"""T5 against Hugging Face `transformers.T5ForConditionalGeneration`: same weights, same inputs, same numbers,
for v1.0 (ReLU, tied embeddings, rescaled output) and v1.1 (gated GELU, untied LM head); checkpoints both ways;
then what parity cannot see: the decoder-only and prefix-LM masks, configs, length limits, training."""

from __future__ import annotations

import json

import pytest
import torch

from bertlab import T5Config, T5ForConditionalGeneration
from bertlab.core.errors import BertlabError, CheckpointError, ConfigError
from bertlab.nn.relative_position import relative_position_bucket
from bertlab.models.t5 import PRESETS, preset

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")
TOL = 1e-5
VARIANTS = {
    "v1.0": dict(feed_forward_proj="relu", tie_word_embeddings=True),
    "v1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),
}


def tiny(variant: str = "v1.0", **overrides) -> T5Config:
    """Small enough to build in milliseconds; few buckets and a short max distance, so the log-spaced buckets
    and the clamp at max_distance are both reached by 30-token inputs. Asymmetric stacks (2 vs 3 layers) and
    num_heads * d_kv != d_model catch mixed-up sizes."""
    fields = dict(vocab_size=99, d_model=32, d_kv=6, d_ff=48, num_layers=2, num_decoder_layers=3, num_heads=4,
                  relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.1,
                  **VARIANTS[variant])
    fields.update(overrides)
    return T5Config(**fields)


def padded_inputs(B=4, T=30, T_dec=25, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 99, (B, T), generator=g)
    mask = torch.ones_like(ids)
    for row, n in enumerate((T, 19, 4, 11)[:B]):
        mask[row, min(n, T):] = 0
        ids[row, min(n, T):] = 0
    labels = torch.randint(2, 99, (B, T_dec), generator=g)
    for row, n in list(enumerate((T_dec, 20, 3)))[1:B]:
        labels[row, n:] = -100
    return ids, mask, labels


def hf_from(ours, tmp_path):
    ours.save_pretrained(tmp_path / "ours")
    theirs, info = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "ours", output_loading_info=True)
    return theirs.eval(), info


@pytest.mark.parametrize("variant", VARIANTS)
def test_parity_and_hf_loads_ours(variant, tmp_path):
    torch.manual_seed(0)
    ours = T5ForConditionalGeneration(tiny(variant)).eval()
    theirs, info = hf_from(ours, tmp_path)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert (theirs.lm_head.weight is theirs.shared.weight) == (variant == "v1.0")
    ids, mask, labels = padded_inputs()
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, labels=labels)
        b = theirs(input_ids=ids, attention_mask=mask, labels=labels)
    keep = mask.bool()
    torch.testing.assert_close(a.encoder_last_hidden_state[keep], b.encoder_last_hidden_state[keep], atol=TOL, rtol=0)
    assert a.logits.shape == (4, 25, 99)
    # logits of an untied N(0, 1) head reach ~±30: compare relative to their scale
    torch.testing.assert_close(a.logits, b.logits, atol=TOL * max(1.0, b.logits.abs().max().item() / 10), rtol=0)
    torch.testing.assert_close(a.loss, b.loss, atol=TOL, rtol=0)
    # explicit decoder inputs with decoder padding, too
    dec = ours.shift_right(labels)
    dec_mask = (labels != -100).long()
    dec_mask[:, 0] = 1
    with torch.no_grad():
        a = ours(ids, mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask).logits
        b = theirs(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask).logits
    real = dec_mask.bool()
    torch.testing.assert_close(a[real], b[real], atol=TOL * max(1.0, b.abs().max().item() / 10), rtol=0)


def hf_saved(variant, folder, untie=False):
    """A random model as `transformers` saves it. HF 5 ties even v1.1's random models (and writes
    `scale_decoder_outputs: false`); with `untie` the file gets its own LM head and `tie_word_embeddings: false`,
    as Google's v1.1 checkpoints have."""
    from safetensors.torch import load_file, save_file

    fields = {k: v for k, v in tiny(variant).to_dict().items() if k not in ("dense_act_fn", "is_gated_act", "model_type")}
    transformers.T5ForConditionalGeneration(transformers.T5Config(**fields)).save_pretrained(folder)
    if untie:
        state = load_file(folder / "model.safetensors")
        state["lm_head.weight"] = torch.randn_like(state["shared.weight"])
        save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
        config = json.loads((folder / "config.json").read_text())
        config["tie_word_embeddings"] = False
        config.pop("scale_decoder_outputs", None)
        (folder / "config.json").write_text(json.dumps(config))
    return transformers.T5ForConditionalGeneration.from_pretrained(folder).eval()


@pytest.mark.parametrize("variant,untie", [("v1.0", False), ("v1.1", False), ("v1.1", True)])
def test_we_load_theirs(variant, untie, tmp_path):
    torch.manual_seed(1)
    theirs = hf_saved(variant, tmp_path / "theirs", untie)
    ours, report = T5ForConditionalGeneration.from_pretrained(tmp_path / "theirs", return_report=True)
    assert not report.initialized and not report.unused
    assert not ours.training
    assert (ours.lm_head.weight is ours.shared.weight) == (not untie)
    ids, mask, labels = padded_inputs(seed=3)
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, labels=labels)
        b = theirs(input_ids=ids, attention_mask=mask, labels=labels)
    torch.testing.assert_close(a.logits, b.logits, atol=TOL * max(1.0, b.logits.abs().max().item() / 10), rtol=0)
    torch.testing.assert_close(a.loss, b.loss, atol=TOL, rtol=0)


def test_round_trip_is_exact(tmp_path):
    torch.manual_seed(2)
    for variant in VARIANTS:
        ours = T5ForConditionalGeneration(tiny(variant, architecture="encoder-decoder"))
        ours.save_pretrained(tmp_path / variant)
        again = T5ForConditionalGeneration.from_pretrained(tmp_path / variant)
        assert again.config.to_dict() == {**ours.config.to_dict(), "architectures": ["T5ForConditionalGeneration"]}
        for (k, a), (_, b) in zip(ours.state_dict().items(), again.state_dict().items()):
            assert torch.equal(a, b), k
        saved = json.loads((tmp_path / variant / "config.json").read_text())
        assert saved["model_type"] == "t5" and "architecture" not in saved  # the default is not written


def test_relative_position_buckets_match_hf():
    rel = torch.arange(-300, 300)[None, :]
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (8, 20)):
            ours = relative_position_bucket(rel, bidirectional, buckets, distance)
            theirs = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
                rel, bidirectional, buckets, distance)
            assert torch.equal(ours, theirs)
            assert int(ours.max()) == buckets - 1


def test_eager_and_sdpa_agree():
    torch.manual_seed(3)
    ours = T5ForConditionalGeneration(tiny()).eval()
    ids, mask, labels = padded_inputs()
    with torch.no_grad():
        sdpa = ours(ids, mask, labels=labels).logits
        for m in ours.modules():
            if hasattr(m, "attn_implementation"):
                m.attn_implementation = "eager"
        eager = ours(ids, mask, labels=labels).logits
    torch.testing.assert_close(sdpa, eager, atol=TOL, rtol=0)


# ---------------------------------------------------------------------------------------------- architectures
def lm(architecture: str) -> T5ForConditionalGeneration:
    torch.manual_seed(4)
    return T5ForConditionalGeneration(tiny(architecture=architecture)).eval()


@pytest.mark.parametrize("architecture", ["decoder-only", "prefix-lm"])
def test_decoder_only_kinds_never_see_a_later_target_token(architecture):
    model = lm(architecture)
    assert model.encoder is None and len(model.decoder.block[0].layer) == 2  # no cross-attention
    ids, _, labels = padded_inputs(B=2, T=9, T_dec=8)
    dec = model.shift_right(labels)
    with torch.no_grad():
        base = model(ids, decoder_input_ids=dec).logits
        for t in range(1, dec.size(1)):
            changed = dec.clone()
            changed[:, t] = (changed[:, t] + 7) % 99
            out = model(ids, decoder_input_ids=changed).logits
            torch.testing.assert_close(out[:, :t], base[:, :t], atol=0, rtol=0)  # earlier targets: untouched
            assert (out[:, t:] - base[:, t:]).abs().amax(dim=(0, 2)).min() > 0  # the token itself and later: see it


def test_prefix_is_fully_visible_only_in_prefix_lm():
    """Changing the last input token changes the first input position's hidden state in the prefix LM (it sees
    the whole prefix) but no earlier position's in the causal LM; in both it reaches every target."""
    from bertlab.nn import AttentionMask

    for architecture in ("prefix-lm", "decoder-only"):
        model = lm(architecture)
        kind = model.config.decoder_mask_kind
        ids, _, labels = padded_inputs(B=2, T=9, T_dec=5)
        changed = ids.clone()
        changed[:, -1] = (changed[:, -1] + 5) % 99

        def hidden(x):
            full, keep, prefix = model.decoder_only_inputs(x, None, model.shift_right(labels), None)
            mask = AttentionMask.padding(keep, kind, prefix if kind == "prefix" else None)
            return model.decoder(model.shared(full), mask)  # (B, 9 + 5, d_model)

        with torch.no_grad():
            a, b = hidden(ids), hidden(changed)
        if architecture == "prefix-lm":
            assert (a[:, 0] - b[:, 0]).abs().amax(-1).min() > 0
        else:
            torch.testing.assert_close(a[:, :8], b[:, :8], atol=0, rtol=0)
        assert (a[:, 9:] - b[:, 9:]).abs().amax(-1).min() > 0


@pytest.mark.parametrize("architecture", ["decoder-only", "prefix-lm"])
def test_decoder_only_input_padding_is_invisible(architecture):
    """A padded row computes the same logits as the same row alone: padding moves in front of the input, so
    input and target stay adjacent and relative positions are unchanged."""
    model = lm(architecture)
    ids, mask, labels = padded_inputs(B=4, T=12, T_dec=6)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask, labels=labels).logits
        for row in range(4):
            n = int(mask[row].sum())
            alone = model(ids[row:row + 1, :n], labels=labels[row:row + 1]).logits
            torch.testing.assert_close(batch[row], alone[0], atol=TOL, rtol=0)


def test_decoder_only_loss_ignores_minus_100_and_trains():
    model = lm("prefix-lm").train()
    ids, mask, labels = padded_inputs(B=4, T=12, T_dec=6)
    out = model(ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    assert model.decoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.grad.abs().sum() > 0
    logits = out.logits.detach()
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 99), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss.detach(), expected)


def test_encoder_decoder_trains_with_dropout():
    torch.manual_seed(5)
    model = T5ForConditionalGeneration(tiny("v1.1")).train()
    ids, mask, labels = padded_inputs()
    a, b = model(ids, mask, labels=labels), model(ids, mask, labels=labels)
    assert not torch.equal(a.logits, b.logits)  # dropout is on in training
    a.loss.backward()
    assert all(p.grad is not None for p in model.parameters())


# ---------------------------------------------------------------------------------------------- configs, sizes
def test_other_model_type_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 32}))
    with pytest.raises(ConfigError, match=r"config.json: field 'model_type' is 'bert'; expected 't5'") as e:
        T5ForConditionalGeneration.from_pretrained(tmp_path)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="feed_forward_proj"):
        T5Config(feed_forward_proj="gated-gelu-x")
    with pytest.raises(ConfigError, match="architecture"):
        T5Config(architecture="encoder-only")
    with pytest.raises(ConfigError, match="'d_model' must be an integer"):
        T5Config.from_dict({"d_model": "512"}, "x.json")


def test_input_longer_than_the_model_allows():
    model = lm("decoder-only")
    model.config.n_positions = 16
    with pytest.raises(BertlabError, match=r"input \+ target of 17 tokens is longer than the model allows "
                                           r"\(n_positions = 16\)"):
        model(torch.ones(1, 12, dtype=torch.long), labels=torch.ones(1, 5, dtype=torch.long))
    enc_dec = T5ForConditionalGeneration(tiny(n_positions=8))
    with pytest.raises(BertlabError, match="input of 9 tokens"):
        enc_dec(torch.ones(1, 9, dtype=torch.long), labels=torch.ones(1, 2, dtype=torch.long))


def test_missing_weight_is_an_error(tmp_path):
    from safetensors.torch import load_file, save_file

    T5ForConditionalGeneration(tiny("v1.1")).save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["lm_head.weight"]
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="missing encoder weights: lm_head.weight"):
        T5ForConditionalGeneration.from_pretrained(tmp_path)


@pytest.mark.parametrize("name", PRESETS)
def test_presets_param_counts(name):
    from bertlab.models.t5.params import t5_count

    config = preset(name)
    with torch.device("meta"):
        ours = T5ForConditionalGeneration(config)
        hf_fields = {k: v for k, v in config.to_dict().items() if k not in ("dense_act_fn", "is_gated_act", "model_type")}
        theirs = transformers.T5ForConditionalGeneration(transformers.T5Config(**hf_fields))
    if not config.tie_word_embeddings:  # HF 5 ties every random model; an untied checkpoint has its own head
        hf = sum(p.numel() for p in theirs.parameters()) + theirs.lm_head.weight.numel()
    else:
        hf = sum(p.numel() for p in theirs.parameters())
    assert t5_count(config) == ours.num_parameters() == hf
    expected = {"t5-small": 60.5e6, "t5-base": 222.9e6, "t5-large": 737.7e6}  # the paper: 60M, 220M, 770M
    if name in expected:
        assert abs(t5_count(config) - expected[name]) < 0.1e6


def test_params_command_counts_t5(tmp_path, capsys):
    from bertlab.cli import main
    from bertlab.models.t5.params import t5_count

    assert main(["params", "t5-small", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["t5-small"]
    assert rows["total (T5ForConditionalGeneration)"] == t5_count(preset("t5-small")) == 60_506_624
    config = tiny("v1.1", architecture="prefix-lm")
    model = T5ForConditionalGeneration(config)
    model.save_pretrained(tmp_path)
    assert main(["params", str(tmp_path), "--format", "json"]) == 0  # a model folder: counted by its model_type
    rows = json.loads(capsys.readouterr().out)[str(tmp_path)]
    assert rows["total (T5ForConditionalGeneration)"] == model.num_parameters()
    assert "decoder.layer.cross_attention" not in rows and "encoder.layer.ffn" not in rows


def test_shared_encoder_decoder_counts_p_and_loads_in_transformers(tmp_path):
    """Table 2's "Enc-dec, shared": decoder block i computes with encoder block i's self-attention and FFN (one
    parameter each: the count is the encoder's plus the decoder's cross-attention, position table and final
    norm, as `bertlab params` says); a gradient step keeps them one; saved, the folder holds equal copies that
    transformers loads as a plain T5 with the same logits, and bertlab loads shared again."""
    from bertlab.models.t5.params import t5_count

    config = tiny("v1.1", num_decoder_layers=2, dropout_rate=0.0, share_encoder_decoder=True)
    torch.manual_seed(3)
    ours = T5ForConditionalGeneration(config)
    unshared = T5ForConditionalGeneration(tiny("v1.1", num_decoder_layers=2, dropout_rate=0.0))
    d, inner, d_ff = config.d_model, config.inner_dim, config.d_ff
    per_decoder_layer = 4 * d * inner + d + 3 * d * d_ff + d  # self-attention + FFN with their norms
    assert ours.num_parameters() == t5_count(config) == unshared.num_parameters() - 2 * per_decoder_layer
    enc, dec = ours.encoder.block[1], ours.decoder.block[1]
    assert dec.layer[0].SelfAttention.q.weight is enc.layer[0].SelfAttention.q.weight
    assert dec.layer[-1] is enc.layer[-1] and dec.layer[1].EncDecAttention.q.weight is not enc.layer[0].SelfAttention.q.weight
    ids, mask, labels = padded_inputs()
    optimizer = torch.optim.SGD(ours.parameters(), lr=0.1)
    ours.train()
    ours(ids, attention_mask=mask, labels=labels).loss.backward()
    optimizer.step()
    assert dec.layer[0].SelfAttention.q.weight is enc.layer[0].SelfAttention.q.weight
    ours.eval()
    with torch.no_grad():
        expected = ours(ids, attention_mask=mask, labels=labels).logits
    theirs, info = hf_from(ours, tmp_path)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        got = theirs(input_ids=ids, attention_mask=mask, labels=labels).logits
    torch.testing.assert_close(got, expected, rtol=TOL, atol=TOL)
    again = T5ForConditionalGeneration.from_pretrained(tmp_path / "ours")
    assert again.config.share_encoder_decoder and again.num_parameters() == ours.num_parameters()
    with torch.no_grad():
        torch.testing.assert_close(again(ids, attention_mask=mask, labels=labels).logits, expected, rtol=0, atol=0)
    with pytest.raises(ConfigError, match="share_encoder_decoder"):
        tiny(share_encoder_decoder=True)  # 2 encoder layers, 3 decoder layers
