"""BERT's objective (paper, section 3.1): masked LM + next-sentence prediction, `--objective mlm+nsp`.

loss = mean MLM cross-entropy over the masked positions + mean NSP cross-entropy over the pairs (both
computed by the family's pretraining head, BERT's `BertForPreTraining`). The data must be segment or sentence
pairs with NSP labels.
Held out: the MLM metrics (`models/objective.py`), and NSP accuracy over the pairs.
"""

from __future__ import annotations

from typing import Any

from ..models.objective import Batch, Evaluation, Evaluations, MaskedLMEval, masked_lm_metrics
from ..models.registry import default_head
from .mlm import MaskedLM


class NextSentenceEval:
    """Held-out NSP accuracy over every pair of the batches that carry NSP labels; {} when none did."""

    def __init__(self) -> None:
        self.correct = self.count = 0.0

    def update(self, output: Any, batch: Batch) -> None:
        if "next_sentence_label" in batch:
            labels = batch["next_sentence_label"]
            self.correct += float((output.seq_relationship_logits.argmax(-1) == labels).sum())
            self.count += labels.numel()

    def compute(self) -> dict[str, float]:
        return {"nsp_accuracy": self.correct / self.count} if self.count else {}


class MaskedLMAndNextSentence(MaskedLM):
    name = "mlm+nsp"
    model_class = default_head("pretraining")
    head_kind = "pretraining"
    label_keys = ("labels", "next_sentence_label")
    needs_next_sentence_labels = True
    data_modes = ("segment-pair", "sentence-pair")  # data/instances.py NSP_MODES

    def loss(self, model, batch):
        out = model(**self.model_inputs(batch))
        return out.loss, {**masked_lm_metrics(out, batch), "nsp_loss": out.nsp_loss}

    def new_eval(self) -> Evaluation:
        return Evaluations(MaskedLMEval(), NextSentenceEval())
