"""Readers: corpus files -> documents (lists of sentences), with optional C4-style cleaning.

BERT's next-sentence task needs two things from the raw text: sentence boundaries (segments are built from
whole sentences) and document boundaries (a "random next" segment must come from another document). Every
reader here therefore yields `Document`s -- a list of sentence strings plus where it came from.

Input formats (`--format`, chosen per file by `detect_format` when `auto`):

- ``google``: Google's `create_pretraining_data.py` format. One sentence per line; one or more blank lines
  end a document. (Lines are taken as sentences as they are; Google's sample text has a few lines holding
  two sentences and that is how Google trained on it.)
- ``plain``: ordinary prose. A file is one document; lines are joined into paragraphs (so hard-wrapped text
  works), blank lines separate paragraphs, and each paragraph is cut into sentences by `split_sentences`,
  a small rule-based splitter.
- ``jsonl``: JSON Lines; each line is an object whose ``text`` field (see `ReaderConfig.text_field`) is one
  document. Newlines inside the text separate paragraphs, which are split into sentences.
- ``wikitext``: WikiText-2/103 raw files. A heading line `` = Title = `` starts a document; sub-headings
  (`` = = Section = = ``) are structure, not sentences, and are skipped; paragraph lines are split into
  sentences. WikiText's escapes for in-word hyphens and number separators (`` @-@ ``, `` @,@ ``,
  `` @.@ ``) are undone so that WordPiece sees "1,000" and "well-known" the way ordinary text has them.

`auto` picks `jsonl` for ``.jsonl``/``.json``/``.ndjson`` names, `wikitext` when the first 64 KiB hold a
`` = Title = `` line, and `google` otherwise (`plain` is never guessed: choose it explicitly).
Files ending in ``.gz`` are decompressed on the fly.

Bad input never stops a run half-way: every oddity is counted in a `ReadReport` (with the first few
`file:line` places), and only problems that leave nothing to work with are errors (`DataError`):
a missing path, or -- checked by the caller -- no text at all. With `ReaderConfig.strict` the first
oddity is raised instead. The oddities:

- a file that is empty, or has only blank lines;
- a binary file (a NUL byte in its first 8 KiB), e.g. a stray image in a corpus directory: skipped;
- bytes that are not UTF-8: decoded with U+FFFD replacement characters (which the tokenizer's cleaning
  step removes), counted per line;
- a line longer than `max_line_bytes` (a 50 MB line with no newline is not a sentence): read in pieces cut
  at whitespace, each piece split into sentences, so memory stays bounded;
- a document longer than `max_document_chars`: cut into several documents, again to bound memory;
- JSON Lines: a line that is not a JSON object, or has no string `text` field: skipped.

Cleaning (`CleaningConfig`, all off by default; `CleaningConfig.c4()` turns on the C4 recipe of Raffel et
al. 2019, section 2.2) drops lines, sentences or whole documents and counts each drop by reason.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterable, Iterator

import numpy as np

from ..core.errors import DataError

CORPUS_FORMATS = ("auto", "google", "plain", "jsonl", "wikitext")


# ---------------------------------------------------------------------------------------------- configs
@dataclass(frozen=True)
class CleaningConfig:
    """C4-style filters (Raffel et al. 2019, sec. 2.2). Line filters apply to a line of the input (a
    sentence in Google's format, a paragraph otherwise) before it is split into sentences."""

    terminal_punctuation: bool = False  # keep only lines ending in . ! ? or a closing quote
    drop_javascript: bool = False  # drop lines mentioning "javascript" (cookie/JS warnings)
    drop_lorem_ipsum: bool = False  # drop documents containing "lorem ipsum" (placeholder text)
    drop_curly_braces: bool = False  # drop documents containing { or } (code, not prose)
    dedupe_spans: bool = False  # keep only the first occurrence of any three-sentence span
    min_words_per_line: int = 0  # drop lines with fewer words
    min_sentences_per_document: int = 0  # drop documents left with fewer sentences
    # Memory for span de-duplication: a Bloom filter of this many bytes, so memory stays fixed however large
    # the corpus; 16 MiB keeps false positives (a unique span dropped as a repeat) under 1e-4 up to ~10M spans.
    dedupe_filter_bytes: int = 16 << 20

    @classmethod
    def c4(cls) -> "CleaningConfig":
        return cls(terminal_punctuation=True, drop_javascript=True, drop_lorem_ipsum=True,
                   drop_curly_braces=True, dedupe_spans=True, min_words_per_line=5,
                   min_sentences_per_document=3)

    @property
    def enabled(self) -> bool:
        return any((self.terminal_punctuation, self.drop_javascript, self.drop_lorem_ipsum,
                    self.drop_curly_braces, self.dedupe_spans, self.min_words_per_line > 0,
                    self.min_sentences_per_document > 0))


@dataclass(frozen=True)
class ReaderConfig:
    format: str = "auto"
    text_field: str = "text"  # JSON Lines
    cleaning: CleaningConfig = field(default_factory=CleaningConfig)
    max_line_bytes: int = 256 << 10
    max_document_chars: int = 1_000_000
    strict: bool = False  # raise on the first oddity instead of counting it

    def __post_init__(self) -> None:
        if self.format not in CORPUS_FORMATS:
            raise DataError(f"unknown corpus format {self.format!r}; expected one of {', '.join(CORPUS_FORMATS)}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class Document:
    sentences: list[str]
    source: str  # "file:line" where the document starts, for messages

    @property
    def chars(self) -> int:
        return sum(len(s) for s in self.sentences)


# ---------------------------------------------------------------------------------------------- report
MAX_EXAMPLES = 3


@dataclass
class ReadReport:
    """What was read, and what was dropped or repaired and why (counts plus a few `file:line` examples)."""

    files: int = 0
    documents: int = 0
    sentences: int = 0
    warnings: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)
    examples: dict = field(default_factory=dict)
    strict: bool = False

    def warn(self, kind: str, where: str, n: int = 1) -> None:
        if self.strict:
            raise DataError(f"{where}: {kind}")
        self.warnings[kind] += n
        self._example(kind, where)

    def drop(self, reason: str, where: str | None = None, n: int = 1) -> None:
        self.dropped[reason] += n
        if where:
            self._example(reason, where)

    def _example(self, kind: str, where: str) -> None:
        places = self.examples.setdefault(kind, [])
        if len(places) < MAX_EXAMPLES:
            places.append(where)

    def to_dict(self) -> dict:
        return {"files": self.files, "documents": self.documents, "sentences": self.sentences,
                "warnings": dict(sorted(self.warnings.items())), "dropped": dict(sorted(self.dropped.items())),
                "examples": {k: v for k, v in sorted(self.examples.items())}}

    def summary_lines(self) -> list[str]:
        lines = [f"read {self.files} file(s): {self.documents} documents, {self.sentences} sentences"]
        for title, counts in (("warning", self.warnings), ("dropped", self.dropped)):
            for kind, n in sorted(counts.items()):
                where = ", ".join(self.examples.get(kind, []))
                lines.append(f"  {title}: {kind}: {n}" + (f" (e.g. {where})" if where else ""))
        return lines


# ---------------------------------------------------------------------------------------------- sentence splitter
# Lower-cased words that a period does not end a sentence after. Single letters (initials: "H. americanus",
# "J. R. R. Tolkien") are handled by rule, not listed.
ABBREVIATIONS = frozenset("""
mr mrs ms dr prof sr jr st mt ft vs etc e.g i.e cf al approx ca inc ltd co corp bros dept est gen gov lt col
sgt capt cmdr adm maj rev hon pres sen rep no nos vol vols fig figs pp ed eds jan feb mar apr jun jul aug sep
sept oct nov dec u.s u.k u.n a.m p.m ph.d b.a m.a d.c n.y l.a viz op
""".split())

# A candidate boundary: terminal punctuation, optional closing quotes/brackets, whitespace, then something
# that can start a sentence (an upper-case letter or digit, possibly after an opening quote or bracket).
# Requiring the capital keeps "e.g. the" and "3.5 m" together; the price is missing the rare sentence that
# starts in lower case.
_BOUNDARY = re.compile(r"([.!?\u2026]+)([\"'\u201d\u2019)\]]*)(\s+)(?=[\"'\u201c\u2018(\[]?[A-Z0-9\u00C0-\u024F])")
_WORD_BEFORE = re.compile(r"(\S+)$")


def split_sentences(text: str) -> list[str]:
    """Cut a paragraph into sentences by rule: after . ! ? (and closing quotes) when the next word starts
    with a capital or digit, unless the period ends a known abbreviation or an initial."""
    text = text.strip()
    if not text:
        return []
    sentences = []
    start = 0
    for m in _BOUNDARY.finditer(text):
        if m.group(1) == ".":
            before = _WORD_BEFORE.search(text, start, m.start(1))
            word = before.group(1).lstrip("\"'(\u201c\u2018[").lower() if before else ""
            # "H." (an initial) or "Mr." / "e.g." (an abbreviation): the sentence goes on.
            if (len(word) == 1 and word.isalpha()) or word in ABBREVIATIONS:
                continue
        end = m.end(2)
        sentence = text[start:end].strip()
        if sentence:
            sentences.append(sentence)
        start = m.end(3)
    rest = text[start:].strip()
    if rest:
        sentences.append(rest)
    return sentences


# ---------------------------------------------------------------------------------------------- files
_COMPRESSED_OR_BINARY = {".zip", ".bz2", ".xz", ".zst", ".7z", ".tar", ".tgz", ".png", ".jpg", ".jpeg", ".gif",
                         ".pdf", ".bin", ".npy", ".npz", ".pt", ".pth", ".safetensors", ".parquet", ".arrow"}


def expand_inputs(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Files named, plus the files under directories named (recursively, sorted, hidden names skipped)."""
    files: list[Path] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(f for f in path.rglob("*")
                           if f.is_file() and not any(part.startswith(".") for part in f.relative_to(path).parts))
            files.extend(found)
        elif path.is_file():
            files.append(path)
        elif path.exists():
            raise DataError(f"{path}: not a regular file or directory")
        else:
            raise DataError(f"{path}: no such file or directory")
    if not files:
        raise DataError(f"no input files found in {', '.join(str(p) for p in paths) or '(nothing given)'}")
    return files


def _open_binary(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _base_suffix(path: Path) -> str:
    return Path(path.stem).suffix.lower() if path.suffix == ".gz" else path.suffix.lower()


_WIKITEXT_TITLE = re.compile(r"^ = [^=].* = $")


def detect_format(path: Path, head: bytes) -> str:
    if _base_suffix(path) in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    text = head.decode("utf-8", errors="replace")
    if any(_WIKITEXT_TITLE.match(line) for line in text.splitlines()[:2000]):
        return "wikitext"
    return "google"


def _iter_lines(f: IO[bytes], where: str, report: ReadReport,
                max_line_bytes: int) -> Iterator[tuple[int, str, bool]]:
    """(line number, text, is_piece) for each line, decoded as UTF-8 (bad bytes replaced and counted).

    A line longer than `max_line_bytes` comes out in pieces cut at whitespace (`is_piece` True), each with
    the line's number, so that a 50 MB line never sits in memory whole."""
    lineno = 0
    while True:
        raw = f.readline(max_line_bytes)
        if not raw:
            return
        lineno += 1
        if raw.endswith(b"\n") or len(raw) < max_line_bytes:
            yield lineno, _decode(raw, where, lineno, report), False
            continue
        report.warn("line longer than the limit, read in pieces", f"{where}:{lineno}")
        buf = raw
        while True:
            while len(buf) >= max_line_bytes and not buf.endswith(b"\n"):
                cut = _cut_point(buf, max_line_bytes)
                yield lineno, _decode(buf[:cut], where, lineno, report), True
                buf = buf[cut:]
            if buf.endswith(b"\n"):
                yield lineno, _decode(buf, where, lineno, report), True
                break
            more = f.readline(max_line_bytes)
            if not more:
                if buf:
                    yield lineno, _decode(buf, where, lineno, report), True
                break
            buf += more


def _cut_point(buf: bytes, limit: int) -> int:
    """Where to cut an over-long line: after the last blank within `limit` bytes, else at a UTF-8 character
    boundary (continuation bytes are 0b10xxxxxx), so no character is split in two."""
    cut = max(buf.rfind(b" ", 0, limit), buf.rfind(b"\t", 0, limit)) + 1
    if cut <= 0:
        cut = min(limit, len(buf)) - 1  # the byte at `cut` starts the remainder: move it off a continuation
        while cut > 1 and (buf[cut] & 0xC0) == 0x80:
            cut -= 1
    return cut


def _decode(raw: bytes, where: str, lineno: int, report: ReadReport) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        report.warn("bytes that are not UTF-8, replaced", f"{where}:{lineno}")
        return raw.decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------------------------- cleaning
_TERMINAL = (".", "!", "?", '"', "\u201d", "'", "\u2019")


class Cleaner:
    """Applies a `CleaningConfig`; holds the Bloom filter used for span de-duplication."""

    def __init__(self, config: CleaningConfig, report: ReadReport):
        self.config = config
        self.report = report
        self._bits = np.zeros(config.dedupe_filter_bytes, dtype=np.uint8) if config.dedupe_spans else None

    def keep_line(self, line: str, where: str) -> bool:
        c = self.config
        if c.terminal_punctuation and not line.rstrip().endswith(_TERMINAL):
            self.report.drop("line: no terminal punctuation")
            return False
        if c.drop_javascript and "javascript" in line.lower():
            self.report.drop("line: mentions javascript", where)
            return False
        if c.min_words_per_line and len(line.split()) < c.min_words_per_line:
            self.report.drop(f"line: fewer than {c.min_words_per_line} words")
            return False
        return True

    def keep_document(self, doc: Document) -> bool:
        c = self.config
        if c.drop_lorem_ipsum or c.drop_curly_braces:
            for s in doc.sentences:
                if c.drop_lorem_ipsum and "lorem ipsum" in s.lower():
                    self.report.drop("document: lorem ipsum", doc.source)
                    return False
                if c.drop_curly_braces and ("{" in s or "}" in s):
                    self.report.drop("document: curly braces", doc.source)
                    return False
        if c.dedupe_spans:
            doc.sentences = self._dedupe(doc.sentences)
        if len(doc.sentences) < max(c.min_sentences_per_document, 1):
            if doc.sentences:
                self.report.drop(f"document: fewer than {c.min_sentences_per_document} sentences", doc.source)
            return False
        return True

    def _dedupe(self, sentences: list[str]) -> list[str]:
        """C4: "we discarded all but one of any three-sentence span occurring more than once in the data set".
        The first occurrence is kept; the sentences of every later occurrence are dropped."""
        if len(sentences) < 3:
            return sentences
        assert self._bits is not None
        nbits = self._bits.size * 8
        drop = [False] * len(sentences)
        for i in range(len(sentences) - 2):
            digest = hashlib.blake2b("\n".join(sentences[i:i + 3]).encode("utf-8"), digest_size=16).digest()
            # Three probes from one 128-bit hash (Kirsch-Mitzenmacher double hashing).
            h1, h2 = int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:], "little") | 1
            probes = [(h1 + k * h2) % nbits for k in range(3)]
            if all(self._bits[p >> 3] & (1 << (p & 7)) for p in probes):
                drop[i] = drop[i + 1] = drop[i + 2] = True
            else:
                for p in probes:
                    self._bits[p >> 3] |= 1 << (p & 7)
        n = sum(drop)
        if n:
            self.report.drop("sentence: in a repeated three-sentence span", n=n)
        return [s for s, d in zip(sentences, drop) if not d]


