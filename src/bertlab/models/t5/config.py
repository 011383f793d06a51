"""`T5Config`: the hyper-parameters of T5 (Raffel et al., 2020), with Hugging Face's field names, presets and
JSON I/O.

The fields are those of Hugging Face's T5 `config.json`, so Google's released configs and ours load both ways.
Two variants are one switch each, as in Hugging Face:
    v1.0   feed_forward_proj "relu",       tie_word_embeddings true   (output rescaled by d_model^-0.5)
    v1.1   feed_forward_proj "gated-gelu", tie_word_embeddings false  (a separate lm_head, no rescale)
`architecture` (ours) picks one of the three Transformer variants of the paper's section 3.2 on the same
blocks: "encoder-decoder" (T5), "decoder-only" (a language model, causal mask) or "prefix-lm" (decoder-only,
fully visible over the input, causal over the target). It is written to config.json only when it is not the
default, so an encoder-decoder config.json is exactly a Hugging Face one.

Fields we do not use (`architectures`, `transformers_version`, `use_cache`, ...) are kept in `extra` and written
back; the ones Hugging Face derives from others (`dense_act_fn`, `is_gated_act`) are re-derived, never stored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ...core.errors import ConfigError, shorten
from ...core.jsonconfig import KNOWN_ACTIVATIONS, JsonConfig, is_type as _is_type

MODEL_TYPE = "t5"
ARCHITECTURES = ("encoder-decoder", "decoder-only", "prefix-lm")
# The attention mask of the decoder stack's self-attention (`nn.AttentionMask` kinds), by architecture.
DECODER_MASK_KINDS = {"encoder-decoder": "causal", "decoder-only": "causal", "prefix-lm": "prefix"}
# Derived by Hugging Face from feed_forward_proj (and tie_word_embeddings); never kept, so they cannot go stale.
_DERIVED = ("dense_act_fn", "is_gated_act", "is_encoder_decoder", "model_type")
# Sane upper bounds, as BERT's config has (config.SIZE_LIMITS), checked before anything is allocated: a
# config.json from an unknown source must not build a million blocks (num_layers 10^6 ran for minutes). Each
# is far above any published T5 (T5-11B: d_model 1024, d_ff 65536, 24 layers, 128 heads of 128; mT5: 250k
# vocabulary); a single weight matrix is held under jsonconfig.MAX_MATRIX_ELEMENTS.
SIZE_LIMITS = {"vocab_size": 1 << 22, "d_model": 1 << 16, "d_kv": 1 << 14, "d_ff": 1 << 18, "num_layers": 1 << 10,
               "num_decoder_layers": 1 << 10, "num_heads": 1 << 10, "relative_attention_num_buckets": 1 << 16,
               "relative_attention_max_distance": 1 << 20, "n_positions": 1 << 20}


@dataclass
class T5Config(JsonConfig):
    vocab_size: int = 32128
    d_model: int = 512
    d_kv: int = 64  # size of one attention head; num_heads * d_kv need not equal d_model
    d_ff: int = 2048
    num_layers: int = 6  # encoder blocks (and decoder blocks unless num_decoder_layers says otherwise)
    num_decoder_layers: int | None = None
    num_heads: int = 8
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    dropout_rate: float = 0.1
    layer_norm_epsilon: float = 1e-6
    initializer_factor: float = 1.0
    feed_forward_proj: str = "relu"  # "relu" (v1.0) | "gated-gelu" (v1.1) | "[gated-]ACT"
    tie_word_embeddings: bool = True
    # Whether the decoder output is multiplied by d_model^-0.5 before the LM head. None: when the embeddings are
    # tied (Hugging Face 4.x's rule). Hugging Face 5 writes it explicitly, and then it wins.
    scale_decoder_outputs: bool | None = None
    pad_token_id: int = 0
    eos_token_id: int = 1
    decoder_start_token_id: int = 0
    # The longest input the model takes. Relative positions have no hard limit; Google's configs carry this
    # (and the tokenizer's model_max_length) as the length T5 was trained and is meant to be used at.
    n_positions: int = 512
    architecture: str = "encoder-decoder"
    # encoder-decoder only: decoder block i uses encoder block i's self-attention projections, FFN and their norms
    # (the paper's Table 2 "Enc-dec, shared": P parameters, not 2P); its cross-attention and position table
    # stay its own. Ours: transformers reads the folder as an unshared T5 holding equal copies.
    share_encoder_decoder: bool = False
    attn_implementation: str = "sdpa"  # the attention kernel (`bertlab.nn.attention`): sdpa | eager
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    model_type = MODEL_TYPE

    def __post_init__(self) -> None:
        if self.num_decoder_layers is None:
            self.num_decoder_layers = self.num_layers
        self.validate()

    # ------------------------------------------------------------------ derived values
    @property
    def is_gated_act(self) -> bool:
        return self.feed_forward_proj.startswith("gated-")

    @property
    def dense_act_fn(self) -> str:
        """The FFN's activation by its `nn.elementwise.ACTIVATIONS` name; "gated-gelu" is the tanh GELU, as in
        Google's v1.1 code and Hugging Face."""
        if self.feed_forward_proj == "gated-gelu":
            return "gelu_new"
        return self.feed_forward_proj.split("-")[-1]

    @property
    def scales_decoder_output(self) -> bool:
        return self.tie_word_embeddings if self.scale_decoder_outputs is None else self.scale_decoder_outputs

    @property
    def is_encoder_decoder(self) -> bool:
        return self.architecture == "encoder-decoder"

    @property
    def decoder_mask_kind(self) -> str:
        return DECODER_MASK_KINDS[self.architecture]

    @property
    def inner_dim(self) -> int:
        return self.num_heads * self.d_kv

    # ------------------------------------------------------------------ validation
    def validate(self, source: str = "config") -> None:
        """Types and consistency; a one-line `ConfigError` naming the field."""
        for f in _FIELDS:
            value = getattr(self, f.name)
            expected = _TYPES[f.name]
            if f.name == "num_decoder_layers" and value is None:
                continue
            if f.name == "scale_decoder_outputs" and value is None:
                continue
            ok = isinstance(value, bool) if expected is bool else _is_type(value, expected)
            if not ok:
                raise ConfigError(f"{source}: field '{f.name}' must be {_TYPE_NAMES[expected]}, "
                                  f"got {type(value).__name__} {shorten(value)}")
        self.check_sizes(source, SIZE_LIMITS, (("vocab_size", "d_model"), ("d_ff", "d_model"), ("inner_dim", "d_model")))
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ConfigError(f"{source}: field 'dropout_rate' must be in [0, 1), got {self.dropout_rate}")
        act = self.feed_forward_proj.split("-")
        if len(act) > 2 or (len(act) == 2 and act[0] != "gated") or act[-1] not in KNOWN_ACTIVATIONS:
            raise ConfigError(f"{source}: field 'feed_forward_proj' is {shorten(self.feed_forward_proj)}; expected "
                              f"'relu', 'gated-gelu' or '[gated-]ACT' with ACT one of {', '.join(KNOWN_ACTIVATIONS)}")
        if self.architecture not in ARCHITECTURES:
            raise ConfigError(f"{source}: field 'architecture' is {shorten(self.architecture)}; expected one of "
                              f"{', '.join(ARCHITECTURES)}")
        if self.share_encoder_decoder and (not self.is_encoder_decoder or self.num_decoder_layers != self.num_layers):
            raise ConfigError(f"{source}: field 'share_encoder_decoder' needs architecture 'encoder-decoder' with as "
                              f"many decoder layers as encoder layers (got {self.architecture}, "
                              f"{self.num_layers}/{self.num_decoder_layers})")
        for name in ("pad_token_id", "eos_token_id", "decoder_start_token_id"):
            if not 0 <= getattr(self, name) < self.vocab_size:
                raise ConfigError(f"{source}: field '{name}' ({getattr(self, name)}) is outside the vocabulary "
                                  f"(vocab_size {self.vocab_size})")

    # ------------------------------------------------------------------ JSON I/O
    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "T5Config":
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {type(data).__name__}")
        model_type = data.get("model_type", MODEL_TYPE)
        if model_type != MODEL_TYPE:
            raise ConfigError(f"{source}: field 'model_type' is {shorten(model_type)}; expected 't5' (this is not a T5 "
                              "config)")
        known = {f.name for f in _FIELDS}
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in data.items():
            if key in known:
                kwargs[key] = value
            elif key not in _DERIVED:
                extra[key] = value
        eos = kwargs.get("eos_token_id")
        if isinstance(eos, list) and len(eos) == 1:  # some exports write a one-element list
            kwargs["eos_token_id"] = eos[0]
        # Validate field by field before construction, so the error names the file.
        config = cls.build(kwargs, extra, {n for n, t in _TYPES.items() if t is int})
        if config.num_decoder_layers is None:
            config.num_decoder_layers = config.num_layers
        config.validate(source)
        return config

    @classmethod
    def preset_lookup(cls):
        return (lambda name: name in PRESETS), preset, (lambda: list(PRESETS))

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = dict(self.extra)
        for f in _FIELDS:
            data[f.name] = getattr(self, f.name)
        for name, default in (("architecture", "encoder-decoder"), ("attn_implementation", "sdpa")):
            if data[name] == default:
                data.pop(name)  # ours, written only when set: an encoder-decoder config.json is Hugging Face's
        if self.scale_decoder_outputs in (None, self.tie_word_embeddings):
            data.pop("scale_decoder_outputs")  # says nothing tie_word_embeddings does not
        # What Hugging Face derives, written for readers of the file (and older versions that read it).
        data["dense_act_fn"] = self.dense_act_fn
        data["is_gated_act"] = self.is_gated_act
        data["is_encoder_decoder"] = self.is_encoder_decoder
        data["model_type"] = MODEL_TYPE
        return data



