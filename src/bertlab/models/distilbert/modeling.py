"""The DistilBERT encoder (Sanh et al., 2019): BERT's post-LN block, six layers, no token types, no pooler.

    x_0 = LayerNorm(E_token + E_position)                         # learned, or fixed sin/cos, positions
    x_l = sa_layer_norm(x_{l-1} + out_lin(MultiHeadAttention(x_{l-1})))
    x_l = output_layer_norm(x_l + dropout(lin2 · act(lin1 · x_l)))

The math is BERT's (`models/bert/modeling.py`) and so is the code: the attention is `BertSelfAttention` with
DistilBERT's projection names (its fused training projection, int8 stacking and the `nn.attention` seam come
with it), the layer stack is `BertEncoder` (the unpadded `TokenLayout` in training), the pre-trained model base
is `BertPreTrainedModel` (initialisation, checkpoint rules). Only the module names are DistilBERT's, those of
Hugging Face's `DistilBertModel`, so a `state_dict` moves between bertlab and `transformers` as it is. One
difference from BERT's block beyond the names: no dropout on the attention output (as DistilBERT's code).
"""

from __future__ import annotations

import torch
from torch import nn

from ...nn import AttentionMask, Dropout, add_and_norm
from ...nn.elementwise import linear_activate
from ...nn.encoder_layer import post_ln_layer
from ..bert.modeling import BertEncoder, BertPreTrainedModel, BertSelfAttention
from ..outputs import EncoderOutput
from .config import DistilBertConfig


def sinusoidal_positions(n_positions: int, dim: int) -> torch.Tensor:
    """(n_positions, dim): sin(p / 10000^(2i/dim)) at even columns 2i, cos(...) at odd ones 2i+1, computed in
    float64 as DistilBERT's code does."""
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]
    angle = pos / torch.pow(torch.tensor(10000.0, dtype=torch.float64),
                            2 * (torch.arange(dim) // 2).to(torch.float64) / dim)  # (P, dim)
    table = torch.empty(n_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle[:, 0::2])
    table[:, 1::2] = torch.cos(angle[:, 1::2])
    return table.float()


class Embeddings(nn.Module):
    """E = LayerNorm(word[input_ids] + position[0..T-1]), then dropout; no token type table."""

    def __init__(self, config: DistilBertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.dim)
        self.LayerNorm = nn.LayerNorm(config.dim, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.dropout)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        T = input_ids.shape[1]
        if T > self.position_embeddings.num_embeddings:
            raise ValueError(f"sequence length {T} exceeds max_position_embeddings "
                             f"({self.position_embeddings.num_embeddings})")
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device)[None, :]  # (1, T)
        return self.dropout(self.LayerNorm(self.word_embeddings(input_ids) + self.position_embeddings(position_ids)))


class MultiHeadSelfAttention(BertSelfAttention):
    """BERT's self-attention under DistilBERT's names, with the output projection inside (`out_lin`)."""

    stacked_projections = ("q_lin", "k_lin", "v_lin")

    def __init__(self, config: DistilBertConfig):
        super().__init__(config)
        self.out_lin = nn.Linear(config.dim, config.dim)

    def forward(self, x, mask, output_attentions=False, layout=None):
        y, probs = super().forward(x, mask, output_attentions, layout)
        return self.out_lin(y), probs


class FFN(nn.Module):
    """dropout(lin2 · act(lin1 · x)): H -> hidden_dim -> H."""

    def __init__(self, config: DistilBertConfig):
        super().__init__()
        self.lin1 = nn.Linear(config.dim, config.hidden_dim)
        self.lin2 = nn.Linear(config.hidden_dim, config.dim)
        self.dropout = Dropout(config.dropout)
        self.activation = config.activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.lin2(linear_activate(self.lin1, x, self.activation)))


class TransformerBlock(nn.Module):
    """One post-LN block: attention sub-layer, then feed-forward sub-layer, each added to its input and
    normalised. `(x, mask, output_attentions, layout) -> (x, probs)`, as `BertLayer`."""

    def __init__(self, config: DistilBertConfig):
        super().__init__()
        self.attention = MultiHeadSelfAttention(config)
        self.sa_layer_norm = nn.LayerNorm(config.dim, eps=config.layer_norm_eps)
        self.ffn = FFN(config)
        self.output_layer_norm = nn.LayerNorm(config.dim, eps=config.layer_norm_eps)

    def forward(self, x, mask, output_attentions=False, layout=None):
        if not (self.training or output_attentions) and layout is None and self.attention.stacked is not None and (
                y := post_ln_layer(x, mask, self.attention.stacked, self.attention.num_heads,
                                   self.attention.attn_implementation, self.attention.out_lin, self.sa_layer_norm,
                                   self.ffn.lin1, self.ffn.activation, self.ffn.lin2,
                                   self.output_layer_norm)) is not None:
            return y, None  # CPU fp32 inference: the block in one C call, the same bits (`nn.encoder_layer`)
        y, probs = self.attention(x, mask, output_attentions, layout)
        x = add_and_norm(y, x, self.sa_layer_norm)
        return add_and_norm(self.ffn(x), x, self.output_layer_norm), probs


class Transformer(BertEncoder):
    """`n_layers` blocks, run by BERT's encoder loop (unpadded in training)."""

    layer_class = TransformerBlock


class DistilBertPreTrainedModel(BertPreTrainedModel):
    """BERT's model base (initialisation, checkpoint I/O) with DistilBERT's checkpoint rules."""

    config_class = DistilBertConfig
    base_model_prefix = "distilbert"
    base_model_parts = ("embeddings.", "transformer.")
    optional_base_parts = ()
    ignored_checkpoint_keys = ("embeddings.position_ids",)

    def init_weights(self, module: nn.Module | None = None) -> None:
        """BERT's initialisation; a sinusoidal position table gets its fixed values (and no gradient)."""
        super().init_weights(module)
        if self.config.sinusoidal_pos_embds:
            for m in (module or self).modules():
                if isinstance(m, Embeddings):
                    with torch.no_grad():
                        m.position_embeddings.weight.copy_(sinusoidal_positions(*m.position_embeddings.weight.shape))
                    m.position_embeddings.weight.requires_grad_(False)


class DistilBertModel(DistilBertPreTrainedModel):
    """`model(input_ids, attention_mask=None)` -> `EncoderOutput` (no pooler output). `token_type_ids` are
    accepted and ignored: DistilBERT has no segment embedding, and the recipes pass the ids their tokenizer
    makes (a text pair's second segment is 1); Hugging Face's DistilBERT tokenizer does not return them."""

    def __init__(self, config: DistilBertConfig):
        super().__init__(config)
        self.embeddings = Embeddings(config)
        self.transformer = Transformer(config)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False) -> EncoderOutput:
        x = self.embeddings(input_ids, position_ids)  # (B, T, H)
        mask = AttentionMask.padding(attention_mask)
        x, hidden_states, attentions = self.transformer(x, mask, attention_mask, output_hidden_states,
                                                        output_attentions)
        return EncoderOutput.of(x, hidden_states, attentions)
