"""`bertlab embed --model DIR [--pooling cls|mean|max] [--no-normalize] [--window-overlap N] [--input FILE]
[--output FILE]`: sentence embeddings.

One text per line in (a file, or stdin), or a table (.csv, .tsv, .jsonl, .json, .parquet) read as `predict`
reads one: its text column (--text-column, else text, sentence, ...), its id column carried into the output.
Out, one JSON array per line (stdout or FILE) -- for a table, {"id", "embedding"} per row -- or a single (N, H)
float32 array when FILE ends in `.npy` or `.safetensors` (tensor "embeddings"; a table's ids in FILE.ids.json). Inputs are read whole, then
embedded and written chunk by chunk, each chunk sorted by length into batches (see `bertlab.infer`).
With `--ray`, the same over Ray Data (`bertlab.infer.ray_data`): --input a table, a folder or a glob of them,
--output a folder of Parquet shards (`id`, `embedding`), finished shards kept on a re-run.
Defaults are the service's (`bertlab serve`): the pooling the model folder declares (sentence-transformers'
config; mean otherwise), L2-normalised.
"""

from __future__ import annotations

import argparse
import json

CHUNK = 8192  # lines embedded (and written) at a time


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..infer.embeddings import POOLINGS
    from ..infer.input_files import add_text_input_arguments
    from ..infer.ray_data import add_ray_arguments
    from ..infer.runtime import add_engine_argument, add_inference_arguments

    add_inference_arguments(p)
    add_engine_argument(p)
    add_embedding_arguments(p, POOLINGS)
    add_text_input_arguments(p)
    p.add_argument("--output", metavar="FILE", help="JSON Lines (default: stdout), or FILE.npy / FILE.safetensors; "
                                                    "with --ray a folder of Parquet shards (id, embedding)")
    add_ray_arguments(p)


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
    from ..infer.input_files import read_texts, write_ids
    from ..infer.outputs import NpyWriter, SafetensorsWriter, output_kind, text_output
    from ..infer.runtime import InferenceOptions
    from ..core.progress import track

    from ..infer import ray_data

    ray_data.check_ray_arguments(args)
    if args.ray is not None:
        return ray_data.run_command(args, ray_data.run_embed, pooling=args.pooling, normalize=args.normalize,
                                    window_overlap=args.window_overlap)
    lines = read_texts(args.input, args.text_column, args.input_format, id_column=args.id_column)
    embedder = Embedder.from_pretrained(args.model, args.pooling, args.normalize, InferenceOptions.from_args(args),
                                        args.window_overlap)
    chunks = ((s, embedder.embed(lines.items[s:s + CHUNK], where=lambda i, s=s: lines.where(s + i)))
              for s in track(range(0, len(lines.items), CHUNK), -(-len(lines.items) // CHUNK), "embed",
                             f"chunk of {CHUNK} lines"))
    kind = output_kind(args.output)
    if kind == "jsonl":
        with text_output(args.output) as f:
            for start, vectors in chunks:
                for i, row in enumerate(vectors.tolist(), start):
                    array = "[" + ",".join(f"{v:.8g}" for v in row) + "]"
                    # a table's row: its id first, as `predict` writes it
                    f.write(f'{{"id": {json.dumps(lines.ids[i])}, "embedding": {array}}}\n' if lines.table
                            else array + "\n")
        return 0
    writer = (NpyWriter(args.output, (embedder.dim,)) if kind == "npy"
              else SafetensorsWriter(args.output, "embeddings", (embedder.dim,)))
    try:
        for _, vectors in chunks:
            writer.write(vectors)
    except BaseException:
        writer.abort()
        raise
    if lines.table:
        write_ids(args.output, lines.ids)
    if kind == "npy":
        writer.close()
    else:
        writer.close(metadata={"pooling": embedder.pooling, "normalize": str(args.normalize), "model": str(args.model)})
    return 0
