"""ALBERT's tokenizer: a SentencePiece unigram model (`spiece.model`, read by the `sentencepiece` library) under
ALBERT's rules, with the call surface of `BertTokenizer` (`tok(texts, pairs, truncation=, padding=,
return_offsets_mapping=, return_tensors=)`, `encode`, `decode`, special-token attributes, `save_pretrained`).
The ids are the `sentencepiece` library's `encode` of the text normalised as below (equal on random strings,
tests/models/albert/test_albert.py); ids and offsets equal `transformers.AlbertTokenizer`'s, which reads the same file, on the
parity tests' texts (on random strings `transformers` 5 differs on a few in ten thousand: docs/guide/families.md):

  * the text is split at the special tokens written in it ([CLS], [SEP], [MASK], <pad>, <unk>); each piece of
    plain text between them is tokenized on its own;
  * normalisation, in `transformers`' order: `` and '' become ", then (unless `keep_accents`) NFKD and the
    combining marks dropped, then (with `do_lower_case`) lowercasing; SentencePiece's own normaliser (the
    model's nmt_nfkc rules) runs inside the library;
  * the text is split at whitespace and every word gets SentencePiece's `▁` in front: `▁the`, or a lone `▁`
    before a word no piece starts with;
  * `[CLS] A [SEP]` / `[CLS] A [SEP] B [SEP]`, token types 0 for A (with [CLS] and its [SEP]) and 1 for B;
  * offsets are character spans of the original text: a piece covers the original characters its normalised
    characters came from (`ﬁ` -> `f` `i` both point at `ﬁ`), a `▁` the span of the first character of its word;
  * `decode` joins the pieces, reads `▁` as a space and drops the first token's leading one.

Truncation, padding, windows, tensors and the output layout are `BertTokenizer`'s own code.
"""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path
from typing import Any

from ...tokenizer import BertTokenizer
from ...tokenizer.sentencepiece import (SentencePieceBinding, SentencePieceError, SpecialsThenPieces, byte_to_char,
                                       load_processor, model_max_length_of, special_tokens_of)

SPACE = "▁"
DEFAULT_SPECIALS = dict(unk_token="<unk>", sep_token="[SEP]", pad_token="<pad>", cls_token="[CLS]",
                        mask_token="[MASK]")


