"""BERT's WordPiece tokenizer: `basic` (normalise and split into words), `wordpiece` (words -> pieces,
vocab.txt I/O), `tokenizer` (`BertTokenizer`: model inputs with offsets, and decoding), and `train`
(learning a vocabulary). An optional C extension `_fast` speeds up encoding; the Python code is the reference.
"""

from .basic import SPECIAL_TOKENS, BasicTokenizer
from .tokenizer import BatchEncoding, BertTokenizer, TokenizerError
from .wordpiece import VocabError, WordPiece, load_vocab, read_vocab, save_vocab

__all__ = ["BasicTokenizer", "BatchEncoding", "BertTokenizer", "SPECIAL_TOKENS", "TokenizerError", "VocabError",
           "WordPiece", "load_vocab", "read_vocab", "save_vocab"]
