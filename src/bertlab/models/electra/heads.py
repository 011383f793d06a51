"""ELECTRA's heads, as Hugging Face's `ElectraFor*` have them (weight names included), registered by kind.

    replaced-token-detection  discriminator_predictions: dense, hidden_act, dense_prediction -> one score per token
                              (> 0: replaced), `ElectraForPreTraining`, the discriminator checkpoints
    masked-lm                 generator_predictions: dense H -> E, GELU, LayerNorm; generator_lm_head: the token
                              embeddings (tied) + bias, `ElectraForMaskedLM`, the generator checkpoints
    text-classification       classifier: dense + GELU on the first token, then out_proj (no pooler)
    token-classification      classifier on every token
    question-answering        qa_outputs: a start and an end score per token
    multiple-choice           sequence_summary (the first token, a projection, GELU) then classifier, per choice
    rtd-pretraining           the generator and the discriminator trained together (`--objective rtd`,
                              `objectives.py`): shared embeddings, sampled replacements, loss MLM + 50 x RTD

The losses of the task heads are BERT's rules (`models/bert/heads.py`): multi-label and regression classifiers,
-100 ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ...core.errors import ConfigError
from ...core.labels import IGNORE_INDEX
from ...nn import ACTIVATIONS
from ..bert.heads import masked_lm, sequence_loss, span_loss, token_loss
from ..heads import (HeadOutput, HeadRegistry, PreTrainingOutput, QuestionAnsweringOutput, TaskOutputLayer,
                     VocabProjection)
from .config import ElectraConfig
from .modeling import ElectraModel, ElectraPreTrainedModel

HEADS = HeadRegistry()  # ELECTRA's heads by kind (`models/heads.py`)
# The discriminator's loss weight against the generator's (the paper's λ, section 2)
RTD_WEIGHT = 50.0


def classifier_dropout(config: ElectraConfig) -> nn.Dropout:
    p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
    return nn.Dropout(p)


def replaced_token_loss(logits: torch.Tensor, replaced: torch.Tensor, attention_mask: torch.Tensor | None):
    """Mean binary cross-entropy of the per-token scores against replaced (1) / original (0), over real tokens."""
    keep = attention_mask > 0 if attention_mask is not None else torch.ones_like(replaced, dtype=torch.bool)
    return F.binary_cross_entropy_with_logits(logits[keep].float(), replaced[keep].float())


class ElectraDiscriminatorPredictions(nn.Module):
    """score_t = w · act(W h_t + b) + c: replaced (> 0) or original."""

    def __init__(self, config: ElectraConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.dense_prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.dense_prediction(self.activation(self.dense(h))).squeeze(-1)  # (B, T)


class ElectraGeneratorPredictions(nn.Module):
    """h (H) -> LayerNorm(GELU(W h + b)) (E): back to the embeddings' width, where the output matrix lives."""

    def __init__(self, config: ElectraConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)
        self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(F.gelu(self.dense(h)))


class ElectraClassificationHead(nn.Module):
    """logits = W_o · dropout(GELU(W · dropout(h_first) + b)) + b_o (GELU where RoBERTa's has tanh)."""

    def __init__(self, config: ElectraConfig):
        super().__init__()
        self.dense = TaskOutputLayer(config.hidden_size, config.hidden_size)
        self.dropout = classifier_dropout(config)
        self.out_proj = TaskOutputLayer(config.hidden_size, config.num_labels)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.dense(self.dropout(hidden[:, 0])))
        return self.out_proj(self.dropout(x))


