"""`bertlab embed --model DIR [--pooling cls|mean|max|splade|colbert] [--no-normalize] [--window-overlap N]
[--top-k N] [--input FILE] [--output FILE]`: sentence embeddings, dense or sparse, or a ColBERT folder's per-token
vectors.

One text per line in (a file, or stdin), or a table (.csv, .tsv, .jsonl, .json, .parquet) read as `predict`
reads one: its text column (--text-column, else text, sentence, ...), its id column carried into the output.
Out, one JSON array per line (stdout or FILE) -- for a table, {"id", "embedding"} per row -- or a single (N, H)
float32 array when FILE ends in `.npy` or `.safetensors` (tensor "embeddings"; a table's ids in FILE.ids.json). Inputs are read whole, then
embedded and written chunk by chunk, each chunk sorted by length into batches (see `bertlab.infer`).
With `--ray`, the same over Ray Data (`bertlab.infer.ray_data`): --input a table, a folder or a glob of them,
--output a folder of Parquet shards (`id`, `embedding`), finished shards kept on a re-run.
Defaults are the service's (`bertlab serve`) and sentence-transformers' `encode`: the pooling the model folder
declares (its config; mean otherwise), L2-normalised when its pipeline has a Normalize module (a folder without
modules.json: normalised).

`--pooling splade` (a model with a masked-LM head; the default for a sentence-transformers SparseEncoder folder)
writes sparse vectors instead (`infer/sparse.py`): per line a JSON object {"token id": weight} of every non-zero
weight (`--top-k N`: the N largest) -- for a table, {"id", "embedding": {...}} -- or, to FILE.npz, one scipy.sparse
CSR matrix (rows in input order, columns the vocabulary).

`--pooling colbert` (the default for a ColBERT folder, `infer.multivector`): each text's token vectors, as a
query (`--text-kind query`: [Q], [MASK] padding to the query length) or a document (the default: [D], punctuation
dropped); one JSON list of vectors per line, or FILE.npz holding `vectors` (all texts' rows, `--vector-dtype`
float32 or float16), `offsets` (text i's rows are offsets[i]:offsets[i+1]) and a table's `ids`.

A BGE-M3 folder (`infer.bge_m3`: an encoder with sparse_linear.pt and colbert_linear.pt) gives three outputs;
`--vectors` picks one -- dense (the default: the normalised [CLS] vector, written as any dense embedding), sparse
(lexical weights, written as `--pooling splade` writes them, `--top-k` too), colbert (vectors per token, written as
`--pooling colbert` writes them) -- or all: one JSON object per line, {"dense", "sparse", "colbert"}.
"""

from __future__ import annotations

import argparse
import json

CHUNK = 8192  # lines embedded (and written) at a time


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..infer.embeddings import POOLINGS
    from ..infer.multivector import MULTI_VECTOR_POOLINGS
    from ..infer.input_files import add_text_input_arguments
    from ..infer.ray_data import add_ray_arguments
    from ..infer.runtime import add_engine_argument, add_inference_arguments
    from ..infer.bge_m3 import VECTOR_CHOICES
    from ..infer.sparse import SPARSE_POOLINGS

    add_inference_arguments(p)
    add_engine_argument(p)
    add_embedding_arguments(p, [*POOLINGS, *SPARSE_POOLINGS, *MULTI_VECTOR_POOLINGS])
    p.add_argument("--top-k", type=int, metavar="N",
                   help="--pooling splade: keep each text's N largest weights (default: every non-zero weight)")
    add_text_input_arguments(p)
    p.add_argument("--output", metavar="FILE", help="JSON Lines (default: stdout), or FILE.npy / FILE.safetensors "
                                                    "(splade: FILE.jsonl or FILE.npz; colbert: FILE.npz); with --ray "
                                                    "a folder of Parquet shards (id, embedding)")
    add_ray_arguments(p)
    p.add_argument("--text-kind", choices=["document", "query"],
                   help="embed the texts as queries or documents: the folder's query or document prompt put before "
                        "each (sentence-transformers' encode_query / encode_document); colbert: its [Q] or [D] "
                        "marker and lengths (default: documents). Without it a dense or sparse text gets the "
                        "folder's default prompt, if it names one (encode's)")
    p.add_argument("--prompt-name", metavar="NAME",
                   help="put the folder's prompt NAME (config_sentence_transformers.json) before each text")
    p.add_argument("--prompt", metavar="TEXT", help="put TEXT before each text (instead of the folder's prompts)")
    p.add_argument("--dimensions", type=int, metavar="N",
                   help="keep each vector's first N dimensions, normalised again when the vectors are (a Matryoshka "
                        "model's shorter vectors; sentence-transformers' truncate_dim)")
    p.add_argument("--vector-dtype", choices=["float32", "float16"], default="float32",
                   help="colbert: the vectors' type in FILE.npz (default float32)")
    p.add_argument("--vectors", choices=list(VECTOR_CHOICES),
                   help="a BGE-M3 folder: which of its outputs to write: dense (default), sparse (lexical weights), "
                        "colbert (vectors per token) or all (JSON Lines of {dense, sparse, colbert})")


