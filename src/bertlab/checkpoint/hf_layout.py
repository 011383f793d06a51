"""The Hugging Face layout itself: its file names, the key rules (one spelling for every key, which weights
are the encoder's and which a head's), reading a folder's weights (safetensors, sharded, `pytorch_model.bin`,
Google's TensorFlow files), checking and loading them into a model, and writing a folder of full weights.
The rules are in the package's docstring (`bertlab.checkpoint`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..core.errors import CheckpointError, some_of
from ..core.fsio import atomic_directory
from ..core.model_names import inside_model_folder
from ..nn.adapters import add_saved_adapters
from ..tokenizer.base import VOCAB_NAME

log = logging.getLogger(__name__)

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
PYTORCH_WEIGHTS_NAME = "pytorch_model.bin"
CONFIG_NAME = "config.json"
TF_INDEX_NAME = "bert_model.ckpt.index"  # Google's TensorFlow release; read by convert.py, without TensorFlow
# The files of each saved-model format: a save in one drops the other's, so no folder holds both
FULL_WEIGHT_FILES = (WEIGHTS_NAME, WEIGHTS_INDEX_NAME, PYTORCH_WEIGHTS_NAME)

# A model this module loads and saves: an nn.Module with `config` (having `to_dict`), and on its class
# `config_class` (with `from_json_file`), `base_model_prefix`, `base_model_parts`, `optional_base_parts`,
# `ignored_checkpoint_keys`, `tied_weight_keys` and `init_weights(module)` -- see `models.bert.modeling.BertPreTrainedModel`.
Model = Any
DEFAULT_BASE_PREFIX = "bert"
# A module path: dotted identifiers (`classifier.weight`). A key that is not one -- a TensorFlow name left
# unmapped, `bert/foo/kernel` -- belongs to no head.
_MODULE_PATH = re.compile(r"[A-Za-z_]\w*(?:\.\w+)*")


@dataclass
class LoadReport:
    """What `from_pretrained` did beyond a one-to-one copy."""

    initialized: list[str] = field(default_factory=list)  # in the model, not in the checkpoint: fresh init
    unused: list[str] = field(default_factory=list)  # in the checkpoint, not in the model: dropped

    def log(self, source: str, expected_unused: tuple[str, ...] = ()) -> None:
        """Warn about fresh and dropped weights; drops under an `expected_unused` prefix are only a debug
        line (a masked LM loaded from a pre-training checkpoint leaves its pooler and NSP head behind every
        time: a warning on each `fill-mask` would teach users to ignore warnings)."""
        if self.initialized:
            log.warning("%s: newly initialised (not in the checkpoint): %s", source, some_of(self.initialized, 20))
        expected = [k for k in self.unused if k.startswith(expected_unused)] if expected_unused else []
        unexpected = [k for k in self.unused if k not in expected]
        if unexpected:
            log.warning("%s: unused checkpoint weights, dropped: %s", source, some_of(unexpected, 20))
        if expected:
            log.debug("%s: weights this model does not use, dropped as expected: %s", source, some_of(expected, 20))


# ---------------------------------------------------------------------------------------------- key names
def canonical_key(key: str, base_prefix: str = DEFAULT_BASE_PREFIX) -> str:
    """A checkpoint or model key in one spelling: encoder keys bare, head keys as they are."""
    if key.startswith(base_prefix + "."):
        key = key[len(base_prefix) + 1:]
    if key.endswith(".gamma"):
        key = key[: -len(".gamma")] + ".weight"
    elif key.endswith(".beta"):
        key = key[: -len(".beta")] + ".bias"
    return key


def canonical_state_dict(state: dict[str, torch.Tensor], source: str, base_prefix: str = DEFAULT_BASE_PREFIX,
                         ignored: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        name = canonical_key(key, base_prefix)
        if name in ignored:
            continue
        if name == "cls.predictions.decoder.bias":  # an alias of cls.predictions.bias in Hugging Face's heads
            if "cls.predictions.bias" in state:
                continue
            name = "cls.predictions.bias"
        if name in out:
            raise CheckpointError(f"{source}: key {key!r} appears twice (with and without the "
                                  f"'{base_prefix}.' prefix)")
        out[name] = tensor
    return out


def model_state_dict(model: Model, state: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """`state` in the canonical spelling of `model`'s family (its base prefix, its ignored buffers)."""
    return canonical_state_dict(state, source, model.base_model_prefix, model.ignored_checkpoint_keys)


