"""DeBERTa-v2/v3's tokenizer: the unigram pieces of a SentencePiece model (`spm.model`) under the pipeline
`transformers` 5 runs for `DebertaV2Tokenizer`, with the call surface of `BertTokenizer` (`tok(texts, pairs,
truncation=, padding=, return_offsets_mapping=, return_tensors=)`, `encode`, `decode`, `save_pretrained`).

Which reference: `transformers` 5 has one `DebertaV2Tokenizer`, built on the `tokenizers` library, and it does
*not* run the SentencePiece model's own normaliser (nmt_nfkc): it reads the file's pieces and scores into a
unigram model and normalises as below. The `sentencepiece` library -- what DeBERTa's own code and
`transformers` 4's slow tokenizer call -- applies NFKC first, so the two differ on compatibility characters
(`ﬁ`, full-width letters, `①`: one unknown piece against `fi`, `F`...). This binding follows `transformers` 5
(ids and offsets equal on the WikiText-2, SQuAD and CoNLL-2003 texts, tests/models/deberta_v2/); the pipeline:

  * the special tokens written in the text ([CLS], [SEP], [PAD], [UNK], [MASK]) are split out first, each
    stretch of text between them tokenized on its own;
  * normalisation: lowercasing (with `do_lower_case`), each run of two or more whitespace characters and each
    tab or newline made one space, NFC, trailing whitespace dropped;
  * every stretch gets a leading `▁` (prepend_scheme "always"), its spaces become `▁`, and it is split into
    words before each `▁`;
  * each word is split by the unigram model's Viterbi search over the pieces' scores (the `tokenizers`
    library's, ties to the first path found); a character no piece covers is the unknown piece (scored the
    lowest score less 10), and a run of unknowns is one `[UNK]`;
  * `[CLS] A [SEP]` / `[CLS] A [SEP] B [SEP]`, token types 0 for A (with [CLS] and its [SEP]) and 1 for B;
  * offsets are character spans of the original text, as `tokenizers` aligns them: a replaced whitespace run
    stands at its last character, a composed character at its first, the leading `▁` at the stretch's first
    character, and a piece's span runs from its first character's start to its last one's end.

`[MASK]` is not a piece of DeBERTa-v3's model: it is added after the pieces (id = number of pieces), as
`transformers` adds it. The model must have the unknown piece (`[UNK]`).
"""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path
from typing import Any

from ...tokenizer import BertTokenizer
from ...tokenizer.sentencepiece import (SentencePieceBinding, SentencePieceError, SpecialsThenPieces, load_processor,
                                        model_max_length_of, special_tokens_of)

SPM_NAME = "spm.model"
SPACE = "▁"
# Unicode White_Space, as the `tokenizers` library's regex (\s) and its Strip read it
WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
WHITESPACE_RUN = re.compile(f"[{WHITE_SPACE}]{{2,}}|[\n\r\t]")
TRAILING_WHITESPACE = re.compile(f"[{WHITE_SPACE}]+$")
UNK_PENALTY = 10.0  # the unknown piece's score: the lowest piece score less this (`tokenizers`' kUnkPenalty)
DEFAULT_SPECIALS = dict(pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", unk_token="[UNK]",
                        mask_token="[MASK]")


