"""BERT (Devlin et al., 2018): `config.py` (`BertConfig`, Google's field names, presets), `modeling.py` (the
encoder, `BertModel`), `heads.py` (pre-training and task heads, and their registry) and `convert.py` (Google's
TensorFlow checkpoints to and from the Hugging Face layout). Checkpoints are Hugging Face's layout.
"""
