"""SpanBERT's span-boundary objective (`--objective mlm+sbo`): the spans the masker records, the span fields of
a batch, the head's formula, and the recipe end to end (prepare -> pretrain -> transformers)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bertlab import BertConfig, BertForMaskedLM
from bertlab.cli import main
from bertlab.data.loader import PretrainingDataset
from bertlab.data.masking import MaskingConfig, VocabInfo, mask_tokens, span_boundaries
from bertlab.models.bert.heads import BertForSpanBoundary
from bertlab.objectives import get_objective
from bertlab.train import read_metrics
from faults_support import signal_on_call
from test_data_prepare import make_corpus, write_vocab

pytestmark = pytest.mark.usefixtures("one_thread")


def test_span_boundaries_of_touching_spans():
    # spans 1-2 and 3-4 touch (one run of masked positions); 7 stands alone
    assert span_boundaries([1, 2, 3, 4, 7], {1, 3, 7}) == [(0, 3, 0), (0, 3, 1), (2, 5, 0), (2, 5, 1), (6, 8, 0)]
    assert span_boundaries([1, 2, 3, 4, 7], {1, 7}) == [(0, 5, 0), (0, 5, 1), (0, 5, 2), (0, 5, 3), (6, 8, 0)]
    assert span_boundaries([], set()) == []


def test_recorded_spans_are_the_spans_the_masker_placed(tmp_path):
    vocab = VocabInfo.from_file(write_vocab(tmp_path / "vocab.txt"))
    cfg = MaskingConfig(granularity="span", masked_lm_prob=0.4, max_predictions_per_seq=40)
    ids = [2] + list(range(10, 70)) + [3]  # [CLS] 60 one-piece words [SEP]: a word is a token
    touching = 0
    for seed in range(200):
        m = mask_tokens(ids, cfg, vocab, random.Random(seed))
        bounds = span_boundaries(m.positions, set(m.span_starts))
        spans = sorted({(left + 1, right - 1) for left, right, _ in bounds})
        assert [s for s, _ in spans] == m.span_starts
        assert sorted(e - s + 1 for s, e in spans) == sorted(m.span_words)  # one token per word here
        assert [p for s, e in spans for p in range(s, e + 1)] == m.positions
        assert all(p - left - 1 == off for p, (left, _, off) in zip(m.positions, bounds))
        assert all(0 <= left and right <= len(ids) - 1 for left, right, _ in bounds)  # [CLS]/[SEP] at the edges
        touching += sum(a[1] + 1 == b[0] for a, b in zip(spans, spans[1:]))
    assert touching > 0  # adjacent spans occur, and are kept apart


def tiny(**kw) -> BertConfig:
    return BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                      max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **kw)


def test_head_formula_by_hand():
    torch.manual_seed(0)
    model = BertForSpanBoundary(tiny()).eval()
    for p in model.sbo.parameters():  # away from the initial LayerNorm 1/0, so every term matters
        p.data.normal_(0, 0.5)
    input_ids = torch.tensor([[2, 4, 4, 4, 11, 4, 3]])  # [CLS] m m m x m [SEP]: spans 1-3 and 5
    labels = torch.full((1, 7), -100)
    labels[0, [1, 2, 3, 5]] = torch.tensor([20, 21, 22, 23])
    left = torch.zeros(1, 7, dtype=torch.long)
    right = torch.zeros(1, 7, dtype=torch.long)
    offset = torch.zeros(1, 7, dtype=torch.long)
    left[0, [1, 2, 3, 5]] = torch.tensor([0, 0, 0, 4])  # the first span's left boundary is [CLS]
    right[0, [1, 2, 3, 5]] = torch.tensor([4, 4, 4, 6])  # the second's right boundary is [SEP]
    offset[0, [1, 2, 3, 5]] = torch.tensor([0, 1, 2, 0])
    with torch.no_grad():
        out = model(input_ids, labels=labels, span_left=left, span_right=right, span_offset=offset)
        x = model.bert(input_ids).last_hidden_state[0]
        sbo, eps = model.sbo, model.config.layer_norm_eps
        expected = []
        for i, (s1, e1, k) in zip([1, 2, 3, 5], [(0, 4, 0), (0, 4, 1), (0, 4, 2), (4, 6, 0)]):
            h0 = torch.cat([x[s1], x[e1], sbo.position_embeddings.weight[k]])
            h1 = F.layer_norm(F.gelu(sbo.mlp1.dense.weight @ h0 + sbo.mlp1.dense.bias), (32,),
                              sbo.mlp1.LayerNorm.weight, sbo.mlp1.LayerNorm.bias, eps)
            y = F.layer_norm(F.gelu(sbo.mlp2.dense.weight @ h1 + sbo.mlp2.dense.bias), (32,),
                             sbo.mlp2.LayerNorm.weight, sbo.mlp2.LayerNorm.bias, eps)
            expected.append(model.bert.embeddings.word_embeddings.weight @ y + model.cls.predictions.bias)
        expected = torch.stack(expected)
        targets = torch.tensor([20, 21, 22, 23])
        mlm_loss = F.cross_entropy(out.prediction_logits, targets)
    torch.testing.assert_close(out.sbo_logits, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.sbo_loss, F.cross_entropy(expected, targets), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.loss, mlm_loss + out.sbo_loss)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


# ---------------------------------------------------------------------------------------------- the recipe
def prepare_args(corpus, vocab, out, *extra):
    return ["--log-level", "WARNING", "prepare", str(corpus), "--vocab", str(vocab), "--out", str(out), "--mode",
            "full-sentences", "--max-seq-length", "64", "--workers", "1", "--quiet", *extra]


@pytest.fixture(scope="module")
def corpus_and_vocab(tmp_path_factory):
    root = tmp_path_factory.mktemp("sbo")
    return make_corpus(root / "corpus.txt", 40, seed=3), write_vocab(root / "vocab.txt")


@pytest.fixture(scope="module")
def span_data(corpus_and_vocab, tmp_path_factory) -> Path:
    corpus, vocab = corpus_and_vocab
    out = tmp_path_factory.mktemp("sbo-static") / "data"
    assert main(prepare_args(corpus, vocab, out, "--objective", "mlm+sbo")) == 0  # span masking by default
    return out


@pytest.fixture(scope="module")
def dynamic_span_data(corpus_and_vocab, tmp_path_factory) -> Path:
    corpus, vocab = corpus_and_vocab
    out = tmp_path_factory.mktemp("sbo-dynamic") / "data"
    assert main(prepare_args(corpus, vocab, out, "--masking", "span", "--dynamic")) == 0
    return out


def batch_spans(batch) -> list[list[tuple[int, int]]]:
    """Each row's spans (first, last position) read back from a batch's span fields, checking them on the way."""
    rows = []
    for b in range(batch["labels"].size(0)):
        masked = (batch["labels"][b] != -100).nonzero()[:, 0].tolist()
        spans = {}
        for p in masked:
            left, right, off = (int(batch[k][b, p]) for k in ("span_left", "span_right", "span_offset"))
            assert left < p < right and off == p - left - 1
            spans[(left + 1, right - 1)] = True
        spans = sorted(spans)
        assert [p for s, e in spans for p in range(s, e + 1)] == masked  # the spans tile the masked positions
        assert all(batch["attention_mask"][b, e + 1] == 1 for _, e in spans)  # right boundary inside the text
        rows.append(spans)
    return rows


def test_batches_carry_the_spans_the_masker_chose(span_data, dynamic_span_data):
    # static: the spans recorded at prepare time; their count can exceed the runs of masked positions
    ds = PretrainingDataset(span_data, "train", batch_size=64, epochs=1)
    spans = [row for batch in ds.dataloader() for row in batch_spans(batch)]
    assert len(spans) == ds.num_instances
    runs = [sum(1 for k, (s, e) in enumerate(row) if k == 0 or row[k - 1][1] + 1 != s) for row in spans]
    assert sum(len(r) for r in spans) > sum(runs)  # touching spans are told apart
    # dynamic: the collator's spans are those mask_tokens placed with the sample's generator
    ds = PretrainingDataset(dynamic_span_data, "train", batch_size=8)
    batch = next(iter(ds.dataloader()))
    for row, g in enumerate(ds.positions()):
        if row == 8:
            break
        ex = ds.example_at(g)
        m = mask_tokens(ex["input_ids"].tolist(), ds.info.masking, ds.vocab, random.Random(ex["mask_seed"]))
        assert [s for s, _ in batch_spans(batch)[row]] == m.span_starts


def pretrain_args(data, out, *extra):
    return ["--log-level", "WARNING", "pretrain", "--model", "tiny", "--data", str(data), "--out", str(out),
            "--objective", "mlm+sbo", "--batch-size", "8", "--max-seq-length", "64", "--phase2-max-seq-length", "0",
            "--eval-batches", "2", "--no-progress", "--num-workers", "0", "--lr", "1e-3", "--precision", "fp32",
            *map(str, extra)]


def test_prepare_pretrain_mlm_sbo_then_transformers_loads_the_mlm(corpus_and_vocab, tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    corpus, vocab = corpus_and_vocab
    small = tmp_path / "small.txt"  # a tiny corpus repeated: loss must fall within 20 steps
    text = "\n\n".join(corpus.read_text().split("\n\n")[:3])
    small.write_text("\n\n".join([text] * 20) + "\n")
    data = tmp_path / "data"
    assert main(prepare_args(small, vocab, data, "--masking", "span")) == 0
    out = tmp_path / "run"
    assert main(pretrain_args(data, out, "--steps", 20, "--warmup", 2, "--eval-every", 20)) == 0
    assert "held-out after: mlm_loss" in capsys.readouterr().out
    records = read_metrics(out)
    train = [r for r in records if "loss" in r]
    assert {"mlm_loss", "sbo_loss", "mlm_accuracy", "sbo_accuracy"} <= set(train[0])
    losses = [r["loss"] for r in train]
    assert all(np.isfinite(losses)) and np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5
    assert all(abs(r["loss"] - r["mlm_loss"] - r["sbo_loss"]) < 1e-4 for r in train)
    evals = [r for r in records if "eval/sbo_loss" in r]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == 20 and evals[-1]["eval/sbo_loss"] < evals[0]["eval/sbo_loss"]

    final = out / "final"
    ours = BertForSpanBoundary.from_pretrained(final).eval()
    theirs = transformers.BertForMaskedLM.from_pretrained(final).eval()  # drops the sbo. weights
    tok = transformers.BertTokenizer.from_pretrained(final)
    batch = tok(["the city was known for its school", "she had been there"], padding=True, return_tensors="pt")
    with torch.no_grad():
        a = ours(batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"])
        b = theirs(**batch)
    keep = batch["attention_mask"].bool()
    torch.testing.assert_close(a.prediction_logits[keep], b.logits[keep], atol=1e-4, rtol=1e-4)
    with torch.no_grad():  # bertlab's MLM model (fill-mask) too, dropping the span-boundary head
        c = BertForMaskedLM.from_pretrained(final)(batch["input_ids"], attention_mask=batch["attention_mask"])
    torch.testing.assert_close(a.prediction_logits[keep], c.prediction_logits[keep])


def test_resume_is_exact_with_dynamic_spans(dynamic_span_data, tmp_path, monkeypatch):
    reference = tmp_path / "reference"
    assert main(pretrain_args(dynamic_span_data, reference, "--steps", 4, "--save-every", 2)) == 0
    run = tmp_path / "run"
    with monkeypatch.context() as patched:
        signal_on_call(patched, type(get_objective("mlm+sbo")), "loss", 3)  # SIGINT during step 3
        assert main(pretrain_args(dynamic_span_data, run, "--steps", 4, "--save-every", 2)) == 130
    assert main(["--log-level", "WARNING", "pretrain", "--out", str(run), "--resume", "--no-progress",
                 "--num-workers", "0"]) == 0
    from safetensors.torch import load_file

    a, b = load_file(str(reference / "final" / "model.safetensors")), load_file(str(run / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and any(k.startswith("sbo.") for k in a) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("extra, expected", [
    (["--masking", "whole-word"], "needs span masking"),
    (["--masking", "span", "--mode", "segment-pair"], "trains on single segments"),
])
def test_data_without_spans_is_refused_in_one_line(corpus_and_vocab, tmp_path, capsys, extra, expected):
    corpus, vocab = corpus_and_vocab
    data = tmp_path / "data"
    assert main(prepare_args(corpus, vocab, data, *extra)) == 0
    capsys.readouterr()
    assert main(pretrain_args(data, tmp_path / "run", "--steps", 2)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err
    assert not (tmp_path / "run" / "final").exists()


def test_phase2_data_without_spans_is_refused(corpus_and_vocab, tmp_path, capsys):
    corpus, vocab = corpus_and_vocab
    data = tmp_path / "data"
    assert main(prepare_args(corpus, vocab, data, "--objective", "mlm+sbo")) == 0
    args = prepare_args(corpus, vocab, data, "--masking", "token")
    args[args.index("--max-seq-length") + 1] = "128"
    assert main(args) == 0
    capsys.readouterr()
    argv = pretrain_args(data, tmp_path / "run", "--steps", 2)
    argv[argv.index("--phase2-max-seq-length") + 1] = "128"
    assert main(argv) == 2
    assert "length 128: instances are masked by 'token'" in capsys.readouterr().err


def test_prepare_objective_mlm_sbo_sets_span_masking(span_data, corpus_and_vocab, tmp_path, capsys):
    info = PretrainingDataset(span_data, "train").info
    assert (info.masking.granularity, info.mode, info.has_spans) == ("span", "full-sentences", True)
    corpus, vocab = corpus_and_vocab
    assert main(prepare_args(corpus, vocab, tmp_path / "x", "--objective", "mlm+sbo", "--masking", "token")) == 2
    assert "--objective mlm+sbo needs --masking span, not token" in capsys.readouterr().err
