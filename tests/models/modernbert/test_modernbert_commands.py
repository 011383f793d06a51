"""The commands on a ModernBERT folder saved by `transformers` (a tiny random model, its tokenizer.json trained
by `tokenizers`): embed, fine-tune, predict, fill-mask, serve's embeddings, the ONNX / sentence-transformers
exports and the peer engines run by the family harness (tests/test_families.py), evaluate, the retrieval fine-tunings, params;
and batch 1 against bulk embedding, against transformers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from modernbert_support import TEXTS, masked_lm_folder  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")



@pytest.fixture
def folder(tmp_path):
    return masked_lm_folder(tmp_path / "model")


def test_embeddings_batch_one_and_bulk_match_transformers(folder):
    """Mean-pooled embeddings of texts of many lengths, in bulk (length-bucketed batches) and one at a time,
    against transformers' encoder on the same ids."""
    import transformers

    from bertlab.infer.embeddings import Embedder
    from bertlab.models.modernbert.tokenizer import ModernBertTokenizer

    rng = np.random.default_rng(0)
    words = " ".join(TEXTS[:5]).split()
    texts = [" ".join(rng.choice(words, size=n)) for n in (1, 3, 9, 17, 30, 60, 120, 250)]
    embedder = Embedder.from_pretrained(folder, pooling="mean", normalize=False)
    bulk = embedder.embed(texts)
    single = np.concatenate([embedder.embed([t]) for t in texts])
    np.testing.assert_allclose(bulk, single, rtol=0, atol=1e-5)
    hf = transformers.AutoModel.from_pretrained(folder).eval()
    tok = ModernBertTokenizer.from_pretrained(folder)
    for text, ours in zip(texts, bulk):
        ids = torch.tensor([tok(text)["input_ids"]])
        with torch.no_grad():
            theirs = hf(input_ids=ids).last_hidden_state[0].mean(0).numpy()
        assert np.abs(ours - theirs).max() / np.abs(theirs).max() < 1e-5


def test_evaluate_and_params(folder, tmp_path, capsys):
    from bertlab.cli import main
    from own_data_support import news_rows, write_csv

    run = lambda *argv: main(["--log-level", "WARNING", *map(str, argv)])  # noqa: E731
    train = write_csv(news_rows(80, 1), tmp_path / "train.csv")
    dev = write_csv(news_rows(24, 2), tmp_path / "dev.csv")
    assert run("finetune", "text-classification", "--model", folder, "--train", train, "--validation", dev,
               "--text-column", "text", "--label-column", "category", "--out", tmp_path / "ft", "--epochs", 2,
               "--batch-size", 16, "--no-progress", "--seed", 0) == 0
    capsys.readouterr()
    assert run("evaluate", "text-classification", "--model", tmp_path / "ft" / "model", "--data", dev) == 0
    assert "accuracy" in capsys.readouterr().out
    assert run("params", folder) == 0
    assert "window=16" in capsys.readouterr().out


def test_gradual_unfreezing_runs_on_a_transformers_folder(folder, tmp_path):
    """`finetune --gradual-unfreezing` walks ModernBERT's layers (the top one with the final norm) and saves a
    classifier; the frozen embeddings are the pre-trained ones at the end of a run too short to reach them."""
    from safetensors.torch import load_file

    from bertlab.cli import main
    from own_data_support import news_rows, write_csv

    train = write_csv(news_rows(48, 1), tmp_path / "train.csv")
    assert main(["--log-level", "WARNING", "finetune", "text-classification", "--model", str(folder), "--train",
                 str(train), "--text-column", "text", "--label-column", "category", "--out", str(tmp_path / "gu"),
                 "--max-steps", "4", "--batch-size", "16", "--gradual-unfreezing", "2", "--no-progress",
                 "--seed", "0"]) == 0
    before = load_file(folder / "model.safetensors")
    after = load_file(tmp_path / "gu" / "model" / "model.safetensors")
    key = "model.embeddings.tok_embeddings.weight"
    assert torch.equal(before[key], after[key])  # 4 steps unfreeze 2 of the 5 groups: not the embeddings
    assert not torch.equal(before["model.final_norm.weight"], after["model.final_norm.weight"])


