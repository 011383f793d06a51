"""ColBERT (multi-vector) retrieval: MaxSim against a direct computation, the query / document tokens against
PyLate's, the folder in PyLate (same vectors, same scores), on-disk MaxSim search against in-memory scores, the
losses against PyLate's formulas, a fine-tuning run that lowers its loss, `embed` / `evaluate-retrieval` and
their one-line refusals."""

from __future__ import annotations

import json
import random
import string

import numpy as np
import pytest
import torch

from bertlab.cli import main
from bertlab.infer import multivector as mv
from bertlab.train.retrieval import colbert, maxsim_search

from infer_support import WORDS, tiny_model
from test_retrieval_eval import CORPUS, QUERIES, write_beir

pytestmark = pytest.mark.usefixtures("one_thread")


def direct_maxsim(q: torch.Tensor, d: torch.Tensor) -> float:
    return float(sum(max(float(qi @ dj) for dj in d) for qi in q))


def ragged(seed, n, dim=8, lo=1, hi=9):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [torch.nn.functional.normalize(torch.randn(t, dim, generator=g), dim=-1) for t in lengths]


def test_maxsim_equals_a_direct_computation():
    queries, docs = ragged(0, 4), ragged(1, 7)
    scores = mv.maxsim(queries, docs)
    for i, q in enumerate(queries):
        for j, d in enumerate(docs):
            assert float(scores[i, j]) == pytest.approx(direct_maxsim(q, d), rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("store,tol", [("float32", 1e-5), ("float16", 2e-2), ("int8", 5e-2)])
def test_search_on_disk_equals_in_memory(tmp_path, monkeypatch, store, tol):
    monkeypatch.setattr(maxsim_search, "TOKEN_BLOCK", 20)  # many blocks: the top-k merge across them is tested
    monkeypatch.setattr(maxsim_search, "QUERY_BLOCK", 3)
    queries, docs = ragged(2, 7), ragged(3, 40)
    corpus = maxsim_search.DiskTokenVectors(tmp_path / "tokens", 8, store)
    corpus.append([d.numpy() for d in docs[:25]])
    corpus.append([d.numpy() for d in docs[25:]])
    corpus.finish()
    idx, scores = maxsim_search.maxsim_search([q.numpy() for q in queries], corpus, 5)
    exact = mv.maxsim(queries, docs)
    top, top_idx = exact.topk(5, dim=1)
    np.testing.assert_allclose(scores, top.numpy(), rtol=tol, atol=tol)
    if store == "float32":
        assert (idx == top_idx.numpy()).all()
    corpus.close()
    assert not (tmp_path / "tokens").exists()


# ---------------------------------------------------------------------------------------------- a folder
def colbert_folder(tmp_path, name="cb", seed=0, **settings):
    """A random-weight ColBERT folder from a tiny BERT: markers added, a seeded projection."""
    from bertlab import BertModel
    from bertlab.tokenizer import BertTokenizer

    base = tiny_model(tmp_path / f"{name}-base", seed=seed)
    tokenizer = BertTokenizer.from_pretrained(base)
    cfg = mv.ColbertSettings(dim=16, **settings)
    model = colbert.build_model(base, BertModel.from_pretrained(base), tokenizer, cfg, seed)
    return colbert.save_folder(model, tokenizer, cfg, {}, tmp_path / name), tokenizer


TEXTS = ["what is the capital of france ?", "john lives in london , works for acme corp .",
         "the cat sat on the mat !", "a dog"]


def test_tokens_are_pylates_layout(tmp_path):
    folder, tokenizer = colbert_folder(tmp_path, query_length=12, document_length=9)
    settings = mv.read_colbert_settings(folder)
    marks = mv.markers(tokenizer, settings)
    vocab_size = json.loads((folder / "config.json").read_text())["vocab_size"]
    assert (marks.query, marks.document) == (vocab_size - 2, vocab_size - 1)
    assert tokenizer.ids_to_tokens[-2:] == ["[Q] ", "[D] "]
    q = mv.tokenize(tokenizer, TEXTS[:1], "query", settings, marks)
    cls_, sep, mask = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.mask_token_id
    words = tokenizer.encode(TEXTS[0], add_special_tokens=False)
    assert q.ids[0] == [cls_, marks.query, *words, sep] + [mask] * (12 - len(words) - 3)
    assert q.attended[0] == len(words) + 3 and all(q.kept[0])
    d = mv.tokenize(tokenizer, TEXTS[1:2], "document", settings, marks)
    words = tokenizer.encode(TEXTS[1], add_special_tokens=False)[:9 - 3]  # cut to the document length
    assert d.ids[0] == [cls_, marks.document, *words, sep]
    comma = tokenizer.convert_tokens_to_ids(",")
    assert d.kept[0] == [t != comma for t in d.ids[0]]
    # PyLate's skiplist: each punctuation character's id, [UNK] for those the vocabulary lacks
    assert set(marks.skiplist) == {tokenizer.convert_tokens_to_ids(c) for c in string.punctuation}
    assert tokenizer.unk_token_id in marks.skiplist


def pylate_model(folder):
    """PyLate's own ColBERT on the folder, where this environment runs it: PyLate 1.6 pins sentence-transformers
    5.3 and transformers <= 5.3 (its loading hooks are gone in sentence-transformers 6), so beside the test
    extra's versions it is skipped and `pylate_formula` below stands for it."""
    models = pytest.importorskip("pylate.models")
    import sentence_transformers

    if int(sentence_transformers.__version__.split(".")[0]) >= 6:
        pytest.skip(f"PyLate needs sentence-transformers 5.3; this environment has {sentence_transformers.__version__}")
    return models.ColBERT(str(folder), device="cpu")


def pylate_formula(folder, texts, kind):
    """PyLate 1.6's `ColBERT.tokenize` and `encode`, written out from its source over `transformers` alone:
    the tokenizer as its Transformer module loads it, the markers added (already in the vocabulary: no new
    ids), [MASK] as the padding token, each text cut to length - 1, padded to it when a query, the marker's id
    inserted after the first token; the last layer through the Dense module's weight, the kept rows (a query's
    all, a document's not on the skiplist and attended) L2-normalised."""
    from safetensors.torch import load_file
    from transformers import AutoModel, AutoTokenizer

    cfg = json.loads((folder / "config_sentence_transformers.json").read_text())
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModel.from_pretrained(str(folder)).eval()
    size = len(tok)
    tok.add_tokens([cfg["query_prefix"], cfg["document_prefix"]])
    assert len(tok) == size == model.get_input_embeddings().num_embeddings  # PyLate's resize changes nothing
    tok.pad_token_id = tok.mask_token_id
    weight = load_file(str(folder / "1_Dense" / "model.safetensors"))["linear.weight"]
    query = kind == "query"
    prefix = tok.convert_tokens_to_ids(cfg["query_prefix" if query else "document_prefix"])
    skiplist = torch.tensor([tok.convert_tokens_to_ids(w) for w in cfg["skiplist_words"]])
    out = []
    for text in texts:
        enc = tok([text.strip()], truncation=True, max_length=cfg["query_length" if query else "document_length"] - 1,
                  padding="max_length" if query and cfg["do_query_expansion"] else False, return_tensors="pt")
        ids, att = enc["input_ids"], enc["attention_mask"]
        ids = torch.cat([ids[:, :1], torch.full((1, 1), prefix), ids[:, 1:]], 1)
        att = torch.cat([att[:, :1], torch.ones(1, 1, dtype=att.dtype), att[:, 1:]], 1)
        with torch.no_grad():
            hidden = model(input_ids=ids, attention_mask=att, token_type_ids=torch.zeros_like(ids)).last_hidden_state
        vectors = hidden[0] @ weight.T
        keep = torch.ones(ids.shape[1], dtype=torch.bool) if query else (~torch.isin(ids[0], skiplist)) & att[0].bool()
        out.append((ids[0].tolist(), att[0].tolist(), torch.nn.functional.normalize(vectors[keep], dim=-1)))
    return out


def test_tokens_and_vectors_are_pylates_formula(tmp_path):
    """The folder read by `transformers` as PyLate reads it gives the token ids, attention, vectors and MaxSim
    scores bertlab gives (relative error <= 1e-5)."""
    folder, tokenizer = colbert_folder(tmp_path, query_length=12, document_length=9)
    ours = mv.ColbertEmbedder.from_pretrained(folder)
    settings = mv.read_colbert_settings(folder)
    vectors = {}
    for kind in ("query", "document"):
        rows = mv.tokenize(tokenizer, TEXTS, kind, settings, ours.markers)
        theirs = pylate_formula(folder, TEXTS, kind)
        vectors[kind] = ours.embed(TEXTS, kind)
        for i, (ids, att, v) in enumerate(theirs):
            assert ids == rows.ids[i], (kind, TEXTS[i])
            assert att == [int(p < rows.attended[i]) for p in range(len(ids))]
            np.testing.assert_allclose(vectors[kind][i], v.numpy(), rtol=1e-5, atol=1e-6)
        if kind == "query":
            their_queries = [v for _, _, v in theirs]
        else:
            their_docs = [v for _, _, v in theirs]
    mine = mv.maxsim([torch.from_numpy(v) for v in vectors["query"]], [torch.from_numpy(v) for v in vectors["document"]])
    for i, q in enumerate(their_queries):
        for j, d in enumerate(their_docs):  # PyLate's colbert_scores: einsum, max over the document, sum
            theirs = torch.einsum("ash,bth->abst", q[None], d[None]).max(-1).values.sum(-1)
            assert float(mine[i, j]) == pytest.approx(float(theirs[0, 0]), rel=1e-5)


def test_pylate_tokenizes_as_bertlab(tmp_path):
    folder, tokenizer = colbert_folder(tmp_path, query_length=12, document_length=9)
    theirs = pylate_model(folder)
    settings = mv.read_colbert_settings(folder)
    marks = mv.markers(tokenizer, settings)
    for kind in ("query", "document"):
        ours = mv.tokenize(tokenizer, TEXTS, kind, settings, marks)
        for i, text in enumerate(TEXTS):
            their = theirs.tokenize([text], is_query=kind == "query")
            assert their["input_ids"][0].tolist() == ours.ids[i], (kind, text)
            assert their["attention_mask"][0].tolist() == [int(p < ours.attended[i]) for p in range(len(ours.ids[i]))]
    assert sorted(theirs.skiplist) == sorted(marks.skiplist)


def test_pylate_loads_the_folder_and_scores_as_bertlab(tmp_path):
    folder, _ = colbert_folder(tmp_path, query_length=16, document_length=12)
    theirs = pylate_model(folder)
    scores_mod = pytest.importorskip("pylate.scores")
    ours = mv.ColbertEmbedder.from_pretrained(folder)
    for kind in ("query", "document"):
        for x, y in zip(ours.embed(TEXTS, kind), theirs.encode(TEXTS, is_query=kind == "query")):
            assert x.shape == y.shape
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    q, d = ours.embed(TEXTS, "query"), ours.embed(TEXTS, "document")
    mine = mv.maxsim([torch.from_numpy(v) for v in q], [torch.from_numpy(v) for v in d])
    for i in range(len(TEXTS)):
        for j in range(len(TEXTS)):
            their = scores_mod.colbert_scores(torch.from_numpy(theirs.encode([TEXTS[i]], is_query=True)[0])[None],
                                              torch.from_numpy(theirs.encode([TEXTS[j]], is_query=False)[0])[None])
            assert float(mine[i, j]) == pytest.approx(float(their[0, 0]), rel=1e-5)


def test_folder_round_trip(tmp_path):
    from bertlab import BertModel

    folder, tokenizer = colbert_folder(tmp_path)
    loaded = mv.ColbertEmbedder.from_pretrained(folder)
    # the same weights, read back: the folder's encoder and projection as the model that wrote them
    model = mv.ColbertModel(BertModel.from_pretrained(folder), 16, mv.read_projection(folder)).eval()
    direct = mv.ColbertEmbedder(model, tokenizer, mv.read_colbert_settings(folder))
    for kind in ("query", "document"):
        for x, y in zip(loaded.embed(TEXTS, kind), direct.embed(TEXTS, kind)):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)
    assert mv.read_colbert_settings(folder) == mv.ColbertSettings(dim=16)
    assert mv.is_colbert_folder(folder) and not mv.is_colbert_folder(tmp_path / "cb-base")


