"""MPNet's tokenizer: BERT's WordPiece (`tokenizer/bert.py`: the same normalisation, words and pieces) laid out
as RoBERTa lays its inputs out -- `<s> A </s>` and `<s> A </s></s> B </s>`, every token type 0 -- with MPNet's
special tokens (`<s> </s> <pad> <mask>`, and `[UNK]`). Ids and offsets are `transformers`' `MPNetTokenizer`'s
(tests/models/mpnet/ compare them); where BERT's rule for cutting a pair to length is Google's, MPNet has no
Google reference and takes the `tokenizers` library's (RoBERTa's `_pair_lengths`), as `transformers` does.
Files: vocab.txt and/or tokenizer.json (its template MPNet's, `TemplateProcessing` or `RobertaProcessing`) with
tokenizer_config.json, as BERT's.
"""

from __future__ import annotations

from typing import Any

from ...tokenizer.bert import BertTokenizer
from ...tokenizer.roberta import RobertaTokenizer


class MPNetTokenizer(BertTokenizer):
    """`BertTokenizer` with MPNet's layout and special tokens (which a folder's files may still rename); a
    tokenizer.json's other special tokens (MPNet's vocabulary has `<unk>` besides `[UNK]`) are kept whole in text,
    as `transformers` keeps them."""

    PAIR_SEPS = 2  # <s> A </s></s> B </s>
    TYPE_B = 0  # one token type
    TOKENIZER_CLASS = "MPNetTokenizer"
    SPECIAL_TOKENS = {"unk_token": "[UNK]", "sep_token": "</s>", "pad_token": "<pad>", "cls_token": "<s>",
                      "mask_token": "<mask>"}
    KEEPS_OTHER_SPECIALS = True
    _pair_lengths = staticmethod(RobertaTokenizer._pair_lengths)

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **{**self.SPECIAL_TOKENS, **kwargs})
