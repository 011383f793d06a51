"""MPNet's parameter table (`bertlab params`): BERT's arithmetic on MPNet's sizes -- no token type table, the
shared relative position bias table beside the blocks, RoBERTa's masked-LM head."""

from __future__ import annotations

from ..bert.params import parameter_table, sizes
from ..family import ParameterTable
from .config import MPNetConfig


def mpnet_parameter_table(config: MPNetConfig) -> list[tuple[str, int]]:
    """Rows in BERT's order with the segment table left out and the bias table (buckets x heads) added."""
    bert = dict(parameter_table(config))
    segment = bert["embeddings.segment"]
    bias = config.relative_attention_num_buckets * config.num_attention_heads
    rows = []
    for name, n in parameter_table(config):
        if name == "embeddings.segment" or name.startswith(("heads.next_sentence", "total.")):
            continue
        rows.append((name, n - segment if name == "embeddings.total" else n))
        if name.startswith("layers.total"):
            rows.append(("encoder.relative_attention_bias", bias))
    encoder = bert["total.encoder (BertModel)"] - segment + bias
    return [*rows, ("total.encoder (MPNetModel)", encoder),
            ("total.masked_lm (MPNetForMaskedLM, no pooler)", encoder - bert["pooler"] + bert["heads.masked_lm"])]


PARAMETERS = ParameterTable(config_class=MPNetConfig, rows=mpnet_parameter_table, sizes=sizes)
