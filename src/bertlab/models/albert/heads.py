"""ALBERT's heads, as Hugging Face's `AlbertFor*` classes have them (same parameter names), registered under the
standard kinds (`models/heads.py`):

    pretraining               masked LM + sentence-order prediction (`sop_classifier` on the pooled [CLS])
    masked-lm                 predictions: dense H -> E, act, LayerNorm, decoder E -> V tied to the word
                              embeddings, plus a bias
    text-classification       classifier(dropout(pooled))
    token-classification      classifier(dropout(h_t))
    question-answering        qa_outputs(h_t) -> start, end
    multiple-choice           classifier(dropout(pooled)), one score per choice

The losses are BERT's (`models/bert/heads.py`), as is the masked LM's selection of predicted rows. Sentence
order: label 0 = the segments in their order, 1 = swapped (ALBERT's), the SOP head's loss is cross-entropy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...nn import ACTIVATIONS
from ..heads import (HeadOutput, HeadRegistry, PreTrainingOutput, QuestionAnsweringOutput, TaskOutputLayer,
                     VocabProjection)
from ..bert.heads import masked_lm, sequence_loss, span_loss, token_loss
from .config import AlbertConfig
from .modeling import AlbertModel, AlbertPreTrainedModel

HEADS = HeadRegistry()  # ALBERT's heads by kind


class AlbertMLMHead(nn.Module):
    """logits = decoder(LayerNorm(act(dense(h)))) + bias: H -> E, then E -> V with the word embeddings (tied)."""

    def __init__(self, config: AlbertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)
        self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.embedding_size, config.vocab_size)
        self.decoder.weight = word_embeddings.weight  # tied
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.decoder.bias = self.bias  # one bias under HF's two names
        self.act = config.hidden_act

    def transform(self, h: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(ACTIVATIONS[self.act](self.dense(h)))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(self.transform(h), self.decoder.weight, self.bias)


class AlbertSOPHead(nn.Module):
    def __init__(self, config: AlbertConfig):
        super().__init__()
        self.dropout = nn.Dropout(config.classifier_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(pooled))


class _MaskedLM(AlbertPreTrainedModel):
    tied_weight_keys = ("predictions.decoder.weight", "predictions.decoder.bias")

    def _predictions(self, config: AlbertConfig) -> AlbertMLMHead:
        head = AlbertMLMHead(config, self.albert.embeddings.word_embeddings)
        self.init_weights(head.dense)
        self.init_weights(head.LayerNorm)
        nn.init.zeros_(head.bias)
        return head

    def init_weights(self, module: nn.Module | None = None) -> None:
        if isinstance(module, AlbertMLMHead):  # a fresh head: its own layers, never the tied embedding
            for m in (module.dense, module.LayerNorm):
                super().init_weights(m)
            nn.init.zeros_(module.bias)
            return
        super().init_weights(module)


@HEADS.register("pretraining", output=PreTrainingOutput, prefix="sop_classifier.",
                logits=lambda out: out.prediction_logits)
class AlbertForPreTraining(_MaskedLM):
    """Masked LM + sentence-order prediction; loss = mean MLM cross-entropy + mean SOP cross-entropy."""

    def __init__(self, config: AlbertConfig):
        super().__init__(config)
        self.albert = AlbertModel(config)
        self.predictions = self._predictions(config)
        self.sop_classifier = AlbertSOPHead(config)
        self.init_weights(self.sop_classifier)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, sentence_order_label=None,
                next_sentence_label=None) -> PreTrainingOutput:
        """`next_sentence_label` is accepted as the sentence-level label too (bertlab's pre-training batches name
        it so for NSP and SOP alike)."""
        out = self.albert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        mlm_logits, mlm_loss = masked_lm(self.predictions, out.last_hidden_state, labels)
        sop_logits = self.sop_classifier(out.pooler_output)  # (B, 2)
        order = sentence_order_label if sentence_order_label is not None else next_sentence_label
        sop_loss = F.cross_entropy(sop_logits.float(), order.view(-1)) if order is not None else None
        loss = None
        if mlm_loss is not None or sop_loss is not None:
            loss = sum(l for l in (mlm_loss, sop_loss) if l is not None)
        return PreTrainingOutput(mlm_logits, sop_logits, loss, mlm_loss, sop_loss)


@HEADS.register("masked-lm", output=PreTrainingOutput, prefix="predictions.", logits=lambda out: out.prediction_logits)
class AlbertForMaskedLM(_MaskedLM):
    # A pre-training checkpoint's pooler and SOP head: dropped without a warning (as `transformers` does)
    expected_unused_keys = ("albert.pooler.", "pooler.", "sop_classifier.")

    def __init__(self, config: AlbertConfig):
        super().__init__(config)
        self.albert = AlbertModel(config, add_pooling_layer=False)
        self.predictions = self._predictions(config)

    def vocab_projection(self) -> VocabProjection:
        return VocabProjection(self.predictions.transform, self.predictions.decoder.weight, self.predictions.bias)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None) -> PreTrainingOutput:
        out = self.albert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        logits, loss = masked_lm(self.predictions, out.last_hidden_state, labels)
        return PreTrainingOutput(logits, None, loss, loss, None)


@HEADS.register("text-classification", output=HeadOutput, prefix="classifier.", soft_target="classes")
class AlbertForSequenceClassification(AlbertPreTrainedModel):
    def __init__(self, config: AlbertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.albert = AlbertModel(config)
        self.dropout = nn.Dropout(config.classifier_dropout_prob)
        self.classifier = TaskOutputLayer(config.hidden_size, config.num_labels)
        self.init_weights(self.classifier)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False) -> HeadOutput:
        out = self.albert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                          output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.classifier(self.dropout(out.pooler_output))  # (B, num_labels)
        return HeadOutput(logits, sequence_loss(self.config, logits, labels), out.hidden_states, out.attentions)


@HEADS.register("token-classification", output=HeadOutput, prefix="classifier.", soft_target="tokens", detectable=False)
class AlbertForTokenClassification(AlbertPreTrainedModel):
    def __init__(self, config: AlbertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.albert = AlbertModel(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(config.classifier_dropout_prob)
        self.classifier = TaskOutputLayer(config.hidden_size, config.num_labels)
        self.init_weights(self.classifier)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False) -> HeadOutput:
        out = self.albert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                          output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.classifier(self.dropout(out.last_hidden_state))  # (B, T, num_labels)
        return HeadOutput(logits, token_loss(logits, labels), out.hidden_states, out.attentions)


@HEADS.register("question-answering", output=QuestionAnsweringOutput, prefix="qa_outputs.",
                soft_target="spans", logits=lambda out: torch.stack([out.start_logits, out.end_logits], dim=-1))
class AlbertForQuestionAnswering(AlbertPreTrainedModel):
    def __init__(self, config: AlbertConfig):
        super().__init__(config)
        self.albert = AlbertModel(config, add_pooling_layer=False)
        self.qa_outputs = TaskOutputLayer(config.hidden_size, 2)
        self.init_weights(self.qa_outputs)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, start_positions=None,
                end_positions=None) -> QuestionAnsweringOutput:
        out = self.albert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        start_logits, end_logits = self.qa_outputs(out.last_hidden_state).unbind(dim=-1)  # 2 x (B, T)
        return QuestionAnsweringOutput(start_logits, end_logits,
                                       span_loss(start_logits, end_logits, start_positions, end_positions))


@HEADS.register("multiple-choice", output=HeadOutput, prefix="classifier.", soft_target="classes", detectable=False)
class AlbertForMultipleChoice(AlbertPreTrainedModel):
    """(B, C, T) choices flattened to (B·C, T), one score each from the pooled [CLS], softmax over the choices."""

    def __init__(self, config: AlbertConfig):
        super().__init__(config)
        self.albert = AlbertModel(config)
        self.dropout = nn.Dropout(config.classifier_dropout_prob)
        self.classifier = TaskOutputLayer(config.hidden_size, 1)
        self.init_weights(self.classifier)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None) -> HeadOutput:
        B, C, T = input_ids.shape
        flat = lambda t: t.reshape(B * C, T) if t is not None else None  # noqa: E731
        out = self.albert(flat(input_ids), attention_mask=flat(attention_mask), token_type_ids=flat(token_type_ids))
        logits = self.classifier(self.dropout(out.pooler_output)).view(B, C)  # (B, C)
        loss = F.cross_entropy(logits.float(), labels.view(-1)) if labels is not None else None
        return HeadOutput(logits, loss)
