"""What every model family's config shares: reading a JSON object from a file, the `JsonConfig` base (built
field by field from JSON, written back sorted, found by preset name or path), type checks and the activations
the models know. Family configs (`models/bert/config.py`, `models/t5/config.py`) build on it; run configs
(`train/runconfig.py`) and checkpoint loading read their files through `read_json_object`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

from .errors import ConfigError, shorten

# One weight matrix of any family is held under 2^32 elements (16 GiB fp32): checked before anything is
# allocated, for a config.json from an unknown source.
MAX_MATRIX_ELEMENTS = 1 << 32

# The most labels a config may name (a num_labels of 10^12 would build a dict of that many names first)
MAX_LABELS = 1 << 20

# Activations the model knows, by the names Google's and Hugging Face's configs use.
KNOWN_ACTIVATIONS = ("gelu", "relu", "gelu_new", "gelu_pytorch_tanh", "silu", "swish", "tanh")


def read_json_object(path: str | os.PathLike) -> dict[str, Any]:
    """A JSON object from a file (model configs, run configs); every failure is one ConfigError line
    naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: line {e.lineno}: not valid JSON ({e.msg})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object of settings, got {type(data).__name__}")
    return data


class JsonConfig:
    """What every model family's config shares (BertConfig here, T5Config in `bertlab.models.t5`): built from a JSON
    object field by field, so a bad field is reported against its file before anything is constructed; written
    back as sorted JSON; found by preset name or path. A family sets `config_files` (the names a model folder
    may hold its config under, first found wins) and `preset_lookup()` -> (is_preset, preset, names)."""

    config_files: tuple[str, ...] = ("config.json",)
    extra: dict[str, Any]

    @classmethod
    def preset_lookup(cls) -> tuple[Any, Any, Any]:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config"):
        raise NotImplementedError

    @classmethod
    def build(cls, kwargs: dict[str, Any], extra: dict[str, Any], int_fields: Any = ()):
        """An instance from checked `kwargs` (defaults for the rest) without running `__init__`, so `validate`
        can name the file; integral floats that some tools write ("hidden_size": 768.0) become ints."""
        config = cls.__new__(cls)
        for f in dataclasses.fields(cls):
            if f.name in kwargs:
                value = kwargs[f.name]
                if f.name in int_fields and isinstance(value, float) and value.is_integer():
                    value = int(value)
                setattr(config, f.name, value)
            elif f.default is not dataclasses.MISSING:
                setattr(config, f.name, f.default)
            else:
                setattr(config, f.name, f.default_factory())  # type: ignore[misc]
        config.extra = extra
        return config

    @classmethod
    def from_json_file(cls, path: str | os.PathLike):
        path = Path(path)
        if path.is_dir():
            path = next((path / n for n in cls.config_files if (path / n).exists()), path / cls.config_files[0])
        return cls.from_dict(read_json_object(path), source=str(path))

    @classmethod
    def from_name_or_path(cls, name: str):
        """A preset name or a path to a config file or a model folder."""
        is_preset, preset, names = cls.preset_lookup()
        if is_preset(name):
            return preset(name)
        if os.path.exists(name):
            return cls.from_json_file(name)
        raise ConfigError(f"{name!r} is neither a preset ({', '.join(names())}) nor an existing file")

    def check_sizes(self, source: str, limits: dict[str, int], matrices: tuple[tuple[str, str], ...]) -> None:
        """Sizes from an unknown file, checked before anything is allocated: each field of `limits` in
        1..limit, and each (rows, cols) pair of fields (or properties) under MAX_MATRIX_ELEMENTS weights."""
        for name, limit in limits.items():
            if not 1 <= getattr(self, name) <= limit:
                raise ConfigError(f"{source}: field '{name}' must be between 1 and {limit:,}, got "
                                  f"{getattr(self, name):,}")
        for rows, cols in matrices:
            if getattr(self, rows) * getattr(self, cols) > MAX_MATRIX_ELEMENTS:
                raise ConfigError(f"{source}: '{rows}' x '{cols}' ({getattr(self, rows):,} x {getattr(self, cols):,}) "
                                  f"is over {MAX_MATRIX_ELEMENTS:,} weights in one matrix")

    @property
    def max_sequence_length(self) -> int:
        """Tokens one input may hold: the position table's size, less any positions a family reserves (RoBERTa's
        start after the padding id, so 514 positions hold 512 tokens). Inference caps its length with it."""
        return self.max_position_embeddings

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def replace(self, **changes: Any):
        return dataclasses.replace(self, **changes)


