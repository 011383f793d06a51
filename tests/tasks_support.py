"""Helpers shared by the task tests (not a test module): one tokenizer load per session, tiny models."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.lru_cache(maxsize=None)
def uncased_tokenizer(vocab: str):
    """Google's uncased WordPiece vocabulary (all-MiniLM-L6-v2 uses the same one), loaded once."""
    from bertlab import BertTokenizer

    return BertTokenizer.from_pretrained(vocab)


def tiny_model_dir(path: Path, vocab_file: Path, seed: int = 0, vocab_lines: int = 3000) -> Path:
    """A tiny randomly initialised BERT (hidden 32, 2 layers) in the HF layout, over the first `vocab_lines`
    entries of a real vocabulary (Google's: the special tokens, every character, the commonest words; rarer
    words become pieces or [UNK]): fast enough for end-to-end recipe tests, real enough that every file and
    code path is exercised."""
    import torch

    from bertlab import BertConfig, BertModel

    torch.manual_seed(seed)
    with open(vocab_file, encoding="utf-8") as f:
        tokens = [line for _, line in zip(range(vocab_lines), f)]
    config = BertConfig(vocab_size=len(tokens), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=512)
    BertModel(config).save_pretrained(path)
    (path / "vocab.txt").write_text("".join(tokens), encoding="utf-8")
    return path