def model_keys(model: Model) -> dict[str, str]:
    """canonical name -> the model's own state_dict name, without tied aliases."""
    tied = set(model.tied_weight_keys)
    return {canonical_key(k, model.base_model_prefix): k for k in model.state_dict() if k not in tied}


def _is_head_key(model: Model, name: str) -> bool:
    """A weight that belongs to a head (or to an optional part of the encoder): missing ones are initialised,
    unused ones dropped. Everything else -- the encoder's own weights, keys that are no module path -- must
    match exactly."""
    if name.startswith(model.optional_base_parts):
        return True
    return not name.startswith(model.base_model_parts) and _MODULE_PATH.fullmatch(name) is not None



# ---------------------------------------------------------------------------------------------- reading
def resolve_dir(path: str | os.PathLike) -> Path:
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p}: no such file or directory")
    return p.parent if p.is_file() else p


def read_state_dict(path: str | os.PathLike,
                    read_tf_checkpoint: Callable[[Path], dict[str, torch.Tensor]] | None = None
                    ) -> dict[str, torch.Tensor]:
    """The raw tensors of a checkpoint folder (or of one weights file), on the CPU. A TensorFlow checkpoint
    (`.index`) is read by `read_tf_checkpoint`, the hook of the model family whose variable names it holds
    (a model class's `read_tf_checkpoint`: BERT's maps Google's names); this layer knows no family's names."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p}: no such file or directory")
    if p.is_dir():
        for name in (WEIGHTS_NAME, WEIGHTS_INDEX_NAME, PYTORCH_WEIGHTS_NAME, TF_INDEX_NAME):
            if (p / name).exists():
                p = p / name
                break
        else:
            raise CheckpointError(
                f"{p}: no weights found (expected {WEIGHTS_NAME}, {WEIGHTS_INDEX_NAME}, {PYTORCH_WEIGHTS_NAME} "
                f"or {TF_INDEX_NAME})"
            )
    if p.suffix == ".index":  # a TensorFlow checkpoint: the family maps its names to these
        if read_tf_checkpoint is None:
            raise CheckpointError(f"{p}: a TensorFlow checkpoint, which this model family does not read")
        return read_tf_checkpoint(p)
    if p.name.endswith(".index.json"):
        state: dict[str, torch.Tensor] = {}
        for shard in index_shards(p):
            state.update(read_state_dict(shard))
        return state
    if p.suffix == ".safetensors":
        try:
            return load_file(str(p), device="cpu")
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{p}: not a readable safetensors file, truncated or corrupt ({e})") from None
    try:
        state = torch.load(str(p), map_location="cpu", weights_only=True)
    except Exception as e:  # pickle errors, truncation, unsafe objects refused by weights_only
        raise CheckpointError(f"{p}: {torch_load_failure(e)}") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{p}: expected a dict of tensor names to tensors")
    return state


def index_shards(index: Path) -> list[Path]:
    """The weight files a `model.safetensors.index.json` names, each checked to lie inside the index's own
    folder (or, in the Hugging Face cache, in its repository's blobs: `model_names.inside_model_folder`): a
    name like `../elsewhere/x.safetensors`, an absolute path or a link out of the folder would read files
    the folder's owner never put there (a path-traversal hole)."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        names = sorted(set(weight_map.values()))
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, AttributeError, TypeError) as e:
        raise CheckpointError(f"{index}: not a valid safetensors index ({type(e).__name__}: {e})") from None
    shards = []
    for name in names:
        if not isinstance(name, str) or not name.endswith(".safetensors"):
            raise CheckpointError(f"{index}: weight_map names {name!r}; expected a .safetensors file name")
        shard = (index.parent / name)
        # A Hugging Face cache snapshot links its shards into the repository's blobs/: those are followed
        if os.path.isabs(name) or not inside_model_folder(shard, index.parent):
            raise CheckpointError(f"{index}: shard {name!r} lies outside the model folder {index.parent}; "
                                  "refused")
        shards.append(shard)
    return shards


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_REFUSED_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")
_UNSUPPORTED_OPERAND = re.compile(r"Unsupported operand (\d+)")
# Binary pickle opcodes that build or import Python objects (or open a protocol 2+ stream of them): the safe
# unpickler stopping at one of these read a real pickle, not random bytes.
_OBJECT_OPCODES = {0x80, 0x81, 0x92, 0x93, 0x95}  # PROTO, NEWOBJ, NEWOBJ_EX, STACK_GLOBAL, FRAME


