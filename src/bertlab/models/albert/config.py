"""`AlbertConfig`: Hugging Face's field names and defaults (ALBERT-xxlarge's sizes), read and written as
`transformers` writes them. Beside BERT's fields: `embedding_size` (E, the factorised embedding width, below
the hidden size H), `num_hidden_groups` (how many distinct blocks the layers share) and `inner_group_num`
(blocks per group), and `classifier_dropout_prob` (the heads' dropout)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...core.errors import ConfigError
from ...core.jsonconfig import FieldConfig

SIZE_LIMITS = {"vocab_size": 1 << 22, "embedding_size": 1 << 16, "hidden_size": 1 << 16,
               "num_hidden_layers": 1 << 10, "num_hidden_groups": 1 << 10, "inner_group_num": 1 << 6,
               "num_attention_heads": 1 << 10, "intermediate_size": 1 << 18, "max_position_embeddings": 1 << 20,
               "type_vocab_size": 1 << 16}


@dataclass
class AlbertConfig(FieldConfig):
    vocab_size: int = 30000
    embedding_size: int = 128
    hidden_size: int = 4096
    num_hidden_layers: int = 12
    num_hidden_groups: int = 1
    num_attention_heads: int = 64
    intermediate_size: int = 16384
    inner_group_num: int = 1
    hidden_act: str = "gelu_new"
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    classifier_dropout_prob: float = 0.1
    pad_token_id: int = 0
    id2label: dict[int, str] | None = None
    attn_implementation: str = "sdpa"  # bertlab's attention kernel (`nn/attention.py`); not written when sdpa
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    model_type = "albert"
    config_files = ("config.json",)
    classifier_dropout = None  # BERT's name; ALBERT's heads read classifier_dropout_prob

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def group_of_layer(self, layer: int) -> int:
        """The group whose block(s) layer `layer` runs: layers are split into `num_hidden_groups` equal runs
        (the float arithmetic of ALBERT's code, so an uneven split groups layers as it does)."""
        return int(layer / (self.num_hidden_layers / self.num_hidden_groups))

    def check(self, source: str) -> None:
        self.check_sizes(source, SIZE_LIMITS, (("vocab_size", "embedding_size"),
                                               ("max_position_embeddings", "embedding_size"),
                                               ("intermediate_size", "hidden_size")))
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"{source}: field 'hidden_size' ({self.hidden_size}) must be divisible by "
                              f"'num_attention_heads' ({self.num_attention_heads})")
        if self.num_hidden_groups > self.num_hidden_layers:
            raise ConfigError(f"{source}: field 'num_hidden_groups' ({self.num_hidden_groups}) is more than "
                              f"'num_hidden_layers' ({self.num_hidden_layers}): a group would run no layer")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{source}: field '{name}' must be in [0, 1), got {getattr(self, name)}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(f"{source}: field 'pad_token_id' ({self.pad_token_id}) is outside the vocabulary")
        if self.extra.get("position_embedding_type", "absolute") != "absolute":
            raise ConfigError(f"{source}: field 'position_embedding_type' is "
                              f"{self.extra['position_embedding_type']!r}; only 'absolute' (learned positions) is "
                              "supported")