def add_embedding_arguments(p: argparse.ArgumentParser, poolings) -> None:
    """The embedding options `embed` and `serve` share, with the same defaults."""
    p.add_argument("--pooling", default=None, choices=list(poolings),
                   help="cls: the [CLS] vector; mean: average of the tokens; max: per-dimension max"
                        + ("; splade: sparse vocabulary weights from the masked-LM head" if "splade" in poolings
                           else "")
                        + ("; colbert: a ColBERT folder's vectors per token (default: colbert for a ColBERT folder, "
                           "else the " if "colbert" in poolings else " (default: the ")
                        + "model folder's sentence-transformers pooling, else mean)")
    p.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                   help="L2-normalise the embeddings or not (default: as the folder's sentence-transformers pipeline "
                        "does -- normalised when it has a Normalize module, not for a model trained for dot "
                        "products; normalised for a folder without modules.json, so cosine = dot product)")
    p.add_argument("--window-overlap", type=int, metavar="N",
                   help="embed a text over the length limit as overlapping windows (N tokens shared by "
                        "neighbours) averaged into one vector, instead of truncating it")


def run(args: argparse.Namespace) -> int:
    from ..core.errors import BertlabError
    from ..infer.embeddings import Embedder, resolve_normalize
    from ..infer.input_files import read_texts, write_ids
    from ..infer.outputs import NpyWriter, SafetensorsWriter, output_kind, text_output
    from ..infer.bge_m3 import is_bge_m3_folder
    from ..infer.multivector import is_colbert_folder
    from ..infer.runtime import InferenceOptions

    from ..infer import ray_data
    from ..infer.sparse import SPARSE_POOLINGS, folder_pooling

    ray_data.check_ray_arguments(args)
    if args.prompt is not None and args.prompt_name is not None:
        raise BertlabError("--prompt puts its own text before each input, --prompt-name one of the folder's: give one")
    if is_bge_m3_folder(args.model):
        if args.pooling is not None:
            raise BertlabError("a BGE-M3 folder's outputs are picked with --vectors (dense, sparse, colbert, all), "
                               "not --pooling")
        if args.vectors not in (None, "dense"):
            return embed_bge_m3(args)
        args.pooling = "cls"  # BGE-M3's dense vector: the [CLS] vector, normalised as its folder says
    elif args.vectors is not None:
        raise BertlabError(f"--vectors picks among a BGE-M3 folder's outputs; {args.model} has no sparse_linear.pt "
                           "and colbert_linear.pt (other folders: --pooling)")
    colbert = args.pooling == "colbert" or (args.pooling is None and is_colbert_folder(args.model))
    sparse = not colbert and (args.pooling or folder_pooling(args.model)) in SPARSE_POOLINGS
    if args.dimensions is not None and (sparse or colbert):
        raise BertlabError("--dimensions shortens dense vectors; sparse (splade) and per-token (colbert) vectors "
                           "are written whole")
    if args.ray is not None:
        if sparse or colbert:
            raise BertlabError("--ray writes dense embeddings; sparse (--pooling splade) and per-token (--pooling "
                               "colbert) vectors run without --ray")
        return ray_data.run_command(args, ray_data.run_embed, pooling=args.pooling, normalize=args.normalize,
                                    window_overlap=args.window_overlap, prompt=text_prompt(args),
                                    dimensions=args.dimensions)
    if args.top_k is not None and not sparse:
        raise BertlabError("--top-k prunes sparse vectors; it needs --pooling splade")
    if sparse:
        return run_sparse(args)
    if colbert:
        return embed_colbert(args)
    lines = with_prompt(read_texts(args.input, args.text_column, args.input_format, id_column=args.id_column),
                        text_prompt(args))
    embedder = Embedder.from_pretrained(args.model, args.pooling, resolve_normalize(args.model, args.normalize),
                                        InferenceOptions.from_args(args), args.window_overlap, args.dimensions)
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
        writer.close(metadata={"pooling": embedder.pooling, "normalize": str(embedder.normalize),
                               "model": str(args.model)})
    return 0


