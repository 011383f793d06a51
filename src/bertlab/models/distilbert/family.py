"""DistilBERT as a family: BERT's WordPiece tokenizer (`vocab.txt`), no token types."""

from __future__ import annotations

from ...tokenizer import BertTokenizer
from ..family import Family
from .convert import write_distilbert
from .config import DistilBertConfig
from .heads import HEADS
from .modeling import DistilBertModel
from .params import PARAMETERS

FAMILY = Family(model_type="distilbert", name="DistilBERT", config_class=DistilBertConfig,
                base_model=DistilBertModel, heads=HEADS, tokenizer=BertTokenizer.from_pretrained, parameters=PARAMETERS,
                engines=frozenset({"ctranslate2"}), student_writer=write_distilbert)
