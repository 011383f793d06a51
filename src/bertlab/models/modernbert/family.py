"""ModernBERT as a family: what the registry (`models/registry.py`) hands to recipes, tasks and inference."""

from __future__ import annotations

from pathlib import Path

from ..family import Family
from .config import ModernBertConfig
from .heads import HEADS
from .modeling import ModernBertModel
from .params import PARAMETERS
from .tokenizer import ModernBertTokenizer, is_modernbert_tokenizer_json


def corpus_tokenizer(vocab: Path) -> ModernBertTokenizer:
    """How `prepare` reads a corpus with ModernBERT's tokenizer.json: "[CLS]" written in the text stays text."""
    return ModernBertTokenizer.from_pretrained(vocab, split_special_tokens=True)


# The tokenizer: its tokenizer.json (a byte-level BPE with [CLS] A [SEP] templates), BertTokenizer's call surface
FAMILY = Family(model_type="modernbert", name="ModernBERT", config_class=ModernBertConfig, base_model=ModernBertModel,
                heads=HEADS, tokenizer=ModernBertTokenizer.from_pretrained, parameters=PARAMETERS,
                # pre-trained by `pretrain` (masked LM) on data prepared with its own tokenizer.json
                data_tokenizer=ModernBertTokenizer.DATA_KIND, corpus_tokenizer=corpus_tokenizer,
                corpus_vocabulary=is_modernbert_tokenizer_json,
                # q, k and v are one fused projection; adapters follow the attention's and the GeGLU's output
                lora_targets=("Wqkv",), adapter_layers=r"layers\.\d+\.(attn|mlp)\.Wo$", adapter_norms="norm")