class AlbertTokenizer(SpecialsThenPieces, SentencePieceBinding, BertTokenizer):
    """`AlbertTokenizer(model_file, do_lower_case=True, keep_accents=False)` or
    `AlbertTokenizer.from_pretrained(folder_or_model_file)`; see the module docstring."""

    def __init__(self, model_file: str | os.PathLike, do_lower_case: bool = True, keep_accents: bool = False, *,
                 unk_token: str = "<unk>", sep_token: str = "[SEP]", pad_token: str = "<pad>",
                 cls_token: str = "[CLS]", mask_token: str = "[MASK]", model_max_length: int = 512):
        self.model_file = Path(model_file)
        self.sp = load_processor(self.model_file)
        self.vocab_file = str(self.model_file)
        self.ids_to_tokens = [self.sp.id_to_piece(i) for i in range(self.sp.get_piece_size())]
        self.vocab = {t: i for i, t in enumerate(self.ids_to_tokens)}
        self.do_lower_case, self.keep_accents = bool(do_lower_case), bool(keep_accents)
        self.model_max_length = int(model_max_length)
        self.unk_token, self.sep_token, self.pad_token = unk_token, sep_token, pad_token
        self.cls_token, self.mask_token = cls_token, mask_token
        self.all_special_tokens = [cls_token, sep_token, unk_token, pad_token, mask_token]
        if unk_token not in self.vocab:
            raise SentencePieceError(f"{self.model_file}: the model has no {unk_token} piece")
        self.unk_token_id = self.vocab[unk_token]
        self.sep_token_id = self.vocab.get(sep_token)
        self.pad_token_id = self.vocab.get(pad_token)
        self.cls_token_id = self.vocab.get(cls_token)
        self.mask_token_id = self.vocab.get(mask_token)
        self.all_special_ids = sorted({self.vocab[t] for t in self.all_special_tokens if t in self.vocab})
        specials = sorted((t for t in self.all_special_tokens if t in self.vocab), key=len, reverse=True)
        self._special_split = re.compile("(" + "|".join(map(re.escape, specials)) + ")")
        self._fast = None  # BertTokenizer's C encoder is WordPiece's

    # -- loading and saving ----------------------------------------------------------------------------------

    FAMILY_NAME = "ALBERT's"

    @classmethod
    def config_kwargs(cls, cfg: dict[str, Any], path: Path) -> dict[str, Any]:
        """From Hugging Face's `tokenizer_config.json`: do_lower_case, keep_accents, special tokens,
        model_max_length."""
        out: dict[str, Any] = {k: bool(cfg[k]) for k in ("do_lower_case", "keep_accents") if k in cfg}
        out.update(special_tokens_of(cfg, DEFAULT_SPECIALS))
        return {**out, **model_max_length_of(cfg)}

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """spiece.model and tokenizer_config.json, as `transformers.AlbertTokenizer` writes and reads them."""
        config = {"tokenizer_class": "AlbertTokenizer", "do_lower_case": self.do_lower_case,
                  "keep_accents": self.keep_accents, "model_max_length": self.model_max_length,
                  "unk_token": self.unk_token, "sep_token": self.sep_token, "pad_token": self.pad_token,
                  "cls_token": self.cls_token, "mask_token": self.mask_token, "bos_token": self.cls_token,
                  "eos_token": self.sep_token}
        return self._save(directory, config)

    # -- text -> pieces ----------------------------------------------------------------------------------------

    def normalize_with_origins(self, text: str) -> tuple[str, list[tuple[int, int]]]:
        """ALBERT's normalisation before SentencePiece's (module docstring), and for each character of the
        result the (start, end) of the original characters it came from."""
        out: list[str] = []
        spans: list[tuple[int, int]] = []
        i = 0
        while i < len(text):
            if text.startswith(("``", "''"), i):
                out.append('"')
                spans.append((i + 1, i + 2))  # transformers aligns the quote with the second character
                i += 2
                continue
            chars = text[i]
            if not self.keep_accents:
                chars = "".join(c for c in unicodedata.normalize("NFKD", chars) if unicodedata.category(c) != "Mn")
            if self.do_lower_case:
                chars = chars.lower()
            out.extend(chars)
            spans.extend([(i, i + 1)] * len(chars))
            i += 1
        return "".join(out), spans

    def _plain(self, text: str, base: int, ids: list[int], offsets: list[tuple[int, int]], words: list[int]) -> None:
        """Tokenize text without special tokens (at `base` in the original), appending to the lists."""
        norm, spans = self.normalize_with_origins(text)
        # SentencePiece's own normaliser next (it may make spaces: a zero-width space becomes one), then the words
        # at its spaces (▁), rejoined by single spaces: SentencePiece gives each word its ▁
        normalized, back = self.sp.normalize(norm, with_offsets=True)
        chars: list[tuple[int, int] | None] = []
        pieces_text: list[str] = []
        word_starts: list[int] = []
        for m in re.finditer(f"[^{SPACE}]+", normalized):
            if pieces_text:
                pieces_text.append(" ")
                chars.append(None)
            word_starts.append(len(chars))
            pieces_text.append(m[0])
            chars.extend(spans[min(back[k], len(spans) - 1)] for k in range(m.start(), m.end()))
        if not pieces_text:
            return
        joined = "".join(pieces_text)
        char_at = byte_to_char(joined)
        first_word = words[-1] + 1 if words else 0
        for piece in self.sp.encode(joined, return_type="proto").pieces:
            start, end = char_at[piece.begin], char_at[piece.end]
            while start < end and chars[start] is None:  # the space a ▁ stands for
                start += 1
            if start == end:  # a lone ▁: the first character of its word
                end = start + 1
            ids.append(piece.id)
            offsets.append((base + chars[start][0], base + chars[end - 1][1]))
            words.append(first_word + sum(1 for s in word_starts if s <= start) - 1)

    def __repr__(self) -> str:
        return f"AlbertTokenizer({self.model_file.name}: {len(self)} pieces, do_lower_case={self.do_lower_case})"
