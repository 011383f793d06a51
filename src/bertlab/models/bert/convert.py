"""Google's BERT checkpoints <-> bertlab: conversion both ways, on the variable-name map of `tf_names.py`
(TensorFlow scopes such as `bert/encoder/layer_3/attention/self/query/kernel` <-> Hugging Face's module paths,
dense kernels transposed, optimizer state skipped). The MLM decoder has no variable of its own: it is the
word-embedding matrix (tied) in both worlds. Which head a checkpoint holds is asked of the head registry.

Two ways in: `read_tf_state_dict` (what `from_pretrained` uses for a folder holding `bert_model.ckpt.index`:
every tensor in memory, like any state dict) and `convert_tf_to_hf` (the `bertlab convert` command: keys and
shapes are checked against the model before a byte is read, then tensors are read and copied into the model
one at a time, so peak memory is the model plus its largest tensor). One way out: `export_tf_checkpoint`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from ...checkpoint.hf_layout import (CONFIG_NAME, LoadReport, canonical_key, initialize_missing, load_state_dict_into,
                                    materialize, model_keys, model_state_dict, read_state_dict)
from ...checkpoint.pretrained import save_pretrained
from .config import BertConfig
from ...core.errors import CheckpointError
from ...core.fsio import atomic_directory
from .heads import HEADS, model_classes
from .modeling import BertModel, BertPreTrainedModel
from ...tokenizer.base import VOCAB_NAME
from ...tf_checkpoint import DEFAULT_PREFIX, TFCheckpointReader, resolve_prefix, write_tf_checkpoint
from .tf_names import (TF_HEAD_NAMES_BACK, is_optimizer_state, read_tf_state_dict, tf_meta_state, tf_plan,
                       tf_to_hf_name, tf_to_torch)

log = logging.getLogger(__name__)

TF_CONFIG_NAME = "bert_config.json"


def hf_to_tf_name(key: str) -> tuple[str, bool]:
    """(TensorFlow variable name, transpose?) for a bertlab / Hugging Face parameter name; the inverse of
    `tf_to_hf_name`. Raises CheckpointError for a name Google's layout has no place for."""
    name = canonical_key(key)  # encoder keys bare, gamma/beta spelled weight/bias
    if name in TF_HEAD_NAMES_BACK:
        return TF_HEAD_NAMES_BACK[name], False
    if name.startswith(("embeddings.", "encoder.", "pooler.")):
        name = "bert." + name
    module, _, leaf = name.rpartition(".")
    scope = re.sub(r"\.layer\.(\d+)\.", r".layer_\1.", module + ".").rstrip(".").replace(".", "/")
    if module.endswith("_embeddings") and leaf == "weight":
        tf_name, transpose = scope, False
    elif module.endswith("LayerNorm") and leaf in ("weight", "bias"):
        tf_name, transpose = f"{scope}/{'gamma' if leaf == 'weight' else 'beta'}", False
    else:
        tf_name, transpose = f"{scope}/{'kernel' if leaf == 'weight' else leaf}", leaf == "weight"
    back = tf_to_hf_name(tf_name)
    if back is None or canonical_key(back[0]) != canonical_key(key):
        raise CheckpointError(f"parameter {key!r} has no counterpart in Google's TensorFlow variable layout")
    return tf_name, transpose


def infer_model_class(names) -> type[BertPreTrainedModel]:
    """The bertlab class whose heads a checkpoint holds (Hugging Face-style names, `bert.` prefix or not): the
    first registered head whose weights are there and tell it apart, else the bare encoder."""
    names = {canonical_key(n) for n in names}
    for head in HEADS.values():
        if head.detectable and any(n.startswith(head.prefix) for n in names):
            return head.model_class
    return BertModel


def load_tf_weights(model_class: type[BertPreTrainedModel], config: BertConfig, path: str | os.PathLike,
                    ) -> tuple[BertPreTrainedModel, LoadReport, list[str]]:
    """Build `model_class(config)` and fill it from a TensorFlow checkpoint, one tensor at a time.

    The model is first built on the meta device (shapes, no storage), where `load_state_dict_into` checks keys
    and shapes with its usual rules and messages -- so a checkpoint that does not fit fails before anything is
    read or allocated. Only then does it get storage; the parameters the checkpoint lacks (reported as
    initialised) get Google's initialisation, every other one is overwritten straight from the file. Skipping
    the random initialisation of weights about to be overwritten matters: for BERT-base it costs more time than
    the rest of the conversion. Returns the model, the load report and the skipped optimizer tensors' names."""
    with TFCheckpointReader(path) as reader:
        source = str(reader.prefix)
        plan, skipped = tf_plan(reader)
        with torch.device("meta"):
            model = model_class(config)
        report = load_state_dict_into(model, tf_meta_state(reader, plan), source)
        materialize(model)
        initialize_missing(model, report)
        own = model_keys(model)
        state = model.state_dict()
        with torch.no_grad():
            for hf_name, (tf_name, transpose) in plan.items():
                key = own.get(canonical_key(hf_name))
                if key is None:  # reported as unused above
                    continue
                tensor = tf_to_torch(reader.read(tf_name), tf_name, source)
                state[key].copy_(tensor.T if transpose else tensor)
                del tensor  # only one checkpoint tensor alive at a time
    report.log(source)
    model.eval()
    return model, report, skipped


def find_beside(prefix: Path, names: tuple[str, ...]) -> Path | None:
    folder = prefix.parent
    return next((folder / n for n in names if (folder / n).is_file()), None)


