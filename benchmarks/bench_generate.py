"""Generation speed: bertlab's cached decoding against `transformers`' `generate` and CTranslate2's
`Translator` (float32 and int8), same model, same inputs.

    python benchmarks/bench_generate.py [--preset t5-small] [--batch 8] [--input-length 48]
        [--new-tokens 32] [--rounds 3] [--threads 1] [--num-beams 1] [--no-ctranslate2] [--separate [--passes N]] [--profile]

The model: a random T5 of the preset's size (t5-small: 60M, vocab 32128), built by bertlab, saved in the Hugging
Face layout and loaded by `transformers.T5ForConditionalGeneration` (sdpa attention) and by bertlab's inference
runtime, as `bertlab generate` loads it (oneDNN-packed linear layers on a CPU) -- the same weights on both sides. A
third row runs bertlab's `model.generate` on the plain model (nn.Linear), to show what packing adds; then
`--dtype bf16` and `--dtype int8` (their ids compared with fp32's position by position). CTranslate2 (where
installed) gets the same folder through its own converter (a vocabulary of placeholder tokens, one per id, since
the weights are random), compute_type float32 and int8, `intra_threads` = `--threads`; its timing is
`translate_batch` alone, and its ids are compared with bertlab fp32's position by position. Random weights repeat
tokens and rarely say </s>, so every side runs to `--new-tokens` and the outputs are checked to be identical ids.
Inputs: `--batch` rows of random ids, lengths spread over 1/2..1 x `--input-length` (right-padded, a fixed seed).
Both sides in fp32 under `torch.inference_mode()`, interleaved round by round (the order alternates, so a busy
machine slows both alike); medians.

tokens/s = generated tokens (batch x new tokens) / wall-clock seconds of the whole `generate` call, encoder
included. `--profile` prints torch.profiler's top operators of one bertlab call.

`--separate` times CTranslate2 in a process of its own (use it above one thread: in one process each runtime's
idle worker threads spin on the cores the other needs, and both slow down -- at 2 threads, batch 1, bertlab
int8 ran at 175 tokens/s beside CTranslate2 and 473 alone). Each process still checks the ids against bertlab
fp32's. `--passes N` runs the pair of processes N times, the order alternating, and reports each contender's
median over the passes (a process on a virtual machine runs up to a quarter faster or slower than the next).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bertlab.infer.runtime import InferenceOptions, prepare  # noqa: E402
from bertlab.models.t5 import T5ForConditionalGeneration, preset  # noqa: E402


def ctranslate2_translators(folder: str, vocab_size: int, threads: int) -> dict:
    """compute type -> `ctranslate2.Translator` of the T5 in `folder`; {} when CTranslate2 is not installed."""
    try:
        import ctranslate2
        from ctranslate2.converters import TransformersConverter
    except ImportError:
        print("skipped CTranslate2: not installed")
        return {}

    class Placeholders:
        """A tokenizer whose token i is the string "t<i>": what the converter reads of one."""
        pad_token, eos_token, unk_token = "t0", "t1", "t2"

        def get_vocab(self) -> dict[str, int]:
            return {f"t{i}": i for i in range(vocab_size)}

        def convert_ids_to_tokens(self, i: int) -> str:
            return f"t{i}"

    class Converter(TransformersConverter):
        def load_tokenizer(self, *args, **kwargs):
            return Placeholders()

    out = Path(folder) / "ctranslate2"
    Converter(folder).convert(str(out), force=True)
    return {compute_type: ctranslate2.Translator(str(out), device="cpu", compute_type=compute_type,
                                                 intra_threads=threads, inter_threads=1)
            for compute_type in ("float32", "int8")}


def report(result: dict) -> None:
    print(f"{result['title']}; identical ids: {result['same']}")
    print(f"{'':<26} {'median s':>9} {'tokens/s':>9}")
    rate = result["tokens_per_s"]
    for name, seconds in result["median_s"].items():
        print(f"{name:<26} {seconds:>9.3f} {rate[name]:>9.1f}")
    print(f"bertlab / transformers: {rate['bertlab'] / rate['transformers']:.2f}x; bertlab int8 / fp32: "
          f"{rate['bertlab int8'] / rate['bertlab']:.2f}x, its ids equal to fp32's at {result['agree']:.1%} of "
          f"positions; bf16 / fp32: {rate['bertlab bf16'] / rate['bertlab']:.2f}x, "
          f"{result['agree_bf16']:.1%} of positions equal")
    for name, share in result["ct2_agree"].items():
        ours_name = "bertlab int8" if name.endswith("int8") else "bertlab"
        print(f"{ours_name} / {name}: {rate[ours_name] / rate[name]:.2f}x; {name}'s ids equal to bertlab fp32's "
              f"at {share:.1%} of positions")


def run_separately(args: argparse.Namespace) -> None:
    """`--separate`: this script twice, bertlab and transformers in one process, CTranslate2 in another; the
    results merged into one report. `--passes N`: the pair N times, the order alternating, each contender's time
    the median over the passes (a process on a virtual machine can run a quarter faster or slower than the next,
    every engine in it alike), each pass's ratios printed too."""
    common = [sys.executable, __file__, "--preset", args.preset, "--batch", str(args.batch), "--input-length",
              str(args.input_length), "--new-tokens", str(args.new_tokens), "--num-beams", str(args.num_beams),
              "--rounds", str(args.rounds), "--threads", str(args.threads)]
    passes = []
    with tempfile.TemporaryDirectory(prefix="bench-generate-") as tmp:
        for n in range(args.passes):
            parts = {}
            for i in ((0, 1) if n % 2 == 0 else (1, 0)):
                out = Path(tmp) / f"{n}-{i}.json"
                subprocess.run([*common, ["--no-ctranslate2", "--only-ctranslate2"][i], "--json", str(out)], check=True)
                parts[i] = json.loads(out.read_text())
            passes.append(parts)
    first = passes[0]
    median_s = {name: statistics.median(p[i]["median_s"][name] for p in passes)
                for i in (0, 1) for name in first[i]["median_s"]}
    tokens = next(iter(first[0]["tokens_per_s"].values())) * next(iter(first[0]["median_s"].values()))
    merged = {**first[0], "ct2_agree": first[1]["ct2_agree"], "median_s": median_s,
              "tokens_per_s": {name: tokens / s for name, s in median_s.items()}}
    merged["title"] += " (CTranslate2 in a process of its own" + (f", {args.passes} passes)" if args.passes > 1 else ")")
    report(merged)
    if args.passes > 1:
        for n, p in enumerate(passes):
            rate = {**p[0]["tokens_per_s"], **p[1]["tokens_per_s"]}
            print(f"pass {n + 1}: bertlab / CTranslate2 float32 {rate['bertlab'] / rate['CTranslate2 float32']:.2f}x, "
                  f"bertlab int8 / CTranslate2 int8 {rate['bertlab int8'] / rate['CTranslate2 int8']:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="t5-small")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--input-length", type=int, default=48)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--num-beams", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-ctranslate2", dest="ctranslate2", action="store_false", help="leave CTranslate2 out")
    p.add_argument("--separate", action="store_true", help="time CTranslate2 in a process of its own")
    p.add_argument("--passes", type=int, default=1,
                   help="with --separate: both processes this many times, medians over the passes")
    p.add_argument("--only-ctranslate2", action="store_true", help=argparse.SUPPRESS)  # --separate's second process
    p.add_argument("--json", type=Path, help=argparse.SUPPRESS)  # where a --separate process leaves its results
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    if args.separate:
        return run_separately(args)

    import transformers

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    plain = T5ForConditionalGeneration(preset(args.preset, dropout_rate=0.0)).eval()
    with tempfile.TemporaryDirectory() as tmp:
        plain.save_pretrained(tmp)
        theirs = transformers.T5ForConditionalGeneration.from_pretrained(tmp, attn_implementation="sdpa").eval()
        # what `bertlab generate` runs: the model through the inference runtime (oneDNN-packed linear layers)
        ours = prepare(T5ForConditionalGeneration.from_pretrained(tmp), InferenceOptions(threads=args.threads))
        # `bertlab generate --dtype int8`: linear layers and LM head as int8 GEMMs (nn/int8_linear.py)
        # `--dtype bf16` (CTranslate2's CPU build has no bf16 to set beside it)
        ours_bf16 = prepare(T5ForConditionalGeneration.from_pretrained(tmp),
                            InferenceOptions(dtype="bf16", threads=args.threads))
        ours_int8 = prepare(T5ForConditionalGeneration.from_pretrained(tmp),
                            InferenceOptions(dtype="int8", threads=args.threads))
        ct2 = ctranslate2_translators(tmp, ours.config.vocab_size, args.threads) if args.ctranslate2 else {}

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, ours.config.vocab_size, (args.batch, args.input_length), generator=g)
    mask = torch.ones_like(ids)
    for row in range(args.batch):
        n = args.input_length // 2 + (args.input_length // 2) * row // max(1, args.batch - 1)
        mask[row, n:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    settings = dict(max_new_tokens=args.new_tokens, num_beams=args.num_beams)

    def run_ours():
        return ours.generate(ids, attention_mask=mask, **settings)

    def run_plain():
        return plain.generate(ids, attention_mask=mask, **settings)

    def run_int8():
        return ours_int8.generate(ids, attention_mask=mask, **settings)

    def run_bf16():
        return ours_bf16.generate(ids, attention_mask=mask, **settings)

    def run_theirs():
        with torch.inference_mode():
            return theirs.generate(input_ids=ids, attention_mask=mask, do_sample=False, **settings)

    source = [[f"t{i}" for i in row[row_mask.bool()].tolist()] for row, row_mask in zip(ids, mask)]

    def ct2_runner(translator):
        def run():  # no end token: run to --new-tokens, as the others do
            return translator.translate_batch(source, beam_size=args.num_beams, max_decoding_length=args.new_tokens,
                                              min_decoding_length=0, return_end_token=True, end_token=[])
        return run

    def ct2_ids(results) -> torch.Tensor:
        """CTranslate2's token strings as an id tensor shaped like `generate`'s (the decoder's start id first)."""
        width = max(len(r.hypotheses[0]) for r in results)
        out = torch.zeros(len(results), width + 1, dtype=torch.long)
        for i, r in enumerate(results):
            out[i, 1:len(r.hypotheses[0]) + 1] = torch.tensor([int(t[1:]) for t in r.hypotheses[0]])
        return out

    a, b, c, d, e = run_ours(), run_theirs(), run_plain(), run_int8(), run_bf16()  # warm-up, and the check
    same = a.shape == b.shape == c.shape and bool((a == b).all()) and bool((c == b).all())
    agree = float((d == a).float().mean()) if d.shape == a.shape else float("nan")
    agree_bf16 = float((e == a).float().mean()) if e.shape == a.shape else float("nan")
    tokens = args.batch * (a.size(1) - 1)
    contenders = {} if args.only_ctranslate2 else {"bertlab": run_ours, "transformers": run_theirs,
                                                   "bertlab, plain nn.Linear": run_plain, "bertlab bf16": run_bf16,
                                                   "bertlab int8": run_int8}
    ct2_agree = {}
    for compute_type, translator in ct2.items():
        name = f"CTranslate2 {compute_type}"
        contenders[name] = ct2_runner(translator)
        got = ct2_ids(contenders[name]())
        ct2_agree[name] = float((got == a).float().mean()) if got.shape == a.shape else float("nan")
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(args.rounds):
        order = list(contenders.items())
        for name, fn in order if r % 2 == 0 else order[::-1]:
            # An untimed call first: each timed call finds its weights as warm in the CPU's caches as a serving
            # process would, whatever ran before it. An L3 can hold a whole small model (300 MB on the Intel
            # Xeon of the docs' tables, more than t5-small's int8 or fp32 weights), so without it the order of
            # the contenders, and how many share a process, decided whose weights came from memory.
            fn()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)

    result = {"title": f"{args.preset} random weights ({ours.num_parameters() / 1e6:.1f}M), batch {args.batch}, "
                       f"inputs {args.input_length // 2}-{args.input_length} tokens, {a.size(1) - 1} new tokens, "
                       f"num_beams {args.num_beams}, {args.threads} thread(s), fp32, {args.rounds} rounds",
              "same": same, "agree": agree, "agree_bf16": agree_bf16, "ct2_agree": ct2_agree,
              "median_s": {name: statistics.median(ts) for name, ts in times.items()},
              "tokens_per_s": {name: tokens / statistics.median(ts) for name, ts in times.items()}}
    if args.json:
        args.json.write_text(json.dumps(result))
    else:
        report(result)

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run_ours()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
