"""PEFT's adapter folders: an unmerged LoRA fine-tuning saved as PEFT saves one, and PEFT's LoRA adapters
loaded onto their base model (read and built through the Hugging Face layout's own code, `hf_layout.py`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from ..core.errors import CheckpointError, ConfigError, shorten
from ..core.jsonconfig import read_json_object
from ..core.model_names import resolve_model
from ..nn.adapters import LORA_CONFIG_KEY, add_lora, check_lora_settings, compile_layer_pattern, lora_layers
from .hf_layout import (CONFIG_NAME, FULL_WEIGHT_FILES, LoadReport, Model, build_and_load, model_keys, read_state_dict,
                        write_model_folder)

# An unmerged LoRA fine-tuning (`finetune --method lora --no-lora-merge`) is saved as PEFT saves one, so that
# `peft.PeftModel.from_pretrained(base, folder)` (and `transformers`' own PEFT integration) load it, and so
# that adapters trained with PEFT load here:
#     adapter_config.json        {"peft_type": "LORA", "r", "lora_alpha", "target_modules", "modules_to_save",
#                                 "base_model_name_or_path", "task_type", ...}
#     adapter_model.safetensors  base_model.model.<layer>.lora_A.weight (r, in), ....lora_B.weight (out, r),
#                                and the weights of `modules_to_save` (the new head) under base_model.model.
#     config.json                the task model's config (labels), with its LoRA record
# The base model's weights are not copied: `base_model_name_or_path` must name a folder (or a model in the
# local Hugging Face cache) when the adapter is loaded.
ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
# A save of full weights drops these, so no folder holds both formats
ADAPTER_FILES = (ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME)
PEFT_PREFIX = "base_model.model."
PEFT_TASK_TYPES = {"BertForSequenceClassification": "SEQ_CLS", "BertForTokenClassification": "TOKEN_CLS",
                   "BertForQuestionAnswering": "QUESTION_ANS"}
_PEFT_LORA_KEY = re.compile(r"(?P<layer>.+)\.lora_(?P<factor>[AB])(?:\.[A-Za-z_]\w*)?\.weight")


def is_lora_adapter_folder(folder: Path) -> bool:
    """A folder holding a PEFT adapter and no full set of weights of its own."""
    return (folder / ADAPTER_CONFIG_NAME).is_file() and not any((folder / name).exists() for name in FULL_WEIGHT_FILES)


def save_lora_adapter(model: Model, path: str | os.PathLike, vocab_file: str | os.PathLike | None = None,
                      extra_files: dict[str, str] | None = None) -> Path:
    """The LoRA factors and the modules trained whole (the head) of `model`, in PEFT's layout (above)."""
    record = model.config.extra.get(LORA_CONFIG_KEY, {})
    lora = lora_layers(model)
    tensors = {}
    for name, factors in lora.items():
        tensors[f"{PEFT_PREFIX}{name}.lora_A.weight"] = factors.lora_A.detach().contiguous().cpu()
        tensors[f"{PEFT_PREFIX}{name}.lora_B.weight"] = factors.lora_B.detach().contiguous().cpu()
    modules = list(record.get("modules_to_save", []))
    for key, value in model.state_dict().items():
        if any(key.startswith(m + ".") for m in modules):
            tensors[PEFT_PREFIX + key] = value.detach().contiguous().cpu()
    adapter = {"peft_type": "LORA", "task_type": PEFT_TASK_TYPES.get(type(model).__name__),
               "base_model_name_or_path": record.get("base_model_name_or_path"), "r": int(record["rank"]),
               "lora_alpha": record["alpha"], "target_modules": sorted(lora), "modules_to_save": modules or None,
               "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "use_rslora": False,
               "use_dora": False, "init_lora_weights": True, "inference_mode": True}
    return write_model_folder(path, model, ADAPTER_WEIGHTS_NAME, tensors, {ADAPTER_CONFIG_NAME: adapter},
                               vocab_file, extra_files, drop=FULL_WEIGHT_FILES)


