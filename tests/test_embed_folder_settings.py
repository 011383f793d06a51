"""A sentence-transformers folder's own settings are the commands' defaults, as sentence-transformers applies
them: `embed`, `serve`, `embed --ray`'s spec and `similarity` pool and normalise as the folder's pipeline does (a
model trained for dot products keeps its vectors' lengths) and put its prompts before the texts as `encode`,
`encode_query` and `encode_document` do; `similarity`, `evaluate-retrieval` and `mine-negatives` rank by the
folder's similarity function; `export sentence-transformers` keeps the folder's Normalize choice, prompts and
similarity."""

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


def st_model(tmp_path, pooling: str, normalize: bool, similarity: str, name: str = "st", prompts=None,
             default_prompt_name=None):
    """A folder saved by sentence-transformers: Transformer -> Pooling(`pooling`) [-> Normalize], `prompts`
    (a query prompt when not given) and `similarity` as its similarity function."""
    st = pytest.importorskip("sentence_transformers")
    try:
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling
    except ImportError:  # before 6.0
        from sentence_transformers.models import Normalize, Pooling
    base = tiny_model(tmp_path / f"{name}-base", seed=5)
    plain = st.SentenceTransformer(str(base), device="cpu")
    modules = [plain[0], Pooling(32, pooling_mode=pooling)] + ([Normalize()] if normalize else [])
    model = st.SentenceTransformer(modules=modules, device="cpu", prompts=prompts or {"query": QUERY_PROMPT},
                                   default_prompt_name=default_prompt_name, similarity_fn_name=similarity)
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
    prompted = EmbedSpec.resolve(folder, None, None, options, None, prompt=QUERY_PROMPT)
    plain = EmbedSpec.resolve(folder, None, None, options, None)
    assert prompted.tokenize(["a dog"]) == plain.tokenize([QUERY_PROMPT + "a dog"]) != plain.tokenize(["a dog"])


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
    # its vectors are embedded and exported as they are; only ranking by a distance is refused
    assert main(["export", "sentence-transformers", "--model", str(folder), "--out", str(tmp_path / "x")]) == 0
    config = json.loads((tmp_path / "x" / "config_sentence_transformers.json").read_text())
    assert config["similarity_fn_name"] == "euclidean"
    assert main(["mine-negatives", "--model", str(folder), "--train", str(write_pairs(tmp_path)),
                 "--output", str(tmp_path / "mined.jsonl"), "--no-progress"]) == 2
    assert "similarity_fn_name 'euclidean'" in capsys.readouterr().err
    assert not (tmp_path / "mined.jsonl").exists()
    colbert, _ = colbert_folder(tmp_path)
    assert main(["similarity", "--model", str(colbert), "a", "b"]) == 2
    err = capsys.readouterr().err.strip()
    assert "MaxSim" in err and len(err.splitlines()) == 1
    assert main(["export", "onnx", "--model", str(folder), "--out", str(tmp_path / "o"), "--normalize"]) == 2
    assert "options of the sentence-transformers export" in capsys.readouterr().err


def write_pairs(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n"
                            for a, p in zip(TEXTS, TEXTS[1:] + TEXTS[:1])))
    return path


E5_PROMPTS = {"query": "query: ", "passage": "passage: ", "classification": "classify: "}


