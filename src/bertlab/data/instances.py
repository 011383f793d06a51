"""Training instances: which tokens go into each sequence, and how they pair up for next-sentence prediction.

Everything here is a pure function of a tokenized `Corpus` (token ids with sentence and document
boundaries) and an injected `random.Random`. An `Instance` does not copy tokens: it names one or two
contiguous token ranges of the corpus (`a`, and `b` for pair modes) plus the NSP label, 40 bytes however long
the sequence, and `instance_ids` turns it into ids when a batch is built. Truncation keeps ranges contiguous
(it trims one token at a time from the front or the back), so the same representation holds after it.

Modes (`InstanceConfig.mode`):

- ``segment-pair`` (BERT): Google's `create_instances_from_document`, generator draw for generator draw.
  Segments are runs of whole sentences (never an arbitrary cut: a mid-sentence split point would make
  next-sentence prediction too easy); the chunk is split at a random sentence into A and B; half the time
  (and always when the chunk has one sentence) B is replaced by a run of sentences from a random other
  document, and the sentences of the chunk not used "are put back" to start the next chunk. With
  `short_seq_prob` (0.1) the target length is drawn from [2, max] so the model also sees short inputs, as
  fine-tuning will give it. `truncate_seq_pair` then trims the longer side, from the front or the back at
  random. Because `segment_pair_instances` is a generator, a caller that masks each instance with the same
  generator before asking for the next one draws exactly the random numbers Google's script draws.
  One deliberate change, on by default (`nsp_balance`): a chunk of one sentence cannot be split, so Google
  makes it "random next" without a coin flip, which leaves IsNext at 47.5% on WikiText-2 at length 128
  (43% on short-sentence text). We keep every draw, but while "random" labels outnumber "next" labels so
  far, a coin that says "random" is read as "next"; IsNext comes out at 50.0%.
  `nsp_balance=False` is Google's script to the letter.
- ``segment-order`` (ALBERT's sentence-order prediction, SOP): segments chunked as in ``segment-pair``, the
  chunk split at a random sentence into A and B, and with probability 0.5 the two swapped (label 1 when
  swapped, 0 in order, as ALBERT's `sentence_order_label`). B always follows A in the same document: the
  label says only which came first, never which document a segment came from. A chunk of one sentence
  (ALBERT's script gives those a random other document's B) is cut at a random token instead, so every pair
  stays two consecutive segments; a one-token chunk makes no pair. With `short_seq_prob` as segment-pair.
- ``sentence-pair`` (RoBERTa's SENTENCE-PAIR+NSP): each sentence but a document's last is an A; B is the
  next sentence or (50%) a random sentence of another document.
- ``full-sentences`` (RoBERTa): whole sentences packed contiguously up to the length, crossing document
  ends, with an extra [SEP] where a document ends inside the sequence; no NSP.
- ``doc-sentences`` (RoBERTa): the same, but a sequence never crosses a document end; no NSP.

In the packing modes a sentence longer than the whole sequence is cut into full-length pieces rather than
dropped. Sequences: ``[CLS] A [SEP] B [SEP]`` with token types 0...0 1...1 for the pair modes,
``[CLS] tokens [SEP]`` with all types 0 for the packing modes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterator, NamedTuple, Sequence

import numpy as np

from .readers import DataError

MODES = ("segment-pair", "sentence-pair", "segment-order", "full-sentences", "doc-sentences")
NSP_MODES = ("segment-pair", "sentence-pair")
ORDER_MODES = ("segment-order",)
# the modes whose instances carry a sentence-level label (`next_sentence_label` in batches): NSP or SOP
LABELLED_PAIR_MODES = NSP_MODES + ORDER_MODES
# the modes that pack whole sentences into a row (full-sentences may hold several documents in one)
PACKED_MODES = ("full-sentences", "doc-sentences")

# next_sentence_label values, as Google's script writes them and Hugging Face's BertForPreTraining reads them
IS_NEXT, RANDOM_NEXT, NO_NSP = 0, 1, -1
# sentence-order labels (segment-order), as ALBERT's script writes them: the same two values
IN_ORDER, SWAPPED = IS_NEXT, RANDOM_NEXT


@dataclass(frozen=True)
class InstanceConfig:
    mode: str = "segment-pair"
    max_seq_length: int = 128
    short_seq_prob: float = 0.1  # segment-pair only, as in Google's script
    # segment-pair only: pay back Google's forced "random next" draws so IsNext stays at 50% (see
    # `segment_pair_instances`); False reproduces Google's script exactly, labels and all.
    nsp_balance: bool = True

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise DataError(f"unknown mode {self.mode!r}; expected one of {', '.join(MODES)}")
        if not 8 <= self.max_seq_length <= 65535:
            raise DataError(f"max_seq_length must be in [8, 65535], got {self.max_seq_length}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise DataError(f"short_seq_prob must be in [0, 1], got {self.short_seq_prob}")

    @property
    def has_nsp(self) -> bool:
        """Whether instances carry a sentence-level label (next sentence, or sentence order)."""
        return self.mode in LABELLED_PAIR_MODES


class Instance(NamedTuple):
    a_start: int  # token offset in the corpus
    a_len: int
    b_start: int = -1
    b_len: int = 0
    next_sentence_label: int = NO_NSP  # IS_NEXT, RANDOM_NEXT, or NO_NSP


# ---------------------------------------------------------------------------------------------- corpus
class Corpus:
    """One split of the tokenized corpus: token ids (in one or more shards) plus boundaries.

    `sentence_ends[s]` is the token offset just past sentence s; `document_ends[d]` is the sentence index just
    past document d. `word_shards` (optional, parallel to `shards`): per token, 1 when it continues the
    previous token's word (a word segmenter's words; see `segment.py`). Arrays may be in memory or
    memory-mapped; nothing here reads more than it needs."""

    def __init__(self, shards: Sequence[np.ndarray], sentence_ends: np.ndarray, document_ends: np.ndarray,
                 doc_token_ends: np.ndarray | None = None, word_shards: Sequence[np.ndarray] | None = None):
        self.shards = list(shards)
        self.word_shards = None if word_shards is None else list(word_shards)
        self.shard_starts = np.concatenate([[0], np.cumsum([len(s) for s in self.shards])]).astype(np.int64)
        self.sentence_ends = sentence_ends
        self.document_ends = document_ends
        if doc_token_ends is None:
            doc_token_ends = (np.asarray(sentence_ends[np.asarray(document_ends) - 1], dtype=np.int64)
                              if len(document_ends) else np.zeros(0, dtype=np.int64))
        self.doc_token_ends = doc_token_ends  # token offset just past each document

    @classmethod
    def from_documents(cls, documents: Sequence[Sequence[Sequence[int]]], dtype=np.int32,
                       word_continues: Sequence[Sequence[Sequence[bool]]] | None = None) -> "Corpus":
        """An in-memory corpus from token-id documents (lists of sentences); empty sentences and documents
        are skipped, as the shard store skips them. `word_continues`: word flags of the same shape."""
        tokens, flags, sent_ends, doc_ends = [], [], [], []
        n = 0
        for d, doc in enumerate(documents):
            sents = [(j, s) for j, s in enumerate(doc) if len(s)]
            if not sents:
                continue
            for j, s in sents:
                tokens.extend(s)
                if word_continues is not None:
                    flags.extend(word_continues[d][j])
                n += len(s)
                sent_ends.append(n)
            doc_ends.append(len(sent_ends))
        words = None if word_continues is None else [np.asarray(flags, dtype=np.uint8)]
        return cls([np.asarray(tokens, dtype=dtype)], np.asarray(sent_ends, dtype=np.int64),
                   np.asarray(doc_ends, dtype=np.int64), word_shards=words)

    @property
    def num_documents(self) -> int:
        return len(self.document_ends)

    @property
    def num_sentences(self) -> int:
        return len(self.sentence_ends)

    @property
    def num_tokens(self) -> int:
        return int(self.shard_starts[-1])

    def doc_sentences(self, d: int) -> tuple[int, list[int]]:
        """(token offset of document d, its sentence lengths)."""
        s0 = int(self.document_ends[d - 1]) if d else 0
        s1 = int(self.document_ends[d])
        start = int(self.sentence_ends[s0 - 1]) if s0 else 0
        ends = np.asarray(self.sentence_ends[s0:s1], dtype=np.int64)
        return start, np.diff(ends, prepend=start).tolist()

    def tokens(self, start: int, end: int) -> np.ndarray:
        """Token ids [start, end) (a copy when the range spans shards)."""
        return self._range(self.shards, start, end)

    def word_continues(self, start: int, end: int) -> np.ndarray | None:
        """The word flags of tokens [start, end) (see the class docstring); None when the corpus has none."""
        return None if self.word_shards is None else self._range(self.word_shards, start, end)

    def _range(self, shards: list[np.ndarray], start: int, end: int) -> np.ndarray:
        k = int(np.searchsorted(self.shard_starts, start, side="right")) - 1
        base = int(self.shard_starts[k])
        if end <= int(self.shard_starts[k + 1]):
            return shards[k][start - base:end - base]
        parts = []
        while start < end:
            stop = min(end, int(self.shard_starts[k + 1]))
            parts.append(np.asarray(shards[k][start - int(self.shard_starts[k]):stop - int(self.shard_starts[k])]))
            start, k = stop, k + 1
        return np.concatenate(parts)


# ---------------------------------------------------------------------------------------------- pair modes
def truncate_seq_pair(a: list[int], b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    """Google's `truncate_seq_pair` on [start, length] ranges, in place: while too long, take one token off
    the longer side (B on a tie), from the front or the back at random -- "to add more randomness and avoid
    biases" -- so a range stays contiguous."""
    while a[1] + b[1] > max_num_tokens:
        trunc = a if a[1] > b[1] else b
        assert trunc[1] >= 1
        if rng.random() < 0.5:
            trunc[0] += 1  # del trunc_tokens[0]
        trunc[1] -= 1  # (or trunc_tokens.pop())


