"""RoBERTa test helpers (not a test module): tiny sizes, byte-level BPE tokenizer files learned here, a folder of
RoBERTa or XLM-R, and the masked-LM folder the family harness (tests/test_families.py) runs the commands on."""

from __future__ import annotations

import json
from pathlib import Path

import torch

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=40, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
EXTRA_TEXT = ["Grüße aus Köln, ça va? naïve café 123,456.78", "東京は晴れ. ｆｕｌｌ width ① ﬁne",
              "The capital is Paris. tab\there\nnew line", "Ωmega, (brackets) and \"quotes\" -- dashes!"]
# Four topics, chance 0.25: a tiny random encoder learning from a two-layer head on <s> stalls at two topics (0.5)
# from some starts (with batches of 4, seeds 1-4 reached 1.0, 0.5, 0.75, 0.5 for RoBERTa and 1.0, 1.0, 0.5, 0.75
# for XLM-R), so the bound leaves room for other starts and machines' rounding. Training's arithmetic is checked
# against transformers' step for step in test_roberta.py.
END_TO_END = dict(lr=1e-3, epochs=20, min_accuracy=0.4)


def bpe_tokenizer_files(folder: Path) -> Path:
    """RoBERTa's tokenizer files (vocab.json + merges.txt), a byte-level BPE learned by the `tokenizers` library on
    the synthetic news text, the specials first."""
    import tokenizers

    from own_data_support import news_rows

    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator([r["text"] for r in news_rows(300, seed=7)] + EXTRA_TEXT, vocab_size=400,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False)
    folder.mkdir(parents=True, exist_ok=True)
    bpe.save_model(str(folder))
    return folder


def family_folder(family: str, folder: Path, tokenizer_files: Path, architecture: str, seed: int = 0) -> Path:
    """A random-weight model of `family` ("roberta" or "xlm-roberta") and `transformers`' `architecture` (its
    bare-encoder class name without the family prefix: "Model", "ForMaskedLM", ...), tokenizer files beside it."""
    import shutil

    import transformers

    if family == "xlm-roberta":
        from xlm_roberta_support import xlmr_folder

        return xlmr_folder(folder, tokenizer_files, "XLMRoberta" + architecture, seed)
    vocab = len(json.loads((tokenizer_files / "vocab.json").read_text()))
    torch.manual_seed(seed)
    config = transformers.RobertaConfig(vocab_size=vocab, **{**TINY, "max_position_embeddings": 130})
    getattr(transformers, "Roberta" + architecture)(config).eval().save_pretrained(folder)
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(tokenizer_files / name, folder / name)
    # bertlab's save adds tokenizer_config.json, which tells transformers that <mask> takes the space before it
    from bertlab import AutoTokenizer

    AutoTokenizer.from_pretrained(folder).save_pretrained(folder)
    return folder


def masked_lm_folder(folder: Path) -> Path:
    """A random RobertaForMaskedLM with BPE tokenizer files learned on the news tables."""
    return family_folder("roberta", folder, bpe_tokenizer_files(folder.parent / "bpe"), "ForMaskedLM")
