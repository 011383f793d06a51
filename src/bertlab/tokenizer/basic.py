"""BERT's basic tokenizer: text -> normalised words, each with the character offsets it came from.

This is the first half of Google's `tokenization.py` (the second half, WordPiece, is in `wordpiece.py`), in
the order Google applies it:

1. split off special tokens (`[CLS]`, `[SEP]`, `[MASK]`, `[PAD]`, `[UNK]`, or whatever `never_split` holds)
   wherever they occur in the raw text, exactly as written (Hugging Face's added-token matching);
2. clean: drop NUL, U+FFFD and control characters, treat every Unicode whitespace character as a space;
3. put spaces around CJK ideographs, so each becomes its own word;
4. per whitespace-separated token, for uncased models: lowercase (Python's full case mapping, final sigma
   included) and strip accents (NFD, then drop nonspacing marks, category Mn);
5. split on punctuation: Unicode categories P* plus every ASCII symbol (``$ + < = > ^ ` | ~``).

Every step is done on `(character, index in the original text)` pairs, so each word knows which original
character each of its normalised characters came from; `BertTokenizer` turns that into offsets for every
word piece. This module is the reference implementation: the optional C extension (`csrc/wordpiece.c`) must agree
with it exactly, and the tests check that it does.

"Control" characters, which the cleaner drops, are categories Cc, Cf and Co (private use), and lone
surrogates (Cs) -- what Hugging Face's fast tokenizer drops. Google drops only Cc and Cf; both Hugging Face
tokenizers also drop private-use characters, so we follow them there. Unassigned code points (Cn) are kept,
as Google and HF-fast do (HF-slow drops them). Unicode properties come from Python's `unicodedata`, as in
Google's code; HF-fast uses older Unicode tables, so for characters added since (e.g. the Unicode 14
punctuation U+2E53..U+2E5D or marks U+0898..U+089F) it differs from HF-slow and from us.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# Google's CJK ranges (tokenization.py `_is_chinese_char`): the CJK Unified Ideographs blocks and the
# compatibility ideographs. Hangul, Hiragana and Katakana are not in it on purpose: they are written with
# spaces, and are split like any other letters.
CJK_RANGES: tuple[tuple[int, int], ...] = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)

# Character classes after cleaning; computed once per distinct character and cached.
DROP, SPACE, CJK, PUNCT, OTHER = 0, 1, 2, 3, 4


def is_cjk(cp: int) -> bool:
    """Whether the code point is a CJK ideograph by Google's definition."""
    for lo, hi in CJK_RANGES:
        if lo <= cp <= hi:
            return True
    return False


def is_punctuation(ch: str) -> bool:
    """Google's rule: Unicode punctuation (P*), plus all non-alphanumeric printable ASCII, such as ^ $ `."""
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def is_control(ch: str) -> bool:
    """Characters the cleaner removes: categories Cc, Cf, Co and Cs, except tab, newline and carriage return
    (those are whitespace). See the module docstring for how this relates to Google's Cc/Cf."""
    if ch in "\t\n\r":
        return False
    return unicodedata.category(ch) in ("Cc", "Cf", "Co", "Cs")


def is_whitespace(ch: str) -> bool:
    """Whitespace after cleaning. Google maps Zs, tab, CR and LF to a space and then splits with `str.split`,
    which also splits on U+2028/U+2029 -- together exactly `str.isspace` once controls are gone."""
    return ch.isspace()


_KIND: dict[str, int] = {}


def char_kind(ch: str) -> int:
    """DROP, SPACE, CJK, PUNCT or OTHER for one character of the raw text (cached).

    PUNCT here is only a hint for the raw character: punctuation is decided after lowercasing and accent
    stripping, because NFD can turn a symbol into ASCII punctuation (U+2260 NOT EQUAL TO -> '=' + U+0338).
    """
    k = _KIND.get(ch)
    if k is None:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or is_control(ch):
            k = DROP
        elif is_whitespace(ch):
            k = SPACE
        elif is_cjk(cp):
            k = CJK
        elif is_punctuation(ch):
            k = PUNCT
        else:
            k = OTHER
        _KIND[ch] = k
    return k