def _random_other_document(corpus: Corpus, document_index: int, rng: random.Random) -> int:
    # "This should rarely go for more than one iteration for large corpora" (Google): ten tries, then accept.
    for _ in range(10):
        r = rng.randint(0, corpus.num_documents - 1)
        if r != document_index:
            break
    return r


class NspBalance:
    """Running count of "random next" labels minus "is next" labels (carried across documents)."""

    def __init__(self) -> None:
        self.excess_random = 0


def _pair_budget(corpus: Corpus, document_index: int, config: InstanceConfig,
                 rng: random.Random) -> tuple[list[int], list[int], int, int]:
    """A document's sentence lengths and token offsets (sentence k spans offsets[k]..offsets[k+1]), the hard
    length of a pair (`max_seq_length` less [CLS], [SEP], [SEP]) and this document's target length."""
    doc_start, lengths = corpus.doc_sentences(document_index)
    offsets = [doc_start]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    max_num_tokens = config.max_seq_length - 3  # [CLS], [SEP], [SEP]
    # We *usually* fill the whole sequence (padding is wasted compute) but sometimes use a shorter target
    # to narrow the gap between pre-training and fine-tuning; the target is a soft length, the max is hard.
    target_seq_length = max_num_tokens
    if rng.random() < config.short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    return lengths, offsets, max_num_tokens, target_seq_length


