"""ELECTRA test helpers (not a test module): tiny `transformers` configs and folders with a WordPiece vocabulary,
and what the family harness (tests/test_families.py) runs the commands on."""

from __future__ import annotations

from pathlib import Path

import torch

# E != H, so the embedding projection is exercised; dropout off so training-mode numbers compare
TINY = dict(embedding_size=24, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
HEADS = ["ElectraModel", "ElectraForPreTraining", "ElectraForMaskedLM", "ElectraForSequenceClassification",
         "ElectraForTokenClassification", "ElectraForQuestionAnswering", "ElectraForMultipleChoice"]


def electra_folder(folder: Path, architecture: str, vocab_size: int = 99, seed: int = 0, vocab: Path | None = None,
                   **config) -> Path:
    """A random-weight `transformers` ELECTRA of class `architecture`, saved (with `vocab`'s WordPiece tokenizer,
    saved by `transformers`' BertTokenizer, when given)."""
    import transformers

    if vocab is not None:
        vocab_size = len(vocab.read_text(encoding="utf-8").split("\n")) - 1
    torch.manual_seed(seed)
    hf_config = transformers.ElectraConfig(vocab_size=vocab_size, **{**TINY, **config})
    getattr(transformers, architecture)(hf_config).eval().save_pretrained(folder)
    if vocab is not None:
        transformers.ElectraTokenizer(str(vocab)).save_pretrained(folder)
    return folder


# ------------------------------------------------------------------------------ the family harness's commands
# (tests/test_families.py: `family_support.end_to_end` on the generator's folder, then `after_end_to_end`)


def masked_lm_folder(folder: Path) -> Path:
    """The generator (ElectraForMaskedLM) over the news tables' WordPiece vocabulary."""
    from own_data_support import write_vocab

    (folder.parent / "electra-vocab").mkdir(parents=True, exist_ok=True)
    vocab = write_vocab(folder.parent / "electra-vocab" / "vocab.txt")
    return electra_folder(folder, "ElectraForMaskedLM", vocab=vocab, seed=2)


def after_end_to_end(folder: Path, tmp_path: Path, capsys, measured: dict) -> None:
    """fill-mask's top word is `transformers`' pipeline's; `transformers`, with its own tokenizer, predicts what
    `bertlab predict` does with the fine-tuned classifier."""
    import json

    import transformers

    from bertlab.cli import main

    run = lambda *argv: main(["--log-level", "WARNING", *map(str, argv)])  # noqa: E731
    pipe = transformers.pipeline("fill-mask", model=str(folder), tokenizer=str(folder), top_k=1)
    assert pipe("the [MASK] won the match")[0]["token_str"].strip() in measured["fill_mask"]
    saved = tmp_path / "ft" / "model"
    config = json.loads((saved / "config.json").read_text())
    assert config["architectures"] == ["ElectraForSequenceClassification"] and config["model_type"] == "electra"
    text = "the coach said the team and the goal"
    with torch.no_grad():
        model = transformers.AutoModelForSequenceClassification.from_pretrained(saved).eval()
        tok = transformers.AutoTokenizer.from_pretrained(saved)
        expected = config["id2label"][str(model(**tok(text, return_tensors="pt")).logits.argmax().item())]
    (tmp_path / "one.jsonl").write_text(json.dumps({"text": text}) + "\n")
    capsys.readouterr()
    assert run("predict", "--model", saved, "--input", tmp_path / "one.jsonl") == 0
    assert json.loads(capsys.readouterr().out)["label"] == expected
