"""RoBERTa in bertlab against `transformers`, same weights, same inputs: embedding throughput and the speed of a
fine-tuning step.

    python benchmarks/bench_roberta.py [--layers 4] [--hidden 256] [--n 256] [--steps 5] [--batch-size 32]
        [--rounds 7] [--threads 1] [--family roberta|xlm-roberta] [--json FILE]

Model: a random-weight RoBERTa made by `transformers` (`--layers`, `--hidden`, heads hidden/64, FFN 4x hidden,
RoBERTa's 50,265-token vocabulary and 514 positions; XLM-R's 250,002 with `--family xlm-roberta`), saved to a
temporary folder; both sides load that folder. Inputs: `--n` sequences of lengths spread uniformly over 16-128
tokens (`<s>` and `</s>` included), random ids, the same for both sides; tokenization is outside the timings
(speed does not depend on which ids they are).

Embedding (the `embed` job: a mean-pooled vector per sequence, fp32, inference mode):
  HF                 `transformers.RobertaModel` (sdpa attention), the inputs in batches of `--batch-size` as they
                     come, each padded to its longest -- how a batch job is usually written
  bertlab            `Embedder.embed_ids` with the CLI's defaults (length buckets, oneDNN-packed linear layers)
  bertlab, HF batches  the same model on HF's padded batches: the model alone, without bucketing

Fine-tuning step (`RobertaForSequenceClassification`, 2 labels, dropout 0.1, AdamW lr 2e-5, fp32): forward,
backward and optimizer step on the same padded batches of `--batch-size` rows, `--steps` steps per round.

One process, the sides interleaved round by round (the order alternates), medians over `--rounds`; the ratio is
HF's time over bertlab's (above 1: bertlab faster). Outputs are checked to agree before timing.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bertlab.infer.embeddings import Embedder  # noqa: E402
from bertlab.infer.runtime import InferenceOptions, prepare  # noqa: E402
from bertlab.models.registry import family  # noqa: E402


def make_folder(folder: Path, family_name: str, layers: int, hidden: int) -> None:
    import transformers

    cls = transformers.XLMRobertaConfig if family_name == "xlm-roberta" else transformers.RobertaConfig
    vocab = 250002 if family_name == "xlm-roberta" else 50265
    config = cls(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=hidden // 64,
                 intermediate_size=4 * hidden, max_position_embeddings=514, num_labels=2)
    torch.manual_seed(0)
    transformers.RobertaForSequenceClassification(config).save_pretrained(folder)


def inputs(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[0] + [rng.randrange(3, vocab) for _ in range(rng.randint(16, 128) - 2)] + [2] for _ in range(n)]


def padded(rows: list[list[int]], batch_size: int) -> list[dict[str, torch.Tensor]]:
    """Batches in input order, each padded (with <pad> = 1) to its longest row."""
    out = []
    for i in range(0, len(rows), batch_size):
        chunk = rows[i:i + batch_size]
        width = max(map(len, chunk))
        ids = torch.ones(len(chunk), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, r in enumerate(chunk):
            ids[j, :len(r)] = torch.tensor(r)
            mask[j, :len(r)] = 1
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


@torch.inference_mode()
def embed_batches(model, batches) -> torch.Tensor:
    out = []
    for b in batches:
        h = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
        m = b["attention_mask"][..., None].float()
        out.append((h * m).sum(1) / m.sum(1))
    return torch.cat(out)


def train_steps(model, optimizer, batches, labels) -> float:
    model.train()
    for b, y in zip(batches, labels):
        loss = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=y).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss.item()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="roberta", choices=["roberta", "xlm-roberta"])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    fam = family(args.family)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        make_folder(folder, args.family, args.layers, args.hidden)
        vocab = fam.config_class.from_json_file(folder).vocab_size
        rows = inputs(args.n, vocab)
        batches = padded(rows, args.batch_size)
        tokens = sum(map(len, rows))

        hf_enc = transformers.AutoModel.from_pretrained(folder, attn_implementation="sdpa").eval()
        options = InferenceOptions()
        # the ids are given, so no tokenizer: max_length is the model's own
        embedder = Embedder(prepare(fam.base_model.from_pretrained(folder), options), None, pooling="mean",
                            max_length=512, options=options)
        plain = fam.base_model.from_pretrained(folder).eval()  # without packing: the model alone
        # agreement before timing
        a = embed_batches(hf_enc, batches[:2]).numpy()
        b = embedder.embed_ids(rows[:2 * args.batch_size])
        err = float(abs(a - b).max() / abs(a).max())
        print(f"embedding agreement: max relative difference {err:.2e}")

        labels = [torch.randint(0, 2, (len(b["input_ids"]),), generator=torch.Generator().manual_seed(i))
                  for i, b in enumerate(batches[:args.steps])]
        ours_clf = fam.head("text-classification").model_class.from_pretrained(folder)
        hf_clf = transformers.AutoModelForSequenceClassification.from_pretrained(folder, attn_implementation="sdpa")
        opt_ours = torch.optim.AdamW(ours_clf.parameters(), lr=2e-5)
        opt_hf = torch.optim.AdamW(hf_clf.parameters(), lr=2e-5)
        train_batches = batches[:args.steps]
        train_tokens = sum(int(b["attention_mask"].sum()) for b in train_batches)

        contenders = {
            "embed: HF": lambda: embed_batches(hf_enc, batches),
            "embed: bertlab": lambda: embedder.embed_ids(rows),
            "embed: bertlab, HF batches": lambda: embed_batches(plain, batches),
            "finetune: HF": lambda: train_steps(hf_clf, opt_hf, train_batches, labels),
            "finetune: bertlab": lambda: train_steps(ours_clf, opt_ours, train_batches, labels),
        }
        times: dict[str, list[float]] = {k: [] for k in contenders}
        for name, fn in contenders.items():  # warm-up
            fn()
        for r in range(args.rounds):
            order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
            for name in order:
                times[name].append(timed(contenders[name]))
            print(f"round {r + 1}: " + ", ".join(f"{k} {times[k][-1]:.2f}s" for k in contenders), flush=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n{args.family} L{args.layers}-H{args.hidden}, {args.threads} threads, {args.n} sequences "
          f"({tokens:,} tokens), {args.steps} steps of {args.batch_size} ({train_tokens:,} tokens)")
    print("| job | contender | median s | tokens/s | HF / this |\n|---|---|---|---|---|")
    for k, v in med.items():
        job, who = k.split(": ")
        n_tok = tokens if job == "embed" else train_tokens
        print(f"| {job} | {who} | {v:.2f} | {n_tok / v:,.0f} | {med[job + ': HF'] / v:.2f} |")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "times": times,
                                         "median": med, "embedding_relative_difference": err}, indent=2) + "\n")


if __name__ == "__main__":
    main()
