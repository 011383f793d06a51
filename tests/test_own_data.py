"""Fine-tuning on the user's own files: `bertlab finetune text-classification` from CSV / TSV / JSONL to
metrics.json, a saved model with its labels, predictions, and `evaluate` / `predict` on that model; multi-label
scores against scikit-learn's; regression; the held-out split; bad input as one-line errors (exit 2).

Everything runs on synthetic news-topic tables and a tiny BERT over their words (`own_data_support.py`), so
no downloaded data is needed and each run takes a second or two."""

from __future__ import annotations

import json
import random

import pytest
import torch

from bertlab.cli import main
from bertlab.tasks import TASKS
from bertlab.tasks.tables import read_table
from bertlab.tasks.metrics import LabelCounts, multi_label_sets, tune_threshold
from bertlab.tasks.own_splits import InputOptions, held_out_split
from bertlab.train import finetune as ft
from own_data_support import (TOPICS, choice_rows, long_document_rows, multi_label_rows, news_rows, squad_file,
                              tagged_rows, tiny_news_model, write_csv, write_jsonl)

pytestmark = pytest.mark.usefixtures("one_thread")

FAST = ("--epochs", 10, "--batch-size", 16, "--lr", 1e-2, "--no-progress")  # the tiny model learns the tables


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_news_model(tmp_path_factory.mktemp("tiny"))


def _run(*argv) -> int:
    return main(["--log-level", "WARNING", *map(str, argv)])


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---------------------------------------------------------------------------------------------- end to end
def test_csv_to_served_labels(tiny, tmp_path, capsys):
    """CSV in; metrics.json, config.json labels, dev/test predictions out; evaluate re-scores the saved model
    to the same numbers; predict labels new text."""
    train = write_csv(news_rows(160, 1), tmp_path / "train.csv")
    dev = write_csv(news_rows(40, 2), tmp_path / "dev.csv")
    test = write_csv([{"id": r["id"], "text": r["text"]} for r in news_rows(12, 3)], tmp_path / "test.csv")
    out = tmp_path / "out"
    assert _run("finetune", "text-classification", "--model", tiny, "--train", train, "--validation", dev,
                "--test", test, "--text-column", "text", "--label-column", "category", "--out", out, *FAST) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    dev_scores = metrics["best_run"]["dev"]
    assert metrics["main_metric"] == "accuracy" and dev_scores["accuracy"] > 0.6  # chance 0.25
    assert dev_scores["micro_f1"] == pytest.approx(dev_scores["accuracy"])  # single-label: micro F1 = accuracy
    assert {f"f1_{t}" for t in TOPICS} <= set(dev_scores) and dev_scores["support_sport"] == 10
    assert metrics["data"]["labels"] == sorted(TOPICS) and metrics["data"]["truncated"] == {"train": 0, "dev": 0}
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["id2label"] == {str(i): t for i, t in enumerate(sorted(TOPICS))}
    assert config["label2id"] == {t: i for i, t in enumerate(sorted(TOPICS))}
    assert config["problem_type"] == "single_label_classification" and config["finetuning_task"] == "text-classification"
    predictions = _jsonl(out / "dev_predictions.jsonl")
    assert len(predictions) == 40 and {"id", "prediction", "label"} == set(predictions[0])
    accuracy = sum(p["prediction"] == p["label"] for p in predictions) / 40
    assert accuracy == pytest.approx(dev_scores["accuracy"])
    tested = _jsonl(out / "test_predictions.jsonl")
    assert [p["id"] for p in tested] == [r["id"] for r in news_rows(12, 3)] and metrics["test_predictions"] == \
        ["test_predictions.jsonl"]
    capsys.readouterr()
    assert _run("evaluate", "text-classification", "--model", out / "model", "--data", dev) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == pytest.approx(dev_scores["accuracy"])
    (tmp_path / "new.jsonl").write_text(json.dumps({"text": "the coach said the team and the goal"}) + "\n")
    assert _run("predict", "--model", out / "model", "--input", tmp_path / "new.jsonl") == 0
    answer = json.loads(capsys.readouterr().out)
    assert set(answer["scores"]) == set(TOPICS) and answer["label"] in TOPICS


