"""Byte-level BPE (GPT-2's, which RoBERTa reuses): text -> pre-tokens -> bytes -> merged pieces, with offsets.

The algorithm, family-neutral; `roberta.py` binds it to RoBERTa's special tokens and input layout.

1. Pre-tokenisation: GPT-2's pattern
   `'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+` splits the text. Python's
   `re` has no `\\p{..}`, so the classes are spelled out as explicit ranges built once from `unicodedata`
   (letters: categories L*, numbers: N*), and `\\s` is Unicode's White_Space property -- what the `tokenizers`
   library's regex engine (Oniguruma) matches, which is not Python's `\\s` (that one also takes U+001C-U+001F).
2. Each pre-token's UTF-8 bytes become printable characters (`bytes_to_unicode`, GPT-2's table: the byte
   ' ' is 'Ġ', '\\n' is 'Ċ'), and BPE merges adjacent symbols, lowest merge rank first, until no listed pair
   is left. Results are cached per pre-token.
3. Offsets are character spans of the original text: a piece covering part of a multi-byte character spans
   the whole character. `trim_offsets` (RoBERTa's post-processor) then moves the start of a piece past its
   leading 'Ġ's and its end before trailing ones, as the `tokenizers` library does -- including its quirk that
   with `add_prefix_space` the added space is aligned to the first real character, so a piece other than the
   text's first that starts with the added space loses that character from its span.

`add_prefix_space` puts a space before each stretch of text that does not start with one (each stretch
between special tokens; each word of pre-split input). The Unicode tables are Python's (`unicodedata`,
14.0 on Python 3.11): there they put every code point in the class the `tokenizers` library's engine does
(tests/test_bpe_tokenizer.py sweeps them all); another Python's tables may differ on characters assigned
in other Unicode versions.

When the C extension is built (`_fast.BPEEncoder`, `csrc/bpe.c`), the same steps run there, with this module's
character classes (handed over per code point) and merge table; this file is the reference and the fallback.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence

from .base import TokenizerError

# Unicode's White_Space property (PropList.txt): Rust's char::is_whitespace and Oniguruma's \s
WHITESPACE = frozenset(
    [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F,
     0x205F, 0x3000])

# character classes of the pre-tokeniser, as the C extension numbers them
C_OTHER, C_LETTER, C_NUMBER, C_SPACE = 0, 1, 2, 3

# how many pre-tokens' results the cache keeps before it starts over (the C encoder has its own)
CACHE_ENTRIES = 100_000


def bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> character table: printable Latin-1 bytes stand for themselves, the other 68 bytes
    (controls, space, ...) are mapped in order to U+0100 onwards, so every byte string is printable text."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = [""] * 256
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_CHARS = bytes_to_unicode()
CHAR_BYTES = {c: b for b, c in enumerate(BYTE_CHARS)}
_LATIN1_TO_BYTE_CHARS = {b: c for b, c in enumerate(BYTE_CHARS)}
SPACE_CHAR = BYTE_CHARS[ord(" ")]  # 'Ġ'


def char_class(cp: int) -> int:
    """The pre-tokeniser's class of code point `cp`: C_LETTER, C_NUMBER, C_SPACE or C_OTHER."""
    if cp in WHITESPACE:
        return C_SPACE
    cat = unicodedata.category(chr(cp))[0]
    return C_LETTER if cat == "L" else C_NUMBER if cat == "N" else C_OTHER


def _class_ranges(wanted: int) -> str:
    """A regex character-class body listing every code point of class `wanted` as ranges."""
    cat = unicodedata.category
    letter = wanted == C_LETTER
    parts, start = [], None
    for cp in range(0x110001):
        inside = cp < 0x110000 and cp not in WHITESPACE and cat(chr(cp))[0] == ("L" if letter else "N")
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            parts.append(f"\\U{start:08x}" if start == cp - 1 else f"\\U{start:08x}-\\U{cp - 1:08x}")
            start = None
    return "".join(parts)


_PATTERN: re.Pattern | None = None


