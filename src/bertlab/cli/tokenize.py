"""`bertlab tokenize --vocab DIR_OR_VOCAB TEXT ...`: show how text is cut into word pieces (or, given a model
folder of another family, into its family's pieces).

Like `fill-mask` and `similarity`, the texts are the arguments; `--input FILE` (also spelled `--file`,
repeatable; `-` is stdin) reads one text per line instead, and with neither, piped stdin is read. One
output line per text: the pieces separated by spaces (default), their ids, or a JSON object with tokens,
ids, offsets and word ids. (Before, the arguments were file names; arguments that all name existing files
are still read as files, with a warning.)
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..core.model_names import resolve_model

    p.add_argument("texts", nargs="*", metavar="TEXT", help="text(s) to tokenize")
    p.add_argument("--input", "--file", dest="inputs", action="append", metavar="FILE",
                   help="UTF-8 text file, one text per line; '-' reads stdin; repeatable")
    p.add_argument("--vocab", required=True, type=lambda v: resolve_model(v, "vocabulary file or tokenizer folder"),
                   help="a vocab.txt or tokenizer.json, a tokenizer folder (either, + tokenizer_config.json), a "
                        "model folder of any family, or a model's name in the local Hugging Face cache")
    case = p.add_mutually_exclusive_group()
    case.add_argument("--cased", action="store_true", help="keep case and accents (cased models)")
    case.add_argument("--uncased", action="store_true", help="lowercase and strip accents (uncased models)")
    p.add_argument("--format", choices=["tokens", "ids", "json"], default="tokens")
    p.add_argument("--special", action="store_true",
                   help="add the family's special tokens ([CLS] and [SEP]; RoBERTa, XLM-R: <s> and </s>)")
    p.add_argument("--max-seq-length", type=int, default=None, help="truncate to this many tokens")


def texts_to_tokenize(texts: list[str], inputs: list[str] | None) -> Iterator[str]:
    """The arguments, else the --input files (or stdin) line by line; old-style file arguments still work."""
    from ..core.errors import BertlabError
    from ..infer.inputs import read_lines

    if texts and inputs:
        raise BertlabError("give texts as arguments or with --input FILE, not both")
    if texts and all(Path(t).is_file() for t in texts):
        log.warning("reading %s as file%s: file arguments are deprecated, use --input FILE (arguments are texts)",
                    ", ".join(texts), "s" if len(texts) > 1 else "")
        inputs = texts
    elif texts:
        yield from texts
        return
    if not inputs:
        if sys.stdin.isatty():
            raise BertlabError("no text given; pass TEXT arguments, --input FILE, or pipe text in")
        inputs = ["-"]
    for name in inputs:
        if name == "-":  # streamed, line by line, as a pipe delivers it
            yield from (line.rstrip("\n").removesuffix("\r") for line in sys.stdin)
        else:
            yield from read_lines(name).items


def family_tokenizer(path: Path, overrides: dict):
    """The tokenizer of a model folder of any family but BERT whose tokenizer has BertTokenizer's call surface
    (RoBERTa, XLM-R, ALBERT, ...); None for anything else, which BertTokenizer reads."""
    from ..core.errors import BertlabError
    from ..models.registry import FAMILIES, family, model_type_of
    from ..tokenizer import TokenizerBase

    if not (path.is_dir() and (path / "config.json").is_file()):
        return None
    model_type = model_type_of(path)
    if model_type == "bert" or model_type not in FAMILIES:  # another family's vocab.txt is still read as WordPiece
        return None
    found = family(model_type)
    tok = found.load_tokenizer(path)
    if not isinstance(tok, TokenizerBase):
        return None
    if overrides:
        raise BertlabError(f"{path}: --cased/--uncased are WordPiece settings; {found.name}'s tokenizer keeps case")
    return tok


def run(args: argparse.Namespace) -> int:
    from ..tokenizer import BertTokenizer

    overrides = {}
    if args.cased or args.uncased:
        overrides["do_lower_case"] = bool(args.uncased)
    tok = family_tokenizer(Path(args.vocab), overrides) or BertTokenizer.from_pretrained(args.vocab, **overrides)
    out = sys.stdout
    for line in texts_to_tokenize(args.texts, args.inputs):
        enc = tok(line, add_special_tokens=args.special, max_length=args.max_seq_length,
                  truncation=args.max_seq_length is not None, return_offsets_mapping=True,
                  return_token_type_ids=False, return_attention_mask=False)
        ids = enc["input_ids"]
        if args.format == "ids":
            out.write(" ".join(map(str, ids)) + "\n")
        elif args.format == "tokens":
            out.write(" ".join(tok.convert_ids_to_tokens(ids)) + "\n")
        else:
            out.write(json.dumps({"tokens": tok.convert_ids_to_tokens(ids), "ids": ids,
                                  "offsets": enc["offset_mapping"], "word_ids": enc.word_ids()},
                                 ensure_ascii=False) + "\n")
    out.flush()
    return 0
