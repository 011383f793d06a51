"""Masked language modelling alone (RoBERTa-style, on packed sequences): `--objective mlm`.

loss = mean cross-entropy over the masked positions (labels != -100); the MLM head computes those rows
only (`heads.masked_lm`), so `prediction_logits` is (masked tokens, vocabulary), in the order of the
masked positions. Held out: MLM loss, accuracy and perplexity over every masked token of the split.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from ..core.errors import BertlabError
from ..models.bert.heads import IGNORE_INDEX, BertForMaskedLM
from ..models.objective import MAX_LOG_PERPLEXITY, Batch, Evaluation, Objective


def masked_targets(batch: Batch) -> torch.Tensor:
    """The original ids of the masked positions: the rows of `prediction_logits`, in the same order."""
    labels = batch["labels"]
    return labels[labels != IGNORE_INDEX]


def masked_lm_metrics(output: Any, batch: Batch) -> dict[str, torch.Tensor]:
    """Training metrics of the MLM term: its loss, and accuracy over the masked tokens (0 with none)."""
    targets = masked_targets(batch)
    with torch.no_grad():
        accuracy = (output.prediction_logits.argmax(-1) == targets).float().mean() if targets.numel() else \
            torch.zeros((), device=targets.device)
    return {"mlm_loss": output.mlm_loss, "mlm_accuracy": accuracy}


class MaskedLMEval:
    """Held-out MLM loss, accuracy and perplexity over all masked tokens (sums, not batch means)."""

    def __init__(self) -> None:
        self.loss_sum = self.correct = self.count = 0.0

    def update(self, output: Any, batch: Batch) -> None:
        targets = masked_targets(batch)
        if targets.numel():
            logits = output.prediction_logits.float()
            self.loss_sum += float(F.cross_entropy(logits, targets, reduction="sum"))
            self.correct += float((logits.argmax(-1) == targets).sum())
            self.count += targets.numel()

    def compute(self) -> dict[str, float]:
        if not self.count:
            raise BertlabError("the held-out split has no masked tokens to evaluate on")
        loss = self.loss_sum / self.count
        return {"mlm_loss": loss, "mlm_accuracy": self.correct / self.count,
                "perplexity": math.exp(min(loss, MAX_LOG_PERPLEXITY))}


class MaskedLM(Objective):
    name = "mlm"
    model_class = BertForMaskedLM
    head_kind = "masked-lm"
    label_keys = ("labels",)

    def loss(self, model, batch):
        out = model(**self.model_inputs(batch))
        return out.loss, masked_lm_metrics(out, batch)

    def new_eval(self) -> Evaluation:
        return MaskedLMEval()
