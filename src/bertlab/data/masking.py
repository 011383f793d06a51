"""Masked-LM corruption: choose positions, replace 80% by [MASK], 10% by a random token, keep 10%.

Pure functions over token ids with an injected `random.Random`, so the same generator state gives the same
masks (static masking writes them once at `prepare` time; dynamic masking calls the same function in the
collator with a generator seeded from (seed, sample position), so every epoch masks differently and a resumed
run masks exactly as the original would have).

Granularities:

- ``token``: Google's `create_masked_lm_predictions`, call for call: shuffle the candidate positions, take
  them in order until `num_to_predict = min(max_predictions_per_seq, max(1, round(len(tokens) * rate)))`
  are chosen, and decide 80/10/10 per token with the same generator draws (`random() < 0.8` -> [MASK], else
  `random() < 0.5` -> keep, else `randint(0, vocab_size - 1)`). Given the same generator and token list it
  produces the very masks Google's script does.
- ``whole-word``: Google's `--do_whole_word_mask`: a word and its ``##`` continuation pieces are one
  candidate, masked together or not at all (a word that would overflow `num_to_predict` is skipped).
  The 80/10/10 decision is still made per token, as Google does. With per-token word flags (`continues`,
  from a word segmenter at `prepare` time: see `segment.py`), the flags decide what a word is instead of
  the vocabulary's ``##``: a Chinese word of several characters is then one candidate, treated exactly as
  Google treats a ``##``-joined word.
- ``span``: SpanBERT (Joshi et al. 2020): span lengths in *words* drawn from Geometric(p=0.2) restricted
  to 1..10 (mean 3.8), each placed at a random word where it fits whole, until the budget is reached;
  80/10/10 is decided once per span. Spans never overlap and never cross a special token, so a span never
  runs from segment A into segment B; two spans may touch, so `MaskedTokens.span_starts` records where each
  begins (the span-boundary objective needs each span's own boundaries: `span_boundaries`). A span is
  shortened only when no place for it is found (near the end of the budget, or in a short sequence), so the
  lengths placed average 3.6-3.7 words at length 512.

Special tokens ([CLS], [SEP], [PAD], [MASK]) are never chosen. The random replacement is drawn from the whole
vocabulary as in Google's script (`vocab_words[randint(0, len(vocab_words) - 1)]`).
"""

from __future__ import annotations

import bisect
import json
import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Container, NamedTuple, Sequence

import numpy as np

from ..tokenizer.tokenizer_json import TOKENIZER_JSON_NAME

GRANULARITIES = ("token", "whole-word", "span")


@dataclass(frozen=True)
class MaskingConfig:
    granularity: str = "token"
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    mask_token_prob: float = 0.8  # of the chosen positions (or spans): replaced by [MASK]
    random_token_prob: float = 0.1  # replaced by a random token; the rest (0.1) keep the original
    span_geometric_p: float = 0.2
    span_max_words: int = 10

    def __post_init__(self) -> None:
        from .readers import DataError

        if self.granularity not in GRANULARITIES:
            raise DataError(f"unknown masking {self.granularity!r}; expected one of {', '.join(GRANULARITIES)}")
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise DataError(f"masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}")
        if self.max_predictions_per_seq < 1:
            raise DataError(f"max_predictions_per_seq must be at least 1, got {self.max_predictions_per_seq}")
        if not (0 <= self.mask_token_prob <= 1 and 0 <= self.random_token_prob
                and self.mask_token_prob + self.random_token_prob <= 1 + 1e-9):
            raise DataError("mask_token_prob and random_token_prob must be >= 0 and sum to at most 1, got "
                            f"{self.mask_token_prob} and {self.random_token_prob}")
        if not 0 < self.span_geometric_p <= 1 or self.span_max_words < 1:
            raise DataError("span_geometric_p must be in (0, 1] and span_max_words at least 1")

    @classmethod
    def for_length(cls, max_seq_length: int, **kwargs) -> "MaskingConfig":
        """Google's pairing of max_predictions_per_seq with sequence length: 20 for 128 (ceil(0.15 * 128))."""
        if kwargs.get("max_predictions_per_seq") is None:
            kwargs["max_predictions_per_seq"] = max(1, math.ceil(max_seq_length * kwargs.get("masked_lm_prob", 0.15)))
        return cls(**kwargs)

    def num_to_predict(self, length: int) -> int:
        # Google's formula, with Python 3's round (half to even), as the script runs today.
        return min(self.max_predictions_per_seq, max(1, int(round(length * self.masked_lm_prob))))

    @property
    def keep_given_not_masked(self) -> float:
        """P(keep | not [MASK]); Google's second draw `random() < 0.5` is this with the 80/10/10 default."""
        rest = 1.0 - self.mask_token_prob
        return (rest - self.random_token_prob) / rest if rest > 0 else 0.0

    def span_length_cdf(self) -> list[float]:
        """Cumulative P(length <= k) for k = 1..span_max_words: Geometric(p) renormalised to 1..max (SpanBERT)."""
        p, n = self.span_geometric_p, self.span_max_words
        weights = [p * (1 - p) ** (k - 1) for k in range(1, n + 1)]
        total = sum(weights)
        cdf, acc = [], 0.0
        for w in weights:
            acc += w / total
            cdf.append(acc)
        cdf[-1] = 1.0
        return cdf


