"""ColBERT folders and sentence-transformers 6's `MultiVectorEncoder`, both ways: its own layout read by bertlab
with the vectors and MaxSim scores it computes, bertlab's (PyLate's) layout read by it; pipelines bertlab does
not compute refused in one line, by the ColBERT path and by the sentence-vector path alike."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest
import torch

from bertlab.cli import main
from bertlab.infer import multivector as mv
from bertlab.train.retrieval import colbert

from infer_support import tiny_model
from test_retrieval_colbert import colbert_folder

pytestmark = pytest.mark.usefixtures("one_thread")

# "~" and "§" are not in the tiny vocabulary: [UNK] tokens, which PyLate's skiplist drops and this one keeps
TEXTS = ["what is the capital of france ?", "john lives in london , works for acme corp .",
         "the cat sat on the mat ! ~ §", "a dog", "who lives in paris , the big city of france , on a river ?"]


def multi_vector_encoder():
    try:
        from sentence_transformers import MultiVectorEncoder
    except ImportError:
        pytest.skip("sentence-transformers has no MultiVectorEncoder before 6.0")
    return MultiVectorEncoder


def st_folder(tmp_path, kind="classic", **expansion):
    """A folder in sentence-transformers 6's own layout, saved by it: "classic" from bertlab's ColBERT folder
    (markers as prompts, [MASK] expansion to 12 tokens, punctuation skiplist, documents cut at 9 tokens), "plain"
    from a bare encoder (no markers, no expansion, no skiplist: what `MultiVectorEncoder(encoder)` makes)."""
    encoder_class = multi_vector_encoder()
    if kind == "classic":
        start, _ = colbert_folder(tmp_path, query_length=12, document_length=9)
    else:
        start = tiny_model(tmp_path / "plain-base", seed=3)
    torch.manual_seed(0)  # the plain folder's new projection
    model = encoder_class(str(start), device="cpu")
    if expansion:
        model[0].query_expansion = {"strategy": "fixed", "length": 12, **expansion}
    out = tmp_path / f"st-{kind}"
    model.save(str(out))
    return out, model


def assert_same_as(model, ours: mv.ColbertEmbedder, texts=TEXTS):
    vectors = {}
    for kind, encode in (("query", model.encode_query), ("document", model.encode_document)):
        vectors[kind] = ours.embed(texts, kind)
        for mine, theirs in zip(vectors[kind], encode(texts, convert_to_numpy=True)):
            assert mine.shape == np.asarray(theirs).shape
            np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    theirs = model.similarity(model.encode_query(texts), model.encode_document(texts))
    mine = mv.maxsim([torch.from_numpy(v) for v in vectors["query"]],
                     [torch.from_numpy(v) for v in vectors["document"]])
    torch.testing.assert_close(mine, theirs.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind,expansion", [("classic", {}), ("classic", {"attend": True}), ("plain", {})])
def test_a_multi_vector_encoder_folder_embeds_as_sentence_transformers(tmp_path, kind, expansion):
    folder, model = st_folder(tmp_path, kind, **expansion)
    assert mv.is_colbert_folder(folder)
    ours = mv.ColbertEmbedder.from_pretrained(folder)
    settings = ours.settings
    assert not settings.skip_unknown and settings.attend_to_expansion_tokens == bool(expansion)
    if kind == "classic":
        assert (settings.query_prefix, settings.query_length, settings.document_length) == ("[Q] ", 12, 9)
        # the skiplist words the vocabulary lacks are left off it: [UNK] is kept, as sentence-transformers keeps it
        assert ours.tokenizer.unk_token_id not in ours.markers.skiplist
        assert ours.markers.skiplist == [ours.tokenizer.convert_tokens_to_ids(w) for w in "!,.?"]
    else:
        assert (settings.query_prefix, settings.do_query_expansion, settings.skiplist_words) == ("", False, [])
    assert_same_as(model, ours)


def test_long_texts_are_cut_where_sentence_transformers_cuts_them(tmp_path):
    folder, model = st_folder(tmp_path, "plain")
    model[0].document_length = 7
    model[0].query_length = 5
    model.save(str(folder))
    ours = mv.ColbertEmbedder.from_pretrained(folder)
    assert (ours.settings.query_length, ours.settings.document_length) == (5, 7)
    assert_same_as(model, ours)


def test_the_sentence_transformers_folder_is_kept_by_a_fine_tuning_start(tmp_path):
    """A run starting from such a folder writes PyLate's layout: the same vectors (its skiplist as that layout
    says it), read back by bertlab and by sentence-transformers."""
    from bertlab import BertModel
    from bertlab.infer.runtime import load_tokenizer

    folder, model = st_folder(tmp_path)
    settings = mv.read_colbert_settings(folder)
    tokenizer = load_tokenizer(folder, mv.marker_tokens(folder))
    built = colbert.build_model(folder, BertModel.from_pretrained(folder), tokenizer, settings, seed=0)
    written = colbert.save_folder(built, tokenizer, settings, {}, tmp_path / "written")
    assert mv.read_colbert_settings(written).skiplist_words == list("!,.?")
    assert_same_as(model, mv.ColbertEmbedder.from_pretrained(written))
    assert_same_as(multi_vector_encoder()(str(written), device="cpu"), mv.ColbertEmbedder.from_pretrained(written))


def test_sentence_transformers_reads_bertlabs_folder_as_bertlab(tmp_path):
    folder, _ = colbert_folder(tmp_path, query_length=12, document_length=9)
    assert_same_as(multi_vector_encoder()(str(folder), device="cpu"), mv.ColbertEmbedder.from_pretrained(folder))


def edit(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("change,message", [
    (lambda f: edit(f / "sentence_bert_config.json", lambda c: c["query_expansion"].update(strategy="min")),
     "query_expansion"),
    (lambda f: edit(f / "config_sentence_transformers.json", lambda c: c.update(similarity_fn_name="meanmaxsim")),
     "meanmaxsim"),
    (lambda f: edit(f / "2_MultiVectorMask" / "config.json", lambda c: c.update(skiplist_tasks=["query", "document"])),
     "skiplist_tasks"),
    (lambda f: edit(f / "2_MultiVectorMask" / "config.json", lambda c: c.update(keep_only_token_ids=[7])),
     "keep_only_token_ids"),
    (lambda f: edit(f / "config_sentence_transformers.json", lambda c: c["prompts"].update(query="query: ")),
     "is text"),
    (lambda f: edit(f / "modules.json", lambda c: c.pop(3)), "MultiVectorMask, not"),
    (lambda f: edit(f / "1_Dense" / "config.json", lambda c: c.update(activation_function="torch.nn.Tanh")),
     "activation"),
])
def test_what_bertlab_does_not_compute_is_refused_in_one_line(tmp_path, capsys, change, message):
    folder, _ = st_folder(tmp_path)
    change(folder)
    texts = tmp_path / "texts.txt"
    texts.write_text("a dog\n")
    capsys.readouterr()  # sentence-transformers' own output while saving
    assert main(["embed", "--model", str(folder), "--input", str(texts), "--output", str(tmp_path / "v.npz")]) != 0
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "v.npz").exists()


def test_a_sentence_vector_is_refused_where_modules_follow_the_pooling(tmp_path, capsys):
    """A sentence-transformers model with a Dense layer after its pooling: read as a plain encoder it would give
    another vector without a word; refused, and the plain pipeline still embeds as sentence-transformers."""
    try:
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.base.modules import Dense
    except ImportError:
        pytest.skip("sentence-transformers 6's module layout")
    base = tiny_model(tmp_path / "base", seed=1)
    plain = SentenceTransformer(str(base), device="cpu")
    plain.save(str(tmp_path / "plain"))
    torch.manual_seed(0)
    projected = SentenceTransformer(modules=[plain[0], plain[1], Dense(32, 8, activation_function=torch.nn.Tanh())],
                                    device="cpu")
    projected.save(str(tmp_path / "projected"))
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    capsys.readouterr()
    assert main(["embed", "--model", str(tmp_path / "projected"), "--input", str(texts),
                 "--output", str(tmp_path / "p.npy")]) != 0
    err = capsys.readouterr().err.strip()
    assert "Transformer -> Pooling -> Dense" in err and len(err.splitlines()) == 1
    assert main(["embed", "--model", str(tmp_path / "plain"), "--input", str(texts), "--no-normalize",
                 "--output", str(tmp_path / "v.npy")]) == 0  # the folder has no Normalize module
    np.testing.assert_allclose(np.load(tmp_path / "v.npy"), plain.encode(TEXTS), rtol=1e-5, atol=1e-6)


def test_evaluate_retrieval_scores_with_sentence_transformers_maxsim(tmp_path):
    """The run's scores are sentence-transformers' MaxSim: its markers placed once (its prompts are the markers,
    not text put before the text as well)."""
    from test_retrieval_eval import evaluated_with

    folder, model = st_folder(tmp_path)
    evaluated_with(model, folder, tmp_path)


@pytest.mark.parametrize("kind", ["pylate", "sentence-transformers"])
def test_exporting_a_colbert_folder_as_a_sentence_vector_model_needs_a_pooling(tmp_path, capsys, kind):
    folder = colbert_folder(tmp_path, query_length=12)[0] if kind == "pylate" else st_folder(tmp_path)[0]
    capsys.readouterr()
    assert main(["export", "sentence-transformers", "--model", str(folder), "--out", str(tmp_path / "st")]) != 0
    err = capsys.readouterr().err.strip()
    assert "is a ColBERT folder" in err and "--pooling" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "st").exists()


def test_serve_answers_with_sentence_transformers_vectors(tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from bertlab.infer.runtime import InferenceOptions
    from bertlab.infer.serve import create_app, load_models, start_in_thread

    from test_infer_serve import LIMITS, call

    folder, model = st_folder(tmp_path)
    running = start_in_thread(create_app(load_models(folder, InferenceOptions()), LIMITS))
    try:
        status, out = call(running, "POST", "/embed_multivector", {"inputs": TEXTS[:2], "kind": "query"})
        assert status == 200
        for got, theirs in zip(out, model.encode_query(TEXTS[:2], convert_to_numpy=True)):
            np.testing.assert_allclose(got, theirs, atol=1e-5)
        status, out = call(running, "POST", "/rerank", {"query": TEXTS[0], "texts": TEXTS[1:]})
        theirs = model.similarity(model.encode_query(TEXTS[:1]), model.encode_document(TEXTS[1:]))[0]
        assert status == 200 and [a["index"] for a in out] == theirs.argsort(descending=True).tolist()
        assert [a["score"] for a in out] == pytest.approx(sorted(theirs.tolist(), reverse=True), rel=1e-5)
        status, out = call(running, "POST", "/embed", {"inputs": "a dog"})
        assert status == 424  # vectors per token: no pooled vector made up
    finally:
        running.stop()


@pytest.mark.parametrize("kind", ["pylate", "sentence-transformers"])
def test_negatives_mined_with_a_colbert_folder_are_its_maxsim_ranking(tmp_path, kind):
    """Each anchor's negatives are the candidates of highest MaxSim that are not its positives, in that order,
    and the margin compares MaxSim scores: checked against the embedder's vectors scored directly."""
    folder = colbert_folder(tmp_path, query_length=12)[0] if kind == "pylate" else st_folder(tmp_path)[0]
    anchors = ["what is a dog", "who lives in paris", "the cat sat", "where is the big river"]
    positives = ["a dog is good", "john lives in paris , the capital of france", "the cat sat on the mat",
                 "the river is big"]
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("anchor,positive\n" + "".join(f"{a},\"{p}\"\n" for a, p in zip(anchors, positives)))
    out = tmp_path / "mined.csv"
    assert main(["mine-negatives", "--model", str(folder), "--train", str(pairs), "--output", str(out),
                 "--num-negatives", "2", "--range-min", "0", "--relative-margin", "0", "--no-progress"]) == 0
    embedder = mv.ColbertEmbedder.from_pretrained(folder)
    scores = mv.maxsim([torch.from_numpy(v) for v in embedder.embed(anchors, "query")],
                       [torch.from_numpy(v) for v in embedder.embed(positives, "document")])
    rows = {r["anchor"]: r for r in csv.DictReader(out.open())}
    assert len(rows) == len(anchors)
    for i, a in enumerate(anchors):
        others = [j for j in scores[i].argsort(descending=True).tolist() if j != i]
        expected = [positives[j] for j in others if scores[i, j] <= scores[i, i]][:2]
        assert [rows[a]["negative_1"], rows[a]["negative_2"]] == expected