def text_prompt(args: argparse.Namespace) -> str:
    """The text put before each input: --prompt, else the folder's prompt as sentence-transformers picks it
    (`st_folder.FolderPrompts.pick`)."""
    from ..infer.st_folder import read_prompts

    if args.prompt is not None:
        return args.prompt
    return read_prompts(args.model).pick(args.prompt_name, args.text_kind)


def with_prompt(lines, prompt: str):
    """`lines` with `prompt` before each text (the same object when there is none)."""
    if prompt:
        lines.items = [prompt + text for text in lines.items]
    return lines


def run_sparse(args: argparse.Namespace, encoder=None, what: str = "--pooling splade") -> int:
    """`--pooling splade` (or `encoder`, a BGE-M3 folder's lexical weights): sparse vectors (never normalised:
    their dot product is the score) to JSON Lines (streamed) or a CSR .npz (held until the end: 8 bytes a
    non-zero weight)."""
    from ..core.errors import BertlabError
    from ..infer.input_files import read_texts, write_ids
    from ..infer.outputs import text_output
    from ..infer.runtime import InferenceOptions
    from ..infer.sparse import SparseRows, SpladeEncoder, check_sparse_output

    check_sparse_output(args.output, what)
    if args.window_overlap is not None:
        raise BertlabError(f"--window-overlap averages dense vectors; {what} truncates long texts instead")
    lines = with_prompt(read_texts(args.input, args.text_column, args.input_format, id_column=args.id_column),
                        text_prompt(args))
    encoder = encoder or SpladeEncoder.from_pretrained(args.model, InferenceOptions.from_args(args), args.top_k)
    chunks = embedded_chunks(lines, lambda texts, where: encoder.encode(texts, where=where))
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


