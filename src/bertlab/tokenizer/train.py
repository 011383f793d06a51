"""WordPiece vocabulary learning: text corpus -> `vocab.txt` in Google's BERT layout.

Three separate pieces:

* `count_words` streams corpus files line by line through the project's `BasicTokenizer` (the same
  pre-tokenization `BertTokenizer` applies before WordPiece, so training and encoding agree) and returns
  word counts. It holds only the distinct-word table, never the corpus, and caps that table by pruning
  rare words periodically (see `count_words`), so a multi-GB corpus is read in bounded memory.
* `learn_wordpiece` is a pure function: word counts in, vocabulary (a list of tokens) out. It is the
  bottom-up, likelihood-based learner of Schuster & Nakajima (2012) that BERT's WordPiece descends from:
  start from the characters (word-initial `c` and continuation `##c`) and repeatedly merge the adjacent
  pair of units whose merge most increases the likelihood of the training words under a unigram language
  model over units (pairs seen at least `min_pair_frequency` times first). Pair counts are updated
  incrementally after each merge (only the words that contain the merged pair are re-segmented), and a
  lazily invalidated heap finds the best pair. Because BERT *encodes* with greedy longest-match-first
  rather than by replaying merges, some merged pieces are never (or hardly ever) produced by the encoder;
  the learner therefore merges `overgenerate` times more pieces than it has room for and then drops, one
  at a time, the piece the encoder uses least on the training words, until the vocabulary has the
  requested size (see `_prune_pieces`).
* `train_vocab` / `write_vocab` glue the two together for the `bertlab vocab train` command.

The output layout follows Google's released vocabularies (`bert-base-uncased.txt`):

    [PAD] [unused0] ... [unused98] [UNK] [CLS] [SEP] [MASK] [unused99] ... [unusedK-1]
    word-initial characters (code-point order), continuation characters `##c` (code-point order),
    learned pieces (in the order they were learned).

`num_unused` (K, default 99) [unused] slots are reserved for tokens a user adds later without resizing the
embeddings. With K >= 99 the special tokens keep Google's ids ([PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102,
[MASK] 103), so code and configs written for Google's vocabularies keep working; slots beyond the first 99
follow [MASK], as in Google's files. With K < 99 the special tokens move down accordingly. (Google's files
have 994 slots in 30522; 99 is the smallest number that keeps the special ids, and costs only ~1% of an
8000-token vocabulary.)

Quality and cost (benchmarks/bench_vocab.py, WikiText-2 train excerpt + valid -> test, 8000 tokens): 1.262
pieces per word against 1.275 for Hugging Face's WordPieceTrainer, the same [UNK]s, ~7 s of CPU. The
learner needs roughly 1.5 KB per distinct word (200,000 words -> 30,522 tokens: ~300 MB, ~3 CPU minutes).
"""

from __future__ import annotations

import heapq
import logging
import math
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import BertlabError, OutputError, output_error

logger = logging.getLogger(__name__)

GOOGLE_UNUSED_BEFORE_UNK = 99  # Google's files put [unused0..98] between [PAD] and [UNK], so [UNK] is id 100
CONTINUATION = "##"
MAX_WORD_CHARS = 100  # BERT's WordPiece maps a longer word to [UNK] whatever the vocabulary: don't learn from it
MIN_PAIR_COUNT = 2  # a pair seen once is never merged: the piece would serve one word and say nothing about new text
N_DRIFT = 0.1  # refresh the likelihood scores' reference N once the true N is 10% lower
SCORES = ("likelihood", "pmi")
DECODE_ERROR_POLICIES = ("skip", "replace", "error")


@dataclass(frozen=True)
class TrainDefaults:
    """The defaults of `train_vocab` / `learn_wordpiece` (and of the `bertlab vocab train` flags).

    `min_pair_frequency` 5 and `overgenerate` 1.5 were chosen on WikiText-2 (train+valid -> test, and
    train+test -> valid) at 4000, 8000 and 16000 tokens; see benchmarks/bench_vocab.py for the measurements.
    On a large corpus the first hardly matters: the vocabulary fills long before pairs get that rare.
    """

    num_unused: int = GOOGLE_UNUSED_BEFORE_UNK
    min_char_frequency: int = 1
    min_pair_frequency: int = 5
    score: str = "likelihood"
    overgenerate: float = 1.5
    on_decode_error: str = "replace"
    max_words: int = 1_000_000


