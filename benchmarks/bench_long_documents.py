"""Long documents: `--long-documents window` against truncation at the same batch size -- peak RSS and time.

    python benchmarks/bench_long_documents.py [--model DIR] [--batch-size 8] [--max-seq-length 128]
        [--max-steps 4] [--modes truncate,window] [--max-tokens N] [--threads N] [--json out.json]

Data: the WikiText-2 articles in `../shared/data/wikitext-2` (every ` = Title = ` article of the three files:
~150 documents, median ~2,500 words, the longest ~10,000-18,000), written as a user's CSV (`text,label`)
with a label by a simple rule (the article's first paragraph mentions a film, song, album, game or
series: "media", else "other"); every fifth article is dev. Model: all-MiniLM-L6-v2 or `--model`.

Each mode is one `bertlab finetune text-classification` process (the CLI's own code path, fp32, CPU) from
the CSV to dev scores; its peak RSS is the child's `ru_maxrss` (wait4) and its time the wall clock. The
batches are length-grouped, so the longest documents meet in one batch: the case that made window mode's
memory grow with the documents before its windows went through the model in parts (`--max-tokens`;
default: the batch's documents x the window length).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bertlab.cli.demo import installed_minilm  # noqa: E402

WIKITEXT = ROOT.parent / "shared" / "data" / "wikitext-2"
MEDIA = re.compile(r"\b(film|song|album|game|series|episode|single)\b", re.IGNORECASE)
TITLE = re.compile(r"^ = [^=].* = $")


def articles(folder: Path) -> list[tuple[str, str]]:
    """(title, text) of every article of the WikiText-2 files in `folder` (headings dropped, escapes undone)."""
    found: list[tuple[str, list[str]]] = []
    for f in sorted(folder.glob("wiki.*")):
        for line in f.open(encoding="utf-8"):
            if TITLE.match(line.rstrip("\n")):
                found.append((line.strip(" =\n"), []))
            elif found and line.strip() and not line.strip().startswith("= "):
                found[-1][1].append(line.strip().replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", "."))
    return [(title, " ".join(lines)) for title, lines in found if lines]


def write_set(folder: Path, out: Path) -> tuple[Path, Path, dict]:
    docs = articles(folder)
    rows = [{"text": text, "label": "media" if MEDIA.search(text.split(" . ")[0] + " " + title) else "other"}
            for title, text in docs]
    paths = []
    for name, part in (("train", [r for i, r in enumerate(rows) if i % 5]), ("dev", rows[::5])):
        path = out / f"{name}.csv"
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=["text", "label"])
            writer.writeheader()
            writer.writerows(part)
        paths.append(path)
    words = sorted(len(r["text"].split()) for r in rows)
    return paths[0], paths[1], {"documents": len(rows), "median_words": words[len(words) // 2],
                                "max_words": words[-1], "media": sum(r["label"] == "media" for r in rows)}


def run(mode: str, model: str, train: Path, dev: Path, out: Path, args) -> dict:
    cmd = [sys.executable, "-m", "bertlab", "--log-level", "WARNING", "finetune", "text-classification",
           "--model", model, "--train", str(train), "--validation", str(dev), "--out", str(out),
           "--batch-size", str(args.batch_size), "--max-seq-length", str(args.max_seq_length),
           "--max-steps", str(args.max_steps), "--eval-batch-size", str(args.batch_size),
           "--long-documents", mode, "--no-progress", "--overwrite"]
    if mode == "window" and args.max_tokens:
        cmd += ["--max-tokens", str(args.max_tokens)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": str(args.threads)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    err = proc.stderr.read()
    if status:
        raise SystemExit(f"{mode}: finetune failed:\n{err[-2000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    return {"mode": mode, "peak_rss_mb": round(usage.ru_maxrss / 1024), "seconds": round(seconds, 1),
            "dev_accuracy": round(metrics["best_run"]["dev"]["accuracy"], 3)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="default: all-MiniLM-L6-v2 (the installed package)")
    p.add_argument("--data", type=Path, default=WIKITEXT)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--max-steps", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--modes", default="truncate,window")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    if not args.data.is_dir():
        print(f"no WikiText-2 at {args.data}", file=sys.stderr)
        return 1
    model = args.model or str(installed_minilm())
    with tempfile.TemporaryDirectory() as tmp:
        train, dev, stats = write_set(args.data, Path(tmp))
        print(f"{stats['documents']} documents (median {stats['median_words']} words, longest "
              f"{stats['max_words']}; {stats['media']} media); batch {args.batch_size}, max-seq-length "
              f"{args.max_seq_length}, {args.max_steps} steps, {args.threads} threads")
        rows = [run(mode, model, train, dev, Path(tmp) / mode, args) for mode in args.modes.split(",")]
    print(f"{'mode':10} {'peak RSS':>10} {'seconds':>8} {'dev acc':>8}")
    for r in rows:
        print(f"{r['mode']:10} {r['peak_rss_mb']:>7} MB {r['seconds']:>8} {r['dev_accuracy']:>8}")
    if args.json:
        args.json.write_text(json.dumps({"data": stats, "settings": vars(args) | {"data": str(args.data),
                                                                                  "json": str(args.json)},
                                         "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
