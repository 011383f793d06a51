"""DistilBERT's heads, as Hugging Face's `DistilBertFor*` classes have them (same parameter names), registered
under the standard kinds (`models/heads.py`):

    masked-lm                 vocab_projector(vocab_layer_norm(act(vocab_transform(h)))), the projector tied
                              to the word embeddings, with its own bias
    text-classification       classifier(dropout(ReLU(pre_classifier(h_[CLS])))) -- no pooler: the first token
    token-classification      classifier(dropout(h_t))
    question-answering        qa_outputs(dropout(h_t)) -> start, end
    multiple-choice           as sequence classification, one score per choice

The losses are BERT's (`models/bert/heads.py`), as is the masked LM's selection of predicted rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...nn import ACTIVATIONS
from ..heads import (HeadOutput, HeadRegistry, PreTrainingOutput, QuestionAnsweringOutput, TaskOutputLayer,
                     VocabProjection)
from ..bert.heads import masked_lm, sequence_loss, span_loss, token_loss
from .config import DistilBertConfig
from .modeling import DistilBertModel, DistilBertPreTrainedModel

HEADS = HeadRegistry()  # DistilBERT's heads by kind


@HEADS.register("masked-lm", output=PreTrainingOutput, prefix="vocab_projector.",
                logits=lambda out: out.prediction_logits)
class DistilBertForMaskedLM(DistilBertPreTrainedModel):
    """Masked LM: the distillation's student objective, and fill-mask."""

    tied_weight_keys = ("vocab_projector.weight",)

    def __init__(self, config: DistilBertConfig):
        super().__init__(config)
        self.distilbert = DistilBertModel(config)
        self.vocab_transform = nn.Linear(config.dim, config.dim)
        self.vocab_layer_norm = nn.LayerNorm(config.dim, eps=config.layer_norm_eps)
        self.vocab_projector = nn.Linear(config.dim, config.vocab_size)
        self.vocab_projector.weight = self.distilbert.embeddings.word_embeddings.weight  # tied
        self.init_weights(self.vocab_transform)
        self.init_weights(self.vocab_layer_norm)
        nn.init.zeros_(self.vocab_projector.bias)

    def vocab_hidden(self, h: torch.Tensor) -> torch.Tensor:
        return self.vocab_layer_norm(ACTIVATIONS[self.config.activation](self.vocab_transform(h)))

    def vocab_projection(self) -> VocabProjection:
        return VocabProjection(self.vocab_hidden, self.vocab_projector.weight, self.vocab_projector.bias)

    def vocab_logits(self, h: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V)."""
        return F.linear(self.vocab_hidden(h), self.vocab_projector.weight, self.vocab_projector.bias)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None) -> PreTrainingOutput:
        out = self.distilbert(input_ids, attention_mask=attention_mask)
        logits, loss = masked_lm(self.vocab_logits, out.last_hidden_state, labels)
        return PreTrainingOutput(logits, None, loss, loss, None)


class _FirstTokenClassifier(DistilBertPreTrainedModel):
    """classifier(dropout(ReLU(pre_classifier(h_[CLS])))), `n_out` scores: sequence classification and
    multiple choice share it."""

    def __init__(self, config: DistilBertConfig, n_out: int):
        super().__init__(config)
        self.distilbert = DistilBertModel(config)
        self.pre_classifier = nn.Linear(config.dim, config.dim)
        self.classifier = TaskOutputLayer(config.dim, n_out)
        self.dropout = nn.Dropout(config.seq_classif_dropout)
        self.init_weights(self.pre_classifier)
        self.init_weights(self.classifier)

    def scores(self, input_ids, attention_mask, **kwargs):
        out = self.distilbert(input_ids, attention_mask=attention_mask, **kwargs)
        return self.classifier(self.dropout(torch.relu(self.pre_classifier(out.last_hidden_state[:, 0])))), out


@HEADS.register("text-classification", output=HeadOutput, prefix="classifier.", soft_target="classes")
class DistilBertForSequenceClassification(_FirstTokenClassifier):
    def __init__(self, config: DistilBertConfig):
        super().__init__(config, config.num_labels)
        self.num_labels = config.num_labels

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False) -> HeadOutput:
        logits, out = self.scores(input_ids, attention_mask, output_hidden_states=output_hidden_states,
                                  output_attentions=output_attentions)  # (B, num_labels)
        return HeadOutput(logits, sequence_loss(self.config, logits, labels), out.hidden_states, out.attentions)


@HEADS.register("token-classification", output=HeadOutput, prefix="classifier.", soft_target="tokens", detectable=False)
class DistilBertForTokenClassification(DistilBertPreTrainedModel):
    def __init__(self, config: DistilBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.distilbert = DistilBertModel(config)
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = TaskOutputLayer(config.dim, config.num_labels)
        self.init_weights(self.classifier)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False) -> HeadOutput:
        out = self.distilbert(input_ids, attention_mask=attention_mask, output_hidden_states=output_hidden_states,
                              output_attentions=output_attentions)
        logits = self.classifier(self.dropout(out.last_hidden_state))  # (B, T, num_labels)
        return HeadOutput(logits, token_loss(logits, labels), out.hidden_states, out.attentions)


@HEADS.register("question-answering", output=QuestionAnsweringOutput, prefix="qa_outputs.",
                soft_target="spans", logits=lambda out: torch.stack([out.start_logits, out.end_logits], dim=-1))
class DistilBertForQuestionAnswering(DistilBertPreTrainedModel):
    def __init__(self, config: DistilBertConfig):
        super().__init__(config)
        self.distilbert = DistilBertModel(config)
        self.qa_outputs = TaskOutputLayer(config.dim, 2)
        self.dropout = nn.Dropout(config.qa_dropout)
        self.init_weights(self.qa_outputs)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, start_positions=None,
                end_positions=None) -> QuestionAnsweringOutput:
        out = self.distilbert(input_ids, attention_mask=attention_mask)
        start_logits, end_logits = self.qa_outputs(self.dropout(out.last_hidden_state)).unbind(dim=-1)  # 2 x (B, T)
        return QuestionAnsweringOutput(start_logits, end_logits,
                                       span_loss(start_logits, end_logits, start_positions, end_positions))


@HEADS.register("multiple-choice", output=HeadOutput, prefix="classifier.", soft_target="classes", detectable=False)
class DistilBertForMultipleChoice(_FirstTokenClassifier):
    """(B, C, T) choices flattened to (B·C, T), one score each, softmax over the choices."""

    def __init__(self, config: DistilBertConfig):
        super().__init__(config, 1)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None) -> HeadOutput:
        B, C, T = input_ids.shape
        mask = attention_mask.reshape(B * C, T) if attention_mask is not None else None
        logits = self.scores(input_ids.reshape(B * C, T), mask)[0].view(B, C)  # (B, C)
        loss = F.cross_entropy(logits.float(), labels.view(-1)) if labels is not None else None
        return HeadOutput(logits, loss)
