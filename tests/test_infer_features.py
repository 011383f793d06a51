"""`features`: hidden states of chosen layers equal transformers' `output_hidden_states`, word alignment,
and the JSON Lines / .npy / safetensors outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertlab.cli import main
from bertlab.core.errors import BertlabError
from bertlab.infer.features import FeatureExtractor, parse_layers
from bertlab.infer.runtime import InferenceOptions

from infer_support import tiny_model

transformers = pytest.importorskip("transformers")

TEXTS = ["the cat sat on the mat .", "who lives in london ?", "a", "paris is the capital of france , john said ."]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("features") / "model")


def hf_hidden_states(model_dir, tokenizer, text):
    hf = transformers.BertModel.from_pretrained(str(model_dir)).eval()
    enc = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        return hf(input_ids=enc["input_ids"], output_hidden_states=True).hidden_states


@pytest.mark.parametrize("layers", ["-1,-2,-3,-4", "0,2", "-1"])
def test_features_equal_transformers_hidden_states(tiny_dir, layers):
    ex = FeatureExtractor.from_pretrained(tiny_dir, layers, options=InferenceOptions(max_tokens=64))
    hf = transformers.BertModel.from_pretrained(str(tiny_dir)).eval()
    got = list(ex.extract(TEXTS))
    assert [g[0] for g in got] == list(range(len(TEXTS)))
    for (_, tokens, feats), text in zip(got, TEXTS):
        enc = ex.tokenizer(text, return_tensors="pt")
        assert tokens == ex.tokenizer.convert_ids_to_tokens(enc["input_ids"][0].tolist())
        with torch.no_grad():
            states = hf(input_ids=enc["input_ids"], output_hidden_states=True).hidden_states
        expected = torch.stack([states[layer][0] for layer in parse_layers(layers, 3)], dim=1)
        np.testing.assert_allclose(feats, expected.numpy(), atol=1e-5)


def test_features_equal_transformers_on_minilm(minilm_dir):
    ex = FeatureExtractor.from_pretrained(minilm_dir, "-1,-2,-3,-4,0")
    hf = transformers.BertModel.from_pretrained(str(minilm_dir), attn_implementation="eager").eval()
    texts = ["The quick brown fox jumps over the lazy dog.", "Short one.", "BERT features, extracted."]
    enc = ex.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        states = hf(**{k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")},
                    output_hidden_states=True).hidden_states
    for i, (_, _, feats) in enumerate(ex.extract(texts)):
        n = int(enc["attention_mask"][i].sum())
        expected = torch.stack([states[layer][i, :n] for layer in (-1, -2, -3, -4, 0)], dim=1)
        np.testing.assert_allclose(feats, expected.numpy(), atol=1e-4)


def test_word_alignment_first_and_mean(tiny_dir):
    words = [["johnx", "lives", "in", "londonzz"], ["a"]]  # "johnx" and "londonzz" are several pieces
    token = FeatureExtractor.from_pretrained(tiny_dir, "-1,1", "token")
    first = FeatureExtractor.from_pretrained(tiny_dir, "-1,1", "first")
    mean = FeatureExtractor.from_pretrained(tiny_dir, "-1,1", "mean")
    for (_, _, t), (_, fw, f), (_, mw, m), ws in zip(token.extract(words, True), first.extract(words, True),
                                                     mean.extract(words, True), words):
        assert fw == mw == ws and f.shape == m.shape == (len(ws), 2, 32)
        enc = token.tokenizer(ws, is_split_into_words=True)
        wid = enc.word_ids()
        for w in range(len(ws)):
            pos = [p for p, x in enumerate(wid) if x == w]
            np.testing.assert_allclose(f[w], t[pos[0]], atol=1e-6)
            np.testing.assert_allclose(m[w], t[pos].mean(0), atol=1e-6)


def test_words_of_raw_text_come_from_offsets(tiny_dir):
    ex = FeatureExtractor.from_pretrained(tiny_dir, "-1", "first")
    (_, words, feats), = ex.extract(["John's  cat,  Paris!"])
    assert words == ["John", "'", "s", "cat", ",", "Paris", "!"] and feats.shape == (7, 1, 32)


def test_layer_errors(tiny_dir):
    assert parse_layers("-1,-2", 3) == [-1, -2] and parse_layers([0, 3, -4], 3) == [0, 3, -4]
    for bad in ("4", "-5", "a,b", ""):
        with pytest.raises(BertlabError):
            parse_layers(bad, 3)


def test_features_cli_formats(tiny_dir, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("the cat sat\nwho ||| lives in london\n", encoding="utf-8")
    jl = tmp_path / "f.jsonl"
    assert main(["features", "--model", str(tiny_dir), "--layers", "-1,-2", "--input", str(src),
                 "--output", str(jl)]) == 0
    rows = [json.loads(line) for line in jl.read_text().splitlines()]
    assert rows[0]["linex_index"] == 0
    assert [f["token"] for f in rows[0]["features"]] == ["[CLS]", "the", "cat", "sat", "[SEP]"]
    assert [f["token"] for f in rows[1]["features"]] == ["[CLS]", "who", "[SEP]", "lives", "in", "london", "[SEP]"]
    assert [l["index"] for l in rows[0]["features"][0]["layers"]] == [-1, -2]
    for suffix in ("npy", "safetensors"):
        out = tmp_path / f"f.{suffix}"
        assert main(["features", "--model", str(tiny_dir), "--layers", "-1,-2", "--input", str(src),
                     "--output", str(out)]) == 0
        if suffix == "npy":
            feats, offsets = np.load(out), np.load(tmp_path / "f.offsets.npy")
        else:
            from safetensors.numpy import load_file

            data = load_file(str(out))
            feats, offsets = data["features"], data["offsets"]
        assert offsets.tolist() == [0, 5, 12] and feats.shape == (12, 2, 32)
        np.testing.assert_allclose(feats[5:12, 0, :3], [f["layers"][0]["values"][:3] for f in rows[1]["features"]],
                                   atol=1e-5)
    words = tmp_path / "words.txt"
    words.write_text("John lives in London\n", encoding="utf-8")
    assert main(["features", "--model", str(tiny_dir), "--layers=-1", "--words", "--align", "mean",
                 "--input", str(words), "--output", str(jl)]) == 0
    assert [f["word"] for f in json.loads(jl.read_text())["features"]] == ["John", "lives", "in", "London"]
