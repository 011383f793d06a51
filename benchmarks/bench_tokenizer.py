"""Tokenizer speed, side by side in one process: bertlab's BertTokenizer vs Hugging Face's BertTokenizerFast vs
raw `tokenizers` encode_batch, on WikiText-2 (every line of the chosen split), single thread.

    python benchmarks/bench_tokenizer.py [--split test] [--repeats 7] [--cased] [--python] [--workers N]

Every contender produces ids, token type ids, attention mask and character offsets for each line:
- bertlab      `tok(lines, return_offsets_mapping=True)` -> Python lists (the C extension when built)
- hf-fast      `BertTokenizerFast(lines, return_offsets_mapping=True)` -> Python lists
- tokenizers   `BertWordPieceTokenizer.encode_batch(lines)` -> Rust Encoding objects (offsets are computed but
               stay in Rust; nothing is converted to Python lists)
- tokenizers+lists  the same, then `.ids/.type_ids/.attention_mask/.offsets` read out as Python lists
Runs are interleaved (A B C D A B C D ...) so background load hits all alike; the table shows medians of
wall-clock time and of this process's CPU time (the fairer number on a shared machine: every contender is
single-threaded, RAYON_NUM_THREADS=1). Ratios are computed from CPU-time medians; wall-clock ratios beside.
`--workers N` also times the parallel corpus mode (`encode_corpus`, ids only) against the single-thread one.
"""

from __future__ import annotations

import os

# Before tokenizers is imported: one Rayon thread, no fork warnings.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import gc  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("BERTLAB_SHARED_DATA", ROOT.parent / "shared" / "data"))


def timed(fn):
    gc.collect()
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w, time.process_time() - c, out


def compare_and_time(contenders: dict, repeats: int) -> tuple[bool, int, dict[str, tuple[float, float]]]:
    """Ours ("bertlab") against "hf-fast" on this very input first (ids and offsets), then `repeats` rounds of
    every contender in turn: (identical, tokens, contender -> median (wall s, cpu s))."""
    a, b = contenders["bertlab"](), contenders["hf-fast"]()
    same = a["input_ids"] == b["input_ids"] and a["offset_mapping"] == [[tuple(o) for o in r] for r in
                                                                          b["offset_mapping"]]
    n_tok = sum(map(len, a["input_ids"]))
    del a, b
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            w, c, out = timed(fn)
            del out
            times[name].append((w, c))
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in times.items()}
    return same, n_tok, med


def print_medians(med: dict[str, tuple[float, float]], n_tok: int, width: int) -> None:
    """The medians, then bertlab's speed-up over each other contender."""
    print(f"{'':{width}s} {'wall s':>8s} {'cpu s':>8s} {'Mtok/s(cpu)':>12s}")
    for k, (w, c) in med.items():
        print(f"{k:{width}s} {w:8.3f} {c:8.3f} {n_tok / c / 1e6:12.2f}")
    ow, oc = med["bertlab"]
    for other in [k for k in med if k != "bertlab"]:
        w, c = med[other]
        print(f"speed-up bertlab vs {other:{width - 2}s} {c / oc:5.2f}x cpu   {w / ow:5.2f}x wall")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default="test", choices=["test", "valid", "train.raw.first1018lines"])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--cased", action="store_true")
    ap.add_argument("--python", action="store_true", help="also time the pure-Python path (slow)")
    ap.add_argument("--workers", type=int, default=0, help="also time encode_corpus with this many processes")
    args = ap.parse_args()

    import tokenizers
    import transformers

    from bertlab import BertTokenizer

    vocab = SHARED / "vocab" / f"bert-base-{'cased' if args.cased else 'uncased'}.txt"
    path = SHARED / "wikitext-2" / f"wiki.{args.split}" if "first" in args.split else \
        SHARED / "wikitext-2" / f"wiki.{args.split}.raw"
    lines = path.read_text(encoding="utf-8").split("\n")
    lower = not args.cased

    ours = BertTokenizer(vocab, do_lower_case=lower)
    if int(transformers.__version__.split(".")[0]) >= 5:
        from transformers.models.bert.tokenization_bert import load_vocab

        hf = transformers.BertTokenizerFast(vocab=dict(load_vocab(str(vocab))), do_lower_case=lower)
    else:
        hf = transformers.BertTokenizerFast(vocab_file=str(vocab), do_lower_case=lower)
    raw = tokenizers.BertWordPieceTokenizer(str(vocab), lowercase=lower)

    def raw_lists():
        encs = raw.encode_batch(lines)
        return ([e.ids for e in encs], [e.type_ids for e in encs], [e.attention_mask for e in encs],
                [e.offsets for e in encs])

    contenders = {
        "bertlab": lambda: ours(lines, return_offsets_mapping=True),
        "hf-fast": lambda: hf(lines, return_offsets_mapping=True),
        "tokenizers": lambda: raw.encode_batch(lines),
        "tokenizers+lists": raw_lists,
    }
    if args.python:
        py = BertTokenizer(vocab, do_lower_case=lower, use_fast=False)
        contenders["bertlab-python"] = lambda: py(lines, return_offsets_mapping=True)

    same, n_tok, med = compare_and_time(contenders, args.repeats)  # same answer first, then the rounds

    fast = "C extension" if ours._fast is not None else "pure Python (C extension not built)"
    print(f"WikiText-2 {args.split}: {len(lines)} lines, {sum(map(len, lines))} characters, {n_tok} tokens "
          f"({'cased' if args.cased else 'uncased'} vocabulary); bertlab path: {fast}; "
          f"identical ids+offsets to HF: {same}")
    print(f"python {sys.version.split()[0]}, transformers {transformers.__version__}, "
          f"tokenizers {tokenizers.__version__}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, "
          f"median of {args.repeats}")
    print_medians(med, n_tok, 18)

    if args.workers:
        texts = lines * 4
        w1, c1, one = timed(lambda: ours.encode_corpus(texts, num_workers=1))
        wn, _, many = timed(lambda: ours.encode_corpus(texts, num_workers=args.workers))
        assert one == many
        print(f"encode_corpus (ids, {len(texts)} lines): 1 process {w1:.3f}s wall; "
              f"{args.workers} processes {wn:.3f}s wall ({w1 / wn:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
