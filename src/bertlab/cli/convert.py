"""`bertlab convert`: Google's TensorFlow BERT checkpoints to the Hugging Face layout, and back.

    bertlab convert uncased_L-12_H-768_A-12/bert_model.ckpt --out bert-base-uncased
    bertlab convert TF_PREFIX --config bert_config.json --vocab vocab.txt --out DIR [--model-class NAME]
    bertlab convert HF_DIR --to tf --out DIR        # DIR/bert_model.ckpt.* + bert_config.json (+ vocab.txt)

TensorFlow is not needed either way. The source of `--to hf` may be the checkpoint prefix, its `.index` file
or the folder holding it; `--config` and `--vocab` default to the files beside it.
"""

from __future__ import annotations

import argparse
import json
import time

from ..core.errors import BertlabError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="TensorFlow checkpoint prefix / .index file / folder (--to hf), or a Hugging "
                                  "Face-layout folder (--to tf)")
    p.add_argument("--out", required=True, help="folder to write (replaced atomically)")
    p.add_argument("--to", choices=["hf", "tf"], default="hf",
                   help="hf: TensorFlow -> config.json + model.safetensors (default); tf: the reverse")
    p.add_argument("--config", help="bert_config.json (default: the one beside the checkpoint)")
    p.add_argument("--vocab", help="vocab.txt to copy into the output (default: the one beside the source)")
    p.add_argument("--model-class", help="bertlab/HF class to build (default: from the heads in the checkpoint: "
                                         "BertForPreTraining, BertForMaskedLM, BertForQuestionAnswering, "
                                         "BertForSequenceClassification or BertModel)")
    p.add_argument("--format", choices=["text", "json"], default="text", help="how to print the summary")


def run(args: argparse.Namespace) -> int:
    from ..models.registry import default_family

    # A TensorFlow checkpoint names no model_type: Google's release is the default family's (BERT's)
    family = default_family()
    if family.tf_conversion is None:
        raise BertlabError(f"{family.name} models have no TensorFlow checkpoints to convert")
    convert_tf_to_hf, export_tf_checkpoint = family.tf_conversion
    start = time.perf_counter()
    if args.to == "hf":
        summary = convert_tf_to_hf(args.source, args.out, config=args.config, vocab=args.vocab,
                                   model_class=args.model_class)
    else:
        summary = export_tf_checkpoint(args.source, args.out, vocab=args.vocab, config=args.config)
    summary["seconds"] = round(time.perf_counter() - start, 2)
    if args.format == "json":
        print(json.dumps(summary, indent=2))
    elif args.to == "hf":
        print(f"{summary['source']} -> {summary['out']}: {summary['model_class']}, "
              f"{summary['parameters']:,} parameters, {summary['skipped_optimizer_tensors']} optimizer "
              f"tensors skipped, {summary['seconds']:.1f} s")
    else:
        print(f"{summary['source']} -> {summary['out']}: {summary['model_class']}, {summary['tensors']} tensors, "
              f"{summary['seconds']:.1f} s")
    return 0
