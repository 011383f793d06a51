"""Helpers for the ModernBERT tests (not a test module): a tiny random ModernBERT made by `transformers`, its
folder, a tokenizer.json of ModernBERT's form trained by `tokenizers`, and inputs around the local window."""

from __future__ import annotations

import json
from pathlib import Path

import torch

# Tiny sizes: heads of 16 (the C attention kernels take 16-64), a window of 16 (±8) so that rows of a few
# dozen tokens already span several windows, and 4 layers: global, local, local, global.
TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            local_attention=16, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
            max_position_embeddings=4096)


def hf_config(**overrides):
    from transformers import ModernBertConfig

    return ModernBertConfig(**{**TINY, **overrides})


def hf_model(cls_name: str = "ModernBertModel", seed: int = 0, **overrides):
    """A random `transformers` ModernBERT of class `cls_name`; norms and biases randomised too (their
    initialisation, 1 and 0, would hide a misplaced one)."""
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(hf_config(**overrides)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def ours_from(hf, tmp_path: Path, name: str = "m"):
    """bertlab's class of the same name, loaded from the folder `transformers` saved."""
    from bertlab.models.modernbert import heads, modeling

    folder = tmp_path / name
    hf.save_pretrained(folder)
    cls = getattr(heads, type(hf).__name__, None) or getattr(modeling, type(hf).__name__)
    return cls.from_pretrained(folder).eval(), folder


def window_batch(T: int, vocab_size: int = 300, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows of T positions: one full, one cut a little past the middle, one short (padding on the right)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab_size, (3, T), generator=g)
    ids[:, 0] = 1
    mask = torch.ones_like(ids)
    mask[1, T // 2 + 3:] = 0
    mask[2, max(2, T // 5):] = 0
    ids[mask == 0] = 0
    return ids, mask


def train_tokenizer_json(path: Path, texts: list[str], vocab_size: int = 1000) -> Path:
    """A tokenizer.json of ModernBERT's form (GPT-NeoX's byte-level BPE, NFC, [CLS] A [SEP] templates, [MASK]
    with lstrip, a non-special added token for runs of spaces), trained by `tokenizers` on `texts`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|padding|>", "<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken("    ", normalized=True), AddedToken("|||IP_ADDRESS|||", normalized=True)])
    tok.add_special_tokens(["[UNK]", "[CLS]", "[SEP]", "[PAD]", AddedToken("[MASK]", lstrip=True, special=True)])
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def tiny_folder(tmp_path: Path, texts: list[str], head: str = "ModernBertForMaskedLM", seed: int = 0,
                **overrides) -> Path:
    """A `transformers`-saved tiny ModernBERT folder with a trained tokenizer.json (the sizes of TINY and
    `overrides`, its vocabulary that of the tokenizer, the special ids its)."""
    from tokenizers import Tokenizer

    folder = tmp_path / "modernbert"
    tj = train_tokenizer_json(folder / "tokenizer.json", texts)
    tok = Tokenizer.from_file(str(tj))
    ids = {t: tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]")}
    model = hf_model(head, seed=seed, vocab_size=tok.get_vocab_size(), pad_token_id=ids["[PAD]"],
                     bos_token_id=ids["[CLS]"], cls_token_id=ids["[CLS]"], eos_token_id=ids["[SEP]"],
                     sep_token_id=ids["[SEP]"], **overrides)
    model.save_pretrained(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096, "cls_token": "[CLS]",
        "sep_token": "[SEP]", "pad_token": "[PAD]", "mask_token": "[MASK]", "unk_token": "[UNK]"}))
    return folder


# ------------------------------------------------------------------------------ the family harness's commands
# (tests/test_families.py: `family_support.end_to_end` on this folder)
TEXTS = ["the team won the match", "shares of the bank fell", "the minister spoke to parliament",
         "a new phone was released", "the coach praised the players"] * 40
END_TO_END = dict(lr=3e-3, epochs=20, min_accuracy=0.5)


def masked_lm_folder(folder: Path) -> Path:
    """A tiny ModernBertForMaskedLM with a tokenizer.json trained on the news tables' text (in `folder`'s parent)."""
    from own_data_support import news_rows

    return tiny_folder(folder.parent, TEXTS + [r["text"] for r in news_rows(200, 7)])
