"""The modules the loop trains in distillation: the student (and a hidden-state projection) whose forward is the
recipe's loss on one micro-batch -- `MLMDistiller` for general distillation on masked-LM data, `TaskDistiller`
for a fine-tuned teacher's task -- from the terms of `losses.py`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ...core.errors import ConfigError
from ...core.labels import IGNORE_INDEX
from .losses import MASKED_LOGIT, cosine_distance, distillation_kl


class _Distiller(nn.Module):
    """The module the loop trains: the student and (when widths differ) the hidden-state projection.

    The teacher is kept outside the module tree on purpose: it is not trained, so it must not be in the
    optimizer, in DistributedDataParallel's gradient buckets, or in every checkpoint (it can be the
    largest thing in memory); it is reloaded from --teacher on resume. It stays in eval mode (no dropout),
    so it consumes no random numbers and resume stays exact."""

    def __init__(self, student: nn.Module, teacher: nn.Module | None, temperature: float, alpha: float,
                 beta: float, gamma: float, layer_map: list[tuple[int, int]]):
        super().__init__()
        self.student = student
        self.__dict__["teacher"] = teacher  # not a submodule (see above)
        if teacher is not None:
            teacher.eval().requires_grad_(False)
        self.temperature, self.alpha, self.beta, self.gamma = temperature, alpha, beta, gamma
        self.layer_map = layer_map  # (student layer, teacher layer) pairs of the cosine term; 0 = embeddings
        h_s = student.config.hidden_size
        h_t = teacher.config.hidden_size if teacher is not None else h_s
        # W in cos(W h_s, h_t): only when the widths differ (the cosine needs one space); no bias, a rotation/scale
        self.projection = nn.Linear(h_s, h_t, bias=False) if gamma > 0 and h_s != h_t else None

    def project(self, h: torch.Tensor) -> torch.Tensor:
        return self.projection(h) if self.projection is not None else h

    def hidden_loss(self, s_states, t_states, keep: torch.Tensor) -> torch.Tensor:
        """γ's term: the cosine distance averaged over the mapped layer pairs."""
        terms = [cosine_distance(self.project(s_states[s]), t_states[t], keep) for s, t in self.layer_map]
        return torch.stack(terms).mean()


class MLMDistiller(_Distiller):
    """General distillation's loss on one micro-batch of masked-LM data (see the module docstring)."""

    def __init__(self, *args, kl_positions: str = "masked", **kwargs):
        super().__init__(*args, **kwargs)
        self.kl_positions = kl_positions

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
        # every layer's output only when the cosine term reads more than the two last hidden states
        last = (self.student.config.num_hidden_layers, self.teacher.config.num_hidden_layers) if self.teacher else None
        all_layers = self.gamma > 0 and self.layer_map != [last]
        s = self.student.bert(**inputs, output_hidden_states=all_layers)
        labels = batch["labels"]
        masked = labels != IGNORE_INDEX  # (B, T): the positions MLM predicts
        # The rows the vocabulary projection runs on: the masked positions, or every real token (see docstring).
        rows = masked if self.kl_positions == "masked" else batch["attention_mask"].bool()
        s_logits = self.student.cls.predictions(s.last_hidden_state[rows])  # (N, V)
        targets = labels[rows]  # the masked tokens; -100 at unmasked rows of "all"
        zero = s_logits.new_zeros((), dtype=torch.float32)  # an unused term, and metrics of an empty selection
        # no masked token in the batch: a zero that keeps the graph, so backward works whatever the weights
        mlm = F.cross_entropy(s_logits.float(), targets, ignore_index=IGNORE_INDEX) if bool(masked.any()) \
            else s_logits.sum() * 0.0
        kl = cos = zero
        metrics: dict[str, torch.Tensor] = {}
        if self.alpha > 0 or self.gamma > 0:
            with torch.no_grad():
                t = self.teacher.bert(**inputs, output_hidden_states=all_layers)
                t_logits = self.teacher.cls.predictions(t.last_hidden_state[rows]) if self.alpha > 0 else None
            if t_logits is not None:
                kl = distillation_kl(s_logits, t_logits, self.temperature)
                with torch.no_grad():
                    metrics["teacher_agreement"] = (s_logits.argmax(-1) == t_logits.argmax(-1)).float().mean() \
                        if t_logits.numel() else zero
            if self.gamma > 0:
                s_states = s.hidden_states if all_layers else {last[0]: s.last_hidden_state}
                t_states = t.hidden_states if all_layers else {last[1]: t.last_hidden_state}
                cos = self.hidden_loss(s_states, t_states, batch["attention_mask"])
        loss = self.alpha * kl + self.beta * mlm + self.gamma * cos  # α · T²·KL + β · MLM + γ · cosine
        with torch.no_grad():
            picked = masked[rows]
            accuracy = (s_logits[picked].argmax(-1) == targets[picked]).float().mean() if bool(picked.any()) \
                else zero
        metrics.update(kl=kl.detach(), mlm_loss=mlm.detach(), cos_loss=cos.detach(), mlm_accuracy=accuracy)
        return loss, metrics


