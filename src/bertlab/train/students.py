"""Student initialisation for distillation: a smaller BERT cut from its teacher, or a fresh one.

`--student` takes one of

    every-other-layer       DistilBERT (Sanh et al., 2019): one teacher layer of two (12 -> 6, 6 -> 3)
    every-K-layers          one layer of K (e.g. every-3-layers: 12 -> 4)
    layers:I,J,...          exactly these teacher layers (0-based), bottom to top
    PRESET                  tiny, mini, small, ..., L4-H256: a fresh model of that shape
    CONFIG                  a config.json (or a folder holding one): a fresh model of that shape
    MODEL_DIR               a Hugging Face-layout folder with weights: those weights (e.g. a student from
                            general distillation, for the task-specific stage)

Cut from the teacher, the student is the teacher's own class with `len(layers)` layers: the embeddings,
the chosen layers (renumbered 0..n-1), the pooler and every head (MLM/NSP, classifier, QA) are copied
tensor for tensor. `every-K-layers` takes layers K-1, 2K-1, ..., L-1 -- the top of each block of K -- so
the teacher's last layer is always kept: the heads were trained on its output, and the student's last
hidden state is compared with the teacher's. (DistilBERT's own 12 -> 6 script took 0, 2, 4, 7, 9, 11;
`layers:0,2,4,7,9,11` gives exactly that.)

A fresh student (PRESET, CONFIG) takes the vocabulary size, [PAD] id, segment count and position count of
its teacher -- a student must read the same token ids -- and any hidden width: the distillation recipe
then learns a projection for the hidden-state loss. A CONFIG or MODEL_DIR with another vocabulary is a
one-line `ConfigError` before anything trains.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checkpoint.hf_layout import (CONFIG_NAME, PYTORCH_WEIGHTS_NAME, TF_INDEX_NAME, WEIGHTS_INDEX_NAME,
                                    WEIGHTS_NAME)
from ..core.errors import ConfigError

_EVERY_K = re.compile(r"every-(\d+)-layers?")
_LAYER_KEY = re.compile(r"^(.*?encoder\.layer\.)(\d+)(\..*)$")
# Fields a fresh student takes from its teacher: they define what the input ids and positions mean.
INPUT_FIELDS = ("vocab_size", "pad_token_id", "type_vocab_size", "max_position_embeddings")
WEIGHT_FILES = (WEIGHTS_NAME, WEIGHTS_INDEX_NAME, PYTORCH_WEIGHTS_NAME, TF_INDEX_NAME)


@dataclass(frozen=True)
class StudentInit:
    """How a student was made (written to the run's config; `layers` also maps hidden states to the teacher's)."""

    kind: str  # "layers" | "preset" | "config" | "model"
    source: str  # the --student value
    layers: tuple[int, ...] | None = None  # teacher layers the student's layers came from (kind "layers")
    random: bool = False  # the weights drawn anew (`--init random`): the shape without what the weights knew

    def to_json(self) -> dict:
        return {"kind": self.kind, "source": self.source, "layers": list(self.layers) if self.layers else None,
                "init": "random" if self.random or self.kind in ("preset", "config") else "pretrained"}


def every_kth_layer(num_layers: int, k: int) -> list[int]:
    """Teacher layers K-1, 2K-1, ..., L-1: the top layer of each block of K (see the module docstring)."""
    if k < 1 or k > num_layers:
        raise ConfigError(f"every-{k}-layers: K must be between 1 and the teacher's {num_layers} layers")
    if num_layers % k:
        raise ConfigError(f"every-{k}-layers: the teacher's {num_layers} layers are not a multiple of {k}; "
                          "name the layers with layers:I,J,...")
    return [k * (i + 1) - 1 for i in range(num_layers // k)]


def parse_layers(spec: str, num_layers: int) -> list[int] | None:
    """The teacher layers a `--student` value selects, or None when it is not a layer selection."""
    if spec == "every-other-layer":
        return every_kth_layer(num_layers, 2)
    if m := _EVERY_K.fullmatch(spec):
        return every_kth_layer(num_layers, int(m[1]))
    if spec.startswith("layers:"):
        try:
            layers = [int(x) for x in spec[len("layers:"):].split(",") if x.strip()]
        except ValueError:
            raise ConfigError(f"--student {spec}: expected layers:I,J,... with integer layer indices") from None
        if not layers or any(not 0 <= i < num_layers for i in layers) or sorted(set(layers)) != layers:
            raise ConfigError(f"--student {spec}: expected distinct increasing layers in 0..{num_layers - 1}")
        return layers
    return None


def cut_layers(teacher: Any, layers: list[int]) -> Any:
    """A copy of `teacher` (same class) with only `layers`, renumbered 0..n-1; every other tensor copied."""
    config = teacher.config.replace(num_hidden_layers=len(layers), extra=dict(teacher.config.extra),
                                    id2label=dict(teacher.config.id2label) if teacher.config.id2label else None)
    student = type(teacher)(config)
    new_index = {t: s for s, t in enumerate(layers)}
    state = {}
    for key, tensor in teacher.state_dict().items():
        m = _LAYER_KEY.match(key)
        if m is None:
            state[key] = tensor  # embeddings, pooler, heads (a tied decoder arrives twice, the same tensor)
        elif int(m[2]) in new_index:
            state[f"{m[1]}{new_index[int(m[2])]}{m[3]}"] = tensor  # teacher layer t -> student layer s
    student.load_state_dict(state, strict=True)
    return student


def fresh_config(spec: str, teacher_config: Any) -> Any:
    """The config of a fresh student from a preset or a config file (of the teacher's config class: BERT's
    presets for a BERT teacher), with the teacher's input fields."""
    config_class = type(teacher_config)
    is_preset, preset, _ = config_class.preset_lookup()
    if is_preset(spec):
        inputs = {name: getattr(teacher_config, name) for name in INPUT_FIELDS}
        return preset(spec, **inputs, hidden_act=teacher_config.hidden_act,
                      layer_norm_eps=teacher_config.layer_norm_eps)
    config = config_class.from_json_file(spec)
    check_same_vocabulary(config, teacher_config, spec)
    return config


