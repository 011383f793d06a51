"""On one CUDA GPU, in one run: pre-training and inference speed side by side with Hugging Face, and learning.

    python benchmarks/bench_cuda.py --data128 DIR --data512 DIR [--out results.json] [--no-compile]
        [--device cuda] [--quick]

`--quick --device cpu` runs every code path on tiny models and few steps (a smoke test of the script itself;
its figures mean nothing).

The GPU counterpart of `bench_pretrain.py` and `bench_infer.py` (which measure the CPU): the same batches, the
same initial weights, Hugging Face as users run it on a GPU -- `BertForPreTraining` / `BertModel` with SDPA
attention, bf16 autocast (inference: the model in bf16), fused AdamW -- against bertlab as its users get it.

1. Ceiling: the bf16 matmul rate of this GPU (8192^3, median of CUDA-event timings after warm-up); model-FLOP
   utilisation (MFU) is measured against it, not against a datasheet.
2. Pre-training speed, BERT-Base (vocab 30522) at seq 128 (batch 128) and 512 (batch 32): WikiText-2 segment
   pairs made by `bertlab prepare` (DATA dirs), both sides on the very same batches, a step = forward,
   backward, clip at 1.0, fused AdamW step, bf16 autocast. Variants in interleaved rounds, medians of
   per-step CUDA-event times: HF; bertlab (unpadded position-wise layers, variable-length FlashAttention,
   the MLM decoder at the masked positions only); bertlab with each layer under `torch.compile`. Reported:
   real tokens/s, the ratio to HF, MFU (useful FLOPs as bench_pretrain counts them: the MLM decoder at masked
   positions only, for both sides), and peak GPU memory above the model's static state.
3. Inference, all-MiniLM-L6-v2's shape (6 x 384, 12 heads) and BERT-Base, random weights (speed does not
   depend on their values), bf16, mean-pooled embeddings of sequences whose lengths are uniform in 16-128
   and in 64-512 tokens, from token-id lists to embeddings on the host: HF on batches of 1 / 32 / 256 in
   input order padded to their longest; bertlab's model on the same batches; bertlab's `Embedder`
   (length-bucketed, the CLI's defaults). Accuracy: minimum cosine of each to HF's fp32 embeddings.
4. Packing (`--data-packed`): MLM-only BERT-Base on FULL-SENTENCES rows of 512, HF and bertlab with attention
   across the row against bertlab with document attention (`pretrain --document-attention`).
5. Learning: BERT-Small (4 x 512) from the same initial weights, same batches and schedule (AdamW lr 5e-4,
   10% warmup, linear decay), ours through `Trainer` (bf16, its default on a GPU), HF in a plain loop under
   bf16 autocast; held-out MLM loss of both, ours within 2% of HF's.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
import traceback
from itertools import cycle, islice
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_pretrain  # noqa: E402
from bench_pretrain import hf_evaluate, model_flops, optimizer_for  # noqa: E402

from bertlab import BertConfig, BertForPreTraining, BertModel, preset  # noqa: E402
from bertlab.data import PretrainingDataset  # noqa: E402
from bertlab.objectives import get_objective  # noqa: E402
from bertlab.train import LoopConfig, Trainer, adamw, linear_warmup_decay  # noqa: E402
from bertlab.train.pretrain import evaluate_pretraining  # noqa: E402

DEV = torch.device("cuda")  # --device
SIZES = {"base": "base", "small": "small"}  # --quick: tiny models
QUICK = False


def log(*a) -> None:
    print(*a, flush=True)


def sync() -> None:
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def empty_cache() -> None:
    if DEV.type == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------- ceiling
def cuda_time(fn, repeats: int, warmup: int = 3) -> list[float]:
    """Seconds of each of `repeats` calls of fn, by CUDA events, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if DEV.type != "cuda":
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return times


