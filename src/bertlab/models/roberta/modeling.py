"""The RoBERTa encoder: BERT's (`models/bert/modeling.py`), with positions numbered as fairseq numbers them.

    position_t = padding_idx + (number of non-padding tokens in the row up to and including t)   (real tokens)
    position_t = padding_idx                                                                      (padding)

So the first token sits at `pad_token_id + 1` (2 for RoBERTa and XLM-R), whatever side the padding is on, and a
padded row gives its real tokens the positions it gives them alone. Positions come from the input ids before
anything else runs, so the unpadded token layout of training (`nn/token_layout.py`) and bucketed inference see
the same numbers. Hugging Face's `create_position_ids_from_input_ids`; its weight names (`roberta.` in heads).
"""

from __future__ import annotations

import torch
from torch import nn

from ..bert.modeling import BertEmbeddings, BertModel, BertPreTrainedModel
from .config import RobertaConfig


def position_ids_from_input_ids(input_ids: torch.Tensor, padding_idx: int) -> torch.Tensor:
    """(B, T) ids -> (B, T) positions: real tokens counted from `padding_idx + 1`, padding at `padding_idx`."""
    keep = input_ids.ne(padding_idx).int()
    return (torch.cumsum(keep, dim=1, dtype=torch.int32) * keep).long() + padding_idx


class RobertaEmbeddings(BertEmbeddings):
    """BERT's embeddings; positions from the ids (above) unless given. The padding rows of the word and position
    tables get no gradient (`padding_idx`), as in fairseq and Hugging Face."""

    def __init__(self, config: RobertaConfig):
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.word_embeddings.padding_idx = self.padding_idx
        self.position_embeddings.padding_idx = self.padding_idx

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        usable = self.position_embeddings.num_embeddings - self.padding_idx - 1
        if input_ids.shape[1] > usable:
            raise ValueError(f"sequence length {input_ids.shape[1]} exceeds the model's {usable} positions "
                             f"(max_position_embeddings {self.position_embeddings.num_embeddings}, from "
                             f"pad_token_id + 1 = {self.padding_idx + 1})")
        if position_ids is None:
            position_ids = position_ids_from_input_ids(input_ids, self.padding_idx)
        return super().forward(input_ids, token_type_ids, position_ids)


class RobertaPreTrainedModel(BertPreTrainedModel):
    config_class = RobertaConfig
    base_model_prefix = "roberta"

    def init_weights(self, module: nn.Module | None = None) -> None:
        """BERT's initialisation, then the padding rows of the embedding tables zeroed (Hugging Face's rule)."""
        super().init_weights(module)
        with torch.no_grad():
            for m in (module or self).modules():
                if isinstance(m, nn.Embedding) and m.padding_idx is not None:
                    m.weight[m.padding_idx].zero_()


class RobertaModel(RobertaPreTrainedModel, BertModel):
    """`model(input_ids, attention_mask=None)` -> `.last_hidden_state` (B, T, H), `.pooler_output` (B, H)."""

    embeddings_class = RobertaEmbeddings