# ---------------------------------------------------------------------------------------------- losses
def token_embeddings(seed, rows, tokens, dim=8):
    g = torch.Generator().manual_seed(seed)
    v = torch.nn.functional.normalize(torch.randn(rows, tokens, dim, generator=g, dtype=torch.float64), dim=-1)
    kept = torch.rand(rows, tokens, generator=g) > 0.3
    kept[:, 0] = True
    return v, kept


def pylate_style_scores(q, d, kept):
    """PyLate's colbert_scores on each document's kept vectors alone (no padding in the max)."""
    return torch.tensor([[direct_maxsim(q[a], d[b][kept[b]]) for b in range(len(d))] for a in range(len(q))],
                        dtype=torch.float64)


def test_contrastive_loss_is_cross_entropy_over_maxsim():
    q, _ = token_embeddings(0, 5, 6)
    emb = {"anchor": (q, torch.ones(5, 6, dtype=torch.bool)), "positive": token_embeddings(1, 5, 9),
           "negative_0": token_embeddings(2, 5, 7)}
    scores = torch.cat([pylate_style_scores(q, *emb["positive"]), pylate_style_scores(q, *emb["negative_0"])], 1)
    expected = torch.nn.functional.cross_entropy(scores, torch.arange(5))
    assert float(colbert.contrastive()(emb)) == pytest.approx(float(expected), rel=1e-9)


