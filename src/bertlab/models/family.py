"""What a model family is to the rest of bertlab: the one object a family folder exports (`family.py`'s `FAMILY`).

Recipes, tasks, inference and serving never name a family's classes; they ask the family of a folder (read from
its `config.json`'s `model_type`, see `registry.py`) for its config class, its bare encoder, the head of a kind
(`models/heads.py`), its tokenizer and its parameter table. A new family is a folder with a `family.py` and one line in the registry.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import BertlabError


@dataclass(frozen=True)
class ParameterTable:
    """A family's parameter arithmetic (`bertlab params`), in its folder's `params.py` as `PARAMETERS`: counted
    from the config alone, so the command reads no weights and imports no model code."""

    config_class: type  # `.from_name_or_path(preset name or config.json / folder)`
    rows: Callable[[Any], list[tuple[str, int]]]  # config -> (row name, count); the last rows are the totals
    sizes: Callable[[Any], str]  # config -> the sizes a table's header shows ("L=12, H=768, ...")
    is_preset: Callable[[str], bool] = lambda name: False  # whether a name is one of the family's presets
    presets: str = ""  # the presets as `--help` lists them


@dataclass(frozen=True)
class Family:
    model_type: str  # config.json's "model_type"
    name: str  # as people write it: "BERT", "RoBERTa"
    config_class: type  # `.from_json_file(folder or file)`, `.from_dict`, `.to_dict()`
    base_model: type | None  # the bare encoder: `model(input_ids=, attention_mask=)` -> `.last_hidden_state`
    heads: Mapping[str, Any]  # head kind (`models/heads.py`) -> HeadSpec
    tokenizer: Callable[[Path], Any]  # a model folder -> its tokenizer (the call surface of `BertTokenizer`)
    parameters: ParameterTable | None = None  # its `params.py`'s PARAMETERS (`registry.parameter_table`)
    # The tokenizer kind (a prepared data manifest's) that its pre-training command trains it on: "wordpiece",
    # "bpe", "sentencepiece"; None: no command pre-trains it
    data_tokenizer: str | None = None
    pretrain_command: str = "pretrain"  # the `bertlab` command that pre-trains it ("pretrain-t5" for T5's objectives)
    # How `prepare` reads a vocabulary of its `data_tokenizer` kind when that tokenizer is the family's own rather
    # than one in `tokenizer/` (a path -> a tokenizer that keeps special-token text in a corpus as text); None: the
    # kind's tokenizer in `tokenizer/` (WordPiece, byte-level BPE) serves
    corpus_tokenizer: Callable[[Path], Any] | None = None
    # Whether a vocabulary path `prepare` is given is the family's own kind, read by `corpus_tokenizer` before
    # the kinds `tokenizer/` recognises (a tokenizer.json of its layout that would otherwise pass for RoBERTa's
    # byte-level BPE); None: the kind's files say it (a SentencePiece model, vocab.json + merges.txt)
    corpus_vocabulary: Callable[[Path], bool] | None = None
    engines: frozenset[str] = frozenset()  # inference engines beyond torch that convert its encoder: "ctranslate2"
    # its models answer by generating text (an encoder-decoder: `infer/generate.py`, one process) rather than with
    # an encoder's head
    generates_text: bool = False
    # Such a family's text-to-text model class, asked for when a folder of it is loaded (a callable, so reading a
    # family's config needs no torch), and its tokenizer (a folder or vocabulary -> a
    # `models.text_to_text.TextToTextTokenizer`, keyword settings passed on): what generation and the text-to-text
    # recipes build, through `text_to_text()`
    text_to_text_model: Callable[[], type] | None = None
    text_to_text_tokenizer: Callable[..., Any] | None = None
    # A random start (the baseline fine-tuning compares pre-training with): `random_start(model, vocab, folder)`
    # writes a model of a size (`model` one of its presets, `vocab` the tokenizer's vocabulary) or of a folder's
    # shape (`model` a folder, `vocab` None: its config and tokenizer) with freshly drawn weights (the torch seed
    # the caller set) and its tokenizer into `folder`; None: the family has none
    random_start: Callable[[str, str | None, Path], None] | None = None
    # Distillation's `student_layout`: a student (a BERT-layout folder, as distillation cuts and trains it)
    # rewritten in place as this family's model (DistilBERT's); None: students are not written as its models
    student_writer: Callable[[Path], Any] | None = None
    # `bertlab convert`: (a TensorFlow checkpoint -> a Hugging Face-layout folder, the reverse), each returning the
    # summary it prints, for the family Google released TensorFlow checkpoints of; None: none
    tf_conversion: tuple[Callable[..., dict], Callable[..., dict]] | None = None
    # Parameter-efficient fine-tuning by module names: the linear layers LoRA adapts when the run names none (the
    # attention's query and value projections, as the LoRA paper chose), the layers a Houlsby adapter follows (the
    # attention block's and the feed-forward block's output projections, a regular expression) and the norms that
    # train beside the adapters (a substring of their names)
    lora_targets: tuple[str, ...] = ("query", "value")
    adapter_layers: str = r"(attention\.output|layer\.\d+\.output)\.dense$"
    adapter_norms: str = "LayerNorm"

    def head(self, kind: str, purpose: str = "this command"):
        """The family's HeadSpec of `kind`; one line when the family has no such head."""
        if kind not in self.heads:
            have = ", ".join(self.heads) or "none"
            raise BertlabError(f"{self.name} models have no {kind} head, which {purpose} needs (they have: {have})")
        return self.heads[kind]

    def text_to_text(self, purpose: str = "this command", where: str | Path | None = None
                     ) -> tuple[type, Callable[..., Any]]:
        """(model class, tokenizer loader) of a family whose models generate text; one line (naming `where` the
        family was read) when it has none."""
        if self.text_to_text_model is None or self.text_to_text_tokenizer is None:
            raise BertlabError(f"{f'{where}: ' if where is not None else ''}model_type {self.model_type!r}: "
                               f"{self.name} models do not generate text, which {purpose} needs")
        return self.text_to_text_model(), self.text_to_text_tokenizer

    def load_tokenizer(self, folder: str | Path, placed_tokens: Sequence[str] = ()):
        """The folder's tokenizer; `placed_tokens`: tokens its tokenizer.json adds after the vocabulary that the
        caller inserts by id (ColBERT's markers; WordPiece tokenizers take them)."""
        if not placed_tokens:
            return self.tokenizer(Path(folder))
        if "placed_tokens" not in inspect.signature(self.tokenizer).parameters:
            raise BertlabError(f"{folder}: {self.name}'s tokenizer takes no tokens placed by id "
                               f"({', '.join(map(repr, placed_tokens))})")
        return self.tokenizer(Path(folder), placed_tokens=tuple(placed_tokens))


def layer_blocks(model: Any) -> list[Any]:
    """The layer blocks of every layer stack in `model` (an `nn.Module`), bottom to top, each block once: a
    family's stack says its blocks by a `blocks()` method (a block may run at several layers, as ALBERT's shared
    one does; it is listed once). What walks a model layer by layer -- gradual unfreezing, sharding one block at a
    time -- asks this, never a family's attribute names. [] when the model has no such stack."""
    found: dict[int, Any] = {}
    for module in model.modules():
        if callable(getattr(module, "blocks", None)):
            for block in module.blocks():
                found.setdefault(id(block), block)
    return list(found.values())


def shared_blocks(model: Any) -> set[int]:
    """The ids of the blocks that a stack of `model` runs at more than one layer (ALBERT's shared block)."""
    seen: set[int] = set()
    shared: set[int] = set()
    for module in model.modules():
        if callable(getattr(module, "blocks", None)):
            for block in module.blocks():
                (shared if id(block) in seen else seen).add(id(block))
    return shared