# ---------------------------------------------------------------------------------------------- readers
_WIKITEXT_ESCAPES = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."))


def _unescape_wikitext(line: str) -> str:
    for escaped, plain in _WIKITEXT_ESCAPES:
        line = line.replace(escaped, plain)
    return line


class _DocumentBuilder:
    """Collects sentences into documents and cuts documents that grow past the size limit."""

    def __init__(self, config: ReaderConfig, report: ReadReport, cleaner: Cleaner | None):
        self.config, self.report, self.cleaner = config, report, cleaner
        self.sentences: list[str] = []
        self.chars = 0
        self.source = ""

    def add(self, sentence: str, where: str) -> Iterator[Document]:
        if not self.sentences:
            self.source = where
        self.sentences.append(sentence)
        self.chars += len(sentence)
        if self.chars >= self.config.max_document_chars:
            self.report.warn("document longer than the limit, cut into several", where)
            yield from self.end()

    def end(self) -> Iterator[Document]:
        if self.sentences:
            doc = Document(self.sentences, self.source)
            self.sentences, self.chars = [], 0
            if self.cleaner is None or self.cleaner.keep_document(doc):
                self.report.documents += 1
                self.report.sentences += len(doc.sentences)
                yield doc


def read_documents(paths: Iterable[str | os.PathLike], config: ReaderConfig | None = None,
                   report: ReadReport | None = None) -> Iterator[Document]:
    """Documents from every file under `paths`, in sorted file order. Streaming: holds one document."""
    config = config or ReaderConfig()
    report = report if report is not None else ReadReport(strict=config.strict)
    # One cleaner for the whole run: repeated spans are looked for across files, not just within one.
    cleaner = Cleaner(config.cleaning, report) if config.cleaning.enabled else None
    for path in expand_inputs(paths):
        yield from read_file(path, config, report, cleaner)


