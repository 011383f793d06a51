"""T5 on either kind of vocabulary: `WordPieceT5Tokenizer` (a BERT vocab.txt plus sentinels) and
`load_text_to_text_tokenizer(path)`, which picks SentencePiece or WordPiece from the path.

Both tokenizers have the interface of `sentinels.TextToTextTokenizer` (re-exported here):

- `sentencepiece.T5Tokenizer`: T5's own, a SentencePiece model (`spiece.model`); `</s>` is the eos.
- `WordPieceT5Tokenizer`: a `BertTokenizer` (vocab.txt) plus 100 sentinels; `[SEP]` is the eos, `[PAD]` the
  pad, `[MASK]` what BERT-style corruption writes. The same token shards then serve BERT and T5 objectives,
  so the two can be compared on one vocabulary.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .sentinels import NUM_SENTINELS, SentinelTokenizer, TextToTextTokenizer, sentinel_token
from .tokenizer import TOKENIZER_CONFIG_NAME, BertTokenizer, TokenizerError

__all__ = ["NUM_SENTINELS", "SentinelTokenizer", "TextToTextTokenizer", "WordPieceT5Tokenizer",
           "load_text_to_text_tokenizer", "sentinel_token"]


class WordPieceT5Tokenizer(SentinelTokenizer):
    """T5's conventions over a BERT WordPiece vocabulary: the `BertTokenizer`'s ids, then `extra_ids` sentinels
    (`<extra_id_0>` the last id); `[SEP]` ends every sequence, `[PAD]` pads (id 0 in Google's layout, as T5's
    `<pad>`), `[MASK]` is BERT-style corruption's mask. A vocab.txt that already ends with the sentinels (one
    this class saved) is read as is."""

    def __init__(self, bert: BertTokenizer, extra_ids: int = NUM_SENTINELS, model_max_length: int = 512,
                 split_special_tokens: bool = False):
        self.bert = bert
        tokens = bert.ids_to_tokens
        saved = extra_ids and len(tokens) > extra_ids and all(
            tokens[len(tokens) - 1 - i] == sentinel_token(i) for i in range(extra_ids))
        self.base_size = len(tokens) - (extra_ids if saved else 0)
        ids = {name: getattr(bert, f"{name}_token_id") for name in ("pad", "sep", "unk", "mask", "cls")}
        missing = [name for name, i in ids.items() if i is None]
        if missing:
            raise TokenizerError(f"the vocabulary has no [{missing[0].upper()}] token, which T5 on WordPiece needs")
        self.pad_token_id, self.eos_token_id = ids["pad"], ids["sep"]
        self.unk_token_id, self.mask_token_id = ids["unk"], ids["mask"]
        self.pad_token, self.eos_token, self.unk_token = bert.pad_token, bert.sep_token, bert.unk_token
        self.base_special_ids = tuple(ids.values())
        self.special_text = {}  # BertTokenizer reads "[SEP]" in text as punctuation and a word; so do we
        self._init_sentinels(extra_ids, model_max_length, split_special_tokens)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, extra_ids: int | None = None, **overrides: Any) \
            -> "WordPieceT5Tokenizer":
        """From a vocab.txt or a BERT tokenizer folder (whose tokenizer_config.json may say `extra_ids`)."""
        path = Path(path)
        if extra_ids is None:
            cfg = path / TOKENIZER_CONFIG_NAME if path.is_dir() else None
            extra_ids = NUM_SENTINELS
            if cfg is not None and cfg.is_file():
                try:
                    extra_ids = int(json.loads(cfg.read_text(encoding="utf-8")).get("extra_ids", NUM_SENTINELS))
                except (ValueError, TypeError, AttributeError, json.JSONDecodeError):
                    raise TokenizerError(f"{cfg}: extra_ids must be a whole number") from None
        return cls(BertTokenizer.from_pretrained(path), extra_ids, **overrides)

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """The BERT tokenizer folder with the sentinels appended to vocab.txt (so `transformers`'
        BertTokenizer numbers them alike) and `extra_ids` / eos in tokenizer_config.json."""
        from .wordpiece import save_vocab

        d = self.bert.save_pretrained(directory)
        base = self.bert.ids_to_tokens[:self.base_size]
        save_vocab(base + [sentinel_token(i) for i in reversed(range(self.num_sentinels))], d / "vocab.txt")
        cfg_path = d / TOKENIZER_CONFIG_NAME
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        cfg.update(extra_ids=self.num_sentinels, eos_token=self.eos_token,
                   additional_special_tokens=[sentinel_token(i) for i in range(self.num_sentinels)])
        tmp = cfg_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, cfg_path)
        return d

    def _encode_plain(self, text: str) -> list[int]:
        return self.bert.encode(text, add_special_tokens=False)

    def _base_token(self, i: int) -> str:
        return self.bert.ids_to_tokens[i]

    def _base_id(self, token: str) -> int:
        i = self.bert.convert_tokens_to_ids(token)
        return i if i < self.base_size else self.unk_token_id

    def _join_tokens(self, tokens: list[str]) -> str:
        return self.bert.convert_tokens_to_string(tokens)

    def __repr__(self) -> str:
        return (f"WordPieceT5Tokenizer({self.base_size} WordPiece tokens + {self.num_sentinels} sentinels = "
                f"{self.vocab_size})")


def load_text_to_text_tokenizer(path: str | os.PathLike, **overrides: Any) -> SentinelTokenizer:
    """The T5 tokenizer a path names: a SentencePiece `.model` file or a folder with `spiece.model` ->
    `T5Tokenizer`; a vocab.txt or a BERT tokenizer folder -> `WordPieceT5Tokenizer`."""
    from .sentencepiece import T5Tokenizer, is_sentencepiece_path

    path = Path(path)
    if not path.exists():
        raise TokenizerError(f"{path}: no such vocabulary file or tokenizer folder")
    if is_sentencepiece_path(path):
        return T5Tokenizer.from_pretrained(path, **overrides)
    return WordPieceT5Tokenizer.from_pretrained(path, **overrides)