def test_labelled_test_file_scored_and_predict_reads_the_trained_column(tiny, tmp_path, capsys):
    """A model fine-tuned on a CSV whose text column is `description`: a labelled --test file is scored into
    metrics.json as "test"; `evaluate --data test.csv` names the split test; `predict` on a CSV reads the header
    as a header and the trained column only (the gold label never reaches the model), carries the id column,
    and a JSON Lines file with that column works too; a file whose content contradicts its name is one line."""
    def described(rows):
        return [{"id": r["id"], "description": r["text"], "category": r["category"]} for r in rows]

    train = write_csv(described(news_rows(160, 1)), tmp_path / "train.csv")
    dev = write_csv(described(news_rows(40, 2)), tmp_path / "dev.csv")
    test_rows = described(news_rows(24, 3))
    test = write_csv(test_rows, tmp_path / "test.csv")
    out = tmp_path / "out"
    assert _run("finetune", "text-classification", "--model", tiny, "--train", train, "--validation", dev,
                "--test", test, "--text-column", "description", "--out", out, *FAST) == 0
    printed = json.loads(capsys.readouterr().out)
    metrics = json.loads((out / "metrics.json").read_text())
    tested = _jsonl(out / "test_predictions.jsonl")
    accuracy = sum(p["prediction"] == p["label"] for p in tested) / len(tested)
    assert metrics["test"]["accuracy"] == pytest.approx(accuracy) and printed["test"]["accuracy"] == \
        pytest.approx(accuracy, abs=1e-4)
    assert json.loads((out / "model" / "config.json").read_text())["input_columns"]["text"] == "description"

    evaluated = tmp_path / "evaluated"
    assert _run("evaluate", "text-classification", "--model", out / "model", "--data", test, "--out", evaluated) == 0
    scored = json.loads(capsys.readouterr().out)
    assert scored["split"] == "test" and scored["accuracy"] == pytest.approx(accuracy)
    assert (evaluated / "test_predictions.jsonl").is_file() and not (evaluated / "dev_predictions.jsonl").exists()
    other = write_csv(test_rows, tmp_path / "holdout-2024.csv")
    assert _run("evaluate", "text-classification", "--model", out / "model", "--data", other) == 0
    assert json.loads(capsys.readouterr().out)["split"] == "holdout-2024"
    assert _run("evaluate", "text-classification", "--model", out / "model", "--data", other, "--split", "../x") == 2
    assert "--split '../x': expected a plain name" in capsys.readouterr().err

    assert _run("predict", "--model", out / "model", "--input", test) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == len(test_rows)  # no row for the header
    assert [r["id"] for r in rows] == [r["id"] for r in test_rows]
    assert [r["text"] for r in rows] == [r["description"] for r in test_rows]  # the text only, not the label
    by_id = {p["id"]: p["prediction"] for p in tested}
    assert [r["label"] for r in rows] == [by_id[r["id"]] for r in rows]  # what finetune predicted for the file
    jsonl = write_jsonl([{"description": r["description"]} for r in test_rows[:3]], tmp_path / "new.jsonl")
    assert _run("predict", "--model", out / "model", "--input", jsonl) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in rows] == [1, 2, 3] and [r["label"] for r in rows] == [by_id[r["id"]] for r in
                                                                                  test_rows[:3]]
    plain = tmp_path / "plain.txt"  # a text file: one text per line, JSON objects with the trained column too
    plain.write_text(test_rows[0]["description"] + "\n" + json.dumps({"description": test_rows[1]["description"]})
                     + "\n")
    assert _run("predict", "--model", out / "model", "--input", plain) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["label"] for r in rows] == [by_id[r["id"]] for r in test_rows[:2]]
    assert _run("predict", "--model", out / "model", "--input", test, "--text-column", "text") == 2
    assert "no column 'text'" in capsys.readouterr().err
    disguised = tmp_path / "disguised.csv"
    disguised.write_text(jsonl.read_text())
    assert _run("predict", "--model", out / "model", "--input", disguised) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "looks like JSON" in err and str(disguised) in err