def torch_load_failure(error: Exception) -> str:
    """Why `torch.load(weights_only=True)` failed, in a few words (torch's own message is a page long,
    coloured, and suggests `weights_only=False`, which would run whatever code the file carries)."""
    text = _ANSI.sub("", str(error))
    refused = _REFUSED_GLOBAL.search(text)
    operand = _UNSUPPORTED_OPERAND.search(text)
    if refused or "Unsupported global" in text or (operand and int(operand[1]) in _OBJECT_OPCODES):
        # a real pickle of Python objects, refused by design
        return ("refused: the file holds pickled Python objects, not only tensors"
                + (f" ({refused[1]})" if refused else "") + "; only tensor data is loaded")
    if "WeightsUnpickler error:" in text:  # garbage bytes fail inside the safe unpickler: say what it read
        detail = text.split("WeightsUnpickler error:", 1)[1].strip().splitlines()[0].strip()
        return f"corrupt or truncated checkpoint, not a readable PyTorch file ({detail})"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    first = first.split(". ")[0].rstrip(".")  # torch's sentences after the first are advice, not the cause
    return f"corrupt or truncated checkpoint, not a readable PyTorch file ({type(error).__name__}: {first})"


def check_state_dict(model: Model, state: dict[str, torch.Tensor], source: str
                     ) -> tuple[LoadReport, dict[str, str]]:
    """Match `state` against `model` under the rules in this module's docstring, touching neither.

    Returns the report and, for every weight to copy, canonical checkpoint name -> the model's key. Works on
    a model built on the meta device, so a checkpoint that does not fit fails before anything is allocated."""
    checkpoint = model_state_dict(model, state, source)
    # A checkpoint may carry a copy of a tied weight (Google's and older HF files store the MLM decoder
    # beside the word embeddings); the model re-derives it from the embedding, so the copy is skipped.
    for key in model.tied_weight_keys:
        checkpoint.pop(canonical_key(key, model.base_model_prefix), None)
    wanted = model_keys(model)
    report = LoadReport()
    missing, unexpected, mismatched = [], [], []
    for name in wanted:
        if name in checkpoint:
            continue
        if _is_head_key(model, name):
            report.initialized.append(name)
        else:
            missing.append(name)
    for name in checkpoint:
        if name in wanted:
            continue
        if _is_head_key(model, name):
            report.unused.append(name)
        else:
            unexpected.append(name)
    own = model.state_dict()
    for name, key in wanted.items():
        if name in checkpoint and tuple(checkpoint[name].shape) != tuple(own[key].shape):
            mismatched.append(f"{name} (checkpoint {tuple(checkpoint[name].shape)}, model {tuple(own[key].shape)})")
    problems = []
    if missing:
        problems.append(f"missing encoder weights: {some_of(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {some_of(unexpected)}")
    if mismatched:
        problems.append(f"shape mismatch: {some_of(mismatched)}")
    if problems:
        raise CheckpointError(f"{source}: " + "; ".join(problems))
    return report, {name: key for name, key in wanted.items() if name in checkpoint}


def load_state_dict_into(model: Model, state: dict[str, torch.Tensor], source: str) -> LoadReport:
    """Copy `state` into `model` under the rules in this module's docstring; raise before touching the model."""
    report, copies = check_state_dict(model, state, source)
    _copy_weights(model, model_state_dict(model, state, source), copies)
    return report


def _copy_weights(model: Model, checkpoint: dict[str, torch.Tensor], copies: dict[str, str]) -> None:
    own = model.state_dict()
    with torch.no_grad():
        for name, key in copies.items():
            own[key].copy_(checkpoint[name])


def materialize(model: Model, device: str | torch.device = "cpu") -> None:
    """Give a meta-device model uninitialised storage, keeping tied parameters tied (`Module.to_empty`
    would give each alias its own copy)."""
    made: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        for key, param in list(module.named_parameters(recurse=False)):
            if id(param) not in made:
                made[id(param)] = torch.nn.Parameter(torch.empty_like(param, device=device), param.requires_grad)
            setattr(module, key, made[id(param)])
        for key, buffer in list(module.named_buffers(recurse=False)):
            setattr(module, key, torch.empty_like(buffer, device=device))


