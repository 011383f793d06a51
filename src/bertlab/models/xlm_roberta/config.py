"""XLM-R's config: RoBERTa's, with XLM-R's vocabulary size and `model_type` "xlm-roberta"."""

from __future__ import annotations

from dataclasses import dataclass

from ..roberta.config import RobertaConfig


@dataclass
class XLMRobertaConfig(RobertaConfig):
    vocab_size: int = 250002

    model_type = "xlm-roberta"
