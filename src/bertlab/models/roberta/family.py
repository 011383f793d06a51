"""RoBERTa as a family: what the registry (`models/registry.py`) hands to recipes, tasks and inference."""

from __future__ import annotations

from pathlib import Path

from ...errors import BertlabError
from ..family import Family
from .config import RobertaConfig
from .heads import HEADS
from .modeling import RobertaModel


def load_tokenizer(folder: Path):
    """RoBERTa's byte-level BPE (`vocab.json` + `merges.txt`), with BertTokenizer's call surface."""
    try:
        from ...tokenizer.roberta import RobertaTokenizer
    except ImportError:
        raise BertlabError(f"{folder}: RoBERTa's byte-level BPE tokenizer (vocab.json + merges.txt) is not part of "
                           "this bertlab; its models load (bertlab.AutoModel) but take token ids") from None
    return RobertaTokenizer.from_pretrained(folder)


FAMILY = Family(model_type="roberta", name="RoBERTa", config_class=RobertaConfig, base_model=RobertaModel,
                heads=HEADS, tokenizer=load_tokenizer, uses_token_types=False)
