"""text-embeddings-inference (TEI)'s sparse route, with its field names (registered as a route group).

    POST /embed_sparse  {"inputs": str | [str], "truncate": bool?, "truncation_direction": "Right" | "Left",
                         "prompt_name": str?}                -> [[{"index": token id, "value": weight}]]

One list per input (a single string too), each the text's non-zero SPLADE weights (`infer/sparse.py`) in
ascending token id, as TEI answers. Served when the model folder has a masked-LM head with its weights (a
SparseEncoder folder, or any masked-LM checkpoint) -- or a BGE-M3 folder: its lexical weights (`infer.bge_m3`);
otherwise 424, TEI's status for a model that is not a
SPLADE model. `truncate` defaults to the service's `--on-long`; `prompt_name` picks a prompt of the folder's
sentence-transformers config and puts it before each input, as TEI does (without one: the folder's default
prompt, if it names one, as `/embed`).
"""

from __future__ import annotations

from typing import Literal

from fastapi import FastAPI
from pydantic import BaseModel, Field

from .responses import ServiceError, json_response
from .routes import register_routes
from .service import Encoded, Service


class EmbedSparseRequest(BaseModel):
    inputs: str | list[str] = Field(..., description="a text or texts")
    truncate: bool | None = Field(None, description="cut a text over the model's limit instead of answering 413")
    truncation_direction: Literal["Right", "Left", "right", "left"] = "Right"
    prompt_name: str | None = Field(None, description="a prompt of the model's sentence-transformers config")


@register_routes("tei-sparse")
def sparse_routes(app: FastAPI, service: Service) -> None:
    def encoded(texts: list[str], truncate: bool, from_left: bool) -> Encoded:
        encoder = service.models.sparse
        tok, limit = encoder.tokenizer, encoder.max_length
        rows = []
        for i, ids in enumerate(tok(texts, add_special_tokens=False, return_token_type_ids=False,
                                    return_attention_mask=False)["input_ids"]):
            if len(ids) + 2 > limit:
                if not truncate:
                    raise service.too_long("inputs", i, len(ids) + 2, limit)
                ids = ids[len(ids) - (limit - 2):] if from_left else ids[:limit - 2]
            rows.append([tok.cls_token_id, *ids, tok.sep_token_id])
        return Encoded(rows, None, list(range(len(rows))), sum(map(len, rows)))

    def weights(rows: list[list[int]]) -> list:  # on the model thread
        sparse = service.models.sparse.encode_ids(rows)
        return [[{"index": int(t), "value": float(v)} for t, v in zip(*sparse.row(k))] for k in range(len(rows))]

    @app.post("/embed_sparse", summary="sparse (SPLADE) token weights of each input, TEI's shape")
    async def embed_sparse(body: EmbedSparseRequest):
        encoder = service.models.sparse
        if encoder is None:
            raise ServiceError(424, "/embed_sparse needs a model with a masked-LM head (a SPLADE model); the "
                                    "served folder has none", kind="Backend")
        texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
        service.check_texts(texts, "inputs")
        texts = service.prompted(texts, body.prompt_name, "inputs")
        enc = await service.off_loop(encoded, texts, service.truncating(body.truncate),
                                     body.truncation_direction.lower() == "left")
        service.batcher("sparse-rows", weights)
        answer = await service.run("sparse-rows", enc.rows, enc.tokens)
        if service.metrics is not None:
            service.metrics.tokens("/embed_sparse", enc.tokens)
        return json_response(answer)
