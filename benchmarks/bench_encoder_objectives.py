"""Encoder pre-training objectives at equal compute, in one run: MLM vs MLM+NSP vs ELECTRA's replaced-token
detection (RTD), each model fine-tuned on SST-2 and MRPC over several seeds, beside randomly initialised ones.

    python benchmarks/bench_encoder_objectives.py [--budget-flops F] [--train-limit N] [--eval-limit N]
        [--seeds S] [--generator-fraction G] [--threads T] [--work DIR] [--json FILE] [--stop-after MINUTES]
        [--no-baselines]

What it does, end to end on one machine:
  1. the WordPiece vocabulary (8,000 tokens) learnt from WikiText-2 (`objective_study.py`, as T5's table in
     `bench_objectives.py` has it), and that text prepared twice from the same tokenization, dynamic masking
     (15%, 80/10/10), inputs of at most 128 tokens: packed full sentences for MLM and RTD, segment pairs with
     next-sentence labels for MLM+NSP (`bertlab prepare --mode full-sentences | segment-pair`);
  2. three pre-trainings of an encoder of the same size (4 layers, hidden 128, 2 heads, FFN 512; the
     discriminator's size for RTD) from the same seed, AdamW 1e-3, 1% warmup, linear decay, batch 32:
       mlm      BERT with masked LM alone (`--objective mlm`),
       mlm+nsp  BERT with masked LM + next-sentence prediction (`--objective mlm+nsp`),
       rtd      ELECTRA: a generator of `--generator-fraction` of the width (0.25: hidden 32, one head, FFN 128,
                as the paper's 1/4) trained with MLM beside the discriminator, shared embeddings, loss
                MLM + 50 x RTD (`--objective rtd`);
     each for the steps that spend the same number of training FLOPs (`--budget-flops`), since the ELECTRA
     paper compares objectives at equal compute and a shared machine's wall-clock is not a fair measure
     between runs (each run's wall-clock is reported beside it). One step's FLOPs are counted from the model's
     shapes (`step_flops`: 2 FLOPs a multiply-add, backward = 2 x forward) on the mean shape of the data's
     first batches, as bertlab computes them: the layers on the real tokens, attention on the padded
     rectangle, the MLM head on the masked positions only, NSP's pooler and classifier per sequence, and for
     RTD the generator's whole pass and the discriminator's per-token head as well (tests check the count
     against torch's FLOP counter);
  3. each pre-trained encoder fine-tuned on seeded subsets of SST-2 and MRPC (`--train-limit` training and
     `--eval-limit` dev examples; 3 epochs, batch 32, AdamW 1e-3, 10% warmup; `--seeds` seeds), and so are a
     randomly initialised BERT and ELECTRA of the same size (the two task heads differ: BERT's classifier
     reads the tanh pooler, ELECTRA's a GELU layer on the first token);
  4. the table: FLOPs a step, steps, FLOPs spent, wall-clock, SST-2 accuracy, MRPC F1 and accuracy (dev, mean
     ± sd over seeds). Every finished piece is kept in `--work` (a rerun with the same settings continues from
     it; `--stop-after 0` only prints what is there) and the table prints what finished, also after Ctrl-C or
     once `--stop-after` minutes have passed (no new pre-training or fine-tuning starts then).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from objective_study import (ENCODER_SIZES, GLUE, SEQ, add_finetuning_arguments, batch_shapes,  # noqa: E402
                             bert_config, cached, check_shared_data, finetune_encoder, fmt, learn_vocabulary,
                             load_line, params, prepare_encoder_data, pretrain_settings, say, vocabulary_size)

OBJECTIVES = {"mlm": "MLM (BERT)", "mlm+nsp": "MLM + NSP (BERT)", "rtd": "RTD (ELECTRA discriminator)"}
BASELINES = {"bert-none": "no pre-training (BERT)", "electra-none": "no pre-training (ELECTRA)"}
DATA_MODE = {"mlm": "full-sentences", "mlm+nsp": "segment-pair", "rtd": "full-sentences"}


# ---------------------------------------------------------------------------------------------- compute
def encoder_macs(config, shape: dict[str, float]) -> float:
    """Multiply-adds of a batch of `shape` (`batch_shapes`) through an encoder as bertlab trains it: the
    embeddings' projection to the hidden size (ELECTRA's, when E != H) at every position; then per layer, on the
    real tokens only (training unpads them), Q, K, V and the output projection (4 H^2) and the FFN (2 H I), and
    attention's scores and weighted sum on the padded rectangle (2 H per query-key pair)."""
    H, I, L = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    E = getattr(config, "embedding_size", H)
    project = shape["positions"] * E * H if E != H else 0.0
    return project + L * (shape["tokens"] * (4 * H * H + 2 * H * I) + shape["pairs"] * 2 * H)


