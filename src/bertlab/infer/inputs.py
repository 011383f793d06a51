"""Reading what the inference commands are given, and tokenizing it under the length limit.

Input is one item per line, from a file or stdin: a plain text, or a JSON object (JSON Lines) where a
command needs several fields (a question and a context). Line i of the input is always row i of the
output, so an empty line stays a row (the embedding of an empty text) instead of shifting the rest.

`encode` tokenizes without truncation first, so it knows which texts are over the limit: those are cut
(longest-first for pairs, as the tokenizer does) and counted in one warning naming the first lines, or --
with `on_long="reject"` -- refused with a one-line error naming the first such line.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..core.errors import BertlabError

log = logging.getLogger(__name__)


@dataclass
class Lines:
    """Input lines and where they came from, for messages (`input.txt:17: ...`)."""

    items: list[str]
    source: str

    def where(self, i: int) -> str:
        return f"{self.source}:{i + 1}"


def read_lines(path: str | Path | None) -> Lines:
    """The lines of a UTF-8 file (or stdin for None / '-'), without line ends; an empty input is an error."""
    if path is None or str(path) == "-":
        data, source = sys.stdin.buffer.read(), "<stdin>"
    else:
        p = Path(path)
        if not p.is_file():
            raise BertlabError(f"{p}: no such file")
        data, source = p.read_bytes(), str(p)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    # Split on "\n" only: str.splitlines would also break on form feeds and U+2028 inside a text.
    raw = data.split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()
    items = []
    for i, line in enumerate(raw):
        try:
            items.append(line.decode("utf-8").removesuffix("\r"))
        except UnicodeDecodeError as e:
            raise BertlabError(f"{source}:{i + 1}: not UTF-8 text (byte {line[e.start]:#04x} at column "
                               f"{e.start + 1})") from None
    if not items:
        raise BertlabError(f"{source}: empty input; expected one text per line")
    return Lines(items, source)


def parse_record(line: str, where: str, fields: Sequence[str] = ()) -> dict[str, Any] | str:
    """A JSON object (a line starting with '{') or the plain text itself; `fields` are required keys."""
    if not line.lstrip().startswith("{"):
        if fields:
            raise BertlabError(f"{where}: expected a JSON object with {', '.join(repr(f) for f in fields)}")
        return line
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise BertlabError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(record, dict):
        raise BertlabError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for f in fields:
        if f not in record:
            raise BertlabError(f"{where}: missing field {f!r}")
    return record


@dataclass
class Encoded:
    """Tokenized rows, unpadded: ids, segment ids, and on request character offsets and word indices."""

    input_ids: list[list[int]]
    token_type_ids: list[list[int]]
    offsets: list[list[tuple[int, int]]] | None = None
    word_ids: list[list[int | None]] | None = None
    truncated: list[int] = field(default_factory=list)  # rows cut to the limit

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> list[int]:
        return [len(r) for r in self.input_ids]


def encode(tokenizer, texts: Sequence[str] | Sequence[Sequence[str]], max_length: int, on_long: str = "truncate",
           pairs: Sequence[str] | None = None, offsets: bool = False, words: bool = False,
           split_into_words: bool = False, where=None) -> Encoded:
    """Tokenize `texts` (and `pairs`) into rows of at most `max_length` tokens under the `on_long` policy.
    A None in `pairs` makes that row a single text. `where(i)` names row i in messages (default: `text i+1`)."""
    where = where or (lambda i: f"text {i + 1}")
    if pairs is not None and any(p is None for p in pairs):
        if all(p is None for p in pairs):
            pairs = None
        else:  # one call for the single texts, one for the pairs, merged back in order
            groups = [[i for i, p in enumerate(pairs) if (p is None) == single] for single in (True, False)]
            parts = [encode(tokenizer, [texts[i] for i in g], max_length, on_long,
                            None if single else [pairs[i] for i in g], offsets, words, split_into_words,
                            lambda k, g=g: where(g[k])) for g, single in zip(groups, (True, False))]
            merged = Encoded([None] * len(texts), [None] * len(texts),  # type: ignore[list-item]
                             [None] * len(texts) if offsets else None, [None] * len(texts) if words else None)
            for g, part in zip(groups, parts):
                for k, i in enumerate(g):
                    merged.input_ids[i], merged.token_type_ids[i] = part.input_ids[k], part.token_type_ids[k]
                    if offsets:
                        merged.offsets[i] = part.offsets[k]
                    if words:
                        merged.word_ids[i] = part.word_ids[k]
                merged.truncated += [g[k] for k in part.truncated]
            return merged
    for i, t in enumerate(texts):
        if not isinstance(t, (str, list, tuple)):
            raise BertlabError(f"{where(i)}: expected text, got {type(t).__name__}")
    kwargs = dict(return_offsets_mapping=offsets, return_attention_mask=False,
                  is_split_into_words=split_into_words)
    enc = tokenizer(list(texts), list(pairs) if pairs is not None else None, truncation=False, **kwargs)
    ids, types = enc["input_ids"], enc["token_type_ids"]
    offs = enc["offset_mapping"] if offsets else None
    wids = [enc.word_ids(i) for i in range(len(ids))] if words else None
    long = [i for i, row in enumerate(ids) if len(row) > max_length]
    if long:
        first = ", ".join(where(i) for i in long[:3]) + (", ..." if len(long) > 3 else "")
        if on_long == "reject":
            i = long[0]
            raise BertlabError(f"{where(i)}: {len(ids[i])} tokens, over the limit of {max_length} "
                               f"({len(long)} such text{'s' if len(long) > 1 else ''}; --on-long truncate cuts "
                               "them instead)")
        cut = tokenizer([texts[i] for i in long], [pairs[i] for i in long] if pairs is not None else None,
                        truncation=True, max_length=max_length, **kwargs)
        for k, i in enumerate(long):
            ids[i], types[i] = cut["input_ids"][k], cut["token_type_ids"][k]
            if offs is not None:
                offs[i] = cut["offset_mapping"][k]
            if wids is not None:
                wids[i] = cut.word_ids(k)
        log.warning("%d text%s over %d tokens, truncated: %s", len(long), "s" if len(long) > 1 else "",
                    max_length, first)
    return Encoded(ids, types, offs, wids, long)
