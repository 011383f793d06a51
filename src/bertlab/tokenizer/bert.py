"""`BertTokenizer`: text -> model inputs (ids, token types, attention mask, offsets, word ids) and back.

It composes `BasicTokenizer` (normalised words with their origins) and `WordPiece` (word -> pieces), then
builds BERT's inputs: `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]`, token type 0 for A and 1 for B, truncation
(longest_first / only_first / only_second, optionally into overlapping windows), padding, and for every token
the character span `(start, end)` of the original text it came from, (0, 0) for special and pad tokens.

The call signature follows Hugging Face's tokenizers so their users feel at home:
`tok(texts, pairs, truncation=..., max_length=..., padding=..., return_offsets_mapping=True)`. Outputs
match Hugging Face's BertTokenizerFast token for token (tests check it on WikiText-2, SQuAD and CoNLL-2003),
except where HF's slow and fast tokenizers disagree with each other; there we follow Google's original code
(tests/test_tokenizer.py `test_documented_divergences_from_hf_fast` pins each case):

- final sigma: 'ΟΔΟΣ' lowercases to 'οδος' (Python's `str.lower`, as Google and HF-slow do), not 'οδοσ';
- longest_first on a pair removes one token at a time from the longer sequence, from the second on ties
  (Google's `_truncate_seq_pair`, HF-slow); HF-fast splits the budget in halves, giving the extra token to B;
- Unicode data is Python's (`unicodedata`), as in Google's code; HF-fast's tables are older, so characters
  added since (Unicode 14 punctuation, marks, format characters) are classified differently there;
- CJK Extension E starts at U+2B820 (Google); HF-fast has U+2B920.

When the optional C extension `bertlab.tokenizer._fast` is built, the hot loop (normalise, WordPiece, build
the output lists) runs there; this file stays the reference and the fallback, and tests check both give the
same output. `BERTLAB_NO_FAST_TOKENIZER=1` forces the pure-Python path. One tokenizer can be shared between
threads. `encode_corpus` is the corpus-scale path: ids only, packed arrays, optionally on every core.

The call surface (`__call__`, pairs, truncation, windows, padding, tensors, `encode_corpus`, vocabulary
look-ups) lives in `TokenizerBase` (base.py), which `RobertaTokenizer` (roberta.py, byte-level BPE) shares, so
code that takes a tokenizer can take either. `folder_vocabulary` reads a model folder's WordPiece tokens.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .base import (TOKENIZER_CONFIG_NAME, VOCAB_NAME, Seq, TokenizerBase, TokenizerError, _as_int_list, _clean_up,
                   _fast_module, check_fits_model, new_seq)
from .basic import BasicTokenizer
from .tokenizer_json import TOKENIZER_JSON_NAME, read_tokenizer_json
from .wordpiece import VocabError, WordPiece, load_vocab, read_vocab, save_vocab

log = logging.getLogger(__name__)


class BertTokenizer(TokenizerBase):
    """BERT's WordPiece tokenizer (Google's rules) with Hugging Face's calling conventions.

    `BertTokenizer(vocab_file, do_lower_case=True)` or `BertTokenizer.from_pretrained(dir_or_vocab_file)`.
    `do_lower_case=False` is the cased models' setting (Google's `--do_lower_case=False`).
    """

    TOKENIZER_CLASS = "BertTokenizer"  # the `transformers` class tokenizer_config.json names
    SPECIAL_TOKENS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                      "mask_token": "[MASK]"}  # the defaults, where the folder's files name none
    # a tokenizer.json's other special tokens kept whole in text (`additional_special_tokens`) rather than refused
    KEEPS_OTHER_SPECIALS = False
    # (the defaults of what __init__ sets, for the SentencePiece bindings built on this class without it)
    additional_special_tokens: Sequence[str] = ()
    _lstrip_ids: frozenset[int] = frozenset()

    def __init__(self, vocab_file: str | os.PathLike | Mapping[str, int] | None = None, do_lower_case: bool = True,
                 *, vocab: Mapping[str, int] | None = None, unk_token: str = "[UNK]", sep_token: str = "[SEP]",
                 pad_token: str = "[PAD]", cls_token: str = "[CLS]", mask_token: str = "[MASK]",
                 tokenize_chinese_chars: bool = True, strip_accents: bool | None = None,
                 model_max_length: int = 512, max_input_chars_per_word: int = 100, use_fast: bool | None = None,
                 additional_special_tokens: Sequence[str] = (), lstrip_tokens: Sequence[str] = ()):
        if isinstance(vocab_file, Mapping):
            vocab, vocab_file = vocab_file, None
        if vocab is None:
            if vocab_file is None:
                raise TokenizerError("BertTokenizer needs a vocab_file (vocab.txt) or a vocab mapping")
            vocab = load_vocab(vocab_file, required=(unk_token,))
            self.vocab_file: str | None = str(vocab_file)
        else:
            vocab = dict(vocab)
            self.vocab_file = None
            if unk_token not in vocab:
                raise VocabError(f"<vocab mapping>: vocabulary has no {unk_token} token (it is required)")
            if sorted(vocab.values()) != list(range(len(vocab))):
                raise VocabError("<vocab mapping>: ids must be 0..n-1, each used once")
        self.vocab: dict[str, int] = vocab
        self.ids_to_tokens: list[str] = [""] * len(vocab)
        for tok, i in vocab.items():
            self.ids_to_tokens[i] = tok
        self.do_lower_case = bool(do_lower_case)
        self.tokenize_chinese_chars = bool(tokenize_chinese_chars)
        self.strip_accents = strip_accents
        self.model_max_length = int(model_max_length)
        self.unk_token, self.sep_token, self.pad_token = unk_token, sep_token, pad_token
        self.cls_token, self.mask_token = cls_token, mask_token
        self.all_special_tokens = [unk_token, sep_token, pad_token, cls_token, mask_token]
        missing = [t for t in additional_special_tokens if t not in vocab]
        if missing:
            raise VocabError(f"{vocab_file or '<vocab mapping>'}: additional special token {missing[0]!r} is not in "
                             "the vocabulary; bertlab does not add tokens")
        self.additional_special_tokens = [t for t in additional_special_tokens if t not in self.all_special_tokens]
        self.all_special_tokens += self.additional_special_tokens
        # tokens whose offsets start at the whitespace before them (a tokenizer.json's lstrip: `_lstripped`)
        self._lstrip_ids = frozenset(vocab[t] for t in lstrip_tokens if t in vocab)
        self.unk_token_id = vocab[unk_token]
        self.sep_token_id = vocab.get(sep_token)
        self.pad_token_id = vocab.get(pad_token)
        self.cls_token_id = vocab.get(cls_token)
        self.mask_token_id = vocab.get(mask_token)
        self.all_special_ids = sorted({vocab[t] for t in self.all_special_tokens if t in vocab})
        self.basic = BasicTokenizer(do_lower_case, never_split=self.all_special_tokens,
                                    tokenize_chinese_chars=tokenize_chinese_chars, strip_accents=strip_accents)
        self.wordpiece = WordPiece(vocab, unk_token=unk_token, max_input_chars_per_word=max_input_chars_per_word)
        if self.do_lower_case and len(vocab) > 1000:
            upper = sum(1 for t in self.ids_to_tokens[:5000] if t[:1].isupper())
            if upper > 100:  # Google's cased vocabulary has ~8000; the uncased one none
                log.warning("%s looks like a cased vocabulary (%d capitalised tokens) but do_lower_case=True",
                            self.vocab_file or "vocabulary", upper)
        self._init_fast(use_fast)

    def _make_fast(self):
        """The C encoder for this vocabulary and these rules, or None when the extension is not built."""
        mod = _fast_module()
        if mod is None:
            return None
        specials = [(t, self.vocab.get(t, self.unk_token_id)) for t in self.basic.never_split]
        return mod.Encoder(self.ids_to_tokens, self.unk_token_id, self.basic,
                           self.wordpiece.max_input_chars_per_word, specials, TokenizerError)

    # -- loading and saving ----------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, placed_tokens: Sequence[str] = (),
                        **overrides: Any) -> "BertTokenizer":
        """Load from a vocab.txt or a tokenizer.json, or from a folder in any layout Hugging Face writes:
        vocab.txt and/or tokenizer.json (what `transformers` 5.x saves: see `tokenizer_json.py`), and
        tokenizer_config.json for do_lower_case, special tokens, model_max_length. Settings two files both
        give must agree, and so must the two vocabularies when both are there: a folder whose files
        contradict each other is refused, not guessed at. Keyword arguments override the files.
        `placed_tokens`: tokens the caller inserts by id (ColBERT's markers), taken from tokenizer.json's added
        tokens right after the vocabulary."""
        path = Path(path)
        kwargs: dict[str, Any] = {}
        vocab_path = json_path = None
        if path.is_dir():
            vocab_path, json_path = path / VOCAB_NAME, path / TOKENIZER_JSON_NAME
            vocab_path = vocab_path if vocab_path.is_file() else None
            json_path = json_path if json_path.is_file() else None
            if vocab_path is None and json_path is None:
                raise TokenizerError(f"{path}: no {VOCAB_NAME} or {TOKENIZER_JSON_NAME} in this folder")
            cfg_path = path / TOKENIZER_CONFIG_NAME
            if cfg_path.is_file():
                kwargs.update(_read_config(cfg_path))
            if not cls.KEEPS_OTHER_SPECIALS:
                kwargs.pop("additional_special_tokens", None)  # (as before: text, not kept whole)
        elif path.is_file():
            json_path, vocab_path = (path, None) if path.suffix == ".json" else (None, path)
        else:
            raise TokenizerError(f"{path}: no such vocabulary file or tokenizer folder")
        if json_path is not None:
            kwargs, vocab = _with_tokenizer_json(json_path, vocab_path, kwargs, path / TOKENIZER_CONFIG_NAME,
                                                 placed_tokens, cls)
            kwargs.update(overrides)
            tokenizer = cls(vocab=vocab, **kwargs)
            tokenizer.vocab_file = str(vocab_path or json_path)
        else:
            kwargs.update(overrides)
            tokenizer = cls(vocab_path, **kwargs)
        if path.is_dir():
            check_fits_model(tokenizer, vocab_path or json_path, path / "config.json")
        return tokenizer

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write vocab.txt and tokenizer_config.json (Hugging Face's layout; `transformers` loads it too)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        save_vocab(self.ids_to_tokens, d / VOCAB_NAME)
        cfg = {
            "tokenizer_class": self.TOKENIZER_CLASS, "do_lower_case": self.do_lower_case,
            "tokenize_chinese_chars": self.tokenize_chinese_chars, "strip_accents": self.strip_accents,
            "model_max_length": self.model_max_length, "unk_token": self.unk_token, "sep_token": self.sep_token,
            "pad_token": self.pad_token, "cls_token": self.cls_token, "mask_token": self.mask_token,
            "clean_up_tokenization_spaces": False,
            **({"additional_special_tokens": list(self.additional_special_tokens)}
               if self.additional_special_tokens else {}),
        }
        tmp = d / (TOKENIZER_CONFIG_NAME + ".tmp")
        tmp.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, d / TOKENIZER_CONFIG_NAME)
        return d

    # -- text -> tokens ----------------------------------------------------------------------------------------

    def basic_tokenize_with_offsets(self, text: str) -> list[tuple[str, int, int]]:
        """Words before WordPiece, each with the (start, end) of the original text it came from."""
        return self.basic.tokenize_with_offsets(text)

    def _encode_seq(self, text: str) -> Seq:
        seq = super()._encode_seq(text)
        return self._lstripped(text, seq) if self._lstrip_ids else seq

    def _encode_many(self, texts: Sequence, enc) -> list[Seq]:
        seqs = super()._encode_many(texts, enc)
        return [self._lstripped(t, s) for t, s in zip(texts, seqs)] if self._lstrip_ids else seqs

    def _lstripped(self, text: str, seq: Seq) -> Seq:
        """`seq` with each lstrip token's span starting at the whitespace before it, back to the token before (as
        `tokenizers` matches such a token: the whitespace included). Idempotent."""
        if not any(i in self._lstrip_ids for i in seq[0]):
            return seq
        ids, offsets, words = seq
        offsets = list(offsets)
        for k, i in enumerate(ids):
            if i in self._lstrip_ids:
                start, end = offsets[k]
                floor = offsets[k - 1][1] if k else 0
                while start > floor and text[start - 1].isspace():
                    start -= 1
                offsets[k] = (start, end)
        return ids, offsets, words

    def _encode_seq_py(self, text: str) -> Seq:
        ids, offsets, words = new_seq(text)
        pieces, vocab, unk = self.wordpiece.pieces, self.vocab, self.unk_token_id
        for w, (word, origin, special) in enumerate(self.basic.words(text)):
            if special:
                ids.append(vocab.get(word, unk))
                offsets.append((origin[0], origin[1]))
                words.append(w)
                continue
            for pid, s, e in pieces(word):
                ids.append(pid)
                offsets.append((origin[s], origin[e - 1] + 1))
                words.append(w)
        return ids, offsets, words

    # -- ids -> text -------------------------------------------------------------------------------------------

    def convert_tokens_to_string(self, tokens: Sequence[str]) -> str:
        """Join pieces: a '##' piece attaches to the one before, other tokens are separated by a space."""
        parts: list[str] = []
        for t in tokens:
            if t.startswith("##") and parts:
                parts.append(t[2:])
            else:
                if parts:
                    parts.append(" ")
                parts.append(t)
        return "".join(parts)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool = False) -> str:
        """Ids -> text, '##' pieces joined to their word. For text without [UNK] this gives back the
        normalised input: words separated by single spaces (`BasicTokenizer.normalize`).
        `clean_up_tokenization_spaces=True` also applies Hugging Face's English clean-up (' .' -> '.', ...)."""
        text = self.convert_tokens_to_string(self.convert_ids_to_tokens(_as_int_list(ids), skip_special_tokens))
        if clean_up_tokenization_spaces:
            text = _clean_up(text)
        return text

    def __repr__(self) -> str:
        return (f"BertTokenizer(vocab_size={len(self)}, do_lower_case={self.do_lower_case}, "
                f"fast={'C' if self._fast is not None else 'python'})")