Chars = list[tuple[str, int]]  # (normalised character, index of the original character it came from)


def _lowercase(token: Chars) -> Chars:
    """Lowercase a whitespace token the way Python's `str.lower` does on the whole token (Google lowercases
    each whitespace token), keeping each character's origin.

    `str.lower` is context-sensitive only for capital sigma (final form at the end of a word), and expands
    only U+0130 (I with dot above -> i + combining dot). When the length is unchanged the mapping is 1:1.
    """
    text = "".join(c for c, _ in token)
    low = text.lower()
    if len(low) == len(text):
        return [(c, i) for c, (_, i) in zip(low, token)]
    out: Chars = []
    for k, (c, i) in enumerate(token):
        if c == "\u03a3":  # capital sigma: its lowercase depends on the neighbours; read it off `low`
            out.append((low[len(text[:k].lower())], i))
        else:
            out.extend((m, i) for m in c.lower())
    return out


def _strip_accents(token: Chars) -> Chars:
    """NFD the token and drop nonspacing marks (Mn), keeping each character's origin.

    NFD is per-character decomposition followed by canonical ordering (a stable sort of each run of
    characters with a nonzero combining class). Marks that survive the Mn filter (a few Mc characters have a
    nonzero class) can be reordered by it, so it is done here too rather than decomposing char by char only.
    """
    if all(c < "\u00c0" for c, _ in token):  # nothing below U+00C0 decomposes: the common, ASCII case
        return token
    dec: list[tuple[str, int, int]] = []
    for c, i in token:
        for d in unicodedata.normalize("NFD", c):
            dec.append((d, i, unicodedata.combining(d)))
    # canonical ordering: sort each run of non-starters by combining class (stable)
    k = 0
    n = len(dec)
    while k < n:
        if dec[k][2] == 0:
            k += 1
            continue
        j = k
        while j < n and dec[j][2] != 0:
            j += 1
        if j - k > 1:
            dec[k:j] = sorted(dec[k:j], key=lambda t: t[2])
        k = j
    return [(d, i) for d, i, _ in dec if unicodedata.category(d) != "Mn"]


def _special_pattern(tokens: Iterable[str]) -> re.Pattern[str] | None:
    # Longest first, so that the regex's leftmost-first alternation is leftmost-longest matching.
    toks = sorted({t for t in tokens if t}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, toks))) if toks else None