def check_same_vocabulary(student: Any, teacher: Any, source: str) -> None:
    if student.vocab_size != teacher.vocab_size:
        raise ConfigError(f"{source}: the student's vocabulary has {student.vocab_size} tokens, the teacher's "
                          f"{teacher.vocab_size}; a student must read the teacher's token ids")


def check_same_vocab_file(student_dir: str | Path, teacher_dir: str | Path) -> None:
    """Two folders' vocabularies (vocab.txt or tokenizer.json) must hold the same tokens in the same order
    (when both have one): equal sizes are not enough."""
    from ..tokenizer import folder_vocabulary

    a, b = folder_vocabulary(student_dir), folder_vocabulary(teacher_dir)
    if a is not None and b is not None and a != b:
        raise ConfigError(f"{student_dir}: its vocabulary differs from the teacher's ({teacher_dir}); a student "
                          "must read the teacher's token ids")


def build_student(spec: str, teacher: Any, teacher_dir: str | Path | None = None, model_cls: type | None = None,
                  random_init: bool = False, **config_overrides) -> tuple[Any, StudentInit]:
    """The student `--student spec` describes (see the module docstring), of class `model_cls` (default: the
    teacher's), with its weights drawn anew when `random_init` (the baseline: that shape, untaught).
    `config_overrides` (e.g. a task's id2label) apply to fresh and loaded students; one cut from the teacher
    has the teacher's config. Fresh weights come from the global torch generator: seed it first."""
    student, init = _build_student(spec, teacher, teacher_dir, model_cls, **config_overrides)
    if random_init:
        student.init_weights()
        init = dataclasses.replace(init, random=True)
    return student, init


def _build_student(spec: str, teacher: Any, teacher_dir: str | Path | None, model_cls: type | None,
                   **config_overrides):
    model_cls = model_cls or type(teacher)
    is_preset = type(teacher.config).preset_lookup()[0]
    layers = parse_layers(spec, teacher.config.num_hidden_layers)
    if layers is not None:
        if model_cls is not type(teacher):
            raise ConfigError(f"--student {spec}: a student cut from the teacher has the teacher's heads "
                              f"({type(teacher).__name__}), not {model_cls.__name__}")
        return cut_layers(teacher, layers), StudentInit("layers", spec, tuple(layers))
    path = Path(spec)
    if not is_preset(spec) and not path.exists():
        raise ConfigError(f"--student {spec!r}: expected every-other-layer, every-K-layers, layers:I,J,..., a "
                          "preset (tiny, mini, small, medium, base, large, L4-H256, ...), a config.json or a "
                          "model folder")
    if path.is_dir() and (path / CONFIG_NAME).is_file() and _has_weights(path):
        config = type(teacher.config).from_json_file(path)
        check_same_vocabulary(config, teacher.config, spec)
        if teacher_dir is not None:
            check_same_vocab_file(path, teacher_dir)
        return model_cls.from_pretrained(path, **config_overrides), StudentInit("model", spec)
    config = fresh_config(spec, teacher.config)
    if path.is_dir() and teacher_dir is not None:
        check_same_vocab_file(path, teacher_dir)
    if config_overrides:
        config = config.replace(**config_overrides)
    return model_cls(config), StudentInit("preset" if is_preset(spec) else "config", spec)


def _has_weights(folder: Path) -> bool:
    return any((folder / name).exists() for name in WEIGHT_FILES)


def hidden_layer_map(init: StudentInit, student_layers: int, teacher_layers: int) -> list[tuple[int, int]]:
    """(student layer, teacher layer) pairs, 1-based outputs as in `hidden_states` (0 = embeddings): the layer
    each student layer was cut from, or for other students the uniform map round(i · L_t / L_s)."""
    if init.layers is not None:
        return [(s + 1, t + 1) for s, t in enumerate(init.layers)]
    return [(i, round(i * teacher_layers / student_layers)) for i in range(1, student_layers + 1)]