@dataclass(frozen=True)
class VocabInfo:
    """What masking needs to know about the vocabulary: its size, [MASK], the ids never to mask, and which ids
    are ``##`` continuation pieces (for whole-word and span masking)."""

    vocab_size: int
    mask_id: int
    special_ids: frozenset
    is_continuation: np.ndarray = field(repr=False, compare=False)  # bool[vocab_size]

    @classmethod
    def from_tokens(cls, tokens: Sequence[str], special_tokens=("[CLS]", "[SEP]", "[PAD]", "[MASK]"),
                    mask_token: str = "[MASK]", continuation_prefix: str | None = "##") -> "VocabInfo":
        """From the vocabulary in id order (vocab.txt lines). `continuation_prefix` None: no token is known from
        the vocabulary alone to continue a word (byte-level BPE, whose pieces do not say it exactly)."""
        index = {t: i for i, t in enumerate(tokens)}
        missing = [t for t in special_tokens if t not in index]
        if missing:
            from .readers import DataError

            raise DataError(f"vocabulary has no {missing[0]} token")
        cont = (np.fromiter((t.startswith(continuation_prefix) for t in tokens), dtype=bool, count=len(tokens))
                if continuation_prefix is not None else np.zeros(len(tokens), dtype=bool))
        return cls(len(tokens), index[mask_token], frozenset(index[t] for t in special_tokens), cont)

    @classmethod
    def from_file(cls, vocab_file: str | os.PathLike) -> "VocabInfo":
        """From a vocab.txt, read by the tokenizer's own reader (lines end at "\\n" only); or from a byte-level
        BPE vocab.json (RoBERTa's), whose specials are `<s> </s> <pad> <mask>`. BPE data is masked token by
        token (`prepare` refuses whole-word and span masking with it, as RoBERTa masks tokens), so its pieces
        are not marked as word continuations."""
        tokens = vocabulary_tokens(vocab_file)
        if Path(vocab_file).name == TOKENIZER_JSON_NAME:  # byte-level BPE laid out [CLS] A [SEP] ("bpe-cls")
            return cls.from_tokens(tokens, continuation_prefix=None)
        if str(vocab_file).endswith(".json"):
            return cls.from_tokens(tokens, BPE_SPECIAL_TOKENS, "<mask>", continuation_prefix=None)
        return cls.from_tokens(tokens)


