"""`from_pretrained` and `save_pretrained` for every model family: a folder of full weights in the Hugging
Face layout (`hf_layout.py`) or, for an unmerged LoRA fine-tuning, PEFT's adapter folder (`peft.py`); the
folder (or the model) says which.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError
from ..core.fsio import atomic_directory
from ..nn.adapters import lora_layers
from .hf_layout import WEIGHTS_NAME, Model, build_and_load, read_state_dict, resolve_dir, write_model_folder
from .peft import ADAPTER_FILES, is_lora_adapter_folder, load_lora_adapter, save_lora_adapter


def load_pretrained(cls: type, path: str | os.PathLike, config: Any = None, return_report: bool = False,
                    **config_overrides):
    """`cls.from_pretrained(path)`: build `cls` from the folder's config (or `config`) and load its weights."""
    folder = resolve_dir(path)
    if is_lora_adapter_folder(folder):  # LoRA factors and a head over a base model named inside
        model, report = load_lora_adapter(cls, folder, config, **config_overrides)
        report.log(str(folder), getattr(cls, "expected_unused_keys", ()))
        return (model, report) if return_report else model
    if config is None:
        config = cls.config_class.from_json_file(folder)
    if config_overrides:
        try:
            config = config.replace(**config_overrides)
        except TypeError as e:
            raise ConfigError(f"{folder}: {e}") from None
    state = read_state_dict(path, getattr(cls, "read_tf_checkpoint", None))
    model, report = build_and_load(cls, config, state, str(folder))
    report.log(str(folder), getattr(cls, "expected_unused_keys", ()))
    model.eval()  # as Hugging Face: a loaded model starts in eval mode; train() before training
    return (model, report) if return_report else model


def save_pretrained(model: Model, path: str | os.PathLike, vocab_file: str | os.PathLike | None = None,
                    extra_files: dict[str, str] | None = None) -> Path:
    """Write `config.json` + `model.safetensors` (+ `vocab.txt`) so that `transformers` loads them as they are."""
    if lora_layers(model):  # an unmerged LoRA fine-tuning: its factors and head alone, as PEFT saves them
        return save_lora_adapter(model, path, vocab_file, extra_files)
    tied = set(model.tied_weight_keys)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items() if k not in tied}
    # Weights shared by design that the layout stores under each name (T5's shared encoder-decoder) are written
    # as copies: a safetensors file holds no aliases, and transformers reads each name as its own weight.
    seen: set[int] = set()
    for key, tensor in state.items():
        if tensor.data_ptr() in seen:
            state[key] = tensor.clone()
        seen.add(tensor.data_ptr())
    return write_model_folder(path, model, WEIGHTS_NAME, state, {}, vocab_file, extra_files, drop=ADAPTER_FILES)


def save_model_folder(model: Model, path: str | os.PathLike, tokenizer: Any) -> Path:
    """config.json + model.safetensors + the tokenizer's files (its `save_pretrained`), in one atomic write: a
    model folder any command reads, or none."""
    model.eval()
    with atomic_directory(path) as tmp:
        weights = save_pretrained(model, tmp / "weights")
        for f in weights.iterdir():
            f.rename(tmp / f.name)
        weights.rmdir()
        tokenizer.save_pretrained(tmp)
    return Path(path)
