"""`bertlab serve`: an HTTP JSON service over a BERT model (FastAPI app, uvicorn server; the `serve` extra).

Endpoints (OpenAPI description at /openapi.json, interactive at /docs):

    GET  /health      {"status": "ok", "endpoints": [...], "model": ..., "batching": {...}}
    POST /embed       {"texts": [str]}                                -> {"embeddings": [[float]], "dim": H}
    POST /classify    {"texts": [str], "text_pairs": [str]?}          -> {"predictions": [{label, score, scores}]}
    POST /fill-mask   {"texts": [str with [MASK]], "top_k": int?}     -> {"predictions": [[[{token, score, ...}]]]}
    POST /qa          {"questions": [{"question": str, "context": str}]} -> {"answers": [{answer, start, end, score}]}
    POST /generate    {"texts": [str]}   (a T5 model: --generate-model)  -> {"predictions": [{generated, ...}]}

Which endpoints answer depends on the models loaded: /embed always (any BERT); /classify, /qa, /fill-mask
when `--model` has that head (config.json "architectures", or MLM weights for fill-mask) or a model is
given for them (`--classify-model`, `--qa-model`, `--fill-mask-model`); otherwise they answer 404 with a
message saying how to enable them.

Every request goes through a `DynamicBatcher` (batcher.py): items of concurrent requests are merged into
one length-bucketed model call. Limits, each answered with a 4xx and {"error": "one line"}, after which the
service carries on: a body over `max_body_bytes` (413, checked on Content-Length and while reading),
malformed JSON (400), a body that does not match the schema (422), more than `max_items` items (413), a
text over `max_text_chars` characters (413), a text over the token limit when `on_long="reject"` (422).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..errors import BertlabError
from .batcher import DynamicBatcher, Limits
from .runtime import InferenceOptions, check_model_dir, checkpoint_keys, has_weights

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- models
@dataclass
class ServiceModels:
    """What the service runs: an embedder always, and the task models that were found or given."""

    embedder: Any
    classifier: Any = None  # Predictor (BertForSequenceClassification)
    qa: Any = None  # Predictor (BertForQuestionAnswering)
    fill_masker: Any = None  # FillMasker
    generator: Any = None  # infer.generate.Generator (a T5 model, --generate-model)
    name: str = ""

    @property
    def endpoints(self) -> list[str]:
        have = {"embed": self.embedder, "classify": self.classifier, "qa": self.qa, "fill-mask": self.fill_masker,
                "generate": self.generator}
        return [name for name, model in have.items() if model is not None]


# The kind of prediction a head serves (`HeadSpec.task`) -> the ServiceModels field (and endpoint) it fills.
TASK_ENDPOINTS = {"classify": "classifier", "qa": "qa"}


def load_models(model_dir: str | Path, options: InferenceOptions, pooling: str = "mean", normalize: bool = True,
                classify_model: str | Path | None = None, qa_model: str | Path | None = None,
                fill_mask_model: str | Path | None = None, generate_model: str | Path | None = None) -> ServiceModels:
    """Load `model_dir` (and the optional per-endpoint folders); a task model's encoder also serves /embed."""
    from ..heads import HEADS
    from ..model import BertModel
    from .embeddings import Embedder
    from .fill_mask import FillMasker
    from .predict import Predictor, find_head
    from .runtime import length_limit, load_model, load_tokenizer

    model_dir = check_model_dir(Path(model_dir))
    models = ServiceModels(embedder=None, name=str(model_dir))
    head = find_head(model_dir)  # config.json read once; a head serving no endpoint here enables none
    own = None  # a model loaded from `model_dir` whose encoder can serve /embed
    if head is not None and head.task in TASK_ENDPOINTS:
        own = Predictor.from_pretrained(model_dir, options, head.architecture)
        setattr(models, TASK_ENDPOINTS[head.task], own)
    keys = checkpoint_keys(model_dir) or set()
    if fill_mask_model is None and has_weights(keys, HEADS["masked-lm"].prefix):
        fill_mask_model = model_dir
    for task, folder in (("classify", classify_model), ("qa", qa_model)):
        if folder is not None:
            setattr(models, TASK_ENDPOINTS[task], Predictor.from_pretrained(folder, options, task=task))
    if fill_mask_model is not None:
        models.fill_masker = FillMasker.from_pretrained(fill_mask_model, options)
        if own is None and fill_mask_model == model_dir:
            own = models.fill_masker
    tokenizer = load_tokenizer(model_dir)
    # The encoder of a model loaded from `model_dir` serves /embed; only a bare encoder is loaded anew.
    encoder = getattr(own.model, own.model.base_model_prefix) if own is not None else \
        load_model(BertModel, model_dir, options)
    models.embedder = Embedder(encoder, tokenizer, pooling, normalize,
                               length_limit(model_dir, encoder.config, tokenizer, options.max_length), options)
    if generate_model is not None:
        from .generate import Generator

        models.generator = Generator.from_pretrained(generate_model, options)
    return models


