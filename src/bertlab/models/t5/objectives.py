"""T5's pre-training objectives (Raffel et al., 2020, section 3.3) as `Objective`s: `--objective span-corruption`,
`iid-denoising`, `bert-style`, `mass-style`, `drop-tokens`, `deshuffle`, `prefix-lm`.

The corruption itself is data (`denoising.py` beside this module: pure transforms, applied when batches are made); what
the recipe needs of an objective is the model it trains and how a batch is scored, and that is the same for all
seven: T5 reads the inputs and is trained to write the targets.

    model     `T5ForConditionalGeneration`, any of its three architectures (`config.architecture`:
              encoder-decoder, decoder-only, prefix-lm): every one is called `model(input_ids, attention_mask,
              labels)` and returns the targets' logits, so one batch format serves them all -- the decoder-only
              kinds read [inputs ; start ; targets] as one sequence (the inputs fully visible for prefix-lm),
              which is also how they are fine-tuned and how they generate
    batch     input_ids, attention_mask (B, T_in); labels (B, T_out) with -100 on padding
              (`data.t5_loader.TextToTextCollator`, encoder-decoder form)
    loss      mean cross-entropy over the target tokens (the model's `.loss`)
    held out  loss, perplexity and accuracy over every target token (teacher-forced argmax), and the share
              of examples whose whole target is right -- sums over the split, not means of batch means
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from ...core.errors import BertlabError
from ...core.labels import IGNORE_INDEX
from ..objective import MAX_LOG_PERPLEXITY, Batch, Evaluation, Objective, target_token_metrics
from .config import ARCHITECTURES
from .denoising import DENOISING_OBJECTIVES
from .modeling import T5ForConditionalGeneration

# One objective per corruption transform T5's folder registers (`denoising.py`): the names come from
# that registry, in its order, so a new transform is an objective without a second list to keep in step.
T5_OBJECTIVES = tuple(DENOISING_OBJECTIVES)


class TargetTokenEval:
    """Held-out loss, perplexity and token accuracy over every target token, and the share of sequences whose
    every target token is the argmax (sums over the split)."""

    def __init__(self) -> None:
        self.loss_sum = self.correct = self.count = self.sequences_right = self.sequences = 0.0

    def update(self, output: Any, batch: Batch) -> None:
        labels = batch["labels"]
        keep = labels != IGNORE_INDEX
        logits = output.logits.float()
        self.loss_sum += float(F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1),
                                               ignore_index=IGNORE_INDEX, reduction="sum"))
        right = (logits.argmax(-1) == labels) | ~keep
        self.correct += float((right & keep).sum())
        self.count += float(keep.sum())
        has_target = keep.any(-1)
        self.sequences_right += float((right.all(-1) & has_target).sum())
        self.sequences += float(has_target.sum())

    def compute(self) -> dict[str, float]:
        if not self.count:
            raise BertlabError("the held-out split has no target tokens to evaluate on")
        loss = self.loss_sum / self.count
        return {"loss": loss, "token_accuracy": self.correct / self.count,
                "perplexity": math.exp(min(loss, MAX_LOG_PERPLEXITY)),
                "sequence_accuracy": self.sequences_right / self.sequences}


class TextToTextObjective(Objective):
    """One of T5's denoising objectives (its name is the data transform's, `bertlab.models.t5.denoising`)."""

    model_class = T5ForConditionalGeneration
    input_keys = ("input_ids", "attention_mask")
    label_keys = ("labels",)
    text_to_text = True
    architectures = ARCHITECTURES  # every T5 architecture trains on it (the model's `config.architecture`)

    def __init__(self, name: str):
        self.name = name

    def loss(self, model, batch):
        out = model(**self.model_inputs(batch))
        return out.loss, target_token_metrics(out.logits, batch["labels"])

    def new_eval(self) -> Evaluation:
        return TargetTokenEval()



# what the registry registers (`models.registry.family_objectives`): one per corruption transform
PRETRAINING_OBJECTIVES = [TextToTextObjective(name) for name in T5_OBJECTIVES]
