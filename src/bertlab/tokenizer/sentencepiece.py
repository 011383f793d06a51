"""SentencePiece models (`spiece.model`) through the `sentencepiece` library: reading one (`load_processor`),
telling a SentencePiece path from a WordPiece one, and learning one from a corpus (`learn_sentencepiece`, with
the settings a model family gives). The algorithm is the library's and every family that uses SentencePiece
shares this; a family's conventions on top of it -- T5's special ids, sentinels, tokenizer folder and trainer
settings -- are the family's (`bertlab.models.t5.tokenizer`).

`sentencepiece` (a dependency of bertlab) is imported only when a model is loaded or trained, so the rest of
bertlab starts without it, and an install without it says so in one line when it is needed.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import TOKENIZER_CONFIG_NAME, TokenizerError, check_fits_model, check_valid_unicode

SPIECE_NAME = "spiece.model"
INSTALL_HINT = "pip install sentencepiece (a dependency of bertlab: pip install -e . installs it)"


class SentencePieceError(TokenizerError):
    """A file that is not a SentencePiece model (or not a T5-style one), or the library is missing."""


def import_sentencepiece():
    """The `sentencepiece` library, or one line saying how to install it."""
    try:
        import sentencepiece
    except ImportError:
        raise SentencePieceError(f"SentencePiece models need the sentencepiece package: {INSTALL_HINT}") from None
    return sentencepiece


def is_sentencepiece_path(path: str | os.PathLike) -> bool:
    """Whether `path` names a SentencePiece model: a `.model` file, or a folder holding `spiece.model`."""
    path = Path(path)
    return (path.is_dir() and (path / SPIECE_NAME).is_file()) or (not path.is_dir() and path.suffix == ".model")


def load_processor(model_file: str | os.PathLike):
    """A `sentencepiece.SentencePieceProcessor` of `model_file`; anything that is not a model is one line."""
    spm = import_sentencepiece()
    path = Path(model_file)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SentencePieceError(f"{path}: cannot read the SentencePiece model ({e.strerror or e})") from None
    processor = spm.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(data)
    except (RuntimeError, OSError, ValueError, TypeError):
        raise SentencePieceError(f"{path}: not a SentencePiece model (expected a model file written by "
                                 "SentencePiece's trainer, such as a T5 spiece.model)") from None
    if processor.get_piece_size() == 0:
        raise SentencePieceError(f"{path}: not a SentencePiece model (it has no pieces)")
    return processor


# TrainerSpec.model_type (sentencepiece_model.proto), as the trainer records it in every model file
SENTENCEPIECE_MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data):
            raise ValueError("truncated varint")
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def _fields(data: bytes):
    """(field number, wire type, value) of a serialized protobuf message: varints as ints, the rest as bytes."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2:
            size, i = _varint(data, i)
            value, i = data[i:i + size], i + size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, i = data[i:i + size], i + size
        else:
            raise ValueError(f"wire type {wire}")
        yield number, wire, value


def sentencepiece_model_type(processor) -> str:
    """"unigram", "bpe", "word" or "char": the algorithm the model was trained as (its TrainerSpec), read from
    the serialized model without the protobuf package; a model that does not say is unigram (the default)."""
    try:
        for number, wire, value in _fields(processor.serialized_model_proto()):
            if number == 2 and wire == 2:  # ModelProto.trainer_spec
                for n, w, v in _fields(value):
                    if n == 3 and w == 0:  # TrainerSpec.model_type
                        return SENTENCEPIECE_MODEL_TYPES.get(v, f"type {v}")
    except ValueError:
        pass  # the processor loaded it, so it is a model; an unreadable spec reads as the default
    return "unigram"


def byte_to_char(text: str) -> list[int]:
    """For each UTF-8 byte offset of `text` (and its end), the index of the character it falls in: SentencePiece
    reports a piece's `begin`/`end` in bytes, offsets are in characters."""
    table: list[int] = []
    for i, c in enumerate(text):
        table.extend([i] * len(c.encode("utf-8")))
    table.append(len(text))
    return table


def metaspace_join(tokens: list[str]) -> str:
    """Pieces joined, each "▁" a space, the first one's dropped (`transformers`' Metaspace decoder)."""
    text = "".join(tokens).replace("▁", " ")
    return text[1:] if tokens and tokens[0].startswith("▁") else text