def read_file(path: Path, config: ReaderConfig, report: ReadReport,
              cleaner: Cleaner | None = None) -> Iterator[Document]:
    path = Path(path)
    report.files += 1
    if path.suffix.lower() in _COMPRESSED_OR_BINARY:
        report.warn("not a text file (by its name), skipped", str(path))
        return
    try:
        f = _open_binary(path)
        head = f.read(65536)
        f.seek(0)
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
    with f:
        if not head:
            report.warn("empty file", str(path))
            return
        if b"\x00" in head[:8192]:
            report.warn("binary file (NUL bytes), skipped", str(path))
            return
        fmt = config.format if config.format != "auto" else detect_format(path, head)
        before = report.documents
        try:
            yield from _READERS[fmt](f, str(path), config, report, cleaner)
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            raise DataError(f"{path}: read failed ({e})") from None
        if report.documents == before:
            report.warn("no documents in file (only blank lines, or all dropped)", str(path))


def _lines(f, where, config, report):
    return _iter_lines(f, where, report, config.max_line_bytes)


def _read_google(f, where, config, report, cleaner) -> Iterator[Document]:
    builder = _DocumentBuilder(config, report, cleaner)
    for lineno, line, piece in _lines(f, where, config, report):
        line = line.strip()
        if not line:
            if not piece:  # a blank line ends the document
                yield from builder.end()
            continue
        if cleaner and not cleaner.keep_line(line, f"{where}:{lineno}"):
            continue
        # A line is a sentence -- except the pieces of an over-long line, which get the sentence splitter.
        for sentence in (split_sentences(line) if piece else [line]):
            yield from builder.add(sentence, f"{where}:{lineno}")
    yield from builder.end()


