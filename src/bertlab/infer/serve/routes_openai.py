"""OpenAI's embeddings API (registered as a route group): what every OpenAI client library speaks.

    POST /v1/embeddings  {"input": str | [str] | [int] | [[int]], "model": str, "encoding_format": "float" |
                         "base64", "dimensions": int?}
                         -> {"object": "list", "data": [{"object": "embedding", "embedding", "index"}],
                             "model", "usage": {"prompt_tokens", "total_tokens"}}
    GET  /v1/models      -> {"object": "list", "data": [{"id", "object": "model", "created", "owned_by"}]}

Token-id inputs are ids of this model's vocabulary, without [CLS]/[SEP] (added here, as for text). base64 is
the little-endian float32 bytes of each vector (what the `openai` client decodes). `dimensions` keeps the
first N dimensions and re-normalises. Embeddings are normalised as the service's are (`--normalize` /
`--no-normalize`; by default as the folder's sentence-transformers pipeline, normalised when it does not
say), and a text gets the folder's default prompt, if it names one. `model` must be the id /v1/models lists
(else 404 `model_not_found`). Errors have OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`;
a body that does not parse is 400.
"""

from __future__ import annotations

import base64
import time
from typing import Literal

import numpy as np
from fastapi import FastAPI
from pydantic import BaseModel, Field

from ...core.errors import shorten as shorten_text
from .responses import ServiceError, json_response
from .routes import register_routes
from .routes_tei import shorten
from .service import Service


class EmbeddingsRequest(BaseModel):
    input: str | list[str] | list[int] | list[list[int]] = Field(
        ..., description="a text, texts, or token ids of this model's vocabulary (one list per input)")
    model: str | None = Field(None, description="the id /v1/models lists")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, description="keep the first N dimensions, re-normalised")
    user: str | None = None


@register_routes("openai")
def openai_routes(app: FastAPI, service: Service) -> None:
    models = service.models
    embedder = models.embedder
    created = int(time.time())

    def model_not_found(model_id: str) -> ServiceError:  # OpenAI's 404 for an unknown model, code included
        return ServiceError(404, f"the model {shorten_text(model_id)} does not exist; this service serves "
                            f"{models.name!r}", param="model", code="model_not_found")

    def model_card() -> dict:
        return {"id": models.name, "object": "model", "created": created, "owned_by": "bertlab"}

    @app.get("/v1/models", summary="the model served (OpenAI's list of models)")
    async def list_models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}", summary="one model (OpenAI's model object)")
    async def get_model(model_id: str):
        if model_id != models.name:
            raise model_not_found(model_id)
        return model_card()

    def encode(inputs, truncate: bool):
        if isinstance(inputs, str):
            inputs = [inputs]
        if not inputs:
            raise ServiceError(400, "input: expected at least one text or token list", param="input")
        if isinstance(inputs[0], int):  # one list of token ids
            inputs = [inputs]
        if isinstance(inputs[0], str):
            service.check_texts(inputs, "input")
            return service.encode_texts(service.prompted(inputs, None, "input"), truncate, "input")
        if len(inputs) > service.limits.max_items:
            raise ServiceError(413, f"{len(inputs)} inputs, over the limit of {service.limits.max_items} per request")
        vocab = embedder.tokenizer.vocab_size
        for i, ids in enumerate(inputs):
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise ServiceError(400, f"input[{i}]: token id {bad} is outside the model's vocabulary (0-{vocab - 1})",
                                   param="input")
        return service.encode_documents(inputs, truncate, "input")

    @app.post("/v1/embeddings", summary="embeddings (OpenAI's API)")
    async def embeddings(body: EmbeddingsRequest):
        if body.model is not None and body.model != models.name:
            raise model_not_found(body.model)
        enc = await service.off_loop(encode, body.input, service.truncating(None))
        normalize = embedder.normalize
        vectors = shorten(await service.embed(enc, normalize), body.dimensions, normalize, embedder.dim)
        if service.metrics is not None:
            service.metrics.tokens("/v1/embeddings", enc.tokens)
        if body.encoding_format == "base64":
            data = [base64.b64encode(np.ascontiguousarray(v, dtype="<f4").tobytes()).decode("ascii") for v in vectors]
        else:
            data = vectors.tolist()
        return json_response({"object": "list",
                              "data": [{"object": "embedding", "embedding": e, "index": i} for i, e in enumerate(data)],
                              "model": models.name,
                              "usage": {"prompt_tokens": enc.tokens, "total_tokens": enc.tokens}})
