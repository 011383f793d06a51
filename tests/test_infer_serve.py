"""The HTTP service on loopback, bertlab's own routes: every endpoint answers; malformed JSON, oversize bodies,
too many or too long texts and unavailable endpoints get a 4xx with a one-line message (TEI's error shape:
{"error", "error_type"}); the service keeps answering afterwards; concurrent requests are batched together.
The OpenAI and TEI routes and the operational limits are in test_infer_serve_api.py."""

from __future__ import annotations

import http.client
import json
import threading

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from bertlab.infer.dynamic_batcher import Limits  # noqa: E402
from bertlab.infer.embeddings import Embedder  # noqa: E402
from bertlab.infer.runtime import InferenceOptions  # noqa: E402
from bertlab.infer.serve import create_app, load_models, start_in_thread  # noqa: E402

from infer_support import tiny_model  # noqa: E402

LIMITS = Limits(max_body_bytes=4096, max_items=8, max_text_chars=300, max_wait_ms=20)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    return {"cls": tiny_model(root / "cls", "BertForSequenceClassification", id2label={0: "neg", 1: "pos"}),
            "qa": tiny_model(root / "qa", "BertForQuestionAnswering", seed=1),
            "mlm": tiny_model(root / "mlm", "BertForPreTraining", seed=2)}


@pytest.fixture(scope="module")
def server(dirs):
    models = load_models(dirs["cls"], InferenceOptions(on_long="reject"), qa_model=dirs["qa"],
                         fill_mask_model=dirs["mlm"])
    running = start_in_thread(create_app(models, LIMITS))
    yield running
    running.stop()


def call(server, method, path, body=None, raw: bytes | None = None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    payload = json.loads(resp.read() or b"null")
    conn.close()
    return resp.status, payload


def test_every_endpoint_answers(server, dirs):
    status, health = call(server, "GET", "/health")
    assert status == 200 and health["status"] == "ok"
    assert set(health["endpoints"]) == {"embed", "classify", "qa", "fill-mask"}
    status, out = call(server, "POST", "/embed", {"texts": ["the cat sat", "a dog"]})
    assert status == 200 and out["dim"] == 32 and len(out["embeddings"]) == 2
    expected = Embedder.from_pretrained(dirs["cls"], normalize=True).embed(["the cat sat", "a dog"])
    np.testing.assert_allclose(out["embeddings"], expected, atol=1e-5)
    status, out = call(server, "POST", "/classify", {"texts": ["the cat", "a dog"], "text_pairs": ["sat", "good"]})
    assert status == 200 and [p["label"] in ("neg", "pos") for p in out["predictions"]] == [True, True]
    status, out = call(server, "POST", "/fill-mask", {"texts": ["the [MASK] sat ."], "top_k": 3})
    assert status == 200 and len(out["predictions"][0][0]) == 3
    context = "john lives in london ."
    status, out = call(server, "POST", "/qa", {"questions": [{"question": "where ?", "context": context}]})
    answer = out["answers"][0]
    assert status == 200 and answer["answer"] == context[answer["start"]:answer["end"]]
    status, spec = call(server, "GET", "/openapi.json")
    assert status == 200 and {"/embed", "/classify", "/fill-mask", "/qa", "/health"} <= set(spec["paths"])


@pytest.mark.parametrize("case", ["malformed", "schema", "oversize", "oversize-chunked", "too-many", "too-long",
                                  "over-token-limit", "no-mask", "not-found"])
def test_bad_requests_get_4xx_and_a_message_then_service_continues(server, case):
    requests = {
        "malformed": dict(raw=b'{"texts": ["a", }', expect=400, match="malformed JSON"),
        "schema": dict(body={"texts": "not a list"}, expect=422, match="texts"),
        "oversize": dict(raw=json.dumps({"texts": ["the cat"] * 1000}).encode(), expect=413, match="4096 bytes"),
        "oversize-chunked": dict(raw=None, expect=413, match="4096 bytes"),
        "too-many": dict(body={"texts": ["a"] * 9}, expect=413, match="9 texts, over the limit of 8"),
        "too-long": dict(body={"texts": ["a", "x" * 301]}, expect=413, match=r"texts\[1\]: 301 characters"),
        "over-token-limit": dict(body={"texts": ["a " * 140]}, expect=413, match="142 tokens, over the model's limit of 128"),
        "no-mask": dict(path="/fill-mask", body={"texts": ["no mask"]}, expect=422, match=r"no \[MASK\]"),
        "not-found": dict(path="/nope", body={}, expect=404, match="Not Found"),
    }
    r = requests[case]
    if case == "oversize-chunked":  # no Content-Length: the limit is enforced while reading
        status, out = chunked_post(server, "/embed", json.dumps({"texts": ["the cat"] * 1000}).encode())
    else:
        status, out = call(server, "POST", r.get("path", "/embed"), r.get("body"), raw=r.get("raw"))
    assert status == r["expect"], out
    assert set(out) == {"error", "error_type"} and "\n" not in out["error"]
    import re

    assert re.search(r["match"], out["error"]), out["error"]
    assert call(server, "POST", "/embed", {"texts": ["still here"]})[0] == 200


def chunked_post(server, path, data: bytes):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.putrequest("POST", path)
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    try:
        for i in range(0, len(data), 1000):
            piece = data[i:i + 1000]
            conn.send(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        conn.send(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    resp = conn.getresponse()
    out = json.loads(resp.read())
    conn.close()
    return resp.status, out


def test_unavailable_endpoint_says_how_to_enable_it(dirs):
    # found by its weights; the masked-LM head also serves SPLADE vectors
    assert load_models(dirs["mlm"], InferenceOptions()).endpoints == ["embed", "fill-mask", "embed_sparse"]
    models = load_models(dirs["qa"], InferenceOptions())
    assert models.endpoints == ["embed", "qa"]
    running = start_in_thread(create_app(models, LIMITS))
    try:
        status, out = call(running, "POST", "/classify", {"texts": ["a"]})
        assert status == 404 and "--classify-model DIR" in out["error"]
    finally:
        running.stop()


def test_concurrent_requests_are_batched_and_all_succeed(server):
    results = []

    def client(i):
        results.append(call(server, "POST", "/embed", {"texts": [f"the cat {'sat ' * (i % 7)}"]})[0])

    before = call(server, "GET", "/health")[1]["batching"].get("embed-rows", {"requests": 0, "batches": 0})
    threads = [threading.Thread(target=client, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = call(server, "GET", "/health")[1]["batching"]["embed-rows"]
    assert results == [200] * 24
    assert after["requests"] - before["requests"] == 24
    assert after["batches"] - before["batches"] < 24  # some requests shared a model call