_D = TrainDefaults()


class CorpusError(BertlabError):
    """A corpus file is missing, unreadable, empty, or not UTF-8 (with on_decode_error="error")."""


class VocabTrainingError(BertlabError, ValueError):
    """The requested vocabulary cannot be built (for example: too small for the special tokens and alphabet)."""


# --------------------------------------------------------------------------------------------------------
# Streaming word counts
# --------------------------------------------------------------------------------------------------------

@dataclass
class WordCounts:
    """What `count_words` read: word -> count, plus the characters of words that pruning removed."""

    words: dict[str, int]
    # Character counts of the words pruning dropped, so the alphabet is built from exact counts:
    pruned_chars: Counter = field(default_factory=Counter)         # all occurrences
    pruned_chars_joined: Counter = field(default_factory=Counter)  # occurrences inside words of 2+ characters
    lines: int = 0
    tokens: int = 0
    bad_lines: int = 0
    pruned_words: int = 0  # distinct-word entries dropped by pruning (a word can be dropped more than once)
    prune_threshold: int = 0  # the highest count at which a word was dropped (0: no pruning happened)

    def char_counts(self) -> tuple[Counter, Counter]:
        """(all, joined): occurrences of each character in the words read, pruned ones included; `joined`
        counts only those inside words of two or more characters."""
        counts, joined = _char_counts(self.words)
        counts.update(self.pruned_chars)
        joined.update(self.pruned_chars_joined)
        return counts, joined


def _char_counts(words: Mapping[str, int]) -> tuple[Counter, Counter]:
    counts: Counter = Counter()
    joined: Counter = Counter()
    for w, f in words.items():
        if len(w) <= MAX_WORD_CHARS:
            for c in w:
                counts[c] += f
            if len(w) > 1:
                for c in w:
                    joined[c] += f
    return counts, joined


def _check_paths(paths: Iterable[str | os.PathLike]) -> list[Path]:
    out = []
    for p in paths:
        path = Path(p)
        if not path.exists():
            raise CorpusError(f"corpus file not found: {path}")
        if path.is_dir():
            raise CorpusError(f"corpus path is a directory, expected a text file: {path}")
        if not os.access(path, os.R_OK):
            raise CorpusError(f"corpus file is not readable: {path}")
        out.append(path)
    if not out:
        raise CorpusError("no corpus files given")
    return out


def corpus_lines(files: list[Path], stats: WordCounts, *, on_decode_error: str = _D.on_decode_error,
                 progress: bool = False, desc: str = "reading") -> Iterator[str]:
    """The lines of `files` (checked by `_check_paths`) as text, with a progress bar over their bytes.

    A UTF-8 byte-order mark at the start of a file is dropped. A line that is not valid UTF-8 is reported with
    file and line number (the first ten as warnings; `stats.bad_lines` counts them all) and, per
    `on_decode_error`, skipped ("skip"), decoded with U+FFFD replacement characters ("replace"), or turned
    into a `CorpusError` ("error"). Shared by the WordPiece and SentencePiece trainers."""
    from ..core.progress import progress as progress_bar  # a bar on a terminal, lines in a log file

    reported = 0
    bar = progress_bar(total=sum(f.stat().st_size for f in files), unit="B", unit_scale=True, desc=desc,
                       enabled=progress, leave=False)
    try:
        for path in files:
            pending = 0  # bytes read but not yet shown: the bar is updated per MB, not per line
            try:
                f = open(path, "rb")  # bytes, so a bad line can be reported and handled on its own
            except OSError as e:
                raise CorpusError(f"cannot open corpus file {path}: {e.strerror}") from None
            with f:
                for lineno, raw in enumerate(f, 1):
                    pending += len(raw)
                    if pending >= 1 << 20:
                        bar.update(pending)
                        pending = 0
                    if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                        raw = raw[3:]  # a UTF-8 byte-order mark is not text
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError as e:
                        where = (f"{path}:{lineno}: invalid UTF-8 (byte 0x{raw[e.start]:02x} is byte "
                                 f"{e.start + 1} of the line)")
                        if on_decode_error == "error":
                            raise CorpusError(f"{where}; use --on-decode-error skip or replace to go on") \
                                from None
                        stats.bad_lines += 1
                        if reported < 10:
                            logger.warning("%s: line %s", where,
                                           "skipped" if on_decode_error == "skip" else "decoded with U+FFFD")
                            reported += 1
                        if on_decode_error == "skip":
                            continue
                        line = raw.decode("utf-8", errors="replace")
                    yield line
            bar.update(pending)
    finally:
        bar.close()


