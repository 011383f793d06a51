"""Pre-training speed by thread count, alone and beside one busy process: the new default vs 2 threads vs 1.

    .venv/bin/python benchmarks/bench_threads.py [--steps 150] [--rounds 3] [--busy torch|spin]
        [--variants default,2,1] [--json results.json]

What runs: README command 1's training (`bertlab pretrain --demo`'s BERT-Tiny on its Python-docs data, batch
64 x 64 tokens, MLM + NSP), as `bertlab pretrain --model CONFIG --data DATA --steps N --threads T` in its own
process per measurement, so that each process chooses its threads and OpenMP wait policy at its start as a user's
does. Variants: `default` (no --threads: the machine's free physical cores, OMP_WAIT_POLICY=PASSIVE when it is
busy -- bertlab/core/threads.py), `2` and `1` (--threads 2 / 1; the wait policy still follows the machine), and
`torch` (as before bertlab chose: torch imported first, so OpenMP keeps its own wait policy, and torch's default
of one thread per logical CPU).

Conditions: `alone`, and `busy` -- beside one CPU-bound process this script starts and stops itself:
`--busy torch` (default) another job's training as torch runs it by default (a 512 x 512 matmul loop on every
logical CPU, OpenMP workers spinning), `--busy spin` a pure-Python loop on one core.

Reported per variant and condition: median tokens/s over steps 6..N of each run (the first steps pay one-off
costs), median over rounds; the variants are interleaved within each round, so a drifting machine load hits them
alike. The thread count each run chose is read from its log line ("CPU threads: ...").

Numbers are only meaningful on a machine that runs nothing else: state the machine, its cores, and its load
(`uptime`) beside any table made with this script.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bertlab.train.demo import DemoSettings, prepare_demo_data  # noqa: E402

BUSY = {
    "torch": "import torch\na = torch.randn(512, 512)\nwhile True:\n    a = (a @ a).tanh_()\n",
    "spin": "while True:\n    pass\n",
}


def bertlab(*args: str) -> list[str]:
    return [sys.executable, "-m", "bertlab", *args]


def TORCH_FIRST(*args: str) -> list[str]:  # noqa: N802 -- torch imported before bertlab can set a wait policy
    return [sys.executable, "-c", "import sys, torch; from bertlab.cli import main; sys.exit(main(sys.argv[1:]))",
            *args]


def run_variant(variant: str, data_dir: Path, config_file: Path, steps: int, settings: DemoSettings,
                work: Path) -> dict:
    """One `bertlab pretrain` process; its median tokens/s after the first steps and the threads it chose."""
    out = Path(tempfile.mkdtemp(dir=work))
    threads = {"default": [], "torch": ["--threads", str(os.cpu_count() or 1)]}.get(variant, ["--threads", variant])
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    env["PYTHONPATH"] = str(ROOT / "src")
    command = TORCH_FIRST if variant == "torch" else bertlab
    started = time.perf_counter()
    proc = subprocess.run(command("pretrain", "--model", str(config_file), "--data", str(data_dir), "--out", str(out),
                                  "--steps", str(steps), "--batch-size", str(settings.batch_size),
                                  "--max-seq-length", str(settings.max_seq_length), "--lr", str(settings.lr),
                                  "--phase2-max-seq-length", "0", "--num-evals", "1", "--no-eval-at-start",
                                  "--eval-batches", "1", "--num-workers", "0", "--no-progress", *threads),
                          capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"bertlab pretrain failed ({variant}):\n{proc.stderr[-2000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r and r.get("step", 0) > 5]
    chosen = re.search(r"CPU threads: (\d+)", proc.stderr)
    return {"tokens_per_s": statistics.median(rates), "threads": int(chosen.group(1)) if chosen else None,
            "passive": "OMP_WAIT_POLICY=PASSIVE" in proc.stderr, "wall_s": round(wall, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--busy", choices=list(BUSY), default="torch")
    p.add_argument("--variants", default="default,2,1,torch")
    p.add_argument("--conditions", default="alone,busy")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    variants = args.variants.split(",")
    settings = DemoSettings()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data_dir, config_file, _ = prepare_demo_data(work / "demo", None, settings, echo=lambda s: None)
        results: dict[str, dict[str, list[dict]]] = {}
        for condition in args.conditions.split(","):
            busy = None
            if condition == "busy":
                busy = subprocess.Popen([sys.executable, "-c", BUSY[args.busy]])
                time.sleep(2)  # let it start (and torch's import finish) before the measured run chooses
            try:
                for r in range(args.rounds):
                    for v in variants:
                        got = run_variant(v, data_dir, config_file, args.steps, settings, work)
                        results.setdefault(condition, {}).setdefault(v, []).append(got)
                        print(f"{condition:5s} round {r + 1} {v:>7s}: {got['tokens_per_s']:8,.0f} tokens/s "
                              f"({got['threads']} threads{', passive wait' if got['passive'] else ''}, "
                              f"{got['wall_s']} s)", flush=True)
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
    print(f"\ncores: {os.cpu_count()} logical; load now {os.getloadavg()[0]:.1f}; busy process: {args.busy}; "
          f"{args.steps} steps of {settings.batch_size} x {settings.max_seq_length} per run, {args.rounds} rounds")
    print(f"| condition | {' | '.join(variants)} |\n|---|{'---|' * len(variants)}")
    summary = {}
    for condition, by_variant in results.items():
        medians = {v: statistics.median(x["tokens_per_s"] for x in runs) for v, runs in by_variant.items()}
        threads = {v: sorted({x["threads"] for x in runs}) for v, runs in by_variant.items()}
        summary[condition] = {"tokens_per_s": medians, "threads": threads}
        print(f"| {condition} | " + " | ".join(f"{medians[v]:,.0f} ({'/'.join(map(str, threads[v]))} thr)"
                                               for v in variants) + " |")
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "runs": results, "steps": args.steps,
                                         "busy": args.busy, "cpus": os.cpu_count()}, indent=2))


if __name__ == "__main__":
    main()
