"""Prometheus metrics for the service (registered as a route group): GET /metrics in the text format.

    bertlab_requests_total{route, status}        requests answered, by route and HTTP status
    bertlab_request_duration_seconds{route}      time from the request's arrival to its answer (histogram)
    bertlab_batch_size{batcher}                  items per model call (histogram): how well requests merge
    bertlab_batch_tokens{batcher}                tokens per model call (histogram), under --max-batch-tokens
    bertlab_queue_depth                          requests admitted and not yet answered (429 past
                                                 --max-concurrent-requests)
    bertlab_input_tokens_total{route}            tokens computed for embedding requests

Each service has its own registry (several apps in one process do not mix). With `--workers N` every
worker process keeps its own numbers, so a scrape sees one worker's. Needs `prometheus-client` (in the
`serve` extra); without it /metrics answers 503 saying so.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import Response

from .responses import ServiceError
from .routes import register_routes
from .service import Service

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
SIZE_BUCKETS = tuple(2 ** k for k in range(0, 10))  # 1 .. 512 items
TOKEN_BUCKETS = tuple(2 ** k for k in range(4, 16))  # 16 .. 32768 tokens


class ServiceMetrics:
    """The service's metrics in a registry of their own."""

    def __init__(self, service: Service):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter("bertlab_requests", "requests answered", ["route", "status"], registry=self.registry)
        self.latency = Histogram("bertlab_request_duration_seconds", "time to answer a request", ["route"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("bertlab_batch_size", "items per model call", ["batcher"], buckets=SIZE_BUCKETS,
                                    registry=self.registry)
        self.batch_tokens = Histogram("bertlab_batch_tokens", "tokens per model call", ["batcher"],
                                      buckets=TOKEN_BUCKETS, registry=self.registry)
        self.queue = Gauge("bertlab_queue_depth", "requests admitted and not yet answered", registry=self.registry)
        self.queue.set_function(lambda: service.inflight)
        self.input_tokens = Counter("bertlab_input_tokens", "tokens computed for embedding requests", ["route"],
                                    registry=self.registry)

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def observe_batch(self, batcher: str, items: int, tokens: int) -> None:
        self.batch_size.labels(batcher).observe(items)
        if tokens:
            self.batch_tokens.labels(batcher).observe(tokens)

    def tokens(self, route: str, count: int) -> None:
        self.input_tokens.labels(route).inc(count)

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


@register_routes("metrics")
def metrics_routes(app: FastAPI, service: Service) -> None:
    try:
        service.metrics = ServiceMetrics(service)
    except ImportError:
        service.metrics = None

    @app.get("/metrics", summary="Prometheus metrics (text format)")
    async def metrics():
        if service.metrics is None:
            raise ServiceError(503, "metrics need prometheus-client: pip install prometheus-client "
                                    "(or the serve extra)")
        body, content_type = service.metrics.render()
        return Response(body, media_type=content_type)
