"""`bertlab mine-negatives` and `bertlab finetune-reranker`: mined negatives are never the anchor's positives
and respect rank range and margin; the reranker trains with each loss, loads in sentence-transformers'
CrossEncoder with the same scores, and is served by /rerank."""

from __future__ import annotations

import csv
import dataclasses
import json

import numpy as np
import pytest

from bertlab.cli import main

from infer_support import tiny_model
from test_retrieval_finetune import write_pairs

pytestmark = pytest.mark.usefixtures("one_thread")


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_mined_negatives_are_not_positives(tmp_path, capsys):
    model = tiny_model(tmp_path / "m")
    pairs = write_pairs(tmp_path / "pairs.csv", rows=30, negatives=False)
    # one anchor with two positives: neither may be mined as its negative
    rows = read_csv(pairs)
    with open(pairs, "a", newline="") as f:
        csv.writer(f).writerow([rows[0]["anchor"], rows[1]["positive"]])
    out = tmp_path / "mined.csv"
    assert main(["mine-negatives", "--model", str(model), "--train", str(pairs), "--output", str(out),
                 "--num-negatives", "2", "--range-min", "1", "--relative-margin", "0", "--no-progress"]) == 0
    counts = json.loads(capsys.readouterr().out)
    mined = read_csv(out)
    assert counts["written"] == len(mined) > 0 and list(mined[0]) == ["anchor", "positive", "negative_1", "negative_2"]
    own = {}
    for r in read_csv(pairs):
        own.setdefault(r["anchor"], set()).add(r["positive"])
    for r in mined:
        assert r["negative_1"] not in own[r["anchor"]] and r["negative_2"] not in own[r["anchor"]]
        assert r["negative_1"] != r["negative_2"]
    # the margin: with 0.99, a negative must score at most 1% of its positive -- almost none do
    assert main(["mine-negatives", "--model", str(model), "--train", str(pairs), "--output", str(out),
                 "--relative-margin", "0.99", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["written"] < counts["written"]


def test_mining_keeps_to_the_rank_range(tmp_path, capsys):
    """Candidates ranked before --range-min are never taken: with 30 candidates and ranks 28..30 left, no
    anchor finds 3 negatives (each has its own positive among the 30)."""
    model = tiny_model(tmp_path / "m")
    pairs = write_pairs(tmp_path / "pairs.csv", rows=30, negatives=False)
    out = tmp_path / "mined.csv"
    assert main(["mine-negatives", "--model", str(model), "--train", str(pairs), "--output", str(out),
                 "--num-negatives", "3", "--range-min", "28", "--range-max", "40", "--relative-margin", "0",
                 "--no-progress"]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts["written"] == 0 and counts["dropped"] == 30


def groups_file(tmp_path):
    model = tiny_model(tmp_path / "emb")
    pairs = write_pairs(tmp_path / "pairs.csv", rows=24, negatives=False)
    out = tmp_path / "groups.csv"
    assert main(["mine-negatives", "--model", str(model), "--train", str(pairs), "--output", str(out),
                 "--num-negatives", "3", "--relative-margin", "0", "--no-progress"]) == 0
    return out


@pytest.mark.parametrize("loss", ["bce", "listwise", "distill"])
def test_reranker_trains_with_each_loss(tmp_path, loss, capsys):
    model = tiny_model(tmp_path / "m")
    if loss == "distill":
        train = tmp_path / "scores.csv"
        train.write_text("query,passage,score\n" + "".join(f"the cat {i},a dog {i},{i / 3:.2f}\n" for i in range(12)))
    else:
        train = groups_file(tmp_path)
    capsys.readouterr()
    out = tmp_path / "out"
    assert main(["finetune-reranker", "--model", str(model), "--train", str(train), "--out", str(out), "--loss", loss,
                 "--batch-size", "4", "--max-steps", "4", "--lr", "1e-3", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 4 and np.isfinite(summary["loss"])
    config = json.loads((out / "final" / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and len(config["id2label"]) == 1


def test_reranker_bad_rows_are_one_line(tmp_path, capsys):
    model = tiny_model(tmp_path / "m")
    (tmp_path / "bad.csv").write_text("query,passage,label\na,b,1\nc,d,7\n")
    assert main(["finetune-reranker", "--model", str(model), "--train", str(tmp_path / "bad.csv"),
                 "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.csv:3: label 7.0 is outside [0, 1]" in err


def test_reranker_loads_in_cross_encoder_and_serves_rerank(tmp_path, minilm_dir, capsys):
    st = pytest.importorskip("sentence_transformers")
    pytest.importorskip("fastapi")
    import torch

    from bertlab.infer.runtime import InferenceOptions
    from bertlab.infer.serve import create_app, load_models, start_in_thread
    from test_infer_serve_api import call

    train = tmp_path / "rows.csv"
    train.write_text("query,passage,label\n" + "".join(
        f"what is {w},{w} is a thing,1\nwhat is {w},paris is big,0\n" for w in ("a cat", "a dog", "rain", "snow")))
    out = tmp_path / "rr"
    assert main(["finetune-reranker", "--model", str(minilm_dir), "--train", str(train), "--out", str(out),
                 "--batch-size", "4", "--max-steps", "2", "--no-progress"]) == 0
    query, texts = "what is a cat", ["a cat is a thing", "paris is big", "snow is cold"]
    cross = st.CrossEncoder(str(out / "final"), device="cpu")
    theirs = cross.predict([(query, t) for t in texts], activation_fn=torch.nn.Identity())
    models = load_models(minilm_dir, InferenceOptions(), classify_model=out / "final")
    running = start_in_thread(create_app(models))
    try:
        status, ranked = call(running.port, "POST", "/rerank", {"query": query, "texts": texts, "raw_scores": True})
    finally:
        running.stop()
    assert status == 200
    ours = {r["index"]: r["score"] for r in ranked}
    np.testing.assert_allclose([ours[i] for i in range(3)], theirs, atol=1e-4)


def test_reranker_run_config_from_before_the_training_group_loads(tmp_path):
    """A run_config.json written before the shared `training` group (every setting at the top) is still a
    --config file and still resumes with its own settings."""
    from bertlab.train.retrieval.reranker import MAY_CHANGE, RerankerConfig
    from bertlab.train.runconfig import config_from_dict
    from bertlab.train.run_record import resolve_resume_config

    old = {"model": "m", "train": "t.csv", "out": str(tmp_path), "loss": "listwise", "query_column": None,
           "passage_column": None, "label_column": None, "max_seq_length": 64, "epochs": 2.0, "max_steps": None,
           "batch_size": 8, "lr": 3e-05, "warmup": 0.1, "weight_decay": 0.01, "max_grad_norm": 1.0, "bf16": False,
           "seed": 7, "device": None, "save_every": None, "resume": False, "progress": True}
    cfg = config_from_dict(RerankerConfig, old)
    assert (cfg.training.lr, cfg.batch_size, cfg.seed, cfg.epochs, cfg.loss) == (3e-05, 8, 7, 2.0, "listwise")
    assert cfg.adam_eps == 1e-6 and cfg.retain_freed_memory is False  # the reranker's own defaults
    (tmp_path / "run_config.json").write_text(json.dumps({**old, "_resolved": {"steps": 10}}))
    resumed = resolve_resume_config(RerankerConfig, RerankerConfig(out=str(tmp_path), resume=True),
                                    tmp_path / "run_config.json", MAY_CHANGE, {"resume"})
    assert resumed.resume and resumed.model == "m"
    assert dataclasses.replace(resumed.training, resume=False) == cfg.training

