"""Retrieval data and metrics: BEIR-layout folders and their CSV/JSONL equivalents, pairs and triplets files,
and the ranking metrics of `trec_eval` (`data.py`, `pairs.py`, `metrics.py`)."""
