"""ALBERT as a family: its SentencePiece tokenizer (`spiece.model`), token types as BERT's."""

from __future__ import annotations

from ..family import Family
from .config import AlbertConfig
from .heads import HEADS
from .modeling import AlbertModel
from .tokenizer import AlbertTokenizer
from .params import PARAMETERS

FAMILY = Family(model_type="albert", name="ALBERT", config_class=AlbertConfig, base_model=AlbertModel, heads=HEADS,
                tokenizer=AlbertTokenizer.from_pretrained, parameters=PARAMETERS)
