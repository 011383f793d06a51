"""The output layers BERT adds on top of the encoder, each a small module stating its rule.

Pre-training (section 3.1):  masked LM + next-sentence prediction; masked LM alone; masked LM + SpanBERT's
                             span-boundary objective.
Fine-tuning  (section 4):    one added layer per task family -- sequence classification/regression on the
                             pooled [CLS], token classification, span-extraction QA, multiple choice.

Every head returns an output object with `.loss` (when labels are given) and its logits; parameter names are
Hugging Face's (`cls.predictions.transform.dense`, `classifier`, `qa_outputs`), so `transformers`' matching
`BertFor*` class loads what we save and vice versa.

`HEADS` is BERT's head registry (`models/heads.py`): one `HeadSpec` per kind of head -- its module class, output
type, the checkpoint prefix of its weights, which prediction it serves (`task`) and how a teacher's logits teach
it (`soft_target`). `predict`, `serve`, `distill` and `convert` ask a folder's family for it; `checkpoint/`
needs no list of heads at all (weights outside the encoder are a head's by rule). Adding a head = its class
with `@register_head(...)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import BertConfig
from .modeling import BertModel, BertPreTrainedModel
from ...core.labels import IGNORE_INDEX
from ...nn import ACTIVATIONS
from ..heads import (HeadOutput, HeadRegistry, HeadSpec, PreTrainingOutput, QuestionAnsweringOutput,
                     TaskOutputLayer, VocabProjection, span_boundary_positions)

HEADS = HeadRegistry()  # BERT's heads by kind (`models/heads.py`)
register_head = HEADS.register


def head_for_architecture(architecture: str) -> HeadSpec | None:
    """BERT's head saved as `architecture` (a `config.json["architectures"]` entry); None for an unknown one."""
    return HEADS.for_architecture(architecture)


def model_classes() -> dict[str, type[BertPreTrainedModel]]:
    """Every loadable model class by architecture name: the bare encoder and each registered head."""
    return {"BertModel": BertModel, **{h.architecture: h.model_class for h in HEADS.values()}}


# ---------------------------------------------------------------------------------------------- pre-training
class BertPredictionHeadTransform(nn.Module):
    """h -> LayerNorm(GELU(W h + b)): one more non-linear layer before the vocabulary projection."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = ACTIVATIONS[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(h)))


class BertLMPredictionHead(nn.Module):
    """logits = transform(h) · E_wordᵀ + b: the decoder is the input embedding matrix (tied), with its own bias."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.decoder.weight = word_embeddings.weight  # tied: one matrix, updated by both ends
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        # One addmm with the bias, not decoder(...) + bias: the (N, V) logits are the largest tensor of
        # pre-training, and a separate add would allocate and sweep them a second time.
        return F.linear(self.transform(h), self.decoder.weight, self.bias)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embeddings)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)  # IsNext = 0, NotNext = 1 (Google's order)


class BertOnlyMLMHead(nn.Module):
    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embeddings)


def masked_lm(head: BertLMPredictionHead, hidden: torch.Tensor, labels: torch.Tensor | None):
    """MLM logits and loss. With labels, only the predicted positions (label != -100) go through the head:
    the vocabulary projection is the most expensive matmul of pre-training and ~85% of its rows would be
    discarded. The loss -- mean cross-entropy over predicted positions -- is identical either way."""
    if labels is None:
        return head(hidden), None  # (B, T, V)
    selected = labels.view(-1) != IGNORE_INDEX  # (B*T,)
    logits = head(hidden.reshape(-1, hidden.size(-1))[selected])  # (N, V)
    targets = labels.view(-1)[selected]
    if targets.numel() == 0:  # nothing masked in this batch: a zero that still has a graph
        return logits, logits.sum() * 0.0
    return logits, F.cross_entropy(logits.float(), targets)


@register_head("pretraining", output=PreTrainingOutput, prefix="cls.seq_relationship.",
               logits=lambda out: out.prediction_logits)
