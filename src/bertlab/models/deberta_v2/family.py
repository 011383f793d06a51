"""DeBERTa-v2/v3 as a family: what the registry (`models/registry.py`) hands to recipes, tasks and inference."""

from __future__ import annotations

from pathlib import Path

from ..family import Family
from .config import DebertaV2Config
from .heads import HEADS
from .modeling import DebertaV2Model
from .params import PARAMETERS


def load_tokenizer(folder: Path):
    """DeBERTa-v2/v3's SentencePiece tokenizer (`spm.model`)."""
    from .tokenizer import DebertaV2Tokenizer

    return DebertaV2Tokenizer.from_pretrained(folder)


FAMILY = Family(model_type="deberta-v2", name="DeBERTa-v2", config_class=DebertaV2Config, base_model=DebertaV2Model,
                heads=HEADS, tokenizer=load_tokenizer, parameters=PARAMETERS,
                lora_targets=("query_proj", "value_proj"))
