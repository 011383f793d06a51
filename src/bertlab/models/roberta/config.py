"""`RobertaConfig`: BERT's config with RoBERTa's defaults (Hugging Face's `RobertaConfig` field for field).

RoBERTa numbers positions as fairseq does, from `pad_token_id + 1`: the table's first `pad_token_id + 1` rows
are never used by a token, so 514 positions hold 512 tokens (`max_sequence_length`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from ..bert.config import BertConfig, is_preset, preset_names
from ...core.errors import ConfigError


@dataclass
class RobertaConfig(BertConfig):
    vocab_size: int = 50265
    max_position_embeddings: int = 514
    type_vocab_size: int = 1
    layer_norm_eps: float = 1e-5
    pad_token_id: int = 1

    model_type = "roberta"

    def validate(self, source: str = "config") -> None:
        super().validate(source)
        if self.max_position_embeddings <= self.pad_token_id + 1:
            raise ConfigError(f"{source}: field 'max_position_embeddings' ({self.max_position_embeddings}) leaves "
                              f"no position for a token: positions start at pad_token_id + 1 = {self.pad_token_id + 1}")

    @property
    def max_sequence_length(self) -> int:
        return self.max_position_embeddings - self.pad_token_id - 1

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        # Hugging Face's RobertaConfig defaults for the special ids its tokenizer and generation read
        data.setdefault("bos_token_id", 0)
        data.setdefault("eos_token_id", 2)
        return data

    @classmethod
    def preset_lookup(cls):
        return is_preset, functools.partial(roberta_preset, config_class=cls), preset_names


def roberta_preset(name: str, config_class: type[RobertaConfig] | None = None, **overrides: Any) -> RobertaConfig:
    """BERT's sizes by BERT's preset names (`base`, `L4-H256`, ...) in `config_class` (RoBERTa's, or a family's
    on it: XLM-R, MPNet), with that class's vocabulary and positions."""
    from ..bert.config import preset

    bert = preset(name)
    fields = dict(num_hidden_layers=bert.num_hidden_layers, hidden_size=bert.hidden_size,
                  num_attention_heads=bert.num_attention_heads, intermediate_size=bert.intermediate_size)
    fields.update(overrides)
    return (config_class or RobertaConfig)(**fields)