def test_distillation_loss_is_pylates():
    q, _ = token_embeddings(0, 4, 6)
    emb = {"anchor": (q, torch.ones(4, 6, dtype=torch.bool)), "positive": token_embeddings(1, 4, 9),
           "negative_0": token_embeddings(2, 4, 7), "negative_1": token_embeddings(3, 4, 5)}
    teacher = torch.randn(4, 3, dtype=torch.float64) * 3
    scores = torch.stack([pylate_style_scores(q, *emb[c]).diagonal() for c in ("positive", "negative_0", "negative_1")],
                         1)
    lo, hi = scores.min(1, keepdim=True).values, scores.max(1, keepdim=True).values
    scores = (scores - lo) / (hi - lo + 1e-8)  # PyLate's Distillation, normalize_scores=True
    expected = torch.nn.KLDivLoss(reduction="batchmean", log_target=True)(
        torch.log_softmax(scores, -1), torch.log_softmax(teacher, -1))
    assert float(colbert.distillation()(emb, teacher)) == pytest.approx(float(expected), rel=1e-9)


# ---------------------------------------------------------------------------------------------- commands
def pairs_file(path, rows=24, seed=0, scores=False):
    rng = random.Random(seed)
    words = [w for w in WORDS if w.isalpha()]
    with open(path, "w", encoding="utf-8") as f:
        for i in range(rows):
            topic = rng.sample(words, 3)
            row = {"query": " ".join(topic[:2]), "positive": " ".join(topic + rng.sample(words, 4)),
                   "negative": " ".join(rng.sample(words, 6))}
            if scores:
                row["scores"] = [rng.uniform(0.9, 1.0), rng.uniform(0.0, 0.1)]  # reachable: min-max scaled
            f.write(json.dumps(row) + "\n")
    return path