def test_no_validation_file_holds_out_a_stratified_share(tiny, tmp_path):
    """Columns guessed from common names and reported; 10% of each class held out, seeded."""
    rows = [{"sentence": r["text"], "topic": r["category"]} for r in news_rows(120, 4)]
    train = write_jsonl(rows, tmp_path / "train.jsonl")
    metrics = ft.finetune(ft.FinetuneConfig(task="text-classification", model=str(tiny), data=str(train),
                                            out=str(tmp_path / "out"), epochs=1, batch_size=16, progress=False))
    data = metrics["data"]
    assert data["columns"]["text"] == "sentence" and data["columns"]["label"] == "topic"
    assert data["held_out"] == {"held_out_from": str(train), "share": 0.1, "seed": 42, "train": 108, "dev": 12}
    assert data["train_label_counts"] == {t: 27 for t in sorted(TOPICS)}  # 3 of each 30 held out
    assert data["examples"] == {"train": 108, "dev": 12}


def test_held_out_split_is_stratified_and_seeded():
    keys = ["a"] * 50 + ["b"] * 9 + ["c"] * 1
    train, dev = held_out_split(keys, 0.1, seed=3)
    assert sorted(train + dev) == list(range(60)) and not set(train) & set(dev)
    assert [keys[i] for i in dev].count("a") == 5 and [keys[i] for i in dev].count("b") == 1
    assert "c" not in [keys[i] for i in dev]  # a class of one stays in training
    assert held_out_split(keys, 0.1, seed=3) == (train, dev) and held_out_split(keys, 0.1, seed=4) != (train, dev)


def test_multi_label_scores_equal_scikit_learn(tiny, tmp_path, capsys):
    """JSON-list labels -> sigmoid + BCE; the reported micro/macro F1 are scikit-learn's on the written
    predictions, at the threshold tuned on dev, which config.json keeps and predict applies."""
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    train = write_jsonl(multi_label_rows(200, 5), tmp_path / "train.jsonl")
    dev = write_jsonl(multi_label_rows(50, 6), tmp_path / "dev.jsonl")
    out = tmp_path / "out"
    assert _run("finetune", "text-classification", "--model", tiny, "--train", train, "--validation", dev,
                "--multi-label", "--out", out, *FAST) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    scores = metrics["best_run"]["dev"]
    assert metrics["main_metric"] == "micro_f1" and scores["micro_f1"] > 0.5
    labels = sorted(TOPICS)
    predictions = _jsonl(out / "dev_predictions.jsonl")
    gold = [[int(l in p["label"]) for l in labels] for p in predictions]
    predicted = [[int(l in p["prediction"]) for l in labels] for p in predictions]
    for average in ("micro", "macro"):
        assert scores[f"{average}_f1"] == pytest.approx(
            sklearn_metrics.f1_score(gold, predicted, average=average, zero_division=0), abs=1e-12)
    assert scores["exact_match"] == pytest.approx(sklearn_metrics.accuracy_score(gold, predicted))
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["problem_type"] == "multi_label_classification"
    assert config["multi_label_threshold"] == scores["threshold"]
    probabilities = [[p["scores"][l] for l in labels] for p in predictions]  # the written labels are over it
    assert [sorted(s) for s in multi_label_sets(probabilities, labels, scores["threshold"])] == \
        [p["prediction"] for p in predictions]
    capsys.readouterr()
    (tmp_path / "new.txt").write_text("the market and the shares after the election vote\n")
    assert _run("predict", "--model", out / "model", "--input", tmp_path / "new.txt") == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["labels"] == sorted(l for l, p in answer["scores"].items() if p > scores["threshold"])
    # `bertlab evaluate` scores at the stored threshold: on dev, the same numbers
    assert _run("evaluate", "text-classification", "--model", out / "model", "--data", dev) == 0
    rescored = json.loads(capsys.readouterr().out)
    assert rescored["micro_f1"] == pytest.approx(scores["micro_f1"]) and rescored["threshold"] == scores["threshold"]
    # `bertlab serve`: /classify answers the labels over the threshold too
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    import http.client

    from bertlab.infer.runtime import InferenceOptions
    from bertlab.infer.serve import create_app, load_models, start_in_thread

    running = start_in_thread(create_app(load_models(out / "model", InferenceOptions())))
    try:
        conn = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30)
        text = "the market and the shares after the election vote"
        conn.request("POST", "/classify", body=json.dumps({"texts": [text]}),
                     headers={"Content-Type": "application/json"})
        served = json.loads(conn.getresponse().read())["predictions"][0]
    finally:
        running.stop()
    assert served["labels"] == answer["labels"] and served["scores"] == pytest.approx(answer["scores"])