class BertForPreTraining(BertPreTrainedModel):
    """Masked LM + next-sentence prediction; loss = mean MLM cross-entropy + mean NSP cross-entropy."""

    tied_weight_keys = ("cls.predictions.decoder.weight",)

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config, self.bert.embeddings.word_embeddings)
        self.init_weights(self.cls)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                next_sentence_label=None) -> PreTrainingOutput:
        out = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        mlm_logits, mlm_loss = masked_lm(self.cls.predictions, out.last_hidden_state, labels)
        nsp_logits = self.cls.seq_relationship(out.pooler_output)  # (B, 2)
        nsp_loss = F.cross_entropy(nsp_logits.float(), next_sentence_label.view(-1)) \
            if next_sentence_label is not None else None
        loss = None
        if mlm_loss is not None or nsp_loss is not None:
            loss = sum(l for l in (mlm_loss, nsp_loss) if l is not None)
        return PreTrainingOutput(mlm_logits, nsp_logits, loss, mlm_loss, nsp_loss)


# Rows of the span-boundary head's position table: a span's offsets run below its length in tokens, which the
# masking budget bounds (max_predictions_per_seq: 77 at length 512), so 200 rows serve sequences up to ~1300
# tokens at 15%. A config.json may set another count under this key; `pretrain` refuses data whose budget
# exceeds it.
class SpanBoundaryHead(nn.Module):
    """SpanBERT's span-boundary representation (Joshi et al., 2020, section 3.2): for the token at offset i - s of
    a span x_s..x_e, y_i = f(x_{s-1}, x_{e+1}, p_{i-s+1}) with p a learned embedding of the offset and f two
    layers, h1 = LayerNorm(GELU(W1 [x_{s-1}; x_{e+1}; p])) (3H -> H), y = LayerNorm(GELU(W2 h1)) (H -> H)
    (GELU: the config's hidden_act).
    The vocabulary projection of y is the MLM head's (tied to the word embeddings, with its bias)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        h = config.hidden_size
        self.position_embeddings = nn.Embedding(span_boundary_positions(config), h)
        # Two of the MLM head's transform layers, LayerNorm(GELU(W x + b)); the first reads [left; right; p].
        self.mlp1 = BertPredictionHeadTransform(config)
        self.mlp1.dense = nn.Linear(3 * h, h)
        self.mlp2 = BertPredictionHeadTransform(config)

    def forward(self, left: torch.Tensor, right: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
        """left, right: (N, H) encodings of the boundaries; offset: (N,) i - s -> y: (N, H)."""
        h0 = torch.cat([left, right, self.position_embeddings(offset)], dim=-1)
        return self.mlp2(self.mlp1(h0))


@dataclass
class SpanBoundaryOutput(PreTrainingOutput):
    """`PreTrainingOutput` (MLM logits over the masked rows; no sentence-level logits) and the SBO term."""

    sbo_logits: torch.Tensor | None = None  # (N_masked, V), rows in the order of the masked positions
    sbo_loss: torch.Tensor | None = None


@register_head("span-boundary", output=SpanBoundaryOutput, prefix="sbo.", logits=lambda out: out.prediction_logits)
class BertForSpanBoundary(BertPreTrainedModel):
    """Masked LM + span-boundary objective (SpanBERT); loss = mean MLM cross-entropy + mean SBO cross-entropy
    over the masked positions. The encoder and MLM head are `BertForMaskedLM`'s, with its parameter names, so
    `transformers.BertForMaskedLM` loads a saved model (dropping the `sbo.` weights). `span_left`,
    `span_right`, `span_offset` ([B, T], read at the masked positions: `data.loader.PretrainingCollator`) give
    each masked token its span's boundary positions and its offset in the span."""

    tied_weight_keys = ("cls.predictions.decoder.weight",)
    expected_unused_keys = ("bert.pooler.", "pooler.", "cls.seq_relationship.")  # as BertForMaskedLM's

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config, self.bert.embeddings.word_embeddings)
        self.sbo = SpanBoundaryHead(config)
        self.init_weights(self.cls)
        self.init_weights(self.sbo)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, span_left=None,
                span_right=None, span_offset=None) -> SpanBoundaryOutput:
        out = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        hidden = out.last_hidden_state
        mlm_logits, mlm_loss = masked_lm(self.cls.predictions, hidden, labels)
        if labels is None or span_left is None or span_right is None or span_offset is None:
            return SpanBoundaryOutput(mlm_logits, None, mlm_loss, mlm_loss, None)
        selected = labels != IGNORE_INDEX  # (B, T): the same rows, in the same order, as the MLM logits
        rows = selected.nonzero()[:, 0]
        y = self.sbo(hidden[rows, span_left[selected]], hidden[rows, span_right[selected]], span_offset[selected])
        head = self.cls.predictions
        sbo_logits = F.linear(y, head.decoder.weight, head.bias)  # the MLM's output embedding and bias
        targets = labels[selected]
        sbo_loss = F.cross_entropy(sbo_logits.float(), targets) if targets.numel() else sbo_logits.sum() * 0.0
        return SpanBoundaryOutput(mlm_logits, None, mlm_loss + sbo_loss, mlm_loss, None, sbo_logits, sbo_loss)


