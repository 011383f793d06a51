"""Retrieval recipes: evaluate an embedding model (and a reranker) on a retrieval set, fine-tune embedding
models on pairs (`finetune-embeddings`); exact dense search over a corpus streamed to disk (`search.py`) and
contrastive losses (`losses.py`)."""
