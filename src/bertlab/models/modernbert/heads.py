"""ModernBERT's heads, as Hugging Face's `ModernBertFor*` have them (weight names included), registered by kind.

Every head reads the encoder's output through the same prediction head, `head`: LayerNorm(act(W h)) (no bias
by default), then

    masked-lm                 decoder: the token embeddings (tied) + a bias, on every token
    text-classification       classifier on the [CLS] token (`classifier_pooling` "cls") or the mean of the
                              real tokens ("mean")
    token-classification      classifier on every token
    question-answering        classifier with a start and an end score per token
    multiple-choice           classifier on each choice's first real token ("cls") or its mean, one score each

The losses are BERT's rules (`models/bert/heads.py`): multi-label and regression classifiers, -100 ignored; the
masked LM computes the labelled positions only when given labels (`sparse_prediction`'s output, whatever the
config says: the loss is the same either way).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..bert.heads import masked_lm, sequence_loss, span_loss, token_loss
from ..heads import HeadOutput, HeadRegistry, PreTrainingOutput, QuestionAnsweringOutput, VocabProjection
from ...nn.elementwise import ACTIVATIONS
from .config import ModernBertConfig
from .modeling import ModernBertModel, ModernBertPreTrainedModel, norm

HEADS = HeadRegistry()  # ModernBERT's heads by kind (`models/heads.py`)


class HeadLinear(nn.Linear):
    """A head's linear layer, initialised with Hugging Face's σ for its place (`init_weights`): "out" for the
    prediction head's dense, "final_out" (hidden_size^-½) for a task's classifier."""

    def __init__(self, n_in: int, n_out: int, bias: bool, initializer_std: str):
        super().__init__(n_in, n_out, bias=bias)
        self.initializer_std = initializer_std


class ModernBertPredictionHead(nn.Module):
    """LayerNorm(act(W h)): what every head reads instead of the encoder's output."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.dense = HeadLinear(config.hidden_size, config.hidden_size, config.classifier_bias, "out")
        self.act = ACTIVATIONS[config.classifier_activation]
        self.norm = norm(config)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(h)))


class TiedDecoder(nn.Linear):
    """logits = h · E_tokenᵀ + bias: the weight is the token embeddings (tied); only the bias is its own (and
    zeroed by `init_weights`, which leaves the embeddings alone)."""

    tied_decoder = True

    def __init__(self, config: ModernBertConfig, embeddings: nn.Embedding):
        super().__init__(config.hidden_size, config.vocab_size, bias=config.decoder_bias)
        self.weight = embeddings.weight


def pooled(config: ModernBertConfig, hidden: torch.Tensor, attention_mask: torch.Tensor | None,
           first_real: bool = False) -> torch.Tensor:
    """(B, T, H) -> (B, H): the first token -- or, with `first_real`, each row's first real token, as the
    multiple-choice head takes it -- for "cls" pooling; the mean over the real tokens for "mean"."""
    if config.classifier_pooling == "cls":
        if first_real and attention_mask is not None:
            return hidden[torch.arange(hidden.size(0), device=hidden.device), attention_mask.argmax(dim=-1)]
        return hidden[:, 0]
    if attention_mask is None:
        attention_mask = torch.ones(hidden.shape[:2], dtype=torch.bool, device=hidden.device)
    m = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(dim=1) / attention_mask.sum(dim=1, keepdim=True)


class _WithHead(ModernBertPreTrainedModel):
    """The encoder (`model.`), the prediction head (`head.`) and a classifier of `n_out` outputs."""

    expected_unused_keys = ("decoder.",)

    def __init__(self, config: ModernBertConfig, n_out: int):
        super().__init__(config)
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.drop = nn.Dropout(config.classifier_dropout)
        self.classifier = HeadLinear(config.hidden_size, n_out, True, "final_out")
        self.init_weights(self.head)
        self.init_weights(self.classifier)

    def scores(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.drop(self.head(hidden)))

    def classify(self, input_ids, attention_mask, labels, output_hidden_states, output_attentions,
                 per_token: bool) -> HeadOutput:
        """Scores of the pooled token (`per_token` False: one row per text) or of every token, and their loss."""
        out = self.model(input_ids, attention_mask=attention_mask, output_hidden_states=output_hidden_states,
                         output_attentions=output_attentions)
        hidden = out.last_hidden_state if per_token else pooled(self.config, out.last_hidden_state, attention_mask)
        logits = self.scores(hidden)  # (B, T, num_labels) per token, else (B, num_labels)
        loss = token_loss(logits, labels) if per_token else sequence_loss(self.config, logits, labels)
        return HeadOutput(logits, loss, out.hidden_states, out.attentions)