@register_head("masked-lm", output=PreTrainingOutput, prefix="cls.predictions.",
               logits=lambda out: out.prediction_logits)
class BertForMaskedLM(BertPreTrainedModel):
    """Masked LM only (RoBERTa-style pre-training, fill-mask): no pooler, no NSP."""

    tied_weight_keys = ("cls.predictions.decoder.weight",)
    # A pre-training checkpoint's pooler and NSP head: dropped without a warning (as `transformers` does); and
    # the span-boundary head of a model pre-trained with `mlm+sbo`, which only pre-training uses.
    expected_unused_keys = ("bert.pooler.", "pooler.", "cls.seq_relationship.", "sbo.")

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config, self.bert.embeddings.word_embeddings)
        self.init_weights(self.cls)

    def vocab_projection(self) -> VocabProjection:
        head = self.cls.predictions
        return VocabProjection(head.transform, head.decoder.weight, head.bias)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None) -> PreTrainingOutput:
        out = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        logits, loss = masked_lm(self.cls.predictions, out.last_hidden_state, labels)
        return PreTrainingOutput(logits, None, loss, loss, None)


# ---------------------------------------------------------------------------------------------- fine-tuning
# The losses of the task heads, one rule each, for every family whose heads follow BERT's (DistilBERT, ALBERT)
def sequence_loss(config, logits: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor | None:
    """Cross-entropy over `num_labels` classes; with a single label, regression (mean squared error); with
    `problem_type` "multi_label_classification" in config.json, binary cross-entropy per label."""
    if labels is None:
        return None
    if config.extra.get("problem_type") == "multi_label_classification":
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())
    if config.num_labels == 1:
        return F.mse_loss(logits.view(-1).float(), labels.view(-1).float())
    return F.cross_entropy(logits.float(), labels.view(-1))


def token_loss(logits: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor | None:
    """Cross-entropy over the tokens whose label is not -100."""
    if labels is None:
        return None
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), labels.view(-1), ignore_index=IGNORE_INDEX)


def span_loss(start_logits: torch.Tensor, end_logits: torch.Tensor, start_positions: torch.Tensor | None,
              end_positions: torch.Tensor | None) -> torch.Tensor | None:
    """(CE(start) + CE(end)) / 2; gold positions outside the window are clamped to T and ignored."""
    if start_positions is None or end_positions is None:
        return None
    T = start_logits.size(1)
    start = start_positions.view(-1).clamp(0, T)
    end = end_positions.view(-1).clamp(0, T)
    return (F.cross_entropy(start_logits.float(), start, ignore_index=T)
            + F.cross_entropy(end_logits.float(), end, ignore_index=T)) / 2


def _classifier_dropout(config: BertConfig) -> nn.Dropout:
    p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
    return nn.Dropout(p)


