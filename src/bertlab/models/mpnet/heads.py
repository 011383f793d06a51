"""MPNet's heads: RoBERTa's (`models/roberta/heads.py`), on MPNet's encoder, under Hugging Face's `MPNetFor*`
names (`mpnet.` before the encoder's weights).

    masked-lm                 lm_head: dense, GELU, layer_norm, then the word embeddings (tied) + bias
    text-classification       classifier: dense + tanh on the <s> token, then out_proj (no pooler)
    token-classification      classifier on every token
    question-answering        qa_outputs: a start and an end score per token
    multiple-choice           classifier on the pooled <s> of each choice (the pooler is kept here)
"""

from __future__ import annotations

from ..heads import HeadRegistry
from ..roberta import heads as roberta
from .modeling import MPNetModel

HEADS = HeadRegistry()  # MPNet's heads by kind: RoBERTa's, registered under MPNet's names


class MPNetHeads:
    """What the heads below set on RoBERTa's: the encoder, and its config, name and checkpoint rules."""

    encoder_class = MPNetModel
    config_class = MPNetModel.config_class
    base_model_prefix = MPNetModel.base_model_prefix
    ignored_checkpoint_keys = MPNetModel.ignored_checkpoint_keys
    expected_unused_keys = (f"{MPNetModel.base_model_prefix}.pooler.", "pooler.")


@HEADS.like(roberta.HEADS["masked-lm"])
class MPNetForMaskedLM(MPNetHeads, roberta.RobertaForMaskedLM):
    pass


@HEADS.like(roberta.HEADS["text-classification"])
class MPNetForSequenceClassification(MPNetHeads, roberta.RobertaForSequenceClassification):
    pass


@HEADS.like(roberta.HEADS["token-classification"])
class MPNetForTokenClassification(MPNetHeads, roberta.RobertaForTokenClassification):
    pass


@HEADS.like(roberta.HEADS["question-answering"])
class MPNetForQuestionAnswering(MPNetHeads, roberta.RobertaForQuestionAnswering):
    pass


@HEADS.like(roberta.HEADS["multiple-choice"])
class MPNetForMultipleChoice(MPNetHeads, roberta.RobertaForMultipleChoice):
    expected_unused_keys = ()  # it reads the pooler