def initialize_missing(model: Model, report: LoadReport) -> None:
    """Google's initialisation for the modules owning the weights the checkpoint lacked (new heads)."""
    own = model_keys(model)
    for module_name in dict.fromkeys(own[name].rpartition(".")[0] for name in report.initialized):
        model.init_weights(model.get_submodule(module_name))


def build_and_load(cls: type, config: Any, state: dict[str, torch.Tensor], source: str) -> tuple[Model, LoadReport]:
    """`cls(config)` filled from `state`, built on the meta device first: keys and shapes are checked before
    any memory is allocated, and no time goes into randomly initialising weights about to be overwritten
    (for BERT-base that initialisation costs more than reading the file)."""
    with torch.device("meta"), _no_random_init():
        model = cls(config)
        try:  # a model fine-tuned with adapters: config.json says where they sit
            add_saved_adapters(model)
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{source}: its config's adapter / LoRA record does not fit "
                                  f"{cls.__name__} ({str(e)[:200]})") from None
    report, copies = check_state_dict(model, state, source)
    materialize(model)
    initialize_missing(model, report)
    _adopt_weights(model, model_state_dict(model, state, source), copies)
    return model, report


# torch.nn.init's random initialisers: no-ops while a model is built on the meta device to be loaded
RANDOM_INITS = ("normal_", "uniform_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
                "xavier_normal_", "orthogonal_")


@contextlib.contextmanager
def _no_random_init():
    """torch.nn.init's random initialisers skipped (each returns its tensor as it is): on a meta tensor they run
    through torch's Python reference operators, whose first use imports torch._dynamo and sympy -- 75 MB of
    modules resident for the rest of the process, to initialise weights the checkpoint then replaces (the
    weights it lacks are initialised afterwards, on real memory: `initialize_missing`). Process-wide while it
    lasts, as `transformers`' own loader does."""
    saved = {name: getattr(torch.nn.init, name) for name in RANDOM_INITS}
    for name in RANDOM_INITS:
        setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


def _adopt_weights(model: Model, checkpoint: dict[str, torch.Tensor], copies: dict[str, str]) -> None:
    """`_copy_weights` for a model just materialized: a checkpoint tensor that is a whole storage of its own in the
    model's dtype and device becomes the weight itself instead of being copied into it. A safetensors file's
    tensors are views of a private mapping of the file (`load_file`): the weights are then read from the file as
    they are first used, and a row of an embedding table that no input reaches never takes memory. A copy held
    the model twice at the peak of loading (the mapping read through, then the weights written). The
    materialized storage a tensor replaces was never written, so it never took memory. As with `transformers`,
    the file must not be rewritten in place while the model lives (a page not yet read would come from the new
    file); bertlab's own saves write a new folder and rename it over the old one, so the mapping keeps the old
    file. Writing to a weight copies its page (a private mapping): the file is never changed."""
    taken: set[int] = set()
    with torch.no_grad():
        for name, key in copies.items():
            src = checkpoint[name]
            owner, _, attr = key.rpartition(".")
            own = getattr(model.get_submodule(owner), attr)
            storage = src.untyped_storage()
            if (src.dtype == own.dtype and src.shape == own.shape and src.device == own.device
                    and src.is_contiguous() and src.storage_offset() == 0 and storage.nbytes() == src.nbytes
                    and storage.data_ptr() not in taken and not src.requires_grad):
                taken.add(storage.data_ptr())
                own.data = src  # the Parameter (or buffer) object stays: tied aliases see the same tensor
            else:
                own.copy_(src)



# ---------------------------------------------------------------------------------------------- writing
def write_model_folder(path: str | os.PathLike, model: Model, weights_name: str, tensors: dict[str, torch.Tensor],
                        json_files: dict[str, Any], vocab_file, extra_files, drop: tuple[str, ...]) -> Path:
    """One saved model, atomically: its weights file, config.json (+ other JSON files), vocab and extra files;
    the other format's files (`drop`) are not carried over from an earlier save into the same folder."""
    from safetensors.torch import save_file

    config = model.config.to_dict()
    config["architectures"] = [type(model).__name__]
    with atomic_directory(path, drop=drop) as tmp:
        save_file(tensors, str(tmp / weights_name), metadata={"format": "pt"})
        for name, value in {**json_files, CONFIG_NAME: config}.items():
            (tmp / name).write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        if vocab_file is not None:
            shutil.copyfile(vocab_file, tmp / VOCAB_NAME)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
    return Path(path)
