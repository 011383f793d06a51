"""ALBERT test helpers (not a test module): a SentencePiece model laid out as ALBERT's, and the masked-LM folder
the family harness (tests/test_families.py) runs the commands on, with its settings."""

from __future__ import annotations

import io
from pathlib import Path

import torch

SPECIALS = ["[CLS]", "[SEP]", "[MASK]"]
# A tiny random ALBERT (one shared block) often separates two of the four topics first and stays there for
# hundreds of steps, in transformers' own training loop too: of six initialisations, dev accuracy was 0.95 for one
# and 0.5-0.55 for the rest (on a GPU, three: 0.475-0.6). 0.4 still says the run learned (chance is 0.25).
END_TO_END = dict(lr=1e-3, epochs=20, min_accuracy=0.4)


def train_spiece(path: Path, sentences: list[str], vocab_size: int = 150) -> Path:
    """A tiny SentencePiece unigram model laid out as ALBERT's (<pad> 0, <unk> 1, [CLS] 2, [SEP] 3, [MASK] 4)."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size,
                                   model_type="unigram", pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
                                   control_symbols=SPECIALS, character_coverage=1.0, minloglevel=2,
                                   hard_vocab_limit=False)
    path.mkdir(parents=True, exist_ok=True)
    (path / "spiece.model").write_bytes(model.getvalue())
    return path


def masked_lm_folder(folder: Path) -> Path:
    """A random AlbertForMaskedLM saved by `transformers`, with a SentencePiece model of the news tables."""
    import sentencepiece as spm
    import transformers

    from own_data_support import news_rows

    rows = news_rows(400, seed=7)
    folder = train_spiece(folder, [r["text"] for r in rows], vocab_size=120)
    size = spm.SentencePieceProcessor(model_file=str(folder / "spiece.model")).get_piece_size()
    torch.manual_seed(0)
    config = transformers.AlbertConfig(vocab_size=size, embedding_size=16, hidden_size=32, num_hidden_layers=4,
                                       num_attention_heads=4, intermediate_size=37, max_position_embeddings=128,
                                       num_labels=2)
    transformers.AlbertForMaskedLM(config).save_pretrained(folder)
    return folder
