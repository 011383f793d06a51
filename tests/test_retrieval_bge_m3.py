"""BGE-M3: a random-weight XLM-R with random sparse and ColBERT layers gives the dense vectors, lexical weights,
ColBERT vectors and scores of FlagEmbedding's `BGEM3FlagModel` -- its steps written out from its source over
`transformers` (always), and FlagEmbedding itself where it is installed -- within a relative error of 1e-5, an
8,192-token input included; `embed --vectors`, `evaluate-retrieval` (each output and the hybrid, against a
brute-force scan) and `serve` (/embed, /embed_sparse, /embed_multivector, /rerank) on such a folder; one-line
refusals of bad layer files and misplaced flags."""

from __future__ import annotations

import io
import json
import random
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

from bertlab.cli import main
from bertlab.core.errors import BertlabError
from bertlab.infer import bge_m3
from bertlab.infer.runtime import InferenceOptions

from own_data_support import news_rows
from test_retrieval_eval import CORPUS, QUERIES, write_beir

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["what is the capital of france ?", "paris is the capital of france", "the team said the goal was late",
         "a", "markets fell as the bank raised rates, the minister said on monday"]
HIDDEN = 32


def relative_error(ours, theirs) -> float:
    ours, theirs = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    return float(np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-30))


def sentencepiece_folder(folder: Path, model_max_length: int) -> None:
    """An XLM-R SentencePiece tokenizer trained on news-like text, saved with its length limit."""
    from bertlab.models.xlm_roberta.tokenizer import XLMRobertaTokenizer

    texts = [r["text"] for r in news_rows(300, seed=11)] + TEXTS * 3
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=model, vocab_size=200,
                                   model_type="unigram", character_coverage=1.0, hard_vocab_limit=False,
                                   minloglevel=2)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sentencepiece.bpe.model").write_bytes(model.getvalue())
    XLMRobertaTokenizer(folder / "sentencepiece.bpe.model", model_max_length=model_max_length).save_pretrained(folder)


def m3_folder(folder: Path, hidden: int = HIDDEN, heads: int = 4, positions: int = 8194, seed: int = 0) -> Path:
    """A BGE-M3-shaped folder: a random XLM-R with BGE-M3's 8,194 positions, its tokenizer, and the two layers
    saved as FlagEmbedding saves them (`torch.save` of each `nn.Linear`'s state dict)."""
    from bertlab.models.xlm_roberta.tokenizer import XLMRobertaTokenizer

    sentencepiece_folder(folder, positions - 2)
    tok = XLMRobertaTokenizer.from_pretrained(folder)
    torch.manual_seed(seed)
    config = transformers.XLMRobertaConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=2,
                                           num_attention_heads=heads, intermediate_size=37,
                                           max_position_embeddings=positions, hidden_dropout_prob=0.0,
                                           attention_probs_dropout_prob=0.0)
    transformers.XLMRobertaModel(config).eval().save_pretrained(folder)
    torch.save(torch.nn.Linear(hidden, 1).state_dict(), folder / bge_m3.SPARSE_FILE)
    torch.save(torch.nn.Linear(hidden, hidden).state_dict(), folder / bge_m3.COLBERT_FILE)
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return m3_folder(tmp_path_factory.mktemp("m3") / "bge-m3")


