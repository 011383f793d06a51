"""Convert a BERT-base-shaped TensorFlow checkpoint: time and peak memory (issue 9).

    .venv/bin/python benchmarks/bench_tf_convert.py [--layers 12] [--with-adam] [--workdir DIR] [--keep]

Writes a 12-layer, hidden-768 BERT checkpoint with random weights in Google's variable layout (pre-training
heads included; with `--with-adam` also the adam_m/adam_v slots, as run_pretraining.py leaves them) using
bertlab's own TensorFlow writer -- whose output is byte-identical to TensorFlow's (tests/models/bert/test_tf_checkpoint.py)
-- then converts it in a fresh subprocess per measurement, so the peak resident set size of the process
(`resource.getrusage(...).ru_maxrss`) belongs to that conversion alone. Reported:

  * wall time of the conversion (reading + CRC-32C checks + building the model + writing model.safetensors);
  * peak RSS above the RSS the process had after importing torch and bertlab, against the checkpoint's size;
  * tracemalloc's peak (numpy buffers are traced; torch's tensor storage is not).

Targets: under 60 s, peak below twice the checkpoint's size. `bertlab convert` (streaming: the model plus one
tensor at a time) must meet them; `from_pretrained` on the TF folder (every tensor in memory, then copied into
the model, like any state dict) is shown for comparison. Exit status 1 when `bertlab convert` misses a target.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def google_shapes(layers: int, hidden: int, vocab: int = 30522, ffn: int | None = None, positions: int = 512):
    ffn = ffn or 4 * hidden
    yield "bert/embeddings/word_embeddings", (vocab, hidden)
    yield "bert/embeddings/position_embeddings", (positions, hidden)
    yield "bert/embeddings/token_type_embeddings", (2, hidden)
    yield "bert/embeddings/LayerNorm/gamma", (hidden,)
    yield "bert/embeddings/LayerNorm/beta", (hidden,)
    for i in range(layers):
        p = f"bert/encoder/layer_{i}"
        for m in ("attention/self/query", "attention/self/key", "attention/self/value", "attention/output/dense"):
            yield f"{p}/{m}/kernel", (hidden, hidden)
            yield f"{p}/{m}/bias", (hidden,)
        for m in ("attention/output/LayerNorm", "output/LayerNorm"):
            yield f"{p}/{m}/gamma", (hidden,)
            yield f"{p}/{m}/beta", (hidden,)
        yield f"{p}/intermediate/dense/kernel", (hidden, ffn)
        yield f"{p}/intermediate/dense/bias", (ffn,)
        yield f"{p}/output/dense/kernel", (ffn, hidden)
        yield f"{p}/output/dense/bias", (hidden,)
    yield "bert/pooler/dense/kernel", (hidden, hidden)
    yield "bert/pooler/dense/bias", (hidden,)
    yield "cls/predictions/transform/dense/kernel", (hidden, hidden)
    yield "cls/predictions/transform/dense/bias", (hidden,)
    yield "cls/predictions/transform/LayerNorm/gamma", (hidden,)
    yield "cls/predictions/transform/LayerNorm/beta", (hidden,)
    yield "cls/predictions/output_bias", (vocab,)
    yield "cls/seq_relationship/output_weights", (2, hidden)
    yield "cls/seq_relationship/output_bias", (2,)


def make_checkpoint(folder: Path, layers: int, with_adam: bool) -> Path:
    from bertlab.tf_checkpoint import write_tf_checkpoint

    hidden = 768
    config = {"attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
              "hidden_size": hidden, "initializer_range": 0.02, "intermediate_size": 4 * hidden,
              "max_position_embeddings": 512, "num_attention_heads": 12, "num_hidden_layers": layers,
              "type_vocab_size": 2, "vocab_size": 30522}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bert_config.json").write_text(json.dumps(config, indent=2))
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                                                + [f"w{i}" for i in range(30522 - 5)]) + "\n")
    rng = np.random.default_rng(0)

    def tensors():  # one tensor alive at a time
        for name, shape in google_shapes(layers, hidden):
            yield name, (rng.random(shape, dtype=np.float32) - 0.5) * 0.04
            if with_adam:
                yield f"{name}/adam_m", rng.random(shape, dtype=np.float32) * 1e-3
                yield f"{name}/adam_v", rng.random(shape, dtype=np.float32) * 1e-6
        yield "global_step", np.array(1_000_000, dtype=np.int64)

    return write_tf_checkpoint(folder / "bert_model.ckpt", tensors())


def child(mode: str, src: str, out: str) -> None:
    """Runs in a fresh interpreter: import, note the RSS, convert, report peak numbers as JSON."""
    import tracemalloc

    from bertlab import BertForPreTraining
    from bertlab.models.bert.convert import convert_tf_to_hf

    baseline = rss_bytes()
    tracemalloc.start()
    start = time.perf_counter()
    if mode == "convert":
        convert_tf_to_hf(src, out)
    else:
        BertForPreTraining.from_pretrained(src).save_pretrained(out, vocab_file=Path(src) / "vocab.txt")
    seconds = time.perf_counter() - start
    _, traced_peak = tracemalloc.get_traced_memory()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux
    print(json.dumps({"seconds": seconds, "baseline_rss": baseline, "peak_rss": peak, "traced_peak": traced_peak}))


def measure(mode: str, src: Path, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.run([sys.executable, __file__, "--child", mode, str(src), str(out)], capture_output=True,
                          text=True)
    if proc.returncode:
        sys.exit(f"{mode} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--with-adam", action="store_true", help="include adam_m/adam_v slots (3x the file size)")
    p.add_argument("--workdir", help="default: a temporary folder, removed afterwards")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    p.add_argument("--child", nargs=3, metavar=("MODE", "SRC", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(*args.child)
        return 0

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-tf-convert-"))
    try:
        start = time.perf_counter()
        prefix = make_checkpoint(work / "google", args.layers, args.with_adam)
        written = time.perf_counter() - start
        size = Path(f"{prefix}.data-00000-of-00001").stat().st_size + Path(f"{prefix}.index").stat().st_size
        print(f"checkpoint: {args.layers} layers, hidden 768{', with adam slots' if args.with_adam else ''}: "
              f"{size / 2**20:.1f} MiB (written by bertlab's TF writer in {written:.1f} s)")
        print(f"{'path':<34} {'seconds':>8} {'peak RSS above baseline':>24} {'x ckpt':>7} {'tracemalloc peak':>17}")
        ok = True
        for mode, label in (("convert", "bertlab convert (streaming)"),
                            ("from_pretrained", "from_pretrained + save_pretrained")):
            r = measure(mode, work / "google", work / f"hf-{mode}")
            extra = r["peak_rss"] - r["baseline_rss"]
            ratio = extra / size
            print(f"{label:<34} {r['seconds']:>8.1f} {extra / 2**20:>20.0f} MiB {ratio:>7.2f} "
                  f"{r['traced_peak'] / 2**20:>13.0f} MiB")
            if mode == "convert":
                ok = r["seconds"] < 60 and ratio < 2
                print(f"{'':<34} (baseline RSS after imports {r['baseline_rss'] / 2**20:.0f} MiB, process peak "
                      f"{r['peak_rss'] / 2**20:.0f} MiB)")
        print("targets (< 60 s, peak < 2x checkpoint):", "met" if ok else "MISSED")
        return 0 if ok else 1
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
