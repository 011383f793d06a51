"""The ASGI application: every registered route group on one FastAPI app, its error handlers (one line in the
shape of the API asked) and the middleware around it (the API key, the body-size limit, request metrics).
"""

from __future__ import annotations

import hmac
import importlib
import logging
import time
from collections.abc import Sequence

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ... import __version__
from ..dynamic_batcher import Limits
from .responses import ServiceError, error_response
from .routes import ROUTE_GROUPS, ROUTE_MODULES
from .service import Service, ServiceModels

log = logging.getLogger(__name__)

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

