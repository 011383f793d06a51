"""The model families bertlab knows, by the `model_type` a `config.json` names (as `transformers`' auto classes
map it), and the family of a folder.

A family is imported only when a folder of it is used, so `bertlab params` or a BERT run never imports T5.
Adding a family is one line here (or `register_family` at run time) and a folder with a `family.py` (and a
`params.py` beside it for `bertlab params`, an `objectives.py` for pre-training objectives of its own, a
`denoising.py` with `CORRUPTIONS` for corruption transforms of text-to-text data, a `tokenizer.py` with
`VOCABULARY_TRAINERS` for a kind of vocabulary trained with its settings).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from ..core.errors import BertlabError
from ..core.jsonconfig import read_json_object
from .family import Family, ParameterTable
from .text_to_text import Corruptions

# model_type -> the module whose FAMILY describes it
FAMILIES: dict[str, str] = {
    "bert": "bertlab.models.bert.family",
    "roberta": "bertlab.models.roberta.family",
    "xlm-roberta": "bertlab.models.xlm_roberta.family",
    "t5": "bertlab.models.t5.family",
    "distilbert": "bertlab.models.distilbert.family",
    "albert": "bertlab.models.albert.family",
    "electra": "bertlab.models.electra.family",
    "deberta-v2": "bertlab.models.deberta_v2.family",
    "modernbert": "bertlab.models.modernbert.family",
    "mpnet": "bertlab.models.mpnet.family",
}
# The family of a config without a model_type (every config written before `transformers` added the field), and
# the one `bertlab pretrain` builds when neither the config nor the data says otherwise
DEFAULT_MODEL_TYPE = "bert"
# Google's TensorFlow release names its config thus and has no model_type: it is BERT's
GOOGLE_CONFIG_NAME = "bert_config.json"


def register_family(model_type: str, module: str) -> None:
    """Make `model_type` load through `module`'s FAMILY (a family kept outside this package, or a test's)."""
    FAMILIES[model_type] = module


def family(model_type: str, where: str | os.PathLike | None = None) -> Family:
    """The family of `model_type`; one line naming it (and `where` it was read) and the supported ones when it
    is unknown."""
    if model_type not in FAMILIES:
        raise BertlabError(f"{f'{where}: ' if where is not None else ''}model_type {model_type!r} is not supported "
                           f"(supported: {', '.join(sorted(FAMILIES))})")
    return importlib.import_module(FAMILIES[model_type]).FAMILY


def default_family() -> Family:
    """The family of a config without a model_type, which `pretrain` builds when nothing says otherwise."""
    return family(DEFAULT_MODEL_TYPE)


def default_head(kind: str) -> type:
    """The class of the default family's head of `kind` (`models/heads.py`): what a task or an objective builds
    when no model folder names a family (a model folder's family is asked for its own head of that kind)."""
    return default_family().head(kind).model_class


def parameter_table(model_type: str, where: str | os.PathLike | None = None) -> ParameterTable:
    """The parameter table of `model_type` (its folder's `params.py`), without importing the family's model code:
    `bertlab params` counts any family's config from its arithmetic alone."""
    if model_type not in FAMILIES:
        family(model_type, where)  # raises the one line naming the supported ones
    module = FAMILIES[model_type].rpartition(".")[0] + ".params"
    try:
        return importlib.import_module(module).PARAMETERS
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        raise BertlabError(f"{f'{where}: ' if where is not None else ''}model_type {model_type!r} has no parameter "
                           f"table") from None


def _folder_modules(name: str) -> Iterator[ModuleType]:
    """Each registered family folder's module `name` ("objectives", "denoising", "tokenizer"), in the registry's
    order; a folder without one is passed over (an error inside one is not)."""
    for module in FAMILIES.values():
        module = module.rpartition(".")[0] + "." + name
        try:
            yield importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise


def family_objectives() -> list:
    """The pre-training objectives the families define in their folders (an `objectives.py` with a list
    `PRETRAINING_OBJECTIVES` of `models.objective.Objective`s: T5's denoising, ELECTRA's replaced-token
    detection), in the registry's order; `bertlab.objectives` registers them beside the encoders' masked-LM
    kinds."""
    return [objective for module in _folder_modules("objectives") for objective in module.PRETRAINING_OBJECTIVES]


def corruptions() -> dict[str, Corruptions]:
    """Objective name -> the corruption transforms (`models.text_to_text.Corruptions`) of the family that defines
    it in its folder's `denoising.py` (`CORRUPTIONS`: T5's seven), families asked in the registry's order; no model
    code is imported (`prepare --help` lists the names)."""
    found: dict[str, Corruptions] = {}
    for module in _folder_modules("denoising"):
        for name in module.CORRUPTIONS.objectives:
            found.setdefault(name, module.CORRUPTIONS)
    return found


def vocabulary_trainer(kind: str):
    """The trainer of a kind of vocabulary that a family's own settings define (its folder's `tokenizer.py`'s
    `VOCABULARY_TRAINERS`: T5's SentencePiece unigram model), the first in the registry's order, or None; no
    model code is imported."""
    for module in _folder_modules("tokenizer"):
        if kind in getattr(module, "VOCABULARY_TRAINERS", {}):
            return module.VOCABULARY_TRAINERS[kind]
    return None


def preset_family(name: str) -> str | None:
    """The `model_type` of the family that has a preset called `name`, or None; families asked in the
    registry's order."""
    for model_type in FAMILIES:
        try:
            if parameter_table(model_type).is_preset(name):
                return model_type
        except BertlabError:  # a family without a parameter table has no presets to count
            continue
    return None


def data_tokenizers(command: str = "pretrain") -> dict[str, str]:
    """model_type -> the tokenizer kind of the data `bertlab COMMAND` trains it on, for each family that command
    pre-trains (every family is imported: the recipe is about to build one)."""
    families = {model_type: family(model_type) for model_type in FAMILIES}
    return {model_type: f.data_tokenizer for model_type, f in families.items()
            if f.data_tokenizer is not None and f.pretrain_command == command}


def pretrain_command(model_type: str) -> str | None:
    """The command that pre-trains `model_type`'s family, or None when none does."""
    f = family(model_type)
    return f.pretrain_command if f.data_tokenizer is not None else None


def data_family_names(kind: str) -> str:
    """The families pre-trained on data of tokenizer `kind`, as people write them ("RoBERTa"; "" when none), for
    messages that say what such data is for."""
    names = [family(model_type).name for model_type in FAMILIES]
    kinds = [family(model_type).data_tokenizer for model_type in FAMILIES]
    return ", ".join(name for name, k in zip(names, kinds) if k == kind)


def corpus_tokenizer(kind: str):
    """The loader (path -> tokenizer) that `prepare` tokenizes a corpus with for a vocabulary of `kind` that a
    family owns (SentencePiece: T5's conventions), or None when `tokenizer/` has it."""
    for model_type in FAMILIES:
        f = family(model_type)
        if f.data_tokenizer == kind and f.corpus_tokenizer is not None:
            return f.corpus_tokenizer
    return None


def claimed_vocabulary(path: str | os.PathLike):
    """(data tokenizer kind, loader) of the family that recognises `path` as a vocabulary of its own kind
    (`Family.corpus_vocabulary`), or None when no family does and the path's files say its kind."""
    for model_type in FAMILIES:
        f = family(model_type)
        if f.corpus_vocabulary is not None and f.corpus_tokenizer is not None and f.corpus_vocabulary(Path(path)):
            return f.data_tokenizer, f.corpus_tokenizer
    return None


def model_type_of(path: str | os.PathLike) -> str:
    """The `model_type` of a model folder or config file. A config without one is BERT's, as every config
    written before `transformers` added the field (and Google's `bert_config.json`) is."""
    path = Path(path)
    if path.is_dir():
        if (path / "config.json").is_file():
            path = path / "config.json"
        elif (path / GOOGLE_CONFIG_NAME).is_file():
            return DEFAULT_MODEL_TYPE
        else:
            raise BertlabError(f"{path}: not a model folder (no config.json)")
    model_type = read_json_object(path).get("model_type", DEFAULT_MODEL_TYPE)
    if not isinstance(model_type, str):
        raise BertlabError(f"{path}: field 'model_type' must be a string, got {model_type!r}")
    return model_type


def family_of(path: str | os.PathLike) -> Family:
    """The family of a model folder (or config file), from its `model_type`."""
    return family(model_type_of(path), where=path)
