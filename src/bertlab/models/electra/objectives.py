"""ELECTRA's pre-training objective, replaced-token detection (Clark et al., 2020, section 2): `--objective rtd`,
registered with the others by the family registry (`models.registry.family_objectives`).

A small generator is trained with masked LM on the masked positions; each of them is filled with a token sampled
from the generator's distribution, and the discriminator -- the model kept -- learns to tell, for every real
token, whether it is the original. Both are `models/electra/heads.py`'s `ElectraForReplacedTokenDetection`:
loss = MLM cross-entropy (the generator's) + 50 x mean binary cross-entropy (the discriminator's, over every
non-padding token). Any masked-LM data trains it (packed sequences or pairs; pair labels are not read).
Held out: the generator's MLM metrics (`models/objective.py`'s), and the discriminator's loss, accuracy and the
share of tokens replaced (a generator that learns more samples the original more often, so this falls as it trains).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ...core.errors import BertlabError
from ..objective import Batch, Evaluation, Evaluations, MaskedLMEval, Objective, masked_lm_metrics
from .heads import ElectraForReplacedTokenDetection


def detection_counts(output: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Over the real tokens: (correct detections, tokens, replaced tokens)."""
    real = output.real
    correct = ((output.rtd_logits > 0) == output.replaced)[real].sum()
    return correct, real.sum(), output.replaced[real].sum()


class ReplacedTokenEval:
    """Held-out discriminator loss and accuracy over every real token, and the share replaced (sums)."""

    def __init__(self) -> None:
        self.loss_sum = self.correct = self.count = self.replaced = 0.0

    def update(self, output: Any, batch: Batch) -> None:
        correct, count, replaced = detection_counts(output)
        self.loss_sum += float(F.binary_cross_entropy_with_logits(
            output.rtd_logits[output.real].float(), output.replaced[output.real].float(), reduction="sum"))
        self.correct += float(correct)
        self.count += float(count)
        self.replaced += float(replaced)

    def compute(self) -> dict[str, float]:
        if not self.count:
            raise BertlabError("the held-out split has no tokens to evaluate on")
        return {"rtd_loss": self.loss_sum / self.count, "rtd_accuracy": self.correct / self.count,
                "replaced_fraction": self.replaced / self.count}


class ReplacedTokenDetection(Objective):
    name = "rtd"
    model_class = ElectraForReplacedTokenDetection
    head_kind = "rtd-pretraining"
    label_keys = ("labels",)  # masked-LM data, as `--objective mlm`

    def loss(self, model, batch):
        out = model(**self.model_inputs(batch))
        correct, count, replaced = detection_counts(out)
        with torch.no_grad():
            metrics = {"rtd_loss": out.rtd_loss, "rtd_accuracy": correct.float() / count.clamp_min(1),
                       "replaced_fraction": replaced.float() / count.clamp_min(1)}
        return out.loss, {**masked_lm_metrics(out, batch), **metrics}

    def new_eval(self) -> Evaluation:
        return Evaluations(MaskedLMEval(), ReplacedTokenEval())


# what the registry registers (`models.registry.family_objectives`)
PRETRAINING_OBJECTIVES = [ReplacedTokenDetection()]
