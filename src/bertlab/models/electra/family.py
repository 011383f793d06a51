"""ELECTRA as a family: what the registry (`models/registry.py`) hands to recipes, tasks and inference. The
tokenizer is BERT's WordPiece (vocab.txt), and `bertlab pretrain --objective rtd` trains it on WordPiece data."""

from __future__ import annotations

from ...tokenizer import BertTokenizer
from ..family import Family
from .config import ElectraConfig
from .heads import HEADS
from .modeling import ElectraModel
from .params import PARAMETERS

FAMILY = Family(model_type="electra", name="ELECTRA", config_class=ElectraConfig, base_model=ElectraModel,
                heads=HEADS, tokenizer=BertTokenizer.from_pretrained, parameters=PARAMETERS,
                data_tokenizer="wordpiece")
