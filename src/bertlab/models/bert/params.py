"""BERT's parameter table (`bertlab params`): the paper's arithmetic, how many weights each part of a BERT of a
given config holds.

BERT-base (L=12, H=768, A=12) comes to 110M and BERT-large (L=24, H=1024, A=16) to 340M (paper, section 3).
Each row is computed from the config alone; tests check the totals against the built model and against
Hugging Face's count of the same config.
"""

from __future__ import annotations

from ..family import ParameterTable
from .config import BertConfig, is_preset, preset_names


def linear(n_in: int, n_out: int) -> int:
    """A dense layer: weight n_in x n_out plus a bias of n_out."""
    return n_in * n_out + n_out


def block_rows(H: int, I: int) -> list[tuple[str, int]]:
    """One post-LN Transformer block (BERT's; DistilBERT's and ALBERT's are the same weights under other names)."""
    return [
        ("layer.attention.query", linear(H, H)),
        ("layer.attention.key", linear(H, H)),
        ("layer.attention.value", linear(H, H)),
        ("layer.attention.output", linear(H, H)),
        ("layer.attention.layer_norm", 2 * H),
        ("layer.ffn.intermediate", linear(H, I)),
        ("layer.ffn.output", linear(I, H)),
        ("layer.ffn.layer_norm", 2 * H),
    ]


def parameter_table(config: BertConfig) -> list[tuple[str, int]]:
    """(row name, count) in the order of the paper's architecture; the last rows are the totals."""
    V, H, I, L = config.vocab_size, config.hidden_size, config.intermediate_size, config.num_hidden_layers
    P, S = config.max_position_embeddings, config.type_vocab_size
    layer_norm = 2 * H  # gain and bias
    embeddings = [
        ("embeddings.word", V * H),
        ("embeddings.position", P * H),
        ("embeddings.segment", S * H),
        ("embeddings.layer_norm", layer_norm),
    ]
    one_layer = block_rows(H, I)
    per_layer = sum(n for _, n in one_layer)
    pooler = linear(H, H)
    # MLM: transform dense + LayerNorm + an output bias per vocabulary entry (the decoder matrix is the tied
    # word embedding, already counted); NSP: a 2-way classifier on the pooled output.
    mlm = linear(H, H) + layer_norm + V
    nsp = linear(H, 2)
    encoder = sum(n for _, n in embeddings) + L * per_layer
    rows = [
        *embeddings,
        ("embeddings.total", sum(n for _, n in embeddings)),
        *one_layer,
        ("layer.total", per_layer),
        (f"layers.total (x{L})", L * per_layer),
        ("pooler", pooler),
        ("heads.masked_lm", mlm),
        ("heads.next_sentence", nsp),
        ("total.encoder (BertModel)", encoder + pooler),
        ("total.pretraining (BertForPreTraining)", encoder + pooler + mlm + nsp),
    ]
    return rows


def count(config: BertConfig, with_heads: bool = False) -> int:
    rows = dict(parameter_table(config))
    return rows["total.pretraining (BertForPreTraining)" if with_heads else "total.encoder (BertModel)"]


def sizes(config) -> str:
    """The sizes a table's header shows: BERT's names (ALBERT's E and groups too, where the config has them)."""
    extra = "".join(f", {k}={getattr(config, f)}" for k, f in (("E", "embedding_size"), ("G", "num_hidden_groups"))
                    if hasattr(config, f))
    return (f"L={config.num_hidden_layers}, H={config.hidden_size}, A={config.num_attention_heads}, "
            f"I={config.intermediate_size}, V={config.vocab_size}{extra}")


PARAMETERS = ParameterTable(config_class=BertConfig, rows=parameter_table, sizes=sizes, is_preset=is_preset,
                            presets=f"{', '.join(preset_names()[:6])}, L2-H128 ... L12-H768")
