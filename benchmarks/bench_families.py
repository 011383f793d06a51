"""DistilBERT and ALBERT: bertlab against `transformers` on the same model, data and threads, one process.

    python benchmarks/bench_families.py [--families distilbert,albert] [--n 256] [--rounds 5] [--threads 1]
        [--train-batches 12] [--batch-size 16] [--json FILE]

Models: random weights made by `transformers` at MiniLM-L6-like sizes and saved to a temporary folder, which
both sides load -- DistilBERT (dim 384, 6 layers, 6 heads, FFN 1536, bert-base-uncased's vocab.txt) and ALBERT
(E 128, H 384, 6 layers sharing one block, 6 heads, FFN 1536, a SentencePiece unigram model of 8,000 pieces
trained on the text here). Data: GLUE SST-2 training sentences (`../shared/data`), tokenized once per family
by bertlab's tokenizer (ids equal to `transformers`'s, tests/test_{distilbert,albert}.py), so tokenization is
outside every timing.

Inference (`embed`'s job: a mean-pooled embedding per sentence, fp32, inference_mode), on `--n` sentences:
  HF        the `transformers` model (sdpa attention), batches of 32 in input order, each padded to its longest
  bertlab   `Embedder.embed_ids` with the CLI's defaults (length buckets, oneDNN-packed linear layers)
  bertlab on HF's batches   the same model on HF's padded batches: the model's own speed, without bucketing
Fine-tuning (a text-classification step: forward, cross-entropy, backward, AdamW, fp32), on the same
`--train-batches` batches of `--batch-size` sentences in random order, each padded to its longest, the same
starting weights on both sides:
  HF        `AutoModelForSequenceClassification`'s class for the family
  bertlab   the family's text-classification head (unpadded layers in training)

Rounds interleave the two sides (the order alternates), so a busy machine slows both alike; each number is
the median over rounds, the ratio bertlab / HF throughput. Threads: `--threads` for both (default 1: the
machine these ran on has 2 cores shared with other work).
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bertlab.infer.embeddings import Embedder  # noqa: E402
from bertlab.infer.runtime import InferenceOptions  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
SST2 = DATA / "glue" / "SST-2" / "train.tsv"
VOCAB = DATA / "vocab" / "bert-base-uncased.txt"
SIZES = dict(hidden=384, layers=6, heads=6, ffn=1536)


def sentences(n: int, seed: int = 0) -> tuple[list[str], list[int]]:
    rows = [line.split("\t") for line in SST2.read_text(encoding="utf-8").splitlines()[1:]]
    rows = [(t.strip(), int(l)) for t, l in rows if len(t.split()) >= 4]
    random.Random(seed).shuffle(rows)
    return [t for t, _ in rows[:n]], [l for _, l in rows[:n]]


def make_folder(family: str, root: Path, texts: list[str]) -> Path:
    """A random model of the family saved by `transformers`, with its tokenizer files."""
    import transformers

    folder = root / family
    torch.manual_seed(0)
    if family == "distilbert":
        config = transformers.DistilBertConfig(vocab_size=len(VOCAB.read_text().splitlines()), dim=SIZES["hidden"],
                                               n_layers=SIZES["layers"], n_heads=SIZES["heads"],
                                               hidden_dim=SIZES["ffn"], num_labels=2)
        transformers.DistilBertModel(config).save_pretrained(folder)
        (folder / "vocab.txt").write_text(VOCAB.read_text())
    else:
        import sentencepiece as spm

        model = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=model, vocab_size=8000,
                                       model_type="unigram", pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
                                       control_symbols=["[CLS]", "[SEP]", "[MASK]"], minloglevel=2,
                                       hard_vocab_limit=False)
        folder.mkdir(parents=True)
        (folder / "spiece.model").write_bytes(model.getvalue())
        size = spm.SentencePieceProcessor(model_file=str(folder / "spiece.model")).get_piece_size()
        config = transformers.AlbertConfig(vocab_size=size, embedding_size=128, hidden_size=SIZES["hidden"],
                                           num_hidden_layers=SIZES["layers"], num_attention_heads=SIZES["heads"],
                                           intermediate_size=SIZES["ffn"], num_labels=2)
        transformers.AlbertModel(config).save_pretrained(folder)
    return folder


def padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
    return ids, mask


# ---------------------------------------------------------------------------------------------- the two jobs
def hf_embed(model, rows, pad: int, batch_size: int = 32) -> np.ndarray:
    out = []
    with torch.inference_mode():
        for i in range(0, len(rows), batch_size):
            ids, mask = padded(rows[i:i + batch_size], pad)
            h = model(input_ids=ids, attention_mask=mask).last_hidden_state
            m = mask[..., None].float()
            out.append(((h * m).sum(1) / m.sum(1)).numpy())
    return np.concatenate(out)


def train_steps(model, batches, lr: float = 1e-4) -> float:
    """Seconds for one AdamW step per batch (the model's own loss when it takes labels)."""
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    t0 = time.perf_counter()
    for ids, mask, labels in batches:
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def bench_family(family: str, args, root: Path) -> dict:
    import transformers

    from bertlab.models.registry import family_of

    texts, labels = sentences(max(args.n, args.train_batches * args.batch_size) + 2000)
    folder = make_folder(family, root, texts)
    fam = family_of(folder)
    tok = fam.load_tokenizer(folder)
    rows = tok(texts[:args.n], truncation=True, max_length=128)["input_ids"]
    pad = tok.pad_token_id

    # inference
    hf = transformers.AutoModel.from_pretrained(folder, attn_implementation="sdpa").eval()
    ours = Embedder.from_pretrained(folder, pooling="mean", options=InferenceOptions(threads=args.threads))
    a, b = hf_embed(hf, rows, pad), ours.embed_ids(rows)
    cosine = float(np.min((a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)))
    jobs = {"hf": lambda: hf_embed(hf, rows, pad), "bertlab": lambda: ours.embed_ids(rows),
            "bertlab_hf_batches": lambda: hf_embed(ours.model, rows, pad)}
    times = {k: [] for k in jobs}
    for r in range(args.rounds):
        order = list(jobs)[r % len(jobs):] + list(jobs)[:r % len(jobs)]  # rotates: a busy spell hits all alike
        for side in order:
            t0 = time.perf_counter()
            jobs[side]()
            times[side].append(time.perf_counter() - t0)
    infer = {k: len(rows) / statistics.median(v) for k, v in times.items()}

    # fine-tuning steps
    n_train = args.train_batches * args.batch_size
    train_rows = tok(texts[:n_train], truncation=True, max_length=128)["input_ids"]
    batches = [(*padded(train_rows[i:i + args.batch_size], pad), torch.tensor(labels[i:i + args.batch_size]))
               for i in range(0, n_train, args.batch_size)]
    hf_cls = transformers.AutoModelForSequenceClassification
    ours_cls = fam.head("text-classification").model_class
    steps = {"hf": [], "bertlab": []}
    for r in range(args.rounds):
        for side in (("hf", "bertlab") if r % 2 == 0 else ("bertlab", "hf")):
            torch.manual_seed(r)
            model = hf_cls.from_pretrained(folder, num_labels=2, attn_implementation="sdpa") if side == "hf" \
                else ours_cls.from_pretrained(folder, id2label={0: "LABEL_0", 1: "LABEL_1"})
            steps[side].append(train_steps(model, batches))
    train = {k: n_train / statistics.median(v) for k, v in steps.items()}
    result = {"family": family, "sentences": len(rows), "mean_tokens": statistics.mean(map(len, rows)),
              "embed_per_s": infer, "embed_ratio": infer["bertlab"] / infer["hf"], "embed_min_cosine": cosine,
              "train_examples_per_s": train, "train_ratio": train["bertlab"] / train["hf"],
              "train_batches": args.train_batches, "batch_size": args.batch_size, "threads": args.threads,
              "rounds": args.rounds}
    print(json.dumps(result, indent=2), flush=True)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default="distilbert,albert", help="comma-separated")
    p.add_argument("--n", type=int, default=256, help="sentences embedded per round")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians over them")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads, both sides")
    p.add_argument("--train-batches", type=int, default=12, help="fine-tuning steps per round")
    p.add_argument("--batch-size", type=int, default=16, help="sentences per fine-tuning step")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        results = [bench_family(f, args, Path(tmp)) for f in args.families.split(",")]
    print("\n| family | embed sentences/s: HF | bertlab (ratio) | bertlab on HF's batches (ratio) | "
          "fine-tune examples/s: HF | bertlab (ratio) |")
    print("|---|---|---|---|---|---|")
    for r in results:
        e, t = r["embed_per_s"], r["train_examples_per_s"]
        print(f"| {r['family']} | {e['hf']:.0f} | {e['bertlab']:.0f} ({r['embed_ratio']:.2f}x) | "
              f"{e['bertlab_hf_batches']:.0f} ({e['bertlab_hf_batches'] / e['hf']:.2f}x) | {t['hf']:.1f} | "
              f"{t['bertlab']:.1f} ({r['train_ratio']:.2f}x) |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
