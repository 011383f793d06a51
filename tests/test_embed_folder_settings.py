"""A sentence-transformers folder's own settings are the commands' defaults, as sentence-transformers applies
them: `embed`, `serve`, `embed --ray`'s spec and `similarity` pool and normalise as the folder's pipeline does (a
model trained for dot products keeps its vectors' lengths), `similarity` scores with the folder's similarity
function, and `export sentence-transformers` keeps the folder's Normalize choice, prompts and similarity."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertlab.cli import main
from bertlab.infer.embeddings import l2_normalize, model_normalize, resolve_normalize

from infer_support import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["what is the capital of france ?", "john lives in london , works for acme corp .", "a dog",
         "the cat sat on the mat"]
QUERY_PROMPT = "query: "


def st_model(tmp_path, pooling: str, normalize: bool, similarity: str, name: str = "st"):
    """A folder saved by sentence-transformers: Transformer -> Pooling(`pooling`) [-> Normalize], a query
    prompt and `similarity` as its similarity function."""
    st = pytest.importorskip("sentence_transformers")
    try:
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling
    except ImportError:  # before 6.0
        from sentence_transformers.models import Normalize, Pooling
    base = tiny_model(tmp_path / f"{name}-base", seed=5)
    plain = st.SentenceTransformer(str(base), device="cpu")
    modules = [plain[0], Pooling(32, pooling_mode=pooling)] + ([Normalize()] if normalize else [])
    model = st.SentenceTransformer(modules=modules, device="cpu", prompts={"query": QUERY_PROMPT},
                                   similarity_fn_name=similarity)
    model.save(str(tmp_path / name))
    return tmp_path / name, model


def embed_cli(folder, tmp_path, capsys, *flags) -> np.ndarray:
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    capsys.readouterr()
    assert main(["embed", "--model", str(folder), "--input", str(tmp_path / "in.txt"), *flags]) == 0
    return np.array([json.loads(line) for line in capsys.readouterr().out.splitlines()], dtype=np.float32)


def test_a_dot_product_folder_is_embedded_and_scored_as_sentence_transformers_does(tmp_path, capsys):
    folder, model = st_model(tmp_path, "cls", normalize=False, similarity="dot")
    theirs = model.encode(TEXTS)
    assert np.abs(np.linalg.norm(theirs, axis=-1) - 1).max() > 0.1  # lengths a normalisation would lose
    assert model_normalize(folder) is False and resolve_normalize(folder, None) is False
    np.testing.assert_allclose(embed_cli(folder, tmp_path, capsys), theirs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(embed_cli(folder, tmp_path, capsys, "--normalize"), l2_normalize(theirs),
                               rtol=1e-5, atol=1e-6)
    # similarity: its pooling (CLS, not the mean), its lengths and its dot product
    capsys.readouterr()
    assert main(["similarity", "--model", str(folder), TEXTS[0], TEXTS[1]]) == 0
    score = float(capsys.readouterr().out)
    expected = float(model.similarity(model.encode([TEXTS[0]]), model.encode([TEXTS[1]]))[0, 0])
    assert abs(expected) > 1.5  # not a cosine
    assert score == pytest.approx(expected, rel=1e-5)


def test_a_normalising_cls_folder_is_scored_by_its_own_pooling(tmp_path, capsys):
    folder, model = st_model(tmp_path, "cls", normalize=True, similarity="cosine")
    assert model_normalize(folder) is True
    capsys.readouterr()
    assert main(["similarity", "--model", str(folder), TEXTS[2], TEXTS[3]]) == 0
    expected = float(model.similarity(model.encode([TEXTS[2]]), model.encode([TEXTS[3]]))[0, 0])
    assert float(capsys.readouterr().out) == pytest.approx(expected, abs=2e-6)


def test_a_folder_without_modules_json_is_normalised(tmp_path, capsys):
    folder = tiny_model(tmp_path / "plain", seed=5)
    assert model_normalize(folder) is None and resolve_normalize(folder, None) is True
    assert resolve_normalize(folder, False) is False
    vectors = embed_cli(folder, tmp_path, capsys)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=-1), 1, atol=1e-5)


def test_serve_and_the_ray_spec_take_the_folder_s_normalisation(tmp_path):
    from bertlab.infer.ray_data import EmbedSpec
    from bertlab.infer.runtime import InferenceOptions
    from bertlab.infer.serve.service import load_models

    folder, _ = st_model(tmp_path, "mean", normalize=False, similarity="dot")
    options = InferenceOptions(threads=1)
    assert load_models(folder, options).embedder.normalize is False
    assert load_models(folder, options, normalize=True).embedder.normalize is True
    assert EmbedSpec.resolve(folder, None, None, options, None).normalize is False
    assert EmbedSpec.resolve(tiny_model(tmp_path / "plain", seed=5), None, None, options, None).normalize is True


def test_the_export_keeps_what_the_folder_says(tmp_path):
    st = pytest.importorskip("sentence_transformers")
    folder, model = st_model(tmp_path, "max", normalize=False, similarity="dot")
    out = tmp_path / "exported"
    assert main(["export", "sentence-transformers", "--model", str(folder), "--out", str(out)]) == 0
    again = st.SentenceTransformer(str(out), device="cpu")
    assert [type(m).__name__ for m in again] == ["Transformer", "Pooling"]
    assert again.similarity_fn_name == "dot" and again.prompts.get("query") == QUERY_PROMPT
    for kwargs in ({}, {"prompt_name": "query"}):
        np.testing.assert_allclose(again.encode(TEXTS, **kwargs), model.encode(TEXTS, **kwargs), rtol=1e-5,
                                   atol=1e-6)
    normalised = tmp_path / "normalised"
    assert main(["export", "sentence-transformers", "--model", str(folder), "--out", str(normalised),
                 "--normalize"]) == 0
    np.testing.assert_allclose(st.SentenceTransformer(str(normalised), device="cpu").encode(TEXTS),
                               l2_normalize(model.encode(TEXTS)), rtol=1e-5, atol=1e-6)


def test_refusals_in_one_line(tmp_path, capsys):
    from test_retrieval_colbert import colbert_folder

    folder, _ = st_model(tmp_path, "mean", normalize=True, similarity="euclidean")
    capsys.readouterr()
    assert main(["similarity", "--model", str(folder), "a", "b"]) == 2
    err = capsys.readouterr().err.strip()
    assert "similarity_fn_name 'euclidean'" in err and len(err.splitlines()) == 1
    assert main(["export", "sentence-transformers", "--model", str(folder), "--out", str(tmp_path / "x")]) == 2
    assert "similarity_fn_name 'euclidean'" in capsys.readouterr().err and not (tmp_path / "x").exists()
    colbert, _ = colbert_folder(tmp_path)
    assert main(["similarity", "--model", str(colbert), "a", "b"]) == 2
    err = capsys.readouterr().err.strip()
    assert "MaxSim" in err and len(err.splitlines()) == 1
    assert main(["export", "onnx", "--model", str(folder), "--out", str(tmp_path / "o"), "--normalize"]) == 2
    assert "options of the sentence-transformers export" in capsys.readouterr().err