def losses_of(out):
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
            if "loss" in json.loads(line)]


@pytest.mark.parametrize("distill", [False, True])
def test_finetune_colbert_lowers_its_loss_and_writes_a_colbert_folder(tmp_path, capsys, distill):
    base = tiny_model(tmp_path / "base")
    pairs = pairs_file(tmp_path / "pairs.jsonl", scores=distill)
    out = tmp_path / "run"
    args = ["finetune-embeddings", "--model", str(base), "--train", str(pairs), "--out", str(out), "--loss", "colbert",
            "--colbert-dim", "16", "--query-length", "8", "--document-length", "16", "--batch-size", "8",
            "--max-steps", "30", "--lr", "1e-3", "--warmup", "0", "--no-progress"]
    assert main(args + (["--score-column", "scores"] if distill else [])) == 0
    losses = losses_of(out)
    assert len(losses) == 30
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])
    folder = out / "final"
    assert mv.read_colbert_settings(folder) == mv.ColbertSettings(dim=16, query_length=8, document_length=16)
    vectors = mv.ColbertEmbedder.from_pretrained(folder).embed(["the cat"], "query")
    assert vectors[0].shape == (8, 16)


def test_evaluate_retrieval_on_a_colbert_folder(tmp_path, capsys):
    folder, _ = colbert_folder(tmp_path)
    data = write_beir(tmp_path / "set", CORPUS, QUERIES, ["q1\td1\t1", "q2\td3\t1", "q3\td2\t1"])
    out = tmp_path / "eval"
    assert main(["evaluate-retrieval", "--model", str(folder), "--data", str(data), "--out", str(out),
                 "--store", "float32", "--no-progress"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["pooling"] == "colbert" and 0 <= results["metrics"]["ndcg@10"] <= 1
    # the run's scores are MaxSim's on the embedder's vectors
    embedder = mv.ColbertEmbedder.from_pretrained(folder)
    passages = [(d.get("title", "") + " " + d["text"]).strip() if d.get("title") else d["text"] for d in CORPUS]
    q = embedder.embed([QUERIES[0]["text"]], "query")
    exact = mv.maxsim([torch.from_numpy(q[0])], [torch.from_numpy(v) for v in embedder.embed(passages, "document")])
    run = {}
    for line in (out / "run.trec").read_text().splitlines():
        qid, _, doc, _, score, _ = line.split()
        run.setdefault(qid, {})[doc] = float(score)
    for j, d in enumerate(CORPUS):
        assert run["q1"][d["_id"]] == pytest.approx(float(exact[0, j]), rel=1e-5)


def test_embed_writes_token_vectors(tmp_path):
    folder, _ = colbert_folder(tmp_path, query_length=10)
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    embedder = mv.ColbertEmbedder.from_pretrained(folder)
    assert main(["embed", "--model", str(folder), "--input", str(texts), "--output", str(tmp_path / "v.npz")]) == 0
    vectors, ids = mv.read_npz(tmp_path / "v.npz")
    assert ids is None and len(vectors) == len(TEXTS)
    for i, expected in enumerate(embedder.embed(TEXTS, "document")):
        np.testing.assert_allclose(vectors[i], expected, rtol=1e-6)
    assert main(["embed", "--model", str(folder), "--input", str(texts), "--output", str(tmp_path / "q.jsonl"),
                 "--text-kind", "query", "--vector-dtype", "float16"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "q.jsonl").read_text().splitlines()]
    assert [np.asarray(r).shape for r in rows] == [(10, 16)] * len(TEXTS)
    np.testing.assert_allclose(rows[0], embedder.embed(TEXTS[:1], "query")[0], atol=1e-3)


@pytest.mark.parametrize("extra,message", [
    (["--output", "v.npy"], "ragged"),
    (["--no-normalize"], "--no-normalize does not apply"),
])
def test_embed_refusals_are_one_line(tmp_path, capsys, extra, message):
    folder, _ = colbert_folder(tmp_path)
    texts = tmp_path / "texts.txt"
    texts.write_text("a dog\n")
    extra = [str(tmp_path / e) if e.endswith(".npy") else e for e in extra]
    assert main(["embed", "--model", str(folder), "--input", str(texts), *extra]) != 0
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_refusals_for_a_plain_folder_and_bad_scores(tmp_path, capsys):
    base = tiny_model(tmp_path / "base")
    texts = tmp_path / "texts.txt"
    texts.write_text("a dog\n")
    assert main(["embed", "--model", str(base), "--pooling", "colbert", "--input", str(texts)]) != 0
    err = capsys.readouterr().err.strip()
    assert "not a ColBERT folder" in err and len(err.splitlines()) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"query": "a", "positive": "b", "negative": "c", "scores": [1.0]}) + "\n" * 1
                   + json.dumps({"query": "d", "positive": "e", "negative": "f", "scores": [1.0, 2.0]}) + "\n")
    assert main(["finetune-embeddings", "--model", str(base), "--train", str(bad), "--out", str(tmp_path / "o"),
                 "--loss", "colbert", "--score-column", "scores", "--no-progress"]) != 0
    err = capsys.readouterr().err.strip()
    assert "bad.jsonl" in err and "expected 2 finite numbers" in err and len(err.splitlines()) == 1


