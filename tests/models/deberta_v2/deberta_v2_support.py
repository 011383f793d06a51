"""DeBERTa-v2 test helpers (not a test module): the masked-LM folder the family harness (tests/test_families.py)
runs the commands on, and its settings."""

from __future__ import annotations

from pathlib import Path

import torch

# (a tiny random DeBERTa separates the four topics slowly: a lower rate, fewer epochs, a lower bar)
END_TO_END = dict(lr=1e-3, epochs=20, min_accuracy=0.5)


def masked_lm_folder(folder: Path) -> Path:
    """Random DebertaV2ForMaskedLM weights (DeBERTa-v3's layout) with a SentencePiece `spm.model` learned on the
    news tables."""
    import sentencepiece as spm
    import transformers

    from own_data_support import news_rows
    from test_deberta_v2_parity import hf_config
    from test_deberta_v2_tokenizer import train_spm

    rows = news_rows(400, seed=7)
    folder = train_spm(folder, [r["text"] for r in rows], vocab_size=120)
    size = spm.SentencePieceProcessor(model_file=str(folder / "spm.model")).get_piece_size()
    torch.manual_seed(0)
    # [MASK] is added after the pieces, as in DeBERTa-v3 (its vocab_size leaves room beyond them)
    config = hf_config("v3", vocab_size=size + 8, num_hidden_layers=2, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0)
    transformers.DebertaV2ForMaskedLM(config).save_pretrained(folder)
    return folder
