"""A large own-data file: `bertlab finetune text-classification` on a 1,000,000-row CSV -- peak RSS and the
time to the first optimizer step.

    python benchmarks/bench_big_csv.py [--rows 1000000] [--model DIR] [--max-steps 5] [--eval-limit 2000]
        [--threads N] [--json out.json]

Data: a generated CSV (`text,label`, ~55 bytes a row: 6-16 common words, a label by a simple rule) written to
a temporary folder (1,000,000 rows: ~55 MB). Model: all-MiniLM-L6-v2 or `--model`. One `bertlab finetune`
process (the CLI's path, fp32, CPU, batch 32, no validation file: 10% held out, stratified), stopped after
`--max-steps` steps and scored on `--eval-limit` dev rows. Measured: the time from the process start to its
first optimizer step (the first line of the run's metrics.jsonl), the peak RSS up to then (sampled every
0.1 s) and over the whole run (the child's `ru_maxrss`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bertlab.cli.demo import installed_minilm  # noqa: E402

WORDS = ("the a of to and in is was for on that with as by at from his her it an were are which this be or has "
         "had market team film game city music river school power water party world house police court light "
         "money").split()


def write_csv(path: Path, rows: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        f.write("text,label\n")
        for _ in range(rows):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 16)))
            f.write(f"{text},{'pos' if 'film' in text or 'music' in text else 'neg'}\n")
    return path.stat().st_size


def rss_mb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) // 1024
    except (OSError, StopIteration):
        return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--model", default=None)
    p.add_argument("--max-steps", type=int, default=5)
    p.add_argument("--eval-limit", type=int, default=2000)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    model = args.model or str(installed_minilm())
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "big.csv"
        size = write_csv(data, args.rows)
        out = Path(tmp) / "out"
        cmd = [sys.executable, "-m", "bertlab", "--log-level", "WARNING", "finetune", "text-classification",
               "--model", model, "--train", str(data), "--out", str(out), "--batch-size", "32",
               "--max-steps", str(args.max_steps), "--eval-limit", str(args.eval_limit), "--no-progress"]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": str(args.threads)}
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        first_step = peak_before = None
        peak = 0
        while proc.poll() is None:
            peak = max(peak, rss_mb(proc.pid))
            if first_step is None and any(f.stat().st_size for f in out.glob("runs/*/metrics.jsonl")):
                first_step, peak_before = time.perf_counter() - t0, peak
            time.sleep(0.1)
        _, status, usage = os.wait4(proc.pid, 0) if proc.returncode is None else (0, proc.returncode, None)
        seconds = time.perf_counter() - t0
        err = proc.stderr.read()
        if proc.returncode:
            raise SystemExit(f"finetune failed:\n{err[-2000:]}")
        import resource
        whole = (usage.ru_maxrss if usage else resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) // 1024
    row = {"rows": args.rows, "file_mb": round(size / 1e6, 1), "threads": args.threads,
           "seconds_to_first_step": round(first_step, 1) if first_step else None,
           "peak_rss_mb_to_first_step": peak_before, "peak_rss_mb_whole_run": whole, "seconds": round(seconds, 1)}
    print(json.dumps(row, indent=2))
    if args.json:
        args.json.write_text(json.dumps(row, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
