"""The ALBERT encoder (Lan et al., 2019, section 3.1): BERT with two parameter reductions.

    e   = LayerNorm(E_token + E_position + E_segment)             # width E (embedding_size), E < H
    x_0 = W_in · e + b_in                                         # embedding_hidden_mapping_in: E -> H
    x_l = Block_{g(l)}(x_{l-1}),  g(l) = l // (L / num_hidden_groups)   # cross-layer sharing
    pooled = tanh(W_p · x_L[:, 0] + b_p)

Each block is BERT's post-LN block (`models/bert/modeling.py`), with ALBERT's module names: the attention is
`BertSelfAttention` (fused training projection, int8 stacking, the `nn.attention` seam) with its output
projection and LayerNorm on the same module; the layer loop is `BertEncoder`'s (unpadded `TokenLayout` in
training), run over the sequence of shared blocks. A group may hold several blocks (`inner_group_num`), run one
after the other each time the group runs. Parameter names are Hugging Face's `AlbertModel`'s.
"""

from __future__ import annotations

import torch
from torch import nn

from ...nn import AttentionMask, Dropout, add_and_norm
from ...nn.elementwise import linear_activate
from ..bert.modeling import BertEmbeddings, BertEncoder, BertPreTrainedModel, BertSelfAttention
from ..outputs import EncoderOutput
from .config import AlbertConfig


class AlbertEmbeddings(BertEmbeddings):
    """BERT's embeddings at width E (`embedding_size`)."""

    def __init__(self, config: AlbertConfig):
        nn.Module.__init__(self)
        self.word_embeddings = nn.Embedding(config.vocab_size, config.embedding_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.embedding_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.embedding_size)
        self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)


class AlbertAttention(BertSelfAttention):
    """BERT's self-attention sub-layer on one module: heads, then dense, dropout, residual, LayerNorm."""

    def __init__(self, config: AlbertConfig):
        super().__init__(config)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.output_dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, x, mask, output_attentions=False, layout=None):
        y, probs = super().forward(x, mask, output_attentions, layout)
        return add_and_norm(self.output_dropout(self.dense(y)), x, self.LayerNorm), probs


class AlbertLayer(nn.Module):
    """One block: attention sub-layer, then full_layer_layer_norm(x + ffn_output(act(ffn(x)))).
    (ALBERT's code applies no dropout to the feed-forward output; nor does this.)"""

    def __init__(self, config: AlbertConfig):
        super().__init__()
        self.attention = AlbertAttention(config)
        self.ffn = nn.Linear(config.hidden_size, config.intermediate_size)
        self.ffn_output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.full_layer_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.hidden_act = config.hidden_act

    def forward(self, x, mask, output_attentions=False, layout=None):
        x, probs = self.attention(x, mask, output_attentions, layout)
        return add_and_norm(self.ffn_output(linear_activate(self.ffn, x, self.hidden_act)), x, self.full_layer_layer_norm), probs


class AlbertLayerGroup(nn.Module):
    """`inner_group_num` blocks run one after the other: what one layer position runs."""

    def __init__(self, config: AlbertConfig):
        super().__init__()
        self.albert_layers = nn.ModuleList(AlbertLayer(config) for _ in range(config.inner_group_num))

    def forward(self, x, mask, output_attentions=False, layout=None):
        probs = None
        for layer in self.albert_layers:
            x, probs = layer(x, mask, output_attentions, layout)
        return x, probs


class AlbertTransformer(BertEncoder):
    """E -> H, then `num_hidden_layers` layer positions, each running its group (shared weights): BERT's
    encoder loop over `blocks()`. `hidden_states` holds the mapped input and each layer position's output."""

    def __init__(self, config: AlbertConfig):
        nn.Module.__init__(self)
        self.config = config
        self.embedding_hidden_mapping_in = nn.Linear(config.embedding_size, config.hidden_size)
        self.albert_layer_groups = nn.ModuleList(AlbertLayerGroup(config) for _ in range(config.num_hidden_groups))

    def blocks(self) -> list[nn.Module]:
        return [self.albert_layer_groups[self.config.group_of_layer(l)] for l in range(self.config.num_hidden_layers)]

    def forward(self, x, mask, attention_mask=None, output_hidden_states=False, output_attentions=False):
        return super().forward(self.embedding_hidden_mapping_in(x), mask, attention_mask, output_hidden_states,
                               output_attentions)


class AlbertPreTrainedModel(BertPreTrainedModel):
    """BERT's model base (initialisation, checkpoint I/O) with ALBERT's checkpoint rules."""

    config_class = AlbertConfig
    base_model_prefix = "albert"
    base_model_parts = ("embeddings.", "encoder.", "pooler.")
    optional_base_parts = ("pooler.",)
    ignored_checkpoint_keys = ("embeddings.position_ids", "embeddings.token_type_ids")


class AlbertModel(AlbertPreTrainedModel):
    """`model(input_ids, attention_mask=None, token_type_ids=None)` -> `EncoderOutput` with
    `.last_hidden_state` (B, T, H) and `.pooler_output` (B, H) (None without the pooler)."""

    def __init__(self, config: AlbertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = AlbertEmbeddings(config)
        self.encoder = AlbertTransformer(config)
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if add_pooling_layer else None
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False) -> EncoderOutput:
        x = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, T, E)
        mask = AttentionMask.padding(attention_mask)
        x, hidden_states, attentions = self.encoder(x, mask, attention_mask, output_hidden_states, output_attentions)
        pooled = torch.tanh(self.pooler(x[:, 0])) if self.pooler is not None else None
        return EncoderOutput.of(x, hidden_states, attentions, pooled)
