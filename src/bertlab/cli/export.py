"""`bertlab export onnx|openvino|ctranslate2|sentence-transformers --model DIR --out DIR`: a model for deployment
elsewhere.

    onnx                   model.onnx (dynamic batch and length) checked against PyTorch in ONNX Runtime (within
                           1e-4); `--quantize int8` adds model_int8.onnx and prints its cosine to fp32. Needs the
                           `export` extra: pip install 'bertlab-paper[export]'.
    openvino               openvino/openvino_model.xml (OpenVINO's IR, from the ONNX graph), checked against PyTorch
                           in OpenVINO; needs the `openvino` extra.
    ctranslate2            ctranslate2/model.bin (an encoder; CTranslate2 has no BERT task heads), checked against
                           PyTorch in CTranslate2; needs the `ctranslate2` extra.
    The onnx, openvino and ctranslate2 folders also hold config.json and the tokenizer, so `--model DIR
    --engine ENGINE` runs them in `embed`, `predict` and `serve`.
    sentence-transformers  the folder `SentenceTransformer(DIR)` loads, with the pooling the model was used with
                           (its sentence-transformers config; `--pooling` to choose), its prompts and
                           similarity function, and L2 normalisation as the folder has it (normalised when it does
                           not say; `--normalize` / `--no-normalize` to choose); `--pooling splade`: the
                           `SparseEncoder(DIR)` folder of the masked-LM head (SPLADE; the default for a folder saved
                           as one).
See `bertlab.infer.export`.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..infer.embeddings import POOLINGS
    from ..infer.sparse import SPARSE_POOLINGS

    p.add_argument("format", choices=["onnx", "openvino", "ctranslate2", "sentence-transformers"], help="what to write")
    p.add_argument("--model", type=Path, required=True, metavar="DIR", help="a Hugging Face-layout model folder")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="a new (or empty) output folder")
    p.add_argument("--quantize", choices=["int8"], help="onnx: also write a dynamically quantised int8 model")
    p.add_argument("--pooling", choices=[*POOLINGS, *SPARSE_POOLINGS],
                   help="sentence-transformers: the pooling (default: the model's own config, else mean); splade: "
                        "a SparseEncoder folder of the masked-LM head")
    p.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                   help="sentence-transformers: a Normalize module or not (default: as the folder's own pipeline; "
                        "a folder without modules.json: normalised)")


def run(args: argparse.Namespace) -> int:
    from ..core.errors import BertlabError
    from ..infer.export import EXPORTERS

    if args.format != "sentence-transformers" and (args.pooling is not None or args.normalize is not None):
        raise BertlabError("--pooling and --normalize / --no-normalize are options of the sentence-transformers "
                           "export")
    if args.format == "onnx":
        report = EXPORTERS["onnx"](args.model, args.out, quantize=args.quantize)
    elif args.format in ("openvino", "ctranslate2"):
        if args.quantize:
            raise BertlabError(f"--quantize is an option of the onnx export; {args.format} chooses int8 when it runs")
        from ..infer.engines import ENGINE_EXPORTERS

        report = ENGINE_EXPORTERS[args.format](args.model, args.out)
    else:
        if args.quantize:
            raise BertlabError("--quantize is an option of the onnx export")
        from ..infer.multivector import is_colbert_folder

        if args.pooling is None and is_colbert_folder(args.model):
            raise BertlabError(f"{args.model} is a ColBERT folder (vectors per token), already one that "
                               "sentence-transformers reads; --pooling mean|cls|max exports its encoder pooled")
        report = EXPORTERS["sentence-transformers"](args.model, args.out, pooling=args.pooling,
                                                    normalize=args.normalize)
    for line in report.lines():
        print(f"bertlab export: {line}")
    return 0
