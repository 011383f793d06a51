"""Learning a byte-level BPE vocabulary (RoBERTa's kind): `bertlab vocab train --kind bpe`.

The corpus is read line by line (`train.corpus_lines`: UTF-8 errors reported with file and line) and split by
the same pre-tokeniser `bpe.py` encodes with, so what is learned is what the encoder will see. The vocabulary
is RoBERTa's layout: `<s> <pad> </s> <unk> <mask>` (ids 0-4), the 256 byte characters, then one token per
merge in the order learned. Each step merges the most frequent adjacent pair over all pre-tokens (weighted by
their counts; ties to the smallest pair, so the result does not depend on the order of the files); pair counts
are updated incrementally, only in the pre-tokens that hold the merged pair. Learning stops at `vocab_size`
tokens or when no pair is seen `min_frequency` times.

`write_bpe_folder` writes vocab.json, merges.txt and tokenizer_config.json, which `RobertaTokenizer` and
`transformers`' RobertaTokenizerFast both load.
"""

from __future__ import annotations

import heapq
import logging
import os
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from .bpe import _LATIN1_TO_BYTE_CHARS, BYTE_CHARS, pretokenize_pattern
from .train import DECODE_ERROR_POLICIES, CorpusError, VocabTrainingError, WordCounts, count_words

logger = logging.getLogger(__name__)

ROBERTA_SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")


def byte_pretokens(line: str) -> list[str]:
    """The pre-tokens of one corpus line (its line break taken off) as byte characters: what BPE merges."""
    line = line.rstrip("\n").rstrip("\r")
    return [m.group().encode("utf-8", errors="replace").decode("latin-1").translate(_LATIN1_TO_BYTE_CHARS)
            for m in pretokenize_pattern().finditer(line)]


def learn_bpe(words: dict[str, int], vocab_size: int, min_frequency: int = 2,
              special_tokens: Iterable[str] = ROBERTA_SPECIAL_TOKENS) -> tuple[list[str], list[tuple[str, str]]]:
    """(tokens in id order, merges) from byte-character pre-tokens and their counts."""
    tokens = list(dict.fromkeys(special_tokens))
    base = len(tokens) + len(BYTE_CHARS)
    if vocab_size < base:
        raise VocabTrainingError(f"vocab_size {vocab_size} is too small: the special tokens and the 256 bytes "
                                 f"need {base}")
    tokens += [c for c in sorted(BYTE_CHARS) if c not in tokens]
    known = set(tokens)
    seqs = [list(w) for w in words]
    freq = list(words.values())
    pairs: dict[tuple[str, str], int] = defaultdict(int)
    where: dict[tuple[str, str], set[int]] = defaultdict(set)
    for i, seq in enumerate(seqs):
        for p in zip(seq, seq[1:]):
            pairs[p] += freq[i]
            where[p].add(i)
    heap = [(-c, p) for p, c in pairs.items()]
    heapq.heapify(heap)
    merges: list[tuple[str, str]] = []
    while len(tokens) < vocab_size and heap:
        c, best = heapq.heappop(heap)
        if -c != pairs.get(best, 0):  # stale entry: the count changed since it was pushed
            if pairs.get(best, 0) > 0:
                heapq.heappush(heap, (-pairs[best], best))
            continue
        if -c < min_frequency:
            break
        a, b = best
        merged = a + b
        merges.append(best)
        if merged not in known:
            known.add(merged)
            tokens.append(merged)
        changed: set[tuple[str, str]] = set()
        for i in sorted(where.pop(best, ())):
            seq, f = seqs[i], freq[i]
            for p in zip(seq, seq[1:]):
                pairs[p] -= f
                changed.add(p)
            out, k = [], 0
            while k < len(seq):
                if k + 1 < len(seq) and seq[k] == a and seq[k + 1] == b:
                    out.append(merged)
                    k += 2
                else:
                    out.append(seq[k])
                    k += 1
            seqs[i] = out
            for p in zip(out, out[1:]):
                pairs[p] += f
                where[p].add(i)
                changed.add(p)
        pairs.pop(best, None)
        for p in changed:
            n = pairs.get(p, 0)
            if n > 0:
                heapq.heappush(heap, (-n, p))
            else:
                pairs.pop(p, None)
    return tokens, merges


def train_bpe(paths: Iterable[str | os.PathLike], vocab_size: int, *, min_frequency: int = 2,
              on_decode_error: str = "replace", max_words: int = 1_000_000, progress: bool | None = False
              ) -> tuple[list[str], list[tuple[str, str]], WordCounts]:
    """Count the byte-level pre-tokens of the corpus files and learn merges (see the module docstring)."""
    if on_decode_error not in DECODE_ERROR_POLICIES:
        raise VocabTrainingError(f"on_decode_error must be one of {', '.join(DECODE_ERROR_POLICIES)}")
    counts = count_words(paths, tokenize=byte_pretokens, on_decode_error=on_decode_error, max_words=max_words,
                         progress=progress)
    tokens, merges = learn_bpe(counts.words, vocab_size, min_frequency)
    if len(tokens) < vocab_size:
        logger.warning("the corpus supports only %d tokens (no pair left seen %d times); asked for %d",
                       len(tokens), min_frequency, vocab_size)
    return tokens, merges, counts


def write_bpe_folder(tokens: list[str], merges: list[tuple[str, str]], folder: str | os.PathLike) -> Path:
    """vocab.json + merges.txt + tokenizer_config.json (RobertaTokenizer's settings) in `folder`."""
    from .roberta import RobertaTokenizer

    if not tokens:
        raise CorpusError("nothing learned")
    tok = RobertaTokenizer(vocab={t: i for i, t in enumerate(tokens)}, merges=merges)
    return tok.save_pretrained(folder)