@contextlib.contextmanager
def layer_outputs(model: nn.Module | None, wanted: set[int]) -> Iterator[dict[int, torch.Tensor]]:
    """Record the hidden states (1-based layer outputs, as in `hidden_states`) of `model.bert`'s layers in
    `wanted` during the block -- for task heads, whose forward returns logits only."""
    found: dict[int, torch.Tensor] = {}
    handles = []
    if model is not None:
        for i in wanted:
            layer = model.bert.encoder.layer[i - 1]
            handles.append(layer.register_forward_hook(lambda mod, args, out, i=i: found.__setitem__(i, out[0])))
    try:
        yield found
    finally:
        for h in handles:
            h.remove()


def soft_target(spec) -> str:
    """How the teacher's logits teach the student's head (the head registry's `soft_target`): classes,
    tokens or spans -- and regression, for a class head with one output (STS-B), which has no distribution."""
    kind = spec.head.head_spec.soft_target
    if kind is None:
        raise ConfigError(f"task {spec.name}: its head ({spec.head.__name__}) cannot be distilled (no soft target)")
    return "regression" if kind == "classes" and spec.is_regression else kind


class TaskDistiller(_Distiller):
    """Task-specific distillation's loss on one micro-batch of task features (see the module docstring).

    The teacher's logits come with the batch (`teacher_logits`, computed once, see `soft_labels`) or, when
    the batch has none (γ > 0), from running the teacher here."""

    def __init__(self, *args, spec, **kwargs):
        super().__init__(*args, **kwargs)
        self.spec, self.kind = spec, soft_target(spec)
        self.logits = spec.head.head_spec.logits  # one logits tensor per output: (B, K), (B, T, K), (B, T, 2)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        spec = self.spec
        wanted_s = {s for s, _ in self.layer_map} if self.gamma > 0 else set()
        has_mask = "gold" in batch  # a batch that mixes labelled examples with unlabelled transfer examples
        with layer_outputs(self.student, wanted_s) as s_states:
            out = self.student(**spec.model_inputs(batch, with_targets=not has_mask))
        s_logits = self.logits(out)
        # the head's own loss on the gold labels, or its mean over the labelled rows of a mixed batch
        gold = self.labelled_loss(s_logits, batch) if has_mask else out.loss
        zero = s_logits.new_zeros((), dtype=torch.float32)  # an unused term (gold's graph carries backward)
        t_logits = batch.get("teacher_logits")
        t_states: dict[int, torch.Tensor] = {}
        if self.gamma > 0 or (self.alpha > 0 and t_logits is None):
            with torch.no_grad(), layer_outputs(self.teacher, {t for _, t in self.layer_map} if self.gamma > 0
                                                else set()) as t_states:
                t_logits = self.logits(self.teacher(**spec.model_inputs(batch)))
        soft = self.soft_loss(s_logits, t_logits, batch) if self.alpha > 0 else zero
        cos = zero
        if self.gamma > 0:
            keep = batch["attention_mask"]
            keep = keep.reshape(-1, keep.size(-1))  # multiple choice: (B, C, T) -> (B·C, T), as the encoder saw it
            cos = self.hidden_loss(s_states, t_states, keep)
        loss = self.alpha * soft + self.beta * gold + self.gamma * cos  # α · soft + β · gold + γ · cosine
        return loss, {"soft_loss": soft.detach(), "gold_loss": gold.detach(), "cos_loss": cos.detach()}

    def labelled_loss(self, s_logits: torch.Tensor, batch) -> torch.Tensor:
        """Σ_i gold_i · loss_i / max(1, Σ_i gold_i): the head's loss (CE, or squared error for regression)
        averaged over the examples that have a label (`gold` = 1); 0 for a batch of transfer examples only."""
        labels, gold = batch["labels"], batch["gold"]
        if self.kind == "regression":
            per_example = (s_logits.float().view(-1) - labels.float().view(-1)) ** 2
        else:
            per_example = F.cross_entropy(s_logits.float(), labels.view(-1), reduction="none")
        return (per_example * gold).sum() / gold.sum().clamp(min=1.0)

    def soft_loss(self, s_logits: torch.Tensor, t_logits: torch.Tensor, batch) -> torch.Tensor:
        T = self.temperature
        if self.kind == "regression":
            return F.mse_loss(s_logits.float().view(-1), t_logits.float().view(-1))  # the teacher's score as target
        if self.kind == "tokens":
            keep = batch["labels"] != IGNORE_INDEX  # (B, T): the tokens the head predicts (first pieces)
            return distillation_kl(s_logits[keep], t_logits[keep], T)
        if self.kind == "spans":
            # (B, T, 2) -> rows (2B, T): a start and an end distribution over the window's real tokens
            pad = ~batch["attention_mask"].bool()[:, :, None]
            s = s_logits.float().masked_fill(pad, MASKED_LOGIT).transpose(1, 2).reshape(-1, s_logits.size(1))
            t = t_logits.float().masked_fill(pad, MASKED_LOGIT).transpose(1, 2).reshape(-1, t_logits.size(1))
            return distillation_kl(s, t, T)  # the mean over rows is (KL_start + KL_end) / 2, batch-averaged
        return distillation_kl(s_logits, t_logits, T)  # classification, multiple choice: (B, K)



__all__ = ["MLMDistiller", "TaskDistiller", "layer_outputs", "soft_target"]
