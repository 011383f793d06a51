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

from ..models.bert.config import BertConfig, is_preset, preset
from ..core.errors import ConfigError

INITS = ("pretrained", "random")
INIT_DIR = "init"  # OUT/init: the random start of a fine-tuning run


def names_a_size(model: str | None) -> bool:
    """Whether `model` names a size (a BERT or T5 preset) rather than a folder or a cached model's name."""
    from ..models.t5.config import PRESETS as T5_PRESETS

    return bool(model) and not Path(model).expanduser().exists() and (is_preset(model) or model in T5_PRESETS)


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


def random_start(family: str, model: str, vocab: str | None, out: str | Path, seed: int,
                 reuse: bool = False) -> RandomStart:
    """OUT/init: a `family` ("bert" or "t5") model of `model`'s size (a preset, with `vocab`'s tokenizer) or
    shape (a folder, with its tokenizer), its weights drawn from `seed`. `reuse` (a resumed run): the start
    an earlier session wrote, as it is."""
    folder = Path(out) / INIT_DIR
    record = {"init": "random", "model": model, "vocab": vocab, "seed": seed}
    if not (reuse and (folder / "config.json").is_file()):
        torch.manual_seed(seed)
        (_write_bert if family == "bert" else _write_t5)(model, vocab, folder)
    return RandomStart(folder, record)


def _write_bert(model: str, vocab: str | None, folder: Path) -> None:
    """Google's initialisation (`BertPreTrainedModel.init_weights`), the tokenizer beside it."""
    from ..models.bert.heads import BertForPreTraining
    from ..tokenizer import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(vocab or model)
    if vocab:
        config = preset(model, vocab_size=len(tokenizer.vocab))
    else:
        config = BertConfig.from_json_file(model)
    BertForPreTraining(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _write_t5(model: str, vocab: str | None, folder: Path) -> None:
    """A T5 preset takes its vocabulary size and special ids from the tokenizer, as pre-training's do."""
    from ..models.t5.config import T5Config
    from ..models.t5.config import preset as t5_preset
    from ..models.t5.modeling import T5ForConditionalGeneration
    from ..models.t5.tokenizer import load_text_to_text_tokenizer
    from .t5_pretrain import export_t5

    tokenizer = load_text_to_text_tokenizer(vocab or model)
    if vocab:
        config = t5_preset(model, vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id,
                           eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id)
    else:
        config = T5Config.from_json_file(model)
    export_t5(T5ForConditionalGeneration(config), folder, tokenizer)
