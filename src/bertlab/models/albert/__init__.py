"""ALBERT (Lan et al., 2019): `config.py` (`AlbertConfig`, Hugging Face's field names), `modeling.py` (the
encoder: factorised embeddings E -> H, BERT's post-LN block shared across layers in groups), `heads.py` (masked
LM + sentence-order prediction and the task heads) and `tokenizer.py` (the SentencePiece tokenizer with ALBERT's
rules and `BertTokenizer`'s call surface). Checkpoints are Hugging Face's layout
(`albert.encoder.albert_layer_groups.0.albert_layers.0.attention.query`).
"""
