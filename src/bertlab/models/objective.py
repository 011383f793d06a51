"""What a pre-training objective is to the recipes that train with one (`train/pretrain.py`, general
distillation in `train/distillation/`): an `Objective` object, so that a recipe asks it instead of testing its name.
It knows no model: every family's objectives implement it (the encoders' masked-LM kinds in `objectives/`, a family's
own in its folder's `objectives.py`: T5's denoising, ELECTRA's replaced-token detection), and the registry of them
by name is `bertlab.objectives`.

An objective says
    name                         its registry name (`--objective NAME`)
    head_kind                    the kind of head it trains (`models/heads.py`: "masked-lm", "pretraining"): a family
                                 gives the class (`model_class_for(family)`: RobertaForMaskedLM for RoBERTa's)
    model_class                  the class it trains without a family (BERT's `BertForPreTraining`; T5's
                                 `T5ForConditionalGeneration`, which names no head kind)
    input_keys, label_keys       the batch fields the model reads, and the targets among them
    needs_next_sentence_labels   whether the prepared data must carry a sentence-level label (pairs)
    data_modes                   with such labels: the instance modes whose labels mean what it trains
    text_to_text                 whether it trains an encoder-decoder on text-to-text pairs (`pretrain-t5`)
    data_problem(info, config)   why prepared data (`data.shards.DataInfo`) cannot train this objective on a
                                 model of `config`, in one line; None when it can (checks beyond the
                                 next-sentence labels above: the span-boundary objective's spans)
    loss(model, batch)           -> (loss, metrics): one micro-batch, as the training loop calls it
    new_eval()                   a streaming held-out evaluation: `update(model_output, batch)` per batch,
                                 then `compute()` -> {metric: value}; the metrics an objective reports live
                                 with it

Evaluations are accumulators (sums and counts over every batch) rather than means of batch means, so a
held-out number does not depend on how the split was batched.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from ..core.errors import BertlabError
from ..core.labels import IGNORE_INDEX

Batch = Mapping[str, torch.Tensor]
# A perplexity beyond e^50 says nothing more and would overflow to inf for an untrained model.
MAX_LOG_PERPLEXITY = 50.0


class Evaluation(Protocol):
    """A streaming held-out evaluation, fed one batch at a time."""

    def update(self, output: Any, batch: Batch) -> None: ...

    def compute(self) -> dict[str, float]: ...


class Evaluations:
    """Several evaluations fed the same batches; `compute` merges their metrics in order."""

    def __init__(self, *parts: Evaluation):
        self.parts = parts

    def update(self, output: Any, batch: Batch) -> None:
        for part in self.parts:
            part.update(output, batch)

    def compute(self) -> dict[str, float]:
        return {k: v for part in self.parts for k, v in part.compute().items()}


class Objective:
    """A pre-training objective (see the module docstring); subclasses set the class attributes and
    implement `loss` and `new_eval`. Instances are registered with `objectives.register_objective`."""

    name: str = ""
    model_class: type[torch.nn.Module]  # a model family's class, built with `from_pretrained` / `(config)`
    head_kind: str | None = None  # the head kind a family trains for it; None: `model_class` in every family
    input_keys: tuple[str, ...] = ("input_ids", "attention_mask", "token_type_ids")
    label_keys: tuple[str, ...] = ()
    needs_next_sentence_labels: bool = False
    data_modes: tuple[str, ...] = ()
    # it trains an encoder-decoder on (input, target) pairs of text-to-text data (T5's denoising objectives), built
    # by `pretrain-t5` on data `prepare` corrupted for it, rather than an encoder on masked-LM data
    text_to_text: bool = False

    def model_class_for(self, family: Any) -> type[torch.nn.Module]:
        """The class this objective trains in `family` (a `models.family.Family`): its head of `head_kind` (one
        line when the family has none: RoBERTa has no next-sentence head); `model_class` without a head kind."""
        if self.head_kind is None:
            return self.model_class
        return family.head(self.head_kind, f"objective {self.name}").model_class

    def model_inputs(self, batch: Batch) -> dict[str, torch.Tensor]:
        """The fields of `batch` the model is called with: inputs and targets (those present)."""
        return {k: batch[k] for k in (*self.input_keys, *self.label_keys) if k in batch}

    def data_problem(self, info: Any, config: Any) -> str | None:
        """Why the data described by `info` cannot train this objective on a model of `config`; None if it can."""
        return None

    def loss(self, model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The scalar loss of one micro-batch and the metrics to log with it (0-d tensors or numbers)."""
        raise NotImplementedError

    def new_eval(self) -> Evaluation:
        """A fresh held-out evaluation for this objective's model outputs."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<objective {self.name}: {self.model_class.__name__}>"


# ------------------------------------------------- masked LM's metrics (BERT's objectives, ELECTRA's generator)
def masked_targets(batch: Batch) -> torch.Tensor:
    """The original ids of the masked positions: the rows of `prediction_logits`, in the same order."""
    labels = batch["labels"]
    return labels[labels != IGNORE_INDEX]


def target_token_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """Training metric of a text-to-text model (T5's objectives, `finetune-t5`): accuracy of the argmax over the
    target tokens (labels != -100)."""
    with torch.no_grad():
        keep = labels != IGNORE_INDEX
        right = (logits.argmax(-1) == labels) & keep
        accuracy = right.sum() / keep.sum().clamp(min=1)
    return {"token_accuracy": accuracy}


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
