"""The MPNet encoder: BERT's post-LN blocks (`models/bert/modeling.py`) with a relative position bias.

    x_0   = LayerNorm(E_token + E_position)                  # positions from after the padding id, no types
    b     = RelBias[bucket(j - i)]                           # (1, nh, T, T), one table for every block
    x_l   = LayerNorm(x_{l-1} + o(softmax(Q Kᵀ / √d_k + b + mask) V))
    x_l   = LayerNorm(x_l + W_2 · GELU(W_1 · x_l + b_1) + b_2)

The bias is T5's bucketing (`nn/relative_position.py`: bidirectional, 32 buckets, max distance 128) over a row's
token indices 0..T-1, computed once per forward by the encoder (`MPNetEncoder.block_arguments`) and added by
every block's attention through the `nn.attention` seam -- in training on the unpadded tokens too, where the
seam lays each row out again as the (B, T) rectangle the bias is made for. A row's real tokens come first, so
padding on the right leaves their bias as it is alone. Module names are Hugging Face's `MPNetModel`
(`encoder.layer.0.attention.attn.q`, `encoder.relative_attention_bias`), so a `state_dict` moves as it is.
"""

from __future__ import annotations

import torch
from torch import nn

from ...nn import AttentionMask, Dropout, add_and_norm
from ...nn.relative_position import relative_position_bias
from ..bert.modeling import BertEncoder, BertIntermediate, BertModel, BertOutput, BertSelfAttention
from ..roberta.modeling import RobertaPreTrainedModel, position_ids_from_input_ids
from .config import MIN_BUCKETS, PADDING_ID, MPNetConfig

MAX_DISTANCE = 128  # offsets beyond share the last bucket (Hugging Face's `relative_position_bucket` default)
# Hugging Face's encoder sorts offsets into 32 buckets whatever the table's size (`compute_position_bias`'s default;
# the config's relative_attention_num_buckets sizes the table only): so does this one (`MPNetConfig` refuses fewer)
BUCKETS = MIN_BUCKETS


class MPNetEmbeddings(nn.Module):
    """E = LayerNorm(word[input_ids] + position[p]), then dropout; p counted from after the padding id (RoBERTa's
    numbering); no token type table (token types given are not read, as Hugging Face's model takes none)."""

    def __init__(self, config: MPNetConfig):
        super().__init__()
        self.padding_idx = PADDING_ID
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=PADDING_ID)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size,
                                                padding_idx=PADDING_ID)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        usable = self.position_embeddings.num_embeddings - PADDING_ID - 1
        if position_ids is None and input_ids.shape[1] > usable:
            raise ValueError(f"sequence length {input_ids.shape[1]} exceeds the model's {usable} positions "
                             f"(max_position_embeddings {self.position_embeddings.num_embeddings}, from "
                             f"padding id + 1 = {PADDING_ID + 1})")
        if position_ids is None:
            position_ids = position_ids_from_input_ids(input_ids, PADDING_ID)  # (B, T)
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)  # (B, T, H)
        return self.dropout(self.LayerNorm(x))


class MPNetSelfAttention(BertSelfAttention):
    """BERT's self-attention under MPNet's names (q, k, v), the output projection `o` inside, the bias added."""

    stacked_projections = ("q", "k", "v")

    def __init__(self, config: MPNetConfig):
        super().__init__(config)
        self.o = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x, mask, output_attentions=False, layout=None, bias=None):
        y, probs = super().forward(x, mask, output_attentions, layout, bias)
        return self.o(y), probs


class MPNetAttention(nn.Module):
    """x + dropout(attention(x)), then LayerNorm (post-LN)."""

    def __init__(self, config: MPNetConfig):
        super().__init__()
        self.attn = MPNetSelfAttention(config)  # the names Hugging Face's checkpoints use
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, x, mask, output_attentions=False, layout=None, bias=None):
        y, probs = self.attn(x, mask, output_attentions, layout, bias)
        return add_and_norm(self.dropout(y), x, self.LayerNorm), probs


class MPNetLayer(nn.Module):
    """One block: the biased self-attention sub-layer, then BERT's feed-forward sub-layer, each post-LN."""

    def __init__(self, config: MPNetConfig):
        super().__init__()
        self.attention = MPNetAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x, mask, output_attentions=False, layout=None, bias=None, mask_in_bias=False):
        # `mask_in_bias`: the encoder summed the padding mask into `bias` once for every block (inference)
        x, probs = self.attention(x, None if mask_in_bias else mask, output_attentions, layout, bias)
        return self.output(self.intermediate(x), x), probs  # (B, T, H), or (N, H) with a layout


class MPNetEncoder(BertEncoder):
    """BERT's layer stack with MPNet's blocks and the (num_buckets, nh) bias table they share."""

    layer_class = MPNetLayer

    def __init__(self, config: MPNetConfig):
        super().__init__(config)
        self.relative_attention_bias = nn.Embedding(config.relative_attention_num_buckets, config.num_attention_heads)

    def block_arguments(self, x: torch.Tensor, mask: AttentionMask) -> dict[str, torch.Tensor]:
        if mask.documents is not None:
            raise ValueError("MPNet's relative position bias numbers a row's tokens from its start; rows packed "
                             "with several documents are not taken")
        T = x.size(1)
        bias = relative_position_bias(self.relative_attention_bias, T, T, True, MAX_DISTANCE, num_buckets=BUCKETS)
        if self.training or torch.is_grad_enabled():
            return {"bias": bias}  # (1, nh, T, T)
        # Inference: bias + padding mask summed here once, in x's dtype, where each block's attention would sum
        # them again -- a (B, nh, T, T) tensor a layer, what kept a bf16 model 1.2x slower than BERT's shape on
        # four rows of 448 tokens. The sum is the one the blocks made (`nn.attention`: bias + the mask's additive).
        add = mask.additive(T, T, x.dtype, x.device)
        bias = bias.to(x.dtype)
        return {"bias": bias if add is None else bias + add, "mask_in_bias": True}  # (1 | B, nh, T, T)


class MPNetPreTrainedModel(RobertaPreTrainedModel):
    config_class = MPNetConfig
    base_model_prefix = "mpnet"
    ignored_checkpoint_keys = ("embeddings.position_ids",)


class MPNetModel(MPNetPreTrainedModel, BertModel):
    """`model(input_ids, attention_mask=None)` -> `.last_hidden_state` (B, T, H), `.pooler_output` (B, H)."""

    embeddings_class = MPNetEmbeddings
    encoder_class = MPNetEncoder
