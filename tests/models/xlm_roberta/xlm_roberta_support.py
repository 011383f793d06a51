"""XLM-R test helpers (not a test module): a SentencePiece model learned here, a random XLM-R folder with it, and
the masked-LM folder the family harness (tests/test_families.py) runs the commands on."""

from __future__ import annotations

import io
from pathlib import Path

import torch

from roberta_support import END_TO_END, EXTRA_TEXT, TINY  # noqa: F401  (END_TO_END: RoBERTa's, the same model)


def train_spm(path: Path, model_type: str = "unigram", vocab_size: int = 160, texts: list[str] | None = None) -> Path:
    """A SentencePiece model (`sentencepiece.bpe.model`, XLM-R's file name) learned on the news tables and a few
    lines of accents, CJK and punctuation."""
    import sentencepiece as spm

    from own_data_support import news_rows

    texts = texts or [r["text"] for r in news_rows(300, seed=7)] + EXTRA_TEXT * 3
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size,
                                   model_type=model_type, character_coverage=1.0, hard_vocab_limit=False,
                                   minloglevel=2)
    path.mkdir(parents=True, exist_ok=True)
    (path / "sentencepiece.bpe.model").write_bytes(model.getvalue())
    return path


def xlmr_folder(folder: Path, spm_folder: Path, architecture: str = "XLMRobertaModel", seed: int = 0, **config):
    """A random-weight XLM-R of `transformers`' `architecture` with the test SentencePiece model beside it."""
    import transformers

    from bertlab.models.xlm_roberta.tokenizer import XLMRobertaTokenizer

    tok = XLMRobertaTokenizer.from_pretrained(spm_folder)
    torch.manual_seed(seed)
    hf_config = transformers.XLMRobertaConfig(vocab_size=len(tok), **{**TINY, "max_position_embeddings": 130},
                                              **config)
    getattr(transformers, architecture)(hf_config).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def masked_lm_folder(folder: Path) -> Path:
    """A random XLMRobertaForMaskedLM with a SentencePiece model learned on the news tables."""
    return xlmr_folder(folder, train_spm(folder.parent / "spm"), "XLMRobertaForMaskedLM")
