"""The sentinel machinery T5's tokenizers share: `SentinelTokenizer`, over the text-to-text interface.

T5 needs a few things of its vocabulary that BERT does not: sentinel ids (`<extra_id_0>` ... `<extra_id_99>`,
appended after the base vocabulary in reverse, so `<extra_id_0>` is the last id), an end-of-sequence token
appended to every sequence, and a pad id (0) that doubles as the decoder's start token.
`models.text_to_text.TextToTextTokenizer` is that interface; T5's objectives and data use nothing else.
`SentinelTokenizer` implements it once -- sentinels, special tokens written in text, `__call__` with padding /
truncation / tensors, decoding -- over a base tokenizer that a subclass supplies (`tokenizer.T5Tokenizer`,
`tokenizer.WordPieceT5Tokenizer`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from ...tokenizer.base import (BatchEncoding, TokenizerError, _as_int_list, _as_rows, _longest_first,
                               _padding_mode, _to_tensors, _truncation_strategy, check_valid_unicode,
                               padded_length)
from ..text_to_text import SENTINEL_PATTERN, sentinel_token

NUM_SENTINELS = 100  # T5's extra_ids


class SentinelTokenizer:
    """The shared part of both implementations (see the module docstring). A subclass sets `base_size`,
    `pad/eos/unk/mask_token_id`, `base_special_ids`, `special_text` (special tokens recognised when written in
    text, text -> id), and implements `_encode_plain`, `_base_token`, `_base_id` and `_join_tokens`."""

    model_input_names = ("input_ids", "attention_mask")
    base_size: int
    pad_token_id: int
    eos_token_id: int
    unk_token_id: int
    mask_token_id: int
    base_special_ids: tuple[int, ...]
    special_text: dict[str, int]

    def _init_sentinels(self, extra_ids: int, model_max_length: int, split_special_tokens: bool) -> None:
        if not 0 <= extra_ids <= 10_000:
            raise TokenizerError(f"extra_ids must be in [0, 10000], got {extra_ids}")
        self.num_sentinels = extra_ids
        self.model_max_length = model_max_length
        self.split_special_tokens = split_special_tokens
        self._special_pattern = re.compile("".join(re.escape(t) + "|" for t in self.special_text)
                                           + SENTINEL_PATTERN.pattern)

    # -- what a subclass provides ------------------------------------------------------------------------------

    def _encode_plain(self, text: str) -> list[int]:
        """Base ids of text that holds no special token."""
        raise NotImplementedError

    def _base_token(self, i: int) -> str:
        raise NotImplementedError

    def _base_id(self, token: str) -> int:
        raise NotImplementedError

    def _join_tokens(self, tokens: list[str]) -> str:
        raise NotImplementedError

    # -- vocabulary --------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.vocab_size

    @property
    def vocab_size(self) -> int:
        """Base vocabulary plus sentinels: the model's embedding size (32100 for T5's 32000 pieces)."""
        return self.base_size + self.num_sentinels

    def sentinel_id(self, i: int) -> int:
        """The id of `<extra_id_i>`: the sentinels run backwards from the last id."""
        if not 0 <= i < self.num_sentinels:
            raise TokenizerError(f"sentinel {i} outside 0..{self.num_sentinels - 1}")
        return self.vocab_size - 1 - i

    def sentinel_index(self, token_id: int) -> int | None:
        """i when `token_id` is `<extra_id_i>`, else None."""
        return self.vocab_size - 1 - int(token_id) if self.base_size <= token_id < self.vocab_size else None

    @property
    def all_special_ids(self) -> list[int]:
        return [*self.base_special_ids, *range(self.base_size, self.vocab_size)]

    def convert_ids_to_tokens(self, ids: int | Iterable[int], skip_special_tokens: bool = False) -> str | list[str]:
        """Id(s) -> token(s); sentinel ids -> `<extra_id_N>`."""
        if isinstance(ids, int) or (hasattr(ids, "ndim") and ids.ndim == 0):
            return self._token(int(ids))
        ids = _as_int_list(ids)
        if skip_special_tokens:
            special = set(self.all_special_ids)
            ids = [i for i in ids if i not in special]
        return [self._token(i) for i in ids]

    def _token(self, i: int) -> str:
        if 0 <= i < self.base_size:
            return self._base_token(i)
        s = self.sentinel_index(i)
        if s is None:
            raise TokenizerError(f"id {i} outside the vocabulary (0..{self.vocab_size - 1})")
        return sentinel_token(s)

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> int | list[int]:
        """Token(s) or `<extra_id_N>` -> id(s); unknown tokens -> the unknown token's id."""
        if isinstance(tokens, str):
            return self._id(tokens)
        return [self._id(t) for t in tokens]

    def _id(self, token: str) -> int:
        m = SENTINEL_PATTERN.fullmatch(token)
        if m and int(m.group(1)) < self.num_sentinels:
            return self.sentinel_id(int(m.group(1)))
        return self._base_id(token)

    # -- encoding ----------------------------------------------------------------------------------------------

    def tokenize(self, text: str) -> list[str]:
        """Tokens of `text`, without the final eos."""
        return self.convert_ids_to_tokens(self._encode_text(text))

    def _encode_text(self, text: str) -> list[int]:
        """Ids of one text without the eos: plain stretches through the base tokenizer, each on its own, and
        the special tokens written in the text by id (unless `split_special_tokens`)."""
        check_valid_unicode(text)
        if self.split_special_tokens:
            return self._encode_plain(text) if text else []
        ids: list[int] = []
        start = 0
        for m in self._special_pattern.finditer(text):
            number = m.group(1)
            if number is not None and int(number) >= self.num_sentinels:
                continue  # <extra_id_N> past the last sentinel is plain text
            if m.start() > start:
                ids.extend(self._encode_plain(text[start:m.start()]))
            ids.append(self.special_text[m.group(0)] if number is None else self.sentinel_id(int(number)))
            start = m.end()
        if start < len(text):
            ids.extend(self._encode_plain(text[start:]))
        return ids

    def encode(self, text: str, pair: str | None = None, add_special_tokens: bool = True,
               truncation: bool | str | None = None, max_length: int | None = None) -> list[int]:
        """Ids of one text (or pair), ending in the eos unless `add_special_tokens=False`."""
        return self(text, pair, add_special_tokens=add_special_tokens, truncation=truncation,
                    max_length=max_length, return_attention_mask=False)["input_ids"]

    def __call__(self, text: str | Sequence[str], text_pair: str | Sequence[str] | None = None, *,
                 add_special_tokens: bool = True, padding: bool | str = False, truncation: bool | str | None = None,
                 max_length: int | None = None, pad_to_multiple_of: int | None = None,
                 return_tensors: str | None = None, return_attention_mask: bool = True,
                 return_special_tokens_mask: bool = False, return_length: bool = False) -> BatchEncoding:
        """Encode one text, a pair, or a batch of them, with Hugging Face's conventions: `A eos` or
        `A eos B eos`; `truncation` True/'longest_first'/'only_first'/'only_second' cuts text (never the eos)
        to fit `max_length`; `padding` True/'longest' or 'max_length' pads with the pad id on the right;
        `return_tensors` 'pt' or 'np'. Returns `input_ids` and `attention_mask` (T5 has no token types)."""
        batched = not isinstance(text, str)
        texts = list(text) if batched else [text]
        pairs = None if text_pair is None else (list(text_pair) if batched else [text_pair])
        if not all(isinstance(t, str) for t in texts):
            raise TokenizerError("text must be a str or a list of str")
        if pairs is not None and len(pairs) != len(texts):
            raise TokenizerError(f"got {len(texts)} texts but {len(pairs)} pairs")
        strategy = _truncation_strategy(truncation, max_length, padding)
        pad_mode = _padding_mode(padding)
        if (strategy != "do_not_truncate" or pad_mode == "max_length") and max_length is None:
            max_length = self.model_max_length
        rows: list[tuple[list[int], list[int]]] = []
        for n, t in enumerate(texts):
            a = self._encode_text(t)
            b = None if pairs is None else self._encode_text(pairs[n])
            a, b = self._truncate(a, b, strategy, max_length, add_special_tokens)
            rows.append(self._build(a, b, add_special_tokens))
        return self._finalize(rows, batched, pad_mode, max_length, pad_to_multiple_of, return_tensors,
                              return_attention_mask, return_special_tokens_mask, return_length)

    def _truncate(self, a: list[int], b: list[int] | None, strategy: str, max_length: int | None,
                  add_special: bool) -> tuple[list[int], list[int] | None]:
        if strategy == "do_not_truncate":
            return a, b
        budget = max_length - ((1 if b is None else 2) if add_special else 0)
        lb = 0 if b is None else len(b)
        if len(a) + lb <= budget:
            return a, b
        if budget <= 0:
            raise TokenizerError(f"max_length={max_length} leaves no room for text after the end-of-sequence tokens")
        if b is None:
            if strategy == "only_second":
                raise TokenizerError("truncation='only_second' needs pairs of texts")
            return a[:budget], None
        if strategy == "longest_first":
            na, nb = _longest_first(len(a), lb, budget)
            return a[:na], b[:nb]
        if strategy == "only_first":
            if budget - lb <= 0:
                raise TokenizerError(f"truncation='only_first': the second text alone ({lb} tokens) does not fit "
                                     f"in max_length={max_length}")
            return a[:budget - lb], b
        if budget - len(a) <= 0:
            raise TokenizerError(f"truncation='only_second': the first text alone ({len(a)} tokens) does not fit "
                                 f"in max_length={max_length}")
        return a, b[:budget - len(a)]

    def _build(self, a: list[int], b: list[int] | None, add_special: bool) -> tuple[list[int], list[int]]:
        """(ids, special-tokens mask) of one row."""
        eos = [self.eos_token_id] if add_special else []
        ids = a + eos + ([] if b is None else b + eos)
        special = [0] * len(a) + [1] * len(eos)
        if b is not None:
            special += [0] * len(b) + [1] * len(eos)
        return ids, special

    def _finalize(self, rows, batched, pad_mode, max_length, pad_to_multiple_of, return_tensors,
                  return_attention_mask, return_special_tokens_mask, return_length) -> BatchEncoding:
        lengths = [len(ids) for ids, _ in rows]
        target = padded_length(lengths, pad_mode, max_length, pad_to_multiple_of, return_tensors)
        out: dict[str, list] = {"input_ids": []}
        if return_attention_mask:
            out["attention_mask"] = []
        if return_special_tokens_mask:
            out["special_tokens_mask"] = []
        seq_rows = []
        for (ids, special), n in zip(rows, lengths):
            p = max(0, target - n) if target is not None else 0
            out["input_ids"].append(ids + [self.pad_token_id] * p)
            if return_attention_mask:
                out["attention_mask"].append([1] * n + [0] * p)
            if return_special_tokens_mask:
                out["special_tokens_mask"].append(special + [1] * p)
            seq_rows.append([None if s else 0 for s in special] + [None] * p)
        if not batched:
            out = {k: v[0] for k, v in out.items()}
        if return_length:
            out["length"] = [len(r) for r in seq_rows]
        if return_tensors is not None:
            out = _to_tensors(out, return_tensors, batched)
        return BatchEncoding(out, [[None] * len(r) for r in seq_rows], seq_rows)

    # -- ids -> text -------------------------------------------------------------------------------------------

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False, **_: Any) -> str:
        """Ids -> text; special tokens (pad, eos, unk, sentinels ...) are dropped with `skip_special_tokens`,
        else written out."""
        return self._join_tokens(self.convert_ids_to_tokens(_as_int_list(ids), skip_special_tokens))

    def batch_decode(self, sequences: Iterable[Iterable[int]], skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(s, skip_special_tokens) for s in _as_rows(sequences)]
