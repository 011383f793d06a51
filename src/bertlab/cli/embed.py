"""`bertlab embed --model DIR [--pooling cls|mean|max|splade] [--no-normalize] [--window-overlap N] [--top-k N]
[--input FILE] [--output FILE]`: sentence embeddings, dense or sparse.

One text per line in (a file, or stdin), or a table (.csv, .tsv, .jsonl, .json, .parquet) read as `predict`
reads one: its text column (--text-column, else text, sentence, ...), its id column carried into the output.
Out, one JSON array per line (stdout or FILE) -- for a table, {"id", "embedding"} per row -- or a single (N, H)
float32 array when FILE ends in `.npy` or `.safetensors` (tensor "embeddings"; a table's ids in FILE.ids.json). Inputs are read whole, then
embedded and written chunk by chunk, each chunk sorted by length into batches (see `bertlab.infer`).
With `--ray`, the same over Ray Data (`bertlab.infer.ray_data`): --input a table, a folder or a glob of them,
--output a folder of Parquet shards (`id`, `embedding`), finished shards kept on a re-run.
Defaults are the service's (`bertlab serve`): the pooling the model folder declares (sentence-transformers'
config; mean otherwise), L2-normalised.

`--pooling splade` (a model with a masked-LM head; the default for a sentence-transformers SparseEncoder folder)
writes sparse vectors instead (`infer/sparse.py`): per line a JSON object {"token id": weight} of every non-zero
weight (`--top-k N`: the N largest) -- for a table, {"id", "embedding": {...}} -- or, to FILE.npz, one scipy.sparse
CSR matrix (rows in input order, columns the vocabulary).
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
    from ..infer.sparse import SPARSE_POOLINGS

    add_inference_arguments(p)
    add_engine_argument(p)
    add_embedding_arguments(p, [*POOLINGS, *SPARSE_POOLINGS])
    p.add_argument("--top-k", type=int, metavar="N",
                   help="--pooling splade: keep each text's N largest weights (default: every non-zero weight)")
    add_text_input_arguments(p)
    p.add_argument("--output", metavar="FILE", help="JSON Lines (default: stdout), or FILE.npy / FILE.safetensors "
                                                    "(sparse: FILE.jsonl or FILE.npz); with --ray a folder of Parquet "
                                                    "shards (id, embedding)")
    add_ray_arguments(p)


def add_embedding_arguments(p: argparse.ArgumentParser, poolings) -> None:
    """The embedding options `embed` and `serve` share, with the same defaults."""
    p.add_argument("--pooling", default=None, choices=list(poolings),
                   help="cls: the [CLS] vector; mean: average of the tokens; max: per-dimension max"
                        + ("; splade: sparse vocabulary weights from the masked-LM head" if "splade" in poolings
                           else "") + " (default: the model folder's sentence-transformers pooling, else mean)")
    p.add_argument("--no-normalize", dest="normalize", action="store_false", default=True,
                   help="do not L2-normalise the embeddings (default: normalised, cosine = dot product)")
    p.add_argument("--normalize", dest="normalize", action="store_true", help=argparse.SUPPRESS)  # the default
    p.add_argument("--window-overlap", type=int, metavar="N",
                   help="embed a text over the length limit as overlapping windows (N tokens shared by "
                        "neighbours) averaged into one vector, instead of truncating it")


def run(args: argparse.Namespace) -> int:
    from ..core.errors import BertlabError
    from ..infer.embeddings import Embedder
    from ..infer.input_files import read_texts, write_ids
    from ..infer.outputs import NpyWriter, SafetensorsWriter, output_kind, text_output
    from ..infer.runtime import InferenceOptions
    from ..core.progress import track

    from ..infer import ray_data
    from ..infer.sparse import SPARSE_POOLINGS, folder_pooling

    ray_data.check_ray_arguments(args)
    sparse = (args.pooling or folder_pooling(args.model)) in SPARSE_POOLINGS
    if args.ray is not None:
        if sparse:
            raise BertlabError("--ray writes dense embeddings; sparse vectors (--pooling splade) run without --ray")
        return ray_data.run_command(args, ray_data.run_embed, pooling=args.pooling, normalize=args.normalize,
                                    window_overlap=args.window_overlap)
    if sparse:
        return run_sparse(args)
    if args.top_k is not None:
        raise BertlabError("--top-k prunes sparse vectors; it needs --pooling splade")
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


def run_sparse(args: argparse.Namespace) -> int:
    """`--pooling splade`: sparse vectors (never normalised: their dot product is the score) to JSON Lines
    (streamed) or a CSR .npz (held until the end: 8 bytes a non-zero weight)."""
    from ..core.errors import BertlabError
    from ..core.progress import track
    from ..infer.input_files import read_texts, write_ids
    from ..infer.outputs import text_output
    from ..infer.runtime import InferenceOptions
    from ..infer.sparse import SparseRows, SpladeEncoder, check_sparse_output

    check_sparse_output(args.output)
    if args.window_overlap is not None:
        raise BertlabError("--window-overlap averages dense vectors; --pooling splade truncates long texts instead")
    lines = read_texts(args.input, args.text_column, args.input_format, id_column=args.id_column)
    encoder = SpladeEncoder.from_pretrained(args.model, InferenceOptions.from_args(args), args.top_k)
    chunks = ((s, encoder.encode(lines.items[s:s + CHUNK], where=lambda i, s=s: lines.where(s + i)))
              for s in track(range(0, len(lines.items), CHUNK), -(-len(lines.items) // CHUNK), "embed",
                             f"chunk of {CHUNK} lines"))
    if args.output is not None and str(args.output).lower().endswith(".npz"):
        SparseRows.concat([rows for _, rows in chunks], encoder.dim).save_npz(args.output)
        if lines.table:
            write_ids(args.output, lines.ids)
        return 0
    with text_output(args.output) as f:
        for start, rows in chunks:
            for k in range(len(rows)):
                obj = rows.json_weights(k)
                i = start + k
                f.write(f'{{"id": {json.dumps(lines.ids[i])}, "embedding": {obj}}}\n' if lines.table else obj + "\n")
    return 0
