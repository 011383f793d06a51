"""XLM-R's model classes: RoBERTa's, named as `transformers` names them (model_type "xlm-roberta")."""

from __future__ import annotations

from ..heads import HeadRegistry
from ..roberta import heads as roberta
from ..roberta.modeling import RobertaModel
from .config import XLMRobertaConfig


class XLMRobertaModel(RobertaModel):
    config_class = XLMRobertaConfig


HEADS = HeadRegistry()  # XLM-R's heads by kind: RoBERTa's, registered under XLM-R's names


@HEADS.like(roberta.HEADS["masked-lm"])
class XLMRobertaForMaskedLM(roberta.RobertaForMaskedLM):
    config_class = XLMRobertaConfig


@HEADS.like(roberta.HEADS["text-classification"])
class XLMRobertaForSequenceClassification(roberta.RobertaForSequenceClassification):
    config_class = XLMRobertaConfig


@HEADS.like(roberta.HEADS["token-classification"])
class XLMRobertaForTokenClassification(roberta.RobertaForTokenClassification):
    config_class = XLMRobertaConfig


@HEADS.like(roberta.HEADS["question-answering"])
class XLMRobertaForQuestionAnswering(roberta.RobertaForQuestionAnswering):
    config_class = XLMRobertaConfig


@HEADS.like(roberta.HEADS["multiple-choice"])
class XLMRobertaForMultipleChoice(roberta.RobertaForMultipleChoice):
    config_class = XLMRobertaConfig
