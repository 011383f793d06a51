"""The commands on a DeBERTa-v3-like folder saved by `transformers` (random DebertaV2ForMaskedLM weights and a
SentencePiece `spm.model` learned on the news table): the auto classes pick the family; embed, finetune (text
classification), predict, evaluate, fill-mask, serve's /v1/embeddings, export onnx / sentence-transformers and
the engines (CTranslate2 refused in one line: it has no DeBERTa converter) as the family harness runs them
(tests/test_families.py), then finetune-embeddings, finetune-reranker and params."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from deberta_v2_support import masked_lm_folder
from own_data_support import news_rows

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def deberta_folder(tmp_path_factory) -> Path:
    return masked_lm_folder(tmp_path_factory.mktemp("deberta") / "model")


def run(*argv) -> int:
    from bertlab.cli import main

    return main(["--log-level", "WARNING", *map(str, argv)])


def test_auto_classes_give_deberta(deberta_folder):
    from bertlab import AutoConfig, AutoModel, AutoTokenizer

    assert type(AutoConfig.from_pretrained(deberta_folder)).__name__ == "DebertaV2Config"
    assert type(AutoModel.from_pretrained(deberta_folder)).__name__ == "DebertaV2Model"
    assert type(AutoModel.for_head("masked-lm").from_pretrained(deberta_folder)).__name__ == "DebertaV2ForMaskedLM"
    tok = AutoTokenizer.from_pretrained(deberta_folder)
    assert type(tok).__name__ == "DebertaV2Tokenizer"
    text = "the coach said the team and the goal [MASK]"
    assert tok(text)["input_ids"] == transformers.DebertaV2Tokenizer.from_pretrained(deberta_folder)(text)["input_ids"]


def test_finetune_embeddings_and_reranker(deberta_folder, tmp_path, capsys):
    rows = news_rows(48, seed=3)
    with open(tmp_path / "pairs.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["anchor", "positive"])
        for r in rows:
            words = r["text"].split()
            w.writerow([" ".join(words[:4]), r["text"]])
    assert run("finetune-embeddings", "--model", deberta_folder, "--train", tmp_path / "pairs.csv", "--out",
               tmp_path / "emb", "--batch-size", 8, "--lr", "1e-3", "--no-progress") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] > 0 and np.isfinite(summary["loss"])
    assert json.loads((tmp_path / "emb" / "final" / "config.json").read_text())["model_type"] == "deberta-v2"
    with open(tmp_path / "rerank.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["query", "passage", "label"])
        for r, other in zip(rows, rows[1:] + rows[:1]):
            query = " ".join(r["text"].split()[:4])
            w.writerow([query, r["text"], 1])
            w.writerow([query, other["text"], 0])
    assert run("finetune-reranker", "--model", deberta_folder, "--train", tmp_path / "rerank.csv", "--out",
               tmp_path / "rr", "--batch-size", 4, "--max-steps", 4, "--lr", "1e-3", "--no-progress") == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 4
    config = json.loads((tmp_path / "rr" / "final" / "config.json").read_text())
    assert config["architectures"] == ["DebertaV2ForSequenceClassification"] and len(config["id2label"]) == 1


def test_params_reads_the_folder(deberta_folder, capsys):
    from bertlab.models.deberta_v2.heads import DebertaV2ForMaskedLM

    assert run("params", deberta_folder, "--format", "json") == 0
    rows = json.loads(capsys.readouterr().out)[str(deberta_folder)]
    model = DebertaV2ForMaskedLM.from_pretrained(deberta_folder)
    assert rows["total.masked_lm (DebertaV2ForMaskedLM)"] == model.num_parameters()
    assert run("params", deberta_folder) == 0
    assert "k=256 (log buckets)" in capsys.readouterr().out


def test_the_onnx_graph_takes_inputs_longer_than_its_trace(deberta_folder):
    """An ONNX export is traced on sample sentences; its relative terms run over the whole relative table, not
    the rows the trace's length reached (which an inference pass multiplies alone): a text over twice as long
    embeds in ONNX Runtime as in bertlab."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from bertlab.infer.embeddings import Embedder
    from bertlab.infer.export import SAMPLE_TEXTS
    from bertlab.infer.runtime import InferenceOptions

    ours = Embedder.from_pretrained(deberta_folder)
    text = " ".join(r["text"] for r in news_rows(14, seed=5))
    longest = max(len(ours.tokenizer(t)["input_ids"]) for t in SAMPLE_TEXTS)
    assert 2 * longest < len(ours.tokenizer(text)["input_ids"]) < 400
    theirs = Embedder.from_pretrained(deberta_folder, options=InferenceOptions(engine="onnxruntime"))
    a, b = ours.embed([text]), theirs.embed([text])
    assert float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b)) > 1 - 1e-5
