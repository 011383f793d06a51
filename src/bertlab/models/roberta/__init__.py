"""RoBERTa (Liu et al., 2019): BERT's encoder trained differently -- masked LM only, no next-sentence task, one
token type, a byte-level BPE vocabulary. The math is BERT's (`models/bert`); what differs is here: `config.py`
(`RobertaConfig`, Hugging Face's defaults), `modeling.py` (positions counted from after the padding id, as
fairseq numbers them), `heads.py` (the LM head and the two-layer classification head of Hugging Face's
`RobertaFor*`) and `family.py`. XLM-R (`models/xlm_roberta`) is this model under other names.
"""