@register_head("text-classification", output=HeadOutput, prefix="classifier.", soft_target="classes")
class BertForSequenceClassification(BertPreTrainedModel):
    """logits = W · dropout(pooled [CLS]) + b. Cross-entropy over `num_labels` classes; with a single label the
    task is regression (STS-B) and the loss is mean squared error; with `problem_type`
    "multi_label_classification" in config.json (Hugging Face's key) one sigmoid per label and binary
    cross-entropy against multi-hot float labels."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config)
        self.dropout = _classifier_dropout(config)
        self.classifier = TaskOutputLayer(config.hidden_size, config.num_labels)
        self.init_weights(self.classifier)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False) -> HeadOutput:
        out = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                        output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.classifier(self.dropout(out.pooler_output))  # (B, num_labels)
        return HeadOutput(logits, sequence_loss(self.config, logits, labels), out.hidden_states, out.attentions)


@register_head("token-classification", output=HeadOutput, prefix="classifier.", soft_target="tokens", detectable=False)
class BertForTokenClassification(BertPreTrainedModel):
    """logits_t = W · dropout(h_t) + b for every token; cross-entropy over tokens whose label is not -100
    (padding, [CLS]/[SEP] and, by convention, every word piece after a word's first)."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config, add_pooling_layer=False)
        self.dropout = _classifier_dropout(config)
        self.classifier = TaskOutputLayer(config.hidden_size, config.num_labels)
        self.init_weights(self.classifier)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False) -> HeadOutput:
        out = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                        output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.classifier(self.dropout(out.last_hidden_state))  # (B, T, num_labels)
        return HeadOutput(logits, token_loss(logits, labels), out.hidden_states, out.attentions)


@register_head("question-answering", output=QuestionAnsweringOutput, prefix="qa_outputs.",
               soft_target="spans", logits=lambda out: torch.stack([out.start_logits, out.end_logits], dim=-1))
class BertForQuestionAnswering(BertPreTrainedModel):
    """Span extraction (SQuAD): a start and an end score per token, [start | end] = W · h_t + b.

    Loss = (CE(start) + CE(end)) / 2. Gold positions outside the window (the answer fell in another
    window of a long context) are clamped to T and ignored, so they add nothing to the loss."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = TaskOutputLayer(config.hidden_size, 2)
        self.init_weights(self.qa_outputs)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, start_positions=None,
                end_positions=None) -> QuestionAnsweringOutput:
        out = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        start_logits, end_logits = self.qa_outputs(out.last_hidden_state).unbind(dim=-1)  # 2 x (B, T)
        return QuestionAnsweringOutput(start_logits, end_logits,
                                       span_loss(start_logits, end_logits, start_positions, end_positions))


@register_head("multiple-choice", output=HeadOutput, prefix="classifier.", soft_target="classes", detectable=False)
class BertForMultipleChoice(BertPreTrainedModel):
    """SWAG: (B, C, T) choices are flattened to (B·C, T), each scored W · pooled + b, reshaped to (B, C),
    and the softmax is over the choices."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.dropout = _classifier_dropout(config)
        self.classifier = TaskOutputLayer(config.hidden_size, 1)
        self.init_weights(self.classifier)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None) -> HeadOutput:
        B, C, T = input_ids.shape
        flat = lambda t: t.reshape(B * C, T) if t is not None else None  # noqa: E731
        out = self.bert(flat(input_ids), attention_mask=flat(attention_mask), token_type_ids=flat(token_type_ids))
        logits = self.classifier(self.dropout(out.pooler_output)).view(B, C)  # (B, C)
        loss = F.cross_entropy(logits.float(), labels.view(-1)) if labels is not None else None
        return HeadOutput(logits, loss)


__all__ = ["IGNORE_INDEX", "HEADS", "HeadSpec", "register_head", "head_for_architecture", "model_classes",
           "TaskOutputLayer", "BertModel", *(h.architecture for h in HEADS.values()), "HeadOutput",
           "PreTrainingOutput", "QuestionAnsweringOutput", "SpanBoundaryHead", "SpanBoundaryOutput"]
