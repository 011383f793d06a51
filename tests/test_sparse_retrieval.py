"""SPLADE: the pooling against a direct torch computation for every family with a masked-LM head, its chunked
backward against autograd, `embed --pooling splade` (JSON Lines, top-k, the scipy .npz, refusals), the
sentence-transformers SparseEncoder export (its `encode` equals bertlab's), TEI's /embed_sparse with a client
written for TEI's shape, exact sparse search against dense dot products, and a short `--loss splade` run."""

from __future__ import annotations

import csv
import json
import random

import numpy as np
import pytest
import torch

from bertlab.cli import main
from bertlab.infer.sparse import SparseRows, SpladeEncoder, max_logits, splade_vectors
from bertlab.models.heads import VocabProjection
from bertlab.models.registry import family_of

from family_support import padded_batch, rel_err
from infer_support import WORDS, write_vocab

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# model_type -> (transformers config, masked-LM class): every family with a masked-LM head
FAMILIES = {
    "bert": lambda: (transformers.BertConfig(**TINY), "BertForMaskedLM"),
    "roberta": lambda: (transformers.RobertaConfig(**TINY), "RobertaForMaskedLM"),
    "xlm-roberta": lambda: (transformers.XLMRobertaConfig(**TINY), "XLMRobertaForMaskedLM"),
    "distilbert": lambda: (transformers.DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4,
                                                         hidden_dim=37, max_position_embeddings=64), "DistilBertForMaskedLM"),
    "albert": lambda: (transformers.AlbertConfig(**TINY, embedding_size=16), "AlbertForMaskedLM"),
    "electra": lambda: (transformers.ElectraConfig(**TINY, embedding_size=16), "ElectraForMaskedLM"),
    "deberta-v2": lambda: (transformers.DebertaV2Config(**TINY, relative_attention=True, position_buckets=16,
                                                        max_relative_positions=32, pos_att_type=["c2p", "p2c"],
                                                        position_biased_input=False, type_vocab_size=0),
                           "DebertaV2ForMaskedLM"),
    "modernbert": lambda: (transformers.ModernBertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                                         num_attention_heads=4, intermediate_size=37,
                                                         max_position_embeddings=64, pad_token_id=0,
                                                         global_attn_every_n_layers=2, local_attention=16),
                           "ModernBertForMaskedLM"),
}


def family_mlm(tmp_path, model_type: str, seed: int = 0):
    """A random-weight `transformers` masked-LM model of the family, saved and loaded as bertlab's."""
    config, cls = FAMILIES[model_type]()
    torch.manual_seed(seed)
    getattr(transformers, cls)(config).eval().save_pretrained(tmp_path / model_type)
    family = family_of(tmp_path / model_type)
    return family.heads["masked-lm"].model_class.from_pretrained(tmp_path / model_type).eval()


def direct_splade(model, inputs) -> torch.Tensor:
    """The formula as written: log(1 + ReLU(logits)) of every token, padding zeroed, max over tokens."""
    logits = model(**inputs).prediction_logits.float()  # (B, T, V)
    weights = torch.log1p(torch.relu(logits)) * inputs["attention_mask"][..., None]
    return weights.amax(1)


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_pooling_equals_the_formula_for_every_family(tmp_path, model_type):
    model = family_mlm(tmp_path, model_type)
    ids, mask = padded_batch(99)
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    with torch.no_grad():
        expected = direct_splade(model, inputs)
        whole = splade_vectors(model, inputs)
        sliced = splade_vectors(model, inputs, budget=3 * 99 * 2)  # two positions at a time
    assert expected.shape == (3, 99) and (expected > 0).any()
    assert rel_err(whole, expected) <= 1e-5 and rel_err(sliced, expected) <= 1e-5


def test_sliced_backward_equals_autograd():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 5, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 5, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(11, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 1:] = 0
    target = torch.randn(3, 11, generator=g, dtype=torch.float64)
    projection = VocabProjection(lambda h: h, weight, bias)

    ours = (torch.log1p(torch.relu(max_logits(x, mask, projection, budget=3 * 11 * 2))) * target).sum()
    grads = torch.autograd.grad(ours, [x, weight, bias])
    logits = torch.nn.functional.linear(x, weight, bias).masked_fill(~mask.bool()[..., None], float("-inf"))
    theirs = (torch.log1p(torch.relu(logits.amax(1))) * target).sum()
    expected = torch.autograd.grad(theirs, [x, weight, bias])
    assert torch.allclose(ours, theirs)
    for a, b in zip(grads, expected):
        assert torch.allclose(a, b.to(a.dtype), atol=1e-6), (a - b).abs().max()


