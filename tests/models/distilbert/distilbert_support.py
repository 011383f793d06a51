"""DistilBERT test helpers (not a test module): the masked-LM folder the family harness (tests/test_families.py)
runs the commands on."""

from __future__ import annotations

from pathlib import Path

import torch


def masked_lm_folder(folder: Path) -> Path:
    """A random DistilBertForMaskedLM saved by `transformers`, over the news tables' WordPiece vocabulary."""
    import transformers

    from own_data_support import write_vocab

    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_vocab(folder / "vocab.txt")
    torch.manual_seed(0)
    config = transformers.DistilBertConfig(vocab_size=len(vocab.read_text().split()), dim=32, n_layers=2, n_heads=4,
                                           hidden_dim=37, max_position_embeddings=128, dropout=0.1,
                                           attention_dropout=0.1)
    transformers.DistilBertForMaskedLM(config).save_pretrained(folder)
    return folder
