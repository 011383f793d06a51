"""ELECTRA (Clark et al., 2020): BERT's encoder pre-trained by replaced-token detection -- a small generator,
trained with masked LM, fills the masked positions with samples, and the encoder (the discriminator) learns to
tell, for every token, whether it is the original. The math is BERT's (`models/bert`) with token embeddings of
width E (`embedding_size`) projected to H when they differ. `config.py` (`ElectraConfig`, Hugging Face's fields),
`modeling.py` (the encoder), `heads.py` (Hugging Face's `ElectraFor*` heads and the generator + discriminator
pair pre-training trains), `objectives.py` (`--objective rtd`), `family.py`, `params.py`.
"""