@pytest.mark.parametrize("change,message", [
    ({"pooling_mode_mean_tokens": False, "pooling_mode_mean_sqrt_len_tokens": True}, "pools by mean_sqrt_len_tokens"),
    ({"pooling_mode_cls_token": True}, "pools by cls + mean"),
    ({"pooling_mode_mean_tokens": False, "pooling_mode_weightedmean_tokens": True}, "pools by weightedmean"),
    ({"pooling_mode": "lasttoken"}, "pools by lasttoken"),  # sentence-transformers 6's form
    ({"pooling_mode": ["cls", "max"]}, "pools by cls + max"),
    ({"include_prompt": False}, "include_prompt"),
])
def test_a_pooling_bertlab_does_not_compute_is_refused(tmp_path, capsys, change, message):
    """A sentence-transformers Pooling module whose vector bertlab would not compute as that library does (it
    fell back to the mean before, without a word); --pooling still pools the encoder on request."""
    from bertlab.infer.embeddings import model_pooling
    from bertlab.infer.st_folder import EmbeddingSettings, write_settings

    folder = tmp_path / "st"
    shutil.copytree(tiny_model(tmp_path / "base", seed=1), folder)
    write_settings(folder, EmbeddingSettings(query_prompt="query: "), 32, 64)
    assert model_pooling(folder) == "mean"
    edit(folder / "1_Pooling" / "config.json", lambda c: c.update(change))
    texts = tmp_path / "texts.txt"
    texts.write_text("a dog\n")
    assert main(["embed", "--model", str(folder), "--input", str(texts), "--output", str(tmp_path / "v.npy")]) != 0
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert main(["embed", "--model", str(folder), "--input", str(texts), "--pooling", "mean",
                 "--output", str(tmp_path / "v.npy")]) == 0


@pytest.mark.parametrize("mode", ["cls", "max", "mean"])
def test_sentence_transformers_6_pooling_is_read(tmp_path, mode):
    """sentence-transformers 6 saves `pooling_mode` as a name (no flags): each is read, and the vectors are its."""
    try:
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.modules import Pooling
    except ImportError:
        pytest.skip("sentence-transformers 6's module layout")
    from bertlab.infer.embeddings import Embedder, model_pooling

    base = tiny_model(tmp_path / "base", seed=4)
    plain = SentenceTransformer(str(base), device="cpu")
    model = SentenceTransformer(modules=[plain[0], Pooling(32, pooling_mode=mode)], device="cpu")
    model.save(str(tmp_path / "st"))
    assert json.loads((tmp_path / "st" / "1_Pooling" / "config.json").read_text())["pooling_mode"] == mode
    assert model_pooling(tmp_path / "st") == mode
    ours = Embedder.from_pretrained(tmp_path / "st", None, normalize=False).embed(TEXTS)
    np.testing.assert_allclose(ours, model.encode(TEXTS), rtol=1e-5, atol=1e-6)
