"""The paper's parameter arithmetic: how many weights each part of a BERT of a given config holds.

BERT-base (L=12, H=768, A=12) comes to 110M and BERT-large (L=24, H=1024, A=16) to 340M (paper, section 3).
Each row is computed from the config alone; tests check the totals against the built model and against
Hugging Face's count of the same config.
"""

from __future__ import annotations

from .models.bert.config import BertConfig


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


def roberta_parameter_table(config) -> list[tuple[str, int]]:
    """RoBERTa and XLM-R (a `RobertaConfig`): BERT's arithmetic on their own sizes -- one token type, 514
    positions -- and no next-sentence head; the masked LM (`lm_head`) is BERT's: dense, LayerNorm, output bias."""
    rows = dict(parameter_table(config))
    kept = [(k, n) for k, n in parameter_table(config) if not k.startswith(("heads.next_sentence", "total."))]
    encoder = rows["total.encoder (BertModel)"]
    return [*kept, ("total.encoder (RobertaModel)", encoder),
            ("total.masked_lm (RobertaForMaskedLM, no pooler)", encoder - rows["pooler"] + rows["heads.masked_lm"])]


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


def count(config: BertConfig, with_heads: bool = False) -> int:
    rows = dict(parameter_table(config))
    return rows["total.pretraining (BertForPreTraining)" if with_heads else "total.encoder (BertModel)"]


def format_table(name: str, config: BertConfig, rows=parameter_table) -> str:
    """The rows of `rows(config)` under a header of the sizes (BERT's names; ALBERT's E and groups too)."""
    extra = "".join(f", {k}={getattr(config, f)}" for k, f in (("E", "embedding_size"), ("G", "num_hidden_groups"))
                    if hasattr(config, f))
    lines = [f"{name}  (L={config.num_hidden_layers}, H={config.hidden_size}, A={config.num_attention_heads}, "
             f"I={config.intermediate_size}, V={config.vocab_size}{extra})"]
    for row, n in rows(config):
        lines.append(f"  {row:<42} {n:>14,}  {_human(n):>8}")
    return "\n".join(lines)


def _human(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n / 1e3:.1f}K"


# ---------------------------------------------------------------------------------------------- T5
def t5_parameter_table(config) -> list[tuple[str, int]]:
    """The same arithmetic for a `T5Config` (read by attribute; this layer does not import the model family):
    no biases anywhere, RMS norms with a scale only, one relative position table per stack, the embedding
    shared by both stacks and, for v1.0, the LM head. t5-small comes to 60M, base 220M, large 738M (the paper's
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


def format_t5_table(name: str, config) -> str:
    lines = [f"{name}  (T5 {config.architecture}, d_model={config.d_model}, d_ff={config.d_ff}, "
             f"layers={config.num_layers}/{config.num_decoder_layers}, heads={config.num_heads}x{config.d_kv}, "
             f"ffn={config.feed_forward_proj}, V={config.vocab_size})"]
    for row, n in t5_parameter_table(config):
        lines.append(f"  {row:<42} {n:>14,}  {_human(n):>8}")
    return "\n".join(lines)
