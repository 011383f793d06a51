"""Distillation (Hinton et al., 2015; DistilBERT, Sanh et al., 2019): a smaller student trained to match a
trained teacher, on the one training loop (`loop.Trainer`) -- resume, torchrun, bf16, logs are the loop's.

    config.py      DistillConfig: the settings, the two recipes' defaults, DistillResult
    losses.py      the loss terms: soft-target KL at temperature T, hidden-state cosine distance
    distillers.py  the modules the loop trains, whose forward is a recipe's loss: MLMDistiller, TaskDistiller
    teachers.py    the teacher with its MLM head, or with the head fine-tuned on the task
    trainer.py     what both recipes set up alike: frozen parameters, the loop, resume
    general.py     general distillation (`run_general`)
    task.py        task-specific distillation (`run_task`, soft labels, the transfer set)
    students       the student's layout (every other layer, ... : DistilBERT's) is `bertlab.train.students`

General distillation -- `bertlab distill --teacher DIR --student S --data DATA_DIR --out RUN_DIR`, on the
masked-LM data of `bertlab prepare`, the teacher a pre-trained model with its MLM head:

    loss = α · T² · KL(p_t ‖ p_s)           p = softmax(MLM logits / T), at the masked positions
         + β · CE(student MLM logits, the masked tokens)
         + γ · mean over tokens of (1 − cos(W h_s, h_t))     last hidden states, padding excluded;
                                             W = identity when the widths match, else a learned
                                             projection (trained with the student, not exported)
    defaults T = 2, α = 5, β = 2, γ = 1 (DistilBERT's)

  The soft term. Written as KL(student ‖ teacher) in some accounts; as in Hinton et al. and DistilBERT's code
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

from collections.abc import Callable
from pathlib import Path

from ...core.errors import BertlabError, ConfigError
from ...models.registry import DEFAULT_MODEL_TYPE, family
from ..run_dir import latest_checkpoint
from ..run_record import RUN_CONFIG, resolve_resume_config
from .config import RESUME_MAY_CHANGE, DistillConfig, DistillResult
from .distillers import MLMDistiller, TaskDistiller
from .general import run_general
from .losses import cosine_distance, distillation_kl
from .task import run_task, soft_labels
from .teachers import load_mlm_teacher, load_task_teacher


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
    if cfg.student_layout != DEFAULT_MODEL_TYPE and result.model_dir is not None:  # the main process saved one
        layout = family(cfg.student_layout)
        if layout.student_writer is None:
            raise ConfigError(f"student_layout {cfg.student_layout}: {layout.name} has no student writer")
        layout.student_writer(result.model_dir)  # in place: DistilBERT's models/distilbert/convert.py
    return result




__all__ = ["DistillConfig", "DistillResult", "MLMDistiller", "TaskDistiller", "cosine_distance", "distillation_kl",
           "load_mlm_teacher", "load_task_teacher", "run_distillation", "run_general", "run_task", "soft_labels"]