def segment_pair_instances(corpus: Corpus, document_index: int, config: InstanceConfig,
                           rng: random.Random, balance: NspBalance | None = None) -> Iterator[Instance]:
    """Google's `create_instances_from_document` on token ranges (see the module docstring)."""
    if balance is None:
        balance = NspBalance()
    lengths, offsets, max_num_tokens, target_seq_length = _pair_budget(corpus, document_index, config, rng)

    chunk_first, chunk_size, current_length = 0, 0, 0
    i = 0
    while i < len(lengths):
        if chunk_size == 0:
            chunk_first = i
        chunk_size += 1
        current_length += lengths[i]
        if i == len(lengths) - 1 or current_length >= target_seq_length:
            if chunk_size:
                # `a_end`: how many sentences of the chunk go into A.
                a_end = 1
                if chunk_size >= 2:
                    a_end = rng.randint(1, chunk_size - 1)
                a = [offsets[chunk_first], offsets[chunk_first + a_end] - offsets[chunk_first]]
                is_random_next = chunk_size == 1 or rng.random() < 0.5
                if is_random_next and chunk_size > 1 and config.nsp_balance and balance.excess_random > 0:
                    is_random_next = False  # pay back an earlier forced "random next"
                balance.excess_random += 1 if is_random_next else -1
                if is_random_next:
                    label = RANDOM_NEXT
                    target_b_length = target_seq_length - a[1]
                    r = _random_other_document(corpus, document_index, rng)
                    r_start, r_lengths = corpus.doc_sentences(r)
                    random_start = rng.randint(0, len(r_lengths) - 1)
                    b = [r_start + sum(r_lengths[:random_start]), 0]
                    for j in range(random_start, len(r_lengths)):
                        b[1] += r_lengths[j]
                        if b[1] >= target_b_length:
                            break
                    # The chunk's sentences after A were not used: "put them back" for the next chunk.
                    i -= chunk_size - a_end
                else:
                    label = IS_NEXT
                    b = [offsets[chunk_first + a_end], offsets[chunk_first + chunk_size] - offsets[chunk_first + a_end]]
                truncate_seq_pair(a, b, max_num_tokens, rng)
                assert a[1] >= 1 and b[1] >= 1
                yield Instance(a[0], a[1], b[0], b[1], label)
            chunk_size, current_length = 0, 0
        i += 1