def _read_plain(f, where, config, report, cleaner) -> Iterator[Document]:
    builder = _DocumentBuilder(config, report, cleaner)
    paragraph: list[str] = []
    para_chars = para_line = 0

    def flush():
        nonlocal para_chars
        text = " ".join(paragraph)
        paragraph.clear()
        para_chars = 0
        if text and (cleaner is None or cleaner.keep_line(text, f"{where}:{para_line}")):
            for sentence in split_sentences(text):
                yield from builder.add(sentence, f"{where}:{para_line}")

    for lineno, line, _ in _lines(f, where, config, report):
        line = line.strip()
        if not line:
            yield from flush()
            continue
        if not paragraph:
            para_line = lineno
        paragraph.append(line)
        para_chars += len(line)
        # Bound the paragraph too: an enormous paragraph is split where it stands.
        if para_chars >= config.max_line_bytes:
            yield from flush()
    yield from flush()
    yield from builder.end()


def _read_wikitext(f, where, config, report, cleaner) -> Iterator[Document]:
    builder = _DocumentBuilder(config, report, cleaner)
    for lineno, line, _ in _lines(f, where, config, report):
        if _WIKITEXT_TITLE.match(line.rstrip("\n")):
            yield from builder.end()  # a new article
            continue
        line = line.strip()
        if not line or (line.startswith("= ") and line.endswith(" =")):
            continue  # blank, or a section heading
        line = _unescape_wikitext(line)
        if cleaner and not cleaner.keep_line(line, f"{where}:{lineno}"):
            continue
        for sentence in split_sentences(line):
            yield from builder.add(sentence, f"{where}:{lineno}")
    yield from builder.end()


def _read_jsonl(f, where, config, report, cleaner) -> Iterator[Document]:
    builder = _DocumentBuilder(config, report, cleaner)
    skipped = 0
    for lineno, line, piece in _lines(f, where, config, report):
        at = f"{where}:{lineno}"
        if piece:  # a piece of an over-long line is not parseable on its own: the line is skipped
            if lineno != skipped:
                report.warn("JSON Lines: line longer than the limit, skipped", at)
                skipped = lineno
            continue
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            report.warn("JSON Lines: not valid JSON, skipped", f"{at} ({e.msg})")
            continue
        text = obj.get(config.text_field) if isinstance(obj, dict) else None
        if not isinstance(text, str):
            report.warn(f"JSON Lines: no string field {config.text_field!r}, skipped", at)
            continue
        for paragraph in io.StringIO(text):
            paragraph = paragraph.strip()
            if not paragraph or (cleaner and not cleaner.keep_line(paragraph, at)):
                continue
            for sentence in split_sentences(paragraph):
                yield from builder.add(sentence, at)
        yield from builder.end()
    yield from builder.end()


_READERS = {"google": _read_google, "plain": _read_plain, "wikitext": _read_wikitext, "jsonl": _read_jsonl}
