"""`bertlab vocab train CORPUS... --vocab-size N [--cased] --out vocab.txt`: learn a WordPiece vocabulary.

The corpus is read line by line (any UTF-8 text; one sentence or paragraph per line is typical) through the
same basic tokenizer `BertTokenizer` uses, and the learned `vocab.txt` has Google's layout, so it loads in
`bertlab.BertTokenizer` and Hugging Face's `BertTokenizer(Fast)` alike. See `bertlab.tokenizer.train`.

`--kind bpe` learns RoBERTa's kind: byte-level BPE merges (`bertlab.tokenizer.bpe_train`), written as a folder
with vocab.json, merges.txt and tokenizer_config.json that `bertlab.tokenizer.RobertaTokenizer` and Hugging
Face's RobertaTokenizer(Fast) load; `--vocab-size` counts the 5 special tokens and 256 bytes too.

`--kind sentencepiece` learns T5's kind instead: a SentencePiece unigram model with T5's settings
(`bertlab.tokenizer.sentencepiece.train_sentencepiece`), written as `spiece.model` or as a Hugging Face T5
tokenizer folder; `--vocab-size` counts its pieces, and T5's 100 sentinels come on top.
"""

from __future__ import annotations

import argparse
import logging
import time

from ..core.errors import BertlabError

log = logging.getLogger("bertlab.vocab")


def _at_least(minimum: float, kind: type = int):
    """An argparse `type`: `kind(text)`, refused with a usage error below `minimum`."""
    noun = "a whole number" if kind is int else "a number"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {noun}, got {text!r}") from None
        if not value >= minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum:g}, got {text}")
        return value

    return parse


_positive_int, _nonnegative_int, _factor = _at_least(1), _at_least(0), _at_least(1, float)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..tokenizer.train import DECODE_ERROR_POLICIES, SCORES, TrainDefaults

    d = TrainDefaults()
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    t = actions.add_parser(
        "train", help="learn a vocabulary from text files (WordPiece; --kind bpe, sentencepiece)",
        description="Learn a WordPiece vocabulary (likelihood-based merges, Schuster & Nakajima 2012) from "
                    "UTF-8 text files and write it in Google's vocab.txt layout: [PAD], [unused0..98], [UNK], "
                    "[CLS], [SEP], [MASK], further [unused], characters, ##characters, learned pieces. "
                    "--kind bpe learns RoBERTa's byte-level BPE, --kind sentencepiece T5's unigram model.",
        allow_abbrev=False)  # as every command (cli/__init__.py): a flag's prefix is an error, not that flag
    t.add_argument("corpus", nargs="+", metavar="CORPUS", help="UTF-8 text files, read line by line")
    t.add_argument("--kind", choices=KINDS, default="wordpiece",
                   help="wordpiece (BERT's vocab.txt, default), bpe (RoBERTa's byte-level BPE: a folder with "
                        "vocab.json + merges.txt) or sentencepiece (T5's spiece.model: unigram, <pad> 0, </s> 1, "
                        "<unk> 2, no byte fallback)")
    t.add_argument("--vocab-size", type=_positive_int, required=True,
                   help="tokens in the vocabulary, all included (sentencepiece: pieces; the 100 sentinels "
                        "come on top, as T5's 32000 + 100)")
    t.add_argument("--out", required=True,
                   help="where to write vocab.txt (bpe: a folder for vocab.json + merges.txt + "
                        "tokenizer_config.json; sentencepiece: a .model file, or a folder for spiece.model "
                        "+ tokenizer_config.json + special_tokens_map.json)")
    t.add_argument("--cased", action="store_true",
                   help="keep case and accents (the cased models' setting); default: lowercase and strip accents")
    t.add_argument("--num-unused", type=_nonnegative_int, default=d.num_unused,
                   help=f"[unused] slots (default {d.num_unused}: [UNK]/[CLS]/[SEP]/[MASK] keep Google's ids "
                        "100-103; more go after [MASK])")
    t.add_argument("--min-char-frequency", type=_positive_int, default=d.min_char_frequency,
                   help=f"characters seen fewer times are left out and encode to [UNK] "
                        f"(default {d.min_char_frequency}: every character seen)")
    t.add_argument("--min-pair-frequency", type=_positive_int, default=d.min_pair_frequency,
                   help="merge pairs seen fewer times only once no other pair is left "
                        f"(default {d.min_pair_frequency}; pairs seen once are never merged; bpe: pairs seen "
                        "fewer times are never merged)")
    t.add_argument("--overgenerate", type=_factor, default=d.overgenerate,
                   help=f"learn this many times the pieces that fit, then drop those the encoder uses least "
                        f"(default {d.overgenerate}; 1 disables)")
    t.add_argument("--score", choices=SCORES, default=d.score,
                   help="merge criterion: likelihood gain (default) or count(ab)/(count(a)*count(b))")
    t.add_argument("--on-decode-error", choices=DECODE_ERROR_POLICIES, default=d.on_decode_error,
                   help="lines that are not valid UTF-8: skip them, replace bad bytes, or stop with an error "
                        "(each is reported with file and line; default %(default)s)")
    t.add_argument("--max-words", type=_positive_int, default=d.max_words,
                   help="cap on distinct words held while counting; above it rare words are pruned. Memory "
                        "is roughly 1.5 KB per distinct word while learning (default %(default)s)")
    t.add_argument("--no-progress", action="store_true", help="no progress bars")
    s = t.add_argument_group("sentencepiece")
    s.add_argument("--threads", type=_positive_int, default=8,
                   help="trainer threads (default 8). The model is a function of the corpus, the settings and "
                        "this number, not of the machine's cores: keep it to reproduce a model byte for byte")
    s.add_argument("--character-coverage", type=float, default=0.9995,
                   help="share of the corpus's characters the pieces must cover (default 0.9995)")
    s.add_argument("--seed", type=int, default=0, help="the trainer's random seed (default 0)")