def test_label_counts_equal_scikit_learn_on_random_sets():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = random.Random(0)
    labels = list("abcde")
    for _ in range(20):
        gold = [frozenset(l for l in labels if rng.random() < 0.3) for _ in range(30)]
        pred = [frozenset(l for l in labels if rng.random() < 0.3) for _ in range(30)]
        counts = LabelCounts()
        for g, p in zip(gold, pred):
            counts.add(g, p)
        y, yhat = ([[int(l in s) for l in labels] for s in sets] for sets in (gold, pred))
        assert counts.micro_f1() == pytest.approx(sklearn_metrics.f1_score(y, yhat, average="micro", zero_division=0))
        assert counts.macro_f1(labels) == pytest.approx(
            sklearn_metrics.f1_score(y, yhat, average="macro", zero_division=0))


def test_tuned_threshold_is_the_best_on_the_grid():
    labels = ["x", "y"]
    gold = [frozenset("x"), frozenset("y"), frozenset("xy"), frozenset()]
    probs = [[0.35, 0.1], [0.2, 0.3], [0.4, 0.33], [0.1, 0.05]]
    best = tune_threshold(gold, probs, labels)
    assert 0.2 <= best < 0.3  # every gold label over it, nothing else

    def micro(t):
        counts = LabelCounts()
        for g, p in zip(gold, multi_label_sets(probs, labels, t)):
            counts.add(g, p)
        return counts.micro_f1()

    assert micro(best) == 1.0 and micro(0.5) == 0.0


def test_regression_from_float_labels(tiny, tmp_path):
    """Numbers with fractions make a regression task: one output, MSE; Pearson/Spearman/MSE as SciPy's."""
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(7)
    rows = [{"text": r["text"], "score": round({"business": 0.5, "sport": 2.5, "tech": 4.5, "politics": 1.5}
                                               [r["category"]] + rng.random() / 10, 3)} for r in news_rows(120, 7)]
    train = write_csv(rows, tmp_path / "train.csv")
    metrics = ft.finetune(ft.FinetuneConfig(task="text-classification", model=str(tiny), data=str(train),
                                            out=str(tmp_path / "out"), epochs=3, batch_size=16, lr=1e-2,
                                            progress=False))
    assert metrics["data"]["problem_type"] == "regression" and metrics["main_metric"] == "pearson"
    predictions = _jsonl(tmp_path / "out" / "dev_predictions.jsonl")
    predicted, gold = [p["prediction"] for p in predictions], [p["label"] for p in predictions]
    scores = metrics["best_run"]["dev"]
    assert scores["pearson"] == pytest.approx(stats.pearsonr(predicted, gold)[0], abs=1e-9)
    assert scores["spearman"] == pytest.approx(stats.spearmanr(predicted, gold)[0], abs=1e-9)
    assert scores["mse"] == pytest.approx(sum((p - g) ** 2 for p, g in zip(predicted, gold)) / len(gold))
    config = json.loads((tmp_path / "out" / "model" / "config.json").read_text())
    assert config["problem_type"] == "regression" and len(config["id2label"]) == 1


def test_class_weights_weight_the_loss(tiny, tmp_path):
    rows = news_rows(40, 8) + [r for r in news_rows(40, 9) if r["category"] == "sport"] * 3
    train = write_csv(rows, tmp_path / "train.csv")
    cfg = ft.FinetuneConfig(task="text-classification", model=str(tiny), data=str(train), out=str(tmp_path),
                            inputs=InputOptions(class_weights=True))
    spec = TASKS["text-classification"].for_run(cfg)
    train_examples = spec.read(cfg.data, "train")
    n, counts = len(train_examples), {l: sum(e.label == l for e in train_examples) for l in spec.labels}
    assert spec.class_weights == pytest.approx([n / (4 * counts[l]) for l in spec.labels])
    assert spec.describe()["class_weights"]["sport"] < 1 < spec.describe()["class_weights"]["tech"]
    from bertlab import BertTokenizer
    model = spec.build_model(tiny).eval()
    features = spec.featurize(train_examples[:8], BertTokenizer.from_pretrained(tiny), 64, train=True)
    batch = spec.collate(features)
    with torch.no_grad():
        logits = model(**spec.model_inputs(batch)).logits
        expected = torch.nn.functional.cross_entropy(logits, batch["labels"], weight=torch.tensor(spec.class_weights))
        torch.testing.assert_close(spec.loss(model, batch), expected)


