"""DeBERTa-v2's heads, as `transformers`' `DebertaV2For*` classes have them (same parameter names), registered
under the standard kinds (`models/heads.py`):

    masked-lm                 `legacy` (transformers' default): cls.predictions -- dense H -> E, act,
                              LayerNorm, decoder E -> V tied to the word embeddings, plus a bias (BERT's layout);
                              `legacy: false`: lm_predictions.lm_head -- dense H -> H, act, LayerNorm, then the
                              word embeddings (tied) and a bias
    text-classification       classifier(dropout(ContextPooler(h))): pooler = act(dense(dropout(h_[CLS])))
    token-classification      classifier(dropout(h_t))
    question-answering        qa_outputs(h_t) -> start, end
    multiple-choice           classifier(dropout(ContextPooler(h))), one score per choice

The enhanced mask decoder of the paper (section 3.2: the absolute positions added back before the softmax
layer, the last layer run again) is not in `transformers`' DebertaV2ForMaskedLM either -- neither of its heads
uses it, and the released checkpoints' EMD/RTD weights (`lm_predictions`-less `mask_predictions`) are dropped
on load -- so the masked LM here is exactly its two heads. The losses are BERT's (`models/bert/heads.py`): the
masked LM's predicted rows only, cross-entropy / regression / multi-label for classification (transformers'
DeBERTa classifier also skips rows with a negative label; bertlab's data has none).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...nn import ACTIVATIONS, Dropout
from ..bert.heads import masked_lm, sequence_loss, span_loss, token_loss
from ..heads import (HeadOutput, HeadRegistry, PreTrainingOutput, QuestionAnsweringOutput, TaskOutputLayer,
                     VocabProjection)
from .config import DebertaV2Config
from .modeling import DebertaV2Model, DebertaV2PreTrainedModel

HEADS = HeadRegistry()  # DeBERTa-v2's heads by kind


class PredictionHeadTransform(nn.Module):
    """h -> LayerNorm(act(W h + b)), H -> `width`."""

    def __init__(self, config: DebertaV2Config, width: int):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, width)
        self.transform_act_fn = ACTIVATIONS[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(width, eps=config.layer_norm_eps)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(h)))


class LegacyLMPredictionHead(nn.Module):
    """`cls.predictions`: logits = transform(h) · E_wordᵀ + b, the decoder tied to the word embeddings (E wide)."""

    def __init__(self, config: DebertaV2Config, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = PredictionHeadTransform(config, config.word_embedding_size)
        self.decoder = nn.Linear(config.word_embedding_size, config.vocab_size, bias=False)
        self.decoder.weight = word_embeddings.weight  # tied
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(self.transform(h), self.decoder.weight, self.bias)


class LegacyOnlyMLMHead(nn.Module):
    def __init__(self, config: DebertaV2Config, word_embeddings: nn.Embedding):
        super().__init__()
        self.predictions = LegacyLMPredictionHead(config, word_embeddings)


class LMPredictionHead(PredictionHeadTransform):
    """`lm_predictions.lm_head`: logits = LayerNorm(act(dense(h))) · E_wordᵀ + b (the embeddings passed in)."""

    def __init__(self, config: DebertaV2Config):
        super().__init__(config, config.hidden_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, h: torch.Tensor, word_embeddings: nn.Embedding) -> torch.Tensor:
        return torch.matmul(super().forward(h), word_embeddings.weight.t()) + self.bias


class OnlyMLMHead(nn.Module):
    def __init__(self, config: DebertaV2Config):
        super().__init__()
        self.lm_head = LMPredictionHead(config)


# The prefix is the legacy layout's (transformers' default): fill-mask on a `legacy: false` folder is refused in
# one line naming it rather than run on a head it would initialise
@HEADS.register("masked-lm", output=PreTrainingOutput, prefix="cls.predictions.",
                logits=lambda out: out.prediction_logits)
class DebertaV2ForMaskedLM(DebertaV2PreTrainedModel):
    tied_weight_keys = ("cls.predictions.decoder.weight",)

    def __init__(self, config: DebertaV2Config):
        super().__init__(config)
        self.deberta = DebertaV2Model(config)
        words = self.deberta.embeddings.word_embeddings
        if config.legacy:
            self.cls = LegacyOnlyMLMHead(config, words)
            self.init_weights(self.cls.predictions.transform)
            nn.init.zeros_(self.cls.predictions.bias)
        else:
            self.lm_predictions = OnlyMLMHead(config)
            self.init_weights(self.lm_predictions)

    def init_weights(self, module: nn.Module | None = None) -> None:
        if isinstance(module, LegacyOnlyMLMHead):  # a fresh head: its own layers, never the tied embedding
            super().init_weights(module.predictions.transform)
            nn.init.zeros_(module.predictions.bias)
            return
        super().init_weights(module)

    def predictions(self, h: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V)."""
        if self.config.legacy:
            return self.cls.predictions(h)
        return self.lm_predictions.lm_head(h, self.deberta.embeddings.word_embeddings)

    def vocab_projection(self) -> VocabProjection:
        if self.config.legacy:
            head = self.cls.predictions
            return VocabProjection(head.transform, head.decoder.weight, head.bias)
        head = self.lm_predictions.lm_head
        return VocabProjection(lambda h: PredictionHeadTransform.forward(head, h),
                               self.deberta.embeddings.word_embeddings.weight, head.bias)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False) -> PreTrainingOutput:
        out = self.deberta(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                           output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits, loss = masked_lm(self.predictions, out.last_hidden_state, labels)
        return PreTrainingOutput(logits, None, loss, loss, None)


class ContextPooler(nn.Module):
    """pooled = act(dense(dropout(h_[CLS]))): the summary the classifiers read (pooler_dropout, pooler_hidden_act)."""

    def __init__(self, config: DebertaV2Config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = Dropout(config.pooler_dropout)
        self.act = ACTIVATIONS[config.pooler_hidden_act]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(self.dropout(hidden[:, 0])))


class _Pooled(DebertaV2PreTrainedModel):
    """The encoder, the ContextPooler, dropout and a `outputs`-wide classifier on the pooled first token."""

    def __init__(self, config: DebertaV2Config, outputs: int):
        super().__init__(config)
        self.deberta = DebertaV2Model(config)
        self.pooler = ContextPooler(config)
        self.classifier = TaskOutputLayer(config.hidden_size, outputs)
        self.dropout = Dropout(config.classifier_dropout)
        self.init_weights(self.pooler)
        self.init_weights(self.classifier)

    def pooled_logits(self, out) -> torch.Tensor:
        return self.classifier(self.dropout(self.pooler(out.last_hidden_state)))


@HEADS.register("text-classification", output=HeadOutput, prefix="classifier.", soft_target="classes")
class DebertaV2ForSequenceClassification(_Pooled):
    def __init__(self, config: DebertaV2Config):
        super().__init__(config, config.num_labels)
        self.num_labels = config.num_labels

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False) -> HeadOutput:
        out = self.deberta(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                           output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.pooled_logits(out)  # (B, num_labels)
        return HeadOutput(logits, sequence_loss(self.config, logits, labels), out.hidden_states, out.attentions)


@HEADS.register("token-classification", output=HeadOutput, prefix="classifier.", soft_target="tokens", detectable=False)
class DebertaV2ForTokenClassification(DebertaV2PreTrainedModel):
    def __init__(self, config: DebertaV2Config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.deberta = DebertaV2Model(config)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.classifier = TaskOutputLayer(config.hidden_size, config.num_labels)
        self.init_weights(self.classifier)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False) -> HeadOutput:
        out = self.deberta(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                           output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.classifier(self.dropout(out.last_hidden_state))  # (B, T, num_labels)
        return HeadOutput(logits, token_loss(logits, labels), out.hidden_states, out.attentions)


@HEADS.register("question-answering", output=QuestionAnsweringOutput, prefix="qa_outputs.",
                soft_target="spans", logits=lambda out: torch.stack([out.start_logits, out.end_logits], dim=-1))
class DebertaV2ForQuestionAnswering(DebertaV2PreTrainedModel):
    def __init__(self, config: DebertaV2Config):
        super().__init__(config)
        self.deberta = DebertaV2Model(config)
        self.qa_outputs = TaskOutputLayer(config.hidden_size, 2)
        self.init_weights(self.qa_outputs)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, start_positions=None,
                end_positions=None) -> QuestionAnsweringOutput:
        out = self.deberta(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        start_logits, end_logits = self.qa_outputs(out.last_hidden_state).unbind(dim=-1)  # 2 x (B, T)
        return QuestionAnsweringOutput(start_logits, end_logits,
                                       span_loss(start_logits, end_logits, start_positions, end_positions))


@HEADS.register("multiple-choice", output=HeadOutput, prefix="classifier.", soft_target="classes", detectable=False)
class DebertaV2ForMultipleChoice(_Pooled):
    """(B, C, T) choices flattened to (B·C, T), one score each from the pooled first token, softmax over the
    choices."""

    def __init__(self, config: DebertaV2Config):
        super().__init__(config, 1)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None) -> HeadOutput:
        B, C, T = input_ids.shape
        flat = lambda t: t.reshape(B * C, T) if t is not None else None  # noqa: E731
        out = self.deberta(flat(input_ids), attention_mask=flat(attention_mask), token_type_ids=flat(token_type_ids))
        logits = self.pooled_logits(out).view(B, C)
        loss = F.cross_entropy(logits.float(), labels.view(-1)) if labels is not None else None
        return HeadOutput(logits, loss)
