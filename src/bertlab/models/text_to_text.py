"""The text-to-text interface: what a family that answers by generating text gives the layers above `models/`.

A text-to-text model (T5's) reads and writes text through a tokenizer with sentinel ids (`<extra_id_0>`,
`<extra_id_1>`, ... standing for the spans a corrupted input left out), an end-of-sequence token appended to
every sequence and a pad id that doubles as the decoder's start token. `TextToTextTokenizer` is that interface;
generation (`infer/generate.py`), the text-to-text recipes and their data use nothing else of a tokenizer, and
find a folder's through its family (`Family.text_to_text_tokenizer`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

SENTINEL_PATTERN = re.compile(r"<extra_id_(\d+)>")


def sentinel_token(i: int) -> str:
    """The text of sentinel i: `<extra_id_i>`."""
    return f"<extra_id_{i}>"


@runtime_checkable
class TextToTextTokenizer(Protocol):
    """What text-to-text objectives, data and generation need of a tokenizer (T5's tokenizers implement it)."""

    pad_token_id: int  # also the decoder's start token
    eos_token_id: int  # appended to every sequence
    unk_token_id: int
    mask_token_id: int  # what BERT-style / MASS-style corruption writes over a token
    num_sentinels: int

    @property
    def vocab_size(self) -> int: ...  # the model's embedding size: base vocabulary + sentinels

    def sentinel_id(self, i: int) -> int: ...

    def encode(self, text: str, pair: str | None = None, add_special_tokens: bool = True,
               truncation: bool | str | None = None, max_length: int | None = None) -> list[int]: ...

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str: ...

    def convert_ids_to_tokens(self, ids: int | Iterable[int], skip_special_tokens: bool = False) -> str | list[str]: ...


@dataclass(frozen=True)
class Corruptions:
    """A family's corruption transforms for text-to-text pre-training data (T5's seven): what `prepare --objective
    NAME` records and the loader applies when it makes a batch. In the family folder's `denoising.py` as
    `CORRUPTIONS`, found by `models.registry.corruptions()` without importing any model code."""

    model_type: str  # the family whose tokenizer (`Family.text_to_text`) reads the data's vocabulary
    objectives: Mapping[str, Any]  # name -> the transform's class, in the order `--help` lists them
    make: Callable[..., Any]  # (name, **params) -> the transform: `.check`, `.source_length`, `.params()`, ...
    vocab: Callable[..., Any]  # the sentinel layout a transform needs: `(**saved)`, `.from_tokenizer(tokenizer)`