# ---------------------------------------------------------------------------------------------- embed
@pytest.fixture(scope="module")
def bert_mlm(tmp_path_factory):
    """A random-weight transformers BertForMaskedLM with the tiny WordPiece vocabulary, saved."""
    root = tmp_path_factory.mktemp("splade")
    vocab = write_vocab(root / "vocab")
    size = len(vocab.read_text().split("\n")) - 1
    torch.manual_seed(0)
    config = transformers.BertConfig(**{**TINY, "vocab_size": size})
    transformers.BertForMaskedLM(config).eval().save_pretrained(root / "mlm")
    transformers.BertTokenizer(str(vocab)).save_pretrained(root / "mlm")
    return root / "mlm"


TEXTS = ["the cat sat on the mat", "paris is the capital of france", "who lives in london ?", "a big river"]


def test_top_k_keeps_the_largest_weights(bert_mlm):
    full = SpladeEncoder.from_pretrained(bert_mlm).encode(TEXTS)
    top = SpladeEncoder.from_pretrained(bert_mlm, top_k=3).encode(TEXTS)
    dense = full.to_dense()
    assert len(top) == len(TEXTS) and full.nnz > 3 * len(TEXTS)
    for i in range(len(TEXTS)):
        ids, w = top.row(i)
        assert len(ids) == 3 and list(ids) == sorted(ids)
        assert np.allclose(w, dense[i, ids]) and w.min() >= np.sort(dense[i])[-3]


def test_embed_jsonl_and_npz_round_trip(bert_mlm, tmp_path, capsys):
    sparse = pytest.importorskip("scipy.sparse")
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    expected = SpladeEncoder.from_pretrained(bert_mlm).encode(TEXTS).to_dense()
    assert main(["embed", "--model", str(bert_mlm), "--pooling", "splade", "--input", str(tmp_path / "in.txt"),
                 "--output", str(tmp_path / "out.npz")]) == 0
    matrix = sparse.load_npz(tmp_path / "out.npz")
    assert matrix.format == "csr" and matrix.shape == expected.shape
    np.testing.assert_allclose(matrix.toarray(), expected, rtol=1e-6)
    np.testing.assert_allclose(SparseRows.load_npz(tmp_path / "out.npz").to_dense(), expected, rtol=1e-6)
    assert main(["embed", "--model", str(bert_mlm), "--pooling", "splade", "--input", str(tmp_path / "in.txt")]) == 0
    lines = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
    assert len(lines) == len(TEXTS)
    for row, line in zip(expected, lines):
        assert set(map(int, line)) == set(np.flatnonzero(row).tolist())
        for token, weight in line.items():
            assert abs(weight - row[int(token)]) <= 1e-6 * max(1.0, row[int(token)])


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_refusals_are_one_line(bert_mlm, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("the cat\n")
    base = ["embed", "--model", str(bert_mlm), "--input", str(tmp_path / "in.txt")]
    for suffix in (".npy", ".safetensors"):
        err = one_line_error(capsys, [*base, "--pooling", "splade", "--output", str(tmp_path / f"o{suffix}")])
        assert "sparse vectors" in err and suffix in err
    assert "needs --pooling splade" in one_line_error(capsys, [*base, "--top-k", "3"])
    assert "at least 1" in one_line_error(capsys, [*base, "--pooling", "splade", "--top-k", "0"])
    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(**{**TINY, "vocab_size": 80})).save_pretrained(tmp_path / "enc")
    write_vocab(tmp_path / "enc")
    capsys.readouterr()  # transformers' save progress
    err = one_line_error(capsys, ["embed", "--model", str(tmp_path / "enc"), "--pooling", "splade",
                                  "--input", str(tmp_path / "in.txt")])
    assert "cls.predictions" in err and "--pooling splade" in err


# ---------------------------------------------------------------------------------------------- sentence-transformers
def test_sparse_encoder_export_encodes_as_bertlab(bert_mlm, tmp_path, capsys):
    st = pytest.importorskip("sentence_transformers")
    out = tmp_path / "st"
    assert main(["export", "sentence-transformers", "--model", str(bert_mlm), "--out", str(out),
                 "--pooling", "splade"]) == 0
    theirs = st.SparseEncoder(str(out), device="cpu").encode(TEXTS, convert_to_tensor=True)
    theirs = theirs.to_dense() if theirs.is_sparse else theirs
    ours = torch.from_numpy(SpladeEncoder.from_pretrained(out).encode(TEXTS).to_dense())
    assert theirs.shape == ours.shape and rel_err(ours, theirs) <= 1e-5
    # the exported folder is read as SPLADE without --pooling
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    assert main(["embed", "--model", str(out), "--input", str(tmp_path / "in.txt"), "--output",
                 str(tmp_path / "o.npz")]) == 0
    np.testing.assert_allclose(SparseRows.load_npz(tmp_path / "o.npz").to_dense(), ours.numpy(), rtol=1e-6)