def test_every_finetune_task_runs_and_predicts(folder, tmp_path, capsys):
    """token-classification (with predict and evaluate on the saved model), question-answering and
    multiple-choice fine-tune from the transformers folder; each saves a model of its ModernBERT head."""
    from bertlab.cli import main
    from own_data_support import choice_rows, squad_file, tagged_rows, write_csv, write_jsonl

    run = lambda *argv: main(["--log-level", "WARNING", *map(str, argv)])  # noqa: E731
    quick = ("--epochs", 2, "--batch-size", 16, "--lr", 3e-3, "--no-progress", "--seed", 0)
    train, dev = write_jsonl(tagged_rows(60, 1), tmp_path / "t.jsonl"), write_jsonl(tagged_rows(12, 2), tmp_path / "d.jsonl")
    assert run("finetune", "token-classification", "--model", folder, "--train", train, "--validation", dev,
               "--out", tmp_path / "ner", "--max-seq-length", 48, *quick) == 0
    capsys.readouterr()
    assert run("evaluate", "token-classification", "--model", tmp_path / "ner" / "model", "--data", dev) == 0
    assert "f1" in json.loads(capsys.readouterr().out)
    (tmp_path / "new.jsonl").write_text(json.dumps({"tokens": ["the", "goal", "and", "the", "coach"]}) + "\n")
    assert run("predict", "--model", tmp_path / "ner" / "model", "--input", tmp_path / "new.jsonl") == 0
    assert len(json.loads(capsys.readouterr().out)["labels"]) == 5
    assert run("finetune", "question-answering", "--model", folder, "--data", squad_file(tmp_path / "q.json", 20, 1),
               "--out", tmp_path / "qa", "--max-seq-length", 96, *quick) == 0
    assert run("finetune", "multiple-choice", "--model", folder, "--train", write_csv(choice_rows(24, 1), tmp_path / "c.csv"),
               "--validation", write_csv(choice_rows(8, 2), tmp_path / "cd.csv"), "--out", tmp_path / "mc", *quick) == 0
    for name, arch in (("ner", "ModernBertForTokenClassification"), ("qa", "ModernBertForQuestionAnswering"),
                       ("mc", "ModernBertForMultipleChoice")):
        assert json.loads((tmp_path / name / "model" / "config.json").read_text())["architectures"] == [arch]


def test_retrieval_finetunings_run(folder, tmp_path, capsys):
    """finetune-embeddings (in-batch negatives) and finetune-reranker (a one-score sequence classifier) on the
    transformers folder; the reranker's save loads in transformers with the same scores."""
    import transformers

    from bertlab.cli import main
    from bertlab.models.modernbert.heads import ModernBertForSequenceClassification
    from test_retrieval_finetune import write_pairs

    pairs = write_pairs(tmp_path / "pairs.csv", rows=24)
    assert main(["finetune-embeddings", "--model", str(folder), "--train", str(pairs), "--out", str(tmp_path / "emb"),
                 "--batch-size", "8", "--lr", "1e-3", "--no-progress", "--seed", "3"]) == 0
    capsys.readouterr()
    train = tmp_path / "rows.csv"
    train.write_text("query,passage,label\n" + "".join(
        f"what is {w},{w} is a thing,1\nwhat is {w},paris is big,0\n" for w in ("a cat", "a dog", "rain", "snow")))
    assert main(["finetune-reranker", "--model", str(folder), "--train", str(train), "--out", str(tmp_path / "rr"),
                 "--batch-size", "4", "--max-steps", "2", "--no-progress"]) == 0
    saved = tmp_path / "rr" / "final"
    assert json.loads((saved / "config.json").read_text())["architectures"] == ["ModernBertForSequenceClassification"]
    ours = ModernBertForSequenceClassification.from_pretrained(saved).eval()
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(saved).eval()
    ids = torch.tensor([[1, 50, 60, 70, 2], [1, 80, 90, 2, 0]])
    mask = (torch.arange(5) < torch.tensor([[5], [4]])).long()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, attention_mask=mask).logits, theirs(input_ids=ids, attention_mask=mask).logits,
                                   rtol=1e-5, atol=1e-6)