# ---------------------------------------------------------------------------------------------- schemas
class EmbedRequest(BaseModel):
    texts: list[str] = Field(..., min_length=1, description="texts to embed")


class EmbedResponse(BaseModel):
    embeddings: list[list[float]]
    dim: int


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


class GenerateRequest(BaseModel):
    texts: list[str] = Field(..., min_length=1, description="input texts; <extra_id_N> sentinels mark spans to fill")


class GenerateResponse(BaseModel):
    predictions: list[dict[str, Any]] = Field(
        ..., description="{generated, token_ids}, plus {spans, filled} for a text with sentinels")


class ErrorResponse(BaseModel):
    error: str


# ---------------------------------------------------------------------------------------------- the app
class BodyLimit:
    """ASGI middleware: a request body over `limit` bytes is answered 413 -- from Content-Length before
    reading anything, or, for a body sent without it, as soon as the bytes read pass the limit."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await _error(413, self.message)(scope, receive, send)
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:  # FastAPI re-raises an HTTPException met while reading the body
                    raise HTTPException(413, self.message)
            return message

        await self.app(scope, limited_receive, send)

    @property
    def message(self) -> str:
        return f"request body over the limit of {self.limit} bytes"


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _json(payload: Any) -> Response:
    # json.dumps directly: FastAPI's generic encoder walks every float of large embedding lists.
    return Response(json.dumps(payload, ensure_ascii=False, separators=(",", ":")), media_type="application/json")


class ServiceError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def create_app(models: ServiceModels, limits: Limits | None = None):
    """The ASGI application: the FastAPI app (routes, error handlers, one dynamic batcher per endpoint) inside
    the body-size limit. Serve it with `serve` or any ASGI server."""
    limits = limits or Limits()
    app = FastAPI(title="bertlab", version=__version__,
                  description="BERT embeddings and predictions over HTTP, with dynamic batching of concurrent "
                              f"requests. Limits: {limits.max_items} items per request, {limits.max_text_chars} "
                              f"characters per text, {limits.max_body_bytes} bytes per body.")
    batchers: dict[str, DynamicBatcher] = {}
    executor = None

    def batcher(name: str, fn) -> DynamicBatcher:
        nonlocal executor
        from concurrent.futures import ThreadPoolExecutor

        executor = executor or ThreadPoolExecutor(1, thread_name_prefix="bertlab-model")
        batchers[name] = DynamicBatcher(fn, executor, limits.max_batch_items, limits.max_wait_ms / 1000)
        return batchers[name]

    def check_texts(texts: list[str], what: str = "texts") -> None:
        if len(texts) > limits.max_items:
            raise ServiceError(413, f"{len(texts)} {what}, over the limit of {limits.max_items} per request")
        for i, t in enumerate(texts):
            if len(t) > limits.max_text_chars:
                raise ServiceError(413, f"{what}[{i}]: {len(t)} characters, over the limit of "
                                        f"{limits.max_text_chars}")

    def need(model: Any, endpoint: str, flag: str, head: str) -> None:
        if model is None:
            raise ServiceError(404, f"/{endpoint} is not available: the loaded model has no {head}; start the "
                                    f"service with {flag} DIR")

    async def submit(name: str, items: list) -> list:
        try:
            return await batchers[name].submit(items)
        except BertlabError as e:
            raise ServiceError(422, str(e)) from None

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError):
        return _error(exc.status, str(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {}
        kind = request.headers.get("content-type", "")
        if "json" not in kind:  # FastAPI reads a body as JSON only when it is labelled so (curl -d is not)
            return _error(415, f"expected a JSON body with Content-Type: application/json, got {kind or 'none'!r}")
        if first.get("type") == "json_invalid":
            loc = first.get("loc", ())
            at = f" at character {loc[1]}" if len(loc) > 1 else ""
            return _error(400, f"malformed JSON{at}: {first.get('ctx', {}).get('error', first.get('msg', ''))}")
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
        return _error(422, f"{where}: {first.get('msg', 'invalid request')}")

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception):
        log.exception("request failed")
        return _error(500, f"internal error: {type(exc).__name__}: {exc}")

    # -------------------------------------------------------------------------------- routes
    embedder = models.embedder
    batcher("embed", lambda texts: list(embedder.embed(texts)))

    @app.get("/health", summary="liveness, loaded endpoints and batching statistics")
    async def health():
        return {"status": "ok", "model": models.name, "endpoints": models.endpoints, "dim": embedder.dim,
                "batching": {name: b.stats.as_dict() for name, b in batchers.items()}}

    @app.post("/embed", response_model=EmbedResponse, responses={413: {"model": ErrorResponse}},
              summary=f"sentence embeddings ({embedder.pooling} pooling"
                      f"{', L2-normalised' if embedder.normalize else ''})")
    async def embed(body: EmbedRequest):
        check_texts(body.texts)
        vectors = await submit("embed", body.texts)
        return _json({"embeddings": [v.tolist() for v in vectors], "dim": embedder.dim})

    if models.classifier is not None:
        batcher("classify", models.classifier.predict_parsed)

    @app.post("/classify", response_model=ClassifyResponse, responses={404: {"model": ErrorResponse}},
              summary="sequence classification with the fine-tuned classifier")
    async def classify(body: ClassifyRequest):
        need(models.classifier, "classify", "--classify-model", "sequence-classification head")
        check_texts(body.texts)
        pairs = body.text_pairs
        if pairs is not None:
            if len(pairs) != len(body.texts):
                raise ServiceError(422, f"text_pairs: {len(pairs)} given for {len(body.texts)} texts")
            check_texts(pairs, "text_pairs")
        items = list(zip(body.texts, pairs if pairs is not None else [None] * len(body.texts)))
        return _json({"predictions": await submit("classify", items)})

    if models.fill_masker is not None:
        masker = models.fill_masker

        def fill(items: list[tuple[str, int]]) -> list:
            results = masker.fill([t for t, _ in items], max(k for _, k in items))
            return [[cands[:k] for cands in masks] for masks, (_, k) in zip(results, items)]

        batcher("fill-mask", fill)

    @app.post("/fill-mask", response_model=FillMaskResponse, responses={404: {"model": ErrorResponse}},
              summary="the masked LM's top-k tokens for each [MASK]")
    async def fill_mask(body: FillMaskRequest):
        need(models.fill_masker, "fill-mask", "--fill-mask-model", "masked-LM head")
        check_texts(body.texts)
        return _json({"predictions": await submit("fill-mask", [(t, body.top_k) for t in body.texts])})

    if models.qa is not None:
        batcher("qa", models.qa.predict_parsed)

    @app.post("/qa", response_model=QAResponse, responses={404: {"model": ErrorResponse}},
              summary="extractive question answering over a context (long contexts in windows)")
    async def qa(body: QARequest):
        need(models.qa, "qa", "--qa-model", "question-answering head")
        check_texts([q.question for q in body.questions], "questions")
        check_texts([q.context for q in body.questions], "contexts")
        return _json({"answers": await submit("qa", [(q.question, q.context) for q in body.questions])})

    if models.generator is not None:
        batcher("generate", models.generator.generate)

    @app.post("/generate", response_model=GenerateResponse, responses={404: {"model": ErrorResponse}},
              summary="text-to-text generation with a T5 model (and span filling)")
    async def generate(body: GenerateRequest):
        need(models.generator, "generate", "--generate-model", "T5 generator")
        check_texts(body.texts)
        return _json({"predictions": await submit("generate", body.texts)})

    return BodyLimit(app, limits.max_body_bytes)


# ---------------------------------------------------------------------------------------------- running
@dataclass
class RunningServer:
    """A server started in a background thread (tests, notebooks): `.url`, and `.stop()`."""

    server: Any
    thread: threading.Thread
    port: int
    host: str = "127.0.0.1"
    extra: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)


def start_in_thread(app, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0) -> RunningServer:
    """Serve `app` from a daemon thread on `host:port` (0: a free port) and wait until it accepts."""
    import time

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    return RunningServer(server, thread, sock.getsockname()[1], host)


def serve(app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Run the service in the foreground until Ctrl-C (uvicorn, one process, one event loop)."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level=log_level, lifespan="off")
