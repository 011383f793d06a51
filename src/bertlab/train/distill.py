"""Distillation (Hinton et al., 2015; DistilBERT, Sanh et al., 2019): a smaller student trained to match a
trained teacher, on the one training loop (`loop.Trainer`) -- resume, torchrun, bf16, logs are the loop's.

General distillation -- `bertlab distill --teacher DIR --student S --data DATA_DIR --out RUN_DIR`, on the
masked-LM data of `bertlab prepare`, the teacher a pre-trained model with its MLM head:

    loss = α · T² · KL(p_t ‖ p_s)           p = softmax(MLM logits / T), at the masked positions
         + β · CE(student MLM logits, the masked tokens)
         + γ · mean over tokens of (1 − cos(W h_s, h_t))     last hidden states, padding excluded;
                                             W = identity when the widths match, else a learned
                                             projection (trained with the student, not exported)
    defaults T = 2, α = 5, β = 2, γ = 1 (DistilBERT's)

  The soft term. The issue writes KL(student ‖ teacher); as in Hinton et al. and DistilBERT's code
  (`KLDivLoss(log_softmax(s / T), softmax(t / T))`) the teacher's distribution is the target:
  KL(p_t ‖ p_s) = Σ_v p_t (log p_t − log p_s), whose gradient is that of cross-entropy against the
  teacher's soft labels. Its gradients shrink as 1/T²; the T² factor keeps the term's weight independent of T.

  Where the KL is taken: at the masked positions only (`kl_positions = "masked"`, the default) -- the rows
  the MLM head computes (`heads.masked_lm`). (1) Cost: the vocabulary projection is the largest matmul in
  the model and ~85% of its rows would be unmasked positions, for the teacher and the student alike; kept
  to the masked rows a distillation step costs a pre-training step plus a teacher forward, and the
  (B·T, V) logits -- 500 MB per model at B 32, T 128, V 30522 in fp32 -- never exist. (2) Signal: at an
  unmasked position the teacher sees the token, and its distribution is close to one-hot on it ("copy the
  input"); at a masked position it is the informative one, over plausible fillers. DistilBERT used every
  non-padding position; `kl_positions = "all"` does that.

  `cosine_layers = "all"` adds the cosine term for every student layer against the teacher layer it was
  cut from (or the uniform map round(i · L_t / L_s) for a fresh student), averaged over the layers.

Task-specific distillation -- `bertlab distill --task TASK --teacher FINETUNED_DIR --data DATA_PATH --out OUT_DIR`,
the teacher fine-tuned on TASK (its head is needed), the data the task's as for `bertlab finetune`:

    classification (GLUE, SWAG)  α · T² · KL(p_t ‖ p_s) + β · CE(gold)          p over the classes
    regression (STS-B)           α · MSE(s, t) + β · MSE(s, gold)              (no distribution to soften)
    token classification (NER)   per predicted token, as classification
    span QA (SQuAD)              α · T² · (KL_start + KL_end) / 2 + β · (CE_start + CE_end) / 2,
                                 p over the real (non-padding) tokens of the window
    + γ · cosine between hidden states, as above (optional)
    defaults T = 2, α = 1, β = 1, γ = 0

  With γ = 0 the teacher's logits on the training set -- the soft labels -- are computed once before
  training: in eval mode the teacher is deterministic, so this is what running it on every batch would
  give, at a fraction of the cost over several epochs. With γ > 0 the teacher runs beside the student on
  every batch (hidden states are too large to keep). α = γ = 0 trains on the gold labels alone (the
  baseline a distilled student is compared with), without the teacher.

  Transfer set (`transfer_limit = N`, sentence-level tasks): N more examples of the task's training split,
  disjoint from the `train_limit` subset, join the training data without their labels -- the teacher's
  soft labels are their only target (Hinton et al.'s transfer set; Turc et al., 2019, "Well-read students
  learn better"). The gold term is then the mean over the labelled examples of each batch (0 when a batch
  has none); the soft term covers every example. This is where distillation helps most: the teacher turns
  unlabelled text into training signal a gold-only student cannot use.

Students (`--student`, see `bertlab.train.students`): every-other-layer (default), every-K-layers,
layers:I,J,..., a preset or config (fresh), or a model folder. The student is the teacher's class.

Outputs
    general   RUN_DIR/{run_config.json, metrics.jsonl, checkpoints/, final/}
    task      OUT_DIR/{run_config.json, metrics.jsonl, model/, metrics.json, dev predictions}; checkpoints/ only
              while a run is unfinished (or with --save-every), as fine-tuning keeps none
final/ and model/ are the Hugging Face layout with vocab.txt and tokenizer_config.json, so the student
works with every other command (finetune, evaluate, features, ...) and loads in `transformers` as it is.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..checkpoint.hf_layout import canonical_key, load_state_dict_into, read_state_dict
from ..models.bert.config import BertConfig
from ..errors import BertlabError, ConfigError
from ..models.bert.heads import IGNORE_INDEX, BertForMaskedLM, BertForPreTraining
from ..models.bert.modeling import BertPreTrainedModel
from ..objectives import get_objective
from .batches import shuffled_batches, steps_for_epochs, time_step
from .distributed import init_distributed, seed_everything
from .loop import LoopConfig, Trainer, TrainResult
from .run_dir import CHECKPOINT_DIR, check_writable, latest_checkpoint
from .optim import adamw, linear_warmup_decay
from .pretrain import FINAL_DIR
from .random_init import INITS
from .runconfig import parse_duration
from .setup import (RUN_CONFIG, autocast_dtype, check_precision, eval_seconds, fit_steps_to_budget,
                    heldout_sequences, resolve_precision, resolve_resume_config, resolved_settings, run_record,
                    split_batch, write_run_config)
from .students import build_student, hidden_layer_map

log = logging.getLogger(__name__)

MODEL_DIR = "model"  # task distillation: OUT_DIR/model, as fine-tuning
KL_POSITIONS = ("masked", "all")
COSINE_LAYERS = ("last", "all")
MASKED_LOGIT = -1e4  # a padding position's logit in a softmax over tokens: probability 0, log finite

# General distillation's hard-label term is masked LM: its held-out metrics are that objective's, whatever
# heads the teacher has (NSP is not distilled; the student keeps the teacher's NSP head, frozen).
GENERAL_OBJECTIVE = "mlm"
GENERAL_EVALS = 10  # held-out evaluations over a general distillation run unless --eval-every says otherwise
# Defaults that differ between the two recipes (None in DistillConfig means "the recipe's default").
GENERAL_DEFAULTS = dict(alpha=5.0, beta=2.0, gamma=1.0, batch_size=128, lr=1e-4, warmup=0.05)
TASK_DEFAULTS = dict(alpha=1.0, beta=1.0, gamma=0.0, batch_size=32, lr=5e-5, warmup=0.1)


@dataclass
class DistillConfig:
    """Everything a distillation run needs; `bertlab distill` fills it from flags (or a JSON file)."""

    teacher: str = ""  # a Hugging Face-layout folder: pre-trained with its MLM head, or fine-tuned on `task`
    student: str = "every-other-layer"  # every-other-layer | every-K-layers | layers:I,J | PRESET | CONFIG | DIR
    init: str | None = None  # random: the student's weights drawn anew (the baseline); None: as --student makes it
    student_layout: str = "bert"  # general: bert | distilbert (the student written as a DistilBERT at the end)
    data: str = ""  # DATA_DIR from `bertlab prepare` (general), or the task's folder/file (task)
    out: str = ""  # RUN_DIR / OUT_DIR
    task: str | None = None  # a task name (sst2, squad, ...): task-specific distillation
    # the loss
    temperature: float = 2.0
    alpha: float | None = None  # soft-label (KL) weight; default 5 general, 1 task
    beta: float | None = None  # hard-label weight (MLM / gold); default 2 general, 1 task
    gamma: float | None = None  # hidden-state cosine weight; default 1 general, 0 task
    kl_positions: str = "masked"  # general: masked | all (every non-padding token, as DistilBERT)
    cosine_layers: str = "last"  # last | all (every student layer against its teacher layer)
    # how long
    steps: int | None = None  # general: required unless time_budget; task: default epochs x the data
    epochs: float = 3.0  # task only
    time_budget: str | None = None  # general: "2h", "90m": the step count is fitted to it
    # batches
    batch_size: int | None = None  # examples per optimizer step, all ranks; default 128 general, 32 task
    micro_batch_size: int | None = None  # per rank per forward pass; the rest is gradient accumulation
    seq_len: int = 128  # general: the instance set's length
    max_seq_length: int | None = None  # task: default the task's (128; SQuAD 384)
    train_limit: int | None = None  # task: a seeded random subset of N training examples
    eval_limit: int | None = None  # task: a seeded random subset of N dev examples
    transfer_limit: int | None = None  # task: N more training examples without their labels (a transfer set)
    # optimisation
    lr: float | None = None  # default 1e-4 general, 5e-5 task
    warmup: float | None = None  # < 1: a fraction of the steps; >= 1: steps. Default 0.05 general, 0.1 task
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    precision: str = "auto"  # auto (bf16 where the hardware does it natively) | fp32 | bf16 | fp16
    # evaluation, logs, checkpoints
    eval_every: int | None = None  # general default: 10 per run; task default: at the end only
    eval_batches: int | None = 50  # general: held-out batches per evaluation (None: all)
    eval_batch_size: int = 64
    eval_teacher: bool = True  # score the teacher once too, for comparison
    save_every: int | None = None  # general default: 10 per run; task: on signals only (see the docstring)
    keep_last: int = 2
    log_every: int = 1
    seed: int = 42
    num_workers: int = 1  # general: DataLoader workers per rank
    device: str = "auto"  # auto | cpu | cuda
    resume: bool = False
    progress: bool = True
    retain_freed_memory: bool = True  # CPU: keep freed tensor memory in the process (bertlab/host_memory.py)

    def resolved(self, name: str) -> Any:
        """A field's value, or the recipe's default for it when it is None."""
        value = getattr(self, name)
        defaults = TASK_DEFAULTS if self.task else GENERAL_DEFAULTS
        return defaults[name] if value is None and name in defaults else value

    def validate(self) -> None:
        for name, flag in (("teacher", "--teacher DIR"), ("data", "--data PATH"), ("out", "--out DIR")):
            if not getattr(self, name):
                raise ConfigError(f"distill: give {flag}")
        if self.task is not None:
            from ..tasks import TASKS

            TASKS[self.task]  # the one-line "unknown task ...; expected one of" error
        elif self.steps is None and self.time_budget is None:
            raise ConfigError("distill: give the length of the run, --steps N or --time-budget 2h")
        if not self.temperature > 0:
            raise ConfigError(f"temperature must be positive, got {self.temperature}")
        for name in ("alpha", "beta", "gamma"):
            if self.resolved(name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {self.resolved(name)}")
        if self.resolved("alpha") == self.resolved("beta") == self.resolved("gamma") == 0:
            raise ConfigError("alpha, beta and gamma are all 0: nothing to train on")
        if self.init is not None and self.init not in INITS:
            raise ConfigError(f"init must be one of {', '.join(INITS)}, got {self.init!r}")
        if self.student_layout not in ("bert", "distilbert"):
            raise ConfigError(f"student_layout must be bert or distilbert, got {self.student_layout!r}")
        if self.student_layout == "distilbert" and self.task is not None:
            raise ConfigError("student_layout distilbert: for general distillation (a task head on BERT's pooler "
                              "has no DistilBERT equivalent)")
        if self.kl_positions not in KL_POSITIONS:
            raise ConfigError(f"kl_positions must be one of {', '.join(KL_POSITIONS)}, got {self.kl_positions!r}")
        if self.cosine_layers not in COSINE_LAYERS:
            raise ConfigError(f"cosine_layers must be one of {', '.join(COSINE_LAYERS)}, got {self.cosine_layers!r}")
        check_precision(self.precision)
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"steps must be at least 1, got {self.steps}")
        if not self.epochs > 0 or not self.resolved("lr") > 0:
            raise ConfigError(f"epochs and lr must be positive, got {self.epochs} and {self.resolved('lr')}")
        for name in ("batch_size", "micro_batch_size"):
            if self.resolved(name) is not None and self.resolved(name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {self.resolved(name)}")
        if self.time_budget is not None:
            parse_duration(self.time_budget)
        if self.transfer_limit is not None:
            if self.task is None or self.transfer_limit < 1:
                raise ConfigError("transfer_limit: a positive number of extra examples, for task distillation")
            if self.resolved("alpha") == 0:
                raise ConfigError("transfer_limit: the transfer examples have no labels, only soft labels; "
                                  "alpha must be > 0")


# Settings a resumed run may change; the rest comes from the run's own run_config.json.
RESUME_MAY_CHANGE = ("eval_every", "eval_batches", "save_every", "keep_last", "log_every", "num_workers", "device",
                     "progress", "resume", "eval_teacher")


@dataclass
class DistillResult:
    out_dir: Path
    model_dir: Path | None  # the exported student (None when the run was interrupted)
    train: TrainResult
    student_eval: dict[str, Any] = field(default_factory=dict)  # held-out MLM numbers / dev scores
    teacher_eval: dict[str, Any] = field(default_factory=dict)
    teacher_parameters: int = 0
    student_parameters: int = 0
    config: DistillConfig | None = None


# ---------------------------------------------------------------------------------------------- the loss terms
def distillation_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """T² · mean over rows of KL(p_t ‖ p_s), p = softmax(logits / T) over the last dimension; 0 for no rows."""
    if student_logits.numel() == 0:
        return student_logits.sum() * 0.0  # a zero that keeps the graph
    log_p_s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_p_t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    kl = (log_p_t.exp() * (log_p_t - log_p_s)).sum(-1)  # Σ_v p_t (log p_t − log p_s), one per row
    return temperature ** 2 * kl.mean()


def cosine_distance(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """mean over the kept tokens of 1 − cos(h_s, h_t); `keep` (B, T) is the attention mask."""
    rows = keep.bool()
    cos = F.cosine_similarity(student_hidden[rows].float(), teacher_hidden[rows].float(), dim=-1)  # (N,)
    return (1.0 - cos).mean() if cos.numel() else student_hidden.sum() * 0.0


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


# ---------------------------------------------------------------------------------------------- teachers
def load_mlm_teacher(path: str | Path) -> BertPreTrainedModel:
    """A pre-trained teacher with its MLM head: BertForPreTraining when it has the NSP head too, else
    BertForMaskedLM. A folder without `cls.predictions.*` (a bare encoder, a fine-tuned model) is an error."""
    folder = Path(path)
    if not folder.is_dir():
        raise ConfigError(f"--teacher {path}: no such model folder")
    config = BertConfig.from_json_file(folder)
    state = read_state_dict(folder)
    keys = {canonical_key(k) for k in state}
    if "cls.predictions.transform.dense.weight" not in keys:
        raise ConfigError(f"{folder}: the teacher has no masked-LM head (cls.predictions.*); general distillation "
                          "needs a pre-trained model with it (bertlab pretrain's RUN_DIR/final, or a "
                          "BertForPreTraining / BertForMaskedLM folder)")
    cls = BertForPreTraining if "cls.seq_relationship.weight" in keys else BertForMaskedLM
    model = cls(config)
    load_state_dict_into(model, state, str(folder)).log(str(folder))
    return model.eval()


def load_task_teacher(spec, path: str | Path) -> BertPreTrainedModel:
    """The teacher fine-tuned on `spec`'s task, with its trained head; a missing head is an error, not a
    fresh initialisation."""
    folder = Path(path)
    if not folder.is_dir():
        raise ConfigError(f"--teacher {path}: no such model folder")
    config = BertConfig.from_json_file(folder)
    if spec.num_labels is not None and config.id2label is not None and len(config.id2label) != spec.num_labels:
        raise ConfigError(f"{folder}: the teacher's head has {len(config.id2label)} labels, task {spec.name} "
                          f"needs {spec.num_labels}; give a teacher fine-tuned on {spec.name}")
    tuned_on = config.extra.get("finetuning_task")
    if tuned_on is not None and str(tuned_on).lower().replace("-", "") != spec.name:
        log.warning("%s: the teacher was fine-tuned on %r, distilling task %r", folder, tuned_on, spec.name)
    model, report = spec.build_model(folder, return_report=True)
    if report.initialized:  # only head (and pooler) weights can be missing: the loader rejects a partial encoder
        raise ConfigError(f"{folder}: the teacher has no trained {spec.head.__name__} head for {spec.name} "
                          f"(missing {', '.join(report.initialized)}); give a model fine-tuned on it (bertlab "
                          "finetune's OUT_DIR/model)")
    return model.eval()


# ---------------------------------------------------------------------------------------------- shared steps
def _freeze_unused(student: nn.Module, prefixes: tuple[str, ...]) -> None:
    """Parameters the objective gives no gradient (the pooler and NSP head in MLM distillation) are frozen:
    kept as they are (copied from the teacher when the student was cut from it), out of the optimizer, and
    no `find_unused_parameters` needed under DDP."""
    for name, p in student.named_parameters():
        if name.startswith(prefixes):
            p.requires_grad_(False)


def _make_trainer(cfg: DistillConfig, distiller: _Distiller, batches, steps: int, accum: int, precision: str,
                  evaluate, eval_every: int | None, save_every: int | None, resolved: dict[str, Any]) -> Trainer:
    """The loop configured for `cfg`, resumed from the last checkpoint on `cfg.resume`; rank 0 writes
    OUT/run_config.json (the config plus `resolved`), and checkpoints carry the same record."""
    record = run_record(cfg, resolved)
    optimizer = adamw(distiller, lr=cfg.resolved("lr"), weight_decay=cfg.weight_decay)
    warmup = cfg.resolved("warmup")
    scheduler = linear_warmup_decay(optimizer, warmup if warmup < 1 else int(warmup), steps)
    loop = LoopConfig(max_steps=steps, out_dir=cfg.out, grad_accum=accum, precision=precision,
                      max_grad_norm=cfg.max_grad_norm, log_every=cfg.log_every, eval_every=eval_every,
                      save_every=save_every, keep_last=cfg.keep_last,
                      time_budget=parse_duration(cfg.time_budget) if cfg.time_budget else None,
                      seed=cfg.seed, progress=cfg.progress,
                      retain_freed_memory=cfg.retain_freed_memory, tensorboard=False)
    trainer = Trainer(distiller, optimizer, scheduler, lambda model, batch: model(batch), batches, loop,
                      evaluate=evaluate, extra_state={"run_config": record})
    if cfg.resume:
        resume_from = latest_checkpoint(cfg.out)
        if resume_from is None:
            raise BertlabError(f"{cfg.out}: no checkpoint to resume from")
        trainer.load_checkpoint(resume_from)  # a corrupt checkpoint is reported here, before any step
    if trainer.dist.is_main:
        write_run_config(cfg.out, record)
    return trainer


# ---------------------------------------------------------------------------------------------- general
def run_general(cfg: DistillConfig, echo: Callable[[str], None] = print) -> DistillResult:
    """General distillation on `bertlab prepare` data (see the module docstring)."""
    from ..data import DataInfo, PretrainingDataset
    from .pretrain import check_same_vocabulary, evaluate_pretraining, export_final, heldout_batches

    objective = get_objective(GENERAL_OBJECTIVE)

    dist = init_distributed(None if cfg.device == "auto" else cfg.device)
    say = echo if dist.is_main else (lambda s: None)
    if dist.is_main:
        check_writable(cfg.out)

    # ---- teacher, data, student: every mismatch reported before the first step
    teacher = load_mlm_teacher(cfg.teacher)
    info = DataInfo.load(cfg.data, max_seq_length=cfg.seq_len)
    if info.max_seq_length != cfg.seq_len:
        raise ConfigError(f"{cfg.data}: no instances of length {cfg.seq_len} (found {info.max_seq_length}); "
                          f"pass --seq-len {info.max_seq_length} or prepare that length")
    if teacher.config.vocab_size != info.vocab_size:
        raise ConfigError(f"{cfg.teacher}: the teacher's vocabulary has {teacher.config.vocab_size} tokens, "
                          f"{cfg.data} was prepared with {info.vocab_size} ({info.vocab_file})")
    check_same_vocabulary(cfg.teacher, info)
    if cfg.seq_len > teacher.config.max_position_embeddings:
        raise ConfigError(f"sequence length {cfg.seq_len} exceeds the teacher's max_position_embeddings "
                          f"({teacher.config.max_position_embeddings})")
    seed_everything(cfg.seed)  # a fresh student's weights and the projection are drawn from this seed
    student, init = build_student(cfg.student, teacher, cfg.teacher, random_init=cfg.init == "random")
    if cfg.seq_len > student.config.max_position_embeddings:
        raise ConfigError(f"sequence length {cfg.seq_len} exceeds the student's max_position_embeddings "
                          f"({student.config.max_position_embeddings})")
    _freeze_unused(student, ("bert.pooler.", "cls.seq_relationship."))
    L_s, L_t = student.config.num_hidden_layers, teacher.config.num_hidden_layers
    layer_map = hidden_layer_map(init, L_s, L_t) if cfg.cosine_layers == "all" else [(L_s, L_t)]
    distiller = MLMDistiller(student, teacher, cfg.temperature, cfg.resolved("alpha"), cfg.resolved("beta"),
                             cfg.resolved("gamma"), layer_map, kl_positions=cfg.kl_positions)
    distiller.to(dist.device).train()
    teacher.to(dist.device)
    precision = resolve_precision(cfg.precision, dist.device)

    micro, accum = split_batch(cfg.resolved("batch_size"), cfg.micro_batch_size, dist.world_size)
    samples_per_step = micro * accum * dist.world_size

    def stream(start_sample: int):
        ds = PretrainingDataset(cfg.data, "train", seed=cfg.seed, rank=dist.rank, world_size=dist.world_size,
                                start_index=start_sample, batch_size=micro, max_seq_length=cfg.seq_len)
        return ds.dataloader(num_workers=cfg.num_workers, pin_memory=dist.device.type == "cuda")

    def batches(step: int):  # seeks to the sample the step starts at: exact resume, no replay
        return stream(step * samples_per_step)

    stream(0)  # open the training split now: a bad data directory is reported before training
    has_heldout = info.num_instances.get("heldout", 0) > 0

    def held_out(model: nn.Module) -> dict[str, float]:
        batches = heldout_batches(cfg.data, cfg.seq_len, cfg.seed, cfg.eval_batch_size, cfg.eval_batches)
        return evaluate_pretraining(model, batches, dist.device, objective)

    # ---- run length: given, or fitted to the time budget by timing real steps
    steps = (resolved_settings(cfg.out) if cfg.resume else {}).get("steps") or cfg.steps
    if steps is None:
        per_step = time_step(distiller, lambda m, b: m(b), stream(0), accum, precision, dist.device)
        # Held-out evaluations (GENERAL_EVALS by default, and the teacher's once) come out of the budget too.
        eval_seqs = heldout_sequences(info.num_instances.get("heldout", 0), cfg.eval_batches, cfg.eval_batch_size)
        eval_s = eval_seconds(eval_seqs, samples_per_step, per_step)
        steps = fit_steps_to_budget(parse_duration(cfg.time_budget), per_step, eval_s, GENERAL_EVALS, cfg.eval_every,
                                    dist)
        say(f"time budget {cfg.time_budget}: {per_step:.2f}s per step -> {steps} steps")
    eval_every = cfg.eval_every or max(1, steps // GENERAL_EVALS)
    save_every = cfg.save_every or max(1, steps // 10)
    resolved = {"steps": steps, "precision": precision, "grad_accum": accum, "micro_batch_size": micro,
                "world_size": dist.world_size, "alpha": distiller.alpha, "beta": distiller.beta,
                "gamma": distiller.gamma, "lr": cfg.resolved("lr"), "warmup": cfg.resolved("warmup"),
                "student_init": init.to_json(), "layer_map": layer_map,
                "student_config": student.config.to_dict()}
    trainer = _make_trainer(cfg, distiller, batches, steps, accum, precision,
                            (lambda m: held_out(m.student)) if has_heldout else None, eval_every, save_every, resolved)
    n_t, n_s = teacher.num_parameters(), student.num_parameters()
    say(f"distilling {cfg.teacher} ({L_t} layers, {n_t / 1e6:.1f}M parameters) into {type(student).__name__} "
        f"from {cfg.student} ({L_s} layers, {n_s / 1e6:.1f}M): {steps} steps x {cfg.resolved('batch_size')} "
        f"sequences of {cfg.seq_len}, loss {distiller.alpha:g}·T²·KL + {distiller.beta:g}·MLM + "
        f"{distiller.gamma:g}·cos, T={cfg.temperature:g}, {precision}, {dist.world_size} process(es)")

    teacher_eval: dict[str, float] = {}
    if has_heldout and cfg.eval_teacher and dist.is_main and not cfg.resume:
        with torch.no_grad():
            teacher_eval = held_out(teacher)
        say("teacher held-out: " + "  ".join(f"{k} {v:.4f}" for k, v in teacher_eval.items()))
    result = trainer.fit()

    final_dir = None
    if result.stopped in ("max_steps", "time_budget", "data_exhausted") and dist.is_main:
        final_dir = export_final(student, Path(cfg.out) / FINAL_DIR, info)
        say(f"saved the student in Hugging Face layout to {final_dir}")
    if dist.world_size > 1:
        torch.distributed.barrier()
    return DistillResult(Path(cfg.out), final_dir, result, result.eval_metrics, teacher_eval, n_t, n_s, cfg)


# ---------------------------------------------------------------------------------------------- task-specific
@torch.no_grad()
def soft_labels(spec, teacher: nn.Module, features: list[dict], batch_size: int, device: torch.device,
                autocast_dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """The teacher's logits for every feature, computed once, in batches of similar length (little padding):
    (K,) per example for classification, (T_i, K) per token, (T_i, 2) start/end for QA; float32, on the CPU."""
    from ..tasks.base import batches as task_batches
    from ..tasks.base import feature_length

    order = sorted(range(len(features)), key=lambda i: feature_length(features[i]))
    out: list[torch.Tensor | None] = [None] * len(features)
    teacher.eval()
    with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
        for batch in task_batches(spec, features, batch_size, device, order):
            logits = spec.head.head_spec.logits(teacher(**spec.model_inputs(batch))).float().cpu()
            for row, i in enumerate(batch["feature_index"].tolist()):
                n = feature_length(features[i])
                out[i] = logits[row] if logits.dim() == 2 else logits[row, :n].clone()
    return out  # type: ignore[return-value]


def _with_soft_labels(collate):
    """The task's collate plus `teacher_logits`, padded along tokens like the inputs (padding is masked later),
    and `gold` (1 labelled, 0 transfer example) when the data has a transfer set."""
    def collate_fn(features):
        batch = collate(features)
        if "teacher_logits" in features[0]:
            batch["teacher_logits"] = nn.utils.rnn.pad_sequence([f["teacher_logits"] for f in features],
                                                                batch_first=True)
        if "gold" in features[0]:
            batch["gold"] = torch.tensor([f["gold"] for f in features], dtype=torch.float32)
        return batch
    return collate_fn


def transfer_examples(spec, cfg: DistillConfig, labelled_examples) -> list:
    """`cfg.transfer_limit` training examples outside the labelled subset, a seeded random choice."""
    from .finetune import subset

    if soft_target(spec) not in ("classes", "regression"):
        raise ConfigError(f"transfer_limit: available for sentence-level tasks (GLUE, SWAG), not {spec.name}")
    labelled = {e.guid for e in labelled_examples}
    rest = [e for e in spec.read(cfg.data, "train") if e.guid not in labelled]
    if cfg.transfer_limit > len(rest):
        raise ConfigError(f"transfer_limit {cfg.transfer_limit}: only {len(rest)} training examples are left "
                          f"outside the {len(labelled)} labelled ones")
    return subset(rest, cfg.transfer_limit, seed=1)  # seed 1: independent of the labelled subset's 0


def unlabelled_features(spec, examples, tokenizer, max_length: int) -> list[dict]:
    """Features of transfer examples: labels replaced by 0 and `gold` = 0, so nothing of the gold label is
    left; the teacher's soft labels are their only target."""
    blank = 0.0 if spec.is_regression else 0
    return [{**f, "labels": blank, "gold": 0.0} for f in spec.featurize(examples, tokenizer, max_length, train=True)]


