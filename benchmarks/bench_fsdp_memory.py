"""Memory per process under DDP and FSDP2: bytes of the parameters, gradients and optimizer state each process
holds (its local shards counted), and its peak and current RSS, for a randomly initialised BERT of a preset's
shape, trained one step (AdamW) by 2 processes on CPU (gloo): pre-training's model (`BertForPreTraining`), or with
`--head classification` fine-tuning's (`BertForSequenceClassification`, two labels).

    python benchmarks/bench_fsdp_memory.py [--model base] [--head pretraining] [--nproc 2] [--seq 64] [--batch 2]
                                           [--json out.json]

Each sharding runs in its own `torchrun` job (so peak RSS is that job's alone). Counted right after the first
backward (gradients) and after the optimizer step (parameters, Adam's two moments). RSS (VmHWM / VmRSS of
/proc/self/status) includes what every process of either kind holds beside the training state: torch's own
libraries and heap, the data, the activations, DDP's gradient buckets, and -- since every process builds the
whole model before `fully_shard` keeps its shard -- the whole model's initial weights.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = textwrap.dedent("""
    import json, sys, torch
    from bertlab import BertConfig, BertForPreTraining, BertForSequenceClassification
    from bertlab.train import adamw, init_distributed
    from bertlab.train.fsdp import local_bytes, shard_model

    model_name, sharding, seq, batch, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    classification = sys.argv[6] == "classification"
    dist = init_distributed("cpu")
    torch.manual_seed(0)
    head = BertForSequenceClassification if classification else BertForPreTraining
    model = head(BertConfig.from_name_or_path(model_name))
    if sharding == "fsdp":
        shard_model(model)
        wrapped = model
    else:
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = adamw(model, lr=1e-4)
    g = torch.Generator().manual_seed(dist.rank)
    ids = torch.randint(5, model.config.vocab_size, (batch, seq), generator=g)
    labels = {"labels": torch.zeros(batch, dtype=torch.long)} if classification else \
        {"labels": ids, "next_sentence_label": torch.zeros(batch, dtype=torch.long)}
    out_ = wrapped(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids), **labels)
    out_.loss.backward()
    grads = local_bytes(p.grad for p in model.parameters() if p.grad is not None)
    optimizer.step()
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    kib = lambda key: int(status[key].split()[0]) * 1024
    record = {"rank": dist.rank, "parameters": local_bytes(model.parameters()), "gradients": grads,
              "optimizer": local_bytes(t for s in optimizer.state.values() for t in s.values()
                                       if torch.is_tensor(t) and t.dim() > 0),
              "peak_rss": kib("VmHWM"), "rss": kib("VmRSS"),
              "whole_model": sum(p.numel() * 4 for p in model.parameters())}
    with open(out + ".rank%d" % dist.rank, "w") as f:
        json.dump(record, f)
    torch.distributed.destroy_process_group()
""")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="base")
    ap.add_argument("--head", choices=("pretraining", "classification"), default="pretraining")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        worker = Path(tmp) / "worker.py"
        worker.write_text(WORKER)
        for sharding in ("ddp", "fsdp"):
            out = Path(tmp) / sharding
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                            str(args.nproc), str(worker), args.model, sharding, str(args.seq), str(args.batch),
                            str(out), args.head], check=True, env=env)
            results[sharding] = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(args.nproc)]
    mb = lambda n: f"{n / 2**20:,.0f}"
    print(f"BERT-{args.model} ({args.head}), {args.nproc} processes, AdamW, batch {args.batch} x {args.seq} per process, "
          f"MiB per process (rank 0 / rank 1 ...)")
    print(f"{'':10s} {'parameters':>14s} {'gradients':>14s} {'optimizer':>14s} {'state total':>14s} "
          f"{'peak RSS':>14s} {'RSS after':>14s}")
    for sharding, ranks in results.items():
        cells = [" / ".join(mb(r[k]) for r in ranks) for k in ("parameters", "gradients", "optimizer")]
        total = " / ".join(mb(r["parameters"] + r["gradients"] + r["optimizer"]) for r in ranks)
        rss = [" / ".join(mb(r[k]) for r in ranks) for k in ("peak_rss", "rss")]
        print(f"{sharding:10s} " + " ".join(f"{c:>14s}" for c in (*cells, total, *rss)))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