def load_lora_adapter(cls: type, folder: Path, config: Any = None, **config_overrides) -> tuple[Model, "LoadReport"]:
    """`cls` built on the adapter's base model, LoRA added where the adapter says, its factors and head loaded.
    Strict as every load: a key that fits no layer, a missing factor or a wrong shape is a `CheckpointError`."""
    source = folder / ADAPTER_CONFIG_NAME
    adapter = read_json_object(source)
    if adapter.get("peft_type") != "LORA":
        raise CheckpointError(f"{source}: peft_type {adapter.get('peft_type')!r}; bertlab loads LoRA adapters only")
    unsupported = [k for k in ("use_dora", "use_rslora", "fan_in_fan_out", "lora_bias", "rank_pattern",
                               "alpha_pattern", "layers_to_transform") if adapter.get(k)]
    if adapter.get("bias", "none") != "none":
        unsupported.append(f"bias {adapter['bias']!r}")
    if unsupported:
        raise CheckpointError(f"{source}: LoRA options bertlab does not implement: {', '.join(unsupported)}")
    # Its settings checked before anything is read or allocated: r sizes every factor, alpha scales every score.
    targets = adapter.get("target_modules") or []
    try:
        check_lora_settings(adapter.get("r"), adapter.get("lora_alpha"))
        if isinstance(targets, str):
            compile_layer_pattern(targets)
            targets = f"^(?:{targets})$"  # PEFT matches a string target against the whole module name
        elif not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise ValueError(f"target_modules must be a list of layer names or one pattern, got {shorten(targets)}")
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from None
    base_name = adapter.get("base_model_name_or_path")
    if not base_name:
        raise CheckpointError(f"{source}: no base_model_name_or_path; the adapter needs its base model")
    base = resolve_model(base_name, "base model folder (the adapter's base_model_name_or_path)")
    weights = folder / ADAPTER_WEIGHTS_NAME
    tensors = read_state_dict(weights)
    if config is None:  # the task model's own (labels); a PEFT folder without one takes the base model's
        config = cls.config_class.from_json_file(folder if (folder / CONFIG_NAME).is_file() else base)
    if config_overrides:
        try:
            config = config.replace(**config_overrides)
        except TypeError as e:
            raise ConfigError(f"{folder}: {e}") from None
    base_config = config.replace(extra={k: v for k, v in config.extra.items() if k != LORA_CONFIG_KEY})
    model, report = build_and_load(cls, base_config, read_state_dict(base, getattr(cls, "read_tf_checkpoint", None)),
                                   str(base))
    try:
        add_lora(model, targets, adapter["r"], float(adapter["lora_alpha"]))
    except (ValueError, KeyError) as e:
        raise CheckpointError(f"{source}: its target_modules / r / lora_alpha do not fit {cls.__name__} ({e})") from None
    lora, own = lora_layers(model), model.state_dict()
    factors: set[str] = set()  # "<layer>.lora_A" / "<layer>.lora_B" filled
    modules: set[str] = set()  # the model's own keys filled (the head trained whole)
    with torch.no_grad():
        for key, value in tensors.items():
            name = key.removeprefix(PEFT_PREFIX)
            match = _PEFT_LORA_KEY.fullmatch(name)
            if match and match["layer"] in lora:
                factor = "lora_" + match["factor"]
                target = getattr(lora[match["layer"]], factor)
                factors.add(f"{match['layer']}.{factor}")
            elif name in own and not match:
                target = own[name]
                modules.add(name)
            else:
                raise CheckpointError(f"{weights}: {key} fits no layer of {cls.__name__}")
            if target.shape != value.shape:
                raise CheckpointError(f"{weights}: {key} has shape {tuple(value.shape)}, the model's is "
                                      f"{tuple(target.shape)}")
            target.copy_(value)
    missing = [f"{n}.{f}" for n in lora for f in ("lora_A", "lora_B") if f"{n}.{f}" not in factors]
    if missing:
        raise CheckpointError(f"{weights}: no weights for {', '.join(missing[:4])}")
    own_names = model_keys(model)  # the head the base lacked came from the adapter: not "newly initialised"
    report.initialized = [k for k in report.initialized if own_names.get(k, k) not in modules]
    model.config.extra[LORA_CONFIG_KEY].update(base_model_name_or_path=str(base_name),
                                               modules_to_save=list(adapter.get("modules_to_save") or []))
    model.eval()
    return model, report
