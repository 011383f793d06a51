"""`bertlab evaluate TASK --model DIR --data PATH [--split dev] [--out DIR]`: re-score a fine-tuned model.

Prints the split's scores as JSON (nothing to score on an unlabeled test split) and, with `--out`, writes
the predictions there in the task's format (GLUE submission TSV, conlleval text, SQuAD JSON, ...).
"""

from __future__ import annotations

import argparse
import json

from ..tasks import TASKS


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..model_names import model_path

    p.add_argument("task", metavar="TASK", choices=list(TASKS), help=f"one of: {' '.join(TASKS)}")
    p.add_argument("--model", metavar="MODEL_DIR", required=True, type=model_path,
                   help="a fine-tuned model folder (OUT_DIR/model), or its name in the local Hugging Face cache")
    p.add_argument("--data", metavar="DATA_PATH", required=True, help="the task's folder or file(s)")
    p.add_argument("--split", default=None, help="which split (default: the task's first dev split)")
    p.add_argument("--out", metavar="DIR", help="write the predictions here")
    p.add_argument("--max-seq-length", type=int, help="tokens per sequence (default: the task's)")
    p.add_argument("--batch-size", type=int, default=64, help="examples per prediction batch (default 64)")
    p.add_argument("--limit", type=int, metavar="N", help="score a seeded random N examples")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")


def run(args: argparse.Namespace) -> int:
    from ..tasks import evaluate
    from ..tokenizer import BertTokenizer
    from ..train.finetune import subset
    from ..train.setup import autocast_dtype, resolve_device

    spec = TASKS[args.task]
    split = args.split or spec.eval_splits[0]
    device = resolve_device(args.device)
    model = spec.head.from_pretrained(args.model).to(device)
    spec = spec.with_model_config(model.config)  # own-data tasks: labels, columns, windows as trained
    tokenizer = BertTokenizer.from_pretrained(args.model)
    examples = subset(spec.read(args.data, split), args.limit)
    scores = evaluate(spec, model, tokenizer, examples, split,
                      max_length=args.max_seq_length or spec.default_max_length, batch_size=args.batch_size,
                      out_dir=args.out, device=device, autocast_dtype=autocast_dtype("bf16" if args.bf16 else "fp32"))
    print(json.dumps({"task": spec.name, "split": split, "examples": len(examples), **scores}, indent=2))
    return 0
