"""RoBERTa as a family: what the registry (`models/registry.py`) hands to recipes, tasks and inference."""

from __future__ import annotations

from ...tokenizer.roberta import RobertaTokenizer
from ..family import Family
from .config import RobertaConfig
from .heads import HEADS
from .modeling import RobertaModel
from .params import PARAMETERS

# The tokenizer: byte-level BPE (vocab.json + merges.txt, or tokenizer.json) with BertTokenizer's call surface
FAMILY = Family(model_type="roberta", name="RoBERTa", config_class=RobertaConfig, base_model=RobertaModel,
                heads=HEADS, tokenizer=RobertaTokenizer.from_pretrained, parameters=PARAMETERS,
                data_tokenizer="bpe", engines=frozenset({"ctranslate2"}))
