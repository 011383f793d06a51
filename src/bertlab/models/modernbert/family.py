"""ModernBERT as a family: what the registry (`models/registry.py`) hands to recipes, tasks and inference."""

from __future__ import annotations

from ..family import Family
from .config import ModernBertConfig
from .heads import HEADS
from .modeling import ModernBertModel
from .params import PARAMETERS
from .tokenizer import ModernBertTokenizer

# The tokenizer: its tokenizer.json (a byte-level BPE with [CLS] A [SEP] templates), BertTokenizer's call surface
FAMILY = Family(model_type="modernbert", name="ModernBERT", config_class=ModernBertConfig, base_model=ModernBertModel,
                heads=HEADS, tokenizer=ModernBertTokenizer.from_pretrained, parameters=PARAMETERS)
