"""`bertlab tokenize --vocab DIR_OR_VOCAB [FILE ...]`: show how text is cut into word pieces.

Reads each input line (from the files, or stdin) and prints one output line per input line: the pieces
separated by spaces (default), their ids, or a JSON object with tokens, ids, offsets and word ids.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="*", help="UTF-8 text files, one text per line (default: stdin)")
    p.add_argument("--vocab", required=True,
                   help="a vocab.txt, or a tokenizer folder (vocab.txt + tokenizer_config.json)")
    case = p.add_mutually_exclusive_group()
    case.add_argument("--cased", action="store_true", help="keep case and accents (cased models)")
    case.add_argument("--uncased", action="store_true", help="lowercase and strip accents (uncased models)")
    p.add_argument("--format", choices=["tokens", "ids", "json"], default="tokens")
    p.add_argument("--special", action="store_true", help="add [CLS] and [SEP]")
    p.add_argument("--max-length", type=int, default=None, help="truncate to this many tokens")


def _lines(files: list[str]) -> Iterator[str]:
    from ..errors import BertlabError

    if not files:
        for line in sys.stdin:
            yield line.rstrip("\n")
        return
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                for line in fh:
                    yield line.rstrip("\n")
        except OSError as e:
            raise BertlabError(f"{f}: cannot read ({e.strerror or e})") from None
        except UnicodeDecodeError:
            raise BertlabError(f"{f}: not valid UTF-8 text") from None


def run(args: argparse.Namespace) -> int:
    from ..tokenizer import BertTokenizer

    overrides = {}
    if args.cased or args.uncased:
        overrides["do_lower_case"] = bool(args.uncased)
    tok = BertTokenizer.from_pretrained(args.vocab, **overrides)
    out = sys.stdout
    for line in _lines(args.files):
        enc = tok(line, add_special_tokens=args.special, max_length=args.max_length,
                  truncation=args.max_length is not None, return_offsets_mapping=True,
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