def test_prompts_are_put_as_encode_encode_query_and_encode_document_put_them(tmp_path, capsys):
    folder, model = st_model(tmp_path, "mean", normalize=True, similarity="cosine", prompts=E5_PROMPTS)
    for flags, theirs in (((), model.encode(TEXTS)),
                          (("--text-kind", "query"), model.encode_query(TEXTS)),
                          (("--text-kind", "document"), model.encode_document(TEXTS)),
                          (("--prompt-name", "classification"), model.encode(TEXTS, prompt_name="classification")),
                          (("--prompt", "x: "), model.encode(TEXTS, prompt="x: "))):
        np.testing.assert_allclose(embed_cli(folder, tmp_path, capsys, *flags), theirs, rtol=1e-5, atol=1e-6,
                                   err_msg=str(flags))
    assert not np.allclose(model.encode_query(TEXTS), model.encode(TEXTS), atol=1e-3)  # the prompts matter
    for flags, words in ((("--prompt-name", "nope"), "no prompt named 'nope'"),
                         (("--prompt-name", "query", "--prompt", "x"), "give one")):
        assert main(["embed", "--model", str(folder), "--input", str(tmp_path / "in.txt"), *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1


def test_a_default_prompt_is_put_where_encode_puts_it(tmp_path, capsys):
    pytest.importorskip("fastapi")
    from bertlab.infer.runtime import InferenceOptions
    from bertlab.infer.serve import create_app, load_models, start_in_thread

    from test_infer_serve import LIMITS, call

    folder, model = st_model(tmp_path, "cls", normalize=False, similarity="dot",
                             prompts={"s2s": "Instruct: similar text\nQuery: ", "plain": ""}, default_prompt_name="s2s")
    theirs = model.encode(TEXTS)
    np.testing.assert_allclose(embed_cli(folder, tmp_path, capsys), theirs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(embed_cli(folder, tmp_path, capsys, "--prompt-name", "plain"),
                               model.encode(TEXTS, prompt_name="plain"), rtol=1e-5, atol=1e-5)
    capsys.readouterr()
    assert main(["similarity", "--model", str(folder), TEXTS[0], TEXTS[1]]) == 0
    expected = float(model.similarity(theirs[:1], theirs[1:2])[0, 0])
    assert float(capsys.readouterr().out) == pytest.approx(expected, rel=1e-5)
    running = start_in_thread(create_app(load_models(folder, InferenceOptions()), LIMITS))
    try:
        status, out = call(running, "POST", "/embed", {"inputs": TEXTS})
        assert status == 200
        np.testing.assert_allclose(out, theirs, rtol=1e-4, atol=1e-5)  # the folder's lengths, its prompt
        status, out = call(running, "POST", "/embed", {"inputs": TEXTS, "prompt_name": "plain", "normalize": True})
        np.testing.assert_allclose(out, l2_normalize(model.encode(TEXTS, prompt_name="plain")), atol=1e-5)
        status, out = call(running, "POST", "/v1/embeddings", {"input": TEXTS[:2]})
        assert status == 200
        np.testing.assert_allclose([d["embedding"] for d in out["data"]], theirs[:2], rtol=1e-4, atol=1e-5)
        status, out = call(running, "POST", "/embed", {"inputs": "a dog", "prompt_name": "nope"})
        assert status == 422 and "'nope' is not one of the model's prompts" in json.dumps(out)
    finally:
        running.stop()
    config = json.loads((folder / "config_sentence_transformers.json").read_text())
    config["default_prompt_name"] = "missing"
    (folder / "config_sentence_transformers.json").write_text(json.dumps(config))
    assert main(["embed", "--model", str(folder), "--input", str(tmp_path / "in.txt")]) == 2
    err = capsys.readouterr().err.strip()
    assert "default_prompt_name 'missing' names none of its prompts" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("similarity", ["cosine", "dot"])
def test_retrieval_ranks_by_the_folder_s_similarity(tmp_path, similarity):
    """A model without a Normalize module is scored by cosine unless it declares dot, as sentence-transformers'
    `similarity` (and its evaluators) score it; with its query and document prompts."""
    from test_retrieval_eval import evaluated_with

    folder, model = st_model(tmp_path, "mean", normalize=False, similarity=similarity, prompts=E5_PROMPTS)
    evaluated_with(model, folder, tmp_path)


def test_dimensions_keep_a_matryoshka_model_s_leading_dimensions(tmp_path, capsys):
    from test_retrieval_eval import evaluated_with

    from bertlab.infer.ray_data import EmbedSpec
    from bertlab.infer.runtime import InferenceOptions

    folder, model = st_model(tmp_path, "mean", normalize=False, similarity="dot", prompts=E5_PROMPTS)
    short = embed_cli(folder, tmp_path, capsys, "--dimensions", "16")
    np.testing.assert_allclose(short, model.encode(TEXTS, truncate_dim=16), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(embed_cli(folder, tmp_path, capsys, "--dimensions", "16", "--normalize"),
                               l2_normalize(model.encode(TEXTS, truncate_dim=16)), rtol=1e-5, atol=1e-6)
    assert EmbedSpec.resolve(folder, None, None, InferenceOptions(threads=1), None, dimensions=16).dim == 16
    evaluated_with(model, folder, tmp_path, "--dimensions", "16", truncate_dim=16)
    assert json.loads((tmp_path / "eval" / "results.json").read_text())["dimensions"] == 16
    for flags, words in ((("--dimensions", "0"), "first N of the model's 32 dimensions; got 0"),
                         (("--dimensions", "33"), "got 33"),
                         (("--dimensions", "8", "--pooling", "splade"), "--dimensions shortens dense vectors")):
        assert main(["embed", "--model", str(folder), "--input", str(tmp_path / "in.txt"), *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1