def matmul_peak(n: int = 8192) -> float:
    n = n if DEV.type == "cuda" else 512
    a, b = (torch.randn(n, n, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    return 2 * n ** 3 / statistics.median(cuda_time(lambda: a @ b, 20))


# ---------------------------------------------------------------------------------------------- data
def load_batches(data: Path, split: str, batch_size: int, seq: int, n: int, seed: int = 0, start: int = 0) -> list:
    ds = PretrainingDataset(data, split, seed=seed, batch_size=batch_size, start_index=start, max_seq_length=seq,
                            epochs=None if split == "train" else 1)
    return list(islice(ds.dataloader(num_workers=0), n))


def to_cuda(batch: dict) -> dict:
    return {k: v.to(DEV, non_blocking=True) for k, v in batch.items()}


def twin_models(config, hf_class: str, ours_class, seed: int = 0):
    """bertlab's model and HF's with identical initial weights (ours saved in HF layout, loaded by transformers)."""
    import transformers

    torch.manual_seed(seed)
    ours = ours_class(config)
    with tempfile.TemporaryDirectory() as tmp:
        ours.save_pretrained(tmp)
        theirs = getattr(transformers, hf_class).from_pretrained(tmp, attn_implementation="sdpa")
    return ours, theirs


# ---------------------------------------------------------------------------------------------- pre-training
def train_step(model, optimizer, batch) -> None:
    """bench_pretrain's step (forward, backward, clip at 1.0, optimizer step) under bf16 autocast on DEV."""
    bench_pretrain.train_step(model, optimizer, batch, torch.bfloat16, DEV.type)


def static_bytes(model, optimizer) -> int:
    """Weights, gradients and optimizer state: what a step's peak sits on."""
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                if torch.is_tensor(t))
    return 2 * n + state


def compile_layers(model) -> None:
    """Each encoder layer under torch.compile (the model's data-dependent parts -- unpadding, the masked
    positions of the MLM head -- stay eager around them)."""
    for layer in model.bert.encoder.layer:
        layer.compile(dynamic=True)


def compile_report(data: Path) -> dict:
    """What torch.compile makes of one encoder layer in a bf16 training step on this device: graphs and the
    reasons for any graph break."""
    from bertlab.nn import AttentionMask, TokenLayout

    model = BertForPreTraining(preset(SIZES["base"], vocab_size=30522)).to(DEV).train()
    b = to_cuda(load_batches(data, "train", 8, 128, 1)[0])
    layout, mask = TokenLayout.of(b["attention_mask"]), AttentionMask.padding(b["attention_mask"])
    x = torch.randn(layout.index.numel(), model.config.hidden_size, device=DEV, requires_grad=True)
    with torch.autocast(DEV.type, dtype=torch.bfloat16):
        model.bert.encoder.attention_takes_rows(x)  # as the encoder asks before its layers run, outside them
        ex = torch._dynamo.explain(model.bert.encoder.layer[0])(x, mask, False, layout)
    return {"graphs": ex.graph_count, "breaks": ex.graph_break_count,
            "reasons": [str(r.reason).splitlines()[0][:200] + " @ " + "; ".join(
                f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}" for f in r.user_stack[-3:]) for r in ex.break_reasons]}


def pretrain_speed(data: Path, seq: int, batch_size: int, rounds: int, steps: int, peak: float,
                   with_compile: bool) -> dict:
    config = preset(SIZES["base"], vocab_size=30522)
    ours, theirs = twin_models(config, "BertForPreTraining", BertForPreTraining)
    variants = {"HF (SDPA, bf16 autocast, fused AdamW)": theirs.to(DEV).train(),
                "bertlab": ours.to(DEV).train()}
    if with_compile:
        compiled = BertForPreTraining(config)
        compiled.load_state_dict(ours.state_dict())
        compile_layers(compiled)
        variants["bertlab + torch.compile (layers)"] = compiled.to(DEV).train()
    opts = {k: (optimizer_for(m, "hf") if k.startswith("HF") else adamw(m, 1e-4)) for k, m in variants.items()}
    batches = [to_cuda(b) for b in load_batches(data, "train", batch_size, seq, 3 if QUICK else 12)]
    tokens = [int(b["attention_mask"].sum()) for b in batches]
    masked = [int((b["labels"] != -100).sum()) for b in batches]
    log(f"  seq {seq}, batch {batch_size}: {statistics.mean(tokens) / (batch_size * seq):.1%} of positions real")
    times = {k: [] for k in variants}
    dead = {}
    for name, model in variants.items():  # warm-up (and compilation): every batch shape once
        t = time.perf_counter()
        try:
            for b in batches:
                train_step(model, opts[name], b)
            sync()
        except Exception as e:  # a variant that fails is reported, not fatal
            dead[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            traceback.print_exc()
        log(f"  warm-up {name}: {time.perf_counter() - t:.1f}s")
    for name in dead:
        variants.pop(name)
    order = list(variants)
    for r in range(rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:
            model, opt = variants[name], opts[name]
            for i in range(steps):
                b = batches[(r * steps + i) % len(batches)]
                times[name] += [(cuda_time(lambda: train_step(model, opt, b), 1, warmup=0)[0],
                                 (r * steps + i) % len(batches))]
    out = {"seq": seq, "batch_size": batch_size, "peak_tflops": peak / 1e12, "variants": {}, "failed": dead}
    base_tps = None
    for name in order:
        per_step = [t for t, _ in times[name]]
        idx = [i for _, i in times[name]]
        tps = statistics.median(tokens[i] / t for t, i in zip(per_step, idx))
        flops = statistics.median(model_flops(config, tokens[i], masked[i], seq) / t for t, i in zip(per_step, idx))
        model, opt = variants[name], opts[name]
        activations = 0
        if DEV.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            for b in batches[:3]:
                train_step(model, opt, b)
            torch.cuda.synchronize()
            activations = torch.cuda.max_memory_allocated() - before
        static = static_bytes(model, opt)
        base_tps = base_tps or tps
        out["variants"][name] = {"tokens_per_s": tps, "ratio_to_hf": tps / base_tps, "mfu": flops / peak,
                                 "step_ms": 1e3 * statistics.median(per_step),
                                 "peak_gib": (static + activations) / 2 ** 30, "activations_gib": activations / 2 ** 30}
    for m in variants.values():
        m.cpu()
    del variants, opts
    empty_cache()
    return out


def packing_speed(data: Path, batch_size: int, rounds: int, steps: int, peak: float) -> dict:
    """MLM-only pre-training of BERT-Base on packed FULL-SENTENCES rows of 512: HF and bertlab with attention
    across the row, and bertlab with document attention (each document of a row attends to itself only: one
    variable-length sequence per document)."""
    from bertlab import BertForMaskedLM
    from bertlab.data import PretrainingDataset

    config = preset(SIZES["base"], vocab_size=30522)
    ours, theirs = twin_models(config, "BertForMaskedLM", BertForMaskedLM)
    docs = BertForMaskedLM(config)
    docs.load_state_dict(ours.state_dict())
    ds = PretrainingDataset(data, "train", seed=0, batch_size=batch_size, max_seq_length=512)
    plain = [to_cuda(b) for b in islice(ds.dataloader(), 3 if QUICK else 8)]
    packed = [to_cuda(b) for b in islice(ds.dataloader(collate_fn=ds.collator(document_attention=True)),
                                          3 if QUICK else 8)]
    variants = {"HF, attention across the row": (theirs.to(DEV).train(), plain),
                "bertlab, attention across the row": (ours.to(DEV).train(), plain),
                "bertlab, document attention": (docs.to(DEV).train(), packed)}
    opts = {k: (optimizer_for(m, "hf") if k.startswith("HF") else adamw(m, 1e-4)) for k, (m, _) in variants.items()}
    tokens = [int(b["attention_mask"].count_nonzero()) for b in plain]
    masked = [int((b["labels"] != -100).sum()) for b in plain]
    for name, (model, batches) in variants.items():
        for b in batches:
            train_step(model, opts[name], b)
    sync()
    times = {k: [] for k in variants}
    order = list(variants)
    for r in range(rounds):
        for name in order[r % 3:] + order[:r % 3]:
            model, batches = variants[name]
            for i in range(steps):
                j = (r * steps + i) % len(batches)
                times[name].append((cuda_time(lambda: train_step(model, opts[name], batches[j]), 1, warmup=0)[0], j))
    out = {"batch_size": batch_size, "documents_per_row": float(statistics.mean(
        float(b["attention_mask"].max(1).values.float().mean()) for b in packed)), "variants": {}}
    base = None
    for name in order:
        tps = statistics.median(tokens[j] / t for t, j in times[name])
        flops = statistics.median(model_flops(config, tokens[j], masked[j], 512) / t for t, j in times[name])
        base = base or tps
        out["variants"][name] = {"tokens_per_s": tps, "ratio_to_hf": tps / base, "mfu": flops / peak}
    for m, _ in variants.values():
        m.cpu()
    empty_cache()
    return out


# ---------------------------------------------------------------------------------------------- inference
def inference_rows(stream: list[int], n: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        length = int(torch.randint(lo, hi + 1, (1,), generator=g))
        at = int(torch.randint(0, len(stream) - length, (1,), generator=g))
        rows.append([101] + stream[at:at + length - 2] + [102])
    return rows


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask[..., None].to(hidden.dtype)
    return (hidden.float() * m).sum(1) / m.sum(1)


def inference(name: str, config, rows: list[list[int]], batch_sizes: list[int], rounds: int) -> dict:
    from bertlab.infer import length_buckets
    from bertlab.infer.embeddings import Embedder
    from bertlab.infer.runtime import InferenceOptions

    ours, theirs = twin_models(config, "BertModel", BertModel)
    with torch.inference_mode():
        ref_model = theirs.to(DEV).eval()
        ref = []
        for i in range(0, len(rows), 64):
            inp = length_buckets.model_inputs(rows[i:i + 64], device=DEV)
            ref.append(mean_pool(ref_model(**inp).last_hidden_state, inp["attention_mask"]))
        ref = torch.cat(ref)
    hf = theirs.to(torch.bfloat16)
    ours = ours.to(DEV, torch.bfloat16).eval()
    out = {"model": name, "n": len(rows), "lengths": [min(map(len, rows)), max(map(len, rows))], "batches": {}}
    for bs in batch_sizes:
        n = min(len(rows), 4 if QUICK and bs == 1 else 64 if bs == 1 else len(rows))
        sub = rows[:n]
        embedder = Embedder(ours, None, "mean", max_length=512,
                            options=InferenceOptions(device=str(DEV), dtype="bf16", max_batch=bs))

        @torch.inference_mode()
        def run_padded(model):  # input tensors made from the id lists inside the timing, as for the Embedder
            out = []
            for i in range(0, n, bs):
                b = length_buckets.model_inputs(sub[i:i + bs], device=DEV)
                out.append(mean_pool(model(**b).last_hidden_state, b["attention_mask"]))
            return torch.cat(out).cpu()

        fns = {"HF bf16": lambda: run_padded(hf), "bertlab bf16, same batches": lambda: run_padded(ours),
               "bertlab bf16, Embedder (bucketed)": lambda: torch.from_numpy(embedder.embed_ids(sub))}
        results = {k: fn() for k, fn in fns.items()}  # warm-up, and the embeddings for the accuracy
        times = {k: [] for k in fns}
        order = list(fns)
        for r in range(rounds):
            for k in order[r % 3:] + order[:r % 3]:
                sync()
                t = time.perf_counter()
                fns[k]()
                sync()
                times[k].append(time.perf_counter() - t)
        row = {}
        for k in fns:
            cos = torch.nn.functional.cosine_similarity(results[k].float().to(DEV), ref[:n], dim=-1)
            row[k] = {"seq_per_s": n / statistics.median(times[k]), "min_cosine_to_hf_fp32": float(cos.min())}
        for k in fns:
            row[k]["ratio_to_hf"] = row[k]["seq_per_s"] / row["HF bf16"]["seq_per_s"]
        out["batches"][bs] = row
        log(f"  {name} batch {bs}: " + ", ".join(f"{k} {v['seq_per_s']:.0f} seq/s" for k, v in row.items()))
    hf.cpu()
    ours.cpu()
    empty_cache()
    return out


# ---------------------------------------------------------------------------------------------- learning
def learning(data: Path, steps: int, batch_size: int, lr: float = 5e-4) -> dict:
    config = preset(SIZES["small"], vocab_size=30522)
    ours, theirs = twin_models(config, "BertForPreTraining", BertForPreTraining, seed=1)
    ours, theirs = ours.to(DEV).train(), theirs.to(DEV).train()
    warmup = max(1, steps // 10)
    train = [to_cuda(b) for b in load_batches(data, "train", batch_size, 128, steps)]
    opt = adamw(ours, lr)
    trainer = Trainer(ours, opt, linear_warmup_decay(opt, warmup, steps), get_objective("mlm+nsp").loss,
                      lambda step: iter(train[step:]),
                      LoopConfig(max_steps=steps, precision="bf16", progress=False, seed=1, handle_signals=False))
    t = time.perf_counter()
    trainer.fit()
    sync()
    ours_s = time.perf_counter() - t
    opt = optimizer_for(theirs, "hf", lr)
    sched = linear_warmup_decay(opt, warmup, steps)
    torch.manual_seed(1)
    t = time.perf_counter()
    for b in train:
        train_step(theirs, opt, b)
        sched.step()
    sync()
    theirs_s = time.perf_counter() - t
    ours.eval()
    theirs.eval()
    held = [to_cuda(b) for b in load_batches(data, "heldout", 32, 128, 1000)]
    with torch.autocast(DEV.type, dtype=torch.bfloat16):
        ours_eval = evaluate_pretraining(ours, held, DEV, get_objective("mlm+nsp"))
        theirs_eval = hf_evaluate(theirs, held)
    return {"steps": steps, "batch_size": batch_size, "heldout_batches": len(held), "ours": ours_eval,
            "hf": theirs_eval, "ours_train_s": ours_s, "hf_train_s": theirs_s,
            "ratio": ours_eval["mlm_loss"] / theirs_eval["mlm_loss"]}


# ---------------------------------------------------------------------------------------------- report
def report(res: dict) -> str:
    lines = [f"GPU: {res['gpu']}, torch {res['torch']}; measured bf16 matmul peak {res['peak_tflops']:.0f} TFLOP/s"]
    for p in res.get("pretrain", []):
        lines.append(f"pre-training BERT-Base seq {p['seq']} batch {p['batch_size']}:")
        for k, v in p["variants"].items():
            lines.append(f"  {k:42s} {v['tokens_per_s'] / 1e3:8.1f}k tok/s  x{v['ratio_to_hf']:.2f}  "
                         f"MFU {v['mfu']:.1%}  step {v['step_ms']:.1f} ms  peak {v['peak_gib']:.1f} GiB")
        for k, v in p.get("failed", {}).items():
            lines.append(f"  {k:42s} failed: {v}")
    for inf in res.get("inference", []):
        lines.append(f"inference {inf['model']} lengths {inf['lengths'][0]}-{inf['lengths'][1]}:")
        for bs, row in inf["batches"].items():
            lines.append(f"  batch {bs:>3}: " + "; ".join(
                f"{k} {v['seq_per_s']:.0f}/s x{v['ratio_to_hf']:.2f} cos {v['min_cosine_to_hf_fp32']:.4f}"
                for k, v in row.items()))
    if "packing" in res:
        pk = res["packing"]
        lines.append(f"MLM-only BERT-Base on packed rows of 512, batch {pk['batch_size']}, "
                     f"{pk['documents_per_row']:.2f} documents a row:")
        for k, v in pk["variants"].items():
            lines.append(f"  {k:42s} {v['tokens_per_s'] / 1e3:8.1f}k tok/s  x{v['ratio_to_hf']:.2f}  MFU {v['mfu']:.1%}")
    if "learning" in res:
        lr = res["learning"]
        lines.append(f"learning BERT-Small {lr['steps']} steps: held-out MLM loss ours {lr['ours']['mlm_loss']:.4f} "
                     f"HF {lr['hf']['mlm_loss']:.4f} (ratio {lr['ratio']:.4f}); train {lr['ours_train_s']:.1f}s vs "
                     f"{lr['hf_train_s']:.1f}s")
    for k, v in res.get("errors", {}).items():
        lines.append(f"ERROR in {k}: {v}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data128", type=Path, required=True)
    ap.add_argument("--data512", type=Path, required=True)
    ap.add_argument("--data-packed", type=Path, default=None,
                    help="full-sentences data of 512 (`prepare --mode full-sentences`): the packing rows")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6, help="steps per variant per round")
    ap.add_argument("--learn-steps", type=int, default=400)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--only", default="compile,pretrain,packing,inference,learning")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny models, few steps: a smoke test of this script")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    global DEV, QUICK
    DEV, QUICK = torch.device(args.device), args.quick
    if args.quick:
        SIZES.update(base="tiny", small="tiny")
        args.rounds, args.steps, args.learn_steps = 2, 2, 6
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    res = {"gpu": torch.cuda.get_device_name() if DEV.type == "cuda" else "none (CPU)", "torch": torch.__version__, "transformers": transformers.__version__,
           "errors": {}}
    res["peak_tflops"] = matmul_peak() / 1e12
    log(f"{res['gpu']}: bf16 matmul {res['peak_tflops']:.0f} TFLOP/s")

    def section(name, fn):
        t = time.perf_counter()
        try:
            fn()
        except Exception as e:
            traceback.print_exc()
            res["errors"][name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        log(f"[{name}] {time.perf_counter() - t:.0f}s")
        if args.out:
            args.out.write_text(json.dumps(res, indent=1))

    if "compile" in only:
        section("compile", lambda: res.__setitem__("compile", compile_report(args.data128)))
        log(f"  {res.get('compile')}")
    if "pretrain" in only:
        res["pretrain"] = []
        shapes = ((128, 4, args.data128), (512, 1, args.data512)) if args.quick else \
            ((128, 128, args.data128), (512, 32, args.data512))
        for seq, bs, data in shapes:
            section(f"pretrain-{seq}", lambda: res["pretrain"].append(
                pretrain_speed(data, seq, bs, args.rounds, args.steps, res["peak_tflops"] * 1e12,
                               not args.no_compile)))
    if "packing" in only and args.data_packed is not None:
        section("packing", lambda: res.__setitem__("packing", packing_speed(
            args.data_packed, 4 if args.quick else 32, args.rounds, args.steps, res["peak_tflops"] * 1e12)))
    if "inference" in only:
        res["inference"] = []
        stream = [i for b in load_batches(args.data128, "train", 64, 128, 20) for row in b["input_ids"].tolist()
                  for i in row if i not in (0, 101, 102, 103)]
        minilm = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=1 if args.quick else 6,
                            num_attention_heads=12, intermediate_size=1536)
        n = 16 if args.quick else 1024
        for name, config in (("MiniLM-L6 shape", minilm), ("BERT-Base", preset(SIZES["base"], vocab_size=30522))):
            for lo, hi in ((16, 128), (64, 512)):
                section(f"inference-{name}-{hi}", lambda: res["inference"].append(
                    inference(name, config, inference_rows(stream, n, lo, hi, seed=hi), [1, 32, 256], 3)))
    if "learning" in only:
        section("learning", lambda: res.__setitem__("learning", learning(args.data128, args.learn_steps, 64)))
    log("\n" + report(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
