"""BERT's WordPiece tokenizer: `basic` (normalise and split into words), `wordpiece` (words -> pieces,
vocab.txt I/O), `tokenizer_json` (reading the `tokenizers` library's tokenizer.json), `tokenizer`
(`BertTokenizer`: model inputs with offsets, and decoding), and `train`
(learning a vocabulary). An optional C extension `_fast` speeds up encoding; the Python code is the reference.

RoBERTa's: `bpe` (byte-level BPE, family-neutral), `roberta` (`RobertaTokenizer`: RoBERTa's special tokens and
layout over it, vocab.json / merges.txt / tokenizer.json) and `bpe_train` (learning merges).

T5's: `sentinels` (the interface T5's objectives use -- sentinels, eos, pad -- implemented once),
`sentencepiece` (`T5Tokenizer` over a spiece.model, and training one) and `text_to_text`
(`WordPieceT5Tokenizer`, T5 on a BERT vocabulary, and `load_text_to_text_tokenizer` for either).
"""

from .basic import SPECIAL_TOKENS, BasicTokenizer
from .roberta import RobertaTokenizer
from .sentencepiece import SentencePieceError, T5Tokenizer
from .text_to_text import TextToTextTokenizer, WordPieceT5Tokenizer, load_text_to_text_tokenizer
from .tokenizer import BatchEncoding, BertTokenizer, TokenizerBase, TokenizerError, folder_vocabulary
from .wordpiece import VocabError, WordPiece, load_vocab, read_vocab, save_vocab

__all__ = ["BasicTokenizer", "BatchEncoding", "BertTokenizer", "RobertaTokenizer", "TokenizerBase", "SPECIAL_TOKENS",
           "TokenizerError", "VocabError", "WordPiece", "load_vocab", "read_vocab", "save_vocab",
           "SentencePieceError", "T5Tokenizer", "TextToTextTokenizer", "WordPieceT5Tokenizer",
           "load_text_to_text_tokenizer", "folder_vocabulary"]
