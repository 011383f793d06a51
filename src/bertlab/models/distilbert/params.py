"""DistilBERT's parameter table (`bertlab params`): BERT's blocks without token types or pooler."""

from __future__ import annotations

from ..bert.params import block_rows, linear, sizes
from ..family import ParameterTable
from .config import DistilBertConfig


def distilbert_parameter_table(config) -> list[tuple[str, int]]:
    """DistilBERT (a `DistilBertConfig`, read through its BERT-named properties): BERT's blocks, no token type
    table, no pooler; its masked LM is a dense layer, a LayerNorm and an output bias (the projector is tied)."""
    V, H, I, L, P = (config.vocab_size, config.hidden_size, config.intermediate_size, config.num_hidden_layers,
                     config.max_position_embeddings)
    embeddings = [("embeddings.word", V * H), ("embeddings.position", P * H), ("embeddings.layer_norm", 2 * H)]
    one_layer = block_rows(H, I)
    per_layer = sum(n for _, n in one_layer)
    encoder = sum(n for _, n in embeddings) + L * per_layer
    mlm = linear(H, H) + 2 * H + V
    return [*embeddings, ("embeddings.total", sum(n for _, n in embeddings)), *one_layer, ("layer.total", per_layer),
            (f"layers.total (x{L})", L * per_layer), ("heads.masked_lm", mlm),
            ("total.encoder (DistilBertModel)", encoder), ("total.masked_lm (DistilBertForMaskedLM)", encoder + mlm)]


PARAMETERS = ParameterTable(config_class=DistilBertConfig, rows=distilbert_parameter_table, sizes=sizes)
