"""DeBERTa-v2's parameter table (`bertlab params`): counted from the config alone.

DeBERTa-v3-base (L=12, H=768, V=128,100, 256 position buckets, shared position keys) comes to 85.5M besides the
word embeddings and 98.4M in them: its model card's "86M backbone + 98M embedding", 183.8M in all.
"""

from __future__ import annotations

from ..bert.params import block_rows, linear
from ..family import ParameterTable
from .config import DebertaV2Config


def deberta_parameter_table(config: DebertaV2Config) -> list[tuple[str, int]]:
    """(row name, count); the last rows are the totals (the bare encoder, and it with its masked LM head)."""
    V, H, I, L = config.vocab_size, config.hidden_size, config.intermediate_size, config.num_hidden_layers
    E, P, S = config.word_embedding_size, config.max_position_embeddings, config.type_vocab_size
    embeddings = [("embeddings.word", V * E)]
    if config.position_biased_input:
        embeddings.append(("embeddings.position", P * E))
    if S > 0:
        embeddings.append(("embeddings.segment", S * E))
    if E != H:
        embeddings.append(("embeddings.projection (E -> H)", E * H))
    embeddings.append(("embeddings.layer_norm", 2 * H))
    one_layer = block_rows(H, I)
    if config.relative_attention and not config.share_att_key:
        one_layer += [(f"layer.attention.position_{name}", linear(H, H)) for term, name in
                      (("c2p", "key"), ("p2c", "query")) if term in config.attention_terms]
    per_layer = sum(n for _, n in one_layer)
    shared = []
    if config.relative_attention:
        shared.append((f"encoder.relative_embeddings (2 x {config.relative_span})", 2 * config.relative_span * H))
    if config.rel_layer_norm:
        shared.append(("encoder.relative_layer_norm", 2 * H))
    if config.conv_kernel_size > 0:
        shared.append(("encoder.conv", H * (H // config.conv_groups) * config.conv_kernel_size + H + 2 * H))
    # the masked LM head: transform (H -> E or H), LayerNorm, output bias; the decoder is the tied embedding
    width = E if config.legacy else H
    mlm = linear(H, width) + 2 * width + V
    encoder = sum(n for _, n in embeddings) + L * per_layer + sum(n for _, n in shared)
    return [*embeddings, ("embeddings.total", sum(n for _, n in embeddings)), *one_layer, ("layer.total", per_layer),
            (f"layers.total (x{L})", L * per_layer), *shared, ("heads.masked_lm", mlm),
            ("total.encoder (DebertaV2Model)", encoder),
            ("total.masked_lm (DebertaV2ForMaskedLM)", encoder + mlm)]


def sizes(config: DebertaV2Config) -> str:
    relative = f", k={config.relative_span}" + (" (log buckets)" if config.position_buckets > 0 else "") \
        if config.relative_attention else ""
    return (f"L={config.num_hidden_layers}, H={config.hidden_size}, A={config.num_attention_heads}, "
            f"I={config.intermediate_size}, V={config.vocab_size}{relative}")


PARAMETERS = ParameterTable(config_class=DebertaV2Config, rows=deberta_parameter_table, sizes=sizes)