def is_type(value: Any, expected: type) -> bool:
    """Whether a JSON value is of the config field's type: a finite number for float, never a bool for a size."""
    if isinstance(value, bool):  # bool is an int subclass; `true` is never a size
        return False
    if expected is float:
        return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, expected)


class FieldConfig(JsonConfig):
    """A family config that is a plain dataclass of JSON fields (DistilBERT's, ALBERT's): each field's type is
    checked from its annotation ("int", "float", "str", "bool"), labels are Hugging Face's (`id2label`, or
    `num_labels`; `label2id` derived), unknown keys are kept in `extra` and written back with `model_type`.
    A subclass sets `model_type` and `check(source)` (its sizes and consistency)."""

    model_type = ""
    _TYPES = {"int": int, "float": float, "str": str, "bool": bool}
    _TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}

    @classmethod
    def typed_fields(cls) -> dict[str, type]:
        return {f.name: cls._TYPES[f.type] for f in dataclasses.fields(cls) if f.type in cls._TYPES}

    def __post_init__(self) -> None:
        self.validate()

    @property
    def num_labels(self) -> int:
        return len(self.id2label) if self.id2label else 2

    @property
    def label2id(self) -> dict[str, int]:
        return {v: k for k, v in (self.id2label or {}).items()}

    def validate(self, source: str = "config") -> None:
        for name, expected in self.typed_fields().items():
            value = getattr(self, name)
            ok = isinstance(value, bool) if expected is bool else is_type(value, expected)
            if not ok:
                raise ConfigError(f"{source}: field '{name}' must be {self._TYPE_NAMES[expected]}, got "
                                  f"{type(value).__name__} {shorten(value)}")
        act = getattr(self, "hidden_act", None)
        if act is not None and act not in KNOWN_ACTIVATIONS:
            raise ConfigError(f"{source}: activation {shorten(act)}; expected one of {', '.join(KNOWN_ACTIVATIONS)}")
        self.check(source)

    def check(self, source: str) -> None:
        raise NotImplementedError

    @classmethod
    def preset_lookup(cls):
        """No named sizes: a config file or a model folder."""
        return (lambda name: False), None, (lambda: [])

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config"):
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs = {k: v for k, v in data.items() if k in known}
        extra = {k: v for k, v in data.items() if k not in known and k not in ("label2id", "num_labels")}
        labels = data.get("num_labels")
        if kwargs.get("id2label") is None and isinstance(labels, int) and not isinstance(labels, bool) and labels > 0:
            if labels > MAX_LABELS:
                raise ConfigError(f"{source}: field 'num_labels' must be at most {MAX_LABELS:,}, got {labels:,}")
            kwargs["id2label"] = {i: f"LABEL_{i}" for i in range(labels)}
        if kwargs.get("id2label") is not None:
            try:
                kwargs["id2label"] = {int(k): str(v) for k, v in kwargs["id2label"].items()}
            except (AttributeError, ValueError) as e:
                raise ConfigError(f"{source}: field 'id2label' must map integer ids to names ({e})") from None
        config = cls.build(kwargs, extra, {n for n, t in cls.typed_fields().items() if t is int})
        config.validate(source)
        return config

    def to_dict(self) -> dict[str, Any]:
        data = {**self.extra, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}}
        if self.id2label is not None:
            data["id2label"] = {str(k): v for k, v in sorted(self.id2label.items())}
            data["label2id"] = {v: k for k, v in sorted(self.id2label.items())}
        else:
            data.pop("id2label")
        if data.get("attn_implementation") == "sdpa":  # the default is not written: config.json stays HF's
            data.pop("attn_implementation")
        data["model_type"] = self.model_type
        return data