# ---------------------------------------------------------------------------------------------- FlagEmbedding's steps
def flag_reference(folder: Path, texts: list[str], max_length: int) -> dict:
    """FlagEmbedding's `M3Embedder.encode_single_device` and `EncoderOnlyEmbedderM3Model`'s embeddings, written
    out from its source over `transformers` alone: AutoTokenizer with truncation=True, `tokenizer.pad`, the
    model's last layer; dense = normalize(h[:, 0]); token weights relu(sparse_linear(h)) kept per id at their
    largest when > 0 and not the cls / eos / pad / unk token (`_process_token_weights`); colbert =
    normalize(colbert_linear(h[:, 1:]) * mask[:, 1:]) cut to the tokens after <s> (`_process_colbert_vecs`)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModel.from_pretrained(str(folder)).eval()
    hidden = model.config.hidden_size
    colbert_linear, sparse_linear = torch.nn.Linear(hidden, hidden), torch.nn.Linear(hidden, 1)
    colbert_linear.load_state_dict(torch.load(folder / "colbert_linear.pt", map_location="cpu"))
    sparse_linear.load_state_dict(torch.load(folder / "sparse_linear.pt", map_location="cpu"))
    unused_tokens = set()
    for _token in ["cls_token", "eos_token", "pad_token", "unk_token"]:
        if _token in tokenizer.special_tokens_map:
            unused_tokens.add(tokenizer.convert_tokens_to_ids(tokenizer.special_tokens_map[_token]))

    def _process_token_weights(token_weights, input_ids):
        result = defaultdict(int)
        for w, idx in zip(token_weights, input_ids):
            if idx not in unused_tokens and w > 0:
                idx = str(idx)
                if w > result[idx]:
                    result[idx] = w
        return result

    inputs = tokenizer(texts, truncation=True, max_length=max_length)
    batch = tokenizer.pad([{k: inputs[k][i] for k in inputs.keys()} for i in range(len(texts))], padding=True,
                          return_tensors="pt")
    with torch.no_grad():
        last_hidden_state = model(**batch, return_dict=True).last_hidden_state
        dense = torch.nn.functional.normalize(last_hidden_state[:, 0], dim=-1)
        token_weights = torch.relu(sparse_linear(last_hidden_state)).squeeze(-1)
        colbert = colbert_linear(last_hidden_state[:, 1:]) * batch["attention_mask"][:, 1:][:, :, None].float()
        colbert = torch.nn.functional.normalize(colbert, dim=-1)
    lexical = list(map(_process_token_weights, token_weights.numpy(), batch["input_ids"].numpy().tolist()))
    vecs = [v[:np.sum(m) - 1] for v, m in zip(colbert.numpy(), batch["attention_mask"].numpy())]
    return {"dense_vecs": dense.numpy(), "lexical_weights": lexical, "colbert_vecs": vecs,
            "input_ids": inputs["input_ids"]}


def flag_lexical_score(lw1, lw2):  # M3Embedder.compute_lexical_matching_score
    scores = 0
    for token, weight in lw1.items():
        if token in lw2:
            scores += weight * lw2[token]
    return scores


def flag_colbert_score(q_reps, p_reps):  # M3Embedder.colbert_score
    q_reps, p_reps = torch.from_numpy(q_reps), torch.from_numpy(p_reps)
    token_scores = torch.einsum("in,jn->ij", q_reps, p_reps)
    scores, _ = token_scores.max(-1)
    return torch.sum(scores) / q_reps.size(0)


def as_dict(rows, i) -> dict[str, float]:
    ids, w = rows.row(i)
    return {str(t): float(v) for t, v in zip(ids.tolist(), w.tolist())}


def check_outputs(ours: bge_m3.M3Output, theirs: dict) -> None:
    assert relative_error(ours.dense, theirs["dense_vecs"]) <= 1e-5
    for i, lw in enumerate(theirs["lexical_weights"]):
        mine = as_dict(ours.sparse, i)
        assert set(mine) == set(lw), i
        if lw:
            keys = sorted(lw)
            assert relative_error([mine[k] for k in keys], [lw[k] for k in keys]) <= 1e-5
    for mine, vecs in zip(ours.colbert, theirs["colbert_vecs"]):
        assert mine.shape == vecs.shape
        assert relative_error(mine, vecs) <= 1e-5


def test_outputs_and_scores_are_flagembeddings_steps(folder):
    ours = bge_m3.BgeM3Encoder.from_pretrained(folder, InferenceOptions(max_seq_length=24))
    out = ours.encode(TEXTS)
    theirs = flag_reference(folder, TEXTS, 24)
    check_outputs(out, theirs)
    assert any(len(lw) for lw in theirs["lexical_weights"])  # the random layer leaves weights to compare
    assert any(len(ids) == 24 for ids in theirs["input_ids"])  # one text was cut, </s> kept, as FlagEmbedding cuts
    assert ours.unused.tolist() == [0, 1, 2, 3]  # <s>, <pad>, </s>, <unk>
    # the scores: each query (row) against each passage, and compute_score's weighted hybrid
    for i in range(len(TEXTS)):
        query = bge_m3.M3Output(out.dense[i:i + 1], out.sparse.take([i]), [out.colbert[i]])
        scores = bge_m3.pair_scores(query, out)
        for j in range(len(TEXTS)):
            dense = float(theirs["dense_vecs"][i] @ theirs["dense_vecs"][j])
            sparse = float(flag_lexical_score(theirs["lexical_weights"][i], theirs["lexical_weights"][j]))
            colbert = float(flag_colbert_score(theirs["colbert_vecs"][i], theirs["colbert_vecs"][j]))
            hybrid = (colbert * 0.4 + sparse * 0.2 + dense * 0.4) / 1.0
            for name, value in (("dense", dense), ("sparse", sparse), ("colbert", colbert), ("hybrid", hybrid)):
                assert scores[name][j] == pytest.approx(value, rel=1e-5, abs=1e-6), (name, i, j)


def test_an_8192_token_input(tmp_path):
    """BGE-M3's length: 8,194 positions hold 8,192 tokens, the default limit of its tokenizer; a longer text is
    cut there, and the three outputs of the whole 8,192 tokens are FlagEmbedding's."""
    folder = m3_folder(tmp_path / "long", hidden=16, heads=1)
    rng = random.Random(3)
    words = " ".join(rng.choice(["market", "bank", "rates", "goal", "team", "said", "monday", "paris"])
                     for _ in range(9000))
    ours = bge_m3.BgeM3Encoder.from_pretrained(folder)
    assert ours.max_length == 8192
    out = ours.encode([words, "a short one"])
    theirs = flag_reference(folder, [words, "a short one"], 8192)
    assert len(theirs["input_ids"][0]) == 8192 and out.colbert[0].shape == (8191, 16)
    check_outputs(out, theirs)


