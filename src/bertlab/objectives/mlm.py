"""Masked language modelling alone (RoBERTa-style, on packed sequences): `--objective mlm`.

loss = mean cross-entropy over the masked positions (labels != -100); the MLM head computes those rows
only (`heads.masked_lm`), so `prediction_logits` is (masked tokens, vocabulary), in the order of the
masked positions. Held out: MLM loss, accuracy and perplexity over every masked token of the split (the metrics,
family-neutral, are `models/objective.py`'s: ELECTRA's generator reports them too).
"""

from __future__ import annotations

from ..models.objective import Evaluation, MaskedLMEval, Objective, masked_lm_metrics
from ..models.registry import default_head


class MaskedLM(Objective):
    name = "mlm"
    model_class = default_head("masked-lm")
    head_kind = "masked-lm"
    label_keys = ("labels",)

    def loss(self, model, batch):
        out = model(**self.model_inputs(batch))
        return out.loss, masked_lm_metrics(out, batch)

    def new_eval(self) -> Evaluation:
        return MaskedLMEval()
