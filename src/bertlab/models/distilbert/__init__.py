"""DistilBERT (Sanh et al., 2019): `config.py` (`DistilBertConfig`, Hugging Face's field names), `modeling.py`
(the encoder, BERT's post-LN block under DistilBERT's names: no token types, no pooler), `heads.py` (its masked
LM and task heads) and `convert.py` (a BERT-layout student written as a DistilBERT). Checkpoints are Hugging
Face's layout (`distilbert.transformer.layer.0.attention.q_lin`).
"""
