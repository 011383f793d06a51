"""`bertlab evaluate TASK --model DIR --data PATH [--split dev] [--out DIR]`: re-score a fine-tuned model.

Prints the split's scores as JSON (nothing to score on an unlabeled test split) and, with `--out`, writes
the predictions there in the task's format (GLUE submission TSV, conlleval text, SQuAD JSON, ...).
"""

from __future__ import annotations

import argparse
import json

from ..tasks import TASKS


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..core.model_names import model_path

    p.add_argument("task", metavar="TASK", choices=list(TASKS), help=f"one of: {' '.join(TASKS)}")
    p.add_argument("--model", metavar="MODEL_DIR", required=True, type=model_path,
                   help="a fine-tuned model folder (OUT_DIR/model), or its name in the local Hugging Face cache")
    p.add_argument("--data", metavar="DATA_PATH", required=True, help="the task's folder or file(s)")
    p.add_argument("--split", default=None,
                   help="which split to score, and the name the output and the prediction file carry (default: "
                        "the task's first dev split; for one file, the split its name says -- test.csv is the "
                        "test split -- else, for a task on your own files, the file's name)")
    p.add_argument("--out", metavar="DIR", help="write the predictions here")
    p.add_argument("--max-seq-length", type=int, help="tokens per sequence (default: the task's)")
    p.add_argument("--batch-size", type=int, default=64, help="examples per prediction batch (default 64)")
    p.add_argument("--limit", type=int, metavar="N", help="score a seeded random N examples")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (the same as --dtype bf16)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "int8"), default=None,
                   help="precision to score in (default fp32): bf16 autocast, or int8 -- the CPU inference runtime's "
                        "int8 linear layers, to measure what `--dtype int8` costs a task")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")


def run(args: argparse.Namespace) -> int:
    from ..tasks import evaluate
    from ..models.auto import AutoTokenizer
    from ..train.finetune import subset
    from ..train.run_record import autocast_dtype, resolve_device

    from ..core.errors import BertlabError
    from ..infer.runtime import InferenceOptions, prepare

    if args.bf16 and args.dtype not in (None, "bf16"):
        raise BertlabError(f"--bf16 and --dtype {args.dtype} disagree; give one of them")
    dtype = "bf16" if args.bf16 else args.dtype or "fp32"
    spec = TASKS[args.task]
    split = split_name(spec, args.data, args.split)
    device = resolve_device(args.device)
    model = spec.head_class(args.model).from_pretrained(args.model).to(device)
    if dtype == "int8":  # refused in one line off the CPU
        model = prepare(model, InferenceOptions(device=str(device), dtype="int8"))
    spec = spec.with_model_config(model.config)  # own-data tasks: labels, columns, windows as trained
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    examples = subset(spec.read(args.data, split), args.limit)
    scores = evaluate(spec, model, tokenizer, examples, split,
                      max_length=args.max_seq_length or spec.default_max_seq_length, batch_size=args.batch_size,
                      out_dir=args.out, device=device, autocast_dtype=autocast_dtype("bf16" if dtype == "bf16" else "fp32"))
    print(json.dumps({"task": spec.name, "split": split, "data": str(args.data), "examples": len(examples),
                      "dtype": dtype, **scores},
                     indent=2))
    return 0


SPLIT_SPELLINGS = {"validation": "dev", "valid": "dev", "val": "dev", "eval": "dev"}


def split_name(spec, data: str, given: str | None) -> str:
    """The split `evaluate` scores and names: `given`; else, for one file, the split its name says (test.csv:
    test; validation.jsonl: dev), a task on the user's own files (no fixed splits) naming it after the file;
    else the task's first dev split. A name that is not a plain word is refused (it names the output file)."""
    import re
    from pathlib import Path

    from ..core.errors import ConfigError
    from ..tasks.base import FolderTask

    if given is not None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", given):
            raise ConfigError(f"--split {given!r}: expected a plain name (letters, digits, _ . -), e.g. dev or test")
        return given
    path = Path(data)
    if not path.is_file():
        return spec.eval_splits[0]
    stem = path.name.split(".", 1)[0]
    known = (*spec.eval_splits, *spec.test_splits, "train")
    said = SPLIT_SPELLINGS.get(stem.lower(), stem.lower())
    if said in known:
        return said
    if isinstance(spec, FolderTask) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", stem):
        return spec.eval_splits[0]  # a benchmark task reads a one-off file as its dev split (its columns)
    return stem