def test_a_sparse_encoder_s_prompts_are_put_as_encode_query_puts_them(bert_mlm, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    out = tmp_path / "st"
    assert main(["export", "sentence-transformers", "--model", str(bert_mlm), "--out", str(out),
                 "--pooling", "splade"]) == 0
    config = json.loads((out / "config_sentence_transformers.json").read_text())
    config["prompts"] = {"query": "who : ", "document": ""}
    (out / "config_sentence_transformers.json").write_text(json.dumps(config))
    model = st.SparseEncoder(str(out), device="cpu")
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    for kind, encode in (("query", model.encode_query), ("document", model.encode_document)):
        theirs = encode(TEXTS, convert_to_tensor=True)
        theirs = (theirs.to_dense() if theirs.is_sparse else theirs).numpy()
        assert main(["embed", "--model", str(out), "--input", str(tmp_path / "in.txt"), "--text-kind", kind,
                     "--output", str(tmp_path / f"{kind}.npz")]) == 0
        ours = SparseRows.load_npz(tmp_path / f"{kind}.npz").to_dense()
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6, err_msg=kind)
    assert not np.allclose(SparseRows.load_npz(tmp_path / "query.npz").to_dense(),
                           SparseRows.load_npz(tmp_path / "document.npz").to_dense())  # the prompt counted


# ---------------------------------------------------------------------------------------------- serve
def test_embed_sparse_answers_in_tei_shape(bert_mlm):
    pytest.importorskip("fastapi")
    from bertlab.infer.runtime import InferenceOptions
    from bertlab.infer.serve import create_app, load_models, start_in_thread
    from test_infer_serve_api import call

    def tei_embed_sparse(port, inputs, **options) -> list[dict[int, float]]:
        """A client written for TEI: POST /embed_sparse {inputs, ...} -> [[{index, value}]]."""
        status, body = call(port, "POST", "/embed_sparse", {"inputs": inputs, **options})
        assert status == 200, body
        assert isinstance(body, list) and all(isinstance(row, list) for row in body)
        for row in body:
            assert all(set(item) == {"index", "value"} and isinstance(item["index"], int) for item in row)
            assert [item["index"] for item in row] == sorted(item["index"] for item in row)
        return [{item["index"]: item["value"] for item in row} for row in body]

    expected = SpladeEncoder.from_pretrained(bert_mlm).encode(TEXTS).to_dense()
    running = start_in_thread(create_app(load_models(bert_mlm, InferenceOptions())))
    try:
        rows = tei_embed_sparse(running.port, TEXTS, truncate=True, truncation_direction="Right")
        single = tei_embed_sparse(running.port, TEXTS[0])
        status, body = call(running.port, "POST", "/embed_sparse", {"inputs": "x", "prompt_name": "query"})
        assert status == 422 and set(body) == {"error", "error_type"}
        status, body = call(running.port, "POST", "/embed_sparse", {"inputs": "the cat " * 80, "truncate": False})
        assert status == 413 and "truncate" in body["error"]
        status, health = call(running.port, "GET", "/health")
        assert "embed_sparse" in health["endpoints"]
    finally:
        running.stop()
    assert len(rows) == len(TEXTS) and len(single) == 1 and single[0] == rows[0]
    for row, dense in zip(rows, expected):
        assert set(row) == set(np.flatnonzero(dense).tolist())
        assert max(abs(v - dense[i]) for i, v in row.items()) <= 1e-5


def test_embed_sparse_without_a_masked_lm_head_is_424(tmp_path):
    pytest.importorskip("fastapi")
    from bertlab.infer.runtime import InferenceOptions
    from bertlab.infer.serve import create_app, load_models, start_in_thread
    from infer_support import tiny_model
    from test_infer_serve_api import call

    running = start_in_thread(create_app(load_models(tiny_model(tmp_path / "enc"), InferenceOptions())))
    try:
        status, body = call(running.port, "POST", "/embed_sparse", {"inputs": "the cat"})
    finally:
        running.stop()
    assert status == 424 and "masked-LM head" in body["error"]


