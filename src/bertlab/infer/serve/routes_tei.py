"""Hugging Face text-embeddings-inference (TEI)'s routes, with its field names (registered as a route group).

    POST /embed     {"inputs": str | [str], "normalize": true, "truncate": bool?, "truncation_direction":
                    "Right" | "Left", "dimensions": int?, "prompt_name": str?}  -> [[float]]
                    (also bertlab's own {"texts": [str]}                       -> {"embeddings": [[float]], "dim"})
    POST /predict   {"inputs": str | [str, str] | [[str] | [str, str]], "raw_scores": false, "truncate"}
                                                                               -> [{"score", "label"}] best first
                                                                                  (a list of those for a batch)
    POST /rerank    {"query": str, "texts": [str], "raw_scores": false, "return_text": false, "truncate"}
                                                                               -> [{"index", "score", "text"?}]
                                                                                  best first
    POST /tokenize  {"inputs": str | [str], "add_special_tokens": true}     -> [[{"id", "text", "special",
                                                                                   "start", "stop"}]]
    GET  /info      the model, its kind (embedding / classifier / reranker) and the service's limits

`normalize` defaults to the service's: as the folder's sentence-transformers pipeline does (a Normalize
module; true for a folder that does not say, as in TEI), the same as `bertlab embed`; `prompt_name` to the
folder's default prompt, if it names one (sentence-transformers' `encode`); `truncate` to the service's
`--on-long` (TEI's `--auto-truncate`). /predict scores are softmax probabilities (a one-output model: its
sigmoid), raw logits with `raw_scores`; /rerank needs a cross-encoder -- a sequence classifier with one output, scored on (query,
text) pairs -- loaded as the model or with `--classify-model` -- or, without one, a ColBERT folder as the model:
then the scores are MaxSim's (`routes_multivector`), or a BGE-M3 folder: then they are its hybrid of dense, sparse
and ColBERT scores (`infer.bge_m3`, weights 0.4, 0.2, 0.4). A ColBERT folder served without `--pooling` has no
/embed (424: its vectors are per token) and /info says so (pooling "colbert", its vectors' dimension).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from fastapi import FastAPI
from pydantic import BaseModel, Field

from ... import __version__
from .responses import ServiceError, json_response
from .routes import register_routes
from .service import Service


class EmbedRequest(BaseModel):
    inputs: str | list[str] | None = Field(None, description="a text or texts (TEI)")
    texts: list[str] | None = Field(None, description="texts (bertlab's own shape; the answer is then "
                                                      "{embeddings, dim})")
    normalize: bool | None = Field(None, description="L2-normalise (default: the service's, as the folder's pipeline)")
    truncate: bool | None = Field(None, description="cut a text over the model's limit instead of answering 413")
    truncation_direction: Literal["Right", "Left", "right", "left"] = "Right"
    dimensions: int | None = Field(None, ge=1, description="keep the first N dimensions (re-normalised)")
    prompt_name: str | None = Field(None, description="a prompt of the model's sentence-transformers config, put "
                                                      "before each text (default: its default prompt, if any)")


class PredictRequest(BaseModel):
    inputs: str | list[str] | list[list[str]] = Field(
        ..., description="a text, a [text, text_pair], or a batch of those ([[text], [text, pair], ...])")
    raw_scores: bool = False
    truncate: bool | None = None


class RerankRequest(BaseModel):
    query: str
    texts: list[str] = Field(..., min_length=1)
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool | None = None


class TokenizeRequest(BaseModel):
    inputs: str | list[str]
    add_special_tokens: bool = True


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def shorten(vectors: np.ndarray, dimensions: int | None, normalize: bool, dim: int, param: str = "dimensions"):
    """Matryoshka-style: the first `dimensions` of each vector, re-normalised when the vectors are."""
    if dimensions is None:
        return vectors
    if dimensions > dim:
        raise ServiceError(400, f"{param}: {dimensions} is more than the model's {dim} dimensions", param=param)
    from ..embeddings import l2_normalize

    vectors = vectors[:, :dimensions]
    return l2_normalize(vectors) if normalize else vectors


@register_routes("tei")
def tei_routes(app: FastAPI, service: Service) -> None:
    models = service.models
    embedder = models.embedder

    @app.post("/embed", summary="sentence embeddings (TEI's {inputs}, or bertlab's {texts})")
    async def embed(body: EmbedRequest):
        if (body.inputs is None) == (body.texts is None):
            raise ServiceError(422, "inputs: give the texts as \"inputs\" (or bertlab's \"texts\"), one of them")
        what = "inputs" if body.inputs is not None else "texts"
        texts = [body.inputs] if isinstance(body.inputs, str) else (body.inputs if body.inputs is not None else body.texts)
        service.check_texts(texts, what)
        texts = service.prompted(texts, body.prompt_name, what)
        normalize = embedder.normalize if body.normalize is None else body.normalize
        enc = await service.off_loop(service.encode_texts, texts, service.truncating(body.truncate), what,
                                     body.truncation_direction.lower() == "left")
        vectors = shorten(await service.embed(enc, normalize), body.dimensions, normalize, embedder.dim)
        if service.metrics is not None:
            service.metrics.tokens("/embed", enc.tokens)
        if body.texts is not None:
            return json_response({"embeddings": vectors.tolist(), "dim": vectors.shape[1]})
        return json_response(vectors.tolist())

    def classifier_limit() -> int:
        return models.classifier.max_length

    @app.post("/predict", summary="a fine-tuned classifier's labels and scores, best first")
    async def predict(body: PredictRequest):
        service.need(models.classifier, "predict", "--classify-model", "text-classification head")
        single = not (isinstance(body.inputs, list) and body.inputs and isinstance(body.inputs[0], list))
        sequences = [body.inputs] if single else body.inputs
        pairs: list[tuple[str, str | None]] = []
        for i, seq in enumerate(sequences):
            seq = [seq] if isinstance(seq, str) else seq
            if not 1 <= len(seq) <= 2:
                raise ServiceError(422, f"inputs[{i}]: expected a text or [text, text_pair], got {len(seq)} texts")
            pairs.append((seq[0], seq[1] if len(seq) == 2 else None))
        service.check_texts([a for a, _ in pairs], "inputs")
        service.check_texts([b for _, b in pairs if b is not None] or [""], "text pairs")
        predictor = models.classifier
        enc = await service.off_loop(service.encode_pairs, predictor.tokenizer, classifier_limit(),
                                     [a for a, _ in pairs], [b for _, b in pairs],
                                     service.truncating(body.truncate))
        logits = await service.classifier_logits(enc)
        labels = predictor.labels
        if body.raw_scores:
            scores = logits
        else:
            scores = _sigmoid(logits) if logits.shape[-1] == 1 else _softmax(logits)
        answers = [sorted(({"score": float(s), "label": labels[k]} for k, s in enumerate(row)),
                          key=lambda a: -a["score"]) for row in scores]
        return json_response(answers[0] if single else answers)

    @app.post("/rerank", summary="a cross-encoder's relevance of each text to the query, best first")
    async def rerank(body: RerankRequest):
        if models.classifier is None and models.hybrid is not None:  # a BGE-M3 model: its hybrid score
            service.check_texts(body.texts)
            service.check_texts([body.query], "query")
            return ranked_answer(await service.hybrid_scores(body.query, body.texts), body)
        if models.classifier is None and models.multivector is not None:  # a ColBERT model: MaxSim
            service.check_texts(body.texts)
            service.check_texts([body.query], "query")
            scores = await service.maxsim_scores(body.query, body.texts)
            return ranked_answer(scores, body)
        service.need(models.classifier, "rerank", "--classify-model", "cross-encoder (text-classification head)")
        predictor = models.classifier
        if len(predictor.labels) != 1:
            raise ServiceError(400, f"/rerank needs a cross-encoder with one output (num_labels 1); the loaded "
                                    f"classifier has {len(predictor.labels)} labels: use /predict")
        service.check_texts(body.texts)
        service.check_texts([body.query], "query")
        enc = await service.off_loop(service.encode_pairs, predictor.tokenizer, classifier_limit(),
                                     [body.query] * len(body.texts), body.texts, service.truncating(body.truncate),
                                     "texts")
        logits = (await service.classifier_logits(enc))[:, 0]
        return ranked_answer(logits if body.raw_scores else _sigmoid(logits), body)

    def ranked_answer(scores, body: RerankRequest):
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        return json_response([{"index": i, "score": float(scores[i]), **({"text": body.texts[i]}
                                                                       if body.return_text else {})} for i in order])

    def tokens_of(texts: list[str], add_special_tokens: bool) -> list[list[dict]]:
        tok = embedder.tokenizer
        enc = tok(texts, add_special_tokens=add_special_tokens, return_offsets_mapping=True,
                  return_token_type_ids=False, return_attention_mask=False)
        special = set(tok.all_special_ids)
        out = []
        for text, ids, offsets in zip(texts, enc["input_ids"], enc["offset_mapping"]):
            names = tok.convert_ids_to_tokens(ids)
            out.append([{"id": i, "text": name if i in special else text[a:b], "special": i in special,
                         "start": None if i in special else a, "stop": None if i in special else b}
                        for i, name, (a, b) in zip(ids, names, offsets)])
        return out

    @app.post("/tokenize", summary="the model's tokens of each text, with character offsets")
    async def tokenize(body: TokenizeRequest):
        texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        service.check_texts(texts, "inputs")
        return json_response(await service.off_loop(tokens_of, texts, body.add_special_tokens))

    @app.get("/info", summary="the model and the service's limits (TEI's /info)")
    async def info():
        limits = service.limits
        if models.classifier is not None and models.classifier.model is not None:
            labels = models.classifier.labels
            kind = {"reranker": {"id2label": {"0": labels[0]}}} if len(labels) == 1 else \
                {"classifier": {"id2label": {str(k): v for k, v in enumerate(labels)},
                                "label2id": {v: k for k, v in enumerate(labels)}}}
        else:
            kind = {"embedding": {"pooling": embedder.pooling if models.dense else "colbert"}}
        dim, pooling = (embedder.dim, embedder.pooling) if models.dense else (models.multivector.dim, "colbert")
        return {"model_id": models.name, "model_sha": None, "model_dtype": embedder.options.dtype,
                "model_type": kind, "max_concurrent_requests": limits.max_concurrent_requests,
                "max_input_length": embedder.max_length, "max_batch_tokens": limits.max_batch_tokens,
                "max_batch_requests": limits.max_batch_items, "max_client_batch_size": limits.max_items,
                "auto_truncate": service.auto_truncate, "tokenization_workers": 1,
                "embedding_dimension": dim, "pooling": pooling,
                "normalize": embedder.normalize, "window_overlap": embedder.window_overlap,
                "endpoints": models.endpoints, "version": __version__}
