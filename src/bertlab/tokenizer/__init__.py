"""BERT's WordPiece tokenizer: `basic` (normalise and split into words), `wordpiece` (words -> pieces,
vocab.txt I/O), `tokenizer_json` (reading the `tokenizers` library's tokenizer.json), `tokenizer`
(`BertTokenizer`: model inputs with offsets, and decoding), and `train`
(learning a vocabulary). An optional C extension `_fast` speeds up encoding; the Python code is the reference.

`sentencepiece`: SentencePiece models through the `sentencepiece` library (reading one, learning one with
a family's settings), which every family on SentencePiece shares. T5's binding on top of these -- its
sentinels, `T5Tokenizer`, `WordPieceT5Tokenizer` -- is T5's folder's (`bertlab.models.t5.tokenizer`,
`bertlab.models.t5.sentinels`); its names still resolve from here for code written against earlier releases.
"""

import importlib

from .basic import SPECIAL_TOKENS, BasicTokenizer
from .sentencepiece import SentencePieceError
from .tokenizer import BatchEncoding, BertTokenizer, TokenizerError, folder_vocabulary
from .wordpiece import VocabError, WordPiece, load_vocab, read_vocab, save_vocab

# Found by name on first use: the family imports this layer, so this layer does not import the family.
_T5_NAMES = ("T5Tokenizer", "TextToTextTokenizer", "WordPieceT5Tokenizer", "load_text_to_text_tokenizer")


def __getattr__(name: str):
    if name in _T5_NAMES:
        return getattr(importlib.import_module("bertlab.models.t5.tokenizer"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["BasicTokenizer", "BatchEncoding", "BertTokenizer", "SPECIAL_TOKENS", "TokenizerError", "VocabError",
           "WordPiece", "load_vocab", "read_vocab", "save_vocab", "SentencePieceError", "T5Tokenizer",
           "TextToTextTokenizer", "WordPieceT5Tokenizer", "load_text_to_text_tokenizer", "folder_vocabulary"]
