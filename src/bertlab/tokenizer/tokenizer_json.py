"""`tokenizer.json`, the `tokenizers` library's format, read as a BERT WordPiece tokenizer.

`transformers` 5.x saves a BERT tokenizer as `tokenizer.json` + `tokenizer_config.json`, without `vocab.txt`;
older versions and the hub's repositories often have both. `read_tokenizer_json` turns the file into what
`BertTokenizer` is built from: the vocabulary in id order and the settings the file fixes.

Only what `BertTokenizer` reproduces exactly is accepted; anything else is one `VocabError` line naming it,
never a tokenizer that silently gives other ids than the file's owner got:
  * model: `WordPiece` with a dense vocabulary (ids 0..n-1), its unk token, `max_input_chars_per_word`, and
    the continuing-subword prefix `##` (BERT's: whole-word masking and decoding rely on it);
  * normalizer: `BertNormalizer` with `clean_text` on; `handle_chinese_chars`, `strip_accents` and
    `lowercase` become `tokenize_chinese_chars`, `strip_accents` and `do_lower_case`;
  * pre-tokenizer: `BertPreTokenizer` (whitespace and punctuation splitting);
  * post-processor: BERT's template (`[CLS] A [SEP]`, `[CLS] A [SEP] B [SEP]`, type ids 0 then 1), as
    `TemplateProcessing` or `BertProcessing`; or, for a tokenizer laid out as RoBERTa's (`pair_seps=2`:
    MPNet's), `<s> A </s>` / `<s> A </s></s> B </s>` as `TemplateProcessing` or `RobertaProcessing` (the type
    ids there are not read: such a model has one token type); its tokens become `cls_token` and `sep_token`;
  * decoder: `WordPiece` with prefix `##`, or none;
  * added tokens: special tokens of the vocabulary, matched as written (not normalised, no stripping but
    `lstrip`: the same ids, the offsets starting at the whitespace before the token, as `tokenizers` gives them
    unless its post-processor trims them), which
    the caller checks are the tokenizer's own special tokens; and the tokens a caller places by id itself
    (`placed`: ColBERT's query and document markers, which PyLate adds after the vocabulary; special or not),
    never looked for in text, accepted only at the ids right after the vocabulary's and appended to it.
`truncation` and `padding` are call-time settings (`transformers` overrides them on every call) and are not
read. The file's size is checked before it is read: a BERT vocabulary's file is a few MB.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .wordpiece import VocabError

TOKENIZER_JSON_NAME = "tokenizer.json"
# transformers 5.24 saves a 30,522-token vocabulary (all-MiniLM-L6-v2's) as 0.7 MB, so Google's multilingual
# one (119,547 tokens) is about 3 MB: 64 MiB leaves room for any real one
MAX_TOKENIZER_JSON_BYTES = 64 * 2**20
CONTINUING_PREFIX = "##"


@dataclass
class TokenizerJson:
    """What a tokenizer.json holds for `BertTokenizer`: tokens in id order, the constructor settings it
    fixes, and the special tokens it matches in raw text."""

    tokens: list[str]
    settings: dict[str, Any] = field(default_factory=dict)
    special_tokens: list[str] = field(default_factory=list)
    placed: list[str] = field(default_factory=list)  # appended to `tokens`, in id order
    # special tokens whose span takes the whitespace before them (`lstrip`), where the post-processor does not trim
    # it off again (RobertaProcessing's trim_offsets does): `BertTokenizer(lstrip_tokens=)` gives those offsets
    lstrip: list[str] = field(default_factory=list)
    trims_offsets: bool = False  # the post-processor trims whitespace off the offsets (RobertaProcessing's)


def read_tokenizer_json(path: str | os.PathLike, placed: Collection[str] = (), pair_seps: int = 1) -> TokenizerJson:
    """Read a tokenizer.json under the rules in this module's docstring; `VocabError` (one line naming the
    file and what it holds) for anything else. `placed`: added tokens the caller inserts by id; `pair_seps`: the
    separators between a pair's texts in the caller's layout (BERT 1, MPNet 2)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_TOKENIZER_JSON_BYTES:
            raise VocabError(f"{path}: {size:,} bytes, over the {MAX_TOKENIZER_JSON_BYTES:,}-byte limit for a "
                             "tokenizer.json (a BERT vocabulary's is a few MB); refused")
        raw = path.read_bytes()
    except OSError as e:
        raise VocabError(f"{path}: cannot read tokenizer file ({e.strerror or e})") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise VocabError(f"{path}: tokenizer file is not valid UTF-8") from None
    except json.JSONDecodeError as e:
        raise VocabError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise VocabError(f"{path}: not a tokenizer.json (expected a JSON object with a 'model' object)")
    out = TokenizerJson(tokens=[])
    _read_model(path, data["model"], out)
    _read_normalizer(path, data.get("normalizer"), out)
    kind = _kind(data.get("pre_tokenizer"))
    if kind != "BertPreTokenizer":
        raise VocabError(f"{path}: pre_tokenizer {kind}; bertlab reproduces only BertPreTokenizer (BERT's)")
    _read_post_processor(path, data.get("post_processor"), out, pair_seps)
    decoder = data.get("decoder")
    if decoder is not None and (_kind(decoder) != "WordPiece" or decoder.get("prefix", "##") != CONTINUING_PREFIX):
        raise VocabError(f"{path}: decoder {_kind(decoder)} (prefix {decoder.get('prefix')!r}); bertlab decodes "
                         "as WordPiece with prefix '##' only")
    _read_added_tokens(path, data.get("added_tokens") or [], out, set(placed))
    return out


