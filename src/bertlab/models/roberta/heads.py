"""RoBERTa's heads, as Hugging Face's `RobertaFor*` have them (weight names included), registered by kind.

    masked-lm                 lm_head: dense, GELU, layer_norm, then the word embeddings (tied) + bias
    text-classification       classifier: dense + tanh on the <s> token, then out_proj (no pooler)
    token-classification      classifier on every token
    question-answering        qa_outputs: a start and an end score per token
    multiple-choice           classifier on the pooled <s> of each choice (the pooler is kept here)

The losses are BERT's rules (`models/bert/heads.py`): multi-label and regression classifiers, -100 ignored.
RoBERTa has no next-sentence objective, so no `pretraining` head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..heads import (HeadOutput, HeadRegistry, PreTrainingOutput, QuestionAnsweringOutput, TaskOutputLayer,
                     VocabProjection)
from ..bert.heads import masked_lm, sequence_loss, span_loss, token_loss
from .config import RobertaConfig
from .modeling import RobertaModel, RobertaPreTrainedModel

HEADS = HeadRegistry()  # RoBERTa's heads by kind (`models/heads.py`)


class RobertaHeadModel(RobertaPreTrainedModel):
    """What every head here shares: its encoder (`encoder_class`), kept under `base_model_prefix` -- the name
    its checkpoints give it, so a family with these heads on another encoder (MPNet) sets the two."""

    encoder_class: type[nn.Module] = RobertaModel

    def build_encoder(self, config: RobertaConfig, add_pooling_layer: bool = False) -> nn.Module:
        setattr(self, self.base_model_prefix, self.encoder_class(config, add_pooling_layer=add_pooling_layer))
        return self.base_model

    @property
    def base_model(self) -> nn.Module:
        """The encoder (Hugging Face's name for it)."""
        return getattr(self, self.base_model_prefix)


def classifier_dropout(config: RobertaConfig) -> nn.Dropout:
    p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
    return nn.Dropout(p)


class RobertaLMHead(nn.Module):
    """logits = LayerNorm(GELU(W h + b)) · E_wordᵀ + bias: the decoder is the input embedding matrix (tied); its
    bias is `bias` (Hugging Face's `lm_head.decoder.bias` is the same tensor)."""

    def __init__(self, config: RobertaConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.decoder.weight = word_embeddings.weight  # tied: one matrix, updated by both ends
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.decoder.bias = self.bias

    def transform(self, h: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(F.gelu(self.dense(h)))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(self.transform(h), self.decoder.weight, self.bias)


class RobertaClassificationHead(nn.Module):
    """logits = W_o · dropout(tanh(W · dropout(h_<s>) + b)) + b_o: two layers on the first token's state."""

    def __init__(self, config: RobertaConfig):
        super().__init__()
        self.dense = TaskOutputLayer(config.hidden_size, config.hidden_size)
        self.dropout = classifier_dropout(config)
        self.out_proj = TaskOutputLayer(config.hidden_size, config.num_labels)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.dense(self.dropout(hidden[:, 0])))
        return self.out_proj(self.dropout(x))


@HEADS.register("masked-lm", output=PreTrainingOutput, prefix="lm_head.", logits=lambda out: out.prediction_logits)
class RobertaForMaskedLM(RobertaHeadModel):
    """Masked LM (RoBERTa's only pre-training objective, and fill-mask)."""

    tied_weight_keys = ("lm_head.decoder.weight", "lm_head.decoder.bias")
    expected_unused_keys = ("roberta.pooler.", "pooler.")

    def __init__(self, config: RobertaConfig):
        super().__init__(config)
        self.lm_head = RobertaLMHead(config, self.build_encoder(config).embeddings.word_embeddings)
        self.init_weights(self.lm_head)

    def vocab_projection(self) -> VocabProjection:
        return VocabProjection(self.lm_head.transform, self.lm_head.decoder.weight, self.lm_head.bias)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None) -> PreTrainingOutput:
        out = self.base_model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        logits, loss = masked_lm(self.lm_head, out.last_hidden_state, labels)
        return PreTrainingOutput(logits, None, loss, loss, None)


@HEADS.register("text-classification", output=HeadOutput, prefix="classifier.out_proj.", soft_target="classes")
class RobertaForSequenceClassification(RobertaHeadModel):
    """Classification (or regression, or multi-label: `nn.heads.sequence_loss`) on the <s> token."""

    expected_unused_keys = ("roberta.pooler.", "pooler.")

    def __init__(self, config: RobertaConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.build_encoder(config)
        self.classifier = RobertaClassificationHead(config)
        self.init_weights(self.classifier)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False) -> HeadOutput:
        out = self.base_model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                           output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.classifier(out.last_hidden_state)  # (B, num_labels)
        loss = sequence_loss(self.config, logits, labels) if labels is not None else None
        return HeadOutput(logits, loss, out.hidden_states, out.attentions)


@HEADS.register("token-classification", output=HeadOutput, prefix="classifier.", soft_target="tokens", detectable=False)
class RobertaForTokenClassification(RobertaHeadModel):
    """logits_t = W · dropout(h_t) + b for every token."""

    expected_unused_keys = ("roberta.pooler.", "pooler.")

    def __init__(self, config: RobertaConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.build_encoder(config)
        self.dropout = classifier_dropout(config)
        self.classifier = TaskOutputLayer(config.hidden_size, config.num_labels)
        self.init_weights(self.classifier)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False) -> HeadOutput:
        out = self.base_model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                           output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.classifier(self.dropout(out.last_hidden_state))  # (B, T, num_labels)
        loss = token_loss(logits, labels) if labels is not None else None
        return HeadOutput(logits, loss, out.hidden_states, out.attentions)


@HEADS.register("question-answering", output=QuestionAnsweringOutput, prefix="qa_outputs.",
                soft_target="spans", logits=lambda out: torch.stack([out.start_logits, out.end_logits], dim=-1))
class RobertaForQuestionAnswering(RobertaHeadModel):
    """Span extraction: [start | end] = W · h_t + b."""

    expected_unused_keys = ("roberta.pooler.", "pooler.")

    def __init__(self, config: RobertaConfig):
        super().__init__(config)
        self.build_encoder(config)
        self.qa_outputs = TaskOutputLayer(config.hidden_size, 2)
        self.init_weights(self.qa_outputs)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, start_positions=None,
                end_positions=None) -> QuestionAnsweringOutput:
        out = self.base_model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        start_logits, end_logits = self.qa_outputs(out.last_hidden_state).unbind(dim=-1)  # 2 x (B, T)
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = span_loss(start_logits, end_logits, start_positions, end_positions)
        return QuestionAnsweringOutput(start_logits, end_logits, loss)


@HEADS.register("multiple-choice", output=HeadOutput, prefix="classifier.", soft_target="classes", detectable=False)
class RobertaForMultipleChoice(RobertaHeadModel):
    """(B, C, T) choices flattened to (B·C, T), each scored W · dropout(pooled <s>) + b, softmax over choices."""

    def __init__(self, config: RobertaConfig):
        super().__init__(config)
        self.build_encoder(config, add_pooling_layer=True)
        self.dropout = classifier_dropout(config)
        self.classifier = TaskOutputLayer(config.hidden_size, 1)
        self.init_weights(self.classifier)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None) -> HeadOutput:
        B, C, T = input_ids.shape
        flat = lambda t: t.reshape(B * C, T) if t is not None else None  # noqa: E731
        out = self.base_model(flat(input_ids), attention_mask=flat(attention_mask), token_type_ids=flat(token_type_ids))
        logits = self.classifier(self.dropout(out.pooler_output)).view(B, C)  # (B, C)
        loss = F.cross_entropy(logits.float(), labels.view(-1)) if labels is not None else None
        return HeadOutput(logits, loss)