def vocabulary_tokens(vocab_file: str | os.PathLike) -> list[str]:
    """The tokens of a data directory's vocabulary in id order: a vocab.txt's lines, a BPE vocab.json's keys, or
    a tokenizer.json's model vocabulary with its added tokens."""
    if Path(vocab_file).name == TOKENIZER_JSON_NAME:
        data = json.loads(Path(vocab_file).read_text(encoding="utf-8"))
        index = dict(data["model"]["vocab"])
        for added in data.get("added_tokens") or []:
            index.setdefault(added["content"], added["id"])
        return sorted(index, key=index.__getitem__)
    if str(vocab_file).endswith(".json"):
        from ..tokenizer.roberta import read_vocab_json

        index = read_vocab_json(vocab_file)
        return sorted(index, key=index.__getitem__)
    from ..tokenizer.wordpiece import read_vocab

    return read_vocab(vocab_file)


BPE_SPECIAL_TOKENS = ("<s>", "</s>", "<pad>", "<mask>")  # never masked: RoBERTa's cls, sep, pad, mask


class MaskedTokens(NamedTuple):
    input_ids: list[int]  # the corrupted sequence
    positions: list[int]  # sorted masked positions
    labels: list[int]  # original ids at those positions
    span_words: list[int] | None = None  # span masking: the length in words of each span placed
    span_starts: list[int] | None = None  # span masking: the first position of each span, sorted


def mask_tokens(ids: Sequence[int], config: MaskingConfig, vocab: VocabInfo, rng: random.Random,
                continues: Sequence[bool] | None = None) -> MaskedTokens:
    """Choose and corrupt the masked-LM positions of one sequence (which includes its [CLS]/[SEP]).

    `continues[i]` (optional, aligned with `ids`): token i continues token i - 1's word; for whole-word and
    span masking it replaces the vocabulary's ``##`` rule (a word segmenter's words, `segment.py`)."""
    if continues is not None and len(continues) != len(ids):
        raise ValueError(f"continues has {len(continues)} flags for {len(ids)} tokens")
    if config.granularity == "span":
        return _mask_spans(ids, config, vocab, rng, continues)
    return _mask_google(ids, config, vocab, rng, continues)


def _word_groups(ids: Sequence[int], vocab: VocabInfo, whole_word: bool,
                 continues: Sequence[bool] | None = None) -> list[list[int]]:
    """Candidate positions, grouped: one group per token, or per word (a word and its ## pieces, or the
    tokens `continues` joins).

    A ## piece joins the group only if it directly follows it; one that opens a segment (left there when
    `truncate_seq_pair` trimmed the front of a word) stands alone rather than reaching across [SEP]."""
    special = vocab.special_ids
    if not whole_word:
        return [[i] for i, t in enumerate(ids) if t not in special]
    cont = vocab.is_continuation[np.asarray(ids, dtype=np.int64)] if continues is None else continues
    return join_words(ids, cont, special)


def join_words(ids: Sequence[int], continues: Sequence[bool], special: Container[int]) -> list[list[int]]:
    """Positions of `ids` grouped into words: a position whose `continues` flag is set joins the word of the
    position right before it; special tokens belong to no word."""
    groups: list[list[int]] = []
    for i, t in enumerate(ids):
        if t in special:
            continue
        if groups and continues[i] and groups[-1][-1] == i - 1:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _replacement(original: int, config: MaskingConfig, vocab: VocabInfo, rng: random.Random) -> int:
    # The same draws as Google's script: random() for [MASK]; otherwise random() for keep vs random token.
    if rng.random() < config.mask_token_prob:
        return vocab.mask_id
    if rng.random() < config.keep_given_not_masked:
        return original
    return rng.randint(0, vocab.vocab_size - 1)


def _mask_google(ids: Sequence[int], config: MaskingConfig, vocab: VocabInfo, rng: random.Random,
                 continues: Sequence[bool] | None) -> MaskedTokens:
    cand = _word_groups(ids, vocab, config.granularity == "whole-word", continues)
    rng.shuffle(cand)
    output = list(ids)
    num_to_predict = config.num_to_predict(len(ids))
    positions: list[int] = []
    for group in cand:  # groups never overlap, so Google's covered-index check is not needed
        if len(positions) >= num_to_predict:
            break
        # A whole word that would overflow the budget is skipped; a later, shorter one may still fit.
        if len(positions) + len(group) > num_to_predict:
            continue
        for i in group:
            output[i] = _replacement(ids[i], config, vocab, rng)
            positions.append(i)
    positions.sort()
    return MaskedTokens(output, positions, [ids[i] for i in positions])


