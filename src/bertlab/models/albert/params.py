"""ALBERT's parameter table (`bertlab params`): shared weights counted once."""

from __future__ import annotations

from ..bert.params import block_rows, linear, sizes
from ..family import ParameterTable
from .config import AlbertConfig


def albert_parameter_table(config) -> list[tuple[str, int]]:
    """ALBERT (an `AlbertConfig`): embeddings of width E mapped to H, and `num_hidden_groups` x `inner_group_num`
    blocks shared by all `num_hidden_layers` layers -- each shared weight counted once, as the model holds it.
    ALBERT-base (E=128, H=768, L=12, one group) comes to 11.7M in the encoder (the paper's "12M")."""
    V, E, H, I, L = (config.vocab_size, config.embedding_size, config.hidden_size, config.intermediate_size,
                     config.num_hidden_layers)
    G, K = config.num_hidden_groups, config.inner_group_num
    P, S = config.max_position_embeddings, config.type_vocab_size
    embeddings = [("embeddings.word", V * E), ("embeddings.position", P * E), ("embeddings.segment", S * E),
                  ("embeddings.layer_norm", 2 * E), ("embeddings.mapping_in (E -> H)", linear(E, H))]
    one_layer = block_rows(H, I)
    per_layer = sum(n for _, n in one_layer)
    pooler = linear(H, H)
    mlm = linear(H, E) + 2 * E + V  # dense H -> E, LayerNorm, output bias; the decoder is the tied embedding
    sop = linear(H, config.num_labels)
    encoder = sum(n for _, n in embeddings) + G * K * per_layer
    return [*embeddings, ("embeddings.total", sum(n for _, n in embeddings)), *one_layer, ("layer.total", per_layer),
            (f"layers.total ({G} group(s) x {K} block(s), shared by {L} layers)", G * K * per_layer),
            ("pooler", pooler), ("heads.masked_lm", mlm), ("heads.sentence_order", sop),
            ("total.encoder (AlbertModel)", encoder + pooler),
            ("total.pretraining (AlbertForPreTraining)", encoder + pooler + mlm + sop)]


PARAMETERS = ParameterTable(config_class=AlbertConfig, rows=albert_parameter_table, sizes=sizes)
