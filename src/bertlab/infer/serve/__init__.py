"""`bertlab serve`: an HTTP service over a BERT model (FastAPI app, uvicorn server; the `serve` extra).

The routes come in groups, each a function registered with `@register_routes(name)` in its own module
(`ROUTE_MODULES`), given the app and the `Service`; a new route is a new group (or a line in one):

    routes_native.py    our own JSON: /embed {"texts"}, /classify, /fill-mask, /qa, /health
    routes_tei.py       Hugging Face text-embeddings-inference's routes and field names: /embed {"inputs"},
                        /predict, /rerank, /tokenize, /info
    routes_sparse.py    TEI's /embed_sparse: SPLADE weights from the served folder's masked-LM head
    routes_openai.py    OpenAI's POST /v1/embeddings and GET /v1/models
    routes_metrics.py   /metrics in the Prometheus text format
    routes_generate.py  /generate: text-to-text generation and span filling with a T5 model (--generate-model)
    routes_multivector.py  /embed_multivector: a ColBERT folder's vectors per token (it also makes /rerank MaxSim)

`Service` is what every route shares: the models, the limits, one dynamic batcher per kind of model call
(`infer/dynamic_batcher.py`: concurrent requests merged under a token budget), tokenization off the event loop,
the length rule and back-pressure:

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

The package: `service.py` (the models and the `Service`), `responses.py` (errors and JSON bodies), `routes.py`
(the route registry), the route groups `routes_*.py`, `app.py` (the ASGI app and its middleware) and
`process.py` (binding, serving, workers). Every name is importable from here, as from `bertlab.infer.serve`
before it was a package.
"""

from ..dynamic_batcher import Limits  # noqa: F401
from ..runtime import InferenceOptions  # noqa: F401
from .app import PUBLIC_PATHS, ServiceMiddleware, create_app  # noqa: F401
from .process import RunningServer, ServeSpec, bind, serve, start_in_thread  # noqa: F401
from .responses import (ERROR_KINDS, OPENAI_CODES, OPENAI_TYPES, ServiceError, error_response,  # noqa: F401
                        json_response)
from .routes import ROUTE_GROUPS, ROUTE_MODULES, RouteGroup, register_routes  # noqa: F401
from .service import (GENERIC_NAMES, TASK_ENDPOINTS, TRIM_EVERY_S, Encoded, Service, ServiceModels,  # noqa: F401
                      load_models, model_name)

