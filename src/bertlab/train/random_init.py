"""A randomly initialised model of a named size as the start of fine-tuning: the baseline that shows what
pre-training bought.

    bertlab finetune sst2 --model tiny --vocab vocab.txt --data glue/SST-2 --out runs/sst2-random
    bertlab finetune sst2 --model RUN/final --init random ...        # RUN/final's shape and tokenizer, new weights
    bertlab finetune-t5 --tasks sst2 --model t5-tiny --vocab spiece.model|vocab.txt --data GLUE --out OUT
    bertlab distill --task sst2 --teacher FT/model --student every-other-layer --init random ...  # student only

A size (a BERT preset: tiny ... large, L4-H256; a T5 preset: t5-tiny ... t5-large) takes its tokenizer from
`--vocab` (a vocab.txt; T5 also a SentencePiece .model); `--vocab` alone implies `--init random`. A model folder
with `--init random` keeps the folder's config and tokenizer and throws its weights away. The start is written
to OUT/init/ (config.json, the tokenizer, the seeded random weights), so that the recipe reads it as any model
folder and the baseline can be inspected and repeated; metrics.json says `"init": {"init": "random", ...}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..core.errors import BertlabError, ConfigError
from ..models.family import Family
from ..models.registry import FAMILIES, family, family_of, parameter_table

INITS = ("pretrained", "random")
INIT_DIR = "init"  # OUT/init: the random start of a fine-tuning run


def _size_family(name: str) -> Family | None:
    """The family with a random start that has a preset called `name` (BERT's tiny ... large, T5's t5-tiny ...),
    or None; families asked in the registry's order."""
    for model_type in FAMILIES:
        try:
            table = parameter_table(model_type)  # its presets, without importing its model code
        except BertlabError:
            continue
        if table.is_preset(name) and family(model_type).random_start is not None:
            return family(model_type)
    return None


def names_a_size(model: str | None) -> bool:
    """Whether `model` names a size (a preset of a family with a random start) rather than a folder or a cached
    model's name."""
    return bool(model) and not Path(model).expanduser().exists() and _size_family(model) is not None


def resolve_init(model: str | None, vocab: str | None, init: str | None) -> str:
    """`pretrained` or `random`: as stated, else `random` for a size or a `--vocab`, else `pretrained`; a
    combination that cannot be meant is one line."""
    if init is not None and init not in INITS:
        raise ConfigError(f"init must be one of {', '.join(INITS)}, got {init!r}")
    size = names_a_size(model)
    if init == "pretrained" and (size or vocab):
        raise ConfigError(f"--init pretrained needs a model folder with weights; {model!r} is a size"
                          if size else "--vocab goes with a random start (a size such as --model tiny, or "
                                       "--init random); a pre-trained model brings its own tokenizer")
    resolved = init or ("random" if size or vocab else "pretrained")
    if resolved == "random":
        if size and not vocab:
            raise ConfigError(f"--model {model} is a size, not a folder: give its tokenizer with --vocab VOCAB "
                              "(a vocab.txt) to fine-tune a randomly initialised model of that size")
        if vocab and not size:
            raise ConfigError(f"--vocab goes with a size (--model tiny, t5-tiny, ...); {model!r} brings its own "
                              "tokenizer (leave out --vocab)")
        if vocab and not Path(vocab).exists():
            raise ConfigError(f"{vocab}: no such vocabulary file")
    return resolved


@dataclass
class RandomStart:
    """Where a random start was written, and what it was made of (the record metrics.json keeps)."""

    folder: Path
    record: dict[str, Any]


def random_start(model: str, vocab: str | None, out: str | Path, seed: int, reuse: bool = False,
                 generates_text: bool = False) -> RandomStart:
    """OUT/init: a model of `model`'s size (a preset, with `vocab`'s tokenizer) or shape (a folder, with its
    tokenizer), its weights drawn from `seed`, written by its family (`Family.random_start`: the preset's or the
    folder's); `generates_text`: the recipe trains a text-to-text model (`finetune-t5`), else an encoder's heads.
    `reuse` (a resumed run): the start an earlier session wrote, as it is."""
    folder = Path(out) / INIT_DIR
    record = {"init": "random", "model": model, "vocab": vocab, "seed": seed}
    if not (reuse and (folder / "config.json").is_file()):
        found = _size_family(model) if vocab else family_of(model)
        if found is None or found.random_start is None:
            why = f"{found.name} models have no random start" if found else "no family has a size of that name"
            raise ConfigError(f"--model {model}: {why} (a size such as tiny or t5-tiny, or a BERT or T5 model "
                              "folder, has one)")
        if found.generates_text != generates_text:
            raise ConfigError(f"--model {model} is a {found.name} {'size' if vocab else 'model'}; this recipe "
                              f"trains {'a text-to-text model' if generates_text else 'an encoder'}")
        torch.manual_seed(seed)
        found.random_start(model, vocab, folder)
    return RandomStart(folder, record)