def flagembedding_model(folder, monkeypatch):
    """FlagEmbedding's own `BGEM3FlagModel` (its `M3Embedder`) on the folder, where FlagEmbedding is installed.
    FlagEmbedding 1.4.2 installs beside transformers 5 but its package `__init__` imports every model it has, and
    its LLM rerankers import `transformers.modeling_attn_mask_utils`, which transformers 5 removed: when the plain
    import fails so, the M3 module is loaded from the installed files under stand-in parent packages (their
    `__init__`s are what fails; the M3 code is FlagEmbedding's, unchanged)."""
    import importlib.util
    import sys
    import types

    spec = importlib.util.find_spec("FlagEmbedding")
    if spec is None:
        pytest.skip("FlagEmbedding is not installed")
    try:
        from FlagEmbedding import BGEM3FlagModel
    except ImportError:
        root = Path(spec.origin).parent
        for name in ("FlagEmbedding", "FlagEmbedding.inference", "FlagEmbedding.inference.embedder",
                     "FlagEmbedding.inference.embedder.encoder_only"):
            stand_in = types.ModuleType(name)
            stand_in.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
            monkeypatch.setitem(sys.modules, name, stand_in)
        from FlagEmbedding.inference.embedder.encoder_only.m3 import M3Embedder as BGEM3FlagModel
    return BGEM3FlagModel(str(folder), use_fp16=False, devices="cpu", query_max_length=24, passage_max_length=24)


