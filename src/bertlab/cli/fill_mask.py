"""`bertlab fill-mask --model DIR [--top-k K] "text with [MASK]"`: the masked LM's best words for each [MASK].

Prints one JSON line per text: {"text", "masks": [[{"token", "token_id", "score", "sequence"}, ...], ...]}
(one list of K candidates per [MASK], best first); `--format text` prints a readable listing instead.
Texts come from the command line or, with `--input FILE`, one per line -- or from a table (.csv, .tsv, .jsonl,
.json, .parquet) read as `predict` reads one: its text column, its id first in each JSON line.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..infer.input_files import add_text_input_arguments
    from ..infer.runtime import add_inference_arguments

    add_inference_arguments(p)
    p.add_argument("texts", nargs="*", metavar="TEXT", help="text(s) containing [MASK]")
    p.add_argument("--top-k", type=int, default=5, metavar="K", help="candidates per [MASK] (default 5)")
    add_text_input_arguments(p, "one text per line (instead of TEXT arguments)")
    p.add_argument("--format", default="json", choices=["json", "text"], help="JSON Lines (default) or a listing")


def run(args: argparse.Namespace) -> int:
    from ..core.errors import BertlabError
    from ..infer.fill_mask import FillMasker
    from ..infer.input_files import TextInputs, read_texts
    from ..infer.outputs import json_line
    from ..infer.runtime import InferenceOptions

    if args.input and args.texts:
        raise BertlabError("give texts as arguments or with --input FILE, not both")
    lines = read_texts(args.input, args.text_column, args.input_format,
                       id_column=args.id_column) if args.input else \
        TextInputs(args.texts, "argument")
    if not lines.items:
        raise BertlabError("no text given; pass a text with [MASK] (or --input FILE)")
    masker = FillMasker.from_pretrained(args.model, InferenceOptions.from_args(args))
    results = masker.fill(lines.items, args.top_k, where=lines.where)
    for i, (text, masks) in enumerate(zip(lines.items, results)):
        if args.format == "json":
            print(json_line({**({"id": lines.ids[i]} if lines.table else {}), "text": text, "masks": masks}), end="")
            continue
        print(text)
        for m, cands in enumerate(masks, 1):
            print(f"  [MASK] #{m}: " + ", ".join(f"{c['token']} ({c['score']:.3f})" for c in cands))
    return 0
