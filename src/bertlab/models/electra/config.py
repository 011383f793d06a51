"""`ElectraConfig`: BERT's config with ELECTRA's fields and defaults (Hugging Face's `ElectraConfig` field for
field): `embedding_size` (E, the token embeddings' width, projected to the hidden size H when different) and the
`summary_*` fields of the multiple-choice head, which stay in `extra` as they were read.

Presets: `small`, `base`, `large` are ELECTRA's (the paper's Table 6: Small is E=128, H=256, 12 layers, 4 heads);
BERT's other names (`tiny`, `mini`, `L4-H256`, ...) give BERT's sizes with E = H.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..bert.config import BertConfig, is_preset, preset, preset_names
from ...core.errors import ConfigError

# ELECTRA's own sizes: (layers, hidden, heads, embedding_size); FFN 4H
ELECTRA_PRESETS = {"small": (12, 256, 4, 128), "base": (12, 768, 12, 768), "large": (24, 1024, 16, 1024)}
EMBEDDING_SIZE_LIMIT = 1 << 16
# The multiple-choice head's summary of a sequence (Hugging Face's `ElectraSequenceSummary`): the ones it computes
SUMMARY_TYPES = ("first", "last", "mean")
# The generator of replaced-token detection: its hidden size as a fraction of the discriminator's (the official
# code's `generator_hidden_size`, 0.25; the paper finds 1/4 to 1/2 best), read from config.json under this key
GENERATOR_FRACTION_KEY = "generator_hidden_size"
GENERATOR_FRACTION = 0.25


@dataclass
class ElectraConfig(BertConfig):
    hidden_size: int = 256
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    embedding_size: int = 128

    model_type = "electra"
    config_files = ("config.json",)

    def validate(self, source: str = "config") -> None:
        super().validate(source)
        if not isinstance(self.embedding_size, int) or isinstance(self.embedding_size, bool) \
                or not 1 <= self.embedding_size <= EMBEDDING_SIZE_LIMIT:
            raise ConfigError(f"{source}: field 'embedding_size' must be an integer in 1..{EMBEDDING_SIZE_LIMIT:,}, "
                              f"got {self.embedding_size!r}")
        self.check_sizes(source, {}, (("vocab_size", "embedding_size"), ("max_position_embeddings", "embedding_size")))
        summary = self.extra.get("summary_type", "first")
        if summary not in SUMMARY_TYPES:
            raise ConfigError(f"{source}: field 'summary_type' is {summary!r}; supported: {', '.join(SUMMARY_TYPES)}")
        if self.extra.get("tie_word_embeddings", True) is not True:
            raise ConfigError(f"{source}: field 'tie_word_embeddings' is false; ELECTRA's generator reads its output "
                              "matrix from the token embeddings (true) only")
        if self.extra.get("is_decoder") or self.extra.get("add_cross_attention"):
            raise ConfigError(f"{source}: a decoder ELECTRA (is_decoder / add_cross_attention); only the "
                              "bidirectional encoder is supported")
        fraction = self.extra.get(GENERATOR_FRACTION_KEY, GENERATOR_FRACTION)
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            raise ConfigError(f"{source}: field '{GENERATOR_FRACTION_KEY}' must be a fraction in (0, 1], got "
                              f"{fraction!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "ElectraConfig":
        config = super().from_dict(data, source)  # BERT's reader keeps embedding_size among the extra fields
        if "embedding_size" in config.extra:
            config.embedding_size = config.extra.pop("embedding_size")
            config.validate(source)
        return config

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "embedding_size": self.embedding_size}

    @property
    def summary(self) -> dict[str, Any]:
        """The multiple-choice head's summary settings, with Hugging Face's defaults."""
        return {"type": self.extra.get("summary_type", "first"), "use_proj": self.extra.get("summary_use_proj", True),
                "activation": self.extra.get("summary_activation", "gelu"),
                "proj_to_labels": self.extra.get("summary_proj_to_labels", False),
                "first_dropout": self.extra.get("summary_first_dropout", 0.0),
                "last_dropout": self.extra.get("summary_last_dropout", 0.1)}

    def generator_config(self) -> "ElectraConfig":
        """The generator beside this discriminator in replaced-token detection, sized as the official code
        sizes it: hidden size H x fraction (GENERATOR_FRACTION_KEY), FFN 4x that, one head per 64 dimensions (at
        least one), the same layers and embeddings (shared)."""
        fraction = self.extra.get(GENERATOR_FRACTION_KEY, GENERATOR_FRACTION)
        hidden = max(1, int(round(self.hidden_size * fraction)))
        extra = {k: v for k, v in self.extra.items() if k not in ("architectures", "id2label", "label2id")}
        return self.replace(hidden_size=hidden, intermediate_size=4 * hidden, num_attention_heads=max(1, hidden // 64),
                            id2label=None, extra=extra)

    @classmethod
    def preset_lookup(cls):
        return is_electra_preset, electra_preset, preset_names


def is_electra_preset(name: str) -> bool:
    return name in ELECTRA_PRESETS or is_preset(name)


def electra_preset(name: str, **overrides: Any) -> ElectraConfig:
    """ELECTRA's `small` / `base` / `large`, or BERT's sizes by BERT's other preset names with E = H."""
    if name in ELECTRA_PRESETS:
        layers, hidden, heads, embedding = ELECTRA_PRESETS[name]
    else:
        bert = preset(name)
        layers, hidden, heads, embedding = (bert.num_hidden_layers, bert.hidden_size, bert.num_attention_heads,
                                            bert.hidden_size)
    fields = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                  intermediate_size=4 * hidden, embedding_size=embedding)
    fields.update(overrides)
    return ElectraConfig(**fields)
