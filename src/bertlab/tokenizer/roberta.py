"""`RobertaTokenizer`: RoBERTa's byte-level BPE (`bpe.py`) with RoBERTa's special tokens and input layout.

The call surface is `BertTokenizer`'s (`TokenizerBase`): `tok(texts, pairs, truncation=..., max_length=...,
padding=..., return_offsets_mapping=True, return_tensors=...)`, `encode`, `decode`, `encode_corpus`,
`from_pretrained` / `save_pretrained`, the special-token attributes. Ids, offsets, word ids and sequence
ids are those of `transformers`' RobertaTokenizerFast (tests/test_bpe_tokenizer.py compares them on
WikiText-2, SQuAD and CoNLL-2003 text):

- `<s> A </s>` and `<s> A </s></s> B </s>`; token type ids are all 0 (RoBERTa has one type). They are
  returned by default, as `BertTokenizer` does, so callers can feed either model; RobertaTokenizerFast
  leaves them out unless asked;
- the special tokens `<s> <pad> </s> <unk> <mask>` are matched whole in the text (leftmost, longest);
  `<mask>` takes the whitespace before it (`mask_lstrip`, RoBERTa's AddedToken(lstrip=True), so
  "a <mask>" is `a`, `<mask>` rather than `a`, `Ġ`, `<mask>`). `transformers` 5 builds a tokenizer from
  bare vocab.json + merges.txt without that flag; files that say so (tokenizer.json's added_tokens,
  tokenizer_config.json's added_tokens_decoder) are followed either way;
- longest_first on a pair splits the budget as the `tokenizers` library does (the shorter text kept whole
  when it fits in half, else halves with the odd token to the second), not as BertTokenizer's Google rule;
- `is_split_into_words=True` needs `add_prefix_space=True`, as in `transformers`.

Files: vocab.json + merges.txt (with tokenizer_config.json / special_tokens_map.json when present), or a
tokenizer.json alone; a folder with both is checked for agreement. tokenizer.json settings that the code
cannot reproduce exactly (a normalizer, another pre-tokenizer or post-processor, BPE dropout, added tokens
that are not RoBERTa's specials, ...) are refused in one line naming the file.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .bpe import BPE, WHITESPACE, BPEError, decode_pieces
from .base import (SPECIAL_TOKENS_MAP_NAME, TOKENIZER_CONFIG_NAME, Seq, TokenizerBase, TokenizerError, _as_int_list,
                   _clean_up, _fast_module, check_fits_model, new_seq)
from .tokenizer_json import MAX_TOKENIZER_JSON_BYTES, TOKENIZER_JSON_NAME, _kind

VOCAB_JSON_NAME = "vocab.json"
MERGES_NAME = "merges.txt"
# RoBERTa's vocab.json is 0.9 MB and merges.txt 0.5 MB for 50,265 tokens: 64 MiB leaves room for any real one
MAX_VOCAB_FILE_BYTES = 64 * 2**20
_WHITESPACE_CHARS = "".join(map(chr, sorted(WHITESPACE)))
SPECIAL_NAMES = ("bos", "eos", "sep", "cls", "unk", "pad", "mask")
ROBERTA_SPECIALS = {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "cls_token": "<s>",
                    "unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "<mask>"}


class RobertaTokenizer(TokenizerBase):
    """RoBERTa's byte-level BPE tokenizer with Hugging Face's calling conventions.

    `RobertaTokenizer(vocab_file, merges_file)` or `RobertaTokenizer.from_pretrained(dir_or_tokenizer_json)`.
    """

    PAIR_SEPS = 2
    TYPE_B = 0
    do_lower_case = False

    def __init__(self, vocab_file: str | os.PathLike | None = None, merges_file: str | os.PathLike | None = None, *,
                 vocab: Mapping[str, int] | None = None, merges: Sequence[tuple[str, str]] | None = None,
                 add_prefix_space: bool = False, trim_offsets: bool = True, mask_lstrip: bool = True,
                 bos_token: str = "<s>", eos_token: str = "</s>", sep_token: str = "</s>", cls_token: str = "<s>",
                 unk_token: str = "<unk>", pad_token: str = "<pad>", mask_token: str = "<mask>",
                 model_max_length: int = 512, bpe_unk_token: str | None = None, use_fast: bool | None = None,
                 split_special_tokens: bool = False):
        # with `vocab` / `merges` given, `vocab_file` / `merges_file` only name them in messages
        self.vocab_file: str | None = None if vocab_file is None else str(vocab_file)
        self.merges_file: str | None = None if merges_file is None else str(merges_file)
        if vocab is None:
            if vocab_file is None:
                raise TokenizerError("RobertaTokenizer needs vocab_file and merges_file (or vocab and merges)")
            vocab = read_vocab_json(vocab_file)
        else:
            vocab = dict(vocab)
            _check_dense(vocab, self.vocab_file or "<vocab mapping>")
        if merges is None:
            if merges_file is None:
                raise TokenizerError("RobertaTokenizer needs merges_file (merges.txt) or merges")
            merges = read_merges(merges_file)
        else:
            merges = [tuple(m) for m in merges]
        self.vocab: dict[str, int] = vocab
        self.ids_to_tokens: list[str] = [""] * len(vocab)
        for tok, i in vocab.items():
            self.ids_to_tokens[i] = tok
        self.model_max_length = int(model_max_length)
        self.add_prefix_space, self.trim_offsets = bool(add_prefix_space), bool(trim_offsets)
        self.mask_lstrip = bool(mask_lstrip)
        # True: special-token text ("</s>" written in a corpus) is encoded as text, never as the special id
        self.split_special_tokens = bool(split_special_tokens)
        self.bos_token, self.eos_token, self.sep_token, self.cls_token = bos_token, eos_token, sep_token, cls_token
        self.unk_token, self.pad_token, self.mask_token = unk_token, pad_token, mask_token
        for name in SPECIAL_NAMES:
            token = getattr(self, f"{name}_token")
            if token not in vocab:
                raise TokenizerError(f"{self.vocab_file or '<vocab mapping>'}: no {token} token in the vocabulary "
                                     f"(RoBERTa's {name} token)")
            setattr(self, f"{name}_token_id", vocab[token])
        self.all_special_tokens = list(dict.fromkeys(getattr(self, f"{n}_token") for n in SPECIAL_NAMES))
        self.all_special_ids = sorted({vocab[t] for t in self.all_special_tokens})
        if bpe_unk_token is not None and bpe_unk_token not in vocab:
            raise TokenizerError(f"BPE unk token {bpe_unk_token!r} is not in the vocabulary")
        self.bpe_unk_token = bpe_unk_token
        try:
            self.bpe = BPE(vocab, merges, add_prefix_space=add_prefix_space, trim_offsets=trim_offsets,
                           unk_id=None if bpe_unk_token is None else vocab[bpe_unk_token])
        except BPEError as e:
            raise TokenizerError(f"{self.merges_file or '<merges>'}: {e}") from None
        # special tokens in text: leftmost, longest first (the tokenizers library's added-token matching); None:
        # none is matched (`split_special_tokens`)
        self._special_re = None if self.split_special_tokens else \
            re.compile("|".join(re.escape(t) for t in sorted(self.all_special_tokens, key=len, reverse=True)))
        self._init_fast(use_fast)

    def _make_fast(self):
        """The C encoder for this vocabulary and these rules, or None when the extension is not built."""
        mod = _fast_module()
        if mod is None or not hasattr(mod, "BPEEncoder"):
            return None
        from .bpe import char_class

        specials = [] if self.split_special_tokens else \
            [(t, self.vocab[t], t == self.mask_token and self.mask_lstrip) for t in self.all_special_tokens]
        return mod.BPEEncoder(self.ids_to_tokens, self.bpe.merges, specials, char_class, self.add_prefix_space,
                              self.trim_offsets, -1 if self.bpe.unk_id is None else self.bpe.unk_id, TokenizerError)

    @staticmethod
    def _pair_lengths(la: int, lb: int, budget: int) -> tuple[int, int]:
        """longest_first as the `tokenizers` library does it: the shorter text kept whole when the longer
        can take the rest, else half each, the odd token to the second."""
        n1, n2 = (lb, la) if la > lb else (la, lb)
        n2 = n1 if n1 > budget else max(n1, budget - n1)
        if n1 + n2 > budget:
            n1, n2 = budget // 2, budget // 2 + budget % 2
        if la > lb:
            n1, n2 = n2, n1
        return min(la, n1), min(lb, n2)

    # -- text -> tokens ----------------------------------------------------------------------------------------

    def special_spans(self, text: str) -> list[tuple[int, int, int]]:
        """(start, end, id) of each special token in `text`; `<mask>` with `mask_lstrip` takes the whitespace
        before it, but not what the previous special token took."""
        out: list[tuple[int, int, int]] = []
        if self._special_re is None:
            return out
        prev = 0
        for m in self._special_re.finditer(text):
            s, e = m.span()
            token = m.group()
            if token == self.mask_token and self.mask_lstrip:
                while s > prev and ord(text[s - 1]) in WHITESPACE:
                    s -= 1
            out.append((s, e, self.vocab[token]))
            prev = e
        return out

    def _encode_seq_py(self, text: str) -> Seq:
        ids, offsets, words = new_seq(text)
        word, pos, into = 0, 0, self.bpe.encode_into
        for s, e, tid in self.special_spans(text):
            word = into(text, pos, s, ids, offsets, words, word)
            o0 = s
            if self.trim_offsets:  # the whitespace a lstrip <mask> took is trimmed like a leading 'Ġ'
                lead = len(text[s:e]) - len(text[s:e].lstrip(_WHITESPACE_CHARS))
                if not ((not ids or s == 0) and self.add_prefix_space and lead == 1):
                    o0 = min(s + lead, e)
            ids.append(tid)
            offsets.append((o0, e))
            words.append(word)
            word += 1
            pos = e
        into(text, pos, len(text), ids, offsets, words, word)
        return ids, offsets, words

    def _encode_words(self, words: Sequence[str]) -> Seq:
        if not self.add_prefix_space:
            raise TokenizerError("is_split_into_words=True needs RobertaTokenizer(add_prefix_space=True), as in "
                                 "transformers (each word is encoded as if it followed a space)")
        return super()._encode_words(words)

    # -- ids -> text -------------------------------------------------------------------------------------------

    def convert_tokens_to_string(self, tokens: Sequence[str]) -> str:
        """Byte-level pieces back to text ('Ġ' is a space; invalid UTF-8 becomes U+FFFD)."""
        return decode_pieces(tokens)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool = False) -> str:
        """Ids -> text: the exact input text for ids of plain text. `clean_up_tokenization_spaces=True` also
        applies Hugging Face's English clean-up (' .' -> '.', ...)."""
        text = self.convert_tokens_to_string(self.convert_ids_to_tokens(_as_int_list(ids), skip_special_tokens))
        return _clean_up(text) if clean_up_tokenization_spaces else text

    # -- loading and saving ------------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **overrides: Any) -> "RobertaTokenizer":
        """Load from a folder with vocab.json + merges.txt and/or tokenizer.json (plus tokenizer_config.json
        and special_tokens_map.json when present), or from a tokenizer.json file. When a folder has both
        forms they must hold the same vocabulary, merges and settings. Keyword arguments override the files."""
        path = Path(path)
        kwargs: dict[str, Any] = {}
        if path.is_dir():
            folder = path
            json_path = path / TOKENIZER_JSON_NAME
            json_path = json_path if json_path.is_file() else None
            vocab_path, merges_path = path / VOCAB_JSON_NAME, path / MERGES_NAME
            have = vocab_path.is_file(), merges_path.is_file()
            if have[0] != have[1]:
                raise TokenizerError(f"{path}: {VOCAB_JSON_NAME if have[0] else MERGES_NAME} without "
                                     f"{MERGES_NAME if have[0] else VOCAB_JSON_NAME}; RoBERTa needs both")
            if not have[0] and json_path is None:
                raise TokenizerError(f"{path}: no {VOCAB_JSON_NAME} + {MERGES_NAME} or {TOKENIZER_JSON_NAME} in "
                                     "this folder")
            for name in (SPECIAL_TOKENS_MAP_NAME, TOKENIZER_CONFIG_NAME):
                if (path / name).is_file():
                    kwargs.update(_read_config(path / name))
        elif path.is_file() and path.suffix == ".json" and path.name != VOCAB_JSON_NAME:
            folder, json_path, have = None, path, (False, False)
        elif path.is_file():
            raise TokenizerError(f"{path}: give the folder that holds {VOCAB_JSON_NAME} and {MERGES_NAME}, or a "
                                 f"{TOKENIZER_JSON_NAME}")
        else:
            raise TokenizerError(f"{path}: no such tokenizer folder or tokenizer.json")
        vocab = merges = None
        if have[0]:
            vocab, merges = read_vocab_json(vocab_path), read_merges(merges_path)
        if json_path is not None:
            tj_vocab, tj_merges, settings = read_bpe_tokenizer_json(json_path)
            if vocab is not None and (vocab != tj_vocab or merges != tj_merges):
                what = VOCAB_JSON_NAME if vocab != tj_vocab else MERGES_NAME
                raise TokenizerError(f"{path / what} and {json_path} disagree; remove the stale one")
            for key, value in settings.items():
                if key in kwargs and kwargs[key] != value:
                    raise TokenizerError(f"{path / TOKENIZER_CONFIG_NAME}: {key} is {kwargs[key]!r} but {json_path} "
                                         f"says {value!r}; libraries differ in which they follow, so neither is "
                                         "guessed")
            kwargs.update(settings)
            vocab, merges = tj_vocab, tj_merges
        kwargs.update(overrides)
        tokenizer = cls(vocab_path if have[0] else json_path, merges_path if have[0] else json_path, vocab=vocab,
                        merges=merges, **kwargs)
        if folder is not None:
            check_fits_model(tokenizer, Path(tokenizer.vocab_file), folder / "config.json")
        return tokenizer

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write vocab.json, merges.txt and tokenizer_config.json (Hugging Face's layout; `transformers` loads
        it with the same `<mask>` lstrip, prefix-space and offset settings)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        write_vocab_json(self.vocab, d / VOCAB_JSON_NAME)
        write_merges(self.bpe.merges, d / MERGES_NAME)
        added = {str(self.vocab[t]): {"content": t, "lstrip": t == self.mask_token and self.mask_lstrip,
                                      "normalized": False, "rstrip": False, "single_word": False, "special": True}
                 for t in self.all_special_tokens}
        cfg = {
            "tokenizer_class": "RobertaTokenizer", "add_prefix_space": self.add_prefix_space,
            "trim_offsets": self.trim_offsets, "model_max_length": self.model_max_length,
            **{f"{n}_token": getattr(self, f"{n}_token") for n in SPECIAL_NAMES},
            "added_tokens_decoder": dict(sorted(added.items(), key=lambda kv: int(kv[0]))),
            "clean_up_tokenization_spaces": False, "errors": "replace",
        }
        _write_atomic(d / TOKENIZER_CONFIG_NAME, json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
        return d

    def __repr__(self) -> str:
        return (f"RobertaTokenizer(vocab_size={len(self)}, merges={len(self.bpe.merges)}, "
                f"add_prefix_space={self.add_prefix_space}, fast={'C' if self._fast is not None else 'python'})")


def is_bpe_path(path: str | os.PathLike) -> bool:
    """Whether `path` names a byte-level BPE tokenizer: a folder with vocab.json + merges.txt, or a tokenizer.json
    (file, or the only tokenizer file of a folder) whose model is BPE."""
    path = Path(path)
    if path.is_dir():
        if (path / VOCAB_JSON_NAME).is_file() or (path / MERGES_NAME).is_file():
            return True
        path = path / TOKENIZER_JSON_NAME
    if not (path.is_file() and path.suffix == ".json" and path.name != VOCAB_JSON_NAME):
        return False
    try:
        head = _read_capped(path, TOKENIZER_JSON_NAME, MAX_TOKENIZER_JSON_BYTES)
        model = json.loads(head).get("model")
    except (TokenizerError, ValueError, AttributeError):
        return False  # not JSON (or too large): the WordPiece reader reports it in its own words
    return isinstance(model, dict) and model.get("type") == "BPE"


# -- files -----------------------------------------------------------------------------------------------------

def _read_capped(path: Path, what: str, limit: int | None = None) -> str:
    """The text of `path`, its size checked before it is read (against MAX_VOCAB_FILE_BYTES by default)."""
    limit = MAX_VOCAB_FILE_BYTES if limit is None else limit
    try:
        size = path.stat().st_size
        if size > limit:
            raise TokenizerError(f"{path}: {size:,} bytes, over the {limit:,}-byte limit for a {what} (RoBERTa's "
                                 "is under 1 MB); refused")
        raw = path.read_bytes()
    except OSError as e:
        raise TokenizerError(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise TokenizerError(f"{path}:{line}: {what} is not valid UTF-8") from None


def _check_dense(vocab: Mapping[str, int], where: str) -> None:
    seen = [False] * len(vocab)
    for token, i in vocab.items():
        if not isinstance(token, str) or not token:
            raise TokenizerError(f"{where}: empty or non-text token (id {i!r})")
        if type(i) is not int or not 0 <= i < len(seen) or seen[i]:
            raise TokenizerError(f"{where}: token {token!r} has id {i!r}; ids must be 0..{len(seen) - 1}, each "
                                 "used once")
        seen[i] = True


def read_vocab_json(path: str | os.PathLike) -> dict[str, int]:
    """A vocab.json (token -> id, ids 0..n-1); anything else is one line naming the file."""
    path = Path(path)
    text = _read_capped(path, "vocabulary (vocab.json)")
    try:
        vocab = json.loads(text)
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(vocab, dict) or not vocab:
        raise TokenizerError(f"{path}: expected a non-empty JSON object of token -> id")
    _check_dense(vocab, str(path))
    return vocab


def read_merges(path: str | os.PathLike) -> list[tuple[str, str]]:
    """A merges.txt: an optional '#version' first line, then one merge per line, two pieces separated by
    one space, highest priority first."""
    path = Path(path)
    lines = _read_capped(path, "merges file (merges.txt)").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    merges = []
    for n, line in enumerate(lines, 1):
        if n == 1 and line.startswith("#version"):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise TokenizerError(f"{path}:{n}: expected two pieces separated by one space, got {line!r}")
        merges.append((parts[0], parts[1]))
    return merges


def write_vocab_json(vocab: Mapping[str, int], path: str | os.PathLike) -> Path:
    return _write_atomic(Path(path), json.dumps(dict(sorted(vocab.items(), key=lambda kv: kv[1])),
                                                ensure_ascii=False) + "\n")


def write_merges(merges: Iterable[tuple[str, str]], path: str | os.PathLike) -> Path:
    return _write_atomic(Path(path), "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))


def _write_atomic(path: Path, text: str) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def _read_config(path: Path) -> dict[str, Any]:
    """The constructor arguments a tokenizer_config.json or special_tokens_map.json holds."""
    try:
        cfg = json.loads(_read_capped(path, "tokenizer config", 2**20))
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{path}:{e.lineno}: cannot read tokenizer config: {e.msg}") from None
    if not isinstance(cfg, dict):
        raise TokenizerError(f"{path}: tokenizer config must be a JSON object")
    out: dict[str, Any] = {}
    for key in ("add_prefix_space", "trim_offsets"):
        if cfg.get(key) is not None:
            if not isinstance(cfg[key], bool):
                raise TokenizerError(f"{path}: {key} must be true or false, got {cfg[key]!r}")
            out[key] = cfg[key]
    mml = cfg.get("model_max_length")
    if isinstance(mml, int) and 0 < mml < 10**9:  # HF writes 1e30 for "no limit"
        out["model_max_length"] = mml
    for name in SPECIAL_NAMES:
        v = cfg.get(f"{name}_token")
        if isinstance(v, dict):
            if name == "mask" and isinstance(v.get("lstrip"), bool):
                out["mask_lstrip"] = v["lstrip"]
            v = v.get("content")
        if isinstance(v, str) and v:
            out[f"{name}_token"] = v
    decoder = cfg.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        mask = out.get("mask_token", ROBERTA_SPECIALS["mask_token"])
        for entry in decoder.values():
            if isinstance(entry, dict) and entry.get("content") == mask and isinstance(entry.get("lstrip"), bool):
                out["mask_lstrip"] = entry["lstrip"]
    return out


def json_refusal(path: Path, reader: str):
    """The one-line error for a tokenizer.json setting `reader` (a class name) does not reproduce."""
    return lambda what: TokenizerError(f"{path}: {what}; bertlab's {reader} does not reproduce that")


def read_bpe_json_model(path: str | os.PathLike, reader: str
                        ) -> tuple[dict[str, Any], str, dict[str, int], list[tuple[str, str]], dict[str, Any]]:
    """A byte-level BPE tokenizer.json: its parsed object and text, its model's vocabulary (not yet checked to be
    dense: added tokens may extend it) and merges, and the BPE unk setting. A model `reader` does not reproduce
    (another type, dropout, a subword prefix or suffix, byte fallback, fused unknowns) is one line naming the file."""
    path = Path(path)
    text = _read_capped(path, "tokenizer file", MAX_TOKENIZER_JSON_BYTES)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise TokenizerError(f"{path}: not a tokenizer.json (expected a JSON object with a 'model' object)")
    refuse = json_refusal(path, reader)
    model = data["model"]
    if model.get("type") != "BPE":
        raise refuse(f"model type {model.get('type')!r} (byte-level BPE expected)")
    for key, ok in (("dropout", (None,)), ("continuing_subword_prefix", (None, "")),
                    ("end_of_word_suffix", (None, "")), ("byte_fallback", (None, False)),
                    ("ignore_merges", (None, False))):
        if model.get(key) not in ok:
            raise refuse(f"BPE {key} {model.get(key)!r}")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise TokenizerError(f"{path}: model.vocab must be a non-empty object of token -> id")
    merges = []
    for n, m in enumerate(model.get("merges") or []):
        parts = m.split(" ") if isinstance(m, str) else m
        if not isinstance(parts, list) or len(parts) != 2 or not all(isinstance(p, str) and p for p in parts):
            raise TokenizerError(f"{path}: model.merges[{n}] is {m!r}; expected 'a b' or [a, b]")
        merges.append((parts[0], parts[1]))
    settings: dict[str, Any] = {}
    unk = model.get("unk_token")
    if unk is not None:
        if model.get("fuse_unk"):
            raise refuse("BPE fuse_unk true")
        settings["bpe_unk_token"] = unk
    return data, text, dict(vocab), merges, settings


def byte_level_pipeline(data: dict[str, Any], refuse, post_kind: str, normalizers: tuple[str, ...] = ()
                        ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pre-tokenizer and post-processor of a byte-level BPE tokenizer.json, checked: no normalizer (or one of
    `normalizers`), the ByteLevel pre-tokenizer with GPT-2's pattern, a post-processor of `post_kind`, the
    ByteLevel decoder (or none); `refuse(what)` makes the one-line error."""
    normalizer = data.get("normalizer")
    if normalizer is not None and _kind(normalizer) not in normalizers:
        raise refuse(f"normalizer {_kind(normalizer)}" + (f" ({' or '.join(normalizers)} expected)" if normalizers else ""))
    pre = data.get("pre_tokenizer")
    if _kind(pre) != "ByteLevel" or pre.get("use_regex", True) is not True:
        raise refuse(f"pre_tokenizer {_kind(pre)} (ByteLevel with GPT-2's pattern expected)")
    post = data.get("post_processor")
    if _kind(post) != post_kind:
        raise refuse(f"post_processor {_kind(post)} ({post_kind} expected)")
    decoder = data.get("decoder")
    if decoder is not None and _kind(decoder) != "ByteLevel":
        raise refuse(f"decoder {_kind(decoder)} (ByteLevel expected)")
    return pre, post


def read_bpe_tokenizer_json(path: str | os.PathLike) -> tuple[dict[str, int], list[tuple[str, str]], dict[str, Any]]:
    """Vocabulary, merges and RobertaTokenizer settings of a RoBERTa-style tokenizer.json: a byte-level BPE
    model, no normalizer, the ByteLevel pre-tokenizer (GPT-2's pattern), RobertaProcessing, the ByteLevel
    decoder, and as added tokens only the special tokens of the vocabulary (`<mask>` may lstrip). Anything
    else is one line naming the file and the setting."""
    path = Path(path)
    data, _, vocab, merges, settings = read_bpe_json_model(path, "RobertaTokenizer")
    _check_dense(vocab, str(path))
    refuse = json_refusal(path, "RobertaTokenizer")
    pre, post = byte_level_pipeline(data, refuse, "RobertaProcessing")
    try:
        (sep, sep_id), (cls_, cls_id) = post["sep"], post["cls"]
    except (KeyError, TypeError, ValueError):
        raise refuse("RobertaProcessing without sep and cls pairs") from None
    if vocab.get(sep) != sep_id or vocab.get(cls_) != cls_id:
        raise refuse(f"RobertaProcessing ids ({sep} {sep_id}, {cls_} {cls_id}) that are not the vocabulary's")
    prefix = bool(pre.get("add_prefix_space", False))
    if bool(post.get("add_prefix_space", prefix)) != prefix:
        raise refuse("add_prefix_space differing between pre_tokenizer and post_processor")
    settings.update(add_prefix_space=prefix, trim_offsets=bool(post.get("trim_offsets", True)), sep_token=sep,
                    eos_token=sep, cls_token=cls_, bos_token=cls_)
    added = data.get("added_tokens") or []
    if not isinstance(added, list):
        raise TokenizerError(f"{path}: added_tokens must be a list")
    for entry in added:
        entry = entry if isinstance(entry, dict) else {}
        content = entry.get("content")
        if not isinstance(content, str) or vocab.get(content) != entry.get("id"):
            raise refuse(f"added token {content!r} (id {entry.get('id')!r}) that is not that id of the vocabulary")
        if not entry.get("special"):
            raise refuse(f"added token {content!r} that is not special")
        if entry.get("rstrip") or entry.get("single_word"):
            raise refuse(f"added token {content!r} with rstrip or single_word")
        if content == "<mask>" or entry.get("lstrip"):
            if content != "<mask>":
                raise refuse(f"added token {content!r} with lstrip (only <mask> may)")
            settings["mask_lstrip"] = bool(entry.get("lstrip"))
    specials = {e.get("content") for e in added if isinstance(e, dict)}
    extra = specials - set(ROBERTA_SPECIALS.values()) - {sep, cls_}
    if extra:
        raise refuse(f"added special token {sorted(extra)[0]!r}, none of RoBERTa's (<s> <pad> </s> <unk> <mask>)")
    return vocab, merges, settings