def step_macs(objective: str, config, shape: dict[str, float]) -> float:
    """Forward multiply-adds of one training step of `objective` on a batch of `shape` (`batch_shapes`)."""
    H, V = config.hidden_size, config.vocab_size
    if objective in ("mlm", "mlm+nsp"):  # BERT: the MLM head's transform (H x H) and decoder (H x V), masked rows
        macs = encoder_macs(config, shape) + shape["masked"] * (H * H + H * V)
        if objective == "mlm+nsp":  # the pooler (H x H) and the 2-way classifier on each sequence's first token
            macs += shape["sequences"] * (H * H + 2 * H)
        return macs
    if objective == "rtd":  # the generator's pass and MLM head (H_g -> E, E x V), the discriminator and its head
        gen, E = config.generator_config(), config.embedding_size
        generator = encoder_macs(gen, shape) + shape["masked"] * (gen.hidden_size * E + E * V)
        discriminator = encoder_macs(config, shape) + shape["positions"] * (H * H + H)
        return generator + discriminator
    raise ValueError(f"no FLOP count for objective {objective!r}")


def step_flops(objective: str, config, shape: dict[str, float]) -> float:
    """Training FLOPs of one step: 2 a multiply-add, forward + backward = 3 x forward."""
    return 6.0 * step_macs(objective, config, shape)


def steps_for_budget(budget: float, flops_per_step: float) -> int:
    """The whole steps that fit `budget` FLOPs (never over it, but at least one)."""
    if budget <= 0 or flops_per_step <= 0:
        raise ValueError(f"budget and FLOPs a step must be positive, got {budget} and {flops_per_step}")
    return max(1, math.floor(budget / flops_per_step))


# ---------------------------------------------------------------------------------------------- models
def electra_config(vocab_size: int, generator_fraction: float):
    """ELECTRA's discriminator at the BERT rows' size (E = H = 128), with its generator's share of the width."""
    from bertlab.models.electra.config import GENERATOR_FRACTION_KEY, ElectraConfig

    return ElectraConfig(vocab_size=vocab_size, embedding_size=ENCODER_SIZES["hidden_size"], **ENCODER_SIZES,
                         extra={GENERATOR_FRACTION_KEY: generator_fraction})


def model_class(objective: str):
    from bertlab.objectives import get_objective

    return get_objective(objective).model_class


def plan(runs: Path, vocab: Path, data: dict[str, Path], budget: float, generator_fraction: float) -> dict:
    """Per objective: its model's config (written to RUNS), the data's mean batch shape, the FLOPs of a step,
    the steps of `budget` and the parameters (the model kept; all those trained, RTD's generator included)."""
    vocab_size = vocabulary_size(vocab)
    configs = {"mlm": bert_config(vocab_size), "mlm+nsp": bert_config(vocab_size),
               "rtd": electra_config(vocab_size, generator_fraction)}
    shapes = {mode: batch_shapes(path) for mode, path in data.items()}
    planned = {}
    for objective, config in configs.items():
        config_file = runs / f"config-{objective.replace('+', '-')}.json"
        config_file.write_text(config.to_json_string())
        shape = shapes[DATA_MODE[objective]]
        flops = step_flops(objective, config, shape)
        torch.manual_seed(0)
        model = model_class(objective)(config)
        kept = model.exported_parts()[""] if hasattr(model, "exported_parts") else model
        planned[objective] = {"config": str(config_file), "shape": shape, "flops_per_step": flops,
                              "steps": steps_for_budget(budget, flops), "params": params(kept),
                              "params_trained": params(model)}
    return planned