class BasicTokenizer:
    """Google's BasicTokenizer: cleaning, CJK splitting, optional lowercasing and accent stripping,
    punctuation splitting, with special tokens kept whole.

    `do_lower_case=True` is the uncased models' setting (lowercase + strip accents); `False` the cased ones'.
    `strip_accents` overrides the accent stripping (None: follow `do_lower_case`, as in Hugging Face).
    `never_split`: strings kept as one word wherever they appear in the raw text (case-sensitive); by default
    BERT's five special tokens.
    """

    def __init__(self, do_lower_case: bool = True, never_split: Iterable[str] | None = None,
                 tokenize_chinese_chars: bool = True, strip_accents: bool | None = None):
        self.do_lower_case = bool(do_lower_case)
        self.never_split = tuple(SPECIAL_TOKENS if never_split is None else never_split)
        self.tokenize_chinese_chars = bool(tokenize_chinese_chars)
        self.strip_accents = self.do_lower_case if strip_accents is None else bool(strip_accents)
        self._special = _special_pattern(self.never_split)

    # -- public API ---------------------------------------------------------------------------------------

    def tokenize(self, text: str) -> list[str]:
        """Normalised words, e.g. "Héllo, World!" -> ['hello', ',', 'world', '!'] (uncased)."""
        return [w for w, _, _ in self.words(text)]

    def tokenize_with_offsets(self, text: str) -> list[tuple[str, int, int]]:
        """(word, start, end) per word; `text[start:end]` is the original span the word came from."""
        return [(w, idx[0], idx[-1] + 1) if not special else (w, idx[0], idx[1])
                for w, idx, special in self.words(text)]

    def words(self, text: str) -> list[tuple[str, list[int], bool]]:
        """(word, origins, is_special) per word.

        For ordinary words `origins[k]` is the index in `text` of the character that produced the word's
        k-th character (several can share one: NFD expands 'ü' in a Korean syllable into 3 jamo). For
        special tokens `origins` is `[start, end]` of the match.
        """
        out: list[tuple[str, list[int], bool]] = []
        pos = 0
        if self._special is not None:
            for m in self._special.finditer(text):
                self._segment(text, pos, m.start(), out)
                out.append((m.group(), [m.start(), m.end()], True))
                pos = m.end()
        self._segment(text, pos, len(text), out)
        return out

    def normalize(self, text: str) -> str:
        """The words joined by single spaces: what `decode(encode(text))` gives back when nothing is [UNK]."""
        return " ".join(self.tokenize(text))

    # -- hooks for the C extension, which asks once per distinct character and for rare hard tokens -----------

    def _char_info(self, cp: int) -> tuple[int, bool, str | None]:
        """(kind, hard, mapping) of one code point for the C extension's table.

        `mapping` is what lowercasing and accent stripping make of the character on its own (None when it
        stays itself). `hard` marks the characters for which that is not enough, because the result depends
        on the neighbours: capital sigma (final form), and decompositions holding a mark that survives the Mn
        filter yet takes part in canonical reordering. Whitespace tokens with a hard character go back to
        `_normalize_token`.
        """
        ch = chr(cp)
        kind = char_kind(ch)
        token: Chars = [(ch, 0)]
        hard = False
        if self.do_lower_case:
            hard = ch == "\u03a3"
            token = [(m, 0) for m in ch.lower()]
        if self.strip_accents:
            for c, _ in token:
                for d in unicodedata.normalize("NFD", c):
                    if unicodedata.combining(d) and unicodedata.category(d) != "Mn":
                        hard = True
            token = _strip_accents(token)
        norm = "".join(c for c, _ in token)
        return kind, hard, (None if norm == ch else norm)

    def _normalize_token(self, token: str) -> tuple[str, list[int]]:
        """Lowercase/strip one whitespace token: the normalised text and, per character, its index in `token`."""
        chars: Chars = [(c, k) for k, c in enumerate(token)]
        if self.do_lower_case:
            chars = _lowercase(chars)
        if self.strip_accents:
            chars = _strip_accents(chars)
        return "".join(c for c, _ in chars), [k for _, k in chars]

    # -- implementation ------------------------------------------------------------------------------------

    def _segment(self, text: str, start: int, stop: int, out: list) -> None:
        """Words of text[start:stop], a stretch without special tokens, appended to `out`."""
        token: Chars = []
        cjk = self.tokenize_chinese_chars
        for i in range(start, stop):
            c = text[i]
            k = _KIND.get(c)
            if k is None:
                k = char_kind(c)
            if k == DROP:
                continue
            if k == SPACE:
                if token:
                    self._finish(token, out)
                    token = []
            elif k == CJK and cjk:
                if token:
                    self._finish(token, out)
                    token = []
                self._finish([(c, i)], out)
            else:
                token.append((c, i))
        if token:
            self._finish(token, out)

    def _finish(self, token: Chars, out: list) -> None:
        """Normalise one whitespace token and split it on punctuation into words."""
        if self.do_lower_case:
            token = _lowercase(token)
        if self.strip_accents:
            token = _strip_accents(token)
        word: list[str] = []
        idx: list[int] = []
        for c, i in token:
            k = _KIND.get(c)
            if k is None:
                k = char_kind(c)
            if k == PUNCT:
                if word:
                    out.append(("".join(word), idx, False))
                    word, idx = [], []
                out.append((c, [i], False))
            else:
                word.append(c)
                idx.append(i)
        if word:
            out.append(("".join(word), idx, False))