def folder_vocabulary(folder: str | os.PathLike) -> list[str] | None:
    """The tokens (in id order) of a model folder's WordPiece vocabulary -- its vocab.txt, else its
    tokenizer.json -- or None when it has neither. Two folders (or a folder and prepared data) read the same
    token ids exactly when these lists are equal, whichever file each keeps."""
    folder = Path(folder)
    if (folder / VOCAB_NAME).is_file():
        return read_vocab(folder / VOCAB_NAME)
    if (folder / TOKENIZER_JSON_NAME).is_file():
        return read_tokenizer_json(folder / TOKENIZER_JSON_NAME).tokens
    return None


def _effective(settings: dict[str, Any]) -> dict[str, Any]:
    """The normalisation settings as they act (strip_accents None follows do_lower_case)."""
    out = dict(settings)
    if "strip_accents" in out and out["strip_accents"] is None and "do_lower_case" in out:
        out["strip_accents"] = out["do_lower_case"]
    return out


def _with_tokenizer_json(json_path: Path, vocab_path: Path | None, kwargs: dict[str, Any], cfg_path: Path,
                         placed: Sequence[str] = (), owner: type = BertTokenizer
                         ) -> tuple[dict[str, Any], dict[str, int]]:
    """The constructor arguments and vocabulary of a tokenizer.json, checked against the folder's vocab.txt
    and tokenizer_config.json (`kwargs`, read from `cfg_path`): a disagreement is one line naming both files.
    (`transformers` 5.x takes normalisation from tokenizer_config.json, `tokenizers` and earlier versions
    from tokenizer.json: when they differ, the two libraries tokenize differently and no choice is right.)"""
    tj = read_tokenizer_json(json_path, placed, owner.PAIR_SEPS)
    if vocab_path is not None:
        tokens = read_vocab(vocab_path)
        theirs = tj.tokens[:len(tj.tokens) - len(tj.placed)]  # vocab.txt holds no placed token
        if tokens != theirs:
            at = next((i for i, (a, b) in enumerate(zip(tokens, theirs)) if a != b), min(len(tokens), len(theirs)))
            what = (f"{len(tokens):,} tokens against {len(theirs):,}" if at == min(len(tokens), len(theirs))
                    else f"id {at} is {tokens[at]!r} in one, {theirs[at]!r} in the other")
            raise TokenizerError(f"{vocab_path} and {json_path} disagree ({what}); remove the stale one")
    effective_cfg, effective_json = _effective(kwargs), _effective(tj.settings)
    for key, value in effective_json.items():
        if key in effective_cfg and effective_cfg[key] != value:
            raise TokenizerError(f"{cfg_path}: {key} is {effective_cfg[key]!r} but {json_path} says {value!r}; "
                                 "libraries differ in which they follow, so neither is guessed")
    merged = {**kwargs, **tj.settings}
    named = {k: merged.get(k, d) for k, d in owner.SPECIAL_TOKENS.items()}
    specials = set(named.values())
    extra = [t for t in tj.special_tokens if t not in specials]
    if len(extra) == 1 and named["pad_token"] == named["mask_token"]:
        # a tokenizer whose pad token was set to its mask token before it was saved (PyLate pads queries with
        # [MASK]) leaves the file's own pad token unnamed: it is the pad token again, kept whole in text as
        # `tokenizers` keeps it; padding itself is never text
        merged["pad_token"], extra = extra[0], []
    if extra and not owner.KEEPS_OTHER_SPECIALS:
        raise TokenizerError(f"{json_path}: added special token {extra[0]!r} is none of the tokenizer's own "
                             f"({', '.join(sorted(specials))}); bertlab keeps only those whole in text")
    if extra:
        merged["additional_special_tokens"] = extra
    if tj.lstrip:
        merged["lstrip_tokens"] = tj.lstrip
    return merged, {t: i for i, t in enumerate(tj.tokens)}


