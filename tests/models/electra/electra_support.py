"""ELECTRA test helpers (not a test module): tiny `transformers` configs and folders with a WordPiece vocabulary."""

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
