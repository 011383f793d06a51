"""The multi-vector route (registered with `serve.register_routes`): a ColBERT folder's vectors per token.

    POST /embed_multivector  {"inputs": str | [str], "kind": "document" | "query"}  -> [[[float]]]
                             each text's L2-normalised token vectors: a query's `query_length` of them ([MASK]
                             augmentation), a document's kept tokens (punctuation dropped)

With a ColBERT folder as the model, TEI's `/rerank` ({"query", "texts"} -> [{"index", "score"}] best first)
scores by MaxSim when no cross-encoder is loaded (`Service.maxsim_scores`); its scores are the raw MaxSim sums
(`raw_scores` changes nothing). A BGE-M3 folder answers its ColBERT vectors (queries and documents alike) and
/rerank by its hybrid score (`infer.bge_m3`). Without either the route answers 404 saying so.
"""

from __future__ import annotations

from typing import Literal

from fastapi import FastAPI
from pydantic import BaseModel, Field

from .responses import json_response
from .routes import register_routes
from .service import Service


class MultiVectorRequest(BaseModel):
    inputs: str | list[str] = Field(..., description="a text or texts")
    kind: Literal["document", "query"] = Field("document", description="embed as documents or as queries")


@register_routes("multivector")
def multivector_routes(app: FastAPI, service: Service) -> None:
    models = service.models

    @app.post("/embed_multivector", summary="a ColBERT model's vectors per token (queries or documents)")
    async def embed_multivector(body: MultiVectorRequest):
        service.need(models.multivector, "embed_multivector", "--model", "ColBERT projection (a PyLate folder)")
        texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        service.check_texts(texts, "inputs")
        vectors = await service.multivector_embed(texts, body.kind)
        return json_response([v.tolist() for v in vectors])
