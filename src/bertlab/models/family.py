"""What a model family is to the rest of bertlab: the one object a family folder exports (`family.py`'s `FAMILY`).

Recipes, tasks, inference and serving never name a family's classes; they ask the family of a folder (read from
its `config.json`'s `model_type`, see `registry.py`) for its config class, its bare encoder, the head of a kind
(`nn/heads.py`) and its tokenizer. A new family is a folder with a `family.py` and one line in the registry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BertlabError


@dataclass(frozen=True)
class Family:
    model_type: str  # config.json's "model_type"
    name: str  # as people write it: "BERT", "RoBERTa"
    config_class: type  # `.from_json_file(folder or file)`, `.from_dict`, `.to_dict()`
    base_model: type | None  # the bare encoder: `model(input_ids=, attention_mask=)` -> `.last_hidden_state`
    heads: Mapping[str, Any]  # head kind (`nn/heads.py`) -> HeadSpec
    tokenizer: Callable[[Path], Any]  # a model folder -> its tokenizer (the call surface of `BertTokenizer`)
    # whether the encoder reads token type (segment) ids; RoBERTa's family and DistilBERT have one type or none
    uses_token_types: bool = True

    def head(self, kind: str, purpose: str = "this command"):
        """The family's HeadSpec of `kind`; one line when the family has no such head."""
        if kind not in self.heads:
            have = ", ".join(self.heads) or "none"
            raise BertlabError(f"{self.name} models have no {kind} head, which {purpose} needs (they have: {have})")
        return self.heads[kind]

    def model_classes(self) -> dict[str, type]:
        """Every loadable model class of the family by architecture name: the bare encoder and each head."""
        classes = {spec.architecture: spec.model_class for spec in self.heads.values()}
        if self.base_model is not None:
            classes = {self.base_model.__name__: self.base_model, **classes}
        return classes

    def load_tokenizer(self, folder: str | Path):
        return self.tokenizer(Path(folder))
