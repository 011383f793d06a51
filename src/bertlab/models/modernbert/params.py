"""ModernBERT's parameter table (`bertlab params`): how many weights each part of a ModernBERT of a given config
holds, from the config alone. ModernBERT-base (L=22, H=768, I=1152, V=50368) comes to 149M, as its release says;
tests check the totals against the built model and against Hugging Face's count of the same config."""

from __future__ import annotations

from ..family import ParameterTable
from .config import ModernBertConfig


def linear(n_in: int, n_out: int, bias: bool) -> int:
    return n_in * n_out + (n_out if bias else 0)


def parameter_table(config: ModernBertConfig) -> list[tuple[str, int]]:
    """(row name, count) in the order of the architecture; the last rows are the totals."""
    V, H, I, L = config.vocab_size, config.hidden_size, config.intermediate_size, config.num_hidden_layers
    layer_norm = H * (2 if config.norm_bias else 1)  # a gain, and a bias only with norm_bias
    embeddings = V * H + layer_norm
    one_layer = [
        ("layer.attn_norm (not in layer 0)", layer_norm),
        ("layer.attn.Wqkv", linear(H, 3 * H, config.attention_bias)),
        ("layer.attn.Wo", linear(H, H, config.attention_bias)),
        ("layer.mlp_norm", layer_norm),
        ("layer.mlp.Wi (GeGLU: value and gate)", linear(H, 2 * I, config.mlp_bias)),
        ("layer.mlp.Wo", linear(I, H, config.mlp_bias)),
    ]
    per_layer = sum(n for _, n in one_layer)
    layers = L * per_layer - layer_norm  # layer 0 reads the embeddings' norm: no attn_norm of its own
    head = linear(H, H, config.classifier_bias) + layer_norm
    mlm = head + (V if config.decoder_bias else 0)  # the decoder matrix is the tied token embeddings
    encoder = embeddings + layers + layer_norm
    return [
        ("embeddings.tok_embeddings", V * H),
        ("embeddings.norm", layer_norm),
        *one_layer,
        ("layer.total", per_layer),
        (f"layers.total (x{L}, less layer 0's attn_norm)", layers),
        ("final_norm", layer_norm),
        ("heads.prediction_head", head),
        ("heads.masked_lm (prediction head + decoder bias)", mlm),
        ("total.encoder (ModernBertModel)", encoder),
        ("total.masked_lm (ModernBertForMaskedLM)", encoder + mlm),
    ]


def sizes(config) -> str:
    global_layers = sum(t == "full_attention" for t in config.layer_types)
    return (f"L={config.num_hidden_layers} ({global_layers} global), H={config.hidden_size}, "
            f"A={config.num_attention_heads}, I={config.intermediate_size}, V={config.vocab_size}, "
            f"window={config.local_attention}")


PARAMETERS = ParameterTable(config_class=ModernBertConfig, rows=parameter_table, sizes=sizes)
