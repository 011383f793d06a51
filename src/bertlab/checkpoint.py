"""Checkpoints in the Hugging Face layout: `config.json` + `model.safetensors` (+ `vocab.txt`).

Loading is strict where it matters and smooth where users expect it to be:
  * the encoder's weights (under the model family's `base_model_parts`: `embeddings.*`, `encoder.*`) must all
    be there, with the right shapes;
  * a head the checkpoint lacks (a classifier on top of a pre-trained encoder) is initialised and reported;
  * head weights -- any module weight outside the encoder -- the model has no use for (MLM/NSP heads when
    fine-tuning) are reported and dropped;
  * anything else -- a missing encoder weight, an unknown key inside the encoder or one that is no module
    path (an unmapped TensorFlow name), a shape that does not fit -- is a `CheckpointError` listing the keys.
    There is never a silent partial load.
This module knows files and these rules, not models: what is the encoder, its prefix in `BertFor*`
checkpoints (`bert.`), its config class and tied weights are attributes of the model class it is given, so
every model family and every head loads through the same code. Both bare `BertModel` keys and
`bert.`-prefixed `BertFor*` keys are accepted, as are the `gamma`/`beta` LayerNorm names of early TensorFlow
conversions. Weights are read only from safetensors or, for `pytorch_model.bin`, through
`torch.load(weights_only=True)`, which cannot run code; a folder holding Google's TensorFlow
`bert_model.ckpt.index` (or that `.index` file) is read through `tf_names.py`, without TensorFlow.

Saving is atomic: everything is written into a temporary sibling folder which then replaces the target,
so a crash mid-save leaves the previous checkpoint as it was; the temporary folders of a process that died
are removed by the next save of that target (`remove_stale_temporaries`). Saved folders and files follow
the umask, like any other tool's output. A failed write (disk full, read-only) is one `OutputError` line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

from .errors import (CheckpointError, ConfigError, OutputError, is_write_failure, output_error, shorten,
                     some_of)
from .jsonconfig import read_json_object
from .model_names import inside_model_folder, resolve_model
from .nn.adapters import (LORA_CONFIG_KEY, add_lora, add_saved_adapters, check_lora_settings, compile_layer_pattern,
                          lora_layers)
from .tokenizer.tokenizer import VOCAB_NAME

log = logging.getLogger(__name__)

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
PYTORCH_WEIGHTS_NAME = "pytorch_model.bin"
CONFIG_NAME = "config.json"
TF_INDEX_NAME = "bert_model.ckpt.index"  # Google's TensorFlow release; read by convert.py, without TensorFlow
# An unmerged LoRA fine-tuning, in PEFT's adapter layout (see "LoRA adapter folders" below)
ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
# The files of each saved-model format: a save in one drops the other's, so no folder holds both
FULL_WEIGHT_FILES = (WEIGHTS_NAME, WEIGHTS_INDEX_NAME, PYTORCH_WEIGHTS_NAME)
ADAPTER_FILES = (ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME)

# A model this module loads and saves: an nn.Module with `config` (having `to_dict`), and on its class
# `config_class` (with `from_json_file`), `base_model_prefix`, `base_model_parts`, `optional_base_parts`,
# `ignored_checkpoint_keys`, `tied_weight_keys` and `init_weights(module)` -- see `model.BertPreTrainedModel`.
Model = Any
DEFAULT_BASE_PREFIX = "bert"
# A module path: dotted identifiers (`classifier.weight`). A key that is not one -- a TensorFlow name left
# unmapped, `bert/foo/kernel` -- belongs to no head.
_MODULE_PATH = re.compile(r"[A-Za-z_]\w*(?:\.\w+)*")
# The temporary and set-aside names `atomic_directory` gives: `.NAME.tmp-PID-xxxx`, `.NAME.old-PID`.
# (Folders of older versions have no pid: `.NAME.tmp-xxxx`.)
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.(?:(?P<tmp>tmp)-(?:(?P<tmppid>\d+)-)?.*|old-(?P<oldpid>\d+))")


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
def _resolve_dir(path: str | os.PathLike) -> Path:
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p}: no such file or directory")
    return p.parent if p.is_file() else p


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The raw tensors of a checkpoint folder (or of one weights file), on the CPU."""
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
    if p.suffix == ".index":  # a TensorFlow checkpoint: Google's names mapped to these, kernels transposed
        from .tf_names import read_tf_state_dict  # TensorFlow's reader is loaded only for these files

        return read_tf_state_dict(p)
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
    with torch.device("meta"):
        model = cls(config)
        try:  # a model fine-tuned with adapters: config.json says where they sit
            add_saved_adapters(model)
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{source}: its config's adapter / LoRA record does not fit "
                                  f"{cls.__name__} ({str(e)[:200]})") from None
    report, copies = check_state_dict(model, state, source)
    materialize(model)
    initialize_missing(model, report)
    _copy_weights(model, model_state_dict(model, state, source), copies)
    return model, report


