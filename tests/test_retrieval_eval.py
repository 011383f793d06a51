"""`bertlab evaluate-retrieval`: trec_eval's metrics (checked equal to pytrec_eval's), BEIR folders and their
one-line errors, exact search over vectors on disk, the command end to end with a reranker."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from bertlab.cli import main
from bertlab.core.errors import DataError
from bertlab.tasks.retrieval.data import load_retrieval_set
from bertlab.tasks.retrieval.metrics import evaluate_run, ranked
from bertlab.train.retrieval import search

from infer_support import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


def random_case(seed: int, queries: int = 30, docs: int = 60, ties: bool = False):
    rng = random.Random(seed)
    qrels, run = {}, {}
    for q in range(queries):
        judged = rng.sample(range(docs), rng.randint(1, 6))
        qrels[f"q{q}"] = {f"d{d}": rng.choice([0, 1, 1, 2, 3]) for d in judged}
        qrels[f"q{q}"][f"d{judged[0]}"] = rng.randint(1, 3)  # every query has a relevant passage
        retrieved = rng.sample(range(docs), rng.randint(0, 40))
        run[f"q{q}"] = {f"d{d}": float(rng.randint(0, 5)) if ties else rng.random() for d in retrieved}
    return qrels, run


@pytest.mark.parametrize("ties", [False, True])
def test_metrics_equal_pytrec_eval(ties):
    pytrec_eval = pytest.importorskip("pytrec_eval")
    cutoffs = (1, 3, 5, 10, 100)
    for seed in range(5):
        qrels, run = random_case(seed, ties=ties)
        ours = evaluate_run(run, qrels, cutoffs, per_query=(per := {}))
        k = ",".join(map(str, cutoffs))
        reference = pytrec_eval.RelevanceEvaluator(qrels, {f"ndcg_cut.{k}", f"map_cut.{k}", f"recall.{k}",
                                                           f"P.{k}"}).evaluate(run)
        for qid in qrels:
            theirs = reference.get(qid)
            if theirs is None:  # pytrec_eval leaves out a query with an empty run; trec_eval -c scores it 0
                assert all(v == 0 for v in per[qid].values())
                continue
            for c in cutoffs:
                assert per[qid][f"ndcg@{c}"] == pytest.approx(theirs[f"ndcg_cut_{c}"], abs=1e-9)
                assert per[qid][f"map@{c}"] == pytest.approx(theirs[f"map_cut_{c}"], abs=1e-9)
                assert per[qid][f"recall@{c}"] == pytest.approx(theirs[f"recall_{c}"], abs=1e-9)
                assert per[qid][f"p@{c}"] == pytest.approx(theirs[f"P_{c}"], abs=1e-9)
                # MRR@k: trec_eval's recip_rank of the run cut to its top k
                cut = {qid: {d: run[qid][d] for d in ranked(run[qid])[:c]}}
                rr = pytrec_eval.RelevanceEvaluator({qid: qrels[qid]}, {"recip_rank"}).evaluate(cut)
                assert per[qid][f"mrr@{c}"] == pytest.approx(rr.get(qid, {"recip_rank": 0.0})["recip_rank"], abs=1e-9)
        assert set(ours) == {f"{m}@{c}" for m in ("ndcg", "map", "recall", "p", "mrr") for c in cutoffs}


def test_ranking_breaks_ties_as_trec_eval():
    assert ranked({"a": 1.0, "b": 1.0, "c": 2.0}) == ["c", "b", "a"]


def test_metrics_by_hand():
    qrels = {"q": {"a": 1, "b": 2}}
    run = {"q": {"x": 0.9, "b": 0.8, "a": 0.1}}
    m = evaluate_run(run, qrels, (1, 3))
    ideal = 2 + 1 / np.log2(3)
    assert m["ndcg@3"] == pytest.approx((2 / np.log2(3) + 1 / np.log2(4)) / ideal)
    assert m["mrr@1"] == 0 and m["mrr@3"] == 0.5
    assert m["recall@3"] == 1 and m["p@1"] == 0
    assert m["map@3"] == pytest.approx((1 / 2 + 2 / 3) / 2)


def write_beir(folder, corpus, queries, qrels_lines, split="test"):
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (folder / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries))
    (folder / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(l + "\n" for l in qrels_lines))
    return folder


CORPUS = [{"_id": "d1", "title": "paris", "text": "paris is the capital of france"},
          {"_id": "d2", "title": "", "text": "the cat sat on the mat"},
          {"_id": "d3", "text": "john lives in london"},
          {"_id": "d4", "text": "a dog is good"}]
QUERIES = [{"_id": "q1", "text": "what is the capital of france ?"}, {"_id": "q2", "text": "who lives in london ?"},
           {"_id": "q3", "text": "where is the cat ?"}]


def evaluated_with(model, folder, tmp_path, *flags, **encode) -> None:
    """`evaluate-retrieval` of `folder` on CORPUS and QUERIES: every score of its run (OUT/run.trec) is
    sentence-transformers' `model.similarity` of the query and the passage (title and text joined as BEIR joins
    them), each encoded by `encode_query` / `encode_document` with `encode`'s arguments."""
    data = write_beir(tmp_path / "set", CORPUS, QUERIES, ["q1\td1\t1", "q2\td3\t1", "q3\td2\t1"])
    out = tmp_path / "eval"
    assert main(["evaluate-retrieval", "--model", str(folder), "--data", str(data), "--out", str(out),
                 "--store", "float32", "--no-progress", *flags]) == 0
    passages = [(d.get("title", "") + " " + d["text"]).strip() if d.get("title") else d["text"] for d in CORPUS]
    theirs = model.similarity(model.encode_query([q["text"] for q in QUERIES], **encode),
                              model.encode_document(passages, **encode))
    rows = [line.split() for line in (out / "run.trec").read_text().splitlines()]
    assert {r[0] for r in rows} == {q["_id"] for q in QUERIES}
    for qid, _, doc, _, score, _ in rows:
        i, j = [q["_id"] for q in QUERIES].index(qid), [d["_id"] for d in CORPUS].index(doc)
        assert float(score) == pytest.approx(float(theirs[i, j]), rel=1e-5, abs=1e-6), (qid, doc)