def sample_span_length(config: MaskingConfig, rng: random.Random, cdf: list[float] | None = None) -> int:
    """A span length in words: Geometric(p) restricted to 1..span_max_words."""
    cdf = cdf or config.span_length_cdf()
    return min(bisect.bisect_left(cdf, rng.random()) + 1, len(cdf))


def _mask_spans(ids: Sequence[int], config: MaskingConfig, vocab: VocabInfo, rng: random.Random,
                continues: Sequence[bool] | None) -> MaskedTokens:
    words = _word_groups(ids, vocab, True, continues)
    output = list(ids)
    budget = config.num_to_predict(len(ids))
    cdf = config.span_length_cdf()
    taken = [False] * len(words)
    positions: list[int] = []
    span_words: list[int] = []
    span_starts: list[int] = []

    def fits(w: int, length: int, room: int) -> int:
        """Tokens in the `length`-word span starting at word w, or 0 if it does not fit: it must stay clear of
        masked words and special tokens (a gap in positions) and within the remaining budget."""
        if w + length > len(words):
            return 0
        size = 0
        for k in range(w, w + length):
            if taken[k] or (k > w and words[k][0] != words[k - 1][-1] + 1):
                return 0
            size += len(words[k])
        return size if size <= room else 0

    failures = 0
    while len(positions) < budget and words and failures < 10:
        length = sample_span_length(config, rng, cdf)
        room = budget - len(positions)
        # Look for a place where the whole sampled span fits; shorten it only when none is found, so the
        # lengths placed stay close to the Geometric(0.2) draws (mean 3.8) rather than being cut by whatever
        # happens to lie to the right of a random anchor.
        w = size = 0
        while length >= 1 and not size:
            for _ in range(8):
                w = rng.randrange(len(words))
                size = fits(w, length, room)
                if size:
                    break
            else:
                length -= 1
        if not size:
            failures += 1
            continue
        # One 80/10/10 decision for the whole span (SpanBERT); a random replacement is drawn per token.
        if rng.random() < config.mask_token_prob:
            action = "mask"
        elif rng.random() < config.keep_given_not_masked:
            action = "keep"
        else:
            action = "random"
        for k in range(w, w + length):
            taken[k] = True
            for i in words[k]:
                positions.append(i)
                if action == "mask":
                    output[i] = vocab.mask_id
                elif action == "random":
                    output[i] = rng.randint(0, vocab.vocab_size - 1)
        span_words.append(length)
        span_starts.append(words[w][0])
    positions.sort()
    return MaskedTokens(output, positions, [ids[i] for i in positions], span_words, sorted(span_starts))


def span_boundaries(positions: Sequence[int], span_starts: Container[int]) -> list[tuple[int, int, int]]:
    """For each masked position (sorted), its span's (left boundary, right boundary, offset in the span): the
    positions just outside the span, s - 1 and e + 1, and i - s (SpanBERT's span-boundary objective).

    A span is a run of consecutive masked positions; `span_starts` says where each span begins, which the
    positions alone cannot: two spans may touch (span masking keeps them from overlapping, not from being
    adjacent), and then the run holds both. A span never covers a special token, so its boundaries are real
    positions of the sequence: [CLS] or [SEP] when it touches one."""
    out: list[tuple[int, int, int]] = []
    begin = 0
    for k, p in enumerate(positions):
        if k == 0 or p in span_starts or p != positions[k - 1] + 1:
            begin = k  # a new span opens here
        if k + 1 == len(positions) or positions[k + 1] in span_starts or positions[k + 1] != p + 1:
            start, end = positions[begin], p
            out.extend((start - 1, end + 1, q - start) for q in positions[begin:k + 1])
    return out