# ---------------------------------------------------------------------------------------------- other task families
def _conll(rows, path):
    path.write_text("".join("".join(f"{w} {t}\n" for w, t in zip(r["tokens"], r["tags"])) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "conll"])
def test_token_classification_from_jsonl_or_conll(tiny, tmp_path, capsys, fmt):
    """Tags discovered and sorted into id2label; entity F1; evaluate and predict on the saved model."""
    write = write_jsonl if fmt == "jsonl" else _conll
    train, dev = write(tagged_rows(150, 1), tmp_path / f"train.{fmt}"), write(tagged_rows(30, 2), tmp_path / f"dev.{fmt}")
    out = tmp_path / "out"
    assert _run("finetune", "token-classification", "--model", tiny, "--train", train, "--validation", dev,
                "--out", out, "--max-seq-length", 48, *FAST) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    tags = sorted({"O", *(f"B-{t.upper()}" for t in TOPICS)})
    assert metrics["data"]["labels"] == tags and metrics["best_run"]["dev"]["f1"] > 0.8
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["id2label"] == {str(i): t for i, t in enumerate(tags)}
    capsys.readouterr()
    assert _run("evaluate", "token-classification", "--model", out / "model", "--data", dev) == 0
    assert json.loads(capsys.readouterr().out)["f1"] == pytest.approx(metrics["best_run"]["dev"]["f1"])
    (tmp_path / "new.jsonl").write_text(json.dumps({"tokens": ["the", "goal", "and", "the", "coach"]}) + "\n")
    assert _run("predict", "--model", out / "model", "--input", tmp_path / "new.jsonl") == 0
    assert json.loads(capsys.readouterr().out)["labels"] == ["O", "B-SPORT", "O", "O", "B-SPORT"]


def test_question_answering_from_any_squad_file_name(tiny, tmp_path):
    """SQuAD JSON under any name; held-out dev by whole paragraphs; v1.1 detected."""
    data = squad_file(tmp_path / "my_questions.json", 60, 1)
    metrics = ft.finetune(ft.FinetuneConfig(task="question-answering", model=str(tiny), data=str(data),
                                            out=str(tmp_path / "out"), epochs=2, batch_size=16, lr=1e-2,
                                            max_seq_length=96, progress=False))
    assert metrics["data"]["squad_version"] == "1.1" and metrics["data"]["held_out"]["dev"] == 12  # 6 paragraphs
    spec = TASKS["question-answering"].for_run(ft.FinetuneConfig(task="question-answering", model="-",
                                                                 data=str(data), out="-"))
    assert not {e.context for e in spec.read(data, "train")} & {e.context for e in spec.read(data, "dev")}
    assert (tmp_path / "out" / "predictions.json").is_file() and 0 <= metrics["best_run"]["dev"]["f1"] <= 1


def test_multiple_choice_from_csv_with_guessed_columns(tiny, tmp_path, capsys):
    rows = choice_rows(60, 1)
    for r in rows[:20]:  # the answer may also be given as the choice's column name or its text
        r["label"] = f"ending{r['label']}"
    train = write_csv(rows, tmp_path / "train.csv")
    dev = write_csv(choice_rows(20, 2), tmp_path / "dev.csv")
    out = tmp_path / "out"
    assert _run("finetune", "multiple-choice", "--model", tiny, "--train", train, "--validation", dev, "--out", out,
                "--epochs", 1, "--batch-size", 16, "--no-progress") == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["data"]["columns"] == {"context": "context", "start": None, "label": "label",
                                          "choices": ["ending0", "ending1", "ending2", "ending3"]}
    capsys.readouterr()
    assert _run("evaluate", "multiple-choice", "--model", out / "model", "--data", dev) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == pytest.approx(metrics["best_run"]["dev"]["accuracy"])
    bad = write_csv([{**choice_rows(1, 3)[0], "label": "ending9"}], tmp_path / "bad.csv")
    err = _error(capsys, "finetune", "multiple-choice", "--model", tiny, "--train", train, "--validation", bad,
                 "--out", tmp_path / "out-bad")
    assert "bad.csv:2: label 'ending9' is not a choice index (0-3)" in err


