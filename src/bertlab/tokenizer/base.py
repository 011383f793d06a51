"""What every subword tokenizer of bertlab shares (`TokenizerBase`): Hugging Face's call surface -- `__call__`
with pairs, truncation (longest_first / only_first / only_second, optionally into overlapping windows), padding,
offsets, word ids and tensors; `encode`, `decode`, vocabulary look-ups -- and `encode_corpus`, the
corpus-scale path (ids only, packed arrays, optionally on every core). A tokenizer supplies how one text becomes
pieces with their character spans (`_encode_one`) and its special tokens; `BertTokenizer` (bert.py, WordPiece),
`RobertaTokenizer` (roberta.py, byte-level BPE) and the SentencePiece families' bindings build on it, so code
that takes a tokenizer can take any of them.

Also here: the file names a tokenizer folder holds, `BatchEncoding`, `TokenizerError`, `check_fits_model` (a
vocabulary larger than the model's embedding table is refused) and the optional C extension's loader.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..core.errors import BertlabError


VOCAB_NAME = "vocab.txt"
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_NAME = "special_tokens_map.json"  # transformers' record of a folder's special tokens
TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second", "do_not_truncate")

# One encoded sequence without special tokens: ids, (start, end) per token, word index per token.
Seq = tuple[list[int], list[tuple[int, int]], list[int]]


class TokenizerError(BertlabError, ValueError):
    """Bad tokenizer input or settings: an impossible truncation, a missing file, an unknown option."""


class BatchEncoding(dict):
    """The tokenizer's output: a dict of `input_ids`, `token_type_ids`, `attention_mask` and whatever else was
    asked for (lists, or tensors with `return_tensors`), plus `word_ids(i)` / `sequence_ids(i)` per row as in
    Hugging Face (None for special and pad tokens). Keys are also attributes: `enc.input_ids`."""

    def __init__(self, data: dict[str, Any], word_ids: list[list[int | None]],
                 sequence_ids: list[list[int | None]]):
        super().__init__(data)
        self._word_ids = word_ids
        self._sequence_ids = sequence_ids

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def word_ids(self, batch_index: int = 0) -> list[int | None]:
        """For each token of row `batch_index`, the index of the word it is part of, counted per sequence
        (the second sequence of a pair starts again at 0); None for [CLS], [SEP] and padding."""
        return self._word_ids[batch_index]

    def sequence_ids(self, batch_index: int = 0) -> list[int | None]:
        """For each token of row `batch_index`: 0 (first text), 1 (second text), None (special, padding)."""
        return self._sequence_ids[batch_index]

    def to(self, device: Any) -> "BatchEncoding":
        """Move tensors to a device (for `return_tensors="pt"`)."""
        for k, v in self.items():
            if hasattr(v, "to"):
                self[k] = v.to(device)
        return self


def _fast_module():
    if os.environ.get("BERTLAB_NO_FAST_TOKENIZER"):
        return None
    try:
        from . import _fast  # the optional C extension
    except ImportError:
        return None
    return _fast


def new_seq(text: str) -> Seq:
    """The empty ids, offsets and word indices a tokenizer fills for one text; a text that is not a str is one
    line."""
    if not isinstance(text, str):
        raise TokenizerError(f"expected text as str, got {type(text).__name__}")
    return [], [], []


def padded_length(lengths: list[int], pad_mode: str | None, max_length: int | None, pad_to_multiple_of: int | None,
                  return_tensors: str | None) -> int | None:
    """The length every row is padded to (None: rows keep their lengths), as `transformers` decides it:
    the longest row or `max_length`, rounded up to `pad_to_multiple_of`. Tensors need one length."""
    target = None
    if pad_mode == "longest":
        target = max(lengths, default=0)
    elif pad_mode == "max_length":
        target = max_length
    if target is not None and pad_to_multiple_of:
        target = -(-target // pad_to_multiple_of) * pad_to_multiple_of
    if return_tensors is not None and target is None and len(set(lengths)) > 1:
        raise TokenizerError("rows have different lengths; use padding=True to return tensors")
    return target

class TokenizerBase:
    """What every subword tokenizer of bertlab shares: Hugging Face's call surface (`__call__`, `encode`,
    pairs, truncation, overflow windows, padding, offsets, tensors), vocabulary look-ups and `encode_corpus`.

    A family supplies `_encode_seq_py(text) -> (ids, offsets, word indices)` for one text without special
    tokens, `_make_fast()` (its C encoder or None), `convert_tokens_to_string` and `decode`, and its input
    layout through three class attributes: `PAIR_SEPS` ([SEP]s between A and B: BERT 1, RoBERTa 2),
    `TYPE_B` (token type of B's tokens: BERT 1, RoBERTa 0) and `_pair_lengths` (how longest_first shares
    max_length between A and B). It sets `vocab`, `ids_to_tokens`, `unk/sep/pad/cls/mask_token(_id)`,
    `all_special_ids` and `model_max_length`.
    """

    PAIR_SEPS = 1
    TYPE_B = 1
    _fast = None


    def __getstate__(self) -> dict[str, Any]:
        # The C encoder is not picklable; workers of the parallel mode rebuild it from the vocabulary.
        state = self.__dict__.copy()
        state["_fast"] = None
        state["_rebuild_fast"] = self._fast is not None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        rebuild = state.pop("_rebuild_fast", False)
        self.__dict__.update(state)
        if rebuild:
            self._fast = self._make_fast()

    # -- vocabulary --------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.ids_to_tokens)

    @property
    def vocab_size(self) -> int:
        return len(self.ids_to_tokens)

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> int | list[int]:
        """Token(s) -> id(s); unknown tokens -> [UNK]'s id."""
        if isinstance(tokens, str):
            return self.vocab.get(tokens, self.unk_token_id)
        return [self.vocab.get(t, self.unk_token_id) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Iterable[int], skip_special_tokens: bool = False) -> str | list[str]:
        """Id(s) -> token string(s)."""
        if isinstance(ids, int) or (hasattr(ids, "ndim") and ids.ndim == 0):
            return self.ids_to_tokens[int(ids)]
        ids = _as_int_list(ids)
        if skip_special_tokens:
            special = set(self.all_special_ids)
            ids = [i for i in ids if i not in special]
        return [self.ids_to_tokens[i] for i in ids]

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return 2 + self.PAIR_SEPS if pair else 2

    def build_inputs_with_special_tokens(self, ids_a: list[int], ids_b: list[int] | None = None) -> list[int]:
        """`[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]` (RoBERTa: `<s> A </s></s> B </s>`) from ids without
        special tokens."""
        cls_, sep = self._special_id("cls"), self._special_id("sep")
        return [cls_, *ids_a, sep] if ids_b is None else [cls_, *ids_a, *[sep] * self.PAIR_SEPS, *ids_b, sep]

    @staticmethod
    def _pair_lengths(la: int, lb: int, budget: int) -> tuple[int, int]:
        """How many tokens of A and of B longest_first keeps (BERT: Google's rule)."""
        return _longest_first(la, lb, budget)

    def _make_fast(self):
        return None

    def _init_fast(self, use_fast: bool | None) -> None:
        """The C encoder unless `use_fast=False`; `use_fast=True` insists on it."""
        self._fast = None
        if use_fast is not False:
            self._fast = self._make_fast()
            if self._fast is None and use_fast:
                raise TokenizerError("use_fast=True but the C extension bertlab.tokenizer._fast is not built")

    def _encode_seq_py(self, text: str) -> Seq:
        raise NotImplementedError

    # -- text -> tokens ----------------------------------------------------------------------------------------

    def tokenize(self, text: str) -> list[str]:
        """Pieces as strings, without special tokens: 'Unaffable!' -> ['una', '##ffa', '##ble', '!']."""
        ids, _, _ = self._encode_seq(text)
        return [self.ids_to_tokens[i] for i in ids]


    def _encode_seq(self, text: str) -> Seq:
        """One text -> (ids, offsets, word indices), no special tokens. The pure-Python reference."""
        if self._fast is not None:
            return self._fast.encode(text)
        return self._encode_seq_py(text)

    def _encode_words(self, words: Sequence[str]) -> Seq:
        """Pre-split words (`is_split_into_words=True`): each word is tokenized on its own, offsets are
        relative to that word, and the word index is its position in `words` (Hugging Face's semantics)."""
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        wids: list[int] = []
        for w, word in enumerate(words):
            i, o, _ = self._encode_seq(word)
            ids += i
            offsets += o
            wids += [w] * len(i)
        return ids, offsets, wids

    # -- encoding ----------------------------------------------------------------------------------------------

    def encode(self, text: str, pair: str | None = None, add_special_tokens: bool = True,
               truncation: bool | str | None = None, max_length: int | None = None) -> list[int]:
        """Ids of one text (or pair), with [CLS]/[SEP] unless `add_special_tokens=False`."""
        enc = self(text, pair, add_special_tokens=add_special_tokens, truncation=truncation, max_length=max_length,
                   return_token_type_ids=False, return_attention_mask=False)
        return enc["input_ids"]

    def __call__(self, text: str | Sequence[str] | Sequence[Sequence[str]],
                 text_pair: str | Sequence[str] | Sequence[Sequence[str]] | None = None, *,
                 pairs: Sequence[str] | None = None, add_special_tokens: bool = True,
                 padding: bool | str = False, truncation: bool | str | None = None, max_length: int | None = None,
                 stride: int = 0, is_split_into_words: bool = False, pad_to_multiple_of: int | None = None,
                 return_tensors: str | None = None, return_token_type_ids: bool = True,
                 return_attention_mask: bool = True, return_overflowing_tokens: bool = False,
                 return_special_tokens_mask: bool = False, return_offsets_mapping: bool = False,
                 return_word_ids: bool = False, return_length: bool = False) -> BatchEncoding:
        """Encode one text, a pair, or a batch of texts/pairs (Hugging Face's conventions).

        `text`: a str (one example) or a list of str (a batch); with `is_split_into_words=True`, a list of
        words (one example) or a list of such lists. `text_pair` / `pairs`: the second texts, same shape.
        `truncation`: True/'longest_first', 'only_first', 'only_second', False; `max_length` counts special
        tokens (default 512 when truncating). `stride` with `return_overflowing_tokens=True` keeps the
        truncated part as extra rows overlapping by `stride` tokens (`overflow_to_sample_mapping` says which
        example each row came from). `padding`: True/'longest' or 'max_length'. Returns a `BatchEncoding`
        with lists (a single example: a flat list per key) or tensors (`return_tensors='pt'` or 'np').
        `return_word_ids=True` adds a `word_ids` key (None, or -1 in tensors, for special and pad tokens).
        """
        if pairs is not None:
            if text_pair is not None:
                raise TokenizerError("give the second texts as text_pair or pairs, not both")
            text_pair = pairs
        batched = _is_batched(text, is_split_into_words)
        if not batched:
            text = [text]
            text_pair = None if text_pair is None else [text_pair]
        elif text_pair is not None:
            if isinstance(text_pair, str) or len(text_pair) != len(text):
                raise TokenizerError(f"got {len(text)} texts but "
                                     f"{1 if isinstance(text_pair, str) else len(text_pair)} pairs")
        strategy = _truncation_strategy(truncation, max_length, padding)
        pad_mode = _padding_mode(padding)
        if strategy != "do_not_truncate" or pad_mode == "max_length":
            if max_length is None:
                max_length = self.model_max_length
        if return_overflowing_tokens and strategy == "longest_first" and text_pair is not None:
            raise TokenizerError("return_overflowing_tokens needs truncation='only_first' or 'only_second' "
                                 "for pairs (longest_first has no single sequence to window)")
        if stride and not return_overflowing_tokens:
            stride = 0

        enc = self._encode_words if is_split_into_words else self._encode_seq
        firsts = self._encode_many(text, enc)
        seconds = None if text_pair is None else self._encode_many(text_pair, enc)

        rows: list[tuple] = []
        sample_map: list[int] = []
        for n, a in enumerate(firsts):
            b = None if seconds is None else seconds[n]
            for row in self._truncate(a, b, strategy, max_length, add_special_tokens, stride,
                                      return_overflowing_tokens):
                rows.append(self._build(*row, add_special_tokens))
                sample_map.append(n)

        return self._finalize(rows, sample_map, batched or return_overflowing_tokens, pad_mode, max_length,
                              pad_to_multiple_of, return_tensors, return_token_type_ids, return_attention_mask,
                              return_overflowing_tokens, return_special_tokens_mask, return_offsets_mapping,
                              return_word_ids, return_length)

    def _encode_many(self, texts: Sequence, enc) -> list[Seq]:
        if self._fast is not None and enc == self._encode_seq:
            return self._fast.encode_many(texts)
        return [enc(t) for t in texts]

    def _truncate(self, a: Seq, b: Seq | None, strategy: str, max_length: int | None, add_special: bool,
                  stride: int, overflow: bool) -> list[tuple[Seq, Seq | None]]:
        """The (A, B) pairs to build rows from: one, or several windows when overflowing tokens are kept."""
        if strategy == "do_not_truncate":
            return [(a, b)]
        budget = max_length - (self.num_special_tokens_to_add(b is not None) if add_special else 0)
        la, lb = len(a[0]), (0 if b is None else len(b[0]))
        if la + lb <= budget:
            return [(a, b)]
        if budget <= 0:
            raise TokenizerError(f"max_length={max_length} leaves no room for text after the special tokens")
        if b is None or strategy == "longest_first":
            if b is None:
                if strategy == "only_second":
                    raise TokenizerError("truncation='only_second' needs pairs of texts")
                na = budget
                if overflow:
                    return [(w, None) for w in _windows(a, na, stride)]
                return [(_cut(a, na), None)]
            na, nb = self._pair_lengths(la, lb, budget)
            return [(_cut(a, na), _cut(b, nb))]
        if strategy == "only_first":
            na = budget - lb
            if na <= 0:
                raise TokenizerError(f"truncation='only_first': the second text alone ({lb} tokens) does not fit "
                                     f"in max_length={max_length}")
            if overflow:
                return [(w, b) for w in _windows(a, na, stride)]
            return [(_cut(a, na), b)]
        nb = budget - la  # only_second
        if nb <= 0:
            raise TokenizerError(f"truncation='only_second': the first text alone ({la} tokens) does not fit "
                                 f"in max_length={max_length}")
        if overflow:
            return [(a, w) for w in _windows(b, nb, stride)]
        return [(a, _cut(b, nb))]

    def _build(self, a: Seq, b: Seq | None, add_special: bool) -> tuple:
        """One row: ids, type ids, offsets, word ids, sequence ids, special-tokens mask."""
        a_ids, a_off, a_w = a
        la = len(a_ids)
        if add_special:
            cls_, sep = self._special_id("cls"), self._special_id("sep")
            ids = [cls_, *a_ids, sep]
            offs = [(0, 0), *a_off, (0, 0)]
            wids = [None, *a_w, None]
            seq = [None] + [0] * la + [None]
            special = [1] + [0] * la + [1]
        else:
            ids, offs, wids = list(a_ids), list(a_off), list(a_w)
            seq = [0] * la
            special = [0] * la
        types = [0] * len(ids)
        if b is not None:
            b_ids, b_off, b_w = b
            lb = len(b_ids)
            if add_special:
                more = self.PAIR_SEPS - 1  # RoBERTa's second </s> before B
                ids += [*[sep] * more, *b_ids, sep]
                offs += [*[(0, 0)] * more, *b_off, (0, 0)]
                wids += [*[None] * more, *b_w, None]
                seq += [None] * more + [1] * lb + [None]
                special += [1] * more + [0] * lb + [1]
                types += [self.TYPE_B] * (more + lb + 1)
            else:
                ids += b_ids
                offs += b_off
                wids += b_w
                seq += [1] * lb
                special += [0] * lb
                types += [self.TYPE_B] * lb
        return ids, types, offs, wids, seq, special

    def _special_id(self, name: str) -> int:
        i = getattr(self, f"{name}_token_id")
        if i is None:
            raise TokenizerError(f"the vocabulary has no {getattr(self, f'{name}_token')} token, needed to build "
                                 "model inputs (use add_special_tokens=False)")
        return i

    def _finalize(self, rows, sample_map, batched, pad_mode, max_length, pad_to_multiple_of, return_tensors,
                  return_token_type_ids, return_attention_mask, return_overflowing_tokens,
                  return_special_tokens_mask, return_offsets_mapping, return_word_ids, return_length):
        lengths = [len(r[0]) for r in rows]
        target = padded_length(lengths, pad_mode, max_length, pad_to_multiple_of, return_tensors)
        pad = self.pad_token_id if self.pad_token_id is not None else 0
        out: dict[str, list] = {"input_ids": []}
        if return_token_type_ids:
            out["token_type_ids"] = []
        if return_attention_mask:
            out["attention_mask"] = []
        if return_special_tokens_mask:
            out["special_tokens_mask"] = []
        if return_offsets_mapping:
            out["offset_mapping"] = []
        word_rows, seq_rows = [], []
        for (ids, types, offs, wids, seq, special), n in zip(rows, lengths):
            p = max(0, target - n) if target is not None else 0
            out["input_ids"].append(ids + [pad] * p if p else ids)
            if return_token_type_ids:
                out["token_type_ids"].append(types + [0] * p if p else types)
            if return_attention_mask:
                out["attention_mask"].append([1] * n + [0] * p)
            if return_special_tokens_mask:
                out["special_tokens_mask"].append(special + [1] * p if p else special)
            if return_offsets_mapping:
                out["offset_mapping"].append(offs + [(0, 0)] * p if p else offs)
            word_rows.append(wids + [None] * p if p else wids)
            seq_rows.append(seq + [None] * p if p else seq)
        if return_word_ids:
            out["word_ids"] = word_rows
        if return_overflowing_tokens:
            out["overflow_to_sample_mapping"] = sample_map
        if not batched:
            out = {k: v[0] for k, v in out.items()}
        if return_length:  # after padding, and a list even for one example, as in Hugging Face
            out["length"] = [len(r) for r in word_rows]
        if return_tensors is not None:
            out = _to_tensors(out, return_tensors, batched)
        return BatchEncoding(out, word_rows, seq_rows)

    # -- corpus scale ------------------------------------------------------------------------------------------

    def encode_corpus(self, texts: Sequence[str], num_workers: int | None = None, add_special_tokens: bool = False,
                      flat: bool = False, chunk_size: int = 2000):
        """Ids of many texts (no offsets, no padding), for corpus-scale work such as pre-training data.

        Returns a list of id lists; or with `flat=True` two numpy arrays `(ids, offsets)`: int32 ids of all
        texts back to back and int64 `offsets` of length n+1, text i being `ids[offsets[i]:offsets[i+1]]` --
        no Python object per token, the form to write shards from. `num_workers` processes share the work
        (None: every core; 1: this process only); each gets the tokenizer once and sends back packed arrays.
        """
        import numpy as np

        texts = texts if isinstance(texts, list) else list(texts)
        workers = (os.cpu_count() or 1) if num_workers is None else max(1, int(num_workers))
        chunks = [texts[i:i + chunk_size] for i in range(0, len(texts), chunk_size)]
        if workers == 1 or len(chunks) <= 1:
            parts = [self._flat_many(texts)]
        else:
            from concurrent.futures import ProcessPoolExecutor

            from ..core.threads import worker_context

            # (the tokenizer is pickled once per worker; not fork: see worker_context)
            with ProcessPoolExecutor(min(workers, len(chunks)), mp_context=worker_context(), initializer=_worker_init,
                                     initargs=(self,)) as pool:
                parts = list(pool.map(_worker_flat, chunks))
        ids = np.concatenate([np.frombuffer(p[0], dtype=np.int32) for p in parts]) if parts else \
            np.zeros(0, np.int32)
        lengths = np.concatenate([np.frombuffer(p[1], dtype=np.int64) for p in parts]) if parts else \
            np.zeros(0, np.int64)
        if add_special_tokens:
            cls_, sep = self._special_id("cls"), self._special_id("sep")
            lengths = lengths + 2
            out = np.empty(len(ids) + 2 * len(lengths), dtype=np.int32)
            ends = np.cumsum(lengths)
            starts = ends - lengths
            keep = np.ones(len(out), dtype=bool)
            keep[starts] = False
            keep[ends - 1] = False
            out[starts] = cls_
            out[ends - 1] = sep
            out[keep] = ids
            ids = out
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if flat:
            return ids, offsets
        every = ids.tolist()
        return [every[offsets[i]:offsets[i + 1]] for i in range(len(lengths))]

    def _flat_many(self, texts: Sequence[str]) -> tuple[bytes, bytes]:
        """(int32 ids, int64 lengths) as bytes for a list of texts: what workers send back."""
        if self._fast is not None:
            return self._fast.encode_flat(texts)
        from array import array

        ids, lengths = array("i"), array("q")
        for t in texts:
            row = self._encode_seq_py(t)[0]
            ids.extend(row)
            lengths.append(len(row))
        return ids.tobytes(), lengths.tobytes()

    def batch_decode(self, sequences: Iterable[Iterable[int]], skip_special_tokens: bool = False,
                     clean_up_tokenization_spaces: bool = False) -> list[str]:
        return [self.decode(s, skip_special_tokens, clean_up_tokenization_spaces) for s in _as_rows(sequences)]



