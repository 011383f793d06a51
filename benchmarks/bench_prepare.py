"""Throughput and peak memory of `bertlab prepare` on WikiText-2, at 1x and 20x the input.

    .venv/bin/python benchmarks/bench_prepare.py [--repeat 1 20] [--dupe-factor 1] [--workers N] [--json out.json]

The input is WikiText-2's complete valid and test files (2.4 MB, ~0.49M WordPiece tokens), concatenated
`repeat` times into one file (20x is ~49 MB). Each size runs `bertlab prepare` in a fresh process, with
Google's uncased vocabulary and otherwise default settings (segment pairs of 128, token masking; the
dupe factor is 1 here by default to keep the run short: it multiplies instance-building time, not
memory). While it runs, the memory of the whole process tree (the main process plus its tokenizer /
instance workers) is sampled every 20 ms: the peak of the summed PSS (shared pages divided among the
processes sharing them -- the forked workers share the parent's torch and numpy) and of the summed RSS
(shared pages counted once per process); the largest single process's own peak RSS comes from the
kernel (`ru_maxrss`).

Reported per size: tokens, wall time, tokens/s over the whole command and over the tokenization stage,
instances and instances/s, the peaks; then the 20x / 1x ratio of each peak, which the issue wants
within 1.2 (memory flat in corpus size).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("BERTLAB_SHARED_DATA", ROOT.parent / "shared" / "data"))


def tree_memory(pid: int) -> tuple[int, int]:
    """(sum of RSS, sum of PSS) in bytes over `pid` and all its descendants (Linux /proc).

    RSS counts a page shared by the forked workers once per process; PSS divides it among them, so the PSS
    sum is the memory the command really holds."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
                children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    rss = pss = 0
    stack = [pid]
    while stack:
        p = stack.pop()
        stack.extend(children.get(p, []))
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
        except OSError:
            continue
    return rss, pss


def run_prepare(corpus: Path, vocab: Path, out: Path, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "bertlab.cli", "prepare", str(corpus), "--vocab", str(vocab), "--out", str(out),
           "--dupe-factor", str(args.dupe_factor), "--quiet"]
    if args.workers:
        cmd += ["--workers", str(args.workers)]
    peak_rss = peak_pss = 0
    t0 = time.perf_counter()
    errors = tempfile.TemporaryFile()  # a file, not a pipe: a chatty child can never block on a full pipe
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errors)
    done = threading.Event()

    def sample() -> None:
        nonlocal peak_rss, peak_pss
        while not done.is_set():
            rss, pss = tree_memory(proc.pid)
            peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    if os.waitstatus_to_exitcode(status) != 0:
        errors.seek(0)
        raise SystemExit(f"prepare failed:\n{errors.read().decode(errors='replace')}")
    errors.close()
    manifest = json.loads((out / "manifest.json").read_text())
    tokens = sum(s["tokens"] for s in manifest["corpus"]["splits"].values())
    iset = manifest["instance_sets"][-1]
    instances = sum(s["instances"] for s in iset["splits"].values())
    # wait4's ru_maxrss: the largest peak of the command and the workers it reaped (kernel-measured)
    one = usage.ru_maxrss * 1024
    return {"input_bytes": corpus.stat().st_size, "tokens": tokens, "wall_s": round(wall, 2),
            "tokens_per_s": round(tokens / wall), "tokenize_s": manifest["corpus"]["seconds"],
            "tokenize_tokens_per_s": round(tokens / manifest["corpus"]["seconds"]),
            "instances": instances, "instances_s": iset["seconds"],
            "instances_per_s": round(instances / iset["seconds"]),
            "peak_pss_tree_mb": round(peak_pss / 2**20, 1), "peak_rss_tree_mb": round(peak_rss / 2**20, 1),
            "peak_rss_one_process_mb": round(one / 2**20, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, nargs="+", default=[1, 20])
    p.add_argument("--dupe-factor", type=int, default=1)
    p.add_argument("--workers", type=int, default=0, help="default: every core")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    sources = [DATA / "wikitext-2" / "wiki.valid.raw", DATA / "wikitext-2" / "wiki.test.raw"]
    vocab = DATA / "vocab" / "bert-base-uncased.txt"
    if not all(s.exists() for s in sources + [vocab]):
        raise SystemExit(f"WikiText-2 / vocabulary not found under {DATA}")
    text = b"".join(s.read_bytes() for s in sources)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_prepare_") as tmp:
        for k in args.repeat:
            corpus = Path(tmp) / f"wikitext2_x{k}.raw"
            with open(corpus, "wb") as f:
                for _ in range(k):
                    f.write(text)
            r = run_prepare(corpus, vocab, Path(tmp) / f"out_x{k}", args)
            results[f"x{k}"] = r
            print(f"{k:>3}x  {r['input_bytes'] / 1e6:6.1f} MB  {r['tokens']:>10,} tokens  {r['wall_s']:7.1f} s  "
                  f"{r['tokens_per_s']:>9,} tok/s overall  {r['tokenize_tokens_per_s']:>9,} tok/s tokenizing  "
                  f"{r['instances']:>9,} instances ({r['instances_per_s']:,}/s)  "
                  f"peak memory: PSS {r['peak_pss_tree_mb']:.0f} MB tree, RSS {r['peak_rss_tree_mb']:.0f} MB tree, "
                  f"RSS {r['peak_rss_one_process_mb']:.0f} MB largest process",
                  flush=True)
            corpus.unlink()
    if len(args.repeat) >= 2:
        a, b = results[f"x{args.repeat[0]}"], results[f"x{args.repeat[-1]}"]
        for key, label in (("peak_pss_tree_mb", "PSS tree"), ("peak_rss_tree_mb", "RSS tree"),
                           ("peak_rss_one_process_mb", "RSS largest process")):
            ratio = b[key] / a[key]
            results[f"ratio_{key}"] = round(ratio, 3)
            print(f"peak {label} {args.repeat[-1]}x / {args.repeat[0]}x = {ratio:.2f} "
                  f"({'flat: within 20%' if ratio <= 1.2 else 'NOT flat'})")
    print(f"cores: {len(os.sched_getaffinity(0))}, workers: {args.workers or 'all'}, dupe factor: {args.dupe_factor}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