# ---------------------------------------------------------------------------------------------- long documents
def test_windows_read_what_truncation_cuts_off(tiny, tmp_path, capsys):
    """The label-bearing sentence sits past the first 32 tokens: truncated to 32, the model sees filler only
    (chance, and every input reported as truncated); in windows of 32 it learns the task, and the saved
    model predicts long texts in windows too (config.json `long_documents`)."""
    train = write_csv(long_document_rows(120, 1), tmp_path / "train.csv")
    dev = write_csv(long_document_rows(40, 2), tmp_path / "dev.csv")
    scores = {}
    for mode in ("truncate", "window"):
        metrics = ft.finetune(ft.FinetuneConfig(
            task="text-classification", model=str(tiny), data=str(train), out=str(tmp_path / mode), epochs=10,
            lr=1e-2, batch_size=16, max_seq_length=32, progress=False,
            inputs=InputOptions(validation=str(dev), long_documents=mode, window_stride=8)))
        scores[mode] = metrics["best_run"]["dev"]["accuracy"]
        assert metrics["data"]["truncated"] == ({"train": 120, "dev": 40} if mode == "truncate" else
                                               {"train": 0, "dev": 0})
    assert scores["truncate"] <= 0.65 and scores["window"] >= 0.8, scores
    config = json.loads((tmp_path / "window" / "model" / "config.json").read_text())
    assert config["long_documents"] == {"mode": "window", "length": 32, "stride": 8}
    capsys.readouterr()
    assert _run("evaluate", "text-classification", "--model", tmp_path / "window" / "model", "--data", dev) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == pytest.approx(scores["window"])
    (tmp_path / "new.jsonl").write_text("".join(json.dumps({"text": r["text"]}) + "\n"
                                                for r in long_document_rows(40, 2)))
    assert _run("predict", "--model", tmp_path / "window" / "model", "--input", tmp_path / "new.jsonl") == 0
    predicted = [json.loads(line)["label"] for line in capsys.readouterr().out.splitlines()]
    gold = [r["label"] for r in long_document_rows(40, 2)]
    assert sum(p == g for p, g in zip(predicted, gold)) / 40 == pytest.approx(scores["window"])


def test_window_logits_aggregate_by_mean_or_max():
    from bertlab.tasks.text_features import aggregate_windows

    logits = torch.tensor([[1.0, 0.0], [3.0, -2.0], [0.5, 0.5]], requires_grad=True)
    owner = torch.tensor([0, 0, 1])
    torch.testing.assert_close(aggregate_windows(logits, owner, 2, "mean"), torch.tensor([[2.0, -1.0], [0.5, 0.5]]))
    torch.testing.assert_close(aggregate_windows(logits, owner, 2, "max"), torch.tensor([[3.0, 0.0], [0.5, 0.5]]))
    aggregate_windows(logits, owner, 2, "mean").sum().backward()  # the loss trains through the aggregation
    torch.testing.assert_close(logits.grad, torch.tensor([[0.5, 0.5], [0.5, 0.5], [1.0, 1.0]]))


