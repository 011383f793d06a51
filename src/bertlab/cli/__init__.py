"""The `bertlab` command: a dict of subcommands, each a module under `bertlab.cli` with `add_arguments` and `run`.

Subcommand modules are imported only when chosen, so `bertlab --help` and light commands start fast.
A `BertlabError` (bad input) is printed as one line and exits with status 2 -- also one raised while the
arguments are read (a `--model` that is neither a folder nor in the local Hugging Face cache) -- as is a
file-system error (disk full, read-only file system) no command translated itself; Ctrl-C exits with 130.
`bertlab --version` prints the installed version (`bertlab.__version__`).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

# name -> (module under bertlab.cli, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "params": ("params", "the paper's parameter arithmetic for presets or config files"),
    "demo": ("demo", "sentence similarities from a real pre-trained BERT (all-MiniLM-L6-v2)"),
    "pretrain": ("pretrain", "pre-train an encoder (masked LM alone or with NSP, SOP or SBO; replaced-token "
                            "detection) on a prepared data directory; exact resume, torchrun"),
    "pretrain-t5": ("pretrain_t5", "pre-train T5 with a denoising objective (span corruption, ...; Adafactor)"),
    "plot": ("plot", "draw a run's loss / accuracy / learning-rate curves to PNG"),
    "prepare": ("prepare", "pre-training data: corpus -> token shards -> an objective's instances (masked LM, "
                          "sentence pairs, T5's denoising)"),
    "convert": ("convert", "Google's TensorFlow BERT checkpoints to the Hugging Face layout, and back (--to tf)"),
    "finetune": ("finetune", "fine-tune a model on a GLUE, SQuAD, CoNLL-2003 or SWAG task or your own files (one added layer)"),
    "finetune-multi": ("finetune_multi", "fine-tune one encoder on several tasks at once, a head each (MT-DNN)"),
    "finetune-t5": ("finetune_t5", "fine-tune T5 text-to-text on one task or several mixed (GLUE, SQuAD)"),
    "finetune-features": ("finetune_features", "NER from frozen BERT features: a BiLSTM tagger on chosen layers "
                                               "(paper Table 7)"),
    "evaluate": ("evaluate", "re-score a fine-tuned model on a task's split and write its predictions"),
    "tokenize": ("tokenize", "cut text into a model's tokens (WordPiece, BPE, SentencePiece) or ids, for inspection"),
    "vocab": ("vocab", "learn a vocabulary from text files (WordPiece; byte-level BPE, SentencePiece: --kind): vocab train"),
    "distill": ("distill", "distil a teacher encoder into a smaller, faster student (general or --task; DistilBERT)"),
    "features": ("features", "hidden states of chosen layers per token or word (Google's extract_features.py)"),
    "embed": ("embed", "sentence embeddings (cls / mean / max pooling) to JSON Lines or .npy"),
    "similarity": ("similarity", "cosine similarity of two texts' sentence embeddings"),
    "fill-mask": ("fill_mask", "the masked LM's top-k words for each [MASK] in a text"),
    "predict": ("predict", "run a fine-tuned model (classification, NER, QA, multiple choice) over a file"),
    "generate": ("generate", "text-to-text generation with a T5 model (greedy or beam search; span filling)"),
    "serve": ("serve", "an HTTP service: OpenAI /v1/embeddings, TEI /embed /rerank /predict, /metrics, batching"),
    "export": ("export", "a model as ONNX (optionally int8) or as a sentence-transformers folder"),
    "evaluate-retrieval": ("evaluate_retrieval", "score an embedding model (and a reranker) on a retrieval set as "
                                                 "BEIR does: nDCG@k, MRR@k, Recall@k, MAP@k; a TREC run file"),
    "finetune-embeddings": ("finetune_embeddings", "fine-tune a sentence-embedding model on your pairs (MNRL, GradCache, "
                                                   "Matryoshka, CoSENT, MarginMSE); a sentence-transformers folder"),
    "mine-negatives": ("mine_negatives", "hard negatives for (anchor, positive) pairs, ranked by an embedding model"),
    "finetune-reranker": ("finetune_reranker", "fine-tune a cross-encoder reranker (BCE, listwise, teacher "
                                               "distillation); served by /rerank"),
}
# Commands that train: `--threads`, with a default chosen for the machine as it is (bertlab/core/threads.py)
TRAINING_COMMANDS = ("pretrain", "pretrain-t5", "finetune", "finetune-multi", "finetune-t5", "finetune-features",
                     "distill", "finetune-embeddings", "finetune-reranker")


def main(argv: list[str] | None = None) -> int:
    from ..core.errors import BertlabError
    from ..core.threads import prepare_wait_policy, use_threads

    argv = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in argv if a in COMMANDS), None)
    # Before the subcommand's module imports torch: the OpenMP wait policy is read once, at that import
    busy = prepare_wait_policy() if chosen in TRAINING_COMMANDS else None
    command = chosen or "bertlab"
    try:
        parser = build_parser(full=False, chosen=chosen)
        args, unknown = parser.parse_known_args(argv)  # option types may raise a BertlabError (model_path)
        if unknown:
            unrecognized(parser, argv, unknown)
        command = args.command
        logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                            datefmt="%H:%M:%S")
        if args.command in TRAINING_COMMANDS:
            use_threads(args.threads, busy)
        code = int(importlib.import_module(f"bertlab.cli.{args._module}").run(args) or 0)
        if args.command in TRAINING_COMMANDS:
            from ..train.distributed import leave_job, torchrun_world_size

            if torchrun_world_size() > 1:
                leave_job(code)  # every process leaves the group; the interpreter's teardown could abort one
        return code
    except BertlabError as e:
        print(f"bertlab {command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"bertlab {command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `bertlab ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:
        # The last resort for a file-system failure no write site translated: one line naming the file and
        # the cause (disk full, read-only file system) instead of a traceback. Only I/O errors that name a
        # file or can only come from writing; anything else is a bug and keeps its traceback.
        line = io_error_line(e)
        if line is None:
            raise
        print(f"bertlab {command}: error: {line}", file=sys.stderr)
        return 2


def build_parser(full: bool = True, chosen: str | None = None) -> argparse.ArgumentParser:
    """The whole argparse tree of `bertlab`. `full` adds every subcommand's options (the documentation's CLI
    reference and its command checks read it); `main` adds only the chosen one's, so a command starts fast."""
    from .. import __version__
    from ..core.threads import add_threads_argument

    # allow_abbrev=False, here and for every subcommand: a prefix of a flag (`--text-colum`) is an error with a
    # suggestion (`unrecognized`), never silently taken for the flag it starts
    parser = argparse.ArgumentParser(prog="bertlab", description="BERT and its family: pre-train, fine-tune, evaluate and serve.",
                                     allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"bertlab {__version__}")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False)
        p.set_defaults(_module=module)
        if full or name == chosen:
            importlib.import_module(f"bertlab.cli.{module}").add_arguments(p)
            if name in TRAINING_COMMANDS:
                add_threads_argument(p, "the machine's physical cores, idle workers sleeping when other "
                                        "processes keep some busy; logged at the start")
    return parser