def count_words(
    paths: Iterable[str | os.PathLike],
    *,
    lowercase: bool = True,
    tokenize: Callable[[str], list[str]] | None = None,
    on_decode_error: str = _D.on_decode_error,
    max_words: int = _D.max_words,
    progress: bool | None = False,
) -> WordCounts:
    """Stream `paths` (UTF-8 text, any line structure) and count the words `BasicTokenizer` produces.

    `tokenize` defaults to `BasicTokenizer(do_lower_case=lowercase).tokenize`, the pre-tokenizer that
    `BertTokenizer` applies before WordPiece. Lines that are not valid UTF-8 are reported with file and
    line number (the first ten as warnings, then a total) and, per `on_decode_error`, skipped ("skip"),
    decoded with U+FFFD replacement characters ("replace"), or turned into a `CorpusError` ("error").

    Bounded memory: whenever the table holds more than `max_words` distinct words, words seen at most `t`
    times are dropped, with `t` = 1, 2, ... raised until at most half the table remains (the "reduce
    vocabulary" step of word2vec). Frequent words are unaffected; a dropped word that reappears starts
    counting again from zero, so counts of words rarer than `prune_threshold` are underestimates -- which
    only affects pieces that rare words alone would support. The characters of dropped words are kept in
    `pruned_chars`, so the alphabet (and with it the [UNK] rate) is still built from exact counts.
    """
    if on_decode_error not in DECODE_ERROR_POLICIES:
        raise VocabTrainingError(f"on_decode_error must be one of {', '.join(DECODE_ERROR_POLICIES)}, "
                                 f"got {on_decode_error!r}")
    if max_words < 2:
        raise VocabTrainingError(f"max_words must be at least 2, got {max_words}")
    files = _check_paths(paths)
    if tokenize is None:
        from .basic import BasicTokenizer  # the project's pre-tokenizer: training and encoding must agree

        tokenize = BasicTokenizer(do_lower_case=lowercase).tokenize

    counts: Counter = Counter()
    result = WordCounts(words={})
    for line in corpus_lines(files, result, on_decode_error=on_decode_error, progress=progress,
                             desc="counting words"):
        result.lines += 1
        words = tokenize(line)
        if words:
            result.tokens += len(words)
            counts.update(words)
            if len(counts) > max_words:
                _prune_table(counts, max_words // 2, result)
    if result.bad_lines:
        logger.warning("%d line(s) in total were not valid UTF-8 and were %s", result.bad_lines,
                       "skipped" if on_decode_error == "skip" else "decoded with replacement characters")
    if not counts:
        raise CorpusError(f"corpus is empty: no words in {', '.join(str(p) for p in files)}")
    result.words = dict(counts)
    return result


def _prune_table(counts: Counter, keep_at_most: int, result: WordCounts) -> None:
    """Drop words seen at most t times, t = 1, 2, ..., until at most `keep_at_most` remain (in place)."""
    t = 0
    while len(counts) > keep_at_most:
        t += 1
        rare = [w for w, c in counts.items() if c <= t]
        for w in rare:
            c = counts.pop(w)
            if len(w) <= MAX_WORD_CHARS:
                for ch in w:
                    result.pruned_chars[ch] += c
                if len(w) > 1:
                    for ch in w:
                        result.pruned_chars_joined[ch] += c
        result.pruned_words += len(rare)
    result.prune_threshold = max(result.prune_threshold, t)
    logger.info("word table pruned to %d distinct words (dropped those seen at most %d times so far)",
                len(counts), t)


# --------------------------------------------------------------------------------------------------------
# The learner (pure: word counts in, vocabulary out)
# --------------------------------------------------------------------------------------------------------

def special_layout(num_unused: int = GOOGLE_UNUSED_BEFORE_UNK) -> list[str]:
    """[PAD], [unused0..min(K,99)-1], [UNK], [CLS], [SEP], [MASK], [unused99..K-1] (Google's order)."""
    if num_unused < 0:
        raise VocabTrainingError(f"num_unused must be >= 0, got {num_unused}")
    before = min(num_unused, GOOGLE_UNUSED_BEFORE_UNK)
    return (["[PAD]"] + [f"[unused{i}]" for i in range(before)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
            + [f"[unused{i}]" for i in range(before, num_unused)])


def _xlogx(x: float) -> float:
    return x * math.log(x) if x > 0 else 0.0


def _score_likelihood(k: int, ca: int, cb: int, xa: float, xb: float, same: bool, n: float, xn: float) -> float:
    # Schuster & Nakajima: the increase of the training data's log-likelihood under a unigram model over
    # units, L = sum_u c_u log(c_u / N) = sum_u c_u log c_u - N log N, when the k occurrences of "a b"
    # become one unit "ab":  c_a -> c_a - k,  c_b -> c_b - k  (c_a - 2k if a == b),  c_ab = k,  N -> N - k:
    #   dL = k log k + (c_a-k) log(c_a-k) - c_a log c_a + (c_b-k) log(c_b-k) - c_b log c_b
    #        - [(N-k) log(N-k) - N log N]
    # xa, xb, xn = c_a log c_a, c_b log c_b, N log N, which the caller keeps per unit (they change only when
    # a merge changes c_u). N is a reference value that `_merge` refreshes when the true N has drifted, and
    # a pre-existing unit "ab" (the same string reached from another pair) is scored as new, so that a
    # pair's score changes only when its own counts do -- what the incremental heap relies on.
    # (x log x written out, not called: this runs millions of times.)
    log = math.log
    if same:  # a == b, e.g. "##a ##a": the one unit loses 2k occurrences
        r = ca - 2 * k
        gain = (r * log(r) if r > 0 else 0.0) - xa
    else:
        r, s = ca - k, cb - k
        gain = (r * log(r) if r > 0 else 0.0) - xa + (s * log(s) if s > 0 else 0.0) - xb
    nk = n - k  # > 0: a pair's k is at most N/2
    return k * log(k) + gain - (nk * log(nk) - xn)


def _score_pmi(k: int, ca: int, cb: int, xa: float, xb: float, same: bool, n: float, xn: float) -> float:
    # score(a, b) = count(ab) / (count(a) * count(b)): the simplified WordPiece criterion (a likelihood ratio
    # without the count weighting). It favours pairs of rare units and compresses far worse (about 2.3x the
    # tokens per word on WikiText-2, benchmarks/bench_vocab.py); kept for comparison.
    return k / (ca * cb)


_SCORE_FUNCTIONS = {"likelihood": _score_likelihood, "pmi": _score_pmi}


def learn_wordpiece(
    word_counts: Mapping[str, int],
    vocab_size: int,
    *,
    num_unused: int = _D.num_unused,
    min_char_frequency: int = _D.min_char_frequency,
    min_pair_frequency: int = _D.min_pair_frequency,
    score: str = _D.score,
    overgenerate: float = _D.overgenerate,
    char_counts: tuple[Mapping[str, int], Mapping[str, int]] | None = None,
    progress: bool | None = False,
) -> list[str]:
    """Learn a WordPiece vocabulary of `vocab_size` tokens (fewer if the corpus runs out of pairs).

    `word_counts` maps pre-tokenized words (what `BasicTokenizer` yields) to counts. The result is the full
    vocabulary, one token per id, in the layout of the module docstring. Deterministic: the same counts and
    arguments give the same list, whatever the order of `word_counts`.

    Alphabet: every character seen at least `min_char_frequency` times (in any position) becomes a
    word-initial token `c`, and also a continuation token `##c` unless it was only ever seen as a word of
    its own (punctuation and CJK ideographs, which the basic tokenizer always splits off: a `##,` could
    never be used). So every word made of such characters can be encoded, even with a letter in a position
    where training never saw it, and the [UNK] rate is only that of rarer characters. A word containing a
    rarer character is [UNK] whatever is learned, so it is left out of the statistics. `char_counts` =
    (all, joined) overrides the character counts derived from `word_counts` (see `WordCounts.char_counts`,
    which is exact even after pruning).

    Merges: repeatedly merge the adjacent pair (a, b) with the highest `score`, ties broken by the higher
    pair count, then by the lower unit ids (the alphabet's code-point order, then the order of learning):
      * "likelihood" (default): the increase of the unigram log-likelihood of the training words
        (Schuster & Nakajima 2012), see `_score_likelihood`;
      * "pmi": count(ab) / (count(a) * count(b)).
    Pairs seen fewer than `min_pair_frequency` times are merged only when no more frequent pair is left,
    and pairs seen once never: the likelihood gain of a pair of rare units is high on the training words
    (they always co-occur) but such a piece rarely recurs in new text, so it would waste a slot there.

    Pruning: `overgenerate` x (the slots left after the alphabet) pieces are learned, then the piece that
    greedy longest-match-first encoding of the training words uses least is removed, repeatedly, until the
    vocabulary fits (`_prune_pieces`). `overgenerate=1` disables this.
    """
    if score not in _SCORE_FUNCTIONS:
        raise VocabTrainingError(f"score must be one of {', '.join(SCORES)}, got {score!r}")
    if min_char_frequency < 1 or min_pair_frequency < 1:
        raise VocabTrainingError("min_char_frequency and min_pair_frequency must be at least 1")
    if not overgenerate >= 1:
        raise VocabTrainingError(f"overgenerate must be >= 1, got {overgenerate}")
    head = special_layout(num_unused)
    budget = vocab_size - len(head)  # tokens left for characters and pieces

    all_counts, joined_counts = _char_counts(word_counts) if char_counts is None else char_counts
    # (A character that is whitespace to str.strip/splitlines could not be written one per line; the basic
    # tokenizer never yields one inside a word.)
    chars = sorted(c for c, n in all_counts.items() if n >= min_char_frequency and len(c) == 1 and c.strip())
    alphabet = chars + [CONTINUATION + c for c in chars if joined_counts.get(c, 0) > 0]
    if not alphabet:
        raise VocabTrainingError("no characters to build a vocabulary from (no words, or min_char_frequency="
                                 f"{min_char_frequency} is above every character's count)")
    if len(alphabet) > budget:
        raise VocabTrainingError(
            f"vocab_size {vocab_size} is too small: {len(head)} special and [unused] tokens + {len(alphabet)} "
            f"characters (c and ##c) need {len(head) + len(alphabet)}; raise --vocab-size or "
            f"--min-char-frequency")

    head_set = set(head)
    initial_set = set(chars)
    continuation_set = {c for c in chars if joined_counts.get(c, 0) > 0}
    words: list[tuple[str, int]] = []
    skipped = 0
    # Sorted so that unit counts, word indices and therefore the result do not depend on dict order.
    for w, f in sorted(word_counts.items(), key=lambda wf: (-wf[1], wf[0])):
        if f <= 0 or not w or w in head_set:
            continue  # (a special token in the text, kept whole by the basic tokenizer, is already a token)
        if len(w) > MAX_WORD_CHARS or w[0] not in initial_set or not continuation_set.issuperset(w[1:]):
            skipped += 1  # encodes to [UNK] whatever the vocabulary
            continue
        words.append((w, f))

    n_pieces = budget - len(alphabet)
    candidates = _merge(words, alphabet, math.ceil(n_pieces * overgenerate), _SCORE_FUNCTIONS[score],
                        min_pair_frequency, progress)
    pieces = _prune_pieces(words, alphabet, candidates, n_pieces, progress) \
        if len(candidates) > n_pieces else candidates
    # Only a pre-tokenizer other than BasicTokenizer (which splits "[" off) can let a piece spell "[UNK]".
    pieces = [p for p in pieces if p not in head_set]
    vocab = head + alphabet + pieces
    logger.info("vocabulary: %d tokens (%d special/[unused], %d characters, %d pieces kept of %d learned); "
                "%d distinct words used, %d with rare characters or over %d characters left out",
                len(vocab), len(head), len(alphabet), len(pieces), len(candidates), len(words), skipped,
                MAX_WORD_CHARS)
    if len(vocab) < vocab_size:
        logger.warning("the corpus ran out of pairs seen at least %d times: the vocabulary has %d tokens, "
                       "not %d", MIN_PAIR_COUNT, len(vocab), vocab_size)
    return vocab


def _merge(words: list[tuple[str, int]], alphabet: list[str], n_pieces: int, score_fn, min_pair: int,
           progress: bool | None) -> list[str]:
    """The merge loop: up to `n_pieces` new tokens, in the order they were learned."""
    from ..core.progress import progress as progress_bar  # a bar on a terminal, lines in a log file

    units: list[str] = list(alphabet)             # unit id -> string
    unit_id = {u: i for i, u in enumerate(units)}
    count: list[int] = [0] * len(units)           # c_u: occurrences of unit u in the current segmentation
    segs: list[list[int]] = []                    # current segmentation of each word of two or more units
    freq: list[int] = []
    for w, f in words:
        seq = [unit_id[w[0]]] + [unit_id[CONTINUATION + c] for c in w[1:]]
        for u in seq:
            count[u] += f
        if len(seq) > 1:
            segs.append(seq)
            freq.append(f)
    total = sum(count)                            # N: units in the corpus under the current segmentation
    n_ref = float(total)
    xl = [_xlogx(c) for c in count]               # c_u log c_u, for the likelihood score
    xn = _xlogx(n_ref)

    pair_count: dict[tuple[int, int], int] = {}
    # pair -> indices of words that contain it. A list, not a set (far less memory): it may also hold
    # words that no longer contain the pair, or a word twice; the merge skips those.
    where: dict[tuple[int, int], list[int]] = {}
    for wi, seq in enumerate(segs):
        f = freq[wi]
        for p in set(zip(seq, seq[1:])):
            where.setdefault(p, []).append(wi)
        for p in zip(seq, seq[1:]):
            pair_count[p] = pair_count.get(p, 0) + f
    right_of: dict[int, set[int]] = {}            # a -> {b : pair (a, b) occurs}
    left_of: dict[int, set[int]] = {}             # b -> {a : pair (a, b) occurs}
    for a, b in pair_count:
        right_of.setdefault(a, set()).add(b)
        left_of.setdefault(b, set()).add(a)

    def entry(p: tuple[int, int]) -> tuple[bool, float, int, int, int]:
        # Heap order: pairs seen at least min_pair times before rarer ones; then the best score, then the
        # more frequent pair, then the lower unit ids (a fixed rule, so the result is deterministic).
        a, b = p
        k = pair_count[p]
        return (k < min_pair, -score_fn(k, count[a], count[b], xl[a], xl[b], a == b, n_ref, xn), -k, a, b)

    def rebuild() -> list:
        heap = [entry(p) for p, k in pair_count.items() if k >= MIN_PAIR_COUNT]
        heapq.heapify(heap)
        return heap

    heap = rebuild()
    pieces: list[str] = []
    drifts = score_fn is _score_likelihood
    bar = progress_bar(total=n_pieces, desc="merging", unit="piece", enabled=progress, leave=False)
    try:
        while len(pieces) < n_pieces and heap:
            item = heapq.heappop(heap)
            a, b = item[3], item[4]
            if pair_count.get((a, b), 0) < MIN_PAIR_COUNT or entry((a, b)) != item:
                continue  # stale: the pair's counts changed since this was pushed, and a fresh entry exists
            new_str = units[a] + units[b][len(CONTINUATION):]
            m = unit_id.get(new_str)
            if m is None:  # new; the same string can also come from another pair (a + ##bc, then ab + ##c)
                m = len(units)
                units.append(new_str)
                unit_id[new_str] = m
                count.append(0)
                xl.append(0.0)
                pieces.append(new_str)
                bar.update(1)

            # Re-segment only the words that contain "a b", collecting the net change of every pair count.
            delta: dict[tuple[int, int], int] = {}
            merged = 0
            for wi in where.pop((a, b)):
                seq = segs[wi]
                new: list[int] = []
                i, n, hits = 0, len(seq), 0
                while i < n:
                    if i + 1 < n and seq[i] == a and seq[i + 1] == b:  # leftmost first, non-overlapping
                        new.append(m)
                        i += 2
                        hits += 1
                    else:
                        new.append(seq[i])
                        i += 1
                if not hits:
                    continue  # a stale or repeated index
                f = freq[wi]
                for p in zip(seq, seq[1:]):
                    delta[p] = delta.get(p, 0) - f
                fresh = set()
                for p in zip(new, new[1:]):
                    delta[p] = delta.get(p, 0) + f
                    if m in p:  # the only pairs this word did not have before
                        fresh.add(p)
                for p in fresh:
                    where.setdefault(p, []).append(wi)
                segs[wi] = new
                merged += hits * f
            count[a] -= merged
            count[b] -= merged
            count[m] += merged
            for u in (a, b, m):
                xl[u] = _xlogx(count[u])
            total -= merged

            changed = set()
            for p, d in delta.items():
                if not d:
                    continue
                c = pair_count.get(p, 0) + d
                x, y = p
                if c:
                    if p not in pair_count:
                        right_of.setdefault(x, set()).add(y)
                        left_of.setdefault(y, set()).add(x)
                    pair_count[p] = c
                    changed.add(p)
                else:
                    del pair_count[p]
                    right_of[x].discard(y)
                    left_of[y].discard(x)
                    where.pop(p, None)

            if drifts and total < n_ref * (1 - N_DRIFT):
                # N enters every likelihood score: refresh it, and with it every entry, after a 10% drift (it
                # only weighs k log N against the rest, and log N moves slowly; 3% gave the same quality).
                n_ref = float(total)
                xn = _xlogx(n_ref)
                heap = rebuild()
                continue
            # Every pair whose score changed: those whose count changed, and those sharing a unit whose count
            # changed (a, b, and m if it already existed). Pushing them all keeps the heap exact; their older
            # entries are recognised as stale when popped.
            for u in (a, b, m) if a != b else (a, m):
                changed.update((u, y) for y in right_of.get(u, ()))
                changed.update((x, u) for x in left_of.get(u, ()))
            for p in changed:
                if pair_count[p] >= MIN_PAIR_COUNT:
                    heapq.heappush(heap, entry(p))
            if len(heap) > 4 * len(pair_count) + 200_000:
                heap = rebuild()  # drop the accumulated stale entries
    finally:
        bar.close()
    return pieces


def _greedy(word: str, vocab: Mapping[str, int], max_len: int) -> list[int]:
    """WordPiece encoding of one word: greedy longest-match-first (every character is in `vocab`)."""
    out = []
    start, n = 0, len(word)
    while start < n:
        end = min(n, start + max_len)
        if start == 0:
            while word[:end] not in vocab:
                end -= 1
            out.append(vocab[word[:end]])
        else:
            while CONTINUATION + word[start:end] not in vocab:
                end -= 1
            out.append(vocab[CONTINUATION + word[start:end]])
        start = end
    return out


def _prune_pieces(words: list[tuple[str, int]], alphabet: list[str], candidates: list[str], n_keep: int,
                  progress: bool | None) -> list[str]:
    """Keep `n_keep` of the learned `candidates`, removing the least useful to the encoder one at a time.

    BERT encodes a word by greedy longest-match-first, not by replaying merges, so a merged piece can be
    useless to the encoder (an intermediate "th" once "the" exists) or nearly so. Usefulness is the number
    of times the encoder emits the piece over the training words. The piece used least (ties: the one
    learned last) is removed and only the words whose encoding used it are re-encoded -- removing a piece a
    word's encoding did not use cannot change that encoding -- which updates the other pieces' counts.
    """
    from ..core.progress import progress as progress_bar  # a bar on a terminal, lines in a log file

    tokens = alphabet + candidates
    vocab = {t: i for i, t in enumerate(tokens)}
    n_fixed = len(alphabet)
    max_len = max(len(t) - (len(CONTINUATION) if t.startswith(CONTINUATION) else 0) for t in tokens)
    use = [0] * len(tokens)
    users: list[list[int]] = [[] for _ in tokens]  # token id -> words whose encoding used it (may be stale)
    texts: list[str] = []
    encs: list[list[int]] = []
    freq: list[int] = []
    for w, f in words:
        if len(w) < 2:
            continue  # a single character is its own token whatever the pieces
        enc = _greedy(w, vocab, max_len)
        wi = len(encs)
        texts.append(w)
        encs.append(enc)
        freq.append(f)
        for t in set(enc):
            users[t].append(wi)
        for t in enc:
            use[t] += f

    heap = [(use[t], -t) for t in range(n_fixed, len(tokens))]
    heapq.heapify(heap)
    to_remove = len(candidates) - n_keep
    bar = progress_bar(total=to_remove, desc="pruning", unit="piece", enabled=progress, leave=False)
    try:
        for _ in range(to_remove):
            while True:
                u, neg_t = heapq.heappop(heap)
                t = -neg_t
                if tokens[t] in vocab and u == use[t]:
                    break  # otherwise removed already, or a stale count with a fresher entry in the heap
            del vocab[tokens[t]]
            bar.update(1)
            changed = set()
            for wi in users[t]:
                old = encs[wi]
                if t not in old:
                    continue  # stale index
                f = freq[wi]
                new = _greedy(texts[wi], vocab, max_len)
                for x in old:
                    use[x] -= f
                for x in new:
                    use[x] += f
                for x in set(new).difference(old):
                    users[x].append(wi)
                changed.update(old)
                changed.update(new)
                encs[wi] = new
            users[t] = []
            for x in changed:
                if x >= n_fixed and x != t:
                    heapq.heappush(heap, (use[x], -x))
    finally:
        bar.close()
    return [c for c in candidates if c in vocab]


# --------------------------------------------------------------------------------------------------------
# Corpus -> vocab.txt
# --------------------------------------------------------------------------------------------------------

def train_vocab(
    paths: Iterable[str | os.PathLike],
    vocab_size: int,
    *,
    lowercase: bool = True,
    num_unused: int = _D.num_unused,
    min_char_frequency: int = _D.min_char_frequency,
    min_pair_frequency: int = _D.min_pair_frequency,
    score: str = _D.score,
    overgenerate: float = _D.overgenerate,
    on_decode_error: str = _D.on_decode_error,
    max_words: int = _D.max_words,
    tokenize: Callable[[str], list[str]] | None = None,
    progress: bool | None = False,
) -> tuple[list[str], WordCounts]:
    """`count_words` then `learn_wordpiece`; returns the vocabulary and what was read."""
    if vocab_size < 1:
        raise VocabTrainingError(f"vocab_size must be positive, got {vocab_size}")
    head = special_layout(num_unused)  # check the cheap arguments before reading a large corpus
    if vocab_size <= len(head):
        raise VocabTrainingError(f"vocab_size {vocab_size} leaves no room for characters after {len(head)} "
                                 "special and [unused] tokens")
    counts = count_words(paths, lowercase=lowercase, tokenize=tokenize, on_decode_error=on_decode_error,
                         max_words=max_words, progress=progress)
    vocab = learn_wordpiece(counts.words, vocab_size, num_unused=num_unused, min_char_frequency=min_char_frequency,
                            min_pair_frequency=min_pair_frequency, score=score, overgenerate=overgenerate,
                            char_counts=counts.char_counts(), progress=progress)
    return vocab, counts


def check_output(path: str | os.PathLike, folder: bool = False) -> Path:
    """Prove the output can be written -- a file at `path` (its folder created), or a folder -- before a
    vocabulary is learned for minutes and then lost: a one-line `OutputError` naming the path otherwise."""
    path = Path(path)
    where = path if folder else path.parent
    if folder and path.exists() and not path.is_dir():
        raise OutputError(f"{path}: exists and is not a folder")
    if not folder and path.is_dir():
        raise OutputError(f"{path}: is a folder; give the file to write (e.g. {path / 'vocab.txt'})")
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", dir=where)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise output_error(path, e) from None
    return path


def write_vocab(vocab: list[str], path: str | os.PathLike) -> Path:
    """Write one token per line (UTF-8, "\\n"), atomically: a crash never leaves a half-written file."""
    path = Path(path)
    bad = [t for t in vocab if not t or t != t.strip() or len(t.splitlines()) != 1]
    if bad:
        raise VocabTrainingError(f"token {bad[0]!r} cannot be written one per line")
    if len(set(vocab)) != len(vocab):
        dup = next(t for t, n in Counter(vocab).items() if n > 1)
        raise VocabTrainingError(f"duplicate token {dup!r} in the vocabulary")
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write("\n".join(vocab) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        raise VocabTrainingError(f"cannot write the vocabulary to {path}: {e.strerror or e}") from None
    return path