# ---------------------------------------------------------------------------------------------- bad input
def _error(capsys, *argv) -> str:
    capsys.readouterr()
    assert _run(*argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_bad_input_is_one_line_naming_file_and_line(tiny, tmp_path, capsys):
    good = write_csv(news_rows(20, 1), tmp_path / "good.csv")
    args = ("finetune", "text-classification", "--model", tiny, "--out", tmp_path / "out")
    err = _error(capsys, *args, "--train", good, "--label-column", "topic")
    assert "good.csv: no column 'topic' (the label); the file has columns: id, text, category" in err
    (tmp_path / "empty.csv").write_text("")
    assert "empty.csv: empty file" in _error(capsys, *args, "--train", tmp_path / "empty.csv")
    (tmp_path / "header.csv").write_text("text,label\n")
    assert "header.csv: no rows after the header" in _error(capsys, *args, "--train", tmp_path / "header.csv")
    one = write_csv([{"text": "a b", "label": "x"}] * 5, tmp_path / "one.csv")
    assert "one.csv: column 'label' holds one class only ('x' in 5 rows)" in _error(capsys, *args, "--train", one)
    (tmp_path / "bad.jsonl").write_text('{"text": "a", "label": "x"}\n{"text": "b", "label": "y"\n')
    assert "bad.jsonl:2: not valid JSON" in _error(capsys, *args, "--train", tmp_path / "bad.jsonl")
    semicolons = write_csv(news_rows(10, 1), tmp_path / "semi.csv", delimiter=";")
    err = _error(capsys, *args, "--train", semicolons)
    assert "semi.csv:1: the header is one column" in err and "semicolon-separated" in err
    (tmp_path / "ragged.csv").write_text("text,label\na b,x\nc d,y,z\n")
    assert "ragged.csv:3: expected 2 comma-separated fields" in _error(capsys, *args, "--train",
                                                                       tmp_path / "ragged.csv")
    dev = write_csv([{"id": "d1", "text": "a goal", "category": "sport"}, {"id": "d2", "text": "x", "category": "art"}],
                    tmp_path / "dev.csv")
    err = _error(capsys, *args, "--train", good, "--validation", dev)
    assert "dev.csv:3: label 'art' is not among the training file's labels (business, politics, sport, tech)" in err
    (tmp_path / "notes.txt").write_text("a\n")
    assert "notes.txt: cannot tell the format" in _error(capsys, *args, "--train", tmp_path / "notes.txt")
    assert "missing.csv: no such file" in _error(capsys, *args, "--train", tmp_path / "missing.csv")


def test_readers_number_rows_by_line(tmp_path):
    (tmp_path / "t.csv").write_text('text,label\n"multi\nline",x\n\nplain,y\n')
    table = read_table(tmp_path / "t.csv")
    assert [(r.line, r.values["label"]) for r in table.rows] == [(2, "x"), (5, "y")]
    (tmp_path / "t.tsv").write_text('text\tlabel\n"quoted\ty\n')  # TSV: quotes are text
    assert read_table(tmp_path / "t.tsv").rows[0].values == {"text": '"quoted', "label": "y"}
    (tmp_path / "t.json").write_text('[{"text": "a", "label": 1}, {"text": "b", "label": 0}]')
    table = read_table(tmp_path / "t.json")
    assert table.where(table.rows[1]).endswith("t.json: record 2")


def test_input_options_group_from_file_and_flags(tmp_path):
    """The options group is an object in a --config file and flat flags on the command line (flags win);
    run_config.json round-trips; a typo inside the group is a one-line error naming it."""
    import argparse

    from bertlab.core.errors import ConfigError
    from bertlab.train.runconfig import add_config_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_config_arguments(parser, ft.FinetuneConfig, aliases={"data": ("--train",)})
    (tmp_path / "run.json").write_text(json.dumps({"task": "text-classification", "model": "m", "out": "o",
                                                   "inputs": {"text_column": "body", "validation_share": 0.2}}))
    args = parser.parse_args(["--config", str(tmp_path / "run.json"), "--train", "t.csv", "--validation-share", "0.3",
                              "--multi-label"])
    cfg = config_from_args(ft.FinetuneConfig, args)
    assert cfg.data == "t.csv" and cfg.inputs == InputOptions(text_column="body", validation_share=0.3,
                                                              multi_label=True)
    import dataclasses
    (tmp_path / "again.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    assert config_from_args(ft.FinetuneConfig, parser.parse_args(["--config", str(tmp_path / "again.json")])) == cfg
    (tmp_path / "typo.json").write_text(json.dumps({"inputs": {"text_colum": "x"}}))
    with pytest.raises(ConfigError, match="inputs: unknown key 'text_colum'"):
        config_from_args(ft.FinetuneConfig, parser.parse_args(["--config", str(tmp_path / "typo.json")]))


def test_parquet_and_tsv_read_like_csv(tmp_path):
    rows = news_rows(6, 1)
    write_csv(rows, tmp_path / "t.tsv", delimiter="\t")
    tsv = read_table(tmp_path / "t.tsv")
    assert [r.values for r in tsv.rows] == rows and tsv.where(tsv.rows[0]).endswith("t.tsv:2")
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pyarrow.Table.from_pylist(rows), tmp_path / "t.parquet")
    table = read_table(tmp_path / "t.parquet")
    assert table.columns == ["id", "text", "category"] and [r.values for r in table.rows] == rows
    assert table.where(table.rows[2]).endswith("t.parquet: record 3")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(Exception, match="bad.parquet: not a Parquet file"):
        read_table(tmp_path / "bad.parquet")