class ElectraSequenceSummary(nn.Module):
    """One vector per sequence (the multiple-choice head's): the first or last token or the mean over positions
    (`summary_type`), then an optional projection, activation and dropout (`summary_*` in config.json)."""

    def __init__(self, config: ElectraConfig):
        super().__init__()
        s = config.summary
        self.summary_type = s["type"]
        out = config.num_labels if s["proj_to_labels"] and config.num_labels > 0 else config.hidden_size
        self.summary = TaskOutputLayer(config.hidden_size, out) if s["use_proj"] else nn.Identity()
        self.activation = ACTIVATIONS.get(s["activation"], nn.Identity()) if s["activation"] else nn.Identity()
        self.first_dropout = nn.Dropout(s["first_dropout"]) if s["first_dropout"] > 0 else nn.Identity()
        self.last_dropout = nn.Dropout(s["last_dropout"]) if s["last_dropout"] > 0 else nn.Identity()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # (as Hugging Face's: "mean" averages every position, padding included)
        x = {"first": lambda: hidden[:, 0], "last": lambda: hidden[:, -1], "mean": lambda: hidden.mean(1)}[
            self.summary_type]()
        return self.last_dropout(self.activation(self.summary(self.first_dropout(x))))


@HEADS.register("replaced-token-detection", output=HeadOutput, prefix="discriminator_predictions.")
class ElectraForPreTraining(ElectraPreTrainedModel):
    """The discriminator: one score per token, replaced (> 0) or original; with labels (1 replaced, 0 original),
    mean binary cross-entropy over the real tokens."""

    def __init__(self, config: ElectraConfig):
        super().__init__(config)
        self.electra = ElectraModel(config)
        self.discriminator_predictions = ElectraDiscriminatorPredictions(config)
        self.init_weights(self.discriminator_predictions)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False) -> HeadOutput:
        out = self.electra(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                           output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.discriminator_predictions(out.last_hidden_state)  # (B, T)
        loss = replaced_token_loss(logits, labels, attention_mask) if labels is not None else None
        return HeadOutput(logits, loss, out.hidden_states, out.attentions)


@HEADS.register("masked-lm", output=PreTrainingOutput, prefix="generator_predictions.",
                logits=lambda out: out.prediction_logits)
class ElectraForMaskedLM(ElectraPreTrainedModel):
    """The generator: masked LM (fill-mask), logits = E_word · LayerNorm(GELU(W h + b)) + bias."""

    tied_weight_keys = ("generator_lm_head.weight",)

    def __init__(self, config: ElectraConfig):
        super().__init__(config)
        self.electra = ElectraModel(config)
        self.generator_predictions = ElectraGeneratorPredictions(config)
        self.generator_lm_head = nn.Linear(config.embedding_size, config.vocab_size)
        self.generator_lm_head.weight = self.electra.embeddings.word_embeddings.weight  # tied
        self.init_weights(self.generator_predictions)
        nn.init.zeros_(self.generator_lm_head.bias)

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.generator_lm_head(self.generator_predictions(h))

    def vocab_projection(self) -> VocabProjection:
        return VocabProjection(self.generator_predictions, self.generator_lm_head.weight, self.generator_lm_head.bias)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None) -> PreTrainingOutput:
        out = self.electra(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        logits, loss = masked_lm(self.lm_logits, out.last_hidden_state, labels)
        return PreTrainingOutput(logits, None, loss, loss, None)


@HEADS.register("text-classification", output=HeadOutput, prefix="classifier.out_proj.", soft_target="classes")
class ElectraForSequenceClassification(ElectraPreTrainedModel):
    """Classification (or regression, or multi-label: BERT's `sequence_loss`) on the first token."""

    def __init__(self, config: ElectraConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.electra = ElectraModel(config)
        self.classifier = ElectraClassificationHead(config)
        self.init_weights(self.classifier)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False) -> HeadOutput:
        out = self.electra(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                           output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.classifier(out.last_hidden_state)  # (B, num_labels)
        return HeadOutput(logits, sequence_loss(self.config, logits, labels), out.hidden_states, out.attentions)


@HEADS.register("token-classification", output=HeadOutput, prefix="classifier.", soft_target="tokens", detectable=False)
class ElectraForTokenClassification(ElectraPreTrainedModel):
    """logits_t = W · dropout(h_t) + b for every token."""

    def __init__(self, config: ElectraConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.electra = ElectraModel(config)
        self.dropout = classifier_dropout(config)
        self.classifier = TaskOutputLayer(config.hidden_size, config.num_labels)
        self.init_weights(self.classifier)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False) -> HeadOutput:
        out = self.electra(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                           output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.classifier(self.dropout(out.last_hidden_state))  # (B, T, num_labels)
        return HeadOutput(logits, token_loss(logits, labels), out.hidden_states, out.attentions)


@HEADS.register("question-answering", output=QuestionAnsweringOutput, prefix="qa_outputs.",
                soft_target="spans", logits=lambda out: torch.stack([out.start_logits, out.end_logits], dim=-1))
class ElectraForQuestionAnswering(ElectraPreTrainedModel):
    """Span extraction: [start | end] = W · h_t + b."""

    def __init__(self, config: ElectraConfig):
        super().__init__(config)
        self.electra = ElectraModel(config)
        self.qa_outputs = TaskOutputLayer(config.hidden_size, 2)
        self.init_weights(self.qa_outputs)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, start_positions=None,
                end_positions=None) -> QuestionAnsweringOutput:
        out = self.electra(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        start_logits, end_logits = self.qa_outputs(out.last_hidden_state).unbind(dim=-1)  # 2 x (B, T)
        return QuestionAnsweringOutput(start_logits, end_logits,
                                       span_loss(start_logits, end_logits, start_positions, end_positions))


@HEADS.register("multiple-choice", output=HeadOutput, prefix="classifier.", soft_target="classes", detectable=False)
class ElectraForMultipleChoice(ElectraPreTrainedModel):
    """(B, C, T) choices flattened to (B·C, T), each scored W · summary + b, softmax over the choices."""

    def __init__(self, config: ElectraConfig):
        super().__init__(config)
        self.electra = ElectraModel(config)
        self.sequence_summary = ElectraSequenceSummary(config)
        self.classifier = TaskOutputLayer(config.hidden_size, 1)
        self.init_weights(self.sequence_summary)
        self.init_weights(self.classifier)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None) -> HeadOutput:
        B, C, T = input_ids.shape
        flat = lambda t: t.reshape(B * C, T) if t is not None else None  # noqa: E731
        out = self.electra(flat(input_ids), attention_mask=flat(attention_mask), token_type_ids=flat(token_type_ids))
        logits = self.classifier(self.sequence_summary(out.last_hidden_state)).view(B, C)  # (B, C)
        loss = F.cross_entropy(logits.float(), labels.view(-1)) if labels is not None else None
        return HeadOutput(logits, loss)


# ---------------------------------------------------------------------------------------------- pre-training
@dataclass
class ReplacedTokenDetectionOutput(PreTrainingOutput):
    """The generator's MLM (`prediction_logits` over the masked rows, `mlm_loss`) and the discriminator's scores
    on the corrupted sequence, with what was replaced."""

    rtd_logits: torch.Tensor | None = None  # (B, T)
    rtd_loss: torch.Tensor | None = None
    replaced: torch.Tensor | None = None  # (B, T) bool: the discriminator's targets
    real: torch.Tensor | None = None  # (B, T) bool: the tokens its loss counts (not padding)


@HEADS.register("rtd-pretraining", output=ReplacedTokenDetectionOutput, prefix="generator.",
                logits=lambda out: out.rtd_logits, detectable=False)
class ElectraForReplacedTokenDetection(ElectraPreTrainedModel):
    """ELECTRA's pre-training (section 2): the generator (an `ElectraForMaskedLM` of `config.generator_config()`)
    predicts the masked tokens; each masked position is filled with a token sampled from its distribution (no
    gradient flows through the sample); the discriminator (`ElectraForPreTraining`'s weights, at the top level)
    scores every real token of the result as replaced or original -- a sample equal to the original counts as
    original. loss = MLM + RTD_WEIGHT x RTD. The two share the embeddings (token, position, type, LayerNorm), as
    the official code does, so the generator's output matrix is the discriminator's token table.

    `exported_parts()` is what pre-training saves: the discriminator (loads in `transformers` as
    `ElectraForPreTraining`) and, in `generator/`, the generator (`ElectraForMaskedLM`)."""

    shared_embeddings = ("word_embeddings.weight", "position_embeddings.weight", "token_type_embeddings.weight",
                         "LayerNorm.weight", "LayerNorm.bias")
    tied_weight_keys = (*(f"generator.electra.embeddings.{k}" for k in shared_embeddings),
                        "generator.generator_lm_head.weight")

    def __init__(self, config: ElectraConfig):
        super().__init__(config)
        self.electra = ElectraModel(config)
        self.discriminator_predictions = ElectraDiscriminatorPredictions(config)
        self.generator = ElectraForMaskedLM(config.generator_config())
        self.generator.electra.embeddings = self.electra.embeddings  # shared: one set of embeddings, both losses
        self.generator.generator_lm_head.weight = self.electra.embeddings.word_embeddings.weight
        self.init_weights(self.discriminator_predictions)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None
                ) -> ReplacedTokenDetectionOutput:
        if labels is None:  # nothing masked: the discriminator scores the sequence as given
            out = self.electra(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return ReplacedTokenDetectionOutput(None, None, rtd_logits=self.discriminator_predictions(
                out.last_hidden_state))
        gen = self.generator(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, labels=labels)
        selected = labels != IGNORE_INDEX  # (B, T): the rows of gen.prediction_logits, in order
        original = torch.where(selected, labels, input_ids)
        with torch.no_grad():
            sampled = torch.multinomial(torch.softmax(gen.prediction_logits.detach().float(), dim=-1), 1)[:, 0] \
                if selected.any() else labels.new_zeros(0)
        corrupted = original.masked_scatter(selected, sampled)
        replaced = corrupted != original
        out = self.electra(corrupted, attention_mask=attention_mask, token_type_ids=token_type_ids)
        logits = self.discriminator_predictions(out.last_hidden_state)  # (B, T)
        rtd_loss = replaced_token_loss(logits, replaced, attention_mask)
        real = attention_mask > 0 if attention_mask is not None else torch.ones_like(replaced)
        return ReplacedTokenDetectionOutput(gen.prediction_logits, None, gen.mlm_loss + RTD_WEIGHT * rtd_loss,
                                            gen.mlm_loss, None, logits, rtd_loss, replaced, real)

    @classmethod
    def from_pretrained(cls, path, config: ElectraConfig | None = None, **kwargs):
        """A folder pre-training saved (or a discriminator's): the discriminator from the folder, the generator
        from its `generator/` sub-folder when there is one (its sizes as saved), else a new one of
        `config.generator_config()`; the two then share the discriminator's embeddings."""
        loaded = super().from_pretrained(path, config, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        generator_dir = Path(path) / "generator"
        if generator_dir.is_dir():
            generator = ElectraForMaskedLM.from_pretrained(generator_dir)
            if generator.config.embedding_size != model.config.embedding_size:
                raise ConfigError(f"{generator_dir}: embedding_size {generator.config.embedding_size}, but the "
                                  f"discriminator's is {model.config.embedding_size}; the two share their embeddings")
            generator.electra.embeddings = model.electra.embeddings
            generator.generator_lm_head.weight = model.electra.embeddings.word_embeddings.weight
            model.generator = generator
        return loaded

    def exported_parts(self) -> dict[str, nn.Module]:
        """Sub-folder ("" the folder itself) -> the model saved there: the discriminator as `transformers`'
        `ElectraForPreTraining`, the generator as its `ElectraForMaskedLM` (each with the shared embeddings)."""
        with torch.device("meta"):
            discriminator = ElectraForPreTraining(self.config)
        discriminator.electra, discriminator.discriminator_predictions = self.electra, self.discriminator_predictions
        return {"": discriminator, "generator": self.generator}
