"""ModernBERT pre-training from raw text at toy size: `prepare` reads its tokenizer.json as ModernBERT's own kind
("bpe-cls", not RoBERTa's byte-level BPE), `pretrain` then picks ModernBERT from the data and trains its masked LM
(30% masking, no NSP) with StableAdamW on a warmup-stable-decay schedule; the saved folder loads in `transformers`
as ModernBertForMaskedLM (and its tokenizer as theirs) with the same logits, and a run stopped by Ctrl-C resumes
bitwise exactly. StableAdamW itself is checked against AdamW where they must agree and where they must not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bertlab.cli import main
from bertlab.train import read_metrics
from faults_support import check_pretraining_resumes_bitwise
from family_support import padded_batch, rel_err
from modernbert_support import train_tokenizer_json

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")


def corpus_lines() -> list[str]:
    from own_data_support import news_rows

    return [r["text"] for r in news_rows(240, 3)]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("mb-tok")
    train_tokenizer_json(folder / "tokenizer.json", corpus_lines(), vocab_size=600)
    return folder


@pytest.fixture(scope="module")
def data_dir(tokenizer_dir, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mb-data")
    corpus = root / "corpus.txt"
    # documents of a few sentences, a blank line between them; one writes "[CLS]" as text
    lines = corpus_lines()
    docs = ["\n".join(lines[i:i + 4]) for i in range(0, len(lines), 4)]
    docs[0] += "\nthe page said [CLS] and [MASK] in brackets"
    corpus.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    out = root / "data"
    assert main(["--log-level", "WARNING", "prepare", str(corpus), "--vocab", str(tokenizer_dir), "--out", str(out),
                 "--mode", "full-sentences", "--dynamic", "--masked-lm-prob", "0.3", "--max-seq-length", "64",
                 "--heldout-fraction", "0.1", "--workers", "1", "--quiet"]) == 0
    return out


def pretrain_args(data_dir, out, *extra):
    return ["--log-level", "WARNING", "pretrain", "--model", "tiny", "--data", str(data_dir), "--out", str(out),
            "--batch-size", "8", "--eval-batches", "2", "--no-progress", "--num-workers", "0", "--precision", "fp32",
            "--optimizer", "stableadamw", "--lr", "2e-3", "--adam-beta2", "0.98", "--weight-decay", "1e-5",
            "--warmup", "2", "--decay-fraction", "0.5", *map(str, extra)]


def test_prepare_reads_the_tokenizer_json_as_modernberts(data_dir, tokenizer_dir):
    from bertlab.data import DataInfo
    from bertlab.data.pipeline import load_corpus_tokenizer
    from bertlab.models.modernbert.tokenizer import ModernBertTokenizer

    info = DataInfo.load(data_dir, max_seq_length=64)
    assert info.tokenizer_kind == "bpe-cls" and info.masking.masked_lm_prob == 0.3 and not info.has_nsp
    assert info.vocab_file.name == "tokenizer.json"
    tok = ModernBertTokenizer.from_pretrained(tokenizer_dir)
    assert (info.cls_id, info.sep_id, info.pad_id, info.mask_id) == \
        (tok.cls_token_id, tok.sep_token_id, tok.pad_token_id, tok.mask_token_id)
    # a corpus's "[CLS]" is text, while a run of spaces (a plain added token) is matched whole as the model sees it
    assert load_corpus_tokenizer(tokenizer_dir).split_special_tokens
    for use_fast in (True, False):
        corpus_tok = ModernBertTokenizer.from_pretrained(tokenizer_dir, split_special_tokens=True, use_fast=use_fast)
        ids = corpus_tok.encode("a [CLS] b    c", add_special_tokens=False)
        assert tok.cls_token_id not in ids and tok.vocab["    "] in ids, use_fast
        assert ids[:1] == tok.encode("a", add_special_tokens=False)
    # a RoBERTa-only setting is refused in one line rather than read into another family's data
    from bertlab.data.readers import DataError

    with pytest.raises(DataError, match="cased"):
        load_corpus_tokenizer(tokenizer_dir, do_lower_case=True)


def test_pretraining_picks_modernbert_and_saves_a_folder_transformers_loads(data_dir, tmp_path, capsys):
    from bertlab.models.modernbert.heads import ModernBertForMaskedLM
    from bertlab.models.modernbert.tokenizer import ModernBertTokenizer

    out = tmp_path / "run"
    assert main(pretrain_args(data_dir, out, "--steps", 12)) == 0
    assert "--family modernbert" in capsys.readouterr().out  # said from the data's manifest
    final = out / "final"
    config = json.loads((final / "config.json").read_text())
    assert config["model_type"] == "modernbert" and config["architectures"] == ["ModernBertForMaskedLM"]
    assert config["hidden_size"] == 128 and config["intermediate_size"] == 192  # BERT-Tiny's sizes, GeGLU 1.5 H
    run_config = json.loads((out / "run_config.json").read_text())
    assert run_config["optimizer"] == "stableadamw"
    hf, info = transformers.ModernBertForMaskedLM.from_pretrained(final, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ours = ModernBertForMaskedLM.from_pretrained(final).eval()
    ids, mask = padded_batch(int(hf.config.vocab_size))
    with torch.no_grad():
        theirs = hf.eval()(input_ids=ids, attention_mask=mask).logits
        mine = ours(ids, attention_mask=mask).prediction_logits
    assert rel_err(mine[mask.bool()], theirs[mask.bool()]) <= 1e-6
    # its tokenizer: transformers reads the saved tokenizer.json and makes the ids bertlab makes
    text = "the coach praised the players"
    assert transformers.AutoTokenizer.from_pretrained(final)(text)["input_ids"] == \
        ModernBertTokenizer.from_pretrained(final)(text)["input_ids"]
    # the held-out masked-LM loss fell from the untrained model's
    evals = [r["eval/mlm_loss"] for r in read_metrics(out) if "eval/mlm_loss" in r]
    assert len(evals) >= 2 and evals[-1] < evals[0] - 0.3


def test_a_stopped_run_resumes_bitwise_exactly(data_dir, tmp_path, monkeypatch):
    check_pretraining_resumes_bitwise(monkeypatch, tmp_path,
                                      lambda out: pretrain_args(data_dir, out, "--steps", 6, "--save-every", 2), "mlm")


def test_a_roberta_family_on_modernbert_data_is_one_line(data_dir, tmp_path, capsys):
    assert main(pretrain_args(data_dir, tmp_path / "run", "--family", "roberta", "--steps", 2)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bpe-cls" in err and "--family modernbert" in err


# ---------------------------------------------------------------------------------------------- StableAdamW
def _two_tensors():
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(5))]


def test_stable_adamw_is_adamw_while_gradients_stay_at_their_scale():
    """With gradients at their running scale (RMS ≤ 1) and no weight decay, StableAdamW's steps are AdamW's."""
    from bertlab.train.optim import StableAdamW

    ours, ref = _two_tensors(), _two_tensors()
    a = StableAdamW(ours, lr=1e-2, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.0)
    b = torch.optim.AdamW(ref, lr=1e-2, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.0, foreach=False)
    grads = [torch.randn(4, 3), torch.randn(5)]
    for _ in range(3):  # the same gradient each step: v̂ = g², RMS exactly 1
        for p, q, g in zip(ours, ref, grads):
            p.grad, q.grad = g.clone(), g.clone()
        a.step(), b.step()
    for p, q in zip(ours, ref):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_stable_adamw_clips_the_spiking_tensor_alone_and_decays_decoupled():
    from bertlab.train.optim import StableAdamW

    ours, ref = _two_tensors(), _two_tensors()
    a = StableAdamW(ours, lr=1e-2, weight_decay=0.0)
    b = torch.optim.AdamW(ref, lr=1e-2, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.0, foreach=False)
    g0, g1 = torch.ones(4, 3), torch.ones(5)
    for step, scale in ((1, 1.0), (2, 100.0)):  # the first tensor's gradient jumps 100x at step 2
        for p, q, g, k in zip(ours, ref, (g0, g1), (scale, 1.0)):
            p.grad, q.grad = g * k, g * k
        a.step(), b.step()
    before = _two_tensors()
    moved = [(p - q).abs().max() for p, q in zip(ours, before)]
    moved_adamw = [(p - q).abs().max() for p, q in zip(ref, before)]
    assert moved[0] < 0.9 * moved_adamw[0]  # the spike's step shrunk by its RMS (√2 here)
    torch.testing.assert_close(ours[1], ref[1], rtol=1e-6, atol=1e-7)  # the other tensor untouched by it
    # decoupled decay: a weight loses λ · lr / lr_peak of itself per step, whatever the rate's size
    w = torch.nn.Parameter(torch.full((3,), 2.0))
    opt = StableAdamW([{"params": [w], "initial_lr": 1e-3}], lr=5e-4, weight_decay=0.1)
    w.grad = torch.zeros(3)
    opt.step()
    torch.testing.assert_close(w.detach(), torch.full((3,), 2.0 * (1 - 0.1 * 0.5)))
