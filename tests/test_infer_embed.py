"""Sentence embeddings: equal to sentence-transformers on all-MiniLM-L6-v2, independent of batching, and the
`embed` / `similarity` commands with their bad-input errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertlab.cli import main
from bertlab.infer.embeddings import Embedder, cosine
from bertlab.infer.runtime import InferenceOptions

from infer_support import tiny_model

SENTENCES = [
    "A man is playing a guitar.",
    "Someone is playing an instrument.",
    "The stock market fell sharply today.",
    "",
    "Héllo wörld!! naïve café, 東京 and the Straße",
    "How do I reset my password? I forgot my login credentials and the reset e-mail never arrived.",
    "word " * 300,  # over all-MiniLM-L6-v2's 256-token limit: truncated where sentence-transformers truncates
    "x",
]


def test_mean_normalize_equals_sentence_transformers(minilm_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    st = pytest.importorskip("sentence_transformers")
    ours = Embedder.from_pretrained(minilm_dir, pooling="mean", normalize=True,
                                    options=InferenceOptions(max_tokens=512)).embed(SENTENCES)
    theirs = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(SENTENCES, batch_size=3)
    sims = cosine(ours, np.asarray(theirs))
    assert sims.min() >= 0.99999, sims
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("embed") / "model")


@pytest.mark.parametrize("pooling", ["cls", "mean", "max"])
def test_poolings_match_a_direct_forward_pass(tiny_dir, pooling):
    from bertlab import BertModel
    from bertlab.tokenizer import BertTokenizer

    texts = ["the cat sat on the mat", "a dog", "paris is the capital of france ."]
    emb = Embedder.from_pretrained(tiny_dir, pooling=pooling).embed(texts)
    model, tok = BertModel.from_pretrained(tiny_dir), BertTokenizer.from_pretrained(tiny_dir)
    for text, row in zip(texts, emb):  # one text at a time: no padding at all
        enc = tok(text, return_tensors="pt")
        with torch.no_grad():
            h = model(enc["input_ids"]).last_hidden_state[0]
        expected = {"cls": h[0], "mean": h.mean(0), "max": h.max(0).values}[pooling]
        np.testing.assert_allclose(row, expected.numpy(), atol=1e-5)


def test_embedder_drops_the_pooler_it_never_reads(tiny_dir):
    """The [CLS] pooler is a task head's input: an embedder's pass skips it (a GEMV a call at batch 1), and its
    vectors stay those of the full encoder (the test above)."""
    emb = Embedder.from_pretrained(tiny_dir)
    assert emb.model.pooler is None
    assert emb.embed(["a dog"]).shape == (1, emb.dim)


def test_result_does_not_depend_on_batching(tiny_dir):
    texts = [" ".join(["the cat"] * n) for n in (1, 9, 2, 30, 4, 1)]
    big = Embedder.from_pretrained(tiny_dir, options=InferenceOptions(max_tokens=10_000)).embed(texts)
    small = Embedder.from_pretrained(tiny_dir, options=InferenceOptions(max_tokens=1, max_batch=1)).embed(texts)
    np.testing.assert_allclose(big, small, atol=1e-5)


def test_bf16_is_close_to_fp32(tiny_dir):
    texts = ["the cat sat on the mat", "a dog is good", "who lives in london ?"]
    fp32 = Embedder.from_pretrained(tiny_dir, normalize=True).embed(texts)
    bf16 = Embedder.from_pretrained(tiny_dir, normalize=True, options=InferenceOptions(dtype="bf16")).embed(texts)
    assert bf16.dtype == np.float32 and cosine(fp32, bf16).min() > 0.99


def test_embed_cli_jsonl_npy_and_similarity(tiny_dir, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("the cat\n\na dog is good\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert main(["embed", "--model", str(tiny_dir), "--input", str(src), "--output", str(out), "--normalize"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and all(len(r) == 32 for r in rows)  # the empty line stays a row
    assert abs(np.linalg.norm(rows[0]) - 1) < 1e-5
    assert main(["embed", "--model", str(tiny_dir), "--input", str(src), "--output", str(tmp_path / "e.npy"),
                 "--normalize"]) == 0
    arr = np.load(tmp_path / "e.npy")
    assert arr.shape == (3, 32) and arr.dtype == np.float32
    np.testing.assert_allclose(arr, np.asarray(rows), atol=1e-6)
    capsys.readouterr()
    assert main(["similarity", "--model", str(tiny_dir), "the cat", "the cat"]) == 0
    assert abs(float(capsys.readouterr().out) - 1.0) < 1e-5


def test_embed_bad_input(tiny_dir, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert main(["embed", "--model", str(tiny_dir), "--input", str(empty)]) == 2
    assert "empty input" in capsys.readouterr().err
    long = tmp_path / "long.txt"
    long.write_text("the cat\n" + "dog " * 200 + "\n", encoding="utf-8")
    assert main(["embed", "--model", str(tiny_dir), "--input", str(long), "--on-long", "reject"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{long}:2:" in err and "over the limit of 128" in err
    assert main(["embed", "--model", str(tiny_dir), "--input", str(long), "--output", str(tmp_path / "o.jsonl")]) == 0
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\n\xff\xfe\n")
    assert main(["embed", "--model", str(tiny_dir), "--input", str(bad)]) == 2
    assert f"{bad}:2: not UTF-8" in capsys.readouterr().err
    assert main(["embed", "--model", str(tmp_path / "nope"), "--input", str(long)]) == 2
    assert "no such model folder" in capsys.readouterr().err


def test_over_long_line_is_truncated_with_a_warning(tiny_dir, caplog):
    emb = Embedder.from_pretrained(tiny_dir)
    with caplog.at_level("WARNING"):
        out = emb.embed(["the cat", "dog " * 200])
    assert out.shape == (2, 32)
    assert "1 text over 128 tokens, truncated: text 2" in caplog.text


def test_bf16_on_a_cpu_without_native_bf16_runs_fp32_and_says_so(monkeypatch, caplog):
    """bf16 is emulated where the CPU lacks AVX-512 BF16 / AMX (slower than fp32): --dtype bf16 runs fp32 there
    with one line; auto picks bf16 only where it is native; peer engines keep what they were asked."""
    import logging

    from bertlab.infer import runtime
    from bertlab.infer.runtime import InferenceOptions

    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: False)
    with caplog.at_level(logging.WARNING, logger=runtime.log.name):
        assert InferenceOptions(dtype="bf16").dtype == "fp32"
    said = [r.getMessage() for r in caplog.records if "bf16" in r.getMessage()]
    assert len(said) == 1 and "running fp32" in said[0] and "\n" not in said[0]
    assert InferenceOptions(dtype="auto").dtype == "fp32"
    assert InferenceOptions(dtype="int8").dtype == "int8"
    assert runtime.resolve_dtype("bf16", "cpu", engine="openvino") == "bf16"
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: True)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=runtime.log.name):
        assert InferenceOptions(dtype="bf16").dtype == "bf16" and InferenceOptions(dtype="auto").dtype == "bf16"
    assert not caplog.records