def test_flagembedding_gives_the_same_outputs_and_scores(folder, monkeypatch):
    model = flagembedding_model(folder, monkeypatch)
    theirs = model.encode(TEXTS, max_length=24, return_dense=True, return_sparse=True, return_colbert_vecs=True)
    ours = bge_m3.BgeM3Encoder.from_pretrained(folder, InferenceOptions(max_seq_length=24))
    out = ours.encode(TEXTS)
    check_outputs(out, theirs)
    pairs = [[q, p] for q in TEXTS[:2] for p in TEXTS]
    # one pair a batch: the passage is not padded (a padded passage's zero vectors would enter ColBERT's max)
    scores = model.compute_score(pairs, batch_size=1, max_query_length=24, max_passage_length=24,
                                 weights_for_different_modes=list(bge_m3.HYBRID_WEIGHTS))
    for k, (q, p) in enumerate(pairs):
        i, j = TEXTS.index(q), TEXTS.index(p)
        mine = bge_m3.pair_scores(bge_m3.M3Output(out.dense[i:i + 1], out.sparse.take([i]), [out.colbert[i]]),
                                  bge_m3.M3Output(out.dense[j:j + 1], out.sparse.take([j]), [out.colbert[j]]))
        for name, key in (("dense", "dense"), ("sparse", "sparse"), ("colbert", "colbert"),
                          ("hybrid", "colbert+sparse+dense")):
            assert float(mine[name][0]) == pytest.approx(scores[key][k], rel=1e-5, abs=1e-6), (name, q, p)


