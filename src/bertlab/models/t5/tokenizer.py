"""T5's tokenizers, on either kind of vocabulary, and `load_text_to_text_tokenizer(path)`, which picks
SentencePiece or WordPiece from the path. Both have the interface of
`models.text_to_text.TextToTextTokenizer`:

- `T5Tokenizer`: T5's own, a SentencePiece model (`spiece.model`); `</s>` is the eos.
- `WordPieceT5Tokenizer`: a `BertTokenizer` (vocab.txt) plus 100 sentinels; `[SEP]` is the eos, `[PAD]` the
  pad, `[MASK]` what BERT-style corruption writes. The same token shards then serve BERT and T5 objectives,
  so the two can be compared on one vocabulary.

`T5Tokenizer` in detail (its SentencePiece model is read through `bertlab.tokenizer.sentencepiece`):

T5 (Raffel et al. 2020, section 2.2) encodes text with SentencePiece and gives the model 100 more ids, the
*sentinels* `<extra_id_0>` ... `<extra_id_99>`, appended after the SentencePiece vocabulary in reverse: with a
model of V pieces, `<extra_id_i>` is id V + 99 - i, so `<extra_id_0>` is the LAST id (`sentinel_id(i)`).
`<pad>` is 0, `</s>` 1 and `<unk>` 2 (the trainer below lays models out that way), and `</s>` ends every
encoded sequence. `T5Tokenizer` here gives the ids `transformers.T5Tokenizer` gives on the same model file
(tests/models/t5/test_t5_tokenizer.py checks WikiText-2 and SQuAD text, sentinels included):

- text is split at the special tokens written in it (`<extra_id_N>` for N below the number of sentinels,
  `</s>`, `<pad>`, `<unk>`); each piece of plain text between them is encoded by SentencePiece on its own, so
  it gets SentencePiece's leading `▁` even right after a special token (the "legacy" behaviour of
  `transformers`' slow T5 tokenizer, which its tokenizers-based T5Tokenizer keeps). `split_special_tokens=True`
  encodes such text literally instead, which is what pre-training data wants (a corpus that mentions
  "<extra_id_0>" must not produce a sentinel);
- `</s>` is appended to every sequence (pairs: `A </s> B </s>`), also when the text already ends in `</s>`
  (the tokenizers-based T5Tokenizer does so; the slow one skipped it then, with a warning);
- `decode` joins the pieces and reads `▁` as a space, as `transformers` does; `skip_special_tokens=True`
  drops pad, eos, unk and the sentinels.

`save_pretrained(DIR)` writes `spiece.model`, `tokenizer_config.json` and `special_tokens_map.json`, which
`transformers.T5Tokenizer(Fast)` load; `from_pretrained` reads those back (or a bare `.model` file).
`train_sentencepiece` learns a model with T5's settings (`bertlab vocab train --kind sentencepiece`).

`sentencepiece` (a dependency of bertlab) is imported only when a model is loaded or trained, so the rest of
bertlab starts without it, and an install without it says so in one line when it is needed.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...tokenizer.sentencepiece import (SPIECE_NAME, SentencePieceBinding, SentencePieceError, SentencePieceTrainReport,
                                        atomic_write_bytes, is_sentencepiece_path, learn_sentencepiece,
                                        load_processor, metaspace_join, model_max_length_of)
from ...tokenizer.base import SPECIAL_TOKENS_MAP_NAME, TOKENIZER_CONFIG_NAME, TokenizerError
from ...tokenizer.bert import BertTokenizer
from ..text_to_text import SENTINEL_PATTERN, sentinel_token
from .sentinels import NUM_SENTINELS, SentinelTokenizer

__all__ = ["NUM_SENTINELS", "SentinelTokenizer", "T5Tokenizer", "WordPieceT5Tokenizer",
           "load_text_to_text_tokenizer", "SentencePieceTrainConfig", "train_sentencepiece"]

log = logging.getLogger(__name__)

PAD_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "</s>", "<unk>"
T5_SPECIAL_IDS = {PAD_TOKEN: 0, EOS_TOKEN: 1, UNK_TOKEN: 2}  # how T5's models (and our trainer) lay them out


class T5Tokenizer(SentencePieceBinding, SentinelTokenizer):
    """T5's tokenizer over a SentencePiece model (see the module docstring). The calling interface is that of
    `BertTokenizer` where it makes sense: `tok(texts, padding=..., truncation=..., max_length=...,
    return_tensors=...)`, `encode`, `decode`, `convert_ids_to_tokens`, `from_pretrained` / `save_pretrained`;
    and the text-to-text interface (`models.text_to_text.TextToTextTokenizer`): `sentinel_id(i)`, `eos_token_id`,
    `pad_token_id`, `mask_token_id`, `vocab_size` (sentinels included)."""

    def __init__(self, model_file: str | os.PathLike, extra_ids: int = NUM_SENTINELS, model_max_length: int = 512,
                 split_special_tokens: bool = False):
        self.model_file = Path(model_file)
        self.sp = load_processor(self.model_file)
        self.base_size = self.sp.get_piece_size()
        for token, expected in T5_SPECIAL_IDS.items():
            found = self.sp.piece_to_id(token)
            if self.sp.id_to_piece(found) != token:
                raise SentencePieceError(f"{self.model_file}: a T5 SentencePiece model needs a {token} piece; this "
                                         "one has none (train one with `bertlab vocab train --kind sentencepiece`)")
            if found != expected:
                log.warning("%s: %s is id %d (T5 models have it at %d)", self.model_file, token, found, expected)
        self.pad_token, self.eos_token, self.unk_token = PAD_TOKEN, EOS_TOKEN, UNK_TOKEN
        self.pad_token_id = self.sp.piece_to_id(PAD_TOKEN)
        self.eos_token_id = self.sp.piece_to_id(EOS_TOKEN)
        self.unk_token_id = self.sp.piece_to_id(UNK_TOKEN)
        self.base_special_ids = (self.pad_token_id, self.eos_token_id, self.unk_token_id)
        # Written in text, these become their ids, as in `transformers` (unless split_special_tokens).
        self.special_text = {PAD_TOKEN: self.pad_token_id, EOS_TOKEN: self.eos_token_id,
                             UNK_TOKEN: self.unk_token_id}
        self._init_sentinels(extra_ids, model_max_length, split_special_tokens)

    @property
    def mask_token_id(self) -> int:
        # T5's BERT-style objective writes "the sentinel" (t5.data.preprocessors.sentinel_id: the last id).
        return self.sentinel_id(0) if self.num_sentinels else self.unk_token_id

    # -- loading and saving ----------------------------------------------------------------------------------

    @classmethod
    def config_kwargs(cls, cfg: dict[str, Any], path: Path) -> dict[str, Any]:
        """From Hugging Face's `tokenizer_config.json`: extra_ids (or the sentinels it lists) and
        model_max_length."""
        out: dict[str, Any] = {}
        extra = cfg.get("extra_ids")
        if extra is None and isinstance(cfg.get("additional_special_tokens"), list):
            extra = sum(1 for t in cfg["additional_special_tokens"] if SENTINEL_PATTERN.fullmatch(str(t)))
        if extra is not None:
            if not isinstance(extra, int) or isinstance(extra, bool):
                raise SentencePieceError(f"{path}: extra_ids must be a whole number, got {extra!r}")
            out["extra_ids"] = extra
        return {**out, **model_max_length_of(cfg)}

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write spiece.model, tokenizer_config.json and special_tokens_map.json (Hugging Face's T5 layout),
        each file atomically."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        sentinels = [sentinel_token(i) for i in range(self.num_sentinels)]
        special = {"eos_token": EOS_TOKEN, "unk_token": UNK_TOKEN, "pad_token": PAD_TOKEN,
                   "additional_special_tokens": sentinels}
        config = {"tokenizer_class": "T5Tokenizer", "extra_ids": self.num_sentinels,
                  "model_max_length": self.model_max_length, "legacy": True, **special}
        atomic_write_bytes(d / SPIECE_NAME, self.sp.serialized_model_proto())
        atomic_write_bytes(d / TOKENIZER_CONFIG_NAME, (json.dumps(config, indent=2) + "\n").encode())
        atomic_write_bytes(d / SPECIAL_TOKENS_MAP_NAME, (json.dumps(special, indent=2) + "\n").encode())
        return d

    # -- the SentencePiece side --------------------------------------------------------------------------------

    def get_vocab(self) -> dict[str, int]:
        vocab = {self.sp.id_to_piece(i): i for i in range(self.base_size)}
        vocab.update({sentinel_token(i): self.sentinel_id(i) for i in range(self.num_sentinels)})
        return vocab

    def _encode_plain(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def _base_token(self, i: int) -> str:
        return self.sp.id_to_piece(i)

    def _base_id(self, token: str) -> int:
        return self.sp.piece_to_id(token)

    def _join_tokens(self, tokens: list[str]) -> str:
        # transformers' T5 decoder (Metaspace): pieces joined, each "▁" a space, the first one's dropped.
        return metaspace_join(tokens)

    def __repr__(self) -> str:
        return (f"T5Tokenizer({self.model_file.name}: {self.base_size} pieces + {self.num_sentinels} sentinels = "
                f"{self.vocab_size})")


class WordPieceT5Tokenizer(SentinelTokenizer):
    """T5's conventions over a BERT WordPiece vocabulary: the `BertTokenizer`'s ids, then `extra_ids` sentinels
    (`<extra_id_0>` the last id); `[SEP]` ends every sequence, `[PAD]` pads (id 0 in Google's layout, as T5's
    `<pad>`), `[MASK]` is BERT-style corruption's mask. A vocab.txt that already ends with the sentinels (one
    this class saved) is read as is."""

    def __init__(self, bert: BertTokenizer, extra_ids: int = NUM_SENTINELS, model_max_length: int = 512,
                 split_special_tokens: bool = False):
        self.bert = bert
        tokens = bert.ids_to_tokens
        saved = extra_ids and len(tokens) > extra_ids and all(
            tokens[len(tokens) - 1 - i] == sentinel_token(i) for i in range(extra_ids))
        self.base_size = len(tokens) - (extra_ids if saved else 0)
        ids = {name: getattr(bert, f"{name}_token_id") for name in ("pad", "sep", "unk", "mask", "cls")}
        missing = [name for name, i in ids.items() if i is None]
        if missing:
            raise TokenizerError(f"the vocabulary has no [{missing[0].upper()}] token, which T5 on WordPiece needs")
        self.pad_token_id, self.eos_token_id = ids["pad"], ids["sep"]
        self.unk_token_id, self.mask_token_id = ids["unk"], ids["mask"]
        self.pad_token, self.eos_token, self.unk_token = bert.pad_token, bert.sep_token, bert.unk_token
        self.base_special_ids = tuple(ids.values())
        self.special_text = {}  # BertTokenizer reads "[SEP]" in text as punctuation and a word; so do we
        self._init_sentinels(extra_ids, model_max_length, split_special_tokens)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, extra_ids: int | None = None, **overrides: Any) \
            -> "WordPieceT5Tokenizer":
        """From a vocab.txt or a BERT tokenizer folder (whose tokenizer_config.json may say `extra_ids`)."""
        path = Path(path)
        if extra_ids is None:
            cfg = path / TOKENIZER_CONFIG_NAME if path.is_dir() else None
            extra_ids = NUM_SENTINELS
            if cfg is not None and cfg.is_file():
                try:
                    extra_ids = int(json.loads(cfg.read_text(encoding="utf-8")).get("extra_ids", NUM_SENTINELS))
                except (ValueError, TypeError, AttributeError, json.JSONDecodeError):
                    raise TokenizerError(f"{cfg}: extra_ids must be a whole number") from None
        return cls(BertTokenizer.from_pretrained(path), extra_ids, **overrides)

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """The BERT tokenizer folder with the sentinels appended to vocab.txt (so `transformers`'
        BertTokenizer numbers them alike) and `extra_ids` / eos in tokenizer_config.json."""
        from ...tokenizer.wordpiece import save_vocab

        d = self.bert.save_pretrained(directory)
        base = self.bert.ids_to_tokens[:self.base_size]
        save_vocab(base + [sentinel_token(i) for i in reversed(range(self.num_sentinels))], d / "vocab.txt")
        cfg_path = d / TOKENIZER_CONFIG_NAME
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        cfg.update(extra_ids=self.num_sentinels, eos_token=self.eos_token,
                   additional_special_tokens=[sentinel_token(i) for i in range(self.num_sentinels)])
        tmp = cfg_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, cfg_path)
        return d

    def _encode_plain(self, text: str) -> list[int]:
        return self.bert.encode(text, add_special_tokens=False)

    def _base_token(self, i: int) -> str:
        return self.bert.ids_to_tokens[i]

    def _base_id(self, token: str) -> int:
        i = self.bert.convert_tokens_to_ids(token)
        return i if i < self.base_size else self.unk_token_id

    def _join_tokens(self, tokens: list[str]) -> str:
        return self.bert.convert_tokens_to_string(tokens)

    def __repr__(self) -> str:
        return (f"WordPieceT5Tokenizer({self.base_size} WordPiece tokens + {self.num_sentinels} sentinels = "
                f"{self.vocab_size})")


def load_text_to_text_tokenizer(path: str | os.PathLike, **overrides: Any) -> SentinelTokenizer:
    """The T5 tokenizer a path names: a SentencePiece `.model` file or a folder with `spiece.model` ->
    `T5Tokenizer`; a vocab.txt or a BERT tokenizer folder -> `WordPieceT5Tokenizer`."""
    path = Path(path)
    if not path.exists():
        raise TokenizerError(f"{path}: no such vocabulary file or tokenizer folder")
    if is_sentencepiece_path(path):
        return T5Tokenizer.from_pretrained(path, **overrides)
    return WordPieceT5Tokenizer.from_pretrained(path, **overrides)


# ---------------------------------------------------------------------------------------------- training
@dataclass(frozen=True)
class SentencePieceTrainConfig:
    """T5's SentencePiece settings (unigram; `<pad>` 0, `</s>` 1, `<unk>` 2, no `<s>`; no byte fallback;
    NFKC normalisation) and the knobs worth having.

    Determinism: with the same corpus, settings and `threads`, `sentencepiece` writes the same bytes (checked
    by the tests); a different `threads` gives a slightly different model (the EM statistics are summed per
    thread), which is why it is a fixed setting rather than the machine's core count."""

    vocab_size: int
    character_coverage: float = 0.9995
    max_sentence_length: int = 16384  # bytes; longer lines are skipped by the trainer (its default is 4192)
    threads: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        if self.vocab_size < 8:
            raise TokenizerError(f"--vocab-size must be at least 8 for a SentencePiece model, got {self.vocab_size}")
        if not 0.9 <= self.character_coverage <= 1.0:
            raise TokenizerError(f"character_coverage must be in [0.9, 1], got {self.character_coverage}")
        if self.threads < 1:
            raise TokenizerError(f"threads must be at least 1, got {self.threads}")

    def trainer_args(self) -> dict[str, Any]:
        return dict(vocab_size=self.vocab_size, model_type="unigram", pad_id=T5_SPECIAL_IDS[PAD_TOKEN],
                    eos_id=T5_SPECIAL_IDS[EOS_TOKEN], unk_id=T5_SPECIAL_IDS[UNK_TOKEN], bos_id=-1,
                    pad_piece=PAD_TOKEN, eos_piece=EOS_TOKEN, unk_piece=UNK_TOKEN, byte_fallback=False,
                    normalization_rule_name="nmt_nfkc", character_coverage=self.character_coverage,
                    max_sentence_length=self.max_sentence_length, num_threads=self.threads)


