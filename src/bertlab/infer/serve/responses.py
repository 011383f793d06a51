"""The service's answers: `ServiceError` (a request answered with a status and a one-line message), errors in the
shape of the API asked (OpenAI's under /v1/, text-embeddings-inference's elsewhere) and JSON bodies.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse, Response


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