def run_task(cfg: DistillConfig, echo: Callable[[str], None] = print) -> DistillResult:
    """Task-specific distillation (see the module docstring)."""
    from ..tasks import TASKS, evaluate
    from ..tokenizer import BertTokenizer
    from .finetune import load_task_data, save_model

    spec = TASKS[cfg.task]
    dist = init_distributed(None if cfg.device == "auto" else cfg.device)
    say = echo if dist.is_main else (lambda s: None)
    out = Path(cfg.out)
    if dist.is_main:
        check_writable(out)
    alpha, beta, gamma = (cfg.resolved(k) for k in ("alpha", "beta", "gamma"))
    needs_teacher = alpha > 0 or gamma > 0

    # ---- teacher, student, data: every mismatch reported before the first step
    teacher = load_task_teacher(spec, cfg.teacher)
    tokenizer = BertTokenizer.from_pretrained(cfg.teacher)
    if len(tokenizer.vocab) != teacher.config.vocab_size:
        raise ConfigError(f"{cfg.teacher}: vocab.txt has {len(tokenizer.vocab)} tokens, the model "
                          f"{teacher.config.vocab_size}")
    seed_everything(cfg.seed)
    overrides = {"id2label": spec.id2label} if spec.id2label is not None else {}  # for a fresh or loaded student
    student, init = build_student(cfg.student, teacher, cfg.teacher, model_cls=spec.head,
                                  random_init=cfg.init == "random", **overrides)
    student.config.extra["finetuning_task"] = spec.name
    L_s, L_t = student.config.num_hidden_layers, teacher.config.num_hidden_layers
    layer_map = hidden_layer_map(init, L_s, L_t) if cfg.cosine_layers == "all" else [(L_s, L_t)]
    max_length = cfg.max_seq_length or spec.default_max_length
    for who, model in (("teacher", teacher), ("student", student)):
        if max_length > model.config.max_position_embeddings:
            raise ConfigError(f"max sequence length {max_length} exceeds the {who}'s max_position_embeddings "
                              f"({model.config.max_position_embeddings})")
    data = load_task_data(spec, cfg.data, tokenizer, max_length, cfg.train_limit, cfg.eval_limit)
    precision = resolve_precision(cfg.precision, dist.device)
    amp_dtype = autocast_dtype(precision)
    teacher.to(dist.device)

    teacher_eval: dict[str, dict[str, float]] = {}
    if cfg.eval_teacher and dist.is_main and not cfg.resume:
        teacher_eval = {split: evaluate(spec, teacher, tokenizer, data.eval_examples[split], split,
                                        max_length=max_length, batch_size=cfg.eval_batch_size, device=dist.device,
                                        autocast_dtype=amp_dtype, features=data.eval_features[split])
                        for split in spec.eval_splits}
        say(f"teacher dev: {json.dumps(teacher_eval)}")
    features = data.train_features
    transfer: list[dict] = []
    if cfg.transfer_limit:
        transfer = unlabelled_features(spec, transfer_examples(spec, cfg, data.train_examples), tokenizer, max_length)
        features = [{**f, "gold": 1.0} for f in features] + transfer
    if alpha > 0 and gamma == 0:  # soft labels once (see the module docstring); with γ > 0 the teacher runs live
        logits = soft_labels(spec, teacher, features, cfg.eval_batch_size, dist.device, amp_dtype)
        features = [{**f, "teacher_logits": t} for f, t in zip(features, logits)]
    distiller = TaskDistiller(student, teacher if needs_teacher else None, cfg.temperature, alpha, beta, gamma,
                              layer_map, spec=spec)
    distiller.to(dist.device).train()

    micro, accum = split_batch(cfg.resolved("batch_size"), cfg.micro_batch_size, dist.world_size)
    steps = cfg.steps or steps_for_epochs(cfg.epochs, len(features), micro, accum, dist.world_size)
    collate = _with_soft_labels(spec.collate)

    def batches(step: int):  # seekable: epoch e's order depends on (seed, e) only
        return shuffled_batches(features, micro, collate_fn=collate, seed=cfg.seed, start=step * accum,
                                rank=dist.rank, world_size=dist.world_size)

    dev = spec.eval_splits[0]

    def score_dev(m: nn.Module) -> dict[str, float]:
        return evaluate(spec, m.student, tokenizer, data.eval_examples[dev], dev, max_length=max_length,
                        batch_size=cfg.eval_batch_size, device=dist.device, features=data.eval_features[dev])

    resolved = {"steps": steps, "precision": precision, "grad_accum": accum, "micro_batch_size": micro,
                "world_size": dist.world_size, "alpha": alpha, "beta": beta, "gamma": gamma,
                "lr": cfg.resolved("lr"), "warmup": cfg.resolved("warmup"), "student_init": init.to_json(),
                "layer_map": layer_map, "train_examples": len(data.train_examples), "transfer_examples": len(transfer),
                "train_features": len(features)}
    trainer = _make_trainer(cfg, distiller, batches, steps, accum, precision, score_dev if cfg.eval_every else None,
                            cfg.eval_every, cfg.save_every, resolved)
    record = run_record(cfg, resolved)
    n_t, n_s = teacher.num_parameters(), student.num_parameters()
    say(f"distilling {spec.name}: teacher {cfg.teacher} ({L_t} layers, {n_t / 1e6:.1f}M parameters) -> student "
        f"{cfg.student} ({L_s} layers, {n_s / 1e6:.1f}M); {len(data.train_examples)} examples"
        + (f" + {len(transfer)} without labels" if transfer else "") + f", {steps} steps x "
        f"{cfg.resolved('batch_size')}, loss {alpha:g}·soft + {beta:g}·gold + {gamma:g}·cos, T={cfg.temperature:g}, "
        f"{precision}")
    result = trainer.fit()

    model_dir, scores = None, {}
    if result.stopped in ("max_steps", "time_budget", "data_exhausted") and dist.is_main:
        student.eval()
        scores = {split: evaluate(spec, student, tokenizer, data.eval_examples[split], split, max_length=max_length,
                                  batch_size=cfg.eval_batch_size, out_dir=out, device=dist.device,
                                  autocast_dtype=amp_dtype, features=data.eval_features[split])
                  for split in spec.eval_splits}
        model_dir = save_model(student, out / MODEL_DIR, tokenizer)
        metrics = {"task": spec.name, "main_metric": spec.main_metric, "student_init": resolved["student_init"],
                   "dev": scores, "teacher_dev": teacher_eval,
                   "parameters": {"teacher": n_t, "student": n_s}, "layers": {"teacher": L_t, "student": L_s},
                   "steps": result.step, "train_seconds": round(result.elapsed, 1),
                   "train_loss": result.metrics.get("loss"), "config": record}
        if cfg.resume and (out / "metrics.json").is_file():  # keep the first session's teacher scores
            metrics["teacher_dev"] = json.loads((out / "metrics.json").read_text()).get("teacher_dev", {}) \
                or teacher_eval
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        say(f"student dev: {json.dumps(scores)}; model: {model_dir}")
        if not cfg.save_every:
            # As with fine-tuning: the training state (3x the student) is only for resuming an interrupted run;
            # a finished one is OUT_DIR/model. Kept when checkpoints were asked for (--save-every).
            shutil.rmtree(out / CHECKPOINT_DIR, ignore_errors=True)
    if dist.world_size > 1:
        torch.distributed.barrier()
    return DistillResult(out, model_dir, result, scores, teacher_eval, n_t, n_s, cfg)


