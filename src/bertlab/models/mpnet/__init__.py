"""MPNet (Song et al., 2020): BERT's post-LN encoder with a relative position bias in every block, on RoBERTa's
inputs and heads -- the encoder of sentence-transformers' all-mpnet-base-v2 and multi-qa-mpnet models. What
differs from RoBERTa is here: `config.py` (`MPNetConfig`, Hugging Face's fields), `modeling.py` (no token types,
T5's bucketed relative position bias shared by the blocks, the attention's output projection inside it),
`heads.py` (RoBERTa's heads under MPNet's names), `tokenizer.py` (BERT's WordPiece with RoBERTa's `<s> A </s>`
layout) and `family.py`. Pre-training MPNet's own objective (permuted language modelling) is not here.
"""