# ---------------------------------------------------------------------------------------------- runs
def pretrain(runs: Path, objective: str, data: Path, planned: dict) -> dict:
    from bertlab.train.pretrain import PretrainConfig, run_pretraining

    out = runs / objective.replace("+", "-")
    if out.exists():  # an interrupted earlier run's: start again
        shutil.rmtree(out)
    say(f"pre-training {objective}: {planned['steps']} steps x {planned['shape']['sequences']:.0f} sequences, "
        f"{planned['flops_per_step'] / 1e9:.1f} GFLOPs a step; {load_line(torch.get_num_threads())}")
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    result = run_pretraining(PretrainConfig(model=planned["config"], data=str(data), out=str(out),
                                            objective=objective, steps=planned["steps"], **pretrain_settings()),
                             echo=lambda s: None)
    seconds = time.perf_counter() - t0
    if result.train.step < planned["steps"]:  # stopped by a signal (Ctrl-C): not a finished row
        raise KeyboardInterrupt
    record = {"dir": str(result.final_dir), "steps": result.train.step, "tokens": result.train.tokens,
              "flops": result.train.step * planned["flops_per_step"], "seconds": round(seconds, 1),
              "load": [round(load_before, 1), round(os.getloadavg()[0], 1)],
              "heldout_before": result.eval_before, "heldout_after": result.eval_after}
    say(f"  {objective}: {record['steps']} steps, {result.train.tokens:,} tokens in {seconds:.0f} s; held-out "
        + ", ".join(f"{k} {v:.3f}" for k, v in result.eval_after.items()))
    return record


def timed(run, *args) -> dict:
    """run(*args) as `scores`, with its wall-clock `seconds` and the load average before and after."""
    load_before, t0 = os.getloadavg()[0], time.perf_counter()
    scores = run(*args)
    return {"scores": scores, "seconds": round(time.perf_counter() - t0, 1),
            "load": [round(load_before, 1), round(os.getloadavg()[0], 1)]}


def random_baselines(runs: Path, data: Path, planned: dict) -> dict:
    """A BERT and an ELECTRA discriminator of the rows' size, randomly initialised (seed 0), saved as
    pre-training saves its models."""
    from bertlab import BertConfig, BertForMaskedLM
    from bertlab.data import DataInfo
    from bertlab.models.electra.config import ElectraConfig
    from bertlab.models.electra.heads import ElectraForPreTraining
    from bertlab.train.pretrain import export_final

    made = {}
    for name, make in (("bert-none", lambda: BertForMaskedLM(BertConfig.from_json_file(planned["mlm"]["config"]))),
                       ("electra-none", lambda: ElectraForPreTraining(ElectraConfig.from_json_file(
                           planned["rtd"]["config"])))):
        final = runs / name / "final"
        if not final.is_dir():
            torch.manual_seed(0)
            export_final(make(), final, DataInfo.load(data, max_seq_length=SEQ))
        made[name] = {"dir": str(final), "steps": 0, "tokens": 0, "flops": 0, "seconds": 0}
    return made


# ---------------------------------------------------------------------------------------------- the table
ROWS = {**OBJECTIVES, **BASELINES}


