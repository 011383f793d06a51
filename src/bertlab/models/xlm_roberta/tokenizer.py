"""XLM-R's tokenizer: a SentencePiece model (`sentencepiece.bpe.model`) with fairseq's ids, and the call surface of
`BertTokenizer` (batches, pairs, truncation strategies, padding, offsets, tensors, decoding).

fairseq put four symbols before the SentencePiece pieces and `<mask>` after them:

    <s> = 0   <pad> = 1   </s> = 2   <unk> = 3   piece i (SentencePiece id i >= 3) = i + 1   <mask> = last

(SentencePiece's own `<unk>`, id 0, becomes 3; its `<s>`/`</s>` control pieces are never produced.) A text is
`<s> A </s>`, a pair `<s> A </s></s> B </s>`, one token type; longest_first shares a pair's budget as RoBERTa's
tokenizer does (the `tokenizers` library's rule). The special tokens written in a text (`<mask>`, `</s>`, ...)
become their ids, as in `transformers`; each stretch of text between them is encoded on its own, so it gets
SentencePiece's leading `▁`. Offsets are character spans of the original text: a piece's span leaves out
the whitespace its `▁` stands for, and a `▁` alone covers the first character of the word it starts.

What is matched: the reference is the `sentencepiece` library itself -- ids are its `encode` of each stretch of
text between special tokens, under fairseq's ids (equal on random strings,
tests/models/xlm_roberta/test_xlm_roberta.py). Against `transformers.XLMRobertaTokenizer` (its tokenizers-based,
"fast" one) ids and offsets are equal on WikiText-2 and
hand-picked edge cases, but not on every string: on random strings of mixed scripts, spaces and controls the
ids differ on a few in a hundred and the offsets on more (docs/guide/families.md has the measured rates).
XLM-R's own `sentencepiece.bpe.model` is a unigram model despite its name; a model of SentencePiece's BPE type
is refused in one line, since `transformers` 5 reads every such file's pieces as a unigram model and would
split words differently from the file's own algorithm.

`save_pretrained(DIR)` writes `sentencepiece.bpe.model`, `tokenizer_config.json` and `special_tokens_map.json`,
which `transformers.XLMRobertaTokenizer.from_pretrained` reads; `from_pretrained` reads a folder holding
`sentencepiece.bpe.model` (a folder with only `tokenizer.json` is refused in one line).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from ...tokenizer.roberta import RobertaTokenizer
from ...tokenizer.sentencepiece import (SentencePieceBinding, SentencePieceError,
                                        atomic_write_bytes, byte_to_char, load_processor, metaspace_join,
                                        sentencepiece_model_type)
from ...tokenizer.base import (TOKENIZER_CONFIG_NAME, Seq, TokenizerBase, _as_int_list, _clean_up,
                                    check_valid_unicode)

XLMR_MODEL_NAME = "sentencepiece.bpe.model"
XLMR_SPECIAL_TOKENS = {"bos_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>",
                       "sep_token": "</s>", "cls_token": "<s>", "mask_token": "<mask>"}
FAIRSEQ_OFFSET = 1  # a SentencePiece id i >= 3 is fairseq id i + 1


class XLMRobertaTokenizer(SentencePieceBinding, TokenizerBase):
    """`XLMRobertaTokenizer(model_file)` or `.from_pretrained(folder or .model file)`; called as `BertTokenizer`."""

    PAIR_SEPS = 2  # <s> A </s></s> B </s>
    TYPE_B = 0  # one token type
    _pair_lengths = staticmethod(RobertaTokenizer._pair_lengths)  # longest_first as the `tokenizers` library

    def __init__(self, model_file: str | os.PathLike, model_max_length: int = 512):
        self.model_file = Path(model_file)
        self.vocab_file = str(self.model_file)
        self.sp = load_processor(self.model_file)
        kind = sentencepiece_model_type(self.sp)
        if kind != "unigram":
            # transformers (5) reads an XLM-R file's pieces as a unigram model whatever its type, so following
            # the file's own algorithm here would disagree with it silently (embedding cosine 0.87 measured)
            raise SentencePieceError(
                f"{self.model_file}: a SentencePiece model of {kind} type; XLM-R's tokenizer takes unigram models "
                "only (transformers reads this file as unigram and splits words differently): retrain it with "
                "SentencePiece's model_type=unigram, as XLM-R's own file is")
        self.model_max_length = int(model_max_length)
        self._setup()

    def _setup(self) -> None:
        pieces = self.sp.get_piece_size()
        self.ids_to_tokens = ["<s>", "<pad>", "</s>", "<unk>"] + \
            [self.sp.id_to_piece(i) for i in range(3, pieces)] + ["<mask>"]
        self.vocab = {t: i for i, t in enumerate(self.ids_to_tokens)}  # specials first: they win a name clash
        for name, token in XLMR_SPECIAL_TOKENS.items():
            setattr(self, name, token)
            setattr(self, f"{name}_id", self.ids_to_tokens.index(token))
        self.do_lower_case = False
        self.all_special_tokens = ["<s>", "</s>", "<unk>", "<pad>", "<mask>"]
        self.all_special_ids = sorted(self.vocab[t] for t in self.all_special_tokens)
        self._fast = None  # SentencePiece is the encoder
        # Special tokens written in the text: longest first, so `</s>` is not read as `<s>`'s neighbour
        self._special = re.compile("|".join(re.escape(t) for t in sorted(self.all_special_tokens, key=len,
                                                                            reverse=True)))

    # -- loading and saving ----------------------------------------------------------------------------------

    MODEL_NAME = XLMR_MODEL_NAME

    @classmethod
    def _missing_hint(cls, folder: Path) -> str:
        if (folder / "tokenizer.json").is_file():
            return f" (its tokenizer.json alone is not read: copy the model's {XLMR_MODEL_NAME} beside it)"
        return ""

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write sentencepiece.bpe.model, tokenizer_config.json and special_tokens_map.json (Hugging Face's
        XLM-R layout), each file atomically."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        config = {"tokenizer_class": "XLMRobertaTokenizer", "model_max_length": self.model_max_length,
                  "clean_up_tokenization_spaces": False, **XLMR_SPECIAL_TOKENS}
        atomic_write_bytes(d / XLMR_MODEL_NAME, self.sp.serialized_model_proto())
        atomic_write_bytes(d / TOKENIZER_CONFIG_NAME, (json.dumps(config, indent=2) + "\n").encode())
        atomic_write_bytes(d / "special_tokens_map.json", (json.dumps(XLMR_SPECIAL_TOKENS, indent=2) + "\n").encode())
        return d

    _unpicklable = ("_special",)  # pickled as the processor's bytes (PicklableProcessor), re-derived by _setup

    def _unpickled(self) -> None:
        self._setup()

    # -- text -> ids -------------------------------------------------------------------------------------------

    def _encode_seq_py(self, text: str) -> Seq:
        """One text -> (ids, offsets, word indices), no `<s>`/`</s>` around it. A word is what a `▁` starts."""
        if not isinstance(text, str):
            raise SentencePieceError(f"expected text as str, got {type(text).__name__}")
        check_valid_unicode(text, SentencePieceError)
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        words: list[int] = []
        start = 0
        for m in [*self._special.finditer(text), None]:
            end = len(text) if m is None else m.start()
            self._encode_plain(text, start, end, ids, offsets, words)
            if m is not None:
                ids.append(self.vocab[m.group()])
                offsets.append((m.start(), m.end()))
                words.append(words[-1] + 1 if words else 0)
                start = m.end()
        return ids, offsets, words

    def _encode_plain(self, text: str, start: int, end: int, ids: list[int], offsets: list[tuple[int, int]],
                      words: list[int]) -> None:
        """Append the pieces of text[start:end] (no special tokens in it), offsets in `text`'s characters."""
        part = text[start:end]
        if not part or part.isspace():
            return
        pieces = self.sp.encode(part, return_type="proto").pieces
        # SentencePiece's begin/end are UTF-8 byte offsets: byte -> character of `part`
        char_at = byte_to_char(part)
        spans = []
        for p in pieces:
            b, e = char_at[p.begin], char_at[p.end]
            while b < e and part[b].isspace():  # the whitespace a leading ▁ stands for is no part of the span
                b += 1
            spans.append([b, e])
        for i in range(len(spans) - 1, -1, -1):  # a ▁ alone covers the first character of its word
            if spans[i][0] == spans[i][1] and i + 1 < len(spans):
                spans[i] = [spans[i + 1][0], min(spans[i + 1][0] + 1, spans[i + 1][1])]
        word = words[-1] if words else -1
        for p, (b, e) in zip(pieces, spans):
            ids.append(p.id + FAIRSEQ_OFFSET if p.id >= 3 else self.unk_token_id)
            offsets.append((start + b, start + e))
            if p.piece.startswith("▁") or word < 0:
                word += 1
            words.append(word)

    # -- ids -> text -------------------------------------------------------------------------------------------

    def convert_tokens_to_string(self, tokens: Sequence[str]) -> str:
        """Pieces joined, each `▁` a space, the first one's dropped (`transformers`' Metaspace decoder)."""
        return metaspace_join(list(tokens))

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool = False) -> str:
        text = self.convert_tokens_to_string(self.convert_ids_to_tokens(_as_int_list(ids), skip_special_tokens))
        return _clean_up(text) if clean_up_tokenization_spaces else text

    def __repr__(self) -> str:
        return f"XLMRobertaTokenizer({self.model_file.name}: {len(self)} ids)"