# ---------------------------------------------------------------------------------------------- the layer files
@pytest.mark.parametrize("case,message", [
    ("missing", "colbert_linear.pt is missing"),
    ("shape", "needs weight (1, 32) and bias (1,)"),
    ("keys", "expected a linear layer's floating-point weight and bias"),
    ("pickle", "not a state dict torch.load(weights_only=True) reads"),
])
def test_bad_layer_files_are_one_line(folder, tmp_path, case, message):
    import shutil

    bad = Path(shutil.copytree(folder, tmp_path / "bad"))
    if case == "missing":
        (bad / bge_m3.COLBERT_FILE).unlink()
    elif case == "shape":
        torch.save(torch.nn.Linear(HIDDEN, 2).state_dict(), bad / bge_m3.SPARSE_FILE)
    elif case == "keys":
        torch.save({"weight": torch.zeros(1, HIDDEN)}, bad / bge_m3.SPARSE_FILE)
    else:
        torch.save({"weight": torch.zeros(1, HIDDEN), "bias": torch.zeros(1), "x": Path(".")}, bad / bge_m3.SPARSE_FILE)
    with pytest.raises(BertlabError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        bge_m3.BgeM3Encoder.from_pretrained(bad)
    assert len(str(e.value).splitlines()) == 1


def test_hybrid_weights_are_checked():
    assert bge_m3.parse_weights("1,0.3,1") == (1.0, 0.3, 1.0)
    for bad in ("1,2", "a,b,c", "0,0,0", "-1,1,1", "nan,1,1"):
        with pytest.raises(BertlabError, match="three non-negative numbers"):
            bge_m3.parse_weights(bad)


# ---------------------------------------------------------------------------------------------- the commands
def test_embed_writes_each_output(folder, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    ours = bge_m3.BgeM3Encoder.from_pretrained(folder).encode(TEXTS)
    base = ["embed", "--model", str(folder), "--input", str(texts)]
    assert main([*base, "--output", str(tmp_path / "dense.npy")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "dense.npy"), ours.dense, rtol=1e-5, atol=1e-6)
    assert main([*base, "--vectors", "sparse", "--output", str(tmp_path / "sparse.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "sparse.jsonl").read_text().splitlines()]
    for i, row in enumerate(rows):
        assert row.keys() == as_dict(ours.sparse, i).keys()
        assert list(row.values()) == pytest.approx(list(as_dict(ours.sparse, i).values()), rel=1e-6)
    assert main([*base, "--vectors", "sparse", "--top-k", "2", "--output", str(tmp_path / "top.npz")]) == 0
    from bertlab.infer.sparse import SparseRows

    top = SparseRows.load_npz(tmp_path / "top.npz")
    for i in range(len(TEXTS)):
        ids, w = ours.sparse.row(i)
        best = sorted(zip(-w, ids))[:2]
        assert sorted(top.row(i)[0].tolist()) == sorted(int(t) for _, t in best)
    assert main([*base, "--vectors", "colbert", "--output", str(tmp_path / "colbert.npz")]) == 0
    with np.load(tmp_path / "colbert.npz") as z:
        for i, v in enumerate(ours.colbert):
            np.testing.assert_allclose(z["vectors"][z["offsets"][i]:z["offsets"][i + 1]], v, rtol=1e-5, atol=1e-6)
    assert main([*base, "--vectors", "all", "--output", str(tmp_path / "all.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "all.jsonl").read_text().splitlines()]
    assert len(rows) == len(TEXTS) and set(rows[0]) == {"dense", "sparse", "colbert"}
    np.testing.assert_allclose(rows[2]["dense"], ours.dense[2], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rows[2]["colbert"], ours.colbert[2], rtol=1e-5, atol=1e-6)
    assert rows[2]["sparse"].keys() == as_dict(ours.sparse, 2).keys()


@pytest.mark.parametrize("extra,message", [
    (["--pooling", "mean"], "a BGE-M3 folder's outputs are picked with --vectors"),
    (["--vectors", "colbert", "--top-k", "3"], "--top-k prunes sparse vectors; it needs --vectors sparse or all"),
    (["--vectors", "all", "--output", "x.npz"], "--vectors all writes JSON Lines"),
    (["--vectors", "sparse", "--output", "x.npy"], "--vectors sparse writes sparse vectors as JSON Lines"),
])
def test_embed_refusals_are_one_line(folder, tmp_path, capsys, extra, message):
    (tmp_path / "t.txt").write_text("a dog\n")
    extra = [str(tmp_path / e) if e.startswith("x.") else e for e in extra]
    assert main(["embed", "--model", str(folder), "--input", str(tmp_path / "t.txt"), *extra]) != 0
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_vectors_needs_a_bge_m3_folder(tmp_path, capsys):
    from infer_support import tiny_model

    (tmp_path / "t.txt").write_text("a dog\n")
    model = tiny_model(tmp_path / "plain")
    assert main(["embed", "--model", str(model), "--input", str(tmp_path / "t.txt"), "--vectors", "sparse"]) != 0
    err = capsys.readouterr().err.strip()
    assert "--vectors picks among a BGE-M3 folder's outputs" in err and len(err.splitlines()) == 1


def test_evaluate_retrieval_each_output_and_the_hybrid(folder, tmp_path, capsys):
    from bertlab.tasks.retrieval.data import load_retrieval_set

    data = write_beir(tmp_path / "set", CORPUS, QUERIES, ["q1\td1\t1", "q2\td3\t1", "q3\td2\t1"])
    out = tmp_path / "out"
    assert main(["evaluate-retrieval", "--model", str(folder), "--data", str(data), "--out", str(out),
                 "--store", "float32", "--k-values", "1,3", "--no-progress"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["modes"]) == {"dense", "sparse", "colbert"} and results["hybrid_weights"] == [0.4, 0.2, 0.4]
    assert results["pooling"] == "bge-m3 all" and "hybrid of dense, sparse, colbert" in capsys.readouterr().out
    # the run file is the brute-force hybrid: every passage scored, the top 3 kept
    s = load_retrieval_set(data)
    encoder = bge_m3.BgeM3Encoder.from_pretrained(folder)
    passages = encoder.encode(s.corpus_texts)
    run: dict = {}
    for line in (out / "run.trec").read_text().splitlines():
        qid, _, doc, _, score, _ = line.split()
        run.setdefault(qid, {})[doc] = float(score)
    for qid, text in s.queries.items():
        scores = bge_m3.pair_scores(encoder.encode([text]), passages)["hybrid"]
        best = np.argsort(-scores)[:3]
        assert list(run[qid]) == [s.corpus_ids[b] for b in best]
        assert list(run[qid].values()) == pytest.approx(scores[best].tolist(), rel=1e-5, abs=1e-6)
    # one output alone: its own ranking (the ColBERT scores averaged over the query's vectors)
    assert main(["evaluate-retrieval", "--model", str(folder), "--data", str(data), "--out", str(tmp_path / "c"),
                 "--store", "float32", "--vectors", "colbert", "--no-progress"]) == 0
    one = json.loads((tmp_path / "c" / "results.json").read_text())
    assert "modes" not in one and one["pooling"] == "bge-m3 colbert"
    first = (tmp_path / "c" / "run.trec").read_text().splitlines()[0].split()
    scores = bge_m3.pair_scores(encoder.encode([s.queries[first[0]]]), passages)["colbert"]
    assert float(first[4]) == pytest.approx(float(scores.max()), rel=1e-5)


def test_evaluate_retrieval_refusals(folder, tmp_path, capsys):
    from infer_support import tiny_model

    data = write_beir(tmp_path / "set", CORPUS, QUERIES, ["q1\td1\t1"])
    assert main(["evaluate-retrieval", "--model", str(folder), "--data", str(data), "--pooling", "cls",
                 "--no-progress"]) != 0
    assert "outputs are picked with --vectors" in capsys.readouterr().err
    assert main(["evaluate-retrieval", "--model", str(tiny_model(tmp_path / "plain")), "--data", str(data),
                 "--vectors", "all", "--no-progress"]) != 0
    assert "--vectors picks among a BGE-M3 folder's outputs" in capsys.readouterr().err
    assert main(["evaluate-retrieval", "--model", str(folder), "--data", str(data), "--hybrid-weights", "1,1",
                 "--no-progress"]) != 0
    assert "three non-negative numbers" in capsys.readouterr().err


def test_serve_answers_the_three_outputs_and_a_hybrid_rerank(folder):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from bertlab.infer.serve import create_app, load_models, start_in_thread

    from test_infer_serve import LIMITS, call

    encoder = bge_m3.BgeM3Encoder.from_pretrained(folder)
    texts = ["the cat sat on the mat", "paris is the capital of france", "a dog"]
    ours = encoder.encode(texts)
    running = start_in_thread(create_app(load_models(folder, InferenceOptions()), LIMITS))
    try:
        status, out = call(running, "POST", "/embed", {"inputs": texts})
        assert status == 200 and relative_error(out, ours.dense) <= 1e-5
        status, out = call(running, "POST", "/embed_sparse", {"inputs": texts})
        assert status == 200
        for i, answer in enumerate(out):
            assert {str(a["index"]): a["value"] for a in answer} == pytest.approx(as_dict(ours.sparse, i), rel=1e-5)
        status, out = call(running, "POST", "/embed_multivector", {"inputs": texts})
        assert status == 200 and all(relative_error(o, v) <= 1e-5 for o, v in zip(out, ours.colbert))
        status, out = call(running, "POST", "/rerank", {"query": "the capital of france", "texts": texts})
        scores = bge_m3.pair_scores(encoder.encode(["the capital of france"]), ours)["hybrid"]
        assert status == 200 and [a["index"] for a in out] == np.argsort(-scores, kind="stable").tolist()
        assert [a["score"] for a in out] == pytest.approx(sorted(scores.tolist(), reverse=True), rel=1e-5)
        status, info = call(running, "GET", "/info")
        assert info["pooling"] == "cls" and {"embed", "embed_sparse", "embed_multivector"} <= set(info["endpoints"])
    finally:
        running.stop()