def test_beir_folder_is_read(tmp_path):
    folder = write_beir(tmp_path / "set", CORPUS, QUERIES, ["q1\td1\t1", "q2\td3\t2", "q2\td4\t0"])
    data = load_retrieval_set(folder)
    assert data.corpus_texts[0] == "paris paris is the capital of france"  # BEIR: title + " " + text
    assert list(data.queries) == ["q1", "q2"]  # only the judged queries are evaluated
    assert data.qrels == {"q1": {"d1": 1}, "q2": {"d3": 2, "d4": 0}}


def test_csv_files_and_trec_qrels(tmp_path):
    (tmp_path / "c.csv").write_text("id,text\nd1,paris is big\nd2,the cat\n")
    (tmp_path / "q.csv").write_text("qid,query\nq1,paris ?\n")
    (tmp_path / "qrels.txt").write_text("q1 0 d1 1\nq1 0 d2 0\n")
    data = load_retrieval_set(corpus=tmp_path / "c.csv", queries=tmp_path / "q.csv", qrels=tmp_path / "qrels.txt")
    assert data.qrels == {"q1": {"d1": 1, "d2": 0}} and data.corpus_ids == ["d1", "d2"]


@pytest.mark.parametrize("lines, message", [
    (["q1\td9\t1"], "test.tsv:2: passage id 'd9' (query 'q1') is not in the corpus"),
    (["q7\td1\t1"], "test.tsv:2: query id 'q7' is not among the queries"),
    (["q1\td1\t1", "q2\td3\t0"], "test.tsv:3: query 'q2' has no relevant passage"),
    (["q1\td1"], "test.tsv:2: expected 'query-id corpus-id score'"),
    (["q1\td1\t1", "q1\td1\t1"], "test.tsv:3: query 'q1' and passage 'd1' judged again"),
    (["q1\td1\tyes"], "test.tsv:2: relevance 'yes' is not an integer"),
])
def test_bad_qrels_is_one_line(tmp_path, lines, message):
    folder = write_beir(tmp_path / "set", CORPUS, QUERIES, lines)
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_retrieval_set(folder)