# ---------------------------------------------------------------------------------------------- entry point
def run_distillation(cfg: DistillConfig, echo: Callable[[str], None] = print) -> DistillResult:
    """General distillation, or task-specific when `cfg.task` is set."""
    if cfg.resume and not cfg.out:
        raise ConfigError("distill: --resume needs the run directory (--out DIR)")
    cfg = resolve_resume_config(DistillConfig, cfg, Path(cfg.out) / RUN_CONFIG, RESUME_MAY_CHANGE)
    cfg.validate()
    if not cfg.resume and latest_checkpoint(cfg.out) is not None:  # before loading anything
        raise BertlabError(f"{cfg.out}: already holds checkpoints; pass --resume to continue it, or choose "
                           "another --out")
    result = run_task(cfg, echo) if cfg.task else run_general(cfg, echo)
    if cfg.student_layout == "distilbert" and result.model_dir is not None:  # the main process saved one
        from ..models.distilbert.convert import write_distilbert

        write_distilbert(result.model_dir)  # in place: models/distilbert/convert.py
    return result


__all__ = ["DistillConfig", "DistillResult", "MLMDistiller", "TaskDistiller", "cosine_distance", "distillation_kl",
           "load_mlm_teacher", "load_task_teacher", "run_distillation", "run_general", "run_task", "soft_labels"]