def embed_colbert(args: argparse.Namespace, embedder=None) -> int:
    """`--pooling colbert` (or `embedder`, a BGE-M3 folder's ColBERT vectors): each text's token vectors (see
    the module docstring)."""
    from ..core.errors import BertlabError
    from ..infer.input_files import read_texts
    from ..infer.multivector import ColbertEmbedder, RaggedNpzWriter
    from ..infer.outputs import json_line, text_output
    from ..infer.runtime import InferenceOptions

    for flag, given in (("--no-normalize", args.normalize is False),
                        ("--window-overlap", args.window_overlap is not None),
                        ("--max-seq-length", args.max_seq_length is not None)):
        if given and (embedder is None or flag == "--window-overlap"):
            raise BertlabError(f"{flag} does not apply to --pooling colbert: its vectors are L2-normalised and its "
                               "lengths are the folder's query_length / document_length")
    if args.prompt is not None or args.prompt_name is not None:
        raise BertlabError("--prompt and --prompt-name do not apply to --pooling colbert: --text-kind places its "
                           "query or document marker")
    text_kind = args.text_kind or "document"
    suffix = str(args.output or "").lower()
    if suffix.endswith((".npy", ".safetensors")):
        raise BertlabError(f"{args.output}: ColBERT's vectors are ragged (a number per text); write FILE.npz or "
                           "JSON Lines")
    lines = read_texts(args.input, args.text_column, args.input_format, id_column=args.id_column)
    embedder = embedder or ColbertEmbedder.from_pretrained(args.model, InferenceOptions.from_args(args))
    chunks = embedded_chunks(lines, lambda texts, where: embedder.embed(texts, text_kind, where=where))
    if suffix.endswith(".npz"):
        writer = RaggedNpzWriter(args.output, embedder.dim, args.vector_dtype)
        write_chunks(writer, chunks)
        writer.close(lines.ids if lines.table else None, text_kind)
        return 0
    with text_output(args.output) as f:
        for start, vectors in chunks:
            for i, rows in enumerate(vectors, start):
                rows = rows.astype(args.vector_dtype).tolist()
                f.write(json_line({"id": lines.ids[i], "embedding": rows} if lines.table else rows))
    return 0


def embed_bge_m3(args: argparse.Namespace) -> int:
    """A BGE-M3 folder's `--vectors sparse | colbert | all` (dense goes the dense path)."""
    from ..core.errors import BertlabError
    from ..infer.bge_m3 import BgeM3Encoder, ColbertView, LexicalView, outputs_of
    from ..infer.embeddings import resolve_normalize
    from ..infer.input_files import read_texts
    from ..infer.outputs import json_line, text_output
    from ..infer.runtime import InferenceOptions

    outputs = outputs_of(args.vectors)
    if args.dimensions is not None:
        raise BertlabError("--dimensions shortens the dense vector; write it alone (--vectors dense)")
    if args.top_k is not None and "sparse" not in outputs:
        raise BertlabError("--top-k prunes sparse vectors; it needs --vectors sparse or all")
    if args.top_k is not None and args.top_k < 1:
        raise BertlabError(f"--top-k must be at least 1, got {args.top_k}")
    if args.ray is not None:
        raise BertlabError("--ray writes dense embeddings; a BGE-M3 folder's --vectors sparse / colbert / all run "
                           "without --ray")
    m3 = BgeM3Encoder.from_pretrained(args.model, InferenceOptions.from_args(args),
                                      resolve_normalize(args.model, args.normalize))
    m3.top_k = args.top_k
    if args.vectors == "sparse":
        return run_sparse(args, LexicalView(m3), "--vectors sparse")
    if args.vectors == "colbert":
        return embed_colbert(args, ColbertView(m3))
    if args.window_overlap is not None:
        raise BertlabError("--window-overlap averages dense vectors; --vectors all truncates long texts instead")
    if args.output is not None and str(args.output) != "-" and not str(args.output).lower().endswith(
            (".jsonl", ".json")):
        raise BertlabError(f"--output {args.output}: --vectors all writes JSON Lines (FILE.jsonl or stdout), one "
                           "object per text; write arrays one output at a time (--vectors dense|sparse|colbert)")
    lines = with_prompt(read_texts(args.input, args.text_column, args.input_format, id_column=args.id_column),
                        text_prompt(args))
    chunks = embedded_chunks(lines, lambda texts, where: m3.encode(texts, outputs, where=where))
    with text_output(args.output) as f:
        for start, out in chunks:
            for k in range(len(out.dense)):
                ids, w = out.sparse.row(k)
                row = {"dense": out.dense[k].tolist(), "sparse": dict(zip(map(str, ids.tolist()), w.tolist())),
                       "colbert": out.colbert[k].astype(args.vector_dtype).tolist()}
                f.write(json_line({"id": lines.ids[start + k], **row} if lines.table else row))
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
