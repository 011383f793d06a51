"""`bertlab features --model DIR --layers -1,-2,-3,-4`: hidden states of chosen layers per token or word.

The equivalent of Google's `extract_features.py`. In: one text per line (a file or stdin), a pair as
`text_a ||| text_b`, or with `--words` space-separated words (e.g. CoNLL tokens); or a table (.csv, .tsv,
.jsonl, .json, .parquet) read as `predict` reads one: its text column, its id carried into the output ("id" in
each JSON line, FILE.ids.json beside an array). Out, by `--output`'s suffix:
  * JSON Lines (default; stdout): Google's layout, {"linex_index", "features": [{"token" | "word",
    "layers": [{"index", "values"}]}]} -- fine for small jobs;
  * FILE.npy: all units back to back, (units, layers, hidden) float32, with FILE.offsets.npy (N+1,) giving
    input i's rows offsets[i]:offsets[i+1];
  * FILE.safetensors: tensors "features" and "offsets" the same way, plus the settings as metadata.
The array formats are streamed to disk, so large inputs need memory for one chunk only.
`--align first|mean` gives one vector per word (its first piece, or the mean of its pieces).
"""

from __future__ import annotations

import argparse
import re


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..infer.features import ALIGNMENTS
    from ..infer.input_files import add_text_input_arguments
    from ..infer.runtime import add_inference_arguments

    add_inference_arguments(p)
    # `--layers -1,-2` as the interface writes it: argparse would read "-1,-2" as an unknown option, since
    # only plain negative numbers count as values; widen that rule to comma-separated negative numbers.
    p._negative_number_matcher = re.compile(r"^-\d+(,-?\d+)*$")
    p.add_argument("--layers", default="-1,-2,-3,-4",
                   help="comma-separated layer indices: 0 = embeddings, 1..L, negative from the top "
                        "(default -1,-2,-3,-4)")
    p.add_argument("--align", default="token", choices=list(ALIGNMENTS),
                   help="token: every word piece with [CLS]/[SEP] (default); first / mean: one vector per word")
    p.add_argument("--words", action="store_true", help="input lines are space-separated words (pre-tokenized)")
    add_text_input_arguments(p)
    p.add_argument("--output", metavar="FILE", help="JSON Lines (default: stdout), FILE.npy or FILE.safetensors")


def run(args: argparse.Namespace) -> int:
    import logging

    from ..infer.features import FeatureExtractor, write_features
    from ..infer.input_files import read_texts
    from ..infer.runtime import InferenceOptions

    lines = read_texts(args.input, args.text_column, args.input_format, id_column=args.id_column)
    extractor = FeatureExtractor.from_pretrained(args.model, args.layers, args.align, InferenceOptions.from_args(args))
    inputs = [line.split() for line in lines.items] if args.words else lines.items
    n = write_features(extractor, inputs, args.output, split_into_words=args.words, where=lines.where,
                       model_name=str(args.model), ids=lines.ids)
    if args.output:
        logging.getLogger(__name__).info("features of %d inputs (layers %s, %s) written to %s", n,
                                         ",".join(map(str, extractor.layers)), args.align, args.output)
    return 0