@HEADS.register("masked-lm", output=PreTrainingOutput, prefix="decoder.", logits=lambda out: out.prediction_logits)
class ModernBertForMaskedLM(ModernBertPreTrainedModel):
    """Masked LM (ModernBERT's pre-training objective, and fill-mask)."""

    tied_weight_keys = ("decoder.weight",)

    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.decoder = TiedDecoder(config, self.model.embeddings.tok_embeddings)
        self.init_weights(self.head)
        self.init_weights(self.decoder)

    def vocab_projection(self) -> VocabProjection:
        return VocabProjection(self.head, self.decoder.weight, self.decoder.bias)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None) -> PreTrainingOutput:
        out = self.model(input_ids, attention_mask=attention_mask)
        logits, loss = masked_lm(lambda h: self.decoder(self.head(h)), out.last_hidden_state, labels)  # (B, T, V), or (N_masked, V)
        return PreTrainingOutput(logits, None, loss, loss, None)


@HEADS.register("text-classification", output=HeadOutput, prefix="classifier.", soft_target="classes")
class ModernBertForSequenceClassification(_WithHead):
    """One label (or several, or a score) per text, from the [CLS] token or the mean of the real tokens."""

    def __init__(self, config: ModernBertConfig):
        super().__init__(config, config.num_labels)
        self.num_labels = config.num_labels

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False) -> HeadOutput:
        return self.classify(input_ids, attention_mask, labels, output_hidden_states, output_attentions, False)


@HEADS.register("token-classification", output=HeadOutput, prefix="classifier.", soft_target="tokens", detectable=False)
class ModernBertForTokenClassification(_WithHead):
    """logits_t = W · dropout(head(h_t)) + b for every token."""

    def __init__(self, config: ModernBertConfig):
        super().__init__(config, config.num_labels)
        self.num_labels = config.num_labels

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False) -> HeadOutput:
        return self.classify(input_ids, attention_mask, labels, output_hidden_states, output_attentions, True)


@HEADS.register("question-answering", output=QuestionAnsweringOutput, prefix="classifier.",
                soft_target="spans", logits=lambda out: torch.stack([out.start_logits, out.end_logits], dim=-1),
                detectable=False)
class ModernBertForQuestionAnswering(_WithHead):
    """Span extraction: [start | end] = W · head(h_t) + b (Hugging Face sizes the classifier by num_labels, 2)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__(config, config.num_labels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, start_positions=None,
                end_positions=None) -> QuestionAnsweringOutput:
        if self.config.num_labels != 2:
            raise ValueError(f"question answering needs num_labels 2 (a start and an end score), the config has "
                             f"{self.config.num_labels}")
        out = self.model(input_ids, attention_mask=attention_mask)
        start_logits, end_logits = self.scores(out.last_hidden_state).unbind(dim=-1)  # 2 x (B, T)
        return QuestionAnsweringOutput(start_logits, end_logits,
                                       span_loss(start_logits, end_logits, start_positions, end_positions))


@HEADS.register("multiple-choice", output=HeadOutput, prefix="classifier.", soft_target="classes", detectable=False)
class ModernBertForMultipleChoice(_WithHead):
    """(B, C, T) choices flattened to (B·C, T), each scored on its pooled token, softmax over choices."""

    def __init__(self, config: ModernBertConfig):
        super().__init__(config, 1)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None) -> HeadOutput:
        B, C, T = input_ids.shape
        flat_mask = attention_mask.reshape(B * C, T) if attention_mask is not None else None
        out = self.model(input_ids.reshape(B * C, T), attention_mask=flat_mask)
        h = pooled(self.config, out.last_hidden_state, flat_mask, first_real=True)  # (B·C, H)
        logits = self.scores(h).view(B, C)
        loss = F.cross_entropy(logits.float(), labels.view(-1)) if labels is not None else None
        return HeadOutput(logits, loss)