def _kind(obj: Any) -> str:
    """An entry's type for messages: its 'type', or 'none' / what it is when it has none."""
    if obj is None:
        return "none"
    if isinstance(obj, dict):
        return str(obj.get("type", "without a type"))
    return type(obj).__name__


def _read_model(path: Path, model: dict, out: TokenizerJson) -> None:
    if model.get("type") != "WordPiece":
        raise VocabError(f"{path}: model type {_kind(model)}; bertlab reads WordPiece tokenizers (BERT's) only")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise VocabError(f"{path}: model.vocab must be a non-empty object of token -> id")
    tokens: list[str | None] = [None] * len(vocab)
    for token, i in vocab.items():
        if type(i) is not int or not 0 <= i < len(tokens) or tokens[i] is not None:
            raise VocabError(f"{path}: token {token!r} has id {i!r}; ids must be 0..{len(tokens) - 1}, each "
                             "used once")
        if not token or "\n" in token or token.endswith("\r"):
            raise VocabError(f"{path}: token {token!r} (id {i}) cannot be a vocabulary line")
        tokens[i] = token
    out.tokens = tokens  # every slot filled: n distinct ids in 0..n-1
    unk = model.get("unk_token", "[UNK]")
    if not isinstance(unk, str) or unk not in vocab:
        raise VocabError(f"{path}: model.unk_token {unk!r} is not in the vocabulary")
    prefix = model.get("continuing_subword_prefix", CONTINUING_PREFIX)
    if prefix != CONTINUING_PREFIX:
        raise VocabError(f"{path}: continuing_subword_prefix {prefix!r}; bertlab's WordPiece uses '##' only")
    chars = model.get("max_input_chars_per_word", 100)
    if type(chars) is not int or chars <= 0:
        raise VocabError(f"{path}: max_input_chars_per_word must be a positive integer, got {chars!r}")
    out.settings.update(unk_token=unk, max_input_chars_per_word=chars)


def _read_normalizer(path: Path, norm: Any, out: TokenizerJson) -> None:
    if _kind(norm) != "BertNormalizer":
        raise VocabError(f"{path}: normalizer {_kind(norm)}; bertlab reproduces only BertNormalizer (BERT's)")
    if norm.get("clean_text", True) is not True:
        raise VocabError(f"{path}: BertNormalizer clean_text {norm.get('clean_text')!r}; bertlab always cleans "
                         "text (drops control characters, maps whitespace to spaces)")
    for key, setting in (("handle_chinese_chars", "tokenize_chinese_chars"), ("lowercase", "do_lower_case")):
        value = norm.get(key, True)
        if not isinstance(value, bool):
            raise VocabError(f"{path}: BertNormalizer {key} must be true or false, got {value!r}")
        out.settings[setting] = value
    strip = norm.get("strip_accents")
    if strip is not None and not isinstance(strip, bool):
        raise VocabError(f"{path}: BertNormalizer strip_accents must be true, false or null, got {strip!r}")
    out.settings["strip_accents"] = strip  # None: follows lowercase, in `tokenizers` as in BertTokenizer


def _special(item: Any, type_id: int) -> str:
    """The token of a TemplateProcessing `SpecialToken` piece with that type id."""
    piece = item.get("SpecialToken") if isinstance(item, dict) else None
    if not isinstance(piece, dict) or piece.get("type_id") != type_id or not isinstance(piece.get("id"), str):
        raise ValueError
    return piece["id"]


