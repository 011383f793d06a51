"""`DistilBertConfig`: Hugging Face's field names (`dim`, `n_layers`, `n_heads`, `hidden_dim`, `activation`,
...), read and written as `transformers` writes them, and BERT's names for the same sizes (`hidden_size`,
`num_hidden_layers`, ...) as read-only properties -- so BERT's modules, which DistilBERT's encoder is built
from, and bertlab's recipes read a DistilBERT config as they read a BERT one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...core.errors import ConfigError
from ...core.jsonconfig import FieldConfig

SIZE_LIMITS = {"vocab_size": 1 << 22, "dim": 1 << 16, "n_layers": 1 << 10, "n_heads": 1 << 10,
               "hidden_dim": 1 << 18, "max_position_embeddings": 1 << 20}


@dataclass
class DistilBertConfig(FieldConfig):
    vocab_size: int = 30522
    max_position_embeddings: int = 512
    sinusoidal_pos_embds: bool = False  # fixed sin/cos positions (Vaswani et al.) instead of learned ones
    n_layers: int = 6
    n_heads: int = 12
    dim: int = 768
    hidden_dim: int = 3072
    dropout: float = 0.1
    attention_dropout: float = 0.1
    activation: str = "gelu"
    initializer_range: float = 0.02
    qa_dropout: float = 0.1
    seq_classif_dropout: float = 0.2
    pad_token_id: int = 0
    id2label: dict[int, str] | None = None
    attn_implementation: str = "sdpa"  # bertlab's attention kernel (`nn/attention.py`); not written when sdpa
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    model_type = "distilbert"
    config_files = ("config.json",)
    layer_norm_eps = 1e-12  # fixed in DistilBERT's code, not a config field
    classifier_dropout = None
    type_vocab_size = 0  # no token types

    # BERT's names for DistilBERT's sizes (Hugging Face's `attribute_map` has the first three)
    hidden_size = property(lambda self: self.dim)
    num_hidden_layers = property(lambda self: self.n_layers)
    num_attention_heads = property(lambda self: self.n_heads)
    intermediate_size = property(lambda self: self.hidden_dim)
    hidden_act = property(lambda self: self.activation)
    hidden_dropout_prob = property(lambda self: self.dropout)
    attention_probs_dropout_prob = property(lambda self: self.attention_dropout)

    @property
    def head_size(self) -> int:
        return self.dim // self.n_heads

    def check(self, source: str) -> None:
        self.check_sizes(source, SIZE_LIMITS, (("vocab_size", "dim"), ("max_position_embeddings", "dim"),
                                               ("hidden_dim", "dim")))
        if self.dim % self.n_heads:
            raise ConfigError(f"{source}: field 'dim' ({self.dim}) must be divisible by 'n_heads' ({self.n_heads})")
        if self.sinusoidal_pos_embds and self.dim % 2:
            raise ConfigError(f"{source}: sinusoidal positions need an even 'dim', got {self.dim}")
        for name in ("dropout", "attention_dropout", "qa_dropout", "seq_classif_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{source}: field '{name}' must be in [0, 1), got {getattr(self, name)}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(f"{source}: field 'pad_token_id' ({self.pad_token_id}) is outside the vocabulary")
