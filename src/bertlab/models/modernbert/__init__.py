"""ModernBERT (Warner et al., 2024): a BERT-style encoder rebuilt -- rotary positions with a global and a local
base, GeGLU feed-forward layers, pre-norm blocks without biases, and attention that alternates one global layer
with two local ones (a 128-token sliding window). `config.py` (`ModernBertConfig`, Hugging Face's fields),
`modeling.py` (the encoder), `heads.py` (Hugging Face's `ModernBertFor*`), `tokenizer.py` (its tokenizer.json),
`params.py` and `family.py`.
"""