class SpecialsThenPieces:
    """For a SentencePiece tokenizer with `BertTokenizer`'s call surface that normalises text itself (ALBERT's,
    DeBERTa's): the special tokens written in a text (`_special_split`, a compiled regex with one group of the
    alternatives, longest first) are split out first, each their id (`_special_ids()`), and each stretch of plain
    text between them goes through `_plain(part, base, ids, offsets, words)`, which appends its pieces (so a
    stretch gets its own leading `▁`); words are the whitespace-separated runs (`WORD`) of
    `normalize_with_origins(text)`; pieces decode as `transformers`' Metaspace decoder joins them."""

    WORD = r"\S+"

    def _special_ids(self) -> dict[str, int]:
        return {t: self.vocab[t] for t in self.all_special_tokens if t in self.vocab}

    def _encode_seq(self, text: str) -> tuple[list, list, list]:
        if not isinstance(text, str):
            raise SentencePieceError(f"expected text as str, got {type(text).__name__}")
        check_valid_unicode(text, SentencePieceError)
        specials = self._special_ids()
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        words: list[int] = []
        pos = 0
        for part in self._special_split.split(text):
            if part in specials:
                ids.append(specials[part])
                offsets.append((pos, pos + len(part)))
                words.append(words[-1] + 1 if words else 0)
            elif part:
                self._plain(part, pos, ids, offsets, words)
            pos += len(part)
        return ids, offsets, words

    def _encode_seq_py(self, text: str) -> tuple[list, list, list]:
        return self._encode_seq(text)

    def basic_tokenize_with_offsets(self, text: str) -> list[tuple[str, int, int]]:
        """Words (whitespace-separated, normalised) with their original spans."""
        norm, spans = self.normalize_with_origins(text)
        return [(m[0], spans[m.start()][0], spans[m.end() - 1][1]) for m in re.finditer(self.WORD, norm)]

    def convert_tokens_to_string(self, tokens) -> str:
        return metaspace_join(list(tokens))

    def _check_folder(self, model_file: Path, folder: Path) -> None:
        # more pieces than the model has embeddings: refused, as BertTokenizer does
        check_fits_model(self, model_file, folder / "config.json")

    def _save(self, directory: str | os.PathLike, config: dict[str, Any]) -> Path:
        """The model file (`MODEL_NAME`) and `config` as tokenizer_config.json in `directory`, each atomically."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(d / self.MODEL_NAME, self.sp.serialized_model_proto())
        atomic_write_bytes(d / TOKENIZER_CONFIG_NAME, (json.dumps(config, indent=2) + "\n").encode())
        return d


class PicklableProcessor:
    """For a tokenizer holding a SentencePiece processor in `self.sp`: the processor is a C++ object, so a pickle
    (DataLoader workers, process pools) carries its model's bytes and rebuilds it. `_unpicklable` names attributes
    left out; `_unpickled()` re-derives them."""

    _unpicklable: tuple[str, ...] = ()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["sp"] = self.sp.serialized_model_proto()
        for name in self._unpicklable:
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        proto = state.pop("sp")
        self.__dict__.update(state)
        self.sp = import_sentencepiece().SentencePieceProcessor()
        self.sp.LoadFromSerializedProto(proto)
        self._unpickled()

    def _unpickled(self) -> None:
        pass


class SentencePieceBinding(PicklableProcessor):
    """What every family's SentencePiece tokenizer (T5's, ALBERT's, XLM-R's, in their folders) shares: the model
    file found in a folder (`MODEL_NAME`) or given itself, Hugging Face's `tokenizer_config.json` read once
    (`read_tokenizer_config`), and the processor carried through pickling. A binding says which settings of the
    config its constructor takes (`config_kwargs`) and may check the loaded tokenizer against the folder
    (`_check_folder`)."""

    MODEL_NAME = SPIECE_NAME
    FAMILY_NAME = ""  # "ALBERT's": said when a folder lacks the model file

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **overrides: Any):
        """From a folder holding `MODEL_NAME` (and `tokenizer_config.json`), or from the `.model` file itself.
        Keyword arguments override the folder's settings."""
        path = Path(path)
        kwargs: dict[str, Any] = {}
        if path.is_dir():
            model_file = path / cls.MODEL_NAME
            if not model_file.is_file():
                raise SentencePieceError(f"{path}: no {cls.MODEL_NAME} in this folder{cls._missing_hint(path)}")
            cfg_path = path / TOKENIZER_CONFIG_NAME
            if cfg_path.is_file():
                kwargs.update(cls.config_kwargs(read_tokenizer_config(cfg_path), cfg_path))
        elif path.is_file():
            model_file = path
        else:
            raise SentencePieceError(f"{path}: no such SentencePiece model file or tokenizer folder")
        kwargs.update(overrides)
        tokenizer = cls(model_file, **kwargs)
        if path.is_dir():
            tokenizer._check_folder(model_file, path)
        return tokenizer

    @classmethod
    def config_kwargs(cls, cfg: dict[str, Any], path: Path) -> dict[str, Any]:
        """The constructor arguments this binding takes from a tokenizer_config.json: model_max_length here."""
        return model_max_length_of(cfg)

    @classmethod
    def _missing_hint(cls, folder: Path) -> str:
        return f" ({cls.FAMILY_NAME} SentencePiece model)" if cls.FAMILY_NAME else ""

    def _check_folder(self, model_file: Path, folder: Path) -> None:
        pass


