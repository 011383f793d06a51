"""What the objective comparisons share (`bench_objectives.py`, T5's table; `bench_encoder_objectives.py`, MLM vs
MLM+NSP vs RTD): the WikiText-2 corpus and the 8,000-token WordPiece vocabulary learnt from it, `bertlab
prepare` into a work folder (skipped when an earlier, interrupted run already made it), the tiny BERT-sized
encoder (4 layers, hidden 128, 2 heads, FFN 512), its fine-tuning on seeded SST-2 / MRPC subsets, and the table
cells (mean ± sd over seeds).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bertlab import BertConfig  # noqa: E402
from bertlab.cli import main as bertlab  # noqa: E402
from bertlab.train import finetune as ft  # noqa: E402

SHARED = Path(os.environ.get("BERTLAB_SHARED_DATA", ROOT.parent / "shared" / "data"))
WIKITEXT = ("wiki.train.raw.first1018lines", "wiki.valid.raw", "wiki.test.raw")
SEQ = 128
BATCH = 32
VOCAB_SIZE = 8000
GLUE = {"sst2": "SST-2", "mrpc": "MRPC"}
# The tiny encoder every BERT-style row uses (and ELECTRA's discriminator): ~1.9M parameters, most of them the
# 8k x 128 token embeddings
ENCODER_SIZES = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=2, intermediate_size=512,
                     max_position_embeddings=SEQ)
# Fine-tuning: 3 epochs at batch 32, AdamW 1e-3 with 10% warmup and linear decay -- the rate a tiny model needs
# in ~75 steps (1e-4 and 5e-4 left the random BERT predicting one class on SST-2; see bench_objectives.py)
FINETUNE_EPOCHS = 3
FINETUNE_LR = 1e-3


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def load_line(threads: int) -> str:
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {threads} threads"


def run_cli(*argv) -> None:
    if bertlab(["--log-level", "WARNING", *map(str, argv)]) != 0:
        raise SystemExit(f"bertlab {' '.join(map(str, argv))} failed")


def check_shared_data() -> None:
    if not (SHARED / "wikitext-2").is_dir() or not (SHARED / "glue" / "SST-2").is_dir():
        raise SystemExit(f"needs WikiText-2 and GLUE in {SHARED}")


def corpus() -> list[Path]:
    return [SHARED / "wikitext-2" / name for name in WIKITEXT]


def learn_vocabulary(work: Path) -> Path:
    """WORK/vocab.txt: VOCAB_SIZE WordPiece tokens learnt from the corpus (kept from an earlier run)."""
    vocab = work / "vocab.txt"
    if not vocab.is_file():
        run_cli("vocab", "train", *corpus(), "--vocab-size", VOCAB_SIZE, "--out", vocab, "--no-progress")
    return vocab


def prepare_encoder_data(work: Path, vocab: Path, name: str, mode: str) -> Path:
    """WORK/NAME: the corpus prepared for an encoder in `mode` (full-sentences, segment-pair, ...), dynamic
    masking, SEQ-token inputs, 2% held out (kept from an earlier run)."""
    out = work / name
    if not (out / "manifest.json").is_file():
        run_cli("prepare", *corpus(), "--vocab", vocab, "--out", out, "--mode", mode, "--dynamic",
                "--max-seq-length", SEQ, "--heldout-fraction", 0.02, "--workers", 1, "--quiet")
    return out


def batch_shape(batch: dict) -> dict[str, float]:
    """The shape of one encoder pre-training batch: sequences, `width` (the padded length), `positions`
    (sequences x width), `pairs` (query-key pairs of the padded rectangle, sequences x width^2), `tokens` (real,
    not padding) and `masked` (positions with an MLM label)."""
    n, width = batch["input_ids"].shape
    return {"sequences": n, "width": width, "positions": n * width, "pairs": n * width * width,
            "tokens": int(batch["attention_mask"].bool().sum()), "masked": int((batch["labels"] != -100).sum())}


def batch_shapes(data: Path, batches: int = 10) -> dict[str, float]:
    """The mean `batch_shape` of the first `batches` training batches of BATCH instances from prepared encoder
    data (dynamic masking drawn as training draws it)."""
    from itertools import islice

    from bertlab.data import PretrainingDataset

    loader = PretrainingDataset(data, "train", batch_size=BATCH, max_seq_length=SEQ).dataloader()
    shapes = [batch_shape(batch) for batch in islice(loader, batches)]
    return {k: sum(s[k] for s in shapes) / len(shapes) for k in shapes[0]}


def vocabulary_size(vocab: Path) -> int:
    return sum(1 for _ in vocab.open(encoding="utf-8"))


def bert_config(vocab_size: int) -> BertConfig:
    return BertConfig(vocab_size=vocab_size, **ENCODER_SIZES)


def params(model: torch.nn.Module) -> int:
    """Parameters, each tied tensor once."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def pretrain_settings(**overrides) -> dict:
    """The PretrainConfig settings every encoder pre-training here shares: AdamW 1e-3 (bertlab's rate for width
    128), 1% warmup then linear decay, fp32, no phase 2, two held-out evaluations, no progress bar."""
    return dict(batch_size=BATCH, max_seq_length=SEQ, phase2_max_seq_length=0, lr=1e-3, warmup=0.01,
                precision="fp32", eval_batches=4, eval_batch_size=64, num_evals=2, num_workers=0, progress=False,
                **overrides)


def finetune_encoder(model_dir: str, task: str, out: Path, train_limit: int, eval_limit: int | None,
                     seeds: int) -> dict:
    """`bertlab finetune` of a BERT-style folder (any family's) on a seeded subset of GLUE `task`: dev accuracy
    (and F1 where the task has it), mean ± sd over `seeds` seeds."""
    cfg = ft.FinetuneConfig(task=task, model=model_dir, data=str(SHARED / "glue" / GLUE[task]), out=str(out),
                            epochs=FINETUNE_EPOCHS, lr=FINETUNE_LR, batch_size=BATCH, max_seq_length=SEQ, seed=0,
                            seeds=seeds, train_limit=train_limit, eval_limit=eval_limit, progress=False,
                            overwrite=True)  # an interrupted earlier run's leftovers (its caller caches results)
    dev = ft.finetune(cfg)["dev"]["dev"]
    return {k: v for k, v in dev.items() if k in ("accuracy", "f1")}


def add_finetuning_arguments(p) -> None:
    """The fine-tuning and thread options both comparisons take (argparse)."""
    p.add_argument("--train-limit", type=int, default=800, help="fine-tuning examples per task (seeded subset)")
    p.add_argument("--eval-limit", type=int, default=400, help="dev examples per task (seeded subset)")
    p.add_argument("--seeds", type=int, default=3, help="fine-tuning seeds per model and task")
    p.add_argument("--threads", type=int, default=1, help="torch threads (tiny models gain little from more)")


def cached(path: Path, compute, run: bool = True):
    """The JSON at `path` when an earlier (interrupted) run wrote it, else `compute()`, written there; None
    when it is not there and `run` is false (out of time: nothing new starts)."""
    if path.is_file():
        return json.loads(path.read_text())
    if not run:
        return None
    value = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))
    return value


def fmt(score: dict | None, scale: float = 100.0) -> str:
    """mean ± sd of a score over seeds, in points; '–' when it was not measured."""
    if score is None:
        return "–"
    return f"{score['mean'] * scale:.1f} ± {score['sd'] * scale:.1f}"