def load_pretrained(cls: type, path: str | os.PathLike, config: Any = None, return_report: bool = False,
                    **config_overrides):
    """`cls.from_pretrained(path)`: build `cls` from the folder's config (or `config`) and load its weights."""
    folder = _resolve_dir(path)
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
    state = read_state_dict(path)
    model, report = build_and_load(cls, config, state, str(folder))
    report.log(str(folder), getattr(cls, "expected_unused_keys", ()))
    model.eval()  # as Hugging Face: a loaded model starts in eval mode; train() before training
    return (model, report) if return_report else model


# ---------------------------------------------------------------------------------------------- writing
@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, keep_existing: bool = True, drop: tuple[str, ...] = ()) -> Iterator[Path]:
    """Yield a temporary folder next to `path`; on success it replaces `path` in two renames.

    Until the first rename the old folder is untouched; between the two it sits under a `.old` name beside
    the new one, so no moment exists at which neither a complete old nor a complete new folder is on disk
    (a process killed there leaves the `.old` one, which the next save puts back). With `keep_existing`,
    files of the old folder that the writer did not produce (a vocab, run state) are carried over, except
    those named in `drop` (another format's weights, which must not stay beside the new ones). On any
    exception the temporary folder is removed and `path` is left as it was; a failed write (disk full,
    read-only file system, a file in the way) becomes one `OutputError` line naming `path`.
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(target.parent, target.name)
        # The pid in the name tells a later process whether the writer is still alive (see above).
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-{os.getpid()}-", dir=target.parent))
    except OSError as e:
        raise output_error(target, e) from None
    try:
        yield tmp
        if keep_existing and target.is_dir():
            for item in target.iterdir():
                if not (tmp / item.name).exists() and item.name not in drop:
                    (shutil.copytree if item.is_dir() else shutil.copy2)(item, tmp / item.name)
        apply_umask(tmp)
        _fsync_dir(tmp)
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
        _fsync_dir(target.parent)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, Exception) and not isinstance(e, OutputError) and is_write_failure(e, target.parent):
            raise output_error(target, e) from None
        raise


def remove_stale_temporaries(parent: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Clean up after `atomic_directory` writers that died (kill -9, power loss) in `parent`: their
    `.NAME.tmp-PID-*` folders are removed, and a `.NAME.old-PID` folder is put back as NAME when NAME is
    missing (the writer died between its two renames), else removed. Only temporaries of dead processes
    (or of unknown pid, from older versions) are touched, and only of target `name` when given. Returns
    what was removed."""
    parent = Path(parent)
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    for entry in sorted(parent.iterdir()):
        m = _TEMPORARY.fullmatch(entry.name)
        if m is None or not entry.is_dir() or (name is not None and m["name"] != name):
            continue
        pid = m["tmppid"] or m["oldpid"]
        if pid is not None and _process_alive(int(pid)):
            continue
        final = parent / m["name"]
        if not m["tmp"] and not final.exists():
            os.replace(entry, final)
            log.warning("%s: restored from %s (a save was interrupted between its two renames)", final, entry.name)
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
        log.warning("%s: removed the temporary folder of an interrupted save", entry)
    return removed


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def current_umask() -> int:
    """The process's umask, read without changing it where Linux tells it (/proc), else set and reset."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        status = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(folder: Path) -> None:
    """Give `folder` and the files and folders in it the modes a plain `mkdir`/`open` would have: the
    temporary folder is made private (0700) by `mkdtemp` and safetensors writes 0600, but a saved model is
    meant to be read by others as the umask allows (another user, a container running as another uid)."""
    mask = current_umask()
    for root, dirs, files in os.walk(folder):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o777 & ~mask)
        for f in files:
            os.chmod(os.path.join(root, f), 0o666 & ~mask)
    os.chmod(folder, 0o777 & ~mask)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write a small text file (a run config, metrics.json) under a temporary name, then rename it into
    place: a reader sees the old file or the new one, never half of one. A failed write is one
    `OutputError` line naming `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise output_error(path, e) from None
    return path


def _fsync_dir(folder: Path) -> None:
    for f in [*folder.iterdir(), folder] if folder.is_dir() else [folder]:
        if f.is_file() or f == folder:
            with contextlib.suppress(OSError):
                fd = os.open(f, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)


def save_pretrained(model: Model, path: str | os.PathLike, vocab_file: str | os.PathLike | None = None,
                    extra_files: dict[str, str] | None = None) -> Path:
    """Write `config.json` + `model.safetensors` (+ `vocab.txt`) so that `transformers` loads them as they are."""
    if lora_layers(model):  # an unmerged LoRA fine-tuning: its factors and head alone, as PEFT saves them
        return save_lora_adapter(model, path, vocab_file, extra_files)
    tied = set(model.tied_weight_keys)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items() if k not in tied}
    return _write_model_folder(path, model, WEIGHTS_NAME, state, {}, vocab_file, extra_files, drop=ADAPTER_FILES)


def _write_model_folder(path: str | os.PathLike, model: Model, weights_name: str, tensors: dict[str, torch.Tensor],
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


# ---------------------------------------------------------------------------------------------- LoRA adapter folders
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
    return _write_model_folder(path, model, ADAPTER_WEIGHTS_NAME, tensors, {ADAPTER_CONFIG_NAME: adapter},
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
    model, report = build_and_load(cls, base_config, read_state_dict(base), str(base))
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