def convert_tf_to_hf(tf_path: str | os.PathLike, out: str | os.PathLike, config: str | os.PathLike | None = None,
                     vocab: str | os.PathLike | None = None, model_class: str | None = None) -> dict:
    """Google's checkpoint (+ bert_config.json, vocab.txt) -> a Hugging Face-layout folder `out`.

    `config`/`vocab` default to the files beside the checkpoint. The model class follows the heads found
    (pre-training, MLM, SQuAD, classifier, or the bare encoder) unless `model_class` names one; a classifier's
    label count comes from its `output_weights` when the config does not give one. Returns a summary."""
    prefix = resolve_prefix(tf_path)
    config_path = Path(config) if config else find_beside(prefix, (TF_CONFIG_NAME, CONFIG_NAME))
    if config_path is None:
        raise CheckpointError(f"{prefix}: no {TF_CONFIG_NAME} beside the checkpoint; pass --config")
    cfg = BertConfig.from_json_file(config_path)
    vocab_path = Path(vocab) if vocab else find_beside(prefix, (VOCAB_NAME,))
    if vocab_path is not None and not vocab_path.is_file():
        raise CheckpointError(f"{vocab_path}: no such vocabulary file")
    with TFCheckpointReader(prefix) as reader:
        names = [m[0] for m in map(tf_to_hf_name, reader.names()) if m is not None]
        if "output_weights" in reader and not cfg.id2label:
            n = reader.entries["output_weights"].shape[0]
            cfg = cfg.replace(id2label={i: f"LABEL_{i}" for i in range(n)})
        data_bytes = reader.data_bytes
    classes = model_classes()
    if model_class is None:
        cls = infer_model_class(names)
    elif model_class in classes:
        cls = classes[model_class]
    else:
        raise CheckpointError(f"unknown model class {model_class!r}; expected one of {', '.join(classes)}")
    model, report, skipped = load_tf_weights(cls, cfg, prefix)
    save_pretrained(model, out, vocab_file=vocab_path)
    return {"source": str(prefix), "out": str(out), "model_class": cls.__name__,
            "parameters": model.num_parameters(), "checkpoint_bytes": data_bytes,
            "skipped_optimizer_tensors": len(skipped), "initialized": report.initialized, "unused": report.unused}


# ---------------------------------------------------------------------------------------------- bertlab -> TF
def google_config(config: BertConfig) -> dict:
    """The fields of Google's bert_config.json (the model's hyper-parameters, nothing of Hugging Face's)."""
    keys = ("attention_probs_dropout_prob", "hidden_act", "hidden_dropout_prob", "hidden_size", "initializer_range",
            "intermediate_size", "max_position_embeddings", "num_attention_heads", "num_hidden_layers",
            "type_vocab_size", "vocab_size")
    data = config.to_dict()
    return {k: data[k] for k in keys}


def export_tf_checkpoint(hf_path: str | os.PathLike, out: str | os.PathLike, vocab: str | os.PathLike | None = None,
                         config: str | os.PathLike | None = None) -> dict:
    """A Hugging Face-layout folder -> `out/bert_model.ckpt.{index,data-00000-of-00001}` + bert_config.json
    (+ vocab.txt): what Google's `modeling.py` / `run_classifier.py --init_checkpoint` read."""
    src = Path(hf_path)
    cfg = BertConfig.from_json_file(config or src)
    state = model_state_dict(BertPreTrainedModel, read_state_dict(src), str(src))
    state.pop("cls.predictions.decoder.weight", None)  # tied to the word embeddings; Google stores it once
    architectures = cfg.extra.get("architectures") or []
    cls = model_classes().get(architectures[0]) if architectures else None
    cls = cls or infer_model_class(state)
    with torch.device("meta"):
        probe = cls(cfg)
    load_state_dict_into(probe, {k: torch.empty(v.shape, device="meta") for k, v in state.items()}, str(src))
    del probe
    names = {k: hf_to_tf_name(k) for k in state}
    vocab_path = Path(vocab) if vocab else (src / VOCAB_NAME if (src / VOCAB_NAME).is_file() else None)
    bf16 = [names[k][0] for k, v in state.items() if v.dtype == torch.bfloat16]

    def tensors() -> Iterator[tuple[str, np.ndarray]]:
        for key in sorted(state, key=lambda k: names[k][0]):
            tf_name, transpose = names[key]
            t = state[key].detach()
            if t.dtype == torch.bfloat16:
                t = t.float()
            yield tf_name, np.ascontiguousarray((t.T if transpose else t).numpy())

    with atomic_directory(out) as tmp:
        write_tf_checkpoint(tmp / DEFAULT_PREFIX, tensors(), bfloat16=bf16)
        (tmp / TF_CONFIG_NAME).write_text(json.dumps(google_config(cfg), indent=2, sort_keys=True) + "\n",
                                          encoding="utf-8")
        if vocab_path is not None:
            shutil.copyfile(vocab_path, tmp / VOCAB_NAME)
    return {"source": str(src), "out": str(Path(out) / DEFAULT_PREFIX), "model_class": cls.__name__,
            "tensors": len(state)}


__all__ = ["tf_to_hf_name", "hf_to_tf_name", "is_optimizer_state", "infer_model_class", "read_tf_state_dict",
           "load_tf_weights", "convert_tf_to_hf", "export_tf_checkpoint", "google_config"]