def table(planned: dict, models: dict, results: dict) -> str:
    lines = ["| objective | FLOPs a step | steps | pre-training FLOPs | wall-clock | SST-2 acc | MRPC F1 | MRPC acc |",
             "|---|---|---|---|---|---|---|---|"]
    for name, label in ROWS.items():
        if name not in models:
            continue
        m, r = models[name], results.get(name, {})
        if m["steps"]:
            step = f"{planned[name]['flops_per_step'] / 1e9:.1f} G"
            spent, clock = f"{m['flops'] / 1e12:.2f} T", f"{m['seconds']:.0f} s"
        else:
            step, spent, clock = "–", "0", "–"
        sst2, mrpc = r.get("sst2", {}), r.get("mrpc", {})
        lines.append(f"| {label} | {step} | {m['steps']} | {spent} | {clock} | {fmt(sst2.get('accuracy'))} | "
                     f"{fmt(mrpc.get('f1'))} | {fmt(mrpc.get('accuracy'))} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget-flops", type=float, default=4e12, help="training FLOPs per pre-training")
    add_finetuning_arguments(p)
    p.add_argument("--generator-fraction", type=float, default=0.25, help="RTD generator width / discriminator's")
    p.add_argument("--work", type=Path, default=None, help="keep the data, models and results here (default: a "
                   "temp dir); a rerun with the same folder continues")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--stop-after", type=float, default=None, help="minutes after which no new pre-training or "
                   "fine-tuning starts; the table shows what finished")
    p.add_argument("--no-baselines", action="store_true", help="skip the models without pre-training")
    args = p.parse_args(argv)
    check_shared_data()
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    started = time.perf_counter()

    def out_of_time() -> bool:
        return args.stop_after is not None and time.perf_counter() - started > 60 * args.stop_after

    planned: dict = {}
    models: dict = {}
    results: dict = {}
    finetune_seconds: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        # what pre-training and fine-tuning make depends on their settings: each set has folders of its own
        runs = work / f"pretrain-{args.budget_flops:.3g}-gen{args.generator_fraction:g}"
        tuned = runs / f"finetune-{args.train_limit}-{args.eval_limit}-{args.seeds}seeds"
        runs.mkdir(parents=True, exist_ok=True)
        try:
            say(load_line(args.threads))
            vocab = learn_vocabulary(work)
            data = {mode: prepare_encoder_data(work, vocab, f"data-{mode}", mode) for mode in dict.fromkeys(
                DATA_MODE.values())}
            planned = plan(runs, vocab, data, args.budget_flops, args.generator_fraction)
            for objective, entry in planned.items():
                say(f"{objective}: {entry['flops_per_step'] / 1e9:.2f} GFLOPs a step "
                    f"({entry['shape']['positions']:.0f} positions, {entry['shape']['masked']:.0f} masked), "
                    f"{entry['steps']} steps; {entry['params'] / 1e6:.2f}M parameters kept, "
                    f"{entry['params_trained'] / 1e6:.2f}M trained")
            for objective in OBJECTIVES:
                done = cached(runs / f"{objective.replace('+', '-')}.json",
                              lambda: pretrain(runs, objective, data[DATA_MODE[objective]], planned[objective]),
                              run=not out_of_time())
                if done is not None:
                    models[objective] = done
            if not args.no_baselines:
                models.update(random_baselines(runs, data["full-sentences"], planned))
            for task in GLUE:  # one task for every model first: a run stopped early still has a whole column
                for name in (n for n in ROWS if n in models):
                    done = cached(tuned / f"{name.replace('+', '-')}-{task}.json",
                                  lambda: timed(finetune_encoder, models[name]["dir"], task,
                                                tuned / name.replace("+", "-") / task, args.train_limit,
                                                args.eval_limit, args.seeds),
                                  run=not out_of_time())
                    if done is not None:
                        results.setdefault(name, {})[task] = done["scores"]
                        finetune_seconds.setdefault(name, {})[task] = done["seconds"]
                        say(f"fine-tuned {name} on {task} ({args.seeds} seeds, {done['seconds']:.0f} s): "
                            + ", ".join(f"{k} {v['mean']:.3f}" for k, v in done["scores"].items()))
        except KeyboardInterrupt:
            say("interrupted: the table below has what finished")
        finally:
            say(f"{load_line(args.threads)}; total {(time.perf_counter() - started) / 60:.1f} min")
            if planned:
                print()
                print(f"Pre-training: WikiText-2, {args.budget_flops:.2g} training FLOPs each (batch 32, inputs <= "
                      f"{SEQ}); encoders of {planned['mlm']['params'] / 1e6:.2f}M (BERT) and "
                      f"{planned['rtd']['params'] / 1e6:.2f}M (ELECTRA discriminator) parameters. Fine-tuning: "
                      f"{args.train_limit} training and {args.eval_limit} dev examples per task, 3 epochs, "
                      f"{args.seeds} seeds (mean ± sd).")
                print()
                print(table(planned, models, results))
                if finetune_seconds:
                    print()
                    print("Fine-tuning wall-clock (all tasks and seeds): " + ", ".join(
                        f"{name} {sum(t.values()) / 60:.1f} min" for name, t in finetune_seconds.items()))
            record = {"planned": planned, "models": models, "results": results,
                      "finetune_seconds": finetune_seconds, "args": {k: str(v) for k, v in vars(args).items()}}
            if args.json:
                args.json.write_text(json.dumps(record, indent=2))
    return record


if __name__ == "__main__":
    main()
