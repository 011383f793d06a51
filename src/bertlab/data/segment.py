"""Word segmenters for whole-word masking of text written without spaces (Chinese).

BERT's tokenizer cuts every CJK ideograph into a word of its own, so Google's whole-word masking (a word and
its ``##`` pieces) never groups Chinese characters: a model learns to guess one character of a word from the
others. Chinese-BERT-wwm (Cui et al. 2019) keeps the character-level vocabulary and inputs and uses a word
segmenter only to decide which characters are masked together. This module supplies that decision:

- a registry of segmenters, name -> a function text -> list of words (``none`` and ``jieba`` built in; a
  user's function plugs in with `register_segmenter("mine", fn)` and is then ``--segmenter mine`` /
  ``CorpusSettings(segmenter="mine")``);
- `word_continues`, a pure function: a sentence, its tokens' character offsets and the tokenizer's own word
  boundaries -> per token, whether it continues the previous token's word. CJK characters follow the
  segmenter's words; every other token keeps the tokenizer's rule (a ``##`` piece continues its word).

`prepare` stores these flags beside the token shards, and masking reads them instead of the vocabulary's
``##`` flags. jieba is an optional dependency (``pip install 'bertlab-paper[zh]'``); it is imported only when the
``jieba`` segmenter is asked for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from ..tokenizer.basic import is_cjk
from .readers import DataError

Segmenter = Callable[[str], list[str]]
NONE = "none"

# name -> a factory that returns the segment function (so an optional package is imported only when used)
_FACTORIES: dict[str, Callable[[], Segmenter]] = {}


class SegmenterError(DataError):
    """An unknown segmenter name, or a segmenter whose package is not installed."""


def register_segmenter(name: str, segment: Segmenter | None = None, *,
                       factory: Callable[[], Segmenter] | None = None) -> None:
    """Make `name` usable as `--segmenter name`: `segment(text) -> words`, or a `factory()` returning one
    (called once per process that segments, e.g. to load a dictionary). Words should be substrings of the
    text in order (jieba's are, spaces included); a word that cannot be found in the text is ignored.

    The name (with `version`, if the function has that attribute) is part of the corpus key: changing what a
    registered function does without renaming it does not invalidate shards already prepared with it."""
    if (segment is None) == (factory is None):
        raise ValueError("give exactly one of segment or factory")
    if not name or name == NONE:
        raise ValueError(f"segmenter name {name!r} is reserved")
    _FACTORIES[name] = factory if factory is not None else (lambda: segment)


def segmenter_names() -> list[str]:
    return [NONE, *sorted(_FACTORIES)]


def get_segmenter(name: str) -> Segmenter | None:
    """The segment function registered as `name`; None for ``none``. `SegmenterError` (one line) for an
    unknown name or a missing optional package."""
    if name == NONE:
        return None
    factory = _FACTORIES.get(name)
    if factory is None:
        raise SegmenterError(f"unknown segmenter {name!r}; expected one of {', '.join(segmenter_names())} "
                             "(register others with bertlab.data.segment.register_segmenter)")
    return factory()


def segmenter_id(name: str) -> dict:
    """What identifies a segmenter's output for the corpus key and the manifest: its name and version."""
    if name == NONE:
        return {"name": NONE}
    segment = get_segmenter(name)
    return {"name": name, "version": str(getattr(segment, "version", ""))}


def _jieba() -> Segmenter:
    try:
        import jieba
    except ImportError:
        raise SegmenterError("the jieba segmenter needs the jieba package: pip install 'bertlab-paper[zh]'") from None
    jieba.setLogLevel(logging.WARNING)  # not "Building prefix dict ..." once per worker process

    def segment(text: str) -> list[str]:
        return jieba.lcut(text)  # precise mode with HMM for unknown words: jieba's default

    segment.version = getattr(jieba, "__version__", "")
    return segment


register_segmenter("jieba", factory=_jieba)


def word_continues(text: str, offsets: Sequence[tuple[int, int]], same_word: Sequence[bool],
                   words: Sequence[str]) -> list[bool]:
    """Per token: does it continue the previous token's word?

    `offsets` are the tokens' (start, end) in `text`; `same_word[i]` is the tokenizer's answer (token i is a
    ``##`` piece of the same basic word as token i - 1); `words` is the segmenter's output for `text`. A token
    that is one CJK character continues when the previous token is a CJK character of the same segmenter
    word; any other token keeps `same_word`. Pure: no state, no randomness."""
    word_of = [-1] * len(text)  # character -> index of the segmenter word holding it
    cursor = 0
    for k, w in enumerate(words):
        at = text.find(w, cursor) if w else -1
        if at < 0:
            continue  # a word the segmenter normalised: its characters stay words of their own
        word_of[at:at + len(w)] = [k] * len(w)
        cursor = at + len(w)
    out: list[bool] = []
    previous = -1  # segmenter word of the previous token when that was a CJK character, else -1
    for (start, end), same in zip(offsets, same_word):
        if end - start == 1 and is_cjk(ord(text[start])):
            w = word_of[start]
            out.append(w >= 0 and w == previous)
            previous = w
        else:
            out.append(bool(same))
            previous = -1
    return out