def test_bad_corpus_and_folder(tmp_path):
    folder = write_beir(tmp_path / "set", CORPUS + [{"_id": "d1", "text": "again"}], QUERIES, ["q1\td1\t1"])
    with pytest.raises(DataError, match=r"corpus.jsonl:5: passage id 'd1' again \(first at line 1\)"):
        load_retrieval_set(folder)
    with pytest.raises(DataError, match="no qrels/dev.tsv or qrels.tsv \\(qrels splits there: test\\)"):
        load_retrieval_set(folder, split="dev")
    bad = write_beir(tmp_path / "set2", CORPUS, [{"_id": "q1", "text": "  "}], ["q1\td1\t1"])
    with pytest.raises(DataError, match="queries.jsonl:1: query 'q1' is empty"):
        load_retrieval_set(bad)


@pytest.mark.parametrize("store, exact", [("float32", True), ("float16", False), ("int8", False)])
def test_exact_search_is_brute_force(tmp_path, monkeypatch, store, exact):
    monkeypatch.setattr(search, "CORPUS_BLOCK", 7)  # many blocks: the running top-k merge is exercised
    monkeypatch.setattr(search, "QUERY_BLOCK", 3)
    monkeypatch.setattr(search, "CORPUS_CHUNK", 5)
    rng = np.random.default_rng(0)
    corpus = rng.normal(size=(50, 8)).astype(np.float32)
    queries = rng.normal(size=(10, 8)).astype(np.float32)
    store_ = search.encode_to_disk(lambda texts: corpus[[int(t) for t in texts]], [str(i) for i in range(50)], 8,
                                   tmp_path / "v.npy", store)
    idx, scores = search.exact_search(queries, store_, 12)
    full = queries @ corpus.T
    expected = np.argsort(-full, axis=1)[:, :12]
    if exact:
        assert (idx == expected).all()
        np.testing.assert_allclose(scores, np.take_along_axis(full, expected, 1), rtol=1e-6)
    else:  # quantised vectors: scores close to exact, the best passage the same almost always
        np.testing.assert_allclose(scores, np.take_along_axis(full, idx, 1), atol=0.1)
        assert (idx[:, 0] == expected[:, 0]).mean() >= 0.9