# -- helpers ---------------------------------------------------------------------------------------------------

_WORKER_TOKENIZER: TokenizerBase | None = None


def _worker_init(tok: TokenizerBase) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = tok


def _worker_flat(texts: list[str]) -> tuple[bytes, bytes]:
    return _WORKER_TOKENIZER._flat_many(texts)


def check_fits_model(tokenizer: TokenizerBase, vocab_path: Path, model_config: Path) -> None:
    """A vocabulary with more entries than the model's embedding table would hand the model ids it has no
    row for: an IndexError deep in the embedding at the first such word (a device-side assert on a GPU).
    Refused here, naming both files. (A smaller vocabulary is fine: tables are often padded.)"""
    try:
        vocab_size = json.loads(model_config.read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return  # no or unreadable config.json: the model loader reports it
    if isinstance(vocab_size, int) and not isinstance(vocab_size, bool) and len(tokenizer) > vocab_size > 0:
        raise TokenizerError(f"{vocab_path}: {len(tokenizer):,} entries but {model_config} says vocab_size "
                             f"{vocab_size:,}; ids from {vocab_size:,} on have no embedding")


def check_valid_unicode(text: str, error: type[Exception] = TokenizerError) -> None:
    """The one line every tokenizer gives for a text with no UTF-8 form (a lone surrogate, from a bad decode
    upstream), instead of whatever the library below would raise (SentencePiece: a raw pybind11 error)."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise error(f"cannot encode a lone surrogate (U+{ord(text[e.start]):04X} at index {e.start}); text must "
                    "be valid Unicode") from None


def _is_batched(text: Any, split_words: bool) -> bool:
    if isinstance(text, str):
        if split_words:
            raise TokenizerError("is_split_into_words=True needs a list of words, got a str")
        return False
    if not isinstance(text, (list, tuple)):
        raise TokenizerError(f"text must be a str or a list of str, got {type(text).__name__}")
    if split_words:  # a list of words is one example; a list of lists (or an empty list) is a batch
        return len(text) == 0 or not isinstance(text[0], str)
    return True


def _truncation_strategy(truncation: bool | str | None, max_length: int | None, padding: bool | str) -> str:
    if truncation is None:
        # Hugging Face: a max_length without padding means "truncate to it"
        truncation = max_length is not None and padding in (False, None, "do_not_pad")
    if truncation is True:
        return "longest_first"
    if truncation is False:
        return "do_not_truncate"
    if truncation not in TRUNCATION_STRATEGIES:
        raise TokenizerError(f"truncation must be True, False or one of {', '.join(TRUNCATION_STRATEGIES)}; "
                             f"got {truncation!r}")
    return truncation


def _padding_mode(padding: bool | str) -> str | None:
    if padding is True or padding == "longest":
        return "longest"
    if padding in (False, None, "do_not_pad"):
        return None
    if padding == "max_length":
        return "max_length"
    raise TokenizerError(f"padding must be True, False, 'longest' or 'max_length'; got {padding!r}")


def _longest_first(la: int, lb: int, budget: int) -> tuple[int, int]:
    """Google's `_truncate_seq_pair` in closed form: pop from the longer sequence until the pair fits, from
    the second on ties. The shorter one is kept whole if it fits in half; otherwise both get about half,
    the first getting the odd token."""
    if la + lb <= budget:
        return la, lb
    short = min(la, lb)
    if 2 * short <= budget:
        return (budget - lb, lb) if la > lb else (la, budget - la)
    return (budget + 1) // 2, budget // 2


def _cut(s: Seq, n: int) -> Seq:
    return s[0][:n], s[1][:n], s[2][:n]


def _windows(s: Seq, n: int, stride: int) -> list[Seq]:
    """Hugging Face's overflow windows: the first `n` tokens, then windows of `n` starting every `n - stride`
    tokens, until one reaches the end."""
    if stride >= n:
        raise TokenizerError(f"stride={stride} must be smaller than the room left for the text ({n} tokens)")
    total = len(s[0])
    out = []
    start = 0
    while True:
        stop = min(start + n, total)
        out.append((s[0][start:stop], s[1][start:stop], s[2][start:stop]))
        if stop == total:
            return out
        start += n - stride


def _as_int_list(ids: Any) -> list[int]:
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if isinstance(ids, int):
        return [ids]
    return [int(i) for i in ids]


def _as_rows(seqs: Any) -> list[list[int]]:
    if hasattr(seqs, "tolist"):
        seqs = seqs.tolist()
    return [list(s) for s in seqs]


def _clean_up(text: str) -> str:
    """Hugging Face's `clean_up_tokenization`: undo the spaces tokenization put before English punctuation."""
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                 (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text


def _to_tensors(out: dict[str, Any], kind: str, batched: bool) -> dict[str, Any]:
    """Lists -> tensors; a single example gets a batch dimension of 1, as in Hugging Face."""
    if kind not in ("pt", "np"):
        raise TokenizerError(f"return_tensors must be 'pt' or 'np', got {kind!r}")
    res: dict[str, Any] = {}
    for k, v in out.items():
        if not batched:
            v = [v] if k not in ("length", "overflow_to_sample_mapping") else v
        if k == "word_ids":
            v = [[-1 if w is None else w for w in row] for row in v]
        if kind == "pt":
            import torch

            res[k] = torch.tensor(v, dtype=torch.long)
        else:
            import numpy as np

            res[k] = np.asarray(v, dtype=np.int64)
    return res