def segment_order_instances(corpus: Corpus, document_index: int, config: InstanceConfig,
                            rng: random.Random) -> Iterator[Instance]:
    """Sentence-order pairs of one document (see the module docstring): two consecutive segments, swapped
    with probability 0.5."""
    lengths, offsets, max_num_tokens, target_seq_length = _pair_budget(corpus, document_index, config, rng)
    chunk_first, chunk_size, current_length = 0, 0, 0
    for i in range(len(lengths)):
        if chunk_size == 0:
            chunk_first = i
        chunk_size += 1
        current_length += lengths[i]
        if i == len(lengths) - 1 or current_length >= target_seq_length:
            start, end = offsets[chunk_first], offsets[chunk_first + chunk_size]
            if chunk_size >= 2:
                cut = offsets[chunk_first + rng.randint(1, chunk_size - 1)]
            elif end - start >= 2:
                cut = start + rng.randint(1, end - start - 1)  # one sentence: cut at a token
            else:
                cut = None  # one token: no pair
            if cut is not None:
                a, b = [start, cut - start], [cut, end - cut]
                label = SWAPPED if rng.random() < 0.5 else IN_ORDER
                if label == SWAPPED:
                    a, b = b, a
                truncate_seq_pair(a, b, max_num_tokens, rng)
                yield Instance(a[0], a[1], b[0], b[1], label)
            chunk_size, current_length = 0, 0


def sentence_pair_instances(corpus: Corpus, document_index: int, config: InstanceConfig,
                            rng: random.Random) -> Iterator[Instance]:
    """RoBERTa's SENTENCE-PAIR: (sentence, next sentence or a random sentence of another document).

    A document's last sentence is never an A (it has no next), so IsNext is 50% exactly in expectation --
    unlike a forced "random" for last sentences, which would tilt the labels."""
    doc_start, lengths = corpus.doc_sentences(document_index)
    max_num_tokens = config.max_seq_length - 3
    start = doc_start
    for i in range(len(lengths) - 1):
        a = [start, lengths[i]]
        if rng.random() < 0.5:
            label, b = IS_NEXT, [start + lengths[i], lengths[i + 1]]
        else:
            label = RANDOM_NEXT
            r = _random_other_document(corpus, document_index, rng)
            r_start, r_lengths = corpus.doc_sentences(r)
            j = rng.randint(0, len(r_lengths) - 1)
            b = [r_start + sum(r_lengths[:j]), r_lengths[j]]
        truncate_seq_pair(a, b, max_num_tokens, rng)
        yield Instance(a[0], a[1], b[0], b[1], label)
        start += lengths[i]


# ---------------------------------------------------------------------------------------------- packing modes
def packed_instances(corpus: Corpus, doc_begin: int, doc_end: int, config: InstanceConfig) -> Iterator[Instance]:
    """FULL-SENTENCES / DOC-SENTENCES packing of documents [doc_begin, doc_end) (no randomness)."""
    budget = config.max_seq_length - 2  # [CLS] ... [SEP]
    cross_documents = config.mode == "full-sentences"
    cur_start, cur_tokens, cur_seps = 0, 0, 0
    pending_sep = 0  # 1 when the current sequence holds a document's end and more text will follow it
    for d in range(doc_begin, doc_end):
        pos, lengths = corpus.doc_sentences(d)
        for n in lengths:
            while n > 0:
                if cur_tokens + cur_seps + pending_sep + n <= budget:
                    if cur_tokens == 0:
                        cur_start = pos
                    cur_tokens += n
                    cur_seps += pending_sep
                    pending_sep = 0
                    pos += n
                    n = 0
                elif cur_tokens == 0:  # a sentence longer than a whole sequence: emit a full piece of it
                    yield Instance(pos, budget)
                    pos += budget
                    n -= budget
                else:
                    yield Instance(cur_start, cur_tokens)
                    cur_tokens, cur_seps, pending_sep = 0, 0, 0
        if cur_tokens:
            if cross_documents:
                pending_sep = 1
            else:
                yield Instance(cur_start, cur_tokens)
                cur_tokens, cur_seps = 0, 0
    if cur_tokens:
        yield Instance(cur_start, cur_tokens)


