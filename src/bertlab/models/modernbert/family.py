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
                heads=HEADS, tokenizer=ModernBertTokenizer.from_pretrained, parameters=PARAMETERS,
                # q, k and v are one fused projection; adapters follow the attention's and the GeGLU's output
                lora_targets=("Wqkv",), adapter_layers=r"layers\.\d+\.(attn|mlp)\.Wo$", adapter_norms="norm")
