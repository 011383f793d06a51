"""ALBERT's objective (Lan et al., 2019, section 4.1 / 3): masked LM + sentence-order prediction, `--objective
mlm+sop`, for BERT models as well as ALBERT's.

Sentence order: two consecutive segments of one document, swapped half the time; the sentence-level head says
whether they are (label 0) in order or (1) swapped -- coherence, where NSP's random B can be told by topic
alone. The data is `bertlab prepare --mode segment-order` (`data/instances.py`); batches carry the label as
`next_sentence_label`, which a BERT model's NSP head (`cls.seq_relationship`) and ALBERT's `sop_classifier`
both read. loss = mean MLM cross-entropy + mean SOP cross-entropy. Held out: the MLM metrics and SOP accuracy.
"""

from __future__ import annotations

from ..models.objective import Evaluation, Evaluations, MaskedLMEval, masked_lm_metrics
from .mlm_nsp import MaskedLMAndNextSentence, NextSentenceEval


class SentenceOrderEval(NextSentenceEval):
    """Held-out SOP accuracy over every pair."""

    def compute(self) -> dict[str, float]:
        return {"sop_accuracy": self.correct / self.count} if self.count else {}


class MaskedLMAndSentenceOrder(MaskedLMAndNextSentence):
    name = "mlm+sop"
    data_modes = ("segment-order",)  # data/instances.py ORDER_MODES

    def loss(self, model, batch):
        out = model(**self.model_inputs(batch))
        return out.loss, {**masked_lm_metrics(out, batch), "sop_loss": out.nsp_loss}

    def new_eval(self) -> Evaluation:
        return Evaluations(MaskedLMEval(), SentenceOrderEval())
