"""`BertConfig`: the encoder's hyper-parameters, with Google's field names, presets and JSON I/O.

The field names are those of Google's `bert_config.json`, which Hugging Face's `config.json` kept, so both
files load as they are. Fields the model does not use (`architectures`, `model_type`, `transformers_version`,
...) are kept in `extra` and written back, so a config survives a round trip through bertlab unchanged.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from ...core.errors import ConfigError, shorten
from ...core.jsonconfig import KNOWN_ACTIVATIONS, MAX_LABELS, JsonConfig, is_type

# Sane upper bounds, checked before anything is allocated: a config.json from an unknown source must not
# make the loader ask for terabytes (hidden_size 10^12 overflows torch's size arithmetic instead of failing
# with a message). Each is far above any published BERT (BERT-large: hidden 1024, 24 layers, 512
# positions; the largest vocabularies ~250k); a single weight matrix is held under 2^32 elements (16 GiB fp32).
SIZE_LIMITS = {"vocab_size": 1 << 22, "hidden_size": 1 << 16, "num_hidden_layers": 1 << 10,
               "num_attention_heads": 1 << 10, "intermediate_size": 1 << 18, "max_position_embeddings": 1 << 20,
               "type_vocab_size": 1 << 16}


@dataclass
class BertConfig(JsonConfig):
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"  # exact erf GELU, as Google's code
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    # Task heads: label names (Hugging Face's fields) and an optional head-specific dropout.
    id2label: dict[int, str] | None = None
    classifier_dropout: float | None = None
    # Which attention kernel runs the formula (`bertlab.nn.attention`): sdpa (PyTorch's fused attention,
    # the default) or eager (as written; the one that can return the probabilities). Hugging Face's name.
    attn_implementation: str = "sdpa"
    # Everything else found in the file, kept verbatim for the round trip.
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    model_type = "bert"  # config.json's "model_type" (a class attribute, not a field); RoBERTa's config has its own

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ derived values
    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_labels(self) -> int:
        return len(self.id2label) if self.id2label else 2

    @property
    def label2id(self) -> dict[str, int]:
        return {v: k for k, v in (self.id2label or {}).items()}

    # ------------------------------------------------------------------ validation
    def validate(self, source: str = "config") -> None:
        """Check types and consistency; raise a one-line `ConfigError` naming the field."""
        for f in _MODEL_FIELDS:
            value = getattr(self, f.name)
            if f.name in ("id2label", "classifier_dropout"):
                continue
            expected = _FIELD_TYPES[f.name]
            if not is_type(value, expected):
                raise ConfigError(
                    f"{source}: field '{f.name}' must be {_TYPE_NAMES[expected]}, "
                    f"got {type(value).__name__} {shorten(value)}"
                )
        if self.classifier_dropout is not None and not is_type(self.classifier_dropout, float):
            raise ConfigError(f"{source}: field 'classifier_dropout' must be a number or null")
        self.check_sizes(source, SIZE_LIMITS, tuple((rows, "hidden_size") for rows in
                                                    ("vocab_size", "max_position_embeddings", "intermediate_size")))
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{source}: field '{name}' must be in [0, 1), got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"{source}: field 'hidden_size' ({self.hidden_size}) must be divisible by "
                f"'num_attention_heads' ({self.num_attention_heads})"
            )
        if self.hidden_act not in KNOWN_ACTIVATIONS:
            raise ConfigError(
                f"{source}: field 'hidden_act' is {shorten(self.hidden_act)}; expected one of {', '.join(KNOWN_ACTIVATIONS)}"
            )
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(f"{source}: field 'pad_token_id' ({self.pad_token_id}) is outside the vocabulary")
        pos_type = self.extra.get("position_embedding_type", "absolute")
        if pos_type != "absolute":
            raise ConfigError(
                f"{source}: field 'position_embedding_type' is {shorten(pos_type)}; only 'absolute' (BERT's learned "
                "positions) is supported"
            )

    # ------------------------------------------------------------------ JSON I/O
    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "BertConfig":
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {type(data).__name__}")
        model_type = data.get("model_type", cls.model_type)
        if model_type != cls.model_type:  # another family's config read as this one would build the wrong model
            raise ConfigError(f"{source}: a {shorten(model_type)} model, not {cls.model_type!r}; this needs "
                              f"{cls.model_type!r} (commands that take any family read the folder's own)")
        missing = [name for name in REQUIRED_FIELDS if name not in data]
        if missing:
            raise ConfigError(f"{source}: missing required field '{missing[0]}'")
        known = {f.name for f in _MODEL_FIELDS}
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in data.items():
            if key == "label2id":  # derived from id2label
                continue
            if key == "num_labels" and "id2label" not in data and isinstance(value, int) and value > 0:
                if value > MAX_LABELS:  # a dict of that many names would be built before any check
                    raise ConfigError(f"{source}: field 'num_labels' must be at most {MAX_LABELS:,}, got {value:,}")
                kwargs["id2label"] = {i: f"LABEL_{i}" for i in range(value)}
                continue
            if key in known:
                kwargs[key] = value
            else:
                extra[key] = value
        if "id2label" in kwargs and kwargs["id2label"] is not None:
            try:
                kwargs["id2label"] = {int(k): str(v) for k, v in kwargs["id2label"].items()}
            except (AttributeError, ValueError) as e:
                raise ConfigError(f"{source}: field 'id2label' must map integer ids to names ({e})") from None
        config = cls.build(kwargs, extra, {n for n, t in _FIELD_TYPES.items() if t is int})
        config.validate(source)
        return config

    config_files = ("config.json", "bert_config.json")  # ours and HF's; Google's TensorFlow folders

    @classmethod
    def preset_lookup(cls):
        return is_preset, preset, preset_names

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = dict(self.extra)
        for f in _MODEL_FIELDS:
            data[f.name] = getattr(self, f.name)
        if self.id2label is not None:
            data["id2label"] = {str(k): v for k, v in sorted(self.id2label.items())}
            data["label2id"] = {v: k for k, v in sorted(self.id2label.items())}
        else:
            data.pop("id2label")
        if self.classifier_dropout is None:
            data.pop("classifier_dropout")
        if self.attn_implementation == "sdpa":  # the default is not written: config.json stays Google's + HF's
            data.pop("attn_implementation")
        data.setdefault("model_type", self.model_type)
        return data


_MODEL_FIELDS = [f for f in dataclasses.fields(BertConfig) if f.name != "extra"]
_FIELD_TYPES: dict[str, type] = {
    f.name: (int if f.type == "int" else float if f.type == "float" else str)
    for f in _MODEL_FIELDS
    if f.name not in ("id2label", "classifier_dropout")
}
_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string"}
# Google's bert_config.json always carries these; everything else has BERT's default.
REQUIRED_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


# ---------------------------------------------------------------------- presets
_SMALL_BERT = re.compile(r"L(\d+)-H(\d+)")
SMALL_BERT_LAYERS = (2, 4, 6, 8, 10, 12)
SMALL_BERT_WIDTHS = (128, 256, 512, 768)
# The named sizes of Google's release (README of google-research/bert) plus the paper's two models.
PRESETS: dict[str, tuple[int, int, int]] = {  # name -> (layers, hidden, heads)
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


def is_preset(name: str) -> bool:
    """Whether `name` names a preset (`base`, `L4-H256`) rather than a file; `preset` reports a size that
    Google's release lacks (`L3-H100`)."""
    return name in PRESETS or _SMALL_BERT.fullmatch(name) is not None


def preset_names() -> list[str]:
    return list(PRESETS) + [f"L{l}-H{h}" for l in SMALL_BERT_LAYERS for h in SMALL_BERT_WIDTHS]


def preset(name: str, **overrides: Any) -> BertConfig:
    """A config by name: `tiny` ... `large`, or `L{2..12}-H{128..768}` (heads H/64, FFN 4H)."""
    if name in PRESETS:
        layers, hidden, heads = PRESETS[name]
    else:
        m = _SMALL_BERT.fullmatch(name)
        if not m or int(m[1]) not in SMALL_BERT_LAYERS or int(m[2]) not in SMALL_BERT_WIDTHS:
            raise ConfigError(f"unknown preset {name!r}; expected one of {', '.join(preset_names())}")
        layers, hidden = int(m[1]), int(m[2])
        heads = hidden // 64
    fields = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                  intermediate_size=4 * hidden)
    fields.update(overrides)
    return BertConfig(**fields)
