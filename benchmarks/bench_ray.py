"""`bertlab embed --ray local` against the one-process `bertlab embed`: rows/s on the same rows, 1 and 2 actors,
and whether the vectors and ids agree.

    python benchmarks/bench_ray.py [--rows 20000] [--model all-MiniLM-L6-v2] [--actors 1,2] [--json out.json]

Data: WikiText-2's test and validation text and the first 1,018 lines of its training text (`../shared/data/wikitext-2`), headings and blank lines dropped, each
paragraph cut into sentences at " . " (19,570), then the paragraphs whole; the first `--rows` as one Parquet
table (`id`, `text`). Each
command runs as its own process (the CLI's path: fp32, CPU, one thread per model -- `--threads 1` -- so one
actor is one core); the time is the process's wall clock, start-up included (Ray's start is part of `--ray
local`). Parity: the Ray output's ids equal the one-process output's, and the minimum cosine of the vectors.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
DATA = ROOT.parent / "shared" / "data" / "wikitext-2"


def sentences(n: int) -> list[str]:
    out: list[str] = []
    paragraphs: list[str] = []
    for name in ("wiki.test.raw", "wiki.valid.raw", "wiki.train.raw.first1018lines"):
        for line in (DATA / name).read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if not line or line.startswith("="):
                continue
            paragraphs.append(line)
            out += [s.strip() + " ." for s in line.split(" . ") if s.strip()]
    out += paragraphs  # 19,570 sentences; then whole paragraphs (up to the model's 256 tokens)
    if len(out) < n:
        raise SystemExit(f"only {len(out)} sentences in {DATA}")
    return out[:n]


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "bertlab", "--log-level", "WARNING", *argv], capture_output=True,
                         text=True)
    if run.returncode != 0:
        raise SystemExit(run.stderr[-3000:])
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--model", default="all-MiniLM-L6-v2")
    ap.add_argument("--actors", default="1,2")
    ap.add_argument("--json")
    args = ap.parse_args()
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bertlab.infer.ray_data import read_output

    texts = sentences(args.rows)
    results = {"rows": args.rows, "model": args.model, "cpus": os.cpu_count(), "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        table = Path(tmp) / "wikitext.parquet"
        pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), table)
        common = ["--model", args.model, "--input", str(table), "--threads", "1"]
        one = Path(tmp) / "one.npy"
        seconds = timed(["embed", *common, "--output", str(one)])
        vectors = np.load(one)
        ids = json.loads(Path(str(one) + ".ids.json").read_text())
        results["runs"].append({"how": "one process", "seconds": round(seconds, 1),
                                "rows_per_s": round(args.rows / seconds, 1)})
        print(f"one process: {seconds:.1f} s, {args.rows / seconds:.1f} rows/s", flush=True)
        for n in (int(a) for a in args.actors.split(",")):
            out = Path(tmp) / f"ray{n}"
            seconds = timed(["embed", *common, "--output", str(out), "--ray", "local", "--ray-actors", str(n)])
            got = read_output(out)
            vec = np.array(got.column("embedding").to_pylist(), dtype=np.float32)
            cos = float(((vec * vectors).sum(1) / np.linalg.norm(vec, axis=1) / np.linalg.norm(vectors, axis=1)).min())
            same_ids = got.column("id").to_pylist() == ids
            results["runs"].append({"how": f"--ray local, {n} actor(s)", "seconds": round(seconds, 1),
                                    "rows_per_s": round(args.rows / seconds, 1), "min_cosine": cos,
                                    "same_ids": same_ids})
            print(f"--ray local, {n} actor(s): {seconds:.1f} s, {args.rows / seconds:.1f} rows/s, "
                  f"min cosine {cos:.7f}, same ids {same_ids}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