def test_serve_answers_token_vectors_and_a_maxsim_rerank(tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from bertlab.infer.runtime import InferenceOptions
    from bertlab.infer.serve import create_app, load_models, start_in_thread

    from test_infer_serve import LIMITS, call

    folder, _ = colbert_folder(tmp_path)
    embedder = mv.ColbertEmbedder.from_pretrained(folder)
    running = start_in_thread(create_app(load_models(folder, InferenceOptions()), LIMITS))
    try:
        status, out = call(running, "POST", "/embed_multivector", {"inputs": ["a dog", "the cat sat"], "kind": "query"})
        assert status == 200
        for got, expected in zip(out, embedder.embed(["a dog", "the cat sat"], "query")):
            np.testing.assert_allclose(got, expected, atol=1e-5)
        texts = ["a dog", "the cat sat on the mat", "paris is big"]
        status, out = call(running, "POST", "/rerank", {"query": "the cat", "texts": texts, "return_text": True})
        scores = mv.maxsim([torch.from_numpy(embedder.embed(["the cat"], "query")[0])],
                           [torch.from_numpy(v) for v in embedder.embed(texts, "document")])[0]
        assert status == 200 and [a["index"] for a in out] == scores.argsort(descending=True).tolist()
        assert [a["score"] for a in out] == pytest.approx(sorted(scores.tolist(), reverse=True), rel=1e-5)
        assert out[0]["text"] == texts[out[0]["index"]]
    finally:
        running.stop()
    running = start_in_thread(create_app(load_models(tmp_path / "cb-base", InferenceOptions()), LIMITS))
    try:
        status, out = call(running, "POST", "/embed_multivector", {"inputs": "a dog"})
        assert status == 404 and "ColBERT" in out["error"]
    finally:
        running.stop()


def test_evaluate_retrieval_refuses_dense_settings_for_a_colbert_folder(tmp_path, capsys):
    folder, _ = colbert_folder(tmp_path)
    data = write_beir(tmp_path / "set", CORPUS, QUERIES, ["q1\td1\t1"])
    assert main(["evaluate-retrieval", "--model", str(folder), "--data", str(data), "--pooling", "cls",
                 "--no-progress"]) != 0
    err = capsys.readouterr().err.strip()
    assert "a ColBERT folder takes no --pooling" in err and len(err.splitlines()) == 1


def test_serve_says_a_colbert_folder_has_vectors_per_token(tmp_path):
    """/embed and /info on a ColBERT folder: no pooled vector is made up (424, pointing at /embed_multivector),
    /info names the ColBERT pooling and the vectors' dimension; with --pooling given, /embed pools as asked."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from bertlab.infer.runtime import InferenceOptions
    from bertlab.infer.serve import create_app, load_models, start_in_thread

    from test_infer_serve import LIMITS, call

    folder, _ = colbert_folder(tmp_path)
    running = start_in_thread(create_app(load_models(folder, InferenceOptions()), LIMITS))
    try:
        status, out = call(running, "POST", "/embed", {"inputs": ["a dog"]})
        assert status == 424 and "/embed_multivector" in out["error"]
        status, out = call(running, "POST", "/v1/embeddings", {"input": "a dog"})
        assert status == 424
        status, info = call(running, "GET", "/info")
        assert info["pooling"] == "colbert" and info["model_type"] == {"embedding": {"pooling": "colbert"}}
        assert info["embedding_dimension"] == 16 and "embed" not in info["endpoints"]
        assert "embed_multivector" in info["endpoints"]
    finally:
        running.stop()
    running = start_in_thread(create_app(load_models(folder, InferenceOptions(), pooling="mean"), LIMITS))
    try:
        status, out = call(running, "POST", "/embed", {"inputs": ["a dog"]})
        assert status == 200 and len(out[0]) == 32
    finally:
        running.stop()


def pylate_written_folder(tmp_path):
    """A ColBERT folder as PyLate saves one under `transformers` 5, made by hand from its source: bertlab's folder's
    encoder (embeddings grown by the two markers) and Dense module, with the tokenizer files as PyLate's
    `ColBERT.__init__` leaves its tokenizer before `save_pretrained` writes it -- `add_tokens([query_prefix,
    document_prefix])`, then the mask token as the pad token -- so the markers are tokens added after the
    vocabulary in tokenizer.json, and tokenizer_config.json names [MASK] the pad token."""
    transformers = pytest.importorskip("transformers")
    folder, _ = colbert_folder(tmp_path, query_length=12, document_length=9)
    cfg = json.loads((folder / "config_sentence_transformers.json").read_text())
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "cb-base"))
    tok.add_tokens([cfg["query_prefix"], cfg["document_prefix"]])
    tok.pad_token_id = tok.mask_token_id
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    tok.save_pretrained(str(folder))
    added = {t["content"]: t for t in json.loads((folder / "tokenizer.json").read_text())["added_tokens"]}
    assert not added["[Q] "]["special"] and added["[D] "]["id"] == added["[Q] "]["id"] + 1
    return folder


def test_a_pylate_written_folder_loads_and_scores_as_pylate(tmp_path):
    folder = pylate_written_folder(tmp_path)
    ours = mv.ColbertEmbedder.from_pretrained(folder)
    bertlabs, _ = colbert_folder(tmp_path / "own", query_length=12, document_length=9)  # the same, as bertlab saves it
    original = mv.ColbertEmbedder.from_pretrained(bertlabs)
    assert ours.markers == original.markers and ours.tokenizer.pad_token == "[PAD]"
    vectors = {}
    for kind in ("query", "document"):
        vectors[kind] = ours.embed(TEXTS, kind)
        for mine, own in zip(vectors[kind], original.embed(TEXTS, kind)):
            np.testing.assert_allclose(mine, own, rtol=1e-6, atol=1e-7)
        for mine, (_, _, theirs) in zip(vectors[kind], pylate_formula(folder, TEXTS, kind)):
            np.testing.assert_allclose(mine, theirs.numpy(), rtol=1e-5, atol=1e-6)
    q, d = pylate_formula(folder, TEXTS, "query"), pylate_formula(folder, TEXTS, "document")
    mine = mv.maxsim([torch.from_numpy(v) for v in vectors["query"]], [torch.from_numpy(v) for v in vectors["document"]])
    for i, (_, _, qi) in enumerate(q):
        for j, (_, _, dj) in enumerate(d):
            theirs = torch.einsum("ash,bth->abst", qi[None], dj[None]).max(-1).values.sum(-1)
            assert float(mine[i, j]) == pytest.approx(float(theirs[0, 0]), rel=1e-5)
