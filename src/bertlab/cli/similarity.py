"""`bertlab similarity --model DIR A B`: the similarity of two texts' sentence embeddings, as
sentence-transformers' `similarity` scores them: with the folder's pooling and normalisation (`embed`'s
defaults), by cosine, or by dot product for a model whose config_sentence_transformers.json says
`similarity_fn_name: dot`. A SPLADE or ColBERT folder is refused without `--pooling` (their scores are
`evaluate-retrieval`'s and `serve`'s /rerank).

With `--pairs FILE` (one `A<TAB>B` pair per line) it prints one score per line instead; a table (.csv, .tsv,
.jsonl, .json, .parquet) is read as `predict` reads one -- the first text from --text-column (else text,
sentence1, ...), the second from --text-pair-column (else text_pair, sentence2, ...) -- and each row prints as
a JSON line {"id", "score"}, its id from the table. A `.tsv` stays tab-separated pairs without a header (say
`--input-format tsv` for a table with one).
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..infer.embeddings import POOLINGS
    from ..infer.input_files import INPUT_FORMATS
    from ..infer.runtime import add_inference_arguments

    add_inference_arguments(p)
    p.add_argument("texts", nargs="*", metavar="TEXT", help="the two texts to compare")
    p.add_argument("--pooling", choices=list(POOLINGS),
                   help="as for `bertlab embed` (default: the pooling the folder declares, else mean)")
    p.add_argument("--dimensions", type=int, metavar="N",
                   help="compare each vector's first N dimensions (a Matryoshka model's; sentence-transformers' "
                        "truncate_dim)")
    p.add_argument("--pairs", metavar="FILE", help="tab-separated pairs, one per line, one score per line out; or a "
                                                   "table (.csv, .jsonl, ...) of two text columns, JSON lines out")
    p.add_argument("--input-format", choices=INPUT_FORMATS,
                   help="how to read --pairs when its name does not say (text: tab-separated lines)")
    p.add_argument("--text-column", metavar="NAME", help="a table's first text (default: text, sentence1, ...)")
    p.add_argument("--text-pair-column", metavar="NAME",
                   help="a table's second text (default: text_pair, sentence2, ...)")


def run(args: argparse.Namespace) -> int:
    from ..core.errors import BertlabError
    from ..infer.embeddings import Embedder, cosine
    from ..infer.multivector import is_colbert_folder
    from ..infer.sparse import SPARSE_POOLINGS, folder_pooling
    from ..infer.st_folder import read_settings
    from ..infer.input_files import TEXT_FORMAT, input_format, read_texts
    from ..infer.inputs import read_lines
    from ..infer.outputs import json_line
    from ..infer.runtime import InferenceOptions

    ids = None
    kind = input_format(args.pairs, args.input_format) if args.pairs else TEXT_FORMAT
    if args.input_format is None and kind == "tsv":  # tab-separated pairs, no header: this command's own format
        kind = TEXT_FORMAT
    if kind != TEXT_FORMAT:
        table = read_texts(args.pairs, args.text_column, kind, with_pair=True,
                           text_pair_column=args.text_pair_column)
        pairs, ids = list(zip(table.items, table.pairs)), table.ids
    elif args.pairs:
        if args.text_column or args.text_pair_column:
            raise BertlabError(f"{args.pairs}: --text-column applies to tables (.csv, .tsv, .jsonl, .json, "
                               ".parquet, or --input-format); this input is tab-separated lines")
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
    if args.pooling is None and (is_colbert_folder(args.model) or folder_pooling(args.model) in SPARSE_POOLINGS):
        raise BertlabError(f"{args.model} scores texts by its own vectors (ColBERT's MaxSim, SPLADE's sparse dot "
                           "product; `serve` /rerank, `evaluate-retrieval`); --pooling compares its encoder pooled")
    settings = read_settings(args.model, args.pooling)
    settings.check_scored()
    embedder = Embedder.from_pretrained(args.model, settings.pooling, settings.normalize,
                                        InferenceOptions.from_args(args), dimensions=args.dimensions)
    prompt = settings.named_prompts.pick()  # encode's: the folder's default prompt, if it names one
    vectors = embedder.embed([prompt + t for pair in pairs for t in pair])
    a, b = vectors[0::2], vectors[1::2]
    scores = (a * b).sum(-1) if settings.similarity == "dot" else cosine(a, b)
    for i, score in enumerate(scores.tolist()):
        if ids is None:
            print(f"{score:.6f}")
        else:
            print(json_line({"id": ids[i], "score": round(score, 6)}), end="")
    return 0
