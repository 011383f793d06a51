"""Moved: distillation is the package `bertlab.train.distillation` -- its settings (`config`), loss terms
(`losses`), the modules that compute a recipe's loss (`distillers`), teachers, and the two recipes
(`general`, `task`). This import path is kept for code written against earlier releases."""

from .distillation import run_distillation  # noqa: F401
from .distillation.config import (COSINE_LAYERS, GENERAL_DEFAULTS, GENERAL_EVALS, GENERAL_OBJECTIVE,  # noqa: F401
                                  KL_POSITIONS, MODEL_DIR, RESUME_MAY_CHANGE, TASK_DEFAULTS, DistillConfig,
                                  DistillResult, DistillRunOptions)
from .distillation.distillers import MLMDistiller, TaskDistiller, _Distiller, layer_outputs, soft_target  # noqa: F401
from .distillation.general import run_general  # noqa: F401
from .distillation.losses import MASKED_LOGIT, cosine_distance, distillation_kl  # noqa: F401
from .distillation.task import (_with_soft_labels, run_task, soft_labels, transfer_examples,  # noqa: F401
                                unlabelled_features)
from .distillation.teachers import load_mlm_teacher, load_task_teacher  # noqa: F401
from .distillation.trainer import freeze_unused as _freeze_unused, make_trainer as _make_trainer  # noqa: F401

__all__ = ["DistillConfig", "DistillResult", "MLMDistiller", "TaskDistiller", "cosine_distance", "distillation_kl",
           "load_mlm_teacher", "load_task_teacher", "run_distillation", "run_general", "run_task", "soft_labels"]
