"""BERT as a family: what the registry (`models/registry.py`) hands to recipes, tasks and inference."""

from __future__ import annotations

from pathlib import Path

from ...tokenizer import BertTokenizer
from ..family import Family
from .config import BertConfig, preset
from .convert import convert_tf_to_hf, export_tf_checkpoint
from .heads import HEADS, BertForPreTraining
from .modeling import BertModel
from .params import PARAMETERS

def random_start(model: str, vocab: str | None, folder: Path) -> None:
    """Google's initialisation (`BertPreTrainedModel.init_weights`) of the pre-training heads, the tokenizer
    beside it (`Family.random_start`)."""
    tokenizer = BertTokenizer.from_pretrained(vocab or model)
    config = preset(model, vocab_size=len(tokenizer.vocab)) if vocab else BertConfig.from_json_file(model)
    BertForPreTraining(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


FAMILY = Family(model_type="bert", name="BERT", config_class=BertConfig, base_model=BertModel, heads=HEADS,
                tokenizer=BertTokenizer.from_pretrained, parameters=PARAMETERS,
                data_tokenizer="wordpiece", engines=frozenset({"ctranslate2"}), random_start=random_start,
                tf_conversion=(convert_tf_to_hf, export_tf_checkpoint))
