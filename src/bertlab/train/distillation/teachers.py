"""Distillation's teachers, loaded with the head their recipe needs: the MLM head (general distillation) or
the head fine-tuned on the task; a missing head is an error, never a fresh initialisation."""

from __future__ import annotations

import logging
from pathlib import Path

from ...checkpoint.hf_layout import canonical_key, load_state_dict_into, read_state_dict
from ...core.errors import ConfigError
from ...models.bert.config import BertConfig
from ...models.bert.heads import BertForMaskedLM, BertForPreTraining
from ...models.bert.modeling import BertPreTrainedModel

log = logging.getLogger(__name__)


def load_mlm_teacher(path: str | Path) -> BertPreTrainedModel:
    """A pre-trained teacher with its MLM head: BertForPreTraining when it has the NSP head too, else
    BertForMaskedLM. A folder without `cls.predictions.*` (a bare encoder, a fine-tuned model) is an error."""
    folder = Path(path)
    if not folder.is_dir():
        raise ConfigError(f"--teacher {path}: no such model folder")
    config = BertConfig.from_json_file(folder)
    state = read_state_dict(folder, BertPreTrainedModel.read_tf_checkpoint)
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



__all__ = ["load_mlm_teacher", "load_task_teacher"]
