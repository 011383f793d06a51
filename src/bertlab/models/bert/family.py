"""BERT as a family: what the registry (`models/registry.py`) hands to recipes, tasks and inference."""

from __future__ import annotations

from ...tokenizer import BertTokenizer
from ..family import Family
from .config import BertConfig
from .heads import HEADS
from .modeling import BertModel
from .params import PARAMETERS

FAMILY = Family(model_type="bert", name="BERT", config_class=BertConfig, base_model=BertModel, heads=HEADS,
                tokenizer=BertTokenizer.from_pretrained, parameters=PARAMETERS,
                data_tokenizer="wordpiece", engines=frozenset({"ctranslate2"}))