def _read_config(path: Path) -> dict[str, Any]:
    """The constructor arguments a tokenizer_config.json holds (Hugging Face's format)."""
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        line = getattr(e, "lineno", None)
        raise TokenizerError(f"{path}{':' + str(line) if line else ''}: cannot read tokenizer config: "
                             f"{getattr(e, 'msg', e)}") from None
    if not isinstance(cfg, dict):
        raise TokenizerError(f"{path}: tokenizer config must be a JSON object")
    out: dict[str, Any] = {}
    for key in ("do_lower_case", "tokenize_chinese_chars"):
        if key in cfg and cfg[key] is not None:
            if not isinstance(cfg[key], bool):
                raise TokenizerError(f"{path}: {key} must be true or false, got {cfg[key]!r}")
            out[key] = cfg[key]
    if cfg.get("strip_accents") is not None:
        out["strip_accents"] = bool(cfg["strip_accents"])
    mml = cfg.get("model_max_length")
    if isinstance(mml, int) and 0 < mml < 10**9:  # HF writes 1e30 for "no limit"
        out["model_max_length"] = mml
    for key in ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        v = cfg.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str) and v:
            out[key] = v
    extra = cfg.get("additional_special_tokens")
    if isinstance(extra, list):
        out["additional_special_tokens"] = [t.get("content") if isinstance(t, dict) else t for t in extra]
        if not all(isinstance(t, str) and t for t in out["additional_special_tokens"]):
            raise TokenizerError(f"{path}: additional_special_tokens must be a list of tokens")
    return out
