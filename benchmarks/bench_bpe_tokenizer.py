"""Byte-level BPE speed, side by side in one process: bertlab's RobertaTokenizer vs `transformers`'
RobertaTokenizerFast vs raw `tokenizers` encode_batch, on WikiText-2 (every line of the chosen split), one thread.

    python benchmarks/bench_bpe_tokenizer.py [--split test] [--repeats 7] [--vocab DIR] [--python]

The vocabulary is a RoBERTa folder (`--vocab`: vocab.json + merges.txt, or tokenizer.json), or by default one
trained here by the `tokenizers` library on WikiText-2 valid and the first 1018 train lines (`--vocab-size`).
Every contender produces ids, attention mask and character offsets for each line:
- bertlab      `tok(lines, return_offsets_mapping=True)` -> Python lists (the C extension when built)
- hf-fast      `RobertaTokenizerFast(lines, return_offsets_mapping=True)` -> Python lists
- tokenizers   `Tokenizer.encode_batch(lines)` of the same tokenizer -> Rust Encoding objects (nothing
               converted to Python lists)
Runs are interleaved (A B C A B C ...) so background load hits all alike; medians of wall-clock and of this
process's CPU time (the fairer number on a shared machine). The `tokenizers` library runs on one thread:
RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false are set before it is imported. Ratios from CPU medians.
"""

from __future__ import annotations

import os

# Before tokenizers is imported: one Rayon thread, no fork warnings.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from bench_tokenizer import SHARED, compare_and_time, print_medians  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default="test", choices=["test", "valid"])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--vocab", help="a RoBERTa tokenizer folder (default: train one on WikiText-2's train lines)")
    ap.add_argument("--vocab-size", type=int, default=16000)
    ap.add_argument("--python", action="store_true", help="also time the pure-Python path (slow)")
    args = ap.parse_args()

    import tokenizers
    import transformers

    from bertlab.tokenizer.roberta import RobertaTokenizer

    lines = (SHARED / "wikitext-2" / f"wiki.{args.split}.raw").read_text(encoding="utf-8").split("\n")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.vocab) if args.vocab else Path(tmp)
        if not args.vocab:
            train = "\n".join((SHARED / "wikitext-2" / name).read_text(encoding="utf-8")
                              for name in ("wiki.train.raw.first1018lines", "wiki.valid.raw"))
            bpe = tokenizers.ByteLevelBPETokenizer()
            bpe.train_from_iterator(train.split("\n"), vocab_size=args.vocab_size, min_frequency=2,
                                    special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False)
            bpe.save_model(tmp)
        ours = RobertaTokenizer.from_pretrained(folder)
        if (folder / "vocab.json").is_file():
            hf = transformers.RobertaTokenizerFast(str(folder / "vocab.json"), str(folder / "merges.txt"))
        else:
            hf = transformers.AutoTokenizer.from_pretrained(str(folder))
        if ours.mask_lstrip:  # as RoBERTa's own files have it (transformers 5 leaves it off for bare files)
            hf.add_special_tokens({"mask_token": transformers.AddedToken("<mask>", lstrip=True, normalized=False,
                                                                         special=True)})
        raw = hf.backend_tokenizer
        contenders = {
            "bertlab": lambda: ours(lines, return_offsets_mapping=True, return_token_type_ids=False),
            "hf-fast": lambda: hf(lines, return_offsets_mapping=True),
            "tokenizers": lambda: raw.encode_batch(lines),
        }
        if args.python:
            py = RobertaTokenizer.from_pretrained(folder, use_fast=False)
            contenders["bertlab-python"] = lambda: py(lines, return_offsets_mapping=True,
                                                      return_token_type_ids=False)

        same, n_tok, med = compare_and_time(contenders, args.repeats)  # same answer first, then the rounds

    path = "C extension" if ours._fast is not None else "pure Python (C extension not built)"
    print(f"WikiText-2 {args.split}: {len(lines)} lines, {sum(map(len, lines))} characters, {n_tok} tokens; "
          f"vocabulary {len(ours)} tokens, {len(ours.bpe.merges)} merges; bertlab path: {path}; identical "
          f"ids+offsets to HF: {same}")
    print(f"python {sys.version.split()[0]}, transformers {transformers.__version__}, tokenizers "
          f"{tokenizers.__version__}, RAYON_NUM_THREADS=1, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.1f}, median of {args.repeats}")
    print_medians(med, n_tok, 16)
    return 0


if __name__ == "__main__":
    sys.exit(main())