class DebertaV2Tokenizer(SpecialsThenPieces, SentencePieceBinding, BertTokenizer):
    """`DebertaV2Tokenizer(model_file, do_lower_case=False)` or `DebertaV2Tokenizer.from_pretrained(folder or
    spm.model)`; see the module docstring."""

    MODEL_NAME = SPM_NAME
    FAMILY_NAME = "DeBERTa's"
    WORD = f"[^{WHITE_SPACE}]+"

    def __init__(self, model_file: str | os.PathLike, do_lower_case: bool = False, *, pad_token: str = "[PAD]",
                 cls_token: str = "[CLS]", sep_token: str = "[SEP]", unk_token: str = "[UNK]",
                 mask_token: str = "[MASK]", model_max_length: int = 512):
        self.model_file = Path(model_file)
        self.vocab_file = str(self.model_file)
        self.sp = load_processor(self.model_file)
        self.do_lower_case = bool(do_lower_case)
        self.model_max_length = int(model_max_length)
        self.pad_token, self.cls_token, self.sep_token = pad_token, cls_token, sep_token
        self.unk_token, self.mask_token = unk_token, mask_token
        self._setup()

    def _setup(self) -> None:
        pieces = [self.sp.id_to_piece(i) for i in range(self.sp.get_piece_size())]
        self.ids_to_tokens = list(pieces)
        self.vocab = {}
        for i, piece in enumerate(pieces):
            self.vocab.setdefault(piece, i)
        self.all_special_tokens = [self.cls_token, self.sep_token, self.unk_token, self.pad_token, self.mask_token]
        for token in self.all_special_tokens:  # those the model lacks are added after its pieces
            if token not in self.vocab:
                self.vocab[token] = len(self.ids_to_tokens)
                self.ids_to_tokens.append(token)
        if self.unk_token not in pieces:
            raise SentencePieceError(f"{self.model_file}: the model has no {self.unk_token} piece (a DeBERTa "
                                     f"spm.model has [PAD], [CLS], [SEP], [UNK] as pieces 0-3)")
        for name in DEFAULT_SPECIALS:
            setattr(self, f"{name}_id", self.vocab[getattr(self, name)])
        self.all_special_ids = sorted({self.vocab[t] for t in self.all_special_tokens})
        self.scores = [self.sp.get_score(i) for i in range(len(pieces))]
        self.unk_score = min(self.scores) - UNK_PENALTY
        self.longest_piece = max(len(p) for p in pieces)
        self._piece_ids = {p: i for i, p in enumerate(pieces)}  # first id of a piece, as `tokenizers` keeps it
        specials = sorted(set(self.all_special_tokens), key=len, reverse=True)
        self._special_split = re.compile("(" + "|".join(map(re.escape, specials)) + ")")
        self._fast = None  # BertTokenizer's C encoder is WordPiece's

    _unpicklable = ("_special_split",)

    def _unpickled(self) -> None:
        self._setup()

    # -- loading and saving ----------------------------------------------------------------------------------
    @classmethod
    def config_kwargs(cls, cfg: dict[str, Any], path: Path) -> dict[str, Any]:
        """From Hugging Face's `tokenizer_config.json`: do_lower_case, the special tokens, model_max_length;
        settings this binding does not implement are refused rather than ignored."""
        out: dict[str, Any] = {"do_lower_case": bool(cfg["do_lower_case"])} if "do_lower_case" in cfg else {}
        out.update(special_tokens_of(cfg, DEFAULT_SPECIALS))
        for key, default in (("split_by_punct", False), ("add_prefix_space", True)):
            if cfg.get(key, default) != default:
                raise SentencePieceError(f"{path}: {key} = {cfg[key]!r} is not supported (DeBERTa's released "
                                         f"tokenizers use {default})")
        return {**out, **model_max_length_of(cfg)}

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """spm.model and tokenizer_config.json, as `transformers.DebertaV2Tokenizer` reads them."""
        config = {"tokenizer_class": "DebertaV2Tokenizer", "do_lower_case": self.do_lower_case,
                  "model_max_length": self.model_max_length, "split_by_punct": False,
                  "bos_token": self.cls_token, "eos_token": self.sep_token,
                  **{name: getattr(self, name) for name in DEFAULT_SPECIALS}}
        return self._save(directory, config)

    # -- text -> pieces ----------------------------------------------------------------------------------------
    def normalize_with_origins(self, text: str) -> tuple[str, list[tuple[int, int]]]:
        """The normalised text and, for each of its characters, the original span it is aligned with."""
        chars: list[str] = []
        spans: list[tuple[int, int]] = []
        for i, c in enumerate(text):  # lowercase: every character of c.lower() stands at c
            out = c.lower() if self.do_lower_case else c
            chars.extend(out)
            spans.extend([(i, i + 1)] * len(out))
        norm = "".join(chars)
        chars, out_spans, pos = [], [], 0
        for m in WHITESPACE_RUN.finditer(norm):  # one space, at the run's last character
            chars.extend(norm[pos:m.start()])
            out_spans.extend(spans[pos:m.start()])
            chars.append(" ")
            out_spans.append(spans[m.end() - 1])
            pos = m.end()
        chars.extend(norm[pos:])
        out_spans.extend(spans[pos:])
        norm, spans = "".join(chars), out_spans
        if not unicodedata.is_normalized("NFC", norm):
            norm, spans = _nfc_with_origins(norm, spans)
        stripped = TRAILING_WHITESPACE.search(norm)
        if stripped:
            norm, spans = norm[:stripped.start()], spans[:stripped.start()]
        return norm, spans

    def viterbi(self, word: str) -> list[tuple[int, int, int]]:
        """The best split of `word` into pieces: (piece id, start, end) in its characters; runs of unknown
        characters fused into one unknown piece."""
        n = len(word)
        best: list[tuple[float, int, int] | None] = [None] * (n + 1)  # (score, start, id) of the best path to here
        best[0] = (0.0, -1, -1)
        for start in range(n):
            here = best[start][0]
            single = False
            for end in range(start + 1, min(n, start + self.longest_piece) + 1):
                piece_id = self._piece_ids.get(word[start:end])
                if piece_id is None:
                    continue
                score = here + self.scores[piece_id]
                if best[end] is None or score > best[end][0]:
                    best[end] = (score, start, piece_id)
                single = single or end == start + 1
            if not single:
                score = here + self.unk_score
                if best[start + 1] is None or score > best[start + 1][0]:
                    best[start + 1] = (score, start, self.unk_token_id)
        out: list[tuple[int, int, int]] = []
        end = n
        while end > 0:
            _, start, piece_id = best[end]
            if piece_id == self.unk_token_id and out and out[-1][0] == self.unk_token_id:
                out[-1] = (piece_id, start, out[-1][2])  # a run of unknowns is one
            else:
                out.append((piece_id, start, end))
            end = start
        return out[::-1]

    def _plain(self, text: str, base: int, ids: list[int], offsets: list[tuple[int, int]], words: list[int]) -> None:
        """Tokenize a stretch of text without special tokens (at `base` in the original), appending to the lists."""
        norm, spans = self.normalize_with_origins(text)
        if not norm:
            return
        metaspaced = norm.replace(" ", SPACE)
        if not metaspaced.startswith(SPACE):  # the leading ▁ stands at the first character
            metaspaced, spans = SPACE + metaspaced, [spans[0]] + spans
        word = words[-1] if words else -1
        for m in re.finditer(f"{SPACE}[^{SPACE}]*|[^{SPACE}]+", metaspaced):
            word += 1
            for piece_id, start, end in self.viterbi(m[0]):
                ids.append(piece_id)
                offsets.append((base + spans[m.start() + start][0], base + spans[m.start() + end - 1][1]))
                words.append(word)

    def __repr__(self) -> str:
        return f"DebertaV2Tokenizer({self.model_file.name}: {len(self)} ids, do_lower_case={self.do_lower_case})"


def _nfc_with_origins(text: str, spans: list[tuple[int, int]]) -> tuple[str, list[tuple[int, int]]]:
    """NFC, a character and the combining marks after it at a time; what one composes to stands at its first
    character (as `tokenizers` aligns it)."""
    chars: list[str] = []
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(text):
        j = i + 1
        while j < len(text) and unicodedata.combining(text[j]):
            j += 1
        composed = unicodedata.normalize("NFC", text[i:j])
        chars.extend(composed)
        out.extend(spans[min(i + k, j - 1)] for k in range(len(composed)))
        i = j
    return "".join(chars), out
