"""DeBERTa-v2/v3 against `transformers`: random-weight models of every head class made by `transformers` load in
bertlab (strict keys) and give the same hidden states and logits (relative error <= 1e-6 in fp32) on padded
batches with token types, for a v3-like config (256 log buckets, shared position keys, LayerNorm'd relative
table, c2p and p2c), a v2-like one (no buckets, k = 8, separate position projections, absolute positions, the
convolution, factorised embeddings) and c2p alone; inputs longer than the buckets and than k; bertlab's saves load
back in `transformers` with the same logits; the log buckets equal `transformers`' on every distance."""

from __future__ import annotations

import json

import pytest
import torch

from family_support import both_ways, compare_hidden_states, padded_batch

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

TOL = 1e-6
HEAD_CLASSES = ("DebertaV2Model", "DebertaV2ForMaskedLM", "DebertaV2ForSequenceClassification",
                "DebertaV2ForTokenClassification", "DebertaV2ForQuestionAnswering", "DebertaV2ForMultipleChoice")
CONFIGS = {
    "v3": dict(relative_attention=True, position_buckets=256, max_relative_positions=-1, pos_att_type="p2c|c2p",
               share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0,
               max_position_embeddings=512),
    "v2": dict(relative_attention=True, position_buckets=-1, max_relative_positions=8, pos_att_type=["c2p", "p2c"],
               share_att_key=False, position_biased_input=True, type_vocab_size=2, conv_kernel_size=3,
               conv_act="gelu", embedding_size=24, max_position_embeddings=64),
    "c2p-only": dict(relative_attention=True, position_buckets=16, max_relative_positions=40, pos_att_type=["c2p"],
                     share_att_key=False, norm_rel_ebd="layer_norm", position_biased_input=False,
                     type_vocab_size=0, max_position_embeddings=64, legacy=False),
}


def hf_config(kind: str, **overrides):
    fields = dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
                  num_labels=2, **CONFIGS[kind])
    fields.update(overrides)
    return transformers.DebertaV2Config(**fields)


def ours_class(name: str):
    import bertlab.models.deberta_v2.heads as heads
    import bertlab.models.deberta_v2.modeling as modeling

    return getattr(heads, name, None) or getattr(modeling, name)


@pytest.mark.parametrize("kind", [k for k in CONFIGS if k != "v3"])  # (v3: the family harness, tests/test_families.py)
@pytest.mark.parametrize("name", HEAD_CLASSES)
def test_transformers_weights_give_the_same_outputs_both_ways(name, kind, tmp_path):
    torch.manual_seed(0)
    assert both_ways(getattr(transformers, name)(hf_config(kind)), ours_class(name), tmp_path) <= TOL


@pytest.mark.parametrize("kind", ["v3", "v2"])
def test_every_layers_hidden_states_match_beyond_the_buckets(kind, tmp_path):
    """300 tokens: past v3's 256 buckets (and their half, where the log buckets begin) and v2's k = 8;
    padded rows of several lengths."""
    from bertlab.models.deberta_v2.modeling import DebertaV2Model

    T = 300 if kind == "v3" else 60
    torch.manual_seed(0)
    transformers.DebertaV2Model(hf_config(kind)).save_pretrained(tmp_path)
    ids, mask = padded_batch(99, shape=(3, T))
    mask[1, T - 37:] = 0
    ids[mask == 0] = 0
    assert compare_hidden_states(transformers.DebertaV2Model.from_pretrained(tmp_path),
                                 DebertaV2Model.from_pretrained(tmp_path), ids, mask) <= TOL


def test_log_buckets_are_transformers_on_every_distance():
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    from bertlab.models.deberta_v2.modeling import log_bucket_positions

    distances = torch.arange(-3000, 3001)
    for buckets, reach in ((256, 512), (16, 40), (64, 2048)):
        assert torch.equal(log_bucket_positions(distances, buckets, reach),
                           make_log_bucket_position(distances, buckets, reach).long())


def test_the_masked_lm_head_trains_on_masked_rows_only(tmp_path):
    """With labels the loss is cross-entropy over the labelled rows, as transformers' over all (-100 ignored)."""
    from bertlab.models.deberta_v2.heads import DebertaV2ForMaskedLM

    torch.manual_seed(0)
    hf = transformers.DebertaV2ForMaskedLM(hf_config("v3")).eval()
    hf.save_pretrained(tmp_path)
    ours = DebertaV2ForMaskedLM.from_pretrained(tmp_path)
    ids, mask = padded_batch(99)
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[1, 5] = 7, 11
    with torch.no_grad():
        a = hf(input_ids=ids, attention_mask=mask, labels=labels).loss
        b = ours(ids, mask, labels=labels).loss
    assert abs(a.item() - b.item()) <= 1e-6 * abs(a.item())


def test_bad_config_is_one_line(tmp_path):
    from bertlab.core.errors import ConfigError
    from bertlab.models.deberta_v2.config import DebertaV2Config

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "deberta-v2", "pos_att_type": "p2c|x2y"}))
    with pytest.raises(ConfigError, match="field 'pos_att_type' must be a list of 'c2p' / 'p2c'"):
        DebertaV2Config.from_json_file(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "deberta-v2", "relative_attention": True,
                                                      "position_buckets": 256, "max_relative_positions": 100}))
    with pytest.raises(ConfigError, match="must exceed half of 'position_buckets'"):
        DebertaV2Config.from_json_file(tmp_path)


def test_params_match_the_built_models_and_transformers(tmp_path, capsys):
    from bertlab.cli import main
    from bertlab.models.deberta_v2.config import DebertaV2Config
    from bertlab.models.deberta_v2.heads import DebertaV2ForMaskedLM
    from bertlab.models.deberta_v2.modeling import DebertaV2Model
    from bertlab.models.deberta_v2.params import deberta_parameter_table

    for kind in CONFIGS:
        hf = hf_config(kind)
        (tmp_path / "config.json").write_text(hf.to_json_string())
        config = DebertaV2Config.from_json_file(tmp_path)
        rows = dict(deberta_parameter_table(config))
        with torch.device("meta"):
            built = (DebertaV2Model(config).num_parameters(), DebertaV2ForMaskedLM(config).num_parameters())
            theirs = tuple(sum(p.numel() for p in m.parameters())
                           for m in (transformers.DebertaV2Model(hf), transformers.DebertaV2ForMaskedLM(hf)))
        assert (rows["total.encoder (DebertaV2Model)"], rows["total.masked_lm (DebertaV2ForMaskedLM)"]) == built \
            == theirs, kind
    assert main(["params", str(tmp_path / "config.json"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[str(tmp_path / "config.json")] == rows
    # DeBERTa-v3-base: its model card's "86M backbone + 98M embedding", 184M
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "deberta-v2", "hidden_size": 768, "num_attention_heads": 12, "num_hidden_layers": 12,
        "intermediate_size": 3072, "relative_attention": True, "position_buckets": 256, "norm_rel_ebd": "layer_norm",
        "share_att_key": True, "pos_att_type": "p2c|c2p", "position_biased_input": False, "type_vocab_size": 0,
        "max_relative_positions": -1, "vocab_size": 128100}))
    rows = dict(deberta_parameter_table(DebertaV2Config.from_json_file(tmp_path)))
    assert round(rows["embeddings.word"] / 1e6) == 98
    assert round((rows["total.encoder (DebertaV2Model)"] - rows["embeddings.word"]) / 1e5) == 855  # "86M"
    assert round(rows["total.encoder (DebertaV2Model)"] / 1e6) == 184
