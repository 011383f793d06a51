"""XLM-R (Conneau et al., 2020): RoBERTa's model (`models/roberta`) trained on 100 languages with a 250k-piece
SentencePiece vocabulary. The classes here are RoBERTa's under the names `transformers` gives them
(`XLMRobertaModel`, `XLMRobertaForSequenceClassification`, ...), so a saved folder's `model_type` and
`architectures` are what `transformers` expects; the tokenizer is `tokenizer.py` here.
"""
