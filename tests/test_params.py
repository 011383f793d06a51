"""`bertlab params`: the paper's arithmetic equals our built model and Hugging Face's count."""

from __future__ import annotations

import json

import pytest
import torch

from bertlab import BertForPreTraining, BertModel, preset, preset_names
from bertlab.cli import main
from bertlab.models.bert.params import count, parameter_table

transformers = pytest.importorskip("transformers")


def hf_count(config, cls):
    with torch.device("meta"):  # counts shapes only: no memory for BERT-large
        model = cls(transformers.BertConfig(**config.to_dict()))
    return sum(p.numel() for p in model.parameters())  # tied weights are one parameter


@pytest.mark.parametrize("name", preset_names())
def test_matches_built_model_and_hugging_face(name):
    config = preset(name)
    with torch.device("meta"):
        ours, ours_pt = BertModel(config), BertForPreTraining(config)
    assert count(config) == ours.num_parameters() == hf_count(config, transformers.BertModel)
    assert count(config, with_heads=True) == ours_pt.num_parameters() == hf_count(config, transformers.BertForPreTraining)


def test_paper_sizes():
    assert round(count(preset("base")) / 1e6) == 109  # "BERT_BASE ... Total Parameters=110M"
    assert 108e6 < count(preset("base")) < 111e6
    assert 330e6 < count(preset("large")) < 345e6  # "BERT_LARGE ... Total Parameters=340M"


def test_rows_add_up():
    rows = dict(parameter_table(preset("base")))
    emb = sum(v for k, v in rows.items() if k.startswith("embeddings.") and k != "embeddings.total")
    assert emb == rows["embeddings.total"]
    assert rows["embeddings.total"] + rows["layers.total (x12)"] + rows["pooler"] == rows["total.encoder (BertModel)"]


def test_cli_table_and_json(capsys, tmp_path):
    assert main(["params", "base", "L2-H128"]) == 0
    out = capsys.readouterr().out
    assert "109,482,240" in out and "L2-H128" in out
    config_file = tmp_path / "config.json"
    config_file.write_text(preset("tiny").to_json_string())
    assert main(["params", str(config_file), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data[str(config_file)]["total.encoder (BertModel)"] == count(preset("tiny"))


def test_cli_bad_config_is_one_line(capsys, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({**preset("tiny").to_dict(), "hidden_size": 100, "num_attention_heads": 12}))
    assert main(["params", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "divisible" in err