def train_sentencepiece(paths: Iterable[str | os.PathLike], config: SentencePieceTrainConfig, out: str | os.PathLike,
                        *, on_decode_error: str = "replace", progress: bool = False,
                        verbose: bool = False) -> tuple[Path, SentencePieceTrainReport]:
    """Learn a SentencePiece model with T5's settings from UTF-8 text files (one sentence or paragraph per line;
    blank lines are skipped; `bertlab.tokenizer.sentencepiece.learn_sentencepiece`) and write it: to `out` itself
    when it ends in `.model`, else as a Hugging Face T5 tokenizer folder (`spiece.model`, `tokenizer_config.json`,
    `special_tokens_map.json`). Returns the model file and what was read."""
    model, report = learn_sentencepiece(paths, config.trainer_args(), config.seed, on_decode_error=on_decode_error,
                                        progress=progress, verbose=verbose)
    out = Path(out)
    if out.suffix == ".model":
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out, model)
        return out, report
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{SPIECE_NAME}.training"
    atomic_write_bytes(tmp, model)
    try:
        T5Tokenizer(tmp).save_pretrained(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out / SPIECE_NAME, report


def train_vocabulary(paths: Iterable[str | os.PathLike], out: str | os.PathLike, *, vocab_size: int,
                     character_coverage: float, threads: int, seed: int, on_decode_error: str = "replace",
                     progress: bool = False, verbose: bool = False
                     ) -> tuple[Path, SentencePieceTrainReport, T5Tokenizer]:
    """`bertlab vocab train --kind sentencepiece`: a SentencePiece model of T5's settings from `paths`, written to
    `out`; (its path, the trainer's report, the tokenizer on it)."""
    config = SentencePieceTrainConfig(vocab_size, character_coverage=character_coverage, threads=threads, seed=seed)
    path, report = train_sentencepiece(paths, config, out, on_decode_error=on_decode_error, progress=progress,
                                       verbose=verbose)
    return path, report, T5Tokenizer(path)


# The kinds of vocabulary `bertlab vocab train` trains with T5's settings (`models.registry.vocabulary_trainer`)
VOCABULARY_TRAINERS = {"sentencepiece": train_vocabulary}
