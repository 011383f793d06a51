"""BertConfig reads Google's and Hugging Face's files as they are and rejects bad ones in one line."""

from __future__ import annotations

import json

import pytest

from bertlab import BertConfig, ConfigError, preset, preset_names

GOOGLE_BASE = {  # bert_config.json of Google's uncased_L-12_H-768_A-12 release, verbatim
    "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768,
    "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 512,
    "num_attention_heads": 12, "num_hidden_layers": 12, "type_vocab_size": 2, "vocab_size": 30522,
}


def test_reads_google_config(tmp_path):
    (tmp_path / "bert_config.json").write_text(json.dumps(GOOGLE_BASE))
    config = BertConfig.from_json_file(tmp_path)  # a folder with only bert_config.json
    assert config == preset("base")
    assert config.layer_norm_eps == 1e-12 and config.pad_token_id == 0


def test_reads_hf_config_and_keeps_extra_fields(minilm_dir, tmp_path):
    config = BertConfig.from_json_file(minilm_dir / "config.json")
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (6, 384, 12)
    assert config.extra["model_type"] == "bert" and "transformers_version" in config.extra
    again = BertConfig.from_dict(json.loads(config.to_json_string()))
    assert again == config and again.extra == config.extra


def test_labels_round_trip():
    config = preset("tiny", id2label={0: "neg", 1: "neu", 2: "pos"})
    data = config.to_dict()
    assert data["label2id"] == {"neg": 0, "neu": 1, "pos": 2}
    assert BertConfig.from_dict(json.loads(json.dumps(data))).id2label == {0: "neg", 1: "neu", 2: "pos"}
    assert BertConfig.from_dict({**GOOGLE_BASE, "num_labels": 5}).num_labels == 5


@pytest.mark.parametrize("change, message", [
    ({"hidden_size": 100, "num_attention_heads": 12}, "'hidden_size' (100) must be divisible by 'num_attention_heads' (12)"),
    ({"hidden_size": "768"}, "field 'hidden_size' must be an integer, got str '768'"),
    ({"num_hidden_layers": True}, "field 'num_hidden_layers' must be an integer"),
    ({"hidden_dropout_prob": "0.1"}, "field 'hidden_dropout_prob' must be a number"),
    ({"hidden_act": "mish"}, "field 'hidden_act' is 'mish'"),
    ({"vocab_size": 0}, "field 'vocab_size' must be between 1 and"),
    ({"position_embedding_type": "relative_key"}, "field 'position_embedding_type'"),
])
def test_bad_fields_are_one_line_errors(tmp_path, change, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**GOOGLE_BASE, **change}))
    with pytest.raises(ConfigError) as e:
        BertConfig.from_json_file(path)
    assert message in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_missing_required_field(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in GOOGLE_BASE.items() if k != "num_attention_heads"}))
    with pytest.raises(ConfigError, match="missing required field 'num_attention_heads'"):
        BertConfig.from_json_file(path)


def test_invalid_json_names_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n "hidden_size": 768,\n oops\n}')
    with pytest.raises(ConfigError, match=r"config.json: line 3: not valid JSON"):
        BertConfig.from_json_file(path)


def test_constructor_validates():
    with pytest.raises(ConfigError, match="divisible"):
        BertConfig(hidden_size=100, num_attention_heads=12)


def test_presets():
    names = preset_names()
    assert len([n for n in names if n.startswith("L")]) == 24
    for name in names:
        c = preset(name)
        assert c.intermediate_size == 4 * c.hidden_size
        assert c.head_size == 64 or name == "tiny" or name.startswith(("mini", "small", "medium"))
    assert (preset("L4-H256").num_hidden_layers, preset("L4-H256").num_attention_heads) == (4, 4)
    assert preset("tiny").num_hidden_layers == 2 and preset("tiny").hidden_size == 128
    assert preset("mini") == preset("L4-H256") and preset("small") == preset("L4-H512")
    assert preset("medium") == preset("L8-H512") and preset("base") == preset("L12-H768")
    large = preset("large")
    assert (large.num_hidden_layers, large.hidden_size, large.num_attention_heads) == (24, 1024, 16)
    with pytest.raises(ConfigError, match="unknown preset"):
        preset("L3-H128")
    with pytest.raises(ConfigError, match="neither a preset"):
        BertConfig.from_name_or_path("no/such/config.json")