def _read_post_processor(path: Path, post: Any, out: TokenizerJson, pair_seps: int) -> None:
    kind = _kind(post)
    vocab = {t: i for i, t in enumerate(out.tokens)}
    try:
        if pair_seps == 2:
            cls_, sep = _roberta_layout(post, kind, vocab, out)
        elif kind == "TemplateProcessing":
            single, pair = post.get("single"), post.get("pair")
            cls_, sep = _special(single[0], 0), _special(single[2], 0)
            if (len(single) != 3 or single[1] != {"Sequence": {"id": "A", "type_id": 0}} or len(pair) != 5
                    or pair[:3] != single or pair[3] != {"Sequence": {"id": "B", "type_id": 1}}
                    or _special(pair[4], 1) != sep):
                raise ValueError
            for token in (cls_, sep):
                if post["special_tokens"][token]["ids"] != [vocab.get(token)]:
                    raise ValueError
        elif kind == "BertProcessing":
            (sep, sep_id), (cls_, cls_id) = post["sep"], post["cls"]
            if [sep_id, cls_id] != [vocab.get(sep), vocab.get(cls_)]:
                raise ValueError
        else:
            raise ValueError
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        if pair_seps == 2:
            raise VocabError(f"{path}: post_processor {kind} is not <s> A </s> / <s> A </s></s> B </s> with tokens "
                             "of this vocabulary; bertlab builds only that for this model") from None
        raise VocabError(f"{path}: post_processor {kind} is not BERT's template ([CLS] A [SEP] / [CLS] A [SEP] "
                         "B [SEP], type ids 0 then 1, with tokens of this vocabulary); bertlab builds only "
                         "that") from None
    out.settings.update(cls_token=cls_, sep_token=sep)


def _roberta_layout(post: Any, kind: str | None, vocab: dict[str, int], out: TokenizerJson) -> tuple[str, str]:
    """The (cls, sep) tokens of `<s> A </s>` / `<s> A </s></s> B </s>`, or ValueError."""
    if kind == "RobertaProcessing":
        (sep, sep_id), (cls_, cls_id) = post["sep"], post["cls"]
        if [sep_id, cls_id] != [vocab.get(sep), vocab.get(cls_)]:
            raise ValueError
        out.trims_offsets = bool(post.get("trim_offsets", True))
        return cls_, sep
    if kind != "TemplateProcessing":
        raise ValueError
    single, pair = post.get("single"), post.get("pair")
    token = lambda item: (item.get("SpecialToken") or {})["id"]  # noqa: E731 (a KeyError when not one)
    cls_, sep = token(single[0]), token(single[2])
    text = lambda item: (item.get("Sequence") or {})["id"]  # noqa: E731
    if (len(single) != 3 or text(single[1]) != "A" or len(pair) != 6 or token(pair[0]) != cls_
            or text(pair[1]) != "A" or [token(pair[i]) for i in (2, 3, 5)] != [sep] * 3 or text(pair[4]) != "B"):
        raise ValueError
    for t in (cls_, sep):
        if post["special_tokens"][t]["ids"] != [vocab.get(t)]:
            raise ValueError
    return cls_, sep


def _read_added_tokens(path: Path, added: Any, out: TokenizerJson, placed: set[str]) -> None:
    if not isinstance(added, list):
        raise VocabError(f"{path}: added_tokens must be a list")
    vocab = {t: i for i, t in enumerate(out.tokens)}
    for entry in sorted((e for e in added if isinstance(e, dict)), key=lambda e: e["id"] if isinstance(e.get("id"), int) else -1):
        content = entry.get("content")
        if content in placed and content not in vocab:  # special or not: it is inserted by id, never matched
            if entry.get("id") != len(out.tokens):
                raise VocabError(f"{path}: added token {content!r} has id {entry.get('id')!r}; it must follow the "
                                 f"vocabulary (id {len(out.tokens)})")
            vocab[content] = len(out.tokens)
            out.tokens.append(content)
            out.placed.append(content)
    for entry in added:
        entry = entry if isinstance(entry, dict) else {}
        content = entry.get("content")
        if content in out.placed:
            continue
        if not isinstance(content, str) or content not in vocab or entry.get("id") != vocab[content]:
            raise VocabError(f"{path}: added token {content!r} (id {entry.get('id')!r}) is not that id of the "
                             "WordPiece vocabulary; bertlab does not add tokens")
        if not entry.get("special"):
            raise VocabError(f"{path}: added token {content!r} is not a special token; bertlab matches only its "
                             "special tokens ([CLS], [SEP], ...) in text")
        flags = [k for k in ("normalized", "rstrip", "single_word") if entry.get(k)]
        if flags:
            raise VocabError(f"{path}: added token {content!r} has {', '.join(flags)}; bertlab matches special "
                             "tokens exactly as written")
        out.special_tokens.append(content)
        if entry.get("lstrip") and not out.trims_offsets:
            out.lstrip.append(content)
