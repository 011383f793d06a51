"""Feature-based NER: the strategies' layers, the feature cache (computed once, reused), the BiLSTM tagger
end to end on a tiny CoNLL folder."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertlab.cli import main
from bertlab.core.errors import ConfigError
from bertlab.train.feature_ner import (STRATEGIES, FeatureNerConfig, WordFeatures, prepare_data,
                                       strategy_layers, train_feature_ner)
from bertlab.infer.features import FeatureExtractor

from infer_support import tiny_model

CONLL = """-DOCSTART- -X- -X- O

John NNP B-NP B-PER
lives VBZ B-VP O
in IN B-PP O
London NNP B-NP B-LOC
. . O O

the DT B-NP O
cat NN I-NP O
sat VBD B-VP O

Paris NNP B-NP B-LOC
is VBZ B-VP O
big JJ B-ADJP O
, , O O
Acme NNP B-NP B-ORG
Corp NNP I-NP I-ORG
works VBZ B-VP O
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("fner")
    model = tiny_model(root / "model", num_hidden_layers=4)
    data = root / "conll"
    data.mkdir()
    (data / "train.txt").write_text(CONLL * 3)
    (data / "valid.txt").write_text(CONLL)
    return model, data, root


def test_strategies_are_table_7():
    assert list(STRATEGIES) == ["embeddings", "second-to-last", "last", "sum-last-4", "concat-last-4", "sum-all"]
    assert {s: strategy_layers(s, 12) for s in STRATEGIES} == {
        "embeddings": [0], "second-to-last": [11], "last": [12], "sum-last-4": [9, 10, 11, 12],
        "concat-last-4": [9, 10, 11, 12], "sum-all": list(range(1, 13))}
    with pytest.raises(ConfigError, match="unknown feature strategy"):
        strategy_layers("nope", 12)
    with pytest.raises(ConfigError, match="needs at least 4 layers"):
        strategy_layers("sum-last-4", 2)


def test_cache_computes_each_layer_once_and_matches_the_extractor(setup, tmp_path):
    model, data, _ = setup
    cfg = FeatureNerConfig(model=str(model), data=str(data), out=None, cache_dir=str(tmp_path))
    nd = prepare_data(cfg)
    calls = []
    inner = nd.cache.factory
    nd.cache.factory = lambda layers: calls.append(list(layers)) or inner(layers)
    words = [s.words for s in nd.dev]
    layers, offsets = nd.cache.get(words, [3, 4])
    nd.cache.get(words, [4, 3])  # cached
    nd.cache.get(words, [2, 3, 4])  # only layer 2 is new
    assert calls == [[3, 4], [2]]
    assert offsets.tolist() == [0, 5, 8, 15]
    direct = list(FeatureExtractor.from_pretrained(model, [3, 4], "first").extract([list(w) for w in words], True))
    concat = WordFeatures(layers, offsets, "concat")
    for i, (_, _, feats) in enumerate(direct):
        x, _ = concat[i]
        np.testing.assert_allclose(x.numpy(), np.concatenate([feats[:, 0], feats[:, 1]], -1), atol=2e-2, rtol=1e-3)
    summed, _ = WordFeatures(layers, offsets, "sum")[0]
    np.testing.assert_allclose(summed.numpy(), direct[0][2].sum(1), atol=2e-2, rtol=1e-3)


def test_train_feature_ner_end_to_end(setup, tmp_path):
    model, data, _ = setup
    cfg = FeatureNerConfig(model=str(model), data=str(data), out=str(tmp_path / "out"), strategy="concat-last-4",
                           epochs=3, lstm_hidden=16, cache_dir=str(tmp_path / "cache"), batch_size=4)
    metrics = train_feature_ner(cfg)
    assert metrics["input_dim"] == 4 * 32 and metrics["layers"] == [1, 2, 3, 4]
    assert 0.0 <= metrics["dev"]["f1"] <= 1.0 and metrics["train_sentences"] == 9 and metrics["dev_words"] == 15
    out = tmp_path / "out"
    assert json.loads((out / "metrics.json").read_text())["strategy"] == "concat-last-4"
    lines = [l for l in (out / "dev_predictions.txt").read_text().splitlines() if l]
    assert len(lines) == 15 and lines[0].split()[:2] == ["John", "B-PER"]
    assert (out / "tagger.safetensors").exists() and json.loads((out / "tagger.json").read_text())["hidden"] == 16


def test_finetune_features_command(setup, tmp_path, capsys, monkeypatch):
    model, data, _ = setup
    monkeypatch.setenv("BERTLAB_CACHE", str(tmp_path / "cache"))
    assert main(["finetune-features", "conll2003", "--strategy", "embeddings", "--model", str(model), "--data",
                 str(data), "--out", str(tmp_path / "o"), "--epochs", "1", "--batch-size", "8"]) == 0
    assert json.loads(capsys.readouterr().out)["strategy"] == "embeddings"
    assert list((tmp_path / "cache" / "features").iterdir())
    assert main(["finetune-features", "sst2", "--strategy", "last", "--model", str(model), "--data", str(data),
                 "--out", str(tmp_path / "o2")]) == 2
    assert "needs a token-classification task" in capsys.readouterr().err


