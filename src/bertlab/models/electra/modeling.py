"""The ELECTRA encoder: BERT's (`models/bert/modeling.py`) on token embeddings of width E.

    e   = LayerNorm(E_token + E_position + E_segment)      # width E (embedding_size)
    x_0 = W_p · e + b_p   when E != H (embeddings_project), else e
    x_L = BERT's post-LN blocks over x_0                    # no pooler: ELECTRA's heads read the tokens

The blocks, attention kernels, unpadded training layout and CPU inference paths are BERT's. Weight names are
Hugging Face's `ElectraModel`'s (`electra.` in heads); the padding id's embedding row learns nothing, as there.
"""

from __future__ import annotations

import torch
from torch import nn

from ...nn import Dropout
from ..bert.modeling import BertEmbeddings, BertModel, BertPreTrainedModel
from .config import ElectraConfig


class ElectraEmbeddings(BertEmbeddings):
    """BERT's embeddings at width E (`embedding_size`); the padding row of the token table gets no gradient."""

    def __init__(self, config: ElectraConfig):
        nn.Module.__init__(self)
        E = config.embedding_size
        self.word_embeddings = nn.Embedding(config.vocab_size, E, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, E)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, E)
        self.LayerNorm = nn.LayerNorm(E, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)


class ElectraPreTrainedModel(BertPreTrainedModel):
    """BERT's model base (initialisation, checkpoint I/O) with ELECTRA's checkpoint rules."""

    config_class = ElectraConfig
    base_model_prefix = "electra"
    base_model_parts = ("embeddings.", "embeddings_project.", "encoder.")
    optional_base_parts = ()
    # A discriminator's or a generator's pre-training head, in a folder loaded for another head: dropped quietly
    expected_unused_keys = ("discriminator_predictions.", "generator_predictions.", "generator_lm_head.")

    def init_weights(self, module: nn.Module | None = None) -> None:
        """BERT's initialisation, then the padding row of the token table zeroed (as `transformers` starts it)."""
        super().init_weights(module)
        with torch.no_grad():
            for m in (module or self).modules():
                if isinstance(m, ElectraEmbeddings) and m.word_embeddings.padding_idx is not None:
                    m.word_embeddings.weight[m.word_embeddings.padding_idx].zero_()


class ElectraModel(ElectraPreTrainedModel, BertModel):
    """`model(input_ids, attention_mask=None, token_type_ids=None)` -> `.last_hidden_state` (B, T, H); no pooler
    (`.pooler_output` is None)."""

    embeddings_class = ElectraEmbeddings

    def __init__(self, config: ElectraConfig, add_pooling_layer: bool = False):
        super().__init__(config, add_pooling_layer=False)  # ELECTRA has no pooler, whatever a head asks
        if config.embedding_size != config.hidden_size:
            self.embeddings_project = nn.Linear(config.embedding_size, config.hidden_size)
            self.init_weights(self.embeddings_project)

    def unfreezing_groups(self) -> list[nn.Module]:
        """Gradual unfreezing's groups, bottom to top: the embeddings with their projection to the hidden width
        (when E != H), then each block."""
        bottom = [self.embeddings, *([self.embeddings_project] if hasattr(self, "embeddings_project") else [])]
        return [nn.ModuleList(bottom) if len(bottom) > 1 else self.embeddings, *self.encoder.blocks()]

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
              position_ids: torch.Tensor | None) -> torch.Tensor:
        e = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, T, E)
        return self.embeddings_project(e) if hasattr(self, "embeddings_project") else e
