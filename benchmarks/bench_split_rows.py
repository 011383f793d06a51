"""The fp32 GEMM's thread split by row count: MiniLM's six layers' GEMMs (384 -> 1152, 384 -> 384, 384 -> 1536,
1536 -> 384 each, every layer its own weights, as an encoder pass reads them) at M rows, threads splitting the
panels (columns) or the rows, timed in interleaved rounds in one process. Prints, per M, the median seconds of a
pass each way and the rows/columns ratio -- the row count from which a rows split pays at this thread count.

    python benchmarks/bench_split_rows.py [--threads 2] [--rows 128,256,384,512,1024,2048,4096] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bertlab.nn import cpu_kernels

SHAPES = ((384, 1152), (384, 384), (384, 1536), (1536, 384))  # (K, N) of one layer's GEMMs, in order
LAYERS = 6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", default="128,256,384,512,1024,2048,4096")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--splits", default="0,2", help="bl_tuning split values compared (2: fp32 bulk by rows)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cpu_kernels._tuned()
    ext = cpu_kernels._extension()
    base = ext.tune()
    g = torch.Generator().manual_seed(0)
    weights = [[(torch.randn(-(-n // 32), k, 32, generator=g) * 0.05, torch.randn(n, generator=g), k, n)
                for k, n in SHAPES] for _ in range(LAYERS)]
    splits = [int(s) for s in args.splits.split(",")]
    print(f"threads {args.threads}, blocking {base}, splits {splits}")
    for m in [int(r) for r in args.rows.split(",")]:
        xs = {k: torch.randn(m, k, generator=g) for k in (384, 1536)}
        ys = {n: torch.empty(m, n) for n in (1152, 384, 1536)}
        calls = [(xs[k].data_ptr(), w.data_ptr(), b.data_ptr(), ys[n].data_ptr(), m, k, n)
                 for layer in weights for w, b, k, n in layer]

        def run(split: int) -> float:
            ext.tune(*base[:-1], split)
            start = time.perf_counter()
            for a in calls:
                ext.linear_f32(*a, args.threads, 0)
            return time.perf_counter() - start

        for s in splits:
            run(s)
        times = {s: [] for s in splits}
        for r in range(args.rounds):
            order = splits[r % len(splits):] + splits[:r % len(splits)]
            for s in order:
                times[s].append(run(s))
        med = {s: statistics.median(t) for s, t in times.items()}
        wins = sum(a < b for a, b in zip(times[splits[-1]], times[splits[0]]))
        print(f"M={m:5d} " + " ".join(f"split {s}: {med[s] * 1e3:8.2f} ms" for s in splits)
              + f"  ratio {splits[0]}/{splits[-1]} {med[splits[0]] / med[splits[-1]]:.3f} (won {wins}/{args.rounds})",
              flush=True)
    ext.tune(*base)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
