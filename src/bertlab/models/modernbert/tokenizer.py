"""`ModernBertTokenizer`: ModernBERT's `tokenizer.json` -- GPT-NeoX's byte-level BPE with BERT's input layout
(`[CLS] A [SEP]`, `[CLS] A [SEP] B [SEP]`) -- on RoBERTa's byte-level BPE code (`tokenizer/roberta.py`), with
ids and offsets those of the `tokenizers` library (tests/models/modernbert compares them on WikiText-2, SQuAD and
CoNLL-2003 text).

What the file may say, and how it is followed:
- model: BPE without dropout, subword prefix or suffix, byte fallback; pre-tokenizer: ByteLevel with GPT-2's
  pattern; decoder: ByteLevel; post-processor: a TemplateProcessing of the two layouts above, which leaves the
  offsets as the ByteLevel pre-tokenizer made them (a piece's leading space included, as `tokenizers` does);
- normalizer: none, or NFC. NFC is applied by checking: text already in NFC (almost all text) tokenizes as it
  is; other text is refused in one line, since normalizing it moves the offsets and `tokenizers`' alignment of
  them is not reproduced here;
- added tokens (special ones, and GPT-NeoX's runs of spaces and placeholders that are not) are matched whole,
  leftmost and longest, before BPE; `[MASK]` may take the whitespace before it (lstrip), no other may.
Anything else is refused in one line naming the file and the setting.
"""

from __future__ import annotations

import json
import os
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...tokenizer.roberta import (VOCAB_JSON_NAME, RobertaTokenizer, _check_dense, _read_capped, _read_config,
                                  _write_atomic, byte_level_pipeline, json_refusal, read_bpe_json_model)
from ...tokenizer.base import (SPECIAL_TOKENS_MAP_NAME, TOKENIZER_CONFIG_NAME, Seq, TokenizerBase,
                               TokenizerError, _fast_module, check_fits_model)
from ...tokenizer.tokenizer_json import MAX_TOKENIZER_JSON_BYTES, TOKENIZER_JSON_NAME, _kind

MODERNBERT_SPECIALS = {"cls_token": "[CLS]", "sep_token": "[SEP]", "unk_token": "[UNK]", "pad_token": "[PAD]",
                       "mask_token": "[MASK]"}