def generate_instances(corpus: Corpus, doc_begin: int, doc_end: int, config: InstanceConfig,
                       rng: random.Random) -> Iterator[Instance]:
    """The instances of documents [doc_begin, doc_end) in the configured mode."""
    if config.mode == "segment-pair":
        balance = NspBalance()
        for d in range(doc_begin, doc_end):
            yield from segment_pair_instances(corpus, d, config, rng, balance)
    elif config.mode == "sentence-pair":
        for d in range(doc_begin, doc_end):
            yield from sentence_pair_instances(corpus, d, config, rng)
    elif config.mode == "segment-order":
        for d in range(doc_begin, doc_end):
            yield from segment_order_instances(corpus, d, config, rng)
    else:
        yield from packed_instances(corpus, doc_begin, doc_end, config)


# ---------------------------------------------------------------------------------------------- materialise
def instance_ids(inst: Instance, corpus: Corpus, cls_id: int, sep_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(input ids, token type ids) of an instance, as int64 arrays without padding."""
    ids = _layout(inst, corpus, corpus.tokens, cls_id, sep_id, np.int64)
    types = np.zeros(len(ids), dtype=np.int64)
    if inst.b_start >= 0:
        types[inst.a_len + 2:] = 1
    return ids, types


def instance_documents(inst: Instance, corpus: Corpus) -> np.ndarray:
    """Which document each position of `instance_ids` belongs to, numbered 1, 2, ... within the instance: a
    packed instance's [CLS] and first document are 1, each [SEP] belongs to the document it closes. A pair
    instance is one document (all 1). The attention mask of document attention (`PretrainingCollator`)."""
    if inst.b_start >= 0:
        return np.ones(inst.a_len + inst.b_len + 3, dtype=np.int64)
    end = inst.a_start + inst.a_len
    dte = corpus.doc_token_ends
    lo = int(np.searchsorted(dte, inst.a_start, side="right"))
    hi = int(np.searchsorted(dte, end, side="left"))
    cuts = dte[lo:hi] - inst.a_start  # token offsets where a document ends inside the instance
    docs = np.ones(inst.a_len + len(cuts) + 2, dtype=np.int64)
    for k, c in enumerate(cuts):  # the k-th [SEP] sits after c tokens, k earlier [SEP]s and the [CLS]
        docs[int(c) + k + 2:] = k + 2
    return docs


def instance_word_continues(inst: Instance, corpus: Corpus) -> np.ndarray | None:
    """The word flags aligned with `instance_ids` (False at [CLS]/[SEP]); None when the corpus has none."""
    if corpus.word_shards is None:
        return None
    return _layout(inst, corpus, corpus.word_continues, 0, 0, np.bool_)


def _layout(inst: Instance, corpus: Corpus, fetch, cls_value, sep_value, dtype) -> np.ndarray:
    """An instance's per-token values from `fetch(start, end)`, with `cls_value` / `sep_value` where [CLS]
    and [SEP] go: `[CLS] A [SEP] B [SEP]`, or packed `[CLS] doc [SEP] doc ... [SEP]`."""
    a = fetch(inst.a_start, inst.a_start + inst.a_len)
    if inst.b_start >= 0:
        b = fetch(inst.b_start, inst.b_start + inst.b_len)
        ids = np.empty(len(a) + len(b) + 3, dtype=dtype)
        ids[0], ids[len(a) + 1], ids[-1] = cls_value, sep_value, sep_value
        ids[1:len(a) + 1] = a
        ids[len(a) + 2:-1] = b
        return ids
    # Packed: a [SEP] after every document that ends strictly inside the range.
    end = inst.a_start + inst.a_len
    dte = corpus.doc_token_ends
    lo = int(np.searchsorted(dte, inst.a_start, side="right"))
    hi = int(np.searchsorted(dte, end, side="left"))
    cuts = dte[lo:hi] - inst.a_start
    pieces: list = [[cls_value]]
    prev = 0
    for c in cuts:
        pieces.append(a[prev:c])
        pieces.append([sep_value])
        prev = int(c)
    pieces.append(a[prev:])
    pieces.append([sep_value])
    return np.concatenate([np.asarray(p, dtype=dtype) for p in pieces])