def pretokenize_pattern() -> re.Pattern:
    """GPT-2's pre-tokenisation pattern for Python's `re` (built on first use, ~0.2 s)."""
    global _PATTERN
    if _PATTERN is None:
        letters, numbers = _class_ranges(C_LETTER), _class_ranges(C_NUMBER)
        space = "".join(f"\\U{cp:08x}" for cp in sorted(WHITESPACE))
        _PATTERN = re.compile(
            f"'s|'t|'re|'ve|'m|'ll|'d| ?[{letters}]+| ?[{numbers}]+| ?[^{space}{letters}{numbers}]+"
            f"|[{space}]+(?![^{space}])|[{space}]+")
    return _PATTERN


class BPEError(TokenizerError):
    """A merges table that cannot be used with its vocabulary, or text that has no UTF-8 form."""


class BPE:
    """Byte-level BPE over a vocabulary (piece -> id) and merges (pairs of pieces, highest priority first).

    `encode_into` appends one stretch of text as ids, offsets and word indices. Pieces whose
    characters are not in the vocabulary are dropped, or become `unk_id` when there is one (the `tokenizers`
    library's BPE without and with an unk token).
    """

    def __init__(self, vocab: Mapping[str, int], merges: Sequence[tuple[str, str]], *, add_prefix_space: bool = False,
                 trim_offsets: bool = True, unk_id: int | None = None):
        self.vocab = vocab
        self.merges = list(merges)
        self.ranks: dict[tuple[str, str], int] = {}
        for rank, (a, b) in enumerate(self.merges):
            for piece in (a, b, a + b):
                if piece not in vocab:
                    raise BPEError(f"merge {rank + 1} ({a} {b}) needs {piece!r}, which is not in the vocabulary")
            self.ranks.setdefault((a, b), rank)
        self.add_prefix_space = bool(add_prefix_space)
        self.trim_offsets = bool(trim_offsets)
        self.unk_id = unk_id
        # leading / trailing 'Ġ's of each piece, for trim_offsets
        size = max(vocab.values(), default=-1) + 1
        self._lead, self._trail = [0] * size, [0] * size
        for t, i in vocab.items():
            if t.startswith(SPACE_CHAR) or t.endswith(SPACE_CHAR):
                self._lead[i] = len(t) - len(t.lstrip(SPACE_CHAR))
                self._trail[i] = len(t) - len(t.rstrip(SPACE_CHAR))
        self._cache: dict[str, tuple[tuple[int, int, int], ...]] = {}

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_cache"] = {}
        return state

    # -- one pre-token -------------------------------------------------------------------------------------

    def merge(self, word: str | list[str]) -> list[str]:
        """The BPE pieces of one byte-mapped pre-token (or its symbols): merge the lowest-ranked adjacent pair (all its
        non-overlapping occurrences, left to right) until no pair of the table is left."""
        symbols = list(word)
        ranks = self.ranks
        while len(symbols) > 1:
            best, best_rank = None, None
            for pair in zip(symbols, symbols[1:]):
                r = ranks.get(pair)
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = pair, r
            if best is None:
                break
            a, b = best
            out, i, n = [], 0, len(symbols)
            while i < n:
                if i < n - 1 and symbols[i] == a and symbols[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            symbols = out
        return symbols

    def _pieces(self, word: str) -> tuple[tuple[int, int, int], ...]:
        """(id, first byte, end byte) per piece of a byte-mapped pre-token; cached. Characters without an id
        are taken out before merging (the pieces on either side may then merge), or stand alone as the unk
        id when there is one: the `tokenizers` library's BPE."""
        got = self._cache.get(word)
        if got is not None:
            return got
        vocab, out = self.vocab, []
        if all(ch in vocab for ch in word):
            at = 0
            for piece in self.merge(word):
                out.append((vocab[piece], at, at + len(piece)))
                at += len(piece)
        else:
            kept = [k for k, ch in enumerate(word) if ch in vocab or self.unk_id is not None]
            # "" stands for an unknown character kept as unk: no merge has it, so it never merges
            symbols = self.merge([word[k] if word[k] in vocab else "" for k in kept])
            j = 0
            for piece in symbols:
                n = len(piece) or 1
                out.append((vocab[piece] if piece else self.unk_id, kept[j], kept[j + n - 1] + 1))
                j += n
        got = tuple(out)
        if len(self._cache) >= CACHE_ENTRIES:
            self._cache.clear()
        self._cache[word] = got
        return got

    # -- a stretch of text ---------------------------------------------------------------------------------

    def encode_into(self, text: str, start: int, end: int, ids: list[int], offsets: list[tuple[int, int]],
                    words: list[int], word: int = 0) -> int:
        """Append the pieces of `text[start:end]` (no special tokens in it) to `ids`, `offsets` ((start, end)
        into `text`) and `words` (one word per pre-token, counted from `word`); returns the next word index.
        A piece is the first of its sequence (for `trim_offsets` with `add_prefix_space`) when `ids` is
        empty."""
        if start >= end:
            return word
        segment = text[start:end]
        prefixed = self.add_prefix_space and segment[0] != " "
        if prefixed:
            segment = " " + segment
        shift = start - 1 if prefixed else start  # text index of segment char k (k >= 1 when prefixed)
        trim, lead, trail = self.trim_offsets, self._lead, self._trail
        for m in pretokenize_pattern().finditer(segment):
            s = m.start()
            chunk = m.group()
            try:
                raw = chunk.encode("utf-8")
            except UnicodeEncodeError as e:
                raise BPEError(f"cannot encode a lone surrogate (U+{ord(chunk[e.start]):04X} at index "
                               f"{s + e.start + shift}); text must be valid Unicode") from None
            pieces = self._pieces(raw.decode("latin-1").translate(_LATIN1_TO_BYTE_CHARS))
            char_at = None
            if len(raw) != len(chunk):  # byte -> index of its character within the chunk
                char_at = []
                for k, ch in enumerate(chunk):
                    char_at.extend([k] * len(ch.encode("utf-8")))
            for pid, b0, b1 in pieces:
                c0, c1 = (b0, b1 - 1) if char_at is None else (char_at[b0], char_at[b1 - 1])
                c0 += s
                c1 += s
                o0 = start if prefixed and c0 == 0 else c0 + shift
                o1 = (start if prefixed and c1 == 0 else c1 + shift) + 1
                if trim and (lead[pid] or trail[pid]):
                    o0, o1 = self._trim(pid, o0, o1, not ids)
                ids.append(pid)
                offsets.append((o0, o1))
                words.append(word)
            word += 1
        return word

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]], list[int]]:
        """The pieces of `text` taken as plain text: ids, offsets, word indices."""
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        words: list[int] = []
        self.encode_into(text, 0, len(text), ids, offsets, words)
        return ids, offsets, words

    def _trim(self, pid: int, o0: int, o1: int, first: bool) -> tuple[int, int]:
        """`trim_offsets`: the `tokenizers` library's ByteLevel `process_offsets` for one piece."""
        lead = self._lead[pid] if pid < len(self._lead) else 0
        trail = self._trail[pid] if pid < len(self._trail) else 0
        if lead:
            if (first or o0 == 0) and self.add_prefix_space and lead == 1:
                lead = 0
            o0 = min(o0 + lead, o1)
        if trail and o1 >= trail:
            o1 = max(o1 - trail, o0)
        return o0, o1


def decode_pieces(tokens: Iterable[str]) -> str:
    """Byte-level pieces -> text: each piece's characters back to bytes, invalid UTF-8 replaced by U+FFFD.
    A piece with a character outside the byte table (an added token such as '<mask>' is within it; one with
    other characters is not) contributes its own UTF-8, as the `tokenizers` library's ByteLevel decoder does."""
    out = bytearray()
    for t in tokens:
        try:
            out += bytes([CHAR_BYTES[c] for c in t])
        except KeyError:
            out += t.encode("utf-8")
    return out.decode("utf-8", errors="replace")
