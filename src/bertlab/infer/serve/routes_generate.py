"""The /generate route (registered with `serve.register_routes`): text-to-text generation with a T5 model.

    POST /generate    {"texts": [str]}   (a T5 model: --generate-model)  -> {"predictions": [{generated, ...}]}

A text with `<extra_id_N>` sentinels is span filling: the prediction also carries the spans and the text with
them filled in. Without `--generate-model` the route answers 404 saying how to enable it.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field

from .responses import json_response
from .routes import register_routes
from .service import Service


class GenerateRequest(BaseModel):
    texts: list[str] = Field(..., min_length=1, description="input texts; <extra_id_N> sentinels mark spans to fill")


class GenerateResponse(BaseModel):
    predictions: list[dict[str, Any]] = Field(
        ..., description="{generated, token_ids}, plus {spans, filled} for a text with sentinels")


@register_routes("generate")
def generate_routes(app: FastAPI, service: Service) -> None:
    models = service.models
    if models.generator is not None:
        service.batcher("generate", models.generator.generate)

    @app.post("/generate", response_model=GenerateResponse,
              summary="text-to-text generation with a T5 model (and span filling)")
    async def generate(body: GenerateRequest):
        service.need(models.generator, "generate", "--generate-model", "T5 generator")
        service.check_texts(body.texts)
        return json_response({"predictions": await service.run("generate", body.texts)})
