"""BERT test helpers (not a test module): the masked-LM folder the family harness (tests/test_families.py) runs
the commands on."""

from __future__ import annotations

from pathlib import Path

import torch


def masked_lm_folder(folder: Path) -> Path:
    """A random BertForMaskedLM saved by `transformers` (hidden 32, 2 layers), over the news tables' WordPiece
    vocabulary, which `transformers`' BertTokenizer saves beside it."""
    import transformers

    from family_support import TINY_CONFIGS
    from own_data_support import write_vocab

    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_vocab(folder / "vocab.txt")
    torch.manual_seed(0)
    config = transformers.BertConfig(**{**TINY_CONFIGS["bert"], "vocab_size": len(vocab.read_text().split()),
                                        "max_position_embeddings": 128})
    transformers.BertForMaskedLM(config).save_pretrained(folder)
    transformers.BertTokenizer(str(vocab)).save_pretrained(folder)
    return folder
