"""T5's parameter table (`bertlab params`)."""

from __future__ import annotations

from ..family import ParameterTable
from .config import PRESETS, T5Config


def t5_parameter_table(config) -> list[tuple[str, int]]:
    """The paper-style arithmetic for a `T5Config`: no biases anywhere, RMS norms with a scale only, one relative position table per stack,
    the embedding shared by both stacks and, for v1.0, the LM head. t5-small comes to 60M, base 220M, large 738M (the paper's
    "770M")."""
    V, d, d_ff, inner, nh = config.vocab_size, config.d_model, config.d_ff, config.num_heads * config.d_kv, config.num_heads
    norm = d
    attention = 4 * d * inner  # q, k, v, o; no biases
    ffn = (3 if config.is_gated_act else 2) * d * d_ff
    positions = config.relative_attention_num_buckets * nh
    encoder_layer = attention + norm + ffn + norm
    decoder_layer = attention + norm + (attention + norm if config.is_encoder_decoder else 0) + ffn + norm
    shared = getattr(config, "share_encoder_decoder", False)
    if shared:  # Table 2's "Enc-dec, shared": the decoder's self-attention and FFN are the encoder's
        decoder_layer = attention + norm
    L_dec = config.num_decoder_layers
    L_enc = config.num_layers if config.is_encoder_decoder else 0
    lm_head = 0 if config.tie_word_embeddings else V * d
    rows = [("shared embedding", V * d)]
    if L_enc:
        rows += [("encoder.layer.self_attention", attention + norm), ("encoder.layer.ffn", ffn + norm),
                 (f"encoder.layers.total (x{L_enc})", L_enc * encoder_layer),
                 ("encoder.relative_positions", positions), ("encoder.final_norm", norm)]
    if not shared:
        rows += [("decoder.layer.self_attention", attention + norm)]
    if config.is_encoder_decoder:
        rows += [("decoder.layer.cross_attention", attention + norm)]
    rows += [("decoder.layer.ffn" + (" (the encoder's)" if shared else ""), 0 if shared else ffn + norm),
             (f"decoder.layers.total (x{L_dec}{', self-attention and FFN shared' if shared else ''})",
              L_dec * decoder_layer),
             ("decoder.relative_positions", positions), ("decoder.final_norm", norm),
             ("lm_head" + (" (tied to the embedding)" if config.tie_word_embeddings else ""), lm_head)]
    total = V * d + (L_enc * encoder_layer + positions + norm if L_enc else 0) + L_dec * decoder_layer \
        + positions + norm + lm_head
    rows.append(("total (T5ForConditionalGeneration)", total))
    return rows


def t5_count(config) -> int:
    return t5_parameter_table(config)[-1][1]


def sizes(config) -> str:
    return (f"T5 {config.architecture}, d_model={config.d_model}, d_ff={config.d_ff}, "
            f"layers={config.num_layers}/{config.num_decoder_layers}, heads={config.num_heads}x{config.d_kv}, "
            f"ffn={config.feed_forward_proj}, V={config.vocab_size}")


PARAMETERS = ParameterTable(config_class=T5Config, rows=t5_parameter_table, sizes=sizes,
                            is_preset=PRESETS.__contains__, presets=", ".join(PRESETS))
