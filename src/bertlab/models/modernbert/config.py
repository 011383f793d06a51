"""`ModernBertConfig`: Hugging Face's `ModernBertConfig` field for field, read and written as `transformers` 5
writes it, and the older form of the released checkpoints (`global_attn_every_n_layers`, `global_rope_theta`,
`local_rope_theta`) read as well.

Which layers attend globally and with what rotary base is resolved once, on load, into `layer_types` and
`rope_parameters` (the form transformers 5 writes back): layer i is global when i % global_attn_every_n_layers
== 0 (default 3), else local with a window of `local_attention` tokens (128: ±64 around each query).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...core.errors import ConfigError, shorten
from ...core.jsonconfig import KNOWN_ACTIVATIONS, FieldConfig

SIZE_LIMITS = {"vocab_size": 1 << 22, "hidden_size": 1 << 16, "num_hidden_layers": 1 << 10,
               "num_attention_heads": 1 << 10, "intermediate_size": 1 << 18, "max_position_embeddings": 1 << 22,
               "local_attention": 1 << 22}
LAYER_TYPES = ("full_attention", "sliding_attention")
# The rotary bases of the release, used where a config names none (Hugging Face's `default_theta`)
DEFAULT_THETA = {"full_attention": 160_000.0, "sliding_attention": 10_000.0}
_OLD_THETA_KEYS = {"full_attention": "global_rope_theta", "sliding_attention": "local_rope_theta"}


@dataclass
class ModernBertConfig(FieldConfig):
    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152  # the GeGLU's width: Wi makes 2x this (value and gate)
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    hidden_activation: str = "gelu"
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    initializer_cutoff_factor: float = 2.0
    norm_eps: float = 1e-5
    norm_bias: bool = False
    pad_token_id: int = 50283
    bos_token_id: int = 50281
    eos_token_id: int = 50282
    cls_token_id: int = 50281
    sep_token_id: int = 50282
    attention_bias: bool = False
    attention_dropout: float = 0.0
    local_attention: int = 128  # the whole window: a query sees keys within local_attention // 2 of it
    embedding_dropout: float = 0.0
    mlp_bias: bool = False
    mlp_dropout: float = 0.0
    decoder_bias: bool = True
    classifier_pooling: str = "cls"  # or "mean" (over the real tokens)
    classifier_dropout: float = 0.0
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    sparse_prediction: bool = False  # masked LM with labels: logits of the labelled positions only
    sparse_pred_ignore_index: int = -100
    tie_word_embeddings: bool = True
    layer_types: list[str] | None = None  # per layer: "full_attention" or "sliding_attention"
    rope_parameters: dict[str, Any] | None = None  # layer type -> {"rope_type": "default", "rope_theta": θ}
    id2label: dict[int, str] | None = None
    attn_implementation: str = "sdpa"  # bertlab's attention kernel (`nn/attention.py`); not written when sdpa
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    model_type = "modernbert"
    config_files = ("config.json",)
    type_vocab_size = 0  # no token types

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def sliding_window(self) -> int:
        """How far a local layer's query sees on each side (Hugging Face's `sliding_window`): |i - j| <= this."""
        return self.local_attention // 2

    def rope_theta(self, layer_type: str) -> float:
        return float(self.rope_parameters[layer_type]["rope_theta"])

    def check(self, source: str) -> None:
        self.check_sizes(source, SIZE_LIMITS, (("vocab_size", "hidden_size"), ("intermediate_size", "hidden_size")))
        if self.hidden_size % self.num_attention_heads or self.head_size % 2:
            raise ConfigError(f"{source}: field 'hidden_size' ({self.hidden_size}) must be divisible by "
                              f"'num_attention_heads' ({self.num_attention_heads}) into heads of an even size "
                              "(rotary positions rotate pairs)")
        for name in ("hidden_activation", "classifier_activation"):
            if getattr(self, name) not in KNOWN_ACTIVATIONS:
                raise ConfigError(f"{source}: field '{name}' is {shorten(getattr(self, name))}; expected one of "
                                  f"{', '.join(KNOWN_ACTIVATIONS)}")
        for name in ("attention_dropout", "embedding_dropout", "mlp_dropout", "classifier_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{source}: field '{name}' must be in [0, 1), got {getattr(self, name)}")
        if self.classifier_pooling not in ("cls", "mean"):
            raise ConfigError(f"{source}: field 'classifier_pooling' is {shorten(self.classifier_pooling)}; "
                              "expected 'cls' or 'mean'")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(f"{source}: field 'pad_token_id' ({self.pad_token_id}) is outside the vocabulary")
        if not self.tie_word_embeddings:
            raise ConfigError(f"{source}: tie_word_embeddings false (a decoder apart from the token embeddings) "
                              "is not supported")
        if self.extra.get("reference_compile") not in (None, False, True):
            raise ConfigError(f"{source}: field 'reference_compile' must be true, false or null")
        self._resolve_layer_types(source)
        self._resolve_rope(source)

    def _resolve_layer_types(self, source: str) -> None:
        if self.layer_types is None:
            every = self.extra.get("global_attn_every_n_layers", 3)
            if isinstance(every, bool) or not isinstance(every, int) or every < 1:
                raise ConfigError(f"{source}: field 'global_attn_every_n_layers' must be a positive integer, "
                                  f"got {shorten(every)}")
            self.layer_types = [LAYER_TYPES[bool(i % every)] for i in range(self.num_hidden_layers)]
        if (not isinstance(self.layer_types, list) or len(self.layer_types) != self.num_hidden_layers
                or any(t not in LAYER_TYPES for t in self.layer_types)):
            raise ConfigError(f"{source}: field 'layer_types' must list {self.num_hidden_layers} of "
                              f"{' / '.join(LAYER_TYPES)}, got {shorten(self.layer_types)}")

    def _resolve_rope(self, source: str) -> None:
        given = self.rope_parameters if self.rope_parameters is not None else {}
        if not isinstance(given, dict):
            raise ConfigError(f"{source}: field 'rope_parameters' must be an object, got {shorten(given)}")
        if self.extra.get("rope_scaling") is not None:
            raise ConfigError(f"{source}: rope_scaling is not supported (default rotary positions only)")
        resolved = {}
        for layer_type in LAYER_TYPES:
            params = dict(given.get(layer_type) or {"rope_type": "default"})
            params.setdefault("rope_theta", self.extra.get(_OLD_THETA_KEYS[layer_type], DEFAULT_THETA[layer_type]))
            kind = params.get("rope_type", params.get("type", "default"))
            if kind != "default":
                raise ConfigError(f"{source}: rope_parameters.{layer_type}.rope_type {shorten(kind)} is not "
                                  "supported (default rotary positions only)")
            theta = params["rope_theta"]
            if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
                raise ConfigError(f"{source}: rope_parameters.{layer_type}.rope_theta must be a positive number, "
                                  f"got {shorten(theta)}")
            resolved[layer_type] = {"rope_theta": float(theta), "rope_type": "default"}
        self.rope_parameters = resolved

    @classmethod
    def preset_lookup(cls):
        from ..bert.config import is_preset, preset_names

        return is_preset, modernbert_preset, preset_names

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        for old in ("global_attn_every_n_layers", *_OLD_THETA_KEYS.values()):
            data.pop(old, None)  # resolved into layer_types and rope_parameters, which win on reading back
        return data


# ModernBERT-base's GeGLU width over its hidden size (1152 / 768): a preset keeps that proportion
GLU_WIDTH = 1.5


def modernbert_preset(name: str, **overrides: Any) -> ModernBertConfig:
    """ModernBERT's architecture at BERT's sizes by BERT's preset names (`mini`, `L4-H256`, `base`: 12 layers, not
    ModernBERT-base's 22): the layers, width and heads of the BERT preset, a GeGLU 1.5 times the width (ModernBERT-
    base's proportion), everything else ModernBERT-base's (one global layer in three, a 128-token window, 8,192
    positions)."""
    from ..bert.config import preset

    bert = preset(name)
    fields = dict(num_hidden_layers=bert.num_hidden_layers, hidden_size=bert.hidden_size,
                  num_attention_heads=bert.num_attention_heads,
                  intermediate_size=int(GLU_WIDTH * bert.hidden_size))
    fields.update(overrides)
    return ModernBertConfig(**fields)
