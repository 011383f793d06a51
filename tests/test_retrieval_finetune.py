"""`bertlab finetune-embeddings`: its losses against sentence-transformers', GradCache's gradient against plain
MNRL's, the no-duplicates sampler, the output folder in sentence-transformers, validation, exact resume and
one-line errors."""

from __future__ import annotations

import csv
import json
import os
import random
import signal

import pytest
import torch

from bertlab.cli import main
from bertlab.core.errors import BertlabError
from bertlab.tasks.retrieval.pairs import read_rows
from bertlab.train.retrieval import finetune, losses

from infer_support import WORDS, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


def embeddings(seed=0, rows=6, dim=16, negatives=1):
    g = torch.Generator().manual_seed(seed)
    cols = ["anchor", "positive", *(f"negative_{i}" for i in range(negatives))]
    return {c: torch.randn(rows, dim, generator=g, dtype=torch.float64) for c in cols}


@pytest.mark.parametrize("name", ["mnrl", "symmetric", "cosent", "cosine", "margin-mse"])
def test_losses_equal_sentence_transformers(name):
    st = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    emb = embeddings(negatives=0 if name in ("cosent", "cosine", "symmetric") else 2)
    labels = torch.rand(6, dtype=torch.float64) * (5 if name == "margin-mse" else 1)
    model = torch.nn.Linear(1, 1)  # the losses below read embeddings only
    ours, theirs = {
        "mnrl": (losses.mnrl(), st.MultipleNegativesRankingLoss(model)),
        "symmetric": (losses.mnrl(symmetric=True), st.MultipleNegativesRankingLoss(
            model, directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction")),
        "cosent": (losses.cosent(), st.CoSENTLoss(model)),
        "cosine": (losses.cosine(), st.CosineSimilarityLoss(model)),
        "margin-mse": (losses.margin_mse(), st.MarginMSELoss(model)),
    }[name]
    columns = ["anchor", "positive", *losses.negative_columns(emb)]
    if name == "margin-mse":
        columns = columns[:3]
    expected = theirs.compute_loss_from_embeddings([emb[c] for c in columns], labels)
    assert float(ours({c: emb[c] for c in columns}, labels)) == pytest.approx(float(expected), rel=1e-6)  # they cast labels to fp32


def test_matryoshka_sums_the_loss_over_leading_dimensions():
    emb = embeddings()
    inner = losses.mnrl()
    wrapped = losses.matryoshka(inner, [16, 8, 4], [1.0, 0.5, 0.25])
    expected = sum(w * inner({c: e[:, :d] for c, e in emb.items()}) for d, w in ((16, 1), (8, .5), (4, .25)))
    assert float(wrapped(emb)) == pytest.approx(float(expected))


def tiny_encoder(tmp_path, dropout=0.0):
    from bertlab import BertModel

    folder = tiny_model(tmp_path / "m", hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    return finetune.SentenceEncoder(BertModel.from_pretrained(folder), "mean"), folder


def random_batch(rows=10, negatives=1, seed=0):
    from bertlab.infer.length_buckets import model_inputs

    rng = random.Random(seed)
    ids = lambda: [3] + [rng.randrange(6, 60) for _ in range(rng.randint(2, 12))] + [4]  # noqa: E731
    cols = ["anchor", "positive", *(f"negative_{i}" for i in range(negatives))]
    return {c: model_inputs([ids() for _ in range(rows)]) for c in cols}


@pytest.mark.parametrize("objective", ["mnrl", "symmetric", "matryoshka"])
def test_gradcache_gradient_equals_plain_mnrl(tmp_path, objective):
    model, _ = tiny_encoder(tmp_path)
    model.train()
    inner = losses.mnrl(symmetric=objective == "symmetric")
    if objective == "matryoshka":
        inner = losses.matryoshka(inner, [32, 16, 8])
    batch = random_batch()
    grads = []
    for loss_fn in (losses.plain_loss(inner, finetune.encode), losses.cached_loss(inner, finetune.encode, 3)):
        model.zero_grad()
        loss, _ = loss_fn(model, batch)
        (loss / 2).backward()  # as the loop scales by the micro-batches of a step
        grads.append((float(loss.detach()), [torch.zeros_like(p) if p.grad is None else p.grad.clone()
                                             for p in model.parameters()]))
    (plain_loss, plain), (cached_loss, cached) = grads
    assert cached_loss == pytest.approx(plain_loss, rel=1e-6)
    for a, b in zip(plain, cached):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    assert any(g.abs().sum() > 0 for g in cached)


def test_gradcache_replays_dropout(tmp_path):
    """With dropout on, the second pass draws the masks of the first: the gradient is that of the embeddings
    whose loss was computed (checked against a plain pass over the same mini-batches)."""
    model, _ = tiny_encoder(tmp_path, dropout=0.3)
    model.train()
    batch = random_batch(rows=4, negatives=0)
    torch.manual_seed(0)
    model.zero_grad()
    loss, _ = losses.cached_loss(losses.mnrl(), finetune.encode, 2)(model, batch)
    loss.backward()
    cached = [p.grad for p in model.parameters()]
    after = torch.rand(1)
    torch.manual_seed(0)  # plain: the same mini-batch forwards, with a graph, in the same order
    model.zero_grad(set_to_none=True)
    emb = {c: torch.cat([model(losses._slice(batch[c], s, s + 2)) for s in (0, 2)]) for c in ("anchor", "positive")}
    plain_loss = losses.mnrl()(emb)
    assert torch.rand(1) == after  # the random stream continues as if no replay happened
    plain_loss.backward()
    assert float(loss.detach()) == pytest.approx(float(plain_loss.detach()), rel=1e-6)
    for a, b in zip(cached, [p.grad for p in model.parameters()]):
        if a is None:
            assert b is None
            continue
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_no_duplicates_sampler():
    texts = ["a", "b", "c", "a", "d", "e", "f", "b", "g", "h"]
    data = finetune.TokenizedRows([[i] for i in range(10)], {"anchor": list(range(10)),
                                                             "positive": [10 + texts.index(t) for t in texts]}, None)
    for epoch in range(3):
        batches = finetune.no_duplicate_batches(data, 4, seed=1, epoch=epoch)
        assert sorted(i for b in batches for i in b) == list(range(10))
        for b in batches:
            positives = [data.rows["positive"][i] for i in b]
            assert len(set(positives)) == len(positives)
        assert batches == finetune.no_duplicate_batches(data, 4, seed=1, epoch=epoch)
    assert finetune.no_duplicate_batches(data, 4, 1, 0) != finetune.no_duplicate_batches(data, 4, 1, 1)


def write_pairs(path, rows=48, seed=0, negatives=True):
    rng = random.Random(seed)
    words = [w for w in WORDS if w.isalpha()]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["anchor", "positive", *(["negative"] if negatives else [])])
        for _ in range(rows):
            a = " ".join(rng.sample(words, 3))
            w.writerow([a, a + " " + rng.choice(words), *([" ".join(rng.sample(words, 4))] if negatives else [])])
    return path


def test_pairs_file_errors(tmp_path):
    (tmp_path / "one.csv").write_text("text\nhello\n")
    with pytest.raises(BertlabError, match="one column"):
        read_rows(tmp_path / "one.csv", "pairs")
    (tmp_path / "empty.csv").write_text("anchor,positive\na b,c d\nx,\n")
    with pytest.raises(BertlabError, match=r"empty.csv:3: (empty|missing) text in column 'positive'"):
        read_rows(tmp_path / "empty.csv", "pairs")
    (tmp_path / "sts.csv").write_text("sentence1,sentence2,score\na,b,0.5\nc,d,high\n")
    with pytest.raises(BertlabError, match=r"sts.csv:3: column 'score' holds 'high', expected a number"):
        read_rows(tmp_path / "sts.csv", "scored")
    rows = read_rows(write_pairs(tmp_path / "p.csv", 4), "pairs")
    assert list(rows.texts) == ["anchor", "positive", "negative_0"] and len(rows) == 4


def test_command_bad_input_is_one_line(tmp_path, capsys):
    model = tiny_model(tmp_path / "m")
    (tmp_path / "one.csv").write_text("text\nhello\n")
    code = main(["finetune-embeddings", "--model", str(model), "--train", str(tmp_path / "one.csv"),
                 "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "one column" in err


def beir_folder(folder, pairs_path):
    rows = read_rows(pairs_path, "pairs")
    (folder / "qrels").mkdir(parents=True)
    with open(folder / "corpus.jsonl", "w") as f:
        for i, text in enumerate(dict.fromkeys(rows.texts["positive"])):
            f.write(json.dumps({"_id": f"d{i}", "text": text}) + "\n")
    index = {t: f"d{i}" for i, t in enumerate(dict.fromkeys(rows.texts["positive"]))}
    with open(folder / "queries.jsonl", "w") as f, open(folder / "qrels" / "test.tsv", "w") as q:
        q.write("query-id\tcorpus-id\tscore\n")
        for i, (a, p) in enumerate(zip(rows.texts["anchor"][:12], rows.texts["positive"][:12])):
            f.write(json.dumps({"_id": f"q{i}", "text": a}) + "\n")
            q.write(f"q{i}\t{index[p]}\t1\n")
    return folder


def test_finetune_with_validation_writes_best_and_final(tmp_path, capsys):
    model = tiny_model(tmp_path / "m")
    pairs = write_pairs(tmp_path / "pairs.csv")
    val = beir_folder(tmp_path / "val", pairs)
    out = tmp_path / "out"
    assert main(["finetune-embeddings", "--model", str(model), "--train", str(pairs), "--out", str(out),
                 "--batch-size", "8", "--eval-every", "3", "--validation", str(val), "--lr", "1e-3",
                 "--matryoshka-dims", "32,16", "--query-prompt", "query: ", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    summary = json.loads(printed[printed.index("\n{") + 1:])  # after the validation lines
    assert summary["steps"] == 6 and "ndcg@10" in summary["validation"]
    best = json.loads((out / "best" / "validation.json").read_text())
    evals = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines() if "eval/ndcg@10" in l]
    assert len(evals) == 2 and best["value"] == max(e["eval/ndcg@10"] for e in evals)
    config = json.loads((out / "final" / "config_sentence_transformers.json").read_text())
    assert config["prompts"] == {"query": "query: "} and config["bertlab"]["matryoshka_dims"] == [32, 16]


def run_recipe(out, model, pairs, extra=()):
    return main(["finetune-embeddings", "--model", str(model), "--train", str(pairs), "--out", str(out),
                 "--batch-size", "8", "--lr", "1e-3", "--no-progress", "--seed", "3", *extra])


def interrupt_at(monkeypatch, step):
    """Ctrl-C during training step `step`: the loop checkpoints after it and stops."""
    plain = losses.plain_loss
    calls = {"n": 0}

    def interrupting(objective, encode):
        inner = plain(objective, encode)

        def loss_fn(m, batch):
            calls["n"] += 1
            if calls["n"] == step:
                os.kill(os.getpid(), signal.SIGINT)
            return inner(m, batch)
        return loss_fn

    monkeypatch.setattr(finetune, "plain_loss", interrupting)
    return lambda: monkeypatch.setattr(finetune, "plain_loss", plain)


@pytest.mark.parametrize("saved", ["grouped", "flat"])
def test_resume_is_exact(tmp_path, monkeypatch, saved):
    """`flat`: the run_config.json of a run from before the settings were grouped (`"lr": ...` at the top, not
    under `"training"`) resumes the same."""
    model = tiny_model(tmp_path / "m", hidden_dropout_prob=0.1)
    pairs = write_pairs(tmp_path / "pairs.csv")
    assert run_recipe(tmp_path / "whole", model, pairs) == 0
    restore = interrupt_at(monkeypatch, 3)
    assert run_recipe(tmp_path / "cut", model, pairs) == 130
    restore()
    record = json.loads((tmp_path / "cut" / "run_config.json").read_text())
    assert record["training"]["lr"] == 1e-3 and record["training"]["seed"] == 3
    if saved == "flat":
        record = {k: v for k, v in record.items() if k != "training"} | record["training"]
        (tmp_path / "cut" / "run_config.json").write_text(json.dumps(record))
    assert main(["finetune-embeddings", "--out", str(tmp_path / "cut"), "--resume", "--no-progress"]) == 0
    a = (tmp_path / "whole" / "final" / "model.safetensors").read_bytes()
    b = (tmp_path / "cut" / "final" / "model.safetensors").read_bytes()
    assert a == b


def printed_summary(capsys):
    printed = capsys.readouterr().out
    return json.loads(printed[printed.index("{\n"):])


def falling_validation(monkeypatch, scores):
    """Validation returns `scores` in turn (ndcg@10), so when early stopping stops is known in advance."""
    seen = []

    def fake(embedder, settings, data, cutoffs, work_dir, store="float16"):
        seen.append(len(seen))
        return {"ndcg@10": scores[len(seen) - 1], "mrr@10": 0.0}

    monkeypatch.setattr(finetune, "evaluate_embedder", fake)
    return seen


def test_early_stopping_keeps_the_best_and_resumes_exactly(tmp_path, monkeypatch, capsys):
    model = tiny_model(tmp_path / "m", hidden_dropout_prob=0.1)
    pairs = write_pairs(tmp_path / "pairs.csv", rows=64)  # 8 steps of 8
    val = beir_folder(tmp_path / "val", pairs)
    stop = ["--validation", str(val), "--eval-every", "2", "--early-stopping", "2"]
    # validations at steps 2, 4, 6: best at 2, none better at 4 and 6 -> patience spent, the run ends at step 6
    seen = falling_validation(monkeypatch, [0.5, 0.4, 0.45, 0.9, 0.9])
    capsys.readouterr()
    assert run_recipe(tmp_path / "whole", model, pairs, stop) == 0
    summary = printed_summary(capsys)
    assert summary["steps"] == 6 and summary["stopped_early_at"] == 6 and len(seen) == 3
    assert summary["best_validation"]["ndcg@10"] == 0.5
    best = json.loads((tmp_path / "whole" / "best" / "validation.json").read_text())
    assert best["step"] == 2 and (tmp_path / "whole" / "final" / "model.safetensors").is_file()
    # without early stopping the same run goes on to the end: the stop was the patience's
    falling_validation(monkeypatch, [0.5, 0.4, 0.45, 0.9, 0.9])
    assert run_recipe(tmp_path / "all", model, pairs, stop[:4]) == 0
    assert printed_summary(capsys)["steps"] > 6
    # interrupted after step 5 and resumed: stops at the same step with the same weights (the patience is
    # judged from the best validation's step, saved in OUT/best)
    falling_validation(monkeypatch, [0.5, 0.4, 0.45, 0.9, 0.9])
    restore = interrupt_at(monkeypatch, 5)
    assert run_recipe(tmp_path / "cut", model, pairs, stop) == 130
    restore()
    falling_validation(monkeypatch, [0.45, 0.9])  # the validation at step 6
    assert main(["finetune-embeddings", "--out", str(tmp_path / "cut"), "--resume", "--no-progress"]) == 0
    assert printed_summary(capsys)["steps"] == 6
    for name in ("final", "best"):
        a = (tmp_path / "whole" / name / "model.safetensors").read_bytes()
        assert a == (tmp_path / "cut" / name / "model.safetensors").read_bytes(), name


def test_early_stopping_needs_validation_every_n_steps(tmp_path, capsys):
    model = tiny_model(tmp_path / "m")
    pairs = write_pairs(tmp_path / "pairs.csv")
    assert run_recipe(tmp_path / "o", model, pairs, ["--early-stopping", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs --validation and --eval-every" in err


def test_sentence_transformers_loads_the_output(tmp_path, minilm_dir):
    st = pytest.importorskip("sentence_transformers")
    pairs = write_pairs(tmp_path / "pairs.csv", rows=16)
    out = tmp_path / "out"
    assert main(["finetune-embeddings", "--model", str(minilm_dir), "--train", str(pairs), "--out", str(out),
                 "--batch-size", "8", "--max-steps", "2", "--no-progress", "--query-prompt", "query: "]) == 0
    from bertlab.infer.embeddings import Embedder

    texts = ["A man is eating food.", "The new movie is awesome, and everyone who saw it says so.", "paris"]
    ours = Embedder.from_pretrained(out / "final", pooling=None, normalize=True).embed(texts)
    model = st.SentenceTransformer(str(out / "final"), device="cpu")
    theirs = model.encode(texts, convert_to_numpy=True)
    cos = (ours * theirs).sum(1) / (((ours ** 2).sum(1) * (theirs ** 2).sum(1)) ** 0.5)
    assert cos.min() > 0.99999, cos
    assert model.prompts.get("query") == "query: "
    before = Embedder.from_pretrained(minilm_dir, pooling=None, normalize=True).embed(texts)
    assert abs(before - ours).max() > 1e-4  # it was trained
