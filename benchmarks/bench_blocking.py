"""One field of the C GEMMs' blocking (`nn/cpu_tuning.py`: bl_tuning) at each of its values, on T5 generation, in
one process: what the sweep at first use weighs, seen on a whole decoding run.

    python benchmarks/bench_blocking.py [--field few_prefetch] [--values 0,1,2] [--dtypes fp32,bf16]
        [--threads 1] [--batch 1,8] [--preset t5-small] [--new-tokens 32] [--rounds 9]

A random T5 of the preset's size (as `bench_generate.py` makes it), prepared as `bertlab generate` loads it at each
precision; greedy generation of `--new-tokens` tokens from `--batch` rows of 48 random ids. The blocking is the one
this process would run (the cached or swept choice, or the default under `BERTLAB_CPU_TUNING=default`) with the
field set to each value in turn, round by round, the order alternating, a warm-up call before each timed one;
medians, and in how many rounds each value beat the one the run started with. Every value gives the same ids (the
blocking moves no sum): checked.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_engines import provenance, provenance_line  # noqa: E402

from bertlab.infer.runtime import InferenceOptions, prepare  # noqa: E402
from bertlab.models.t5 import T5ForConditionalGeneration  # noqa: E402
from bertlab.models.t5.config import preset  # noqa: E402
from bertlab.nn import cpu_kernels, cpu_tuning  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--field", default="few_prefetch", help=f"one of {', '.join(cpu_tuning.PARAMS)}")
    p.add_argument("--values", default="0,1,2")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", default="1,8")
    p.add_argument("--preset", default="t5-small")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args()
    if args.field not in cpu_tuning.PARAMS:
        p.error(f"--field: expected one of {', '.join(cpu_tuning.PARAMS)}, got {args.field!r}")
    ext = cpu_kernels._extension()
    if ext is None or not cpu_kernels.f32_gemm_available():
        raise SystemExit("bertlab's C GEMMs do not run here (no extension, or the level none): no blocking to vary")
    torch.set_num_threads(args.threads)
    info = provenance()
    torch.manual_seed(0)
    plain = T5ForConditionalGeneration(preset(args.preset, dropout_rate=0.0)).eval()
    with tempfile.TemporaryDirectory() as tmp:
        plain.save_pretrained(tmp)
        models = {d: prepare(T5ForConditionalGeneration.from_pretrained(tmp),
                             InferenceOptions(dtype=d, threads=args.threads)) for d in args.dtypes.split(",")}
    cpu_kernels._tuned()
    base = dict(zip(cpu_tuning.PARAMS, ext.tune()))
    values = [int(v) for v in args.values.split(",")]
    field = args.field

    def set_value(v: int) -> None:
        ext.tune(*{**base, field: v}.values())

    print(f"\n**{args.preset} greedy, {args.new_tokens} new tokens, {args.threads} thread(s); blocking {base}; "
          f"{field} at {values}**\n")
    print("| precision, rows | " + " | ".join(f"{field} {v} tokens/s" for v in values)
          + f" | rounds faster than {base[field]} |")
    print("|---|" + "---|" * (len(values) + 1))
    try:
        for dtype, model in models.items():
            if dtype == "bf16" and model.shared.weight.dtype != torch.bfloat16:
                print("| bf16 | no native bf16 here: --dtype bf16 runs fp32 |")
                continue
            for batch in (int(b) for b in args.batch.split(",")):
                ids = torch.randint(2, plain.config.vocab_size, (batch, 48),
                                    generator=torch.Generator().manual_seed(1))

                def run():
                    with torch.inference_mode():
                        return model.generate(ids, max_new_tokens=args.new_tokens)

                outs = []
                for v in values:
                    set_value(v)
                    outs.append(run())
                if any(not torch.equal(o, outs[0]) for o in outs):
                    raise SystemExit(f"{dtype}, batch {batch}: the ids differ between {field} values")
                times = {v: [] for v in values}
                for r in range(args.rounds):
                    for v in values if r % 2 == 0 else values[::-1]:
                        set_value(v)
                        run()
                        start = time.perf_counter()
                        run()
                        times[v].append(time.perf_counter() - start)
                tokens = batch * (outs[0].size(1) - 1)
                ref = times.get(base[field])
                wins = [f"{v}: {sum(a < b for a, b in zip(times[v], ref))}/{args.rounds}" for v in values
                        if ref is not None and v != base[field]]
                print(f"| {dtype}, {batch} | " + " | ".join(f"{tokens / statistics.median(times[v]):.1f}"
                                                           for v in values) + f" | {', '.join(wins) or '-'} |",
                      flush=True)
    finally:
        ext.tune(*base.values())
    print("\n" + provenance_line({**info, "load_average_end": [round(x, 2) for x in os.getloadavg()],
                                   "bertlab_blocking": base}))


if __name__ == "__main__":
    main()