_FIELDS = [f for f in dataclasses.fields(T5Config) if f.name != "extra"]
_TYPES: dict[str, type] = {
    f.name: {"int": int, "int | None": int, "float": float, "str": str, "bool": bool, "bool | None": bool}[f.type]
    for f in _FIELDS
}
_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


# ---------------------------------------------------------------------- presets
# The paper's sizes (Raffel et al., 2020, section 3.7; Google's released configs) and the v1.1 checkpoints'
# (gated-GELU FFN, untied LM head, no dropout in pre-training, d_ff and heads re-balanced).
# name -> (d_model, d_ff, num_layers, num_heads, v1.1)
_PRESET_SHAPES: dict[str, tuple[int, int, int, int, bool]] = {
    "t5-small": (512, 2048, 6, 8, False),  # 60M
    "t5-base": (768, 3072, 12, 12, False),  # 220M, "twice BERT-Base"
    "t5-large": (1024, 4096, 24, 16, False),  # 770M (737.7M counted exactly; the paper rounds)
    "t5-v1_1-small": (512, 1024, 8, 6, True),
    "t5-v1_1-base": (768, 2048, 12, 12, True),
    "t5-v1_1-large": (1024, 2816, 24, 16, True),
    # Not the paper's: small shapes for CPU runs, tests and bench_objectives.py (the objective comparison).
    "t5-tiny": (128, 512, 2, 2, False),
    "t5-mini": (256, 1024, 4, 4, False),
}
PRESETS = tuple(_PRESET_SHAPES)


def preset(name: str, **overrides: Any) -> T5Config:
    """A T5 config by name (`t5-small` ... `t5-v1_1-large`), with any field overridden."""
    if name not in _PRESET_SHAPES:
        raise ConfigError(f"unknown T5 preset {name!r}; expected one of {', '.join(PRESETS)}")
    d_model, d_ff, layers, heads, v1_1 = _PRESET_SHAPES[name]
    fields = dict(d_model=d_model, d_ff=d_ff, num_layers=layers, num_heads=heads, d_kv=64)
    if v1_1:
        fields.update(feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    fields.update(overrides)
    return T5Config(**fields)
