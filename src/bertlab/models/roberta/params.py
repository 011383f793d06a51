"""RoBERTa's parameter table (`bertlab params`): BERT's arithmetic on RoBERTa's sizes."""

from __future__ import annotations

from ..bert.params import parameter_table, sizes
from ..family import ParameterTable
from .config import RobertaConfig


def roberta_parameter_table(config) -> list[tuple[str, int]]:
    """RoBERTa and XLM-R (a `RobertaConfig`): BERT's arithmetic on their own sizes -- one token type, 514
    positions -- and no next-sentence head; the masked LM (`lm_head`) is BERT's: dense, LayerNorm, output bias."""
    rows = dict(parameter_table(config))
    kept = [(k, n) for k, n in parameter_table(config) if not k.startswith(("heads.next_sentence", "total."))]
    encoder = rows["total.encoder (BertModel)"]
    return [*kept, ("total.encoder (RobertaModel)", encoder),
            ("total.masked_lm (RobertaForMaskedLM, no pooler)", encoder - rows["pooler"] + rows["heads.masked_lm"])]


PARAMETERS = ParameterTable(config_class=RobertaConfig, rows=roberta_parameter_table, sizes=sizes)
