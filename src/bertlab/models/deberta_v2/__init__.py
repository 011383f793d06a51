"""DeBERTa-v2 and v3 (He et al., 2021; 2023): `config.py` (`DebertaV2Config`, Hugging Face's field names),
`modeling.py` (the encoder: disentangled attention with relative-position buckets, post-LN blocks, the optional
convolution), `heads.py` (masked LM and the task heads, `transformers`' `DebertaV2For*`), `tokenizer.py` (the
SentencePiece tokenizer, `spm.model`, with `BertTokenizer`'s call surface) and `params.py`. Checkpoints are
Hugging Face's layout (`deberta.encoder.layer.0.attention.self.query_proj`), model_type "deberta-v2" for both
versions, as `transformers` has it.
"""
