"""What jieba whole-word masking changes on the shipped Chinese corpus, against character masking.

    .venv/bin/python benchmarks/bench_zh_wwm.py [--copies 20] [--max-seq-length 64] [--json out.json]

A vocabulary is trained on tests/data/zh (`bertlab vocab train`'s code), the corpus is prepared once with
`--segmenter jieba` (segment pairs, dynamic masking), and the same instances are then masked `--copies`
times per variant with the same generators:

- ``token``: Google's token masking;
- ``whole-word (## only)``: Google's whole-word masking without a segmenter -- for Chinese every character
  is its own word, so this is character masking;
- ``whole-word + jieba``: the segmenter's words grouped (`prepare --segmenter jieba`).

Words are jieba's throughout (the stored word flags). Columns: the share of all tokens masked (15% is the
target); the share of masked CJK characters that lie in a multi-character word; of the multi-character words
with at least one masked character, the share masked entirely; the mean length of a run of adjacent masked
tokens. Needs jieba (`pip install 'bertlab-paper[zh]'`).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZH = ROOT / "tests" / "data" / "zh"


def measure(store, variant: str, copies: int, max_seq_length: int) -> dict:
    from bertlab.data.instances import instance_word_continues
    from bertlab.data.masking import MaskingConfig, join_words, mask_tokens
    from bertlab.tokenizer import read_vocab
    from bertlab.tokenizer.basic import is_cjk

    tokens = read_vocab(store.info.vocab_file)
    cjk = [len(t) == 1 and is_cjk(ord(t)) for t in tokens]
    config = MaskingConfig.for_length(max_seq_length, granularity="token" if variant == "token" else "whole-word")
    total = masked = masked_cjk = masked_cjk_multi = touched = whole = runs = run_tokens = 0
    for i in range(len(store)):
        ex = store.example(i)
        ids = ex["input_ids"].tolist()
        flags = instance_word_continues(store.instance(i), store.corpus)
        words = [w for w in join_words(ids, flags, store.vocab.special_ids) if all(cjk[ids[p]] for p in w)]
        in_multi = {p for w in words if len(w) > 1 for p in w}
        for copy in range(copies):
            rng = random.Random(f"{i}:{copy}")
            m = mask_tokens(ids, config, store.vocab, rng, flags if variant == "whole-word + jieba" else None)
            pos = set(m.positions)
            total += len(ids)
            masked += len(pos)
            masked_cjk += sum(cjk[ids[p]] for p in pos)
            masked_cjk_multi += len(pos & in_multi)
            for w in words:
                if len(w) > 1:
                    hit = sum(p in pos for p in w)
                    touched += hit > 0
                    whole += hit == len(w)
            prev = -2
            for p in sorted(pos):
                runs += p != prev + 1
                run_tokens += 1
                prev = p
    return {"variant": variant, "masked_share": masked / total,
            "masked_cjk_in_multichar_words": masked_cjk_multi / max(masked_cjk, 1),
            "multichar_words_masked_whole": whole / max(touched, 1),
            "mean_masked_run": run_tokens / max(runs, 1), "masked_tokens": masked}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, default=20, help="masks drawn per instance and variant")
    ap.add_argument("--max-seq-length", type=int, default=64)
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    try:
        import jieba  # noqa: F401
    except ImportError:
        print("needs jieba: pip install 'bertlab-paper[zh]'", file=sys.stderr)
        return 2
    from bertlab.data.instances import InstanceConfig
    from bertlab.data.masking import MaskingConfig
    from bertlab.data.pipeline import CorpusSettings, InstanceSettings, prepare
    from bertlab.data.shards import InstanceStore
    from bertlab.tokenizer.train import train_vocab, write_vocab

    with tempfile.TemporaryDirectory() as tmp:
        texts = [ZH / "corpus.txt", ZH / "sentiment" / "train.tsv", ZH / "sentiment" / "dev.tsv"]
        vocab = write_vocab(train_vocab(texts, 1500)[0], Path(tmp) / "vocab.txt")
        settings = InstanceSettings(InstanceConfig("segment-pair", args.max_seq_length),
                                    MaskingConfig.for_length(args.max_seq_length, granularity="whole-word"), dynamic=True)
        prepare([ZH / "corpus.txt"], vocab, Path(tmp) / "data", CorpusSettings(heldout_fraction=0.0,
                segmenter="jieba"), settings, workers=1, progress=False, echo=lambda s: None)
        store = InstanceStore(Path(tmp) / "data")
        rows = [measure(store, v, args.copies, args.max_seq_length)
                for v in ("token", "whole-word (## only)", "whole-word + jieba")]
    print(f"{len(store)} instances of {args.max_seq_length} tokens from tests/data/zh/corpus.txt, {args.copies} masks each\n")
    print(f"| {'variant':<22} | masked / tokens | masked CJK chars in multi-char words | multi-char words "
          "masked whole | mean masked run |")
    print(f"|{'-' * 24}|----------------:|-------------------------------------:|"
          "----------------------------:|----------------:|")
    for r in rows:
        print(f"| {r['variant']:<22} | {r['masked_share']:15.1%} | {r['masked_cjk_in_multichar_words']:36.1%} | "
              f"{r['multichar_words_masked_whole']:28.1%} | {r['mean_masked_run']:15.2f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