def test_command_end_to_end_with_reranker(tmp_path, capsys):
    pytrec_eval = pytest.importorskip("pytrec_eval")
    model = tiny_model(tmp_path / "model")
    reranker = tiny_model(tmp_path / "reranker", "BertForSequenceClassification", id2label={0: "relevant"})
    folder = write_beir(tmp_path / "set", CORPUS, QUERIES, ["q1\td1\t1", "q2\td3\t1", "q3\td2\t1", "q3\td4\t1"])
    out = tmp_path / "out"
    assert main(["evaluate-retrieval", "--model", str(model), "--data", str(folder), "--out", str(out),
                 "--k-values", "1,3,10", "--reranker", str(reranker), "--rerank-top", "3", "--no-progress"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["metrics"]) >= {"ndcg@10", "mrr@10", "recall@3", "map@10", "p@1"}
    assert results["queries"] == 3 and results["passages"] == 4 and "reranked" in results
    # the run file, scored by pytrec_eval, gives the figures of results.json
    run: dict = {}
    lines = (out / "run.trec").read_text().splitlines()
    assert len(lines) == 12 and lines[0].split()[1] == "Q0" and lines[0].split()[3] == "1"
    for line in lines:
        qid, _, doc, _, score, _ = line.split()
        run.setdefault(qid, {})[doc] = float(score)
    qrels = load_retrieval_set(folder).qrels
    per = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.3"}).evaluate(run)
    assert results["metrics"]["ndcg@10"] == pytest.approx(np.mean([v["ndcg_cut_10"] for v in per.values()]), abs=1e-5)
    assert results["metrics"]["recall@3"] == pytest.approx(np.mean([v["recall_3"] for v in per.values()]), abs=1e-5)
    assert len((out / "run.reranked.trec").read_text().splitlines()) == 9
    assert not list(out.glob("*.npy")) and "ndcg" in capsys.readouterr().out


def test_command_bad_input_is_one_line(tmp_path, capsys):
    model = tiny_model(tmp_path / "model")
    folder = write_beir(tmp_path / "set", CORPUS, QUERIES, ["q1\td9\t1"])
    assert main(["evaluate-retrieval", "--model", str(model), "--data", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "passage id 'd9'" in err


def test_bm25_row(tmp_path):
    pytest.importorskip("bm25s")
    model = tiny_model(tmp_path / "model")
    folder = write_beir(tmp_path / "set", CORPUS, QUERIES, ["q1\td1\t1", "q2\td3\t1", "q3\td2\t1"])
    out = tmp_path / "out"
    assert main(["evaluate-retrieval", "--model", str(model), "--data", str(folder), "--out", str(out),
                 "--k-values", "1,10", "--bm25", "--no-progress"]) == 0
    results = json.loads((out / "results.json").read_text())
    # the words of each query are in its passage only: BM25 puts every relevant passage first
    assert results["bm25"]["mrr@10"] == 1.0 and results["bm25"]["ndcg@1"] == 1.0
    assert len((out / "run.bm25.trec").read_text().splitlines()) == 12


@pytest.mark.slow
def test_squad_retrieval_equals_pytrec_eval(tmp_path, shared_data, minilm_dir):
    """Every answerable SQuAD v1.1 dev question against all dev paragraphs with all-MiniLM-L6-v2: the figures
    of results.json are pytrec_eval's on the run file (the guide's table)."""
    pytrec_eval = pytest.importorskip("pytrec_eval")
    from bertlab.tasks.retrieval.squad import squad_retrieval_set, write_beir

    data = squad_retrieval_set(shared_data / "squad" / "dev-v1.1.json")
    assert (len(data.queries), len(data.corpus_ids)) == (10570, 2067)
    folder = write_beir(data, tmp_path / "squad")
    out = tmp_path / "out"
    assert main(["evaluate-retrieval", "--model", str(minilm_dir), "--data", str(folder), "--out", str(out),
                 "--k-values", "10,100", "--no-progress"]) == 0
    ours = json.loads((out / "results.json").read_text())["metrics"]
    run: dict = {}
    for line in (out / "run.trec").read_text().splitlines():
        qid, _, doc, _, score, _ = line.split()
        run.setdefault(qid, {})[doc] = float(score)
    per = pytrec_eval.RelevanceEvaluator(data.qrels, {"ndcg_cut.10", "recall.100"}).evaluate(run)
    top10 = {q: {d: run[q][d] for d in ranked(run[q])[:10]} for q in run}
    rr = pytrec_eval.RelevanceEvaluator(data.qrels, {"recip_rank"}).evaluate(top10)
    assert ours["ndcg@10"] == pytest.approx(np.mean([v["ndcg_cut_10"] for v in per.values()]), abs=1e-4)
    assert ours["recall@100"] == pytest.approx(np.mean([v["recall_100"] for v in per.values()]), abs=1e-4)
    assert ours["mrr@10"] == pytest.approx(np.mean([v["recip_rank"] for v in rr.values()]), abs=1e-4)
    assert ours["ndcg@10"] == pytest.approx(0.7719, abs=2e-3)