KINDS = ("wordpiece", "bpe", "sentencepiece")


def run(args: argparse.Namespace) -> int:
    from ..tokenizer.train import check_output, train_vocab, write_vocab

    if args.action != "train":  # argparse allows only the actions above; kept for clarity
        raise SystemExit(f"unknown action {args.action}")
    # the output first: learning takes minutes on a real corpus (sentencepiece: a .model file, or a folder)
    check_output(args.out, folder=args.kind == "bpe" or (args.kind == "sentencepiece"
                                                          and not str(args.out).endswith(".model")))
    if args.kind == "sentencepiece":
        return _train_sentencepiece(args)
    if args.kind == "bpe":
        return _train_bpe(args)
    start = time.perf_counter()
    vocab, counts = train_vocab(
        args.corpus, args.vocab_size, lowercase=not args.cased, num_unused=args.num_unused,
        min_char_frequency=args.min_char_frequency, min_pair_frequency=args.min_pair_frequency,
        score=args.score, overgenerate=args.overgenerate, on_decode_error=args.on_decode_error,
        max_words=args.max_words, progress=False if args.no_progress else None)
    path = write_vocab(vocab, args.out)
    chars = sum(1 for t in vocab if len(t) == 1 or (len(t) == 3 and t.startswith("##")))
    print(f"wrote {path}: {len(vocab)} tokens ({chars} characters) from {counts.tokens:,} words "
          f"({len(counts.words):,} distinct) in {counts.lines:,} lines, {time.perf_counter() - start:.1f}s"
          + (f"; {counts.bad_lines} line(s) not UTF-8" if counts.bad_lines else ""))
    return 0


def _train_sentencepiece(args: argparse.Namespace) -> int:
    from ..models.registry import vocabulary_trainer

    train = vocabulary_trainer("sentencepiece")  # a family's settings (T5's)
    if train is None:
        raise BertlabError("no model family trains SentencePiece vocabularies")
    start = time.perf_counter()
    log.info("training a SentencePiece unigram model of %d pieces (T5's settings, %d threads)", args.vocab_size,
             args.threads)
    path, report, tok = train(args.corpus, args.out, vocab_size=args.vocab_size,
                              character_coverage=args.character_coverage, threads=args.threads, seed=args.seed,
                              on_decode_error=args.on_decode_error, progress=not args.no_progress,
                              verbose=log.isEnabledFor(logging.DEBUG))
    print(f"wrote {path}: {tok.base_size} pieces + {tok.num_sentinels} sentinels = {tok.vocab_size} ids, from "
          f"{report.lines:,} lines ({report.chars:,} characters), {time.perf_counter() - start:.1f}s"
          + (f"; {report.bad_lines} line(s) not UTF-8" if report.bad_lines else ""))
    return 0


def _train_bpe(args: argparse.Namespace) -> int:
    from ..tokenizer.bpe_train import train_bpe, write_bpe_folder

    start = time.perf_counter()
    tokens, merges, counts = train_bpe(args.corpus, args.vocab_size, min_frequency=args.min_pair_frequency,
                                       on_decode_error=args.on_decode_error, max_words=args.max_words,
                                       progress=False if args.no_progress else None)
    path = write_bpe_folder(tokens, merges, args.out)
    print(f"wrote {path}: {len(tokens)} tokens ({len(merges)} merges) from {counts.tokens:,} pre-tokens "
          f"({len(counts.words):,} distinct) in {counts.lines:,} lines, {time.perf_counter() - start:.1f}s"
          + (f"; {counts.bad_lines} line(s) not UTF-8" if counts.bad_lines else ""))
    return 0
