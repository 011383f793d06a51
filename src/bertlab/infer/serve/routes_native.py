"""bertlab's own routes (registered with `serve.register_routes`): /classify, /fill-mask, /qa and /health.

    GET  /health      {"status": "ok", "model", "endpoints": [...], "dim", "batching": {...}}
    POST /classify    {"texts": [str], "text_pairs": [str]?}          -> {"predictions": [{label, score, scores}]}
    POST /fill-mask   {"texts": [str with [MASK]], "top_k": int?}     -> {"predictions": [[[{token, score, ...}]]]}
    POST /qa          {"questions": [{"question": str, "context": str}]} -> {"answers": [{answer, start, end, score}]}

/embed {"texts": [...]} -> {"embeddings", "dim"} is served beside TEI's shape of it (routes_tei.py). /classify,
/qa and /fill-mask answer 404 with how to enable them when no model has that head.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field

from .responses import ServiceError, json_response
from .routes import register_routes
from .service import Service


class ClassifyRequest(BaseModel):
    texts: list[str] = Field(..., min_length=1)
    text_pairs: list[str] | None = Field(None, description="second texts, for sentence-pair tasks (one per text)")


class ClassifyResponse(BaseModel):
    predictions: list[dict[str, Any]] = Field(..., description="{label, score, scores} or, for regression, {score}")


class FillMaskRequest(BaseModel):
    texts: list[str] = Field(..., min_length=1, description="texts with at least one [MASK]")
    top_k: int = Field(5, ge=1, le=100)


class FillMaskResponse(BaseModel):
    predictions: list[list[list[dict[str, Any]]]] = Field(
        ..., description="per text, per [MASK], the top-k {token, token_id, score, sequence}")


class Question(BaseModel):
    question: str
    context: str


class QARequest(BaseModel):
    questions: list[Question] = Field(..., min_length=1)


class QAResponse(BaseModel):
    answers: list[dict[str, Any]] = Field(..., description="{answer, start, end, score}; start/end in characters")


class ErrorResponse(BaseModel):
    error: str
    error_type: str


@register_routes("native")
def native_routes(app: FastAPI, service: Service) -> None:
    models = service.models
    embedder = models.embedder

    @app.get("/health", summary="liveness, loaded endpoints and batching statistics")
    async def health():
        return {"status": "ok", "model": models.name, "endpoints": models.endpoints, "dim": embedder.dim,
                "batching": {name: b.stats.as_dict() for name, b in service.batchers.items()}}

    if models.classifier is not None:
        service.batcher("classify", models.classifier.predict_parsed)

    @app.post("/classify", response_model=ClassifyResponse, responses={404: {"model": ErrorResponse}},
              summary="sequence classification with the fine-tuned classifier")
    async def classify(body: ClassifyRequest):
        service.need(models.classifier, "classify", "--classify-model", "text-classification head")
        service.check_texts(body.texts)
        pairs = body.text_pairs
        if pairs is not None:
            if len(pairs) != len(body.texts):
                raise ServiceError(422, f"text_pairs: {len(pairs)} given for {len(body.texts)} texts")
            service.check_texts(pairs, "text_pairs")
        items = list(zip(body.texts, pairs if pairs is not None else [None] * len(body.texts)))
        return json_response({"predictions": await service.run("classify", items)})

    if models.fill_masker is not None:
        masker = models.fill_masker

        def fill(items: list[tuple[str, int]]) -> list:
            results = masker.fill([t for t, _ in items], max(k for _, k in items))
            return [[cands[:k] for cands in masks] for masks, (_, k) in zip(results, items)]

        service.batcher("fill-mask", fill)

    @app.post("/fill-mask", response_model=FillMaskResponse, responses={404: {"model": ErrorResponse}},
              summary="the masked LM's top-k tokens for each [MASK]")
    async def fill_mask(body: FillMaskRequest):
        service.need(models.fill_masker, "fill-mask", "--fill-mask-model", "masked-LM head")
        service.check_texts(body.texts)
        return json_response({"predictions": await service.run("fill-mask", [(t, body.top_k) for t in body.texts])})

    if models.qa is not None:
        service.batcher("qa", models.qa.predict_parsed)

    @app.post("/qa", response_model=QAResponse, responses={404: {"model": ErrorResponse}},
              summary="extractive question answering over a context (long contexts in windows)")
    async def qa(body: QARequest):
        service.need(models.qa, "qa", "--qa-model", "question-answering head")
        service.check_texts([q.question for q in body.questions], "questions")
        service.check_texts([q.context for q in body.questions], "contexts")
        return json_response({"answers": await service.run("qa", [(q.question, q.context) for q in body.questions])})