# ---------------------------------------------------------------------------------------------- search
def test_sparse_search_equals_dense_dot_products():
    from bertlab.train.retrieval.sparse_search import corpus_blocks, sparse_search

    g = torch.Generator().manual_seed(0)
    def random_rows(n):
        dense = torch.rand(n, 300, generator=g) * (torch.rand(n, 300, generator=g) < 0.05)
        return SparseRows.from_dense(dense), dense

    queries, q = random_rows(40)
    corpus, d = random_rows(1000)
    idx, scores = sparse_search(queries, corpus_blocks(corpus, block=128), top_k=10)
    brute = (q.double() @ d.double().T).numpy()
    for i in range(len(q)):
        np.testing.assert_allclose(scores[i], brute[i, idx[i]], rtol=1e-5, atol=1e-6)  # the dot products
        assert scores[i, -1] >= np.sort(brute[i])[-10] - 1e-5  # and the best ones
        assert list(scores[i]) == sorted(scores[i], reverse=True)


# ---------------------------------------------------------------------------------------------- fine-tuning
def write_pairs(path, rows=48, seed=0):
    rng = random.Random(seed)
    words = [w for w in WORDS if w.isalpha()]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["anchor", "positive", "negative"])
        for _ in range(rows):
            a = " ".join(rng.sample(words, 3))
            w.writerow([a, a + " " + rng.choice(words), " ".join(rng.sample(words, 4))])
    return path


def test_splade_finetune_lowers_its_loss_and_writes_a_sparse_encoder(bert_mlm, tmp_path, capsys):
    pairs = write_pairs(tmp_path / "pairs.csv")
    out = tmp_path / "out"
    assert main(["finetune-embeddings", "--model", str(bert_mlm), "--train", str(pairs), "--out", str(out),
                 "--loss", "splade", "--batch-size", "8", "--max-steps", "24", "--lr", "3e-3", "--warmup", "0",
                 "--no-progress", "--seed", "1"]) == 0
    logged = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    ranks = [m["rank_loss"] for m in logged if "rank_loss" in m]
    assert len(ranks) == 24 and np.mean(ranks[-4:]) < 0.7 * np.mean(ranks[:4]), ranks
    assert all(m["flops_query"] >= 0 and m["document_terms"] > 0 for m in logged if "flops_query" in m)
    modules = json.loads((out / "final" / "modules.json").read_text())
    assert modules[1]["type"].endswith("SpladePooling")
    rows = SpladeEncoder.from_pretrained(out / "final").encode(TEXTS)
    assert len(rows) == len(TEXTS) and rows.nnz > 0


def test_splade_warmup_is_quadratic():
    from bertlab.train.retrieval.splade import flops, warmup_scale

    assert [warmup_scale(s, 10) for s in (0, 5, 10, 20)] == [0.0, 0.25, 1.0, 1.0]
    w = torch.tensor([[1.0, 0.0, 2.0], [3.0, 0.0, 0.0]])
    assert float(flops(w)) == pytest.approx(2.0 ** 2 + 1.0 ** 2)


def test_a_new_head_starts_with_a_negative_bias(tmp_path, caplog):
    from bertlab.train.retrieval.splade import NEW_HEAD_BIAS, load_mlm
    from infer_support import tiny_model

    model = load_mlm(tiny_model(tmp_path / "enc"))  # a bare BertModel: no masked-LM weights
    assert torch.all(model.vocab_projection().bias == NEW_HEAD_BIAS)
    assert "new head" in caplog.text


def test_validation_metrics_are_evaluate_retrievals(bert_mlm, tmp_path):
    """Fine-tuning's SPLADE validation (`evaluate_sparse`) gives the metrics `evaluate-retrieval` writes."""
    from bertlab.tasks.retrieval.data import load_retrieval_set
    from bertlab.train.retrieval.evaluate import evaluate_sparse
    from bertlab.infer.st_folder import EmbeddingSettings

    from test_retrieval_eval import CORPUS, QUERIES, write_beir

    data = write_beir(tmp_path / "set", CORPUS, QUERIES, ["q1\td1\t1", "q2\td3\t1", "q3\td2\t1"])
    metrics = evaluate_sparse(SpladeEncoder.from_pretrained(bert_mlm), EmbeddingSettings("splade", False),
                              load_retrieval_set(data), [1, 3])
    assert main(["evaluate-retrieval", "--model", str(bert_mlm), "--pooling", "splade", "--data", str(data),
                 "--k-values", "1,3", "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    assert metrics and metrics == pytest.approx(json.loads((tmp_path / "out" / "results.json").read_text())["metrics"])
