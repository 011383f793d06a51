"""XLM-R as a family: what the registry (`models/registry.py`) hands to recipes, tasks and inference."""

from __future__ import annotations

from pathlib import Path

from ..family import Family
from .config import XLMRobertaConfig
from .modeling import HEADS, XLMRobertaModel
from .params import PARAMETERS


def load_tokenizer(folder: Path):
    """XLM-R's SentencePiece tokenizer (`sentencepiece.bpe.model`, fairseq's ids)."""
    from .tokenizer import XLMRobertaTokenizer

    return XLMRobertaTokenizer.from_pretrained(folder)


FAMILY = Family(model_type="xlm-roberta", name="XLM-R", config_class=XLMRobertaConfig, base_model=XLMRobertaModel,
                heads=HEADS, tokenizer=load_tokenizer, parameters=PARAMETERS,
                engines=frozenset({"ctranslate2"}))
