"""`DebertaV2Config`: Hugging Face's field names and defaults (DeBERTa-v2-xlarge's sizes), read and written as
`transformers` writes them, for DeBERTa-v2 and v3 alike (v3 is v2's architecture with its own settings).

Beside BERT's fields, what makes the disentangled attention (`modeling.py`):

    relative_attention       whether the c2p / p2c terms are computed at all (every released v2/v3 model: true)
    pos_att_type             which of them: ["c2p", "p2c"] (a "p2c|c2p" string as the released configs write it
                             is read as that list)
    max_relative_positions   k, the distance beyond which relative positions are clamped; < 1: max_position_embeddings
    position_buckets         > 0: relative distances go into that many log-spaced buckets per direction (v3: 256)
    share_att_key            the position projections are the content ones (v3); else pos_key_proj/pos_query_proj
    norm_rel_ebd             "layer_norm": the relative embedding table goes through a LayerNorm before use (v3)
    position_biased_input    absolute position embeddings added to the input (v2/v3 models: false)
    conv_kernel_size         > 0: a convolution beside the first layer (v2-xlarge and larger), with conv_act,
                             conv_groups
    embedding_size           the embedding width when it differs from hidden_size (then `embed_proj`)
    legacy                   the masked LM head's layout: BERT's `cls.predictions` (true, `transformers`' default)
                             or `lm_predictions.lm_head` (false)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...core.errors import ConfigError
from ...core.jsonconfig import KNOWN_ACTIVATIONS, FieldConfig, is_type

SIZE_LIMITS = {"vocab_size": 1 << 22, "hidden_size": 1 << 16, "num_hidden_layers": 1 << 10,
               "num_attention_heads": 1 << 10, "intermediate_size": 1 << 18, "max_position_embeddings": 1 << 20}
ATTENTION_TERMS = ("c2p", "p2c")
# Fields that `transformers` reads with getattr and a default: written back only when set, since a `null` in
# config.json would be read as the value itself
OPTIONAL_INTS = ("embedding_size", "pooler_hidden_size")
OPTIONAL_FLOATS = ("cls_dropout",)


@dataclass
class DebertaV2Config(FieldConfig):
    vocab_size: int = 128100
    hidden_size: int = 1536
    num_hidden_layers: int = 24
    num_attention_heads: int = 24
    intermediate_size: int = 6144
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 0
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-7
    relative_attention: bool = False
    max_relative_positions: int = -1
    position_buckets: int = -1
    pad_token_id: int = 0
    position_biased_input: bool = True
    pos_att_type: Any = None  # list of "c2p" / "p2c", or their "|"-joined string; None: neither
    share_att_key: bool = False
    norm_rel_ebd: str = "none"
    conv_kernel_size: int = 0
    conv_groups: int = 1
    conv_act: str = "tanh"
    pooler_dropout: float = 0.0
    pooler_hidden_act: str = "gelu"
    legacy: bool = True
    embedding_size: Any = None
    pooler_hidden_size: Any = None
    cls_dropout: Any = None
    id2label: dict[int, str] | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    model_type = "deberta-v2"
    config_files = ("config.json",)

    # -- derived sizes (what `transformers` computes from the fields) ------------------------------------------
    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def attention_terms(self) -> tuple[str, ...]:
        """The relative terms in `pos_att_type`, normalised: ("c2p", "p2c"), ("c2p",), ..."""
        terms = self.pos_att_type
        if terms is None:
            return ()
        if isinstance(terms, str):
            terms = [t.strip() for t in terms.lower().split("|")]
        return tuple(t for t in ATTENTION_TERMS if t in terms)

    @property
    def relative_span(self) -> int:
        """k: relative positions run over [-k, k) after clamping; the relative table has 2k rows."""
        if self.position_buckets > 0:
            return self.position_buckets
        return self.max_relative_positions if self.max_relative_positions >= 1 else self.max_position_embeddings

    @property
    def max_distance(self) -> int:
        """The distance the log buckets reach their last bucket at (max_relative_positions, or the positions)."""
        return self.max_relative_positions if self.max_relative_positions >= 1 else self.max_position_embeddings

    @property
    def word_embedding_size(self) -> int:
        return self.embedding_size if self.embedding_size is not None else self.hidden_size

    @property
    def classifier_dropout(self) -> float:
        """The dropout before a pooled classifier: `cls_dropout`, else the hidden dropout (as `transformers`)."""
        return self.hidden_dropout_prob if self.cls_dropout is None else self.cls_dropout

    @property
    def rel_layer_norm(self) -> bool:
        return "layer_norm" in [x.strip() for x in self.norm_rel_ebd.lower().split("|")]

    def check(self, source: str) -> None:
        self.check_sizes(source, SIZE_LIMITS, (("vocab_size", "word_embedding_size"),
                                               ("intermediate_size", "hidden_size")))
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"{source}: field 'hidden_size' ({self.hidden_size}) must be divisible by "
                              f"'num_attention_heads' ({self.num_attention_heads})")
        terms = self.pos_att_type
        names = terms if isinstance(terms, list) else [t.strip() for t in terms.lower().split("|")] \
            if isinstance(terms, str) else [] if terms is None else None
        if names is None or any(not isinstance(t, str) or t.lower() not in ATTENTION_TERMS for t in names):
            raise ConfigError(f"{source}: field 'pos_att_type' must be a list of 'c2p' / 'p2c' (or 'p2c|c2p'), got "
                              f"{terms!r}")
        for name in OPTIONAL_INTS:
            value = getattr(self, name)
            if value is not None and (not is_type(value, int) or not 1 <= value <= 1 << 16):
                raise ConfigError(f"{source}: field '{name}' must be an integer between 1 and 65,536, got {value!r}")
        if self.cls_dropout is not None and not (is_type(self.cls_dropout, float) and 0 <= self.cls_dropout < 1):
            raise ConfigError(f"{source}: field 'cls_dropout' must be in [0, 1), got {self.cls_dropout!r}")
        if self.pooler_hidden_size not in (None, self.hidden_size):
            # transformers' classifier reads the pooler's output as hidden_size wide: another width cannot run
            raise ConfigError(f"{source}: field 'pooler_hidden_size' ({self.pooler_hidden_size}) must equal "
                              f"'hidden_size' ({self.hidden_size})")
        if not self.legacy and self.word_embedding_size != self.hidden_size:
            raise ConfigError(f"{source}: 'legacy': false (the lm_predictions head) needs 'embedding_size' equal to "
                              f"'hidden_size'")
        if "attention_head_size" in self.extra and self.extra["attention_head_size"] != self.head_size:
            raise ConfigError(f"{source}: field 'attention_head_size' ({self.extra['attention_head_size']}) other than "
                              f"hidden_size / num_attention_heads is not supported")
        if self.extra.get("z_steps", 0) not in (0, 1):
            raise ConfigError(f"{source}: field 'z_steps' (enhanced mask decoder steps) is not supported")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "pooler_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{source}: field '{name}' must be in [0, 1), got {getattr(self, name)}")
        for name in ("conv_act", "pooler_hidden_act"):
            if getattr(self, name) not in KNOWN_ACTIVATIONS:
                raise ConfigError(f"{source}: field '{name}' is {getattr(self, name)!r}; expected one of "
                                  f"{', '.join(KNOWN_ACTIVATIONS)}")
        if self.type_vocab_size < 0 or self.conv_kernel_size < 0 or self.conv_groups < 1:
            raise ConfigError(f"{source}: fields 'type_vocab_size', 'conv_kernel_size' must be >= 0 and "
                              f"'conv_groups' >= 1")
        if self.conv_kernel_size > 0 and self.hidden_size % self.conv_groups:
            raise ConfigError(f"{source}: 'hidden_size' ({self.hidden_size}) must be divisible by 'conv_groups' "
                              f"({self.conv_groups})")
        if self.relative_attention and self.relative_span > 1 << 16:
            raise ConfigError(f"{source}: relative positions span {self.relative_span:,}: at most 65,536")
        if self.relative_attention and self.position_buckets > 0 and \
                self.max_distance - 1 <= self.position_buckets // 2:
            # the log buckets divide by log((max_distance - 1) / (buckets / 2)): zero or negative otherwise
            raise ConfigError(f"{source}: 'max_relative_positions' ({self.max_distance}) must exceed half of "
                              f"'position_buckets' ({self.position_buckets}) plus one for the log buckets")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(f"{source}: field 'pad_token_id' ({self.pad_token_id}) is outside the vocabulary")

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        for name in (*OPTIONAL_INTS, *OPTIONAL_FLOATS):
            if data.get(name) is None:
                data.pop(name, None)
        data["pos_att_type"] = list(self.attention_terms)
        return data
