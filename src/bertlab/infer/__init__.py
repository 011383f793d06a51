"""Using a trained model without training it: features, embeddings, fill-mask, batch prediction, the HTTP service.

    runtime.py      device, precision, threads, loading a model with the head a command needs, length limits
    inputs.py       reading one item per line (text or JSON) and tokenizing under the length limit
    length_buckets.py  length bucketing: similar lengths batched together, so compute goes to real tokens
    outputs.py      JSON Lines, .npy and safetensors writers that stream (bounded memory for large jobs)
    features.py     per-token / per-word hidden states of chosen layers (Google's extract_features.py)
    embeddings.py   sentence embeddings: cls / mean / max pooling, L2 normalisation
    fill_mask.py    top-k tokens for each [MASK]
    predict.py      any fine-tuned model (classification, NER, QA, multiple choice) over JSON Lines
    dynamic_batcher.py dynamic batching of concurrent requests under a token budget; the service's limits
    serve/          the HTTP service (`serve` extra): service.py (models, limits, back-pressure), responses.py
                    (errors in each API's shape), routes.py (the route registry) and its groups:
                    routes_native.py (/classify, /fill-mask, /qa, /health), routes_tei.py (text-embeddings-
                    inference's /embed, /predict, /rerank, /tokenize, /info), routes_openai.py (/v1/embeddings,
                    /v1/models), routes_metrics.py (Prometheus /metrics), routes_generate.py (T5's /generate);
                    app.py (the ASGI app, its middleware), process.py (binding, workers, shutdown)

Submodules are imported where used; importing `bertlab.infer` itself loads torch and the engine registry
(`engines.py`: the peer engines' own packages load only when one is used).
"""

from . import engines  # noqa: E402,F401  registers the peer engines' loaders (runtime.ENGINE_LOADERS); torch only
