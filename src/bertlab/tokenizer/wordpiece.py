"""WordPiece: a word -> vocabulary pieces, greedy longest-match-first; and reading/writing `vocab.txt`.

The algorithm is Google's (tokenization.py `WordpieceTokenizer`): from the start of the word take the
longest prefix in the vocabulary, then the longest `##`-prefixed continuation from where that ended, and so
on. If some position has no match, or the word is longer than `max_input_chars_per_word` (100) characters,
the whole word becomes [UNK] -- not just the unmatched part.

A vocabulary file has one token per line; the line number (from 0) is the id. Duplicates or a missing [UNK]
are errors with the file and line in the message, because they silently shift or break every id after them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..core.errors import BertlabError


class VocabError(BertlabError, ValueError):
    """A vocabulary file is unreadable, has a duplicate or empty line, or lacks a required token."""


def read_vocab(path: str | os.PathLike) -> list[str]:
    """Read a vocab.txt: the tokens in id order. The project's one vocabulary reader.

    Lines end at "\\n" only (a "\\r" before it is dropped): never `str.splitlines()`, which also breaks on
    U+2028, U+2029, U+0085, U+000B, U+000C and U+001C..U+001E -- and Google's Chinese vocabulary has U+2028
    as a token (id 343), which would shift every later id by one. Raises `VocabError` naming file and line
    for unreadable or non-UTF-8 files, empty lines and duplicates."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise VocabError(f"{path}: cannot read vocabulary file ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise VocabError(f"{path}:{line}: vocabulary file is not valid UTF-8") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":  # the final newline ends the last line; it does not start an empty one
        lines.pop()
    tokens: list[str] = []
    first: dict[str, int] = {}
    for i, line in enumerate(lines):
        token = line[:-1] if line.endswith("\r") else line  # tolerate Windows line ends
        if not token:
            raise VocabError(f"{path}:{i + 1}: empty line in vocabulary file (every line must hold one token)")
        seen = first.setdefault(token, i)
        if seen != i:
            raise VocabError(f"{path}:{i + 1}: duplicate token {token!r} (first on line {seen + 1})")
        tokens.append(token)
    if not tokens:
        raise VocabError(f"{path}: vocabulary file is empty")
    return tokens


def load_vocab(path: str | os.PathLike, required: Iterable[str] = ("[UNK]",)) -> dict[str, int]:
    """Read a vocab.txt: token -> id (its line number from 0), by `read_vocab`'s rules; `required` tokens
    must be present. Raises `VocabError` naming file and line."""
    tokens = read_vocab(path)
    vocab = {t: i for i, t in enumerate(tokens)}
    for tok in required:
        if tok not in vocab:
            raise VocabError(f"{path}:{len(tokens)}: no line holds the {tok} token, which is required")
    return vocab


def save_vocab(vocab: Mapping[str, int] | list[str], path: str | os.PathLike) -> Path:
    """Write tokens in id order, one per line. `vocab` is a token -> id mapping or a list of tokens."""
    tokens = list(vocab) if isinstance(vocab, list) else [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    os.replace(tmp, path)
    return path


class WordPiece:
    """Greedy longest-match-first segmentation of one (already normalised) word into vocabulary ids."""

    def __init__(self, vocab: Mapping[str, int], unk_token: str = "[UNK]", max_input_chars_per_word: int = 100,
                 continuing_prefix: str = "##"):
        self.vocab = vocab
        self.unk_token = unk_token
        self.unk_id = vocab[unk_token]
        self.max_input_chars_per_word = max_input_chars_per_word
        self.prefix = continuing_prefix
        # No piece is longer than the longest token, so matching never needs to try longer substrings.
        self._max_len = max((len(t) for t in vocab), default=1)
        self._cache: dict[str, list[tuple[int, int, int]]] = {}

    def pieces(self, word: str) -> list[tuple[int, int, int]]:
        """(id, start, end) per piece, `start:end` indexing characters of `word`; [UNK] spans the word."""
        hit = self._cache.get(word)
        if hit is not None:
            return hit
        res = self._pieces(word)
        if len(self._cache) >= 200_000:  # bounded memory on corpus-scale runs; Zipf makes refills cheap
            self._cache.clear()
        self._cache[word] = res
        return res

    def _pieces(self, word: str) -> list[tuple[int, int, int]]:
        n = len(word)
        if n > self.max_input_chars_per_word:
            return [(self.unk_id, 0, n)]
        vocab, prefix = self.vocab, self.prefix
        out: list[tuple[int, int, int]] = []
        start = 0
        while start < n:
            end = min(n, start + self._max_len)
            found = None
            while start < end:
                sub = word[start:end]
                if start > 0:
                    sub = prefix + sub
                found = vocab.get(sub)
                if found is not None:
                    break
                end -= 1
            if found is None:
                return [(self.unk_id, 0, n)]
            out.append((found, start, end))
            start = end
        return out

    def tokenize(self, word: str) -> list[str]:
        """The pieces as strings, e.g. 'unaffable' -> ['un', '##aff', '##able']."""
        if not word:
            return []
        res = self.pieces(word)
        if len(res) == 1 and res[0][0] == self.unk_id and word != self.unk_token:
            return [self.unk_token]
        return [word[s:e] if s == 0 else self.prefix + word[s:e] for _, s, e in res]
