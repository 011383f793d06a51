"""Running the service: `ServeSpec` (what a server process loads), `bind` (the port taken first, a busy one is one
clear line), `serve` (one process or `workers` processes sharing the socket, SIGTERM finishing the requests in
flight) and `start_in_thread` (a server in a background thread, for tests and notebooks).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.errors import BertlabError
from ..dynamic_batcher import Limits
from ..runtime import InferenceOptions
from .app import create_app
from .service import ServiceModels, load_models

log = logging.getLogger(__name__)

# A worker that dies on its own is replaced (`serve`), unless workers died more than MAX_RESTARTS times each
# within RESTART_WINDOW_S: then something is wrong with every one of them (memory, the model) and the service
# stops with status 1 instead of restarting forever.
MAX_RESTARTS = 3
RESTART_WINDOW_S = 60


@dataclass
class ServeSpec:
    """Everything a server process needs to build the app (picklable: `--workers` processes each load it)."""

    model: Path
    options: InferenceOptions
    limits: Limits = field(default_factory=Limits)
    pooling: str | None = None
    normalize: bool | None = None  # None: as the folder's pipeline does
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
    from multiprocessing.connection import wait

    context = multiprocessing.get_context("spawn")

    def start(i: int):
        process = context.Process(target=_worker, args=(spec, sock, log_level), name=f"bertlab-serve-{i}")
        process.start()
        return process

    processes = [start(i) for i in range(workers)]
    if announce:
        announce(None)

    received: list[int] = []

    def forward(signum, frame):
        received.append(signum)
        # This process's copy of the listening socket goes first: while it stays open the kernel keeps queueing
        # new connections that no worker will accept, and resets them when this process exits; closed, once the
        # workers have closed theirs, a new client is refused (never accepted, so never lost).
        sock.close()
        for p in processes:
            if p.is_alive():
                os.kill(p.pid, signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    replaced: list[float] = []  # when workers were replaced: a worker that keeps dying is not restarted forever
    failed = False
    try:
        while any(p.exitcode is None for p in processes):
            # (a timeout too: each worker's exit status is also polled once a second, whatever the sentinels say)
            wait([p.sentinel for p in processes if p.exitcode is None], timeout=1.0)
            for i, p in enumerate(processes):
                if p.exitcode is None or received or failed:
                    continue
                # A worker died on its own (killed, out of memory): its requests in flight are lost, but the
                # port keeps its full capacity -- a replacement takes its place, and says so.
                now = time.monotonic()
                replaced[:] = [t for t in replaced if now - t < RESTART_WINDOW_S] + [now]
                if len(replaced) > MAX_RESTARTS * workers:
                    log.error("bertlab serve: workers keep dying (%d replaced in %ds, the last with exit status "
                              "%s); stopping", len(replaced) - 1, RESTART_WINDOW_S, p.exitcode)
                    forward(signal.SIGTERM, None)
                    received.clear()  # stopped for a failure, not by a signal: exit status 1 below
                    failed = True
                    break
                log.warning("bertlab serve: worker %d (pid %d) exited with status %s; starting a replacement",
                            i, p.pid, p.exitcode)
                processes[i] = start(i)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    stopped = {-signal.SIGTERM, -signal.SIGINT, 0}
    if received:  # end as a single server does (uvicorn re-raises the signal): 143 for SIGTERM, 130 for Ctrl-C
        signal.raise_signal(received[0])
    return 0 if all(p.exitcode in stopped for p in processes) else 1


def _worker(spec: ServeSpec, sock: socket.socket, log_level: str) -> None:
    from ...core.threads import set_threads

    set_threads(spec.options.threads)
    _server(spec.app(), log_level).run(sockets=[sock])