def read_tokenizer_config(path: Path) -> dict[str, Any]:
    """A Hugging Face tokenizer_config.json as a dict; anything else is one line."""
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SentencePieceError(f"{path}: cannot read tokenizer config: {getattr(e, 'msg', e)}") from None
    if not isinstance(cfg, dict):
        raise SentencePieceError(f"{path}: tokenizer config must be a JSON object")
    return cfg


def model_max_length_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """{"model_max_length": n} when the config states a real limit (Hugging Face writes 1e30 for none), else {}."""
    mml = cfg.get("model_max_length")
    if isinstance(mml, int) and not isinstance(mml, bool) and 0 < mml < 10**9:
        return {"model_max_length": mml}
    return {}


def special_tokens_of(cfg: dict[str, Any], names) -> dict[str, str]:
    """The special tokens a `tokenizer_config.json` sets among `names` ("mask_token", ...), each as its text
    (an AddedToken written out, {"content": "[MASK]", ...}, is read as its content)."""
    out: dict[str, str] = {}
    for key in names:
        value = cfg.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` under a temporary name, then rename it into place."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------------------------------------- training
@dataclass
class SentencePieceTrainReport:
    """What `learn_sentencepiece` read: the lines it gave the trainer, those it could not decode, characters."""

    lines: int = 0
    bad_lines: int = 0
    chars: int = 0


def learn_sentencepiece(paths: Iterable[str | os.PathLike], trainer_args: dict[str, Any], seed: int, *,
                        on_decode_error: str = "replace", progress: bool = False,
                        verbose: bool = False) -> tuple[bytes, SentencePieceTrainReport]:
    """Learn a SentencePiece model from UTF-8 text files (one sentence or paragraph per line; blank lines are
    skipped) with `trainer_args` (`SentencePieceTrainer`'s settings: a model family's, such as T5's
    `SentencePieceTrainConfig`) and the random `seed`. Returns the model's bytes and what was read. The corpus
    is streamed to the trainer (which keeps the sentences it samples in memory)."""
    import io

    from .train import DECODE_ERROR_POLICIES, WordCounts, _check_paths, corpus_lines

    spm = import_sentencepiece()
    if on_decode_error not in DECODE_ERROR_POLICIES:
        raise TokenizerError(f"on_decode_error must be one of {', '.join(DECODE_ERROR_POLICIES)}")
    files = _check_paths(paths)
    stats = WordCounts(words={})
    report = SentencePieceTrainReport()

    failure: list[BaseException] = []

    def sentences():
        # An error while reading (a bad line under on_decode_error="error") must reach the user as it is, not
        # as whatever the C++ trainer makes of an exception inside its input iterator: it is kept and re-raised.
        try:
            for line in corpus_lines(files, stats, on_decode_error=on_decode_error, progress=progress,
                                     desc="reading for SentencePiece"):
                line = line.strip()
                if line:
                    report.lines += 1
                    report.chars += len(line)
                    yield line
        except BaseException as e:
            failure.append(e)

    buffer = io.BytesIO()
    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=sentences(), model_writer=buffer,
                                       minloglevel=0 if verbose else 1, **trainer_args)
    except RuntimeError as e:
        if not failure and report.lines:
            # The trainer's own complaints (a vocabulary larger than the corpus allows, ...): one line each.
            raise TokenizerError(f"SentencePiece training failed: {str(e).strip().splitlines()[-1]}") from None
    if failure:
        raise failure[0]
    report.bad_lines = stats.bad_lines
    if not report.lines:
        raise TokenizerError(f"corpus is empty: no text in {', '.join(str(p) for p in files)}")
    return buffer.getvalue(), report

