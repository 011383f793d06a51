"""Peer engines (`--engine onnxruntime|openvino|ctranslate2`): each refuses in one line when its package is missing
or it does not run the precision asked for; where installed, its export is checked and gives bertlab's outputs
through the same embed / predict API."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from bertlab.cli import main
from bertlab.core.errors import BertlabError
from bertlab.infer import runtime
from bertlab.infer.embeddings import Embedder
from bertlab.infer.runtime import InferenceOptions

from infer_support import tiny_model

TEXTS = ["the cat sat on the mat", "paris is the capital of france", "who lives in london ?", "a dog"]


def installed(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


@pytest.mark.parametrize("engine", ["onnxruntime", "openvino", "ctranslate2"])
def test_engine_refuses_in_one_line_when_its_package_is_missing(engine, monkeypatch, tmp_path, capsys):
    real = importlib.util.find_spec
    missing = runtime.PACKAGES[engine][0]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == missing else real(name, *a))
    with pytest.raises(BertlabError, match=rf"--engine {engine} needs the {missing} package: pip install"):
        InferenceOptions(engine=engine)
    folder = tiny_model(tmp_path / "m")
    (tmp_path / "in.txt").write_text("the cat\n")
    assert main(["embed", "--model", str(folder), "--engine", engine, "--input", str(tmp_path / "in.txt")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"needs the {missing} package" in err[0] and "Traceback" not in err[0]


def test_engine_refuses_a_precision_it_does_not_run():
    if not installed("openvino"):
        pytest.skip("openvino is not installed")
    with pytest.raises(BertlabError, match="--engine openvino runs --dtype fp32 or bf16, not int8"):
        InferenceOptions(engine="openvino", dtype="int8")
    with pytest.raises(BertlabError, match="unknown engine"):
        runtime.require_engine("tensorrt")


ENGINE_CASES = [("onnxruntime", "fp32", 1e-5), ("onnxruntime", "int8", 0.95),
                ("openvino", "fp32", 1e-5), ("ctranslate2", "fp32", 1e-5), ("ctranslate2", "int8", 0.97)]


@pytest.mark.slow
@pytest.mark.parametrize("engine,dtype,bound", ENGINE_CASES)
def test_engine_embeddings_match_bertlab(engine, dtype, bound, tmp_path):
    """Converted on load from a bertlab folder; fp32 within 1e-5 in cosine, int8 above its stated bound."""
    if not installed(*runtime.PACKAGES[engine], "onnx" if engine != "ctranslate2" else "transformers"):
        pytest.skip(f"{engine} is not installed")
    folder = tiny_model(tmp_path / "m")
    ours = Embedder.from_pretrained(folder, options=InferenceOptions(max_seq_length=64), window_overlap=4)
    theirs = Embedder.from_pretrained(folder, options=InferenceOptions(engine=engine, dtype=dtype, max_seq_length=64),
                                      window_overlap=4)
    texts = TEXTS + [" ".join(["the cat sat on the mat"] * 20)]  # the last one over the limit: windows
    a, b = ours.embed(texts), theirs.embed(texts)
    cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    assert (cos.min() > 1 - bound) if dtype == "fp32" else (cos.min() > bound)


@pytest.mark.parametrize("engine", ["onnx", "openvino", "ctranslate2"])
def test_export_folder_runs_with_its_engine(engine, tmp_path, capsys):
    engine_name = {"onnx": "onnxruntime"}.get(engine, engine)
    if not installed(*runtime.PACKAGES[engine_name], "onnx" if engine != "ctranslate2" else "transformers"):
        pytest.skip(f"{engine_name} is not installed")
    folder = tiny_model(tmp_path / "m")
    assert main(["export", engine, "--model", str(folder), "--out", str(tmp_path / "x")]) == 0
    assert "max_abs_diff_vs_pytorch" in capsys.readouterr().out
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    for name, extra in (("ref", []), ("eng", ["--engine", engine_name])):
        model = folder if name == "ref" else tmp_path / "x"
        assert main(["embed", "--model", str(model), "--input", str(tmp_path / "in.txt"), "--output",
                     str(tmp_path / f"{name}.npy"), *extra]) == 0
    assert (np.load(tmp_path / "ref.npy") * np.load(tmp_path / "eng.npy")).sum(-1).min() > 1 - 1e-5
    if engine == "onnx":  # exported without --quantize int8: int8 asked of it is one line, not a failed conversion
        with pytest.raises(BertlabError, match="no model_int8.onnx; export it with"):
            Embedder.from_pretrained(tmp_path / "x", options=InferenceOptions(engine="onnxruntime", dtype="int8"))


@pytest.mark.slow
def test_predict_with_onnxruntime_matches_bertlab(tmp_path):
    if not installed("onnxruntime", "onnx"):
        pytest.skip("onnxruntime is not installed")
    from bertlab.infer.predict import Predictor

    folder = tiny_model(tmp_path / "clf", "BertForSequenceClassification", id2label={0: "neg", 1: "pos", 2: "mixed"})
    ours = Predictor.from_pretrained(folder).predict(TEXTS)
    theirs = Predictor.from_pretrained(folder, InferenceOptions(engine="onnxruntime")).predict(TEXTS)
    assert [o["label"] for o in ours] == [t["label"] for t in theirs]
    np.testing.assert_allclose([o["score"] for o in ours], [t["score"] for t in theirs], atol=1e-5)
    qa = tiny_model(tmp_path / "qa", "BertForQuestionAnswering")  # start and end logits: one stacked output
    items = [{"question": "who lives in london ?", "context": "john lives in london . he works for acme corp ."}]
    ours = Predictor.from_pretrained(qa).predict(items)
    theirs = Predictor.from_pretrained(qa, InferenceOptions(engine="onnxruntime")).predict(items)
    assert ours[0]["answer"] == theirs[0]["answer"] and abs(ours[0]["score"] - theirs[0]["score"]) < 1e-4


def test_ctranslate2_refuses_task_heads_and_embed_refuses_a_head_folder(tmp_path):
    if not installed("ctranslate2", "onnxruntime", "onnx"):
        pytest.skip("ctranslate2 or onnxruntime is not installed")
    from bertlab.infer.predict import Predictor

    folder = tiny_model(tmp_path / "clf", "BertForSequenceClassification")
    with pytest.raises(BertlabError, match="ctranslate2 runs encoders only"):
        Predictor.from_pretrained(folder, InferenceOptions(engine="ctranslate2"))
    with pytest.raises(BertlabError, match="not its encoder alone"):
        Embedder.from_pretrained(folder, options=InferenceOptions(engine="onnxruntime"))


def test_serve_loads_an_encoder_on_an_engine_and_refuses_a_task_model(tmp_path):
    if not installed("onnxruntime", "onnx", "fastapi"):
        pytest.skip("onnxruntime or the service's packages are not installed")
    from bertlab.infer.serve import load_models

    folder = tiny_model(tmp_path / "m", "BertForMaskedLM")  # the MLM head is not served on a peer engine
    ours = load_models(folder, InferenceOptions()).embedder.embed(TEXTS)
    models = load_models(folder, InferenceOptions(engine="onnxruntime"))
    assert models.fill_masker is None
    assert (ours * models.embedder.embed(TEXTS)).sum(-1).min() > 1 - 1e-5
    clf = tiny_model(tmp_path / "clf", "BertForSequenceClassification")
    with pytest.raises(BertlabError, match="serves the embedding routes from an encoder folder"):
        load_models(clf, InferenceOptions(engine="onnxruntime"))
