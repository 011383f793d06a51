"""WordPiece vocabulary learning: ours (`bertlab vocab train`) against Hugging Face `tokenizers`.

Trains a vocabulary of the same size with each learner on the same text (by default WikiText-2 train excerpt
+ valid) and reports, on held-out text (wiki.test.raw):

* tokens per word -- word pieces per basic-tokenizer word (lower is better: shorter sequences), and
* the [UNK] rate -- per word (the share of words that become [UNK]; WordPiece maps a whole word to [UNK]
  when one of its characters is missing) and per token,

plus each learner's training time (wall and CPU; ours is pure Python, Hugging Face's is Rust and may use
several threads). Each vocabulary is applied with its own library's encoder: ours with
`bertlab.BertTokenizer`, Hugging Face's with the trained `tokenizers.Tokenizer`; the denominators (words) come
from our `BasicTokenizer` for both, which splits text exactly like `BertPreTokenizer` + `BertNormalizer`.

Learners compared, all at exactly `--sizes` tokens in total (special and [unused] tokens included):

* `ours`: `bertlab.tokenizer.train.train_vocab` with its defaults (likelihood-gain merges, pairs seen at least
  5 times first, 1.5x over-generation pruned by encoder usage, 99 [unused] slots so [UNK] = 100 as in Google's
  files: those 99 slots are 99 fewer pieces than the Hugging Face vocabularies have);
* `hf-trainer`: `models.WordPiece` + `trainers.WordPieceTrainer` (defaults: min_frequency 0, no alphabet limit)
  with `BertNormalizer` + `BertPreTokenizer`;
* `hf-bert-wordpiece`: `BertWordPieceTokenizer().train(...)` with its defaults (min_frequency 2, limit_alphabet
  1000);
* with `--ablations`: ours with the count(ab)/(count(a)count(b)) criterion, without pruning (`--overgenerate 1`),
  and with every pair seen twice on an equal footing (`--min-pair-frequency 2`).

    .venv/bin/python benchmarks/bench_vocab.py                      # 4000, 8000, 16000 tokens
    .venv/bin/python benchmarks/bench_vocab.py --sizes 8000 --ablations --json results.json
    .venv/bin/python benchmarks/bench_vocab.py --train wiki.train.raw.first1018lines wiki.test.raw --test wiki.valid.raw
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("BERTLAB_SHARED_DATA", ROOT.parent / "shared" / "data")) / "wikitext-2"
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def train_ours(files: list[Path], size: int, lowercase: bool, **overrides):
    from bertlab.tokenizer.train import train_vocab

    vocab, _ = train_vocab(files, size, lowercase=lowercase, **overrides)
    return vocab


def train_hf_trainer(files: list[Path], size: int, lowercase: bool):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train([str(f) for f in files], trainers.WordPieceTrainer(vocab_size=size, special_tokens=SPECIALS,
                                                                 show_progress=False))
    return tok


def train_hf_bert_wordpiece(files: list[Path], size: int, lowercase: bool):
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(lowercase=lowercase)
    tok.train([str(f) for f in files], vocab_size=size, show_progress=False)
    return tok


def evaluate(encode, unk_id: int, lines: list[str], words_per_line: list[int]) -> dict:
    tokens = unk = 0
    for line in lines:
        ids = encode(line)
        tokens += len(ids)
        unk += sum(1 for i in ids if i == unk_id)
    words = sum(words_per_line)
    return {"tokens_per_word": tokens / words, "unk_per_word": unk / words, "unk_per_token": unk / tokens,
            "tokens": tokens, "words": words, "unk": unk}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", nargs="+", default=["wiki.train.raw.first1018lines", "wiki.valid.raw"],
                    help="training files (names under shared/data/wikitext-2, or paths)")
    ap.add_argument("--test", default="wiki.test.raw", help="held-out file")
    ap.add_argument("--sizes", default="4000,8000,16000", help="comma-separated vocabulary sizes")
    ap.add_argument("--cased", action="store_true")
    ap.add_argument("--ablations", action="store_true", help="also ours with other settings")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)

    def resolve(name: str) -> Path:
        p = Path(name)
        return p if p.exists() else DATA / name

    files = [resolve(n) for n in args.train]
    test = resolve(args.test)
    missing = [str(p) for p in files + [test] if not p.exists()]
    if missing:
        print(f"bench_vocab: data not found: {', '.join(missing)}", file=sys.stderr)
        return 2
    lowercase = not args.cased

    import logging

    import tokenizers

    from bertlab.tokenizer import BasicTokenizer, BertTokenizer
    from bertlab.tokenizer.train import write_vocab

    logging.basicConfig(level=logging.WARNING)
    basic = BasicTokenizer(do_lower_case=lowercase)
    lines = [line for line in test.read_text(encoding="utf-8").splitlines() if line.strip()]
    words_per_line = [len(basic.tokenize(line)) for line in lines]
    print(f"train: {', '.join(p.name for p in files)} ({sum(p.stat().st_size for p in files) / 1e6:.2f} MB); "
          f"held out: {test.name} ({sum(words_per_line):,} words); {'cased' if args.cased else 'uncased'}; "
          f"tokenizers {tokenizers.__version__}")

    learners = [("ours", lambda s: train_ours(files, s, lowercase))]
    if args.ablations:
        learners += [
            ("ours, pmi score", lambda s: train_ours(files, s, lowercase, score="pmi")),
            ("ours, no pruning", lambda s: train_ours(files, s, lowercase, overgenerate=1.0)),
            ("ours, min pair 2", lambda s: train_ours(files, s, lowercase, min_pair_frequency=2)),
        ]
    learners += [("hf-trainer", lambda s: train_hf_trainer(files, s, lowercase)),
                 ("hf-bert-wordpiece", lambda s: train_hf_bert_wordpiece(files, s, lowercase))]

    results = []
    header = (f"| {'size':>6} | {'learner':<18} | {'tokens/word':>11} | {'UNK/word %':>10} | {'UNK/token %':>11} | "
              f"{'train wall s':>12} | {'train CPU s':>11} |")
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    with tempfile.TemporaryDirectory() as tmp:
        for size in [int(s) for s in args.sizes.split(",")]:
            for name, train in learners:
                model, wall, cpu = timed(lambda: train(size))
                if isinstance(model, list):  # ours: a vocabulary, applied by our BertTokenizer
                    path = write_vocab(model, Path(tmp) / f"{size}.txt")
                    tok = BertTokenizer(path, do_lower_case=lowercase)
                    n_tokens = len(model)
                    res = evaluate(lambda t: tok.encode(t, add_special_tokens=False), tok.unk_token_id, lines,
                                   words_per_line)
                else:  # Hugging Face: a trained tokenizers.Tokenizer (or its BertWordPieceTokenizer wrapper)
                    n_tokens = model.get_vocab_size()
                    res = evaluate(lambda t: model.encode(t, add_special_tokens=False).ids,
                                   model.token_to_id("[UNK]"), lines, words_per_line)
                res.update(size=size, learner=name, vocab_tokens=n_tokens, train_wall_s=wall, train_cpu_s=cpu)
                results.append(res)
                print(f"| {size:>6} | {name:<18} | {res['tokens_per_word']:>11.4f} | "
                      f"{100 * res['unk_per_word']:>10.4f} | {100 * res['unk_per_token']:>11.4f} | {wall:>12.1f} | "
                      f"{cpu:>11.1f} |" + ("" if n_tokens == size else f" ({n_tokens} tokens)"), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
