"""`MPNetConfig`: Hugging Face's `MPNetConfig` field for field, on RoBERTa's config (positions counted from after
the padding id, no token types).

MPNet's embeddings number positions from `pad_token_id + 1` with the padding id fixed at 1 in Hugging Face's
code, whatever the config says: a config with another `pad_token_id` is refused rather than read two ways.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.errors import ConfigError
from ..roberta.config import RobertaConfig

PADDING_ID = 1  # MPNet's embeddings' padding index (Hugging Face's `MPNetEmbeddings.padding_idx`)
MIN_BUCKETS = 32  # the buckets Hugging Face's encoder sorts offsets into: a smaller table is indexed past its end
MAX_BUCKETS = 4096  # a (buckets, heads) table: far more than any released model's 32


@dataclass
class MPNetConfig(RobertaConfig):
    vocab_size: int = 30527
    max_position_embeddings: int = 512
    layer_norm_eps: float = 1e-12
    relative_attention_num_buckets: int = 32

    model_type = "mpnet"

    def validate(self, source: str = "config") -> None:
        super().validate(source)
        if self.pad_token_id != PADDING_ID:
            raise ConfigError(f"{source}: field 'pad_token_id' is {self.pad_token_id}; MPNet's embeddings take id "
                              f"{PADDING_ID} as padding whatever the config says, so another id is not read")
        buckets = self.relative_attention_num_buckets
        if not isinstance(buckets, int) or isinstance(buckets, bool) or not MIN_BUCKETS <= buckets <= MAX_BUCKETS:
            raise ConfigError(f"{source}: field 'relative_attention_num_buckets' must be an integer in "
                              f"{MIN_BUCKETS}..{MAX_BUCKETS} (MPNet sorts offsets into {MIN_BUCKETS} buckets "
                              f"whatever its table's size), got {buckets!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "MPNetConfig":
        config = super().from_dict(data, source)  # BERT's reader keeps MPNet's own field among the extra ones
        if "relative_attention_num_buckets" in config.extra:
            config.relative_attention_num_buckets = config.extra.pop("relative_attention_num_buckets")
            config.validate(source)
        return config

    def to_dict(self) -> dict[str, Any]:
        data = {**super().to_dict(), "relative_attention_num_buckets": self.relative_attention_num_buckets}
        data.pop("type_vocab_size", None)  # MPNet has no token types
        return data