def unrecognized(parser: argparse.ArgumentParser, argv: list[str], unknown: list[str]) -> None:
    """Arguments no option took: the error of the (sub)command they were given to -- its usage, not the
    top-level one -- naming the closest flag it has (exits with status 2, as argparse does)."""
    import difflib

    command = parser
    for word in argv:  # down the subcommands named on the line (`bertlab vocab train ...`)
        subs = next((a for a in command._actions if isinstance(a, argparse._SubParsersAction)), None)
        if subs is None:
            break
        if word in subs.choices:
            command = subs.choices[word]
    flags = [f for action in command._actions for f in action.option_strings if f.startswith("--")]
    hints = []
    for arg in unknown:
        if arg.startswith("-"):
            close = difflib.get_close_matches(arg.split("=", 1)[0], flags, n=1, cutoff=0.6)
            if close:
                hints.append(f"{arg.split('=', 1)[0]}: did you mean {close[0]}?")
    command.error(f"unrecognized arguments: {' '.join(unknown)}" + (" (" + "; ".join(hints) + ")" if hints else ""))


def io_error_line(error: BaseException) -> str | None:
    """`PATH: disk full` for an OSError (or one behind a torch/safetensors error) that names a file or is a
    write failure; None for anything else."""
    from ..core.errors import WRITE_ERRNOS, describe_os_error, os_error_of

    os_error = os_error_of(error)
    if os_error is None or (os_error.filename is None and os_error.errno not in WRITE_ERRNOS):
        return None
    where = os_error.filename if os_error.filename is not None else "writing the output"
    return f"{os.fsdecode(where)}: {describe_os_error(os_error)}"


if __name__ == "__main__":
    sys.exit(main())
