"""T5's comparison of pre-training objectives (Raffel et al., 2020, Table 4) at a small scale, in one run.

    python benchmarks/bench_objectives.py [--budget-tokens N] [--train-limit N] [--eval-limit N] [--seeds S]
        [--threads T] [--work DIR] [--json results.json] [--no-baselines]

What it does, end to end on one machine:
  1. a WordPiece vocabulary (8,000 tokens) learnt from WikiText-2 (`../shared/data/wikitext-2`: the 1,018-line
     train excerpt, valid and test, ~530k words), and that text prepared twice from the same tokenization:
     packed 128-token sequences for BERT's MLM, and 128-token-input examples for each T5 objective
     (`bertlab prepare --objective NAME`; the T5 vocabulary is the same WordPiece one + 100 sentinels);
  2. five pre-trainings of models of the same size (~2M parameters, most of them the shared 8k x 128
     embedding): BERT-style MLM on our BERT (4 layers, hidden 128, 2 heads, FFN 512; `bertlab pretrain
     --objective mlm`: AdamW 1e-3, 1% warmup, linear decay), and T5 encoder-decoders (2 + 2 blocks, d_model
     128, 2 heads, d_ff 512; `t5-tiny`) with span corruption, i.i.d. denoising, prefix LM and deshuffling
     (Adafactor on T5's schedule: 0.01 constant, as T5's first 10^4 steps are) -- each for the same number of
     tokens processed (`--budget-tokens`: inputs, plus targets for T5; steps = budget / the measured tokens of
     a batch of 32), the same seed;
  3. each pre-trained model fine-tuned on seeded subsets of SST-2 and MRPC (`--train-limit` training examples,
     `--eval-limit` dev examples) for 3 epochs, batch 32, `--seeds` seeds: BERT with one added layer (`bertlab
     finetune`: AdamW 1e-3, 10% warmup, linear decay), T5 text-to-text (`bertlab finetune t2t`: Adafactor at a
     constant 1e-2), greedy decoding scored by the same metric code, invalid outputs counted; plus the same
     architectures without pre-training (random initialisation) as baselines, as T5's tables have. The two
     learning rates are the recipes' shapes (BERT's AdamW schedule, T5's constant Adafactor) at rates a tiny
     model needs in ~75 steps, picked once on the randomly initialised models (SST-2): BERT at 1e-4 and 5e-4
     and T5 at 1e-3 predicted one class throughout, BERT at 1e-3 reached 62% and T5 at 1e-2 67%;
  4. the table: SST-2 accuracy, MRPC F1 and accuracy (dev, mean ± sd over seeds), and for T5 the share of
     outputs that were no label.
The corpus, vocabulary, BERT encoder and its fine-tuning are `objective_study.py`'s, which the encoder
objectives' table (`bench_encoder_objectives.py`: MLM, MLM+NSP, RTD at equal compute) uses too.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from objective_study import (BATCH, GLUE, SEQ, SHARED, add_finetuning_arguments, batch_shapes,  # noqa: E402
                             bert_config, check_shared_data, corpus, finetune_encoder, fmt, learn_vocabulary,
                             load_line, params, prepare_encoder_data, pretrain_settings, run_cli, say,
                             vocabulary_size)
from bertlab.models.t5 import T5ForConditionalGeneration, preset  # noqa: E402
from bertlab.train import finetune as ft  # noqa: E402
from bertlab.train import text_to_text as t2t  # noqa: E402
from bertlab.train.pretrain import PretrainConfig, run_pretraining  # noqa: E402
from bertlab.checkpoint.pretrained import save_model_folder  # noqa: E402
from bertlab.train.t5_pretrain import T5PretrainConfig, run_t5_pretraining  # noqa: E402

T5_OBJECTIVES = ("span-corruption", "iid-denoising", "prefix-lm", "deshuffle")
ROWS = {"bert-mlm": "BERT-style MLM (BERT encoder)", "span-corruption": "span corruption (T5)",
        "iid-denoising": "i.i.d. denoising (T5)", "prefix-lm": "prefix LM (T5)", "deshuffle": "deshuffling (T5)",
        "bert-none": "no pre-training (BERT encoder)", "t5-none": "no pre-training (T5)"}


# ---------------------------------------------------------------------------------------------- data
def prepare_data(work: Path) -> tuple[Path, Path, Path]:
    vocab = learn_vocabulary(work)
    bert = prepare_encoder_data(work, vocab, "data-bert", "full-sentences")
    t5 = work / "data-t5"
    if not (t5 / "manifest.json").is_file():
        run_cli("prepare", *corpus(), "--vocab", vocab, "--out", t5, "--objective", T5_OBJECTIVES[0],
                "--max-seq-length", SEQ, "--heldout-fraction", 0.02, "--workers", 1, "--quiet")
        for objective in T5_OBJECTIVES[1:]:
            run_cli("prepare", "--out", t5, "--objective", objective, "--max-seq-length", SEQ, "--quiet")
    return vocab, bert, t5


def t5_tokens_per_batch(data: Path, objective: str) -> float:
    from bertlab.data.t5_loader import batch_at
    from bertlab.train.t5_pretrain import count_text_to_text_tokens, select_data

    iset = select_data(str(data), objective).instance_set
    return sum(count_text_to_text_tokens(batch_at(data, s, BATCH, seed=0, instance_set=iset)) for s in range(10)) / 10


# ---------------------------------------------------------------------------------------------- models
def t5_tokenizer(vocab: Path):
    from bertlab.models.t5.tokenizer import load_text_to_text_tokenizer

    return load_text_to_text_tokenizer(vocab)


def t5_config(tokenizer):
    return preset("t5-tiny", vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id,
                  eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id)


def pretrain_all(work: Path, vocab: Path, bert_data: Path, t5_data: Path, budget: int, baselines: bool) -> dict:
    """Every pre-trained (and baseline) model folder, with what its pre-training did."""
    from bertlab import BertForMaskedLM
    from bertlab.train.pretrain import export_final

    models: dict[str, dict] = {}
    config_file = work / "bert_config.json"
    tokenizer = t5_tokenizer(vocab)
    bert_cfg = bert_config(vocabulary_size(vocab))
    config_file.write_text(bert_cfg.to_json_string())
    per_batch = {"bert-mlm": batch_shapes(bert_data)["tokens"]}
    per_batch.update({o: t5_tokens_per_batch(t5_data, o) for o in T5_OBJECTIVES})
    for name, tokens in per_batch.items():
        steps = max(1, math.ceil(budget / tokens))
        out = work / "pretrain" / name
        final = out / "final"
        record = {"tokens_per_batch": round(tokens, 1), "steps": steps}
        if (work / "pretrain" / f"{name}.json").is_file():  # done in an earlier (interrupted) run of this script
            models[name] = json.loads((work / "pretrain" / f"{name}.json").read_text())
            continue
        say(f"pre-training {name}: {steps} steps x {BATCH} ({tokens:.0f} tokens a batch)")
        t0 = time.perf_counter()
        if name == "bert-mlm":
            result = run_pretraining(PretrainConfig(
                model=str(config_file), data=str(bert_data), out=str(out), objective="mlm", steps=steps,
                **pretrain_settings()), echo=lambda s: None)
        else:
            result = run_t5_pretraining(T5PretrainConfig(
                model="t5-tiny", data=str(t5_data), out=str(out), objective=name, steps=steps, batch_size=BATCH,
                precision="fp32", eval_batches=4, eval_batch_size=64, num_evals=2, num_workers=0, progress=False),
                echo=lambda s: None)
        record.update(dir=str(final), seconds=round(time.perf_counter() - t0, 1), tokens=result.train.tokens,
                      heldout_before=result.eval_before, heldout_after=result.eval_after)
        say(f"  {name}: {result.train.tokens:,} tokens in {record['seconds']:.0f} s; held-out "
            + ", ".join(f"{k} {v:.3f}" for k, v in result.eval_after.items()))
        (work / "pretrain" / f"{name}.json").write_text(json.dumps(record, indent=2))
        models[name] = record
    if baselines:  # the same architectures, randomly initialised (seed 0), saved as the pre-trainings are
        torch.manual_seed(0)
        bert_final = work / "pretrain" / "bert-none" / "final"
        if not bert_final.is_dir():
            from bertlab.data import DataInfo

            export_final(BertForMaskedLM(bert_cfg), bert_final, DataInfo.load(bert_data, max_seq_length=SEQ))
        torch.manual_seed(0)
        t5_final = work / "pretrain" / "t5-none" / "final"
        if not t5_final.is_dir():
            save_model_folder(T5ForConditionalGeneration(t5_config(tokenizer)), t5_final, tokenizer)
        models["bert-none"] = {"dir": str(bert_final), "steps": 0, "tokens": 0, "seconds": 0}
        models["t5-none"] = {"dir": str(t5_final), "steps": 0, "tokens": 0, "seconds": 0}
    models["_params"] = {"bert": params(BertForMaskedLM(bert_cfg)),
                         "t5": params(T5ForConditionalGeneration(t5_config(tokenizer)))}
    return models


# ---------------------------------------------------------------------------------------------- fine-tuning
def finetune_t5(model_dir: str, task: str, out: Path, train_limit: int, eval_limit: int | None,
                seeds: int) -> dict:
    cfg = t2t.TextToTextConfig(model=model_dir, data=str(SHARED / "glue"), out=str(out), epochs=3, lr=1e-2,
                               batch_size=BATCH, max_seq_length=SEQ, seed=0, seeds=seeds, train_limit=train_limit,
                               eval_limit=eval_limit, progress=False, multi=ft.MultiTaskOptions(tasks=task))
    dev = t2t.finetune_text_to_text(cfg)["dev"][task]
    return {k: v for k, v in dev.items() if k in ("accuracy", "f1", "invalid_outputs", "total")}


def table(models: dict, results: dict) -> str:
    lines = ["| objective | pre-training tokens (steps) | SST-2 acc | MRPC F1 | MRPC acc | T5 outputs no label |",
             "|---|---|---|---|---|---|"]
    for name in ROWS:
        if name not in results:
            continue
        r, m = results[name], models[name]
        invalid = "–"
        if "invalid_outputs" in r["sst2"]:
            bad = r["sst2"]["invalid_outputs"]["mean"] + r["mrpc"]["invalid_outputs"]["mean"]
            total = r["sst2"]["total"]["mean"] + r["mrpc"]["total"]["mean"]
            invalid = f"{100 * bad / total:.1f}%"
        tokens = f"{m['tokens'] / 1e6:.2f}M ({m['steps']})" if m["steps"] else "0"
        lines.append(f"| {ROWS[name]} | {tokens} | {fmt(r['sst2'].get('accuracy'))} | {fmt(r['mrpc'].get('f1'))} | "
                     f"{fmt(r['mrpc'].get('accuracy'))} | {invalid} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget-tokens", type=int, default=250_000, help="tokens processed per pre-training")
    add_finetuning_arguments(p)
    p.add_argument("--work", type=Path, default=None, help="keep the data and models here (default: a temp dir)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--no-baselines", action="store_true", help="skip the models without pre-training")
    args = p.parse_args()
    check_shared_data()
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        say(load_line(args.threads))
        vocab, bert_data, t5_data = prepare_data(work)
        models = pretrain_all(work, vocab, bert_data, t5_data, args.budget_tokens, not args.no_baselines)
        results: dict[str, dict] = {}
        for name in ROWS:
            if name not in models:
                continue
            is_bert = name.startswith("bert")
            results[name] = {}
            for task in GLUE:
                t0 = time.perf_counter()
                run = finetune_encoder if is_bert else finetune_t5
                results[name][task] = run(models[name]["dir"], task, work / "finetune" / name / task,
                                          args.train_limit, args.eval_limit, args.seeds)
                say(f"fine-tuned {name} on {task} ({args.seeds} seeds, {time.perf_counter() - t0:.0f} s): "
                    + ", ".join(f"{k} {v['mean']:.3f}" for k, v in results[name][task].items()))
        say(f"{load_line(args.threads)}; total {(time.perf_counter() - started) / 60:.1f} min")
        print()
        print(f"Pre-training: WikiText-2, {args.budget_tokens:,} tokens each (batch {BATCH}, inputs <= {SEQ}); "
              f"BERT {models['_params']['bert'] / 1e6:.2f}M parameters, T5 {models['_params']['t5'] / 1e6:.2f}M. "
              f"Fine-tuning: {args.train_limit} training and {args.eval_limit} dev examples per task, 3 epochs, "
              f"{args.seeds} seeds (mean ± sd).")
        print()
        print(table(models, results))
        if args.json:
            args.json.write_text(json.dumps({"models": models, "results": results, "args": {
                k: str(v) for k, v in vars(args).items()}}, indent=2))


if __name__ == "__main__":
    main()
