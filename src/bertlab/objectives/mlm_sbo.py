"""SpanBERT's objective (Joshi et al., 2020, section 3.2): masked LM + span-boundary objective, `--objective mlm+sbo`.

Every masked token x_i of a span x_s..x_e is predicted twice: by the MLM head from its own encoding, and by the
span-boundary head from the encodings of the tokens just outside the span, x_{s-1} and x_{e+1}, and a learned
embedding of its offset i - s (`models/bert/heads.SpanBoundaryHead`), through the same output embedding.
loss = mean MLM cross-entropy + mean SBO cross-entropy over the masked tokens (the sum of both, as SpanBERT).

The data: span masking (`bertlab prepare --masking span`) on single segments (no NSP, as SpanBERT), static or
dynamic; the collator gives each masked position its span's boundaries (`span_left`, `span_right`,
`span_offset`). Held out: the MLM metrics (`models/objective.py`), and SBO loss and accuracy over every masked
token.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..models.heads import SPAN_BOUNDARY_POSITIONS_KEY, span_boundary_positions
from ..models.objective import Batch, Evaluation, Evaluations, MaskedLMEval, masked_lm_metrics, masked_targets
from ..models.registry import default_head
from .mlm import MaskedLM

SPAN_KEYS = ("span_left", "span_right", "span_offset")


class SpanBoundaryEval:
    """Held-out SBO loss and accuracy over all masked tokens (sums, not batch means)."""

    def __init__(self) -> None:
        self.loss_sum = self.correct = self.count = 0.0

    def update(self, output: Any, batch: Batch) -> None:
        targets = masked_targets(batch)
        if targets.numel() and output.sbo_logits is not None:
            logits = output.sbo_logits.float()
            self.loss_sum += float(F.cross_entropy(logits, targets, reduction="sum"))
            self.correct += float((logits.argmax(-1) == targets).sum())
            self.count += targets.numel()

    def compute(self) -> dict[str, float]:
        if not self.count:
            return {}
        return {"sbo_loss": self.loss_sum / self.count, "sbo_accuracy": self.correct / self.count}


class MaskedLMAndSpanBoundary(MaskedLM):
    name = "mlm+sbo"
    model_class = default_head("span-boundary")
    head_kind = "span-boundary"
    label_keys = ("labels", *SPAN_KEYS)

    def data_problem(self, info, config):
        if info.masking.granularity != "span":
            return (f"instances are masked by {info.masking.granularity!r}; objective {self.name} needs span "
                    "masking (`bertlab prepare --masking span`)")
        if info.has_nsp:
            return f"instances are {info.mode!r} pairs; objective {self.name} trains on single segments (no NSP)"
        if not info.has_spans:
            return (f"its static span masks were prepared without their spans; objective {self.name} needs them: "
                    "prepare the data again")
        positions = span_boundary_positions(config)
        if info.masking.max_predictions_per_seq > positions:
            return (f"max_predictions_per_seq {info.masking.max_predictions_per_seq} allows spans longer than the "
                    f"span-boundary head's {positions} offsets (config.json {SPAN_BOUNDARY_POSITIONS_KEY})")
        return None

    def loss(self, model, batch):
        out = model(**self.model_inputs(batch))
        targets = masked_targets(batch)
        with torch.no_grad():
            accuracy = (out.sbo_logits.argmax(-1) == targets).float().mean() if targets.numel() else \
                torch.zeros((), device=targets.device)
        return out.loss, {**masked_lm_metrics(out, batch), "sbo_loss": out.sbo_loss, "sbo_accuracy": accuracy}

    def new_eval(self) -> Evaluation:
        return Evaluations(MaskedLMEval(), SpanBoundaryEval())
