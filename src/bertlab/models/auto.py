"""`AutoConfig`, `AutoModel`, `AutoTokenizer`: the right family's class for a folder, from its `config.json`'s
`model_type` -- the entry points `transformers` users know, over bertlab's family registry.

    model = AutoModel.from_pretrained("runs/roberta")        # the bare encoder of the folder's family
    tok = AutoTokenizer.from_pretrained("runs/roberta")       # its tokenizer, BertTokenizer's call surface
    clf = AutoModel.for_head("text-classification").from_pretrained(folder)
"""

from __future__ import annotations

import os
from pathlib import Path

from ..core.errors import BertlabError
from .registry import family_of


class AutoConfig:
    @staticmethod
    def from_pretrained(path: str | os.PathLike):
        """The folder's (or config file's) config, as its family's config class."""
        return family_of(path).config_class.from_json_file(path)


class AutoModel:
    @staticmethod
    def from_pretrained(path: str | os.PathLike, **kwargs):
        """The bare encoder of the folder's family, its weights loaded (a `...For*` checkpoint's encoder too)."""
        fam = family_of(path)
        if fam.base_model is None:
            raise BertlabError(f"{path}: {fam.name} has no bare encoder model; use its own model class")
        return fam.base_model.from_pretrained(path, **kwargs)

    @staticmethod
    def for_head(kind: str):
        """A loader of the head `kind` (`models/heads.py`): `.from_pretrained(folder)` builds the folder's family's
        class for it (a new head is initialised on a plain encoder folder)."""
        return _HeadLoader(kind)


class _HeadLoader:
    def __init__(self, kind: str):
        self.kind = kind

    def from_pretrained(self, path: str | os.PathLike, **kwargs):
        return family_of(path).head(self.kind).model_class.from_pretrained(path, **kwargs)


class AutoTokenizer:
    @staticmethod
    def from_pretrained(path: str | os.PathLike):
        """The folder's tokenizer, read from the files its family ships."""
        return family_of(path).load_tokenizer(Path(path))