class ModernBertTokenizer(RobertaTokenizer):
    """ModernBERT's tokenizer.json with `BertTokenizer`'s calling conventions: `from_pretrained(folder or file)`.

    With `split_special_tokens` (how `prepare` reads a corpus) "[CLS]" or "[MASK]" written in the text is text,
    while the added tokens that are not special (runs of spaces) are still matched whole, as the model sees them."""

    PAIR_SEPS = 1  # [CLS] A [SEP] B [SEP]
    # The tokenizer kind of data prepared with it (a prepared manifest's): byte-level BPE laid out [CLS] A [SEP],
    # which RoBERTa's "bpe" data (<s> A </s>, vocab.json + merges.txt) is not
    DATA_KIND = "bpe-cls"

    def __init__(self, *args: Any, added_tokens: Sequence[str] = (), normalizer: str | None = None,
                 type_b: int = 1, source_json: str | None = None, **kwargs: Any):
        self.added_tokens = list(added_tokens)  # matched whole like the specials, before __init__ builds matchers
        self.normalizer = normalizer
        self.TYPE_B = type_b
        self.source_json = source_json  # the tokenizer.json text, written back as it is by save_pretrained
        super().__init__(*args, **kwargs)
        import re

        matched = sorted(set(self.added_tokens) | (set() if self.split_special_tokens else
                                                    set(self.all_special_tokens)), key=len, reverse=True)
        self._special_re = re.compile("|".join(re.escape(t) for t in matched)) if matched else None

    def _make_fast(self):
        mod = _fast_module()
        if mod is None or not hasattr(mod, "BPEEncoder"):
            return None
        from ...tokenizer.bpe import char_class

        tokens = list(dict.fromkeys([*([] if self.split_special_tokens else self.all_special_tokens),
                                     *self.added_tokens]))
        specials = [(t, self.vocab[t], t == self.mask_token and self.mask_lstrip) for t in tokens]
        return mod.BPEEncoder(self.ids_to_tokens, self.bpe.merges, specials, char_class, self.add_prefix_space,
                              self.trim_offsets, -1 if self.bpe.unk_id is None else self.bpe.unk_id, TokenizerError)

    def _check_text(self, text: Any) -> None:
        if self.normalizer == "NFC" and isinstance(text, str) and not unicodedata.is_normalized("NFC", text):
            raise TokenizerError(f"text {text[:40]!r}... is not in Unicode NFC, which this tokenizer.json normalizes "
                                 "to; bertlab does not reproduce the offsets of that normalization: pass "
                                 "unicodedata.normalize('NFC', text)")

    def _encode_seq(self, text: str) -> Seq:
        self._check_text(text)
        return super()._encode_seq(text)

    def _encode_many(self, texts: Sequence, enc) -> list[Seq]:
        for t in texts:
            self._check_text(t)
        return super()._encode_many(texts, enc)

    def _flat_many(self, texts: Sequence[str]) -> tuple[bytes, bytes]:
        for t in texts:
            self._check_text(t)
        return super()._flat_many(texts)

    def _encode_words(self, words: Sequence[str]) -> Seq:
        """Pre-split words each encoded on its own, as `tokenizers` encodes pre-tokenized input: with
        add_prefix_space false (ModernBERT's) a word gets no leading space piece (RoBERTa's tokenizer refuses
        that, as `transformers`' RobertaTokenizerFast does; a plain tokenizer.json has no such rule)."""
        return TokenizerBase._encode_words(self, words)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **overrides: Any) -> "ModernBertTokenizer":
        """From a folder holding tokenizer.json (with tokenizer_config.json / special_tokens_map.json when
        present), or from a tokenizer.json file."""
        path = Path(path)
        kwargs: dict[str, Any] = {}
        folder = None
        if path.is_dir():
            folder, json_path = path, path / TOKENIZER_JSON_NAME
            if not json_path.is_file():
                raise TokenizerError(f"{path}: no {TOKENIZER_JSON_NAME} (ModernBERT's tokenizer) in this folder")
            for name in (SPECIAL_TOKENS_MAP_NAME, TOKENIZER_CONFIG_NAME):
                if (path / name).is_file():
                    kwargs.update(_read_config(path / name))
        elif path.is_file() and path.suffix == ".json":
            json_path = path
        else:
            raise TokenizerError(f"{path}: no such tokenizer folder or tokenizer.json")
        settings = read_modernbert_tokenizer_json(json_path)
        for key in ("cls_token", "sep_token", "add_prefix_space", "trim_offsets"):
            if key in kwargs and kwargs[key] != settings[key]:
                raise TokenizerError(f"{path}: {key} is {kwargs[key]!r} in the tokenizer config but {json_path} says "
                                     f"{settings[key]!r}; libraries differ in which they follow, so neither is guessed")
        kwargs.update(settings)
        kwargs.update(overrides)
        tokenizer = cls(json_path, json_path, **kwargs)
        if folder is not None:
            check_fits_model(tokenizer, json_path, folder / "config.json")
        return tokenizer

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write tokenizer.json (the file it was read from) and a tokenizer_config.json `transformers` reads."""
        if self.source_json is None:
            raise TokenizerError("this ModernBertTokenizer was not read from a tokenizer.json; nothing to save")
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        _write_atomic(d / TOKENIZER_JSON_NAME, self.source_json)
        cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": self.model_max_length,
               "clean_up_tokenization_spaces": False,
               **{f"{n}_token": getattr(self, f"{n}_token") for n in ("cls", "sep", "unk", "pad", "mask")},
               "model_input_names": ["input_ids", "attention_mask"]}
        _write_atomic(d / TOKENIZER_CONFIG_NAME, json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
        return d

    def __repr__(self) -> str:
        return (f"ModernBertTokenizer(vocab_size={len(self)}, merges={len(self.bpe.merges)}, "
                f"normalizer={self.normalizer}, fast={'C' if self._fast is not None else 'python'})")


def is_modernbert_tokenizer_json(path: str | os.PathLike) -> bool:
    """Whether `path` is a tokenizer.json (or a folder whose tokenizer it is, without RoBERTa's vocab.json) of
    ModernBERT's kind: a BPE model laid out by a TemplateProcessing post-processor. Whether the template is
    [CLS] A [SEP] is `from_pretrained`'s to check (in one line naming the file)."""
    path = Path(path)
    if path.is_dir():
        if (path / VOCAB_JSON_NAME).is_file():
            return False
        path = path / TOKENIZER_JSON_NAME
    if not (path.is_file() and path.suffix == ".json" and path.name != VOCAB_JSON_NAME):
        return False
    try:
        data = json.loads(_read_capped(path, TOKENIZER_JSON_NAME, MAX_TOKENIZER_JSON_BYTES))
    except (TokenizerError, ValueError):
        return False  # not JSON (or too large): the reader of the kind it passes for reports it
    return (isinstance(data, dict) and isinstance(data.get("model"), dict) and data["model"].get("type") == "BPE"
            and _kind(data.get("post_processor")) == "TemplateProcessing")


def _template(post: Any, refuse) -> tuple[str, str, int]:
    """(cls, sep, type id of B) of a TemplateProcessing laying out [CLS] A [SEP] and [CLS] A [SEP] B [SEP]."""
    def parts(seq: Any) -> list[tuple[str, str, int]]:
        if not isinstance(seq, list):
            raise refuse("TemplateProcessing without single and pair templates")
        out = []
        for p in seq:
            (kind, body), = p.items() if isinstance(p, dict) and len(p) == 1 else [(None, None)]
            if kind not in ("SpecialToken", "Sequence") or not isinstance(body, dict):
                raise refuse(f"TemplateProcessing piece {p!r}")
            out.append((kind, body.get("id"), body.get("type_id", 0)))
        return out

    single, pair = parts(post.get("single")), parts(post.get("pair"))
    shape = [k for k, _, _ in single], [(k, i) for k, i, _ in pair]
    if shape[0] != ["SpecialToken", "Sequence", "SpecialToken"] or [i for k, i, _ in single][1] != "A":
        raise refuse("TemplateProcessing single template other than [CLS] $A [SEP]")
    cls_, sep = single[0][1], single[2][1]
    if shape[1] != [("SpecialToken", cls_), ("Sequence", "A"), ("SpecialToken", sep), ("Sequence", "B"),
                    ("SpecialToken", sep)]:
        raise refuse("TemplateProcessing pair template other than [CLS] $A [SEP] $B [SEP]")
    if any(t for _, _, t in single) or any(t for _, _, t in pair[:3]) or pair[3][2] != pair[4][2]:
        raise refuse("TemplateProcessing type ids other than 0 for [CLS] A [SEP] and one type for B [SEP]")
    specials = post.get("special_tokens") or {}
    for name in (cls_, sep):
        if name in specials and specials[name].get("tokens") != [name]:
            raise refuse(f"TemplateProcessing special token {name!r} standing for {specials[name].get('tokens')!r}")
    return cls_, sep, pair[3][2]


def read_modernbert_tokenizer_json(path: str | os.PathLike) -> dict[str, Any]:
    """The `ModernBertTokenizer` arguments of a tokenizer.json (see the module docstring); anything else is one
    line naming the file and the setting."""
    path = Path(path)
    data, text, vocab, merges, settings = read_bpe_json_model(path, "ModernBertTokenizer")
    refuse = json_refusal(path, "ModernBertTokenizer")
    pre, post = byte_level_pipeline(data, refuse, "TemplateProcessing", normalizers=("NFC",))
    normalizer = data.get("normalizer")
    cls_, sep, type_b = _template(post, refuse)
    added = data.get("added_tokens") or []
    if not isinstance(added, list):
        raise TokenizerError(f"{path}: added_tokens must be a list")
    settings["mask_lstrip"] = False
    plain = []
    for entry in added:
        entry = entry if isinstance(entry, dict) else {}
        content = entry.get("content")
        token_id = entry.get("id")
        if not isinstance(content, str) or not content or isinstance(token_id, bool) or not isinstance(token_id, int):
            raise TokenizerError(f"{path}: added token {content!r} with id {token_id!r}; expected text and an integer")
        if vocab.setdefault(content, token_id) != token_id:  # beyond the BPE vocabulary, an added token extends it
            raise refuse(f"added token {content!r} (id {token_id}) that is id {vocab[content]} of the vocabulary")
        if entry.get("rstrip") or entry.get("single_word"):
            raise refuse(f"added token {content!r} with rstrip or single_word")
        if entry.get("lstrip"):
            if content != MODERNBERT_SPECIALS["mask_token"]:
                raise refuse(f"added token {content!r} with lstrip (only [MASK] may)")
            settings["mask_lstrip"] = True
        if not entry.get("special"):
            plain.append(content)
    _check_dense(vocab, str(path))  # the BPE vocabulary and the added tokens: ids 0 .. n-1, each once
    names = {**MODERNBERT_SPECIALS, "cls_token": cls_, "sep_token": sep}
    for key, token in names.items():
        if token not in vocab:
            raise refuse(f"no {token} token ({key}) in the vocabulary")
    settings.update(names, bos_token=cls_, eos_token=sep, add_prefix_space=bool(pre.get("add_prefix_space", False)),
                    trim_offsets=False, added_tokens=plain, normalizer=_kind(normalizer) if normalizer else None,
                    type_b=type_b, vocab=vocab, merges=merges, source_json=text)
    return settings
