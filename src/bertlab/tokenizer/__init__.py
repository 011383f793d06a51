"""Text to model inputs. `base` (`TokenizerBase`: the call surface every tokenizer shares -- pairs, truncation,
windows, padding, offsets, tensors, `encode_corpus` -- and the folder's file names).

BERT's WordPiece tokenizer: `basic` (normalise and split into words), `wordpiece` (words -> pieces,
vocab.txt I/O), `tokenizer_json` (reading the `tokenizers` library's tokenizer.json), `bert`
(`BertTokenizer`: model inputs with offsets, and decoding), and `train`
(learning a vocabulary). An optional C extension `_fast` speeds up encoding; the Python code is the reference.

`sentencepiece`: SentencePiece models through the `sentencepiece` library (reading one, learning one with
a family's settings), which every family on SentencePiece shares. A family's binding on top of these (T5's
sentinels and `T5Tokenizer`, ALBERT's and XLM-R's tokenizers) is in its folder under `bertlab.models`.

`bpe` (byte-level BPE, family-neutral), `roberta` (`RobertaTokenizer`: RoBERTa's special tokens and layout over
it, vocab.json / merges.txt / tokenizer.json) and `bpe_train` (learning merges).
"""

from .basic import SPECIAL_TOKENS, BasicTokenizer
from .roberta import RobertaTokenizer
from .sentencepiece import SentencePieceError
from .base import BatchEncoding, TokenizerBase, TokenizerError
from .bert import BertTokenizer, folder_vocabulary
from .wordpiece import VocabError, WordPiece, load_vocab, read_vocab, save_vocab


__all__ = ["BasicTokenizer", "BatchEncoding", "BertTokenizer", "RobertaTokenizer", "TokenizerBase", "SPECIAL_TOKENS",
           "TokenizerError", "VocabError", "WordPiece", "load_vocab", "read_vocab", "save_vocab",
           "SentencePieceError", "folder_vocabulary"]
from .basic import SPECIAL_TOKENS, BasicTokenizer
