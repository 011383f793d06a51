"""The commands on a ModernBERT folder saved by `transformers` (a tiny random model, its tokenizer.json trained
by `tokenizers`): embed, fine-tune, predict, fill-mask, serve's embeddings, the ONNX / sentence-transformers
exports and the peer engines (`family_support.end_to_end`), evaluate, the retrieval fine-tunings, params;
and batch 1 against bulk embedding, against transformers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from family_support import end_to_end  # noqa: E402
from modernbert_support import tiny_folder  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["the team won the match", "shares of the bank fell", "the minister spoke to parliament",
         "a new phone was released", "the coach praised the players"] * 40


@pytest.fixture
def folder(tmp_path):
    from own_data_support import news_rows

    return tiny_folder(tmp_path, TEXTS + [r["text"] for r in news_rows(200, 7)])


def test_commands_run_on_a_transformers_folder(folder, tmp_path, capsys):
    measured = end_to_end(folder, tmp_path, capsys, lr=3e-3, epochs=20, min_accuracy=0.5)
    assert measured["accuracy"] > 0.5


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
