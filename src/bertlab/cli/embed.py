"""`bertlab embed --model DIR [--pooling cls|mean|max] [--no-normalize] [--window-overlap N] [--input FILE]
[--output FILE]`: sentence embeddings.

One text per line in (a file, or stdin); out, one JSON array per line (stdout or FILE), or a single (N, H)
float32 array when FILE ends in `.npy` or `.safetensors` (tensor "embeddings"). Inputs are read whole, then
embedded and written chunk by chunk, each chunk sorted by length into batches (see `bertlab.infer`).
Defaults are the service's (`bertlab serve`): the pooling the model folder declares (sentence-transformers'
config; mean otherwise), L2-normalised.
"""

from __future__ import annotations

import argparse

CHUNK = 8192  # lines embedded (and written) at a time


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..infer.embeddings import POOLINGS
    from ..infer.runtime import add_engine_argument, add_inference_arguments

    add_inference_arguments(p)
    add_engine_argument(p)
    add_embedding_arguments(p, POOLINGS)
    p.add_argument("--input", metavar="FILE", help="one text per line (default: stdin)")
    p.add_argument("--output", metavar="FILE", help="JSON Lines (default: stdout), or FILE.npy / FILE.safetensors")


def add_embedding_arguments(p: argparse.ArgumentParser, poolings) -> None:
    """The embedding options `embed` and `serve` share, with the same defaults."""
    p.add_argument("--pooling", default=None, choices=list(poolings),
                   help="cls: the [CLS] vector; mean: average of the tokens; max: per-dimension max "
                        "(default: the model folder's sentence-transformers pooling, else mean)")
    p.add_argument("--no-normalize", dest="normalize", action="store_false", default=True,
                   help="do not L2-normalise the embeddings (default: normalised, cosine = dot product)")
    p.add_argument("--normalize", dest="normalize", action="store_true", help=argparse.SUPPRESS)  # the default
    p.add_argument("--window-overlap", type=int, metavar="N",
                   help="embed a text over the length limit as overlapping windows (N tokens shared by "
                        "neighbours) averaged into one vector, instead of truncating it")


def run(args: argparse.Namespace) -> int:
    from ..infer.embeddings import Embedder
    from ..infer.inputs import read_lines
    from ..infer.outputs import NpyWriter, SafetensorsWriter, output_kind, text_output
    from ..infer.runtime import InferenceOptions
    from ..core.progress import track

    lines = read_lines(args.input)
    embedder = Embedder.from_pretrained(args.model, args.pooling, args.normalize, InferenceOptions.from_args(args),
                                        args.window_overlap)
    chunks = ((s, embedder.embed(lines.items[s:s + CHUNK], where=lambda i, s=s: lines.where(s + i)))
              for s in track(range(0, len(lines.items), CHUNK), -(-len(lines.items) // CHUNK), "embed",
                             f"chunk of {CHUNK} lines"))
    kind = output_kind(args.output)
    if kind == "jsonl":
        with text_output(args.output) as f:
            for _, vectors in chunks:
                f.writelines("[" + ",".join(f"{v:.8g}" for v in row) + "]\n" for row in vectors.tolist())
        return 0
    writer = (NpyWriter(args.output, (embedder.dim,)) if kind == "npy"
              else SafetensorsWriter(args.output, "embeddings", (embedder.dim,)))
    try:
        for _, vectors in chunks:
            writer.write(vectors)
    except BaseException:
        writer.abort()
        raise
    if kind == "npy":
        writer.close()
    else:
        writer.close(metadata={"pooling": embedder.pooling, "normalize": str(args.normalize), "model": str(args.model)})
    return 0
