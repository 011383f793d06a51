"""bertlab: BERT (Devlin et al., 2018) as software -- tokenizer, encoder, pre-training, fine-tuning, serving.

The public API is importable from here: `from bertlab import BertConfig, BertModel, BertTokenizer`.
"""

import importlib

from .models.bert.config import BertConfig, preset, preset_names
from .core.errors import BertlabError, CheckpointError, ConfigError
from .models.t5.tokenizer import T5Tokenizer, WordPieceT5Tokenizer
from .tokenizer import BertTokenizer

__version__ = "0.1.0"  # the one place: pyproject.toml reads it for the package (`bertlab --version` prints it)

# The model classes need torch, ~1.5 s to import; they are loaded on first use (PEP 562), so the tokenizer,
# `bertlab --help` and the commands that never run a model start without it.
_LAZY = {
    "BertModel": "models.bert.modeling", "EncoderOutput": "models.outputs",
    **dict.fromkeys(("BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
                     "BertForTokenClassification", "BertForQuestionAnswering", "BertForMultipleChoice"),
                    "models.bert.heads"),
    "T5Config": "models.t5.config", "T5ForConditionalGeneration": "models.t5.modeling",  # the second family
    **dict.fromkeys(("AutoConfig", "AutoModel", "AutoTokenizer"), "models.auto"),  # any family, by model_type
}

__all__ = ["BertConfig", "preset", "preset_names", "BertlabError", "CheckpointError", "ConfigError", "BertTokenizer",
           "T5Tokenizer", "WordPieceT5Tokenizer", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
