"""`bertlab similarity --model DIR A B`: cosine similarity of two texts' sentence embeddings.

With `--pairs FILE` (one `A<TAB>B` pair per line) it prints one score per line instead.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..infer.embeddings import POOLINGS
    from ..infer.runtime import add_inference_arguments

    add_inference_arguments(p)
    p.add_argument("texts", nargs="*", metavar="TEXT", help="the two texts to compare")
    p.add_argument("--pooling", default="mean", choices=list(POOLINGS), help="as for `bertlab embed` (default mean)")
    p.add_argument("--pairs", metavar="FILE", help="tab-separated pairs, one per line; one score per line out")


def run(args: argparse.Namespace) -> int:
    from ..core.errors import BertlabError
    from ..infer.embeddings import Embedder, cosine
    from ..infer.inputs import read_lines
    from ..infer.runtime import InferenceOptions

    if args.pairs:
        lines = read_lines(args.pairs)
        pairs = []
        for i, line in enumerate(lines.items):
            parts = line.split("\t")
            if len(parts) != 2:
                raise BertlabError(f"{lines.where(i)}: expected two texts separated by a tab, got {len(parts)} fields")
            pairs.append(parts)
    elif len(args.texts) == 2:
        pairs = [args.texts]
    else:
        raise BertlabError(f"expected two texts (or --pairs FILE), got {len(args.texts)}")
    embedder = Embedder.from_pretrained(args.model, args.pooling, True, InferenceOptions.from_args(args))
    vectors = embedder.embed([t for pair in pairs for t in pair])
    for score in cosine(vectors[0::2], vectors[1::2]).tolist():
        print(f"{score:.6f}")
    return 0
