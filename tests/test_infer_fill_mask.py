"""fill-mask: its top-1 is the argmax of our MLM logits; probabilities; clear errors for bad input."""

from __future__ import annotations

import json

import pytest
import torch

from bertlab import BertForMaskedLM
from bertlab.cli import main
from bertlab.core.errors import BertlabError
from bertlab.infer.fill_mask import FillMasker
from bertlab.tokenizer import BertTokenizer

from infer_support import tiny_model


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("mlm") / "model", "BertForMaskedLM")


def test_top1_is_the_argmax_of_the_mlm_logits(mlm_dir):
    texts = ["the [MASK] sat on the mat .", "[MASK] lives in [MASK] .", "paris is the capital of [MASK]"]
    results = FillMasker.from_pretrained(mlm_dir).fill(texts, top_k=3)
    model, tok = BertForMaskedLM.from_pretrained(mlm_dir), BertTokenizer.from_pretrained(mlm_dir)
    for text, masks in zip(texts, results):
        enc = tok(text, return_tensors="pt")
        with torch.no_grad():
            logits = model(enc["input_ids"]).prediction_logits[0]  # (T, V)
        positions = (enc["input_ids"][0] == tok.mask_token_id).nonzero().flatten().tolist()
        assert len(masks) == len(positions)
        for pos, cands in zip(positions, masks):
            probs = logits[pos].softmax(-1)
            assert cands[0]["token_id"] == int(logits[pos].argmax())
            assert [c["token_id"] for c in cands] == probs.topk(3).indices.tolist()
            assert cands[0]["score"] == pytest.approx(float(probs.max()), abs=1e-5)
            assert cands[0]["token"] == tok.convert_ids_to_tokens(cands[0]["token_id"])
            assert "[MASK]" not in cands[0]["sequence"] or len(positions) > 1


def test_bad_input(mlm_dir, tmp_path):
    masker = FillMasker.from_pretrained(mlm_dir)
    with pytest.raises(BertlabError, match=r"text 2: no \[MASK\] in the text"):
        masker.fill(["the [MASK]", "no mask here"])
    with pytest.raises(BertlabError, match="every \\[MASK\\] was truncated away"):
        masker.fill(["the " * 200 + "[MASK]"])
    encoder_only = tiny_model(tmp_path / "encoder")
    with pytest.raises(BertlabError, match="no cls.predictions.\\* weights .*fill-mask needs"):
        FillMasker.from_pretrained(encoder_only)


def test_fill_mask_cli(mlm_dir, capsys):
    assert main(["fill-mask", "--model", str(mlm_dir), "--top-k", "2", "the [MASK] sat ."]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["text"] == "the [MASK] sat ." and len(out["masks"]) == 1 and len(out["masks"][0]) == 2
    assert main(["fill-mask", "--model", str(mlm_dir), "no mask"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertlab fill-mask: error: argument:1: no [MASK]") and err.count("\n") == 1
