"""`bertlab embed --model DIR [--pooling cls|mean|max|colbert] [--no-normalize] [--window-overlap N] [--input FILE]
[--output FILE]`: sentence embeddings, or a ColBERT folder's per-token vectors.

One text per line in (a file, or stdin), or a table (.csv, .tsv, .jsonl, .json, .parquet) read as `predict`
reads one: its text column (--text-column, else text, sentence, ...), its id column carried into the output.
Out, one JSON array per line (stdout or FILE) -- for a table, {"id", "embedding"} per row -- or a single (N, H)
float32 array when FILE ends in `.npy` or `.safetensors` (tensor "embeddings"; a table's ids in FILE.ids.json). Inputs are read whole, then
embedded and written chunk by chunk, each chunk sorted by length into batches (see `bertlab.infer`).
Defaults are the service's (`bertlab serve`): the pooling the model folder declares (sentence-transformers'
config; mean otherwise), L2-normalised.

`--pooling colbert` (the default for a ColBERT folder, `infer.multivector`): each text's token vectors, as a
query (`--text-kind query`: [Q], [MASK] padding to the query length) or a document (the default: [D], punctuation
dropped); one JSON list of vectors per line, or FILE.npz holding `vectors` (all texts' rows, `--vector-dtype`
float32 or float16), `offsets` (text i's rows are offsets[i]:offsets[i+1]) and a table's `ids`.
"""

from __future__ import annotations

import argparse
import json

CHUNK = 8192  # lines embedded (and written) at a time


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..infer.embeddings import POOLINGS
    from ..infer.multivector import MULTI_VECTOR_POOLINGS
    from ..infer.input_files import add_text_input_arguments
    from ..infer.runtime import add_engine_argument, add_inference_arguments

    add_inference_arguments(p)
    add_engine_argument(p)
    add_embedding_arguments(p, [*POOLINGS, *MULTI_VECTOR_POOLINGS])
    add_text_input_arguments(p)
    p.add_argument("--output", metavar="FILE", help="JSON Lines (default: stdout), or FILE.npy / FILE.safetensors "
                                                    "(colbert: FILE.npz)")
    p.add_argument("--text-kind", choices=["document", "query"], default="document",
                   help="colbert: embed the texts as documents (default) or as queries")
    p.add_argument("--vector-dtype", choices=["float32", "float16"], default="float32",
                   help="colbert: the vectors' type in FILE.npz (default float32)")


def add_embedding_arguments(p: argparse.ArgumentParser, poolings) -> None:
    """The embedding options `embed` and `serve` share, with the same defaults."""
    p.add_argument("--pooling", default=None, choices=list(poolings),
                   help="cls: the [CLS] vector; mean: average of the tokens; max: per-dimension max"
                        + ("; colbert: a ColBERT folder's vectors per token (default: colbert for a ColBERT folder, "
                           "else the " if "colbert" in poolings else " (default: the ")
                        + "model folder's sentence-transformers pooling, else mean)")
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
    from ..infer.multivector import is_colbert_folder
    from ..infer.runtime import InferenceOptions

    if args.pooling == "colbert" or (args.pooling is None and is_colbert_folder(args.model)):
        return embed_colbert(args)
    lines = read_texts(args.input, args.text_column, args.input_format)
    embedder = Embedder.from_pretrained(args.model, args.pooling, args.normalize, InferenceOptions.from_args(args),
                                        args.window_overlap)
    chunks = embedded_chunks(lines, lambda texts, where: embedder.embed(texts, where=where))
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
    write_chunks(writer, chunks)
    if lines.table:
        write_ids(args.output, lines.ids)
    if kind == "npy":
        writer.close()
    else:
        writer.close(metadata={"pooling": embedder.pooling, "normalize": str(args.normalize), "model": str(args.model)})
    return 0


def embed_colbert(args: argparse.Namespace) -> int:
    """`--pooling colbert`: each text's token vectors (see the module docstring)."""
    from ..core.errors import BertlabError
    from ..infer.input_files import read_texts
    from ..infer.multivector import ColbertEmbedder, RaggedNpzWriter
    from ..infer.outputs import json_line, text_output
    from ..infer.runtime import InferenceOptions

    for flag, given in (("--no-normalize", not args.normalize), ("--window-overlap", args.window_overlap is not None),
                        ("--max-length", args.max_length is not None)):
        if given:
            raise BertlabError(f"{flag} does not apply to --pooling colbert: its vectors are L2-normalised and its "
                               "lengths are the folder's query_length / document_length")
    suffix = str(args.output or "").lower()
    if suffix.endswith((".npy", ".safetensors")):
        raise BertlabError(f"{args.output}: ColBERT's vectors are ragged (a number per text); write FILE.npz or "
                           "JSON Lines")
    lines = read_texts(args.input, args.text_column, args.input_format)
    embedder = ColbertEmbedder.from_pretrained(args.model, InferenceOptions.from_args(args))
    chunks = embedded_chunks(lines, lambda texts, where: embedder.embed(texts, args.text_kind, where=where))
    if suffix.endswith(".npz"):
        writer = RaggedNpzWriter(args.output, embedder.dim, args.vector_dtype)
        write_chunks(writer, chunks)
        writer.close(lines.ids if lines.table else None, args.text_kind)
        return 0
    with text_output(args.output) as f:
        for start, vectors in chunks:
            for i, rows in enumerate(vectors, start):
                rows = rows.astype(args.vector_dtype).tolist()
                f.write(json_line({"id": lines.ids[i], "embedding": rows} if lines.table else rows))
    return 0


def embedded_chunks(lines, embed):
    """(start, vectors) of the inputs `CHUNK` at a time, with progress; `embed(texts, where)`."""
    from ..core.progress import track

    return ((s, embed(lines.items[s:s + CHUNK], lambda i, s=s: lines.where(s + i)))
            for s in track(range(0, len(lines.items), CHUNK), -(-len(lines.items) // CHUNK), "embed",
                           f"chunk of {CHUNK} lines"))


def write_chunks(writer, chunks) -> None:
    """Every chunk's vectors to an array writer; on any failure its half-written file is removed."""
    try:
        for _, vectors in chunks:
            writer.write(vectors)
    except BaseException:
        writer.abort()
        raise
